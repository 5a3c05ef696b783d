/* See links.h. */
#include "links.h"

#include "../core/psshard.h"

#include "../base/err.h"
#include "../net/sock.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>


const char *links_ps_name(const struct config *c, int k, char *buf, size_t len)
{
	snprintf(buf, len, "ps %d (%s:%u)", k, c->cluster.ps[k].name, c->cluster.ps[k].port);
	return buf;
}

/* One link's part of links_exchange, on a thread of its own. */
struct link_job {
	struct links *lk;
	int k, pos;             /* the shard; its place in this worker's push order */
	const float *grads;
	float *params;
	struct gradflow *flow;  /* NULL: grads is final already */
	pthread_t th;
	int started;
	int r;
	char err[512];
};

/* The heartbeat thread: every half heartbeat period, a HEARTBEAT on each
 * link that has sent nothing for a period, so that a ps does not take a
 * worker that is computing, evaluating or waiting on another shard for a
 * dead one. A failed send is left for the main thread to find. */
static void *links_heartbeats(void *arg)
{
	struct links *lk = arg;
	uint8_t buf[CONN_FRAME_BYTES(MSG_HEARTBEAT_BYTES)];
	int ms = role_heartbeat_ms(lk->c);
	struct msg_heartbeat hb;
	memset(&hb, 0, sizeof(hb));
	pthread_mutex_lock(&lk->hb_mu);
	while (!lk->hb_stop) {
		struct timespec dl;
		role_deadline(&dl, ms / 2);
		pthread_cond_timedwait(&lk->hb_cv, &lk->hb_mu, &dl);
		if (lk->hb_stop)
			break;
		pthread_mutex_unlock(&lk->hb_mu);
		for (int k = 0; k < lk->nps; k++) {
			size_t len;
			/* Sealing encrypts in place: encoded for each send. */
			if (msg_encode_heartbeat(conn_msg(buf), conn_msg_cap(sizeof(buf)), &hb, &len, NULL, 0) == 0)
				(void)conn_send_idle(&lk->ln[k].conn, buf, sizeof(buf), len, ms / 1000.0, NULL, 0);
		}
		pthread_mutex_lock(&lk->hb_mu);
	}
	pthread_mutex_unlock(&lk->hb_mu);
	return NULL;
}

int links_open(struct links *lk, const struct config *c, const struct role_setup *s,
	       const struct shard *plan, int index, const volatile sig_atomic_t *stop, FILE *out,
	       char *err, size_t errlen)
{
	*lk = (struct links){ .c = c, .s = s, .stop = stop, .out = out, .index = index,
			      .nps = c->cluster.nps, .lost = -1, .pieces = role_pieces(c) };
	lk->ln = calloc((size_t)lk->nps, sizeof(*lk->ln));
	lk->job = calloc((size_t)lk->nps, sizeof(*lk->job));
	if (!lk->ln || !lk->job)
		return err_set(err, errlen, -ENOMEM, "out of memory for %d links", lk->nps);
	int ct = cryptopool_threads_for(c->cluster.crypto_threads), e;
	if (ct > 1 && (e = cryptopool_new(&lk->pool, ct, err, errlen)))
		return e;
	for (int k = 0; k < lk->nps; k++) {
		struct link *l = &lk->ln[k];
		l->rbuf = malloc(CONN_RBUF_BYTES);
		l->wbuf = malloc(CONN_WBUF_BYTES);
		if (!l->rbuf || !l->wbuf)
			return err_set(err, errlen, -ENOMEM, "out of memory for the buffers of %d links", lk->nps);
		e = pipe_init(&l->pp, lk->pool, l->wbuf, CONN_WBUF_BYTES, err, errlen);
		if (e)
			return e;
		l->pp_ready = 1;
		l->range = plan[k];
		if (!lk->pieces)
			continue;
		l->rwbuf = malloc(CONN_WBUF_BYTES);
		if (!l->rwbuf)
			return err_set(err, errlen, -ENOMEM, "out of memory for the buffers of %d links", lk->nps);
		e = pipe_init(&l->rpp, lk->pool, l->rwbuf, CONN_WBUF_BYTES, err, errlen);
		if (e)
			return e;
		l->rpp_ready = 1;
	}
	int nokeys = 0;
	for (int k = 0; k < lk->nps; k++)
		nokeys |= conn_init(&lk->ln[k].conn, -1, lk->ln[k].rbuf, lk->ln[k].wbuf, &lk->ln[k].pp,
				    role_peer_timeout_ms(c), role_write_timeout_ms(c)) != 0;
	for (int k = 0; k < lk->nps; k++)
		lk->ln[k].conn.rpp = lk->ln[k].rpp_ready ? &lk->ln[k].rpp : NULL;
	if (nokeys) {
		for (int k = 0; k < lk->nps; k++)
			conn_destroy(&lk->ln[k].conn);
		return err_set(err, errlen, -ENOMEM, "out of memory for the session keys");
	}
	pthread_mutex_init(&lk->hb_mu, NULL);
	pthread_mutex_init(&lk->say_mu, NULL);
	pthread_mutex_init(&lk->turn_mu, NULL);
	if (role_cond_init(&lk->hb_cv) || pthread_cond_init(&lk->turn_cv, NULL)) {
		pthread_mutex_destroy(&lk->hb_mu);
		pthread_mutex_destroy(&lk->say_mu);
		pthread_mutex_destroy(&lk->turn_mu);
		return err_set(err, errlen, -ENOMEM, "cannot make the links' condition variables");
	}
	lk->ready = 1;
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
	if (lk->ready) {
		for (int k = 0; k < lk->nps; k++)
			conn_destroy(&lk->ln[k].conn);
		pthread_mutex_destroy(&lk->hb_mu);
		pthread_cond_destroy(&lk->hb_cv);
		pthread_mutex_destroy(&lk->say_mu);
		pthread_mutex_destroy(&lk->turn_mu);
		pthread_cond_destroy(&lk->turn_cv);
		lk->ready = 0;
	}
	for (int k = 0; lk->ln && k < lk->nps; k++) {
		struct link *l = &lk->ln[k];
		if (l->pp_ready)
			pipe_free(&l->pp);
		if (l->rpp_ready)
			pipe_free(&l->rpp);
		free(l->rbuf);
		free(l->wbuf);
		free(l->rwbuf);
		l->pp_ready = l->rpp_ready = 0;
		l->rbuf = l->wbuf = l->rwbuf = NULL;
	}
	cryptopool_destroy(lk->pool);
	free(lk->ln);
	free(lk->job);
	lk->pool = NULL;
	lk->ln = NULL;
	lk->job = NULL;
}

int links_local(const struct links *lk)
{
	int n = 0;
	for (int k = 0; lk->ln && k < lk->nps; k++)
		n += lk->ln[k].conn.fd >= 0 && lk->ln[k].unx;
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

void links_disconnect(struct links *lk)
{
	for (int k = 0; lk->ln && k < lk->nps; k++)
		conn_close(&lk->ln[k].conn);
}

/* The Unix socket to try before TCP for ps k ([cluster] local_socket), or
 * NULL: only for a ps whose address is one of this host's, so that hosts
 * sharing a file system (or network namespaces sharing one kernel) never
 * reach each other's ps that way. Where the directory is not ours alone
 * the ps says so and listens on TCP only; here it is just TCP. So it is
 * while the socket file there is one that failed a greeting (link_shun). */
static const char *link_local_path(const struct links *lk, int k, char *path, size_t len)
{
	const struct config *c = lk->c;
	const struct link *l = &lk->ln[k];
	char e[400];
	if (!c->cluster.local_socket || sock_is_own_address(c->cluster.ps[k].name, e, sizeof(e)) != 1 ||
	    role_local_path(c, k, path, len, e, sizeof(e)))
		return NULL;
	if (l->shun && sock_unix_file_is(path, &l->shunned))
		return NULL;
	return path;
}

/* The Unix socket at path failed a greeting (why: the error): whatever
 * listens there is not ps k for us (another cluster's ps under the same
 * path, which left ours on TCP only; any other program of this user), so
 * the link goes over TCP for as long as that file is there. Keyed on the
 * file, not for good: a ps that restarts binds a new one, which is tried
 * (our own ps may have dropped the greeting as it died), while a
 * reconnect past the same stranger pays no failed greeting again. */
static void link_shun(struct links *lk, int k, const char *path, const char *why)
{
	struct link *l = &lk->ln[k];
	l->shun = sock_unix_file_of(path, &l->shunned) == 0;
	role_log(lk->out, "worker %d: ps %d: the Unix socket %s did not answer as ps %d, so TCP for it: %s",
		 lk->index, k, path, k, why);
}

/* A connection to ps k within timeout_ms: its Unix socket first if local
 * is not NULL, else (or if nobody listens there) TCP. */
static int link_dial(struct links *lk, int k, const char *local, int timeout_ms, int *fd, char *err,
		     size_t errlen)
{
	const struct config *c = lk->c;
	char e[512];
	int r = sock_connect_local_until(local, c->cluster.ps[k].name, c->cluster.ps[k].port, timeout_ms,
					 lk->stop, fd, e, sizeof(e));
	if (r)
		return err_set(err, errlen, r == -EINVAL || r == -ENOENT ? -EINVAL : r == -EINTR ? -EINTR : -ECONNABORTED,
			       "ps %d: %s", k, e);
	return 0;
}

/* The handshake with ps k on fd (which it takes); then, at once, a
 * HEARTBEAT: the first frame the ps opens confirms that we hold the key
 * (until then a ps does not count the connection as this worker).
 * -ENOLINK: the ps did not answer our greeting. */
static int link_greet(struct links *lk, int k, int fd, int timeout_ms, char *err, size_t errlen)
{
	const struct config *c = lk->c;
	struct hs_identity me = { .role = HS_WORKER, .index = (uint32_t)lk->index,
				  .ciphers = lk->s->ciphers };
	memcpy(me.config_hash, lk->s->hash, HS_HASH_BYTES);
	struct conn *cn = &lk->ln[k].conn;
	char e[512], nm[300];
	int hs_ms = timeout_ms < ROLE_HANDSHAKE_MS ? timeout_ms : ROLE_HANDSHAKE_MS;
	links_ps_name(c, k, nm, sizeof(nm));
	me.local = sock_is_unix_same_user(fd);
	lk->ln[k].unx = sock_is_unix(fd);
	int r = conn_client(cn, fd, lk->s->key, &me, hs_ms, nm, err, errlen);
	if (r)
		return r;
	conn_send_buffer(cn, c->cluster.send_buffer_kib);
	if (cn->hr.peer.role != HS_PS || cn->hr.peer.index != (uint32_t)k) {
		r = err_set(err, errlen, -ECONNABORTED, "%s answered as %s %u", nm,
			    hs_role_name(cn->hr.peer.role), cn->hr.peer.index);
		conn_close(cn);
		return r;
	}
	struct msg_heartbeat hb;
	size_t len;
	memset(&hb, 0, sizeof(hb));
	r = msg_encode_heartbeat(conn_msg(cn->wbuf), conn_msg_cap(CONN_WBUF_BYTES), &hb, &len, e,
				 sizeof(e));
	if (!r)
		r = conn_send(cn, len, e, sizeof(e));
	if (r) {
		conn_close(cn);
		return err_set(err, errlen, -ECONNABORTED, "%s: %s", nm, e);
	}
	return 0;
}

/* One connection and handshake with ps k. A greeting that fails on the
 * Unix socket is not the end of this try: the ps may well listen on TCP
 * (another listener held the path when it started), so TCP is tried at
 * once, with what is left of the time. */
static int link_open(struct links *lk, int k, int timeout_ms, char *err, size_t errlen)
{
	int64_t end = role_now_ms() + timeout_ms;
	char upath[256];
	const char *local = link_local_path(lk, k, upath, sizeof(upath));
	int fd = -1;
	int r = link_dial(lk, k, local, timeout_ms, &fd, err, errlen);
	if (r)
		return r;
	r = link_greet(lk, k, fd, timeout_ms, err, errlen);
	if (!lk->ln[k].unx || (r != -ENOLINK && r != -ECONNABORTED))
		return r;
	link_shun(lk, k, upath, err);
	int left = (int)(end - role_now_ms());
	left = left < 100 ? 100 : left;
	r = link_dial(lk, k, NULL, left, &fd, err, errlen);
	return r ? r : link_greet(lk, k, fd, left, err, errlen);
}

/* A ps drops greetings it cannot tell from a flood's (evicted while
 * connections pile up on it), so an unanswered one is tried twice more.
 * Not more: a different cluster key looks the same from here, and that
 * should fail in a second, not after connect_timeout. */
#define LINK_GREETINGS 3

int links_connect_one(struct links *lk, int k, int timeout_ms, char *err, size_t errlen)
{
	int64_t end = role_now_ms() + timeout_ms;
	int r = -ENOLINK;
	for (int i = 0; i < LINK_GREETINGS && r == -ENOLINK; i++) {
		int left = (int)(end - role_now_ms());
		if (i > 0)
			role_nap_ms(20L << i);
		r = link_open(lk, k, left < 100 ? 100 : left, err, errlen);
	}
	return r == -ENOLINK ? -ECONNABORTED : r;
}

int links_connect(struct links *lk, char *err, size_t errlen)
{
	for (int k = 0; k < lk->nps; k++) {
		int r = links_connect_one(lk, k, (int)(lk->c->cluster.connect_timeout * 1000), err, errlen);
		if (r)
			return r;
	}
	return 0;
}

/* A HEARTBEAT from ps k while a sync PULL waits: the chief prints which
 * workers the shard is waiting for, once per version and set. */
static void links_heard_locked(struct links *lk, int k, const struct msg_heartbeat *hb)
{
	int any = 0;
	for (size_t i = 0; i < sizeof(hb->missing); i++)
		any |= hb->missing[i];
	if (!lk->pg || !any ||
	    (hb->version == lk->heard_v && memcmp(hb->missing, lk->heard, sizeof(lk->heard)) == 0))
		return;
	lk->heard_v = hb->version;
	memcpy(lk->heard, hb->missing, sizeof(lk->heard));
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
	progress_clear(lk->pg);
	role_log(lk->out, "worker %d: step %llu is waiting for worker%s %s (ps %d has no gradient from %s yet)",
		 lk->index, (unsigned long long)hb->version, n == 1 ? "" : "s", list, k,
		 n == 1 ? "it" : "them");
}

static void links_heard(struct links *lk, int k, const struct msg_heartbeat *hb)
{
	pthread_mutex_lock(&lk->say_mu);
	links_heard_locked(lk, k, hb);
	pthread_mutex_unlock(&lk->say_mu);
}

/* The first link found lost in a call is the one recovery starts from
 * (links_exchange runs them all at once). */
static void links_mark_lost(struct links *lk, int k)
{
	int none = -1;
	atomic_compare_exchange_strong(&lk->lost, &none, k);
}

/* A link failed at the transport level (not an ERROR the ps sent): the
 * caller may reconnect (recovery_resync). */
static int link_failed(struct links *lk, int k, int r, const char *e, char *err, size_t errlen)
{
	char nm[300];
	if (!lk->shutting && !lk->ln[k].halted)
		links_mark_lost(lk, k);
	if (r == -ETIMEDOUT)
		return err_set(err, errlen, -ECONNABORTED, "lost %s: no traffic for %g s (peer_timeout)",
			       links_ps_name(lk->c, k, nm, sizeof(nm)), lk->c->cluster.peer_timeout);
	return err_set(err, errlen, -ECONNABORTED, "lost %s: %s", links_ps_name(lk->c, k, nm, sizeof(nm)), e);
}

/* A shard answered with a version below what this worker had from it. */
static int link_went_back(struct links *lk, int k, uint64_t v, char *err, size_t errlen)
{
	char nm[300];
	links_mark_lost(lk, k);
	return err_set(err, errlen, -ECONNABORTED, "%s went back to step %llu",
		       links_ps_name(lk->c, k, nm, sizeof(nm)), (unsigned long long)v);
}

/* Reads one message from ps k into lk->rbuf, passing over HEARTBEATs; an
 * ERROR is reported. Returns the message's type. */
static int links_recv(struct links *lk, int k, size_t *len, char *err, size_t errlen)
{
	char e[512], nm[300];
	for (;;) {
		uint8_t *rbuf = lk->ln[k].rbuf;
		int r = conn_recv(&lk->ln[k].conn, len, e, sizeof(e));
		if (r)
			return link_failed(lk, k, r, e, err, errlen);
		r = msg_type(rbuf, *len, e, sizeof(e));
		if (r == WIRE_HEARTBEAT) {
			struct msg_heartbeat hb;
			if (msg_decode_heartbeat(rbuf, *len, &hb, e, sizeof(e)) == 0) {
				links_heard(lk, k, &hb);
				continue;
			}
			r = -EPROTO;
		}
		if (r == WIRE_ERROR) {
			struct msg_error me;
			if (msg_decode_error(rbuf, *len, &me, e, sizeof(e)) == 0)
				snprintf(e, sizeof(e), "%s", me.text);
			return err_set(err, errlen, -ECONNABORTED, "%s: %s", links_ps_name(lk->c, k, nm, sizeof(nm)), e);
		}
		if (r < 0)
			return err_set(err, errlen, -ECONNABORTED, "%s: %s", links_ps_name(lk->c, k, nm, sizeof(nm)), e);
		return r;
	}
}

/* A control message for every ps, encoded for each (sealing encrypts it
 * in place). */
struct ctl {
	uint8_t type;
	union {
		struct msg_pull pull;
		struct msg_checkpoint ck;
		struct msg_rollback rb;
		struct msg_done done;
		struct msg_status status;
	} u;
};

static int ctl_encode(const struct ctl *m, uint8_t *buf, size_t cap, size_t *len, char *err,
		      size_t errlen)
{
	switch (m->type) {
	case WIRE_PULL: return msg_encode_pull(buf, cap, &m->u.pull, len, err, errlen);
	case WIRE_CHECKPOINT: return msg_encode_checkpoint(buf, cap, &m->u.ck, len, err, errlen);
	case WIRE_ROLLBACK: return msg_encode_rollback(buf, cap, &m->u.rb, len, err, errlen);
	case WIRE_DONE: return msg_encode_done(buf, cap, &m->u.done, len, err, errlen);
	case WIRE_STATUS: return msg_encode_status(buf, cap, &m->u.status, len, err, errlen);
	}
	return err_set(err, errlen, -EINVAL, "no control message of type %u", m->type);
}

/* Sends m to ps k. */
static int links_send(struct links *lk, int k, const struct ctl *m, char *err, size_t errlen)
{
	char e[512];
	size_t len;
	if (ctl_encode(m, conn_msg(lk->ln[k].wbuf), conn_msg_cap(CONN_WBUF_BYTES), &len, e, sizeof(e)))
		return err_set(err, errlen, -EPROTO, "%s", e);
	int r = conn_send(&lk->ln[k].conn, len, e, sizeof(e));
	if (r)
		return link_failed(lk, k, r, e, err, errlen);
	return 0;
}

static int links_send_all(struct links *lk, const struct ctl *m, char *err, size_t errlen)
{
	for (int k = 0; k < lk->nps; k++) {
		int r = links_send(lk, k, m, err, errlen);
		if (r)
			return r;
	}
	return 0;
}

/* What link_reply is waiting for on ps k: the parameters, and, when a
 * push went up at the same time, its ACK. */
struct reply {
	struct links *lk;
	int k;
	int want_ack, acked;
	struct msg_assembly a;
	struct conn_chunk_rx x;
};

/* An ACK (len bytes at msg) of a push; stale and duplicate ones are
 * counted. */
static int links_take_ack(struct links *lk, const uint8_t *msg, size_t len, char *err, size_t errlen)
{
	struct msg_ack ack;
	int r = msg_decode_ack(msg, len, &ack, err, errlen);
	if (r)
		return r;
	if (ack.status == MSG_ACK_STALE || ack.status == MSG_ACK_DUPLICATE)
		lk->stale++;
	return 0;
}

static int reply_ack(struct reply *rp, const uint8_t *msg, size_t len, char *err, size_t errlen)
{
	if (!rp->want_ack || rp->acked)
		return err_set(err, errlen, -EPROTO, "an ACK for no push");
	int r = links_take_ack(rp->lk, msg, len, err, errlen);
	rp->acked = r == 0;
	return r;
}

/* A message between the chunks of the parameters: a HEARTBEAT while the
 * ps waits for the next piece, or the ACK of the push going up. */
static int reply_other(void *ctx, int type, const uint8_t *msg, size_t len, char *err, size_t errlen)
{
	struct reply *rp = ctx;
	if (type == WIRE_ACK)
		return reply_ack(rp, msg, len, err, errlen);
	if (type != WIRE_HEARTBEAT)
		return err_set(err, errlen, -EPROTO, "unexpected %s message among PARAMS",
			       wire_msg_name((uint8_t)type));
	struct msg_heartbeat hb;
	int r = msg_decode_heartbeat(msg, len, &hb, err, errlen);
	if (!r)
		links_heard(rp->lk, rp->k, &hb);
	return r;
}

/* A chunk of the parameters is in place: with a flow for them (the
 * forward pass of the next step waits on it), marked final. A flow that
 * cannot take the range fails, which ends that wait, not the receive. */
static int reply_took(void *ctx, const struct msg_chunk *c, char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	struct reply *rp = ctx;
	size_t lo = rp->lk->ln[rp->k].range.begin + (size_t)c->offset;
	(void)gradflow_mark(rp->lk->pflow, lo, lo + c->count);
	return 0;
}

/* The reply to a PULL from ps k into params, and with want_ack the ACK
 * of the push sent after it, in whatever order they come: messages one at
 * a time until the first chunk, then the rest of the tensor on the pipe
 * (again after each message taken between chunks). */
static int link_reply(struct links *lk, int k, float *params, int want_ack, char *err, size_t errlen)
{
	struct link *l = &lk->ln[k];
	struct reply rp = { .lk = lk, .k = k, .want_ack = want_ack };
	char e[512], nm[300];
	size_t len;
	if (msg_assembly_init(&rp.a, WIRE_PARAMS, (uint32_t)k, l->range.end - l->range.begin,
			      role_param_dtype(lk->c), e, sizeof(e)))
		return err_set(err, errlen, -EINVAL, "%s", e);
	rp.x = (struct conn_chunk_rx){ .type = WIRE_PARAMS, .a = &rp.a, .dst = params + l->range.begin,
				       .other = reply_other, .took = want_ack && lk->pflow ? reply_took : NULL,
				       .ctx = &rp };
	while (!msg_assembly_done(&rp.a) || (want_ack && !rp.acked)) {
		int r;
		if (rp.a.received == 0 || msg_assembly_done(&rp.a)) {
			r = links_recv(lk, k, &len, err, errlen);
			if (r < 0)
				return r;
			r = r == WIRE_ACK ? reply_ack(&rp, l->rbuf, len, e, sizeof(e))
			    : r == WIRE_PARAMS ? conn_take_chunk(&l->conn, &rp.x, len, e, sizeof(e))
					       : err_set(e, sizeof(e), -EPROTO, "unexpected %s message instead of PARAMS",
							 wire_msg_name((uint8_t)r));
			if (r)
				return err_set(err, errlen, -ECONNABORTED, "%s: %s",
					       links_ps_name(lk->c, k, nm, sizeof(nm)), e);
			continue;
		}
		r = conn_recv_rest(&l->conn, &rp.x, e, sizeof(e));
		if (r && rp.x.bad)
			return err_set(err, errlen, -ECONNABORTED, "%s: %s", links_ps_name(lk->c, k, nm, sizeof(nm)), e);
		if (r)
			return link_failed(lk, k, r, e, err, errlen);
	}
	l->got = rp.a.version;
	lk->pvalues += rp.a.n;
	lk->pbytes += rp.x.value_bytes;
	return 0;
}

/* Float32 goes packed (net/fpack.h) on a link that is not a Unix socket
 * when the worker says so (worker.c: where the link limits its steps);
 * on a Unix socket only the CPU would pay. */
static int link_packs(const struct links *lk, int k)
{
	return lk->pack && !lk->ln[k].unx;
}

static unsigned link_grad_dtype(const struct links *lk, int k)
{
	unsigned dt = role_grad_dtype(lk->c);
	return dt == WIRE_F32 && link_packs(lk, k) ? WIRE_F32P : dt;
}

/* PULL to ps k: sync asks for the version after the one it last had
 * (first: 0, whatever it has), async for the newest. *want: what was asked. */
static int link_ask(struct links *lk, int k, int first, uint64_t *want, char *err, size_t errlen)
{
	int async = lk->c->train.mode == MODE_ASYNC;
	struct ctl m = { .type = WIRE_PULL, .u.pull = { .shard = (uint32_t)k } };
	if (link_packs(lk, k) && role_param_dtype(lk->c) == WIRE_F32)
		m.u.pull.flags = MSG_PULL_PACKED;
	/* Never past the run's end: with backup workers the shards advance
	 * apart, and one may be there while this worker trains on. */
	uint64_t next = lk->ln[k].got + 1, end = (uint64_t)lk->s->job.total;
	m.u.pull.version = async ? MSG_VERSION_LATEST : first ? 0 : next < end ? next : end;
	*want = m.u.pull.version;
	return links_send(lk, k, &m, err, errlen);
}

/* The answer to link_ask. Async: versions only grow, so a lower one means
 * the shard was restarted or rolled back (recovery sees which). Sync: a
 * shard that answers below the version asked for was rolled back. */
static int link_take(struct links *lk, int k, float *params, int first, uint64_t want, char *err,
		     size_t errlen)
{
	int async = lk->c->train.mode == MODE_ASYNC;
	uint64_t had = lk->ln[k].got;
	int r = link_reply(lk, k, params, 0, err, errlen);
	if (r)
		return r;
	uint64_t v = lk->ln[k].got;
	if (!first && (async ? v < had : v < want))
		return link_went_back(lk, k, v, err, errlen);
	return 0;
}

int links_pull(struct links *lk, float *params, int first, char *err, size_t errlen)
{
	uint64_t want[CONFIG_MAX_HOSTS];
	for (int k = 0; k < lk->nps; k++) {
		int r = link_ask(lk, k, first, &want[k], err, errlen);
		if (r)
			return r;
	}
	for (int k = 0; k < lk->nps; k++) {
		int r = link_take(lk, k, params, first, want[k], err, errlen);
		if (r)
			return r;
	}
	return 0;
}

/* grads' slice for ps k, tagged with version. */
static int link_push_at(struct links *lk, int k, const float *grads, uint64_t version, char *err,
			size_t errlen)
{
	struct link *l = &lk->ln[k];
	char e[512];
	struct conn_chunk_tx t = { .type = WIRE_PUSH, .shard = (uint32_t)k, .version = version,
				   .worker = (uint32_t)lk->index, .src = grads + l->range.begin,
				   .n = l->range.end - l->range.begin, .dtype = (uint8_t)link_grad_dtype(lk, k) };
	int r = conn_send_tensor(&l->conn, &t, e, sizeof(e));
	return r ? link_failed(lk, k, r, e, err, errlen) : 0;
}

/* grads' slice for ps k, tagged with the version pulled from it. */
static int link_push(struct links *lk, int k, const float *grads, char *err, size_t errlen)
{
	return link_push_at(lk, k, grads, lk->ln[k].got, err, errlen);
}

/* Ps k's ACK of a push. */
static int link_ack(struct links *lk, int k, char *err, size_t errlen)
{
	char e[512];
	size_t len;
	int r = links_recv(lk, k, &len, err, errlen);
	if (r < 0)
		return r;
	if (r != WIRE_ACK || links_take_ack(lk, lk->ln[k].rbuf, len, e, sizeof(e)))
		return err_set(err, errlen, -ECONNABORTED, "ps %d: %s", k,
			       r != WIRE_ACK ? "unexpected message instead of ACK" : e);
	return 0;
}

int links_push(struct links *lk, const float *grads, char *err, size_t errlen)
{
	for (int k = 0; k < lk->nps; k++) {
		int r = link_push(lk, k, grads, err, errlen);
		if (r)
			return r;
	}
	for (int k = 0; k < lk->nps; k++) {
		int r = link_ack(lk, k, err, errlen);
		if (r)
			return r;
	}
	return 0;
}


/* Waits for this link's turn to push, pushes, passes the turn on (also
 * after a failure, so that no other link waits for ever), then asks for
 * the next version and takes the ACK and the parameters as they come. */
static int link_staggered(struct link_job *j)
{
	struct links *lk = j->lk;
	pthread_mutex_lock(&lk->turn_mu);
	while (lk->turn < j->pos)
		pthread_cond_wait(&lk->turn_cv, &lk->turn_mu);
	pthread_mutex_unlock(&lk->turn_mu);
	uint64_t want = 0;
	int r = link_push(lk, j->k, j->grads, j->err, sizeof(j->err));
	if (!r)
		r = link_ask(lk, j->k, 0, &want, j->err, sizeof(j->err));
	/* The turn passes at the ACK, when the ps has the whole gradient,
	 * not when the socket took it: the kernel buffers megabytes, and
	 * pushes that all sit in buffers at once share the uplink again. */
	if (!r)
		r = link_ack(lk, j->k, j->err, sizeof(j->err));
	pthread_mutex_lock(&lk->turn_mu);
	lk->turn++;
	pthread_cond_broadcast(&lk->turn_cv);
	pthread_mutex_unlock(&lk->turn_mu);
	if (!r)
		r = link_take(lk, j->k, j->params, 0, want, j->err, sizeof(j->err));
	return r;
}

/* Pieces a push waits for before it sends: one call per piece cost the
 * worker about 1 ms of CPU a step more at 10 Gbit/s (wake-ups, a send
 * per piece), while 4 are still 2 ms at 1 Gbit/s and made in a fraction
 * of a millisecond. */
#define LINK_FLOW_RUN 4

/* Piece mode with a flow: grads' slice for ps k, tagged with version,
 * sent run by run of whole pieces as backward makes them final (the
 * last piece may be shorter). A step that fails before its gradient is
 * final cancels the push half-way: the caller shuts the link. */
static int link_push_flow(struct links *lk, int k, const float *grads, uint64_t version,
			  struct gradflow *flow, char *err, size_t errlen)
{
	struct link *l = &lk->ln[k];
	size_t lo = l->range.begin, end = l->range.end;
	char e[512];
	while (lo < end) {
		size_t have, hi;
		if (gradflow_wait(flow, k, lo + LINK_FLOW_RUN * PSSHARD_PIECE, &have))
			return err_set(err, errlen, -ECANCELED, "the step ended before its gradient was made");
		hi = have == end ? end : lo + (have - lo) / PSSHARD_PIECE * PSSHARD_PIECE;
		struct conn_chunk_tx t = { .type = WIRE_PUSH, .shard = (uint32_t)k, .version = version,
					   .worker = (uint32_t)lk->index, .src = grads + lo, .n = hi - lo,
					   .offset = lo - l->range.begin,
					   .dtype = (uint8_t)link_grad_dtype(lk, k) };
		int r = conn_send_tensor(&l->conn, &t, e, sizeof(e));
		if (r)
			return link_failed(lk, k, r, e, err, errlen);
		lo = hi;
	}
	return 0;
}

/* A stream left to the end (gradflow_later): its whole range at once,
 * when it is final. */
static int link_push_later(struct links *lk, int k, const float *grads, uint64_t version,
			   struct gradflow *flow, char *err, size_t errlen)
{
	size_t have;
	if (gradflow_wait(flow, k, lk->ln[k].range.end, &have))
		return err_set(err, errlen, -ECANCELED, "the step ended before its gradient was made");
	return link_push_at(lk, k, grads, version, err, errlen);
}

/* The receiving half of link_duplex, on a thread of its own. */
struct link_rx {
	struct links *lk;
	int k;
	float *params;
	int r;
	char err[512];
	_Atomic int first;  /* the half that failed first: 1 the push, 2 this */
};

/* The half that fails first shuts the link down, so that the other one
 * (a push stuck on a ps that stopped reading, a receive waiting for a
 * reply that will not come) ends at once. */
static void link_half_failed(struct link_rx *x, int half)
{
	int none = 0;
	atomic_compare_exchange_strong(&x->first, &none, half);
	x->lk->ln[x->k].halted = 1;
	conn_shutdown(&x->lk->ln[x->k].conn);
}

static void *link_rx_main(void *arg)
{
	struct link_rx *x = arg;
	x->r = link_reply(x->lk, x->k, x->params, 1, x->err, sizeof(x->err));
	if (x->r)
		link_half_failed(x, 2);
	return NULL;
}

/* Piece mode: asks for the next version, then pushes while a second
 * thread takes the ACK and the parameters as the ps streams them, so the
 * link carries both directions at once and the first pieces of the new
 * parameters arrive before the last of the gradient has left. */
static int link_duplex(struct link_job *j)
{
	struct links *lk = j->lk;
	struct link *l = &lk->ln[j->k];
	uint64_t tag = l->got, want = 0;
	l->halted = 0;
	int r = link_ask(lk, j->k, 0, &want, j->err, sizeof(j->err));
	if (r)
		return r;
	struct link_rx x = { .lk = lk, .k = j->k, .params = j->params };
	pthread_t th;
	int threaded = pthread_create(&th, NULL, link_rx_main, &x) == 0;
	if (j->flow && gradflow_is_later(j->flow, j->k))
		r = link_push_later(lk, j->k, j->grads, tag, j->flow, j->err, sizeof(j->err));
	else if (j->flow)
		r = link_push_flow(lk, j->k, j->grads, tag, j->flow, j->err, sizeof(j->err));
	else
		r = link_push_at(lk, j->k, j->grads, tag, j->err, sizeof(j->err));
	if (r)
		link_half_failed(&x, 1);
	if (threaded)
		pthread_join(th, NULL);
	else if (!r) /* a ps's streamer answers after the push all the same */
		link_rx_main(&x);
	/* The first failure is the reason; the other half's is then only
	 * the shutdown it caused. */
	if (x.first == 2) {
		snprintf(j->err, sizeof(j->err), "%s", x.err);
		r = x.r;
	}
	l->halted = 0;
	if (!r && l->got < want)
		r = link_went_back(lk, j->k, l->got, j->err, sizeof(j->err));
	return r;
}

static void *link_exchange(void *arg)
{
	struct link_job *j = arg;
	struct links *lk = j->lk;
	int r = lk->pieces ? link_duplex(j) : link_staggered(j);
	j->r = r;
	/* A lost link ends the exchange on every link: the others would
	 * otherwise wait on, a healthy ps holding its step for a worker that
	 * the failed link has just taken away (seen: 6 s more over a cut
	 * link, for peer_timeout 3 s); recovery reconnects to every ps
	 * anyway. An ERROR from a ps does not: another link may yet be
	 * found lost, and recovery then comes first (a ps rolled back by a
	 * restarted one refuses a push of the old step, and the lost link
	 * to the restarted ps is what the worker must act on). */
	/* The next step's forward pass waits for these parameters no more. */
	if (r && lk->pflow)
		gradflow_fail(lk->pflow);
	int none = -1;
	if (r && lk->lost == j->k && atomic_compare_exchange_strong(&lk->failed_first, &none, j->k)) {
		lk->shutting = 1;
		for (int k = 0; k < lk->nps; k++)
			if (k != j->k)
				conn_shutdown(&lk->ln[k].conn);
	}
	return NULL;
}

/* The lost link's message if one was lost (links shut down after the
 * first failure do not count as lost), else the first failure's. */
static int links_outcome(struct links *lk, struct link_job *job, char *err, size_t errlen)
{
	int pick = lk->lost, r = 0;
	for (int k = 0; pick < 0 && k < lk->nps; k++)
		if (job[k].r)
			pick = k;
	lk->shutting = 0;
	if (pick >= 0) {
		snprintf(err, errlen, "%s", job[pick].err);
		r = job[pick].r ? job[pick].r : -ECONNABORTED;
	}
	return r;
}

static void links_jobs_set(struct links *lk, const float *grads, float *params, struct gradflow *flow)
{
	int nps = lk->nps;
	lk->turn = 0;
	lk->failed_first = -1;
	lk->shutting = 0;
	for (int k = 0; k < nps; k++)
		lk->job[k] = (struct link_job){ .lk = lk, .k = k, .pos = (k - lk->index % nps + nps) % nps,
						.grads = grads, .params = params, .flow = flow };
}

int links_exchange(struct links *lk, const float *grads, float *params, char *err, size_t errlen)
{
	int nps = lk->nps;
	struct link_job *job = lk->job;
	lk->pflow = NULL;
	links_jobs_set(lk, grads, params, NULL);
	/* The last one runs on this thread: one ps needs no thread. */
	for (int k = 0; k + 1 < nps; k++)
		job[k].started = pthread_create(&job[k].th, NULL, link_exchange, &job[k]) == 0;
	/* Those without a thread, here in push order: each waits only for
	 * turns of threads or of jobs run here before it. */
	for (int pos = 0; pos < nps; pos++)
		for (int k = 0; k < nps; k++)
			if (job[k].pos == pos && !job[k].started)
				link_exchange(&job[k]);
	for (int k = 0; k < nps; k++)
		if (job[k].started)
			pthread_join(job[k].th, NULL);
	return links_outcome(lk, job, err, errlen);
}

int links_exchange_begin(struct links *lk, const float *grads, float *params, struct gradflow *flow,
			 struct gradflow *pflow)
{
	struct link_job *job = lk->job;
	links_jobs_set(lk, grads, params, flow);
	lk->pflow = pflow;
	for (int k = 0; k < lk->nps; k++) {
		job[k].started = pthread_create(&job[k].th, NULL, link_exchange, &job[k]) == 0;
		if (!job[k].started) {
			gradflow_fail(flow);
			if (pflow)
				gradflow_fail(pflow);
			for (int i = 0; i < k; i++)
				pthread_join(job[i].th, NULL);
			return -EAGAIN;
		}
	}
	return 0;
}

int links_exchange_end(struct links *lk, char *err, size_t errlen)
{
	for (int k = 0; k < lk->nps; k++)
		pthread_join(lk->job[k].th, NULL);
	return links_outcome(lk, lk->job, err, errlen);
}

int links_checkpoint(struct links *lk, long step, double acc, char *err, size_t errlen)
{
	struct ctl m = { .type = WIRE_CHECKPOINT, .u.ck = { .step = (uint64_t)step, .has_acc = acc >= 0,
								    .acc = acc >= 0 ? acc : 0 } };
	return links_send_all(lk, &m, err, errlen);
}

int links_rollback(struct links *lk, uint64_t step, char *err, size_t errlen)
{
	struct ctl m = { .type = WIRE_ROLLBACK, .u.rb = { .step = step } };
	return links_send_all(lk, &m, err, errlen);
}

int links_done(struct links *lk, int leaving, char *err, size_t errlen)
{
	struct ctl m = { .type = WIRE_DONE,
			 .u.done = { .worker = (uint32_t)lk->index, .leaving = (uint8_t)leaving } };
	return links_send_all(lk, &m, err, errlen);
}

/* A shard below the version this worker last pulled from it went back
 * while it waited (a ps restarted from a checkpoint, or rolled back): that
 * is a lost link, for recovery_resync. */
int links_status(struct links *lk, int *complete, char *err, size_t errlen)
{
	size_t len;
	char e[256], nm[300];
	*complete = 1;
	for (int k = 0; k < lk->nps; k++) {
		struct ctl m = { .type = WIRE_STATUS, .u.status = { .reply = 0, .shard = (uint32_t)k } };
		int r = links_send(lk, k, &m, err, errlen);
		if (r)
			return r;
	}
	for (int k = 0; k < lk->nps; k++) {
		struct msg_status a;
		int r = links_recv(lk, k, &len, err, errlen);
		if (r < 0)
			return r;
		if (r != WIRE_STATUS || msg_decode_status(lk->ln[k].rbuf, len, &a, e, sizeof(e)) || !a.reply ||
		    a.shard != (uint32_t)k)
			return err_set(err, errlen, -ECONNABORTED, "%s: %s", links_ps_name(lk->c, k, nm, sizeof(nm)),
				       r != WIRE_STATUS ? "unexpected message instead of STATUS" : "bad STATUS reply");
		if (a.version < lk->ln[k].got)
			return link_went_back(lk, k, a.version, err, errlen);
		*complete &= a.complete;
	}
	return 0;
}
