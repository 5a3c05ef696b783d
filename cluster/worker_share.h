/* A worker's share of a step in an elastic cluster (docs/ELASTIC.md):
 * which slices it trains, from the newest VIEW ps 0 sent with the
 * parameters (cluster/link.c keeps it in link_shared). */
#ifndef PSTRAIN_CLUSTER_WORKER_SHARE_H
#define PSTRAIN_CLUSTER_WORKER_SHARE_H

#include <stddef.h>

#include "links.h"

/* Worker `index`'s slices of `step` (of S) under the newest VIEW, in
 * slice order, into mine (room for S), how many in *n, and the workers
 * the view holds in *live; sync, params (P: the step's parameters) kept
 * for a recovery (links_keep). sync: the VIEW must be of that step (ps 0
 * sends each step's before its parameters), else -EPROTO; async: the
 * newest is the one. -EPROTO too for none at all, or one of another S. */
int worker_share(struct links *lk, const float *params, int sync, long step, int index, int S, int *mine,
		 int *n, int *live, char *err, size_t errlen);

/* A step with no slice here (a view of more workers than slices, or one
 * fixed before this worker was ready): only the next parameters into
 * params (P). Async pulls the newest, so it naps first rather than spin. */
int worker_share_idle(struct links *lk, float *params, char *err, size_t errlen);

/* After the pushes of its last step (`step` of total, counted from 1),
 * having said LEAVE: DONE(leaving) to every ps, and one line. */
int worker_share_leave(struct links *lk, long step, long total, char *err, size_t errlen);

#endif
