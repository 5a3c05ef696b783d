/* bench/gpu-session.sh on a stub bundle: a lent GPU session has 15 minutes
 * of device time, so one call must run what fits and say what it left out,
 * never start a step it cannot finish, bring its logs back in few files,
 * and not count a GPU test that skipped on a GPU machine as passed. Runs
 * anywhere: a stub nvidia-smi stands for the machine with or without a GPU,
 * and the steps that run fail or pass at once, which is enough to see which
 * ran and under what limit. */
#include <criterion/criterion.h>

#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* A copy of the script in its own tree (run unpacks into the tree's root,
 * which must not be the repository's), beside it a bundle of a stub pstrain
 * and a stub test binary, and two stub nvidia-smi. */
static void session_make(char *dir, size_t len)
{
	char script[4096], cmd[16384];
	test_dir_make(dir, len, "gpusession");
	test_repo_path(script, sizeof(script), "bench/gpu-session.sh");
	snprintf(cmd, sizeof(cmd),
		 "set -e; cd '%s'; mkdir -p tree/bench stage .gpu/data;"
		 "cp '%s' tree/bench/gpu-session.sh;"
		 "printf '#!/bin/sh\\necho pstrain stub\\n' >stage/pstrain; chmod +x stage/pstrain;"
		 /* A test binary whose every suite passes with one test skipped
		  * for want of a GPU, as on a machine where cuBLAS is not found. */
		 "mkdir -p stage/build/tests;"
		 "printf '#!/bin/sh\\necho \"[SKIP] any::test: needs a GPU: no cuBLAS\"\\n' >stage/build/tests/run;"
		 "chmod +x stage/build/tests/run;"
		 "tar czf .gpu/bin.tar.gz -C stage .; echo gzip >.gpu/FORMAT; echo 'commit stub' >.gpu/MANIFEST;"
		 /* nvidia-smi as on a GPU machine (gpu/) and as without a GPU (nogpu/). */
		 "mkdir gpu nogpu;"
		 "printf '#!/bin/sh\\necho \"GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\"\\n' >gpu/nvidia-smi;"
		 "printf '#!/bin/sh\\necho \"NVIDIA-SMI has failed\"; exit 9\\n' >nogpu/nvidia-smi;"
		 "chmod +x gpu/nvidia-smi nogpu/nvidia-smi",
		 dir, script);
	cr_assert_eq(system(cmd), 0, "could not make the stub bundle in %s", dir);
}

/* Runs the script's run with args, with nvidia-smi from dir/smi (gpu or
 * nogpu); returns its exit status, its output in *out (the path's buffer,
 * see slurp). */
static int session_run_with(const char *dir, const char *smi, const char *args, char **out)
{
	char cmd[8192], log[4096];
	snprintf(log, sizeof(log), "%s/run.log", dir);
	/* PY=false: the env step's torch query fails at once rather than
	 * import a framework. */
	snprintf(cmd, sizeof(cmd),
		 "cd '%s/tree' && PATH='%s/%s':\"$PATH\" PY=false sh bench/gpu-session.sh run ../.gpu ../out %s >'%s' 2>&1",
		 dir, dir, smi, args, log);
	int st = system(cmd);
	*out = slurp(log);
	cr_assert(WIFEXITED(st), "the script did not exit: %d\n%s", st, *out);
	return WEXITSTATUS(st);
}

/* Step name's log, from the call's one archive of logs (a device call
 * brings back at most 8 files). */
static const char *session_log(const char *dir, const char *name)
{
	char cmd[8192], log[4200];
	snprintf(cmd, sizeof(cmd), "cd '%s' && rm -rf logs && mkdir logs && tar xzf out/logs.tar.gz -C logs", dir);
	cr_assert_eq(system(cmd), 0, "no out/logs.tar.gz in %s", dir);
	snprintf(log, sizeof(log), "%s/logs/%s.log", dir, name);
	return slurp(log);
}

static int session_run(const char *dir, const char *args, char **out)
{
	return session_run_with(dir, "nogpu", args, out);
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
	/* What comes back from a device call: the logs and the summary. */
	char path[4200];
	snprintf(path, sizeof(path), "%s/out/summary.txt", dir);
	const char *summary = slurp(path);
	cr_expect(strstr(summary, "   env: exit 1\n   tests: not run (budget)"), "summary.txt:\n%s", summary);
	cr_expect(strstr(session_log(dir, "env"), "## nvidia-smi"), "env's log is not in the archive");
	char cmd[4300];
	snprintf(cmd, sizeof(cmd), "test $(ls -A '%s/out' | wc -l) = 2", dir);
	cr_expect_eq(system(cmd), 0, "out/ holds other files than logs.tar.gz and summary.txt");
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

/* A GPU test that skips proves nothing: on a machine whose nvidia-smi lists
 * a GPU, the tests step fails on it; without a GPU the skip is expected. */
Test(gpu_session, a_test_skipped_on_a_gpu_machine_fails_the_tests_step, .timeout = 60)
{
	char dir[4096], *out;
	session_make(dir, sizeof(dir));
	int rc = session_run_with(dir, "gpu", "tests", &out);
	cr_expect_eq(rc, 1, "exit %d with a GPU listed\n%s", rc, out);
	const char *text = session_log(dir, "tests");
	cr_expect(strstr(text, "## suite gpu_kernels FAILED: 1 test(s) skipped on a machine with a GPU"), "%s", text);
	cr_expect(strstr(text, "## suite cnn FAILED: 1 test(s) skipped"), "%s", text);
	rc = session_run_with(dir, "nogpu", "tests", &out);
	cr_expect_eq(rc, 0, "exit %d without a GPU\n%s", rc, out);
	cr_expect(strstr(out, "   tests: exit 0"), "%s", out);
	test_dir_remove(dir);
}
