/* Tests of cluster/members.c and of the decisions in cluster/recovery.c,
 * without sockets, threads or a clock: a table of events per scenario
 * (a connection authenticated, failed or closed; PULL; DONE; DONE leaving;
 * time passing) with what the ps must conclude after each: whether the
 * worker is waited for (lost or away), whether a lost worker's deadline
 * passed (the ps stops), whether the ps may finish, whether the run is
 * complete. The scenarios include the races that only end-to-end tests
 * caught before (commits 9f68695, 17ac67b, 78fe358, 43db199, a05c0f0). */
#include <criterion/criterion.h>

#include "leak.h"

#include <stdint.h>
#include <string.h>

#include "../cluster/members.h"
#include "../cluster/recovery.h"

TestSuite(members, .fini = leak_check);

enum op {
	JOIN,     /* worker w authenticated a connection */
	FAIL,     /* a connection of w ended with an error */
	CLOSE,    /* a connection of w ended without one (after DONE) */
	STOPPING, /* a connection of w ended while the ps stops */
	PULL,     /* w pulled */
	DONE,     /* w said DONE */
	LEAVING,  /* w said DONE(leaving) */
	TICK,     /* only time passes */
	END
};

/* One event at time t (ms) and what must hold after it. gone is
 * members_leave's result for FAIL, CLOSE and STOPPING; -2 in expired: not
 * checked. */
struct ev {
	enum op op;
	int w;
	int64_t t;
	int gone, expired, finished, complete;
};

#define NOCHK -2
#define EV_END { END, 0, 0, 0, 0, 0, 0 }

struct scenario {
	const char *name;
	int W;
	double peer_timeout;
	struct ev ev[16];
};

/* peer_timeout 10 s throughout: deadlines are t + 10000. */
static const struct scenario scenarios[] = {
	{ "every worker leaves after the run is complete", 2, 10, {
		{ JOIN, 0, 0, 0, -1, 0, 0 },
		{ JOIN, 1, 0, 0, -1, 0, 0 },
		{ DONE, 1, 100, 0, -1, 0, 0 },
		{ DONE, 0, 200, 0, -1, 0, 1 },
		{ LEAVING, 0, 200, 0, -1, 0, 1 },
		{ CLOSE, 0, 300, MEMBERS_GONE, -1, 0, 1 },
		{ LEAVING, 1, 400, 0, -1, 1, 1 }, /* its connection closes as the ps drains */
		{ CLOSE, 1, 400, MEMBERS_GONE, -1, 1, 1 },
		EV_END } },
	/* 9f68695: an async worker that finished, then lost a restarted ps,
	 * found ps 0 gone once the chief had left. A finished worker that
	 * closes before the run is complete is waited for. */
	{ "a finished worker away before the run is complete is waited for", 2, 10, {
		{ JOIN, 0, 0, 0, -1, 0, 0 },
		{ JOIN, 1, 0, 0, -1, 0, 0 },
		{ DONE, 1, 100, 0, -1, 0, 0 },
		{ CLOSE, 1, 1000, MEMBERS_AWAY, -1, 0, 0 },
		{ DONE, 0, 1500, 0, -1, 0, 1 },
		{ LEAVING, 0, 1500, 0, -1, 0, 1 },
		{ CLOSE, 0, 2000, MEMBERS_GONE, -1, 0, 1 },
		{ TICK, 0, 10999, 0, -1, 0, 1 },
		{ TICK, 0, 11000, 0, -1, 1, 1 }, /* done workers never expire */
		EV_END } },
	{ "a finished worker that comes back and leaves ends the wait", 2, 10, {
		{ JOIN, 0, 0, 0, -1, 0, 0 },
		{ JOIN, 1, 0, 0, -1, 0, 0 },
		{ DONE, 1, 100, 0, -1, 0, 0 },
		{ CLOSE, 1, 1000, MEMBERS_AWAY, -1, 0, 0 },
		{ DONE, 0, 1500, 0, -1, 0, 1 },
		{ LEAVING, 0, 1500, 0, -1, 0, 1 },
		{ CLOSE, 0, 1600, MEMBERS_GONE, -1, 0, 1 },
		{ JOIN, 1, 5000, 0, -1, 0, 1 },
		{ DONE, 1, 5000, 0, -1, 0, 1 },
		{ TICK, 0, 30000, 0, -1, 0, 1 }, /* back: no deadline */
		{ LEAVING, 1, 30000, 0, -1, 1, 1 },
		{ CLOSE, 1, 30100, MEMBERS_GONE, -1, 1, 1 },
		EV_END } },
	{ "a worker lost before DONE may come back within peer_timeout", 2, 10, {
		{ JOIN, 0, 0, 0, -1, 0, 0 },
		{ JOIN, 1, 0, 0, -1, 0, 0 },
		{ FAIL, 1, 1000, MEMBERS_LOST, -1, 0, 0 },
		{ TICK, 0, 10999, 0, -1, 0, 0 },
		{ JOIN, 1, 10999, 0, -1, 0, 0 },
		{ TICK, 0, 99999, 0, -1, 0, 0 },
		EV_END } },
	{ "a worker lost before DONE that stays away stops the ps", 3, 10, {
		{ JOIN, 0, 0, 0, -1, 0, 0 },
		{ JOIN, 1, 0, 0, -1, 0, 0 },
		{ JOIN, 2, 0, 0, -1, 0, 0 },
		{ FAIL, 2, 1000, MEMBERS_LOST, -1, 0, 0 },
		{ FAIL, 1, 2000, MEMBERS_LOST, -1, 0, 0 },
		{ TICK, 0, 10999, 0, -1, 0, 0 },
		{ TICK, 0, 11000, 0, 2, 0, 0 },
		{ TICK, 0, 12000, 0, 1, 0, 0 }, /* the lowest index first */
		EV_END } },
	/* A worker that reconnected before its old connection was found dead
	 * has a live connection: the old one's failure sets no deadline. */
	{ "a second live connection keeps a worker", 2, 10, {
		{ JOIN, 1, 0, 0, -1, 0, 0 },
		{ JOIN, 1, 500, 0, -1, 0, 0 },
		{ FAIL, 1, 1000, MEMBERS_LOST, -1, 0, 0 },
		{ TICK, 0, 50000, 0, -1, 0, 0 },
		{ FAIL, 1, 60000, MEMBERS_LOST, -1, 0, 0 },
		{ TICK, 0, 69999, 0, -1, 0, 0 },
		{ TICK, 0, 70000, 0, 1, 0, 0 },
		EV_END } },
	/* 17ac67b: the run is complete when the chief has said DONE, not
	 * when every worker has: a stopped backup worker must not hold the
	 * chief, and a worker finishing before the chief waits for it. */
	{ "complete is the chief's DONE", 3, 10, {
		{ DONE, 1, 0, 0, -1, 0, 0 },
		{ DONE, 2, 0, 0, -1, 0, 0 },
		{ DONE, 0, 100, 0, -1, 0, 1 },
		EV_END } },
	{ "complete with a backup worker that never finishes", 3, 10, {
		{ DONE, 0, 100, 0, -1, 0, 1 },
		EV_END } },
	/* 78fe358: a PULL cancels DONE (a worker rolled back trains again),
	 * the chief's too. */
	{ "a PULL cancels DONE and leaving", 2, 10, {
		{ JOIN, 0, 0, 0, -1, 0, 0 },
		{ JOIN, 1, 0, 0, -1, 0, 0 },
		{ DONE, 0, 0, 0, -1, 0, 1 },
		{ LEAVING, 1, 0, 0, -1, 0, 1 },
		{ PULL, 0, 10, 0, -1, 0, 0 },
		{ PULL, 1, 10, 0, -1, 0, 0 },
		{ FAIL, 1, 20, MEMBERS_LOST, -1, 0, 0 }, /* not done: lost */
		{ TICK, 0, 10020, 0, 1, 0, 0 },
		EV_END } },
	{ "a connection closed while the ps stops sets no deadline", 2, 10, {
		{ JOIN, 1, 0, 0, -1, 0, 0 },
		{ STOPPING, 1, 0, MEMBERS_GONE, -1, 0, 0 },
		{ TICK, 0, 99999, 0, -1, 0, 0 },
		EV_END } },
	{ "a lost worker's deadline is peer_timeout, not whole seconds", 1, 1.5, {
		{ JOIN, 0, 999, 0, -1, 0, 0 },
		{ FAIL, 0, 999, MEMBERS_LOST, -1, 0, 0 },
		{ TICK, 0, 2498, 0, -1, 0, 0 },
		{ TICK, 0, 2499, 0, 0, 0, 0 },
		EV_END } },
};

static const char *op_name(enum op o)
{
	static const char *n[] = { "JOIN", "FAIL", "CLOSE", "STOPPING", "PULL", "DONE", "LEAVING", "TICK", "END" };
	return n[o];
}

Test(members, scenarios)
{
	static struct members m;
	for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++) {
		const struct scenario *sc = &scenarios[i];
		members_init(&m, sc->W, sc->peer_timeout);
		for (int j = 0; sc->ev[j].op != END; j++) {
			const struct ev *e = &sc->ev[j];
			int gone = -1;
			switch (e->op) {
			case JOIN: members_join(&m, e->w); break;
			case FAIL: gone = (int)members_leave(&m, e->w, 1, 0, e->t, "it broke"); break;
			case CLOSE: gone = (int)members_leave(&m, e->w, 0, 0, e->t, NULL); break;
			case STOPPING: gone = (int)members_leave(&m, e->w, 1, 1, e->t, "stopping"); break;
			case PULL: members_pulled(&m, e->w); break;
			case DONE: members_done(&m, e->w, 0); break;
			case LEAVING: members_done(&m, e->w, 1); break;
			case TICK: case END: break;
			}
			if (gone >= 0)
				cr_expect_eq(gone, e->gone, "%s, event %d (%s %d): members_leave %d, want %d",
					     sc->name, j, op_name(e->op), e->w, gone, e->gone);
			if (e->expired != NOCHK)
				cr_expect_eq(members_expired(&m, e->t), e->expired,
					     "%s, event %d (%s %d at %lld ms): expired %d, want %d", sc->name, j,
					     op_name(e->op), e->w, (long long)e->t, members_expired(&m, e->t),
					     e->expired);
			cr_expect_eq(members_finished(&m, e->t), e->finished,
				     "%s, event %d (%s %d at %lld ms): finished %d, want %d", sc->name, j,
				     op_name(e->op), e->w, (long long)e->t, members_finished(&m, e->t), e->finished);
			cr_expect_eq(members_complete(&m), e->complete, "%s, event %d (%s %d): complete %d, want %d",
				     sc->name, j, op_name(e->op), e->w, members_complete(&m), e->complete);
		}
	}
}

Test(members, lost_why_is_the_lost_workers)
{
	static struct members m;
	members_init(&m, 3, 1);
	members_join(&m, 1);
	members_join(&m, 2);
	cr_assert_eq(members_leave(&m, 1, 1, 0, 0, "lost worker 1: reset"), MEMBERS_LOST);
	cr_assert_eq(members_leave(&m, 2, 1, 0, 500, "lost worker 2: timeout"), MEMBERS_LOST);
	cr_assert_eq(members_expired(&m, 1000), 1);
	cr_assert_str_eq(members_why(&m, 1), "lost worker 1: reset");
	cr_assert_str_eq(members_why(&m, 2), "lost worker 2: timeout");
}

/* A sync PULL stops waiting once every other worker is done. */
Test(members, others_done)
{
	static struct members m;
	members_init(&m, 3, 1);
	cr_assert_not(members_others_done(&m));
	members_done(&m, 1, 0);
	cr_assert_not(members_others_done(&m));
	members_done(&m, 1, 0); /* twice counts once */
	cr_assert_not(members_others_done(&m));
	members_done(&m, 2, 1);
	cr_assert(members_others_done(&m));
	cr_assert_not(members_all_done(&m));
	members_done(&m, 0, 0);
	cr_assert(members_all_done(&m));
	members_pulled(&m, 2);
	cr_assert_not(members_all_done(&m));
	cr_assert(members_others_done(&m));
}

/* The heartbeat's missing set: no gradient for the version yet and not
 * done. */
Test(members, missing)
{
	static struct members m;
	struct psshard sh;
	memset(&sh, 0, sizeof(sh));
	sh.workers = 10;
	sh.mode = MODE_SYNC;
	sh.pushed[0] = 1u << 3 | 1u << 9;
	members_init(&m, 10, 1);
	members_done(&m, 5, 0);
	uint8_t miss[4];
	memset(miss, 0xff, sizeof(miss));
	members_missing(&m, &sh, miss, 32);
	cr_assert_eq(miss[0], 0xff & ~(1u << 3) & ~(1u << 5), "%#x", miss[0]);
	cr_assert_eq(miss[1], 0x01, "%#x", miss[1]); /* 8 missing, 9 pushed, 10.. no workers */
	cr_assert_eq(miss[2], 0);
	cr_assert_eq(miss[3], 0);
	members_missing(&m, &sh, miss, 4); /* fewer bits than workers */
	cr_assert_eq(miss[0], 0x07, "%#x", miss[0]);
}

/* ---- recovery's decisions ---------------------------------------------- */

Test(members, recovery_spread)
{
	static const struct {
		int nps;
		uint64_t got[4], prev[4];
		int use_prev;
		uint64_t lo, hi;
		int back;
	} rows[] = {
		{ 1, { 7 }, { 7 }, 1, 7, 7, 0 },
		{ 3, { 5, 9, 6 }, { 0 }, 0, 5, 9, 0 },
		{ 3, { 5, 9, 6 }, { 5, 9, 6 }, 1, 5, 9, 0 },
		{ 3, { 5, 9, 6 }, { 5, 9, 7 }, 1, 5, 9, 1 },  /* ps 2 went back */
		{ 2, { 100, 40 }, { 100, 100 }, 1, 40, 100, 1 },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		uint64_t lo, hi;
		int back;
		recovery_spread(rows[i].got, rows[i].use_prev ? rows[i].prev : NULL, rows[i].nps, &lo, &hi, &back);
		cr_expect(lo == rows[i].lo && hi == rows[i].hi && back == rows[i].back,
			  "row %zu: lo %llu hi %llu back %d", i, (unsigned long long)lo, (unsigned long long)hi, back);
	}
}

/* Sync shards train on together within 2 W steps of each other (backup
 * workers), and only when none went back or all are at one step; a05c0f0:
 * at start a spread beyond that is pulled again, not taken for shards of
 * different checkpoints at once (recovery_start loops on this). */
/* Which links keep the parameters the worker held, for step lo again:
 * only where the shard moved on past lo, lo was the version pulled there,
 * and no PULL failed part way through that range since (it holds some of
 * a newer version, and zeros where a frame failed to open). */
Test(members, recovery_keeps)
{
	static const struct { uint64_t got, prev; int torn; uint64_t lo; int want; } rows[] = {
		{ 8, 7, 0, 7, 1 }, /* moved on, held lo: kept */
		{ 8, 7, 1, 7, 0 }, /* the same, torn by a failed PULL: the newer version serves */
		{ 7, 7, 0, 7, 0 }, /* still at lo: pulled */
		{ 8, 8, 0, 7, 0 }, /* had pulled lo + 1: pushed for lo already */
		{ 9, 6, 0, 7, 0 }, /* held an older version */
		{ 7, 6, 1, 7, 0 },
	};
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
		cr_expect_eq(recovery_keeps(rows[i].got, rows[i].prev, rows[i].torn, rows[i].lo),
			     rows[i].want, "row %zu", i);
}

Test(members, recovery_agree)
{
	static const struct {
		uint64_t lo, hi;
		int back, W, want;
	} rows[] = {
		{ 5, 5, 0, 2, 1 },
		{ 5, 9, 0, 2, 1 },    /* 2 W apart: backup workers */
		{ 5, 10, 0, 2, 0 },   /* more: different checkpoints, or a late answer */
		{ 0, 1000, 0, 4, 0 },
		{ 3, 5, 1, 2, 0 },    /* one went back: roll the others back first */
		{ 5, 5, 1, 2, 1 },    /* went back, but all at one step */
		{ 0, 0, 0, 1, 1 },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		cr_expect_eq(recovery_agree(rows[i].lo, rows[i].hi, rows[i].back, rows[i].W), rows[i].want,
			     "row %zu", i);
}

/* Async: the shards that went back and the lowest of them (the ROLLBACK
 * target), and the global step, lowest version / W. */
Test(members, recovery_async)
{
	uint64_t target;
	const uint64_t got[] = { 10, 4, 7 }, prev[] = { 10, 9, 8 };
	cr_assert_eq(recovery_went_back(got, prev, 3, &target), 2);
	cr_assert_eq(target, 4);
	cr_assert_eq(recovery_went_back(got, got, 3, &target), 0);
	const uint64_t all[] = { 1, 2, 3 };
	cr_assert_eq(recovery_went_back(all, prev, 3, &target), 3);
	cr_assert_eq(target, 1);
	cr_assert_eq(recovery_async_step(got, 3, 2), 2);
	cr_assert_eq(recovery_async_step(got, 3, 1), 4);
	cr_assert_eq(recovery_async_step(got, 1, 3), 3);
}

/* 43db199: while reconnecting, a healthy ps reached with the last
 * milliseconds of the deadline times out too; the ps that used the time
 * up (k0) stays the one named ('gave up on ps 0' was printed for a
 * SIGSTOPped ps 1). */
Test(members, recovery_blame)
{
	cr_assert(recovery_blame(1, 1, 0.0));      /* the same ps */
	cr_assert_not(recovery_blame(0, 1, 0.001)); /* out of time: not its fault */
	cr_assert_not(recovery_blame(0, 1, 0.05));
	cr_assert(recovery_blame(0, 1, 0.051));     /* time was left: it failed */
	cr_assert(recovery_blame(2, 0, 30));
}

/* What a REPORT says of each worker as a run goes: absent, live, lost,
 * live again, done, away, done again, left. */
Test(members, state_for_reports)
{
	struct members m;
	members_init(&m, 2, 10);
	cr_assert_eq(members_state(&m, 0), MEMBERS_IS_ABSENT);
	members_join(&m, 0);
	cr_assert_eq(members_state(&m, 0), MEMBERS_IS_LIVE);
	members_leave(&m, 0, 1, 0, 100, "reset");
	cr_assert_eq(members_state(&m, 0), MEMBERS_IS_LOST);
	members_join(&m, 0);
	cr_assert_eq(members_state(&m, 0), MEMBERS_IS_LIVE);
	members_done(&m, 0, 0);
	cr_assert_eq(members_state(&m, 0), MEMBERS_IS_DONE);
	members_leave(&m, 0, 0, 0, 200, NULL);
	cr_assert_eq(members_state(&m, 0), MEMBERS_IS_AWAY);
	members_join(&m, 0);
	cr_assert_eq(members_state(&m, 0), MEMBERS_IS_DONE);
	members_done(&m, 0, 1);
	cr_assert_eq(members_state(&m, 0), MEMBERS_IS_LEFT);
	members_leave(&m, 0, 0, 0, 300, NULL);
	cr_assert_eq(members_state(&m, 0), MEMBERS_IS_LEFT);
	/* a worker whose connection closed cleanly before training: absent */
	members_join(&m, 1);
	members_leave(&m, 1, 0, 0, 300, NULL);
	cr_assert_eq(members_state(&m, 1), MEMBERS_IS_ABSENT);
}

/* ---- elastic (issue 40) -------------------------------------------------- */

/* The workers a view may hold: seen, ready (pulled), connected, neither
 * done, going nor dropped; min_workers is the caller's to compare with. */
Test(members, view_needs_ready_workers)
{
	static struct members m;
	struct view v;
	members_init(&m, 4, 10);
	members_elastic(&m, 2, 0);
	cr_assert(m.elastic);
	members_candidates(&m, &v, 4);
	cr_assert_eq(view_count(&v), 0);
	members_join(&m, 0);
	members_join(&m, 1);
	members_candidates(&m, &v, 4);
	cr_assert_eq(view_count(&v), 0, "connected, not ready until it pulls");
	members_pulled(&m, 0);
	members_pulled(&m, 1);
	members_candidates(&m, &v, 4);
	cr_assert_eq(view_count(&v), 2);
	cr_assert(view_has(&v, 0) && view_has(&v, 1));
	cr_assert_eq(v.S, 4);
	members_going(&m, 1);
	members_candidates(&m, &v, 4);
	cr_assert(!view_has(&v, 1), "a worker that said LEAVE gets no later slice");
	cr_assert_eq(members_live_count(&m, 0), 1);
	cr_assert_eq(members_state(&m, 1), MEMBERS_IS_GOING);
	members_pulled(&m, 1); /* back: a new worker */
	members_candidates(&m, &v, 4);
	cr_assert(view_has(&v, 1));
	/* not elastic: min_workers = the workers listed */
	static struct members f;
	members_init(&f, 4, 10);
	members_elastic(&f, 4, 0);
	cr_assert(!f.elastic);
}

/* Elastic, the end: workers never seen are not waited for, the chief
 * always is; a dropped worker (lost past its deadline) is not; one that
 * left (DONE, leaving) is done. */
Test(members, elastic_waits_for_seen_workers_only)
{
	static struct members m;
	members_init(&m, 4, 1);
	members_elastic(&m, 1, 0);
	cr_assert_not(members_all_done(&m), "the chief is always awaited");
	members_join(&m, 0);
	members_join(&m, 1);
	members_join(&m, 2);
	members_done(&m, 1, 1);
	cr_assert_not(members_others_done(&m), "0 and 2 are training");
	members_leave(&m, 2, 1, 0, 1000, "killed");
	cr_assert_eq(members_expired(&m, 1500), -1);
	cr_assert_eq(members_expired(&m, 2000), 2);
	members_drop(&m, 2);
	cr_assert_eq(members_expired(&m, 3000), -1, "dropped: not expired again");
	cr_assert_eq(members_state(&m, 2), MEMBERS_IS_DROPPED);
	cr_assert(members_others_done(&m));
	cr_assert_not(members_all_done(&m));
	members_done(&m, 0, 0);
	cr_assert(members_all_done(&m), "worker 3 never came: not waited for");
	cr_assert(members_complete(&m));
	members_done(&m, 0, 1);
	members_leave(&m, 0, 0, 0, 4000, NULL);
	members_leave(&m, 1, 0, 0, 4000, NULL);
	cr_assert(members_finished(&m, 4000));
}

/* The events ring keeps the newest 8, oldest first. */
Test(members, events_keep_the_newest)
{
	static struct members m;
	struct members_event ev[MEMBERS_EVENTS];
	members_init(&m, 4, 1);
	cr_assert_eq(members_events(&m, ev, MEMBERS_EVENTS), 0);
	for (int i = 0; i < 11; i++)
		members_event(&m, (uint64_t)(10 * i), i % 4, (enum members_event_kind)(1 + i % 3));
	int n = members_events(&m, ev, MEMBERS_EVENTS);
	cr_assert_eq(n, 8);
	for (int i = 0; i < n; i++) {
		cr_assert_eq(ev[i].step, (uint64_t)(10 * (i + 3)));
		cr_assert_eq(ev[i].w, (i + 3) % 4);
		cr_assert_eq((int)ev[i].kind, 1 + (i + 3) % 3);
	}
	cr_assert_eq(members_events(&m, ev, 2), 2);
	cr_assert_eq(ev[1].step, 100, "the newest two");
}
