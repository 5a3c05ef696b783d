/* The devices one process trains on, and the batch split over them.
 *
 * Placement: [gpu] devices picks GPUs (an index may repeat: `0,0` runs two
 * replicas on one GPU, which exercises the multi-GPU path on a one-GPU
 * machine); with no driver, no GPU or no cuBLAS, soft placement falls back
 * to one CPU replica and says why, strict placement refuses.
 *
 * A step: the batch is split over the G replicas in contiguous parts whose
 * sizes differ by at most one; each computes its gradient with scale 1/B
 * (B = the whole batch), and the parts are summed into replica 0's
 * gradient, so the result is the whole batch's average, as one device
 * would compute it up to float32 rounding. In `local` mode the optimizer
 * then runs where replica 0's parameters live and the result is copied to
 * the others; a worker downloads the summed gradient and pushes it.
 *
 * Each replica has its own parameter and gradient vectors in its device's
 * memory; on the CPU they are plain host memory and nothing is copied.
 * Every GPU replica has a backend of its own (stream, cuBLAS handle,
 * arena), also when a GPU is listed twice: `devices = 0,0` then runs the
 * cross-stream copies and sums that two GPUs run, and each of the two
 * backends gets half of the GPU's memory_fraction. */
#ifndef PSTRAIN_DEVICES_H
#define PSTRAIN_DEVICES_H

#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "../config/config.h"
#include "model.h"
#include "optim.h"
#include "gradflow.h"
#include "replica.h"
#include "sparse_optim.h"

#define DEVICES_MAX CONFIG_MAX_DEVICES

/* How devices_step_flow and devices_forward_flow run (devices_flow_init). */
enum devices_flow {
	DEVICES_FLOW_NONE,   /* not set up: both refuse */
	DEVICES_FLOW_HOST,   /* one CPU replica: its buffers are host memory, so
			      * backward is split there, the dense weights
			      * block by block (replica_train_flow) */
	DEVICES_FLOW_QUEUED, /* one replica on a backend with a copy queue (a
			      * GPU): whole layers, each layer's gradient
			      * copied down once its kernels are queued and
			      * each layer's parameters copied up as they
			      * arrive (replica_train_queued) */
};

/* What the flow did, counted since devices_open (devices_flow_say). */
struct devices_flow_stats {
	long steps;      /* devices_step_flow calls that made the whole gradient final */
	long ranges;     /* the ranges they marked final */
	long forwards;   /* devices_forward_flow passes that ran to the end */
	long uploads;    /* QUEUED: the copies up those passes made */
	double waited;   /* seconds those passes waited for parameters */
	long disputed;   /* QUEUED: ranges the backend's check found a NaN or an
			  * infinity in and the host's scan did not (none, unless
			  * the check reads the wrong values: pushed as landed) */
};
struct devices_embed;   /* core/nn/devices_embed.h */

struct devices {
	const struct model *m;
	int n;                              /* replicas */
	int gpu;                            /* 1: CUDA backends, 0: one CPU replica */
	int tf32;                           /* the GPUs' GEMMs may use TF32 ([gpu] tf32) */
	int nbe;                            /* backends: one per GPU replica, or the CPU's */
	struct backend be[DEVICES_MAX];
	int be_of[DEVICES_MAX];             /* replica -> backend */
	struct replica rep[DEVICES_MAX];
	float *params[DEVICES_MAX];         /* (P) per replica, in its device's memory */
	float *grads[DEVICES_MAX];          /* (P) per replica */
	float *stage;                       /* (P) on replica 0's device: others' gradients land here */
	float *opt_m, *opt_v;               /* (P) optimizer state on replica 0's device (GPU) */
	/* The enum optim_kind the state was sized for (devices_open's oc),
	 * -1 for none: gradients only. Every call that steps or copies the
	 * state refuses an optimizer of another kind, on the CPU too, where
	 * the struct optim holds its own state, so that CI catches what
	 * would step a GPU's state through buffers never allocated. */
	int opt_kind;
	int max_batch;                      /* per replica */
	/* The training set (devices_set_data) and the epoch's order
	 * (devices_set_order). Per backend: where its batches come from,
	 * the set and the order in its memory, or data_x NULL when a GPU
	 * cannot hold the set and its batches are staged from the host. */
	const struct dataset *data;
	const float *data_x[DEVICES_MAX];   /* (n, inputs) */
	const int32_t *data_y[DEVICES_MAX]; /* (n) */
	uint32_t *order[DEVICES_MAX];       /* (n) */
	uint32_t *host_order;               /* (n) the order, for staged batches */
	size_t norder;
	long samples;                       /* trained since the last devices_meter */
	int stage_only;                     /* tests: stage batches even where the set fits */
	/* devices_train_step's CUDA graph: [gpu] cuda_graphs, whether a
	 * step has run (the one before the capture), 0 not captured yet, 1
	 * captured for batches of graph_B, -1 not possible; log gets the
	 * one line that says why when a capture fails. */
	int graphs, graph_warm, graph_state, graph_B;
	FILE *log;
	/* devices_forward_flow's pass, which devices_step_flow goes on from:
	 * its batch (fwd_B 0: none) and where the batch is */
	size_t fwd_at;
	int fwd_B;
	const float *fwd_x;
	enum devices_flow flow;
	struct devices_flow_stats fs;
	/* The embedding layer's tables and each batch's plan
	 * (devices_embed_open); NULL for a model without one. */
	struct devices_embed *emb;
};

/* Opens the devices the config asks for (see the top of this file), with
 * replicas for batches up to max_batch samples in all, and optimizer
 * state for oc's kind (NULL: none; devices_apply then refuses every
 * optimizer, as it refuses one of another kind). Prints the
 * placement line, and with [gpu] log_placement where each layer runs, to
 * out (job: e.g. "/job:localhost/replica:0/task:0" for the device names).
 * Returns 0, or a negative errno with the reason in err. */
int devices_open(struct devices *d, const struct config *c, const struct model *m,
		 const struct optim_config *oc, int max_batch, const char *job, FILE *out,
		 char *err, size_t errlen);

/* n CPU replicas (threads as for layers_set_threads): the batch split and
 * the gradient sum without a GPU, for tests; oc as for devices_open. */
int devices_open_cpu(struct devices *d, const struct model *m, const struct optim_config *oc, int n,
		     int threads, int max_batch, char *err, size_t errlen);

void devices_close(struct devices *d);   /* accepts a zeroed struct */

/* What d's arithmetic runs on, in a line: "cpu: OpenBLAS 0.3.21 SkylakeX"
 * or "gpu: NVIDIA H200 sm_90, tf32 off", with " x2" for replicas. Two
 * workers whose lines differ may compute the same slice to other bits. */
void devices_compute(const struct devices *d, char *out, size_t outlen);

/* Copies host parameters (P) to every replica. */
int devices_set_params(struct devices *d, const float *host, char *err, size_t errlen);

/* Zeroes every replica's gradient. */
int devices_zero_grads(struct devices *d, char *err, size_t errlen);

/* The training set the steps draw their batches from. Where it fits under
 * a GPU's cap beside the replicas, it is copied there once and batches are
 * gathered on the device; otherwise each step gathers its batch on the
 * host into pinned memory and uploads it on a copy stream while the
 * previous step computes (two buffers). On the CPU the host's dataset is
 * read as it is. ds must outlive the steps. *resident (may be NULL) says
 * whether every GPU holds the set. */
int devices_set_data(struct devices *d, const struct dataset *ds, int *resident, char *err,
		     size_t errlen);

/* The order in which the steps visit the training set: n indices into it
 * (an epoch's permutation). Copied to each device once; the steps then
 * name their batch by its first position in this order. */
int devices_set_order(struct devices *d, const uint32_t *order, size_t n, char *err,
		      size_t errlen);

/* One training forward and backward over the B samples order[at .. at+B)
 * (devices_set_data, devices_set_order), split over the replicas; the
 * summed gradient (scale 1/B) is in d->grads[0], ADDED to what is there.
 * key is the step's dropout key (replica_key); replica 0 uses it as it
 * is, so one replica drops what a lone replica would, and the others
 * derive their own from it. The loss and the right answers are summed on
 * the devices (devices_meter): no step waits for a GPU. */
int devices_step(struct devices *d, size_t at, int B, uint64_t key, char *err, size_t errlen);

/* Whether devices_step_flow can run here, and how (d->flow, enum
 * devices_flow): one CPU replica (HOST), or one replica whose backend has
 * a copy queue (QUEUED: a GPU), with what it needs taken now (the split
 * backward's buffers; the queue's slots). -EOPNOTSUPP otherwise (several
 * replicas), -ENOMEM, or the backend's failure. Files: devices_flow.c. */
int devices_flow_init(struct devices *d);
/* Whether devices_forward_flow can run after devices_flow_init: QUEUED,
 * or HOST on a backend with dense_forward_rows. */
int devices_flow_forwards(const struct devices *d);
/* devices_step (one replica, after devices_flow_init), with the gradient
 * copied into host (P) range by range as each becomes final, and each
 * range then marked in flow, so that a worker can push the first pieces
 * while backward still runs. HOST: replica_train_flow's ranges, the dense
 * weights block by block in the order gradflow_behind asks for; the
 * gradient is devices_step's to float rounding (block GEMMs). QUEUED: one
 * range a layer, the last layer first, each copied down on the backend's
 * queue as soon as its kernels are queued and marked once it has landed,
 * while the layers before it still compute; the gradient is devices_step's
 * bit for bit; host should come from devices_host_alloc. A range holding
 * a NaN or an infinity is not marked: the step ends with -EDOM and *bad,
 * its index (P otherwise), and no message. On any failure the flow is
 * failed, so no reader waits for ever. forwarded: devices_forward_flow
 * has run the forward pass of this very batch (-EINVAL if it has not),
 * and only the backward pass is left. Returns once the whole gradient is
 * in host (QUEUED: the step's only host waits are for its copies down). */
int devices_step_flow(struct devices *d, size_t at, int B, uint64_t key, float *host,
		      struct gradflow *flow, int forwarded, size_t *bad, char *err, size_t errlen);
/* The forward pass of devices_step_flow alone, for the batch of a step
 * whose parameters are still arriving: host (P) fills as the links take
 * them and mark them final in flow, and each layer waits for its own,
 * copying them to the replica as they come (HOST: replica_forward_flow, a
 * dense layer's rows as they come; QUEUED: replica_forward_layers, each
 * run that has arrived copied up on the queue, the layer's kernels queued
 * to wait for them). host must keep its values until devices_step_flow
 * has returned. The loss goes to the training meter as devices_step's
 * does. Then
 * devices_step_flow with forwarded 1 and the same batch computes the
 * backward pass; anything else between the two (devices_step,
 * devices_set_params, an evaluation) forgets the pass. *waited: seconds
 * spent waiting for parameters. -ECANCELED when the flow failed (the
 * exchange that brings the parameters did), with one line in err. */
int devices_forward_flow(struct devices *d, size_t at, int B, uint64_t key, const float *host,
			 struct gradflow *flow, double *waited, char *err, size_t errlen);

/* Host memory for n floats that the devices copy to and from fastest:
 * pinned for a GPU (replica 0's backend's host_alloc), else plain. *p is
 * the caller's, freed with devices_host_free before devices_close. */
int devices_host_alloc(struct devices *d, float **p, size_t n, char *err, size_t errlen);
void devices_host_free(struct devices *d, float *p); /* accepts NULL */

/* One line of what the flow did (d->fs) in buf, "" when it did nothing. */
void devices_flow_say(const struct devices *d, char *buf, size_t len);

/* devices_step then devices_apply: one whole step of `local`. Where the
 * step can be a CUDA graph ([gpu] cuda_graphs on one GPU replica, the
 * training set on that GPU), the second step is captured and every later
 * one replays it with this step's order position, learning rate and
 * dropout key: one launch, the same results. */
int devices_train_step(struct devices *d, size_t at, int B, uint64_t key, struct optim *o,
		       float lr, char *err, size_t errlen);

/* One step of `local` with [train] slices S > 1 (docs/ELASTIC.md): each
 * slice s, the B samples order[at[s] .. at[s]+B) with dropout key key[s],
 * made by devices_step into a zeroed gradient, the slices folded in slice
 * order on the host (gradfold.h, what a ps does with the slices workers
 * push), the mean back on replica 0, then devices_apply. The same bits as
 * a cluster whose workers computed the slices, however many there were
 * (on the same kernels). acc and g (P): the caller's host scratch. An
 * embedding's rows fold the same way, row by row (devices_embed_slices
 * must have made room for S). Files: devices_slices.c. */
int devices_slices_step(struct devices *d, int S, const size_t *at, int B, const uint64_t *key,
			float *acc, float *g, struct optim *o, float lr, char *err, size_t errlen);

/* The summed loss, the right answers and the samples of every step since
 * the last call, which are then cleared. Waits for the devices: call it
 * when the figures are shown, not every step. */
int devices_meter(struct devices *d, double *loss, long *right, long *samples, char *err,
		  size_t errlen);

/* devices_meter's figures into the progress line after step (progress_step). */
struct progress;
int devices_report(struct devices *d, struct progress *pg, long step, char *err, size_t errlen);

/* Downloads the summed gradient (P) into host. */
int devices_get_grads(struct devices *d, float *host, char *err, size_t errlen);

/* The optimizer over replica 0's parameters with the summed gradient
 * (which it zeroes), then the new parameters to the other replicas. o->t
 * counts steps as on the CPU; on a GPU o->m and o->v are not used (the
 * state lives on the device: devices_get_optim copies it out). An
 * optimizer of another kind than the devices were opened for, over
 * another count than P, or (CPU) without the state its kind needs is
 * refused with -EINVAL before anything is stepped; so are the calls
 * below and devices_train_step. */
int devices_apply(struct devices *d, struct optim *o, float lr, char *err, size_t errlen);

/* The optimizer state between the device and o->m, o->v (for checkpoints);
 * nothing to do on the CPU, where o's buffers are the state. */
int devices_get_optim(struct devices *d, struct optim *o, char *err, size_t errlen);
int devices_set_optim(struct devices *d, const struct optim *o, char *err, size_t errlen);

/* Replica 0's parameters (P) into host. */
int devices_get_params(struct devices *d, float *host, char *err, size_t errlen);

/* Test loss and accuracy of replica 0's parameters over a dataset
 * (devices_eval's loss and acc). */
int devices_evaluate(struct devices *d, const struct dataset *ds, double *loss, double *acc,
		     char *err, size_t errlen);

/* ---- click-through models (core/nn/devices_embed.c, devices_eval.c) ------ */

/* What an evaluation finds: the mean loss and the accuracy (for a binary
 * model, the share of samples whose logit's sign is the label); for a
 * binary model (loss = sigmoid_cross_entropy) the loss is metrics.h's log
 * loss of the probabilities, the figure `pstrain synth` reports for its
 * planted model, and auc their ROC AUC. binary is 0 and auc NaN for any
 * other model; auc is NaN too where the set holds one class only. */
struct eval_result {
	double loss, acc, auc;
	int binary;
};

/* Replica 0's parameters (and the embedding tables, devices_embed_open)
 * over a dataset, in chunks of the replicas' batch. Allocates a score per
 * sample for a binary model (an evaluation is not a step). */
int devices_eval(struct devices *d, const struct dataset *ds, struct eval_result *ev, char *err,
		 size_t errlen);
/* An evaluation into the progress line (progress_eval, or a binary model's
 * progress_eval_auc, which progress_set_binary must have prepared). */
void devices_show_eval(struct progress *pg, long step, const struct eval_result *ev);

/* devices_eval's work on one replica r with params (P) and table (R, DIM),
 * the embedding's (NULL: none), both in r's backend memory: for callers
 * without devices (`pstrain eval`). 0 or a negative errno, no message
 * (-EINVAL: the set's fields do not fit, or no table for an embedding). */
int devices_eval_replica(struct replica *r, const float *params, const float *table,
			 const struct dataset *ds, struct eval_result *ev);

/* The embedding tables of a model whose first layer is an embedding:
 * table (R, DIM) and its sparse optimizer, both the caller's and in host
 * memory, which must outlive the devices. From then on devices_step plans
 * each batch (embed_plan.h: its unique rows, gathered from table into the
 * replica) and devices_apply steps the sparse optimizer over the rows of
 * the last step with its own learning rate (o->cfg.lr), after the dense
 * one. One CPU replica only for now: -EOPNOTSUPP with one line otherwise
 * (the CUDA backend has the kernels, not the tables). -ENOMEM. Closed with
 * the devices. */
int devices_embed_open(struct devices *d, float *table, struct sparse_optim *o, char *err,
		       size_t errlen);
/* After devices_embed_open, for `local` with [train] slices S > 1: room
 * to keep each slice's gradient rows until devices_slices_step folds
 * them. -ENOMEM, -EINVAL with one line. */
int devices_embed_slices(struct devices *d, int S, char *err, size_t errlen);

/* Where the embedding rows come from when the devices hold no table (a
 * cluster's worker: its ps hold the tables by row): U (u, DIM), host
 * memory, gets the values of rows[0 .. u) (ascending, distinct). 0 or a
 * negative errno with one line in err. */
struct embed_fetch {
	int (*fetch)(void *ctx, const uint64_t *rows /* (u) */, size_t u, float *U /* (u, DIM) */,
		     char *err, size_t errlen);
	void *ctx;
};

/* The embedding layer without tables, so that the devices hold a batch's
 * rows and never the tables: before each devices_step the caller takes
 * the batch's plan (devices_embed_plan) and puts its rows' values in the
 * buffer that gives; after it, the batch's gradient rows
 * (devices_embed_grads) are the caller's to apply (devices_apply steps no
 * sparse optimizer). An evaluation fetches each chunk's rows through f,
 * which must outlive the devices. One CPU replica, as devices_embed_open.
 * Files: core/nn/devices_embed.c. */
int devices_embed_open_remote(struct devices *d, const struct embed_fetch *f, char *err, size_t errlen);
/* Remote: the plan of the batch order[at .. at + B) that the next
 * devices_step(at, B) trains, its unique rows in (*plan)->rows, and *U
 * ((*plan)->u, DIM) where their values go before that step. -EINVAL for a
 * batch over the capacity, with one line in err. */
int devices_embed_plan(struct devices *d, size_t at, int B, const struct embed_plan **plan, float **U,
		       char *err, size_t errlen);
/* Remote, after devices_step: the batch's rows (*u of them, ascending) and
 * their gradient dU (*u, DIM), host memory valid until the next step. */
int devices_embed_grads(struct devices *d, const uint64_t **rows, size_t *u, const float **dU, char *err,
			size_t errlen);

#endif
