/* Stateful libFuzzer harness for a worker's side of the protocol: what a
 * ps may say to a worker. docs/SECURITY.md lets a key holder act as a ps
 * to a worker whose connection it can redirect; this is the search for
 * what such a ps can do to that worker beyond training it badly. The
 * worker's real links (cluster/links.c and link.c: each link's sender and
 * receiver threads, the heartbeat thread, the crypto pool, the fan-out,
 * the staggered pushes, the parameters read into place) talk to 2 ps
 * whose connections the harness hands over already authenticated, one
 * socketpair each; everything the ps side sends comes from the input.
 *
 * The model is a 64-512-3 MLP, 34,819 parameters over 2 ps: a shard is 2
 * float32 chunks, so that the second is read into place (local frames),
 * opened into place (AEGIS-256 without a pool) or opened on the pool;
 * the elastic config's is 64-1024-3, 69,635 parameters, 3 chunks a
 * shard, so that with its pool of 2 crypto threads the last two are
 * opened together, into place by position (AEGIS-256) or copied.
 *
 * Byte 0 (mode):
 *   bits 0-2  what the worker does: 0 push and pull (links_exchange),
 *             1 pull, 2 the first pull (any version), 3 push alone,
 *             4 push and pull with a flow for the parameters (overlap),
 *             5 STATUS, 6 CHECKPOINT, 7 DONE
 *   bit 3     local frames (not sealed, as over a ps's Unix socket);
 *             else sealed, as over TCP (byte 1 bit 2 says with what)
 *   bit 4     [cluster] wire_dtype = bf16
 *   bit 5     piece mode (the PULL goes before the PUSH)
 *   bit 6     packed float32 (sealed links only, as over TCP)
 *   bit 7     the elastic config (3 workers, min_workers 1, 4 slices:
 *             VIEWs, and every push to ps 0 last)
 * Byte 1: bit 0 async; bit 1 wire_dtype = bf16_grads (without bit 4);
 *   bit 2 sealed frames in AEGIS-256 where this CPU has it (opened into
 *   place: the non-elastic config has one crypto thread, the elastic one
 *   two), else ChaCha20-Poly1305; bits 3-7 the version each link last
 *   pulled.
 * Then records [kind u8][len u8][len bytes], each turned into bytes from
 * the current ps (ps 0 at first):
 *   kind >= 250  the records that follow are ps (kind % 2)'s
 *   kind % 10 == 0  the bytes as a message, sealed in a frame
 *                1  the bytes raw on the wire (a broken frame layer)
 *                2  a PARAMS chunk: version, offset (0, one chunk,
 *                   two, or a byte), count (a whole chunk, the rest,
 *                   or a byte), dtype by the tens digit (0 float32,
 *                   1 bf16, 2 packed float32, 3 XORs with the poison
 *                   the buffer holds, of values a few bits from it,
 *                   else float32), the values from the bytes (NaN and
 *                   inf too)
 *                3  ACK(status, version)   4 HEARTBEAT(version, missing)
 *                5  STATUS reply(version, complete, shard)
 *                6  ERROR(text)            7 VIEW(version, rev, slices, live, base)
 *                8  the whole shard, right: every chunk in the config's
 *                   dtype, version from the bytes
 *                9  a frame sealed under another key (fails to open)
 * Each ps's bytes go out on a thread of its own while the worker's call
 * runs, then its writing half is shut; the call must end.
 *
 * After each call the worker must be sound: the call returned (no hang:
 * libFuzzer's -timeout), its error a single line; no link left
 * exchanging; the gradient it pushed untouched; and if it returned 0
 * after a pull, every parameter arrived (the buffer was poisoned with a
 * NaN no record can make). Sanitizers catch the rest. */
#include "../../base/err.h"
#include "../../cluster/links.h"
#include "../../cluster/role.h"
#include "../../core/config/config.h"
#include "../../core/shard.h"
#include "../../net/frame.h"
#include "../../net/key.h"
#include "../../net/msg.h"
#include "fuzz.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <sys/socket.h>

#define NPS 2
/* The parameters' poison: a NaN whose bits no record's values produce
 * (record_floats steers clear of it). */
#define POISON 0x7fbadbadu

static char dir[64];
static struct config cfg, cfg_el;
static struct role_setup setup, setup_el;
static FILE *devnull;
static uint8_t wire[NPS][1 << 20];
static float values[1 << 15];
static float poisoned[1 << 15]; /* what a pull's buffer holds before any of it arrived */
static uint8_t msg[FRAME_MAX];

static void write_text(const char *name, const char *text)
{
	char path[128];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	FUZZ_CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

static void config_from(struct config *c, struct role_setup *s, const char *name, const char *ini)
{
	char path[128], err[1024];
	write_text(name, ini);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FUZZ_CHECK(config_load(c, path, NULL, 0, err, sizeof(err)) == 0);
	if (role_setup_load(s, c, 0, err, sizeof(err)))
		fprintf(stderr, "fuzz_worker: %s\n", err);
	FUZZ_CHECK(s->job.m.nparams > 0);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	char err[1024], path[128], ini[1024], row[1024];
	FUZZ_CHECK(sodium_init() >= 0);
	signal(SIGPIPE, SIG_IGN);
	snprintf(dir, sizeof(dir), "/tmp/pstrain-fuzz-worker-XXXXXX");
	FUZZ_CHECK(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/cluster.key", dir);
	FUZZ_CHECK(key_generate(path, err, sizeof(err)) == 0);
	size_t at = (size_t)snprintf(row, sizeof(row), "1");
	for (int i = 0; i < 64; i++)
		at += (size_t)snprintf(row + at, sizeof(row) - at, ",%d", i % 7);
	snprintf(row + at, sizeof(row) - at, "\n");
	write_text("data.csv", row);
	static const char *const kinds[2] = {
		"workers = 127.0.0.1:3, 127.0.0.1:4\n",
		"workers = 127.0.0.1:3, 127.0.0.1:4, 127.0.0.1:5\nmin_workers = 1\n",
	};
	for (int el = 0; el < 2; el++) {
		snprintf(ini, sizeof(ini),
			 "[cluster]\nps = 127.0.0.1:1, 127.0.0.1:2\n%skey_file = %s/cluster.key\n"
			 "peer_timeout = 1\ncrypto_threads = %d\n"
			 "[data]\nformat = csv\ntrain_csv = %s/data.csv\nlabel_column = first\n"
			 "[train]\nsteps = 1000\n%sbatch_size = 1\nlearning_rate = 0.05\n"
			 "checkpoint_dir = %s/ckpt\nthreads = 1\n"
			 "[model]\ninput = 64\nlayer = dense %d\nlayer = relu\nlayer = dense 3\n",
			 kinds[el], dir, 1 + el, dir, el ? "slices = 4\n" : "", dir, el ? 1024 : 512);
		config_from(el ? &cfg_el : &cfg, el ? &setup_el : &setup, el ? "elastic.ini" : "cluster.ini",
			    ini);
	}
	for (size_t i = 0; i < sizeof(poisoned) / sizeof(poisoned[0]); i++) {
		uint32_t u = POISON;
		memcpy(&poisoned[i], &u, 4);
	}
	devnull = getenv("FUZZ_WORKER_LOG") ? stderr : fopen("/dev/null", "w");
	FUZZ_CHECK(devnull);
	return 0;
}

/* count values from the record's bytes from at on, cycled (zeros for an
 * empty record): any float, NaN and inf included, but never the poison. */
static void record_floats(const uint8_t *b, size_t n, size_t at, uint32_t count)
{
	for (uint32_t i = 0; i < count; i++) {
		uint32_t u = 0;
		for (int j = 0; j < 4 && n > at; j++)
			u |= (uint32_t)b[at + ((size_t)i * 4 + (size_t)j) % (n - at)] << (8 * j);
		u = u == POISON ? u ^ 1u : u;
		memcpy(&values[i], &u, 4);
	}
}

/* What the records of one ps need to know. */
struct ps_side {
	int k;                  /* the ps */
	size_t n;               /* its shard's values */
	unsigned dt;            /* the parameters' dtype in the config */
	struct frame_key tx;    /* its sending key (the worker's receiving one) */
	size_t out;             /* bytes in wire[k] */
	int fd;                 /* its end of the socketpair */
};

/* A ps's bytes, sent on a thread of their own, then its writing half shut:
 * the worker reads only once it has asked, and a socket buffer smaller
 * than the bytes (net.core.wmem_max is 208 KiB on a stock kernel) would
 * otherwise hold the harness before the worker's call begins. Ends when
 * all is sent or the worker's end is closed. */
static void *ps_send(void *arg)
{
	struct ps_side *p = arg;
	for (size_t done = 0; done < p->out;) {
		ssize_t w = send(p->fd, wire[p->k] + done, p->out - done, MSG_NOSIGNAL);
		if (w <= 0)
			break;
		done += (size_t)w;
	}
	shutdown(p->fd, SHUT_WR);
	return NULL;
}

/* msg (len bytes) sealed into ps p's bytes; other: under another key. */
static void ps_put(struct ps_side *p, size_t len, int other)
{
	char err[256];
	size_t flen = 0;
	if (!len || p->out + FRAME_SEALED_BYTES(len) > sizeof(wire[0]))
		return;
	struct frame_key k = p->tx;
	if (other)
		k.key[0] ^= 1;
	if (frame_seal(&k, wire[p->k] + p->out, sizeof(wire[0]) - p->out, msg, len, &flen, err,
		       sizeof(err)) == 0)
		p->out += flen;
	p->tx.counter = k.counter;
	sodium_memzero(&k, sizeof(k));
}

/* A PARAMS chunk of the shard, encoded into msg; its length or 0. */
static size_t chunk(const struct ps_side *p, unsigned dt, uint64_t version, uint64_t offset,
		    uint32_t count)
{
	char err[256];
	size_t len = 0;
	struct msg_chunk ch = { .type = WIRE_PARAMS, .dtype = (uint8_t)dt, .shard = (uint32_t)p->k,
				.version = version, .offset = offset, .count = count,
				.base = dt == WIRE_F32X ? poisoned : NULL };
	return msg_encode_chunk(msg, sizeof(msg), &ch, values, &len, err, sizeof(err)) == 0 ? len : 0;
}

/* Record kind 2: one chunk from the bytes. */
static void record_chunk(struct ps_side *p, int tens, const uint8_t *b, size_t n)
{
	static const unsigned dts[] = { WIRE_F32, WIRE_BF16, WIRE_F32P, WIRE_F32X };
	unsigned dt = tens < 4 ? dts[tens] : WIRE_F32;
	uint32_t mx = msg_chunk_max(dt), at = (uint32_t)fuzz_take(b, n, 1, 1), c = (uint32_t)fuzz_take(b, n, 2, 1);
	uint64_t off = at % 4 == 3 ? at / 4 : (uint64_t)(at % 4) * mx;
	uint32_t count = c == 0 ? mx : c == 1 ? (off < p->n ? (uint32_t)(p->n - off) : 1) : c;
	if (count > mx)
		count = mx;
	record_floats(b, n, 3, count);
	/* XORs against the poison the buffer holds: values a few low bits
	 * from it, so that they shrink and are sent as XORs, and pass
	 * their check where nothing arrived before them */
	for (uint32_t i = 0; dt == WIRE_F32X && i < count; i++) {
		uint32_t u;
		memcpy(&u, &values[i], 4);
		u = POISON ^ ((u & 0xffffu) | 1u);
		memcpy(&values[i], &u, 4);
	}
	ps_put(p, chunk(p, dt, fuzz_take(b, n, 0, 1), off, count), 0);
}

/* Record kind 8: the whole shard as a ps sends it. */
static void record_shard(struct ps_side *p, const uint8_t *b, size_t n)
{
	uint32_t mx = msg_chunk_max(p->dt);
	for (size_t off = 0; off < p->n; off += mx) {
		uint32_t count = p->n - off < mx ? (uint32_t)(p->n - off) : mx;
		record_floats(b, n, 2, count);
		for (uint32_t i = 0; i < count; i++)
			values[i] = isfinite(values[i]) ? values[i] : (float)i;
		ps_put(p, chunk(p, p->dt, fuzz_take(b, n, 0, 2), off, count), 0);
	}
}

/* One record (kind k, n bytes at b) into ps p's bytes. */
static void record_wire(struct ps_side *p, int k, const uint8_t *b, size_t n)
{
	char err[256];
	size_t len = 0;
	int r = -1;
	switch (k % 10) {
	case 0:
	case 9:
		memcpy(msg, b, n);
		ps_put(p, n, k % 10 == 9);
		return;
	case 1:
		if (p->out + n <= sizeof(wire[0])) {
			memcpy(wire[p->k] + p->out, b, n);
			p->out += n;
		}
		return;
	case 2:
		record_chunk(p, k / 10, b, n);
		return;
	case 8:
		record_shard(p, b, n);
		return;
	case 3: {
		struct msg_ack a = { .shard = (uint32_t)p->k, .version = fuzz_take(b, n, 1, 1),
				     .status = (uint32_t)fuzz_take(b, n, 0, 1) % 5 };
		r = msg_encode_ack(msg, sizeof(msg), &a, &len, err, sizeof(err));
		break;
	}
	case 4: {
		struct msg_heartbeat h = { .version = fuzz_take(b, n, 0, 1) };
		for (size_t i = 0; i < sizeof(h.missing); i++)
			h.missing[i] = (uint8_t)fuzz_take(b, n, 1 + i, 1);
		r = msg_encode_heartbeat(msg, sizeof(msg), &h, &len, err, sizeof(err));
		break;
	}
	case 5: {
		struct msg_status s = { .reply = 1, .complete = (uint8_t)(fuzz_take(b, n, 1, 1) & 1),
					.shard = (uint32_t)fuzz_take(b, n, 2, 1) % 3, .version = fuzz_take(b, n, 0, 1) };
		r = msg_encode_status(msg, sizeof(msg), &s, &len, err, sizeof(err));
		break;
	}
	case 6: {
		char text[64];
		size_t t = n < sizeof(text) - 1 ? n : sizeof(text) - 1;
		memcpy(text, b, t);
		text[t] = 0;
		r = msg_encode_error(msg, sizeof(msg), 1, text, &len, err, sizeof(err));
		break;
	}
	case 7: {
		struct msg_view v = { .version = fuzz_take(b, n, 0, 1), .rev = (uint32_t)fuzz_take(b, n, 1, 1),
				      .slices = (uint32_t)fuzz_take(b, n, 2, 1) % 6 };
		v.live[0] = (uint8_t)fuzz_take(b, n, 3, 1);
		v.base[0] = (uint8_t)fuzz_take(b, n, 4, 1);
		r = msg_encode_view(msg, sizeof(msg), &v, &len, err, sizeof(err));
		break;
	}
	}
	if (r == 0)
		ps_put(p, len, 0);
}

static void socket_pair(int sp[2])
{
	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0);
	int big = 4 << 20;
	for (int i = 0; i < 2; i++) {
		setsockopt(sp[i], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
		setsockopt(sp[i], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	}
}

/* Link k handed its connection (fd, keys made as a handshake would),
 * READY, having last pulled version got. */
static void link_attach(struct link *l, int fd, enum frame_cipher fc, uint64_t got)
{
	uint8_t k1[FRAME_KEY_BYTES], k2[FRAME_KEY_BYTES];
	memset(k1, 0x11, sizeof(k1));
	memset(k2, 0x22, sizeof(k2));
	struct hs_result hr;
	memset(&hr, 0, sizeof(hr));
	FUZZ_CHECK(frame_key_init(&hr.send, k1, fc) == 0);
	FUZZ_CHECK(frame_key_init(&hr.recv, k2, fc) == 0);
	hr.peer.role = HS_PS;
	hr.peer.index = (uint32_t)l->k;
	conn_attach(&l->conn, fd, &hr);
	frame_key_wipe(&hr.send);
	frame_key_wipe(&hr.recv);
	l->unx = fc == FRAME_LOCAL;
	l->got = got;
	pthread_mutex_lock(&l->mu);
	l->state = LINK_READY;
	l->end = LINK_OK;
	l->rc = 0;
	pthread_mutex_unlock(&l->mu);
}

/* The whole input's records into each ps's bytes. */
static void conversation(struct ps_side *ps, const uint8_t *data, size_t size)
{
	struct ps_side *p = &ps[0];
	size_t at = 2;
	while (at + 2 <= size) {
		int k = data[at];
		size_t n = data[at + 1];
		const uint8_t *b = data + at + 2;
		if (n > size - at - 2)
			n = size - at - 2;
		at += 2 + n;
		if (k >= 250)
			p = &ps[k % NPS];
		else
			record_wire(p, k, b, n);
	}
}

/* What the worker does with its links (byte 0's bits 0-2); the call's
 * result, and whether it pulled. */
static int worker_call(struct links *lk, int what, const float *grads, float *params,
		       struct gradflow *pf, int *pulled, char *err, size_t errlen)
{
	int complete = 0;
	*pulled = what <= 2 || what == 4;
	switch (what) {
	case 0: return links_exchange(lk, grads, params, err, errlen);
	case 1: return links_pull(lk, params, 0, err, errlen);
	case 2: return links_pull(lk, params, 1, err, errlen);
	case 3:
		links_exchange_begin(lk, grads, NULL, NULL, NULL);
		return links_exchange_end(lk, err, errlen);
	case 4:
		gradflow_reset(pf);
		links_exchange_begin(lk, grads, NULL, params, pf);
		return links_exchange_end(lk, err, errlen);
	case 5: return links_status(lk, &complete, err, errlen);
	case 6: return links_checkpoint(lk, 7, 0.5, err, errlen);
	default: return links_done(lk, 0, err, errlen);
	}
}

/* The invariants a ps cannot break (see the top of this file). */
static void worker_check(const struct links *lk, int r, int pulled, const char *err,
			 const float *grads, const float *grads0, const float *params, size_t P)
{
	FUZZ_CHECK(memcmp(grads, grads0, P * sizeof(float)) == 0);
	if (r) {
		FUZZ_CHECK(err[0] != '\0' && !strchr(err, '\n'));
	} else if (pulled) {
		for (size_t i = 0; i < P; i++) {
			uint32_t u;
			memcpy(&u, &params[i], 4);
			if (u == POISON)
				fprintf(stderr, "fuzz_worker: the call returned 0 with parameter %zu never received\n", i);
			FUZZ_CHECK(u != POISON);
		}
	}
	for (int k = 0; k < lk->nps; k++) {
		const struct link *l = &lk->ln[k];
		FUZZ_CHECK(l->state != LINK_EXCHANGING);
		/* A range a PULL wrote part of is marked torn, so that
		 * recovery does not keep it as the version before. */
		size_t untouched = 0, n = l->range.end - l->range.begin;
		for (size_t i = l->range.begin; i < l->range.end; i++) {
			uint32_t u;
			memcpy(&u, &params[i], 4);
			untouched += u == POISON;
		}
		if (untouched > 0 && untouched < n && !l->torn)
			fprintf(stderr, "fuzz_worker: ps %d's range is part written (%zu of %zu untouched) but not torn\n",
				k, untouched, n);
		FUZZ_CHECK(untouched == 0 || untouched == n || l->torn);
		FUZZ_CHECK(!(r == 0 && pulled && l->torn));
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static volatile sig_atomic_t stop;
	char err[1024] = "";
	if (size < 2)
		return 0;
	unsigned mode = data[0], opts = data[1];
	struct config *c = mode & 0x80 ? &cfg_el : &cfg;
	const struct role_setup *s = mode & 0x80 ? &setup_el : &setup;
	c->cluster.wire_dtype = mode & 0x10 ? PRECISION_BF16 : opts & 2 ? PRECISION_BF16_GRADS : PRECISION_FP32;
	c->train.mode = opts & 1 ? MODE_ASYNC : MODE_SYNC;
	enum frame_cipher fc = mode & 0x08			     ? FRAME_LOCAL
			       : opts & 4 && frame_aegis_available() ? FRAME_AEGIS256
								     : FRAME_CHACHA20POLY1305;
	size_t P = s->job.m.nparams;
	struct shard plan[NPS];
	shard_plan(plan, NPS, P);

	struct links lk;
	FUZZ_CHECK(links_open(&lk, c, s, plan, 0, &stop, devnull, err, sizeof(err)) == 0);
	lk.sh.pieces = (mode & 0x20) != 0;
	lk.sh.pack = fc != FRAME_LOCAL && (mode & 0x40);
	struct ps_side ps[NPS];
	int sp[NPS][2];
	for (int k = 0; k < NPS; k++) {
		socket_pair(sp[k]);
		link_attach(&lk.ln[k], sp[k][1], fc, opts >> 3);
		ps[k] = (struct ps_side){ .k = k, .n = plan[k].end - plan[k].begin, .dt = role_param_dtype(c) };
		uint8_t k2[FRAME_KEY_BYTES];
		memset(k2, 0x22, sizeof(k2));
		FUZZ_CHECK(frame_key_init(&ps[k].tx, k2, fc) == 0);
	}
	conversation(ps, data, size);
	pthread_t senders[NPS];
	for (int k = 0; k < NPS; k++) {
		frame_key_wipe(&ps[k].tx);
		ps[k].fd = sp[k][0];
		FUZZ_CHECK(pthread_create(&senders[k], NULL, ps_send, &ps[k]) == 0);
	}

	float *grads = malloc(P * sizeof(float)), *grads0 = malloc(P * sizeof(float));
	float *params = malloc(P * sizeof(float));
	FUZZ_CHECK(grads && grads0 && params);
	for (size_t i = 0; i < P; i++) {
		grads[i] = grads0[i] = (float)i * 1e-3f;
		uint32_t u = POISON;
		memcpy(&params[i], &u, 4);
	}
	struct gradflow pf;
	size_t begin[NPS] = { plan[0].begin, plan[1].begin }, end[NPS] = { plan[0].end, plan[1].end };
	FUZZ_CHECK(gradflow_init(&pf, P, NPS, begin, end, 2) == 0);
	int pulled = 0;
	int r = worker_call(&lk, mode & 7, grads, params, &pf, &pulled, err, sizeof(err));
	if (getenv("FUZZ_WORKER_LOG"))
		fprintf(stderr, "fuzz_worker: call %u returned %d: %s\n", mode & 7, r, r ? err : "");
	worker_check(&lk, r, pulled, err, grads, grads0, params, P);

	links_disconnect(&lk);   /* closes the worker's ends: a sender still at it stops */
	for (int k = 0; k < NPS; k++) {
		FUZZ_CHECK(pthread_join(senders[k], NULL) == 0);
		close(sp[k][0]);
	}
	links_close(&lk);
	gradflow_free(&pf);
	free(grads);
	free(grads0);
	free(params);
	return 0;
}
