/* See links.h: the fan-out over every ps link; what one link does is
 * link.c's. */
#include "links.h"
#include "link_sparse.h"

#include "../base/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The heartbeat thread: every half heartbeat period, a HEARTBEAT on each
 * link that has sent nothing for a period, so that a ps does not take a
 * worker that is computing, evaluating or waiting on another shard for a
 * dead one. One thread for every link: a link's sender may wait on the
 * gradient's flow or on its turn to push for longer than that. A failed
 * send is left for the link to find. */
static void *links_heartbeats(void *arg)
{
	struct links *lk = arg;
	uint8_t msg[CONN_IDLE_MAX];
	size_t len;
	int ms = role_heartbeat_ms(lk->sh.c);
	struct msg_heartbeat hb;
	memset(&hb, 0, sizeof(hb));
	int ok = msg_encode_heartbeat(msg, sizeof(msg), &hb, &len, NULL, 0) == 0;
	pthread_mutex_lock(&lk->hb_mu);
	while (!lk->hb_stop) {
		struct timespec dl;
		role_deadline(&dl, ms / 2);
		pthread_cond_timedwait(&lk->hb_cv, &lk->hb_mu, &dl);
		if (lk->hb_stop)
			break;
		pthread_mutex_unlock(&lk->hb_mu);
		for (int k = 0; k < lk->nps && ok; k++)
			(void)conn_send_idle(&lk->ln[k].conn, msg, len, ms / 1000.0, NULL, 0);
		pthread_mutex_lock(&lk->hb_mu);
	}
	pthread_mutex_unlock(&lk->hb_mu);
	return NULL;
}

/* A link was found lost, or its shard went back: the first since lost
 * was reset is the one recovery starts from, and it ends the exchange on
 * every link. The others would otherwise wait on, a healthy ps holding
 * its step for a worker that the failed link has just taken away (seen:
 * 6 s more over a cut link, for peer_timeout 3 s); recovery reconnects to
 * every ps anyway. An ERROR from a ps does not come here: another link
 * may yet be found lost, and recovery then comes first (a ps rolled back
 * by a restarted one refuses a push of the old step, and the lost link to
 * the restarted ps is what the worker must act on). */
static void links_on_lost(void *ctx, int k)
{
	struct links *lk = ctx;
	pthread_mutex_lock(&lk->mu);
	int first = lk->lost < 0;
	if (first)
		lk->lost = k;
	pthread_mutex_unlock(&lk->mu);
	for (int i = 0; first && i < lk->nps; i++)
		if (i != k)
			link_cancel(&lk->ln[i], "shut down: another ps link was lost");
}

static int links_sync_init(struct links *lk, char *err, size_t errlen)
{
	struct link_shared *sh = &lk->sh;
	pthread_mutex_init(&lk->mu, NULL);
	pthread_mutex_init(&lk->hb_mu, NULL);
	pthread_mutex_init(&sh->say_mu, NULL);
	pthread_mutex_init(&sh->turn.mu, NULL);
	if (role_cond_init(&lk->hb_cv) || pthread_cond_init(&sh->turn.cv, NULL)) {
		pthread_mutex_destroy(&lk->mu);
		pthread_mutex_destroy(&lk->hb_mu);
		pthread_mutex_destroy(&sh->say_mu);
		pthread_mutex_destroy(&sh->turn.mu);
		return err_set(err, errlen, -ENOMEM, "cannot make the links' condition variables");
	}
	lk->ready = 1;
	return 0;
}

int links_open(struct links *lk, const struct config *c, const struct role_setup *s,
	       const struct shard *plan, int index, const volatile sig_atomic_t *stop, FILE *out,
	       char *err, size_t errlen)
{
	*lk = (struct links){ .sh = { .c = c, .s = s, .stop = stop, .out = out, .index = index,
				      .pieces = role_pieces(c), .lost = links_on_lost },
			      .nps = c->cluster.nps, .lost = -1,
			      .ps0_last = role_views(c) && c->train.mode == MODE_SYNC };
	lk->sh.ctx = lk;
	int e = links_sync_init(lk, err, errlen);
	if (e)
		return e;
	lk->ln = calloc((size_t)lk->nps, sizeof(*lk->ln));
	if (!lk->ln)
		return err_set(err, errlen, -ENOMEM, "out of memory for %d links", lk->nps);
	size_t begin[CONFIG_MAX_HOSTS], end[CONFIG_MAX_HOSTS];
	for (int k = 0; k < lk->nps; k++) {
		begin[k] = plan[k].begin;
		end[k] = plan[k].end;
	}
	if (gradflow_init(&lk->whole, plan[lk->nps - 1].end, lk->nps, begin, end, 2))
		return err_set(err, errlen, -ENOMEM, "out of memory for %d links", lk->nps);
	if (lk->ps0_last && !(lk->kept = malloc(plan[lk->nps - 1].end * sizeof(float))))
		return err_set(err, errlen, -ENOMEM, "out of memory for a copy of the parameters");
	int ct = cryptopool_threads_for(c->cluster.crypto_threads);
	if (ct > 1 && (e = cryptopool_new(&lk->pool, ct, err, errlen)))
		return e;
	for (int k = 0; k < lk->nps; k++)
		if ((e = link_init(&lk->ln[k], k, &lk->sh, plan[k], lk->pool, err, errlen)))
			return e;
	lk->hb_on = pthread_create(&lk->hb, NULL, links_heartbeats, lk) == 0;
	if (!lk->hb_on)
		return err_set(err, errlen, -ENOMEM, "cannot start the heartbeat thread");
	return 0;
}

void links_close(struct links *lk)
{
	if (lk->hb_on) {
		pthread_mutex_lock(&lk->hb_mu);
		lk->hb_stop = 1;
		pthread_cond_signal(&lk->hb_cv);
		pthread_mutex_unlock(&lk->hb_mu);
		pthread_join(lk->hb, NULL);
		lk->hb_on = 0;
	}
	for (int k = 0; lk->ln && k < lk->nps; k++)
		link_free(&lk->ln[k]);
	if (lk->ready) {
		pthread_mutex_destroy(&lk->mu);
		pthread_mutex_destroy(&lk->hb_mu);
		pthread_cond_destroy(&lk->hb_cv);
		pthread_mutex_destroy(&lk->sh.say_mu);
		pthread_mutex_destroy(&lk->sh.turn.mu);
		pthread_cond_destroy(&lk->sh.turn.cv);
		lk->ready = 0;
	}
	gradflow_free(&lk->whole);
	cryptopool_destroy(lk->pool);
	free(lk->kept);
	lk->kept = NULL;
	free(lk->ln);
	lk->pool = NULL;
	lk->ln = NULL;
}

int links_local(const struct links *lk, int *rings)
{
	int n = 0, r = 0;
	for (int k = 0; lk->ln && k < lk->nps; k++) {
		n += lk->ln[k].conn.fd >= 0 && lk->ln[k].unx;
		r += lk->ln[k].conn.fd >= 0 && lk->ln[k].conn.ring.map;
	}
	if (rings)
		*rings = r;
	return n;
}

const char *links_cipher(const struct links *lk)
{
	const char *name = NULL;
	for (int k = 0; lk->ln && k < lk->nps; k++) {
		const struct conn *cn = &lk->ln[k].conn;
		if (cn->fd < 0 || cn->keys->send.cipher == FRAME_LOCAL)
			continue;
		const char *n = frame_cipher_name(cn->keys->send.cipher);
		if (name && strcmp(name, n) != 0)
			return "several";
		name = n;
	}
	return name;
}

int links_connect_one(struct links *lk, int k, int timeout_ms, char *err, size_t errlen)
{
	return link_connect(&lk->ln[k], timeout_ms, err, errlen);
}

int links_connect(struct links *lk, char *err, size_t errlen)
{
	for (int k = 0; k < lk->nps; k++) {
		int r = link_connect(&lk->ln[k], (int)(lk->sh.c->cluster.connect_timeout * 1000), err, errlen);
		if (r)
			return r;
	}
	return 0;
}

void links_disconnect(struct links *lk)
{
	for (int k = 0; lk->ln && k < lk->nps; k++)
		link_disconnect(&lk->ln[k]);
}

/* Link k's turn to push, 0 first: starting at shard index mod nps, or
 * elastic (ps0_last) among the others, ps 0 the last. */
static int links_turn_of(const struct links *lk, int k)
{
	int n = lk->nps - lk->ps0_last, i = lk->sh.index % (n ? n : 1);
	if (lk->ps0_last && k == 0)
		return n;
	k -= lk->ps0_last;
	return (k - i + n) % n;
}

/* ex on every link. A staggered exchange (a push and a pull, not in
 * piece mode; elastic, a push alone too) takes turns to push. */
static void links_begin(struct links *lk, const struct link_ex *ex)
{
	int nps = lk->nps;
	struct link_ex x = *ex;
	if (ex->grads && !ex->gflow) {
		gradflow_reset(&lk->whole);
		(void)gradflow_mark(&lk->whole, 0, lk->whole.n);
		x.gflow = &lk->whole;
	}
	x.turn = ex->grads && (ex->params || lk->ps0_last) && !lk->sh.pieces ? &lk->sh.turn : NULL;
	pthread_mutex_lock(&lk->sh.turn.mu);
	lk->sh.turn.turn = 0;
	pthread_mutex_unlock(&lk->sh.turn.mu);
	/* Rows staged go with a gradient, on every link, first: one
	 * exchange where they took two (docs/PROTOCOL.md, "Rows"). */
	struct links_rows *up = ex->grads ? lk->rows_up : NULL, *ahead = ex->grads ? lk->rows_ahead : NULL;
	lk->rows_up = ex->grads ? NULL : lk->rows_up;
	lk->rows_ahead = ex->grads ? NULL : lk->rows_ahead;
	for (int k = 0; k < nps; k++) {
		x.pos = links_turn_of(lk, k);
		x.rows = up ? &up->x[k] : ex->rows;
		x.ahead = ahead ? &ahead->x[k] : NULL;
		link_begin(&lk->ln[k], &x);
	}
}

/* Waits for every link: the lost link's message if one was lost in this
 * exchange (links shut down after it do not count), else the first
 * failure's. */
static int links_end(struct links *lk, char *err, size_t errlen)
{
	int rc[CONFIG_MAX_HOSTS] = { 0 }, pick = -1;
	for (int k = 0; k < lk->nps; k++)
		rc[k] = link_wait(&lk->ln[k], NULL, 0);
	if (lk->lost >= 0 && rc[lk->lost])
		pick = lk->lost;
	for (int k = 0; pick < 0 && k < lk->nps; k++)
		if (rc[k])
			pick = k;
	/* Ended: it says its end again, with the message. */
	return pick < 0 ? 0 : link_wait(&lk->ln[pick], err, errlen);
}

static int links_run(struct links *lk, const struct link_ex *ex, char *err, size_t errlen)
{
	links_begin(lk, ex);
	return links_end(lk, err, errlen);
}

int links_each(struct links *lk, const struct link_ex *ex, char *err, size_t errlen)
{
	for (int k = 0; k < lk->nps; k++)
		link_begin(&lk->ln[k], &ex[k]);
	return links_end(lk, err, errlen);
}

int links_pull(struct links *lk, float *params, int first, char *err, size_t errlen)
{
	struct link_ex ex = { .params = params, .first = first };
	return links_run(lk, &ex, err, errlen);
}

void links_exchange_begin(struct links *lk, const float *grads, struct gradflow *gflow, float *params,
			  struct gradflow *pflow)
{
	struct link_ex ex = { .grads = grads, .gflow = gflow, .params = params, .pflow = pflow };
	links_begin(lk, &ex);
}

int links_exchange_end(struct links *lk, char *err, size_t errlen)
{
	return links_end(lk, err, errlen);
}

int links_exchange(struct links *lk, const float *grads, float *params, char *err, size_t errlen)
{
	links_exchange_begin(lk, grads, NULL, params, NULL);
	return links_end(lk, err, errlen);
}

int links_checkpoint(struct links *lk, long step, double acc, char *err, size_t errlen)
{
	struct link_ex ex = { .ctl = { .type = WIRE_CHECKPOINT,
				       .u.ck = { .step = (uint64_t)step, .has_acc = acc >= 0, .acc = acc >= 0 ? acc : 0 } } };
	return links_run(lk, &ex, err, errlen);
}

int links_rollback(struct links *lk, uint64_t step, char *err, size_t errlen)
{
	struct link_ex ex = { .ctl = { .type = WIRE_ROLLBACK, .u.rb = { .step = step } } };
	return links_run(lk, &ex, err, errlen);
}

int links_done(struct links *lk, int leaving, char *err, size_t errlen)
{
	struct link_ex ex = { .ctl = { .type = WIRE_DONE,
				       .u.done = { .worker = (uint32_t)lk->sh.index, .leaving = (uint8_t)leaving } } };
	return links_run(lk, &ex, err, errlen);
}

void links_keep(struct links *lk, const float *params, uint64_t v)
{
	if (!lk->kept)
		return;
	memcpy(lk->kept, params, lk->whole.n * sizeof(float));
	lk->kept_v = v;
	lk->has_kept = 1;
}

int links_leave(struct links *lk, char *err, size_t errlen)
{
	struct link_ex ex = { .ctl = { .type = WIRE_LEAVE, .u.leave = { .worker = (uint32_t)lk->sh.index } } };
	return links_run(lk, &ex, err, errlen);
}

int links_status(struct links *lk, int *complete, char *err, size_t errlen)
{
	*complete = 1;
	for (int k = 0; k < lk->nps; k++) {
		struct link_ex ex = { .ctl = { .type = WIRE_STATUS, .u.status = { .reply = 0, .shard = (uint32_t)k } } };
		link_begin(&lk->ln[k], &ex);
	}
	int r = links_end(lk, err, errlen);
	for (int k = 0; !r && k < lk->nps; k++)
		*complete &= lk->ln[k].complete;
	return r;
}

void links_say_sndbuf(struct links *lk, int index, FILE *out)
{
	char line[1024] = "", one[200];
	size_t n = 0;
	for (int k = 0; k < lk->nps && n < sizeof(line); k++) {
		struct conn *cn = &lk->ln[k].conn;
		if (lk->ln[k].unx)
			continue;
		pthread_mutex_lock(&cn->mu);
		sndbuf_describe(&cn->sb, one, sizeof(one));
		pthread_mutex_unlock(&cn->mu);
		n += (size_t)snprintf(line + n, sizeof(line) - n, "%sps %d %s", n ? "; " : "", k, one);
	}
	if (n)
		role_log(out, "worker %d: send buffers: %s", index, line);
}
