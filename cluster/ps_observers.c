/* See ps_observers.h. */
#include "ps_observers.h"
#include "role.h"

#include "../base/err.h"
#include "../net/conn.h"
#include "../net/sock.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* An observer's longest message: the largest REPORT out, and in, anything
 * an observer may send (STATUS, HEARTBEAT, an ERROR). */
#define PS_OBS_MSG_MAX MSG_REPORT_BYTES_ALL
_Static_assert(MSG_ERROR_BYTES_MAX <= MSG_REPORT_BYTES_MAX, "an observer's ERROR fits");
/* How long an observer may take to read a REPORT before it is dropped:
 * the ps's exit waits for its observers' last ones. */
#define PS_OBS_WRITE_MS 1000

/* Where an observer stands (under the ps's mu). */
enum ps_obs_state {
	PS_OBS_GREETED,   /* answered, no frame opened yet: may be evicted */
	PS_OBS_CONFIRMED, /* a frame opened: it holds the key; keeps its slot */
	PS_OBS_CLOSING,   /* served, lingering for its ERROR to get out: its
			   * slot goes to the next observer that wants one */
	PS_OBS_EVICTED,   /* shut down for a newer observer; in no slot */
};

/* One observer's connection, served on its own thread. */
struct ps_obs {
	struct ps_observers *po;
	struct conn conn;
	enum ps_obs_state state;
	uint64_t seq;             /* when it was admitted: the oldest goes first */
	int slot;                 /* -1 once evicted */
	char peer[SOCK_ADDR_STRLEN];
};

void ps_observers_init(struct ps_observers *po, pthread_mutex_t *mu, pthread_cond_t *cv,
		       const struct config *c, FILE *out, int index, ps_report_fn report, void *ctx)
{
	*po = (struct ps_observers){ .mu = mu, .cv = cv, .c = c, .out = out, .index = index,
				     .report = report, .ctx = ctx };
}

/* The slot a new observer takes (under mu): a free one, else that of an
 * observer done with (lingering up to CONN_LINGER_MS for its ERROR to get
 * out: the test that showed it refused a newcomer in CI under load), else
 * that of the oldest observer not confirmed yet; -1 if every slot's is
 * confirmed and still served. */
static int ps_obs_slot_for_new(const struct ps_observers *po)
{
	int old = -1, closing = -1;
	for (int i = 0; i < PS_OBSERVERS_MAX; i++) {
		const struct ps_obs *ob = po->obs[i];
		if (!ob)
			return i;
		if (ob->state == PS_OBS_CLOSING)
			closing = i;
		if (ob->state == PS_OBS_GREETED && (old < 0 || ob->seq < po->obs[old]->seq))
			old = i;
	}
	return closing >= 0 ? closing : old;
}

int ps_observers_full(const struct ps_observers *po)
{
	return ps_obs_slot_for_new(po) < 0;
}

void ps_observers_drain(struct ps_observers *po)
{
	po->draining = 1;
	for (int i = 0; i < PS_OBSERVERS_MAX; i++)
		if (po->obs[i])
			conn_shutdown_read(&po->obs[i]->conn);
}

static int ps_obs_send_report(struct ps_obs *ob, int final, char *err, size_t errlen)
{
	struct msg_report rp;
	size_t len;
	ob->po->report(ob->po->ctx, &rp, final);
	int r = msg_encode_report(conn_payload(&ob->conn, CONN_MAIN), conn_payload_cap(&ob->conn), &rp,
				  &len, err, errlen);
	return r ? r : conn_send_payload(&ob->conn, CONN_MAIN, len, err, errlen);
}

/* A request an observer may not make: an ERROR saying so, and the reason
 * for the log line. */
static int ps_obs_refuse(struct ps_obs *ob, int code, char *err, size_t errlen, const char *fmt,
			 const char *what)
{
	char text[WIRE_ERROR_TEXT_MAX + 1];
	snprintf(text, sizeof(text), fmt, what);
	conn_send_error(&ob->conn, CONN_MAIN, (uint32_t)code, text);
	return err_set(err, errlen, -code, "%s", text);
}

/* Serves one observer until it leaves: 0 when it closed, said ERROR, or
 * the ps drains; else a negative errno with the reason in err. */
static int ps_obs_serve(struct ps_obs *ob, char *err, size_t errlen)
{
	struct ps_observers *po = ob->po;
	for (int first = 1;; first = 0) {
		size_t len;
		int r = conn_recv(&ob->conn, &len, err, errlen);
		pthread_mutex_lock(po->mu);
		int draining = po->draining;
		enum ps_obs_state st = ob->state;
		if (!r && st == PS_OBS_GREETED)
			ob->state = st = PS_OBS_CONFIRMED;
		pthread_mutex_unlock(po->mu);
		if (st == PS_OBS_EVICTED)
			return err_set(err, errlen, -ECONNABORTED,
				       "evicted before any frame opened: every slot was taken "
				       "and a newer observer greeted");
		if (r && (draining || r == -EPIPE || r == -ECONNRESET))
			return 0;
		if (r == -ENOBUFS)
			return ps_obs_refuse(ob, EPERM, err, errlen,
					     "%s: an observer may only ask STATUS", "a frame too long");
		if (r == -ETIMEDOUT && first)
			return err_set(err, errlen, r, "no frame within %d ms of the handshake",
				       ob->conn.read_ms);
		if (r == -ETIMEDOUT)
			return err_set(err, errlen, r, "no traffic for %g s (peer_timeout)",
				       po->c->cluster.peer_timeout);
		if (r)
			return r;
		/* the key is confirmed: as patient as with a worker now */
		ob->conn.read_ms = role_peer_timeout_ms(po->c);
		int type = msg_type(ob->conn.rbuf, len, err, errlen);
		if (type < 0)
			return ps_obs_refuse(ob, EPROTO, err, errlen, "%.240s", err);
		if (type == WIRE_STATUS) {
			struct msg_status q;
			r = msg_decode_status(ob->conn.rbuf, len, &q, err, errlen);
			if (r)
				return ps_obs_refuse(ob, -r, err, errlen, "%.240s", err);
			if (q.reply || q.shard != (uint32_t)po->index) {
				char what[96];
				snprintf(what, sizeof(what), "STATUS %s for shard %u, this is shard %d",
					 q.reply ? "reply" : "request", q.shard, po->index);
				return ps_obs_refuse(ob, EPROTO, err, errlen, "%s", what);
			}
			r = ps_obs_send_report(ob, 0, err, errlen);
			if (r)
				return r;
		} else if (type == WIRE_HEARTBEAT) {
			struct msg_heartbeat hb;
			r = msg_decode_heartbeat(ob->conn.rbuf, len, &hb, err, errlen);
			if (r)
				return ps_obs_refuse(ob, -r, err, errlen, "%.240s", err);
		} else if (type == WIRE_ERROR) {
			return 0; /* it closes */
		} else {
			return ps_obs_refuse(ob, EPERM, err, errlen, "%s: an observer may only ask STATUS",
					     wire_msg_name((uint8_t)type));
		}
	}
}

/* Takes ob off po->obs and closes it (not freed). */
static void ps_obs_drop(struct ps_obs *ob)
{
	struct ps_observers *po = ob->po;
	pthread_mutex_lock(po->mu);
	if (ob->slot >= 0)
		po->obs[ob->slot] = NULL;
	conn_destroy(&ob->conn); /* under the lock: ps_observers_drain and an eviction
				  * shut down what is listed */
	po->n--;
	pthread_cond_broadcast(po->cv);
	pthread_mutex_unlock(po->mu);
}

static void *ps_obs_main(void *arg)
{
	struct ps_obs *ob = arg;
	struct ps_observers *po = ob->po;
	char e[320];
	int r = ps_obs_serve(ob, e, sizeof(e));
	pthread_mutex_lock(po->mu);
	int draining = po->draining;
	pthread_mutex_unlock(po->mu);
	if (draining)
		(void)!ps_obs_send_report(ob, 1, e, sizeof(e)); /* best effort: it may be gone */
	else if (r)
		role_log(po->out, "ps %d: %s: closed an observer's connection: %s", po->index, ob->peer, e);
	pthread_mutex_lock(po->mu);
	if (ob->state != PS_OBS_EVICTED)
		ob->state = PS_OBS_CLOSING;
	pthread_mutex_unlock(po->mu);
	conn_linger(&ob->conn, CONN_LINGER_MS); /* if it ended with an ERROR */
	ps_obs_drop(ob);
	free(ob);
	return NULL;
}

int ps_observers_spawn(struct ps_observers *po, int fd, const char *peer, const struct hs_result *hr)
{
	struct ps_obs *ob = calloc(1, sizeof(*ob));
	struct conn_shape shape = { .msg_max = PS_OBS_MSG_MAX };
	if (!ob || conn_init(&ob->conn, -1, &shape, ROLE_HANDSHAKE_MS, PS_OBS_WRITE_MS) != 0) {
		if (ob)
			conn_destroy(&ob->conn);
		free(ob);
		close(fd);
		return -1;
	}
	ob->po = po;
	conn_attach(&ob->conn, fd, hr);
	snprintf(ob->peer, sizeof(ob->peer), "%s", peer);
	pthread_mutex_lock(po->mu);
	ob->slot = ps_obs_slot_for_new(po);
	if (ob->slot >= 0 && po->obs[ob->slot]) {
		/* Its thread sees the state once its read fails, and ends
		 * without touching the slot. */
		struct ps_obs *old = po->obs[ob->slot];
		old->state = PS_OBS_EVICTED;
		old->slot = -1;
		conn_shutdown(&old->conn);
	}
	if (ob->slot >= 0) {
		ob->state = PS_OBS_GREETED;
		ob->seq = po->seq++;
		po->obs[ob->slot] = ob;
		po->n++;
	}
	pthread_mutex_unlock(po->mu);
	if (ob->slot < 0) {
		conn_destroy(&ob->conn); /* closes fd */
		free(ob);
		return -1;
	}
	pthread_t t;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	int ok = pthread_create(&t, &at, ps_obs_main, ob) == 0;
	pthread_attr_destroy(&at);
	if (ok)
		return 0;
	ps_obs_drop(ob);
	free(ob);
	return -1;
}
