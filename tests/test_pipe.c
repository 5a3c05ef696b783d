/* Tests of net/pipe.c and net/cryptopool.c: multi-MiB tensors round-trip
 * bit-exactly over a real socket with 1, 2 and 4 crypto threads and chunk
 * counts that are not multiples of the thread count; the bytes a parallel
 * sender writes are exactly those of sealing one frame at a time; and a
 * receiver with 4 threads refuses a bit flip in a middle chunk, a replayed
 * frame, two swapped frames, a truncated stream and an oversized length,
 * naming the failure and delivering no chunk from the bad one on. Sockets
 * are AF_UNIX socketpairs (the same stream semantics sock.c relies on);
 * every blocking call has a deadline. Last, a 2 ps + 2 worker cluster ends
 * with the same parameters whatever crypto_threads each node uses. */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "../core/config/config.h"
#include "../net/handshake.h"
#include "../net/key.h"

#include "../net/cryptopool.h"
#include "../net/frame.h"
#include "../net/msg.h"
#include "../net/pipe.h"
#include "../net/sock.h"

#define IO_MS 10000

static void init(void)
{
	cr_assert_geq(sodium_init(), 0);
}

TestSuite(pipe, .init = init, .fini = leak_check, .timeout = 60);

/* ---- helpers ------------------------------------------------------------ */

/* A tensor of N floats whose bits depend on the index and a seed. */
static float *tensor_new(size_t N, uint32_t seed)
{
	float *t = malloc(N * sizeof(float));
	cr_assert_not_null(t);
	for (size_t i = 0; i < N; i++) {
		uint32_t u = (uint32_t)i * 2654435761u ^ seed;
		memcpy(&t[i], &u, sizeof u);
		if (t[i] != t[i]) /* keep NaN patterns out: compare with memcmp anyway */
			t[i] = (float)i;
	}
	return t;
}

/* Keys of cipher c, or (local 0) the cipher two ends of this CPU
 * negotiate, as production seals. */
static void keys_of(struct frame_key *tx, struct frame_key *rx, uint64_t counter, int local)
{
	uint8_t k[FRAME_KEY_BYTES];
	randombytes_buf(k, sizeof k);
	enum frame_cipher c = local ? FRAME_LOCAL : frame_cipher_choose(frame_offers(), frame_offers());
	cr_assert_eq(frame_key_init(tx, k, c), 0);
	cr_assert_eq(frame_key_init(rx, k, c), 0);
	tx->counter = rx->counter = counter;
	sodium_memzero(k, sizeof k);
}

static void keys(struct frame_key *tx, struct frame_key *rx, uint64_t counter)
{
	keys_of(tx, rx, counter, 0);
}

static void pair(int sv[2])
{
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
}

struct tensor_tx {
	const float *src;
	uint64_t n;
};

static int encode(void *ctx, uint64_t i, uint8_t *msg, size_t cap, struct pipe_msg *m, char *err,
		  size_t errlen)
{
	const struct tensor_tx *t = ctx;
	struct msg_chunk ch = { .type = WIRE_PUSH, .shard = 0, .version = 7, .worker = 1 };
	msg_chunk_range(t->n, WIRE_F32, i, &ch.offset, &ch.count);
	return msg_encode_chunk_parts(msg, cap, &ch, t->src + ch.offset, &m->len, &m->body, &m->blen, err,
				      errlen);
}

/* Checks that chunks arrive in order and places them. */
struct tensor_rx {
	struct msg_assembly a;
	float *dst;
	uint64_t delivered; /* chunks handed to us */
	uint64_t placed;    /* of them, read straight into dst (pipe_place) */
	int order_ok;
};

static int deliver(void *ctx, uint64_t i, const uint8_t *msg, size_t len, char *err,
		   size_t errlen)
{
	struct tensor_rx *x = ctx;
	if (i != x->delivered)
		x->order_ok = 0;
	x->delivered++;
	struct msg_chunk ch;
	int r = msg_decode_chunk(msg, len, &ch, err, errlen);
	if (r < 0)
		return r;
	r = msg_assembly_add(&x->a, &ch, x->dst, err, errlen);
	return r < 0 ? r : 0;
}

/* The receiver's pipe_place: a local frame's values straight into dst,
 * after the floats received. */
static uint8_t *rx_where(void *ctx, const uint8_t *head, size_t mlen)
{
	(void)head;
	struct tensor_rx *x = ctx;
	size_t b = mlen - MSG_CHUNK_HDR_BYTES;
	if (b % sizeof(float) || b / sizeof(float) > x->a.n - x->a.received)
		return NULL;
	return (uint8_t *)(x->dst + x->a.received);
}

/* The same for frames opened on a pool: chunk i of the tensor goes at
 * its place if it is that whole chunk (the receive starts at 0). */
static uint8_t *rx_ahead(void *ctx, uint64_t i, const uint8_t *head, size_t mlen)
{
	(void)head;
	struct tensor_rx *x = ctx;
	uint64_t at = i * MSG_CHUNK_FLOATS, left = at < x->a.n ? x->a.n - at : 0;
	uint64_t count = left < MSG_CHUNK_FLOATS ? left : MSG_CHUNK_FLOATS;
	if (!count || mlen != MSG_CHUNK_HDR_BYTES + count * sizeof(float))
		return NULL;
	return (uint8_t *)(x->dst + at);
}

static int rx_took(void *ctx, uint64_t i, const uint8_t *msg, const uint8_t *body, size_t mlen,
		   char *err, size_t errlen)
{
	struct tensor_rx *x = ctx;
	struct msg_chunk ch;
	cr_assert_eq(body, (const uint8_t *)(x->dst + x->a.received));
	if (i != x->delivered)
		x->order_ok = 0;
	x->delivered++;
	x->placed++;
	int r = msg_decode_chunk_head(msg, mlen, &ch, err, errlen);
	if (r == 0)
		r = msg_assembly_add(&x->a, &ch, NULL, err, errlen);
	return r < 0 ? r : 0;
}

static void rx_init(struct tensor_rx *x, uint64_t n)
{
	char e[256];
	memset(x, 0, sizeof *x);
	x->order_ok = 1;
	x->dst = calloc(n, sizeof(float));
	cr_assert_not_null(x->dst);
	cr_assert_eq(msg_assembly_init(&x->a, WIRE_PUSH, 0, n, WIRE_F32, e, sizeof e), 0, "%s", e);
}

static struct cryptopool *pool_of(int threads)
{
	struct cryptopool *p = NULL;
	char e[256];
	if (threads <= 0)
		return NULL;
	cr_assert_eq(cryptopool_new(&p, threads, e, sizeof e), 0, "%s", e);
	cr_assert_eq(cryptopool_size(p), threads);
	return p;
}

/* The sending side on its own thread: pipe_send of a tensor, or raw bytes. */
struct sender {
	int fd;
	int threads;
	struct frame_key tx;
	struct tensor_tx t;
	const uint8_t *raw; /* if set: write these bytes instead, then shut down */
	size_t rawlen;
	int rc;
	char err[320];
};

static void *sender_main(void *arg)
{
	struct sender *s = arg;
	if (s->raw) {
		s->rc = sock_write_full(s->fd, s->raw, s->rawlen, IO_MS, s->err, sizeof s->err);
		shutdown(s->fd, SHUT_WR);
		return NULL;
	}
	struct cryptopool *pool = pool_of(s->threads);
	uint8_t *buf = malloc(FRAME_BYTES_MAX);
	struct pipe p;
	s->rc = -ENOMEM;
	if (buf && pipe_init(&p, pool, buf, FRAME_BYTES_MAX, s->err, sizeof s->err) == 0) {
		s->rc = pipe_send(&p, SOCK_FD(s->fd), &s->tx, msg_chunks(s->t.n, WIRE_F32), encode, &s->t, IO_MS,
				  s->err, sizeof s->err);
		pipe_free(&p);
	}
	free(buf);
	cryptopool_destroy(pool);
	return NULL;
}

/* Receives n floats with pipe_recv on `threads` crypto threads (0: no
 * pool), local frames' values placed (rx_where) or not. */
static int receive_placed(int fd, int threads, struct frame_key *rx, struct tensor_rx *x,
			  int placed, char *e, size_t elen)
{
	const struct pipe_place pl = { { MSG_CHUNK_HDR_BYTES, rx_where, x }, rx_took, rx_ahead };
	struct cryptopool *pool = pool_of(threads);
	uint8_t *buf = malloc(FRAME_BYTES_MAX);
	cr_assert_not_null(buf);
	struct pipe p;
	cr_assert_eq(pipe_init(&p, pool, buf, FRAME_BYTES_MAX, e, elen), 0, "%s", e);
	int r = pipe_recv_placed(&p, SOCK_FD(fd), rx, msg_chunks(x->a.n, WIRE_F32), placed ? &pl : NULL,
				 deliver, x, IO_MS, e, elen);
	pipe_free(&p);
	free(buf);
	cryptopool_destroy(pool);
	return r;
}

static int receive(int fd, int threads, struct frame_key *rx, struct tensor_rx *x, char *e,
		   size_t elen)
{
	return receive_placed(fd, threads, rx, x, 0, e, elen);
}

/* ---- round trips -------------------------------------------------------- */

/* One tensor of n floats from a sender with tthreads to a receiver with
 * rthreads, starting at counter c0; bit-exact, in order, counters advanced. */
static void round_trip(uint64_t n, int tthreads, int rthreads, uint64_t c0)
{
	int sv[2];
	pair(sv);
	float *src = tensor_new(n, (uint32_t)(n + (uint64_t)tthreads * 31 + (uint64_t)rthreads));
	struct sender s = { .fd = sv[0], .threads = tthreads, .t = { .src = src, .n = n } };
	struct frame_key rx;
	keys(&s.tx, &rx, c0);
	struct tensor_rx x;
	rx_init(&x, n);
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, sender_main, &s), 0);
	char e[320] = "";
	int r = receive(sv[1], rthreads, &rx, &x, e, sizeof e);
	pthread_join(th, NULL);
	cr_assert_eq(s.rc, 0, "send (%d threads): %s", tthreads, s.err);
	cr_assert_eq(r, 0, "recv (%d threads): %s", rthreads, e);
	cr_assert(x.order_ok, "chunks delivered out of order");
	cr_assert_eq(x.delivered, msg_chunks(n, WIRE_F32));
	cr_assert(msg_assembly_done(&x.a));
	cr_assert_eq(memcmp(x.dst, src, n * sizeof(float)), 0,
		     "tensor of %llu floats changed (%d -> %d threads)", (unsigned long long)n,
		     tthreads, rthreads);
	cr_assert_eq(s.tx.counter, c0 + msg_chunks(n, WIRE_F32));
	cr_assert_eq(rx.counter, c0 + msg_chunks(n, WIRE_F32));
	free(src);
	free(x.dst);
	close(sv[0]);
	close(sv[1]);
}

Test(pipe, round_trip_1_2_4_threads)
{
	/* 7 and 5 chunks (6.x and 4.x MiB): multiples of neither 2 nor 4. */
	const uint64_t ns[] = { 6 * (uint64_t)MSG_CHUNK_FLOATS + 1234,
				5 * (uint64_t)MSG_CHUNK_FLOATS };
	const int threads[] = { 1, 2, 4 };
	for (int i = 0; i < 2; i++)
		for (int t = 0; t < 3; t++)
			round_trip(ns[i], threads[t], threads[t], 3);
}

/* Either side may run in parallel alone: the bytes are the same. */
Test(pipe, parallel_and_serial_sides_interoperate)
{
	uint64_t n = 9 * (uint64_t)MSG_CHUNK_FLOATS + 1;
	round_trip(n, 4, 0, 0);
	round_trip(n, 0, 4, 0);
	round_trip(n, 3, 2, 1000);
}

/* A single chunk and a small tensor go through the serial path. */
Test(pipe, single_chunk_and_small)
{
	round_trip(1, 4, 4, 0);
	round_trip(MSG_CHUNK_FLOATS, 4, 4, 5);
	round_trip(MSG_CHUNK_FLOATS + 1, 4, 4, 5); /* 2 chunks, the last of 1 float */
}

/* One pipe per side moves tensors of 2, 7, 3 and 9 chunks in turn: its
 * window grows with the longest tensor and keeps its buffers. */
static const uint64_t seq_chunks[] = { 2, 7, 3, 9 };
#define NSEQ (sizeof seq_chunks / sizeof seq_chunks[0])

struct seq_sender {
	int fd;
	struct frame_key tx;
	float *src[NSEQ];
	int rc;
	char err[320];
};

static uint64_t seq_n(size_t k)
{
	return (seq_chunks[k] - 1) * (uint64_t)MSG_CHUNK_FLOATS + 17 * (k + 1);
}

static void *seq_sender_main(void *arg)
{
	struct seq_sender *s = arg;
	struct cryptopool *pool = pool_of(4);
	uint8_t *buf = malloc(FRAME_BYTES_MAX);
	struct pipe p;
	s->rc = pipe_init(&p, pool, buf, FRAME_BYTES_MAX, s->err, sizeof s->err);
	for (size_t k = 0; k < NSEQ && s->rc == 0; k++) {
		struct tensor_tx t = { .src = s->src[k], .n = seq_n(k) };
		s->rc = pipe_send(&p, SOCK_FD(s->fd), &s->tx, msg_chunks(t.n, WIRE_F32), encode, &t, IO_MS, s->err,
				  sizeof s->err);
	}
	pipe_free(&p);
	free(buf);
	cryptopool_destroy(pool);
	return NULL;
}

Test(pipe, one_pipe_many_tensors)
{
	int sv[2];
	pair(sv);
	struct seq_sender s = { .fd = sv[0] };
	struct frame_key rx;
	keys(&s.tx, &rx, 0);
	for (size_t k = 0; k < NSEQ; k++)
		s.src[k] = tensor_new(seq_n(k), (uint32_t)k);
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, seq_sender_main, &s), 0);
	struct cryptopool *pool = pool_of(2);
	uint8_t *buf = malloc(FRAME_BYTES_MAX);
	struct pipe p;
	char e[320] = "";
	cr_assert_eq(pipe_init(&p, pool, buf, FRAME_BYTES_MAX, e, sizeof e), 0, "%s", e);
	uint64_t frames = 0;
	for (size_t k = 0; k < NSEQ; k++) {
		struct tensor_rx x;
		rx_init(&x, seq_n(k));
		cr_assert_eq(msg_chunks(seq_n(k), WIRE_F32), seq_chunks[k]);
		int r = pipe_recv(&p, SOCK_FD(sv[1]), &rx, seq_chunks[k], deliver, &x, IO_MS, e, sizeof e);
		cr_assert_eq(r, 0, "tensor %zu: %s", k, e);
		cr_assert(msg_assembly_done(&x.a));
		cr_assert_eq(memcmp(x.dst, s.src[k], seq_n(k) * sizeof(float)), 0, "tensor %zu", k);
		cr_assert_leq(p.nslots, 3, "a 2-thread pipe keeps at most 3 frames");
		frames += seq_chunks[k];
		cr_assert_eq(rx.counter, frames);
		free(x.dst);
	}
	pthread_join(th, NULL);
	cr_assert_eq(s.rc, 0, "%s", s.err);
	pipe_free(&p);
	free(buf);
	cryptopool_destroy(pool);
	for (size_t k = 0; k < NSEQ; k++)
		free(s.src[k]);
	close(sv[0]);
	close(sv[1]);
}

/* ---- bytes on the wire -------------------------------------------------- */

/* The frames of a tensor sealed one at a time (what sock_write_frame
 * writes), concatenated. Sets *len. */
static uint8_t *serial_frames(const float *src, uint64_t n, struct frame_key k, size_t *len,
			      size_t *off /* (chunks + 1) frame starts */)
{
	uint64_t C = msg_chunks(n, WIRE_F32);
	uint8_t *out = malloc(C * FRAME_BYTES_MAX), *msg = malloc(FRAME_MAX);
	cr_assert(out && msg);
	struct tensor_tx t = { .src = src, .n = n };
	char e[256];
	size_t at = 0;
	for (uint64_t i = 0; i < C; i++) {
		size_t ml = 0, fl = 0;
		struct msg_chunk ch = { .type = WIRE_PUSH, .shard = 0, .version = 7, .worker = 1 };
		msg_chunk_range(t.n, WIRE_F32, i, &ch.offset, &ch.count);
		cr_assert_eq(msg_encode_chunk(msg, FRAME_MAX, &ch, t.src + ch.offset, &ml, e, sizeof e), 0, "%s", e);
		cr_assert_eq(frame_seal(&k, out + at, FRAME_BYTES_MAX, msg, ml, &fl, e, sizeof e), 0,
			     "%s", e);
		if (off)
			off[i] = at;
		at += fl;
	}
	if (off)
		off[C] = at;
	free(msg);
	*len = at;
	return out;
}

struct drain {
	int fd;
	uint8_t *buf;
	size_t cap, got;
};

static void *drain_main(void *arg)
{
	struct drain *d = arg;
	for (;;) {
		ssize_t r = recv(d->fd, d->buf + d->got, d->cap - d->got, 0);
		if (r <= 0)
			break;
		d->got += (size_t)r;
	}
	return NULL;
}

/* Frames sealed from the tensor where it is (the header in the frame
 * buffer, the values read in place: AEGIS-256 from two parts, a local
 * socket's frames written from three) are byte for byte those of a
 * message copied whole and sealed one at a time, with every cipher, from
 * one thread or from a pool of 4. */
Test(pipe, parallel_sender_writes_the_serial_bytes)
{
	uint64_t n = 7 * (uint64_t)MSG_CHUNK_FLOATS + 99;
	float *src = tensor_new(n, 42);
	enum frame_cipher ciphers[] = { FRAME_AEGIS256, FRAME_AES256GCM, FRAME_CHACHA20POLY1305, FRAME_LOCAL };
	for (size_t c = 0; c < sizeof ciphers / sizeof ciphers[0]; c++) {
		for (int threads = 0; threads <= 4; threads += 4) {
			uint8_t k[FRAME_KEY_BYTES];
			struct frame_key tx;
			randombytes_buf(k, sizeof k);
			int kr = frame_key_init(&tx, k, ciphers[c]);
			if (kr == -ENOTSUP)
				continue; /* AES on a CPU without it */
			cr_assert_eq(kr, 0);
			tx.counter = 77;
			size_t want_len;
			uint8_t *want = serial_frames(src, n, tx, &want_len, NULL);

			int sv[2];
			pair(sv);
			struct drain d = { .fd = sv[1], .cap = want_len + 1, .buf = malloc(want_len + 1) };
			cr_assert_not_null(d.buf);
			pthread_t th;
			cr_assert_eq(pthread_create(&th, NULL, drain_main, &d), 0);
			struct cryptopool *pool = pool_of(threads);
			uint8_t *buf = malloc(FRAME_BYTES_MAX);
			struct pipe p;
			char e[320];
			cr_assert_eq(pipe_init(&p, pool, buf, FRAME_BYTES_MAX, e, sizeof e), 0, "%s", e);
			struct tensor_tx t = { .src = src, .n = n };
			cr_assert_eq(pipe_send(&p, SOCK_FD(sv[0]), &tx, msg_chunks(n, WIRE_F32), encode, &t, IO_MS, e,
					       sizeof e), 0, "%s", e);
			shutdown(sv[0], SHUT_WR);
			pthread_join(th, NULL);
			const char *name = frame_cipher_name(ciphers[c]);
			cr_assert_eq(d.got, want_len, "%s, %d threads: %zu bytes on the wire, %zu sealing one at a time",
				     name, threads, d.got, want_len);
			cr_assert_eq(memcmp(d.buf, want, want_len), 0, "%s, %d threads: the bytes changed", name,
				     threads);
			/* Local frames have nothing to seal: they never go
			 * through the pool, which would only add wake-ups
			 * (the pipe's slots are made at its first parallel
			 * call); sealed ones do. */
			cr_assert_eq(p.nslots > 0, threads > 1 && ciphers[c] != FRAME_LOCAL,
				     "%s, %d threads: %d slots", name, threads, p.nslots);
			pipe_free(&p);
			cryptopool_destroy(pool);
			free(buf);
			free(d.buf);
			free(want);
			close(sv[0]);
			close(sv[1]);
		}
	}
	free(src);
}

/* ---- refusals ----------------------------------------------------------- */

enum tamper { FLIP, HEAD_FLIP, REPLAY, SWAP, TRUNCATE, OVERSIZE };

/* Sends the 7 frames of a tensor with one tampering around frame k,
 * receives with 4 threads; returns pipe_recv's result, sets *delivered. */
/* How tampered_on receives: sealed frames opened on a pool of 4 and
 * copied, local frames read into place, sealed frames opened into place
 * without a pool, or on a pool of 4. */
enum tamper_rx { RX_POOL, RX_LOCAL, RX_SEALED_PLACED, RX_POOL_PLACED };

static int tampered_on(enum tamper how, uint64_t k, enum tamper_rx mode, uint64_t *delivered,
		       char *e, size_t elen)
{
	uint64_t n = 6 * (uint64_t)MSG_CHUNK_FLOATS + 5000, C = msg_chunks(n, WIRE_F32);
	float *src = tensor_new(n, 9);
	struct frame_key tx, rx;
	keys_of(&tx, &rx, 0, mode == RX_LOCAL);
	size_t len, off[16];
	uint8_t *f = serial_frames(src, n, tx, &len, off);
	uint8_t *raw = malloc(len + FRAME_BYTES_MAX);
	cr_assert_not_null(raw);
	size_t rl = 0;
	/* frames [0, k) as they were */
	memcpy(raw, f, off[k]);
	rl = off[k];
	size_t fk = off[k + 1] - off[k];
	switch (how) {
	case FLIP: /* one bit in the middle of frame k's ciphertext */
		memcpy(raw + rl, f + off[k], len - off[k]);
		raw[rl + fk / 2] ^= 0x10;
		rl += len - off[k];
		break;
	case HEAD_FLIP: /* one bit of the top byte of frame k's chunk offset */
		memcpy(raw + rl, f + off[k], len - off[k]);
		raw[rl + FRAME_HDR_BYTES + 23] ^= 0x40;
		rl += len - off[k];
		break;
	case REPLAY: /* frame k-1 again where frame k belongs */
		memcpy(raw + rl, f + off[k - 1], off[k] - off[k - 1]);
		rl += off[k] - off[k - 1];
		memcpy(raw + rl, f + off[k], len - off[k]);
		rl += len - off[k];
		break;
	case SWAP: /* frames k+1 and k swapped */
		memcpy(raw + rl, f + off[k + 1], off[k + 2] - off[k + 1]);
		rl += off[k + 2] - off[k + 1];
		memcpy(raw + rl, f + off[k], fk);
		rl += fk;
		memcpy(raw + rl, f + off[k + 2], len - off[k + 2]);
		rl += len - off[k + 2];
		break;
	case TRUNCATE: /* half of frame k, then EOF */
		memcpy(raw + rl, f + off[k], fk / 2);
		rl += fk / 2;
		break;
	case OVERSIZE: /* frame k's length field above the limit */
		memcpy(raw + rl, f + off[k], len - off[k]);
		wire_put_u32(raw + rl, FRAME_CT_MAX + 1);
		rl += len - off[k];
		break;
	}
	int sv[2];
	pair(sv);
	struct sender s = { .fd = sv[0], .raw = raw, .rawlen = rl };
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, sender_main, &s), 0);
	struct tensor_rx x;
	rx_init(&x, n);
	int r = receive_placed(sv[1], mode == RX_SEALED_PLACED ? 0 : 4, &rx, &x, mode != RX_POOL,
			       e, elen);
	close(sv[1]); /* the sender gets EPIPE if it is still writing */
	pthread_join(th, NULL);
	cr_assert(x.order_ok);
	*delivered = x.delivered;
	cr_assert_lt(x.delivered, C);
	/* What was delivered is exactly the tensor's first chunks. */
	cr_assert_eq(memcmp(x.dst, src, x.a.received * sizeof(float)), 0);
	/* Past it, nothing; on a pool, a frame after the bad one may have
	 * been opened into place already: its own values, authenticated. */
	for (uint64_t i = x.a.received; i < n; i++)
		cr_assert(x.dst[i] == 0.0f || (mode == RX_POOL_PLACED && x.dst[i] == src[i]),
			  "float %llu written after the bad frame", (unsigned long long)i);
	free(x.dst);
	free(raw);
	free(f);
	free(src);
	close(sv[0]);
	return r;
}

static int tampered(enum tamper how, uint64_t k, uint64_t *delivered, char *e, size_t elen)
{
	return tampered_on(how, k, RX_POOL, delivered, e, elen);
}

/* Local frames, their values read into place: a frame replayed or out of
 * order fails on its tag as a sealed one does, after its values were read
 * where the next chunk's go, and those are zeroed again (tampered_on
 * checks every float past the last good chunk); a truncated one ends the
 * receive. (A bit flip is not caught: nothing seals a local frame, and
 * nobody but its two processes can write the socket.) */
Test(pipe, local_frames_placed_refuse_a_wrong_counter)
{
	static const struct { enum tamper how; uint64_t k; int r; const char *say; } rows[] = {
		{ REPLAY, 4, -EBADMSG, "frame 4 failed authentication (local)" },
		{ SWAP, 2, -EBADMSG, "frame 2 failed authentication (local)" },
		{ TRUNCATE, 5, -EPIPE, "peer closed the connection" },
		{ OVERSIZE, 1, -EMSGSIZE, "exceeds the limit" },
	};
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		char e[320] = "";
		uint64_t got;
		int r = tampered_on(rows[i].how, rows[i].k, RX_LOCAL, &got, e, sizeof e);
		cr_assert_eq(r, rows[i].r, "row %zu: %d: %s", i, r, e);
		cr_assert_not_null(strstr(e, rows[i].say), "row %zu: %s", i, e);
		cr_assert_eq(got, rows[i].k, "row %zu: %llu chunks delivered", i,
			     (unsigned long long)got);
	}
}

/* A tensor sent with `threads` crypto threads a side to a receiver that
 * places its chunks: every chunk's values go straight into the tensor,
 * none through the buffer, the same bits arrive, and the counter moves
 * as it does for frames taken whole. */
static void round_trip_placed(int threads, int local, int seed)
{
	uint64_t n = 4 * (uint64_t)MSG_CHUNK_FLOATS + 77, C = msg_chunks(n, WIRE_F32);
	int sv[2];
	pair(sv);
	float *src = tensor_new(n, seed);
	struct sender s = { .fd = sv[0], .threads = threads, .t = { .src = src, .n = n } };
	struct frame_key rx;
	keys_of(&s.tx, &rx, 3, local);
	cr_assert_eq(rx.cipher, local ? FRAME_LOCAL : FRAME_AEGIS256);
	struct tensor_rx x;
	rx_init(&x, n);
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, sender_main, &s), 0);
	char e[320] = "";
	int r = receive_placed(sv[1], threads, &rx, &x, 1, e, sizeof e);
	pthread_join(th, NULL);
	cr_assert_eq(s.rc, 0, "%s", s.err);
	cr_assert_eq(r, 0, "%s", e);
	cr_assert(x.order_ok);
	cr_assert_eq(x.placed, C, "%d threads: %llu of %llu chunks placed", threads,
		     (unsigned long long)x.placed, (unsigned long long)C);
	cr_assert(msg_assembly_done(&x.a));
	cr_assert_eq(memcmp(x.dst, src, n * sizeof(float)), 0);
	cr_assert_eq(rx.counter, 3 + C);
	free(src);
	free(x.dst);
	close(sv[0]);
	close(sv[1]);
}

/* Local frames, with or without a pool (they go one at a time either
 * way), are read into place. */
Test(pipe, local_frames_are_read_into_place)
{
	for (int threads = 0; threads <= 4; threads += 4)
		round_trip_placed(threads, 1, 5);
}

/* AEGIS-256 frames are opened into place, received one at a time (from
 * where) or on a pool (from ahead). */
Test(pipe, sealed_frames_are_opened_into_place)
{
	if (!frame_aegis_available())
		cr_skip_test("this CPU has no AES-NI: AEGIS-256 frames are not opened into place");
	for (int threads = 0; threads <= 4; threads += 1 + 2 * (threads == 1))
		round_trip_placed(threads, 0, 6);
}

/* Sealed frames opened into place, one at a time and on a pool: a frame
 * flipped, replayed or out of order fails on its tag after its values
 * were opened where the next chunk's go, and those are zeroed
 * (tampered_on checks every float past the last good chunk); a bit
 * flipped in a chunk's header sends its values nowhere or to the only
 * place a chunk may go, and fails the same. */
Test(pipe, sealed_frames_placed_refuse_tampering)
{
	if (!frame_aegis_available())
		cr_skip_test("this CPU has no AES-NI: AEGIS-256 frames are not opened into place");
	static const struct { enum tamper how; uint64_t k; int r; const char *say; } rows[] = {
		{ FLIP, 3, -EBADMSG, "frame 3 failed authentication (aegis-256)" },
		{ HEAD_FLIP, 2, -EBADMSG, "frame 2 failed authentication (aegis-256)" },
		{ REPLAY, 4, -EBADMSG, "frame 4 failed authentication (aegis-256)" },
		{ SWAP, 2, -EBADMSG, "frame 2 failed authentication (aegis-256)" },
		{ TRUNCATE, 5, -EPIPE, "peer closed the connection" },
		{ OVERSIZE, 1, -EMSGSIZE, "exceeds the limit" },
	};
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		char e[320] = "";
		uint64_t got;
		for (int pool = 0; pool < 2; pool++) {
			int r = tampered_on(rows[i].how, rows[i].k, pool ? RX_POOL_PLACED : RX_SEALED_PLACED,
					    &got, e, sizeof e);
			cr_assert_eq(r, rows[i].r, "row %zu, pool %d: %d: %s", i, pool, r, e);
			cr_assert_not_null(strstr(e, rows[i].say), "row %zu, pool %d: %s", i, pool, e);
			cr_assert_eq(got, rows[i].k, "row %zu, pool %d: %llu chunks delivered", i, pool,
				     (unsigned long long)got);
		}
	}
}

Test(pipe, bit_flip_in_a_middle_chunk)
{
	char e[320] = "";
	uint64_t got;
	int r = tampered(FLIP, 3, &got, e, sizeof e);
	cr_assert_eq(r, -EBADMSG, "%d: %s", r, e);
	cr_assert_not_null(strstr(e, "frame 3 failed authentication"), "%s", e);
	cr_assert_eq(got, 3, "%llu chunks delivered, want 0..2", (unsigned long long)got);
}

Test(pipe, replayed_frame)
{
	char e[320] = "";
	uint64_t got;
	int r = tampered(REPLAY, 4, &got, e, sizeof e);
	cr_assert_eq(r, -EBADMSG, "%d: %s", r, e);
	cr_assert_not_null(strstr(e, "frame 4 failed authentication"), "%s", e);
	cr_assert_eq(got, 4);
}

Test(pipe, reordered_frames)
{
	char e[320] = "";
	uint64_t got;
	int r = tampered(SWAP, 2, &got, e, sizeof e);
	cr_assert_eq(r, -EBADMSG, "%d: %s", r, e);
	cr_assert_not_null(strstr(e, "frame 2 failed authentication"), "%s", e);
	cr_assert_eq(got, 2);
}

Test(pipe, truncated_stream)
{
	char e[320] = "";
	uint64_t got;
	int r = tampered(TRUNCATE, 5, &got, e, sizeof e);
	cr_assert_eq(r, -EPIPE, "%d: %s", r, e);
	cr_assert_not_null(strstr(e, "peer closed the connection"), "%s", e);
	cr_assert_eq(got, 5);
}

Test(pipe, oversized_length)
{
	char e[320] = "";
	uint64_t got;
	int r = tampered(OVERSIZE, 1, &got, e, sizeof e);
	cr_assert_eq(r, -EMSGSIZE, "%d: %s", r, e);
	cr_assert_not_null(strstr(e, "exceeds the limit"), "%s", e);
	cr_assert_eq(got, 1);
}

/* A failing encode stops the send with its error, and the pool threads
 * are joined cleanly afterwards (LSan/ASan see no leak or race). */
static int encode_fails_at_3(void *ctx, uint64_t i, uint8_t *msg, size_t cap, struct pipe_msg *m,
			     char *err, size_t errlen)
{
	if (i == 3) {
		snprintf(err, errlen, "chunk 3 refused");
		return -EINVAL;
	}
	return encode(ctx, i, msg, cap, m, err, errlen);
}

Test(pipe, encode_failure_stops_the_send)
{
	uint64_t n = 8 * (uint64_t)MSG_CHUNK_FLOATS;
	float *src = tensor_new(n, 5);
	struct frame_key tx, rx;
	keys(&tx, &rx, 0);
	int sv[2];
	pair(sv);
	struct drain d = { .fd = sv[1], .cap = 16 * FRAME_BYTES_MAX,
			   .buf = malloc(16 * FRAME_BYTES_MAX) };
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, drain_main, &d), 0);
	struct cryptopool *pool = pool_of(2);
	uint8_t *buf = malloc(FRAME_BYTES_MAX);
	struct pipe p;
	char e[320] = "";
	cr_assert_eq(pipe_init(&p, pool, buf, FRAME_BYTES_MAX, e, sizeof e), 0);
	struct tensor_tx t = { .src = src, .n = n };
	int r = pipe_send(&p, SOCK_FD(sv[0]), &tx, msg_chunks(n, WIRE_F32), encode_fails_at_3, &t, IO_MS, e, sizeof e);
	cr_assert_eq(r, -EINVAL, "%d: %s", r, e);
	cr_assert_str_eq(e, "chunk 3 refused");
	shutdown(sv[0], SHUT_WR);
	pthread_join(th, NULL);
	/* exactly frames 0..2 went out */
	cr_assert_eq(d.got, 3 * FRAME_SEALED_BYTES(MSG_CHUNK_BYTES_MAX));
	pipe_free(&p);
	cryptopool_destroy(pool);
	free(buf);
	free(d.buf);
	free(src);
	close(sv[0]);
	close(sv[1]);
	(void)rx;
}

/* A write that times out part way through a frame leaves the counter past
 * that frame, from one thread or from a pool of 4: some of its bytes are
 * on the wire under its nonce, and whatever is sealed next on the same key
 * (an ERROR from another thread) must not use that nonce again. The peer
 * reads nothing and the socket's buffer is small, so the send stops in
 * the middle of the tensor. */
Test(pipe, failed_write_moves_the_counter_past_its_frame)
{
	uint64_t n = 24 * (uint64_t)MSG_CHUNK_FLOATS;
	float *src = tensor_new(n, 9);
	size_t F = FRAME_SEALED_BYTES(MSG_CHUNK_BYTES_MAX);
	for (int threads = 0; threads <= 4; threads += 4) {
		struct frame_key tx, rx;
		keys(&tx, &rx, 1000);
		int sv[2];
		pair(sv);
		int sb = 150000;
		cr_assert_eq(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sb, sizeof sb), 0);
		struct cryptopool *pool = pool_of(threads);
		uint8_t *buf = malloc(FRAME_BYTES_MAX);
		struct pipe p;
		char e[320] = "";
		cr_assert_eq(pipe_init(&p, pool, buf, FRAME_BYTES_MAX, e, sizeof e), 0, "%s", e);
		struct tensor_tx t = { .src = src, .n = n };
		int r = pipe_send(&p, SOCK_FD(sv[0]), &tx, msg_chunks(n, WIRE_F32), encode, &t, 200, e, sizeof e);
		cr_assert_eq(r, -ETIMEDOUT, "%d threads: %d: %s", threads, r, e);
		/* What reached the peer: frames 0..whole-1, and the write of
		 * frame `whole` began (it timed out, with none or some of its
		 * bytes out). */
		size_t got = 0;
		uint8_t *sink = malloc(F);
		cr_assert_not_null(sink);
		for (;;) {
			ssize_t k = recv(sv[1], sink, F, MSG_DONTWAIT);
			if (k <= 0)
				break;
			got += (size_t)k;
		}
		uint64_t whole = got / F;
		cr_assert_lt(whole, msg_chunks(n, WIRE_F32), "%d threads: the whole tensor went", threads);
		cr_assert_gt(tx.counter, 1000 + whole,
			     "%d threads: %zu bytes (%" PRIu64 " whole frames and %zu bytes of the next) "
			     "on the wire, but the counter is back at frame %" PRIu64 ": its nonce would be "
			     "used again",
			     threads, got, whole, got % F, tx.counter - 1000);
		free(sink);
		pipe_free(&p);
		cryptopool_destroy(pool);
		free(buf);
		close(sv[0]);
		close(sv[1]);
		(void)rx;
	}
	free(src);
}

/* ---- thread count -------------------------------------------------------- */

Test(pipe, thread_count_for_config)
{
	cr_assert_eq(cryptopool_threads_for(1), 1);
	cr_assert_eq(cryptopool_threads_for(3), 3);
	cr_assert_eq(cryptopool_threads_for(100), CRYPTOPOOL_MAX_THREADS);
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	int a = cryptopool_threads_for(0);
	cr_assert_geq(a, 1);
	cr_assert_leq(a, CRYPTOPOOL_MAX_THREADS);
	cr_assert_leq(a, cpus > 1 ? cpus - 1 : 1, "auto %d threads on %ld CPUs", a, cpus);
	struct cryptopool *p = NULL;
	char e[256] = "";
	cr_assert_eq(cryptopool_new(&p, 0, e, sizeof e), -EINVAL);
	cr_assert_eq(cryptopool_new(&p, CRYPTOPOOL_MAX_THREADS + 1, e, sizeof e), -EINVAL);
	cr_assert_not_null(strstr(e, "crypto pool of 9 threads"), "%s", e);
	cryptopool_destroy(NULL);
}

/* ---- end to end ----------------------------------------------------------- */

#define E2E_TIMEOUT_S 90

/* Starts $PSTRAIN_BIN role --index index --config cfg --set
 * cluster.crypto_threads=threads [more...], output to log. */
static pid_t e2e_spawn(const char *role, int index, const char *cfg, int threads,
		       const char *more1, const char *more2, const char *log)
{
	const char *bin = getenv("PSTRAIN_BIN");
	cr_assert_not_null(bin, "PSTRAIN_BIN is not set (run through make unit)");
	char idx[16], set[64];
	snprintf(idx, sizeof idx, "%d", index);
	snprintf(set, sizeof set, "cluster.crypto_threads=%d", threads);
	pid_t pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(fd, 1);
		dup2(fd, 2);
		execl(bin, bin, role, "--index", idx, "--config", cfg, "--set", set, more1, more2,
		      (char *)NULL);
		_exit(127);
	}
	return pid;
}

/* Waits for n processes, killing what is left after E2E_TIMEOUT_S.
 * st[i]: exit status, 128+signal, or -1 if killed. */
static void e2e_wait(const pid_t *pids, int n, int *st)
{
	time_t t0 = time(NULL);
	int left = n;
	for (int i = 0; i < n; i++)
		st[i] = -2;
	while (left > 0) {
		for (int i = 0; i < n; i++) {
			int s;
			if (st[i] == -2 && waitpid(pids[i], &s, WNOHANG) == pids[i]) {
				st[i] = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
				left--;
			}
		}
		if (time(NULL) - t0 > E2E_TIMEOUT_S)
			for (int i = 0; i < n; i++)
				if (st[i] == -2) {
					kill(pids[i], SIGKILL);
					waitpid(pids[i], NULL, 0);
					st[i] = -1;
					left--;
				}
		usleep(20000);
	}
}

static char *e2e_slurp(const char *path)
{
	static char text[2][1 << 14];
	static int next;
	char *t = text[next++ % 2];
	t[0] = '\0';
	FILE *f = fopen(path, "r");
	if (f) {
		t[fread(t, 1, sizeof text[0] - 1, f)] = '\0';
		fclose(f);
	}
	return t;
}

/* dir with blobs.csv, cluster.key (its bytes in key) and cluster.ini: P ps
 * and W workers, sync, a 6-150000-3 MLP of 1,500,003 parameters (with one
 * ps 6 chunks a shard, with two 3). Returns the config path in cfg. */
static void e2e_setup(char *dir, size_t dirlen, char *cfg, size_t cfglen, int P, int W,
		      uint8_t *key)
{
	char path[300], err[KEY_ERR_MAX];
	test_dir_make(dir, dirlen, "pipe");
	snprintf(path, sizeof path, "%s/blobs.csv", dir);
	write_blobs(path, 400, 3, 6, 3);
	snprintf(path, sizeof path, "%s/cluster.key", dir);
	cr_assert_eq(key_generate(path, err, sizeof err), 0, "%s", err);
	if (key)
		cr_assert_eq(key_load(key, path, err, sizeof err), 0, "%s", err);
	snprintf(cfg, cfglen, "%s/cluster.ini", dir);
	FILE *f = fopen(cfg, "w");
	cr_assert_not_null(f);
	fprintf(f, "[cluster]\nps = ");
	for (int i = 0; i < P; i++)
		fprintf(f, "%s127.0.0.1:%d", i ? ", " : "", free_port());
	fprintf(f, "\nworkers = ");
	for (int i = 0; i < W; i++)
		fprintf(f, "%s127.0.0.1:%d", i ? ", " : "", free_port());
	fprintf(f, "\nkey_file = cluster.key\n"
		   "[data]\nformat = csv\ntrain_csv = blobs.csv\nlabel_column = first\n"
		   "[train]\nmode = sync\nsteps = 6\nbatch_size = 8\nlearning_rate = 0.01\n"
		   "eval_every = 3\nthreads = 1\n"
		   "[model]\ninput = 6\nlayer = dense 150000\nlayer = relu\nlayer = dense 3\n");
	cr_assert_eq(fclose(f), 0);
}

static void e2e_cleanup(const char *dir)
{
	cr_assert_eq(test_dir_remove(dir), 0);
}

/* 2 ps + 2 workers; threads[i] for ps 0, ps 1, worker 1, worker 0 (the
 * chief, which dumps its parameters to dump). All must exit 0. */
static void e2e_run(const char *dir, const char *cfg, const int threads[4], const char *dump)
{
	const char *role[4] = { "ps", "ps", "worker", "worker" };
	const int index[4] = { 0, 1, 1, 0 };
	pid_t pids[4];
	char logs[4][300];
	int st[4];
	for (int i = 0; i < 4; i++) {
		snprintf(logs[i], sizeof logs[i], "%s/%s%d-%d.log", dir, role[i], index[i], threads[i]);
		pids[i] = e2e_spawn(role[i], index[i], cfg, threads[i], i == 3 ? "--dump-params" : NULL,
				    dump, logs[i]);
	}
	e2e_wait(pids, 4, st);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(st[i], 0, "%s %d (crypto_threads %d) exit %d:\n%s", role[i], index[i],
			     threads[i], st[i], e2e_slurp(logs[i]));
}

static float *slurp_floats(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s missing", path);
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	fseek(f, 0, SEEK_SET);
	float *p = malloc((size_t)len);
	cr_assert_not_null(p);
	cr_assert_eq(fread(p, 1, (size_t)len, f), (size_t)len);
	fclose(f);
	*n = (size_t)len / sizeof(float);
	return p;
}

/* A sync cluster ends with bit-identical parameters with crypto_threads 1
 * everywhere and with 2, 3 and 4 on different nodes (the key is node-local:
 * no config hash mismatch). */
Test(pipe, cluster_same_parameters_with_crypto_threads, .timeout = 240)
{
	char dir[256], cfg[300], d1[300], d2[300];
	e2e_setup(dir, sizeof dir, cfg, sizeof cfg, 2, 2, NULL);
	snprintf(d1, sizeof d1, "%s/serial.bin", dir);
	snprintf(d2, sizeof d2, "%s/parallel.bin", dir);
	const int serial[4] = { 1, 1, 1, 1 }, par[4] = { 3, 2, 4, 2 };
	e2e_run(dir, cfg, serial, d1);
	e2e_run(dir, cfg, par, d2);
	size_t n1, n2;
	float *p1 = slurp_floats(d1, &n1), *p2 = slurp_floats(d2, &n2);
	cr_assert_eq(n1, 1500003);
	cr_assert_eq(n1, n2);
	cr_assert_eq(memcmp(p1, p2, n1 * sizeof(float)), 0,
		     "parameters differ between crypto_threads 1 and 2-4");
	free(p1);
	free(p2);
	e2e_cleanup(dir);
}

/* A ps with 4 crypto threads receives a 92-chunk PUSH from a peer holding
 * the key whose frame 3 is tampered with (a bit flip, or frame 2 replayed):
 * it closes that connection naming the frame, takes nothing from that
 * frame on (the pieces before it were whole and authentic: a sync ps
 * aggregates each as it arrives), and a real worker then trains to the
 * end. */
static void ps_refuses_tampered_push(int replay)
{
	char dir[256], cfg[300], log[300], wlog[300], err[256];
	uint8_t key[KEY_BYTES];
	e2e_setup(dir, sizeof dir, cfg, sizeof cfg, 1, 1, key);
	snprintf(log, sizeof log, "%s/ps0.log", dir);
	snprintf(wlog, sizeof wlog, "%s/worker0.log", dir);
	pid_t ps = e2e_spawn("ps", 0, cfg, 4, NULL, NULL, log);

	struct config *c = malloc(sizeof *c);
	char cerr[CONFIG_ERR_MAX];
	cr_assert_not_null(c);
	cr_assert_eq(config_load(c, cfg, NULL, 0, cerr, sizeof cerr), 0, "%s", cerr);
	struct hs_identity me = { .role = HS_WORKER, .index = 0, .ciphers = frame_offers() };
	cr_assert_eq(config_hash(c, me.config_hash), 0);
	int fd;
	cr_assert_eq(sock_connect_retry("127.0.0.1", c->cluster.ps[0].port, 10000, &fd, err,
					sizeof err), 0, "%s", err);
	free(c);
	struct hs h;
	struct hs_result hr;
	uint8_t h1[HS_HELLO_BYTES], h2[HS_HELLO_BYTES];
	cr_assert_eq(hs_client_start(&h, h1, key, &me, err, sizeof err), 0, "%s", err);
	cr_assert_eq(sock_write_full(fd, h1, sizeof h1, IO_MS, err, sizeof err), 0, "%s", err);
	cr_assert_eq(sock_read_full(fd, h2, sizeof h2, IO_MS, err, sizeof err), 0, "%s", err);
	cr_assert_eq(hs_client_finish(&h, &hr, h2, sizeof h2, err, sizeof err), 0, "%s", err);

	/* The gradient of the whole shard (1,500,003 floats, 92 chunks). */
	uint64_t n = 1500003, C = msg_chunks(n, WIRE_F32);
	cr_assert_eq(C, 92);
	float *g = calloc(n, sizeof(float));
	uint8_t *msg = malloc(FRAME_MAX), *f = malloc(FRAME_BYTES_MAX), *prev = malloc(FRAME_BYTES_MAX);
	cr_assert(g && msg && f && prev);
	size_t prevlen = 0;
	for (uint64_t i = 0; i < C; i++) {
		struct msg_chunk ch = { .type = WIRE_PUSH, .shard = 0, .version = 0, .worker = 0 };
		size_t ml, fl;
		msg_chunk_range(n, WIRE_F32, i, &ch.offset, &ch.count);
		cr_assert_eq(msg_encode_chunk(msg, FRAME_MAX, &ch, g + ch.offset, &ml, err, sizeof err), 0);
		cr_assert_eq(frame_seal(&hr.send, f, FRAME_BYTES_MAX, msg, ml, &fl, err, sizeof err), 0);
		if (i == 3 && replay) {
			cr_assert_eq(sock_write_full(fd, prev, prevlen, IO_MS, err, sizeof err), 0, "%s", err);
			continue;
		}
		if (i == 3)
			f[fl / 2] ^= 0x04;
		/* The ps may close before the last frames: ignore write errors. */
		if (sock_write_full(fd, f, fl, IO_MS, err, sizeof err) < 0)
			break;
		memcpy(prev, f, fl);
		prevlen = fl;
	}
	uint8_t b;
	int r = sock_read_full(fd, &b, 1, IO_MS, err, sizeof err);
	cr_assert(r == -EPIPE || r == -ECONNRESET, "the ps kept the connection: %d %s", r, err);
	close(fd);
	frame_key_wipe(&hr.send);
	frame_key_wipe(&hr.recv);

	pid_t w = e2e_spawn("worker", 0, cfg, 4, NULL, NULL, wlog);
	pid_t pids[2] = { ps, w };
	int st[2];
	e2e_wait(pids, 2, st);
	char *pslog = e2e_slurp(log);
	cr_assert_not_null(strstr(pslog, "closed worker 0's connection"), "%s", pslog);
	cr_assert_not_null(strstr(pslog, "frame 3 failed authentication"), "%s", pslog);
	cr_assert_eq(st[1], 0, "worker exit %d:\n%s\nps:\n%s", st[1], e2e_slurp(wlog), pslog);
	cr_assert_eq(st[0], 0, "ps exit %d:\n%s", st[0], pslog);
	cr_assert_not_null(strstr(pslog, "version 6"), "the tampered push was applied?\n%s", pslog);
	free(g);
	free(msg);
	free(f);
	free(prev);
	e2e_cleanup(dir);
}

Test(pipe, ps_refuses_bit_flip_in_a_parallel_push, .timeout = 240)
{
	ps_refuses_tampered_push(0);
}

Test(pipe, ps_refuses_replay_in_a_parallel_push, .timeout = 240)
{
	ps_refuses_tampered_push(1);
}

/* ---- [cluster] crypto_threads --------------------------------------------- */

static int parse(struct config *c, const char *extra, char *err, size_t errlen)
{
	char text[512];
	snprintf(text, sizeof text,
		 "[cluster]\nps = 127.0.0.1:2222\nworkers = 127.0.0.1:2224\n%s"
		 "[model]\ninput = 4\nlayer = dense 2\n",
		 extra);
	return config_parse_string(c, "test.ini", text, err, errlen);
}

Test(pipe, crypto_threads_key)
{
	struct config *a = malloc(sizeof *a), *b = malloc(sizeof *b);
	char err[CONFIG_ERR_MAX] = "";
	cr_assert(a && b);
	cr_assert_eq(parse(a, "", err, sizeof err), 0, "%s", err);
	cr_assert_eq(a->cluster.crypto_threads, 0, "default is auto");
	cr_assert_eq(parse(b, "crypto_threads = 4\n", err, sizeof err), 0, "%s", err);
	cr_assert_eq(b->cluster.crypto_threads, 4);
	uint8_t ha[CONFIG_HASH_BYTES], hb[CONFIG_HASH_BYTES];
	cr_assert_eq(config_hash(a, ha), 0);
	cr_assert_eq(config_hash(b, hb), 0);
	cr_assert_eq(memcmp(ha, hb, sizeof ha), 0, "crypto_threads must not change the hash");
	const char *bad[] = { "crypto_threads = 9\n", "crypto_threads = -1\n",
			      "crypto_threads = 2x\n" };
	for (int i = 0; i < 3; i++) {
		err[0] = '\0';
		cr_assert_eq(parse(a, bad[i], err, sizeof err), -EINVAL, "%s accepted", bad[i]);
		cr_assert_not_null(strstr(err, "[cluster] crypto_threads"), "%s", err);
		cr_assert_null(strchr(err, '\n'), "%s", err);
	}
	free(a);
	free(b);
}
