/* TensorBoard event files (core/tblog.c, issue 16 item 5): the framing's
 * CRC, and files that TensorBoard's own reader (tests/tb_read.py, run with
 * the tensorboard package `make deps-test` installs in build/pyvenv) reads
 * back to exactly what pstrain printed: `local`, a cluster's chief, and a
 * run killed mid-way. */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include <math.h>
#include <sched.h>
#include <signal.h>
#include <sodium.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../core/tblog.h"

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
}

TestSuite(tblog, .init = setup);

static char err_buf[512];

Test(tblog, crc32c_and_its_mask)
{
	/* RFC 3720's check value, and TFRecord's mask of a known CRC */
	cr_assert_eq(tblog_crc32c("123456789", 9), 0xe3069283u);
	cr_assert_eq(tblog_crc32c("", 0), 0u);
	uint32_t c = 0xe3069283u;
	cr_assert_eq(tblog_masked_crc(c), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

#define SKIP_NO_TB "tensorboard is not installed in build/pyvenv (make deps-test installs it): event files not read back"

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
			double v = test_tb_value(events, f[i].tag, step);
			cr_assert(!isnan(v), "no %s at step %ld in the events:\n%s", f[i].tag, step, events);
			cr_assert(fabs(v * f[i].scale - f[i].printed) <= f[i].digits * 1.01,
				  "%s at step %ld: %g in the events, %g printed", f[i].tag, step, v * f[i].scale,
				  f[i].printed);
		}
		cr_assert(!isnan(test_tb_value(events, "learning_rate", step)));
		cr_assert(test_tb_value(events, "samples_per_second", step) > 0);
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
	char *events = test_tb_read(logs, tb);
	if (!events)
		cr_skip_test(SKIP_NO_TB);
	int n = compare(slurp(out), events);
	cr_assert_geq(n, 6, "only %d evaluation lines compared:\n%s", n, slurp(out));
	cr_assert(!isnan(test_tb_value(events, "test/accuracy", 60)), "the final evaluation:\n%s", events);
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
	char *events = test_tb_read(logs, tb);
	if (!events)
		cr_skip_test(SKIP_NO_TB);
	cr_assert_geq(compare(slurp(out[2]), events), 5, "%s", slurp(out[2]));
	cr_assert(test_tb_value(events, "step_time/compute_ms", 30) > 0, "%s", events);
	cr_assert(test_tb_value(events, "step_time/communication_ms", 30) > 0, "%s", events);
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
	char *events = test_tb_read(logs, tb);
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

/* ---- log_dir is shared ground (issue 38 item 3) ---------------------- */

/* The names tblog_open may pick in dir around now for this process, as
 * "events.out.tfevents.T.HOST.PID.pstrain", for T in now-1 .. now+2. */
static int planted_names(char names[4][400], const char *dir)
{
	char host[256] = "";
	cr_assert_eq(gethostname(host, sizeof(host) - 1), 0);
	for (const char *c = host; *c; c++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_", *c))
			cr_skip_test("host name %s needs escaping: the planted names would not match", host);
	long now = (long)time(NULL);
	for (int i = 0; i < 4; i++)
		snprintf(names[i], sizeof(names[i]), "%s/events.out.tfevents.%ld.%s.%ld.pstrain", dir, now - 1 + i,
			 host, (long)getpid());
	return 4;
}

/* Regular files in dir whose name holds "tfevents"; the last one's path
 * into one (if any). Asserts each is mode 0600. */
static int event_files(const char *dir, char *one, size_t len)
{
	char cmd[600], list[300];
	snprintf(list, sizeof(list), "%s.list", dir);
	snprintf(cmd, sizeof(cmd), "find '%s' -maxdepth 1 -type f -name '*tfevents*' > '%s'", dir, list);
	cr_assert_eq(system(cmd), 0);
	int n = 0;
	char *text = strdup(slurp(list));
	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		struct stat sb;
		cr_assert_eq(lstat(line, &sb), 0, "%s", line);
		cr_assert_eq(sb.st_mode & 07777, 0600, "%s: mode %o, want 600", line, (unsigned)(sb.st_mode & 07777));
		snprintf(one, len, "%s", line);
		n++;
	}
	free(text);
	unlink(list);
	return n;
}

/* Links planted where the next event file goes, to a file of the user's
 * and to a name that does not exist yet: neither is followed. fopen(..,
 * "ab") appended to the first and created the second. */
Test(tblog, planted_links_are_not_followed)
{
	char dir[200], logs[300], victim[300], absent[300], names[4][400], made[600];
	test_dir_make(dir, sizeof(dir), "tblink");
	snprintf(logs, sizeof(logs), "%s/logs", dir);
	snprintf(victim, sizeof(victim), "%s/victim", dir);
	snprintf(absent, sizeof(absent), "%s/absent", dir);
	cr_assert_eq(mkdir(logs, 0755), 0);
	FILE *v = fopen(victim, "w");
	cr_assert(v && fputs("keep\n", v) >= 0 && fclose(v) == 0);
	const char *targets[] = { victim, absent };
	for (int round = 0; round < 2; round++) {
		int n = planted_names(names, logs);
		for (int i = 0; i < n; i++) {
			unlink(names[i]);
			cr_assert_eq(symlink(targets[round], names[i]), 0, "%s", names[i]);
		}
		struct tblog t;
		cr_assert_eq(tblog_open(&t, logs, err_buf, sizeof(err_buf)), 0, "%s", err_buf);
		cr_assert_eq(tblog_scalar(&t, 1, "train/loss", 0.5), 0);
		cr_assert_eq(tblog_flush(&t), 0);
		tblog_close(&t);
		cr_assert_str_eq(slurp(victim), "keep\n", "the link to victim was followed");
		cr_assert_neq(access(absent, F_OK), 0, "the link to a missing name made %s", absent);
		cr_assert_eq(event_files(logs, made, sizeof(made)), round + 1, "one new regular file per run");
		/* That file holds the records: a first event and the scalar. */
		unsigned char *b;
		size_t len;
		read_all(made, &b, &len);
		cr_assert_gt(len, 40, "%s: %zu bytes", made, len);
		free(b);
	}
	test_dir_remove(dir);
}

/* A log_dir that is a link, another user's, or writable by group or
 * others is refused with one line, and nothing is made in it. */
Test(tblog, a_log_dir_others_may_change_is_refused)
{
	char dir[200], good[300], path[300], made[600];
	test_dir_make(dir, sizeof(dir), "tbdir");
	snprintf(good, sizeof(good), "%s/good", dir);
	cr_assert_eq(mkdir(good, 0700), 0);
	const struct {
		const char *name;
		int mode;           /* mkdir then chmod; 0: a link to good; -1: another user's */
		const char *want;
	} rows[] = {
		{ "world", 0777, "may be written by others (mode 777, want no write bit for group or others)" },
		{ "group", 0775, "may be written by others (mode 775" },
		{ "others", 0703, "may be written by others (mode 703" },
		{ "sticky", 01777, "may be written by others (mode 777" },
		{ "link", 0, "is a symbolic link: name the directory it leads to" },
		{ "theirs", -1, "belongs to uid 1234, not to this process's" },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, rows[i].name);
		if (rows[i].mode == 0) {
			cr_assert_eq(symlink(good, path), 0);
		} else {
			cr_assert_eq(mkdir(path, 0700), 0);
			if (rows[i].mode > 0)
				cr_assert_eq(chmod(path, (mode_t)rows[i].mode), 0);
			else if (geteuid() != 0 || chown(path, 1234, 1234) != 0)
				continue;   /* only root can give a directory away */
		}
		struct tblog t;
		err_buf[0] = 0;
		int r = tblog_open(&t, path, err_buf, sizeof(err_buf));
		tblog_close(&t);
		cr_expect_lt(r, 0, "%s: accepted", rows[i].name);
		cr_expect(strstr(err_buf, rows[i].want) && !strchr(err_buf, '\n'), "%s: %s", rows[i].name, err_buf);
		cr_expect_eq(event_files(path, made, sizeof(made)), 0, "%s: a file was made", rows[i].name);
	}
	cr_assert_eq(event_files(good, made, sizeof(made)), 0, "through the link");
	test_dir_remove(dir);
}

/* A host name is whatever the UTS namespace says: one with a '/', ".."
 * and an escape byte names a file inside log_dir, escaped (fopen of the
 * raw name failed: "events...../x" is no directory). Needs root for a
 * namespace of its own. */
Test(tblog, the_host_name_is_escaped_in_the_file_name)
{
	char fname[300];
	tblog_file_name(fname, sizeof(fname), 7, "a/b c%\x1b..", 9, 0);
	cr_assert_str_eq(fname, "events.out.tfevents.7.a%2Fb%20c%25%1B...9.pstrain");
	tblog_file_name(fname, sizeof(fname), 7, "h", 9, 2);
	cr_assert_str_eq(fname, "events.out.tfevents.7.h.9.pstrain.2");
	if (geteuid() != 0 || unshare(CLONE_NEWUTS) != 0)
		cr_skip_test("no UTS namespace of its own (needs root): the name's escaping was checked, not a file made with it");
	const char *host = "../../x\x1b[31m";
	cr_assert_eq(sethostname(host, strlen(host)), 0);
	char dir[200], logs[300], made[600];
	test_dir_make(dir, sizeof(dir), "tbhost");
	snprintf(logs, sizeof(logs), "%s/logs", dir);
	struct tblog t;
	cr_assert_eq(tblog_open(&t, logs, err_buf, sizeof(err_buf)), 0, "%s", err_buf);
	tblog_close(&t);
	cr_assert_eq(event_files(logs, made, sizeof(made)), 1);
	cr_assert(strstr(made, "/events.out.tfevents.") && strstr(made, "...%2F..%2Fx%1B%5B31m."), "%s", made);
	test_dir_remove(dir);
}
