/* The ps's side of PUSH (ps_conn.h): a worker's gradient for the shard,
 * checked and aggregated as a whole (psshard_push), or in sync piece mode
 * piece by piece as each chunk arrives (psshard_push_piece), so that the
 * pieces every worker has sent can go back out while the rest still comes
 * in; then one ACK. */
#include "ps_apply.h"
#include "ps_conn.h"

#include "../base/err.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The reason a push (or, in piece mode, the piece of it over [lo, hi) of
 * the shard, whose values are g) was refused: r from psshard_push or
 * psshard_push_piece; v: the shard's version. */
static int push_refused(struct ps_conn *cn, int r, const float *g, size_t lo, size_t hi, uint64_t v,
			char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	unsigned long long tag = (unsigned long long)cn->a.version;
	if (r == -EDOM) {
		size_t i = lo + optim_nonfinite(g, hi - lo);
		float x = i < hi ? g[i - lo] : 0;
		return err_set(err, errlen, r, "PUSH for version %llu refused: gradient element %zu (parameter %zu) is %s",
			       tag, i, ps->sh.range.begin + i, isnan(x) ? "NaN" : x > 0 ? "+inf" : "-inf");
	}
	if (r == -ERANGE)
		return err_set(err, errlen, -EPROTO, "PUSH for version %llu refused: the shard is at version %llu",
			       tag, (unsigned long long)v);
	return err_set(err, errlen, -EPROTO, "PUSH for version %llu refused: %s", tag, strerror(-r));
}

int ps_ack(struct ps_conn *cn, int r, enum psshard_outcome oc, uint64_t v, char *err,
		    size_t errlen)
{
	size_t len;
	struct msg_ack ack = { .shard = (uint32_t)cn->ps->index, .version = v };
	ack.status = r == -EALREADY	     ? MSG_ACK_DUPLICATE
		     : oc == PSSHARD_APPLIED ? MSG_ACK_APPLIED
		     : oc == PSSHARD_WAITING ? MSG_ACK_ACCEPTED
					     : MSG_ACK_STALE;
	r = msg_encode_ack(conn_payload(&cn->conn, CONN_MAIN), conn_payload_cap(&cn->conn), &ack, &len,
			   err, errlen);
	return r ? r : ps_io(cn, conn_send_payload(&cn->conn, CONN_MAIN, len, err, errlen));
}

/* Piece mode: the values of chunk c, piece [lo, hi). float32 ones are
 * used where the frame was opened (they are 4-byte aligned there, and
 * psshard_push_piece reads them only during the call): a copy into
 * cn->grad first was 1.3 MB a worker a step for each ps of the MLP.
 * Other dtypes are widened into cn->grad. */
static const float *push_values(struct ps_conn *cn, const struct msg_chunk *c, size_t lo)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	if (c->dtype == WIRE_F32 && (uintptr_t)c->data % _Alignof(float) == 0)
		return (const float *)(const void *)c->data;
#endif
	msg_chunk_floats(cn->grad + lo, c);
	return cn->grad + lo;
}

/* Piece mode: piece j of this connection's push, values g (under no
 * lock), aggregated at once (so that the pieces the other workers have
 * sent too can go back out while the rest still comes in). A piece this
 * worker already gave (it pushes again after reconnecting) is a
 * duplicate, not an error. */
int ps_push_piece(struct ps_conn *cn, uint64_t tag, size_t j, const float *g, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	size_t lo, hi;
	psshard_piece_range(&ps->sh, j, &lo, &hi);
	struct psshard_owed owe = { 0 };
	struct ps_lead seen;
	pthread_mutex_lock(&ps->mu);
	ps_lead_seen(ps, &seen);
	int r = psshard_push_piece_owed(&ps->sh, cn->slice, tag, j, g, hi == ps->sh.n, &cn->last_oc,
					ps->applier ? &owe : NULL);
	if (r == 0 && owe.g)
		ps->applying++; /* owed from now: a PULL's hope, a rollback's wait */
	cn->pushed |= r == 0 || r == -EALREADY;
	uint64_t v = psshard_version(&ps->sh);
	/* Only the leading pieces growing is news to a waiting PULL (a
	 * streamer waits on the first piece it has not sent, a whole PULL
	 * on the version; ps_lead_news), or, once every other worker is
	 * done, this worker's whole gradient: its own streamer then stops
	 * waiting (pull_hopeless) at once, not at its next HEARTBEAT. */
	int applied = r == 0 && cn->last_oc == PSSHARD_APPLIED && !owe.g;
	if (applied)
		ps_store_pushed(&ps->store);
	if (ps_lead_news(cn, &seen) || ((r == 0 || r == -EALREADY) && members_others_done(&ps->mb) &&
			psshard_has_pushed(&ps->sh, cn->w)))
		pthread_cond_broadcast(&ps->pull_cv);
	pthread_mutex_unlock(&ps->mu);
	/* The pool steps the piece it completed after this returns, from a
	 * copy that lasts until the PUSH is ACKed (the frame's is the next
	 * frame's by then); no one else touches the owed piece meanwhile. */
	if (owe.g) {
		if (owe.g != cn->grad + lo)
			memcpy(cn->grad + lo, owe.g, (hi - lo) * sizeof(float));
		owe.g = cn->grad + lo;
		ps_apply_submit(cn, &owe);
	}
	cn->last_r = r;
	return r && r != -EALREADY ? push_refused(cn, r, g, lo, hi, v, err, errlen) : 0;
}

void ps_lead_seen(const struct ps *ps, struct ps_lead *l)
{
	*l = (struct ps_lead){ .moves = psshard_lead_moves(&ps->sh), .v = psshard_version(&ps->sh),
			       .lead = psshard_lead(&ps->sh) };
}

/* The lead grew (or the version moved): news to a streamer, which sends the
 * leading pieces in order. A piece that came over a local connection
 * (ring or Unix socket) wakes it only for 8 more (512 KiB) or for the
 * version: the rest follow at memory speed, microseconds apart, and a ps
 * woken for each of the CNN's 200 pieces spent a third of its CPU on
 * wake-ups (2 vCPUs). One that came over TCP wakes it at once: at 1
 * Gbit/s the next piece is half a millisecond away, and the parameters
 * going down while the gradient still comes up is what the link's two
 * directions are for (waking for 8 at a time cost 5% of the steps there). */
#define LEAD_BATCH_LOCAL 8

int ps_lead_news(const struct ps_conn *cn, const struct ps_lead *l)
{
	const struct psshard *sh = &cn->ps->sh;
	if (psshard_lead_moves(sh) == l->moves)
		return 0;
	if (cn->conn.keys->recv.cipher != FRAME_LOCAL || psshard_version(sh) != l->v)
		return 1;
	return psshard_lead(sh) / LEAD_BATCH_LOCAL != l->lead / LEAD_BATCH_LOCAL;
}

/* Piece mode: one chunk of a PUSH is one piece of the shard, or one piece
 * of a run sent as factors (ps_factors.c). */
static int push_took(void *ctx, const struct msg_chunk *c, char *err, size_t errlen)
{
	struct ps_conn *cn = ctx;
	struct ps *ps = cn->ps;
	size_t j = (size_t)(c->offset / PSSHARD_PIECE), lo, hi;
	psshard_piece_range(&ps->sh, j, &lo, &hi);
	if (j >= ps->sh.npieces || c->offset != lo || c->count != hi - lo)
		return err_set(err, errlen, -EPROTO, "PUSH chunk [%llu, %llu) is not one of the shard's pieces of %u values",
			       (unsigned long long)c->offset, (unsigned long long)(c->offset + c->count),
			       PSSHARD_PIECE);
	if (c->dtype == WIRE_F32F || cn->fx.need)
		return ps_factors_take(cn, c, err, errlen);
	return ps_push_piece(cn, c->version, j, push_values(cn, c, lo), err, errlen);
}

/* Async: a push tagged with a version the shard had before a rollback
 * (another worker's recovery rolled it back while this one trained on) is
 * stale, not refused: its worker learns of the rollback from its next
 * pull and rolls back with the others (cluster/recovery.c). Refused, it
 * ended that worker (a CI run, 2026-11-29: a late ROLLBACK to a
 * checkpoint completed after the chief had already gone on). Anything
 * above every version the shard had is still refused. Under ps->mu. */
static int push_from_before_a_rollback(struct ps *ps, int r, uint64_t tag, enum psshard_outcome *oc)
{
	if (r != -ERANGE || ps->sh.mode != MODE_ASYNC || tag > ps->went_back_from)
		return r;
	ps->sh.received++;
	ps->sh.dropped_stale++;
	*oc = PSSHARD_STALE;
	return 0;
}

/* A whole gradient has arrived: applied under the lock (piece mode: it
 * was, piece by piece), then ACKed. One with a NaN or an infinity is
 * refused (psshard_push checks as it copies or before it applies), the
 * shard untouched; an honest worker checks before it pushes, so this is
 * a broken or hostile one. */
static int push_apply(struct ps_conn *cn, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	enum psshard_outcome oc = cn->last_oc;
	cn->assembling = 0;
	if (ps->applier) /* the ACK says the pieces are stepped, and cn->grad is free again */
		ps_apply_wait_conn(cn);
	pthread_mutex_lock(&ps->mu);
	int r = cn->last_r;
	if (!psshard_pieces(&ps->sh)) {
		r = psshard_push(&ps->sh, cn->slice, cn->a.version, cn->grad, &oc);
		r = push_from_before_a_rollback(ps, r, cn->a.version, &oc);
		cn->pushed |= r == 0 || r == -EALREADY;
		ps_store_pushed(&ps->store);
		pthread_cond_broadcast(&ps->pull_cv);
	}
	uint64_t v = psshard_version(&ps->sh);
	pthread_mutex_unlock(&ps->mu);
	if (r && r != -EALREADY)
		return push_refused(cn, r, cn->grad, 0, ps->sh.n, v, err, errlen);
	return ps_ack(cn, r, oc, v, err, errlen);
}

/* PUSH (or PARAMS, refused by the assembly): the first chunk here, the
 * rest of the tensor on the pipe, as many frames as full chunks can
 * complete it, opened on the pool; in piece mode each piece is
 * aggregated as it is taken. */
int ps_on_push(struct ps_conn *cn, size_t len, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	size_t n = ps->sh.n;
	struct msg_chunk ch;
	int pieces = psshard_pieces(&ps->sh);
	int r = msg_decode_chunk(cn->conn.rbuf, len, &ch, err, errlen);
	if (r)
		return r;
	if (WIRE_PUSH_WORKER(ch.worker) != (uint32_t)cn->w)
		return err_set(err, errlen, -EPROTO, "PUSH names worker %u on worker %d's connection",
			       WIRE_PUSH_WORKER(ch.worker), cn->w);
	/* Any worker may push any slice: a view moves slices between
	 * workers, and one pushed twice is a duplicate (cluster/view.h). */
	if (WIRE_PUSH_SLICE(ch.worker) >= (uint32_t)ps->sh.workers)
		return err_set(err, errlen, -EPROTO, "PUSH of slice %u; a step has %d",
			       WIRE_PUSH_SLICE(ch.worker), ps->sh.workers);
	if (!cn->assembling) {
		r = msg_assembly_init(&cn->a, WIRE_PUSH, (uint32_t)ps->index, n,
				      role_grad_dtype(ps->c), err, errlen);
		if (r)
			return r;
		cn->assembling = 1;
		cn->slice = (int)WIRE_PUSH_SLICE(ch.worker);
		cn->fx.need = 0;
	}
	/* Piece mode: push_took takes each chunk's values (push_values). */
	float *dst = pieces ? NULL : cn->grad;
	r = msg_assembly_add(&cn->a, &ch, dst, err, errlen);
	if (r < 0)
		return r;
	int done = r;
	if (pieces && (r = push_took(cn, &ch, err, errlen)) < 0)
		return r;
	if (!done) {
		struct conn_chunk_rx x = { .type = WIRE_PUSH, .worker = ch.worker, .a = &cn->a,
					   .dst = dst, .took = pieces ? push_took : NULL, .ctx = cn };
		r = conn_recv_rest(&cn->conn, &x, err, errlen);
		if (r)
			return x.bad ? r : ps_io(cn, r);
		if (!msg_assembly_done(&cn->a))
			return 0;
	}
	return push_apply(cn, err, errlen);
}
