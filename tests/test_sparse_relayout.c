/* Issue 39 part 5, end to end through the binary ($PSTRAIN_BIN): a sparse
 * checkpoint that 2 ps wrote (rows-0-of-2, rows-1-of-2) restores into 3 ps,
 * whose row ranges cut across both files, and into `local`, which reads
 * every row from both; training continues from it.
 *
 * Every stage trains one worker in sync mode with `local`'s batch size
 * and a constant learning rate, so each step sums the same gradients in
 * the same order as `local` (tests/test_sparse.c: one worker over 1 or 2
 * ps ends bit for bit on `local`). A restore that lost or misplaced a
 * single row, a moment of lazy Adam, its step count or Adam's dense state
 * therefore ends elsewhere than an uninterrupted `local` run: the tensor
 * lines of `pstrain check` (every table, its optimizer state and every
 * dense tensor, hashed) must be equal at the step of the checkpoint and at
 * the end. The data: `pstrain synth`'s 3000 rows, 26 tables of 100 rows of
 * 4; a stage takes well under a second. */
#include <criterion/criterion.h>

#include "target.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RUN_S 60
#define MAX_PROCS 5

TestSuite(sparse_relayout, .init = target_setup, .fini = target_teardown, .timeout = 240);

/* target_dir/ctr/{train,test}.txt (pstrain synth) and cluster.key, once. */
static void ctr_data(void)
{
	char out[300], path[300], err[KEY_ERR_MAX];
	snprintf(path, sizeof(path), "%s/ctr", target_dir);
	if (access(path, F_OK) == 0)
		return;
	snprintf(out, sizeof(out), "%s/synth.log", target_dir);
	const char *args[] = { "synth", "--out", path, "--train-rows", "3000", "--test-rows", "400", "--vocab", "300",
			       "--seed", "7", NULL };
	pid_t p = spawn_pstrain(args, out, NULL);
	int st;
	wait_children(&p, 1, &st, RUN_S);
	cr_assert_eq(st, 0, "synth: %s", slurp(out));
	snprintf(path, sizeof(path), "%s/cluster.key", target_dir);
	cr_assert_eq(key_generate(path, err, sizeof(err)), 0, "%s", err);
}

/* target_dir/NAME.ini: nps ps on free ports and one worker, `steps` steps,
 * checkpoints every 25 steps into ck (relative to the config). lazy_adam
 * over the tables and adam over the rest: the most state a restore can
 * lose (two moments and a step count on each side). */
static void write_cfg(char *cfg, size_t len, const char *name, int nps, int steps, const char *ck)
{
	ctr_data();
	snprintf(cfg, len, "%s/%s.ini", target_dir, name);
	FILE *f = fopen(cfg, "w");
	cr_assert_not_null(f);
	fprintf(f, "[cluster]\nps = ");
	for (int k = 0; k < nps; k++)
		fprintf(f, "%s127.0.0.1:%d", k ? ", " : "", free_port());
	fprintf(f, "\nworkers = 127.0.0.1:%d\nkey_file = cluster.key\nsocket_dir = sockets-%s\n"
		   "[data]\nformat = criteo\ntrain_csv = ctr/train.txt\ntest_csv = ctr/test.txt\n"
		   "[train]\nsteps = %d\nbatch_size = 32\noptimizer = adam\nlearning_rate = 0.003\n"
		   "lr_schedule = constant\nembedding_optimizer = lazy_adam\nembedding_learning_rate = 0.02\n"
		   "seed = 3\nthreads = 1\nlog_dir =\ncheckpoint_dir = %s\ncheckpoint_every = 25\n"
		   "[model]\ninput = 13\nlayer = embedding 26 100 4\nlayer = dense 8\nlayer = relu\n"
		   "layer = dense 1\nloss = sigmoid_cross_entropy\n",
		   free_port(), name, steps, ck);
	cr_assert_eq(fclose(f), 0);
}

/* `pstrain local` on cfg; its log (dir/NAME.log). */
static char *run_local(const char *cfg, const char *name)
{
	char out[300];
	snprintf(out, sizeof(out), "%s/%s.log", target_dir, name);
	const char *args[] = { "local", "--config", cfg, NULL };
	pid_t p = spawn_pstrain(args, out, NULL);
	int st;
	wait_children(&p, 1, &st, RUN_S);
	cr_assert_eq(st, 0, "local %s: exit %d:\n%s", name, st, slurp(out));
	return slurp(out);
}

/* nps ps, then the worker; every one exits 0 and the worker recovered from
 * nothing (a run without failures). out[k]: ps k's log, out[nps] the
 * worker's. */
static void run_cluster(const char *cfg, const char *name, int nps, char (*out)[300])
{
	pid_t pids[MAX_PROCS];
	int st[MAX_PROCS], n = nps + 1;
	cr_assert_leq(n, MAX_PROCS);
	for (int i = 0; i < n; i++) {
		int ps = i < nps;
		char idx[16];
		snprintf(idx, sizeof(idx), "%d", ps ? i : 0);
		snprintf(out[i], 300, "%.200s/%.40s-%s%s.log", target_dir, name, ps ? "ps" : "worker", idx);
		const char *args[] = { ps ? "ps" : "worker", "--index", idx, "--config", cfg, NULL };
		pids[i] = spawn_pstrain(args, out[i], NULL);
	}
	wait_children(pids, n, st, RUN_S);
	assert_exits_zero(st, out, n, name);
	const char *w = slurp(out[nps]);
	cr_assert(!strstr(w, "reconnecting for up to") && !strstr(w, "rolling every shard back"),
		  "%s: the worker recovered in a run without failures:\n%s", name, w);
}

/* The tensor lines of step `step` in target_dir/CK (check's log in
 * target_dir/check.log); a new string. */
static char *tensors(const char *ck, long step)
{
	static char buf[32768];
	char sd[400];
	snprintf(sd, sizeof(sd), "%s/%s/step-%08ld", target_dir, ck, step);
	checkpoint_tensor_lines(target_dir, sd, buf, sizeof(buf));
	cr_assert(strstr(buf, "tensor embedding1.25.weight ") && strstr(buf, "tensor optim.v.embedding1.13.weight ") &&
			  strstr(buf, "tensor dense1.weight "),
		  "%s: not every table, its state and the dense tensors:\n%s", sd, buf);
	return strdup(buf);
}

/* The log says it resumed from target_dir/CK's step `step`, continued from
 * there and trained to `end`. */
static void assert_continued(const char *log, const char *who, const char *ck, long step, int end)
{
	char want[400];
	snprintf(want, sizeof(want), "resuming from %s/%s/step-%08ld", target_dir, ck, step);
	cr_assert_not_null(strstr(log, want), "%s did not resume from step %ld:\n%s", who, step, log);
	snprintf(want, sizeof(want), "done: %d steps", end);
	cr_assert_not_null(strstr(log, want), "%s did not train to step %d:\n%s", who, end, log);
}

enum { A = 25, T = 60 };

Test(sparse_relayout, two_ps_checkpoint_restores_into_three_ps_and_local)
{
	char cfg[300], out[MAX_PROCS][300], want[200], cmd[1000];

	/* Uninterrupted: local to T, checkpoints at A, 50 and T. */
	write_cfg(cfg, sizeof(cfg), "ref", 1, T, "ref");
	run_local(cfg, "ref");
	char *ref_a = tensors("ref", A), *ref_t = tensors("ref", T);

	/* 1: 2 ps + 1 worker to A. Each ps writes its half of the rows, and
	 * the checkpoint is `local`'s at A. */
	write_cfg(cfg, sizeof(cfg), "s1", 2, A, "ck");
	run_cluster(cfg, "s1", 2, out);
	for (int k = 0; k < 2; k++) {
		char path[500];
		snprintf(path, sizeof(path), "%s/ck/step-%08d/rows-%d-of-2.safetensors", target_dir, A, k);
		cr_assert_eq(access(path, F_OK), 0, "no %s:\n%s", path, slurp(out[k]));
	}
	char *got = tensors("ck", A);
	cr_assert_str_eq(got, ref_a, "2 ps wrote another step %d than local's:\n%s\nlocal's:\n%s", A, got, ref_a);
	free(got);
	/* The same checkpoint for the local stage (3 ps write step T into ck). */
	snprintf(cmd, sizeof(cmd), "cp -a %s/ck %s/ck_local", target_dir, target_dir);
	cr_assert_eq(system(cmd), 0, "%s", cmd);

	/* 2: 3 ps + 1 worker from A to T. The 2,600 rows were [0, 1300) and
	 * [1300, 2600) and are now [0, 867), [867, 1734), [1734, 2600): ps 1
	 * reads from both files. */
	write_cfg(cfg, sizeof(cfg), "s2", 3, T, "ck");
	run_cluster(cfg, "s2", 3, out);
	static const char *const ranges[] = { "[0, 867)", "[867, 1734)", "[1734, 2600)" };
	for (int k = 0; k < 3; k++) {
		char *ps = slurp(out[k]);
		snprintf(want, sizeof(want), "ps %d: embedding rows %s loaded from step %d's checkpoint", k, ranges[k], A);
		cr_assert_not_null(strstr(ps, want), "ps %d of 3:\n%s", k, ps);
	}
	char *w = slurp(out[3]);
	snprintf(want, sizeof(want), "continuing at step %d of %d", A, T);
	cr_assert_not_null(strstr(w, want), "the worker of 3 ps:\n%s", w);
	cr_assert_not_null(strstr(w, "done: 60 steps"), "the worker of 3 ps:\n%s", w);
	got = tensors("ck", T);
	cr_assert_str_eq(got, ref_t, "2 ps -> 3 ps ends elsewhere:\n%s\nuninterrupted:\n%s", got, ref_t);
	free(got);

	/* 3: local from the 2 ps' step A to T. */
	write_cfg(cfg, sizeof(cfg), "s3", 1, T, "ck_local");
	assert_continued(run_local(cfg, "s3"), "local", "ck_local", A, T);
	got = tensors("ck_local", T);
	cr_assert_str_eq(got, ref_t, "2 ps -> local ends elsewhere:\n%s\nuninterrupted:\n%s", got, ref_t);
	free(got);
	free(ref_a);
	free(ref_t);
}
