/* The ps role: `pstrain ps --index N` serves one shard of the parameter
 * vector (cluster.h). Start-up; an admission loop on the main thread, where
 * new connections wait in net/gate.c (no thread, no buffers) until their
 * greeting is whole and is then checked (authentic, a worker of this
 * cluster, newer than any greeting of that worker answered before) and
 * answered; one detached thread per answered connection, which counts as
 * its worker only once the first frame opens (the key is confirmed, and no
 * other live connection is that worker's) and then answers the worker's
 * messages, one handler per message type from a table (PULL's in
 * ps_pull.c, PUSH's in ps_push.c; what they share in ps_conn.h). What
 * the admission does with a whole greeting is ps_admit.c's. The
 * shard's update rules are cluster/psshard.c, its checkpoints ps_store.c, and who the
 * workers are (live, done, leaving, lost, newest greeting) members.c; all
 * of them under the one mutex ps->mu. Observers (`pstrain status`) are
 * admitted beside the workers into a few slots of their own, may only ask
 * STATUS (answered with REPORT), and are never members. docs/SECURITY.md
 * says what each limit here is for. The stateful fuzzer's harness around
 * the same ps is ps_harness.c. */
#include "cluster.h"
#include "ps_apply.h"
#include "ps_conn.h"

#include "psshard.h"
#include "../core/shard.h"
#include "../net/conn.h"
#include "../net/cryptopool.h"
#include "../net/gate.h"
#include "../base/err.h"
#include "../net/handshake.h"
#include "../net/msg.h"
#include "../net/pipe.h"
#include "../net/sock.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* Connections waiting for their greeting (fixed records in the gate), in
 * all and from one source address; fewer if file descriptors are short. */
#define PS_PENDING_MAX 1024
#define PS_PENDING_PER_SOURCE 512
_Static_assert(MSG_REPORT_WORKERS >= MEMBERS_MAX, "a REPORT names every worker");

static int on_checkpoint(struct ps_conn *cn, size_t len, char *err, size_t errlen)
{
	struct msg_checkpoint ck;
	int r = msg_decode_checkpoint(cn->conn.rbuf, len, &ck, err, errlen);
	if (r)
		return r;
	if (cn->w != 0)
		return err_set(err, errlen, -EPROTO,
			       "CHECKPOINT from worker %d; only the chief (0) sends it", cn->w);
	ps_store_checkpoint(&cn->ps->store, ck.step, ck.has_acc ? ck.acc : -1);
	return 0;
}

/* ROLLBACK: ps_store does the restoring, under ps->mu, so no push or pull
 * sees a half restored shard; waiting PULLs are woken (ps->gen) and
 * answered with the restored version. A rollback that fails (no such
 * checkpoint, or one that does not load) leaves the shard untouched and is
 * refused: this connection ends with an ERROR, and the ps goes on serving
 * the others. It used to stop the ps, which let any key holder stop one
 * with a step that has no checkpoint; an honest worker refused here exits
 * with the reason, so a checkpoint that truly cannot be loaded still ends
 * the run (docs/PROTOCOL.md, "Failures"). */
static int on_rollback(struct ps_conn *cn, size_t len, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	struct msg_rollback rb;
	char e[CONFIG_ERR_MAX] = "";
	int r = msg_decode_rollback(cn->conn.rbuf, len, &rb, err, errlen);
	if (r)
		return r;
	uint64_t step = rb.step;
	pthread_mutex_lock(&ps->mu);
	/* Not under a stream from the shard itself (ps_pull.c): bounded by
	 * write_timeout, as every send is. */
	while (ps->streaming > 0 || ps->applying > 0) /* nor under a piece being stepped */
		pthread_cond_wait(&ps->cv, &ps->mu);
	uint64_t v = psshard_version(&ps->sh);
	r = ps_store_rollback(&ps->store, &step, e, sizeof(e));
	if (r == 0) {
		ps_sparse_rewind(ps);
		ps->gen++;
		ps->went_back_from = v > ps->went_back_from ? v : ps->went_back_from;
		pthread_cond_broadcast(&ps->pull_cv);
	}
	pthread_mutex_unlock(&ps->mu);
	if (r < 0)
		return err_set(err, errlen, r, "cannot roll back to step %llu: %s",
			       (unsigned long long)rb.step, e);
	if (r == 1)
		role_log(ps->out, "ps %d: ROLLBACK to step %llu: already there", ps->index,
			 (unsigned long long)step);
	else
		role_log(ps->out, "ps %d: rolled back from version %llu to step %llu, where a restarted ps resumed",
			 ps->index, (unsigned long long)v, (unsigned long long)step);
	return 0;
}

static int on_heartbeat(struct ps_conn *cn, size_t len, char *err, size_t errlen)
{
	struct msg_heartbeat hb;
	return msg_decode_heartbeat(cn->conn.rbuf, len, &hb, err, errlen);
}

/* A finished worker asking whether the run is complete: the chief has
 * said DONE, after its final checkpoint and evaluation. */
static int on_status(struct ps_conn *cn, size_t len, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	struct msg_status q;
	int r = msg_decode_status(cn->conn.rbuf, len, &q, err, errlen);
	if (r)
		return r;
	if (q.reply || q.shard != (uint32_t)ps->index)
		return err_set(err, errlen, -EPROTO, "STATUS %s for shard %u, this is shard %d",
			       q.reply ? "reply" : "request", q.shard, ps->index);
	pthread_mutex_lock(&ps->mu);
	struct msg_status ans = { .reply = 1, .shard = (uint32_t)ps->index,
				  .version = psshard_version(&ps->sh),
				  .applied = ps->sh.received - ps->sh.dropped_stale,
				  .stale = ps->sh.dropped_stale,
				  .complete = (uint8_t)members_complete(&ps->mb) };
	pthread_mutex_unlock(&ps->mu);
	r = msg_encode_status(conn_payload(&cn->conn, CONN_MAIN), conn_payload_cap(&cn->conn), &ans,
			      &len, err, errlen);
	return r ? r : ps_io(cn, conn_send_payload(&cn->conn, CONN_MAIN, len, err, errlen));
}

static int on_done(struct ps_conn *cn, size_t len, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	struct msg_done d;
	int r = msg_decode_done(cn->conn.rbuf, len, &d, err, errlen);
	if (r)
		return r;
	if (d.worker != (uint32_t)cn->w)
		return err_set(err, errlen, -EPROTO, "DONE names worker %u on worker %d's connection",
			       d.worker, cn->w);
	pthread_mutex_lock(&ps->mu);
	/* A worker that owns a slice of the step under way has not finished:
	 * accepted, its DONE would leave the step waiting on it for ever, as
	 * nobody gives a finished worker's slices to another (found by
	 * tests/fuzz/fuzz_ps.c's elastic mode: LEAVE, then DONE with nothing
	 * pushed). Refused, the worker is lost, and its slices go. */
	if (ps_view_unpushed(ps, cn->w)) {
		uint64_t v = psshard_version(&ps->sh);
		pthread_mutex_unlock(&ps->mu);
		return err_set(err, errlen, -EPROTO, "DONE from worker %d with its slices of step %llu not pushed",
			       cn->w, (unsigned long long)v);
	}
	members_done(&ps->mb, cn->w, d.leaving);
	cn->state = PS_CONN_DONE;
	pthread_cond_broadcast(&ps->pull_cv); /* pull_hopeless may hold now */
	pthread_mutex_unlock(&ps->mu);
	return 0;
}

/* LEAVE: the worker leaves once the pushes that follow are in (an elastic
 * worker's SIGTERM): no later step's view holds it. */
static int on_leave(struct ps_conn *cn, size_t len, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	struct msg_leave lv;
	int r = msg_decode_leave(cn->conn.rbuf, len, &lv, err, errlen);
	if (r)
		return r;
	if (lv.worker != (uint32_t)cn->w || !ps->mb.elastic || cn->w == 0)
		return err_set(err, errlen, -EPROTO, "LEAVE from worker %u on worker %d's connection%s", lv.worker,
			       cn->w, !ps->mb.elastic ? ": the worker set is not elastic ([cluster] min_workers)"
				      : cn->w == 0 ? ": the chief does not leave" : "");
	pthread_mutex_lock(&ps->mu);
	uint64_t v = psshard_version(&ps->sh);
	members_going(&ps->mb, cn->w);
	if (ps->index == 0)
		members_event(&ps->mb, v, cn->w, MEMBERS_EV_LEFT);
	pthread_mutex_unlock(&ps->mu);
	if (ps->index == 0)
		role_log(ps->out, "ps 0: worker %d leaves after %s %llu: its slices go to the others from the next step",
			 cn->w, ps->sh.mode == MODE_SYNC ? "step" : "version", (unsigned long long)v);
	return 0;
}

/* A worker's COMPUTE: ps 0 says, once per worker, that a sync run with
 * workers on different arithmetic will not end on local's bits. */
static int on_compute(struct ps_conn *cn, size_t len, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	struct msg_compute m;
	int r = msg_decode_compute(cn->conn.rbuf, len, &m, err, errlen);
	if (r)
		return r;
	if (ps->index != 0)
		return err_set(err, errlen, -EPROTO, "COMPUTE to ps %d: only ps 0 takes it", ps->index);
	struct ps_compute *pc = &ps->compute;
	char first[sizeof(pc->first)];
	int first_w = -1;
	pthread_mutex_lock(&ps->mu);
	if (!pc->first[0]) {
		memcpy(pc->first, m.text, sizeof(m.text));
		pc->first_w = cn->w;
	} else if (strcmp(pc->first, m.text) != 0 && !(pc->said[cn->w / 8] & (1u << (cn->w % 8)))) {
		pc->said[cn->w / 8] |= (uint8_t)(1u << (cn->w % 8));
		memcpy(first, pc->first, sizeof(first));
		first_w = pc->first_w;
	}
	pthread_mutex_unlock(&ps->mu);
	if (first_w >= 0 && ps->sh.mode == MODE_SYNC)
		role_log(ps->out, "ps 0: warning: worker %d computes on %s, worker %d on %s: a step's sum depends on which worker trained which slice, so this run will not end bit for bit on local's parameters (docs/ELASTIC.md)",
			 cn->w, m.text, first_w, first);
	return 0;
}

static int on_error(struct ps_conn *cn, size_t len, char *err, size_t errlen)
{
	struct msg_error me;
	int r = msg_decode_error(cn->conn.rbuf, len, &me, err, errlen);
	if (r)
		return r;
	cn->failing = PS_CONN_LOST; /* it closes: an ERROR back would cross its own */
	return err_set(err, errlen, -ECONNABORTED, "it reported: %s", me.text);
}

static const struct {
	uint8_t type;
	ps_handler fn;
} ps_handlers[] = {
	{ WIRE_PULL, ps_on_pull },
	{ WIRE_PUSH, ps_on_push },
	{ WIRE_PARAMS, ps_on_push }, /* refused as a chunk of the wrong type */
	{ WIRE_CHECKPOINT, on_checkpoint },
	{ WIRE_ROLLBACK, on_rollback },
	{ WIRE_HEARTBEAT, on_heartbeat },
	{ WIRE_STATUS, on_status },
	{ WIRE_DONE, on_done },
	{ WIRE_ERROR, on_error },
	{ WIRE_SPULL, ps_on_spull },
	{ WIRE_SPUSH, ps_on_spush },
	{ WIRE_ROWS, ps_on_spush }, /* refused */
	{ WIRE_LEAVE, on_leave },
	{ WIRE_COMPUTE, on_compute },
};

/* How long a connection may have been silent and still be taken for a
 * live one: a worker sends at least a HEARTBEAT every heartbeat period
 * (role_heartbeat_ms) and its heartbeat thread looks every half period. */
static int ps_alive_ms(const struct ps *ps)
{
	return 2 * role_heartbeat_ms(ps->c);
}

/* The first frame of worker w's connection opened: it holds the key (a
 * replayed greeting cannot get this far), so it is w's connection now,
 * unless another live one is: then this one is refused with an ERROR (and
 * PS_END). A dead one (closed by the peer, or silent past ps_alive_ms, by
 * the kernel's count, whoever reads it) is replaced. */
static int ps_confirm(struct ps_conn *cn, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	size_t n = ps->sh.n;
	int w = cn->w, quiet = 0;
	char other[SOCK_ADDR_STRLEN] = "", why[WIRE_ERROR_TEXT_MAX];
	cn->grad = malloc(n * sizeof(float));
	cn->snap = malloc(n * sizeof(float));
	if (!cn->grad || !cn->snap || ps_apply_conn_init(cn))
		return err_set(err, errlen, -ENOMEM, "out of memory for worker %d's connection", w);
	pthread_mutex_lock(&ps->mu);
	if (ps->fresh[w] == cn)
		ps->fresh[w] = NULL;
	struct ps_conn *old = ps->worker[w];
	if (old) {
		quiet = sock_quiet_ms(old->conn.fd);
		snprintf(other, sizeof(other), "%s", old->peer);
		if (quiet >= 0 && quiet < ps_alive_ms(ps)) {
			pthread_mutex_unlock(&ps->mu);
			snprintf(why, sizeof(why), "worker %d is already connected to ps %d, from %s", w,
				 ps->index, other);
			role_log(ps->out, "ps %d: %s: refused a second connection as worker %d: it is connected from %s and alive (its last bytes %d ms ago)",
				 ps->index, cn->peer, w, other, quiet);
			conn_send_error(&cn->conn, CONN_MAIN, EALREADY, why);
			snprintf(err, errlen, "%s", why);
			return PS_END;
		}
		ps_conn_end_set(old, PS_CONN_REPLACED);
		conn_shutdown(&old->conn);
	}
	ps->worker[w] = cn;
	cn->state = PS_CONN_MEMBER;
	members_join(&ps->mb, w);
	pthread_mutex_unlock(&ps->mu);
	cn->conn.read_ms = role_peer_timeout_ms(ps->c);
	if (old && quiet < 0)
		role_log(ps->out, "ps %d: %s: worker %d connected again; its old connection from %s had been closed by the peer",
			 ps->index, cn->peer, w, other);
	else if (old)
		role_log(ps->out, "ps %d: %s: worker %d connected again; its old connection from %s, silent for %d ms, is closed",
			 ps->index, cn->peer, w, other, quiet);
	return 0;
}

/* A request this ps does not honour (malformed, of a type a ps never
 * takes, or refused by its handler: a failed ROLLBACK, a CHECKPOINT from a
 * non-chief, a chunk out of range, a NaN in a gradient) ends the
 * connection with an ERROR carrying the reason, so that the worker can say
 * why it stops; ps_left logs the same reason with the worker and the peer.
 * The shard is untouched and the ps serves the others on. A failure of
 * the transport (cn->failing LOST) gets no ERROR. Returns r. */
static int ps_refuse(struct ps_conn *cn, int r, const char *why)
{
	if (cn->failing == PS_CONN_LOST)
		return r;
	char text[WIRE_ERROR_TEXT_MAX + 1];
	snprintf(text, sizeof(text), "%.*s", (int)WIRE_ERROR_TEXT_MAX, why);
	conn_send_error(&cn->conn, CONN_MAIN, (uint32_t)-r, text);
	cn->failing = PS_CONN_REFUSED;
	return r;
}

/* Serves one authenticated worker until it leaves. Returns 0 when it said
 * DONE (or left after DONE, or the ps stops), else a negative errno with
 * the reason in err. */
static int ps_serve(struct ps_conn *cn, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	for (;;) {
		size_t len;
		/* After DONE too: a finished worker polls STATUS every 100 ms
		 * until it leaves, so silence means it is stuck. */
		int r = conn_recv(&cn->conn, &len, err, errlen);
		if (r && cn->state == PS_CONN_DONE)
			return 0;
		if (r == -ETIMEDOUT && cn->state == PS_CONN_UNCONFIRMED)
			return err_set(err, errlen, r, "no frame within %d ms of the handshake",
				       cn->conn.read_ms);
		if (r == -ETIMEDOUT)
			return err_set(err, errlen, r, "no traffic for %g s (peer_timeout)",
				       ps->c->cluster.peer_timeout);
		if (r)
			return r;
		if (cn->state == PS_CONN_UNCONFIRMED) {
			r = ps_confirm(cn, err, errlen);
			if (r == PS_END)
				return 0;
			if (r)
				return r;
		}
		r = msg_type(cn->conn.rbuf, len, err, errlen);
		if (r < 0)
			return ps_refuse(cn, r, err);
		ps_handler fn = NULL;
		for (size_t i = 0; i < sizeof(ps_handlers) / sizeof(ps_handlers[0]) && !fn; i++)
			if (ps_handlers[i].type == r)
				fn = ps_handlers[i].fn;
		if (!fn)
			return ps_refuse(cn, err_set(err, errlen, -EPROTO, "unexpected %s message",
						     wire_msg_name((uint8_t)r)), err);
		r = fn(cn, len, err, errlen);
		if (r == PS_END)
			return 0;
		if (r)
			return ps_refuse(cn, r, err);
	}
}

/* A worker's connection has ended (r: ps_serve's result, e its reason). A
 * lost worker (killed, crashed, or a peer holding the key that sent a bad
 * frame) does not end training: async workers carry on, sync steps go on
 * while replicas_to_aggregate workers remain and otherwise wait. Restarted
 * with the same command, the worker rejoins at the current version (a
 * gradient it had pushed for that version stays counted; pushing it again
 * is a duplicate). Only if it does not come back within peer_timeout does
 * the ps give up (members_expired). */
static void ps_left(struct ps_conn *cn, int r, const char *e)
{
	struct ps *ps = cn->ps;
	char why[512];
	snprintf(why, sizeof(why), "lost worker %d (%s): %s", cn->w, cn->peer, e);
	pthread_mutex_lock(&ps->mu);
	enum members_gone g = members_leave(&ps->mb, cn->w, r != 0, ps->aborted, role_now_ms(), why);
	int replaced = ps->worker[cn->w] != cn; /* ps_confirm gave its place to the next */
	if (!replaced)
		ps->worker[cn->w] = NULL;
	pthread_mutex_unlock(&ps->mu);
	/* ps_confirm said the worker is back; what ended this connection
	 * first is still worth its line (a worker can reconnect, over a Unix
	 * socket within a millisecond, before this thread gets here). */
	if (replaced && ps_conn_failed(cn) && r)
		role_log(ps->out, "ps %d: %s: closed worker %d's connection: %s (it has connected again)",
			 ps->index, cn->peer, cn->w, e);
	if (replaced)
		return;
	/* A refused request is logged whatever it means for the worker (it
	 * may have another connection live, or have finished): the one line
	 * that names who asked for what. */
	if (cn->end == PS_CONN_REFUSED && g != MEMBERS_LOST)
		role_log(ps->out, "ps %d: %s: closed worker %d's connection: %s%s", ps->index, cn->peer,
			 cn->w, e, g == MEMBERS_AWAY ? "; it had finished, waiting for it to connect again" : "");
	else if (g == MEMBERS_AWAY)
		role_log(ps->out, "ps %d: %s: worker %d, which had finished, closed its connection before the run was complete; waiting up to %g s for it to connect again",
			 ps->index, cn->peer, cn->w, ps->c->cluster.peer_timeout);
	else if (g == MEMBERS_LOST)
		role_log(ps->out, "ps %d: %s: closed worker %d's connection: %s; %s, waiting up to %g s for it to connect again",
			 ps->index, cn->peer, cn->w, e, cn->pushed ? "it had trained" : "it had not pushed yet",
			 ps->c->cluster.peer_timeout);
}

/* Worker w's answered connection fd, authenticated with hr's keys, listed
 * in ps->conns as the worker's unconfirmed connection (an older
 * unconfirmed one of w's goes: this greeting is newer); its first frame is
 * due within a handshake's step (the worker sends a HEARTBEAT right after
 * its handshake). Its own thread receives the PUSH and sends the
 * replies and PARAMS on one pipe; in piece mode the streamer sends the
 * PARAMS instead, as CONN_SIDE on a pipe of its own. NULL, fd closed, if
 * there is no slot or no memory. */
struct ps_conn *ps_conn_add(struct ps *ps, int fd, const char *peer, int w,
			    const struct hs_result *hr)
{
	struct ps_conn *cn = calloc(1, sizeof(*cn));
	struct conn_shape shape = { .pipes = psshard_pieces(&ps->sh) ? CONN_PIPE_SIDE : CONN_PIPE_ONE,
				    .pool = ps->pool };
	if (!cn ||
	    conn_init(&cn->conn, -1, &shape, ROLE_HANDSHAKE_MS, role_write_timeout_ms(ps->c)) != 0) {
		if (cn)
			conn_destroy(&cn->conn);
		free(cn);
		close(fd);
		return NULL;
	}
	cn->ps = ps;
	cn->w = w;
	conn_attach(&cn->conn, fd, hr);
	conn_send_buffer(&cn->conn, ps->c->cluster.send_buffer_kib);
	snprintf(cn->peer, sizeof(cn->peer), "%s", peer);
	pthread_mutex_lock(&ps->mu);
	int slot = -1;
	for (int i = 0; i < PS_MAX_CONN && slot < 0; i++)
		if (!ps->conns[i])
			slot = i;
	if (slot >= 0) {
		cn->slot = slot;
		ps->conns[slot] = cn;
		ps->nconn++;
		if (ps->fresh[w])
			conn_shutdown(&ps->fresh[w]->conn);
		ps->fresh[w] = cn;
	}
	pthread_mutex_unlock(&ps->mu);
	if (slot < 0) {
		conn_destroy(&cn->conn); /* closes fd */
		free(cn);
		return NULL;
	}
	return cn;
}

/* Takes cn off ps->conns and closes it (not freed). */
void ps_conn_drop(struct ps_conn *cn)
{
	struct ps *ps = cn->ps;
	pthread_mutex_lock(&ps->mu);
	ps->conns[cn->slot] = NULL;
	if (ps->fresh[cn->w] == cn)
		ps->fresh[cn->w] = NULL;
	conn_destroy(&cn->conn); /* under the lock: ps_drain shuts down what is listed */
	ps->nconn--;
	pthread_cond_broadcast(&ps->cv);
	pthread_mutex_unlock(&ps->mu);
}

/* Piece mode: the streamer's thread (its buffer and pipe are the
 * connection's CONN_SIDE). -ENOMEM if it cannot be had. */
static int ps_streamer_start(struct ps_conn *cn)
{
	struct ps *ps = cn->ps;
	if (!psshard_pieces(&ps->sh))
		return 0;
	if (pthread_cond_init(&cn->st_cv, NULL))
		return -ENOMEM;
	if (pthread_create(&cn->st, NULL, ps_streamer, cn) != 0) {
		pthread_cond_destroy(&cn->st_cv);
		return -ENOMEM;
	}
	cn->st_on = 1;
	return 0;
}

/* Ends the streamer after the connection's thread is done (r, err: how
 * it ended). The streamer's own failure, if it had one, is the reason:
 * the reading thread's is then only the shutdown it caused. */
static void ps_streamer_stop(struct ps_conn *cn, int *r, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	if (!cn->st_on)
		return;
	pthread_mutex_lock(&ps->mu);
	cn->st_stop = 1;
	pthread_cond_signal(&cn->st_cv);      /* idle */
	pthread_cond_broadcast(&ps->pull_cv); /* or waiting in pull_wait */
	pthread_mutex_unlock(&ps->mu);
	/* a send blocked on a peer that stopped reading; the reading half
	 * stays for conn_linger */
	conn_shutdown_write(&cn->conn);
	pthread_join(cn->st, NULL);
	pthread_cond_destroy(&cn->st_cv);
	cn->st_on = 0;
	if (cn->st_r == PS_END) {
		*r = 0;
	} else if (cn->st_r) {
		*r = cn->st_r;
		snprintf(err, errlen, "%s", cn->st_err);
	}
}

/* What send_buffer_kib = auto came to on a worker's TCP connection (the
 * worker says the same of its own ends: links_say_sndbuf). */
static void ps_say_sndbuf(struct ps_conn *cn)
{
	char one[200];
	pthread_mutex_lock(&cn->conn.mu);
	int tcp = cn->conn.sb.state != SNDBUF_KERNEL;
	sndbuf_describe(&cn->conn.sb, one, sizeof(one));
	pthread_mutex_unlock(&cn->conn.mu);
	if (tcp)
		role_log(cn->ps->out, "ps %d: send buffer to worker %d: %s", cn->ps->index, cn->w, one);
}

/* Serves connection cn until it ends, then frees what it holds but cn
 * itself; returns ps_serve's result. */
int ps_conn_run(struct ps_conn *cn)
{
	struct ps *ps = cn->ps;
	char e[320];
	int r = -ENOMEM;
	cn->first_pull = 1;
	/* Before anything is sent on it: a ring offered carries every byte. */
	int ring = conn_ring_accept(&cn->conn, ROLE_HANDSHAKE_MS, e, sizeof(e));
	if (!ring && cn->conn.ring_why[0])
		role_log(ps->out, "ps %d: %s: worker %d's bytes go through the Unix socket: %s", ps->index,
			 cn->peer, cn->w, cn->conn.ring_why);
	if (ring) {
		role_log(ps->out, "ps %d: %s: closed a connection that greeted as worker %d: %s", ps->index,
			 cn->peer, cn->w, e);
	} else if (ps_streamer_start(cn)) {
		role_log(ps->out, "ps %d: %s: out of memory for a connection", ps->index, cn->peer);
	} else {
		r = ps_serve(cn, e, sizeof(e));
		pthread_mutex_lock(&ps->mu);
		int member = ps_conn_ending(cn, r);
		pthread_mutex_unlock(&ps->mu);
		ps_streamer_stop(cn, &r, e, sizeof(e));
		/* A peer gone silent in the middle of a tensor (the common case
		 * since pushes and parameters stream both ways for most of a
		 * step), either way: the line docs/NETWORK.md documents. */
		if (r == -ETIMEDOUT && member)
			snprintf(e, sizeof(e), "no traffic for %g s (peer_timeout)", ps->c->cluster.peer_timeout);
		if (member) {
			ps_say_sndbuf(cn);
			ps_left(cn, r, e);
		} else if (r) {
			role_log(ps->out, "ps %d: %s: closed a connection that greeted as worker %d before any frame opened (%s); it was not counted as worker %d",
				 ps->index, cn->peer, cn->w, e, cn->w);
		}
		conn_linger(&cn->conn, CONN_LINGER_MS); /* if it ended with an ERROR */
	}
	ps_apply_conn_free(cn); /* its pieces' jobs run first */
	free(cn->grad);
	free(cn->snap);
	free(cn->sent);
	ps_factors_free(&cn->fx);
	ps_sparse_conn_free(cn);
	ps_conn_drop(cn);
	return r;
}

/* Whether the accept loop ends: a lost worker's deadline passed (the ps
 * stops), or every worker is done and gone (members_finished). */
int ps_over(struct ps *ps)
{
	int64_t now = role_now_ms();
	pthread_mutex_lock(&ps->mu);
	int w = ps->aborted ? -1 : members_expired(&ps->mb, now);
	if (w >= 0)
		w = ps_view_expired(ps, w, now);
	if (w >= 0) {
		ps->aborted = 1;
		snprintf(ps->why, sizeof(ps->why), "%s", members_why(&ps->mb, w));
		role_log(ps->out, "ps %d: worker %d did not come back within peer_timeout (%g s)",
			 ps->index, w, ps->c->cluster.peer_timeout);
		pthread_cond_broadcast(&ps->pull_cv);
	}
	int over = ps->aborted || members_finished(&ps->mb, now);
	/* here, not after each push: the accept loop comes by every 200 ms
	 * or sooner, pushes cost nothing more, and a stalled shard is seen */
	rate_add(&ps->rate, now, psshard_version(&ps->sh));
	pthread_mutex_unlock(&ps->mu);
	return over;
}

static void ps_accept_loop(struct ps *ps, const volatile sig_atomic_t *stop)
{
	while (!ps_over(ps) && !*stop) {
		struct gate_greeting gr;
		char e[256];
		int r = gate_next(&ps->gate, 200, &gr, e, sizeof(e));
		if (r == 1)
			ps_admit(ps, &gr);
		if (r < 0) {
			role_log(ps->out, "ps %d: accept: %s", ps->index, e);
			role_nap_ms(100);
		}
		ps_tally_log(ps, 0);
	}
	ps_tally_log(ps, 1);
}

/* Ends every connection still open (workers close theirs once a STATUS
 * says the run is complete: they poll every 100 ms, so this normally
 * takes a moment; a stuck one gets peer_timeout), then waits for their
 * threads before anything they use is freed. Observers are not waited
 * for: each gets its last REPORT (final) at once and is closed. */
static void ps_drain(struct ps *ps, const volatile sig_atomic_t *stop)
{
	pthread_mutex_lock(&ps->mu);
	ps_observers_drain(&ps->po);
	ps->aborted |= *stop ? 1 : 0;
	if (*stop && !ps->why[0])
		snprintf(ps->why, sizeof(ps->why), "interrupted");
	pthread_cond_broadcast(&ps->pull_cv);
	struct timespec dl;
	role_deadline(&dl, members_all_done(&ps->mb) && !*stop
				   ? ((long)ps->c->cluster.peer_timeout + 1) * 1000 : 2000);
	while (ps->nconn > 0 && pthread_cond_timedwait(&ps->cv, &ps->mu, &dl) == 0)
		;
	for (int i = 0; i < PS_MAX_CONN; i++)
		if (ps->conns[i])
			conn_shutdown(&ps->conns[i]->conn);
	while (ps->nconn > 0 || ps->po.n > 0)
		pthread_cond_wait(&ps->cv, &ps->mu);
	pthread_mutex_unlock(&ps->mu);
}

/* The shard of plan[index] (from the newest checkpoint unless fresh), its
 * lock and the writer, the identity for handshakes, the crypto pool. */
int ps_open(struct ps *ps, const struct config *c, const struct role_setup *s,
	    const struct shard *sh, int index, int fresh, FILE *out, char *err, size_t errlen)
{
	long total = c->train.mode == MODE_ASYNC ? s->job.total * s->job.S : s->job.total;
	int e = psshard_init(&ps->sh, &s->job.m, sh, c, total, err, errlen);
	if (e)
		return e;
	pthread_mutex_init(&ps->mu, NULL);
	if (role_cond_init(&ps->cv))
		return err_set(err, errlen, -ENOMEM, "out of memory");
	if (role_cond_init(&ps->pull_cv)) {
		pthread_cond_destroy(&ps->cv);
		return err_set(err, errlen, -ENOMEM, "out of memory");
	}
	ps->s = s;
	ps->c = c;
	ps->out = out;
	ps->index = index;
	ps->W = c->cluster.max_workers;
	ps->prev_fits = c->ps.memory_limit <= 0; /* with a limit, ps_sparse_fits says */
	hooks_read(&ps->hooks);
	members_init(&ps->mb, ps->W, c->cluster.peer_timeout);
	members_elastic(&ps->mb, c->cluster.min_workers, index != 0);
	observers_init(&ps->seen);
	rate_init(&ps->rate);
	ps->started_ms = role_now_ms();
	ps_observers_init(&ps->po, &ps->mu, &ps->cv, c, out, index, ps_report, ps);
	/* The rows first, so that a resume loads them with the dense shard
	 * from the same checkpoint. */
	e = ps_sparse_open(ps, err, errlen);
	if (!e)
		e = ps_store_open(&ps->store, &ps->mu, &ps->sh, ps_sparse_rows(ps), &s->job.m, c, index,
				  fresh, out, err, errlen);
	if (!e)
		ps_sparse_rewind(ps);
	if (e)
		return e;
	ps->me = (struct hs_identity){ .role = HS_PS, .index = (uint32_t)index,
				       .ciphers = s->ciphers };
	memcpy(ps->me.config_hash, s->hash, HS_HASH_BYTES);
	int ct = cryptopool_threads_for(c->cluster.crypto_threads);
	if (ct > 1 && (e = cryptopool_new(&ps->pool, ct, err, errlen)))
		return e;
	return ps_apply_open(ps, err, errlen);
}

/* The Unix socket for workers on this host, in *fd, its path in path and
 * its file in *file; if there can be none (the directory is not ours
 * alone, the path is too long, another ps holds it), one line says why
 * and they use TCP. */
static void ps_listen_local(struct ps *ps, char *path, size_t len, int *fd, struct sock_unix_file *file)
{
	char e[400];
	int r = role_local_path(ps->c, ps->index, path, len, e, sizeof(e));
	if (!r)
		r = sock_listen_unix(path, fd, file, e, sizeof(e));
	if (r) {
		*fd = -1;
		path[0] = 0;
		role_log(ps->out, "ps %d: warning: no Unix socket for workers on this host, they use TCP: %s",
			 ps->index, e);
	}
}

/* The gate in front of the listener. Pending connections cost a file
 * descriptor each: the soft limit goes up to the hard one, and the gate
 * takes what the workers' connections leave of it, at most PS_PENDING_MAX. */
static int ps_gate_open(struct ps *ps, int lfd, char *err, size_t errlen)
{
	struct rlimit rl;
	long fds = 1024;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		if (rl.rlim_cur < rl.rlim_max) {
			rl.rlim_cur = rl.rlim_max;
			(void)setrlimit(RLIMIT_NOFILE, &rl);
			(void)getrlimit(RLIMIT_NOFILE, &rl);
		}
		fds = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (1 << 20) ? 1 << 20 : (long)rl.rlim_cur;
	}
	long room = fds - 64 - 3L * ps->W;
	int max = room > PS_PENDING_MAX ? PS_PENDING_MAX : room < 16 ? 16 : (int)room;
	int per = max < PS_PENDING_PER_SOURCE ? max : PS_PENDING_PER_SOURCE;
	return gate_init(&ps->gate, lfd, max, per, (int)(ps->c->cluster.handshake_timeout * 1000), err,
			 errlen);
}

/* Closes the Unix socket, removing its file first if it is still the one
 * bound at start: the path may have been taken since (our file removed,
 * then a second ps bound its own there), and that one is not ours to
 * remove. Removed while ours still listens, so that a ps starting now
 * finds the path in use, not free to bind and then lose to our unlink. */
static void ps_close_local(int index, FILE *out, int fd, const char *path, const struct sock_unix_file *file)
{
	int r = sock_unlink_unix(path, file);
	if (r && r != -ENOENT)
		role_log(out, "ps %d: left %s in place: %s", index, path,
			 r == -ESTALE ? "it is no longer the socket this ps bound" : strerror(-r));
	close(fd);
}

void ps_close(struct ps *ps)
{
	ps_store_close(&ps->store);
	ps_sparse_close(ps);
	cryptopool_destroy(ps->pool); /* every connection thread has ended */
	ps_apply_close(ps);
	if (ps->s) {
		pthread_mutex_destroy(&ps->mu);
		pthread_cond_destroy(&ps->cv);
		pthread_cond_destroy(&ps->pull_cv);
	}
	psshard_free(&ps->sh);
}

/* How the ps ends: interrupted, stopped (a lost worker did not come
 * back), or every worker done. */
static int ps_result(struct ps *ps, const volatile sig_atomic_t *stop, char *err, size_t errlen)
{
	if (*stop)
		return err_set(err, errlen, -EINTR, "ps %d: interrupted at version %llu", ps->index,
			       (unsigned long long)psshard_version(&ps->sh));
	if (!members_all_done(&ps->mb))
		return err_set(err, errlen, -ECONNABORTED, "ps %d: %s", ps->index, ps->why);
	role_log(ps->out, "ps %d: all %d workers done: version %llu, %llu gradients applied, %llu dropped as stale",
		 ps->index, ps->W, (unsigned long long)psshard_version(&ps->sh),
		 (unsigned long long)ps->sh.received - ps->sh.dropped_stale,
		 (unsigned long long)ps->sh.dropped_stale);
	ps_sparse_say(ps);
	uint64_t na = ps->sh.received - ps->sh.dropped_stale;
	if (ps->sh.mode == MODE_ASYNC && na)
		role_log(ps->out, "ps %d: gradients applied %.2f versions old on average (at most %llu); "
			 "staleness_lr %s",
			 ps->index, (double)ps->sh.age_sum / (double)na, (unsigned long long)ps->sh.age_max,
			 ps->sh.staleness_lr ? "on: each step divided by 1 + that age" : "off");
	return 0;
}

int cluster_ps(const struct config *c, int index, int fresh, FILE *out,
	       const volatile sig_atomic_t *stop, char *err, size_t errlen)
{
	struct role_setup s;
	struct ps *ps = calloc(1, sizeof(*ps));
	struct shard plan[CONFIG_MAX_HOSTS];
	int lfd = -1, ufd = -1, e;
	char upath[256] = "";
	struct sock_unix_file ufile;

	memset(&s, 0, sizeof(s));
	if (!ps)
		return err_set(err, errlen, -ENOMEM, "out of memory");
	e = role_setup_load(&s, c, 0, err, errlen);
	if (!e)
		e = shard_check(c->cluster.nps, s.job.m.nparams, err, errlen);
	if (e)
		goto out;
	shard_plan(plan, c->cluster.nps, s.job.m.nparams);
	int prev_fits = 0;
	e = ps_sparse_fits(c, &s.job.m, &plan[index], index, &prev_fits, err, errlen);
	if (!e)
		e = ps_open(ps, c, &s, &plan[index], index, fresh, out, err, errlen);
	if (e)
		goto out;
	ps->prev_fits = prev_fits;
	if (!prev_fits)
		role_log(out, "ps %d: [ps] memory_limit = %d MiB leaves no room for a copy of the shard's version before: sync parameters go packed, not as XORs with it",
			 index, c->ps.memory_limit);
	/* [cluster] listen: what this host can bind (a pod's 0.0.0.0, a
	 * private address behind NAT) while workers dial its ps entry. */
	const struct host *h = c->cluster.nlisten == 0 ? &c->cluster.ps[index]
			       : &c->cluster.listen[c->cluster.nlisten == 1 ? 0 : index];
	/* The Unix socket before the TCP one: a worker on this host that
	 * tries both at once then never settles for TCP while we start. */
	if (c->cluster.local_socket)
		ps_listen_local(ps, upath, sizeof(upath), &ufd, &ufile);
	e = sock_listen(h->name, h->port, 0, &lfd, err, errlen);
	if (e) {
		e = e == -ENOMEM ? e : -EINVAL;
		goto out;
	}
	role_log(out, "ps %d: listening on %s:%u, shard [%zu, %zu) of %zu parameters, %s mode, %ld steps, waiting for %d worker%s",
		 index, h->name, h->port, plan[index].begin, plan[index].end, s.job.m.nparams,
		 c->train.mode == MODE_SYNC ? "sync" : "async", s.job.total, ps->W, ps->W == 1 ? "" : "s");
	if (ufd >= 0)
		role_log(out, "ps %d: workers on this host reach it over the Unix socket %s (frames not encrypted: [cluster] local_socket)",
			 index, upath);
	e = ps_gate_open(ps, lfd, err, errlen);
	if (!e && ufd >= 0 && gate_listen_also(&ps->gate, ufd))
		e = err_set(err, errlen, -ENOSPC, "ps %d: the gate takes no second listener", index);
	if (e)
		goto out;
	ps_accept_loop(ps, stop);
	gate_free(&ps->gate);
	ps_drain(ps, stop);
	e = ps_result(ps, stop, err, errlen);
out:
	gate_free(&ps->gate);
	if (lfd >= 0)
		close(lfd);
	if (ufd >= 0)
		ps_close_local(index, out, ufd, upath, &ufile);
	ps_close(ps);
	role_setup_free(&s);
	free(ps);
	return e;
}
