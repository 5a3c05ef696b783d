/* A ps's share of the embedding tables as pure state: its contiguous range
 * of the tables' global rows, those rows' values and sparse optimizer
 * state (core/nn/sparse_optim.h), a version, and the update rules for the
 * row gradients workers push, the dense shard's rules (psshard.h) carried
 * over to rows:
 *
 * Which rows: ps k of nps holds rows [r0, r1) of shard_plan(nps, R)
 * (core/shard.h's balanced plan, applied to the R rows of embed.h instead
 * of the P parameters): floor(R / nps) or one more each, the larger ones
 * first. A row's place never depends on the data, and the plan is the
 * dense one, so both ends compute it from the config alone.
 *
 * Pushes are of slices (docs/ELASTIC.md): a step trains S slices
 * ([train] slices; unset, one per worker, and worker w's is slice w), and
 * any worker may push any slice, as for the dense shard.
 *
 * sync: the rows are at version v. A push tagged v of a slice not pushed
 * for v (its row ids, ascending, and one gradient row each) is kept in one
 * of R slots; when R distinct slices have been pushed, the union of their
 * rows is walked in ascending order, each row's gradients summed in SLICE
 * order and divided by R (grad_fold_rows, core/nn/gradfold.h, which
 * `local` with slices calls too), and the sparse optimizer steps over the
 * union once (a lazy Adam's step counter moves once per version, touched
 * or not, as in `local`). A push tagged below v, or at or past the run's
 * last step, is dropped as stale; one tagged above v is an error, as is a
 * second push of one slice for v (-EALREADY: the ps ACKs it as a
 * duplicate).
 *
 * async: each push is applied on arrival, its rows' step divided by its
 * staleness v - t + 1 with staleness_lr (the learning rate scaled, as the
 * dense rule scales Adam's step), dropped as stale past max_staleness or
 * when tagged above v but at a version the rows had before a rewind, and
 * v moves by one.
 *
 * Every push is checked before it is used: its slice, its ids (strictly
 * ascending, inside [r0, r1), at most cap of them) and its values
 * (finite). A refused push leaves everything as it was. Nothing is
 * allocated after psrows_init: the slots hold R pushes of at most cap
 * rows, cap being what one batch can touch (batch_size x fields, or the
 * whole range if smaller), so the state is the range's rows and their
 * optimizer state plus R batches of rows, never the tables. */
#ifndef PSTRAIN_CLUSTER_PSROWS_H
#define PSTRAIN_CLUSTER_PSROWS_H

#include <stddef.h>
#include <stdint.h>

#include "psshard.h"
#include "../core/nn/embed.h"
#include "../core/nn/sparse_optim.h"

struct psrows {
	uint64_t r0, r1;            /* global rows [r0, r1) */
	size_t n;                   /* r1 - r0 */
	int dim;                    /* DIM */
	float *table;               /* (n, DIM) the rows' values */
	struct sparse_optim opt;    /* over the n rows */
	uint64_t version;           /* v */
	uint64_t went_back_from;    /* the highest v before a rewind (0: none) */
	long total;                 /* sync: a push at or past it is stale */
	enum train_mode mode;
	int workers;                /* S: the slices a step has (psshard's name) */
	int replicas, max_staleness, staleness_lr;
	size_t cap;                 /* rows one push may hold */

	/* sync: the pushes waiting for v */
	uint64_t *ids;              /* (R, cap) each slot's local rows */
	float *vals;                /* (R, cap, DIM) their gradients */
	size_t *cnt;                /* (R) rows in each slot */
	int nwaiting;
	uint64_t pushed[PSSHARD_PUSHED_WORDS];
	int16_t slot_of[PSSHARD_MAX_WORKERS];   /* by slice */
	uint64_t *uids;             /* (R * cap) the union's local rows (async: cap) */
	float *usum;                /* (R * cap, DIM) their sums; NULL in async */
	size_t *cur;                /* (R) merge cursors */

	/* sync: the last step's union as it was before it, so that a step
	 * trained again after a lost worker reads the rows it was trained on
	 * (psrows_read_at) */
	uint64_t *undo_ids;         /* (R * cap) local rows, ascending */
	float *undo_vals;           /* (R * cap, DIM) */
	size_t undo_n;
	int undo_ok;                /* the rows at v - 1 are undo's over the table */

	/* counters since init */
	uint64_t received, applied, dropped_stale, age_sum, age_max;
};

/* The rows [r0, r1) of the tables e at their initial values
 * (embed_init_rows with c->train.seed, what `local` starts from), the
 * sparse optimizer of [train] embedding_optimizer at zero, mode, W, R and
 * the staleness keys from c; total as psshard_init's; cap the most rows
 * one push holds (0: the range's). -EINVAL, -ENOMEM with one line in err;
 * s is left freeable. */
int psrows_init(struct psrows *s, const struct embed_spec *e, uint64_t r0, uint64_t r1,
		const struct config *c, long total, size_t cap, char *err, size_t errlen);
void psrows_free(struct psrows *s);   /* accepts NULL and zeroed structs */

/* What psrows_init allocates besides the rows and their optimizer state
 * for a range of n rows with c's mode, replicas_to_aggregate and cap:
 * sync, R slots of a push each, the union and the kept union; async, one
 * push's scratch (UINT64_MAX: past counting). For a ps's memory_limit. */
uint64_t psrows_buffer_bytes(const struct config *c, uint64_t n, size_t cap, int dim);

/* The index of the first of ids (n, global) that is not in range or not
 * above the one before it; n if all are fine. */
size_t psrows_bad_id(const struct psrows *s, const uint64_t *ids, size_t n);

/* Slice `slice`'s gradient for rows ids (n, global, ascending, in range),
 * vals (n, DIM), computed on version `version`. Sets *outcome
 * (PSSHARD_APPLIED, _WAITING or _STALE) and returns 0, or leaves
 * everything as it was and returns -EINVAL (a slice out of range, ids that
 * psrows_bad_id refuses, n over cap), -ERANGE (version above v), -EALREADY
 * (sync: this slice was pushed for v already) or -EDOM (a value is NaN or infinite:
 * optim_nonfinite(vals, n * DIM) says which). A stale push is not read.
 * vals is only read during the call. */
int psrows_push(struct psrows *s, int slice, uint64_t version, const uint64_t *ids, const float *vals,
		size_t n, enum psshard_outcome *outcome);

/* The values of rows ids (n, global, in range) into out (n, DIM). */
void psrows_read(const struct psrows *s, const uint64_t *ids, size_t n, float *out);

/* The same at version want where the rows can give it: the current
 * rows, or (sync) at v - 1, the last step's union as it was before that
 * step and the table for the rest (which that step did not touch). The
 * version read is returned: want, or v where it is not (want above v,
 * further back, or after a rewind). A step is trained again after a
 * worker was lost between its rows' push and its dense push (an elastic
 * cluster's survivors, docs/ELASTIC.md, or the worker itself, restarted
 * within peer_timeout) on the parameters it was first trained on, while
 * a ps that had every slice's rows has moved on: without this its rows
 * would be the next step's. */
uint64_t psrows_read_at(const struct psrows *s, uint64_t want, const uint64_t *ids, size_t n, float *out);

/* Sync: whether slice s's push for v has arrived. */
int psrows_has_pushed(const struct psrows *s, int slice);

/* The rows are at `version` from now on with no push waiting: a rollback
 * of the dense shard to a checkpoint (the rows themselves are not in it
 * yet, issue 39 part 5, and keep their values). */
void psrows_rewind(struct psrows *s, uint64_t version);

#endif
