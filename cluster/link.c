/* See link.h. */
#include "link.h"

#include "../base/err.h"
#include "link_sparse.h"
#include "psshard.h"
#include "../core/nn/factors.h"
#include "../net/sock.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

const char *link_ps_name(const struct config *c, int k, char *buf, size_t len)
{
	snprintf(buf, len, "ps %d (%s:%u)", k, c->cluster.ps[k].name, c->cluster.ps[k].port);
	return buf;
}

/* ---- the end of an exchange ---- */

/* Under l->mu: the exchange's end, if none yet. The connection is shut
 * down so that the other half (a push stuck on a ps that stopped reading,
 * a receive waiting for a reply that will not come) ends at once, and the
 * next step's forward pass waits on these parameters no more. 1 if this
 * was the end. */
static int link_end_locked(struct link *l, enum link_end why, int rc, const char *msg)
{
	if (l->end != LINK_OK)
		return 0;
	l->end = why;
	l->rc = rc;
	snprintf(l->why, sizeof(l->why), "%s", msg);
	conn_shutdown(&l->conn);
	if (l->ex.pflow)
		gradflow_fail(l->ex.pflow);
	pthread_cond_broadcast(&l->cv);
	return 1;
}

/* The first failure of the running exchange is its end; later ones (the
 * other half's, caused by the shutdown) are not. Returns rc. */
static int link_fail(struct link *l, enum link_end why, int rc, const char *msg)
{
	pthread_mutex_lock(&l->mu);
	int first = link_end_locked(l, why, rc, msg);
	pthread_mutex_unlock(&l->mu);
	if (first && (why == LINK_LOST || why == LINK_WENT_BACK) && l->sh->lost)
		l->sh->lost(l->sh->ctx, l->k);
	return rc;
}

void link_cancel(struct link *l, const char *why)
{
	pthread_mutex_lock(&l->mu);
	if (l->state == LINK_EXCHANGING)
		(void)link_end_locked(l, LINK_CANCELLED, -ECONNABORTED, why);
	pthread_mutex_unlock(&l->mu);
}

/* The transport failed (not an ERROR the ps sent): the caller may
 * reconnect (recovery_resync). */
static int link_lost(struct link *l, int r, const char *e)
{
	char nm[300], msg[LINK_WHY_BYTES];
	link_ps_name(l->sh->c, l->k, nm, sizeof(nm));
	if (r == -ETIMEDOUT)
		snprintf(msg, sizeof(msg), "lost %s: no traffic for %g s (peer_timeout)", nm,
			 l->sh->c->cluster.peer_timeout);
	else
		snprintf(msg, sizeof(msg), "lost %s: %s", nm, e);
	return link_fail(l, LINK_LOST, -ECONNABORTED, msg);
}

/* The shard answered with a version below what this worker had from it. */
static int link_went_back(struct link *l, uint64_t v)
{
	char nm[300], msg[LINK_WHY_BYTES];
	snprintf(msg, sizeof(msg), "%s went back to step %llu", link_ps_name(l->sh->c, l->k, nm, sizeof(nm)),
		 (unsigned long long)v);
	return link_fail(l, LINK_WENT_BACK, -ECONNABORTED, msg);
}

/* An ERROR from the ps, or a message that is not what was asked for. */
static int link_refused(struct link *l, const char *e)
{
	char nm[300], msg[LINK_WHY_BYTES];
	snprintf(msg, sizeof(msg), "%s: %s", link_ps_name(l->sh->c, l->k, nm, sizeof(nm)), e);
	return link_fail(l, LINK_REFUSED, -ECONNABORTED, msg);
}

/* ---- the sender ---- */

/* link.h */
int link_packs(const struct link *l)
{
	return l->sh->pack && !l->unx;
}

/* link.h */
int link_packs_ids(const struct link *l)
{
	return l->sh->c->cluster.wire_pack != CONFIG_OVERLAP_OFF && !l->unx;
}

static unsigned link_grad_dtype(const struct link *l)
{
	unsigned dt = role_grad_dtype(l->sh->c);
	return dt == WIRE_F32 && link_packs(l) ? WIRE_F32P : dt;
}

/* The receiver may read from here on: what was sent has a reply. */
static void link_asked(struct link *l)
{
	pthread_mutex_lock(&l->mu);
	l->asked = 1;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

static int link_ctl_encode(const struct link_ctl *m, uint8_t *buf, size_t cap, size_t *len, char *err,
			   size_t errlen)
{
	switch (m->type) {
	case WIRE_CHECKPOINT: return msg_encode_checkpoint(buf, cap, &m->u.ck, len, err, errlen);
	case WIRE_ROLLBACK: return msg_encode_rollback(buf, cap, &m->u.rb, len, err, errlen);
	case WIRE_DONE: return msg_encode_done(buf, cap, &m->u.done, len, err, errlen);
	case WIRE_STATUS: return msg_encode_status(buf, cap, &m->u.status, len, err, errlen);
	case WIRE_LEAVE: return msg_encode_leave(buf, cap, &m->u.leave, len, err, errlen);
	}
	return err_set(err, errlen, -EINVAL, "no control message of type %u", m->type);
}

/* The control message m. */
static int link_send_ctl(struct link *l, const struct link_ctl *m)
{
	char e[512];
	size_t len;
	if (link_ctl_encode(m, conn_payload(&l->conn, CONN_MAIN), conn_payload_cap(&l->conn), &len, e,
			    sizeof(e)))
		return link_fail(l, LINK_REFUSED, -EPROTO, e);
	int r = conn_send_payload(&l->conn, CONN_MAIN, len, e, sizeof(e));
	return r ? link_lost(l, r, e) : 0;
}

uint64_t link_next_version(const struct link *l)
{
	/* Never past the run's end: with backup workers the shards advance
	 * apart, and one may be there while this worker trains on. */
	uint64_t next = l->got + 1, end = (uint64_t)l->sh->s->job.total;
	return next < end ? next : end;
}

/* PULL: sync asks for the version after the one it last had (first: 0,
 * whatever it has), async for the newest; l->want: what was asked. */
static int link_ask(struct link *l)
{
	const struct config *c = l->sh->c;
	struct msg_pull m = { .shard = (uint32_t)l->k };
	char e[512];
	size_t len;
	if (link_packs(l) && role_param_dtype(c) == WIRE_F32)
		m.flags = MSG_PULL_PACKED;
	m.version = c->train.mode == MODE_ASYNC ? MSG_VERSION_LATEST : l->ex.first ? 0 : link_next_version(l);
	l->want = m.version;
	/* XORs with the version before: only where the range holds it as
	 * the ps sent it (net/xdelta.h checks it besides). */
	if (m.flags && c->train.mode == MODE_SYNC && !l->ex.first && l->holds && !l->torn && l->held == l->got &&
	    m.version == l->got + 1)
		m.flags |= MSG_PULL_DELTA;
	if (msg_encode_pull(conn_payload(&l->conn, CONN_MAIN), conn_payload_cap(&l->conn), &m, &len, e,
			    sizeof(e)))
		return link_fail(l, LINK_REFUSED, -EPROTO, e);
	int r = conn_send_payload(&l->conn, CONN_MAIN, len, e, sizeof(e));
	return r ? link_lost(l, r, e) : 0;
}

/* Pieces a push waits for before it sends: one call per piece cost the
 * worker about 1 ms of CPU a step more at 10 Gbit/s (wake-ups, a send
 * per piece), while 4 are still 2 ms at 1 Gbit/s and made in a fraction
 * of a millisecond. */
#define LINK_FLOW_RUN 4

/* A run of this shard's pieces as factors (core/nn/factors.h), final:
 * each piece's chunk carries its share of the factor stream, in
 * proportion to its values (a share is never more values than its
 * piece's, as factors_plan takes only runs that save a good part). */
static int link_push_factors(struct link *l, const struct factor_run *fr)
{
	const struct factors *fx = l->ex.gflow->fx;
	const struct model *m = &l->sh->s->job.m;
	size_t F = factors_count(m, fr, fx->B), run = fr->hi - fr->lo, from = 0;
	char e[512];
	for (size_t lo = fr->lo; lo < fr->hi;) {
		size_t hi = fr->hi - lo > PSSHARD_PIECE ? lo + PSSHARD_PIECE : fr->hi;
		size_t to = (size_t)((double)F * (double)(hi - fr->lo) / (double)run);
		to = hi == fr->hi ? F : to;
		struct msg_chunk c = { .type = WIRE_PUSH, .dtype = WIRE_F32F, .shard = (uint32_t)l->k,
				       .version = l->tag, .worker = WIRE_PUSH_TAG(l->sh->index, l->sh->slice),
				       .offset = lo - l->range.begin, .count = (uint32_t)(hi - lo) };
		uint8_t *buf = conn_payload(&l->conn, CONN_MAIN);
		size_t len;
		if (msg_encode_chunk_factors(buf, conn_payload_cap(&l->conn), &c, (uint32_t)(fr->hi - lo),
					     (uint32_t)fx->B, to - from, &len, e, sizeof(e)))
			return link_fail(l, LINK_REFUSED, -EPROTO, e);
		factors_write(fx, m, fr, from, to, buf + len - 4 * (to - from));
		msg_chunk_factors_seal(buf, &len);
		l->sh->fbytes += len - MSG_CHUNK_HDR_BYTES;
		int r = conn_send_payload(&l->conn, CONN_MAIN, len, e, sizeof(e));
		if (r)
			return link_lost(l, r, e);
		from = to;
		lo = hi;
	}
	l->sh->fvalues += run;
	return 0;
}

/* Where the next run of factors after lo begins (end: none). */
static size_t link_next_run(const struct factors *fx, size_t lo, size_t end)
{
	for (int k = 0; fx && k < fx->n; k++)
		if (fx->run[k].lo > lo && fx->run[k].lo < end)
			end = fx->run[k].lo;
	return end;
}

/* The gradient's slice for this shard, tagged with the version pulled from
 * it, sent run by run of whole pieces as the flow makes them final (the
 * last piece may be shorter): a gradient final at once is one message. A
 * stream left to the end (gradflow_later) goes whole when it is final. A
 * run the step kept as factors goes as those. A step that fails before
 * its gradient is final cancels the push half-way. */
static int link_push(struct link *l)
{
	const struct link_ex *x = &l->ex;
	const struct factors *fx = x->gflow->fx;
	size_t lo = l->range.begin, end = l->range.end;
	int later = gradflow_is_later(x->gflow, l->k);
	char e[512];
	while (lo < end) {
		const struct factor_run *fr = fx ? factors_at(fx, lo) : NULL;
		size_t have, hi, stop = link_next_run(fx, lo, end);
		size_t want = later ? end : lo + LINK_FLOW_RUN * PSSHARD_PIECE;
		want = fr ? fr->hi : want < stop ? want : stop;
		if (gradflow_wait(x->gflow, l->k, want, &have))
			return link_fail(l, LINK_CANCELLED, -ECANCELED, "the step ended before its gradient was made");
		if (fr && fr->on) {
			int r = link_push_factors(l, fr);
			if (r)
				return r;
			l->sh->gvalues += fr->hi - lo;
			lo = fr->hi;
			continue;
		}
		hi = have >= stop ? stop : lo + (have - lo) / PSSHARD_PIECE * PSSHARD_PIECE;
		struct conn_chunk_tx t = { .type = WIRE_PUSH, .shard = (uint32_t)l->k, .version = l->tag,
					   .worker = WIRE_PUSH_TAG(l->sh->index, l->sh->slice), .src = x->grads + lo, .n = hi - lo,
					   .offset = lo - l->range.begin, .dtype = (uint8_t)link_grad_dtype(l) };
		int r = conn_send_tensor(&l->conn, CONN_MAIN, &t, e, sizeof(e));
		if (r)
			return link_lost(l, r, e);
		l->sh->gvalues += hi - lo;
		lo = hi;
	}
	return 0;
}

static void link_turn_wait(struct link_turn *t, int pos)
{
	pthread_mutex_lock(&t->mu);
	while (t->turn < pos)
		pthread_cond_wait(&t->cv, &t->mu);
	pthread_mutex_unlock(&t->mu);
}

/* The turn passes at the ACK, when the ps has the whole gradient, not
 * when the socket took it: the kernel buffers megabytes, and pushes that
 * all sit in buffers at once share the uplink again. After a failure it
 * passes all the same, so that no other link waits for ever. */
static void link_turn_pass(struct link *l, struct link_turn *t, int pos)
{
	pthread_mutex_lock(&l->mu);
	while (!l->acked && l->end == LINK_OK)
		pthread_cond_wait(&l->cv, &l->mu);
	pthread_mutex_unlock(&l->mu);
	pthread_mutex_lock(&t->mu);
	if (t->turn < pos + 1)
		t->turn = pos + 1;
	pthread_cond_broadcast(&t->cv);
	pthread_mutex_unlock(&t->mu);
}

/* The sending half: the control message, then PULL and PUSH in the order
 * the ps needs. In piece mode the PULL goes first and the ps streams the
 * parameters while the gradient still goes up; otherwise a ps answers a
 * PULL of the next version only once it has this push, so the PUSH goes
 * first. */
static void link_send_side(struct link *l)
{
	const struct link_ex *x = &l->ex;
	int pull_first = x->params && (!x->grads || l->sh->pieces);
	int r = 0;
	if (x->ctl.type) {
		r = link_send_ctl(l, &x->ctl);
		if (!r && x->ctl.type == WIRE_STATUS)
			link_asked(l);
	}
	if (!r && x->rows) {
		char e[512];
		int lost;
		r = link_rows_send(l, x->rows, &lost, e, sizeof(e));
		r = !r ? 0 : lost ? link_lost(l, r, e) : link_fail(l, LINK_REFUSED, -EPROTO, e);
		/* With a gradient the receiver starts once its PUSH or PULL is
		 * out: not while this link waits its turn, which peer_timeout
		 * would take for a silent ps. */
		if (!r && !x->grads)
			link_asked(l);
	}
	if (!r && pull_first) {
		r = link_ask(l);
		if (!r)
			link_asked(l);
	}
	if (x->grads) {
		if (x->turn)
			link_turn_wait(x->turn, x->pos);
		if (!r)
			r = link_push(l);
		if (!r && !x->params)
			link_asked(l);
	}
	if (!r && x->params && !pull_first) {
		r = link_ask(l);
		if (!r)
			link_asked(l);
	}
	/* Last: the ps answers it once every worker's rows of this step
	 * are in, which this link's SPUSH went up in front of. */
	if (!r && x->ahead) {
		char e[512];
		int lost;
		r = link_rows_send(l, x->ahead, &lost, e, sizeof(e));
		r = !r ? 0 : lost ? link_lost(l, r, e) : link_fail(l, LINK_REFUSED, -EPROTO, e);
	}
	if (x->turn)
		link_turn_pass(l, x->turn, x->pos);
}

/* ---- the receiver ---- */

/* What the receiving half waits for, and the parameters' assembly. */
struct link_rx {
	struct link *l;
	int want_params, want_acks, want_status; /* want_acks: a PUSH's, an SPUSH's, or both */
	int acked, statused;
	struct msg_assembly a;
	struct conn_chunk_rx x;
};

static int link_rx_pending(const struct link_rx *rx)
{
	return (rx->want_params && !msg_assembly_done(&rx->a)) || rx->acked < rx->want_acks ||
	       (rx->want_status && !rx->statused) || link_rows_waiting(rx->l->ex.rows) ||
	       link_rows_waiting(rx->l->ex.ahead);
}

/* A HEARTBEAT from ps k while a sync PULL waits: the chief prints which
 * workers the shard is waiting for, once per version and set. */
static void link_heard_locked(struct link *l, const struct msg_heartbeat *hb)
{
	struct link_shared *sh = l->sh;
	int any = 0;
	for (size_t i = 0; i < sizeof(hb->missing); i++)
		any |= hb->missing[i];
	if (!sh->pg || !any ||
	    (hb->version == sh->heard_v && memcmp(hb->missing, sh->heard, sizeof(sh->heard)) == 0))
		return;
	sh->heard_v = hb->version;
	memcpy(sh->heard, hb->missing, sizeof(sh->heard));
	char list[200] = "";
	size_t at = 0;
	int n = 0;
	for (int w = 0; w < (int)MSG_HEARTBEAT_WORKERS; w++) {
		if (!(hb->missing[w / 8] >> (w % 8) & 1))
			continue;
		if (at < sizeof(list) - 16)
			at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%d", n ? ", " : "", w);
		else if (at < sizeof(list) - 4)
			at += (size_t)snprintf(list + at, sizeof(list) - at, ", ...");
		n++;
	}
	progress_clear(sh->pg);
	role_log(sh->out, "worker %d: step %llu is waiting for worker%s %s (ps %d has no gradient from %s yet)",
		 sh->index, (unsigned long long)hb->version, n == 1 ? "" : "s", list, l->k,
		 n == 1 ? "it" : "them");
}

static int rx_heartbeat(struct link_rx *rx, const uint8_t *msg, size_t len, char *err, size_t errlen)
{
	struct msg_heartbeat hb;
	int r = msg_decode_heartbeat(msg, len, &hb, err, errlen);
	if (r)
		return r;
	pthread_mutex_lock(&rx->l->sh->say_mu);
	link_heard_locked(rx->l, &hb);
	pthread_mutex_unlock(&rx->l->sh->say_mu);
	return 0;
}

/* The ACK of a push (rows, dense, in the order sent); stale and duplicate
 * ones are counted. The turn passes at the last. */
static int rx_ack(struct link_rx *rx, const uint8_t *msg, size_t len, char *err, size_t errlen)
{
	struct msg_ack ack;
	if (rx->acked >= rx->want_acks)
		return err_set(err, errlen, -EPROTO, "an ACK for no push");
	int r = msg_decode_ack(msg, len, &ack, err, errlen);
	if (r)
		return r;
	if (ack.status == MSG_ACK_STALE || ack.status == MSG_ACK_DUPLICATE)
		rx->l->sh->stale++;
	if (++rx->acked < rx->want_acks)
		return 0;
	pthread_mutex_lock(&rx->l->mu);
	rx->l->acked = 1;
	pthread_cond_broadcast(&rx->l->cv);
	pthread_mutex_unlock(&rx->l->mu);
	return 0;
}

/* The first chunk of the parameters (the rest come on the pipe). */
static int rx_params(struct link_rx *rx, const uint8_t *msg, size_t len, char *err, size_t errlen)
{
	(void)msg;
	if (!rx->want_params || rx->a.received)
		return err_set(err, errlen, -EPROTO, "unexpected PARAMS message");
	return conn_take_chunk(&rx->l->conn, &rx->x, len, err, errlen);
}

/* The reply to STATUS: a shard below the version this worker last pulled
 * from it went back while it waited (a ps restarted from a checkpoint, or
 * rolled back): that is a lost link, for recovery_resync. */
static int rx_status(struct link_rx *rx, const uint8_t *msg, size_t len, char *err, size_t errlen)
{
	struct link *l = rx->l;
	struct msg_status a;
	if (!rx->want_status || rx->statused)
		return err_set(err, errlen, -EPROTO, "unexpected STATUS message");
	if (msg_decode_status(msg, len, &a, err, errlen) || !a.reply || a.shard != (uint32_t)l->k)
		return err_set(err, errlen, -EPROTO, "bad STATUS reply");
	rx->statused = 1;
	if (a.version < l->got)
		return link_went_back(l, a.version);
	l->complete = a.complete;
	return 0;
}

/* ps 0's VIEW (elastic) before the parameters it comes with: kept for the
 * worker, which reads it when it starts the step. */
static int rx_view(struct link_rx *rx, const uint8_t *msg, size_t len, char *err, size_t errlen)
{
	struct link_shared *sh = rx->l->sh;
	struct msg_view v;
	if (rx->l->k != 0 || !rx->want_params || rx->a.received)
		return err_set(err, errlen, -EPROTO, "unexpected VIEW message");
	int r = msg_decode_view(msg, len, &v, err, errlen);
	if (r)
		return r;
	pthread_mutex_lock(&sh->say_mu);
	sh->view = v;
	sh->views++;
	pthread_mutex_unlock(&sh->say_mu);
	return 0;
}

/* A message of the rows pulled (this step's, else the next one's); a
 * sync answer below the version asked for went back, as PARAMS would
 * (link_sparse.h). */
static int rx_rows(struct link_rx *rx, const uint8_t *msg, size_t len, char *err, size_t errlen)
{
	struct link_rows *x = link_rows_waiting(rx->l->ex.rows) ? rx->l->ex.rows : rx->l->ex.ahead;
	int r = link_rows_take(x, msg, len, err, errlen);
	if (r == 1 && x->version != MSG_VERSION_LATEST && x->got < x->version)
		return link_went_back(rx->l, x->got);
	return r < 0 ? r : 0;
}

static int rx_error(struct link_rx *rx, const uint8_t *msg, size_t len, char *err, size_t errlen)
{
	(void)rx;
	struct msg_error me;
	int r = msg_decode_error(msg, len, &me, err, errlen);
	if (!r)
		snprintf(err, errlen, "%s", me.text);
	return -ECONNABORTED;
}

typedef int (*link_rx_fn)(struct link_rx *rx, const uint8_t *msg, size_t len, char *err, size_t errlen);

/* What the receiver does with each message a ps may send a worker. */
static const struct {
	uint8_t type;
	link_rx_fn fn;
} link_handlers[] = {
	{ WIRE_HEARTBEAT, rx_heartbeat },
	{ WIRE_ACK, rx_ack },
	{ WIRE_PARAMS, rx_params },
	{ WIRE_STATUS, rx_status },
	{ WIRE_ERROR, rx_error },
	{ WIRE_ROWS, rx_rows },
	{ WIRE_VIEW, rx_view },
};

static int link_dispatch(struct link_rx *rx, int type, const uint8_t *msg, size_t len, char *err,
			 size_t errlen)
{
	for (size_t i = 0; i < sizeof(link_handlers) / sizeof(link_handlers[0]); i++)
		if (link_handlers[i].type == type)
			return link_handlers[i].fn(rx, msg, len, err, errlen);
	return err_set(err, errlen, -EPROTO, "unexpected %s message", wire_msg_name((uint8_t)type));
}

/* A message between the chunks of the parameters: a HEARTBEAT while the
 * ps waits for the next piece, or the ACK of the push going up. */
static int rx_other(void *ctx, int type, const uint8_t *msg, size_t len, char *err, size_t errlen)
{
	if (type == WIRE_PARAMS)
		return err_set(err, errlen, -EPROTO, "unexpected PARAMS message among PARAMS");
	return link_dispatch(ctx, type, msg, len, err, errlen);
}

/* A chunk of the parameters is in place: with a flow for them (the
 * forward pass of the next step waits on it), marked final. A flow that
 * cannot take the range fails, which ends that wait, not the receive. */
static int rx_took(void *ctx, const struct msg_chunk *c, char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	struct link_rx *rx = ctx;
	size_t lo = rx->l->range.begin + (size_t)c->offset;
	(void)gradflow_mark(rx->l->ex.pflow, lo, lo + c->count);
	return 0;
}

/* One message, through the table; the rest of a tensor on the pipe. */
static int link_recv_one(struct link_rx *rx)
{
	struct link *l = rx->l;
	char e[512];
	size_t len;
	int r;
	if (rx->want_params && rx->a.received && !msg_assembly_done(&rx->a)) {
		r = conn_recv_rest(&l->conn, &rx->x, e, sizeof(e));
		return !r ? 0 : rx->x.bad ? link_refused(l, e) : link_lost(l, r, e);
	}
	r = conn_recv(&l->conn, &len, e, sizeof(e));
	if (r)
		return link_lost(l, r, e);
	r = msg_type(l->conn.rbuf, len, e, sizeof(e));
	if (r >= 0)
		r = link_dispatch(rx, r, l->conn.rbuf, len, e, sizeof(e));
	return r ? link_refused(l, e) : 0;
}

/* The parameters are in: the version they are, counted. Async: versions
 * only grow, so a lower one means the shard was restarted or rolled back
 * (recovery sees which). Sync: a shard that answers below the version
 * asked for was rolled back. */
static int link_took_params(struct link_rx *rx)
{
	struct link *l = rx->l;
	uint64_t had = l->got, v = rx->a.version;
	l->got = v;
	l->torn = 0;
	l->held = v;
	l->holds = role_param_dtype(l->sh->c) == WIRE_F32;
	l->sh->pvalues += rx->a.n;
	l->sh->pbytes += rx->x.value_bytes;
	if (!l->ex.first && (l->sh->c->train.mode == MODE_ASYNC ? v < had : v < l->want))
		return link_went_back(l, v);
	return 0;
}

/* The receiving half: nothing until a message with a reply went out (a
 * long compute must not look like a silent ps), then every reply the
 * exchange waits for, in whatever order they come. */
static void link_recv_side(struct link *l)
{
	const struct link_ex *x = &l->ex;
	struct link_rx rx = { .l = l, .want_params = x->params != NULL,
			      .want_acks = (x->grads != NULL) + (x->rows && x->rows->kind == LINK_ROWS_PUSH),
			      .want_status = x->ctl.type == WIRE_STATUS };
	char e[512];
	if (!rx.want_params && !rx.want_acks && !rx.want_status && !link_rows_waiting(x->rows) &&
	    !link_rows_waiting(x->ahead))
		return;
	pthread_mutex_lock(&l->mu);
	while (!l->asked && l->end == LINK_OK)
		pthread_cond_wait(&l->cv, &l->mu);
	int go = l->end == LINK_OK;
	pthread_mutex_unlock(&l->mu);
	if (!go)
		return;
	if (rx.want_params) {
		if (msg_assembly_init(&rx.a, WIRE_PARAMS, (uint32_t)l->k, l->range.end - l->range.begin,
				      role_param_dtype(l->sh->c), e, sizeof(e))) {
			link_fail(l, LINK_REFUSED, -EINVAL, e);
			return;
		}
		rx.x = (struct conn_chunk_rx){ .type = WIRE_PARAMS, .a = &rx.a, .dst = x->params + l->range.begin,
					       .other = rx_other, .took = x->pflow ? rx_took : NULL, .ctx = &rx };
	}
	while (link_rx_pending(&rx))
		if (link_recv_one(&rx)) {
			/* XORs that failed their check changed the range too */
			l->torn |= rx.want_params && rx.a.received > 0;
			l->holds &= !rx.want_params;
			return;
		}
	if (rx.want_params)
		(void)link_took_params(&rx);
}

/* ---- the two threads ---- */

/* Under l->mu: once both halves are done, the exchange is over. */
static void link_settle_locked(struct link *l)
{
	if (l->tx_busy || l->rx_busy || l->state != LINK_EXCHANGING)
		return;
	l->state = l->end == LINK_OK ? LINK_READY : LINK_FAILED;
	pthread_cond_broadcast(&l->done_cv);
}

/* One half's thread: the half of every exchange begun on the link, until
 * link_free. busy: the half's flag, set by link_begin. */
static void link_serve(struct link *l, int *busy, void (*half)(struct link *))
{
	pthread_mutex_lock(&l->mu);
	for (;;) {
		while (!l->quit && !*busy)
			pthread_cond_wait(&l->cv, &l->mu);
		if (l->quit)
			break;
		pthread_mutex_unlock(&l->mu);
		half(l);
		pthread_mutex_lock(&l->mu);
		*busy = 0;
		link_settle_locked(l);
	}
	pthread_mutex_unlock(&l->mu);
}

static void *link_tx_main(void *arg)
{
	struct link *l = arg;
	link_serve(l, &l->tx_busy, link_send_side);
	return NULL;
}

static void *link_rx_main(void *arg)
{
	struct link *l = arg;
	link_serve(l, &l->rx_busy, link_recv_side);
	return NULL;
}

void link_begin(struct link *l, const struct link_ex *ex)
{
	char nm[300];
	pthread_mutex_lock(&l->mu);
	if (l->state != LINK_READY) {
		if (l->state == LINK_DOWN) {
			l->end = LINK_LOST;
			l->rc = -ECONNABORTED;
			snprintf(l->why, sizeof(l->why), "%s: not connected", link_ps_name(l->sh->c, l->k, nm, sizeof(nm)));
		}
		pthread_mutex_unlock(&l->mu);
		if (ex->turn) {
			pthread_mutex_lock(&ex->turn->mu);
			if (ex->turn->turn < ex->pos + 1)
				ex->turn->turn = ex->pos + 1;
			pthread_cond_broadcast(&ex->turn->cv);
			pthread_mutex_unlock(&ex->turn->mu);
		}
		return;
	}
	l->ex = *ex;
	l->tag = l->got;
	l->state = LINK_EXCHANGING;
	l->end = LINK_OK;
	l->rc = 0;
	l->why[0] = '\0';
	l->asked = l->acked = l->complete = 0;
	l->tx_busy = l->rx_busy = 1;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

int link_wait(struct link *l, char *err, size_t errlen)
{
	pthread_mutex_lock(&l->mu);
	while (l->state == LINK_EXCHANGING)
		pthread_cond_wait(&l->done_cv, &l->mu);
	int r = l->rc;
	if (r && err)
		snprintf(err, errlen, "%s", l->why);
	pthread_mutex_unlock(&l->mu);
	return r;
}

int link_init(struct link *l, int k, struct link_shared *sh, struct shard range,
	      struct cryptopool *pool, char *err, size_t errlen)
{
	const struct config *c = sh->c;
	*l = (struct link){ .k = k, .sh = sh, .range = range, .state = LINK_DOWN };
	if (pthread_mutex_init(&l->mu, NULL))
		return err_set(err, errlen, -ENOMEM, "cannot make the lock of ps link %d", k);
	if (pthread_cond_init(&l->cv, NULL)) {
		pthread_mutex_destroy(&l->mu);
		return err_set(err, errlen, -ENOMEM, "cannot make the condition variable of ps link %d", k);
	}
	if (pthread_cond_init(&l->done_cv, NULL)) {
		pthread_cond_destroy(&l->cv);
		pthread_mutex_destroy(&l->mu);
		return err_set(err, errlen, -ENOMEM, "cannot make the condition variable of ps link %d", k);
	}
	/* From here link_free destroys the connection, as conn_init asks
	 * even when it fails. */
	l->sync_on = 1;
	/* The receiver's own pipe: it takes the parameters while the sender
	 * pushes. */
	struct conn_shape shape = { .pipes = CONN_PIPE_RECV, .pool = pool };
	if (conn_init(&l->conn, -1, &shape, role_peer_timeout_ms(c), role_write_timeout_ms(c)))
		return err_set(err, errlen, -ENOMEM,
			       "out of memory for the buffers and session keys of ps link %d", k);
	l->tx_on = pthread_create(&l->tx, NULL, link_tx_main, l) == 0;
	l->rx_on = l->tx_on && pthread_create(&l->rx, NULL, link_rx_main, l) == 0;
	if (!l->rx_on)
		return err_set(err, errlen, -EAGAIN, "cannot start the threads of ps link %d", k);
	return 0;
}

void link_free(struct link *l)
{
	if (l->sync_on) {
		pthread_mutex_lock(&l->mu);
		l->quit = 1;
		pthread_cond_broadcast(&l->cv);
		pthread_mutex_unlock(&l->mu);
	}
	if (l->tx_on)
		pthread_join(l->tx, NULL);
	if (l->rx_on)
		pthread_join(l->rx, NULL);
	l->tx_on = l->rx_on = 0;
	if (l->sync_on) {
		conn_destroy(&l->conn);
		pthread_mutex_destroy(&l->mu);
		pthread_cond_destroy(&l->cv);
		pthread_cond_destroy(&l->done_cv);
		l->sync_on = 0;
	}
}
