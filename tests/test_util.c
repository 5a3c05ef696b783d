/* The test helpers themselves, where a fault would let other tests pass
 * or leave processes behind. */
#include <criterion/criterion.h>

#include "util.h"

#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Whether pid is gone, or a zombie: not a child of ours, so reaped by
 * whoever adopted it, which in some containers nobody does. */
static int dead(pid_t pid)
{
	char path[64], st[512] = "";
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 1;
	size_t n = fread(st, 1, sizeof(st) - 1, f);
	fclose(f);
	st[n] = 0;
	const char *p = strrchr(st, ')');
	return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* A pstrain started by a test that then ends without waiting for it (an
 * assertion failed) is killed with it: here a ps, which would otherwise
 * wait for its workers for ever. A child process stands in for the test. */
Test(util, spawned_pstrain_dies_with_the_test)
{
	char dir[256], cfg[300], log[300];
	cr_assert_geq(sodium_init(), 0); /* write_cluster makes a key */
	test_dir_make(dir, sizeof(dir), "util");
	snprintf(cfg, sizeof(cfg), "%s/c.ini", dir);
	snprintf(log, sizeof(log), "%s/ps.log", dir);
	write_cluster(dir, cfg, 100, 10, "checkpoint_dir =\n", "");
	int fds[2];
	cr_assert_eq(pipe(fds), 0);
	pid_t test = fork();
	cr_assert_neq(test, -1);
	if (test == 0) {
		const char *args[] = { "ps", "--index", "0", "--config", cfg, NULL };
		pid_t ps = spawn_pstrain(args, log, NULL);
		(void)!write(fds[1], &ps, sizeof(ps));
		wait_for_text(log, "listening on");
		_exit(1); /* as a failed assertion ends a test */
	}
	pid_t ps = -1;
	cr_assert_eq(read(fds[0], &ps, sizeof(ps)), (ssize_t)sizeof(ps));
	int st;
	cr_assert_eq(waitpid(test, &st, 0), test);
	cr_assert_not_null(strstr(slurp(log), "listening on"), "%s", slurp(log));
	struct timespec nap = { 0, 20 * 1000 * 1000 };
	for (int i = 0; i < 250 && !dead(ps); i++)
		nanosleep(&nap, NULL);
	int gone = dead(ps);
	if (!gone)
		kill(ps, SIGKILL);
	close(fds[0]);
	close(fds[1]);
	cr_assert(gone, "ps %d outlived the test that started it:\n%s", (int)ps, slurp(log));
	test_dir_remove(dir);
}
