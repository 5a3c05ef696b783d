/* Tests of net/conn.c over AF_UNIX socketpairs: both handshakes, the
 * state, one message each way, a tensor of several chunks (first chunk
 * taken by hand, the rest on the pipe, as the roles do), the same in bf16
 * (serial and on a pool; a float32 receiver refusing it), the idle
 * keep-alive, a wrong cluster key, conn_shutdown from another thread
 * ending a blocked read at once, a failed send closing the connection so
 * that nothing more is sealed on it, two senders on one connection each
 * encoding in a buffer of its own, and a connection shaped for short
 * messages refusing longer frames. Tensors in parts and a message between
 * chunks run sealed and local (FRAME_LOCAL, where the values are read
 * straight into the receiver's tensor). */
#include <criterion/criterion.h>

#include "leak.h"
#include "../base/err.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "../net/bf16.h"
#include "../net/conn.h"

static void setup(void)
{
	cr_assert(sodium_init() >= 0, "sodium_init failed");
}

TestSuite(conn, .init = setup, .fini = leak_check);

/* One side: its connection (which owns its buffers and pipes). */
struct side {
	struct conn cn;
	uint8_t psk[HS_PSK_BYTES];
	struct hs_identity me;
	int r;
	char err[512];
};

static void side_init(struct side *s, int fd, enum hs_role role, uint32_t index, uint8_t key,
		      struct cryptopool *pool)
{
	memset(s, 0, sizeof(*s));
	struct conn_shape shape = { .pipes = CONN_PIPE_ONE, .pool = pool };
	cr_assert_eq(conn_init(&s->cn, fd, &shape, 5000, 5000), 0);
	memset(s->psk, key, sizeof(s->psk));
	s->me.role = role;
	s->me.index = index;
	memset(s->me.config_hash, 7, sizeof(s->me.config_hash));
	s->me.ciphers = frame_offers();
}

static void side_free(struct side *s)
{
	conn_destroy(&s->cn);
}

static void *serve(void *arg)
{
	struct side *s = arg;
	s->r = conn_server(&s->cn, s->psk, &s->me, 5000, s->err, sizeof(s->err));
	if (s->r)
		conn_close(&s->cn); /* a refused peer sees the connection end */
	return NULL;
}

/* Connects a client (worker 3, key byte ck) to a server (ps 1, key sk),
 * their pipes on pool (NULL: one frame at a time), their frames local
 * (FRAME_LOCAL, as a worker and its ps on one host) or sealed. */
static void pair_with(struct side *cl, struct side *sv, uint8_t ck, uint8_t sk,
		      struct cryptopool *pool, int local)
{
	int sp[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	side_init(sv, sp[1], HS_PS, 1, sk, pool);
	side_init(cl, -1, HS_WORKER, 3, ck, pool);
	cl->me.to = 1;
	cl->me.local = sv->me.local = local;
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, serve, sv), 0);
	cl->r = conn_client(&cl->cn, sp[0], cl->psk, &cl->me, 5000, "ps 1 (test)", cl->err,
			    sizeof(cl->err));
	pthread_join(t, NULL);
	cr_assert(cl->r || (cl->cn.keys->recv.cipher == FRAME_LOCAL) == local);
}

/* Whether sv's receives put chunks' values straight into the tensor:
 * local frames, and AEGIS-256 ones opened without a pool. */
static int placing(const struct side *sv)
{
	enum frame_cipher c = sv->cn.keys->recv.cipher;
	return c == FRAME_LOCAL || c == FRAME_AEGIS256;
}

static void pair_on(struct side *cl, struct side *sv, uint8_t ck, uint8_t sk, struct cryptopool *pool)
{
	pair_with(cl, sv, ck, sk, pool, 0);
}

static void pair(struct side *cl, struct side *sv, uint8_t ck, uint8_t sk)
{
	pair_on(cl, sv, ck, sk, NULL);
}

struct sendarg {
	struct side *s;
	struct conn_chunk_tx *t;
	int r;
};

static void *send_tensor_main(void *arg)
{
	struct sendarg *a = arg;
	char e[256];
	a->r = conn_send_tensor(&a->s->cn, CONN_MAIN, a->t, e, sizeof(e));
	return NULL;
}

Test(conn, handshake_and_one_message_each_way)
{
	struct side cl, sv;
	size_t len;
	char e[256];
	/* Nothing flows before the handshake. */
	struct conn idle;
	cr_assert_eq(conn_init(&idle, -1, NULL, 100, 100), 0);
	cr_assert_eq(idle.state, CONN_PENDING);
	cr_assert_eq(conn_send_payload(&idle, CONN_MAIN, 1, e, sizeof(e)), -ENOTCONN);
	conn_destroy(&idle);

	pair(&cl, &sv, 5, 5);
	cr_assert_eq(sv.r, 0, "%s", sv.err);
	cr_assert_eq(cl.r, 0, "%s", cl.err);
	cr_assert_eq(cl.cn.state, CONN_AUTHENTICATED);
	cr_assert_eq(sv.cn.state, CONN_AUTHENTICATED);
	cr_assert_eq(sv.cn.hr.peer.role, HS_WORKER);
	cr_assert_eq(sv.cn.hr.peer.index, 3);
	cr_assert_eq(cl.cn.hr.peer.role, HS_PS);
	cr_assert_eq(cl.cn.hr.peer.index, 1);

	struct msg_pull p = { .shard = 1, .version = 42 }, got;
	cr_assert_eq(msg_encode_pull(conn_payload(&cl.cn, CONN_MAIN), conn_payload_cap(&cl.cn), &p, &len,
				     e, sizeof(e)),
		     0);
	cr_assert_eq(conn_send_payload(&cl.cn, CONN_MAIN, len, e, sizeof(e)), 0, "%s", e);
	cr_assert_eq(conn_recv(&sv.cn, &len, e, sizeof(e)), 0, "%s", e);
	cr_assert_eq(msg_type(sv.cn.rbuf, len, e, sizeof(e)), WIRE_PULL);
	cr_assert_eq(msg_decode_pull(sv.cn.rbuf, len, &got, e, sizeof(e)), 0);
	cr_assert_eq(got.version, 42);

	conn_send_error(&sv.cn, CONN_MAIN, 7, "it went wrong");
	cr_assert_eq(conn_recv(&cl.cn, &len, e, sizeof(e)), 0, "%s", e);
	struct msg_error me;
	cr_assert_eq(msg_decode_error(cl.cn.rbuf, len, &me, e, sizeof(e)), 0);
	cr_assert_str_eq(me.text, "it went wrong");

	conn_close(&cl.cn);
	cr_assert_eq(cl.cn.state, CONN_PENDING);
	cr_assert_eq(cl.cn.fd, -1);
	cr_assert_neq(conn_recv(&sv.cn, &len, e, sizeof(e)), 0); /* the peer closed */
	side_free(&cl);
	side_free(&sv);
}

/* A tensor of three chunks, the way the roles receive one: the first
 * chunk read as a message, the rest on the pipe. */
Test(conn, tensor_in_chunks)
{
	struct side cl, sv;
	char e[256];
	size_t len;
	pair(&cl, &sv, 9, 9);
	cr_assert_eq(cl.r, 0, "%s", cl.err);
	uint64_t n = 2 * (uint64_t)MSG_CHUNK_FLOATS + 5;
	float *src = malloc(n * sizeof(float)), *dst = calloc(n, sizeof(float));
	cr_assert(src && dst);
	for (uint64_t i = 0; i < n; i++)
		src[i] = (float)i * 0.5f - 3.0f;
	struct conn_chunk_tx t = { .type = WIRE_PUSH, .shard = 1, .worker = 3, .version = 11,
				   .src = src, .n = n };
	/* The socketpair's buffer is smaller than the tensor: send from a
	 * thread. */
	pthread_t th;
	struct sendarg sa = { &cl, &t, -1 };
	cr_assert_eq(pthread_create(&th, NULL, send_tensor_main, &sa), 0);
	struct msg_assembly a;
	cr_assert_eq(msg_assembly_init(&a, WIRE_PUSH, 1, n, WIRE_F32, e, sizeof(e)), 0);
	struct conn_chunk_rx x = { .type = WIRE_PUSH, .worker = 3, .a = &a, .dst = dst };
	cr_assert_eq(conn_recv(&sv.cn, &len, e, sizeof(e)), 0, "%s", e);
	cr_assert_eq(conn_take_chunk(&sv.cn, &x, len, e, sizeof(e)), 0, "%s", e);
	cr_assert_eq(conn_recv_rest(&sv.cn, &x, e, sizeof(e)), 0, "%s", e);
	pthread_join(th, NULL);
	cr_assert_eq(sa.r, 0);
	cr_assert(msg_assembly_done(&a));
	cr_assert_eq(a.version, 11);
	cr_assert_eq(memcmp(src, dst, n * sizeof(float)), 0);
	free(src);
	free(dst);
	side_free(&cl);
	side_free(&sv);
}

/* What the receiver's per-chunk hook saw. */
struct took_log {
	int calls;
	uint64_t offsets[8];
	int fail_at; /* the call that fails, -1: none */
	const float *dst;
	int in_place; /* every chunk's values were in dst when the hook ran */
};

static int took_note(void *ctx, const struct msg_chunk *c, char *err, size_t errlen)
{
	struct took_log *l = ctx;
	if (l->calls < 8)
		l->offsets[l->calls] = c->offset;
	l->in_place &= l->dst[c->offset + c->count - 1] == (float)(c->offset + c->count - 1) * 0.25f;
	if (l->calls++ == l->fail_at)
		return err_set(err, errlen, -EDOM, "hook refused chunk at %llu",
			       (unsigned long long)c->offset);
	return 0;
}

struct parts_arg {
	struct side *s;
	const float *src;
	uint64_t n;
	int r;
	int heartbeat; /* a HEARTBEAT between the parts */
};

/* The tensor as a ps streams it: its first chunk, then (with heartbeat,
 * a HEARTBEAT while the next piece is not ready) the rest, each call with
 * the offset where its part starts. */
static void *send_parts_main(void *arg)
{
	struct parts_arg *a = arg;
	char e[256];
	size_t len;
	struct conn_chunk_tx t = { .type = WIRE_PARAMS, .shard = 2, .version = 5, .src = a->src,
				   .n = MSG_CHUNK_FLOATS };
	struct msg_heartbeat hb = { .version = 4 };
	a->r = conn_send_tensor(&a->s->cn, CONN_MAIN, &t, e, sizeof(e));
	if (!a->r && a->heartbeat)
		a->r = msg_encode_heartbeat(conn_payload(&a->s->cn, CONN_MAIN), conn_payload_cap(&a->s->cn),
					    &hb, &len, e, sizeof(e));
	if (!a->r && a->heartbeat)
		a->r = conn_send_payload(&a->s->cn, CONN_MAIN, len, e, sizeof(e));
	t.src = a->src + MSG_CHUNK_FLOATS;
	t.n = a->n - MSG_CHUNK_FLOATS;
	t.offset = MSG_CHUNK_FLOATS;
	if (!a->r)
		a->r = conn_send_tensor(&a->s->cn, CONN_MAIN, &t, e, sizeof(e));
	return NULL;
}

/* A tensor sent in two parts (conn_chunk_tx.offset) arrives as one, and
 * the receiver's hook sees each chunk, in order, once its values are in
 * place; a hook that fails ends the receive as a bad message. */
Test(conn, tensor_in_parts_with_a_hook)
{
	for (int k = 0; k < 8; k++) {
		int fail = k & 1, local = (k >> 1) & 1, pooled = k >> 2;
		struct side cl, sv;
		char e[256] = "";
		size_t len;
		struct cryptopool *pool = NULL;
		if (pooled)
			cr_assert_eq(cryptopool_new(&pool, 3, e, sizeof e), 0, "%s", e);
		pair_with(&cl, &sv, 9, 9, pool, local);
		cr_assert_eq(cl.r, 0, "%s", cl.err);
		uint64_t n = 3 * (uint64_t)MSG_CHUNK_FLOATS + 9;
		float *src = malloc(n * sizeof(float)), *dst = calloc(n, sizeof(float));
		cr_assert(src && dst);
		for (uint64_t i = 0; i < n; i++)
			src[i] = (float)i * 0.25f;
		pthread_t th;
		struct parts_arg pa = { &cl, src, n, -1, 0 };
		cr_assert_eq(pthread_create(&th, NULL, send_parts_main, &pa), 0);
		struct msg_assembly a;
		struct took_log lg = { .fail_at = fail ? 2 : -1, .dst = dst, .in_place = 1 };
		cr_assert_eq(msg_assembly_init(&a, WIRE_PARAMS, 2, n, WIRE_F32, e, sizeof(e)), 0);
		struct conn_chunk_rx x = { .type = WIRE_PARAMS, .a = &a, .dst = dst, .took = took_note,
					   .ctx = &lg };
		cr_assert_eq(conn_recv(&sv.cn, &len, e, sizeof(e)), 0, "%s", e);
		cr_assert_eq(conn_take_chunk(&sv.cn, &x, len, e, sizeof(e)), 0, "%s", e);
		int r = conn_recv_rest(&sv.cn, &x, e, sizeof(e));
		if (fail) {
			cr_assert_eq(r, -EDOM);
			cr_assert(x.bad);
			cr_assert_str_eq(e, "hook refused chunk at 32768");
			cr_assert_eq(lg.calls, 3);
			conn_shutdown(&sv.cn);
		} else {
			cr_assert_eq(r, 0, "%s", e);
			cr_assert(msg_assembly_done(&a));
			cr_assert_eq(memcmp(src, dst, n * sizeof(float)), 0);
			cr_assert_eq(lg.calls, 4);
			for (int i = 0; i < 4; i++)
				cr_assert_eq(lg.offsets[i], (uint64_t)i * MSG_CHUNK_FLOATS);
			/* every chunk on the pipe read (local) or opened
			 * (AEGIS-256; on the pool by position) into place */
			cr_assert_eq(x.placed, placing(&sv) ? n - MSG_CHUNK_FLOATS : 0, "k %d: placed %llu",
				     k, (unsigned long long)x.placed);
		}
		cr_assert(lg.in_place);
		pthread_join(th, NULL);
		if (!fail) /* failing, it may have written all into the socket's buffer */
			cr_assert_eq(pa.r, 0, "sender: %d", pa.r);
		free(src);
		free(dst);
		side_free(&cl);
		side_free(&sv);
		cryptopool_destroy(pool);
	}
}

static int other_note(void *ctx, int type, const uint8_t *msg, size_t len, char *err, size_t errlen)
{
	struct msg_heartbeat hb;
	int *seen = ctx;
	if (type != WIRE_HEARTBEAT)
		return err_set(err, errlen, -EPROTO, "not a heartbeat");
	int r = msg_decode_heartbeat(msg, len, &hb, err, errlen);
	*seen += r == 0 && hb.version == 4;
	return r;
}

/* A message between the chunks of a tensor goes to the receiver's other
 * function; the receive that took it ends a chunk short, and the next
 * one completes the tensor. Without that function it is refused. */
Test(conn, message_between_chunks)
{
	for (int k = 0; k < 8; k++) {
		int with = k & 1, local = (k >> 1) & 1, pooled = k >> 2;
		struct side cl, sv;
		char e[256] = "";
		size_t len;
		struct cryptopool *pool = NULL;
		if (pooled)
			cr_assert_eq(cryptopool_new(&pool, 3, e, sizeof e), 0, "%s", e);
		pair_with(&cl, &sv, 9, 9, pool, local);
		cr_assert_eq(cl.r, 0, "%s", cl.err);
		uint64_t n = 3 * (uint64_t)MSG_CHUNK_FLOATS + 2;
		float *src = malloc(n * sizeof(float)), *dst = calloc(n, sizeof(float));
		cr_assert(src && dst);
		for (uint64_t i = 0; i < n; i++)
			src[i] = (float)i * 0.25f;
		pthread_t th;
		struct parts_arg pa = { &cl, src, n, -1, 1 };
		cr_assert_eq(pthread_create(&th, NULL, send_parts_main, &pa), 0);
		struct msg_assembly a;
		int seen = 0, calls = 0, r = 0;
		cr_assert_eq(msg_assembly_init(&a, WIRE_PARAMS, 2, n, WIRE_F32, e, sizeof(e)), 0);
		struct conn_chunk_rx x = { .type = WIRE_PARAMS, .a = &a, .dst = dst,
					   .other = with ? other_note : NULL, .ctx = &seen };
		cr_assert_eq(conn_recv(&sv.cn, &len, e, sizeof(e)), 0, "%s", e);
		cr_assert_eq(conn_take_chunk(&sv.cn, &x, len, e, sizeof(e)), 0, "%s", e);
		while (!msg_assembly_done(&a) && r == 0 && calls++ < 4)
			r = conn_recv_rest(&sv.cn, &x, e, sizeof(e));
		if (with) {
			cr_assert_eq(r, 0, "%s", e);
			cr_assert_eq(calls, 2, "receives: %d", calls);
			cr_assert_eq(seen, 1);
			cr_assert_eq(memcmp(src, dst, n * sizeof(float)), 0);
			/* the HEARTBEAT among the placed chunks was handed
			 * over whole; on a pool it moved the chunks after it
			 * off their positions, so that receive copied them
			 * (chunk_ahead), and the next one, a frame, placed the
			 * last 2 values one at a time */
			uint64_t want = !placing(&sv) ? 0 : pooled && !local ? 2 : n - MSG_CHUNK_FLOATS;
			cr_assert_eq(x.placed, want, "k %d: placed %llu", k, (unsigned long long)x.placed);
		} else {
			cr_assert_eq(r, -EPROTO);
			cr_assert(x.bad);
			cr_assert_str_eq(e, "unexpected HEARTBEAT message in a PARAMS tensor");
			conn_shutdown(&sv.cn);
		}
		pthread_join(th, NULL);
		free(src);
		free(dst);
		side_free(&cl);
		side_free(&sv);
		cryptopool_destroy(pool);
	}
}

/* Counts the frames a side's connection sent (its send counter). */
static uint64_t frames_sent(const struct side *s)
{
	return s->cn.keys->send.counter;
}

/* A bf16 tensor of several chunks, serially and with the frames sealed and
 * opened on pools of 3 threads: msg_chunks(n, WIRE_BF16) frames (as many
 * as in float32, each half the bytes), every element arriving as its bf16 rounding; and a
 * receiver that expects float32 refusing the first chunk, as bad. */
Test(conn, tensor_in_chunks_bf16)
{
	for (int pooled = 0; pooled < 2; pooled++) {
		struct side cl, sv;
		char e[256];
		size_t len;
		struct cryptopool *pool = NULL;
		if (pooled)
			cr_assert_eq(cryptopool_new(&pool, 3, e, sizeof e), 0, "%s", e);
		pair_on(&cl, &sv, 9, 9, pool);
		cr_assert_eq(cl.r, 0, "%s", cl.err);
		/* 41 chunks in either dtype, more than a socket's buffer holds */
		uint64_t n = 40 * (uint64_t)MSG_CHUNK_FLOATS + 7;
		float *src = malloc(n * sizeof(float)), *dst = calloc(n, sizeof(float));
		cr_assert(src && dst);
		for (uint64_t i = 0; i < n; i++)
			src[i] = ((float)(i % 1000) - 500.0f) * 1.001f + (float)i * 1e-3f;
		struct conn_chunk_tx t = { .type = WIRE_PUSH, .dtype = WIRE_BF16, .shard = 1,
					   .worker = 3, .version = 11, .src = src, .n = n };
		cr_assert_eq(msg_chunks(n, WIRE_BF16), 41);
		uint64_t c0 = frames_sent(&cl);
		pthread_t th;
		struct sendarg sa = { &cl, &t, -1 };
		cr_assert_eq(pthread_create(&th, NULL, send_tensor_main, &sa), 0);
		struct msg_assembly a;
		cr_assert_eq(msg_assembly_init(&a, WIRE_PUSH, 1, n, WIRE_BF16, e, sizeof(e)), 0);
		struct conn_chunk_rx x = { .type = WIRE_PUSH, .worker = 3, .a = &a, .dst = dst };
		cr_assert_eq(conn_recv(&sv.cn, &len, e, sizeof(e)), 0, "%s", e);
		cr_assert_eq(len, MSG_CHUNK_BYTES(msg_chunk_max(WIRE_BF16), WIRE_BF16));
		cr_assert_eq(conn_take_chunk(&sv.cn, &x, len, e, sizeof(e)), 0, "%s", e);
		cr_assert_eq(conn_recv_rest(&sv.cn, &x, e, sizeof(e)), 0, "%s", e);
		pthread_join(th, NULL);
		cr_assert_eq(sa.r, 0);
		cr_assert(msg_assembly_done(&a));
		cr_assert_eq(frames_sent(&cl) - c0, 41, "%s: frames", pooled ? "pooled" : "serial");
		for (uint64_t i = 0; i < n; i++) {
			uint32_t u, v;
			memcpy(&u, &src[i], 4);
			memcpy(&v, &dst[i], 4);
			cr_assert_eq(v, (uint32_t)bf16_round(u) << 16, "element %llu: %a for %a",
				     (unsigned long long)i, (double)dst[i], (double)src[i]);
		}

		/* The same tensor to a receiver that expects float32. */
		sa.r = -1;
		cr_assert_eq(pthread_create(&th, NULL, send_tensor_main, &sa), 0);
		cr_assert_eq(msg_assembly_init(&a, WIRE_PUSH, 1, n, WIRE_F32, e, sizeof(e)), 0);
		x = (struct conn_chunk_rx){ .type = WIRE_PUSH, .worker = 3, .a = &a, .dst = dst };
		cr_assert_eq(conn_recv(&sv.cn, &len, e, sizeof(e)), 0, "%s", e);
		cr_assert_eq(conn_take_chunk(&sv.cn, &x, len, e, sizeof(e)), -EPROTO);
		cr_assert(x.bad);
		cr_assert(strstr(e, "PUSH: chunk in bf16, but this side expects fp32"), "%s", e);
		conn_close(&sv.cn); /* as a ps does: the sender's write fails */
		pthread_join(th, NULL);
		cr_assert_neq(sa.r, 0);
		free(src);
		free(dst);
		side_free(&cl);
		side_free(&sv);
		cryptopool_destroy(pool);
	}
}

Test(conn, wrong_key_is_refused_on_both_sides)
{
	struct side cl, sv;
	pair(&cl, &sv, 5, 6);
	cr_assert_neq(sv.r, 0);
	cr_assert(strstr(sv.err, "handshake refused"), "%s", sv.err);
	cr_assert_eq(cl.r, -ENOLINK, "%d %s", cl.r, cl.err);
	cr_assert(strstr(cl.err, "ps 1 (test): handshake: ") && strstr(cl.err, "no answer to our greeting"),
		  "%s", cl.err);
	cr_assert_eq(cl.cn.state, CONN_PENDING);
	side_free(&cl);
	side_free(&sv);
}

/* The keep-alive goes out only on a connection idle that long. */
Test(conn, send_idle)
{
	struct side cl, sv;
	char e[256];
	size_t len;
	pair(&cl, &sv, 5, 5);
	cr_assert_eq(cl.r, 0, "%s", cl.err);
	uint8_t msg[CONN_IDLE_MAX + 1];
	struct msg_heartbeat hb;
	memset(&hb, 0, sizeof(hb));
	cr_assert_eq(msg_encode_heartbeat(msg, sizeof(msg), &hb, &len, e, sizeof(e)), 0);
	cr_assert_eq(conn_send_idle(&cl.cn, msg, len, 60, e, sizeof(e)), 0); /* just connected */
	cr_assert_eq(conn_send_idle(&cl.cn, msg, sizeof(msg), 0, e, sizeof(e)), -EMSGSIZE);
	cr_assert_eq(conn_send_idle(&cl.cn, msg, len, 0, e, sizeof(e)), 1);
	cr_assert_eq(conn_recv(&sv.cn, &len, e, sizeof(e)), 0, "%s", e);
	cr_assert_eq(msg_type(sv.cn.rbuf, len, e, sizeof(e)), WIRE_HEARTBEAT);
	side_free(&cl);
	side_free(&sv);
}

static void *shut_main(void *arg)
{
	struct timespec t = { 0, 100 * 1000000L };
	nanosleep(&t, NULL);
	conn_shutdown(arg);
	return NULL;
}

/* conn_shutdown from another thread ends a read that would wait 5 s. */
Test(conn, shutdown_ends_a_blocked_read)
{
	struct side cl, sv;
	char e[256];
	size_t len;
	pair(&cl, &sv, 5, 5);
	cr_assert_eq(cl.r, 0, "%s", cl.err);
	pthread_t th;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	cr_assert_eq(pthread_create(&th, NULL, shut_main, &sv.cn), 0);
	cr_assert_neq(conn_recv(&sv.cn, &len, e, sizeof(e)), 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	pthread_join(th, NULL);
	cr_assert_lt((double)(t1.tv_sec - t0.tv_sec), 4.0);
	cr_assert_eq(sv.cn.state, CONN_CLOSING);
	cr_assert_eq(conn_send_payload(&sv.cn, CONN_MAIN, 1, e, sizeof(e)), -ESHUTDOWN);
	side_free(&cl);
	side_free(&sv);
}

/* A send that fails part way (here a tensor's write times out on a peer
 * that reads nothing) leaves the connection closing: the ERROR another
 * thread would send next is not sealed, so no frame can reuse the nonce
 * of one cut short on the wire, and nothing more reaches the peer. */
Test(conn, failed_send_closes_the_connection)
{
	struct side cl, sv;
	char e[256];
	pair(&cl, &sv, 5, 5);
	cr_assert_eq(cl.r, 0, "%s", cl.err);
	int sb = 100000;
	cr_assert_eq(setsockopt(cl.cn.fd, SOL_SOCKET, SO_SNDBUF, &sb, sizeof(sb)), 0);
	cl.cn.write_ms = 200;
	uint64_t n = 16 * (uint64_t)MSG_CHUNK_FLOATS;
	float *src = calloc(n, sizeof(float));
	cr_assert_not_null(src);
	struct conn_chunk_tx t = { .type = WIRE_PUSH, .shard = 1, .worker = 3, .version = 1,
				   .src = src, .n = n };
	cr_assert_eq(conn_send_tensor(&cl.cn, CONN_MAIN, &t, e, sizeof(e)), -ETIMEDOUT, "%s", e);
	cr_assert_eq(cl.cn.state, CONN_CLOSING);
	/* Empty the peer's side so that a frame would fit again. */
	uint8_t *sink = malloc(FRAME_BYTES_MAX);
	cr_assert_not_null(sink);
	while (recv(sv.cn.fd, sink, FRAME_BYTES_MAX, MSG_DONTWAIT) > 0)
		;
	uint64_t counter = cl.cn.keys->send.counter;
	conn_send_error(&cl.cn, CONN_MAIN, EIO, "after a failed send");
	cr_assert_eq(conn_send_payload(&cl.cn, CONN_MAIN, 1, e, sizeof(e)), -ESHUTDOWN);
	cr_assert_eq(cl.cn.keys->send.counter, counter, "a frame was sealed after the failure");
	struct timespec w = { 0, 50 * 1000000L };
	nanosleep(&w, NULL);
	cr_assert_lt(recv(sv.cn.fd, sink, FRAME_BYTES_MAX, MSG_DONTWAIT), 0,
		     "bytes reached the peer after the failed send");
	/* What the peer says still arrives: why it went, say. */
	size_t len;
	conn_send_error(&sv.cn, CONN_MAIN, EPERM, "refused");
	cr_assert_eq(conn_recv(&cl.cn, &len, e, sizeof(e)), 0, "%s", e);
	cr_assert_eq(msg_type(cl.cn.rbuf, len, e, sizeof(e)), WIRE_ERROR);
	free(sink);
	free(src);
	side_free(&cl);
	side_free(&sv);
}

struct side_arg {
	struct side *s;
	const float *src;
	uint64_t n;
	int r;
};

/* The streamer's part on a CONN_PIPE_SIDE connection: a HEARTBEAT and a
 * tensor, both as CONN_SIDE, encoded in its own buffer. */
static void *side_send_main(void *arg)
{
	struct side_arg *a = arg;
	char e[256];
	size_t len;
	struct msg_heartbeat hb = { .version = 4 };
	a->r = msg_encode_heartbeat(conn_payload(&a->s->cn, CONN_SIDE), conn_payload_cap(&a->s->cn),
				    &hb, &len, e, sizeof(e));
	if (!a->r)
		a->r = conn_send_payload(&a->s->cn, CONN_SIDE, len, e, sizeof(e));
	struct conn_chunk_tx t = { .type = WIRE_PARAMS, .shard = 1, .version = 5, .src = a->src,
				   .n = a->n };
	if (!a->r)
		a->r = conn_send_tensor(&a->s->cn, CONN_SIDE, &t, e, sizeof(e));
	return NULL;
}

/* Two threads send on one connection, each from a buffer of its own: a
 * message CONN_MAIN encoded before CONN_SIDE encoded and sent its own
 * (and a tensor) is still whole when CONN_MAIN sends it. */
Test(conn, two_senders_each_with_a_buffer_of_its_own)
{
	struct side cl, sv;
	char e[256];
	size_t len;
	int sp[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	/* The ps's shape: CONN_SIDE beside the owner; a worker's at the other
	 * end. Both with the same all-zero keys: the handshake is not what is
	 * under test. */
	struct conn_shape ps_shape = { .pipes = CONN_PIPE_SIDE },
			  w_shape = { .pipes = CONN_PIPE_RECV };
	cr_assert_eq(conn_init(&sv.cn, -1, &ps_shape, 5000, 5000), 0);
	cr_assert_eq(conn_init(&cl.cn, -1, &w_shape, 5000, 5000), 0);
	struct hs_result hr;
	memset(&hr, 0, sizeof(hr));
	hr.send.cipher = hr.recv.cipher = FRAME_CHACHA20POLY1305;
	conn_attach(&sv.cn, sp[1], &hr);
	conn_attach(&cl.cn, sp[0], &hr);
	cr_assert_neq(conn_payload(&sv.cn, CONN_SIDE), conn_payload(&sv.cn, CONN_MAIN));
	cr_assert_null(conn_payload(&cl.cn, CONN_SIDE), "a connection without CONN_SIDE");

	struct msg_status q = { .reply = 1, .shard = 1, .version = 77 };
	cr_assert_eq(msg_encode_status(conn_payload(&sv.cn, CONN_MAIN), conn_payload_cap(&sv.cn), &q,
				       &len, e, sizeof(e)),
		     0, "%s", e);
	uint64_t n = 2 * (uint64_t)MSG_CHUNK_FLOATS + 3;
	float *src = malloc(n * sizeof(float)), *dst = calloc(n, sizeof(float));
	cr_assert(src && dst);
	for (uint64_t i = 0; i < n; i++)
		src[i] = (float)i - 7.0f;
	struct side_arg sa = { &sv, src, n, -1 };
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, side_send_main, &sa), 0);
	size_t hlen;
	cr_assert_eq(conn_recv(&cl.cn, &hlen, e, sizeof(e)), 0, "%s", e);
	cr_assert_eq(msg_type(cl.cn.rbuf, hlen, e, sizeof(e)), WIRE_HEARTBEAT);
	struct msg_assembly a;
	cr_assert_eq(msg_assembly_init(&a, WIRE_PARAMS, 1, n, WIRE_F32, e, sizeof(e)), 0);
	struct conn_chunk_rx x = { .type = WIRE_PARAMS, .a = &a, .dst = dst };
	cr_assert_eq(conn_recv(&cl.cn, &hlen, e, sizeof(e)), 0, "%s", e);
	cr_assert_eq(conn_take_chunk(&cl.cn, &x, hlen, e, sizeof(e)), 0, "%s", e);
	cr_assert_eq(conn_recv_rest(&cl.cn, &x, e, sizeof(e)), 0, "%s", e);
	pthread_join(th, NULL);
	cr_assert_eq(sa.r, 0);
	cr_assert_eq(memcmp(src, dst, n * sizeof(float)), 0);

	cr_assert_eq(conn_send_payload(&sv.cn, CONN_MAIN, len, e, sizeof(e)), 0, "%s", e);
	struct msg_status got;
	cr_assert_eq(conn_recv(&cl.cn, &len, e, sizeof(e)), 0, "%s", e);
	cr_assert_eq(msg_decode_status(cl.cn.rbuf, len, &got, e, sizeof(e)), 0, "%s", e);
	cr_assert_eq(got.version, 77, "CONN_MAIN's message was overwritten");
	/* A sender the connection has not. */
	cr_assert_eq(conn_send_payload(&cl.cn, CONN_SIDE, 1, e, sizeof(e)), -EINVAL);
	free(src);
	free(dst);
	side_free(&cl);
	side_free(&sv);
}

/* A connection shaped for short messages (an observer's) refuses a
 * longer frame unread, offers only that much to encode into, and has no
 * pipe for a tensor. */
Test(conn, a_small_shape_refuses_longer_frames)
{
	char e[256];
	size_t len;
	int sp[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	struct conn small, big;
	struct conn_shape shape = { .msg_max = 64 };
	cr_assert_eq(conn_init(&small, -1, &shape, 5000, 5000), 0);
	cr_assert_eq(conn_init(&big, -1, NULL, 5000, 5000), 0);
	cr_assert_eq(conn_payload_cap(&small), 64);
	cr_assert_eq(conn_payload_cap(&big), CONN_MSG_MAX);
	struct hs_result hr;
	memset(&hr, 0, sizeof(hr));
	hr.send.cipher = hr.recv.cipher = FRAME_CHACHA20POLY1305;
	conn_attach(&small, sp[0], &hr);
	conn_attach(&big, sp[1], &hr);
	memset(conn_payload(&big, CONN_MAIN), 0, 65);
	cr_assert_eq(conn_send_payload(&big, CONN_MAIN, 64, e, sizeof(e)), 0, "%s", e);
	cr_assert_eq(conn_recv(&small, &len, e, sizeof(e)), 0, "%s", e);
	cr_assert_eq(len, 64);
	cr_assert_eq(conn_send_payload(&big, CONN_MAIN, 65, e, sizeof(e)), 0, "%s", e);
	cr_assert_eq(conn_recv(&small, &len, e, sizeof(e)), -ENOBUFS, "%s", e);
	float v = 1;
	struct conn_chunk_tx t = { .type = WIRE_PUSH, .shard = 1, .src = &v, .n = 1 };
	cr_assert_eq(conn_send_tensor(&small, CONN_MAIN, &t, e, sizeof(e)), -EINVAL);
	conn_destroy(&small);
	conn_destroy(&big);
}
