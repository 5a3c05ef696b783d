/* Which workers a ps has: live (an authenticated connection open), done
 * (said DONE; a PULL cancels it), leaving (said DONE(leaving): saw the run
 * complete and closes), and, for a worker with no connection, the deadline
 * by which it must be back: peer_timeout after a worker that had not said
 * DONE lost its connection (lost), or after one that had said DONE closed
 * before the run was complete (away). Also the heartbeat's "missing" set.
 *
 * Elastic (docs/ELASTIC.md: [cluster] min_workers below the workers
 * listed): a worker is seen once it has connected and ready once it has
 * pulled (it pulls only once it reaches every ps); ps 0 gives the ready
 * ones that are live and neither going (said it leaves after its pushes)
 * nor dropped (lost past peer_timeout with enough others left) the slices
 * of each step (the view, kept here with its base so that the heartbeat
 * names who is missing), and only seen workers are waited for at the end.
 * Events (joined, left, lost) are kept for `pstrain status`.
 *
 * Pure state: no sockets, no threads, no clock. Time is passed in as
 * milliseconds on any monotonic clock; the ps calls these under its lock
 * (docs/PROTOCOL.md, "Failures" and "Finishing"). */
#ifndef PSTRAIN_CLUSTER_MEMBERS_H
#define PSTRAIN_CLUSTER_MEMBERS_H

#include <stddef.h>
#include <stdint.h>

#include "../core/config/config.h"
#include "psshard.h"
#include "view.h"

#define MEMBERS_MAX CONFIG_MAX_HOSTS
#define MEMBERS_WHY_MAX 512
#define MEMBERS_EVENTS 8

/* What happened to a worker at a step, for `pstrain status`. */
enum members_event_kind {
	MEMBERS_EV_JOINED = 1, /* in a step's view, and not in the one before */
	MEMBERS_EV_LEFT = 2,   /* said it leaves: out of the views from the next step */
	MEMBERS_EV_LOST = 3,   /* dropped: lost past peer_timeout, its slices given out again */
};

struct members_event {
	uint64_t step;
	int w;
	enum members_event_kind kind;
};

struct members {
	int W;
	int64_t grace_ms;                   /* peer_timeout */
	int ndone;
	unsigned char done[MEMBERS_MAX];
	unsigned char leaving[MEMBERS_MAX];
	int live[MEMBERS_MAX];              /* authenticated connections per worker */
	unsigned char due[MEMBERS_MAX];     /* a deadline is set */
	int64_t deadline[MEMBERS_MAX];      /* ms */
	char why[MEMBERS_MAX][MEMBERS_WHY_MAX]; /* why a lost worker was lost */
	uint64_t greeted[MEMBERS_MAX];      /* newest greeting time answered, ns */

	/* elastic (members_elastic) */
	int elastic, min;                   /* min_workers */
	int blind;                          /* not ps 0: holds no view, names nobody missing */
	unsigned char seen[MEMBERS_MAX];    /* a connection of it was confirmed */
	unsigned char ready[MEMBERS_MAX];   /* it pulled: every ps is reachable from it */
	unsigned char going[MEMBERS_MAX];   /* said it leaves after the pushes that follow */
	unsigned char dropped[MEMBERS_MAX]; /* lost past its deadline, not waited for */
	int has_view;                       /* ps 0: view and base hold a step's */
	struct view view, base;             /* that step's view now, and as first fixed */
	uint64_t view_serial;               /* views and revisions so far */
	struct members_event ev[MEMBERS_EVENTS]; /* a ring, the newest nev % MEMBERS_EVENTS - 1 */
	uint64_t nev;
};

/* What a closed connection means for its worker (members_leave). */
enum members_gone {
	MEMBERS_GONE,  /* nothing to wait for: another connection is live, it
			* left after seeing the run complete, or the ps stops */
	MEMBERS_AWAY,  /* it had said DONE but closed before the run was
			* complete: the ps waits until its deadline */
	MEMBERS_LOST,  /* it failed before DONE: the ps waits until its
			* deadline (set only when no other connection is live) */
};

/* W workers, 1..MEMBERS_MAX; grace = peer_timeout in seconds. */
void members_init(struct members *m, int W, double peer_timeout);

/* The worker set is elastic, with at least min workers a step (below W);
 * blind: this ps is not ps 0, which alone holds the views. */
void members_elastic(struct members *m, int min, int blind);

/* Elastic: w said it leaves once the pushes that follow are in; w was
 * lost past its deadline and is dropped (not waited for again; it may
 * come back as a new worker). */
void members_going(struct members *m, int w);
void members_drop(struct members *m, int w);

/* Elastic: the workers a view of the next step may hold, into v (S
 * slices): seen, ready, connected, and neither done, going nor dropped. */
void members_candidates(const struct members *m, struct view *v, int S);

/* Workers with a connection, or lost but within their deadline at now (a
 * worker reconnecting), that are neither done, going nor dropped. */
int members_live_count(const struct members *m, int64_t now);

/* An event at step; members_events: the newest up to max, oldest first,
 * into out; returns how many. */
void members_event(struct members *m, uint64_t step, int w, enum members_event_kind kind);
int members_events(const struct members *m, struct members_event *out, int max);

/* A greeting from worker w carrying time_ns (its clock): 1 if it is newer
 * than every greeting of w answered so far (it is recorded), else 0: a
 * replay, or a worker whose clock went back; it gets no answer. */
int members_greeted(struct members *m, int w, uint64_t time_ns);

/* Worker w's connection opened its first frame (the key is confirmed):
 * it is live, no deadline. */
void members_join(struct members *m, int w);

/* Worker w's connection closed at `now`: failed says it ended with an
 * error (not after DONE), stopping that the ps is stopping anyway; why (may
 * be NULL) is kept for members_expired's caller. */
enum members_gone members_leave(struct members *m, int w, int failed, int stopping, int64_t now,
				const char *why);

/* A PULL from w: it trains again (after a rollback) or looks where the
 * shards are, so it is not done until it says DONE again. */
void members_pulled(struct members *m, int w);

/* DONE from w; leaving: it saw the run complete and closes. */
void members_done(struct members *m, int w, int leaving);

/* The run is complete: the chief has said DONE (after its final
 * checkpoint and evaluation). What STATUS reports. */
int members_complete(const struct members *m);

/* Every worker but at most one has said DONE (elastic: of those seen and
 * not dropped): a sync PULL stops waiting for the others' gradients (none
 * will come). */
int members_others_done(const struct members *m);

/* Every worker has said DONE (elastic: every one seen and not dropped). */
int members_all_done(const struct members *m);

/* A worker lost before DONE that is not back by its deadline (the lowest
 * such index), or -1: the ps stops. */
int members_expired(const struct members *m, int64_t now);

/* The ps may end: every worker has said DONE and, having seen the run
 * complete, left (or stayed away past its deadline). */
int members_finished(const struct members *m, int64_t now);

/* For a HEARTBEAT: bit w of missing (nbits bits, zeroed here) is set for
 * each worker with a slice (of sh's, spread over the workers as
 * cluster/view.h says: every worker, or elastic the view held) whose
 * gradient for sh's version has not arrived, and that has not said DONE.
 * Blind, none. */
void members_missing(const struct members *m, const struct psshard *sh, uint8_t *missing,
		     int nbits);
/* The same for S slices whose pushes pushed(ctx, s) says have arrived
 * (an embedding's rows, cluster/psrows.h). */
void members_missing_of(const struct members *m, int S, int (*pushed)(const void *ctx, int s), const void *ctx,
			uint8_t *missing, int nbits);

/* Whether every slice of worker w's share has its gradient for sh's
 * version (in piece mode: every piece of it still at that version). */
int members_has_pushed(const struct members *m, const struct psshard *sh, int w);

const char *members_why(const struct members *m, int w);

/* What a REPORT says of worker w: live (connected, not done), done (said
 * DONE), left (said DONE, leaving), lost (no connection before DONE,
 * deadline set), away (done, no connection before the run was complete,
 * deadline set), else absent. */
enum members_state {
	MEMBERS_IS_ABSENT,
	MEMBERS_IS_LIVE,
	MEMBERS_IS_DONE,
	MEMBERS_IS_LEFT,
	MEMBERS_IS_LOST,
	MEMBERS_IS_AWAY,
	MEMBERS_IS_GOING,   /* elastic: said it leaves after its pushes */
	MEMBERS_IS_DROPPED, /* elastic: lost past peer_timeout, not waited for */
};
enum members_state members_state(const struct members *m, int w);

#endif
