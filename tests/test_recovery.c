/* Issue 6 item 5, the ps side and silent peers: a ps SIGKILLed mid-training
 * and restarted with the same command (the cluster rolls back to its
 * checkpoint everywhere), a ps or a worker that stops sending (SIGSTOP)
 * declared dead after peer_timeout, and heartbeats keeping connections
 * alive across a slow evaluation. 2 ps + 2 workers of the pstrain binary
 * ($PSTRAIN_BIN) on 127.0.0.1 with ports from free_port(), trained on
 * generated blobs. Every run is bounded: on timeout all its processes are
 * killed and the test fails. */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include "../net/key.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RUN_TIMEOUT_S 90
#define STEPS 2500

static char dir[256];

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
	test_dir_make(dir, sizeof(dir), "recovery");
}

static void teardown(void)
{
	test_dir_remove(dir);
	leak_check();
}

TestSuite(recovery, .init = setup, .fini = teardown, .timeout = 300);

/* A 2 ps + 2 worker config (write_cluster) in mode ("sync" or "async"),
 * evaluating every 100 steps unless train_extra says otherwise. */
static void write_config_mode(const char *cfg, int steps, const char *mode, const char *train_extra,
			      const char *cluster_extra)
{
	char extra[512];
	snprintf(extra, sizeof(extra), "mode = %s\n%s", mode, train_extra);
	write_cluster(dir, cfg, steps, 100, extra, cluster_extra);
}

static void write_config(const char *cfg, int steps, const char *train_extra, const char *cluster_extra)
{
	write_config_mode(cfg, steps, "sync", train_extra, cluster_extra);
}

/* Runs pstrain with args, output to outpath; env ("NAME=VALUE") may be NULL. */
/* Waits until the file at path, or the one at also (may be NULL),
 * contains text (up to 30 s). */
static int wait_for_either(const char *path, const char *also, const char *text)
{
	struct timespec nap = { 0, 2 * 1000 * 1000 };
	for (int i = 0; i < 15000; i++) {
		if (strstr(slurp(path), text) || (also && strstr(slurp(also), text)))
			return 1;
		nanosleep(&nap, NULL);
	}
	return 0;
}

/* The four processes of a cluster, in the order ps 0, ps 1, worker 1,
 * worker 0 (the chief, dumping its final parameters to dump if not NULL,
 * with env). out[i]: their logs, named after tag. */
static const char *ROLES[4][2] = { { "ps", "0" }, { "ps", "1" }, { "worker", "1" }, { "worker", "0" } };

static pid_t start_one(const char *cfg, int i, const char *dump, const char *env, const char *log)
{
	const char *args[] = { ROLES[i][0], "--index", ROLES[i][1], "--config", cfg,
			       i == 3 && dump ? "--dump-params" : NULL, dump, NULL };
	return spawn_pstrain(args, log, i == 3 ? env : NULL);
}

static void start_cluster(const char *cfg, const char *tag, const char *dump, const char *env,
			  pid_t *pids, char out[4][300])
{
	for (int i = 0; i < 4; i++) {
		snprintf(out[i], 300, "%s/%s-%s%s.log", dir, tag, ROLES[i][0], ROLES[i][1]);
		pids[i] = start_one(cfg, i, dump, env, out[i]);
	}
}

/* The undisturbed run of a config: final accuracy, parameters in dump. */
static double reference_mode(const char *mode, const char *train_extra, const char *cluster_extra,
			     const char *dump)
{
	char cfg[300], out[4][300];
	pid_t pids[4];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/ref.ini", dir);
	write_config_mode(cfg, STEPS, mode, train_extra, cluster_extra);
	start_cluster(cfg, "ref", dump, NULL, pids, out);
	wait_children(pids, 4, st, RUN_TIMEOUT_S);
	assert_exits_zero(st, out, 4, "undisturbed run");
	return final_accuracy(slurp(out[3]));
}

static double reference(const char *train_extra, const char *cluster_extra, const char *dump)
{
	return reference_mode("sync", train_extra, cluster_extra, dump);
}

/* The trials of killed_ps_rolls_back_everywhere with cluster_extra in
 * the config (after peer_timeout): the run's parameters against an
 * undisturbed one's with the same extra; with max_bytes > 0, the
 * parameters came in fewer bytes a value than that in each run. */
static void killed_ps_trials(const char *cluster_extra, int trials, double max_bytes)
{
	char dump_ref[300], dump[300], cfg[300], out[4][300], again[300], ck[64], cl[256];
	snprintf(cl, sizeof(cl), "peer_timeout = 10\n%s", cluster_extra);
	snprintf(dump_ref, sizeof(dump_ref), "%s/ref.bin", dir);
	double ref = reference("checkpoint_dir = ref-ck\ncheckpoint_every = 70\n", cl, dump_ref);
	unsigned char *a, *b;
	size_t na, nb;
	read_all(dump_ref, &a, &na);

	uint32_t seed = 61;
	for (int trial = 0, att = 0; trial < trials; trial++, att++) {
		seed = seed * 1103515245u + 12345u;
		int kill_at = 100 * (2 + (int)((seed >> 16) % 11));   /* 200..1200, a progress line */
		int k = trial % 2;
		char tag[32], train[128];
		snprintf(tag, sizeof(tag), "t%d", att);
		snprintf(ck, sizeof(ck), "t%d-ck", att);
		snprintf(train, sizeof(train), "checkpoint_dir = %s\ncheckpoint_every = 70\n", ck);
		snprintf(cfg, sizeof(cfg), "%s/t%d.ini", dir, att);
		snprintf(dump, sizeof(dump), "%s/t%d.bin", dir, att);
		write_config(cfg, STEPS, train, cl);
		pid_t pids[4];
		int st[4];
		start_cluster(cfg, tag, dump, NULL, pids, out);
		char mark[32];
		snprintf(mark, sizeof(mark), "step %d/%d", kill_at, STEPS);
		int seen = wait_for_text(out[3], mark), ws = 0;
		kill(pids[k], SIGKILL);
		waitpid(pids[k], &ws, 0);
		if (!seen) {
			for (int i = 0; i < 4; i++)
				kill(pids[i], SIGKILL);
			wait_children(pids, 4, st, RUN_TIMEOUT_S);
			cr_assert_fail("trial %d: the chief never reached %s:\n%s", trial, mark, slurp(out[3]));
		}
		if (WIFEXITED(ws)) {
			/* On a loaded machine this process may be scheduled only
			 * after the whole run has finished: nothing was killed, and
			 * the trial is run again (with its own directory). */
			wait_children(pids, 4, st, RUN_TIMEOUT_S);
			cr_assert_lt(att, 6, "the runs keep finishing before the kill (machine too busy?)");
			fprintf(stderr, "recovery: trial %d ended before the kill at step %d; again\n", trial, kill_at);
			trial--;
			continue;
		}
		struct timespec pause = { 0, 300 * 1000 * 1000 };
		nanosleep(&pause, NULL);
		snprintf(again, sizeof(again), "%s/t%d-ps%d-again.log", dir, att, k);
		pids[k] = start_one(cfg, k, NULL, NULL, again);
		wait_children(pids, 4, st, RUN_TIMEOUT_S);
		snprintf(out[k], 300, "%s", again);
		char what[64];
		snprintf(what, sizeof(what), "trial %d (ps %d killed at step %d)", trial, k, kill_at);
		assert_exits_zero(st, out, 4, what);
		char *chief = slurp(out[3]);
		char lost[32];
		snprintf(lost, sizeof(lost), "lost ps %d", k);
		/* A worker either saw the ps go (and sent ROLLBACK) or first
		 * heard of it from the other shard, answering its PULL with the
		 * rolled back version; at least one saw it go. */
		char *w1 = slurp(out[2]);
		cr_assert(strstr(chief, lost) || strstr(chief, "went back to step"), "trial %d: chief:\n%s",
			  trial, chief);
		cr_assert(strstr(w1, lost) || strstr(w1, "went back to step"), "trial %d: worker 1:\n%s", trial, w1);
		cr_assert(strstr(chief, lost) || strstr(w1, lost), "trial %d: nobody lost ps %d:\n%s\n%s", trial, k,
			  chief, w1);
		/* The restarted ps resumed from the newest complete checkpoint;
		 * the ps tasks write from a thread, so on a busy machine the
		 * killed one may not have finished any yet: then it starts at
		 * 0 and the other shard is rolled back to 0. */
		char *re = slurp(again), *other = slurp(out[1 - k]);
		cr_assert(strstr(re, "resuming from") || strstr(other, "to step 0,"),
			  "trial %d: restarted ps:\n%s\nps %d:\n%s", trial, re, 1 - k, other);
		char done[32];
		snprintf(done, sizeof(done), "done: %d steps", STEPS);
		cr_assert_not_null(strstr(chief, done), "%s", chief);
		const char *at = strstr(chief, "the parameters arrived in ");
		double per = 0;
		if (max_bytes > 0)
			cr_assert(at && sscanf(at, "the parameters arrived in %lf", &per) == 1 && per < max_bytes,
				  "trial %d: %.3f bytes a value, expected below %.2f:\n%s", trial, per, max_bytes, chief);
		double acc = final_accuracy(chief);
		cr_assert(fabs(acc - ref) <= 1.0, "trial %d: accuracy %.2f%% vs %.2f%% undisturbed", trial, acc,
			  ref);
		read_all(dump, &b, &nb);
		cr_assert_eq(na, nb);
		cr_expect_eq(memcmp(a, b, na), 0, "trial %d: the recovered run ends on other parameters", trial);
		free(b);
	}
	free(a);
}

/* Item 5, a killed ps: SIGKILL ps K (alternating) at a seeded random step,
 * restart it with the same command; it resumes from the newest complete
 * checkpoint, the chief rolls the other shard back to that step, and the
 * run finishes: every process exits 0, the accuracy is within 1 point of an
 * undisturbed run, and (sync sums in worker order, the data order and lr
 * are functions of the step) the final parameters are exactly the same. */
Test(recovery, killed_ps_rolls_back_everywhere, .timeout = 400)
{
	killed_ps_trials("", 3, 0);
}

/* The same over TCP with wire_pack = true: after the first pull each
 * PULL asks for XORs with the version the worker holds (net/xdelta.h),
 * and a killed ps, its restart from a checkpoint and the other shard's
 * rollback must leave no worker asking for them against values it does
 * not hold (it would stop on the check), ending on the same parameters. */
Test(recovery, killed_ps_with_xor_pulls_rolls_back_everywhere, .timeout = 300)
{
	killed_ps_trials("local_socket = false\nwire_pack = true\n", 2, 3.45);
}

/* Item 5 in async mode: the chief asks both ps to save under ps 0's
 * version (a label); SIGKILL ps K (alternating) at a seeded random step and
 * restart it: it resumes from the newest complete checkpoint, a worker
 * sees that shard go back and rolls the other one back to the same
 * checkpoint, the workers continue at that global step, and the run
 * finishes with every process exiting 0 and the accuracy within 1 point of
 * an undisturbed async run. */
Test(recovery, async_killed_ps_rolls_back_everywhere, .timeout = 300)
{
	char cfg[300], out[4][300], again[300];
	double ref = reference_mode("async", "checkpoint_dir = ref-ck\ncheckpoint_every = 130\n",
				    "peer_timeout = 10\n", NULL);
	uint32_t seed = 67;
	for (int trial = 0, att = 0; trial < 2; trial++, att++) {
		seed = seed * 1103515245u + 12345u;
		int kill_at = 100 * (3 + (int)((seed >> 16) % 10));   /* 300..1200, a progress line */
		int k = trial % 2;
		char tag[32], train[128];
		snprintf(tag, sizeof(tag), "a%d", att);
		/* 130: no checkpoint falls on a kill step (multiples of 100
		 * up to 1200), which would leave nothing to roll back. */
		snprintf(train, sizeof(train), "checkpoint_dir = a%d-ck\ncheckpoint_every = 130\n", att);
		snprintf(cfg, sizeof(cfg), "%s/a%d.ini", dir, att);
		write_config_mode(cfg, STEPS, "async", train, "peer_timeout = 10\n");
		pid_t pids[4];
		int st[4];
		start_cluster(cfg, tag, NULL, NULL, pids, out);
		/* Async workers do not wait for each other: the kill follows
		 * both, and a trial where either had already finished (and left:
		 * the known limit in README) is run again. */
		char mark[32];
		snprintf(mark, sizeof(mark), "step %d/%d", kill_at, STEPS);
		int seen = wait_for_text(out[3], mark) && wait_for_text(out[2], mark), ws = 0;
		kill(pids[k], SIGKILL);
		waitpid(pids[k], &ws, 0);
		/* A worker that connected after the other had trained past
		 * the mark starts where the shards are ("continuing at step
		 * 845", seen once in a full run on 2 CPUs) and never prints
		 * it: run the trial again, as one that finished early. */
		int late = strstr(slurp(out[3]), "where the shards are") || strstr(slurp(out[2]), "where the shards are");
		if (!seen && late && att < 4) {
			pid_t rest[3];
			for (int i = 0, j = 0; i < 4; i++)
				if (i != k)
					kill(rest[j++] = pids[i], SIGKILL);
			wait_children(rest, 3, st, RUN_TIMEOUT_S);
			fprintf(stderr, "recovery: async trial %d: a worker joined past step %d; again\n", trial, kill_at);
			trial--;
			continue;
		}
		if (!seen) {
			for (int i = 0; i < 4; i++)
				kill(pids[i], SIGKILL);
			wait_children(pids, 4, st, RUN_TIMEOUT_S);
			cr_assert_fail("trial %d: a worker never reached %s:\n%s\n%s", trial, mark, slurp(out[3]),
				       slurp(out[2]));
		}
		if (WIFEXITED(ws) || strstr(slurp(out[2]), "done: ") || strstr(slurp(out[3]), "done: ")) {
			pid_t rest[3];
			for (int i = 0, j = 0; i < 4; i++)
				if (i != k)
					kill(rest[j++] = pids[i], SIGKILL);
			wait_children(rest, 3, st, RUN_TIMEOUT_S);
			cr_assert_lt(att, 5, "the runs keep finishing before the kill (machine too busy?)");
			fprintf(stderr, "recovery: async trial %d ended before the kill at step %d; again\n", trial,
				kill_at);
			trial--;
			continue;
		}
		struct timespec pause = { 0, 300 * 1000 * 1000 };
		nanosleep(&pause, NULL);
		snprintf(again, sizeof(again), "%s/a%d-ps%d-again.log", dir, att, k);
		pids[k] = start_one(cfg, k, NULL, NULL, again);
		wait_children(pids, 4, st, RUN_TIMEOUT_S);
		snprintf(out[k], 300, "%s", again);
		char what[64];
		snprintf(what, sizeof(what), "trial %d (ps %d killed at step %d)", trial, k, kill_at);
		assert_exits_zero(st, out, 4, what);
		char *chief = slurp(out[3]), *w1 = slurp(out[2]);
		/* The restarted ps resumed from the newest complete checkpoint
		 * (on a very slow disk there may be none yet: then it starts
		 * at 0), and the shard that was not killed went back to the
		 * same step. */
		char *other = slurp(out[1 - k]), *re = slurp(again);
		cr_assert(strstr(re, "resuming from") || strstr(other, "to step 0,"),
			  "trial %d: restarted ps:\n%s\nps %d:\n%s", trial, re, 1 - k, other);
		cr_assert_not_null(strstr(other, "rolled back from version"), "trial %d: ps %d:\n%s", trial, 1 - k,
				   other);
		/* The first worker to see the restarted shard behind what it
		 * had sent ROLLBACK; the other may find the shards already
		 * rolled back, or (when the first has pushed past its old
		 * versions by then) carry on at its own step. */
		cr_assert(strstr(chief, "rolling every shard back") || strstr(w1, "rolling every shard back"),
			  "trial %d: no worker rolled back:\n%s\n%s", trial, chief, w1);
		char done[32];
		snprintf(done, sizeof(done), "done: %d steps", STEPS);
		cr_assert_not_null(strstr(chief, done), "%s", chief);
		double acc = final_accuracy(chief);
		cr_assert(fabs(acc - ref) <= 1.0, "trial %d: accuracy %.2f%% vs %.2f%% undisturbed", trial, acc,
			  ref);
	}
}

/* Item 5, a silent ps: SIGSTOP ps 1 (its connections stay open); a worker
 * declares it dead after peer_timeout (2 s) and retries (the other may be
 * waiting on ps 0 for that worker's gradient, hearing its heartbeats);
 * continued, ps 1 is reconnected to and the run finishes. */
Test(recovery, stopped_ps_is_declared_dead_and_rejoins, .timeout = 200)
{
	char cfg[300], out[4][300];
	double ref = reference("checkpoint_dir =\n", "peer_timeout = 2\n", NULL);
	snprintf(cfg, sizeof(cfg), "%s/stop.ini", dir);
	write_config(cfg, STEPS, "checkpoint_dir =\n", "peer_timeout = 2\n");
	pid_t pids[4];
	int st[4];
	start_cluster(cfg, "stop", NULL, NULL, pids, out);
	char mark[32];
	snprintf(mark, sizeof(mark), "step 300/%d", STEPS);
	int seen = wait_for_text(out[3], mark);
	kill(pids[1], SIGSTOP);
	int dead = seen && wait_for_either(out[3], out[2], "no traffic for 2 s");
	kill(pids[1], SIGCONT);
	wait_children(pids, 4, st, RUN_TIMEOUT_S);
	cr_assert(seen, "the chief never reached step 300:\n%s", slurp(out[3]));
	cr_assert(dead, "no worker declared the stopped ps dead:\n%s\n%s", slurp(out[3]), slurp(out[2]));
	assert_exits_zero(st, out, 4, "stopped ps");
	char *chief = slurp(out[3]);
	cr_assert(strstr(chief, "lost ps 1 (127.0.0.1:") || strstr(slurp(out[2]), "lost ps 1 (127.0.0.1:"),
		  "%s\n%s", chief, slurp(out[2]));
	char done[32];
	snprintf(done, sizeof(done), "done: %d steps", STEPS);
	cr_assert_not_null(strstr(chief, done), "%s", chief);
	double acc = final_accuracy(chief);
	cr_assert(fabs(acc - ref) <= 1.0, "accuracy %.2f%% vs %.2f%% undisturbed", acc, ref);
}

/* A ps that stays silent: the workers give up after peer_timeout of
 * retrying, with a message naming it, and exit 3. */
Test(recovery, stopped_ps_that_never_returns_is_named, .timeout = 120)
{
	char cfg[300], out[4][300];
	snprintf(cfg, sizeof(cfg), "%s/gone.ini", dir);
	write_config(cfg, 100000, "checkpoint_dir =\n", "peer_timeout = 1\n");
	pid_t pids[4];
	int st[4];
	start_cluster(cfg, "gone", NULL, NULL, pids, out);
	int seen = wait_for_text(out[3], "step 300/100000");
	kill(pids[1], SIGSTOP);
	wait_children(pids + 2, 2, st + 2, RUN_TIMEOUT_S);
	kill(pids[1], SIGKILL);
	kill(pids[0], SIGKILL);
	wait_children(pids, 2, st, RUN_TIMEOUT_S);
	cr_assert(seen, "%s", slurp(out[3]));
	/* Worker 1 may instead hear from ps 0 that it stops, having lost the
	 * chief: also exit 3. */
	for (int i = 2; i < 4; i++)
		cr_assert_eq(st[i], 3, "worker %s exit %d:\n%s", ROLES[i][1], st[i], slurp(out[i]));
	/* The worker that gives up first names ps 1; the other may instead
	 * hear from ps 0 that it stops, having lost that worker. */
	int named = strstr(slurp(out[3]), "gave up on ps 1 (127.0.0.1:") ||
		    strstr(slurp(out[2]), "gave up on ps 1 (127.0.0.1:");
	cr_assert(named, "no worker named ps 1:\n%s\n%s", slurp(out[2]), slurp(out[3]));
}

/* A worker told to stop (SIGTERM, Ctrl-C) while it reconnects to a lost
 * ps exits 130 at once, saying so, not after peer_timeout (60 s here):
 * the connect retries used to ignore the stop. Both ps are killed, so
 * both workers are reconnecting when the signal comes. */
Test(recovery, interrupted_while_reconnecting_exits_at_once, .timeout = 120)
{
	char cfg[300], out[4][300];
	snprintf(cfg, sizeof(cfg), "%s/term.ini", dir);
	write_config(cfg, 100000, "checkpoint_dir =\n", "peer_timeout = 60\n");
	pid_t pids[4];
	int st[4];
	start_cluster(cfg, "term", NULL, NULL, pids, out);
	int seen = wait_for_text(out[3], "step 200/100000");
	kill(pids[0], SIGKILL);
	kill(pids[1], SIGKILL);
	wait_children(pids, 2, st, RUN_TIMEOUT_S);
	int both = wait_for_text(out[3], "reconnecting for up to 60 s") &&
		   wait_for_text(out[2], "reconnecting for up to 60 s");
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	kill(pids[2], SIGTERM);
	kill(pids[3], SIGTERM);
	wait_children(pids + 2, 2, st + 2, RUN_TIMEOUT_S);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
	cr_assert(seen && both, "no step 200, or no reconnecting:\n%s\n%s", slurp(out[3]), slurp(out[2]));
	for (int i = 2; i < 4; i++) {
		cr_assert_eq(st[i], 130, "worker %s exit %d:\n%s", ROLES[i][1], st[i], slurp(out[i]));
		cr_assert_not_null(strstr(slurp(out[i]), "interrupted while reconnecting"), "%s", slurp(out[i]));
	}
	/* 60 s of peer_timeout against a prompt exit: any bound far from both. */
	cr_assert_lt(took, 10.0, "the workers took %.1f s to stop", took);
}

/* Item 5, a silent worker: SIGSTOP worker 1 (sync, both gradients needed);
 * each ps declares it dead after peer_timeout, the chief's progress says
 * the shards wait for worker 1; continued, it reconnects and the run
 * finishes. */
Test(recovery, stopped_worker_is_declared_dead_and_rejoins, .timeout = 200)
{
	char cfg[300], out[4][300];
	double ref = reference("checkpoint_dir =\n", "peer_timeout = 2\n", NULL);
	snprintf(cfg, sizeof(cfg), "%s/wstop.ini", dir);
	write_config(cfg, STEPS, "checkpoint_dir =\n", "peer_timeout = 2\n");
	pid_t pids[4];
	int st[4];
	start_cluster(cfg, "wstop", NULL, NULL, pids, out);
	char mark[32];
	snprintf(mark, sizeof(mark), "step 300/%d", STEPS);
	int seen = wait_for_text(out[3], mark);
	kill(pids[2], SIGSTOP);
	int dead = seen && wait_for_either(out[0], out[1], "closed worker 1's connection: no traffic for 2 s");
	kill(pids[2], SIGCONT);
	wait_children(pids, 4, st, RUN_TIMEOUT_S);
	cr_assert(seen, "the chief never reached step 300:\n%s", slurp(out[3]));
	cr_assert(dead, "no ps declared the stopped worker dead:\n%s\n%s", slurp(out[0]), slurp(out[1]));
	assert_exits_zero(st, out, 4, "stopped worker");
	char *chief = slurp(out[3]);
	cr_assert_not_null(strstr(chief, "is waiting for worker 1 "), "%s", chief);
	double acc = final_accuracy(chief);
	cr_assert(fabs(acc - ref) <= 1.0, "accuracy %.2f%% vs %.2f%% undisturbed", acc, ref);
}

/* Heartbeats: with peer_timeout = 1 s, a chief whose every evaluation takes
 * 2.5 s (test hook PSTRAIN_EVAL_DELAY_MS) leaves worker 1 waiting on its
 * PULL and its own links idle for longer than that; nobody is declared
 * dead and the run finishes. */
Test(recovery, heartbeats_outlast_a_slow_evaluation, .timeout = 120)
{
	char cfg[300], out[4][300];
	snprintf(cfg, sizeof(cfg), "%s/slow.ini", dir);
	write_config(cfg, 300, "checkpoint_dir =\n", "peer_timeout = 1\n");
	pid_t pids[4];
	int st[4];
	start_cluster(cfg, "slow", NULL, "PSTRAIN_EVAL_DELAY_MS=2500", pids, out);
	wait_children(pids, 4, st, RUN_TIMEOUT_S);
	assert_exits_zero(st, out, 4, "slow evaluation");
	cr_assert_not_null(strstr(slurp(out[3]), "done: 300 steps"), "%s", slurp(out[3]));
	for (int i = 0; i < 4; i++) {
		char *log = slurp(out[i]);
		cr_assert_null(strstr(log, "no traffic"), "%s %s:\n%s", ROLES[i][0], ROLES[i][1], log);
		cr_assert_null(strstr(log, "lost"), "%s %s:\n%s", ROLES[i][0], ROLES[i][1], log);
	}
}

/* Issue 6, a slow disk: every ps save takes 2.5 s (test hook
 * PSTRAIN_CKPT_DELAY_MS) with peer_timeout = 1 s and a checkpoint asked for
 * every 50 steps. The ps copies its shard under its lock and writes it from
 * a writer thread, so pushes, pulls and heartbeats go on meanwhile: nobody
 * is declared dead, the run finishes, and the final checkpoint is
 * complete. */
Test(recovery, slow_checkpoint_write_stalls_nobody, .timeout = 120)
{
	char cfg[300], out[4][300], path[400];
	snprintf(cfg, sizeof(cfg), "%s/slowck.ini", dir);
	write_config(cfg, 300, "checkpoint_dir = slow-ck\ncheckpoint_every = 50\n", "peer_timeout = 1\n");
	pid_t pids[4];
	int st[4];
	cr_assert_eq(setenv("PSTRAIN_CKPT_DELAY_MS", "2500", 1), 0);
	start_cluster(cfg, "slowck", NULL, NULL, pids, out);
	unsetenv("PSTRAIN_CKPT_DELAY_MS");
	wait_children(pids, 4, st, RUN_TIMEOUT_S);
	assert_exits_zero(st, out, 4, "slow checkpoint writes");
	cr_assert_not_null(strstr(slurp(out[3]), "done: 300 steps"), "%s", slurp(out[3]));
	for (int i = 0; i < 4; i++) {
		char *log = slurp(out[i]);
		cr_assert_null(strstr(log, "no traffic"), "%s %s:\n%s", ROLES[i][0], ROLES[i][1], log);
		cr_assert_null(strstr(log, "lost"), "%s %s:\n%s", ROLES[i][0], ROLES[i][1], log);
	}
	for (int k = 0; k < 2; k++) {
		snprintf(path, sizeof(path), "%s/slow-ck/step-00000300/manifest-%d-of-2", dir, k);
		cr_assert_eq(access(path, F_OK), 0, "no final checkpoint from ps %d:\n%s", k, slurp(out[k]));
	}
}

/* A ps stopped (SIGSTOP) while a worker pushes a large model: each push
 * (67 MB, one 16.8M-parameter shard) is larger than what the loopback
 * socket buffers hold (up to 4 MB sent + 32 MB received by default), so the
 * worker is blocked writing, not reading, when the ps stops reading. The write deadline follows peer_timeout (2 s), so the worker
 * reports the ps within a few seconds (with a fixed 60 s write deadline it
 * took a minute). */
Test(recovery, stopped_ps_is_found_while_pushing, .timeout = 120)
{
	char cfg[300], out[2][300], path[300], err[KEY_ERR_MAX];
	snprintf(path, sizeof(path), "%s/blobs.csv", dir);
	write_blobs(path, 600, 3, 6, 3);
	snprintf(path, sizeof(path), "%s/cluster.key", dir);
	cr_assert_eq(key_generate(path, err, sizeof(err)), 0, "%s", err);
	snprintf(cfg, sizeof(cfg), "%s/big.ini", dir);
	FILE *f = fopen(cfg, "w");
	cr_assert_not_null(f);
	fprintf(f, "[cluster]\nps = 127.0.0.1:%d\nworkers = 127.0.0.1:%d\nkey_file = cluster.key\n"
		   "peer_timeout = 2\n"
		   "[data]\nformat = csv\ntrain_csv = blobs.csv\nlabel_column = first\n"
		   "[train]\nsteps = 100000\nbatch_size = 4\nlearning_rate = 0.01\neval_every = 100000\n"
		   "threads = 1\nmode = sync\ncheckpoint_dir =\n"
		   "[model]\ninput = 6\nlayer = dense 4096\nlayer = relu\nlayer = dense 4096\nlayer = relu\n"
		   "layer = dense 3\n",
		free_port(), free_port());
	cr_assert_eq(fclose(f), 0);
	snprintf(out[0], 300, "%s/big-ps0.log", dir);
	snprintf(out[1], 300, "%s/big-worker0.log", dir);
	const char *pa[] = { "ps", "--index", "0", "--config", cfg, NULL };
	const char *wa[] = { "worker", "--index", "0", "--config", cfg, NULL };
	pid_t pids[2] = { spawn_pstrain(pa, out[0], NULL), spawn_pstrain(wa, out[1], NULL) };
	int st[2];
	int up = wait_for_text(out[1], "connected to 1 ps");
	struct timespec train = { 2, 0 };   /* a few steps: pushes under way */
	nanosleep(&train, NULL);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	kill(pids[0], SIGSTOP);
	int lost = up && wait_for_text(out[1], "lost ps 0 (127.0.0.1:");
	clock_gettime(CLOCK_MONOTONIC, &t1);
	kill(pids[0], SIGKILL);
	kill(pids[0], SIGCONT);
	kill(pids[1], SIGKILL);
	wait_children(pids, 2, st, RUN_TIMEOUT_S);
	cr_assert(up, "the worker never connected:\n%s\n%s", slurp(out[1]), slurp(out[0]));
	double s = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	fprintf(stderr, "recovery/stopped_ps_is_found_while_pushing: reported %.2f s after SIGSTOP (peer_timeout 2 s)\n", s);
	cr_assert(lost, "the worker did not report the stopped ps within 30 s:\n%s", slurp(out[1]));
	cr_assert_lt(s, 10.0, "the stopped ps was reported after %.1f s (peer_timeout 2 s):\n%s", s,
		     slurp(out[1]));
	cr_assert_not_null(strstr(slurp(out[1]), "no traffic for 2 s (peer_timeout)"), "%s", slurp(out[1]));
}

/* Item 5, README's former known limit: a ps killed after worker 1 has
 * trained its last step. The chief evaluates once, at step 2499, slowly
 * (PSTRAIN_EVAL_DELAY_MS), so worker 1 finishes, says DONE and waits for the
 * run to complete while the chief is still at that step; ps K (alternating)
 * is killed then and restarted. Worker 1 sees the shard go back, rolls every
 * shard back to the newest complete checkpoint (2450) and trains those
 * steps again with the chief: every process exits 0 and the run ends on
 * exactly the parameters of an undisturbed one. */
Test(recovery, ps_killed_after_a_worker_finished, .timeout = 300)
{
	char dump_ref[300], dump[300], cfg[300], out[4][300], again[300];
	const char *train_ref = "checkpoint_dir = fin-ref-ck\ncheckpoint_every = 70\neval_every = 2499\n";
	snprintf(dump_ref, sizeof(dump_ref), "%s/fin-ref.bin", dir);
	double ref = reference(train_ref, "peer_timeout = 10\n", dump_ref);
	unsigned char *a, *b;
	size_t na, nb;
	read_all(dump_ref, &a, &na);
	for (int k = 0; k < 2; k++) {
		char tag[32], train[160];
		snprintf(tag, sizeof(tag), "fin%d", k);
		snprintf(train, sizeof(train), "checkpoint_dir = fin%d-ck\ncheckpoint_every = 70\neval_every = 2499\n", k);
		snprintf(cfg, sizeof(cfg), "%s/fin%d.ini", dir, k);
		snprintf(dump, sizeof(dump), "%s/fin%d.bin", dir, k);
		write_config(cfg, STEPS, train, "peer_timeout = 10\n");
		pid_t pids[4];
		int st[4], ws = 0;
		start_cluster(cfg, tag, dump, "PSTRAIN_EVAL_DELAY_MS=4000", pids, out);
		char mark[32];
		snprintf(mark, sizeof(mark), "step %d/%d", STEPS, STEPS);
		int seen = wait_for_text(out[2], mark);
		kill(pids[k], SIGKILL);
		waitpid(pids[k], &ws, 0);
		int chief_done = strstr(slurp(out[3]), "done: ") != NULL;
		struct timespec pause = { 0, 300 * 1000 * 1000 };
		nanosleep(&pause, NULL);
		snprintf(again, sizeof(again), "%s/fin%d-ps%d-again.log", dir, k, k);
		pids[k] = start_one(cfg, k, NULL, NULL, again);
		wait_children(pids, 4, st, RUN_TIMEOUT_S);
		cr_assert(seen, "worker 1 never finished:\n%s", slurp(out[2]));
		cr_assert(!chief_done, "the chief had finished too: the kill came too late:\n%s", slurp(out[3]));
		snprintf(out[k], 300, "%s", again);
		char what[32];
		snprintf(what, sizeof(what), "ps %d killed", k);
		assert_exits_zero(st, out, 4, what);
		char *w1 = slurp(out[2]), *chief = slurp(out[3]);
		cr_assert_not_null(strstr(slurp(again), "resuming from"), "%s", slurp(again));
		/* to the newest complete checkpoint: 2450, or an older one if
		 * a busy disk made the ps skip some (logged) */
		cr_assert(strstr(w1, "rolling every shard back to step") ||
			  strstr(chief, "rolling every shard back to step"), "nobody rolled back:\n%s\n%s", w1,
			  chief);
		/* worker 1 trained the last 50 steps again and finished twice */
		const char *first = strstr(w1, mark);
		cr_assert(first && strstr(first + 1, mark), "worker 1 did not finish again:\n%s", w1);
		double acc = final_accuracy(chief);
		cr_assert(fabs(acc - ref) <= 1.0, "accuracy %.2f%% vs %.2f%% undisturbed", acc, ref);
		read_all(dump, &b, &nb);
		cr_assert_eq(na, nb);
		cr_expect_eq(memcmp(a, b, na), 0, "ps %d killed: the recovered run ends on other parameters", k);
		free(b);
	}
	free(a);
}

/* Item 5, async: a ps killed after worker 1 has finished, while worker 1 is
 * slow to notice (SIGSTOPped, less than peer_timeout). The chief, evaluating
 * slowly at step 2499, reconnects first, rolls back, finishes and exits.
 * ps 0 must not end with it: worker 1 said DONE but never saw the run
 * complete. Continued, worker 1 loses ps 1, reconnects to both (the old ps
 * 0 could have stopped accepting: worker 1 exited 3 and the restarted ps 1
 * waited for it until killed), trains again if the shards went back below
 * what it had pulled or else says DONE again, and leaves. */
Test(recovery, async_ps_killed_after_a_worker_finished, .timeout = 300)
{
	char cfg[300], out[4][300], again[300];
	const char *train = "checkpoint_dir = afin-ck\ncheckpoint_every = 70\neval_every = 2499\n";
	double ref = reference_mode("async", "checkpoint_dir = afin-ref-ck\ncheckpoint_every = 70\neval_every = 2499\n",
				    "peer_timeout = 20\n", NULL);
	snprintf(cfg, sizeof(cfg), "%s/afin.ini", dir);
	write_config_mode(cfg, STEPS, "async", train, "peer_timeout = 20\n");
	pid_t pids[4];
	int st[4], ws = 0;
	start_cluster(cfg, "afin", NULL, "PSTRAIN_EVAL_DELAY_MS=4000", pids, out);
	char mark[32];
	snprintf(mark, sizeof(mark), "step %d/%d", STEPS, STEPS);
	int seen = wait_for_text(out[2], mark);
	kill(pids[2], SIGSTOP);
	kill(pids[1], SIGKILL);
	waitpid(pids[1], &ws, 0);
	int chief_early = strstr(slurp(out[3]), "done: ") != NULL;
	struct timespec pause = { 0, 300 * 1000 * 1000 };
	nanosleep(&pause, NULL);
	snprintf(again, sizeof(again), "%s/afin-ps1-again.log", dir);
	pids[1] = start_one(cfg, 1, NULL, NULL, again);
	/* The chief has exited and ps 0 has had its DONE for 300 ms (the
	 * old ps 0 stopped accepting within 200 ms) before worker 1 goes on. */
	int chief_done = wait_for_text(out[3], "done: ");
	wait_children(pids + 3, 1, st + 3, RUN_TIMEOUT_S);
	nanosleep(&pause, NULL);
	kill(pids[2], SIGCONT);
	wait_children(pids, 3, st, RUN_TIMEOUT_S);
	snprintf(out[1], 300, "%s", again);
	cr_assert(seen, "worker 1 never finished:\n%s", slurp(out[2]));
	cr_assert(!chief_early, "the chief had finished too: the kill came too late:\n%s", slurp(out[3]));
	cr_assert(chief_done, "the chief did not finish while worker 1 was stopped:\n%s", slurp(out[3]));
	assert_exits_zero(st, out, 4, "");
	cr_assert_not_null(strstr(slurp(out[2]), "reconnected to every ps"), "%s", slurp(out[2]));
	double acc = final_accuracy(slurp(out[3]));
	cr_assert(fabs(acc - ref) <= 1.0, "accuracy %.2f%% vs %.2f%% undisturbed", acc, ref);
}

/* A ps lost in the middle of an exchange ends the exchange with the other
 * shards at once (links_exchange shuts them down). The chief evaluates
 * slowly (4 s) at step 100, so worker 1, its step-100 exchange done but for
 * the parameters, waits on both shards, which wait for the chief; then ps
 * 0 is killed. Worker 1 must say it lost ps 0 at once, not when the
 * chief's push lets ps 1 answer (3 s later). Found by tests/net's cut
 * test, where the chief noticed a cut ps 6 s late. */
Test(recovery, lost_ps_ends_the_exchange_with_every_shard)
{
	char cfg[300], out[4][300];
	pid_t pids[4];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/xchg.ini", dir);
	write_config(cfg, STEPS, "checkpoint_dir = \neval_every = 100\n", "peer_timeout = 10\n");
	start_cluster(cfg, "xchg", NULL, "PSTRAIN_EVAL_DELAY_MS=4000", pids, out);
	cr_assert(wait_for_text(out[2], "worker 1: step 100/"), "%s", slurp(out[2]));
	/* worker 1 computes step 100 and waits on both shards */
	struct timespec pause = { 1, 0 };
	nanosleep(&pause, NULL);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	kill(pids[0], SIGKILL);
	int said = wait_for_text(out[2], "worker 1: lost ps 0");
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
	for (int i = 0; i < 4; i++)
		kill(pids[i], SIGKILL);
	wait_children(pids, 4, st, 20);
	cr_assert(said, "worker 1 never said it lost ps 0:\n%s", slurp(out[2]));
	cr_assert_lt(s, 1.5, "worker 1 said it lost ps 0 %.1f s after the kill:\n%s", s, slurp(out[2]));
}
