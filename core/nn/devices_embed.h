/* The embedding layer's side of struct devices (devices.h's
 * devices_embed_open), shared by devices.c, which calls the three hooks
 * below at the points of a step they belong to, devices_embed.c and
 * devices_eval.c. Private to those files. */
#ifndef PSTRAIN_DEVICES_EMBED_H
#define PSTRAIN_DEVICES_EMBED_H

#include "devices.h"
#include "embed_plan.h"

/* One batch's plan. Remote, two: the next batch's is planned (and its
 * rows pulled) while the last one's rows still go up with its gradient. */
struct devices_embed_slot {
	struct embed_plan plan;
	uint32_t *ids;                /* (max_batch, F) the batch's IDs */
	float *U;                     /* remote: (max u, DIM) its rows */
	size_t at;                    /* remote: the batch the plan is of (planned) */
	int B, planned;
};

struct devices_embed {
	float *table;                 /* (R, DIM) the caller's, host memory; NULL: remote
				       * (devices_embed_open_remote) */
	struct sparse_optim *opt;     /* the caller's; NULL when remote */
	struct embed_fetch fetch;     /* remote: where an evaluation's rows come from */
	struct devices_embed_slot slot[2]; /* local: slot 0 only */
	int last;                     /* the slot of the last training batch */
	float *dU;                    /* remote: (max u, DIM) its rows' gradient */
	int pending;                  /* 1: replica 0's dU holds that batch's gradient,
				       * which the next devices_apply applies */
	/* local with [train] slices (devices_embed_slices): each slice's
	 * rows and their gradient, kept until the step folds them */
	int S;
	size_t segs;                  /* the most rows one batch has */
	uint64_t *sl_rows;            /* (S, segs) */
	float *sl_dU;                 /* (S, segs, DIM) */
	size_t *sl_n, *sl_cur;        /* (S) */
	uint64_t *fold_rows;          /* (S * segs) their union */
	float *fold_dU;               /* (S * segs, DIM) its fold */
};

/* Replica r's batch order[at .. at + B): its IDs gathered from the
 * training set, its plan built and loaded into the replica (U from the
 * table). Before the replica's forward. */
int devices_embed_batch(struct devices *d, int r, size_t at, int B);

/* The sparse optimizer over the rows of the last batch with replica 0's
 * dU (through a host copy on a GPU), if a batch is pending. After the
 * dense optimizer. 0, or the download's error (the table untouched). */
int devices_embed_apply(struct devices *d);

/* local with slices: slice s's rows and replica 0's gradient of them
 * kept (the batch no longer pending); after the last slice, every kept
 * slice folded row by row (grad_fold_rows, as a ps folds them) and the
 * sparse optimizer stepped over the union once. 0, or the download's
 * error. */
int devices_embed_keep(struct devices *d, int s);
void devices_embed_fold(struct devices *d, int S);

void devices_embed_close(struct devices *d);   /* accepts d->emb NULL */

#endif
