/* The embedding layer's side of struct devices (devices.h's
 * devices_embed_open), shared by devices.c, which calls the three hooks
 * below at the points of a step they belong to, devices_embed.c and
 * devices_eval.c. Private to those files. */
#ifndef PSTRAIN_DEVICES_EMBED_H
#define PSTRAIN_DEVICES_EMBED_H

#include "devices.h"
#include "embed_plan.h"

struct devices_embed {
	float *table;                 /* (R, DIM) the caller's, host memory; NULL: remote
				       * (devices_embed_open_remote) */
	struct sparse_optim *opt;     /* the caller's; NULL when remote */
	struct embed_fetch fetch;     /* remote: where an evaluation's rows come from */
	struct embed_plan plan;       /* the last training batch's */
	uint32_t *ids;                /* (max_batch, F) that batch's IDs */
	float *U, *dU;                /* remote: (max u, DIM) its rows, and their gradient */
	size_t at;                    /* remote: the batch the plan is of (planned) */
	int B, planned;
	int pending;                  /* 1: replica 0's dU holds that batch's gradient,
				       * which the next devices_apply applies */
};

/* Replica r's batch order[at .. at + B): its IDs gathered from the
 * training set, its plan built and loaded into the replica (U from the
 * table). Before the replica's forward. */
int devices_embed_batch(struct devices *d, int r, size_t at, int B);

/* The sparse optimizer over the rows of the last batch with replica 0's
 * dU (through a host copy on a GPU), if a batch is pending. After the
 * dense optimizer. 0, or the download's error (the table untouched). */
int devices_embed_apply(struct devices *d);

void devices_embed_close(struct devices *d);   /* accepts d->emb NULL */

#endif
