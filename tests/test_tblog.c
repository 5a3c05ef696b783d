/* TensorBoard event files (core/tblog.c, issue 16 item 5): the framing's
 * CRC, and files that TensorBoard's own reader (tests/tb_read.py, run with
 * the tensorboard package `make deps-test` installs in build/pyvenv) reads
 * back to exactly what pstrain printed: `local`, a cluster's chief, and a
 * run killed mid-way. */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include <math.h>
#include <signal.h>
#include <sodium.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tblog.h"

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
}

TestSuite(tblog, .init = setup);

Test(tblog, crc32c_and_its_mask)
{
	/* RFC 3720's check value, and TFRecord's mask of a known CRC */
	cr_assert_eq(tblog_crc32c("123456789", 9), 0xe3069283u);
	cr_assert_eq(tblog_crc32c("", 0), 0u);
	uint32_t c = 0xe3069283u;
	cr_assert_eq(tblog_masked_crc(c), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

/* tb_read.py's output for log_dir, or NULL (test skipped) without the
 * tensorboard package. */
static char *tb_read(const char *log_dir, const char *outpath)
{
	char py[PATH_MAX], script[PATH_MAX], cmd[3 * PATH_MAX];
	test_repo_path(py, sizeof(py), "build/pyvenv/bin/python");
	test_repo_path(script, sizeof(script), "tests/tb_read.py");
	if (access(py, X_OK) != 0)
		return NULL;
	snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s' > '%s' 2>&1", py, script, log_dir, outpath);
	int st = system(cmd);
	cr_assert_eq(st, 0, "tb_read.py failed:\n%s", slurp(outpath));
	return slurp(outpath);
}

#define SKIP_NO_TB "tensorboard is not installed in build/pyvenv (make deps-test installs it): event files not read back"

/* The value of tag at step in tb_read.py's output; NAN if absent. */
static double tb_value(const char *text, const char *tag, long step)
{
	char want[200];
	snprintf(want, sizeof(want), "%s %ld ", tag, step);
	for (const char *at = text; (at = strstr(at, want)) != NULL; at++)
		if (at == text || at[-1] == '\n')
			return strtod(at + strlen(want), NULL);
	return NAN;
}

/* Every evaluation line pstrain printed ("step N/M ... loss L  acc A%
 * test TL/TA%") has its figures in the events at step N, to the digits
 * printed. Returns how many lines were checked. */
static int compare(const char *printed, const char *events)
{
	int n = 0;
	for (const char *at = printed; (at = strstr(at, "step ")) != NULL; at++) {
		long step, total;
		double loss, acc, tl, ta;
		if (at != printed && at[-1] != '\n')
			continue;
		const char *test = strstr(at, "  test ");
		const char *eol = strchr(at, '\n');
		if (!test || (eol && test > eol))
			continue;
		if (sscanf(at, "step %ld/%ld", &step, &total) != 2)
			continue;
		const char *l = strstr(at, "  loss ");
		cr_assert(l && sscanf(l, "  loss %lf  acc %lf%%", &loss, &acc) == 2, "%.200s", at);
		cr_assert_eq(sscanf(test, "  test %lf/%lf%%", &tl, &ta), 2, "%.200s", at);
		struct { const char *tag; double printed, scale, digits; } f[] = {
			{ "train/loss", loss, 1, 5e-5 }, { "train/accuracy", acc, 100, 5e-3 },
			{ "test/loss", tl, 1, 5e-5 }, { "test/accuracy", ta, 100, 5e-3 },
		};
		for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
			double v = tb_value(events, f[i].tag, step);
			cr_assert(!isnan(v), "no %s at step %ld in the events:\n%s", f[i].tag, step, events);
			cr_assert(fabs(v * f[i].scale - f[i].printed) <= f[i].digits * 1.01,
				  "%s at step %ld: %g in the events, %g printed", f[i].tag, step, v * f[i].scale,
				  f[i].printed);
		}
		cr_assert(!isnan(tb_value(events, "learning_rate", step)));
		cr_assert(tb_value(events, "samples_per_second", step) > 0);
		n++;
	}
	return n;
}

/* A config for `local` on the blobs, evaluating every 10 steps. */
static void local_config(const char *dir, const char *cfg, int steps)
{
	write_cluster(dir, cfg, steps, 10, "", "");
}

Test(tblog, local_events_are_what_it_printed, .timeout = 60)
{
	char dir[200], cfg[300], out[300], logs[300], tb[300];
	test_dir_make(dir, sizeof(dir), "tblog");
	snprintf(cfg, sizeof(cfg), "%s/c.ini", dir);
	snprintf(out, sizeof(out), "%s/local.log", dir);
	snprintf(tb, sizeof(tb), "%s/tb.txt", dir);
	local_config(dir, cfg, 60);
	const char *args[] = { "local", "--config", cfg, NULL };
	pid_t p = spawn_pstrain(args, out, NULL);
	int st;
	wait_children(&p, 1, &st, 50);
	cr_assert_eq(st, 0, "%s", slurp(out));
	snprintf(logs, sizeof(logs), "%s/c.logs", dir);
	struct stat sb;
	cr_assert_eq(stat(logs, &sb), 0, "log_dir's default is NAME.logs beside the config");
	char *events = tb_read(logs, tb);
	if (!events)
		cr_skip_test(SKIP_NO_TB);
	int n = compare(slurp(out), events);
	cr_assert_geq(n, 6, "only %d evaluation lines compared:\n%s", n, slurp(out));
	cr_assert(!isnan(tb_value(events, "test/accuracy", 60)), "the final evaluation:\n%s", events);
	test_dir_remove(dir);
}

Test(tblog, chief_events_split_the_step_time, .timeout = 90)
{
	char dir[200], cfg[300], out[4][300], logs[300], tb[300];
	test_dir_make(dir, sizeof(dir), "tbcluster");
	snprintf(cfg, sizeof(cfg), "%s/c.ini", dir);
	snprintf(tb, sizeof(tb), "%s/tb.txt", dir);
	write_cluster(dir, cfg, 60, 10, "log_dir = chief-logs\n", "");
	pid_t pids[4];
	int st[4];
	for (int i = 0; i < 4; i++) {
		char ix[8];
		snprintf(ix, sizeof(ix), "%d", i % 2);
		snprintf(out[i], sizeof(out[i]), "%s/%s%d.log", dir, i < 2 ? "ps" : "w", i % 2);
		const char *args[] = { i < 2 ? "ps" : "worker", "--index", ix, "--config", cfg, NULL };
		pids[i] = spawn_pstrain(args, out[i], NULL);
	}
	wait_children(pids, 4, st, 80);
	assert_exits_zero(st, out, 4, "");
	snprintf(logs, sizeof(logs), "%s/chief-logs", dir);
	char *events = tb_read(logs, tb);
	if (!events)
		cr_skip_test(SKIP_NO_TB);
	cr_assert_geq(compare(slurp(out[2]), events), 5, "%s", slurp(out[2]));
	cr_assert(tb_value(events, "step_time/compute_ms", 30) > 0, "%s", events);
	cr_assert(tb_value(events, "step_time/communication_ms", 30) > 0, "%s", events);
	test_dir_remove(dir);
}

/* Killed after its first evaluations: what was flushed reads back. */
Test(tblog, a_killed_run_leaves_readable_files, .timeout = 60)
{
	char dir[200], cfg[300], out[300], logs[300], tb[300];
	test_dir_make(dir, sizeof(dir), "tbkill");
	snprintf(cfg, sizeof(cfg), "%s/c.ini", dir);
	snprintf(out, sizeof(out), "%s/local.log", dir);
	snprintf(tb, sizeof(tb), "%s/tb.txt", dir);
	local_config(dir, cfg, 2000000);
	const char *args[] = { "local", "--config", cfg, NULL };
	pid_t p = spawn_pstrain(args, out, NULL);
	int seen = wait_for_text(out, "step 30/");
	kill(p, SIGKILL);
	int st;
	wait_children(&p, 1, &st, 10);
	cr_assert(seen, "%s", slurp(out));
	snprintf(logs, sizeof(logs), "%s/c.logs", dir);
	char *events = tb_read(logs, tb);
	if (!events)
		cr_skip_test(SKIP_NO_TB);
	/* The line at step 30 may be printed and its events not yet
	 * flushed when the kill lands: the lines before it are compared. */
	char *printed = strdup(slurp(out)), *cut = strstr(printed, "step 30/");
	if (cut)
		*cut = 0;
	cr_assert_geq(compare(printed, events), 2, "%s\n%s", slurp(out), events);
	free(printed);
	test_dir_remove(dir);
}
