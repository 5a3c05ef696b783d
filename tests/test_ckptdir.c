/* Where checkpoints go (issue 14): the default checkpoint_dir is named
 * after the config (NAME.ckpt beside it), so configs in one folder never
 * share one; an explicit checkpoint_dir is used as given; and a
 * checkpoint_dir that cannot be made or written stops `local` and `ps` at
 * start with one line (exit 2), before any data is loaded, leaving nothing
 * behind. Runs are `pstrain local` on small blobs for a few steps. */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include "../core/config/config.h"
#include "../core/data/data.h"
#include "../core/fileio.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define RUN_TIMEOUT_S 60
#define REFUSED_TIMEOUT_S 10   /* a run that should stop at once; a ps that did
				* not would wait for its workers */

static char dir[256];    /* the test's folder */
static char real[PATH_MAX];   /* dir without symlinks, as config_load resolves it */
static char mounted[300];     /* a read-only bind mount to undo, "" if none */

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
	test_dir_make(dir, sizeof(dir), "ckptdir");
	cr_assert_not_null(realpath(dir, real));
}

static void teardown(void)
{
	if (mounted[0])
		umount2(mounted, MNT_DETACH);
	test_dir_remove(dir);
	leak_check();
}

TestSuite(ckptdir, .init = setup, .fini = teardown, .timeout = 120);

/* dir/name: a local config training blobs.csv (beside it) with a
 * dense `units` hidden layer for `steps` steps, saving every 10; extra
 * goes into [train]. */
static void write_local(const char *folder, const char *name, int units, int steps, const char *extra)
{
	char path[400];
	snprintf(path, sizeof(path), "%s/blobs.csv", folder);
	if (access(path, F_OK) != 0)
		write_blobs(path, 300, 3, 6, 5);
	snprintf(path, sizeof(path), "%s/%s", folder, name);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fprintf(f, "[data]\nformat = csv\ntrain_csv = blobs.csv\nlabel_column = first\n"
		   "[train]\nsteps = %d\nbatch_size = 16\nthreads = 1\ncheckpoint_every = 10\n%s"
		   "[model]\ninput = 6\nlayer = dense %d\nlayer = relu\nlayer = dense 3\n",
		steps, extra, units);
	cr_assert_eq(fclose(f), 0);
}

/* Runs pstrain with args to completion within timeout_s; its stdout and
 * stderr in out. */
static int run_within(const char *const *args, const char *out, int timeout_s)
{
	pid_t pid = spawn_pstrain(args, out, NULL);
	int st;
	wait_children(&pid, 1, &st, timeout_s);
	cr_assert_neq(st, -1, "pstrain %s did not finish in %d s:\n%s", args[0], timeout_s, slurp(out));
	return st;
}

static int run(const char *const *args, const char *out)
{
	return run_within(args, out, RUN_TIMEOUT_S);
}

static int is_dir(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The names in folder, sorted, one per line. */
static void listing(const char *folder, char *buf, size_t len)
{
	struct dirent **names;
	int n = scandir(folder, &names, NULL, alphasort);
	cr_assert_geq(n, 0, "scandir %s: %s", folder, strerror(errno));
	buf[0] = '\0';
	for (int i = 0; i < n; i++) {
		snprintf(buf + strlen(buf), len - strlen(buf), "%s\n", names[i]->d_name);
		free(names[i]);
	}
	free(names);
}

static struct config *load_ok(const char *path, const char *const *sets, int nsets)
{
	struct config *c = malloc(sizeof(*c));
	char err[CONFIG_ERR_MAX];
	cr_assert_not_null(c);
	int r = config_load(c, path, sets, nsets, err, sizeof(err));
	cr_assert_eq(r, 0, "config_load %s: %s", path, err);
	return c;
}

/* ---- the default is named after the config ---------------------------- */

Test(ckptdir, default_is_named_after_the_config)
{
	static const struct {
		const char *file, *want;
	} rows[] = {
		{ "fashion-mlp.ini", "fashion-mlp.ckpt" },
		{ "cluster.conf", "cluster.ckpt" },
		{ "UPPER.INI", "UPPER.ckpt" },
		{ "noext", "noext.ckpt" },
		{ "run.cfg", "run.cfg.ckpt" },   /* only .ini and .conf are dropped */
		{ "two.dots.ini", "two.dots.ckpt" },
		{ ".ini", ".ini.ckpt" },         /* not a hidden ".ckpt" */
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		char path[400], want[PATH_MAX + 64];
		write_local(dir, rows[i].file, 8, 20, "");
		snprintf(path, sizeof(path), "%s/%s", dir, rows[i].file);
		struct config *c = load_ok(path, NULL, 0);
		snprintf(want, sizeof(want), "%s/%s", real, rows[i].want);
		cr_expect_str_eq(c->train.checkpoint_dir, want, "%s", rows[i].file);
		free(c);
	}

	/* From a string, relative as the name is (no directory to resolve). */
	struct config *c = malloc(sizeof(*c));
	char err[CONFIG_ERR_MAX];
	cr_assert_not_null(c);
	cr_assert_eq(config_parse_string(c, "examples/x.ini", "", err, sizeof(err)), 0, "%s", err);
	cr_expect_str_eq(c->train.checkpoint_dir, "examples/x.ckpt");
	free(c);
}

/* A folder so deep that NAME.ckpt beside the config would not fit in a
 * path: an error naming the key, unless the file or --set gives one. */
Test(ckptdir, default_too_long_for_a_path_is_an_error_unless_set)
{
	char deep[DATA_PATH_MAX + 64], cfg[DATA_PATH_MAX + 128], csv[400], err[CONFIG_ERR_MAX];
	size_t n = (size_t)snprintf(deep, sizeof(deep), "%s", real);
	while (n < DATA_PATH_MAX - 30) {   /* room for /cluster.key, not for /NAME.ckpt */
		n += (size_t)snprintf(deep + n, sizeof(deep) - n, "/%.*s", (int)(DATA_PATH_MAX - 31 - n),
				      "dddddddddddddddddddddddddddddddddddddddddddddddddd");
		cr_assert_eq(mkdir(deep, 0755), 0, "mkdir %s: %s", deep, strerror(errno));
	}
	snprintf(csv, sizeof(csv), "%s/blobs.csv", dir);
	write_blobs(csv, 300, 3, 6, 5);
	const char *name = "a-config-with-a-long-name.ini";
	snprintf(cfg, sizeof(cfg), "%s/%s", deep, name);
	/* log_dir's default (NAME.logs) is as long: given too, so that
	 * only checkpoint_dir's is under test */
	const char *extra[] = { "", "checkpoint_dir = ck\nlog_dir = logs\n" };
	for (int i = 0; i < 2; i++) {
		FILE *f = fopen(cfg, "w");
		cr_assert_not_null(f);
		fprintf(f, "[data]\nformat = csv\ntrain_csv = %s\n[train]\n%s[model]\ninput = 6\n", csv, extra[i]);
		cr_assert_eq(fclose(f), 0);
		struct config *c = malloc(sizeof(*c));
		cr_assert_not_null(c);
		int r = config_load(c, cfg, NULL, 0, err, sizeof(err));
		if (i == 0) {
			cr_expect_eq(r, -EINVAL, "loaded with checkpoint_dir %s", c->train.checkpoint_dir);
			cr_expect(strstr(err, "[train] checkpoint_dir: its default beside this file: ") &&
				  strstr(err, "longer than") && strstr(err, "; set checkpoint_dir"), "%s", err);
			const char *sets[] = { "train.checkpoint_dir=/elsewhere/ck", "train.log_dir=" };
			r = config_load(c, cfg, sets, 2, err, sizeof(err));
			cr_expect_eq(r, 0, "with --set: %s", err);
			cr_expect_str_eq(c->train.checkpoint_dir, "/elsewhere/ck");
		} else {
			cr_expect_eq(r, 0, "with checkpoint_dir in the file: %s", err);
			cr_expect(strstr(c->train.checkpoint_dir, "/ck"), "%s", c->train.checkpoint_dir);
		}
		free(c);
	}
}

/* `pstrain check`'s printout names the resolved directory, so it loads back
 * to the same checkpoint_dir under any other name, and "" stays off. */
Test(ckptdir, printed_config_loads_back_to_the_same_directory)
{
	const char *extra[] = { "", "checkpoint_dir =\n" };
	for (int i = 0; i < 2; i++) {
		char path[400], printed[400];
		write_local(dir, "orig.ini", 8, 20, extra[i]);
		snprintf(path, sizeof(path), "%s/orig.ini", dir);
		struct config *a = load_ok(path, NULL, 0);
		snprintf(printed, sizeof(printed), "%s/printed.ini", dir);
		FILE *f = fopen(printed, "w");
		cr_assert_not_null(f);
		config_print(a, f);
		cr_assert_eq(fclose(f), 0);
		struct config *b = load_ok(printed, NULL, 0);
		cr_expect_str_eq(b->train.checkpoint_dir, a->train.checkpoint_dir);
		if (i == 0)
			cr_expect(strstr(a->train.checkpoint_dir, "/orig.ckpt"), "%s", a->train.checkpoint_dir);
		else
			cr_expect_str_empty(b->train.checkpoint_dir);
		free(a);
		free(b);
	}
}

/* ---- an explicit checkpoint_dir ---------------------------------------- */

Test(ckptdir, explicit_checkpoint_dir_is_used_as_given)
{
	char path[400], want[PATH_MAX + 64];
	write_local(dir, "t.ini", 8, 20, "checkpoint_dir = mine\n");
	snprintf(path, sizeof(path), "%s/t.ini", dir);
	struct config *c = load_ok(path, NULL, 0);
	snprintf(want, sizeof(want), "%s/mine", real);
	cr_expect_str_eq(c->train.checkpoint_dir, want);
	free(c);

	const char *sets[] = { "train.checkpoint_dir=/somewhere/else" };
	c = load_ok(path, sets, 1);
	cr_expect_str_eq(c->train.checkpoint_dir, "/somewhere/else");
	free(c);

	/* A run writes there and makes no t.ckpt. */
	char out[400], step[400];
	snprintf(out, sizeof(out), "%s/out.txt", dir);
	const char *args[] = { "local", "--config", path, NULL };
	int st = run(args, out);
	cr_assert_eq(st, 0, "exit %d:\n%s", st, slurp(out));
	snprintf(step, sizeof(step), "%s/mine/step-00000020", dir);
	cr_expect(is_dir(step), "no %s:\n%s", step, slurp(out));
	snprintf(step, sizeof(step), "%s/t.ckpt", dir);
	cr_expect(!is_dir(step), "%s made although checkpoint_dir is set", step);
}

/* ---- two configs in one folder ----------------------------------------- */

/* What issue 14 met: with one shared default every config after the first
 * was refused ("the model differs from the config's"). */
Test(ckptdir, two_configs_in_one_folder_do_not_collide)
{
	char a[400], b[400], out[400], path[400];
	write_local(dir, "a.ini", 16, 20, "");
	write_local(dir, "b.ini", 8, 20, "");   /* another model */
	snprintf(a, sizeof(a), "%s/a.ini", dir);
	snprintf(b, sizeof(b), "%s/b.ini", dir);
	snprintf(out, sizeof(out), "%s/out.txt", dir);

	const char *args_a[] = { "local", "--config", a, NULL };
	int st = run(args_a, out);
	cr_assert_eq(st, 0, "a.ini: exit %d:\n%s", st, slurp(out));
	snprintf(path, sizeof(path), "%s/a.ckpt/step-00000020", dir);
	cr_assert(is_dir(path), "no %s:\n%s", path, slurp(out));

	const char *args_b[] = { "local", "--config", b, NULL };
	st = run(args_b, out);
	char *text = slurp(out);
	cr_assert_eq(st, 0, "b.ini after a.ini: exit %d:\n%s", st, text);
	cr_expect(!strstr(text, "resuming"), "b.ini did not start at step 0:\n%s", text);
	cr_expect(!strstr(text, "a.ckpt"), "b.ini looked at a.ini's checkpoints:\n%s", text);
	cr_expect(strstr(text, "done: 20 steps"), "%s", text);
	snprintf(path, sizeof(path), "%s/b.ckpt/step-00000020", dir);
	cr_expect(is_dir(path), "no %s:\n%s", path, text);
	snprintf(path, sizeof(path), "%s/ckpt", dir);
	cr_expect(!is_dir(path), "the old shared default ckpt/ was made");

	/* Each resumes its own: a.ini, run longer, continues from a.ckpt. */
	const char *args_a2[] = { "local", "--config", a, "--set", "train.steps=30", NULL };
	st = run(args_a2, out);
	text = slurp(out);
	cr_assert_eq(st, 0, "a.ini again: exit %d:\n%s", st, text);
	cr_expect(strstr(text, "resuming from") && strstr(text, "/a.ckpt/step-00000020"),
		  "a.ini did not resume its own checkpoint:\n%s", text);
	cr_expect(strstr(text, "done: 30 steps"), "%s", text);
}

/* ---- file_dir_writable -------------------------------------------------- */

Test(ckptdir, dir_writable_makes_the_folder_and_leaves_no_probe)
{
	char path[400], names[4096], err[512];
	snprintf(path, sizeof(path), "%s/new/deeper/x.ckpt", dir);
	cr_assert_eq(file_dir_writable(path, err, sizeof(err)), 0, "%s", err);
	cr_assert(is_dir(path));
	listing(path, names, sizeof(names));
	cr_expect_str_eq(names, ".\n..\n", "left behind:\n%s", names);
	/* An existing folder, with a trailing slash; what is in it stays. */
	snprintf(path, sizeof(path), "%s/new/", dir);
	cr_assert_eq(file_dir_writable(path, err, sizeof(err)), 0, "%s", err);
	listing(path, names, sizeof(names));
	cr_expect_str_eq(names, ".\n..\ndeeper\n");
}

/* A failure names the path and the reason in one line and removes the
 * levels it made. */
Test(ckptdir, dir_writable_refuses_and_removes_what_it_made)
{
	char path[600], before[4096], after[4096], err[512], file[400], longname[300];
	snprintf(file, sizeof(file), "%s/afile", dir);
	FILE *f = fopen(file, "w");
	cr_assert(f && fputs("x", f) >= 0 && fclose(f) == 0);
	memset(longname, 'n', 299);
	longname[299] = '\0';
	listing(dir, before, sizeof(before));

	struct {
		const char *fmt;
		int code;
		const char *why;
	} rows[] = {
		{ "%s/afile", -ENOTDIR, "(Not a directory)" },
		{ "%s/afile/below.ckpt", -ENOTDIR, "(Not a directory)" },
		{ "%s/made/too/%s", -ENAMETOOLONG, "(File name too long)" },   /* made/ and too/ undone */
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		snprintf(path, sizeof(path), rows[i].fmt, dir, longname);
		err[0] = '\0';
		int r = file_dir_writable(path, err, sizeof(err));
		cr_expect_eq(r, rows[i].code, "%s: %d (%s)", path, r, err);
		cr_expect(strstr(err, path) && strstr(err, "cannot be written") && strstr(err, rows[i].why),
			  "message: %s", err);
		cr_expect(!strchr(err, '\n'));
		listing(dir, after, sizeof(after));
		cr_expect_str_eq(after, before, "row %zu left something behind", i);
	}
	struct stat sb;
	cr_expect(stat(file, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == 1, "afile was changed");
}

/* ---- an unwritable checkpoint_dir stops local and ps at start ---------- */

/* local and ps 0 with cfg (in folder, which must stay as it was) exit 2
 * with exactly one line, naming ckdir and why, before any other output. */
static void expect_refused_at_start(const char *folder, const char *cfg, const char *ckdir, const char *why)
{
	char before[4096], after[4096], out[400], want[PATH_MAX + 64];
	snprintf(out, sizeof(out), "%s/logs/out.txt", dir);
	snprintf(want, sizeof(want), "pstrain: checkpoint_dir %s cannot be written (%s); set [train] checkpoint_dir",
		 ckdir, why);
	const char *local[] = { "local", "--config", cfg, NULL };
	const char *ps[] = { "ps", "--index", "0", "--config", cfg, NULL };
	const char *const *runs[] = { local, ps };
	for (int i = 0; i < 2; i++) {
		listing(folder, before, sizeof(before));
		int st = run_within(runs[i], out, REFUSED_TIMEOUT_S);
		char *text = slurp(out);
		listing(folder, after, sizeof(after));
		cr_expect_eq(st, 2, "%s: exit %d:\n%s", runs[i][0], st, text);
		cr_expect(strncmp(text, want, strlen(want)) == 0, "%s: expected \"%s...\", got:\n%s", runs[i][0],
			  want, text);
		char *nl = strchr(text, '\n');
		cr_expect(nl && nl[1] == '\0', "%s: more than one line:\n%s", runs[i][0], text);
		cr_expect_str_eq(after, before, "%s: the folder changed", runs[i][0]);
	}
}

Test(ckptdir, checkpoint_dir_below_a_regular_file_is_refused_at_start)
{
	char cfg[400], ckdir[PATH_MAX + 64], logs[400], file[400];
	snprintf(logs, sizeof(logs), "%s/logs", dir);
	cr_assert_eq(mkdir(logs, 0755), 0);
	snprintf(file, sizeof(file), "%s/afile", dir);
	FILE *f = fopen(file, "w");
	cr_assert(f && fclose(f) == 0);
	snprintf(cfg, sizeof(cfg), "%s/t.ini", dir);
	write_cluster(dir, cfg, 20, 10, "checkpoint_dir = afile/run.ckpt\n", "");
	snprintf(ckdir, sizeof(ckdir), "%s/afile/run.ckpt", real);
	expect_refused_at_start(dir, cfg, ckdir, "Not a directory");
}

/* A worker writes no checkpoints, so it is not asked: it goes on to look
 * for the ps (and gives up after connect_timeout, 1 s here). */
Test(ckptdir, worker_does_not_check_checkpoint_dir)
{
	char cfg[400], out[400], file[400];
	snprintf(file, sizeof(file), "%s/afile", dir);
	FILE *f = fopen(file, "w");
	cr_assert(f && fclose(f) == 0);
	snprintf(cfg, sizeof(cfg), "%s/t.ini", dir);
	write_cluster(dir, cfg, 20, 10, "checkpoint_dir = afile/run.ckpt\n", "connect_timeout = 1\n");
	snprintf(out, sizeof(out), "%s/out.txt", dir);
	const char *args[] = { "worker", "--index", "0", "--config", cfg, NULL };
	int st = run(args, out);
	char *text = slurp(out);
	cr_expect(!strstr(text, "cannot be written"), "the worker checked checkpoint_dir:\n%s", text);
	cr_expect_eq(st, 3, "exit %d (expected 3, no ps):\n%s", st, text);
}

/* A config in a read-only folder (the "config kept in /etc"): its
 * default NAME.ckpt beside it cannot be made. Root writes through file
 * modes, so as root the folder is a read-only bind mount, made in a mount
 * namespace of this test's own, which vanishes with it; without the
 * privilege to mount, the test is skipped and says why. Not as root,
 * mode 0555 does it. */
Test(ckptdir, read_only_folder_is_refused_at_start)
{
	char ro[300], cfg[400], ckdir[PATH_MAX + 64], logs[400], deep[PATH_MAX + 64];
	snprintf(logs, sizeof(logs), "%s/logs", dir);
	cr_assert_eq(mkdir(logs, 0755), 0);
	snprintf(ro, sizeof(ro), "%s/etc", dir);
	cr_assert_eq(mkdir(ro, 0755), 0);
	snprintf(cfg, sizeof(cfg), "%s/t.ini", ro);
	write_cluster(ro, cfg, 20, 10, "", "");
	const char *why;
	if (geteuid() == 0) {
		if (unshare(CLONE_NEWNS) != 0) {
			cr_skip_test("cannot unshare the mount namespace (%s) to make a read-only bind mount",
				     strerror(errno));
		}
		/* Private first, so that nothing below propagates to the host. */
		cr_assert_eq(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), 0, "%s", strerror(errno));
		cr_assert_eq(mount(ro, ro, NULL, MS_BIND, NULL), 0, "bind %s: %s", ro, strerror(errno));
		snprintf(mounted, sizeof(mounted), "%s", ro);
		if (mount(NULL, ro, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) != 0)
			cr_skip_test("cannot remount %s read-only (%s)", ro, strerror(errno));
		why = "Read-only file system";
	} else {
		cr_assert_eq(chmod(ro, 0555), 0);
		why = "Permission denied";
	}
	snprintf(ckdir, sizeof(ckdir), "%s/etc/t.ckpt", real);
	expect_refused_at_start(ro, cfg, ckdir, why);

	/* A deeper explicit path there fails at its first level. */
	snprintf(deep, sizeof(deep), "train.checkpoint_dir=%s/etc/runs/one.ckpt", real);
	const char *sets[] = { deep };
	struct config *c = load_ok(cfg, sets, 1);
	char err[512];
	cr_expect_eq(file_dir_writable(c->train.checkpoint_dir, err, sizeof(err)), geteuid() == 0 ? -EROFS : -EACCES,
		     "%s", err);
	free(c);
	snprintf(deep, sizeof(deep), "%s/runs", ro);
	cr_expect(!is_dir(deep));

	if (geteuid() != 0)
		chmod(ro, 0755);   /* so that the teardown can remove it */
}
