/* Push/pull throughput of one worker and one ps over loopback: a parameter
 * vector of 1, 16 and 64 MiB moved with the real protocol (handshake, then
 * PUSH / PULL / PARAMS / ACK messages from net/msg.c in frames sealed by
 * net/frame.c, written and read by net/sock.c) and, for comparison, with the
 * same messages in the same length-prefixed framing but not encrypted.
 *
 *   build/bench/pushpull [--seconds S] [--rounds R] [--sizes 1,16,64]
 *                        [--modes sealed,plain[,gcm][,aesnm][,chacha][,local]] [--csv]
 *                        [--crypto-threads N[,M...]]
 *
 * --crypto-threads N: as [cluster] crypto_threads (0 = auto, 1 = one frame
 * at a time on the connection's thread); each end gets its own pool of N
 * threads, as two processes would. The sealed, gcm and chacha modes go through
 * net/pipe.c exactly as cluster/ps.c and cluster/links.c do. Several counts (1,2,4) give a
 * column each ("sealed@2"), interleaved in every round.
 *
 * After the table, a "cpu ceiling" row per size: the best sealed/plain ratio
 * this machine's CPUs allow (docs/BENCHMARKS.md explains the formula), from
 * the in-memory seal and open rates of one core, the plain throughput and
 * the CPU time the plain runs used.
 *
 * Modes (the bench-only ones exist in this file only; nothing in the config
 * or in the pstrain binary can reach them):
 *   sealed  the production path: sock_write_frame / sock_read_frame with the
 *           cipher the handshake negotiates (AEGIS-256 where the CPU has
 *           AES-NI, else ChaCha20-Poly1305)
 *   plain   bench only: same header, same messages, a fake all-zero 16-byte
 *           tag, no encryption and no authentication
 *   aesnm   bench only: the same AES-256-GCM frames (same bytes on the wire)
 *           sealed with libsodium's precomputed state (beforenm/afternm)
 *           instead of expanding the key for every frame
 *   gcm     the production path with AES-256-GCM forced (the only cipher
 *           offered besides ChaCha; the default before protocol version 6)
 *   chacha  the production path with ChaCha20-Poly1305 forced (no AES
 *           offered in the handshake)
 *   local   the production path of a Unix socket between two processes of
 *           one host: frames not sealed (FRAME_LOCAL), the counter as the
 *           tag (the handshake is told both sockets are local), and each
 *           chunk's values read straight into the tensor (pipe_place)
 *   local-copy  bench only: local, but each frame read whole into the
 *           pipe's buffer and its values copied out (the path before
 *           pipe_place)
 *   sealed-copy  bench only: sealed, but each frame opened whole in the
 *           pipe's buffer and its values copied out (the path before
 *           AEGIS-256 frames were opened into place, one at a time or
 *           on the pool)
 *
 * A server thread plays the ps: it decodes each PUSH chunk into a float
 * buffer (msg_assembly_add), answers a whole push with ACK, and answers PULL
 * with the vector as PARAMS chunks. The client (main thread) plays the
 * worker. Per (round, size, mode) a fresh connection with a fresh handshake
 * (cluster key from randombytes_buf, never a file). Each operation is
 * repeated for about S seconds; the best of R rounds (interleaved across
 * modes) is reported, in GB/s (1e9 bytes) of parameter bytes: push and
 * pull move the vector once, push+pull moves it twice (once each way). */
#include "../net/frame.h"
#include "../net/cryptopool.h"
#include "../net/handshake.h"
#include "../net/msg.h"
#include "../net/pipe.h"
#include "../net/sock.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#define TIMEOUT_MS 60000
#define BUF_BYTES FRAME_BYTES_MAX

enum mode { M_SEALED, M_PLAIN, M_AESNM, M_CHACHA, M_GCM, M_LOCAL, M_LOCALCOPY, M_SEALEDCOPY,
	    M_COUNT };
static const char *const mode_names[M_COUNT] = { "sealed", "plain", "aesnm", "chacha", "gcm", "local",
						 "local-copy", "sealed-copy" };

/* One direction of a connection, for every mode. */
struct chan {
	enum mode mode;
	struct frame_key fk; /* sealed, chacha; aesnm uses its counter */
	crypto_aead_aes256gcm_state st; /* aesnm only */
};

/* The production modes move tensors through net/pipe.c. */
static int piped(enum mode m)
{
	return m == M_SEALED || m == M_CHACHA || m == M_GCM || m == M_LOCAL || m == M_LOCALCOPY ||
	       m == M_SEALEDCOPY;
}

/* What a mode offers in the handshake: everything this CPU runs for the
 * production path, nothing for ChaCha, else AES-256-GCM alone (the
 * bench-only modes reuse its keys or its framing). */
static unsigned mode_offers(enum mode m)
{
	if (m == M_SEALED || m == M_SEALEDCOPY)
		return frame_offers();
	if (m == M_CHACHA)
		return 0;
	return frame_offers() & FRAME_OFFER_AES256GCM;
}

static void die(const char *what, const char *e)
{
	fprintf(stderr, "pushpull: %s: %s\n", what, e);
	exit(1);
}

/* A pool of `threads` (--crypto-threads, resolved), or none for 1. */
static struct cryptopool *pool_start(int threads)
{
	struct cryptopool *p = NULL;
	char e[256];
	if (threads > 1 && cryptopool_new(&p, threads, e, sizeof e))
		die("crypto pool", e);
	return p;
}

/* Chunk i of a tensor (PUSH or PARAMS), for pipe_send. */
struct tensor_tx {
	uint8_t type;
	uint64_t version;
	const float *src;
	uint64_t n;
};

static int tensor_encode(void *ctx, uint64_t i, uint8_t *msg, size_t cap, struct pipe_msg *m,
			 char *err, size_t errlen)
{
	const struct tensor_tx *t = ctx;
	struct msg_chunk ch = { .type = t->type, .version = t->version };
	msg_chunk_range(t->n, WIRE_F32, i, &ch.offset, &ch.count);
	return msg_encode_chunk_parts(msg, cap, &ch, t->src + ch.offset, &m->len, &m->body, &m->blen, err,
				      errlen);
}

/* A tensor being received: its assembly and where its values go. */
struct tensor_rx {
	struct msg_assembly *a;
	float *dst;
	uint64_t base; /* a->received when the pipe's receive began */
};

/* The chunks of a tensor, for pipe_recv: into an assembly. */
static int tensor_deliver(void *ctx, uint64_t i, const uint8_t *msg, size_t len, char *err,
			  size_t errlen)
{
	struct tensor_rx *x = ctx;
	struct msg_chunk ch;
	(void)i;
	int r = msg_decode_chunk(msg, len, &ch, err, errlen);
	if (r == 0)
		r = msg_assembly_add(x->a, &ch, x->dst, err, errlen);
	return r < 0 ? r : 0;
}

/* Local mode's pipe_place, as net/conn.c's: the next chunk's values go
 * right after those received. */
static uint8_t *tensor_where(void *ctx, const uint8_t *head, size_t mlen)
{
	(void)head;
	struct tensor_rx *x = ctx;
	size_t b = mlen - MSG_CHUNK_HDR_BYTES;
	if (b % sizeof(float) || b / sizeof(float) > x->a->n - x->a->received)
		return NULL;
	return (uint8_t *)(x->dst + x->a->received);
}

/* The same for frames opened on the pool (net/conn.c's chunk_ahead):
 * message i goes at position i from where the receive began. */
static uint8_t *tensor_ahead(void *ctx, uint64_t i, const uint8_t *head, size_t mlen)
{
	(void)head;
	const struct tensor_rx *x = ctx;
	uint64_t at = x->base + i * MSG_CHUNK_FLOATS, left = at < x->a->n ? x->a->n - at : 0;
	uint64_t count = left < MSG_CHUNK_FLOATS ? left : MSG_CHUNK_FLOATS;
	if (!count || mlen != MSG_CHUNK_HDR_BYTES + count * sizeof(float))
		return NULL;
	return (uint8_t *)(x->dst + at);
}

static int tensor_took(void *ctx, uint64_t i, const uint8_t *msg, const uint8_t *body, size_t mlen,
		       char *err, size_t errlen)
{
	struct tensor_rx *x = ctx;
	struct msg_chunk ch;
	(void)i;
	int r = msg_decode_chunk_head(msg, mlen, &ch, err, errlen);
	if (r == 0 && body != (const uint8_t *)(x->dst + ch.offset))
		return 1; /* not the chunk its place was for: taken whole */
	if (r == 0)
		r = msg_assembly_add(x->a, &ch, NULL, err, errlen);
	return r < 0 ? r : 0;
}

/* pipe_recv of the rest of x's tensor, placed but in the -copy modes. */
static int tensor_recv(struct pipe *pp, int fd, struct frame_key *rx, enum mode m,
		       struct tensor_rx *x, char *e, size_t elen)
{
	const struct pipe_place pl = { { MSG_CHUNK_HDR_BYTES, tensor_where, x }, tensor_took,
				       tensor_ahead };
	x->base = x->a->received;
	return pipe_recv_placed(pp, SOCK_FD(fd), rx, msg_chunks(x->a->n - x->a->received, WIRE_F32),
				m == M_LOCALCOPY || m == M_SEALEDCOPY ? NULL : &pl, tensor_deliver, x,
				TIMEOUT_MS, e, elen);
}


static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void chan_init(struct chan *c, enum mode m, const struct frame_key *fk)
{
	c->mode = m;
	c->fk = *fk;
	if (m == M_AESNM)
		crypto_aead_aes256gcm_beforenm(&c->st, fk->key);
}

/* The message is already at buf + FRAME_HDR_BYTES (len bytes). */
static int chan_send(int fd, struct chan *c, uint8_t *buf, size_t len, char *e, size_t elen)
{
	if (piped(c->mode))
		return sock_write_frame(SOCK_FD(fd), &c->fk, buf, BUF_BYTES, buf + FRAME_HDR_BYTES, len,
					TIMEOUT_MS, e, elen);
	wire_put_u32(buf, (uint32_t)(len + FRAME_TAG_BYTES));
	if (c->mode == M_PLAIN) {
		memset(buf + FRAME_HDR_BYTES + len, 0, FRAME_TAG_BYTES);
	} else {
		uint8_t nonce[FRAME_NONCE_BYTES] = { 0 };
		unsigned long long clen = 0;
		wire_put_u64(nonce, c->fk.counter);
		if (crypto_aead_aes256gcm_encrypt_afternm(buf + FRAME_HDR_BYTES, &clen,
							  buf + FRAME_HDR_BYTES, len, buf,
							  FRAME_HDR_BYTES, NULL, nonce, &c->st))
			return snprintf(e, elen, "afternm encryption failed"), -EIO;
		c->fk.counter++;
	}
	return sock_write_full(fd, buf, FRAME_SEALED_BYTES(len), TIMEOUT_MS, e, elen);
}

/* Reads one frame into buf; the message is its first *len bytes. */
static int chan_recv(int fd, struct chan *c, uint8_t *buf, size_t *len, char *e, size_t elen)
{
	if (piped(c->mode))
		return sock_read_frame(SOCK_FD(fd), &c->fk, buf, BUF_BYTES, len, TIMEOUT_MS, e, elen);
	uint8_t hdr[FRAME_HDR_BYTES];
	size_t ctlen;
	int r = sock_read_full(fd, hdr, sizeof hdr, TIMEOUT_MS, e, elen);
	if (r || (r = frame_check_len(hdr, &ctlen, e, elen)) ||
	    (r = sock_read_full(fd, buf, ctlen, TIMEOUT_MS, e, elen)))
		return r;
	*len = ctlen - FRAME_TAG_BYTES;
	if (c->mode == M_PLAIN)
		return 0;
	uint8_t nonce[FRAME_NONCE_BYTES] = { 0 };
	unsigned long long got = 0;
	wire_put_u64(nonce, c->fk.counter);
	if (crypto_aead_aes256gcm_decrypt_afternm(buf, &got, NULL, buf, ctlen, hdr, FRAME_HDR_BYTES,
						  nonce, &c->st) ||
	    got != *len)
		return snprintf(e, elen, "afternm: frame failed authentication"), -EBADMSG;
	c->fk.counter++;
	return 0;
}

struct server {
	int lfd;
	int threads;
	enum mode mode;
	size_t n; /* floats */
	uint8_t psk[HS_PSK_BYTES];
	char err[512];
};

static struct hs_identity ident(enum hs_role role, enum mode m)
{
	/* local: both ends say their socket is a Unix one, so the
	 * handshake picks FRAME_LOCAL (the bench's socket is loopback TCP:
	 * the frames are the same bytes). */
	struct hs_identity id = { .role = role, .index = 0, .ciphers = mode_offers(m), .local = m == M_LOCAL || m == M_LOCALCOPY };
	memset(id.config_hash, 0x5a, sizeof id.config_hash);
	return id;
}

/* The ps side: serves one connection until DONE. */
static void *serve(void *arg)
{
	struct server *sv = arg;
	char *e = sv->err;
	size_t elen = sizeof sv->err;
	int fd = -1;
	uint8_t hello1[HS_HELLO_BYTES], hello2[HS_HELLO_BYTES];
	size_t outlen = 0;
	struct hs_result hr;
	struct hs_identity me = ident(HS_PS, sv->mode);
	uint8_t *rbuf = malloc(BUF_BYTES), *wbuf = malloc(BUF_BYTES);
	float *params = malloc(sv->n * sizeof(float)), *grad = malloc(sv->n * sizeof(float));
	if (!rbuf || !wbuf || !params || !grad)
		die("server", "out of memory");
	for (size_t i = 0; i < sv->n; i++)
		params[i] = (float)i * 1e-6f;
	if (sock_accept(sv->lfd, TIMEOUT_MS, &fd, NULL, 0, e, elen) ||
	    sock_read_full(fd, hello1, sizeof hello1, TIMEOUT_MS, e, elen) ||
	    hs_server_respond(&hr, hello2, &outlen, sv->psk, &me, hello1, sizeof hello1, e, elen) ||
	    sock_write_full(fd, hello2, outlen, TIMEOUT_MS, e, elen))
		die("server handshake", e);
	struct chan tx, rx;
	chan_init(&tx, sv->mode, &hr.send);
	chan_init(&rx, sv->mode, &hr.recv);
	struct cryptopool *pool = pool_start(sv->threads);
	struct pipe pp;
	if (pipe_init(&pp, pool, wbuf, BUF_BYTES, e, elen))
		die("server", e);
	uint8_t *mb = wbuf + FRAME_HDR_BYTES;
	size_t cap = BUF_BYTES - FRAME_HDR_BYTES - FRAME_TAG_BYTES;
	uint64_t version = 0;
	struct msg_assembly a;
	int assembling = 0;
	for (;;) {
		size_t len;
		if (chan_recv(fd, &rx, rbuf, &len, e, elen))
			die("server recv", e);
		int t = msg_type(rbuf, len, e, elen);
		if (t == WIRE_PULL) {
			struct msg_pull p;
			if (msg_decode_pull(rbuf, len, &p, e, elen))
				die("server", e);
			struct tensor_tx tt = { .type = WIRE_PARAMS, .version = version,
						.src = params, .n = sv->n };
			if (piped(sv->mode)) {
				if (pipe_send(&pp, SOCK_FD(fd), &tx.fk, msg_chunks(sv->n, WIRE_F32), tensor_encode, &tt,
					      TIMEOUT_MS, e, elen))
					die("server PARAMS", e);
				continue;
			}
			for (uint64_t i = 0; i < msg_chunks(sv->n, WIRE_F32); i++) {
				struct msg_chunk ch = { .type = WIRE_PARAMS, .version = version };
				msg_chunk_range(sv->n, WIRE_F32, i, &ch.offset, &ch.count);
				if (msg_encode_chunk(mb, cap, &ch, params + ch.offset, &len, e, elen) ||
				    chan_send(fd, &tx, wbuf, len, e, elen))
					die("server PARAMS", e);
			}
		} else if (t == WIRE_PUSH) {
			struct msg_chunk ch;
			if (msg_decode_chunk(rbuf, len, &ch, e, elen))
				die("server", e);
			if (!assembling) {
				if (msg_assembly_init(&a, WIRE_PUSH, 0, sv->n, WIRE_F32, e, elen))
					die("server", e);
				assembling = 1;
			}
			int r = msg_assembly_add(&a, &ch, grad, e, elen);
			if (r < 0)
				die("server PUSH", e);
			if (r == 0 && piped(sv->mode)) { /* the rest, as cluster/ps.c does */
				struct tensor_rx x = { .a = &a, .dst = grad };
				if (tensor_recv(&pp, fd, &rx.fk, sv->mode, &x, e, elen))
					die("server PUSH", e);
				r = msg_assembly_done(&a);
			}
			if (r == 0)
				continue;
			assembling = 0;
			version++;
			struct msg_ack ack = { .shard = 0, .version = version,
					       .status = MSG_ACK_APPLIED };
			if (msg_encode_ack(mb, cap, &ack, &len, e, elen) ||
			    chan_send(fd, &tx, wbuf, len, e, elen))
				die("server ACK", e);
		} else if (t == WIRE_DONE) {
			/* What was pushed arrived intact (checked once, untimed). */
			for (size_t i = 0; i < sv->n; i++)
				if (grad[i] != (float)i * -1e-6f)
					die("server", "pushed vector arrived corrupted");
			break;
		} else {
			die("server", t < 0 ? e : "unexpected message");
		}
	}
	close(fd);
	pipe_free(&pp);
	cryptopool_destroy(pool);
	sodium_memzero(&hr, sizeof hr);
	sodium_memzero(&tx, sizeof tx);
	sodium_memzero(&rx, sizeof rx);
	free(rbuf);
	free(wbuf);
	free(params);
	free(grad);
	return NULL;
}

struct client {
	int fd;
	struct chan tx, rx;
	struct pipe pp;
	size_t n;
	uint8_t *rbuf, *wbuf;
	float *params, *grads;
	uint64_t got;
};

static void do_push(struct client *c)
{
	char e[512];
	size_t len, cap = BUF_BYTES - FRAME_HDR_BYTES - FRAME_TAG_BYTES;
	struct tensor_tx t = { .type = WIRE_PUSH, .version = c->got, .src = c->grads, .n = c->n };
	if (piped(c->tx.mode) && pipe_send(&c->pp, SOCK_FD(c->fd), &c->tx.fk, msg_chunks(c->n, WIRE_F32),
					   tensor_encode, &t, TIMEOUT_MS, e, sizeof e))
		die("client PUSH", e);
	for (uint64_t i = 0; !piped(c->tx.mode) && i < msg_chunks(c->n, WIRE_F32); i++) {
		struct msg_chunk ch = { .type = WIRE_PUSH, .version = c->got };
		msg_chunk_range(c->n, WIRE_F32, i, &ch.offset, &ch.count);
		if (msg_encode_chunk(c->wbuf + FRAME_HDR_BYTES, cap, &ch, c->grads + ch.offset, &len,
				     e, sizeof e) ||
		    chan_send(c->fd, &c->tx, c->wbuf, len, e, sizeof e))
			die("client PUSH", e);
	}
	struct msg_ack ack;
	if (chan_recv(c->fd, &c->rx, c->rbuf, &len, e, sizeof e) ||
	    msg_decode_ack(c->rbuf, len, &ack, e, sizeof e))
		die("client ACK", e);
	c->got = ack.version;
}

static void do_pull(struct client *c)
{
	char e[512];
	size_t len, cap = BUF_BYTES - FRAME_HDR_BYTES - FRAME_TAG_BYTES;
	struct msg_pull p = { .shard = 0, .version = MSG_VERSION_LATEST };
	if (msg_encode_pull(c->wbuf + FRAME_HDR_BYTES, cap, &p, &len, e, sizeof e) ||
	    chan_send(c->fd, &c->tx, c->wbuf, len, e, sizeof e))
		die("client PULL", e);
	struct msg_assembly a;
	if (msg_assembly_init(&a, WIRE_PARAMS, 0, c->n, WIRE_F32, e, sizeof e))
		die("client", e);
	if (piped(c->rx.mode)) {
		struct tensor_rx x = { .a = &a, .dst = c->params };
		if (tensor_recv(&c->pp, c->fd, &c->rx.fk, c->rx.mode, &x, e, sizeof e))
			die("client PARAMS", e);
	}
	while (!msg_assembly_done(&a)) {
		struct msg_chunk ch;
		int r;
		if (chan_recv(c->fd, &c->rx, c->rbuf, &len, e, sizeof e) ||
		    msg_decode_chunk(c->rbuf, len, &ch, e, sizeof e) ||
		    (r = msg_assembly_add(&a, &ch, c->params, e, sizeof e)) < 0)
			die("client PARAMS", e);
		if (r == 1)
			break;
	}
	c->got = a.version;
}

enum op { OP_PUSH, OP_PULL, OP_BOTH, OP_COUNT };

static void do_op(struct client *c, enum op op)
{
	if (op != OP_PULL)
		do_push(c);
	if (op != OP_PUSH)
		do_pull(c);
}

/* GB/s of parameter bytes for op, repeated for about `seconds`. */
static double cpu_seconds(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

/* ... and *util: CPUs kept busy meanwhile (both ends live in this process). */
static double measure(struct client *c, enum op op, double seconds, double *util)
{
	double t0 = now();
	do_op(c, op); /* warm-up, and the time of one */
	double one = now() - t0;
	long reps = one > 0 ? (long)(seconds / one) : 1;
	if (reps < 1)
		reps = 1;
	t0 = now();
	double c0 = cpu_seconds();
	for (long i = 0; i < reps; i++)
		do_op(c, op);
	double dt = now() - t0;
	*util = (cpu_seconds() - c0) / dt;
	double bytes = (double)reps * (double)c->n * 4.0 * (op == OP_BOTH ? 2 : 1);
	return bytes / dt / 1e9;
}

/* One connection: handshake, the three operations, DONE. gbs[op]. */
static void run_one(enum mode m, size_t n, const uint8_t *psk, double seconds, int threads,
		    double gbs[OP_COUNT], double util[OP_COUNT], const char **cipher)
{
	char e[512];
	struct server sv = { .mode = m, .n = n, .threads = threads };
	memcpy(sv.psk, psk, HS_PSK_BYTES);
	if (sock_listen("127.0.0.1", 0, 1, &sv.lfd, e, sizeof e))
		die("listen", e);
	int port = sock_local_port(sv.lfd);
	pthread_t th;
	if (pthread_create(&th, NULL, serve, &sv))
		die("pthread_create", strerror(errno));

	struct client c = { .n = n };
	c.rbuf = malloc(BUF_BYTES);
	c.wbuf = malloc(BUF_BYTES);
	c.params = malloc(n * sizeof(float));
	c.grads = malloc(n * sizeof(float));
	if (!c.rbuf || !c.wbuf || !c.params || !c.grads)
		die("client", "out of memory");
	for (size_t i = 0; i < n; i++)
		c.grads[i] = (float)i * -1e-6f;
	struct hs h;
	struct hs_result hr;
	struct hs_identity me = ident(HS_WORKER, m);
	uint8_t hello1[HS_HELLO_BYTES], hello2[HS_HELLO_BYTES];
	if (sock_connect_retry("127.0.0.1", (uint16_t)port, TIMEOUT_MS, &c.fd, e, sizeof e) ||
	    hs_client_start(&h, hello1, psk, &me, e, sizeof e) ||
	    sock_write_full(c.fd, hello1, sizeof hello1, TIMEOUT_MS, e, sizeof e) ||
	    sock_read_full(c.fd, hello2, sizeof hello2, TIMEOUT_MS, e, sizeof e) ||
	    hs_client_finish(&h, &hr, hello2, sizeof hello2, e, sizeof e))
		die("client handshake", e);
	*cipher = m == M_PLAIN ? "none" : frame_cipher_name(hr.send.cipher);
	if (m == M_AESNM && hr.send.cipher != FRAME_AES256GCM)
		die("aesnm", "this CPU has no AES-256-GCM");
	chan_init(&c.tx, m, &hr.send);
	chan_init(&c.rx, m, &hr.recv);
	struct cryptopool *pool = pool_start(threads);
	if (pipe_init(&c.pp, pool, c.wbuf, BUF_BYTES, e, sizeof e))
		die("client", e);

	for (int op = 0; op < OP_COUNT; op++)
		gbs[op] = measure(&c, (enum op)op, seconds, &util[op]);
	for (size_t i = 0; i < n; i++) /* what was pulled arrived intact */
		if (c.params[i] != (float)i * 1e-6f)
			die("client", "pulled vector arrived corrupted");

	size_t len, cap = BUF_BYTES - FRAME_HDR_BYTES - FRAME_TAG_BYTES;
	struct msg_done d = { .worker = 0 };
	if (msg_encode_done(c.wbuf + FRAME_HDR_BYTES, cap, &d, &len, e, sizeof e) ||
	    chan_send(c.fd, &c.tx, c.wbuf, len, e, sizeof e))
		die("client DONE", e);
	pthread_join(th, NULL);
	pipe_free(&c.pp);
	cryptopool_destroy(pool);
	close(c.fd);
	close(sv.lfd);
	sodium_memzero(sv.psk, sizeof sv.psk);
	sodium_memzero(&hr, sizeof hr);
	sodium_memzero(&c.tx, sizeof c.tx);
	sodium_memzero(&c.rx, sizeof c.rx);
	free(c.rbuf);
	free(c.wbuf);
	free(c.params);
	free(c.grads);
}

/* Seals (dir 0) or opens (dir 1) one 1 MiB frame in memory with chan c's
 * crypto: in is a frame header + message (seal) or header + ciphertext
 * (open); the result goes to out. Opening rewinds the counter so the same
 * frame opens every time. */
static void crypto_once(struct chan *c, int dir, uint8_t *in, uint8_t *out, size_t len)
{
	char e[256];
	size_t got = 0;
	int r = 0;
	uint8_t nonce[FRAME_NONCE_BYTES] = { 0 };
	unsigned long long cl = 0;
	if (dir == 1)
		c->fk.counter = 0;
	wire_put_u64(nonce, c->fk.counter);
	if (c->mode == M_PLAIN) {
		wire_put_u32(out, (uint32_t)(len + FRAME_TAG_BYTES));
		memcpy(out + FRAME_HDR_BYTES, in + FRAME_HDR_BYTES, len);
		memset(out + FRAME_HDR_BYTES + len, 0, FRAME_TAG_BYTES);
	} else if (c->mode == M_AESNM) {
		wire_put_u32(in, (uint32_t)(len + FRAME_TAG_BYTES));
		r = dir == 0 ? crypto_aead_aes256gcm_encrypt_afternm(out + FRAME_HDR_BYTES, &cl,
								     in + FRAME_HDR_BYTES, len, in,
								     FRAME_HDR_BYTES, NULL, nonce,
								     &c->st)
			     : crypto_aead_aes256gcm_decrypt_afternm(out, &cl, NULL,
								     in + FRAME_HDR_BYTES,
								     len + FRAME_TAG_BYTES, in,
								     FRAME_HDR_BYTES, nonce, &c->st);
		c->fk.counter++;
	} else if (dir == 0) {
		r = frame_seal(&c->fk, out, BUF_BYTES, in + FRAME_HDR_BYTES, len, &got, e, sizeof e);
	} else {
		r = frame_open(&c->fk, in, in + FRAME_HDR_BYTES, len + FRAME_TAG_BYTES, out,
			       BUF_BYTES, &got, e, sizeof e);
	}
	if (r)
		die("crypto", c->mode == M_AESNM ? "afternm failed" : e);
}

/* Seal (g[0]) and open (g[1]) GB/s of 1 MiB chunk frames on one thread in
 * memory with c's crypto, about seconds/2 each; a and b are BUF_BYTES. */
static void crypto_rate(struct chan *c, double seconds, uint8_t *a, uint8_t *b, double g[2])
{
	size_t len = MSG_CHUNK_BYTES_MAX;
	for (int dir = 0; dir < 2; dir++) {
		if (dir == 1) { /* a valid frame with counter 0 in b, opened into a */
			c->fk.counter = 0;
			crypto_once(c, 0, a, b, len);
		}
		long reps = 0;
		double t0 = now(), dt;
		do {
			crypto_once(c, dir, dir ? b : a, dir ? a : b, len);
			reps++;
			dt = now() - t0;
		} while (dt < seconds / 2);
		g[dir] = (double)reps * (double)len / dt / 1e9;
	}
}

/* The production cipher's one-core seal and open rates (g[0], g[1]). */
static void sealed_rates(double seconds, double g[2])
{
	uint8_t *a = calloc(1, BUF_BYTES), *b = calloc(1, BUF_BYTES), key[FRAME_KEY_BYTES];
	struct frame_key fk;
	struct chan c;
	if (!a || !b)
		die("crypto", "out of memory");
	randombytes_buf(key, sizeof key);
	randombytes_buf(a, BUF_BYTES);
	if (frame_key_init(&fk, key, frame_cipher_choose(frame_offers(), frame_offers())))
		die("crypto", "frame_key_init");
	chan_init(&c, M_SEALED, &fk);
	crypto_rate(&c, seconds, a, b, g);
	sodium_memzero(&c, sizeof c);
	sodium_memzero(&fk, sizeof fk);
	free(a);
	free(b);
}

/* CPUs this process may run on (the affinity mask). */
static int cpus_usable(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof set, &set) == 0)
		return CPU_COUNT(&set);
	return (int)sysconf(_SC_NPROCESSORS_ONLN);
}

/* --crypto: seal and open of 1 MiB chunk frames in memory, one thread, no
 * socket: the ceiling crypto alone puts on one connection. */
static void crypto_only(double seconds)
{
	uint8_t *a = calloc(1, BUF_BYTES), *b = calloc(1, BUF_BYTES), key[FRAME_KEY_BYTES];
	if (!a || !b)
		die("crypto", "out of memory");
	randombytes_buf(key, sizeof key);
	randombytes_buf(a, BUF_BYTES);
	printf("%-24s %-18s %10s %10s\n", "1 MiB frames, memory", "cipher", "seal GB/s",
	       "open GB/s");
	for (int m = 0; m < M_COUNT; m++) {
		unsigned offers = mode_offers((enum mode)m);
		if (m == M_AESNM && !offers)
			continue;
		struct frame_key fk;
		if (frame_key_init(&fk, key, frame_cipher_choose(offers, offers)))
			die("crypto", "frame_key_init");
		struct chan c;
		chan_init(&c, (enum mode)m, &fk);
		double g[2];
		crypto_rate(&c, seconds, a, b, g);
		printf("%-24s %-18s %10.2f %10.2f\n", mode_names[m],
		       m == M_PLAIN ? "none (memcpy)" : frame_cipher_name(fk.cipher), g[0], g[1]);
		sodium_memzero(&c, sizeof c);
	}
	free(a);
	free(b);
}

static const char *arg_str(int argc, char **argv, const char *name, const char *def)
{
	for (int i = 1; i + 1 < argc; i++)
		if (strcmp(argv[i], name) == 0)
			return argv[i + 1];
	return def;
}

static int arg_flag(int argc, char **argv, const char *name)
{
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], name) == 0)
			return 1;
	return 0;
}

/* One column of the table: a mode at a crypto thread count. */
struct variant {
	enum mode mode;
	int threads;     /* resolved: 1 = no pool */
	char name[16];   /* "sealed", or "sealed@2" when several counts run */
	const char *cipher;
};

#define MAX_VARIANTS 32

int main(int argc, char **argv)
{
	double seconds = atof(arg_str(argc, argv, "--seconds", "1"));
	int rounds = atoi(arg_str(argc, argv, "--rounds", "3"));
	int csv = arg_flag(argc, argv, "--csv");
	char sizes_s[128], modes_s[128], threads_s[128];
	snprintf(sizes_s, sizeof sizes_s, "%s", arg_str(argc, argv, "--sizes", "1,16,64"));
	snprintf(modes_s, sizeof modes_s, "%s", arg_str(argc, argv, "--modes", "sealed,plain"));
	snprintf(threads_s, sizeof threads_s, "%s", arg_str(argc, argv, "--crypto-threads", "1"));
	if (sodium_init() < 0)
		die("sodium_init", "failed");
	if (rounds < 1 || seconds <= 0)
		die("usage", "--rounds >= 1, --seconds > 0");
	if (arg_flag(argc, argv, "--crypto")) {
		crypto_only(seconds);
		return 0;
	}

	/* --crypto-threads N[,M...]: each count is a column of its own for the
	 * piped modes, interleaved with the others in every round, so counts
	 * are compared under the same load. */
	int counts[8], autos[8], ncounts = 0, any_auto = 0;
	for (char *t = strtok(threads_s, ","); t; t = strtok(NULL, ",")) {
		char *end;
		long ct = strtol(t, &end, 10);
		if (end == t || *end || ct < 0 || ct > CRYPTOPOOL_MAX_THREADS || ncounts == 8)
			die("--crypto-threads (0 = auto, 1..8, at most 8 values)", t);
		any_auto |= ct == 0;
		autos[ncounts] = ct == 0;
		counts[ncounts++] = cryptopool_threads_for((int)ct);
	}
	if (ncounts == 0)
		die("usage", "--crypto-threads needs a value");

	int sizes[16], nsizes = 0;
	for (char *t = strtok(sizes_s, ","); t && nsizes < 16; t = strtok(NULL, ","))
		if ((sizes[nsizes] = atoi(t)) > 0)
			nsizes++;
	struct variant v[MAX_VARIANTS];
	int nv = 0, plain = -1;
	for (char *t = strtok(modes_s, ","); t; t = strtok(NULL, ",")) {
		int k = 0;
		while (k < M_COUNT && strcmp(t, mode_names[k]) != 0)
			k++;
		if (k == M_COUNT)
			die("unknown mode (sealed, plain, aesnm, chacha, gcm, local)", t);
		int nc = piped((enum mode)k) ? ncounts : 1;
		for (int c = 0; c < nc && nv < MAX_VARIANTS; c++, nv++) {
			v[nv] = (struct variant){ .mode = (enum mode)k,
						  .threads = piped((enum mode)k) ? counts[c] : 1 };
			if (nc > 1 && autos[c])
				snprintf(v[nv].name, sizeof v[nv].name, "%s@auto", t);
			else if (nc > 1)
				snprintf(v[nv].name, sizeof v[nv].name, "%s@%d", t, counts[c]);
			else
				snprintf(v[nv].name, sizeof v[nv].name, "%s", t);
			if (k == M_PLAIN)
				plain = nv;
		}
	}
	if (nsizes == 0 || nv == 0)
		die("usage", "no sizes or no modes");

	const char *coretype = getenv("OPENBLAS_CORETYPE");
	int cpus = cpus_usable();
	if (!csv) {
		printf("%d CPUs usable (affinity mask); OPENBLAS_CORETYPE=%s; crypto threads per end:",
		       cpus, coretype ? coretype : "(unset)");
		for (int c = 0; c < ncounts; c++)
			printf("%s %d", c ? "," : "", counts[c]);
		printf("%s\n", any_auto ? " (auto = 0, resolved)" : "");
	}

	uint8_t psk[HS_PSK_BYTES];
	randombytes_buf(psk, sizeof psk);
	static double best[16][MAX_VARIANTS][OP_COUNT], util[16][MAX_VARIANTS][OP_COUNT];
	double so[2] = { 0, 0 }; /* one core's seal and open GB/s, best of the rounds */
	for (int r = 0; r < rounds; r++) {
		if (plain >= 0) { /* for the ceiling: see docs/BENCHMARKS.md, push/pull */
			double g[2];
			sealed_rates(seconds < 0.5 ? seconds : 0.5, g);
			so[0] = g[0] > so[0] ? g[0] : so[0];
			so[1] = g[1] > so[1] ? g[1] : so[1];
		}
		for (int si = 0; si < nsizes; si++)
			for (int vi = 0; vi < nv; vi++) {
				double g[OP_COUNT], u[OP_COUNT];
				size_t n = (size_t)sizes[si] << 18; /* MiB of floats */
				run_one(v[vi].mode, n, psk, seconds, v[vi].threads, g, u, &v[vi].cipher);
				for (int op = 0; op < OP_COUNT; op++)
					if (g[op] > best[si][vi][op]) {
						best[si][vi][op] = g[op];
						util[si][vi][op] = u[op];
					}
			}
	}
	sodium_memzero(psk, sizeof psk);

	if (!csv)
		printf("%-7s %-11s %-18s %10s %10s %10s\n", "size", "mode", "cipher", "push GB/s",
		       "pull GB/s", "push+pull");
	for (int si = 0; si < nsizes; si++) {
		char sz[32];
		snprintf(sz, sizeof sz, "%d MiB", sizes[si]);
		for (int vi = 0; vi < nv; vi++) {
			const double *b = best[si][vi];
			printf(csv ? "%s,%s,%s,%.3f,%.3f,%.3f\n" : "%-7s %-11s %-18s %10.2f %10.2f %10.2f\n",
			       sz, v[vi].name, v[vi].cipher, b[0], b[1], b[2]);
		}
		for (int vi = 0; vi < nv && plain >= 0; vi++) {
			if (vi == plain)
				continue;
			const double *b = best[si][vi], *q = best[si][plain];
			char nm[40];
			snprintf(nm, sizeof nm, "%s/plain", v[vi].name);
			printf(csv ? "%s,%s,ratio,%.3f,%.3f,%.3f\n" : "%-7s %-30s %9.2fx %9.2fx %9.2fx\n",
			       sz, nm, b[0] / q[0], b[1] / q[1], b[2] / q[2]);
		}
		if (plain >= 0 && so[0] > 0 && so[1] > 0) {
			/* ratio <= C / (U + P/S + P/O), at most 1 */
			double cl[OP_COUNT];
			for (int op = 0; op < OP_COUNT; op++) {
				double P = best[si][plain][op], U = util[si][plain][op];
				cl[op] = (double)cpus / (U + P / so[0] + P / so[1]);
				if (cl[op] > 1)
					cl[op] = 1;
			}
			char nm[48];
			snprintf(nm, sizeof nm, "cpu ceiling, %d CPUs", cpus);
			printf(csv ? "%s,%s,ceiling,%.3f,%.3f,%.3f\n" : "%-7s %-30s %9.2fx %9.2fx %9.2fx\n",
			       sz, nm, cl[0], cl[1], cl[2]);
		}
	}
	if (!csv && plain >= 0 && so[0] > 0 && so[1] > 0) {
		/* CPU seconds per GB do not depend on how loaded the machine is;
		 * the plain rate (and so the ratio ceiling) does. */
		double P = best[nsizes - 1][plain][OP_BOTH], U = util[nsizes - 1][plain][OP_BOTH];
		double cpu_gb = U / P + 1 / so[0] + 1 / so[1];
		printf("ceiling from: one core seals %.2f and opens %.2f GB/s in memory (best of"
		       " the rounds); plain push+pull at %d MiB: %.2f GB/s keeping %.2f CPUs busy;"
		       " so sealed costs %.2f CPU s/GB and %d free CPUs could move at most %.2f GB/s\n",
		       so[0], so[1], sizes[nsizes - 1], P, U, cpu_gb, cpus, cpus / cpu_gb);
	}
	return 0;
}
