/* bench/gpu-session.sh's call budget, on a stub bundle: a lent GPU session
 * has 15 minutes of device time, so one call must run what fits and say
 * what it left out, never start a step it cannot finish. Runs anywhere: the
 * steps that do run fail at once here (no nvidia-smi), which is enough to
 * see which ran and under what limit. */
#include <criterion/criterion.h>

#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* A copy of the script in its own tree (run unpacks into the tree's root,
 * which must not be the repository's), and beside it a bundle whose only
 * binary is a stub pstrain. */
static void session_make(char *dir, size_t len)
{
	char script[4096], cmd[16384];
	test_dir_make(dir, len, "gpusession");
	test_repo_path(script, sizeof(script), "bench/gpu-session.sh");
	snprintf(cmd, sizeof(cmd),
		 "set -e; cd '%s'; mkdir -p tree/bench stage .gpu/data;"
		 "cp '%s' tree/bench/gpu-session.sh;"
		 "printf '#!/bin/sh\\necho pstrain stub\\n' >stage/pstrain; chmod +x stage/pstrain;"
		 "tar czf .gpu/bin.tar.gz -C stage .; echo gzip >.gpu/FORMAT; echo 'commit stub' >.gpu/MANIFEST",
		 dir, script);
	cr_assert_eq(system(cmd), 0, "could not make the stub bundle in %s", dir);
}

/* Runs the script's run with args; returns its exit status, its output in
 * *out (the path's buffer, see slurp). */
static int session_run(const char *dir, const char *args, char **out)
{
	char cmd[8192], log[4096];
	snprintf(log, sizeof(log), "%s/run.log", dir);
	/* PY=false: the env step's torch query fails at once rather than
	 * import a framework. */
	snprintf(cmd, sizeof(cmd), "cd '%s/tree' && PY=false sh bench/gpu-session.sh run ../.gpu ../out %s >'%s' 2>&1",
		 dir, args, log);
	int st = system(cmd);
	*out = slurp(log);
	cr_assert(WIFEXITED(st), "the script did not exit: %d\n%s", st, *out);
	return WEXITSTATUS(st);
}

Test(gpu_session, a_budget_too_small_runs_nothing_and_says_so, .timeout = 60)
{
	char dir[4096], *out;
	session_make(dir, sizeof(dir));
	int rc = session_run(dir, "--budget 20 all", &out);
	cr_expect_eq(rc, 3, "exit %d, expected 3 (nothing failed, steps left out)\n%s", rc, out);
	const char *steps[] = { "env", "tests", "mlp", "cluster", "sanitize", "bench", "bench-cnn", "ncu", "pushpull", "cnn" };
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		char want[64];
		snprintf(want, sizeof(want), "\n   %s: not run (budget)", steps[i]);
		cr_expect(strstr(out, want), "no '%s' in\n%s", want + 4, out);
	}
	cr_expect(!strstr(out, "(limit "), "a step started under a 20 s budget:\n%s", out);
	test_dir_remove(dir);
}

Test(gpu_session, a_step_is_cut_to_what_is_left_and_later_ones_left_out, .timeout = 90)
{
	char dir[4096], *out;
	session_make(dir, sizeof(dir));
	int rc = session_run(dir, "--budget 100 env tests", &out);
	/* env fails here (no GPU), so 1, not 3, though tests was left out. */
	cr_expect_eq(rc, 1, "exit %d, expected 1\n%s", rc, out);
	const char *at = strstr(out, "== env (limit ");
	cr_assert(at, "env did not run:\n%s", out);
	int lim = atoi(at + strlen("== env (limit "));
	cr_expect(lim >= 60 && lim <= 85, "env ran with a limit of %d s, expected 60..85 (100 s less the margin)\n%s",
		  lim, out);
	cr_expect(strstr(out, "\n   tests: not run (budget)"), "tests was not left out:\n%s", out);
	cr_expect(strstr(out, "\n   env: exit "), "env's status is not in the summary:\n%s", out);
	test_dir_remove(dir);
}

Test(gpu_session, without_a_budget_every_step_has_its_own_limit, .timeout = 60)
{
	char dir[4096], *out;
	session_make(dir, sizeof(dir));
	session_run(dir, "env", &out);
	cr_expect(strstr(out, "== env (limit 120s)"), "env did not run with its own limit:\n%s", out);
	cr_expect(!strstr(out, "not run"), "a step was left out without a budget:\n%s", out);
	test_dir_remove(dir);
}

Test(gpu_session, a_bad_budget_is_refused, .timeout = 30)
{
	char dir[4096], *out;
	session_make(dir, sizeof(dir));
	int rc = session_run(dir, "--budget 8m env", &out);
	cr_expect_eq(rc, 2, "exit %d\n%s", rc, out);
	cr_expect(strstr(out, "--budget takes whole seconds, not '8m'"), "%s", out);
	rc = session_run(dir, "--budget 100", &out);
	cr_expect_eq(rc, 2, "no step: exit %d\n%s", rc, out);
	test_dir_remove(dir);
}
