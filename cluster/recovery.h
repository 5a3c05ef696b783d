/* Where a worker trains from when the shards are not where it left them:
 * at start (pull until the shards agree), and after a lost or rolled-back
 * shard (reconnect to every ps, agree on one step, ROLLBACK the others to
 * a restarted ps's checkpoint). Each returns the step to continue at; the
 * worker's loop then goes on from there.
 *
 * The decisions themselves are the pure functions at the end (no sockets,
 * no clock), unit-tested in tests/test_members.c. */
#ifndef PSTRAIN_CLUSTER_RECOVERY_H
#define PSTRAIN_CLUSTER_RECOVERY_H

#include <stdint.h>

#include "links.h"

/* After the links are connected: pulls every shard into params (P) until
 * the shards agree (sync: within 2 W steps of each other, for up to
 * peer_timeout; async: any versions) and sets *start to the step to train
 * from: sync, the lowest shard version; async, the global step (lowest
 * version / S, the slices of a step). A step at or past total is a
 * finished run (the caller says so; total only bounds the log line here);
 * shards that stay apart -ECONNABORTED. */
int recovery_start(struct links *lk, float *params, long total, long *start, char *err,
		   size_t errlen);

/* After a lost ps (lk->lost; why says how): reconnects to every ps with
 * backoff for up to peer_timeout, then pulls where the shards are. In sync
 * mode a ps that came back at an older step was restarted from the newest
 * complete checkpoint: ROLLBACK makes every shard go back to that step.
 * Sets *start to the step to continue at (async: left alone when no shard
 * went back) and params to its parameters. */
int recovery_resync(struct links *lk, float *params, long *start, const char *why, char *err,
		    size_t errlen);

/* ---- the decisions ------------------------------------------------------ */

/* The shards' versions got[nps] after a pull: lowest, highest, and whether
 * any is below what this worker had pulled from it before (prev; NULL:
 * none): a ps that went back, restarted from a checkpoint or rolled back. */
void recovery_spread(const uint64_t *got, const uint64_t *prev, int nps, uint64_t *lo,
		     uint64_t *hi, int *back);

/* Sync: whether shards at lo..hi may train on together. With backup
 * workers (replicas_to_aggregate < W) they may differ by a step or two
 * (up to 2 W); shards restored from different checkpoints differ by far
 * more, or one went back (back) and the others must roll back first. */
int recovery_agree(uint64_t lo, uint64_t hi, int back, int W);

/* Sync, the shards at lo..hi (lo < hi): whether a link's range of the
 * parameters keeps what this worker held when its exchange failed, for
 * step lo again: its shard moved on (got > lo), the worker had pulled lo
 * there (prev == lo), and no PULL tore that range since (torn: link.h). */
int recovery_keeps(uint64_t got, uint64_t prev, int torn, uint64_t lo);

/* Async: how many shards went back (got[k] < prev[k]) and, if any, the
 * lowest version among them in *target. */
int recovery_went_back(const uint64_t *got, const uint64_t *prev, int nps, uint64_t *target);

/* Async: the global step of shards at got[nps], lowest version / S
 * (async versions count pushes, one per slice: S a step). */
long recovery_async_step(const uint64_t *got, int nps, int S);

/* While reconnecting, ps k failed with left_s seconds of peer_timeout
 * left; k0 is the ps named so far. Whether k is the one to name: a healthy
 * ps reached with the last milliseconds of the deadline times out too, so
 * it is named only if it is k0 already or time was left. */
int recovery_blame(int k, int k0, double left_s);

#endif
