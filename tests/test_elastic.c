/* Issue 40 part 1, end to end through the binary ($PSTRAIN_BIN): a step
 * trains a global batch of [train] slices whatever the number of workers
 * (docs/ELASTIC.md), so sync clusters of different sizes end on the
 * parameters of `local --set train.slices=S`, bit for bit; and with
 * [cluster] min_workers below the workers listed, workers join a running
 * job, leave it on SIGTERM, or are lost, and it still ends there.
 *
 * The data are the small blobs (600 rows, 480 train / 120 test) of
 * tests/util.h; every run is bounded by RUN_TIMEOUT_S, after which its
 * processes are killed and the test fails. Workers push with [cluster]
 * overlap = false: a CPU worker's split backward rounds its blocks'
 * products as its BLAS does, not as local's whole GEMM (docs/CONFIG.md). */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include <math.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RUN_TIMEOUT_S 60
/* Every worker of an elastic run sleeps this long before each step
 * (base/hooks.h), so that the run lasts while workers join and leave. */
#define SLOW "PSTRAIN_STEP_DELAY_MS=4"
#define MAX_PROCS 8

static char dir[256];

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
	test_dir_make(dir, sizeof(dir), "elastic");
}

static void teardown(void)
{
	test_dir_remove(dir);
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
	int min_workers;      /* 0: unset (all) */
	int eval_every;       /* 0: 1000 (once, at the end) */
	int peer_timeout;     /* 0: the default */
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
	if (r.min_workers)
		fprintf(f, "\nmin_workers = %d", r.min_workers);
	if (r.peer_timeout)
		fprintf(f, "\npeer_timeout = %d", r.peer_timeout);
	fprintf(f, "\nkey_file = cluster.key\noverlap = false\nsocket_dir = sockets\n"
		   "[data]\nformat = csv\ntrain_csv = blobs.csv\nlabel_column = first\n"
		   "[train]\nmode = %s\nsteps = %d\nbatch_size = 16\noptimizer = adam\n"
		   "learning_rate = 0.01\nlr_schedule = constant\nseed = 3\nthreads = 1\n"
		   "eval_every = %d\ncheckpoint_dir = %s\ncheckpoint_every = 0\nlog_dir = %s.logs\n",
		r.mode ? r.mode : "sync", r.steps, r.eval_every ? r.eval_every : 1000, r.ck ? r.ck : "ck",
		r.ck ? r.ck : "ck");
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

/* ---- elastic ------------------------------------------------------------------ */

/* `local` on rc's config (its checkpoints in dir/ref): the tensor lines
 * of its last step into ref (len bytes). */
static void local_ref(struct run_cfg rc, char *ref, size_t len)
{
	char cfg[300];
	snprintf(cfg, sizeof(cfg), "%s/ref.ini", dir);
	rc.ck = "ref";
	write_cfg(cfg, rc);
	run_local(cfg, NULL, "local");
	ck_lines("ref", rc.steps, ref, len);
}

/* Worker w of cfg (with env, if not NULL), its log at out. */
static pid_t start_worker(const char *cfg, int w, const char *tag, char *out, const char *env)
{
	char idx[16];
	snprintf(idx, sizeof(idx), "%d", w);
	snprintf(out, 300, "%.200s/%.40s-worker%d.log", dir, tag, w);
	const char *args[] = { "worker", "--index", idx, "--config", cfg, NULL };
	return spawn_pstrain(args, out, env);
}

/* Starts ps 0..nps-1 of cfg; logs in out[0..nps). */
static void start_ps(const char *cfg, int nps, const char *tag, pid_t *pids, char out[][300])
{
	for (int k = 0; k < nps; k++) {
		char idx[16];
		snprintf(idx, sizeof(idx), "%d", k);
		snprintf(out[k], 300, "%.200s/%.40s-ps%d.log", dir, tag, k);
		const char *args[] = { "ps", "--index", idx, "--config", cfg, NULL };
		pids[k] = spawn_pstrain(args, out[k], NULL);
	}
}

/* Waits up to 60 s for text in the file at path, failing the test
 * (and showing also, a second log) if it does not come. */
static void await_text(const char *path, const char *text, const char *also)
{
	cr_assert(wait_for_text(path, text), "no \"%s\" in %s:\n%s\n---\n%s", text, path, slurp(path),
		  also ? slurp(also) : "");
}

/* Waits up to 60 s for the log at path to show a step at or past n
 * ("step K/" with K >= n: a chief's progress line or another worker's
 * evaluation line; a worker that joined late has none before it). */
static void await_step(const char *path, long n)
{
	struct timespec nap = { 0, 2 * 1000 * 1000 };
	for (int i = 0; i < 30000; i++) {
		for (const char *p = slurp(path); (p = strstr(p, "step ")) != NULL; p += 5) {
			long k;
			char slash;
			if (sscanf(p, "step %ld%c", &k, &slash) == 2 && slash == '/' && k >= n)
				return;
		}
		nanosleep(&nap, NULL);
	}
	cr_assert_fail("%s shows no step at or past %ld:\n%s", path, n, slurp(path));
}

/* `pstrain status` on cfg: its output. */
static char *status_of(const char *cfg, const char *tag)
{
	char log[300];
	snprintf(log, sizeof(log), "%s/%s-status.log", dir, tag);
	const char *args[] = { "status", "--config", cfg, NULL };
	pid_t pid = spawn_pstrain(args, log, NULL);
	int st;
	wait_children(&pid, 1, &st, RUN_TIMEOUT_S);
	cr_assert_eq(st, 0, "status: exit %d:\n%s", st, slurp(log));
	return slurp(log);
}

/* The chain 2 -> 4 -> 1 on cfg (4 workers listed, 2 ps), logs tagged
 * tag: ps 0 and 1, workers 1 and 0 (each step slowed down, SLOW, so that
 * the changes land mid-run); workers 2 and
 * 3 once the two train together and the chief has logged step 40; SIGTERM
 * to workers 1 to 3 once the four train together and the chief has
 * logged step `leave`. pids and out as start_cluster's. */
static void run_chain(const char *cfg, const char *tag, long leave, pid_t *pids, char out[][300])
{
	start_ps(cfg, 2, tag, pids, out);
	pids[3] = start_worker(cfg, 1, tag, out[3], SLOW);
	pids[2] = start_worker(cfg, 0, tag, out[2], SLOW);
	await_text(out[0], "workers 0, 1 train the 4 slices", out[2]);
	await_step(out[2], 40);
	pids[4] = start_worker(cfg, 2, tag, out[4], SLOW);
	pids[5] = start_worker(cfg, 3, tag, out[5], SLOW);
	await_text(out[0], "workers 0, 1, 2, 3 train the 4 slices", out[4]);
	await_step(out[2], leave);
	for (int i = 3; i < 6; i++)
		cr_assert_eq(kill(pids[i], SIGTERM), 0);
}

/* The elastic chain (docs/ELASTIC.md): 4 workers listed, min_workers 1,
 * 4 slices, sync. Workers 0 and 1 train from the start, 2 and 3 start
 * once worker 1 has logged step 40 and join at whatever step their first
 * pull lands, then 1, 2 and 3 get SIGTERM once the four have trained
 * together and worker 1 has logged step 90: each says LEAVE, pushes its
 * slices of one more step and exits 0, and the chief trains alone to the
 * end. `pstrain status` meanwhile shows the joins and leaves, and the
 * chief's TensorBoard the live worker count. The parameters and adam's
 * moments at the end are local's with 4 slices, bit for bit: timing-free
 * by construction. */
Test(elastic, chain_2_4_1_sync_is_bit_for_bit)
{
	enum { T = 400 };
	static char ref[16384], got[16384];
	char cfg[300], out[MAX_PROCS][300], want[200];
	pid_t pids[MAX_PROCS];
	int st[MAX_PROCS];
	struct run_cfg rc = { .nps = 2, .nw = 4, .steps = T, .slices = 4, .min_workers = 1, .eval_every = 10 };

	local_ref(rc, ref, sizeof(ref));
	snprintf(cfg, sizeof(cfg), "%s/chain.ini", dir);
	rc.ck = "ck";
	write_cfg(cfg, rc);
	run_chain(cfg, "chain", 90, pids, out);
	for (int w = 1; w < 4; w++) {
		snprintf(want, sizeof(want), "worker %d leaves", w);
		await_text(out[0], want, out[2 + w]);
	}
	char *text = status_of(cfg, "chain");
	for (int w = 0; w < 4; w++) {
		snprintf(want, sizeof(want), "worker %d joined", w);
		cr_assert_not_null(strstr(text, want), "status does not show \"%s\":\n%s", want, text);
	}
	for (int w = 1; w < 4; w++) {
		snprintf(want, sizeof(want), "worker %d left", w);
		cr_assert_not_null(strstr(text, want), "status does not show \"%s\":\n%s", want, text);
	}
	wait_children(pids, 6, st, RUN_TIMEOUT_S);
	assert_exits_zero(st, out, 6, "chain");
	for (int i = 3; i < 6; i++)
		cr_assert_not_null(strstr(slurp(out[i]), "(SIGTERM): its slices go to the others"), "%s",
				   slurp(out[i]));
	ck_lines("ck", T, got, sizeof(got));
	cr_assert_str_eq(got, ref, "the chain ends elsewhere:\n%s\nlocal with 4 slices:\n%s", got, ref);

	char logs[400], tb[400];
	snprintf(logs, sizeof(logs), "%s/ck.logs", dir);
	snprintf(tb, sizeof(tb), "%s/tb.txt", dir);
	char *events = test_tb_read(logs, tb);
	if (!events)
		return; /* no tensorboard in build/pyvenv: the rest is checked */
	double lo = 9, hi = 0;
	for (long step = 10; step <= T; step += 10) {
		double v = test_tb_value(events, "cluster/live_workers", step);
		lo = !isnan(v) && v < lo ? v : lo;
		hi = !isnan(v) && v > hi ? v : hi;
	}
	cr_assert(lo == 1 && hi == 4, "cluster/live_workers from %g to %g, want 1 to 4:\n%s", lo, hi, events);
}

/* A worker killed mid-run (SIGKILL: no LEAVE, as soon as the three train
 * together) is lost; past peer_timeout
 * ps 0 drops it and gives its slices of the step under way to the others
 * (a revision), which train that step again; the run still ends on
 * local's parameters, bit for bit. */
Test(elastic, killed_worker_slices_go_to_the_others)
{
	enum { T = 200 };
	static char ref[16384], got[16384];
	char cfg[300], out[MAX_PROCS][300];
	pid_t pids[MAX_PROCS];
	int st[MAX_PROCS];
	struct run_cfg rc = { .nps = 2, .nw = 3, .steps = T, .slices = 4, .min_workers = 1, .eval_every = 10,
			      .peer_timeout = 1 };

	local_ref(rc, ref, sizeof(ref));
	snprintf(cfg, sizeof(cfg), "%s/kill.ini", dir);
	rc.ck = "ck";
	write_cfg(cfg, rc);
	start_ps(cfg, 2, "kill", pids, out);
	pids[4] = start_worker(cfg, 2, "kill", out[4], SLOW);
	pids[3] = start_worker(cfg, 1, "kill", out[3], SLOW);
	pids[2] = start_worker(cfg, 0, "kill", out[2], SLOW);
	await_text(out[0], "workers 0, 1, 2 train the 4 slices", out[2]);
	cr_assert_eq(kill(pids[4], SIGKILL), 0);
	wait_children(pids, 4, st, RUN_TIMEOUT_S);
	assert_exits_zero(st, out, 4, "kill");
	cr_assert_not_null(strstr(slurp(out[0]), "again (a worker was lost)"), "%s", slurp(out[0]));
	ck_lines("ck", T, got, sizeof(got));
	cr_assert_str_eq(got, ref, "a lost worker changed the result:\n%s\nlocal with 4 slices:\n%s", got, ref);
	int st4;
	wait_children(&pids[4], 1, &st4, 1);
}

/* The test accuracy of a chief's final line. */
static double chief_accuracy(const char *log)
{
	return final_accuracy(slurp(log));
}

/* Async follows the same membership: 2 workers, then 4 (2 and 3 start
 * once worker 1 has logged step 40), then the chief alone (1 to 3 get
 * SIGTERM once worker 1 has logged step 120), each worker training its
 * share of the 4 slices of the newest view. Not reproducible, as async
 * never is: the test accuracy is within 1 point of a fixed 4-worker async
 * run's. */
Test(elastic, async_within_a_point)
{
	enum { T = 300 };
	char cfg[300], out[MAX_PROCS][300];
	pid_t pids[MAX_PROCS];
	int st[MAX_PROCS];
	struct run_cfg rc = { .nps = 2, .nw = 4, .mode = "async", .steps = T, .slices = 4, .eval_every = 10 };

	snprintf(cfg, sizeof(cfg), "%s/fixed.ini", dir);
	rc.ck = "fixed";
	write_cfg(cfg, rc);
	start_cluster(cfg, 2, 4, "fixed", pids, out);
	wait_children(pids, 6, st, RUN_TIMEOUT_S);
	assert_exits_zero(st, out, 6, "fixed");
	double fixed = chief_accuracy(out[2]);

	snprintf(cfg, sizeof(cfg), "%s/async.ini", dir);
	rc.ck = "ck";
	rc.min_workers = 1;
	write_cfg(cfg, rc);
	run_chain(cfg, "async", 120, pids, out);
	wait_children(pids, 6, st, RUN_TIMEOUT_S);
	assert_exits_zero(st, out, 6, "async");
	cr_assert_not_null(strstr(slurp(out[0]), "worker 0 trains the 4 slices"), "%s", slurp(out[0]));
	double acc = chief_accuracy(out[2]);
	cr_assert(fabs(acc - fixed) <= 1.0, "elastic async: accuracy %.2f%%, fixed 4 workers %.2f%%", acc, fixed);
}

/* Backup workers follow the same membership, each keeping its one slice
 * (3 slices, replicas_to_aggregate 2, min_workers 2): workers 0 and 1
 * train from the start, 2 joins once the chief has logged step 40 and
 * leaves on SIGTERM once the chief has logged step 120; every step takes the first 2
 * gradients, and the run ends with every process at 0 and the accuracy
 * of a run that trained. */
Test(elastic, backup_workers_join_and_leave)
{
	char cfg[300], out[MAX_PROCS][300];
	pid_t pids[MAX_PROCS];
	int st[MAX_PROCS];
	snprintf(cfg, sizeof(cfg), "%s/backup.ini", dir);
	write_cfg(cfg, (struct run_cfg){ .nps = 2, .nw = 3, .steps = 300, .min_workers = 2, .eval_every = 10 });
	FILE *f = fopen(cfg, "a");
	cr_assert_not_null(f);
	fprintf(f, "[train]\nreplicas_to_aggregate = 2\n");
	cr_assert_eq(fclose(f), 0);
	start_ps(cfg, 2, "backup", pids, out);
	pids[3] = start_worker(cfg, 1, "backup", out[3], SLOW);
	pids[2] = start_worker(cfg, 0, "backup", out[2], SLOW);
	await_step(out[2], 40);
	pids[4] = start_worker(cfg, 2, "backup", out[4], SLOW);
	await_text(out[4], "continuing at step", out[0]);
	await_step(out[2], 120);
	cr_assert_eq(kill(pids[4], SIGTERM), 0);
	wait_children(pids, 5, st, RUN_TIMEOUT_S);
	assert_exits_zero(st, out, 5, "backup");
	cr_assert_not_null(strstr(slurp(out[0]), "worker 2 leaves"), "%s", slurp(out[0]));
	cr_assert_not_null(strstr(slurp(out[4]), "left at step"), "%s", slurp(out[4]));
	double acc = chief_accuracy(out[2]);
	cr_assert_geq(acc, 95.0, "backup workers: accuracy %.2f%%", acc);
}

/* ---- schedulers ---------------------------------------------------------- */

/* The end of a scheduler's chain on cfg (1 ps, the chief, workers 1 and
 * 2, logs out[0..3]): every process exited 0, ps 0 gave worker 2 slices
 * while 1 still trained, 1 left on SIGTERM, and the parameters and
 * moments are local's with 4 slices, bit for bit. */
static void assert_scheduler_chain(const char *cfg, int *st, char out[][300], const char *tag)
{
	static char ref[16384], got[16384];
	assert_exits_zero(st, out, 4, tag);
	cr_assert_not_null(strstr(slurp(out[0]), "workers 0, 1, 2 train the 4 slices"), "%s", slurp(out[0]));
	cr_assert_not_null(strstr(slurp(out[2]), "(SIGTERM): its slices go to the others"), "%s", slurp(out[2]));
	ck_lines("ck", 300, got, sizeof(got));
	char rcfg[300];
	snprintf(rcfg, sizeof(rcfg), "%s/ref.ini", dir);
	FILE *in = fopen(cfg, "r"), *o = fopen(rcfg, "w");
	cr_assert(in && o);
	char line[512];
	while (fgets(line, sizeof(line), in))
		fputs(strncmp(line, "checkpoint_dir", 14) ? line : "checkpoint_dir = ref\n", o);
	fclose(in);
	cr_assert_eq(fclose(o), 0);
	run_local(rcfg, NULL, "local");
	ck_lines("ref", 300, ref, sizeof(ref));
	cr_assert_str_eq(got, ref, "%s ends elsewhere:\n%s\nlocal with 4 slices:\n%s", tag, got, ref);
}

/* A TFJob scaled up and then down (issue 40): every process is `pstrain
 * run` with the TF_CONFIG Kubeflow sets. The ps, the chief and worker 0
 * (pstrain's worker 1) start with a TF_CONFIG of one worker; a second
 * worker's pod gets one that lists two (its task worker 1: pstrain's
 * worker 2), as a TFJob's new pods do while the old ones keep theirs, and
 * joins, since the workers' entries are not in the config hash
 * (max_workers is); then worker 1 gets SIGTERM, as a scale-down sends,
 * and leaves. */
Test(elastic, tf_config_add_and_remove)
{
	char cfg[300], out[4][300], env[4][700];
	pid_t pids[4];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/tf.ini", dir);
	write_cfg(cfg, (struct run_cfg){ .nw = 2, .steps = 300, .slices = 4, .min_workers = 1, .eval_every = 10 });
	FILE *f = fopen(cfg, "a");
	cr_assert_not_null(f);
	fprintf(f, "[cluster]\nmax_workers = 4\n");
	cr_assert_eq(fclose(f), 0);
	int ps = free_port(), chief = free_port(), w0 = free_port(), w1 = free_port();
	static const char *const type[4] = { "ps", "chief", "worker", "worker" };
	for (int i = 0; i < 4; i++) {
		char workers[64];
		if (i == 3)
			snprintf(workers, sizeof(workers), "\"127.0.0.1:%d\", \"127.0.0.1:%d\"", w0, w1);
		else
			snprintf(workers, sizeof(workers), "\"127.0.0.1:%d\"", w0);
		snprintf(env[i], sizeof(env[i]),
			 "TF_CONFIG={\"cluster\": {\"ps\": [\"127.0.0.1:%d\"], \"chief\": [\"127.0.0.1:%d\"], \"worker\": [%s]}, "
			 "\"task\": {\"type\": \"%s\", \"index\": %d}}",
			 ps, chief, workers, type[i], i == 3);
		snprintf(out[i], sizeof(out[i]), "%s/tf-%d.log", dir, i);
	}
	const char *args[] = { "run", "--config", cfg, NULL };
	for (int i = 0; i < 3; i++) {
		const char *envs[] = { env[i], SLOW, NULL };
		pids[i] = spawn_pstrain_env(args, out[i], envs);
	}
	await_text(out[0], "workers 0, 1 train the 4 slices", out[1]);
	await_step(out[1], 40);
	const char *envs[] = { env[3], SLOW, NULL };
	pids[3] = spawn_pstrain_env(args, out[3], envs);
	await_text(out[0], "workers 0, 1, 2 train the 4 slices", out[3]);
	cr_assert_not_null(strstr(slurp(out[3]), "pstrain: worker 2, from TF_CONFIG (task worker 1, after the chief)"),
			   "%s", slurp(out[3]));
	await_step(out[1], 120);
	cr_assert_eq(kill(pids[2], SIGTERM), 0);
	wait_children(pids, 4, st, RUN_TIMEOUT_S);
	assert_scheduler_chain(cfg, st, out, "TF_CONFIG");
}

/* The same through StatefulSet pod names (pstrain run in pods named
 * job-ps-0, job-worker-0 and -1, then job-worker-2 as `kubectl scale
 * --replicas=3` adds it, and SIGTERM to job-worker-1): [cluster] lists
 * every pod's address up front, min_workers lets them come and go.
 * Skipped where this system gives a process no host name of its own. */
Test(elastic, pod_name_add_and_remove)
{
	char cfg[300], out[4][300];
	pid_t pids[4];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/pod.ini", dir);
	write_cfg(cfg, (struct run_cfg){ .nw = 4, .steps = 300, .slices = 4, .min_workers = 1, .eval_every = 10 });
	static const char *const pod[4] = { "job-ps-0", "job-worker-0", "job-worker-1", "job-worker-2" };
	const char *envs[] = { "KUBERNETES_SERVICE_HOST=10.0.0.1", SLOW, NULL };
	const char *args[] = { "run", "--config", cfg, NULL };
	for (int i = 0; i < 4; i++)
		snprintf(out[i], sizeof(out[i]), "%s/pod-%d.log", dir, i);
	for (int i = 0; i < 3; i++)
		pids[i] = spawn_pstrain_pod(args, out[i], envs, pod[i]);
	for (int t = 0; t < 100 && !slurp(out[0])[0]; t++)
		usleep(20000);
	int s0;
	if (waitpid(pids[0], &s0, WNOHANG) == pids[0] && WIFEXITED(s0) && WEXITSTATUS(s0) == SPAWN_NO_POD) {
		for (int i = 1; i < 3; i++)
			kill(pids[i], SIGKILL);
		cr_skip_test("%s", slurp(out[0]));
	}
	await_text(out[0], "workers 0, 1 train the 4 slices", out[1]);
	await_step(out[1], 40);
	pids[3] = spawn_pstrain_pod(args, out[3], envs, pod[3]);
	await_text(out[0], "workers 0, 1, 2 train the 4 slices", out[3]);
	cr_assert_not_null(strstr(slurp(out[3]), "job-worker-2"), "%s", slurp(out[3]));
	await_step(out[1], 120);
	cr_assert_eq(kill(pids[2], SIGTERM), 0);
	wait_children(pids, 4, st, RUN_TIMEOUT_S);
	assert_scheduler_chain(cfg, st, out, "pod names");
}

/* Each worker tells ps 0 what its arithmetic runs on (COMPUTE); in a sync
 * run ps 0 warns, once per worker, when one differs from the first
 * worker's: the run then cannot end on local's bits. Two workers on this
 * CPU's kernels: no warning; worker 1 on OpenBLAS's generic ones
 * (OPENBLAS_CORETYPE=Prescott, which pstrain respects and every x86-64
 * runs): one, naming both, and the run still trains to its end. */
Test(elastic, mixed_kernels_are_warned_about)
{
	for (int mixed = 0; mixed < 2; mixed++) {
		char out[3][300], tag[16], cfg[300];
		pid_t pids[3];
		int st[3];
		snprintf(tag, sizeof(tag), "mixed%d", mixed);
		snprintf(cfg, sizeof(cfg), "%s/%s.ini", dir, tag);
		write_cfg(cfg, (struct run_cfg){ .nps = 1, .nw = 2, .steps = 12, .ck = tag });
		for (int i = 0; i < 3; i++) {
			char idx[16];
			snprintf(idx, sizeof(idx), "%d", i ? 2 - i : 0);
			snprintf(out[i], 300, "%.200s/%s-%s%s.log", dir, tag, i ? "worker" : "ps", idx);
			const char *args[] = { i ? "worker" : "ps", "--index", idx, "--config", cfg, NULL };
			pids[i] = spawn_pstrain(args, out[i], mixed && i == 1 ? "OPENBLAS_CORETYPE=Prescott" : NULL);
		}
		wait_children(pids, 3, st, RUN_TIMEOUT_S);
		assert_exits_zero(st, out, 3, tag);
		/* Which worker ps 0 heard first is a race: either order. */
		const char *ps = slurp(out[0]), *warned = strstr(ps, "ps 0: warning: worker ");
		cr_assert_not_null(strstr(slurp(out[2]), "done: 12 steps"), "%s", slurp(out[2]));
		if (!mixed) {
			cr_assert_null(strstr(ps, "computes on"), "the same kernels warned about:\n%s", ps);
			continue;
		}
		cr_assert_not_null(warned, "%s", ps);
		char line[400];
		snprintf(line, sizeof(line), "%.*s", (int)strcspn(warned, "\n"), warned);
		cr_assert(strstr(line, "worker 0 ") && strstr(line, "worker 1 ") && strstr(line, " computes on cpu: OpenBLAS ") &&
				  strstr(line, " on cpu: OpenBLAS 0") && strstr(line, " Prescott"),
			  "%s", line);
		cr_assert_not_null(strstr(warned, "will not end bit for bit on local's parameters"), "%s", ps);
		cr_assert_null(strstr(warned + strlen(line), "computes on"), "warned twice:\n%s", ps);
	}
}
