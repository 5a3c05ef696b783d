/* See ps_harness.h: the ps of ps.c, with no listener and no accept loop,
 * driven by the caller. */
#include "ps_harness.h"
#include "ps_conn.h"

#include "../base/err.h"
#include "../core/shard.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Refused greetings the gate holds at once (it closes the oldest past
 * that): more than a fuzz input makes. */
#define HARNESS_HELD_MAX 64

struct ps_harness {
	struct ps ps;
	struct role_setup s;
	struct shard plan[CONFIG_MAX_HOSTS];
	int deadline_stop;   /* ps_harness_tick stopped the ps: a worker's deadline, no peer's doing */
};

int ps_harness_open(struct ps_harness **out, const struct config *c, int index, FILE *log,
		    char *err, size_t errlen)
{
	struct ps_harness *h = calloc(1, sizeof(*h));
	if (!h)
		return err_set(err, errlen, -ENOMEM, "out of memory");
	int e = role_setup_load(&h->s, c, 0, err, errlen);
	if (!e)
		e = shard_check(c->cluster.nps, h->s.job.m.nparams, err, errlen);
	if (!e) {
		shard_plan(h->plan, c->cluster.nps, h->s.job.m.nparams);
		e = ps_open(&h->ps, c, &h->s, &h->plan[index], index, 1, log, err, errlen);
	}
	/* No listener: greetings come from ps_harness_greet, and the gate
	 * holds the refused ones until the end. */
	if (!e)
		e = gate_init(&h->ps.gate, -1, HARNESS_HELD_MAX, HARNESS_HELD_MAX, 1000, err, errlen);
	if (e) {
		ps_harness_close(h);
		return e;
	}
	*out = h;
	return 0;
}

int ps_harness_serve(struct ps_harness *h, int fd, const struct hs_result *hr, int w)
{
	struct ps_conn *cn = ps_conn_add(&h->ps, fd, "harness", w, hr);
	if (!cn)
		return -ENOMEM;
	int r = ps_conn_run(cn);
	free(cn);
	return r;
}

int ps_harness_tick(struct ps_harness *h)
{
	/* While connections are served only this round sets ps->aborted
	 * (ps.c; ps_drain is the real ps's end): a stop that appears across
	 * it is its doing. */
	pthread_mutex_lock(&h->ps.mu);
	int before = h->ps.aborted;
	pthread_mutex_unlock(&h->ps.mu);
	int over = ps_over(&h->ps);
	pthread_mutex_lock(&h->ps.mu);
	h->deadline_stop |= !before && h->ps.aborted;
	pthread_mutex_unlock(&h->ps.mu);
	return over;
}

void ps_harness_greet(struct ps_harness *h, int fd, const uint8_t hello[HS_HELLO_BYTES])
{
	struct gate_greeting gr = { .fd = fd };
	memcpy(gr.hello, hello, HS_HELLO_BYTES);
	snprintf(gr.peer, sizeof(gr.peer), "harness");
	ps_admit(&h->ps, &gr);
}

void ps_harness_settle(struct ps_harness *h)
{
	struct ps *ps = &h->ps;
	pthread_mutex_lock(&ps->mu);
	while (ps->nconn > 0 || ps->po.n > 0)
		pthread_cond_wait(&ps->cv, &ps->mu);
	pthread_mutex_unlock(&ps->mu);
}

int ps_harness_check(struct ps_harness *h, char *err, size_t errlen)
{
	struct ps *ps = &h->ps;
	pthread_mutex_lock(&ps->mu);
	const float *p = psshard_params(&ps->sh);
	size_t bad = ps->sh.n;
	for (size_t i = 0; i < ps->sh.n && bad == ps->sh.n; i++)
		if (!isfinite(p[i]))
			bad = i;
	char rows[160] = "";
	int rows_bad = ps_sparse_check(ps, rows, sizeof(rows));
	int aborted = ps->aborted, live = 0;
	for (int w = 0; w < ps->W; w++)
		live += ps->worker[w] != NULL || ps->fresh[w] != NULL;
	char why[sizeof(ps->why)];
	snprintf(why, sizeof(why), "%s", ps->why);
	pthread_mutex_unlock(&ps->mu);
	if (bad < ps->sh.n)
		return err_set(err, errlen, -EDOM, "parameter %zu is %g", bad, (double)p[bad]);
	if (rows_bad)
		return err_set(err, errlen, rows_bad, "%s", rows);
	if (aborted && !h->deadline_stop)
		return err_set(err, errlen, -ECONNABORTED, "a peer stopped the ps: %s", why);
	if (live || ps->nconn || ps->po.n)
		return err_set(err, errlen, -EBUSY, "a connection outlived its thread");
	return 0;
}

void ps_harness_close(struct ps_harness *h)
{
	if (!h)
		return;
	gate_free(&h->ps.gate);
	ps_close(&h->ps);
	role_setup_free(&h->s);
	free(h);
}
