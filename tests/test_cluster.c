/* The ps and worker roles end to end: 2 ps + 2 workers of the pstrain
 * binary ($PSTRAIN_BIN) on 127.0.0.1 with ports the test picks, trained on
 * generated blobs; plus sync equivalence with a local run of batch 2·B,
 * bf16 on the wire against fp32, and a worker holding the wrong key being
 * refused. Every run is bounded in
 * time: on timeout all processes are killed and the test fails. */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include "../core/nn/backend.h"
#include "../core/config/config.h"
#include "../core/data/data.h"
#include "../core/nn/model.h"
#include "../core/nn/optim.h"
#include "../core/nn/replica.h"
#include "../core/nn/rng.h"
#include "../cluster/role.h"
#include "../net/frame.h"
#include "../net/key.h"
#include "../net/wire.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RUN_TIMEOUT_S 60

static char dir[256];

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
	test_dir_make(dir, sizeof(dir), "cluster");
}

static void teardown(void)
{
	test_dir_remove(dir);
	leak_check();
}

TestSuite(cluster, .init = setup, .fini = teardown, .timeout = 120);

/* blobs.csv, cluster.key and cluster.ini (2 ps + 2 workers) in dir. */
/* Starts ps 0, ps 1, worker 1, worker 0 (chief, with --dump-params dump if
 * not NULL) and waits; with workers_first, the workers start half a second
 * before the ps tasks. out[i]: the logs in that order. */
static void run_cluster_order(const char *cfg, const char *dump, int workers_first, int *st,
			      char out[4][300])
{
	const char *roles[4][2] = { { "ps", "0" }, { "ps", "1" }, { "worker", "1" }, { "worker", "0" } };
	pid_t pids[4];
	for (int j = 0; j < 4; j++) {
		int i = workers_first ? 3 - j : j;
		if (workers_first && j == 2) {
			struct timespec half = { 0, 500 * 1000 * 1000 };
			nanosleep(&half, NULL);
		}
		snprintf(out[i], 300, "%s/%s%s.log", dir, roles[i][0], roles[i][1]);
		const char *args[] = { roles[i][0], "--index", roles[i][1], "--config", cfg,
				       i == 3 && dump ? "--dump-params" : NULL, dump, NULL };
		pids[i] = spawn_pstrain(args, out[i], NULL);
	}
	wait_children(pids, 4, st, RUN_TIMEOUT_S);
}

static void run_cluster(const char *cfg, const char *dump, int *st, char out[4][300])
{
	run_cluster_order(cfg, dump, 0, st, out);
}

/* Neither worker (out[2], out[3]) recovered: in a run where nothing
 * fails, a recovery hides a bug behind a run that still ends well. */
static void assert_no_recovery(char out[4][300])
{
	for (int i = 2; i < 4; i++) {
		char *text = slurp(out[i]);
		cr_assert(!strstr(text, "reconnecting for up to") && !strstr(text, "rolling every shard back"),
			  "a worker recovered in a run without failures:\n%s", text);
	}
}

Test(cluster, sync_two_ps_two_workers)
{
	char cfg[300], out[4][300];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 150, 10, "mode = sync\n", "");
	run_cluster(cfg, NULL, st, out);
	assert_exits_zero(st, out, 4, "");
	char *chief = slurp(out[3]);
	cr_assert_not_null(strstr(chief, "done: 150 steps"), "chief:\n%s", chief);
	assert_no_recovery(out);
	double acc = final_accuracy(chief);
	cr_assert_gt(acc, 95.0, "final accuracy %.2f%%:\n%s", acc, chief);
	cr_assert_not_null(strstr(slurp(out[0]), "all 2 workers done: version 150"), "%s",
			   slurp(out[0]));
	/* Each role says first which GEMM kernels it runs and why. */
	for (int i = 0; i < 4; i++)
		cr_expect(strncmp(slurp(out[i]), "pstrain: BLAS: OpenBLAS ", 24) == 0, "%s:\n%s", out[i],
			  slurp(out[i]));
}

/* The parameters a sync run (with a 6-32768-3 MLP: 10 pieces a shard)
 * ends with, with the [cluster] lines extra; name tells its files apart;
 * out: the processes' output files. */
/* How many of n floats differ from their twin in bits. */
static size_t floats_differ(const float *a, const float *b, size_t n)
{
	size_t d = 0;
	for (size_t i = 0; i < n; i++)
		d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
	return d;
}

static float *params_run(const char *name, const char *extra, size_t P, char out[4][300])
{
	char cfg[300], dump[300];
	int st[4];
	/* A config of its own: its checkpoints go beside it, apart. */
	snprintf(cfg, sizeof(cfg), "%s/%s.ini", dir, name);
	snprintf(dump, sizeof(dump), "%s/params-%s.bin", dir, name);
	write_cluster(dir, cfg, 25, 10, "mode = sync\n", extra);
	char *text = slurp(cfg), *at = strstr(text, "layer = dense 16\n");
	cr_assert_not_null(at);
	FILE *f = fopen(cfg, "w");
	cr_assert_not_null(f);
	fprintf(f, "%.*slayer = dense 32768\n%s", (int)(at - text), text, at + strlen("layer = dense 16\n"));
	cr_assert_eq(fclose(f), 0);
	run_cluster(cfg, dump, st, out);
	assert_exits_zero(st, out, 4, "");
	assert_no_recovery(out);
	float *got = malloc(P * sizeof(float));
	cr_assert_not_null(got);
	f = fopen(dump, "rb");
	cr_assert_not_null(f, "no parameter dump; chief:\n%s", slurp(out[3]));
	cr_assert_eq(fread(got, sizeof(float), P, f), P);
	cr_assert_eq(fgetc(f), EOF);
	fclose(f);
	return got;
}

/* How many steps a worker's last line says ran their forward pass while
 * their parameters arrived (-1: no such line). */
static int preforwarded(const char *text)
{
	const char *at = strstr(text, " of them computing forward while their parameters arrived");
	if (!at)
		return -1;
	while (at > text && at[-1] >= '0' && at[-1] <= '9')
		at--;
	return atoi(at);
}

/* [cluster] overlap: each worker pushes the pieces of its gradient as
 * backward makes them (in runs, at offsets into each shard) while it
 * still computes the rest, and says so; the run ends with the very
 * parameters of one that pushes whole gradients. Over TCP every shard
 * is a stream pushed early; over the Unix sockets both shards are left
 * to the end of the backward pass (gradflow_later) and pushed whole. */
Test(cluster, overlap_pushes_while_computing_and_changes_no_number)
{
	char out[4][300], extra[400];
	size_t P = 6 * 32768 + 32768 + 32768 * 3 + 3;
	float *whole = params_run("overlap-false", "overlap = false\nlocal_socket = false\n", P, out);
	for (int i = 2; i < 4; i++)
		cr_assert_null(strstr(slurp(out[i]), "as backward makes them"), "%s", slurp(out[i]));
	float *flow = params_run("overlap-true", "overlap = true\nlocal_socket = false\n", P, out);
	/* ... and starts most steps' forward pass while their parameters
	 * still arrive (not the first, the last, or one after an evaluation) */
	for (int i = 2; i < 4; i++) {
		char *text = slurp(out[i]);
		cr_assert_not_null(strstr(text, "as backward makes them"), "%s", text);
		cr_assert_geq(preforwarded(text), 10, "%s", text);
		/* and at the end what the flow did (devices_flow_say) */
		cr_assert_not_null(strstr(text, "overlap: cpu:0: "), "%s", text);
		cr_assert_not_null(strstr(text, "forward passes took their parameters as they arrived"), "%s", text);
	}
	snprintf(extra, sizeof(extra), "overlap = true\nlocal_socket = true\nsocket_dir = %s/sockets-ov\n", dir);
	float *later = params_run("overlap-unix", extra, P, out);
	for (int i = 2; i < 4; i++)
		cr_assert_not_null(strstr(slurp(out[i]), "2 on this host, over a Unix socket"), "%s", slurp(out[i]));
	/* auto, the default, starts pushing after computing and says how it
	 * decides; whichever way its steps go, the numbers are the same */
	float *autof = params_run("overlap-auto", "local_socket = false\n", P, out);
	for (int i = 2; i < 4; i++)
		cr_assert_not_null(strstr(slurp(out[i]), "overlap = auto: pushes each gradient after computing it until"),
				   "%s", slurp(out[i]));
	size_t differ = floats_differ(whole, flow, P), differ_later = floats_differ(whole, later, P),
	       differ_auto = floats_differ(whole, autof, P);
	cr_assert_eq(differ, 0, "%zu of %zu parameters differ", differ, P);
	cr_assert_eq(differ_auto, 0, "overlap = auto: %zu of %zu parameters differ", differ_auto, P);
	free(autof);
	cr_assert_eq(differ_later, 0, "over Unix sockets: %zu of %zu parameters differ", differ_later, P);
	free(whole);
	free(flow);
	free(later);
}

/* [cluster] local_socket: every ps and worker of these tests is at
 * 127.0.0.1, so each worker reaches both ps over their Unix sockets, and
 * says so, as the ps do; the frames there are not encrypted and go
 * through rings in shared memory (local_ring), or, with local_ring off,
 * through the sockets, and either run ends with the very parameters of
 * one over TCP with every frame sealed.
 * Over TCP each worker names the cipher: the best this CPU runs by
 * default, the one [cluster] cipher names otherwise, with the same
 * parameters at the end. */
Test(cluster, local_socket_on_one_host_changes_no_number)
{
	char out[4][300], want[160];
	size_t P = 6 * 32768 + 32768 + 32768 * 3 + 3;
	float *tcp = params_run("local-false", "local_socket = false\n", P, out);
	snprintf(want, sizeof(want), "connected to 2 ps (%s);",
		 frame_cipher_name(frame_cipher_choose(frame_offers(), frame_offers())));
	for (int i = 0; i < 4; i++) {
		char *text = slurp(out[i]);
		cr_assert_null(strstr(text, "Unix socket"), "%s", text);
		if (i >= 2)
			cr_assert_not_null(strstr(text, want), "no \"%s\" in:\n%s", want, text);
	}
	const char *other = frame_aes_available() ? "aes-256-gcm" : "chacha20-poly1305";
	char extra0[200];
	snprintf(extra0, sizeof(extra0), "local_socket = false\ncipher = %s\n", other);
	float *named = params_run("local-named", extra0, P, out);
	snprintf(want, sizeof(want), "connected to 2 ps (%s);", other);
	for (int i = 2; i < 4; i++)
		cr_assert_not_null(strstr(slurp(out[i]), want), "no \"%s\" in:\n%s", want, slurp(out[i]));
	size_t differ_named = floats_differ(tcp, named, P);
	cr_assert_eq(differ_named, 0, "with %s: %zu of %zu parameters differ", other, differ_named, P);
	free(named);
	char extra[400];
	snprintf(extra, sizeof(extra), "local_socket = true\nsocket_dir = %s/sockets\n", dir);
	float *unx = params_run("local-true", extra, P, out);
	for (int i = 0; i < 2; i++)
		cr_assert_not_null(strstr(slurp(out[i]), "workers on this host reach it over the Unix socket"),
				   "%s", slurp(out[i]));
	for (int i = 2; i < 4; i++)
		cr_assert_not_null(strstr(slurp(out[i]), "connected to 2 ps (2 on this host, over a Unix socket, its bytes through shared memory);"),
				   "%s", slurp(out[i]));
	size_t differ = floats_differ(tcp, unx, P);
	cr_assert_eq(differ, 0, "%zu of %zu parameters differ", differ, P);
	/* The same sockets without rings: every byte through the sockets. */
	snprintf(extra, sizeof(extra), "local_socket = true\nlocal_ring = false\nsocket_dir = %s/sockets\n",
		 dir);
	float *bare = params_run("local-noring", extra, P, out);
	for (int i = 2; i < 4; i++)
		cr_assert_not_null(strstr(slurp(out[i]), "connected to 2 ps (2 on this host, over a Unix socket);"),
				   "%s", slurp(out[i]));
	differ = floats_differ(tcp, bare, P);
	cr_assert_eq(differ, 0, "without rings: %zu of %zu parameters differ", differ, P);
	free(bare);
	/* Each ps removed its socket when it ended. */
	char sockets[400];
	snprintf(sockets, sizeof(sockets), "%s/sockets", dir);
	DIR *d = opendir(sockets);
	cr_assert_not_null(d, "%s", sockets);
	for (struct dirent *e; (e = readdir(d));)
		cr_assert(e->d_name[0] == '.', "%s/%s left behind", sockets, e->d_name);
	closedir(d);
	free(tcp);
	free(unx);
}

/* [ps] apply_threads: each ps steps the pieces a push completes on a
 * pool of 3 threads, while the connection's thread reads on, and the run
 * ends with the very parameters of one where each piece is stepped on the
 * connection's thread (2 workers: each piece's sum of two gradients). */
Test(cluster, apply_threads_change_no_number)
{
	char out[4][300];
	size_t P = 6 * 32768 + 32768 + 32768 * 3 + 3;
	float *one = params_run("apply-1", "[ps]\napply_threads = 1\n", P, out);
	for (int i = 0; i < 2; i++)
		cr_assert_null(strstr(slurp(out[i]), "steps its pieces on"), "%s", slurp(out[i]));
	float *three = params_run("apply-3", "[ps]\napply_threads = 3\n", P, out);
	for (int i = 0; i < 2; i++)
		cr_assert_not_null(strstr(slurp(out[i]), "steps its pieces on 3 threads ([ps] apply_threads)"),
				   "%s", slurp(out[i]));
	size_t differ = floats_differ(one, three, P);
	cr_assert_eq(differ, 0, "%zu of %zu parameters differ", differ, P);
	free(one);
	free(three);
}

/* A socket directory others may enter is not used: the ps says why and
 * every worker reaches it over TCP, sealed, as before. */
Test(cluster, local_socket_refuses_a_directory_others_may_enter)
{
	char cfg[300], out[4][300], sockets[400], extra[500];
	int st[4];
	snprintf(sockets, sizeof(sockets), "%s/open", dir);
	cr_assert_eq(mkdir(sockets, 0777), 0);
	cr_assert_eq(chmod(sockets, 0777), 0);
	snprintf(extra, sizeof(extra), "socket_dir = %s\n", sockets);
	snprintf(cfg, sizeof(cfg), "%s/open.ini", dir);
	write_cluster(dir, cfg, 20, 10, "mode = sync\n", extra);
	run_cluster(cfg, NULL, st, out);
	assert_exits_zero(st, out, 4, "");
	char want[800];
	snprintf(want, sizeof(want), "no Unix socket for workers on this host, they use TCP: %s may be entered by others (mode 777, want 700)",
		 sockets);
	for (int i = 0; i < 2; i++)
		cr_assert_not_null(strstr(slurp(out[i]), want), "no \"%s\" in:\n%s", want, slurp(out[i]));
	for (int i = 2; i < 4; i++)
		cr_assert_null(strstr(slurp(out[i]), "Unix socket"), "%s", slurp(out[i]));
}

/* cfg's "threads = 1" (write_cluster's) replaced by threads = t. */
static void set_threads(const char *cfg, int t)
{
	char *text = slurp(cfg), *at = strstr(text, "\nthreads = 1\n");
	cr_assert_not_null(at, "%s", text);
	FILE *f = fopen(cfg, "w");
	cr_assert_not_null(f);
	fprintf(f, "%.*s\nthreads = %d\n%s", (int)(at - text), text, t, at + strlen("\nthreads = 1\n"));
	cr_assert_eq(fclose(f), 0);
}

/* [train] threads = 0 with both workers at 127.0.0.1: each takes half of
 * this machine's CPUs (at least one) and says so; an explicit count is
 * left alone. */
Test(cluster, workers_on_one_host_share_its_cpus)
{
	char cfg[300], out[4][300], want[160];
	int st[4];
	cpu_set_t set;
	cr_assert_eq(sched_getaffinity(0, sizeof(set), &set), 0);
	int cpus = CPU_COUNT(&set), n = cpus / 2 > 0 ? cpus / 2 : 1;
	snprintf(want, sizeof(want), "[train] threads = 0: %d thread%s (this host's %d CPU%s shared by the 2 workers [cluster] lists at 127.0.0.1)",
		 n, n == 1 ? "" : "s", cpus, cpus == 1 ? "" : "s");
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 20, 10, "mode = sync\n", "");
	set_threads(cfg, 0);
	run_cluster(cfg, NULL, st, out);
	assert_exits_zero(st, out, 4, "threads = 0: ");
	for (int i = 2; i < 4; i++)
		cr_assert_not_null(strstr(slurp(out[i]), want), "no \"%s\" in:\n%s", want, slurp(out[i]));
	write_cluster(dir, cfg, 20, 10, "mode = sync\n", "");
	set_threads(cfg, 3);
	run_cluster(cfg, NULL, st, out);
	assert_exits_zero(st, out, 4, "threads = 3: ");
	for (int i = 2; i < 4; i++)
		cr_assert_null(strstr(slurp(out[i]), "[train] threads = 0:"), "%s", slurp(out[i]));
}

Test(cluster, async_two_ps_two_workers)
{
	char cfg[300], out[4][300];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 150, 10, "mode = async\n", "");
	run_cluster(cfg, NULL, st, out);
	assert_exits_zero(st, out, 4, "");
	double acc = final_accuracy(slurp(out[3]));
	cr_assert_gt(acc, 90.0, "final accuracy %.2f%%:\n%s", acc, slurp(out[3]));
	assert_no_recovery(out);
	/* staleness_lr is on by default, reached each shard, and each ps
	 * reports the gradients' mean age */
	for (int k = 0; k < 2; k++) {
		char *ps = slurp(out[k]);
		cr_assert_not_null(strstr(ps, "versions old on average"), "ps %d:\n%s", k, ps);
		cr_assert_not_null(strstr(ps, "staleness_lr on"), "ps %d:\n%s", k, ps);
	}
}

/* Start order does not matter: workers retry until the ps tasks listen. */
Test(cluster, workers_start_before_ps)
{
	char cfg[300], out[4][300];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 60, 10, "mode = sync\n", "");
	run_cluster_order(cfg, NULL, 1, st, out);
	assert_exits_zero(st, out, 4, "");
	cr_assert_not_null(strstr(slurp(out[3]), "done: 60 steps"), "%s", slurp(out[3]));
}

/* replicas_to_aggregate = 1 of 2 workers: a step never waits for the
 * second gradient; training still ends, every process exits 0. */
Test(cluster, sync_with_a_backup_worker)
{
	char cfg[300], out[4][300];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 150, 10, "mode = sync\nreplicas_to_aggregate = 1\n", "");
	run_cluster(cfg, NULL, st, out);
	assert_exits_zero(st, out, 4, "");
	double acc = final_accuracy(slurp(out[3]));
	cr_assert_gt(acc, 90.0, "final accuracy %.2f%%:\n%s", acc, slurp(out[3]));
}

/* With a backup worker the shards move on without the chief: each worker
 * goes on from the version it pulled (the run is `steps` versions long,
 * not steps per worker), and every multiple of checkpoint_every is saved
 * although the chief's CHECKPOINT often arrives after the shard passed it
 * (found by tests/net's slow-link test: no checkpoint was ever written). */
Test(cluster, backup_workers_count_versions_and_checkpoint_every_multiple)
{
	char cfg[300], out[4][300], step[400];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 150, 10,
		      "mode = sync\nreplicas_to_aggregate = 1\ncheckpoint_dir = bk-ck\ncheckpoint_every = 30\nkeep_checkpoints = 10\n", "");
	run_cluster(cfg, NULL, st, out);
	assert_exits_zero(st, out, 4, "");
	for (int k = 0; k < 2; k++) {
		const char *ps = slurp(out[k]);
		cr_assert_not_null(strstr(ps, "workers done: version 150,"), "ps %d:\n%s", k, ps);
		cr_assert_null(strstr(ps, "skipped"), "ps %d:\n%s", k, ps);
	}
	for (int w = 2; w < 4; w++)
		cr_assert_null(strstr(slurp(out[w]), "went back"), "%s", slurp(out[w]));
	/* A chief that starts late may find worker 1 trained every step
	 * alone (R = 1): it then says the run is finished, at step 150. */
	const char *chief = slurp(out[3]);
	cr_assert(strstr(chief, "done: 150 steps") || strstr(chief, "run finished: the shards are at step 150 of"),
		  "%s", chief);
	for (int s = 30; s <= 150; s += 30) {
		snprintf(step, sizeof(step), "%s/bk-ck/step-%08d/manifest-1-of-2", dir, s);
		cr_assert_eq(access(step, F_OK), 0, "no checkpoint at step %d:\n%s\n%s", s, slurp(out[0]), slurp(out[1]));
	}
}

/* Issue 3 item 4: 2 workers with batch B in sync mode end with the
 * parameters of one process training with batch 2B (computed here in
 * process, the way `pstrain local` does), up to float summation order. */
Test(cluster, sync_equals_local_with_double_batch)
{
	char cfg[300], dump[300], out[4][300], err[CONFIG_ERR_MAX];
	int st[4];
	const int steps = 25;
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	snprintf(dump, sizeof(dump), "%s/params.bin", dir);
	write_cluster(dir, cfg, steps, 10, "mode = sync\n", "");
	run_cluster(cfg, dump, st, out);
	assert_exits_zero(st, out, 4, "");

	struct config *c = malloc(sizeof(*c));
	cr_assert_not_null(c);
	cr_assert_eq(config_load(c, cfg, NULL, 0, err, sizeof(err)), 0, "%s", err);
	struct model m;
	cr_assert_eq(model_build(&m, &c->model, err, sizeof(err)), 0, "%s", err);
	struct dataset train = { 0 }, test = { 0 };
	cr_assert_eq(data_load(&train, &test, &c->data, c->train.seed, err, sizeof(err)), 0, "%s", err);
	int B = 2 * c->train.batch_size;
	long spe = (long)(train.n / (size_t)B);
	struct backend be;
	backend_cpu(&be, 1);
	struct replica rep = { 0 };
	cr_assert_eq(replica_init(&rep, &m, &be, B, err, sizeof(err)), 0, "%s", err);
	struct optim opt = { 0 };
	cr_assert_eq(optim_init(&opt, &c->train.optim, m.nparams), 0);
	float *p = malloc(m.nparams * sizeof(float)), *g = calloc(m.nparams, sizeof(float));
	float *got = malloc(m.nparams * sizeof(float)), *xb = malloc((size_t)B * train.d * sizeof(float));
	int32_t *yb = malloc((size_t)B * sizeof(int32_t));
	uint32_t *perm = malloc(train.n * sizeof(uint32_t));
	cr_assert(p && g && got && xb && yb && perm);
	model_init_params(&m, p, 0, m.nparams, c->train.seed);
	for (long s = 0; s < steps; s++) {
		if (s % spe == 0)
			data_permute(perm, train.n, c->train.seed, (uint64_t)(s / spe));
		dataset_gather(&train, perm + (size_t)(s % spe) * (size_t)B, (size_t)B, xb, yb);
		double loss;
		int right;
		cr_assert_eq(replica_load(&rep, xb, yb, B), 0);
		cr_assert_eq(replica_forward(&rep, p, B, 1, 0, &loss, &right), 0);
		cr_assert_eq(replica_backward(&rep, p, g, B, 1.0f / (float)B), 0);
		optim_step_zero(&opt, p, g, optim_lr(&c->train.optim, s, steps));
	}
	FILE *f = fopen(dump, "rb");
	cr_assert_not_null(f, "no parameter dump; chief:\n%s", slurp(out[3]));
	cr_assert_eq(fread(got, sizeof(float), m.nparams, f), m.nparams);
	cr_assert_eq(fgetc(f), EOF);
	fclose(f);
	double worst = 0;
	for (size_t i = 0; i < m.nparams; i++) {
		double d = fabs((double)got[i] - (double)p[i]) / (1e-3 + fabs((double)p[i]));
		if (d > worst)
			worst = d;
	}
	cr_expect_lt(worst, 1e-3, "largest relative difference %g", worst);
	free(p);
	free(g);
	free(got);
	free(xb);
	free(yb);
	free(perm);
	optim_free(&opt);
	replica_free(&rep);
	dataset_free(&train);
	dataset_free(&test);
	free(c);
}

/* [cluster] wire_dtype's values, direction by direction. */
Test(cluster, wire_dtype_directions)
{
	static const struct {
		int w;
		unsigned grads, params;
	} rows[] = {
		{ PRECISION_FP32, WIRE_F32, WIRE_F32 },
		{ PRECISION_BF16, WIRE_BF16, WIRE_BF16 },
		{ PRECISION_BF16_GRADS, WIRE_BF16, WIRE_F32 },
		{ PRECISION_BF16_PARAMS, WIRE_F32, WIRE_BF16 },
	};
	struct config c;
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		c.cluster.wire_dtype = rows[i].w;
		cr_expect_eq(role_grad_dtype(&c), rows[i].grads, "row %zu", i);
		cr_expect_eq(role_param_dtype(&c), rows[i].params, "row %zu", i);
	}
}

/* One 150-step run named name with train_extra in [train] (and after it,
 * sections that come before write_cluster's [model]: layers first) and
 * cluster_extra in [cluster]: its final parameters in p (n floats), the
 * processes' logs in out. */
static void run_sync_150_of(const char *name, const char *train_extra, const char *cluster_extra, float *p,
			    size_t n, char out[4][300])
{
	char cfg[300], dump[300];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/%s.ini", dir, name);
	snprintf(dump, sizeof(dump), "%s/%s.bin", dir, name);
	write_cluster(dir, cfg, 150, 50, train_extra, cluster_extra);
	run_cluster(cfg, dump, st, out);
	assert_exits_zero(st, out, 4, name);
	FILE *f = fopen(dump, "rb");
	cr_assert_not_null(f, "%s: no parameter dump; chief:\n%s", name, slurp(out[3]));
	cr_assert_eq(fread(p, sizeof(float), n, f), n, "%s: short dump", name);
	cr_assert_eq(fgetc(f), EOF, "%s: long dump", name);
	fclose(f);
}

/* The same, sync, the model write_cluster's. */
static void run_sync_150(const char *name, const char *cluster_extra, float *p, size_t n,
			 char out[4][300])
{
	run_sync_150_of(name, "mode = sync\n", cluster_extra, p, n, out);
}

/* One 150-step sync run with [cluster] wire_dtype = dtype: the chief's
 * final accuracy, and its final parameters in p (n floats). */
static double run_wire_dtype(const char *dtype, float *p, size_t n)
{
	char out[4][300], extra[64];
	snprintf(extra, sizeof(extra), "wire_dtype = %s\n", dtype);
	run_sync_150(dtype, extra, p, n, out);
	return final_accuracy(slurp(out[3]));
}

/* How many of p's n floats are bf16 values (low 16 bits zero). */
static size_t bf16_exact(const float *p, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t u;
		memcpy(&u, &p[i], sizeof(u));
		k += (u & 0xffffu) == 0;
	}
	return k;
}

/* Issue 15: the same run with gradients and parameters in bf16 on the
 * wire ends within one test sample of the fp32 run's accuracy (the blobs'
 * test set is 120 samples, 0.83 points each, so the 0.3 points is
 * finer than this test can tell; the MLP and CNN examples are compared by
 * hand, docs/BENCHMARKS.md). The chief's final parameters are what it
 * pulled: with bf16 parameters every one is a bf16 value, with bf16
 * gradients only (float32 parameters) almost none is, yet they differ
 * from the fp32 run's, so each direction really travelled as configured. */
Test(cluster, bf16_on_the_wire_matches_fp32)
{
	const size_t n = 6 * 16 + 16 + 16 * 3 + 3; /* write_cluster's model: 6-16-3 */
	float *f32 = malloc(n * sizeof(float)), *b16 = malloc(n * sizeof(float)),
	      *grads = malloc(n * sizeof(float));
	cr_assert(f32 && b16 && grads);
	double a32 = run_wire_dtype("fp32", f32, n);
	double a16 = run_wire_dtype("bf16", b16, n);
	double ag = run_wire_dtype("bf16_grads", grads, n);
	cr_log_info("accuracy: fp32 %.2f%%, bf16 %.2f%%, bf16_grads %.2f%%", a32, a16, ag);
	cr_assert_gt(a32, 95.0, "fp32 accuracy %.2f%%", a32);
	cr_assert_geq(a16, a32 - 1.0, "bf16 accuracy %.2f%%, fp32 %.2f%%", a16, a32);
	cr_assert_geq(ag, a32 - 1.0, "bf16_grads accuracy %.2f%%, fp32 %.2f%%", ag, a32);
	cr_assert_eq(bf16_exact(b16, n), n, "bf16: %zu of %zu parameters are bf16 values",
		     bf16_exact(b16, n), n);
	cr_assert_lt(bf16_exact(f32, n), n / 4, "fp32: %zu of %zu parameters are bf16 values",
		     bf16_exact(f32, n), n);
	cr_assert_lt(bf16_exact(grads, n), n / 4, "bf16_grads: %zu of %zu parameters are bf16 values",
		     bf16_exact(grads, n), n);
	cr_assert_neq(memcmp(grads, f32, n * sizeof(float)), 0, "bf16_grads ended as fp32 did");
	free(f32);
	free(b16);
	free(grads);
}

/* One 150-step sync run over TCP with the gradient pushed as backward
 * makes it (overlap = true) and wire_pack = pack, on a model with a
 * 256x256 weight, whole pieces of both shards, which a batch of 16 makes
 * in a fraction of their bytes as factors: the chief's final parameters
 * in p (n floats), its output in out. */
static void run_factored(const char *pack, float *p, size_t n, char out[4][300])
{
	char name[32], extra[128];
	snprintf(name, sizeof(name), "factors-%.8s", pack);
	snprintf(extra, sizeof(extra), "wire_pack = %s\nlocal_socket = false\noverlap = true\n", pack);
	run_sync_150_of(name,
			"mode = sync\n[model]\nlayer = dense 256\nlayer = relu\nlayer = dense 256\nlayer = relu\n",
			extra, p, n, out);
}

/* Protocol 15: with packing on, a worker sends the whole pieces of the
 * 256x256 weight as its gradient's factors (core/nn/factors.h), and the
 * ps's GEMM makes them from those. The run ends where the one that sends
 * float32 values does, to float rounding: not bit for bit, since the
 * worker's split backward makes its weight rows in blocks whose bounds
 * depend on when each link asks for them (two runs without factors
 * differ as much), while the ps makes a run's rows in one GEMM
 * (tests/test_factors.c: the same bits from the same blocks). Every
 * parameter within 1e-4 of the other run's after 150 steps, the same
 * test accuracy; a wrong row, or a row of another step's factors, moves
 * them far more. */
Test(cluster, factored_gradients_are_float32_to_rounding)
{
	const size_t n = 6 * 256 + 256 + 256 * 256 + 256 + 256 * 16 + 16 + 16 * 3 + 3;
	float *plain = malloc(n * sizeof(float)), *fac = malloc(n * sizeof(float));
	cr_assert(plain && fac);
	char out[4][300];
	run_factored("false", plain, n, out);
	const char *text = slurp(out[3]);
	cr_assert_null(strstr(text, "as the factors"), "factors without packing:\n%s", text);
	double a0 = final_accuracy(text);
	run_factored("true", fac, n, out);
	text = slurp(out[3]);
	double share = 0;
	const char *at = strstr(text, "% of the gradient went as the factors");
	cr_assert_not_null(at, "no factors:\n%s", text);
	while (at > text && at[-1] != ' ')
		at--;
	cr_assert_eq(sscanf(at, "%lf", &share), 1);
	cr_assert_gt(share, 40.0, "%.0f%% of the gradient as factors", share);
	cr_assert_eq(final_accuracy(text), a0, "accuracy %.2f%% with factors, %.2f%% without", final_accuracy(text),
		     a0);
	double most = 0;
	size_t where = 0;
	for (size_t i = 0; i < n; i++)
		if (fabs((double)fac[i] - (double)plain[i]) > most) {
			most = fabs((double)fac[i] - (double)plain[i]);
			where = i;
		}
	cr_log_info("factors: %.0f%% of the gradient; parameters differ by at most %.3g (parameter %zu)", share,
		    most, where);
	cr_assert_lt(most, 1e-4, "parameter %zu: %.9g with factors, %.9g as float32", where, fac[where],
		     plain[where]);
	free(plain);
	free(fac);
}

/* One 150-step sync run over TCP (local_socket = false: packing never
 * happens over a Unix socket) with [cluster] wire_pack = pack: the
 * chief's final parameters in p (n floats), and the bytes a parameter
 * value took on the wire, from its last lines. */
static double run_wire_pack(const char *pack, float *p, size_t n)
{
	char name[64], out[4][300], extra[96];
	snprintf(name, sizeof(name), "pack-%s", pack);
	snprintf(extra, sizeof(extra), "wire_pack = %s\nlocal_socket = false\n", pack);
	run_sync_150(name, extra, p, n, out);
	const char *text = slurp(out[3]);
	const char *at = strstr(text, "the parameters arrived in ");
	cr_assert_not_null(at, "wire_pack = %s: no bytes-a-value line in:\n%s", pack, text);
	double b = 0;
	cr_assert_eq(sscanf(at, "the parameters arrived in %lf bytes a value", &b), 1);
	return b;
}

/* Issue 15: wire_pack = true carries the parameters in fewer bytes than
 * float32, and loses nothing: the run ends on the same parameters, bit
 * for bit, as the one with float32 (sync with 2 workers is deterministic:
 * a sum of two does not depend on their order). Below 3.45 bytes a
 * value, packing alone's floor being 3.5 (3.52 measured with the XORs
 * off): after the first pulls the parameters come as XORs with the
 * version before (net/xdelta.h), each checked against the values the
 * worker made of them. How many pulls come so varies from run to run
 * (2.72 to 3.34 bytes in 23 runs since the ps records what each
 * connection was sent): 3.3 failed once in 15. */
Test(cluster, packed_float32_is_the_same_float32_in_fewer_bytes)
{
	const size_t n = 6 * 16 + 16 + 16 * 3 + 3;
	float *plain = malloc(n * sizeof(float)), *packed = malloc(n * sizeof(float));
	cr_assert(plain && packed);
	double b32 = run_wire_pack("false", plain, n);
	double bp = run_wire_pack("true", packed, n);
	cr_log_info("bytes a value: float32 %.3f, packed %.3f", b32, bp);
	cr_assert(b32 == 4.0, "wire_pack = false: %.3f bytes a value", b32);
	cr_assert(bp < 3.45, "wire_pack = true: %.3f bytes a value", bp);
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(memcmp(&plain[i], &packed[i], sizeof(float)), 0,
			     "parameter %zu: %.9g packed, %.9g as float32", i, packed[i], plain[i]);
	free(plain);
	free(packed);
}

/* A worker whose wire_dtype differs from the ps's is refused at the
 * handshake (the key is in the config hash), before any tensor moves:
 * the worker exits 3 saying its config differs. */
Test(cluster, wire_dtype_mismatch_is_refused_at_the_handshake)
{
	char cfg[300], out[3][300];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 10, 10, "mode = sync\n", "wire_dtype = bf16\n");
	pid_t ps[2];
	for (int k = 0; k < 2; k++) {
		snprintf(out[k], 300, "%s/ps%d.log", dir, k);
		const char *ps_args[] = { "ps", "--index", k ? "1" : "0", "--config", cfg, NULL };
		ps[k] = spawn_pstrain(ps_args, out[k], NULL);
	}
	snprintf(out[2], 300, "%s/worker.log", dir);
	const char *w_args[] = { "worker", "--index", "0", "--config", cfg, "--set",
				 "cluster.wire_dtype=bf16_grads", NULL };
	pid_t w = spawn_pstrain(w_args, out[2], NULL);
	int st[1], pst[2];
	wait_children(&w, 1, st, RUN_TIMEOUT_S);
	kill(ps[0], SIGTERM);
	kill(ps[1], SIGTERM);
	wait_children(ps, 2, pst, RUN_TIMEOUT_S);
	char *log = slurp(out[2]);
	cr_assert_eq(st[0], 3, "worker exit %d:\n%s", st[0], log);
	cr_assert_not_null(strstr(log, "different training config"), "worker log:\n%s", log);
	char both[700];
	snprintf(both, sizeof(both), "%s%s", slurp(out[0]), slurp(out[1]));
	cr_assert_not_null(strstr(both, "different training config"), "ps logs:\n%s", both);
}

/* A worker with another cluster key is refused (exit 3) and the ps logs it
 * once with its address; the ps is then stopped by the test. */
Test(cluster, wrong_key_is_refused)
{
	char cfg[300], bad[340], out[2][300], path[300], err[KEY_ERR_MAX];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 10, 10, "mode = sync\n", "");
	snprintf(path, sizeof(path), "%s/other.key", dir);
	cr_assert_eq(key_generate(path, err, sizeof(err)), 0, "%s", err);
	snprintf(bad, sizeof(bad), "cluster.key_file=%s", path);
	snprintf(out[0], 300, "%s/ps0.log", dir);
	snprintf(out[1], 300, "%s/worker.log", dir);
	const char *ps_args[] = { "ps", "--index", "0", "--config", cfg, NULL };
	pid_t ps = spawn_pstrain(ps_args, out[0], NULL);
	const char *w_args[] = { "worker", "--index", "0", "--config", cfg, "--set", bad, NULL };
	pid_t w = spawn_pstrain(w_args, out[1], NULL);
	int st[1];
	wait_children(&w, 1, st, RUN_TIMEOUT_S);
	kill(ps, SIGTERM);
	int pst[1];
	wait_children(&ps, 1, pst, RUN_TIMEOUT_S);
	cr_assert_eq(st[0], 3, "worker exit %d:\n%s", st[0], slurp(out[1]));
	char *log = slurp(out[0]);
	cr_assert_not_null(strstr(log, "127.0.0.1:"), "ps log lacks the peer:\n%s", log);
	cr_assert_not_null(strstr(log, "handshake refused"), "ps log:\n%s", log);
	cr_assert_eq(pst[0], 130, "ps exit %d:\n%s", pst[0], log);
}

/* The ps's resident anonymous memory in KiB (RssAnon, else VmRSS) from
 * /proc/PID/status; -1 once it is gone or a zombie. */
static long rss_anon_kib(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	long anon = -1, rss = -1;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "RssAnon:", 8) == 0)
			anon = strtol(line + 8, NULL, 10);
		else if (strncmp(line, "VmRSS:", 6) == 0)
			rss = strtol(line + 6, NULL, 10);
	}
	fclose(f);
	return anon >= 0 ? anon : rss;
}

/* RssAnon samples of one process. */
struct rss_samples {
	pid_t pid;
	int n;
	long kib[4096];
};

static void rss_sample(void *ctx)
{
	struct rss_samples *rs = ctx;
	long k = rss_anon_kib(rs->pid);
	if (k > 0 && rs->n < (int)(sizeof(rs->kib) / sizeof(rs->kib[0])))
		rs->kib[rs->n++] = k;
}

/* Issue 3 item 7: a ps's memory does not grow with steps. 1 ps + 2 workers
 * run 30000 steps in sync, then async, mode while the test samples the ps's
 * RssAnon every 10 ms; after the first quarter of the samples (thread
 * arenas, first connections), it grows by at most 1 MiB. A leak of one
 * page per PUSH would add more than 10 MiB here. Each mode saves a
 * checkpoint every 500 steps into its own directory (a sync ps refuses
 * async checkpoints and the reverse). */
Test(cluster, ps_memory_does_not_grow_with_steps, .timeout = 60)
{
#ifdef __SANITIZE_ADDRESS__
	cr_skip_test("RSS under ASan is dominated by its quarantine, not by the ps");
#endif
	enum { STEPS = 30000 };
	const char *modes[] = { "sync", "async" };
	for (int m = 0; m < 2; m++) {
		char cfg[300], path[300], out[3][300], err[KEY_ERR_MAX];
		snprintf(path, sizeof(path), "%s/blobs.csv", dir);
		write_blobs(path, 600, 3, 6, 3);
		snprintf(path, sizeof(path), "%s/cluster.key", dir);
		if (m == 0)
			cr_assert_eq(key_generate(path, err, sizeof(err)), 0, "%s", err);
		snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
		FILE *f = fopen(cfg, "w");
		cr_assert_not_null(f);
		fprintf(f, "[cluster]\nps = 127.0.0.1:%d\nworkers = 127.0.0.1:%d, 127.0.0.1:%d\n"
			   "key_file = cluster.key\n"
			   "[data]\nformat = csv\ntrain_csv = blobs.csv\nlabel_column = first\n"
			   "[train]\nsteps = %d\nbatch_size = 4\nlearning_rate = 0.05\n"
			   "optimizer = momentum\nmomentum = 0.9\neval_every = 1000\nthreads = 1\n"
			   "mode = %s\ncheckpoint_dir = ck-%s\n"
			   "[model]\ninput = 6\nlayer = dense 8\nlayer = relu\nlayer = dense 3\n",
			free_port(), free_port(), free_port(), STEPS, modes[m], modes[m]);
		cr_assert_eq(fclose(f), 0);
		const char *roles[3][2] = { { "ps", "0" }, { "worker", "1" }, { "worker", "0" } };
		pid_t pids[3];
		for (int i = 0; i < 3; i++) {
			snprintf(out[i], 300, "%s/%s-%s%s.log", dir, modes[m], roles[i][0], roles[i][1]);
			const char *args[] = { roles[i][0], "--index", roles[i][1], "--config", cfg, NULL };
			pids[i] = spawn_pstrain(args, out[i], NULL);
		}
		struct rss_samples rs = { .pid = pids[0] };
		int st[3];
		wait_children_sampling(pids, 3, st, RUN_TIMEOUT_S / 2, 10, rss_sample, &rs);
		int ns = rs.n;
		const long *kib = rs.kib;
		assert_exits_zero(st, out, 3, modes[m]);
		char done[64];
		snprintf(done, sizeof(done), "done: %d steps", STEPS);
		cr_assert_not_null(strstr(slurp(out[2]), done), "%s", slurp(out[2]));
		cr_assert_geq(ns, 20, "%s: only %d samples of the ps's memory", modes[m], ns);
		int w = ns / 4;
		long base = kib[w], top = base;
		for (int i = w; i < ns; i++)
			if (kib[i] > top)
				top = kib[i];
		fprintf(stderr, "cluster/ps_memory (%s): %d samples, RssAnon %ld KiB first, %ld after warm-up, %ld last, %ld max\n",
			modes[m], ns, kib[0], base, kib[ns - 1], top);
		cr_assert_leq(top - base, 1024,
			      "%s: ps RssAnon grew from %ld to %ld KiB after warm-up (%d samples; first %ld)",
			      modes[m], base, top, ns, kib[0]);
	}
}

/* Issue 6 item 5, saving and resuming (a killed ps, silent peers and
 * heartbeats are in test_recovery.c): the chief asks both ps tasks to save; each writes its shard and
 * its own manifest; a cluster restarted with a longer run resumes every
 * shard from the newest complete checkpoint and ends on exactly the
 * parameters of an uninterrupted run (sync mode sums in worker order). */
Test(cluster, checkpoint_and_resume_sync)
{
	char cfg[300], out[4][300], dump1[300], dump3[300], path[400];
	int st[4];
	/* Uninterrupted: 60 steps. */
	snprintf(cfg, sizeof(cfg), "%s/c1.ini", dir);
	snprintf(dump1, sizeof(dump1), "%s/p1.bin", dir);
	write_cluster(dir, cfg, 60, 10, "mode = sync\ncheckpoint_dir = ck1\ncheckpoint_every = 15\n", "");
	run_cluster(cfg, dump1, st, out);
	assert_exits_zero(st, out, 4, "run 1");
	/* 40 steps, then the same cluster told to run 60. */
	snprintf(cfg, sizeof(cfg), "%s/c2.ini", dir);
	snprintf(path, sizeof(path), "%s/cluster.key", dir);
	cr_assert_eq(unlink(path), 0);   /* write_cluster makes a new one */
	write_cluster(dir, cfg, 40, 10, "mode = sync\ncheckpoint_dir = ck2\ncheckpoint_every = 15\n", "");
	run_cluster(cfg, NULL, st, out);
	assert_exits_zero(st, out, 4, "run 2");
	for (int s = 15; s <= 45; s += 15) {
		for (int k = 0; k < 2; k++) {
			/* A save asked for while the previous one is still being
			 * written may be replaced by the next (logged); on a busy
			 * disk that happens to 15 or 30 here. */
			char skipped[64];
			snprintf(skipped, sizeof(skipped), "checkpoint at step %d not written", s);
			snprintf(path, sizeof(path), "%s/ck2/step-%08d/manifest-%d-of-2", dir, s, k);
			if (s < 45 && strstr(slurp(out[k]), skipped))
				continue;
			cr_assert_eq(access(path, F_OK) == 0, s < 45, "%s:\n%s", path, slurp(out[k]));
		}
	}
	snprintf(path, sizeof(path), "%s/ck2/step-00000040/manifest-1-of-2", dir);
	cr_assert_eq(access(path, F_OK), 0, "no final checkpoint at step 40");

	snprintf(cfg, sizeof(cfg), "%s/c3.ini", dir);
	snprintf(dump3, sizeof(dump3), "%s/p3.bin", dir);
	snprintf(path, sizeof(path), "%s/cluster.key", dir);
	cr_assert_eq(unlink(path), 0);
	write_cluster(dir, cfg, 60, 10, "mode = sync\ncheckpoint_dir = ck2\ncheckpoint_every = 15\n", "");
	run_cluster(cfg, dump3, st, out);
	assert_exits_zero(st, out, 4, "run 3");
	cr_assert_not_null(strstr(slurp(out[0]), "resuming from"), "ps 0 did not resume:\n%s", slurp(out[0]));
	cr_assert_not_null(strstr(slurp(out[3]), "continuing at step 40 of 60"), "chief:\n%s", slurp(out[3]));
	cr_assert_not_null(strstr(slurp(out[3]), "done: 60 steps"), "chief:\n%s", slurp(out[3]));
	unsigned char *a, *b;
	size_t na, nb;
	read_all(dump1, &a, &na);
	read_all(dump3, &b, &nb);
	cr_assert_eq(na, nb);
	cr_assert_eq(memcmp(a, b, na), 0, "resumed cluster ends on other parameters than an uninterrupted one");
	free(a);
	free(b);

	/* The standard-library loader reassembles the two shard files (the
	 * first dense weight straddles them) and agrees with pstrain check. */
	char cmd[1200];
	snprintf(path, sizeof(path), "%s", __FILE__);
	char *slash = strrchr(path, '/');
	snprintf(slash ? slash + 1 : path, 64, "checkpoint_load.py");
	snprintf(cmd, sizeof(cmd), "python3 '%s' '%s' '%s/ck2' > '%s/py.txt' 2>&1", path, getenv("PSTRAIN_BIN"), dir, dir);
	if (system("python3 -c 'import hashlib' >/dev/null 2>&1") == 0) {
		int r = system(cmd);
		snprintf(path, sizeof(path), "%s/py.txt", dir);
		cr_assert_eq(r, 0, "checkpoint_load.py:\n%s", slurp(path));
		cr_assert_not_null(strstr(slurp(path), "ok dense1.weight 16x6"), "%s", slurp(path));
	} else {
		fprintf(stderr, "python3 missing: checkpoint_load.py not run on a cluster checkpoint\n");
	}
}

/* The newest step-NNNNNNNN under ckdir with both ps manifests, or -1. */
static long newest_complete(const char *ckdir)
{
	char path[600];
	for (long s = 99999; s > 0; s--) {
		int both = 1;
		for (int k = 0; k < 2 && both; k++) {
			snprintf(path, sizeof(path), "%s/step-%08ld/manifest-%d-of-2", ckdir, s, k);
			both = access(path, F_OK) == 0;
		}
		if (both)
			return s;
	}
	return -1;
}

/* Async save and resume: the chief asks both ps to save under a label (the
 * global step of ps 0's version as it pulled it, version / W); each writes
 * its shard as it is then. A cluster restarted with a longer run resumes
 * every shard from the newest complete checkpoint at version label x W,
 * and the workers continue at the global step, the label, instead of
 * training the whole run again. A sync cluster continues the same
 * checkpoints at that step (issue 14: any checkpoint in either mode). */
Test(cluster, checkpoint_and_resume_async)
{
	char cfg[300], out[4][300], path[400], ck[320];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/a1.ini", dir);
	write_cluster(dir, cfg, 40, 10, "mode = async\ncheckpoint_dir = ck\ncheckpoint_every = 15\n", "");
	run_cluster(cfg, NULL, st, out);
	assert_exits_zero(st, out, 4, "run 1");
	snprintf(ck, sizeof(ck), "%s/ck", dir);
	long label = newest_complete(ck);
	/* The final checkpoint: ps 0's version after the chief's 40 pushes
	 * and some of worker 1's, at most 80 pushes, over W = 2. */
	cr_assert(label >= 20 && label <= 40, "newest complete checkpoint %ld:\n%s", label, slurp(out[0]));
	cr_assert_not_null(strstr(slurp(out[1]), "saved shard 1 of 2"), "%s", slurp(out[1]));

	snprintf(cfg, sizeof(cfg), "%s/a2.ini", dir);
	snprintf(path, sizeof(path), "%s/cluster.key", dir);
	cr_assert_eq(unlink(path), 0);   /* write_cluster makes a new one */
	write_cluster(dir, cfg, 60, 10, "mode = async\ncheckpoint_dir = ck\ncheckpoint_every = 15\n", "");
	run_cluster(cfg, NULL, st, out);
	assert_exits_zero(st, out, 4, "run 2");
	char want[400];
	snprintf(want, sizeof(want), "resuming from %s/step-%08ld", ck, label);
	for (int k = 0; k < 2; k++)
		cr_assert_not_null(strstr(slurp(out[k]), want), "ps %d did not resume from %ld:\n%s", k, label,
				   slurp(out[k]));
	/* The first worker to pull finds every shard at the label; the
	 * other may find pushes of the first on top. */
	long start[2] = { -1, -1 };
	for (int w = 0; w < 2; w++) {
		const char *at = strstr(slurp(out[3 - w]), "continuing at step ");
		cr_assert_not_null(at, "worker %d:\n%s", w, slurp(out[3 - w]));
		cr_assert_eq(sscanf(at, "continuing at step %ld", &start[w]), 1);
		cr_assert(start[w] >= label && start[w] < 60, "worker %d at %ld:\n%s", w, start[w],
			  slurp(out[3 - w]));
	}
	cr_assert_eq(start[0] < start[1] ? start[0] : start[1], label, "label %ld, steps %ld and %ld",
		     label, start[0], start[1]);
	char *chief = slurp(out[3]);
	cr_assert_not_null(strstr(chief, "done: 60 steps"), "chief:\n%s", chief);
	cr_assert_gt(final_accuracy(chief), 90.0, "%s", chief);

	/* The same checkpoints for a sync cluster: it continues at the
	 * newest label (step) and trains to its end. */
	label = newest_complete(ck);
	snprintf(cfg, sizeof(cfg), "%s/s3.ini", dir);
	cr_assert_eq(unlink(path), 0);
	write_cluster(dir, cfg, 80, 10, "mode = sync\ncheckpoint_dir = ck\n", "");
	run_cluster(cfg, NULL, st, out);
	assert_exits_zero(st, out, 4, "sync run over async checkpoints");
	snprintf(want, sizeof(want), "resuming from %s/step-%08ld", ck, label);
	cr_assert_not_null(strstr(slurp(out[0]), want), "ps 0 did not resume from %ld:\n%s", label,
			   slurp(out[0]));
	snprintf(want, sizeof(want), "continuing at step %ld of 80", label);
	cr_assert_not_null(strstr(slurp(out[3]), want), "chief:\n%s", slurp(out[3]));
	cr_assert_not_null(strstr(slurp(out[3]), "done: 80 steps"), "chief:\n%s", slurp(out[3]));
}

/* Issue 6 item 5, first case: a worker SIGKILLed mid-training (at a seeded
 * random step, several trials) and restarted with the same command rejoins
 * at the shards' step; the sync run (R = W, so the shards wait for it)
 * finishes every step, every process exits 0, and the final accuracy is
 * within 1 point of an undisturbed run. */
Test(cluster, killed_worker_rejoins, .timeout = 180)
{
	char cfg[300], out[4][300], path[300], rejoin[300];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/ref.ini", dir);
	write_cluster(dir, cfg, 1500, 10, "mode = sync\ncheckpoint_dir =\n", "");
	run_cluster(cfg, NULL, st, out);
	assert_exits_zero(st, out, 4, "undisturbed");
	double ref = final_accuracy(slurp(out[3]));

	uint32_t seed = 6;
	for (int trial = 0, att = 0; trial < 2; trial++, att++) {
		seed = seed * 1103515245u + 12345u;
		int kill_at = 100 * (2 + (int)((seed >> 16) % 11));   /* 200..1200, on a progress line */
		snprintf(path, sizeof(path), "%s/cluster.key", dir);
		cr_assert_eq(unlink(path), 0);
		snprintf(cfg, sizeof(cfg), "%s/t%d.ini", dir, trial);
		write_cluster(dir, cfg, 1500, 10, "mode = sync\ncheckpoint_dir =\n", "");
		const char *roles[4][2] = { { "ps", "0" }, { "ps", "1" }, { "worker", "1" }, { "worker", "0" } };
		pid_t pids[4];
		for (int i = 0; i < 4; i++) {
			snprintf(out[i], 300, "%s/t%d-%s%s.log", dir, trial, roles[i][0], roles[i][1]);
			const char *args[] = { roles[i][0], "--index", roles[i][1], "--config", cfg, NULL };
			pids[i] = spawn_pstrain(args, out[i], NULL);
		}
		char mark[32];
		snprintf(mark, sizeof(mark), "step %d/1500", kill_at);
		int seen = wait_for_text(out[3], mark), ws = 0;
		kill(pids[2], SIGKILL);
		waitpid(pids[2], &ws, 0);
		if (!seen) {
			for (int i = 0; i < 4; i++)
				kill(pids[i], SIGKILL);
			cr_assert_fail("trial %d: the chief never reached %s:\n%s", trial, mark, slurp(out[3]));
		}
		if (WIFEXITED(ws) || strstr(slurp(out[2]), "worker 1: per step: ")) {
			/* Scheduled only after the run had finished (a loaded
			 * machine): nothing was killed, or only a worker that had
			 * trained every step and was on its way out (its last
			 * line, flushed, says so; a CI run saw every ps
			 * finish with both workers' 3000 gradients); run the
			 * trial again. */
			wait_children(pids, 4, st, RUN_TIMEOUT_S);
			cr_assert_lt(att, 5, "the runs keep finishing before the kill (machine too busy?)");
			fprintf(stderr, "cluster: trial %d ended before the kill at step %d; again\n", trial, kill_at);
			trial--;
			continue;
		}
		struct timespec pause = { 0, 300 * 1000 * 1000 };
		nanosleep(&pause, NULL);
		snprintf(rejoin, sizeof(rejoin), "%s/t%d-worker1-again.log", dir, trial);
		const char *args[] = { "worker", "--index", "1", "--config", cfg, NULL };
		pids[2] = spawn_pstrain(args, rejoin, NULL);
		wait_children(pids, 4, st, RUN_TIMEOUT_S);
		snprintf(out[2], 300, "%s", rejoin);
		char what[64];
		snprintf(what, sizeof(what), "trial %d (killed at step %d)", trial, kill_at);
		assert_exits_zero(st, out, 4, what);
		char *chief = slurp(out[3]);
		cr_assert_not_null(strstr(chief, "done: 1500 steps"), "%s", chief);
		double acc = final_accuracy(chief);
		cr_assert(fabs(acc - ref) <= 1.0, "trial %d: accuracy %.2f%% vs %.2f%% undisturbed", trial, acc, ref);
		cr_assert_not_null(strstr(slurp(out[0]), "closed worker 1's connection"), "%s", slurp(out[0]));
		cr_assert_not_null(strstr(slurp(rejoin), "continuing at step"), "%s", slurp(rejoin));
	}
}

/* replicas_to_aggregate = 1: worker 1 trains alone before the chief starts,
 * and ps 1 answers each connection's first PULL 300 ms late (test hook
 * PSTRAIN_FIRST_PULL_DELAY_MS, as a starved thread would on a busy
 * machine), so the chief's first pull finds the shards far apart. It pulls
 * again instead of taking them for shards restored from different
 * checkpoints: that made it exit 3 while ps 0 waited for it (seen once in
 * CI's ASan run, without the hook). */
Test(cluster, late_chief_beside_a_backup_worker_pulls_again)
{
	enum { STEPS = 8000 };
	char cfg[300], out[4][300], mark[64];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/late.ini", dir);
	write_cluster(dir, cfg, STEPS, 10, "mode = sync\nreplicas_to_aggregate = 1\n", "");
	const char *roles[4][2] = { { "ps", "0" }, { "ps", "1" }, { "worker", "1" }, { "worker", "0" } };
	pid_t pids[4];
	for (int i = 0; i < 4; i++) {
		if (i == 3) {
			snprintf(mark, sizeof(mark), "worker 1: step 200/%d", STEPS);
			if (!wait_for_text(out[2], mark)) {
				wait_children(pids, 3, st, 0);
				cr_assert_fail("worker 1 never reached step 200:\n%s", slurp(out[2]));
			}
		}
		snprintf(out[i], 300, "%s/late-%s%s.log", dir, roles[i][0], roles[i][1]);
		const char *args[] = { roles[i][0], "--index", roles[i][1], "--config", cfg, NULL };
		pids[i] = spawn_pstrain(args, out[i], i == 1 ? "PSTRAIN_FIRST_PULL_DELAY_MS=300" : NULL);
	}
	wait_children(pids, 4, st, RUN_TIMEOUT_S);
	assert_exits_zero(st, out, 4, "");
	char *chief = slurp(out[3]);
	cr_assert_not_null(strstr(chief, "pulling again until they agree"), "%s", chief);
	double acc = final_accuracy(chief);
	cr_assert_gt(acc, 90.0, "final accuracy %.2f%%:\n%s", acc, chief);
}

/* [cluster] cipher to the handshake's offer: auto offers what this CPU
 * runs, a name only that cipher (ChaCha20-Poly1305: nothing besides the
 * fallback every end has), and a cipher the CPU cannot run is a config
 * error that says so rather than a failed connection later. */
Test(cluster, cipher_offers_follow_the_config)
{
	static const struct {
		int choice;
		unsigned offer;
		int runs;
	} rows[] = {
		{ CIPHER_AUTO, 0, 1 },
		{ CIPHER_AEGIS256, FRAME_OFFER_AEGIS256, -1 },
		{ CIPHER_AES256GCM, FRAME_OFFER_AES256GCM, -1 },
		{ CIPHER_CHACHA20, 0, 1 },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct config *c = calloc(1, sizeof(*c));
		cr_assert_not_null(c);
		snprintf(c->path, sizeof(c->path), "x.ini");
		c->cluster.cipher = rows[i].choice;
		unsigned offers = 0xff;
		char err[256] = "";
		int e = role_ciphers(c, &offers, err, sizeof(err));
		unsigned want = rows[i].choice == CIPHER_AUTO ? frame_offers() : rows[i].offer;
		if (rows[i].runs == 1 || (want & ~frame_offers()) == 0) {
			cr_assert_eq(e, 0, "row %zu: %s", i, err);
			cr_assert_eq(offers, want, "row %zu: offers 0x%x", i, offers);
		} else {
			cr_assert_eq(e, -EINVAL, "row %zu", i);
			cr_assert_not_null(strstr(err, "this CPU cannot run it"), "%s", err);
			cr_log_warn("this CPU lacks AES-NI: only the refusal of row %zu ran", i);
		}
		free(c);
	}
}

/* Adds the thread ids in /proc/PID/task not in ids (n of them, cap) to
 * it; how many were new. */
static int task_ids_add(pid_t pid, long *ids, int *n, int cap)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	if (!d)
		return 0;
	int added = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		long id = strtol(e->d_name, NULL, 10);
		int seen = 0;
		for (int i = 0; i < *n && !seen; i++)
			seen = ids[i] == id;
		if (!seen && *n < cap) {
			ids[(*n)++] = id;
			added++;
		}
	}
	closedir(d);
	return added;
}

/* The threads of two workers as they train: every id seen (n), and how
 * many were first seen after the worker said it was connected (late). */
struct thread_watch {
	pid_t pids[2];
	const char *out[2];
	long ids[2][1 << 14];
	int n[2], late[2], ready[2], samples;
};

static void thread_sample(void *ctx)
{
	struct thread_watch *tw = ctx;
	for (int w = 0; w < 2; w++) {
		/* Listed before the log is read: every thread made before
		 * the line is in the list. */
		int added = task_ids_add(tw->pids[w], tw->ids[w], &tw->n[w], 1 << 14);
		if (tw->ready[w])
			tw->late[w] += added;
		else if (strstr(slurp(tw->out[w]), "connected to"))
			tw->ready[w] = 1;
	}
	tw->samples++;
}

/* Issue 37: no thread is created per training step. 2 ps + 2 workers run
 * 3000 steps in sync (each shard streams its pieces: both directions of
 * every link at once) and in async mode (pushes one shard after the
 * other) while the test lists the threads of both workers every
 * millisecond: every thread a worker has once it says it is connected is
 * made before that, so a thread id first seen after it is a thread made
 * during training (before issue 37, up to 2 per ps link and step, made
 * and joined by every exchange). */
Test(cluster, worker_threads_do_not_grow_with_steps, .timeout = 90)
{
	enum { STEPS = 3000 };
	const char *modes[] = { "sync", "async" };
	for (int m = 0; m < 2; m++) {
		char cfg[300], path[300], out[4][300], err[KEY_ERR_MAX];
		snprintf(path, sizeof(path), "%s/blobs.csv", dir);
		write_blobs(path, 600, 3, 6, 3);
		snprintf(path, sizeof(path), "%s/cluster.key", dir);
		if (m == 0)
			cr_assert_eq(key_generate(path, err, sizeof(err)), 0, "%s", err);
		snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
		FILE *f = fopen(cfg, "w");
		cr_assert_not_null(f);
		fprintf(f, "[cluster]\nps = 127.0.0.1:%d, 127.0.0.1:%d\nworkers = 127.0.0.1:%d, 127.0.0.1:%d\n"
			   "key_file = cluster.key\n"
			   "[data]\nformat = csv\ntrain_csv = blobs.csv\nlabel_column = first\n"
			   "[train]\nsteps = %d\nbatch_size = 4\nlearning_rate = 0.05\n"
			   "eval_every = 1000\nthreads = 1\nmode = %s\n"
			   "[model]\ninput = 6\nlayer = dense 8\nlayer = relu\nlayer = dense 3\n",
			free_port(), free_port(), free_port(), free_port(), STEPS, modes[m]);
		cr_assert_eq(fclose(f), 0);
		const char *roles[4][2] = { { "ps", "0" }, { "ps", "1" }, { "worker", "1" }, { "worker", "0" } };
		pid_t pids[4];
		/* The workers first, so that both connect as the ps tasks
		 * come up: in async mode a worker that came late would find
		 * the run finished by the other. */
		for (int i = 3; i >= 0; i--) {
			snprintf(out[i], 300, "%s/threads-%s-%s%s.log", dir, modes[m], roles[i][0], roles[i][1]);
			const char *args[] = { roles[i][0], "--index", roles[i][1], "--config", cfg, NULL };
			pids[i] = spawn_pstrain(args, out[i], NULL);
		}
		static struct thread_watch tw;
		memset(&tw, 0, sizeof(tw));
		for (int w = 0; w < 2; w++) {
			tw.pids[w] = pids[2 + w];
			tw.out[w] = out[2 + w];
		}
		int st[4];
		wait_children_sampling(pids, 4, st, RUN_TIMEOUT_S, 1, thread_sample, &tw);
		const int *n = tw.n, *late = tw.late, *ready = tw.ready, samples = tw.samples;
		assert_exits_zero(st, out, 4, modes[m]);
		/* Async, the chief may find the run finished by worker 1
		 * (which then trained it all). */
		char done[64];
		snprintf(done, sizeof(done), "done: %d steps", STEPS);
		cr_assert(strstr(slurp(out[3]), done) || (m == 1 && strstr(slurp(out[3]), "run finished")), "%s",
			  slurp(out[3]));
		fprintf(stderr, "cluster/worker_threads (%s): %d samples; worker 1: %d threads, %d made while training; worker 0: %d, %d\n",
			modes[m], samples, n[0], late[0], n[1], late[1]);
		cr_assert(ready[0] && ready[1], "%s: a worker never said it was connected", modes[m]);
		for (int w = 0; w < 2; w++)
			cr_assert_eq(late[w], 0,
				     "%s: worker %d made %d threads while training %d steps (%d threads in all)",
				     modes[m], 1 - w, late[w], STEPS, n[w]);
	}
}
