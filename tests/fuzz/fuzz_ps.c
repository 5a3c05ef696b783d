/* Stateful libFuzzer harness for the ps's message handling (issue 13 item
 * 6): a key holder's whole conversation with a fresh ps, through a
 * connection the harness hands over already authenticated
 * (cluster/ps_harness.h), so every input runs the production path: key
 * confirmation, every handler, ERROR replies, shard updates, checkpoints
 * and rollbacks on disk.
 *
 * The input is a list of records, [kind u8][len u8][len bytes], each
 * turned into bytes on the worker's side of a socketpair:
 *   kind % 10 == 0  the bytes as a message, sealed in a frame
 *               1   the bytes raw on the wire (a broken frame layer)
 *               2   PULL(version from the bytes; its flags the kind
 *                   byte's tens digit: 12 PACKED, 32 PACKED and DELTA,
 *                   which a sync ps answers with XORs once it kept the
 *                   version before)
 *               3   PUSH chunk (offset, count, version, worker from the
 *                   bytes; the floats from the bytes: NaN and inf too;
 *                   in bf16 if the kind byte's tens digit is odd, 13,
 *                   33, ..., else in float32); 53: a piece's chunk of
 *                   factors (record_factors), which with a first byte
 *                   of 40..49 go to a ps whose first dense weight is
 *                   one whole piece (2 x 8192) and the second most of
 *                   two (8192 x 3)
 *               4   CHECKPOINT(step)   5 ROLLBACK(step)
 *               6   STATUS request     7 DONE(leaving)
 *               8   HEARTBEAT          9 ERROR(text)
 * and with a kind byte of 100..199, kind % 10 == 2 and 3 are the
 * embedding rows' messages, their bytes laid out by hand so that the
 * ids may come in any order (duplicates, unsorted, out of range):
 *               2   SPULL: version (0xff: the newest), total, first,
 *                   count, then count ids of 2 bytes
 *               3   SPUSH: version, total, first, count, worker, then
 *                   count ids of 2 bytes and count x 2 floats
 * An input whose first byte is 100..199 runs against a ps of a
 * click-through model (`embedding 26 20 2`: 520 rows of 2, a push of at
 * most 2 x 26 rows); one whose first byte is 60..99 against an elastic
 * ps (below); the others against the MLP of blobs.
 * The ps's [cluster] wire_dtype is bf16 if the input's first byte has an
 * odd tens digit (18: a HEARTBEAT first), else fp32, so both its
 * assemblies and a dtype it does not expect are reached. Worker 0's
 * frames are sealed with AEGIS-256 if that byte is odd and this CPU has
 * it (the ps, with one crypto thread, opens a push's chunks after the
 * first straight into place), else with ChaCha20-Poly1305.
 * If the input's first byte is under 200, the connection is worker 0's,
 * handed over authenticated; the peer's side shuts its writing half and
 * the ps serves it on this thread until the end.
 *
 * If it is 200 or more, the connections go through the ps's own admission
 * (ps_harness_greet, as from its gate: the greeting's destination, the
 * replay checks, the observer slots and their eviction) and are served on
 * threads of their own, the observer path of `pstrain status` (served by
 * cluster/ps_observers.c, which must refuse all but STATUS, HEARTBEAT and
 * ERROR). The first is an observer's fresh greeting to this ps; a record
 * whose kind byte is 250 or more starts the next connection (at most
 * SESSIONS_MAX) with a greeting made from its bytes:
 *   byte 0  bits 0-1 the role: 0 or 1 observer, 2 worker, 3 ps;
 *           bit 2 index 1 (an observer says 0; there is no worker 1);
 *           bit 3 for ps 1 (this is ps 0); bit 4 the previous greeting's
 *           bytes again (a replay), the rest ignored; bit 5 another key
 *   bytes 1-2  the time, s from now (int16)
 * The records after a greeting are that connection's frames, sealed with
 * its session keys if it was answered. Every connection stays open until
 * the input's end (observers that send no frame hold a slot meanwhile),
 * and the admission must keep its promises: a greeting for another ps,
 * with another key or already answered is never answered; a fresh
 * observer's greeting, for this ps, with the key and a time near ours, is
 * answered unless 4 observers that sent a frame may hold the slots.
 *
 * Elastic mode (first byte 60..99): ps 0 of the MLP with 3 workers listed,
 * min_workers = 1 and 4 slices a step (docs/ELASTIC.md), so its PULLs
 * wait for min_workers, fix a step's view and send VIEW before PARAMS,
 * and its members join, leave and are lost. Several workers' connections
 * are served at once, each on a thread of its own; the records go to the
 * current one (worker 0's at first), and with these kind bytes:
 *   200..209  LEAVE(worker: byte 0 % 4)
 *   210..219  VIEW (version, rev, slices, live, base from bytes 0..4):
 *             a worker's, which the ps must refuse
 *   240..249  worker (k - 240) % 3's connection shuts its writing half
 *             (the worker goes away: lost, unless it said DONE)
 *   250..255  the records that follow go to worker (k - 250) % 3's
 *             connection, opened now (a join, or a worker coming back)
 *             if it has none open (at most EL_CONNS in all); worker 1's
 *             frames are local (a worker beside its ps), worker 2's
 *             sealed with AEGIS-256 (where this CPU has it), worker 0's
 *             with ChaCha20-Poly1305
 * and a PUSH (kind % 10 == 3) names worker byte 0 & 3 and slice
 * (byte 0 >> 2) & 7 (4..7: no slice of the step). Then every connection
 * shuts its writing half and the ps's accept-loop round runs every 10 ms
 * (ps_harness_tick: a lost worker is dropped after peer_timeout, 50 ms
 * here, and its slices given to the others, or with none left the ps
 * stops, as the real one does) until every connection has ended: one that
 * has not within EL_END_S is a finding (a PULL that waits for ever).
 *
 * After each input the ps must be sound: every parameter and row finite, not
 * stopped by a peer, no connection left (ps_harness_check); sanitizers
 * catch the rest. One worker, sync (all but elastic mode): a PULL never
 * waits for another worker. */
#include "../../base/err.h"
#include "../../cluster/ps_harness.h"
#include "../../core/config/config.h"
#include "../../net/frame.h"
#include "../../net/key.h"
#include "../../net/msg.h"
#include "../../net/msg_rows.h"
#include "fuzz.h"

#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Greeting mode: connections an input makes at most. */
#define SESSIONS_MAX 8
/* Observer slots (cluster/ps_observers.h), as the invariant counts them. */
#define SLOTS 4
/* Elastic mode: workers listed, connections an input opens at most, and
 * how long its connections may take to end once every worker is gone. */
#define EL_WORKERS 3
#define EL_CONNS 8
#define EL_END_S 5

static char dir[64];
static uint8_t cluster_key[KEY_BYTES];
static char ckpt[96];
static struct config cfg, cfg_ctr, cfg_el, cfg_wide;
static size_t shard_n; /* the ps's values: its pieces for factors records */
static FILE *devnull;
static uint8_t wire[1 << 20];

static void write_text(const char *name, const char *text)
{
	char path[128];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	FUZZ_CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

/* ini written to dir/NAME and loaded into c. */
static void config_from(struct config *c, const char *name, const char *ini)
{
	char path[128], err[1024];
	write_text(name, ini);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FUZZ_CHECK(config_load(c, path, NULL, 0, err, sizeof(err)) == 0);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	char err[1024], path[128];
	FUZZ_CHECK(sodium_init() >= 0);
	signal(SIGPIPE, SIG_IGN);
	snprintf(dir, sizeof(dir), "/tmp/pstrain-fuzz-ps-XXXXXX");
	FUZZ_CHECK(mkdtemp(dir));
	snprintf(ckpt, sizeof(ckpt), "%s/ckpt", dir);
	snprintf(path, sizeof(path), "%s/cluster.key", dir);
	FUZZ_CHECK(key_generate(path, err, sizeof(err)) == 0);
	FUZZ_CHECK(key_load(cluster_key, path, err, sizeof(err)) == 0);
	write_text("blobs.csv", "0,1,2\n1,2,3\n2,3,4\n0,1,1\n");
	char ini[1024];
	/* The MLP of blobs, and one whose dense weights hold whole pieces,
	 * for factors (first byte 40..49). */
	const char *mlps[2] = { "dense 4", "dense 8192" };
	for (int w = 0; w < 2; w++) {
		snprintf(ini, sizeof(ini),
			 "[cluster]\nps = 127.0.0.1:1\nworkers = 127.0.0.1:2\nkey_file = %s/cluster.key\n"
			 "peer_timeout = 1\ncrypto_threads = 1\n"
			 "[data]\nformat = csv\ntrain_csv = %s/blobs.csv\nlabel_column = first\n"
			 "[train]\nsteps = 1000\nbatch_size = 2\nlearning_rate = 0.05\noptimizer = adam\n"
			 "checkpoint_dir = %s\nthreads = 1\n"
			 "[model]\ninput = 2\nlayer = %s\nlayer = relu\nlayer = dense 3\n",
			 dir, dir, ckpt, mlps[w]);
		config_from(w ? &cfg_wide : &cfg, w ? "wide.ini" : "cluster.ini", ini);
	}
	/* A click-through model's ps, for the embedding rows' messages. */
	write_text("ctr.txt", "1\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13"
			      "\t0a\t0b\t0c\t0d\t0e\t0f\t10\t11\t12\t13\t14\t15\t16"
			      "\t17\t18\t19\t1a\t1b\t1c\t1d\t1e\t1f\t20\t21\t22\t23\n");
	snprintf(ini, sizeof(ini),
		 "[cluster]\nps = 127.0.0.1:1\nworkers = 127.0.0.1:2\nkey_file = %s/cluster.key\n"
		 "peer_timeout = 1\ncrypto_threads = 1\n"
		 "[data]\nformat = criteo\ntrain_csv = %s/ctr.txt\n"
		 "[train]\nsteps = 1000\nbatch_size = 2\nlearning_rate = 0.05\noptimizer = adam\n"
		 "embedding_optimizer = lazy_adam\ncheckpoint_dir = %s\nthreads = 1\n"
		 "[model]\ninput = 13\nlayer = embedding 26 20 2\nlayer = dense 2\nlayer = relu\nlayer = dense 1\n"
		 "loss = sigmoid_cross_entropy\n",
		 dir, dir, ckpt);
	config_from(&cfg_ctr, "ctr.ini", ini);
	/* The elastic ps: the MLP, 3 workers listed, min_workers 1, 4 slices. */
	snprintf(ini, sizeof(ini),
		 "[cluster]\nps = 127.0.0.1:1\nworkers = 127.0.0.1:2, 127.0.0.1:3, 127.0.0.1:4\nmin_workers = 1\n"
		 "key_file = %s/cluster.key\npeer_timeout = 1\ncrypto_threads = 1\n"
		 "[data]\nformat = csv\ntrain_csv = %s/blobs.csv\nlabel_column = first\n"
		 "[train]\nsteps = 1000\nslices = 4\nbatch_size = 1\nlearning_rate = 0.05\noptimizer = adam\n"
		 "checkpoint_dir = %s\nthreads = 1\n"
		 "[model]\ninput = 2\nlayer = dense 4\nlayer = relu\nlayer = dense 3\n",
		 dir, dir, ckpt);
	config_from(&cfg_el, "elastic.ini", ini);
	/* Below the parser's 1 s floor, for this harness only: an input whose
	 * PULL waits on a worker gone costs 50 ms of ticks, not a second. */
	cfg_el.cluster.peer_timeout = 0.05;
	devnull = getenv("FUZZ_PS_LOG") ? stderr : fopen("/dev/null", "w");
	FUZZ_CHECK(devnull);
	return 0;
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st, (void)flag, (void)ftw;
	return remove(p);
}

/* An SPULL (push 0) or SPUSH record as its message, by hand: the header
 * from the record's first bytes, count ids of 2 bytes each as they come,
 * and for SPUSH count x 2 float32 values. */
static size_t record_rows(int push, const uint8_t *b, size_t n, uint8_t *msg, size_t cap)
{
	uint32_t count = (uint32_t)fuzz_take(b, n, 3, 1) % 200;
	size_t at = push ? 5 : 4, len = MSG_ROWS_HDR_BYTES + 8 * (size_t)count + (push ? 8 * (size_t)count : 0);
	if (len > cap)
		return 0;
	memset(msg, 0, MSG_ROWS_HDR_BYTES);
	msg[0] = push ? WIRE_SPUSH : WIRE_SPULL;
	uint64_t v = fuzz_take(b, n, 0, 1);
	wire_put_u64(msg + 8, v == 0xff && !push ? MSG_VERSION_LATEST : v);
	wire_put_u32(msg + 16, (uint32_t)fuzz_take(b, n, 1, 1));
	wire_put_u32(msg + 20, (uint32_t)fuzz_take(b, n, 2, 1));
	wire_put_u32(msg + 24, count);
	wire_put_u32(msg + 28, push ? (uint32_t)fuzz_take(b, n, 4, 1) % 2 : 0);
	for (uint32_t i = 0; i < count; i++)
		wire_put_u64(msg + MSG_ROWS_HDR_BYTES + 8 * (size_t)i, fuzz_take(b, n, at + 2 * i, 2));
	for (uint32_t i = 0; push && i < 2 * count; i++)
		wire_put_u32(msg + MSG_ROWS_HDR_BYTES + 8 * (size_t)count + 4 * (size_t)i,
			     (uint32_t)fuzz_take(b, n, at + 2 * (size_t)count + 4 * i, 4));
	return len;
}

/* The message of one record into msg (cap bytes); its length, or 0 for
 * none (a record whose fields the encoder refuses). */
/* A PUSH chunk of factors (kind 53): piece b[0] of the shard, the run
 * to the shard's end (b[1] odd) or over 1 to 3 pieces, batch b[3] % 4,
 * k = u16 at b[4] values (at most the piece's), repeating the 8 floats
 * from b[6]. */
static size_t record_factors(const uint8_t *b, size_t n, uint8_t *msg, size_t cap)
{
	size_t np = (shard_n + MSG_CHUNK_FLOATS - 1) / MSG_CHUNK_FLOATS, j = fuzz_take(b, n, 0, 1) % np;
	size_t off = j * MSG_CHUNK_FLOATS, left = shard_n - off;
	uint32_t count = (uint32_t)(left < MSG_CHUNK_FLOATS ? left : MSG_CHUNK_FLOATS);
	uint32_t b1 = (uint32_t)fuzz_take(b, n, 1, 1), run = (uint32_t)left;
	if (!(b1 & 1) && (size_t)count * (1 + (b1 >> 1) % 3) < left)
		run = count * (1 + (b1 >> 1) % 3);
	size_t k = fuzz_take(b, n, 4, 2) % (count + 1u);
	struct msg_chunk ch = { .type = WIRE_PUSH, .dtype = WIRE_F32F, .shard = 0, .worker = 0,
				.version = fuzz_take(b, n, 2, 1), .offset = off, .count = count };
	char err[256];
	size_t len = 0;
	if (msg_encode_chunk_factors(msg, cap, &ch, run, (uint32_t)fuzz_take(b, n, 3, 1) % 4, k, &len, err,
				     sizeof(err)))
		return 0;
	for (size_t i = 0; i < k; i++) {
		uint32_t u = (uint32_t)fuzz_take(b, n, 6 + 4 * (i % 8), 4);
		memcpy(msg + len - 4 * k + 4 * i, &u, 4);
	}
	msg_chunk_factors_seal(msg, &len);
	return len;
}

static size_t record_msg(int kind, int tens, int elastic, const uint8_t *b, size_t n, uint8_t *msg, size_t cap)
{
	uint32_t b0 = (uint32_t)fuzz_take(b, n, 0, 1);
	char err[256];
	size_t len = 0;
	int r = -1;
	switch (kind) {
	case 0:
		memcpy(msg, b, n);
		return n;
	case 2: {
		struct msg_pull p = { .flags = (uint8_t)(tens & MSG_PULL_FLAGS), .shard = 0,
				      .version = fuzz_take(b, n, 0, 1) == 0xff ? MSG_VERSION_LATEST
									     : fuzz_take(b, n, 1, 2) };
		r = msg_encode_pull(msg, cap, &p, &len, err, sizeof(err));
		break;
	}
	case 3:
		if (tens == 5 && !elastic)
			return record_factors(b, n, msg, cap);
		{
		static float f[64];
		struct msg_chunk ch = { .type = WIRE_PUSH, .dtype = tens % 2 ? WIRE_BF16 : WIRE_F32,
					.shard = 0, .worker = elastic ? (b0 & 3) | ((b0 >> 2) & 7) << 16 : b0 % 2,
					.version = fuzz_take(b, n, 1, 1), .offset = fuzz_take(b, n, 2, 1),
					.count = 1 + fuzz_take(b, n, 3, 1) % 64 };
		for (uint64_t i = 0; i < ch.count; i++) {
			uint32_t u = (uint32_t)fuzz_take(b, n, 4 + 4 * i, 4);
			memcpy(&f[i], &u, 4);
		}
		r = msg_encode_chunk(msg, cap, &ch, f, &len, err, sizeof(err));
		break;
		}
	case 4: {
		struct msg_checkpoint c = { .step = fuzz_take(b, n, 0, 2) };
		r = msg_encode_checkpoint(msg, cap, &c, &len, err, sizeof(err));
		break;
	}
	case 5: {
		struct msg_rollback c = { .step = fuzz_take(b, n, 0, 2) };
		r = msg_encode_rollback(msg, cap, &c, &len, err, sizeof(err));
		break;
	}
	case 6: {
		struct msg_status s = { .shard = (uint32_t)fuzz_take(b, n, 0, 1) % 2 };
		r = msg_encode_status(msg, cap, &s, &len, err, sizeof(err));
		break;
	}
	case 7: {
		struct msg_done d = { .worker = (uint32_t)fuzz_take(b, n, 0, 1) % 2,
				      .leaving = (uint8_t)(fuzz_take(b, n, 1, 1) & 1) };
		r = msg_encode_done(msg, cap, &d, &len, err, sizeof(err));
		break;
	}
	case 8: {
		struct msg_heartbeat h;
		memset(&h, 0, sizeof(h));
		r = msg_encode_heartbeat(msg, cap, &h, &len, err, sizeof(err));
		break;
	}
	case 9: {
		char text[64];
		size_t k = n < sizeof(text) - 1 ? n : sizeof(text) - 1;
		memcpy(text, b, k);
		text[k] = 0;
		r = msg_encode_error(msg, cap, 1 + (uint32_t)fuzz_take(b, n, 0, 1), text, &len, err, sizeof(err));
		break;
	}
	}
	return r == 0 ? len : 0;
}

/* Elastic mode's own messages (kind byte 200..219): LEAVE, or a VIEW as a
 * worker would never send one; 0 for none. */
static size_t record_elastic(int k, const uint8_t *b, size_t n, uint8_t *msg, size_t cap)
{
	char err[256];
	size_t len = 0;
	int r = -1;
	if (k < 210) {
		struct msg_leave l = { .worker = (uint32_t)fuzz_take(b, n, 0, 1) % 4 };
		r = msg_encode_leave(msg, cap, &l, &len, err, sizeof(err));
	} else if (k < 220) {
		struct msg_view v = { .version = fuzz_take(b, n, 0, 1), .rev = (uint32_t)fuzz_take(b, n, 1, 1),
				      .slices = (uint32_t)fuzz_take(b, n, 2, 1) };
		v.live[0] = (uint8_t)fuzz_take(b, n, 3, 1);
		v.base[0] = (uint8_t)fuzz_take(b, n, 4, 1);
		r = msg_encode_view(msg, cap, &v, &len, err, sizeof(err));
	}
	return r == 0 ? len : 0;
}

/* The bytes of one record (kind byte k, n bytes at b) sealed with tx
 * into wire at *out; elastic: an input of elastic mode. */
static void record_wire(int k, int elastic, const uint8_t *b, size_t n, struct frame_key *tx, size_t *out)
{
	static uint8_t msg[MSG_CHUNK_BYTES_MAX]; /* a chunk of factors may be a frame's */
	if (*out + FRAME_SEALED_BYTES(sizeof(msg)) >= sizeof(wire))
		return;
	if (k % 10 == 1) {
		memcpy(wire + *out, b, n);
		*out += n;
		return;
	}
	size_t len = elastic && k >= 200 ? record_elastic(k, b, n, msg, sizeof(msg))
		     : k >= 100 && k < 200 && (k % 10 == 2 || k % 10 == 3)
			     ? record_rows(k % 10 == 3, b, n, msg, sizeof(msg))
			     : record_msg(k % 10, k / 10, elastic, b, n, msg, sizeof(msg));
	size_t flen;
	char err[256];
	if (len && frame_seal(tx, wire + *out, sizeof(wire) - *out, msg, len, &flen, err,
			      sizeof(err)) == 0)
		*out += flen;
}

/* The next record of data at *at: its kind byte, bytes and length. */
static int record_next(const uint8_t *data, size_t size, size_t *at, const uint8_t **b, size_t *n)
{
	if (*at + 2 > size)
		return -1;
	int k = data[*at];
	*n = data[*at + 1];
	*b = data + *at + 2;
	if (*n > size - *at - 2)
		*n = size - *at - 2;
	*at += 2 + *n;
	return k;
}

/* The worker's bytes for the whole input into wire; their length. */
static size_t conversation(const uint8_t *data, size_t size, struct frame_key *tx)
{
	size_t at = 0, out = 0, n;
	const uint8_t *b;
	int k;
	while ((k = record_next(data, size, &at, &b, &n)) >= 0)
		record_wire(k, 0, b, n, tx, &out);
	return out;
}

static void send_all(int fd, const uint8_t *b, size_t n, int must)
{
	size_t done = 0;
	while (done < n) {
		ssize_t w = send(fd, b + done, n - done, MSG_NOSIGNAL);
		if (w <= 0 && !must)
			return; /* the ps closed it (an ERROR), or its buffer is full */
		FUZZ_CHECK(w > 0);
		done += (size_t)w;
	}
}

static void socket_pair(int sp[2])
{
	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0);
	int big = 4 << 20;
	setsockopt(sp[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	setsockopt(sp[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	setsockopt(sp[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	setsockopt(sp[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
}

/* ---- greeting mode ------------------------------------------------------- */

struct session {
	int fd;               /* our side */
	struct hs h;
	struct hs_result hr;
	uint8_t hello[HS_HELLO_BYTES];
	int answered, sent;   /* sent: a frame went on it, so it may have confirmed */
};

/* A greeting from a record's bytes (b, n; NULL: an observer's fresh one),
 * as session i; prev: the previous session's greeting. Returns whether
 * the ps must answer it if a slot can be had (an observer's, valid and
 * fresh), -1 whether it must never be (for another ps, another key, a
 * replay of one answered). */
static int greeting(struct session *ss, int i, const uint8_t *b, size_t n, const uint8_t hash[32],
		    uint64_t now_ns)
{
	struct session *s = &ss[i];
	char err[256];
	unsigned f = n ? b[0] : 0;
	int16_t off = (int16_t)fuzz_take(b, n, 1, 2);
	if ((f & 16) && i > 0) {
		memcpy(s->hello, ss[i - 1].hello, HS_HELLO_BYTES);
		for (int j = 0; j < i; j++)
			if (ss[j].answered && !memcmp(ss[j].hello, s->hello, HS_HELLO_BYTES))
				return -1;
		return 0;
	}
	static const enum hs_role roles[] = { HS_OBSERVER, HS_OBSERVER, HS_WORKER, HS_PS };
	struct hs_identity me = { .role = roles[f & 3], .index = (f & 4) ? 1 : 0,
				  .to = (f & 8) ? 1 : 0, .ciphers = frame_offers() };
	memcpy(me.config_hash, hash, 32);
	uint8_t other[KEY_BYTES];
	memset(other, 0x77, sizeof(other));
	uint64_t t = now_ns + (uint64_t)((int64_t)off * 1000000000) + (uint64_t)i;
	FUZZ_CHECK(hs_client_start_at(&s->h, s->hello, (f & 32) ? other : cluster_key, &me, t, err,
				      sizeof(err)) == 0);
	if ((f & 8) || (f & 32))
		return -1;
	return me.role == HS_OBSERVER && me.index == 0 && off >= -100 && off <= 100;
}

/* Greets the ps as session i and, if answered, finishes the handshake;
 * checks the admission's promise (want: greeting's return). */
static void session_open(struct ps_harness *h, struct session *ss, int i, int want)
{
	struct session *s = &ss[i];
	int sp[2];
	socket_pair(sp);
	s->fd = sp[0];
	ps_harness_greet(h, sp[1], s->hello); /* as read off the socket by the gate */
	uint8_t h2[HS_HELLO_BYTES];
	ssize_t got = recv(s->fd, h2, sizeof(h2), MSG_DONTWAIT);
	char err[256];
	s->answered = got == (ssize_t)sizeof(h2) &&
		      hs_client_finish(&s->h, &s->hr, h2, sizeof(h2), err, sizeof(err)) == 0;
	hs_wipe(&s->h);
	int busy = 0;
	for (int j = 0; j < i; j++)
		busy += ss[j].answered && ss[j].sent;
	if (want < 0 && got > 0)
		fprintf(stderr, "fuzz_ps: greeting %d (for another ps, another key, or a replay of "
				"one answered) was answered\n", i);
	FUZZ_CHECK(!(want < 0 && got > 0));
	if (want > 0 && busy < SLOTS && !s->answered)
		fprintf(stderr, "fuzz_ps: observer greeting %d refused with %d of %d slots possibly "
				"confirmed\n", i, busy, SLOTS);
	FUZZ_CHECK(!(want > 0 && busy < SLOTS && !s->answered));
}

/* Greeting mode's whole input: the first byte is the first connection's
 * first record's kind too. */
static void greetings(struct ps_harness *h, const uint8_t *data, size_t size, const uint8_t hash[32])
{
	static struct session ss[SESSIONS_MAX];
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t now_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	memset(ss, 0, sizeof(ss));
	int ns = 1;
	session_open(h, ss, 0, greeting(ss, 0, NULL, 0, hash, now_ns));
	size_t at = 0, n;
	const uint8_t *b;
	int k;
	while ((k = record_next(data, size, &at, &b, &n)) >= 0) {
		if (k >= 250) {
			if (ns == SESSIONS_MAX)
				break;
			session_open(h, ss, ns, greeting(ss, ns, b, n, hash, now_ns));
			ns++;
			continue;
		}
		struct session *s = &ss[ns - 1];
		if (!s->answered)
			continue;
		size_t out = 0;
		record_wire(k, 0, b, n, &s->hr.send, &out);
		send_all(s->fd, wire, out, 0);
		s->sent |= out > 0;
	}
	for (int i = 0; i < ns; i++)
		shutdown(ss[i].fd, SHUT_WR);
	ps_harness_settle(h);
	for (int i = 0; i < ns; i++) {
		close(ss[i].fd);
		frame_key_wipe(&ss[i].hr.send);
		frame_key_wipe(&ss[i].hr.recv);
	}
}

/* ---- elastic mode ---------------------------------------------------------- */

/* One worker's connection: our side (fd, sealing with tx) and the ps's
 * (served by ps_harness_serve on thread t until it ends). */
struct el_conn {
	struct ps_harness *h;
	int fd, ps_fd, w, shut;
	struct frame_key tx;
	struct hs_result hr;
	pthread_t t;
	int ended;   /* atomic: ps_harness_serve returned */
};

static void *el_serve(void *arg)
{
	struct el_conn *c = arg;
	ps_harness_serve(c->h, c->ps_fd, &c->hr, c->w);
	__atomic_store_n(&c->ended, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* Worker w's new connection, as cs[*n], served on a thread of its own;
 * one key per direction, as a handshake would have made. Worker 1 runs
 * beside the ps: its frames are local (FRAME_LOCAL, not sealed), and the
 * elastic ps, which aggregates whole gradients, reads their values
 * straight into its buffer (net/pipe.h pipe_place); worker 2's are
 * sealed with AEGIS-256 where this CPU has it, and opened there (the ps
 * has one crypto thread), worker 0's with ChaCha20-Poly1305; so a hostile frame
 * meets that path too. */
static struct el_conn *el_open(struct ps_harness *h, struct el_conn *cs, int *n, int w)
{
	struct el_conn *c = &cs[(*n)++];
	uint8_t k1[FRAME_KEY_BYTES], k2[FRAME_KEY_BYTES];
	memset(k1, 0x11 + *n, sizeof(k1));
	memset(k2, 0x22 + *n, sizeof(k2));
	memset(c, 0, sizeof(*c));
	c->h = h;
	c->w = w;
	c->hr.peer.role = HS_WORKER;
	enum frame_cipher fc = w == 1				  ? FRAME_LOCAL
			       : w == 2 && frame_aegis_available() ? FRAME_AEGIS256
								   : FRAME_CHACHA20POLY1305;
	FUZZ_CHECK(frame_key_init(&c->tx, k1, fc) == 0);
	FUZZ_CHECK(frame_key_init(&c->hr.recv, k1, fc) == 0);
	FUZZ_CHECK(frame_key_init(&c->hr.send, k2, fc) == 0);
	int sp[2];
	socket_pair(sp);
	c->fd = sp[0];
	c->ps_fd = sp[1];
	FUZZ_CHECK(pthread_create(&c->t, NULL, el_serve, c) == 0);
	return c;
}

/* Worker w's open connection, or NULL. */
static struct el_conn *el_find(struct el_conn *cs, int n, int w)
{
	for (int i = n - 1; i >= 0; i--)
		if (cs[i].w == w && !cs[i].shut)
			return &cs[i];
	return NULL;
}

static int el_all_ended(struct el_conn *cs, int n)
{
	for (int i = 0; i < n; i++)
		if (!__atomic_load_n(&cs[i].ended, __ATOMIC_ACQUIRE))
			return 0;
	return 1;
}

/* The whole input of elastic mode (see the top of this file). A send
 * that would block is cut short: a connection whose thread waits in a
 * PULL reads nothing until a tick frees it, and the ticks come after. */
static void elastic(struct ps_harness *h, const uint8_t *data, size_t size)
{
	static struct el_conn cs[EL_CONNS];
	int n = 0;
	struct el_conn *cur = el_open(h, cs, &n, 0);
	size_t at = 0, len;
	const uint8_t *b;
	int k;
	while ((k = record_next(data, size, &at, &b, &len)) >= 0) {
		if (k >= 240) {
			int w = (k % 10) % EL_WORKERS;
			struct el_conn *c = el_find(cs, n, w);
			if (k >= 250)
				cur = c ? c : n < EL_CONNS ? el_open(h, cs, &n, w) : cur;
			else if (c) {
				shutdown(c->fd, SHUT_WR);
				c->shut = 1;
			}
			continue;
		}
		if (cur->shut)
			continue;
		size_t out = 0;
		record_wire(k, 1, b, len, &cur->tx, &out);
		for (size_t done = 0; done < out;) {
			ssize_t s = send(cur->fd, wire + done, out - done, MSG_NOSIGNAL | MSG_DONTWAIT);
			if (s <= 0)
				break;
			done += (size_t)s;
		}
	}
	for (int i = 0; i < n; i++)
		shutdown(cs[i].fd, SHUT_WR);
	struct timespec t0, now, nap = { 0, 10 * 1000 * 1000 };
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (!el_all_ended(cs, n)) {
		ps_harness_tick(h);
		nanosleep(&nap, NULL);
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - t0.tv_sec > EL_END_S) {
			fprintf(stderr, "fuzz_ps: an elastic ps's connection did not end within %d s of every worker's going\n",
				EL_END_S);
			FUZZ_CHECK(0);
		}
	}
	for (int i = 0; i < n; i++) {
		FUZZ_CHECK(pthread_join(cs[i].t, NULL) == 0);
		close(cs[i].fd);
		frame_key_wipe(&cs[i].tx);
		frame_key_wipe(&cs[i].hr.send);
		frame_key_wipe(&cs[i].hr.recv);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[512];
	struct ps_harness *h = NULL;
	nftw(ckpt, rm_one, 8, FTW_DEPTH | FTW_PHYS);
	struct config *c = size && data[0] >= 100 && data[0] < 200 ? &cfg_ctr
			   : size && data[0] >= 60 && data[0] < 100 ? &cfg_el
			   : size && data[0] >= 40 && data[0] < 50 ? &cfg_wide : &cfg;
	shard_n = c == &cfg_wide ? 2 * 8192 + 8192 + 8192 * 3 + 3 : 2 * 4 + 4 + 4 * 3 + 3;
	c->cluster.wire_dtype = size && data[0] / 10 % 2 ? PRECISION_BF16 : PRECISION_FP32;
	FUZZ_CHECK(ps_harness_open(&h, c, 0, devnull, err, sizeof(err)) == 0);

	/* One key per direction, as a handshake would have made. */
	uint8_t k1[FRAME_KEY_BYTES], k2[FRAME_KEY_BYTES];
	memset(k1, 0x11, sizeof(k1));
	memset(k2, 0x22, sizeof(k2));
	struct frame_key wtx, wrx;
	struct hs_result hr;
	memset(&hr, 0, sizeof(hr));
	enum frame_cipher fc = size && data[0] % 2 && frame_aegis_available() ? FRAME_AEGIS256
									       : FRAME_CHACHA20POLY1305;
	FUZZ_CHECK(frame_key_init(&wtx, k1, fc) == 0);
	FUZZ_CHECK(frame_key_init(&wrx, k2, fc) == 0);
	FUZZ_CHECK(frame_key_init(&hr.recv, k1, fc) == 0);
	FUZZ_CHECK(frame_key_init(&hr.send, k2, fc) == 0);
	hr.peer.role = HS_WORKER;

	int sp[2] = { -1, -1 };
	if (c == &cfg_el) {
		elastic(h, data, size);
	} else if (size && data[0] >= 200) {
		uint8_t hash[CONFIG_HASH_BYTES];
		FUZZ_CHECK(config_hash(c, hash) == 0);
		greetings(h, data, size, hash);
	} else {
		socket_pair(sp);
		size_t n = conversation(data, size, &wtx);
		send_all(sp[0], wire, n, 1);
		shutdown(sp[0], SHUT_WR);
		int sr = ps_harness_serve(h, sp[1], &hr, 0);
		if (getenv("FUZZ_PS_LOG"))
			fprintf(stderr, "fuzz_ps: %zu bytes in, served: %d\n", n, sr);
	}
	int r = ps_harness_check(h, err, sizeof(err));
	if (r)
		fprintf(stderr, "fuzz_ps: %s\n", err);
	FUZZ_CHECK(r == 0);
	if (sp[0] >= 0)
		close(sp[0]);
	ps_harness_close(h);
	frame_key_wipe(&hr.send);
	frame_key_wipe(&hr.recv);
	return 0;
}
