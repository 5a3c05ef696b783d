/* Who computes which slice of a step (docs/ELASTIC.md): the live set of
 * one step and the slices it gives each worker. The step's numbers do not
 * depend on it (core/job.h: a slice is a function of the step and its
 * index; cluster/psshard.h sums the slices in slice order), so a view only
 * spreads the work.
 *
 * The owner of slice s among L live workers is live worker number
 * floor(s·L / S), counting the live workers in index order: contiguous
 * ranges of slices, in worker-index order, whose sizes differ by at most
 * one (none for some workers when L > S). A revision (the view `now` of
 * the same step, its base minus workers lost mid-step) keeps every slice
 * whose base owner is still live where it is, so no finished work is
 * redone, and spreads the orphans, in slice order, over the survivors by
 * the same rule.
 *
 * Pure: no sockets, threads or clock; tested in tests/test_view.c. */
#ifndef PSTRAIN_CLUSTER_VIEW_H
#define PSTRAIN_CLUSTER_VIEW_H

#include <stdint.h>

#include "../core/config/config.h"

#define VIEW_MAX CONFIG_MAX_HOSTS
#define VIEW_WORDS (VIEW_MAX / 64)

struct view {
	uint64_t version;           /* the step it is for */
	uint32_t rev;               /* revisions of that step's view */
	int S, W;                   /* slices; workers that may be live (0..W-1) */
	uint64_t live[VIEW_WORDS];  /* bit w: worker w computes slices */
};

/* S slices (1..VIEW_MAX) over W possible workers (1..VIEW_MAX), none live. */
void view_init(struct view *v, int S, int W);
/* Every one of the W workers live. */
void view_all(struct view *v, int S, int W);

void view_set(struct view *v, int w, int live);
int view_has(const struct view *v, int w);
/* How many workers are live. */
int view_count(const struct view *v);

/* The worker that computes slice s under now, whose base is the step's
 * view as first fixed (NULL: now is the base); -1 when no worker is live. */
int view_owner(const struct view *now, const struct view *base, int s);

/* view_owner of every slice s into owner[s] (room for S). */
void view_owners(const struct view *now, const struct view *base, int *owner);

/* Worker w's slices under now (base as for view_owner), in slice order,
 * into out (room for S); returns how many. */
int view_slices(const struct view *now, const struct view *base, int w, int *out);

#endif
