/* See gate.h. */
#include "gate.h"
#include "../base/err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Connections accepted per turn of the loop: enough to drain a burst, few
 * enough that reading greetings is never starved by accepting. */
#define GATE_ACCEPT_BATCH 64

static const char *const why_name[GATE_NWHY] = {
	[GATE_IDLE] = "idle past handshake_timeout",
	[GATE_EVICTED] = "evicted (too many pending)",
	[GATE_HUNG_UP] = "closed before a whole greeting",
	[GATE_UNAUTH] = "failed authentication",
	[GATE_REPLAYED] = "replayed greetings",
	[GATE_UNWANTED] = "not a worker of this cluster",
	[GATE_MISMATCH] = "another version or config",
	[GATE_ELSEWHERE] = "for another ps",
};

static int64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int gate_init(struct gate *g, int lfd, int max, int per_source, int timeout_ms, char *err,
	      size_t errlen)
{
	memset(g, 0, sizeof(*g));
	g->lfd[0] = lfd;
	g->nl = 1;
	g->max = max < 1 ? 1 : max;
	g->per_source = per_source < 1 ? 1 : per_source;
	g->timeout_ms = timeout_ms;
	g->p = calloc((size_t)g->max, sizeof(*g->p));
	g->pfd = calloc((size_t)g->max + GATE_LISTENERS, sizeof(*g->pfd));
	if (!g->p || !g->pfd) {
		gate_free(g);
		return err_set(err, errlen, -ENOMEM, "out of memory for %d pending connections", max);
	}
	return 0;
}

void gate_free(struct gate *g)
{
	for (int i = 0; g->p && i < g->n; i++)
		close(g->p[i].fd);
	free(g->p);
	free(g->pfd);
	g->p = NULL;
	g->pfd = NULL;
	g->n = 0;
}

static void tally_add(struct gate_tally *t, enum gate_why why, const char *peer,
		      const char *reason)
{
	if (t->total == 0)
		snprintf(t->first, sizeof(t->first), "%s: %s", peer, reason ? reason : why_name[why]);
	t->n[why]++;
	t->total++;
}

/* Closes pending connection i and counts it (a held one was counted when
 * it was refused); the last record takes its place. */
static void pending_drop(struct gate *g, int i, enum gate_why why)
{
	if (g->p[i].state != GATE_HELD)
		tally_add(&g->tally, why, g->p[i].peer, NULL);
	close(g->p[i].fd);
	g->p[i] = g->p[--g->n];
}

/* Reads what has arrived of pending connection i's greeting. 1: whole; 0:
 * not yet; -1: it hung up or failed (dropped). */
static int pending_read(struct gate *g, int i)
{
	struct gate_pending *p = &g->p[i];
	if (p->state == GATE_HELD) {
		/* Woken only by its hang-up or an error: done with it. */
		pending_drop(g, i, GATE_HUNG_UP);
		return -1;
	}
	while (p->got < HS_HELLO_BYTES) {
		ssize_t r = recv(p->fd, p->hello + p->got, HS_HELLO_BYTES - p->got, MSG_DONTWAIT);
		if (r > 0) {
			p->got = (uint16_t)(p->got + r);
			continue;
		}
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		pending_drop(g, i, GATE_HUNG_UP);
		return -1;
	}
	if (p->state != GATE_WHOLE) {
		p->state = GATE_WHOLE;
		g->nwhole++;
	}
	return 1;
}

/* The oldest pending connection still waiting for its greeting or held (a
 * whole one is never evicted: it leaves with the next gate_pop), of source src
 * (NULL: of all), and how many there are of that source. */
static int pending_oldest(const struct gate *g, const uint8_t *src, int *count)
{
	int old = -1;
	*count = 0;
	for (int i = 0; i < g->n; i++) {
		if (src && memcmp(g->p[i].source, src, SOCK_SOURCE_BYTES) != 0)
			continue;
		(*count)++;
		if (g->p[i].state != GATE_WHOLE && (old < 0 || g->p[i].since_ms < g->p[old].since_ms))
			old = i;
	}
	return old;
}

/* Room for one more from src: the oldest of its source goes if the
 * source has its share, else the oldest of all if the gate is full. 0, or
 * -1 when only whole greetings fill it (the newcomer must go). */
static int pending_make_room(struct gate *g, const uint8_t *src)
{
	int count;
	int old = pending_oldest(g, src, &count);
	if (count >= g->per_source && old >= 0)
		pending_drop(g, old, GATE_EVICTED);
	if (g->n < g->max)
		return 0;
	old = pending_oldest(g, NULL, &count);
	if (old < 0)
		return -1;
	pending_drop(g, old, GATE_EVICTED);
	return 0;
}

int gate_listen_also(struct gate *g, int lfd)
{
	if (g->nl >= GATE_LISTENERS)
		return -ENOSPC;
	g->lfd[g->nl++] = lfd;
	return 0;
}

/* Accepts what is waiting on listening socket lfd, up to a batch. A
 * negative errno for a listener failure that waiting will not cure. */
static int gate_accept(struct gate *g, int lfd, char *err, size_t errlen)
{
	for (int k = 0; k < GATE_ACCEPT_BATCH; k++) {
		struct gate_pending np;
		char e[200];
		memset(&np, 0, sizeof(np));
		int r = sock_accept_from(lfd, 0, &np.fd, np.peer, sizeof(np.peer), np.source, e,
					 sizeof(e));
		if (r == -EAGAIN || r == -ETIMEDOUT)
			return 0;
		/* Out of descriptors or memory: what is pending will expire
		 * and free some; the listener itself is fine. */
		if (r == -EMFILE || r == -ENFILE || r == -ENOBUFS || r == -ENOMEM)
			return 0;
		if (r)
			return err_set(err, errlen, r, "%s", e);
		np.since_ms = now_ms();
		if (pending_make_room(g, np.source)) {
			tally_add(&g->tally, GATE_EVICTED, np.peer, NULL);
			close(np.fd);
			continue;
		}
		g->p[g->n++] = np;
		(void)pending_read(g, g->n - 1);
	}
	return 0;
}

/* Drops the connections past their deadline. */
static void gate_expire(struct gate *g)
{
	int64_t now = now_ms();
	for (int i = 0; i < g->n;)
		if (g->p[i].state != GATE_WHOLE && now - g->p[i].since_ms >= g->timeout_ms)
			pending_drop(g, i, GATE_IDLE);
		else
			i++;
}

/* Hands the first whole greeting out of the gate. */
static int gate_pop(struct gate *g, struct gate_greeting *out)
{
	for (int i = 0; g->nwhole > 0 && i < g->n; i++) {
		if (g->p[i].state != GATE_WHOLE)
			continue;
		out->fd = g->p[i].fd;
		out->since_ms = g->p[i].since_ms;
		memcpy(out->source, g->p[i].source, sizeof(out->source));
		memcpy(out->peer, g->p[i].peer, sizeof(out->peer));
		memcpy(out->hello, g->p[i].hello, sizeof(out->hello));
		g->p[i] = g->p[--g->n];
		g->nwhole--;
		return 1;
	}
	return 0;
}

int gate_next(struct gate *g, int wait_ms, struct gate_greeting *out, char *err, size_t errlen)
{
	if (gate_pop(g, out))
		return 1;
	/* Wake for the nearest deadline too, so an idle peer never outstays
	 * it by more than a turn. */
	int64_t now = now_ms();
	for (int i = 0; i < g->n; i++) {
		int64_t left = g->p[i].since_ms + g->timeout_ms - now;
		if (left < wait_ms)
			wait_ms = left < 0 ? 0 : (int)left;
	}
	int nl = g->nl;
	for (int l = 0; l < nl; l++)
		g->pfd[l] = (struct pollfd){ .fd = g->lfd[l], .events = POLLIN };
	for (int i = 0; i < g->n; i++)
		g->pfd[nl + i] = (struct pollfd){ .fd = g->p[i].fd,
						  .events = g->p[i].state == GATE_HELD ? POLLRDHUP : POLLIN };
	int n = g->n;
	int r = poll(g->pfd, (nfds_t)(n + nl), wait_ms);
	if (r < 0 && errno != EINTR)
		return err_set(err, errlen, -errno, "poll: %s", strerror(errno));
	if (r > 0) {
		/* Readers first, from the last so that a drop (which moves
		 * the last record into the hole) leaves the rest in place. */
		for (int i = n - 1; i >= 0; i--)
			if (g->pfd[nl + i].revents)
				(void)pending_read(g, i);
		for (int l = 0; l < nl; l++) {
			if (!g->pfd[l].revents)
				continue;
			r = gate_accept(g, g->lfd[l], err, errlen);
			if (r)
				return r;
		}
	}
	gate_expire(g);
	return gate_pop(g, out);
}

void gate_refuse(struct gate *g, struct gate_greeting *gr, enum gate_why why, const char *reason)
{
	tally_add(&g->tally, why, gr->peer, reason);
	int count, old = g->n < g->max ? -1 : pending_oldest(g, NULL, &count);
	if (g->n >= g->max && old < 0) {
		close(gr->fd);
	} else {
		if (old >= 0)
			pending_drop(g, old, GATE_EVICTED);
		struct gate_pending *p = &g->p[g->n++];
		memset(p, 0, sizeof(*p));
		p->fd = gr->fd;
		p->state = GATE_HELD;
		p->since_ms = gr->since_ms;
		memcpy(p->source, gr->source, sizeof(p->source));
		memcpy(p->peer, gr->peer, sizeof(p->peer));
	}
	gr->fd = -1;
}

void gate_tally_take(struct gate *g, struct gate_tally *t)
{
	*t = g->tally;
	memset(&g->tally, 0, sizeof(g->tally));
}

void gate_tally_text(const struct gate_tally *t, char *buf, size_t len)
{
	size_t at = 0;
	buf[0] = 0;
	for (int w = 0; w < GATE_NWHY && at < len; w++)
		if (t->n[w])
			at += (size_t)snprintf(buf + at, len - at, "%s%llu %s", at ? ", " : "",
					       (unsigned long long)t->n[w], why_name[w]);
}
