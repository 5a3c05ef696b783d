/* The cluster key file: key_generate / key_load in process (round trip,
 * randomness, mode under any umask, no overwriting, every refusal with its
 * message) and `pstrain keygen` through the binary. */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include "../net/key.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256];

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
	test_dir_make(dir, sizeof(dir), "key");
}

static void teardown(void)
{
	cr_expect_eq(test_dir_remove(dir), 0);
	leak_check();
}

TestSuite(key, .init = setup, .fini = teardown);

static void in_dir(char *buf, size_t len, const char *name)
{
	snprintf(buf, len, "%s/%s", dir, name);
}

static void write_file(const char *path, const void *data, size_t n, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
	cr_assert_eq(write(fd, data, n), (ssize_t)n);
	cr_assert_eq(fchmod(fd, mode), 0);
	cr_assert_eq(close(fd), 0);
}

/* The file's bytes, at most cap; returns how many. */
static size_t read_file(const char *path, uint8_t *buf, size_t cap)
{
	int fd = open(path, O_RDONLY);
	cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
	size_t n = 0;
	ssize_t r;
	while (n < cap && (r = read(fd, buf + n, cap - n)) > 0)
		n += (size_t)r;
	close(fd);
	return n;
}

static int all_equal(const uint8_t *p, size_t n, uint8_t v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v)
			return 0;
	return 1;
}

Test(key, generate_then_load_round_trip)
{
	char path[300], err[KEY_ERR_MAX] = "";
	uint8_t key[KEY_BYTES], raw[64];
	in_dir(path, sizeof(path), "cluster.key");
	cr_assert_eq(key_generate(path, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(read_file(path, raw, sizeof(raw)), KEY_BYTES, "the file is not exactly 32 raw bytes");
	memset(key, 0, sizeof(key));
	cr_assert_eq(key_load(key, path, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(memcmp(key, raw, KEY_BYTES), 0, "loaded key differs from the file's bytes");
	cr_assert_not(all_equal(key, KEY_BYTES, 0), "an all-zero key");
}

Test(key, two_generations_differ)
{
	char a[300], b[300], err[KEY_ERR_MAX] = "";
	uint8_t ka[KEY_BYTES], kb[KEY_BYTES];
	in_dir(a, sizeof(a), "a.key");
	in_dir(b, sizeof(b), "b.key");
	cr_assert_eq(key_generate(a, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(key_generate(b, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(key_load(ka, a, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(key_load(kb, b, err, sizeof(err)), 0, "%s", err);
	cr_assert_neq(memcmp(ka, kb, KEY_BYTES), 0, "two keys are identical");
	/* Not a constant pattern either: 32 random bytes have ~32 distinct values. */
	int seen[256] = { 0 }, distinct = 0;
	for (int i = 0; i < KEY_BYTES; i++)
		distinct += !seen[ka[i]]++;
	cr_assert_gt(distinct, 16, "only %d distinct byte values in a key", distinct);
}

/* umask 0 would give 0600 from open alone; umask 0777 would give 0000
 * without the fchmod. Both must end at exactly 0600. */
Test(key, mode_is_0600_whatever_the_umask)
{
	const mode_t masks[] = { 0, 0022, 0077, 0777 };
	for (size_t i = 0; i < sizeof(masks) / sizeof(masks[0]); i++) {
		char path[300], name[32], err[KEY_ERR_MAX] = "";
		struct stat st;
		snprintf(name, sizeof(name), "k%04o.key", (unsigned)masks[i]);
		in_dir(path, sizeof(path), name);
		mode_t old = umask(masks[i]);
		int r = key_generate(path, err, sizeof(err));
		umask(old);
		cr_assert_eq(r, 0, "umask %04o: %s", (unsigned)masks[i], err);
		cr_assert_eq(stat(path, &st), 0);
		cr_assert(S_ISREG(st.st_mode));
		cr_assert_eq(st.st_mode & 07777, 0600, "umask %04o gave mode %04o",
			     (unsigned)masks[i], (unsigned)(st.st_mode & 07777));
		cr_assert_eq(st.st_size, KEY_BYTES);
	}
}

Test(key, generate_refuses_to_overwrite)
{
	char path[300], err[KEY_ERR_MAX] = "";
	const char old[] = "precious old key, 32 bytes long!";
	uint8_t raw[64];
	struct stat st;
	in_dir(path, sizeof(path), "cluster.key");
	write_file(path, old, 32, 0644);
	cr_assert_eq(key_generate(path, err, sizeof(err)), -EEXIST, "%s", err);
	cr_assert_not_null(strstr(err, path), "message does not name the file: %s", err);
	cr_assert_not_null(strstr(err, "already exists"), "%s", err);
	cr_assert_null(strchr(err, '\n'), "not one line: %s", err);
	cr_assert_eq(read_file(path, raw, sizeof(raw)), 32);
	cr_assert_eq(memcmp(raw, old, 32), 0, "the existing file was changed");
	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0644, "the existing file's mode was changed");
}

/* A (dangling) symlink at the path must not be followed to create its
 * target somewhere else. */
Test(key, generate_does_not_follow_symlinks)
{
	char path[300], target[300], err[KEY_ERR_MAX] = "";
	in_dir(path, sizeof(path), "cluster.key");
	in_dir(target, sizeof(target), "elsewhere.key");
	cr_assert_eq(symlink(target, path), 0);
	cr_assert_eq(key_generate(path, err, sizeof(err)), -EEXIST, "%s", err);
	cr_assert_eq(access(target, F_OK), -1, "the symlink's target was created");
}

Test(key, generate_in_missing_directory)
{
	char path[300], err[KEY_ERR_MAX] = "";
	in_dir(path, sizeof(path), "no/such/dir/cluster.key");
	cr_assert_eq(key_generate(path, err, sizeof(err)), -ENOENT, "%s", err);
	cr_assert_not_null(strstr(err, path), "%s", err);
	cr_assert_not_null(strstr(err, "cannot create"), "%s", err);
}

/* key_load's refusals, one row each: how the file is made, the code, and
 * what the message must say besides the file's name. */
enum kind { MISSING, DIRECTORY, FIFO, BYTES };

static const struct bad_key {
	const char *name;
	enum kind kind;
	size_t size;
	mode_t mode;
	int code;
	const char *msg;
	const char *msg2;
} bad_keys[] = {
	{ "missing", MISSING, 0, 0, -ENOENT, "no such file", "pstrain keygen" },
	{ "directory", DIRECTORY, 0, 0700, -EINVAL, "is a directory", NULL },
	{ "fifo", FIFO, 0, 0600, -EINVAL, "is a FIFO", NULL },
	{ "empty", BYTES, 0, 0600, -EINVAL, "0 bytes, expected exactly 32", NULL },
	{ "short", BYTES, 31, 0600, -EINVAL, "31 bytes, expected exactly 32", NULL },
	{ "long", BYTES, 33, 0600, -EINVAL, "33 bytes, expected exactly 32", NULL },
	{ "hex", BYTES, 65, 0600, -EINVAL, "65 bytes, expected exactly 32", NULL },
	{ "g_read", BYTES, 32, 0640, -EPERM, "permissions 0640 are too open", "run chmod 600" },
	{ "o_read", BYTES, 32, 0604, -EPERM, "permissions 0604 are too open", "run chmod 600" },
	{ "g_rw", BYTES, 32, 0660, -EPERM, "permissions 0660 are too open", "run chmod 600" },
	{ "w_all", BYTES, 32, 0644, -EPERM, "permissions 0644 are too open", "run chmod 600" },
	{ "g_write", BYTES, 32, 0620, -EPERM, "permissions 0620 are too open", "run chmod 600" },
	{ "o_exec", BYTES, 32, 0601, -EPERM, "permissions 0601 are too open", "run chmod 600" },
};

Test(key, load_refuses_bad_files)
{
	uint8_t data[128];
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (uint8_t)(i * 37 + 1);
	for (size_t i = 0; i < sizeof(bad_keys) / sizeof(bad_keys[0]); i++) {
		const struct bad_key *b = &bad_keys[i];
		char path[300], err[KEY_ERR_MAX] = "";
		uint8_t key[KEY_BYTES];
		in_dir(path, sizeof(path), b->name);
		if (b->kind == DIRECTORY)
			cr_assert_eq(mkdir(path, b->mode), 0);
		else if (b->kind == FIFO)
			cr_assert_eq(mkfifo(path, b->mode), 0);
		else if (b->kind == BYTES)
			write_file(path, data, b->size, b->mode);
		memset(key, 0xAA, sizeof(key));
		int r = key_load(key, path, err, sizeof(err));
		cr_assert_eq(r, b->code, "%s: got %d (%s), want %d", b->name, r, err, b->code);
		cr_assert_not_null(strstr(err, path), "%s: message does not name the file: %s", b->name, err);
		cr_assert_not_null(strstr(err, b->msg), "%s: want \"%s\" in: %s", b->name, b->msg, err);
		if (b->msg2)
			cr_assert_not_null(strstr(err, b->msg2), "%s: want \"%s\" in: %s", b->name, b->msg2, err);
		cr_assert_null(strchr(err, '\n'), "%s: not one line: %s", b->name, err);
		cr_assert(all_equal(key, KEY_BYTES, 0xAA), "%s: key written on failure", b->name);
	}
}

/* What ssh accepts: no bits for group or others, any for the owner. */
Test(key, load_accepts_owner_only_modes)
{
	const mode_t modes[] = { 0600, 0400, 0700 };
	uint8_t data[KEY_BYTES];
	for (int i = 0; i < KEY_BYTES; i++)
		data[i] = (uint8_t)(255 - i);
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		char path[300], name[32], err[KEY_ERR_MAX] = "";
		uint8_t key[KEY_BYTES] = { 0 };
		snprintf(name, sizeof(name), "m%04o.key", (unsigned)modes[i]);
		in_dir(path, sizeof(path), name);
		write_file(path, data, KEY_BYTES, modes[i]);
		cr_assert_eq(key_load(key, path, err, sizeof(err)), 0, "mode %04o: %s", (unsigned)modes[i], err);
		cr_assert_eq(memcmp(key, data, KEY_BYTES), 0, "mode %04o: wrong bytes", (unsigned)modes[i]);
	}
}

/* Root is not exempt (net/key.h). Only root can make a file owned by someone
 * else, so elsewhere there is nothing to test. */
Test(key, load_refuses_other_owner)
{
	if (geteuid() != 0)
		cr_skip_test("needs root to chown a file to another user");
	char path[300], err[KEY_ERR_MAX] = "";
	uint8_t key[KEY_BYTES];
	in_dir(path, sizeof(path), "theirs.key");
	cr_assert_eq(key_generate(path, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(chown(path, 65534, 65534), 0, "%s", strerror(errno));
	cr_assert_eq(key_load(key, path, err, sizeof(err)), -EPERM, "%s", err);
	cr_assert_not_null(strstr(err, path), "%s", err);
	cr_assert_not_null(strstr(err, "owned by uid 65534"), "%s", err);
}

/* Symlinks are followed, and the checks apply to the target. */
Test(key, load_follows_symlink_and_checks_target)
{
	char target[300], link[300], err[KEY_ERR_MAX] = "";
	uint8_t key[KEY_BYTES], raw[KEY_BYTES];
	in_dir(target, sizeof(target), "real.key");
	in_dir(link, sizeof(link), "link.key");
	cr_assert_eq(key_generate(target, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(symlink(target, link), 0);
	cr_assert_eq(key_load(key, link, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(read_file(target, raw, sizeof(raw)), KEY_BYTES);
	cr_assert_eq(memcmp(key, raw, KEY_BYTES), 0);
	cr_assert_eq(chmod(target, 0644), 0);
	cr_assert_eq(key_load(key, link, err, sizeof(err)), -EPERM, "%s", err);
	cr_assert_not_null(strstr(err, "permissions 0644 are too open"), "%s", err);
}

/* ---- the binary ---------------------------------------------------------- */

/* Runs pstrain with args in cwd (NULL: this one), stdout and stderr both
 * into outpath; returns the exit status. */
static int run_pstrain(const char *const *args, const char *cwd, const char *outpath)
{
	const char *bin = getenv("PSTRAIN_BIN");
	cr_assert_not_null(bin, "PSTRAIN_BIN is not set (run through make unit)");
	pid_t pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		int fd = open(outpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0 || (cwd && chdir(cwd) < 0))
			_exit(126);
		dup2(fd, 1);
		dup2(fd, 2);
		char *argv[16];
		int n = 0;
		argv[n++] = (char *)bin;
		for (int i = 0; args[i] && n < 15; i++)
			argv[n++] = (char *)args[i];
		argv[n] = NULL;
		execv(bin, argv);
		_exit(127);
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int count_lines(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

Test(key, cli_keygen_writes_key_then_refuses)
{
	char path[300], out[300], want[400], err[KEY_ERR_MAX] = "";
	uint8_t key[KEY_BYTES], before[KEY_BYTES], after[64];
	struct stat st;
	in_dir(path, sizeof(path), "cluster.key");
	in_dir(out, sizeof(out), "out.txt");
	const char *args[] = { "keygen", path, NULL };

	int rc = run_pstrain(args, NULL, out);
	char *text = slurp(out);
	cr_assert_eq(rc, 0, "exit %d:\n%s", rc, text);
	snprintf(want, sizeof(want), "wrote new cluster key to %s (mode 0600); copy it to every node", path);
	cr_assert_not_null(strstr(text, want), "want \"%s\" in:\n%s", want, text);
	cr_assert_eq(count_lines(text), 1, "want one line:\n%s", text);
	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0600, "mode %04o", (unsigned)(st.st_mode & 07777));
	cr_assert_eq(st.st_size, KEY_BYTES);
	cr_assert_eq(key_load(key, path, err, sizeof(err)), 0, "%s", err);
	cr_assert_not(all_equal(key, KEY_BYTES, 0));
	memcpy(before, key, KEY_BYTES);

	rc = run_pstrain(args, NULL, out);
	text = slurp(out);
	cr_assert_eq(rc, 2, "second keygen: exit %d:\n%s", rc, text);
	cr_assert_not_null(strstr(text, path), "message does not name the file:\n%s", text);
	cr_assert_not_null(strstr(text, "already exists"), "%s", text);
	cr_assert_eq(count_lines(text), 1, "want one line:\n%s", text);
	cr_assert_eq(read_file(path, after, sizeof(after)), KEY_BYTES);
	cr_assert_eq(memcmp(before, after, KEY_BYTES), 0, "the second keygen changed the key");
}

Test(key, cli_keygen_default_file_is_cluster_key_here)
{
	char path[300], out[300];
	struct stat st;
	in_dir(path, sizeof(path), "cluster.key");
	in_dir(out, sizeof(out), "out.txt");
	const char *args[] = { "keygen", NULL };
	int rc = run_pstrain(args, dir, out);
	char *text = slurp(out);
	cr_assert_eq(rc, 0, "exit %d:\n%s", rc, text);
	cr_assert_not_null(strstr(text, "wrote new cluster key to cluster.key (mode 0600)"), "%s", text);
	cr_assert_eq(stat(path, &st), 0, "no ./cluster.key");
	cr_assert_eq(st.st_mode & 07777, 0600);
	cr_assert_eq(st.st_size, KEY_BYTES);
}

/* keygen takes one optional FILE and nothing else: exit 2, nothing written. */
Test(key, cli_keygen_usage_errors)
{
	char a[300], b[300], out[300];
	in_dir(a, sizeof(a), "a.key");
	in_dir(b, sizeof(b), "b.key");
	in_dir(out, sizeof(out), "out.txt");
	const struct {
		const char *args[5];
		const char *msg;
	} rows[] = {
		{ { "keygen", a, b, NULL }, "unexpected argument" },
		{ { "keygen", "--config", a, NULL }, "--config does not apply" },
		{ { "keygen", "--set", "train.steps=1", NULL }, "--set does not apply" },
		{ { "keygen", "--force", NULL }, "unknown option \"--force\"" },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		int rc = run_pstrain(rows[i].args, dir, out);
		char *text = slurp(out);
		cr_assert_eq(rc, 2, "row %zu: exit %d:\n%s", i, rc, text);
		cr_assert_not_null(strstr(text, rows[i].msg), "row %zu: want \"%s\" in:\n%s", i, rows[i].msg, text);
		cr_assert_eq(access(a, F_OK), -1, "row %zu: %s was written", i, a);
		cr_assert_eq(access(b, F_OK), -1, "row %zu: %s was written", i, b);
		char dflt[300];
		in_dir(dflt, sizeof(dflt), "cluster.key");
		cr_assert_eq(access(dflt, F_OK), -1, "row %zu: ./cluster.key was written", i);
	}
}

Test(key, cli_keygen_unwritable_path_is_exit_2)
{
	char path[300], out[300];
	in_dir(path, sizeof(path), "missing-dir/cluster.key");
	in_dir(out, sizeof(out), "out.txt");
	const char *args[] = { "keygen", path, NULL };
	int rc = run_pstrain(args, NULL, out);
	char *text = slurp(out);
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, text);
	cr_assert_not_null(strstr(text, path), "%s", text);
	cr_assert_not_null(strstr(text, "cannot create"), "%s", text);
	cr_assert_eq(count_lines(text), 1, "want one line:\n%s", text);
}

Test(key, cli_help_lists_keygen)
{
	char out[300];
	in_dir(out, sizeof(out), "out.txt");
	const char *args[] = { "keygen", "--help", NULL };
	int rc = run_pstrain(args, dir, out);
	char *text = slurp(out);
	cr_assert_eq(rc, 0, "exit %d:\n%s", rc, text);
	cr_assert_not_null(strstr(text, "pstrain keygen [FILE]"), "%s", text);
	cr_assert_not_null(strstr(text, "default ./cluster.key"), "%s", text);
	char dflt[300];
	in_dir(dflt, sizeof(dflt), "cluster.key");
	cr_assert_eq(access(dflt, F_OK), -1, "--help wrote a key");
}
