/* One copy of the model on one device: its activation and gradient buffers
 * and the forward and backward passes over a batch. Parameters and
 * gradients are passed in, so one flat vector can serve several replicas
 * (multi-GPU) and a ps shard never needs a replica at all. */
#ifndef PSTRAIN_REPLICA_H
#define PSTRAIN_REPLICA_H

#include <stdint.h>

#include "backend.h"
#include "../data/data.h"
#include "embed_plan.h"
#include "model.h"

struct replica {
	const struct model *m;
	struct backend be;
	int max_batch;
	float *x;                          /* (B, inputs) */
	int32_t *y;                        /* (B) */
	double *meter;                     /* (4): training's summed loss and right
					    * answers (replica_train adds, replica_meter
					    * reads), then evaluation's */
	float *act[MODEL_MAX_LAYERS];      /* (B, out) per layer; some layers share their
					    * input's buffer (see buffer_shared) */
	float *stats[MODEL_MAX_LAYERS];    /* batchnorm: batch mean (C) then variance (C) */
	float *col;                        /* conv im2col scratch, the largest conv's */
	float *keep[MODEL_MAX_LAYERS];     /* conv: its im2col columns kept from forward
					    * for backward (conv_keep_floats), or NULL */
	float *probs;                      /* (B, outputs) */
	float *grad[2];                    /* (B, max_width) ping-pong d(activation) */
	int training;                      /* the last forward was a training one */
	uint64_t key;                      /* its dropout key */
	/* replica_train_flow's (replica_flow_init): each dense layer's
	 * dout (B, out), and which weight rows are done this step */
	float *dz[MODEL_MAX_LAYERS];
	size_t rowoff[MODEL_MAX_LAYERS];
	uint8_t *rowdone;
	size_t flow_made;                  /* values of dense weights made final this step */
	const char *failed;                /* the layer (or "the loss") whose kernel
					    * failed in the last forward or backward */
	/* The embedding layer's batch (replica_embed_load), in backend
	 * memory, for up to max_batch samples of one ID per field: the
	 * batch-local table U (u, DIM) of the rows it touches, its gradient
	 * dU (u, DIM), which backward SETS, and the plan's indexes */
	float *U, *dU;
	uint64_t *e_rows;                  /* (u) */
	uint32_t *e_off, *e_idx;           /* (B*F + 1), (nnz) */
	uint32_t *e_roff, *e_rseg;         /* (u + 1), (nnz) */
	size_t e_u, e_max_u, e_max_nnz;    /* the loaded plan's rows; capacities */
	float *e_stage;                    /* host (max u, DIM): a batch's rows gathered
					    * from a host table for a backend without
					    * embed_gather; NULL for one with it */
	int e_B;                           /* the loaded plan's samples; 0: none */
};

/* The dropout key of one training step of one replica: masks are a
 * function of (seed, step, stream, layer, element) only, so a run is
 * reproducible and each worker (stream) drops different units. */
uint64_t replica_key(uint64_t seed, long step, int stream);

int replica_init(struct replica *r, const struct model *m, const struct backend *be,
		 int max_batch, char *err, size_t errlen);
void replica_free(struct replica *r);   /* accepts NULL and zeroed structs */

/* The embedding layer's plan for the next forward (a model with one runs
 * no forward without it: -EINVAL): its indexes copied in, and U gathered
 * from table (R, DIM) in backend memory. A batch of p->B samples must
 * follow. -EINVAL when the plan is over the replica's capacity (more than
 * one ID per field, or more than max_batch samples). */
int replica_embed_load(struct replica *r, const struct embed_plan *p, const float *table);
/* The same with U given: the plan's rows' values U (p->u, DIM) in host
 * memory, uploaded as they are (a worker pulled them from the ps). */
int replica_embed_load_rows(struct replica *r, const struct embed_plan *p, const float *U);
/* replica_init's and replica_free's part for the embedding layer's buffers
 * (core/nn/replica_embed.c); nothing to do for a model without one. */
int replica_embed_init(struct replica *r);
void replica_embed_free(struct replica *r);

/* Copies a batch from host memory: x (B, inputs), y (B). */
int replica_load(struct replica *r, const float *x, const int32_t *y, int B);

/* Gathers a batch into r->x, r->y from a training set in the backend's
 * memory: rows order[at .. at + B) of data_x (n, inputs), data_y (n). */
int replica_gather(struct replica *r, const float *data_x, const int32_t *data_y,
		   const uint32_t *order, size_t at, int B);

/* One training step over the batch x (B, inputs), y (B) in backend memory
 * (r->x and r->y after replica_load or replica_gather, or any other
 * buffer): forward with dropout masks from key, the loss added to the
 * training meter, and backward, which ACCUMULATES into grads (P) with
 * scale (1 over the whole batch the gradient is averaged over: all
 * replicas together). Nothing here waits for the device. */
int replica_train(struct replica *r, const float *params, float *grads, const float *x,
		  const int32_t *y, int B, uint64_t key, float scale);

/* The weight rows replica_train_flow computes first: about this many
 * values (a wire piece), so the first pieces are final soon. Each later
 * block is as large as all before it together: a GEMM of a few rows
 * repacks the whole input (16384-value blocks made the weight gradients
 * of the 784-512-512-10 MLP 0.44 ms slower a step than one GEMM a layer,
 * doubling blocks 0.1 ms), and once the first piece is on its way the
 * GEMMs stay far ahead of any link. */
#define REPLICA_FLOW_BLOCK 16384

struct gradflow;
/* What replica_train_flow needs, taken once (not in a step): -EOPNOTSUPP
 * when the backend cannot split a backward pass (only the CPU's can: its
 * buffers are host memory), -ENOMEM. */
int replica_flow_init(struct replica *r);
/* replica_train, with the gradient made final in ranges as soon as they
 * are: every input gradient and every gradient but the dense layers'
 * weights first, then those weights a block of rows at a time, choosing
 * the block at the frontier of the flow's stream that is furthest behind
 * (gradflow_behind). final(ctx, lo, hi) is called once for each range of
 * grads that holds its final value (together they cover [0, P) once); a
 * nonzero return ends the step with it. The values and the order of every
 * sum are those of replica_train's, block by block. */
int replica_train_flow(struct replica *r, const float *params, float *grads, const float *x,
		       const int32_t *y, int B, uint64_t key, float scale, struct gradflow *flow,
		       int (*final)(void *ctx, size_t lo, size_t hi), void *ctx);
/* replica_forward_flow's dense products take at least this many weight
 * rows (output columns) at a time, but at a layer's end: each product
 * packs the whole input again, so a product of one row would cost more
 * than it computes. The blocks' values are the whole product's to float
 * rounding, not bit for bit: BLAS kernels need not add a block's products
 * in the order they add the whole's (OpenBLAS's Haswell sgemm does not,
 * at any block size tried). */
#define REPLICA_FORWARD_ROWS 16

/* replica_train_flow's two halves. replica_forward_flow: the training
 * forward pass and the loss over x, y (B) as replica_train computes them,
 * with each layer waiting for its parameters first: ready(ctx, lo, want,
 * most, unit, &have) returns once params[lo, want) is in place, with *have
 * (want <= *have <= most) the end of what is from lo: most, or lo plus
 * whole units of `unit` values (want is one of those too); each value is
 * asked for once. A nonzero return ends the pass with it (-ECANCELED: the
 * parameters will not come). A dense layer asks for its bias, then for
 * REPLICA_FORWARD_ROWS weight rows (the unit) at a time, taking every row
 * up to *have in one product (dense_forward_rows), so that it computes on
 * the first rows while the last arrive; any other layer asks for all of
 * its parameters. -EOPNOTSUPP without the backend's
 * dense_forward_rows. replica_backward_flow: the backward pass after it
 * (or after replica_forward), as replica_train_flow's. */
int replica_forward_flow(struct replica *r, const float *params, const float *x, const int32_t *y,
			 int B, uint64_t key, float scale,
			 int (*ready)(void *ctx, size_t lo, size_t want, size_t most, size_t unit,
				      size_t *have),
			 void *ctx);
int replica_backward_flow(struct replica *r, const float *params, float *grads, const float *x, int B,
			  float scale, struct gradflow *flow, int (*final)(void *ctx, size_t lo, size_t hi),
			  void *ctx);

/* The same passes for a backend whose copies run beside its kernels (a
 * GPU's copy queue, devices_flow.c), where the values and the order of
 * every sum must stay those of replica_train, bit for bit: whole layers,
 * no split products. replica_forward_layers: replica_forward_flow with
 * each layer asking ready for all of its parameters at once (unit 1,
 * want = most = its end) and then running exactly as in replica_train
 * (fused kernels included); no backend entry needed. replica_train_queued:
 * replica_train, calling queued(ctx, lo, hi) each time a layer's gradient
 * kernels are queued, with [lo, hi) that layer's parameters: grads[lo,
 * hi) holds its final value once the backend's work queued so far has
 * run. The last layer comes first; together the calls cover every
 * parameter of a layer that has some, once. A nonzero return ends the
 * pass with it. replica_backward_queued: its backward alone, after
 * replica_forward_layers (or any training forward). */
int replica_forward_layers(struct replica *r, const float *params, const float *x, const int32_t *y,
			   int B, uint64_t key, float scale,
			   int (*ready)(void *ctx, size_t lo, size_t want, size_t most, size_t unit,
					size_t *have),
			   void *ctx);
int replica_train_queued(struct replica *r, const float *params, float *grads, const float *x,
			 const int32_t *y, int B, uint64_t key, float scale,
			 int (*queued)(void *ctx, size_t lo, size_t hi), void *ctx);
int replica_backward_queued(struct replica *r, const float *params, float *grads, const float *x,
			    int B, float scale, int (*queued)(void *ctx, size_t lo, size_t hi), void *ctx);

/* The training meter: summed loss and right answers of the steps since the
 * last call, which are then cleared. Waits for the device. */
int replica_meter(struct replica *r, double *loss_sum, double *right);

/* Forward over the loaded batch with params (P); *loss_sum is the summed
 * (not averaged) loss, *correct the number of right answers. training = 1
 * normalizes with batch statistics and drops units with masks from key
 * (replica_key); training = 0 is evaluation: running statistics, no
 * dropout, key unused. Waits for the device (for the loss). */
int replica_forward(struct replica *r, const float *params, int B, int training, uint64_t key,
		    double *loss_sum, int *correct);

/* Backward after a training replica_forward (-EINVAL after an evaluation
 * one); ACCUMULATES into grads (P). scale is 1 over the whole batch the
 * gradient is averaged over (all replicas together). The slots of
 * batchnorm's running statistics receive their update instead (see
 * batchnorm_backward), which the optimizer adds as it is. */
int replica_backward(struct replica *r, const float *params, float *grads, int B, float scale);

/* Mean loss and accuracy over a whole dataset, forward only, in chunks of
 * max_batch samples. */
int replica_evaluate(struct replica *r, const float *params, const struct dataset *ds,
		     double *loss, double *acc);

#endif
