/* See members.h. */
#include "members.h"

#include <stdio.h>
#include <string.h>

void members_init(struct members *m, int W, double peer_timeout)
{
	memset(m, 0, sizeof(*m));
	m->W = W;
	m->grace_ms = (int64_t)(peer_timeout * 1000);
}

int members_greeted(struct members *m, int w, uint64_t time_ns)
{
	if (time_ns <= m->greeted[w])
		return 0;
	m->greeted[w] = time_ns;
	return 1;
}

void members_elastic(struct members *m, int min, int blind)
{
	m->elastic = min < m->W;
	m->min = min;
	m->blind = m->elastic && blind;
}

void members_join(struct members *m, int w)
{
	m->live[w]++;
	m->due[w] = 0;
	m->seen[w] = 1;
}

void members_going(struct members *m, int w)
{
	m->going[w] = 1;
}

void members_drop(struct members *m, int w)
{
	m->dropped[w] = 1;
	m->due[w] = 0;
}

/* Elastic: a worker the ps waits for at all: one seen and not dropped,
 * and the chief, which ends the run, in any case. */
static int counted(const struct members *m, int w)
{
	return !m->elastic || w == 0 || (m->seen[w] && !m->dropped[w]);
}

void members_candidates(const struct members *m, struct view *v, int S)
{
	view_init(v, S, m->W);
	for (int w = 0; w < m->W; w++)
		if (m->seen[w] && m->ready[w] && m->live[w] > 0 && !m->done[w] && !m->going[w] && !m->dropped[w])
			view_set(v, w, 1);
}

int members_live_count(const struct members *m, int64_t now)
{
	int n = 0;
	for (int w = 0; w < m->W; w++)
		n += (m->live[w] > 0 || (m->due[w] && now < m->deadline[w])) && !m->done[w] && !m->going[w] &&
		     !m->dropped[w];
	return n;
}

void members_event(struct members *m, uint64_t step, int w, enum members_event_kind kind)
{
	m->ev[m->nev % MEMBERS_EVENTS] = (struct members_event){ .step = step, .w = w, .kind = kind };
	m->nev++;
}

int members_events(const struct members *m, struct members_event *out, int max)
{
	uint64_t n = m->nev < MEMBERS_EVENTS ? m->nev : MEMBERS_EVENTS;
	if (n > (uint64_t)max)
		n = (uint64_t)max;
	for (uint64_t i = 0; i < n; i++)
		out[i] = m->ev[(m->nev - n + i) % MEMBERS_EVENTS];
	return (int)n;
}

enum members_gone members_leave(struct members *m, int w, int failed, int stopping, int64_t now,
				const char *why)
{
	m->live[w]--;
	int others = m->live[w] > 0;
	if (stopping)
		return MEMBERS_GONE;
	if (m->done[w]) {
		/* Finished but gone before seeing the run complete:
		 * reconnecting (another ps was lost), or dead. The run is not
		 * over for this ps until it comes back and leaves, or its
		 * deadline passes. */
		if (m->leaving[w] || others)
			return MEMBERS_GONE;
		m->due[w] = 1;
		m->deadline[w] = now + m->grace_ms;
		return MEMBERS_AWAY;
	}
	if (!failed)
		return MEMBERS_GONE;
	/* A lost worker (killed, crashed, or a peer holding the key that
	 * sent a bad frame) does not end training: it may come back within
	 * peer_timeout. A second connection still open (it reconnected
	 * before this one was found dead) keeps it live. */
	if (!others) {
		m->due[w] = 1;
		m->deadline[w] = now + m->grace_ms;
		snprintf(m->why[w], sizeof(m->why[w]), "%s", why ? why : "");
	}
	return MEMBERS_LOST;
}

void members_pulled(struct members *m, int w)
{
	if (m->done[w]) {
		m->done[w] = 0;
		m->ndone--;
	}
	m->leaving[w] = 0;
	m->ready[w] = 1;
	/* back after it left or was dropped: a new worker */
	m->going[w] = 0;
	m->dropped[w] = 0;
}

void members_done(struct members *m, int w, int leaving)
{
	if (!m->done[w]) {
		m->done[w] = 1;
		m->ndone++;
	}
	m->leaving[w] |= leaving ? 1 : 0;
}

int members_complete(const struct members *m)
{
	return m->done[0];
}

/* Workers waited for that have not said DONE; with left, also those that
 * left the job mid-run (said LEAVE): gone, but a step they left behind
 * waits for a worker to join, not for nothing. */
static int undone(const struct members *m, int left)
{
	if (!m->elastic)
		return m->W - m->ndone;
	int n = 0;
	for (int w = 0; w < m->W; w++)
		n += counted(m, w) && (!m->done[w] || (left && m->going[w]));
	return n;
}

int members_others_done(const struct members *m)
{
	return undone(m, 1) <= 1;
}

int members_all_done(const struct members *m)
{
	return undone(m, 0) == 0;
}

static int past(const struct members *m, int w, int64_t now)
{
	return !m->live[w] && m->due[w] && now >= m->deadline[w];
}

int members_expired(const struct members *m, int64_t now)
{
	for (int w = 0; w < m->W; w++)
		if (!m->done[w] && !m->dropped[w] && past(m, w, now))
			return w;
	return -1;
}

int members_finished(const struct members *m, int64_t now)
{
	if (!members_all_done(m))
		return 0;
	for (int w = 0; w < m->W; w++)
		if (counted(m, w) && !m->leaving[w] && !past(m, w, now))
			return 0;
	return 1;
}

/* The owners of the step's S slices: every worker, each its share
 * (cluster/view.h), or elastic the view held (none held, blind: nobody). */
static void owners(const struct members *m, int S, int *owner)
{
	struct view v;
	if (m->has_view && m->view.S == S) {
		view_owners(&m->view, &m->base, owner);
		return;
	}
	view_all(&v, S, m->W);
	view_owners(&v, NULL, owner);
	for (int s = 0; s < S && m->elastic; s++)
		owner[s] = -1;
}

int members_has_pushed(const struct members *m, const struct psshard *sh, int w)
{
	int owner[VIEW_MAX];
	owners(m, sh->workers, owner);
	for (int s = 0; s < sh->workers; s++)
		if (owner[s] == w && !psshard_has_pushed(sh, s))
			return 0;
	return 1;
}

void members_missing_of(const struct members *m, int S, int (*pushed)(const void *ctx, int s), const void *ctx,
			uint8_t *missing, int nbits)
{
	int owner[VIEW_MAX];
	owners(m, S, owner);
	memset(missing, 0, (size_t)(nbits + 7) / 8);
	for (int s = 0; s < S; s++) {
		int w = owner[s];
		if (w >= 0 && w < nbits && !pushed(ctx, s) && !m->done[w])
			missing[w / 8] |= (uint8_t)(1u << (w % 8));
	}
}

static int shard_pushed(const void *ctx, int s)
{
	return psshard_has_pushed(ctx, s);
}

void members_missing(const struct members *m, const struct psshard *sh, uint8_t *missing,
		     int nbits)
{
	members_missing_of(m, sh->workers, shard_pushed, sh, missing, nbits);
}

const char *members_why(const struct members *m, int w)
{
	return m->why[w];
}

enum members_state members_state(const struct members *m, int w)
{
	if (m->leaving[w])
		return MEMBERS_IS_LEFT;
	if (m->dropped[w])
		return MEMBERS_IS_DROPPED;
	if (m->going[w])
		return MEMBERS_IS_GOING;
	if (m->live[w] > 0)
		return m->done[w] ? MEMBERS_IS_DONE : MEMBERS_IS_LIVE;
	if (m->due[w])
		return m->done[w] ? MEMBERS_IS_AWAY : MEMBERS_IS_LOST;
	return m->done[w] ? MEMBERS_IS_DONE : MEMBERS_IS_ABSENT;
}
