/* The ps's answers to PULL (ps_conn.h): the whole shard as it is, or, in
 * sync piece mode, the next version streamed piece by piece as each piece
 * completes, from a streamer thread per connection so that the PUSH on
 * the same connection keeps coming in. While a sync PULL waits, HEARTBEATs
 * tell the worker which workers the shard waits for.
 *
 * The lock: every pull_* function is called holding ps->mu and returns
 * holding it, whatever it returns (it used to be held on some returns and
 * not on others). Those that send release it around each send only (a
 * send may wait write_timeout on a slow worker, and no other thread of
 * the ps may wait on that): what goes out was copied under it, or, for
 * a streamed piece, cannot change while it goes out (pull_stream), and
 * after a send they look at the shard again, never at what they saw
 * before.
 *
 * Waiting: a PULL waits on ps->pull_cv, which is broadcast when what it
 * waits for may have come (pull_wait lists it); an idle streamer waits on
 * its connection's st_cv, signalled when it is handed a PULL or told to
 * end; ps->cv is left to those waiting for connections to end, for the
 * streams from the shard itself and for the apply pool's jobs
 * (ps_apply_settle, before a whole copy of the shard). */
#include "ps_apply.h"
#include "ps_conn.h"

#include "../base/err.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* A HEARTBEAT for a worker waiting on a sync PULL: which workers' gradients
 * for the shard's version have not arrived (under ps->mu). */
static void ps_heartbeat(struct ps *ps, struct msg_heartbeat *hb)
{
	memset(hb, 0, sizeof(*hb));
	hb->version = psshard_version(&ps->sh);
	members_missing(&ps->mb, &ps->sh, hb->missing, (int)MSG_HEARTBEAT_WORKERS);
}

int ps_heartbeat_send(struct ps_conn *cn, enum conn_sender from, const struct msg_heartbeat *hb, char *err,
		      size_t errlen)
{
	size_t len;
	pthread_mutex_unlock(&cn->ps->mu);
	int r = msg_encode_heartbeat(conn_payload(&cn->conn, from), conn_payload_cap(&cn->conn), hb, &len, err,
				     errlen);
	if (!r)
		r = conn_send_payload(&cn->conn, from, len, err, errlen);
	pthread_mutex_lock(&cn->ps->mu);
	return r;
}

/* The version a sync PULL waits for: of the whole shard (piece < 0) or
 * of one piece. */
static uint64_t pull_has(const struct ps *ps, long piece)
{
	return piece < 0 ? psshard_version(&ps->sh) : psshard_piece_version(&ps->sh, (size_t)piece);
}

/* The answer to a PULL is sent by the connection's own thread, or, in
 * piece mode, by its streamer: `from` is that thread's sender (CONN_MAIN
 * or CONN_SIDE), whose frame buffer and pipe carry the HEARTBEATs, an
 * ERROR and the PARAMS. Its failures are all the transport's (or a shard
 * gone back under a streamed answer): none gets an ERROR. */

/* Whether the shard's current version waits on this worker's own
 * gradient while the PULL is answered on the thread that must read it
 * (no streamer): a sync shard that needs every slice (no backup
 * workers), a slice this worker owns in the step (on ps 0 of an elastic
 * cluster, ps_view_owes) not pushed. Nobody else can push it while the
 * worker is connected, and its thread reads nothing until the PULL is
 * answered: waiting would hold the shard, and every other worker's PULL,
 * for ever. A worker never asks so (it pushes, reads the ACK, then
 * pulls); a peer that does (found by tests/fuzz/fuzz_ps.c's elastic
 * mode), or one whose shard was rolled back meanwhile, gets the shard as
 * it is, as after a revision. */
static int pull_waits_on_itself(const struct ps_conn *cn, long piece)
{
	const struct ps *ps = cn->ps;
	if (piece >= 0 || cn->st_on || ps->sh.mode != MODE_SYNC || ps->sh.replicas < ps->sh.workers)
		return 0;
	return ps->mb.elastic ? ps_view_owes(ps, cn->w) : !members_has_pushed(&ps->mb, &ps->sh, cn->w);
}

/* Whether nothing but this worker can move the shard, and this worker
 * has: every other worker is done, and this one's gradient for the
 * current version is in (a streamed PULL comes before the PUSH); or it
 * alone can, and cannot while this PULL waits (pull_waits_on_itself). */
static int pull_hopeless(const struct ps_conn *cn, long piece)
{
	const struct ps *ps = cn->ps;
	if (pull_waits_on_itself(cn, piece))
		return 1;
	/* Pieces being stepped (ps_apply.h) still move the shard: a push
	 * is in, its steps not yet; the last of them wakes this wait. */
	if (ps->applying > 0)
		return 0;
	return members_others_done(&ps->mb) && (piece < 0 || members_has_pushed(&ps->mb, &ps->sh, cn->w));
}

/* Whether a PULL still waits (under ps->mu): see pull_wait. */
static int pull_waits(const struct ps_conn *cn, long piece, uint64_t want, uint64_t gen)
{
	const struct ps *ps = cn->ps;
	if (ps->aborted || ps->gen != gen || cn->st_stop)
		return 0;
	if (ps_view_wait(ps))
		return 1;
	return want != MSG_VERSION_LATEST && pull_has(ps, piece) < want && !pull_hopeless(cn, piece);
}

/* A sync PULL waits (under ps->mu) for version `want` of the shard, or of
 * one piece, to exist (and on ps 0 of an elastic cluster, any PULL for
 * min_workers to be ready: ps_view.c); meanwhile a HEARTBEAT every
 * heartbeat_ms tells the worker that the shard is alive and which workers
 * it waits for. It stops waiting when the ps stops, a rollback or a
 * revision of the step's view since gen happens, no other worker will
 * push (pull_hopeless), or the streamer is told to end; each of those, a
 * the leading pieces growing (psshard_lead_moves), and (elastic) a PULL that makes a worker
 * ready, broadcasts ps->pull_cv (a timed wait besides, for the
 * HEARTBEATs). */
static int pull_wait(struct ps_conn *cn, long piece, uint64_t want, uint64_t gen,
		     enum conn_sender from, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	while (pull_waits(cn, piece, want, gen)) {
		struct timespec dl;
		role_deadline(&dl, role_heartbeat_ms(ps->c));
		if (pthread_cond_timedwait(&ps->pull_cv, &ps->mu, &dl) != ETIMEDOUT || !pull_waits(cn, piece, want, gen))
			continue;
		struct msg_heartbeat hb;
		ps_heartbeat(ps, &hb);
		int r = ps_heartbeat_send(cn, from, &hb, err, errlen);
		if (r)
			return r;
	}
	if (cn->st_stop)
		return err_set(err, errlen, -ECANCELED, "the connection ends");
	return 0;
}

/* The dtype of the PARAMS for this connection's PULL: float32 packed
 * where the worker asked for it (it does where its link limits its
 * steps: worker.c). */
static unsigned pull_dtype(const struct ps_conn *cn)
{
	unsigned dt = role_param_dtype(cn->ps->c);
	return dt == WIRE_F32 && cn->pull_packed ? WIRE_F32P : dt;
}

/* A PULL's answer: the whole shard as it is (copied under the lock, sent
 * without it), or, if the ps stops, an ERROR saying why (and PS_END). */
static int pull_send_whole(struct ps_conn *cn, enum conn_sender from, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	size_t n = ps->sh.n;
	ps_apply_settle(ps); /* no piece half stepped in the copy */
	int ab = ps->aborted;
	uint64_t v = psshard_version(&ps->sh);
	if (!ab)
		memcpy(cn->snap, psshard_params(&ps->sh), n * sizeof(float));
	for (size_t j = 0; !ab && cn->sent && j < ps->sh.npieces; j++)
		cn->sent[j] = psshard_piece_version(&ps->sh, j);
	char why[WIRE_ERROR_TEXT_MAX + 1];
	snprintf(why, sizeof(why), "ps %d stops: %.200s", ps->index, ps->why);
	cn->st_job = 0; /* the answer waits on nothing more: the next PULL may come */
	struct msg_view vm;
	ps_view_fix(ps);
	int view = !ab && ps_view_message(cn, &vm);
	struct conn_chunk_tx t = { .type = WIRE_PARAMS, .shard = (uint32_t)ps->index, .version = v,
				   .src = cn->snap, .n = n, .dtype = (uint8_t)pull_dtype(cn) };
	pthread_mutex_unlock(&ps->mu);
	int r = PS_END;
	if (ab) {
		conn_send_error(&cn->conn, from, ECONNABORTED, why);
		snprintf(err, errlen, "training aborted");
	} else {
		size_t len;
		/* ps 0, elastic: the view of this version first (ps_view.c) */
		r = view ? msg_encode_view(conn_payload(&cn->conn, from), conn_payload_cap(&cn->conn), &vm, &len, err,
					   errlen) : 0;
		if (!r && view)
			r = conn_send_payload(&cn->conn, from, len, err, errlen);
		if (!r)
			r = conn_send_tensor(&cn->conn, from, &t, err, errlen);
	}
	pthread_mutex_lock(&ps->mu);
	return r;
}

#define PULL_SENT_NONE UINT64_MAX /* cn->sent: nothing recorded */

/* Whether this connection asked for XORs and last sent pieces [j, k) at
 * version want - 1: what the worker holds, if it holds what it was sent
 * (it asks only then). Not the shard's version: a whole shard's copy
 * (pull_send_whole, a reconnected worker's first pull) takes pieces that
 * went a version ahead with it, labelled with the shard's version. */
static int pull_sent_before(const struct ps_conn *cn, size_t j, size_t k, uint64_t want)
{
	if (!cn->pull_delta || !cn->sent || want == 0)
		return 0;
	for (size_t i = j; i < k; i++)
		if (cn->sent[i] != want - 1)
			return 0;
	return 1;
}

/* Piece mode, a PULL of the next version: each piece goes out as soon as
 * its R gradients are in, in order, every run of pieces that is ready at
 * once in one call (sealed on the pool), while the last gradients of the
 * step still arrive. Every piece it sends is at `want`: no piece gets
 * past the next version before every worker, this one included, has all
 * of it. A wait that ends otherwise (the ps stops, a rollback, every
 * other worker done) before the first piece falls back to the whole
 * shard as it is; after it, the pieces sent are of a version the shard no
 * longer has, and the connection ends as if lost: the worker connects
 * again and pulls what there is. */
static int pull_stream(struct ps_conn *cn, uint64_t want, enum conn_sender from, char *err,
		       size_t errlen)
{
	struct ps *ps = cn->ps;
	struct psshard *sh = &ps->sh;
	size_t np = sh->npieces;
	uint64_t gen = ps->gen;
	for (size_t j = 0; j < np;) {
		int r = pull_wait(cn, (long)j, want, gen, from, err, errlen);
		if (r)
			return r;
		if (psshard_piece_version(sh, j) != want) {
			if (j == 0 || ps->aborted)
				return pull_send_whole(cn, from, err, errlen);
			return err_set(err, errlen, -ECONNABORTED,
				       "version %llu was going out when the shard went back or stopped",
				       (unsigned long long)want);
		}
		size_t k = j + 1, lo, hi, e;
		while (k < np && psshard_piece_version(sh, k) == want)
			k++;
		psshard_piece_range(sh, j, &lo, &e);
		psshard_piece_range(sh, k - 1, &e, &hi);
		if (k == np)
			cn->st_job = 0; /* as in pull_send_whole */
		/* Sent from the shard itself, unlocked, not from a copy (a
		 * ps spent a tenth of its CPU copying): these pieces cannot
		 * move while they go out, since no piece gets past `want`
		 * before this worker, which has not got them, pushed for it;
		 * every sealing read of them is done before the last frame is
		 * written. A connection the worker replaces is shut down
		 * before the new one is taken (ps.c), so its stream fails
		 * long before the worker could push on the new one. A
		 * rollback, the one other writer, waits for the stream
		 * (on_rollback). Piece mode only: with backup workers, async
		 * or an elastic set the shard may move under a send, and
		 * pull_send_whole copies. */
		/* XORs with the version the worker holds, where the shard kept
		 * it: read unlocked like the pieces, and for the same reason
		 * (their next update, which overwrites them, waits on this
		 * worker's push). */
		const float *prev = pull_sent_before(cn, j, k, want) ? psshard_prev(sh, j, k, want) : NULL;
		for (size_t i = j; cn->sent && i < k; i++)
			cn->sent[i] = want;
		ps->streaming++;
		/* read under the lock: the connection's next PULL sets it */
		uint8_t dtype = (uint8_t)pull_dtype(cn);
		pthread_mutex_unlock(&ps->mu);
		struct conn_chunk_tx t = { .type = WIRE_PARAMS, .shard = (uint32_t)ps->index, .version = want,
					   .src = psshard_params(sh) + lo, .n = hi - lo, .offset = lo, .dtype = dtype };
		if (prev && t.dtype == WIRE_F32P) {
			t.dtype = WIRE_F32X;
			t.base = prev + lo;
		}
		r = conn_send_tensor(&cn->conn, from, &t, err, errlen);
		pthread_mutex_lock(&ps->mu);
		if (--ps->streaming == 0)
			pthread_cond_broadcast(&ps->cv);
		if (r)
			return r;
		j = k;
	}
	return 0;
}

/* A PULL of version want, streamed when it is the next version of a
 * shard in piece mode. */
static int pull_answer(struct ps_conn *cn, uint64_t want, enum conn_sender from, char *err,
		       size_t errlen)
{
	struct ps *ps = cn->ps;
	if (psshard_pieces(&ps->sh) && want != MSG_VERSION_LATEST && want > psshard_version(&ps->sh))
		return pull_stream(cn, want, from, err, errlen);
	int r = pull_wait(cn, -1, want, ps->gen, from, err, errlen);
	return r ? r : pull_send_whole(cn, from, err, errlen);
}

/* The streamer: answers each PULL the connection's thread hands it, until
 * told to end. A failure, or an ERROR it sent, ends the connection (shut
 * down, so that the reading thread sees it at once); st_r and st_err keep
 * why. */
void *ps_streamer(void *arg)
{
	struct ps_conn *cn = arg;
	struct ps *ps = cn->ps;
	pthread_mutex_lock(&ps->mu);
	for (;;) {
		while (!cn->st_job && !cn->st_stop)
			pthread_cond_wait(&cn->st_cv, &ps->mu);
		if (cn->st_stop)
			break;
		int r = pull_answer(cn, cn->st_want, CONN_SIDE, cn->st_err, sizeof(cn->st_err));
		if (r) {
			/* A failure once told to end is only the end. */
			cn->st_job = 0;
			cn->st_r = cn->st_stop ? 0 : r;
			break;
		}
	}
	pthread_mutex_unlock(&ps->mu);
	if (cn->st_r)
		conn_shutdown(&cn->conn);
	return NULL;
}

/* A PULL's flags (under ps->mu): XORs only with packing, and only where
 * the shard can keep its pieces' previous versions (piece mode, memory
 * for one more copy, within [ps] memory_limit; else the pieces go
 * packed). */
static void pull_flags(struct ps_conn *cn, uint8_t flags)
{
	struct psshard *sh = &cn->ps->sh;
	cn->pull_packed = (flags & MSG_PULL_PACKED) != 0;
	cn->pull_delta = cn->pull_packed && (flags & MSG_PULL_DELTA) && cn->ps->prev_fits &&
			 psshard_keep_prev(sh) == 0;
	/* what this connection sends is recorded from its first PULL asking
	 * for XORs on: none before it (what was sent then is not known) */
	if (cn->pull_delta && !cn->sent && (cn->sent = malloc(sh->npieces * sizeof(*cn->sent))))
		for (size_t j = 0; j < sh->npieces; j++)
			cn->sent[j] = PULL_SENT_NONE;
	cn->pull_delta &= cn->sent != NULL;
}

int ps_on_pull(struct ps_conn *cn, size_t len, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	struct msg_pull p;
	int r = msg_decode_pull(cn->conn.rbuf, len, &p, err, errlen);
	if (r)
		return r;
	if (p.shard != (uint32_t)ps->index)
		return err_set(err, errlen, -EPROTO, "PULL for shard %u, this is shard %d", p.shard,
			       ps->index);
	/* A worker that said DONE pulls again (on this connection or, after
	 * reconnecting, on a new one) only to train again after a rollback
	 * while it waited for the run to complete, or to see where the
	 * shards are: it is not done until it says DONE again. */
	if (cn->first_pull && ps->hooks.first_pull_delay_ms)
		role_nap_ms(ps->hooks.first_pull_delay_ms);
	cn->first_pull = 0;
	pthread_mutex_lock(&ps->mu);
	cn->state = PS_CONN_MEMBER;
	members_pulled(&ps->mb, cn->w);
	/* elastic: one more ready worker may let a step's view be fixed */
	if (ps->mb.elastic)
		pthread_cond_broadcast(&ps->pull_cv);
	if (!cn->st_on) {
		pull_flags(cn, p.flags);
		r = pull_answer(cn, p.version, CONN_MAIN, err, errlen);
		if (r < 0)
			cn->failing = PS_CONN_LOST;
		pthread_mutex_unlock(&ps->mu);
		return r;
	}
	int busy = cn->st_job;
	if (!busy) {
		cn->st_want = p.version;
		pull_flags(cn, p.flags);
		cn->st_job = 1;
		pthread_cond_signal(&cn->st_cv);
	}
	pthread_mutex_unlock(&ps->mu);
	if (busy)
		return err_set(err, errlen, -EPROTO, "PULL for version %llu before the last one was answered",
			       (unsigned long long)p.version);
	return 0;
}
