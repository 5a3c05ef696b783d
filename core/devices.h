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
 * memory; on the CPU they are plain host memory and nothing is copied. */
#ifndef PSTRAIN_DEVICES_H
#define PSTRAIN_DEVICES_H

#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "config.h"
#include "model.h"
#include "optim.h"
#include "replica.h"

#define DEVICES_MAX CONFIG_MAX_DEVICES

struct devices {
	const struct model *m;
	int n;                              /* replicas */
	int gpu;                            /* 1: CUDA backends, 0: one CPU replica */
	int nbe;                            /* backends: one per distinct device */
	struct backend be[DEVICES_MAX];
	int be_of[DEVICES_MAX];             /* replica -> backend */
	struct replica rep[DEVICES_MAX];
	float *params[DEVICES_MAX];         /* (P) per replica, in its device's memory */
	float *grads[DEVICES_MAX];          /* (P) per replica */
	float *stage;                       /* (P) on replica 0's device: others' gradients land here */
	float *opt_m, *opt_v;               /* (P) optimizer state on replica 0's device (GPU) */
	int max_batch;                      /* per replica */
};

/* Opens the devices the config asks for (see the top of this file), with
 * replicas for batches up to max_batch samples in all. Prints the
 * placement line, and with [gpu] log_placement where each layer runs, to
 * out (job: e.g. "/job:localhost/replica:0/task:0" for the device names).
 * Returns 0, or a negative errno with the reason in err. */
int devices_open(struct devices *d, const struct config *c, const struct model *m,
		 const struct optim_config *oc, int max_batch, const char *job, FILE *out,
		 char *err, size_t errlen);

/* n CPU replicas (threads as for layers_set_threads): the batch split and
 * the gradient sum without a GPU, for tests. */
int devices_open_cpu(struct devices *d, const struct model *m, int n, int threads, int max_batch,
		     char *err, size_t errlen);

void devices_close(struct devices *d);   /* accepts a zeroed struct */

/* Copies host parameters (P) to every replica. */
int devices_set_params(struct devices *d, const float *host, char *err, size_t errlen);

/* Zeroes every replica's gradient. */
int devices_zero_grads(struct devices *d, char *err, size_t errlen);

/* One training forward and backward over the batch x (B, inputs), y (B),
 * split over the replicas; the summed gradient (scale 1/B) is in
 * d->grads[0]. key is the step's dropout key (replica_key); replica 0 uses
 * it as it is, so one replica drops what a lone replica would, and the
 * others derive their own from it. *loss is the summed loss, *right the
 * number of correct predictions. */
int devices_step(struct devices *d, const float *x, const int32_t *y, int B, uint64_t key,
		 double *loss, int *right, char *err, size_t errlen);

/* Downloads the summed gradient (P) into host. */
int devices_get_grads(struct devices *d, float *host, char *err, size_t errlen);

/* The optimizer over replica 0's parameters with the summed gradient
 * (which it zeroes), then the new parameters to the other replicas. o->t
 * counts steps as on the CPU; on a GPU o->m and o->v are not used (the
 * state lives on the device: devices_get_optim copies it out). */
int devices_apply(struct devices *d, struct optim *o, float lr, char *err, size_t errlen);

/* The optimizer state between the device and o->m, o->v (for checkpoints);
 * nothing to do on the CPU, where o's buffers are the state. */
int devices_get_optim(struct devices *d, struct optim *o, char *err, size_t errlen);
int devices_set_optim(struct devices *d, const struct optim *o, char *err, size_t errlen);

/* Replica 0's parameters (P) into host. */
int devices_get_params(struct devices *d, float *host, char *err, size_t errlen);

/* Test loss and accuracy of replica 0's parameters over a dataset. */
int devices_evaluate(struct devices *d, const struct dataset *ds, double *loss, double *acc,
		     char *err, size_t errlen);

#endif
