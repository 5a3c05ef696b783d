/* See ps_apply.h. */
#include "ps_apply.h"
#include "ps_conn.h"

#include "../base/err.h"
#include "../core/nn/layers.h"

#include <errno.h>
#include <stdlib.h>
#include <strings.h>

#define PS_APPLY_MAX_THREADS CRYPTOPOOL_MAX_THREADS /* [ps] apply_threads' range too */

/* One piece's owed step, queued on the pool. */
struct ps_apply_job {
	struct cryptopool_job job; /* the pool runs it (net/cryptopool.h: any small jobs) */
	struct ps_conn *cn;
	struct psshard_owed o;
};

int ps_apply_threads_for(const struct config *c, int index)
{
	if (c->ps.apply_threads > 0)
		return c->ps.apply_threads;
	int here = 0;
	for (int i = 0; i < c->cluster.nps; i++)
		here += strcasecmp(c->cluster.ps[i].name, c->cluster.ps[index].name) == 0;
	int n = layers_cpus() / (2 * (here > 0 ? here : 1));
	/* Fewer than 4 is one, inline: a piece handed to the pool costs its
	 * connection's thread a copy and a wake-up (about 7 us of the 2
	 * vCPUs' 25 a piece), which a pool of 2 did not win back where the
	 * worker and the ps's own threads left it no free CPU (the CNN's
	 * exchange 4.2-4.9 ms a step inline, 5.6-6.3 with 2 threads). */
	return n < 4 ? 1 : n > PS_APPLY_MAX_THREADS ? PS_APPLY_MAX_THREADS : n;
}

int ps_apply_open(struct ps *ps, char *err, size_t errlen)
{
	int n = ps_apply_threads_for(ps->c, ps->index);
	if (!psshard_pieces(&ps->sh) || n <= 1)
		return 0;
	int r = cryptopool_new(&ps->applier, n, err, errlen);
	if (r == 0)
		role_log(ps->out, "ps %d: steps its pieces on %d threads ([ps] apply_threads%s)", ps->index, n,
			 ps->c->ps.apply_threads > 0 ? "" : " = 0: half this host's CPUs, shared by its ps");
	return r;
}

void ps_apply_close(struct ps *ps)
{
	cryptopool_destroy(ps->applier);
	ps->applier = NULL;
}

int ps_apply_conn_init(struct ps_conn *cn)
{
	struct ps *ps = cn->ps;
	if (!ps->applier)
		return 0;
	cn->ajobs = calloc(ps->sh.npieces, sizeof(*cn->ajobs));
	cn->aqueued = calloc(ps->sh.npieces, sizeof(*cn->aqueued));
	if (!cn->ajobs || !cn->aqueued || role_cond_init(&cn->awake)) {
		free(cn->ajobs);
		free(cn->aqueued);
		cn->ajobs = NULL;
		cn->aqueued = NULL;
		return -ENOMEM;
	}
	return 0;
}

void ps_apply_conn_free(struct ps_conn *cn)
{
	if (!cn->ajobs)
		return;
	ps_apply_wait_conn(cn);
	pthread_cond_destroy(&cn->awake);
	free(cn->ajobs);
	free(cn->aqueued);
	cn->ajobs = NULL;
	cn->aqueued = NULL;
}

/* On a pool thread: the piece's math without the lock, then its
 * bookkeeping and the wake-ups ps_push_piece makes for a piece stepped
 * at once (psshard_lead_moves: what a streamer waits for). */
static void apply_run(void *arg)
{
	struct ps_apply_job *aj = arg;
	struct ps *ps = aj->cn->ps;
	psshard_owed_math(&ps->sh, &aj->o);
	struct ps_lead seen;
	pthread_mutex_lock(&ps->mu);
	ps_lead_seen(ps, &seen);
	psshard_owed_done(&ps->sh, &aj->o);
	ps_store_pushed(&ps->store);
	/* The last job also wakes a PULL that may now have nothing left to
	 * wait for (ps_pull.c's pull_hopeless waits while jobs run). */
	int last = --ps->applying == 0;
	if (ps_lead_news(aj->cn, &seen) || last)
		pthread_cond_broadcast(&ps->pull_cv);
	if (last)
		pthread_cond_broadcast(&ps->cv);
	pthread_mutex_unlock(&ps->mu);
}

void ps_apply_submit(struct ps_conn *cn, const struct psshard_owed *o)
{
	struct ps *ps = cn->ps;
	struct ps_apply_job *aj = &cn->ajobs[o->j];
	aj->cn = cn;
	aj->o = *o;
	aj->job.run = apply_run;
	aj->job.arg = aj;
	cn->aqueued[cn->naqueued++] = o->j;
	cryptopool_submit(ps->applier, &aj->job, &cn->awake);
}

void ps_apply_wait_conn(struct ps_conn *cn)
{
	for (size_t i = 0; i < cn->naqueued; i++)
		cryptopool_wait(cn->ps->applier, &cn->ajobs[cn->aqueued[i]].job);
	cn->naqueued = 0;
}

void ps_apply_settle(struct ps *ps)
{
	while (ps->applying > 0)
		pthread_cond_wait(&ps->cv, &ps->mu);
}
