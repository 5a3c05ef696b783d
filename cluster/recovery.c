/* See recovery.h. */
#include "recovery.h"

#include "../base/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void recovery_spread(const uint64_t *got, const uint64_t *prev, int nps, uint64_t *lo,
		     uint64_t *hi, int *back)
{
	*lo = *hi = got[0];
	*back = 0;
	for (int k = 0; k < nps; k++) {
		uint64_t g = got[k];
		*lo = g < *lo ? g : *lo;
		*hi = g > *hi ? g : *hi;
		*back |= prev && g < prev[k];
	}
}

int recovery_agree(uint64_t lo, uint64_t hi, int back, int W)
{
	return (!back || lo == hi) && hi - lo <= 2 * (uint64_t)W;
}

int recovery_keeps(uint64_t got, uint64_t prev, int torn, uint64_t lo)
{
	return got > lo && prev == lo && !torn;
}

int recovery_went_back(const uint64_t *got, const uint64_t *prev, int nps, uint64_t *target)
{
	int nback = 0;
	*target = UINT64_MAX;
	for (int k = 0; k < nps; k++)
		if (got[k] < prev[k]) {
			nback++;
			*target = got[k] < *target ? got[k] : *target;
		}
	return nback;
}

long recovery_async_step(const uint64_t *got, int nps, int S)
{
	uint64_t lo = got[0];
	for (int k = 1; k < nps; k++)
		lo = got[k] < lo ? got[k] : lo;
	return (long)(lo / (uint64_t)S);
}

int recovery_blame(int k, int k0, double left_s)
{
	return k == k0 || left_s > 0.05;
}

static void gots(const struct links *lk, uint64_t *got)
{
	for (int k = 0; k < lk->nps; k++)
		got[k] = lk->ln[k].got;
}

/* Whether a stop (SIGTERM, SIGINT) ends the recovery under way: not an
 * elastic worker's other than the chief's, whose stop is a leave
 * (docs/ELASTIC.md): it recovers first, bounded by peer_timeout as ever,
 * and leaves at its next step, rather than exit 130 as a lost one. */
static int stopping(const struct links *lk)
{
	return *lk->sh.stop && !(config_elastic(lk->sh.c) && lk->sh.index != 0);
}

static uint64_t lowest(const struct links *lk)
{
	uint64_t got[CONFIG_MAX_HOSTS] = { 0 }, lo, hi;
	int back;
	gots(lk, got);
	recovery_spread(got, NULL, lk->nps, &lo, &hi, &back);
	return lo;
}

/* Sync, elastic: shards a step apart (this worker pulled while the others
 * trained): every one asked for the highest version, which those behind
 * reach once the step under way completes. None gets past it while this
 * worker, ready since its first pull, holds slices of it: ps 0 puts it in
 * every view it fixes from then on. A shard that answers higher (past a
 * view fixed before this worker was ready) starts another round. */
static int catch_up(struct links *lk, float *params, char *err, size_t errlen)
{
	for (int round = 0; round < 8; round++) {
		uint64_t got[CONFIG_MAX_HOSTS] = { 0 }, lo, hi;
		int back;
		gots(lk, got);
		recovery_spread(got, NULL, lk->nps, &lo, &hi, &back);
		if (lo == hi)
			return 0;
		for (int k = 0; k < lk->nps; k++)
			lk->ln[k].got = hi - 1;
		int e = links_pull(lk, params, 0, err, errlen);
		if (e)
			return e;
	}
	return err_set(err, errlen, -ECONNABORTED, "worker %d: the shards stay apart while the others train",
		       lk->sh.index);
}

/* Sync, elastic, reconnected with the shards a step apart (lo, lo + 1).
 * Where ps 0 is at lo and this worker was training step lo (its kept
 * parameters are of lo), it trains lo again: ps 0 was left a slice short
 * (a worker lost after pushing it to some ps, which went on: pushes reach
 * ps 0 last), and has given it out again, or its pushes are still on the
 * way. The shards that went on take the kept parameters of lo back, and
 * its pushes of lo to them are dropped as stale. Otherwise (a worker
 * that joined, or ps 0 ahead) catch_up. */
static int again_or_catch_up(struct links *lk, float *params, const uint64_t *got, uint64_t lo, char *err,
			     size_t errlen)
{
	if (got[0] != lo || !lk->has_kept || lk->kept_v != lo)
		return catch_up(lk, params, err, errlen);
	for (int k = 0; k < lk->nps; k++) {
		struct link *l = &lk->ln[k];
		if (got[k] > lo)
			memcpy(params + l->range.begin, lk->kept + l->range.begin,
			       (l->range.end - l->range.begin) * sizeof(float));
		l->got = lo;
	}
	return 0;
}

int recovery_start(struct links *lk, float *params, long total, long *start, char *err,
		   size_t errlen)
{
	const struct config *c = lk->sh.c;
	int W = c->cluster.nworkers;
	/* The first pull says where the shards are: 0, or in sync mode the
	 * step of the checkpoint they resumed from, the same on every shard. */
	int e = links_pull(lk, params, 1, err, errlen);
	if (!e && c->train.mode == MODE_SYNC && config_elastic(c))
		e = catch_up(lk, params, err, errlen);
	if (e)
		return e;
	if (c->train.mode == MODE_ASYNC) {
		/* The global step, as after a lost ps: 0 in a fresh run (a
		 * worker that joins late skips the steps the cluster has done),
		 * else where a resumed or running cluster is, so a resumed run
		 * does not train the whole run again. */
		uint64_t got[CONFIG_MAX_HOSTS] = { 0 };
		gots(lk, got);
		*start = recovery_async_step(got, lk->nps, lk->sh.s->job.S);
		if (*start > 0 && *start < total)
			role_log(lk->sh.out, "worker %d: continuing at step %ld of %ld, where the shards are (version %llu)",
				 lk->sh.index, *start, total, (unsigned long long)lowest(lk));
		return 0;
	}
	/* With backup workers (replicas_to_aggregate < workers) the shards
	 * run ahead of a late worker and may differ by a step or two; shards
	 * restored from different checkpoints differ by far more, and would
	 * wait for each other forever. */
	double until = progress_now() + c->cluster.peer_timeout;
	for (int again = 0;; again++) {
		uint64_t got[CONFIG_MAX_HOSTS] = { 0 }, lo, hi;
		int back;
		gots(lk, got);
		recovery_spread(got, NULL, lk->nps, &lo, &hi, &back);
		if (recovery_agree(lo, hi, back, W)) {
			*start = (long)lo;
			break;
		}
		/* Or one shard answered before and another after the backup
		 * workers' next steps (a busy machine): pulled again, they
		 * agree. */
		if (progress_now() >= until || *lk->sh.stop)
			return err_set(err, errlen, -ECONNABORTED,
				       "the ps tasks are at steps %llu to %llu: restart every ps so they load the same checkpoint",
				       (unsigned long long)lo, (unsigned long long)hi);
		if (!again)
			role_log(lk->sh.out, "worker %d: the shards are at steps %llu to %llu: pulling again until they agree (up to %g s, peer_timeout)",
				 lk->sh.index, (unsigned long long)lo, (unsigned long long)hi, c->cluster.peer_timeout);
		role_nap_ms(50);
		e = links_pull(lk, params, 1, err, errlen);
		if (e)
			return e;
	}
	if (*start > 0 && *start < total)
		role_log(lk->sh.out, "worker %d: continuing at step %ld of %ld, where the shards are", lk->sh.index,
			 *start, total);
	return 0;
}

/* What the parameters held when the exchange failed, and which links'
 * ranges of them were torn by a PULL that failed part way (link.h). */
struct kept {
	float *v;
	int torn[CONFIG_MAX_HOSTS];
};

/* Sync, the shards at versions lo..hi and none went back: some had the
 * gradients of step lo from every worker and moved on while the lost link
 * cost another its copy. Every worker does step lo again, with the
 * parameters of version lo: pulled where a shard is at lo, and where it
 * has moved on, the ones this worker held (keep) if they are of version lo
 * (recovery_keeps). Otherwise this worker had pushed for lo there already,
 * and what it pushes again is dropped as a duplicate whatever it
 * computes; or a failed PULL tore that range (some of a newer version,
 * and zeros where a frame failed to open), and the newer version pulled
 * there serves, a step apart, as it does without keep. */
static void keep_step(struct links *lk, float *params, const struct kept *keep,
		      const uint64_t *prev, uint64_t lo)
{
	for (int k = 0; k < lk->nps; k++) {
		struct link *l = &lk->ln[k];
		if (recovery_keeps(l->got, prev[k], keep->torn[k], lo))
			memcpy(params + l->range.begin, keep->v + l->range.begin,
			       (l->range.end - l->range.begin) * sizeof(float));
		l->got = lo;
	}
}

/* Async, connected to every ps and just pulled: a shard below the version
 * this worker had pulled from it (prev) went back, restarted from its
 * newest complete checkpoint or rolled back by another worker. If some
 * went back and others did not, the others are told to go back too:
 * ROLLBACK of the lowest version among those that went back, which each ps
 * resolves to the newest complete checkpoint at or below it (the one the
 * restarted ps resumed from, although others may have pushed to it since).
 * If all went back, someone did that already. Then the worker continues
 * at the global step, lowest version / S, so the steps since that
 * checkpoint are trained again; if none went back (a ps that was only
 * unreachable), at its own step. */
static int resync_async(struct links *lk, float *params, const uint64_t *prev, long *start,
			char *err, size_t errlen)
{
	uint64_t got[CONFIG_MAX_HOSTS] = { 0 }, target;
	gots(lk, got);
	int nback = recovery_went_back(got, prev, lk->nps, &target);
	if (nback && nback < lk->nps) {
		role_log(lk->sh.out, "worker %d: a ps went back to step %llu (restarted from its newest checkpoint): rolling every shard back to it",
			 lk->sh.index, (unsigned long long)target);
		int r = links_rollback(lk, target, err, errlen);
		if (!r)
			r = links_pull(lk, params, 1, err, errlen);
		if (r)
			return r;
	}
	if (!nback) {
		role_log(lk->sh.out, "worker %d: reconnected to every ps; carrying on", lk->sh.index);
		return 0;
	}
	gots(lk, got);
	*start = recovery_async_step(got, lk->nps, lk->sh.s->job.S);
	role_log(lk->sh.out, "worker %d: reconnected to every ps; the shards are at version %llu: continuing at step %ld",
		 lk->sh.index, (unsigned long long)lowest(lk), *start);
	return 0;
}

/* Sync, connected to every ps: pulls until the shards agree (rolling them
 * back to the lowest step when one went back). 1: not yet (pull again);
 * 0: agreed, *start set; negative: failed (last says why). */
static int resync_sync(struct links *lk, float *params, const struct kept *keep, uint64_t *prev,
		       long *start, char *last, size_t lastlen)
{
	uint64_t got[CONFIG_MAX_HOSTS] = { 0 }, lo, hi;
	int back, W = lk->sh.c->cluster.nworkers;
	gots(lk, got);
	recovery_spread(got, prev, lk->nps, &lo, &hi, &back);
	if (!back && lo != hi && config_elastic(lk->sh.c)) {
		int r = again_or_catch_up(lk, params, got, lo, last, lastlen);
		if (r)
			return r;
		gots(lk, got);
		recovery_spread(got, NULL, lk->nps, &lo, &hi, &back);
	}
	/* Any worker that sees it sends ROLLBACK, not only the chief: the
	 * chief may be waiting on another shard for this worker's gradient,
	 * and would not notice the restart. A second ROLLBACK to the same
	 * step is a no-op. */
	if (back && lo != hi) {
		role_log(lk->sh.out, "worker %d: the shards are at steps %llu to %llu (a ps restarted from its newest checkpoint): rolling every shard back to step %llu",
			 lk->sh.index, (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)lo);
		int r = links_rollback(lk, lo, last, lastlen);
		if (!r)
			r = links_pull(lk, params, 1, last, lastlen);
		if (r)
			return r;
		gots(lk, got);
		for (int k = 0; k < lk->nps; k++)
			prev[k] = got[k];
		recovery_spread(got, NULL, lk->nps, &lo, &hi, &back);
	}
	if (!recovery_agree(lo, hi, back, W))
		return 1;
	if (lo != hi && keep->v)
		keep_step(lk, params, keep, prev, lo);
	*start = (long)lo;
	role_log(lk->sh.out, "worker %d: reconnected to every ps; continuing at step %llu", lk->sh.index,
		 (unsigned long long)lo);
	return 0;
}

/* Reconnects to every ps within the deadline `end`. Returns 0, -EINVAL
 * (an address that cannot work, err says which), or another negative
 * errno with the failing ps in *k0 and its reason in last. */
static int reconnect(struct links *lk, double end, int *k0, char *last, size_t lastlen, char *err,
		     size_t errlen)
{
	links_disconnect(lk);
	lk->lost = -1;
	int r = 0;
	lk->sh.dial_on = *lk->sh.stop && !stopping(lk);
	for (int k = 0; k < lk->nps && !r; k++) {
		double ms = (end - progress_now()) * 1000;
		char why_k[512];
		r = links_connect_one(lk, k, ms < 1 ? 1 : (int)ms, why_k, sizeof(why_k));
		if (r == -EINVAL)
			return err_set(err, errlen, r, "%s", why_k);
		if (r && recovery_blame(k, *k0, end - progress_now())) {
			*k0 = k;
			snprintf(last, lastlen, "%s", why_k);
		}
	}
	lk->sh.dial_on = 0;
	return r;
}

static int resync_loop(struct links *lk, float *params, const struct kept *keep, uint64_t *prev,
		       long *start, const char *why, char *err, size_t errlen)
{
	const struct config *c = lk->sh.c;
	int sync = c->train.mode == MODE_SYNC;
	int k0 = lk->lost;
	char nm[300], last[512];
	if (lk->sh.pg)
		progress_clear(lk->sh.pg);
	role_log(lk->sh.out, "worker %d: %s; reconnecting for up to %g s (peer_timeout)", lk->sh.index, why,
		 c->cluster.peer_timeout);
	snprintf(last, sizeof(last), "%s", why);
	double end = progress_now() + c->cluster.peer_timeout;
	long pause = 100;
	int said_wait = 0;
	for (int tries = 0;; tries++) {
		if (stopping(lk))
			return err_set(err, errlen, -EINTR, "worker %d: interrupted while reconnecting", lk->sh.index);
		double left = end - progress_now();
		if (left <= 0)
			return err_set(err, errlen, -ECONNABORTED, "worker %d: gave up on %s after %g s (peer_timeout): %s",
				       lk->sh.index, link_ps_name(c, k0, nm, sizeof(nm)), c->cluster.peer_timeout, last);
		if (tries) {
			role_nap_ms(pause < left * 1000 ? pause : (long)(left * 1000));
			pause = pause * 2 > 1000 ? 1000 : pause * 2;
		}
		int r = reconnect(lk, end, &k0, last, sizeof(last), err, errlen);
		if (r == -EINVAL)
			return r;
		if (r)
			continue;
		/* Connected to all: pull until the shards agree. */
		for (;;) {
			r = links_pull(lk, params, 1, last, sizeof(last));
			if (r)
				break;
			if (!sync) {
				r = resync_async(lk, params, prev, start, last, sizeof(last));
				if (r)
					break;
				return 0;
			}
			r = resync_sync(lk, params, keep, prev, start, last, sizeof(last));
			if (r <= 0)
				break;
			uint64_t got[CONFIG_MAX_HOSTS] = { 0 }, lo, hi;
			int back;
			gots(lk, got);
			recovery_spread(got, NULL, lk->nps, &lo, &hi, &back);
			if (progress_now() >= end || stopping(lk))
				return err_set(err, errlen, -ECONNABORTED,
					       "worker %d: the ps tasks stay at steps %llu to %llu: restart every ps so they load the same checkpoint",
					       lk->sh.index, (unsigned long long)lo, (unsigned long long)hi);
			if (!said_wait++)
				role_log(lk->sh.out, "worker %d: the shards are at steps %llu to %llu: waiting for them to agree",
					 lk->sh.index, (unsigned long long)lo, (unsigned long long)hi);
			role_nap_ms(100);
		}
		if (r == 0)
			return 0;
		if (lk->lost >= 0)
			k0 = lk->lost;
		else
			return err_set(err, errlen, -ECONNABORTED, "%s", last);
	}
}

int recovery_resync(struct links *lk, float *params, long *start, const char *why, char *err,
		    size_t errlen)
{
	int sync = lk->sh.c->train.mode == MODE_SYNC;
	uint64_t prev[CONFIG_MAX_HOSTS];
	gots(lk, prev);
	/* What params hold now, for keep_step; without it (no memory)
	 * recovery still works, but may apply one step's gradient computed
	 * from parameters a step apart. */
	size_t P = lk->ln[lk->nps - 1].range.end;
	struct kept keep = { .v = sync ? malloc(P * sizeof(float)) : NULL };
	if (keep.v)
		memcpy(keep.v, params, P * sizeof(float));
	for (int k = 0; k < lk->nps; k++)
		keep.torn[k] = lk->ln[k].torn;
	int r = resync_loop(lk, params, &keep, prev, start, why, err, errlen);
	free(keep.v);
	return r;
}
