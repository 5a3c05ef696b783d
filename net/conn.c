/* See conn.h. */
#include "conn.h"
#include "../base/err.h"
#include "sock.h"

#include <errno.h>
#include <poll.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The frame of a message of at most msg_max bytes. */
static size_t conn_frame_bytes(const struct conn *cn)
{
	return FRAME_SEALED_BYTES(cn->shape.msg_max);
}

/* Sender s's buffer and pipe (a pipe's frame 0 is its buffer). */
static int conn_tx_init(struct conn *cn, struct conn_tx *tx)
{
	tx->buf = malloc(conn_frame_bytes(cn));
	if (!tx->buf)
		return -ENOMEM;
	if (cn->shape.pipes != CONN_NO_PIPES &&
	    pipe_init(&tx->pp, cn->shape.pool, tx->buf, FRAME_BYTES_MAX, NULL, 0))
		return -ENOMEM;
	return 0;
}

/* The buffers and pipes of cn->shape: -ENOMEM if any cannot be had (what
 * was had stays for conn_free_buffers). */
static int conn_alloc_buffers(struct conn *cn)
{
	enum conn_pipes pp = cn->shape.pipes;
	cn->rbuf = malloc(conn_frame_bytes(cn));
	if (!cn->rbuf || conn_tx_init(cn, &cn->tx[CONN_MAIN]))
		return -ENOMEM;
	if (pp == CONN_PIPE_SIDE && conn_tx_init(cn, &cn->tx[CONN_SIDE]))
		return -ENOMEM;
	if (pp == CONN_PIPE_RECV) {
		/* rbuf is done with once a tensor's first chunk is taken:
		 * the rest of it comes on the pipe. */
		if (pipe_init(&cn->rpp, cn->shape.pool, cn->rbuf, FRAME_BYTES_MAX, NULL, 0))
			return -ENOMEM;
		cn->rp = &cn->rpp;
	} else if (pp != CONN_NO_PIPES) {
		cn->rp = &cn->tx[CONN_MAIN].pp;
	}
	return 0;
}

/* Where the connection's frames go: its ring, once it has one. */
#define conn_stream(cn) \
	(&(const struct sock_stream){ .fd = (cn)->fd, .ring = (cn)->ring.map ? &(cn)->ring : NULL })

static void conn_free_buffers(struct conn *cn)
{
	for (int s = 0; s < CONN_SENDERS; s++) {
		pipe_free(&cn->tx[s].pp);
		free(cn->tx[s].buf);
		cn->tx[s].buf = NULL;
	}
	pipe_free(&cn->rpp);
	free(cn->rbuf);
	cn->rbuf = NULL;
	cn->rp = NULL;
}

int conn_init(struct conn *cn, int fd, const struct conn_shape *shape, int read_ms,
	      int write_ms)
{
	memset(cn, 0, sizeof(*cn));
	if (shape)
		cn->shape = *shape;
	if (!cn->shape.msg_max || cn->shape.msg_max > CONN_MSG_MAX ||
	    cn->shape.pipes != CONN_NO_PIPES)
		cn->shape.msg_max = CONN_MSG_MAX; /* a pipe's frames are all full-size */
	cn->fd = fd;
	cn->state = CONN_PENDING;
	cn->read_ms = read_ms;
	cn->write_ms = write_ms;
	pthread_mutex_init(&cn->mu, NULL);
	/* Once per connection, not per handshake: a worker's links reconnect
	 * in the same pages. An mlock beyond RLIMIT_MEMLOCK does not fail
	 * this (see net/key.c). */
	cn->keys = sodium_malloc(sizeof(*cn->keys));
	if (cn->keys)
		sodium_memzero(cn->keys, sizeof(*cn->keys)); /* sodium_malloc fills 0xdb */
	if (!cn->keys || conn_alloc_buffers(cn)) {
		/* No keys: every handshake fails, so no buffer is ever used. */
		sodium_free(cn->keys);
		cn->keys = NULL;
		conn_free_buffers(cn);
		return -ENOMEM;
	}
	return 0;
}

void conn_destroy(struct conn *cn)
{
	if (!cn->shape.msg_max)
		return; /* zeroed, never initialized */
	conn_close(cn);
	sodium_free(cn->keys);
	cn->keys = NULL;
	conn_free_buffers(cn);
	pthread_mutex_destroy(&cn->mu);
	cn->shape.msg_max = 0;
}

void conn_attach(struct conn *cn, int fd, const struct hs_result *hr)
{
	pthread_mutex_lock(&cn->mu);
	cn->fd = fd;
	cn->keys->send = hr->send;
	cn->keys->recv = hr->recv;
	cn->hr.peer = hr->peer;
	cn->state = CONN_AUTHENTICATED;
	cn->said_error = 0;
	cn->ring_why[0] = 0; /* a reason of the connection before, if any, is not this one's */
	cn->last_send = now_s();
	pthread_mutex_unlock(&cn->mu);
}

void conn_send_buffer(struct conn *cn, int kib)
{
	pthread_mutex_lock(&cn->mu);
	/* A cap, not a need: a socket that refuses one still works. */
	if (cn->fd >= 0)
		(void)sndbuf_init(&cn->sb, cn->fd, kib);
	pthread_mutex_unlock(&cn->mu);
}

int conn_client(struct conn *cn, int fd, const uint8_t psk[HS_PSK_BYTES],
		const struct hs_identity *me, int hs_ms, const char *who, char *err,
		size_t errlen)
{
	uint8_t hello1[HS_HELLO_BYTES], hello2[HS_HELLO_BYTES];
	struct hs h;
	struct hs_result hr;
	char e[512];
	if (!cn->keys) {
		close(fd);
		return err_set(err, errlen, -ENOMEM, "%s: out of memory for the session keys", who);
	}
	int r = hs_client_start(&h, hello1, psk, me, e, sizeof(e));
	if (r) {
		close(fd);
		return err_set(err, errlen, r, "handshake: %s", e);
	}
	r = sock_write_full(fd, hello1, sizeof(hello1), hs_ms, e, sizeof(e));
	if (!r)
		r = sock_read_full(fd, hello2, sizeof(hello2), hs_ms, e, sizeof(e));
	if (r) {
		hs_wipe(&h);
		close(fd);
		/* A ps never says why it drops a greeting (that would answer
		 * peers without the key): say what was seen, and where the
		 * reason is. */
		return err_set(err, errlen, r == -EPIPE || r == -ETIMEDOUT ? -ENOLINK : -ECONNABORTED,
			       "%s: handshake: %s%s", who, e,
			       r == -EPIPE || r == -ETIMEDOUT
				       ? ": no answer to our greeting (a ps answers none that fails "
					 "authentication, as with another cluster key, none it takes "
					 "for a replay, and none later than its handshake_timeout; "
					 "its log says which)"
				       : "");
	}
	r = hs_client_finish(&h, &hr, hello2, sizeof(hello2), e, sizeof(e));
	if (r) {
		hs_wipe(&h);
		close(fd);
		return err_set(err, errlen, -ECONNABORTED, "%s: %s", who, e);
	}
	conn_attach(cn, fd, &hr);
	frame_key_wipe(&hr.send);
	frame_key_wipe(&hr.recv);
	if (me->local != HS_LOCAL_RING || cn->keys->recv.cipher != FRAME_LOCAL)
		return 0;
	r = ring_offer(&cn->ring, fd, 0, hs_ms, cn->ring_why, sizeof(cn->ring_why));
	if (r < 0) {
		conn_close(cn);
		return err_set(err, errlen, -ECONNABORTED, "%s: %s", who, cn->ring_why);
	}
	return 0;
}

int conn_ring_due(const struct conn *cn)
{
	return cn->state == CONN_AUTHENTICATED && cn->keys->recv.cipher == FRAME_LOCAL &&
	       cn->hr.peer.local == HS_LOCAL_RING && !cn->ring.map;
}

int conn_ring_accept(struct conn *cn, int timeout_ms, char *err, size_t errlen)
{
	if (!conn_ring_due(cn))
		return 0;
	int r = ring_accept(&cn->ring, cn->fd, timeout_ms, cn->ring_why, sizeof(cn->ring_why));
	if (r < 0)
		return err_set(err, errlen, r, "%s", cn->ring_why);
	return 0;
}

int conn_server(struct conn *cn, const uint8_t psk[HS_PSK_BYTES], const struct hs_identity *me,
		int hs_ms, char *err, size_t errlen)
{
	uint8_t hello1[HS_HELLO_BYTES], hello2[HS_HELLO_BYTES];
	struct hs_result hr;
	size_t outlen = 0;
	char e[320];
	int fd = cn->fd;
	if (!cn->keys)
		return err_set(err, errlen, -ENOMEM, "out of memory for the session keys");
	int r = sock_read_full(fd, hello1, sizeof(hello1), hs_ms, e, sizeof(e));
	if (r)
		return err_set(err, errlen, r, "no handshake: %s", e);
	r = hs_server_respond(&hr, hello2, &outlen, psk, me, hello1, sizeof(hello1), e, sizeof(e));
	if (outlen)
		(void)!sock_write_full(fd, hello2, outlen, hs_ms, NULL, 0);
	if (r)
		return err_set(err, errlen, r, "handshake refused: %s", e);
	conn_attach(cn, fd, &hr);
	frame_key_wipe(&hr.send);
	frame_key_wipe(&hr.recv);
	return conn_ring_accept(cn, hs_ms, err, errlen);
}

void conn_close(struct conn *cn)
{
	pthread_mutex_lock(&cn->mu);
	ring_free(&cn->ring);
	if (cn->fd >= 0)
		close(cn->fd);
	cn->fd = -1;
	cn->state = CONN_PENDING;
	memset(&cn->sb, 0, sizeof(cn->sb)); /* the next socket's own */
	if (cn->keys)
		sodium_memzero(cn->keys, sizeof(*cn->keys));
	pthread_mutex_unlock(&cn->mu);
}

void conn_shutdown(struct conn *cn)
{
	cn->state = CONN_CLOSING;
	ring_shutdown(&cn->ring, SHUT_RDWR);
	if (cn->fd >= 0)
		shutdown(cn->fd, SHUT_RDWR);
}

void conn_shutdown_write(struct conn *cn)
{
	cn->state = CONN_CLOSING;
	ring_shutdown(&cn->ring, SHUT_WR);
	if (cn->fd >= 0)
		shutdown(cn->fd, SHUT_WR);
}

void conn_shutdown_read(struct conn *cn)
{
	ring_shutdown(&cn->ring, SHUT_RD);
	if (cn->fd >= 0)
		shutdown(cn->fd, SHUT_RD);
}

/* Under mu, after a send on an authenticated connection failed: part of a
 * frame may be on the wire (a write that timed out or was cut), so the
 * stream can no longer carry a whole frame, and the pipe may have moved
 * the counter past frames it never wrote. Nothing more is sealed or read
 * on it; the owner closes it. */
static int conn_send_failed(struct conn *cn, int r)
{
	if (r < 0 && cn->state == CONN_AUTHENTICATED)
		cn->state = CONN_CLOSING;
	return r;
}

/* Whether a frame may be sealed (send) or read (!send) now. A closing
 * connection seals nothing, but what the peer sent before it stays
 * readable until the socket says otherwise (conn_shutdown shuts it, so
 * reads end too): after a send failed on a ps that closed, its last
 * message, a final REPORT or an ERROR saying why, is still there. */
static int conn_ready(const struct conn *cn, int send, char *err, size_t errlen)
{
	if (cn->state == CONN_AUTHENTICATED || (!send && cn->state == CONN_CLOSING))
		return 0;
	return err_set(err, errlen, cn->state == CONN_CLOSING ? -ESHUTDOWN : -ENOTCONN,
		       cn->state == CONN_CLOSING ? "connection shut down" : "not connected");
}

/* Sender s's buffer, or an error for a sender the shape has not. */
static struct conn_tx *conn_tx_of(struct conn *cn, enum conn_sender s, char *err, size_t errlen)
{
	if ((unsigned)s < CONN_SENDERS && cn->tx[s].buf)
		return &cn->tx[s];
	(void)err_set(err, errlen, -EINVAL, "no sender %d on this connection", (int)s);
	return NULL;
}

uint8_t *conn_payload(struct conn *cn, enum conn_sender s)
{
	return cn->tx[s].buf ? cn->tx[s].buf + FRAME_HDR_BYTES : NULL;
}

size_t conn_payload_cap(const struct conn *cn)
{
	return cn->shape.msg_max;
}

/* Seals the len-byte message at msg into buf (cap bytes) and writes it,
 * under mu, if the connection may send: a failure closes it. */
static int conn_write_locked(struct conn *cn, uint8_t *buf, size_t cap, const uint8_t *msg,
			     size_t len, int ms, char *err, size_t errlen)
{
	int r = conn_ready(cn, 1, err, errlen);
	if (!r)
		r = conn_send_failed(cn, sock_write_frame(conn_stream(cn), &cn->keys->send, buf, cap, msg, len,
							  ms, err, errlen));
	cn->last_send = now_s();
	return r;
}

int conn_send_payload(struct conn *cn, enum conn_sender s, size_t len, char *err, size_t errlen)
{
	struct conn_tx *tx = conn_tx_of(cn, s, err, errlen);
	if (!tx)
		return -EINVAL;
	pthread_mutex_lock(&cn->mu);
	int r = conn_write_locked(cn, tx->buf, conn_frame_bytes(cn), tx->buf + FRAME_HDR_BYTES, len,
				  cn->write_ms, err, errlen);
	pthread_mutex_unlock(&cn->mu);
	return r;
}

int conn_send_idle(struct conn *cn, const uint8_t *msg, size_t len, double idle_s, char *err,
		   size_t errlen)
{
	/* The caller's thread may be any (a heartbeat thread beside the
	 * senders): the frame is its own, a few dozen bytes. */
	uint8_t frame[FRAME_SEALED_BYTES(CONN_IDLE_MAX)];
	if (len > CONN_IDLE_MAX)
		return err_set(err, errlen, -EMSGSIZE, "keep-alive of %zu bytes, at most %zu", len,
			       CONN_IDLE_MAX);
	int r = 0;
	pthread_mutex_lock(&cn->mu);
	if (cn->state == CONN_AUTHENTICATED && now_s() - cn->last_send >= idle_s) {
		r = conn_write_locked(cn, frame, sizeof(frame), msg, len, (int)(idle_s * 1000), err,
				      errlen);
		r = r ? r : 1;
	}
	pthread_mutex_unlock(&cn->mu);
	return r;
}

void conn_send_error(struct conn *cn, enum conn_sender s, uint32_t code, const char *text)
{
	char e[128];
	size_t len;
	struct conn_tx *tx = conn_tx_of(cn, s, e, sizeof(e));
	if (!tx || msg_encode_error(tx->buf + FRAME_HDR_BYTES, cn->shape.msg_max, code, text, &len, e,
				    sizeof(e)) != 0)
		return;
	pthread_mutex_lock(&cn->mu);
	if (conn_write_locked(cn, tx->buf, conn_frame_bytes(cn), tx->buf + FRAME_HDR_BYTES, len,
			      cn->write_ms, e, sizeof(e)) == 0)
		cn->said_error = 1;
	/* the last message: nothing is sealed after it, sent or not */
	if (cn->state == CONN_AUTHENTICATED)
		cn->state = CONN_CLOSING;
	pthread_mutex_unlock(&cn->mu);
}

void conn_linger(struct conn *cn, int ms)
{
	pthread_mutex_lock(&cn->mu);
	int fd = cn->said_error ? cn->fd : -1;
	pthread_mutex_unlock(&cn->mu);
	if (fd < 0)
		return;
	shutdown(fd, SHUT_WR);
	uint8_t junk[4096];
	double end = now_s() + ms / 1000.0;
	for (;;) {
		ssize_t n = recv(fd, junk, sizeof(junk), MSG_DONTWAIT);
		if (n > 0 || (n < 0 && errno == EINTR))
			continue;
		double left = end - now_s();
		if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || left <= 0)
			return; /* the peer closed, the connection failed, or time is up */
		struct pollfd p = { .fd = fd, .events = POLLIN };
		(void)poll(&p, 1, (int)(left * 1000) + 1);
	}
}

int conn_recv(struct conn *cn, size_t *len, char *err, size_t errlen)
{
	int r = conn_ready(cn, 0, err, errlen);
	/* The ciphertext of a message of at most msg_max bytes. */
	return r ? r : sock_read_frame(conn_stream(cn), &cn->keys->recv, cn->rbuf,
				       cn->shape.msg_max + FRAME_TAG_BYTES, len, cn->read_ms, err,
				       errlen);
}

/* The values go from t->src into the frame as it is sealed (AEGIS-256)
 * or written (a local socket), not through a copy next to the header:
 * at 10 Gbit/s such copies were about half a millisecond of CPU a step
 * over the ps and workers of a 2-host cluster. */
static int chunk_encode(void *ctx, uint64_t i, uint8_t *msg, size_t cap, struct pipe_msg *m,
			char *err, size_t errlen)
{
	const struct conn_chunk_tx *t = ctx;
	struct msg_chunk ch = { .type = t->type, .dtype = t->dtype, .shard = t->shard,
				.version = t->version, .worker = t->worker };
	msg_chunk_range(t->n, t->dtype, i, &ch.offset, &ch.count);
	const float *src = t->src + ch.offset;
	ch.base = t->base ? t->base + ch.offset : NULL;
	ch.offset += t->offset;
	return msg_encode_chunk_parts(msg, cap, &ch, src, &m->len, &m->body, &m->blen, err, errlen);
}

int conn_send_tensor(struct conn *cn, enum conn_sender s, const struct conn_chunk_tx *t, char *err,
		     size_t errlen)
{
	struct conn_tx *tx = conn_tx_of(cn, s, err, errlen);
	if (!tx)
		return -EINVAL;
	if (cn->shape.pipes == CONN_NO_PIPES)
		return err_set(err, errlen, -EINVAL, "no pipe on this connection");
	pthread_mutex_lock(&cn->mu);
	int r = conn_ready(cn, 1, err, errlen);
	if (!r)
		r = conn_send_failed(cn, pipe_send(&tx->pp, conn_stream(cn), &cn->keys->send,
						   msg_chunks(t->n, t->dtype), chunk_encode,
						   (void *)t, cn->write_ms, err, errlen));
	cn->last_send = now_s();
	if (!r) /* after a tensor, the most a connection sends at once */
		sndbuf_tune(&cn->sb, cn->fd, cn->last_send);
	pthread_mutex_unlock(&cn->mu);
	return r;
}

/* A decoded chunk of x's tensor, of len message bytes: checked against the
 * assembly, its values copied to x->dst unless they are there already
 * (placed), then handed to x->took. */
static int chunk_take(struct conn_chunk_rx *x, struct msg_chunk *ch, size_t len, int placed,
		      char *err, size_t errlen)
{
	if (x->type == WIRE_PUSH && ch->worker != x->worker)
		return err_set(err, errlen, -EPROTO, "PUSH names worker %u on worker %u's connection",
			       ch->worker, x->worker);
	int r = msg_assembly_add(x->a, ch, placed ? NULL : x->dst, err, errlen);
	if (r < 0)
		return r;
	if (placed) {
		ch->data = (const uint8_t *)(x->dst + ch->offset);
		x->placed += ch->count;
	}
	if (x->took && (r = x->took(x->ctx, ch, err, errlen)) < 0)
		return r;
	x->value_bytes += len - MSG_CHUNK_HDR_BYTES;
	x->bad = 0;
	return 0;
}

static int chunk_deliver(void *ctx, uint64_t i, const uint8_t *msg, size_t len, char *err,
			 size_t errlen)
{
	struct conn_chunk_rx *x = ctx;
	struct msg_chunk ch;
	struct msg_error me;
	(void)i;
	x->bad = 1;
	int r = msg_type(msg, len, err, errlen);
	if (r == WIRE_ERROR && x->type == WIRE_PARAMS)
		return msg_decode_error(msg, len, &me, err, errlen) ? -EPROTO
			: err_set(err, errlen, -ECONNABORTED, "%s", me.text);
	if (r < 0)
		return r;
	if (r != x->type && r != WIRE_ERROR && x->other) {
		r = x->other(x->ctx, r, msg, len, err, errlen);
		x->bad = r < 0;
		return r;
	}
	if (r != x->type)
		return err_set(err, errlen, -EPROTO, "unexpected %s message in a %s tensor",
			       wire_msg_name((uint8_t)r), wire_msg_name(x->type));
	r = msg_decode_chunk(msg, len, &ch, err, errlen);
	return r < 0 ? r : chunk_take(x, &ch, len, 0, err, errlen);
}

/* Where in x's tensor the values of the message whose head this is go,
 * if it is a float32 chunk of x's type at offset `at` (the assembly checks
 * the rest once it is in): whole, the full chunk msg_chunk_range puts
 * there; else any count that fits. Floats are placed as they came only
 * on a little-endian host. */
static uint8_t *chunk_place(const struct conn_chunk_rx *x, const uint8_t *head, size_t mlen,
			    uint64_t at, int whole)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	const struct msg_assembly *a = x->a;
	uint64_t m = msg_chunk_max(WIRE_F32), left = at < a->n ? a->n - at : 0;
	struct msg_chunk ch;
	if (!x->dst || a->dtype != WIRE_F32 || head[0] != x->type || !left ||
	    msg_decode_chunk_head(head, mlen, &ch, NULL, 0) || ch.offset != at ||
	    (whole ? ch.count != (left < m ? left : m) : ch.count > left))
		return NULL;
	return (uint8_t *)(x->dst + at);
#else
	(void)x, (void)head, (void)mlen, (void)at, (void)whole;
	return NULL;
#endif
}

/* Where the values of the tensor's next chunk go: past the received ones. */
static uint8_t *chunk_where(void *ctx, const uint8_t *head, size_t mlen)
{
	const struct conn_chunk_rx *x = ctx;
	return chunk_place(x, head, mlen, x->a->received, 0);
}

/* chunk_where for a frame opened on the pool before the messages ahead of
 * it are delivered: message i of the receive goes to its place if it is
 * the whole chunk at position i from where the receive began (x->base),
 * as the sender's msg_chunk_range lays them out. Reads only what the
 * receive does not change (not a->received); the messages before i fill
 * at most i chunks from x->base, so none reaches it. */
static uint8_t *chunk_ahead(void *ctx, uint64_t i, const uint8_t *head, size_t mlen)
{
	const struct conn_chunk_rx *x = ctx;
	return chunk_place(x, head, mlen, x->base + i * msg_chunk_max(WIRE_F32), 1);
}

/* A message whose values chunk_where or chunk_ahead placed: a float32
 * chunk of x's type is taken (the assembly refuses one at another offset
 * than where it went); anything else goes to chunk_deliver whole. */
static int chunk_took(void *ctx, uint64_t i, const uint8_t *msg, const uint8_t *body, size_t mlen,
		      char *err, size_t errlen)
{
	struct conn_chunk_rx *x = ctx;
	struct msg_chunk ch;
	(void)i;
	(void)body;
	if (msg[0] != x->type || msg[1] != WIRE_F32)
		return 1;
	x->bad = 1;
	int r = msg_decode_chunk_head(msg, mlen, &ch, err, errlen);
	return r < 0 ? r : chunk_take(x, &ch, mlen, 1, err, errlen);
}

int conn_take_chunk(struct conn *cn, struct conn_chunk_rx *x, size_t len, char *err,
		    size_t errlen)
{
	return chunk_deliver(x, 0, cn->rbuf, len, err, errlen);
}

int conn_recv_rest(struct conn *cn, struct conn_chunk_rx *x, char *err, size_t errlen)
{
	if (msg_assembly_done(x->a))
		return 0;
	if (!cn->rp)
		return err_set(err, errlen, -EINVAL, "no pipe on this connection");
	int r = conn_ready(cn, 0, err, errlen);
	const struct pipe_place pl = { { MSG_CHUNK_HDR_BYTES, chunk_where, x }, chunk_took,
				       chunk_ahead };
	x->base = x->a->received;
	return r ? r : pipe_recv_placed(cn->rp, conn_stream(cn), &cn->keys->recv,
					msg_chunks(x->a->n - x->a->received, x->a->dtype), &pl,
					chunk_deliver, x, cn->read_ms, err, errlen);
}
