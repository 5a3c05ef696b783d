/* See target.h. */
#include "target.h"
#include "leak.h"
#include "util.h"

#include <criterion/criterion.h>

#include "../core/config/config.h"
#include "../net/msg.h"
#include "../net/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#define IO_MS 5000

char target_dir[256];

/* Every process this test started (each test is a process of its own). */
static pid_t spawned[8];
static int nspawned;

void target_setup(void)
{
	cr_assert_geq(sodium_init(), 0);
	signal(SIGPIPE, SIG_IGN);
	test_dir_make(target_dir, sizeof(target_dir), criterion_current_suite->name);
}

void target_teardown(void)
{
	for (int i = 0; i < nspawned; i++)
		if (waitpid(spawned[i], NULL, WNOHANG) == 0) {
			kill(spawned[i], SIGKILL);
			waitpid(spawned[i], NULL, 0);
		}
	nspawned = 0;
	test_dir_remove(target_dir);
	leak_check();
}

/* A test that starts more than the table holds fails rather than leave a
 * process that teardown would not kill. */
pid_t target_spawn(const char *const *args, const char *outpath)
{
	return target_spawn_env(args, outpath, NULL);
}

pid_t target_spawn_env(const char *const *args, const char *outpath, const char *env)
{
	pid_t pid = spawn_pstrain(args, outpath, env);
	cr_assert_lt(nspawned, (int)(sizeof(spawned) / sizeof(spawned[0])));
	spawned[nspawned++] = pid;
	return pid;
}

double target_now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void target_nap_ms(long ms)
{
	struct timespec t = { ms / 1000, (ms % 1000) * 1000 * 1000 };
	nanosleep(&t, NULL);
}

/* Whether a line of text sets key ("key = ..."). */
static int sets_key(const char *text, const char *key)
{
	size_t n = strlen(key);
	for (const char *l = text; l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		if (!strncmp(l, key, n) && (l[n] == ' ' || l[n] == '='))
			return 1;
	return 0;
}

/* blobs.csv, cluster.key and cluster.ini (1 ps, W workers) in target_dir;
 * loads the key and the config hash into t. */
void target_write(struct target *t, int W, int steps, int batch, const char *extra)
{
	/* [train] lines a test may replace through extra (a key set twice is
	 * a config error). */
	static const char *const dflt[][2] = { { "learning_rate", "0.05" }, { "optimizer", "momentum" },
					       { "momentum", "0.9" }, { "eval_every", "10" },
					       { "threads", "1" } };
	char path[300], err[KEY_ERR_MAX];
	snprintf(path, sizeof(path), "%s/blobs.csv", target_dir);
	write_blobs(path, 600, 3, 6, 3);
	snprintf(path, sizeof(path), "%s/cluster.key", target_dir);
	cr_assert_eq(key_generate(path, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(key_load(t->key, path, err, sizeof(err)), 0, "%s", err);
	snprintf(t->cfg, sizeof(t->cfg), "%s/cluster.ini", target_dir);
	snprintf(t->log, sizeof(t->log), "%s/ps0.log", target_dir);
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
		   "[train]\nsteps = %d\nbatch_size = %d\n", steps, batch);
	for (size_t i = 0; i < sizeof(dflt) / sizeof(dflt[0]); i++)
		if (!sets_key(extra, dflt[i][0]))
			fprintf(f, "%s = %s\n", dflt[i][0], dflt[i][1]);
	fprintf(f, "%s[model]\ninput = 6\nlayer = dense 16\nlayer = relu\nlayer = dense 3\n", extra);
	cr_assert_eq(fclose(f), 0);
	struct config *c = malloc(sizeof(*c));
	cr_assert_not_null(c);
	char cerr[CONFIG_ERR_MAX];
	cr_assert_eq(config_load(c, t->cfg, NULL, 0, cerr, sizeof(cerr)), 0, "%s", cerr);
	cr_assert_eq(config_hash(c, t->hash), 0);
	free(c);
}

void target_start(struct target *t, const char *set)
{
	const char *args[] = { "ps", "--index", "0", "--config", t->cfg, set ? "--set" : NULL, set, NULL };
	t->pid = target_spawn(args, t->log);
}

char *target_worker_finishes(struct target *t, int timeout_s)
{
	char wlog[300];
	snprintf(wlog, sizeof(wlog), "%s/worker0.log", target_dir);
	const char *args[] = { "worker", "--index", "0", "--config", t->cfg, NULL };
	pid_t pids[2] = { t->pid, target_spawn(args, wlog) };
	int st[2];
	wait_children(pids, 2, st, timeout_s);
	cr_assert_eq(st[1], 0, "worker exit %d:\n%s\nps:\n%s", st[1], slurp(wlog), slurp(t->log));
	cr_assert_eq(st[0], 0, "ps exit %d:\n%s", st[0], slurp(t->log));
	return slurp(wlog);
}

/* Waits (bounded) for the ps's log to contain needle; returns the log. */
char *target_wait_log(const struct target *t, const char *needle)
{
	double t0 = target_now_s();
	char *log;
	while (!strstr(log = slurp(t->log), needle) && target_now_s() - t0 < 5)
		target_nap_ms(20);
	return log;
}

/* The log line holding needle and the peer "127.0.0.1:PORT" of fd. */
void target_assert_logged(const struct target *t, int fd, const char *needle)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	char peer[64];
	snprintf(peer, sizeof(peer), "127.0.0.1:%u:", ntohs(a.sin_port));
	char *log = target_wait_log(t, peer);
	const char *line = strstr(log, peer);
	cr_assert_not_null(line, "the ps did not log the peer %s:\n%s", peer, log);
	const char *eol = strchr(line, '\n');
	const char *hit = strstr(line, needle);
	cr_assert(hit && (!eol || hit < eol), "no \"%s\" on the line of %s:\n%s", needle, peer, log);
	cr_assert_null(strstr(eol ? eol : line + 1, peer), "%s logged more than once:\n%s", peer, log);
}

int target_dial(const struct target *t)
{
	int fd;
	char err[256];
	cr_assert_eq(sock_connect_retry("127.0.0.1", (uint16_t)t->port, 10000, &fd, err, sizeof(err)),
		     0, "%s", err);
	return fd;
}

/* Sends HELLO1 as worker `index` with key. */
void target_hello(int fd, struct hs *h, const uint8_t *key, const struct target *t, uint32_t index)
{
	uint8_t h1[HS_HELLO_BYTES];
	target_greeting(h, h1, key, t, index, 0);
	target_send(fd, h1, sizeof(h1));
}

void target_greeting(struct hs *h, uint8_t out[HS_HELLO_BYTES], const uint8_t *key,
		     const struct target *t, uint32_t index, uint64_t time_ns)
{
	char err[256];
	struct hs_identity me = { .role = HS_WORKER, .index = index, .ciphers = frame_offers() };
	memcpy(me.config_hash, t->hash, HS_HASH_BYTES);
	if (time_ns)
		cr_assert_eq(hs_client_start_at(h, out, key, &me, time_ns, err, sizeof(err)), 0, "%s", err);
	else
		cr_assert_eq(hs_client_start(h, out, key, &me, err, sizeof(err)), 0, "%s", err);
}

void target_hello_finish(int fd, struct hs *h, struct hs_result *hr)
{
	uint8_t h2[HS_HELLO_BYTES];
	char err[256];
	cr_assert_eq(sock_read_full(fd, h2, sizeof(h2), IO_MS, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(hs_client_finish(h, hr, h2, sizeof(h2), err, sizeof(err)), 0, "%s", err);
}

/* A sealed HEARTBEAT, as a real worker sends right after its handshake:
 * the ps counts the connection as the worker once it opens. */
void target_confirm(int fd, struct hs_result *hr)
{
	uint8_t m[64], f[128];
	size_t len, flen;
	char err[256];
	struct msg_heartbeat hb;
	memset(&hb, 0, sizeof(hb));
	cr_assert_eq(msg_encode_heartbeat(m, sizeof(m), &hb, &len, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(frame_seal(&hr->send, f, sizeof(f), m, len, &flen, err, sizeof(err)), 0, "%s", err);
	target_send(fd, f, flen);
}

/* Connects and completes a correct handshake as worker index, confirmed
 * by a first frame unless raw. */
int target_peer(const struct target *t, uint32_t index, struct hs_result *hr, int raw)
{
	int fd = target_dial(t);
	struct hs h;
	target_hello(fd, &h, t->key, t, index);
	target_hello_finish(fd, &h, hr);
	if (!raw)
		target_confirm(fd, hr);
	return fd;
}

/* Seals a PULL of shard 0 at version 0 into out; returns the frame's length. */
size_t target_seal_pull(struct frame_key *tx, uint8_t *out, size_t cap)
{
	uint8_t m[64];
	size_t len, flen;
	char err[256];
	struct msg_pull p = { .shard = 0, .version = 0 };
	cr_assert_eq(msg_encode_pull(m, sizeof(m), &p, &len, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(frame_seal(tx, out, cap, m, len, &flen, err, sizeof(err)), 0, "%s", err);
	return flen;
}

void target_send(int fd, const void *b, size_t n)
{
	char err[256];
	cr_assert_eq(sock_write_full(fd, b, n, IO_MS, err, sizeof(err)), 0, "%s", err);
}

/* The ps closes fd without sending anything more, within limit_ms; returns
 * how long that took in seconds. */
double target_expect_closed(int fd, int limit_ms)
{
	uint8_t b;
	char err[256];
	double t0 = target_now_s();
	int r = sock_read_full(fd, &b, 1, limit_ms, err, sizeof(err));
	cr_assert(r == -EPIPE || r == -ECONNRESET, "expected the ps to close, got %d (%s)", r,
		  r ? err : "a byte");
	return target_now_s() - t0;
}

/* Reads the PARAMS reply to a PULL (the model has one chunk). */
void target_read_params(int fd, struct hs_result *hr)
{
	static uint8_t buf[FRAME_CT_MAX];
	size_t len;
	char err[256];
	cr_assert_eq(sock_read_frame(SOCK_FD(fd), &hr->recv, buf, sizeof(buf), &len, IO_MS, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(msg_type(buf, len, err, sizeof(err)), WIRE_PARAMS, "%s", err);
}

int target_recv_msg(int fd, struct hs_result *hr, uint8_t *buf, size_t *len, const char *what)
{
	char err[256];
	for (;;) {
		int r = sock_read_frame(SOCK_FD(fd), &hr->recv, buf, FRAME_CT_MAX, len, IO_MS, err, sizeof(err));
		cr_assert_eq(r, 0, "no answer to %s: %s", what, err);
		r = msg_type(buf, *len, err, sizeof(err));
		cr_assert_geq(r, 0, "%s", err);
		if (r != WIRE_HEARTBEAT)
			return r;
	}
}

uint32_t target_ack_status(int fd, struct hs_result *hr, const char *what)
{
	static uint8_t buf[FRAME_CT_MAX];
	size_t len;
	char err[256];
	int type = target_recv_msg(fd, hr, buf, &len, what);
	cr_assert_eq(type, WIRE_ACK, "%s was answered with %s", what, wire_msg_name((uint8_t)type));
	struct msg_ack a;
	cr_assert_eq(msg_decode_ack(buf, len, &a, err, sizeof(err)), 0, "%s", err);
	return a.status;
}

void target_wipe(struct hs_result *hr)
{
	frame_key_wipe(&hr->send);
	frame_key_wipe(&hr->recv);
}

