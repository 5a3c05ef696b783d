/* Secret and text hygiene (issue 13 item 5): where the cluster key and the
 * session keys live (sodium_malloc'd pages: guarded, mlocked, out of core
 * dumps) and that they are wiped when done with; that the roles make
 * themselves non-dumpable; that a peer's ERROR text cannot carry bytes a
 * terminal acts on. Each test failed before the change it covers (or,
 * where today's code already held, when that code was broken on purpose).
 * The tests that start `pstrain ps` need $PSTRAIN_BIN. */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "../cluster/role.h"
#include "../core/config/config.h"
#include "../net/conn.h"
#include "../net/cryptopool.h"
#include "../net/key.h"
#include "../net/msg.h"
#include "../net/pipe.h"
#include "../net/sock.h"

static char dir[256];
static pid_t spawned = -1; /* a ps a failed assertion left running */

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
	signal(SIGPIPE, SIG_IGN);
	test_dir_make(dir, sizeof dir, "hygiene");
}

static void teardown(void)
{
	if (spawned > 0 && waitpid(spawned, NULL, WNOHANG) == 0) {
		kill(spawned, SIGKILL);
		waitpid(spawned, NULL, 0);
	}
	spawned = -1;
	test_dir_remove(dir);
	leak_check();
}

TestSuite(hygiene, .init = setup, .fini = teardown, .timeout = 60);

static void nap_ms(long ms)
{
	struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&t, NULL);
}

/* Runs fn in a child process (so that what it does to the process, like
 * role_harden, stays there) and returns its exit status, or 128 + the
 * signal that ended it. */
static int in_child(int (*fn)(void *), void *arg)
{
	fflush(NULL);
	pid_t pid = fork();
	cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
	if (pid == 0)
		_exit(fn(arg));
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* VmLck of /proc/PID/status in KiB (memory the process has mlocked), -1 if
 * it cannot be read. */
static long vmlck_kib(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	long kib = -1;
	while (fgets(line, sizeof line, f))
		if (strncmp(line, "VmLck:", 6) == 0)
			kib = strtol(line + 6, NULL, 10);
	fclose(f);
	return kib;
}

static int all_zero(const void *p, size_t n)
{
	return sodium_is_zero(p, n);
}

/* ---- ERROR text: printable ASCII only ------------------------------------ */

/* Every byte value in one text (but NUL, which ends a C string): the
 * encoder sends 0x20..0x7e as they are and every other byte as '?', and
 * what it sent decodes back to exactly that. */
Test(hygiene, error_text_encoded_printable)
{
	char text[256];
	uint8_t buf[MSG_ERROR_BYTES_MAX];
	struct msg_error out;
	char err[256] = "";
	size_t len = 0;
	for (int i = 1; i < 256; i++)
		text[i - 1] = (char)i;
	text[255] = '\0';
	cr_assert_eq(msg_encode_error(buf, sizeof buf, 5, text, &len, err, sizeof err), 0, "%s",
		     err);
	cr_assert_eq(len, MSG_ERROR_HDR_BYTES + 255);
	for (int i = 1; i < 256; i++) {
		uint8_t want = i >= 0x20 && i <= 0x7e ? (uint8_t)i : '?';
		cr_assert_eq(buf[MSG_ERROR_HDR_BYTES + i - 1], want,
			     "byte 0x%02x sent as 0x%02x, expected 0x%02x", i,
			     buf[MSG_ERROR_HDR_BYTES + i - 1], want);
	}
	cr_assert_eq(msg_decode_error(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_eq(out.code, 5);
	cr_assert_eq(memcmp(out.text, buf + MSG_ERROR_HDR_BYTES, 255), 0);

	/* What an attacker would try: a colour, a title, a cleared line. */
	const char *evil = "ps 0: \x1b[2K\r\x1b]0;pwned\x07ok\n";
	cr_assert_eq(msg_encode_error(buf, sizeof buf, 5, evil, &len, err, sizeof err), 0, "%s",
		     err);
	cr_assert_eq(msg_decode_error(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_str_eq(out.text, "ps 0: ?[2K??]0;pwned?ok?");
}

/* A peer's ERROR holding any byte outside 0x20..0x7e is refused, the byte
 * named in hex (the refusal itself is safe to print). */
Test(hygiene, error_text_decoded_printable_or_refused)
{
	uint8_t buf[MSG_ERROR_BYTES_MAX];
	struct msg_error out;
	char err[256];
	size_t len = 0;
	for (int b = 0; b < 256; b++) {
		cr_assert_eq(msg_encode_error(buf, sizeof buf, 5, "abcdefgh", &len, err, sizeof err),
			     0, "%s", err);
		buf[MSG_ERROR_HDR_BYTES + 3] = (uint8_t)b;
		err[0] = '\0';
		memset(&out, 0, sizeof out);
		int r = msg_decode_error(buf, len, &out, err, sizeof err);
		if (b >= 0x20 && b <= 0x7e) {
			cr_assert_eq(r, 0, "byte 0x%02x: %s", b, err);
			cr_assert_eq((uint8_t)out.text[3], b);
			continue;
		}
		cr_assert_eq(r, -EPROTO, "byte 0x%02x accepted (returned %d)", b, r);
		char want[64];
		snprintf(want, sizeof want, "text byte 3 is 0x%02x", b);
		cr_assert(strstr(err, want), "byte 0x%02x: \"%s\" does not say \"%s\"", b, err, want);
		for (const char *p = err; *p; p++)
			cr_assert(*p >= 0x20 && *p <= 0x7e, "refusal holds byte 0x%02x", (uint8_t)*p);
	}
}

/* ---- the process: non-dumpable ------------------------------------------ */

static int harden_child(void *arg)
{
	(void)arg;
	char err[256];
	if (prctl(PR_GET_DUMPABLE) != 1)
		return 2; /* already non-dumpable: the test would prove nothing */
	if (role_harden(err, sizeof err) != 0)
		return 3;
	return prctl(PR_GET_DUMPABLE) == 0 ? 0 : 1;
}

Test(hygiene, role_harden_makes_the_process_non_dumpable)
{
	int st = in_child(harden_child, NULL);
	cr_assert_neq(st, 2, "the test process is not dumpable to begin with");
	cr_assert_neq(st, 3, "role_harden failed");
	cr_assert_eq(st, 0, "PR_GET_DUMPABLE is still 1 after role_harden (child status %d)", st);
}

/* What the ps and the worker do first: role_setup_load. In a child: the
 * process is non-dumpable after it, the key is the file's, and writing to
 * the key faults (it is read-only; a grandchild tries). */
static int setup_child(void *arg)
{
	const char *cfg = arg;
	static struct config c;
	struct role_setup s;
	uint8_t want[KEY_BYTES];
	char err[CONFIG_ERR_MAX], path[512];
	memset(&s, 0, sizeof s);
	if (config_load(&c, cfg, NULL, 0, err, sizeof err) != 0)
		return 10;
	if (prctl(PR_GET_DUMPABLE) != 1)
		return 11;
	if (role_setup_load(&s, &c, 0, err, sizeof err) != 0) {
		fprintf(stderr, "role_setup_load: %s\n", err);
		return 12;
	}
	if (prctl(PR_GET_DUMPABLE) != 0)
		return 1;
	snprintf(path, sizeof path, "%s/cluster.key", dir);
	if (key_load(want, path, err, sizeof err) != 0 || memcmp(want, s.key, KEY_BYTES) != 0)
		return 13;
	sodium_memzero(want, sizeof want);
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL); /* under ASan: die of it, without a report */
		((volatile uint8_t *)s.key)[0] ^= 1;
		_exit(0); /* the write went through: the key is writable */
	}
	int st = 0;
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return 14;
	role_setup_free(&s);
	if (s.key)
		return 15;
	return WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV ? 0 : 4;
}

Test(hygiene, role_setup_hardens_then_keeps_the_key_read_only)
{
	char cfg[300];
	snprintf(cfg, sizeof cfg, "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 10, 10, "", "");
	int st = in_child(setup_child, cfg);
	cr_assert_eq(st, 0,
		     "child status %d: 1 still dumpable after role_setup_load, 4 the key is writable, "
		     "10-15 the setup failed",
		     st);
}

/* ---- a running ps: its keys are mlocked --------------------------------- */

/* Starts `pstrain ps --index 0` on the config at cfg and waits for its
 * "listening" line. */
static pid_t start_ps(const char *cfg, const char *log)
{
	const char *args[] = { "ps", "--index", "0", "--config", cfg, NULL };
	pid_t pid = spawn_pstrain(args, log, NULL);
	spawned = pid;
	for (int i = 0; i < 1000 && !strstr(slurp(log), "listening on"); i++) {
		cr_assert_eq(waitpid(pid, NULL, WNOHANG), 0, "the ps exited:\n%s", slurp(log));
		nap_ms(10);
	}
	cr_assert(strstr(slurp(log), "listening on"), "the ps did not start:\n%s", slurp(log));
	return pid;
}

/* Polls the ps's VmLck for up to 5 s until pred(kib, ref) holds. */
static long vmlck_wait(pid_t pid, int (*pred)(long, long), long ref)
{
	long kib = vmlck_kib(pid);
	for (int i = 0; i < 500 && !pred(kib, ref); i++) {
		nap_ms(10);
		kib = vmlck_kib(pid);
	}
	return kib;
}

static int above(long kib, long ref)
{
	return kib > ref;
}

static int at_most(long kib, long ref)
{
	return kib >= 0 && kib <= ref;
}

/* The cluster key is mlocked from the start (VmLck > 0), an authenticated
 * connection's session keys add locked memory, and the connection's end
 * gives it back (the pages are freed, not only wiped). */
Test(hygiene, ps_keeps_its_keys_in_locked_memory)
{
#ifdef __SANITIZE_ADDRESS__
	cr_skip_test("ASan's mlock interceptor locks nothing (VmLck stays 0)");
#endif
	char cfg[300], log[300], err[CONFIG_ERR_MAX], e[512];
	snprintf(cfg, sizeof cfg, "%s/cluster.ini", dir);
	snprintf(log, sizeof log, "%s/ps0.log", dir);
	write_cluster(dir, cfg, 1000, 1000, "", "");
	pid_t pid = start_ps(cfg, log);
	long base = vmlck_kib(pid);
	cr_assert_gt(base, 0, "a listening ps has VmLck %ld kB: the cluster key is not mlocked", base);

	/* Worker 0's handshake, from this process. */
	static struct config c;
	cr_assert_eq(config_load(&c, cfg, NULL, 0, err, sizeof err), 0, "%s", err);
	uint8_t *key = NULL;
	cr_assert_eq(key_load_guarded(&key, c.cluster.key_file, err, sizeof err), 0, "%s", err);
	struct hs_identity me = { .role = HS_WORKER, .index = 0, .ciphers = frame_offers() };
	cr_assert_eq(config_hash(&c, me.config_hash), 0);
	struct conn cn;
	int fd = -1;
	cr_assert_eq(conn_init(&cn, -1, NULL, 5000, 5000), 0);
	cr_assert_eq(sock_connect_retry(c.cluster.ps[0].name, c.cluster.ps[0].port, 5000, &fd, e,
					sizeof e),
		     0, "%s", e);
	cr_assert_eq(conn_client(&cn, fd, key, &me, 5000, "ps 0", e, sizeof e), 0, "%s", e);
	key_free(key);
	long during = vmlck_wait(pid, above, base);
	cr_assert_gt(during, base,
		     "VmLck %ld kB with an authenticated connection, %ld kB without: the session "
		     "keys are not mlocked",
		     during, base);
	conn_destroy(&cn);
	long after = vmlck_wait(pid, at_most, base);
	cr_assert_eq(waitpid(pid, NULL, WNOHANG), 0, "the ps exited:\n%s", slurp(log));
	cr_assert(after >= 0 && after <= base,
		  "VmLck %ld kB after the connection ended, %ld kB before it", after, base);
}

/* ---- session keys: wiped when done with --------------------------------- */

struct server {
	struct conn cn;
	uint8_t psk[KEY_BYTES];
	struct hs_identity me;
	int r;
	char err[512];
};

static void *serve(void *arg)
{
	struct server *sv = arg;
	sv->r = conn_server(&sv->cn, sv->psk, &sv->me, 5000, sv->err, sizeof sv->err);
	return NULL;
}

/* A handshake over a socketpair: cl (worker 3, key byte ck) to a new
 * server (ps 1, key byte sk) whose connection is left in sv. */
static void handshake(struct conn *cl, struct server *sv, uint8_t ck, uint8_t sk, int *rc)
{
	int sp[2];
	uint8_t psk[KEY_BYTES];
	char e[512];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	memset(sv, 0, sizeof *sv);
	cr_assert_eq(conn_init(&sv->cn, sp[1], NULL, 5000, 5000), 0);
	memset(sv->psk, sk, sizeof sv->psk);
	sv->me = (struct hs_identity){ .role = HS_PS, .index = 1, .ciphers = frame_offers() };
	struct hs_identity me = { .role = HS_WORKER, .index = 3, .to = 1, .ciphers = frame_offers() };
	memset(psk, ck, sizeof psk);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, serve, sv), 0);
	*rc = conn_client(cl, sp[0], psk, &me, 5000, "ps 1 (test)", e, sizeof e);
	pthread_join(t, NULL);
}

/* Both ends' keys are set while authenticated and all zero after
 * conn_close (the pages stay the connection's until conn_destroy, so they
 * can be read); a failed handshake on the same connection (a wrong key,
 * as a ps refusing a peer would see) leaves nothing in them either. */
Test(hygiene, conn_keys_wiped_on_close)
{
	struct conn cl;
	struct server sv;
	int rc;
	cr_assert_eq(conn_init(&cl, -1, NULL, 5000, 5000), 0);
	cr_assert(all_zero(cl.keys, sizeof *cl.keys), "conn_init left bytes in the key pages");
	handshake(&cl, &sv, 9, 9, &rc);
	cr_assert_eq(rc, 0);
	cr_assert_eq(sv.r, 0, "%s", sv.err);
	cr_assert_not(all_zero(cl.keys->send.key, FRAME_KEY_BYTES));
	cr_assert_not(all_zero(cl.keys->recv.key, FRAME_KEY_BYTES));
	cr_assert_not(all_zero(sv.cn.keys->send.key, FRAME_KEY_BYTES));
	cr_assert_eq(memcmp(cl.keys->send.key, sv.cn.keys->recv.key, FRAME_KEY_BYTES), 0);

	conn_close(&cl);
	conn_close(&sv.cn);
	cr_assert(all_zero(cl.keys, sizeof *cl.keys), "the client's keys survived conn_close");
	cr_assert(all_zero(sv.cn.keys, sizeof *sv.cn.keys), "the server's keys survived conn_close");
	conn_destroy(&sv.cn);
	cr_assert_null(sv.cn.keys);

	handshake(&cl, &sv, 9, 8, &rc);
	cr_assert_neq(rc, 0, "a handshake with the wrong key succeeded");
	cr_assert_neq(sv.r, 0);
	cr_assert(all_zero(cl.keys, sizeof *cl.keys));
	cr_assert(all_zero(sv.cn.keys, sizeof *sv.cn.keys));
	conn_destroy(&sv.cn);
	conn_destroy(&cl);
	cr_assert_null(cl.keys);
}

/* ---- the pipe's per-job key copies -------------------------------------- */

enum { NFRAMES = 12 };

static int enc_small(void *ctx, uint64_t i, uint8_t *msg, size_t cap, struct pipe_msg *m, char *err,
		     size_t errlen)
{
	(void)ctx, (void)cap, (void)err, (void)errlen;
	memset(msg, (int)i, 100);
	m->len = 100;
	return 0;
}

static int deliver_count(void *ctx, uint64_t i, const uint8_t *msg, size_t len, char *err,
			 size_t errlen)
{
	(void)err, (void)errlen;
	int *n = ctx;
	if (len != 100 || msg[0] != (uint8_t)i)
		return -EBADMSG;
	(*n)++;
	return 0;
}

struct receiver {
	struct pipe *p;
	int fd;
	struct frame_key *rx;
	int n, r;
	char err[320];
};

static void *receive(void *arg)
{
	struct receiver *rv = arg;
	rv->r = pipe_recv(rv->p, SOCK_FD(rv->fd), rv->rx, NFRAMES, deliver_count, &rv->n, 5000, rv->err,
			  sizeof rv->err);
	return NULL;
}

/* With a crypto pool, every job seals or opens with its own copy of the
 * key; after a tensor has gone through, not one of those copies is left
 * on either side (each job wiped its own). */
Test(hygiene, pipe_jobs_wipe_their_key_copies)
{
	struct cryptopool *pool;
	struct pipe tx, rx;
	struct frame_key ktx, krx;
	uint8_t k[FRAME_KEY_BYTES];
	char e[320];
	int sp[2];
	cr_assert_eq(cryptopool_new(&pool, 2, e, sizeof e), 0, "%s", e);
	uint8_t *btx = malloc(FRAME_BYTES_MAX), *brx = malloc(FRAME_BYTES_MAX);
	cr_assert(btx && brx);
	cr_assert_eq(pipe_init(&tx, pool, btx, FRAME_BYTES_MAX, e, sizeof e), 0, "%s", e);
	cr_assert_eq(pipe_init(&rx, pool, brx, FRAME_BYTES_MAX, e, sizeof e), 0, "%s", e);
	size_t nkeys = (size_t)cryptopool_size(pool) + 1;
	cr_assert_not_null(tx.keys);
	cr_assert(all_zero(tx.keys, nkeys * sizeof *tx.keys));
	randombytes_buf(k, sizeof k);
	cr_assert_eq(frame_key_init(&ktx, k, FRAME_CHACHA20POLY1305), 0);
	cr_assert_eq(frame_key_init(&krx, k, FRAME_CHACHA20POLY1305), 0);
	sodium_memzero(k, sizeof k);
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);

	struct receiver rv = { .p = &rx, .fd = sp[1], .rx = &krx };
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, receive, &rv), 0);
	int r = pipe_send(&tx, SOCK_FD(sp[0]), &ktx, NFRAMES, enc_small, NULL, 5000, e, sizeof e);
	pthread_join(t, NULL);
	cr_assert_eq(r, 0, "%s", e);
	cr_assert_eq(rv.r, 0, "%s", rv.err);
	cr_assert_eq(rv.n, NFRAMES);
	cr_assert_eq(ktx.counter, NFRAMES);
	cr_assert_eq(tx.nslots, (int)nkeys, "the send did not run in parallel");
	cr_assert(all_zero(tx.keys, nkeys * sizeof *tx.keys), "a sealing job's key copy survived");
	cr_assert(all_zero(rx.keys, nkeys * sizeof *rx.keys), "an opening job's key copy survived");

	frame_key_wipe(&ktx);
	frame_key_wipe(&krx);
	pipe_free(&tx);
	pipe_free(&rx);
	cryptopool_destroy(pool);
	close(sp[0]);
	close(sp[1]);
	free(btx);
	free(brx);
}

/* ---- where nothing may be locked ---------------------------------------- */

/* With RLIMIT_MEMLOCK at 0 (and, for root, no CAP_IPC_LOCK: the child
 * becomes nobody), mlock fails; the key pages must still be had and work:
 * a handshake succeeds. A ps on a host with a low limit keeps serving. */
static int nolock_child(void *arg)
{
	(void)arg;
	struct rlimit rl = { 0, 0 };
	if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0)
		return 10;
	if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
		return 11;
	void *probe = sodium_malloc(16);
	long locked = vmlck_kib(getpid());
	sodium_free(probe);
	if (locked != 0)
		return 12; /* mlock still works: the test would prove nothing */
	struct conn cl;
	struct server sv;
	int rc;
	if (conn_init(&cl, -1, NULL, 5000, 5000) != 0)
		return 1;
	handshake(&cl, &sv, 4, 4, &rc);
	if (rc != 0 || sv.r != 0)
		return 2;
	conn_destroy(&sv.cn);
	conn_destroy(&cl);
	return 0;
}

Test(hygiene, keys_work_where_nothing_may_be_locked)
{
	int st = in_child(nolock_child, NULL);
	cr_assert_lt(st, 10, "child status %d: could not set up a process that cannot mlock", st);
	cr_assert_eq(st, 0, "child status %d: 1 conn_init failed, 2 the handshake failed", st);
}
