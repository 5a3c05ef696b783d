/* Issue 40 part 1, end to end through the binary ($PSTRAIN_BIN): a step
 * trains a global batch of [train] slices whatever the number of workers
 * (docs/ELASTIC.md), so sync clusters of different sizes end on the
 * parameters of `local --set train.slices=S`, bit for bit.
 *
 * The data are the small blobs (600 rows, 480 train / 120 test) of
 * tests/util.h; every run is bounded by RUN_TIMEOUT_S, after which its
 * processes are killed and the test fails. Workers push with [cluster]
 * overlap = false: a CPU worker's split backward rounds its blocks'
 * products as its BLAS does, not as local's whole GEMM (docs/CONFIG.md). */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define RUN_TIMEOUT_S 60
#define MAX_PROCS 8

static char dir[256];

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
	test_dir_make(dir, sizeof(dir), "elastic");
}

static void teardown(void)
{
	if (!getenv("KEEP")) test_dir_remove(dir);
	leak_check();
}

TestSuite(elastic, .init = setup, .fini = teardown, .timeout = 240);

/* One run's config. Zero fields take the defaults in write_cfg. */
struct run_cfg {
	int nps, nw;          /* [cluster]: ps tasks, workers listed */
	const char *mode;     /* "sync" or "async" */
	int steps;
	int slices;           /* 0: unset (auto) */
	const char *ck;       /* checkpoint_dir, relative to the config */
};

/* blobs.csv and cluster.key in dir and at cfg a config for r on free
 * loopback ports: adam (the most optimizer state to differ), a constant
 * rate, batches of 16 a slice. */
static void write_cfg(const char *cfg, struct run_cfg r)
{
	write_cluster_files(dir);
	FILE *f = fopen(cfg, "w");
	cr_assert_not_null(f);
	fprintf(f, "[cluster]\nps = ");
	for (int k = 0; k < (r.nps ? r.nps : 1); k++)
		fprintf(f, "%s127.0.0.1:%d", k ? ", " : "", free_port());
	fprintf(f, "\nworkers = ");
	for (int w = 0; w < (r.nw ? r.nw : 1); w++)
		fprintf(f, "%s127.0.0.1:%d", w ? ", " : "", free_port());
	fprintf(f, "\nkey_file = cluster.key\noverlap = false\nsocket_dir = sockets\n"
		   "[data]\nformat = csv\ntrain_csv = blobs.csv\nlabel_column = first\n"
		   "[train]\nmode = %s\nsteps = %d\nbatch_size = 16\noptimizer = adam\n"
		   "learning_rate = 0.01\nlr_schedule = constant\nseed = 3\nthreads = 1\n"
		   "eval_every = 1000\ncheckpoint_dir = %s\ncheckpoint_every = 0\n",
		r.mode ? r.mode : "sync", r.steps, r.ck ? r.ck : "ck");
	if (r.slices)
		fprintf(f, "slices = %d\n", r.slices);
	fprintf(f, "[model]\ninput = 6\nlayer = dense 16\nlayer = relu\nlayer = dropout 0.2\nlayer = dense 3\n");
	cr_assert_eq(fclose(f), 0);
}

/* `pstrain local` on cfg with --set set (if not NULL); its log at
 * dir/TAG.log; asserts that it exits 0. */
static void run_local(const char *cfg, const char *set, const char *tag)
{
	char log[300];
	snprintf(log, sizeof(log), "%s/%s.log", dir, tag);
	const char *args[] = { "local", "--config", cfg, set ? "--set" : NULL, set, NULL };
	pid_t pid = spawn_pstrain(args, log, NULL);
	int st;
	wait_children(&pid, 1, &st, RUN_TIMEOUT_S);
	cr_assert_eq(st, 0, "%s: exit %d:\n%s", tag, st, slurp(log));
}

/* Starts ps 0..nps-1 and then workers nw-1..0 of cfg, logs in out
 * (dir/TAG-ps0.log ..., worker w's at out[nps + w]); their pids in pids. */
static void start_cluster(const char *cfg, int nps, int nw, const char *tag, pid_t *pids, char out[][300])
{
	cr_assert_leq(nps + nw, MAX_PROCS);
	for (int j = 0; j < nps + nw; j++) {
		int i = j < nps ? j : nps + nw - 1 - (j - nps), ps = i < nps;
		char idx[16];
		snprintf(idx, sizeof(idx), "%d", ps ? i : i - nps);
		snprintf(out[i], 300, "%.200s/%.40s-%s%s.log", dir, tag, ps ? "ps" : "worker", idx);
		const char *args[] = { ps ? "ps" : "worker", "--index", idx, "--config", cfg, NULL };
		pids[i] = spawn_pstrain(args, out[i], NULL);
	}
}

/* The tensor lines of checkpoint `step` in dir/ck. */
static void ck_lines(const char *ck, long step, char *out, size_t len)
{
	char sd[400];
	snprintf(sd, sizeof(sd), "%s/%s/step-%08ld", dir, ck, step);
	checkpoint_tensor_lines(dir, sd, out, len);
}

/* Sync clusters of 1, 2 and 4 workers over 4 slices end where `local
 * --set train.slices=4` does: parameters and adam's moments bit for bit.
 * 1 and 2 workers train several slices each, pushed one by one. */
Test(elastic, one_two_four_workers_end_on_local_slices)
{
	enum { T = 40 };
	static char ref[16384], got[16384];
	char cfg[300], out[MAX_PROCS][300], tag[32], ck[32], logp[400];
	pid_t pids[MAX_PROCS];
	int st[MAX_PROCS];

	snprintf(cfg, sizeof(cfg), "%s/local.ini", dir);
	write_cfg(cfg, (struct run_cfg){ .steps = T, .ck = "ref" });
	run_local(cfg, "train.slices=4", "local");
	snprintf(logp, sizeof(logp), "%s/local.log", dir);
	cr_assert_not_null(strstr(slurp(logp), "batch 4 slices x 16"), "%s", slurp(logp));
	ck_lines("ref", T, ref, sizeof(ref));

	static const int sizes[] = { 1, 2, 4 };
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		int nw = sizes[i];
		snprintf(tag, sizeof(tag), "w%d", nw);
		snprintf(ck, sizeof(ck), "ck%d", nw);
		snprintf(cfg, sizeof(cfg), "%s/%s.ini", dir, tag);
		write_cfg(cfg, (struct run_cfg){ .nps = 2, .nw = nw, .steps = T, .slices = 4, .ck = ck });
		start_cluster(cfg, 2, nw, tag, pids, out);
		wait_children(pids, 2 + nw, st, RUN_TIMEOUT_S);
		assert_exits_zero(st, out, 2 + nw, tag);
		ck_lines(ck, T, got, sizeof(got));
		cr_assert_str_eq(got, ref, "%d workers end elsewhere:\n%s\nlocal with 4 slices:\n%s", nw, got, ref);
	}
}
