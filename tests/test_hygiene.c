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
#include "../core/config.h"
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

