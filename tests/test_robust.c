/* A ps under attack keeps serving (issue 3 items 1, 2, 7 and 9). Each test
 * starts one `pstrain ps` ($PSTRAIN_BIN) on 127.0.0.1 with a port the test
 * picks, attacks it from this process with the net modules (a wrong key,
 * random bytes, a stalled handshake; after a correct handshake, modified,
 * replayed, reordered, truncated and oversized frames; 64 connections at
 * once), checks the ps logged the peer and the reason, and then that a real
 * `pstrain worker --index 0` still trains to the end and the ps exits 0.
 * Plus backup workers: a stopped worker does not slow the chief's steps.
 * Every wait is bounded; on timeout the processes are killed. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include "leak.h"
#include "util.h"

#include "../core/config.h"
#include "../core/rng.h"
#include "../net/frame.h"
#include "../net/handshake.h"
#include "../net/key.h"
#include "../net/msg.h"
#include "../net/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RUN_TIMEOUT_S 40
#define IO_MS 5000

static char dir[256];
/* Every process a test started, killed by teardown if a failed assertion
 * left it running. */
static pid_t spawned[8];
static int nspawned;

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
	signal(SIGPIPE, SIG_IGN);
	test_dir_make(dir, sizeof(dir), "robust");
}

static void teardown(void)
{
	for (int i = 0; i < nspawned; i++)
		if (waitpid(spawned[i], NULL, WNOHANG) == 0) {
			kill(spawned[i], SIGKILL);
			waitpid(spawned[i], NULL, 0);
		}
	nspawned = 0;
	test_dir_remove(dir);
	leak_check();
}

TestSuite(robust, .init = setup, .fini = teardown, .timeout = 90);

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void nap_ms(long ms)
{
	struct timespec t = { ms / 1000, (ms % 1000) * 1000 * 1000 };
	nanosleep(&t, NULL);
}

/* The ps under test and what the attacker needs to speak to it. */
struct target {
	char cfg[300], log[300];
	int port;
	pid_t pid;
	uint8_t key[KEY_BYTES];
	uint8_t hash[CONFIG_HASH_BYTES];
};

/* blobs.csv, cluster.key and cluster.ini (1 ps, W workers) in dir; loads the
 * key and the config hash into t. */
static void target_write(struct target *t, int W, int steps, int batch, const char *extra)
{
	char path[300], err[KEY_ERR_MAX];
	snprintf(path, sizeof(path), "%s/blobs.csv", dir);
	write_blobs(path, 600, 3, 6, 3);
	snprintf(path, sizeof(path), "%s/cluster.key", dir);
	cr_assert_eq(key_generate(path, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(key_load(t->key, path, err, sizeof(err)), 0, "%s", err);
	snprintf(t->cfg, sizeof(t->cfg), "%s/cluster.ini", dir);
	snprintf(t->log, sizeof(t->log), "%s/ps0.log", dir);
	t->port = free_port();
	FILE *f = fopen(t->cfg, "w");
	cr_assert_not_null(f);
	fprintf(f, "[cluster]\nps = 127.0.0.1:%d\nworkers = ", t->port);
	for (int i = 0; i < W; i++)
		/* Workers are never listened on here: placeholder ports above
		 * Linux's ephemeral range (32768-60999), so the ps's port, which
		 * comes from that range, cannot collide with them. */
		fprintf(f, "%s127.0.0.1:%d", !i ? "" : i % 8 ? ", " : ",\n  ", 61000 + i);
	fprintf(f, "\nkey_file = cluster.key\n"
		   "[data]\nformat = csv\ntrain_csv = blobs.csv\nlabel_column = first\n"
		   "[train]\nsteps = %d\nbatch_size = %d\nlearning_rate = 0.05\noptimizer = momentum\n"
		   "momentum = 0.9\neval_every = 10\nthreads = 1\n%s"
		   "[model]\ninput = 6\nlayer = dense 16\nlayer = relu\nlayer = dense 3\n",
		steps, batch, extra);
	cr_assert_eq(fclose(f), 0);
	struct config *c = malloc(sizeof(*c));
	cr_assert_not_null(c);
	char cerr[CONFIG_ERR_MAX];
	cr_assert_eq(config_load(c, t->cfg, NULL, 0, cerr, sizeof(cerr)), 0, "%s", cerr);
	cr_assert_eq(config_hash(c, t->hash), 0);
	free(c);
}

/* spawn_pstrain, remembering the process for teardown. */
static pid_t spawn(const char *const *args, const char *outpath)
{
	pid_t pid = spawn_pstrain(args, outpath, NULL);
	if (nspawned < (int)(sizeof(spawned) / sizeof(spawned[0])))
		spawned[nspawned++] = pid;
	return pid;
}

static void start_ps(struct target *t, int W, int steps, int batch, const char *extra)
{
	target_write(t, W, steps, batch, extra);
	const char *args[] = { "ps", "--index", "0", "--config", t->cfg, NULL };
	t->pid = spawn(args, t->log);
}

/* Waits (bounded) for the ps's log to contain needle; returns the log. */
static char *wait_log(const struct target *t, const char *needle)
{
	double t0 = now_s();
	char *log;
	while (!strstr(log = slurp(t->log), needle) && now_s() - t0 < 5)
		nap_ms(20);
	return log;
}

/* The log line holding needle and the peer "127.0.0.1:PORT" of fd. */
static void assert_logged(const struct target *t, int fd, const char *needle)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	char peer[64];
	snprintf(peer, sizeof(peer), "127.0.0.1:%u:", ntohs(a.sin_port));
	char *log = wait_log(t, peer);
	const char *line = strstr(log, peer);
	cr_assert_not_null(line, "the ps did not log the peer %s:\n%s", peer, log);
	const char *eol = strchr(line, '\n');
	const char *hit = strstr(line, needle);
	cr_assert(hit && (!eol || hit < eol), "no \"%s\" on the line of %s:\n%s", needle, peer, log);
	cr_assert_null(strstr(eol ? eol : line + 1, peer), "%s logged more than once:\n%s", peer, log);
}

/* The ps still serves: a real worker 0 trains to the end, both exit 0. */
static void real_worker_finishes(struct target *t)
{
	char wlog[300];
	snprintf(wlog, sizeof(wlog), "%s/worker0.log", dir);
	const char *args[] = { "worker", "--index", "0", "--config", t->cfg, NULL };
	pid_t pids[2] = { t->pid, spawn(args, wlog) };
	int st[2];
	wait_children(pids, 2, st, RUN_TIMEOUT_S);
	cr_assert_eq(st[1], 0, "worker exit %d:\n%s\nps:\n%s", st[1], slurp(wlog), slurp(t->log));
	cr_assert_eq(st[0], 0, "ps exit %d:\n%s", st[0], slurp(t->log));
	cr_assert_not_null(strstr(slurp(wlog), "done: "), "%s", slurp(wlog));
}

static int dial(const struct target *t)
{
	int fd;
	char err[256];
	cr_assert_eq(sock_connect_retry("127.0.0.1", (uint16_t)t->port, 10000, &fd, err, sizeof(err)),
		     0, "%s", err);
	return fd;
}

/* Sends HELLO1 as worker `index` with key. */
static void hello(int fd, struct hs *h, const uint8_t *key, const struct target *t, uint32_t index)
{
	uint8_t h1[HS_HELLO_BYTES];
	char err[256];
	struct hs_identity me = { .role = HS_WORKER, .index = index, .aes = frame_aes_available() };
	memcpy(me.config_hash, t->hash, HS_HASH_BYTES);
	cr_assert_eq(hs_client_start(h, h1, key, &me, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(sock_write_full(fd, h1, sizeof(h1), IO_MS, err, sizeof(err)), 0, "%s", err);
}

static void hello_finish(int fd, struct hs *h, struct hs_result *hr)
{
	uint8_t h2[HS_HELLO_BYTES];
	char err[256];
	cr_assert_eq(sock_read_full(fd, h2, sizeof(h2), IO_MS, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(hs_client_finish(h, hr, h2, sizeof(h2), err, sizeof(err)), 0, "%s", err);
}

static void send_bytes(int fd, const void *b, size_t n);

/* A sealed HEARTBEAT, as a real worker sends right after its handshake:
 * the ps counts the connection as the worker once it opens. */
static void confirm(int fd, struct hs_result *hr)
{
	uint8_t m[64], f[128];
	size_t len, flen;
	char err[256];
	struct msg_heartbeat hb;
	memset(&hb, 0, sizeof(hb));
	cr_assert_eq(msg_encode_heartbeat(m, sizeof(m), &hb, &len, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(frame_seal(&hr->send, f, sizeof(f), m, len, &flen, err, sizeof(err)), 0, "%s", err);
	send_bytes(fd, f, flen);
}

/* Connects and completes a correct handshake as worker index, confirmed
 * by a first frame unless raw. */
static int attacker_as(const struct target *t, uint32_t index, struct hs_result *hr, int raw)
{
	int fd = dial(t);
	struct hs h;
	hello(fd, &h, t->key, t, index);
	hello_finish(fd, &h, hr);
	if (!raw)
		confirm(fd, hr);
	return fd;
}

/* Seals a PULL of shard 0 at version 0 into out; returns the frame's length. */
static size_t sealed_pull(struct frame_key *tx, uint8_t *out, size_t cap)
{
	uint8_t m[64];
	size_t len, flen;
	char err[256];
	struct msg_pull p = { .shard = 0, .version = 0 };
	cr_assert_eq(msg_encode_pull(m, sizeof(m), &p, &len, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(frame_seal(tx, out, cap, m, len, &flen, err, sizeof(err)), 0, "%s", err);
	return flen;
}

static void send_bytes(int fd, const void *b, size_t n)
{
	char err[256];
	cr_assert_eq(sock_write_full(fd, b, n, IO_MS, err, sizeof(err)), 0, "%s", err);
}

/* The ps closes fd without sending anything more, within limit_ms; returns
 * how long that took in seconds. */
static double expect_closed(int fd, int limit_ms)
{
	uint8_t b;
	char err[256];
	double t0 = now_s();
	int r = sock_read_full(fd, &b, 1, limit_ms, err, sizeof(err));
	cr_assert(r == -EPIPE || r == -ECONNRESET, "expected the ps to close, got %d (%s)", r,
		  r ? err : "a byte");
	return now_s() - t0;
}

/* Reads the PARAMS reply to a PULL (the model has one chunk). */
static void read_params(int fd, struct hs_result *hr)
{
	static uint8_t buf[FRAME_CT_MAX];
	size_t len;
	char err[256];
	cr_assert_eq(sock_read_frame(fd, &hr->recv, buf, sizeof(buf), &len, IO_MS, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(msg_type(buf, len, err, sizeof(err)), WIRE_PARAMS, "%s", err);
}

static void wipe(struct hs_result *hr)
{
	frame_key_wipe(&hr->send);
	frame_key_wipe(&hr->recv);
}

/* ---- attacks on one connection --------------------------------------------
 * A table: each row attacks a ps on one connection, before the handshake or
 * after a correct one as worker 0. The ps must drop that connection (within
 * limit_ms, and within max_s seconds where set), log both needles with the
 * attacker's port, and still train a real worker to the end. */

/* Criterion may run each row in a fresh process image, so a row holds no
 * pointers: the attack is an index into attack_fns, the texts are arrays. */
struct attack {
	char name[40];
	int authed;   /* a correct handshake as worker 0 first (2: and no
		       * HEARTBEAT after it: the attack's is the first frame) */
	int fn;       /* attack_fns[fn] */
	int limit_ms;
	double max_s; /* 0: no bound beyond limit_ms */
	char logged[2][48];
};

/* A hello under another cluster key. */
static void wrong_key(const struct target *t, int fd, struct hs_result *hr)
{
	(void)hr;
	uint8_t other[KEY_BYTES];
	randombytes_buf(other, sizeof(other));
	struct hs h;
	hello(fd, &h, other, t, 0);
	hs_wipe(&h);
}

static void random_hello(const struct target *t, int fd, struct hs_result *hr)
{
	(void)t, (void)hr;
	uint8_t junk[HS_HELLO_BYTES];
	randombytes_buf(junk, sizeof(junk));
	send_bytes(fd, junk, sizeof(junk));
}

/* Part of a hello, then silence: dropped after the handshake timeout. */
static void stalled_hello(const struct target *t, int fd, struct hs_result *hr)
{
	(void)hr;
	struct hs h;
	uint8_t h1[HS_HELLO_BYTES];
	char err[256];
	struct hs_identity me = { .role = HS_WORKER, .index = 0, .aes = frame_aes_available() };
	memcpy(me.config_hash, t->hash, HS_HASH_BYTES);
	cr_assert_eq(hs_client_start(&h, h1, t->key, &me, err, sizeof(err)), 0, "%s", err);
	hs_wipe(&h);
	send_bytes(fd, h1, 40);
}

static void bit_flip_in_length(const struct target *t, int fd, struct hs_result *hr)
{
	(void)t;
	uint8_t f[128];
	size_t n = sealed_pull(&hr->send, f, sizeof(f) - 1);
	f[0] ^= 1; /* one more ciphertext byte claimed: send one */
	f[n++] = 0;
	send_bytes(fd, f, n);
}

static void bit_flip_in_body(const struct target *t, int fd, struct hs_result *hr)
{
	(void)t;
	uint8_t f[128];
	size_t n = sealed_pull(&hr->send, f, sizeof(f));
	f[FRAME_HDR_BYTES + 3] ^= 0x10;
	send_bytes(fd, f, n);
}

static void replayed_frame(const struct target *t, int fd, struct hs_result *hr)
{
	(void)t;
	uint8_t f[128];
	size_t n = sealed_pull(&hr->send, f, sizeof(f));
	send_bytes(fd, f, n);
	read_params(fd, hr); /* the first one is served */
	send_bytes(fd, f, n);
}

static void reordered_frames(const struct target *t, int fd, struct hs_result *hr)
{
	(void)t;
	uint8_t a[128], b[128];
	size_t na = sealed_pull(&hr->send, a, sizeof(a));
	size_t nb = sealed_pull(&hr->send, b, sizeof(b));
	send_bytes(fd, b, nb);
	send_bytes(fd, a, na);
}

static void truncated_frame(const struct target *t, int fd, struct hs_result *hr)
{
	(void)t;
	uint8_t f[128];
	size_t n = sealed_pull(&hr->send, f, sizeof(f));
	send_bytes(fd, f, n - 7);
	cr_assert_eq(shutdown(fd, SHUT_WR), 0);
}

static void oversized_length(const struct target *t, int fd, struct hs_result *hr)
{
	(void)t, (void)hr;
	uint8_t f[FRAME_HDR_BYTES + 16];
	uint32_t big = (uint32_t)FRAME_CT_MAX + 1;
	for (int i = 0; i < 4; i++)
		f[i] = (uint8_t)(big >> (8 * i));
	memset(f + FRAME_HDR_BYTES, 0xab, 16);
	send_bytes(fd, f, sizeof(f));
}

#define CLOSED "closed worker 0's connection"

typedef void attack_fn(const struct target *t, int fd, struct hs_result *hr);
static attack_fn *const attack_fns[] = { wrong_key, random_hello, stalled_hello, bit_flip_in_length,
					  bit_flip_in_body, replayed_frame, reordered_frames,
					  truncated_frame, oversized_length };

static struct attack attacks[] = {
	{ "wrong_key_gets_no_reply", 0, 0, IO_MS, 0, { "handshake refused", "failed authentication" } },
	{ "random_bytes_instead_of_hello", 0, 1, IO_MS, 0,
	  { "handshake refused", "failed authentication" } },
	{ "stalled_handshake_is_dropped", 0, 2, 15000, 3.0, { "idle past", "handshake_timeout" } },
	{ "bit_flip_in_length", 1, 3, IO_MS, 0, { CLOSED, "failed authentication" } },
	{ "bit_flip_in_body", 1, 4, IO_MS, 0, { CLOSED, "failed authentication" } },
	{ "replayed_frame", 1, 5, IO_MS, 0, { CLOSED, "failed authentication" } },
	{ "reordered_frames", 1, 6, IO_MS, 0, { CLOSED, "failed authentication" } },
	{ "truncated_frame", 1, 7, IO_MS, 0, { CLOSED, "peer closed the connection after" } },
	{ "oversized_length", 1, 8, IO_MS, 0, { CLOSED, "exceeds the limit" } },
	/* Until a frame opens, the connection is not worker 0's. */
	{ "bad_first_frame_is_not_the_worker", 2, 4, IO_MS, 0,
	  { "before any frame opened", "not counted as worker 0" } },
};

ParameterizedTestParameters(robust, attack_on_one_connection)
{
	return cr_make_param_array(struct attack, attacks, sizeof(attacks) / sizeof(attacks[0]));
}

ParameterizedTest(struct attack *a, robust, attack_on_one_connection)
{
	struct target t;
	start_ps(&t, 1, 20, 16, "");
	struct hs_result hr;
	memset(&hr, 0, sizeof(hr));
	int fd = a->authed ? attacker_as(&t, 0, &hr, a->authed == 2) : dial(&t);
	cr_assert_lt((size_t)a->fn, sizeof(attack_fns) / sizeof(attack_fns[0]), "%s: no attack %d", a->name, a->fn);
	attack_fns[a->fn](&t, fd, &hr);
	double took = expect_closed(fd, a->limit_ms);
	if (a->max_s > 0)
		cr_assert_lt(took, a->max_s, "%s: the ps held the connection for %.1f s", a->name, took);
	for (int i = 0; i < 2; i++)
		assert_logged(&t, fd, a->logged[i]);
	close(fd);
	if (a->authed)
		wipe(&hr);
	real_worker_finishes(&t);
}

/* ---- capacity and backup workers ------------------------------------------ */

/* Item 7: 64 workers connect at once, each handshakes and is served a PULL
 * while all 64 are open; workers 1..63 then say DONE and leave, worker 0's raw
 * connection just closes and the real worker 0 trains (async: it needs no
 * one else's gradients). */
Test(robust, sixty_four_concurrent_workers)
{
	enum { N = 64 };
	struct target t;
	start_ps(&t, N, 20, 2, "mode = async\n");
	static struct hs h[N];
	static struct hs_result hr[N];
	int fd[N];
	for (int i = 0; i < N; i++)
		fd[i] = dial(&t);
	for (int i = 0; i < N; i++)
		hello(fd[i], &h[i], t.key, &t, (uint32_t)i);
	for (int i = 0; i < N; i++)
		hello_finish(fd[i], &h[i], &hr[i]);
	uint8_t f[128];
	for (int i = 0; i < N; i++) {
		uint8_t m[64];
		size_t len, flen;
		char err[256];
		struct msg_pull p = { .shard = 0, .version = MSG_VERSION_LATEST };
		cr_assert_eq(msg_encode_pull(m, sizeof(m), &p, &len, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(frame_seal(&hr[i].send, f, sizeof(f), m, len, &flen, err, sizeof(err)), 0);
		send_bytes(fd[i], f, flen);
	}
	for (int i = 0; i < N; i++)
		read_params(fd[i], &hr[i]);
	for (int i = 1; i < N; i++) {
		uint8_t m[64];
		size_t len, flen;
		char err[256];
		/* DONE, leaving: otherwise the ps would wait peer_timeout
		 * for them to come back before finishing. */
		struct msg_done d = { .worker = (uint32_t)i, .leaving = 1 };
		cr_assert_eq(msg_encode_done(m, sizeof(m), &d, &len, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(frame_seal(&hr[i].send, f, sizeof(f), m, len, &flen, err, sizeof(err)), 0);
		send_bytes(fd[i], f, flen);
	}
	for (int i = 0; i < N; i++) {
		close(fd[i]);
		wipe(&hr[i]);
	}
	real_worker_finishes(&t);
	cr_assert_not_null(strstr(slurp(t.log), "all 64 workers done"), "%s", slurp(t.log));
}

/* Item 9: replicas_to_aggregate = 1 of 2 workers; worker 1 is stopped before
 * it connects and the chief still runs all its steps; once worker 1 is
 * continued it trains too and every process exits 0. */
Test(robust, stopped_backup_worker_does_not_slow_steps)
{
	struct target t;
	start_ps(&t, 2, 100, 16, "mode = sync\nreplicas_to_aggregate = 1\n");
	char log1[300], log0[300];
	snprintf(log1, sizeof(log1), "%s/worker1.log", dir);
	snprintf(log0, sizeof(log0), "%s/worker0.log", dir);
	const char *a1[] = { "worker", "--index", "1", "--config", t.cfg, NULL };
	pid_t w1 = spawn(a1, log1);
	cr_assert_eq(kill(w1, SIGSTOP), 0);
	const char *a0[] = { "worker", "--index", "0", "--config", t.cfg, NULL };
	double t0 = now_s();
	pid_t w0 = spawn(a0, log0);
	int st0[1];
	wait_children(&w0, 1, st0, 20);
	double took = now_s() - t0;
	int s;
	int w1_alive = waitpid(w1, &s, WNOHANG) == 0, ps_alive = waitpid(t.pid, &s, WNOHANG) == 0;
	kill(w1, SIGCONT);
	pid_t rest[2] = { t.pid, w1 };
	int st[2];
	if (!ps_alive || !w1_alive) {
		kill(t.pid, SIGKILL);
		kill(w1, SIGKILL);
	}
	wait_children(rest, 2, st, RUN_TIMEOUT_S);
	cr_assert_eq(st0[0], 0, "chief exit %d after %.1f s:\n%s\nps:\n%s", st0[0], took, slurp(log0),
		     slurp(t.log));
	cr_assert_not_null(strstr(slurp(log0), "done: 100 steps"), "%s", slurp(log0));
	cr_assert(ps_alive && w1_alive, "the ps or the stopped worker exited early:\n%s",
		  slurp(t.log));
	cr_assert_eq(st[1], 0, "worker 1 exit %d:\n%s", st[1], slurp(log1));
	cr_assert_eq(st[0], 0, "ps exit %d:\n%s", st[0], slurp(t.log));
	cr_assert_not_null(strstr(slurp(t.log), "all 2 workers done"), "%s", slurp(t.log));
}
