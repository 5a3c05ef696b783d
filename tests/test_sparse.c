/* A click-through model in a cluster (issue 39 part 3): the ps hold the
 * embedding tables by row, workers pull their batches' rows and push
 * their gradients (SPULL, ROWS, SPUSH). Each test starts `pstrain`
 * processes ($PSTRAIN_BIN) on 127.0.0.1 on a data set of `pstrain synth`:
 *   - one worker in sync mode ends with `local`'s parameters and tables
 *     bit for bit (--dump-params), over one ps and over two, with Adagrad
 *     and lazy Adam, and in async mode (a lone worker's gradients are
 *     never stale, so the same numbers again);
 *   - two workers end alike over one ps and over two (the rows' sums run
 *     in worker-index order whatever the sharding); async trains within a
 *     tolerance of sync; backup workers drop their late rows as stale;
 *   - [ps] memory_limit: tables too large for one process are refused by
 *     `local` and by a lone ps with one line, and train over two ps, each
 *     holding its half, while the worker holds a batch's rows;
 *   - a key holder's malformed row messages are refused with an ERROR and
 *     one log line, and the ps trains real workers on.
 * Every wait is bounded; teardown kills what a failed assertion left. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include "target.h"
#include "util.h"

#include "../core/nn/embed.h"
#include "../net/msg.h"
#include "../net/msg_rows.h"
#include "../net/sock.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RUN_S 120
#define IO_MS 5000

TestSuite(sparse, .init = target_setup, .fini = target_teardown, .timeout = 300);

/* target_dir/ctr/{train,test}.txt from pstrain synth (once) and the key. */
static void ctr_data(void)
{
	char out[300], path[300], err[KEY_ERR_MAX];
	snprintf(path, sizeof(path), "%s/ctr", target_dir);
	if (access(path, F_OK) == 0)
		return;
	snprintf(out, sizeof(out), "%s/synth.log", target_dir);
	const char *args[] = { "synth", "--out", path, "--train-rows", "3000", "--test-rows", "600", "--vocab", "300",
			       "--seed", "5", NULL };
	pid_t p = spawn_pstrain(args, out, NULL);
	int st;
	wait_children(&p, 1, &st, 60);
	cr_assert_eq(st, 0, "synth: %s", slurp(out));
	snprintf(path, sizeof(path), "%s/cluster.key", target_dir);
	cr_assert_eq(key_generate(path, err, sizeof(err)), 0, "%s", err);
}

/* A cluster of nps ps and W workers. */
struct ctr {
	char name[32], cfg[300];
	int nps, W;
	int port[4];        /* the ps's */
	const char *slow;   /* the last worker's environment (NULL: none) */
	const char *ps_env; /* every ps's (NULL: none) */
};

/* x's config, target_dir/NAME.ini: nps ps on free ports, W workers
 * (placeholder ports: never listened on), `steps` steps of batch 32, the
 * model `embed` (an embedding layer's line) under dense 8, relu, dense 1;
 * train and cluster: more lines for [train] and [cluster]. */
static void ctr_config(struct ctr *x, const char *name, int nps, int W, int steps, const char *embed,
		       const char *train, const char *cluster)
{
	ctr_data();
	snprintf(x->name, sizeof(x->name), "%s", name);
	snprintf(x->cfg, sizeof(x->cfg), "%s/%s.ini", target_dir, name);
	x->nps = nps;
	x->W = W;
	x->slow = NULL;
	x->ps_env = NULL;
	FILE *f = fopen(x->cfg, "w");
	cr_assert_not_null(f);
	fprintf(f, "[cluster]\nps = ");
	cr_assert_leq(nps, 4);
	for (int k = 0; k < nps; k++)
		fprintf(f, "%s127.0.0.1:%d", k ? ", " : "", x->port[k] = free_port());
	fprintf(f, "\nworkers = ");
	for (int w = 0; w < W; w++)
		fprintf(f, "%s127.0.0.1:%d", w ? ", " : "", 61000 + w);
	fprintf(f, "\nkey_file = cluster.key\nsocket_dir = sockets-%s\n%s"
		   "[data]\nformat = criteo\ntrain_csv = ctr/train.txt\ntest_csv = ctr/test.txt\n"
		   "[train]\nsteps = %d\nbatch_size = 32\noptimizer = adam\nlearning_rate = 0.003\n"
		   "embedding_learning_rate = 0.05\nseed = 3\nthreads = 1\nlog_dir =\n%s%s"
		   "[model]\ninput = 13\nlayer = %s\nlayer = dense 8\nlayer = relu\nlayer = dense 1\n"
		   "loss = sigmoid_cross_entropy\n",
		   name, cluster, steps, strstr(train, "checkpoint_dir") ? "" : "checkpoint_dir =\n", train, embed);
	cr_assert_eq(fclose(f), 0);
}

/* `pstrain local` on x's config, dumping to dump (NULL: none); its log.
 * want: the exit status it must have. */
static char *run_local(const struct ctr *x, const char *dump, int want)
{
	char out[300];
	snprintf(out, sizeof(out), "%s/%s-local.log", target_dir, x->name);
	const char *args[] = { "local", "--config", x->cfg, dump ? "--dump-params" : NULL, dump, NULL };
	pid_t p = spawn_pstrain(args, out, NULL);
	int st;
	wait_children(&p, 1, &st, RUN_S);
	cr_assert_eq(st, want, "local %s: exit %d:\n%s", x->name, st, slurp(out));
	return slurp(out);
}

/* x's ps, then its workers, the chief dumping to dump (NULL: none); every
 * process exits 0. out: the logs, ps first, the chief last. sample: as
 * wait_children_sampling's (NULL: none), with pids the ps's then the
 * workers'. */
struct watch {
	pid_t pids[8];
	int n;
	void (*fn)(struct watch *w);
	long hwm_kib[8];   /* the largest VmHWM seen of each */
};

static void watch_sample(void *ctx)
{
	struct watch *w = ctx;
	for (int i = 0; i < w->n; i++) {
		char path[64], line[256];
		snprintf(path, sizeof(path), "/proc/%d/status", (int)w->pids[i]);
		FILE *f = fopen(path, "r");
		while (f && fgets(line, sizeof(line), f)) {
			long kib;
			if (sscanf(line, "VmHWM: %ld kB", &kib) == 1 && kib > w->hwm_kib[i])
				w->hwm_kib[i] = kib;
		}
		if (f)
			fclose(f);
	}
}

static void run_cluster(const struct ctr *x, const char *dump, char (*out)[300], struct watch *wt)
{
	static struct watch none;
	struct watch *w = wt ? wt : &none;
	int n = x->nps + x->W, st[8];
	cr_assert_leq(n, 8);
	memset(w->hwm_kib, 0, sizeof(w->hwm_kib));
	w->n = n;
	for (int i = 0; i < n; i++) {
		int ps = i < x->nps, idx = ps ? i : n - 1 - i;   /* the chief last */
		char index[16];
		snprintf(index, sizeof(index), "%d", idx);
		int k = snprintf(out[i], 300, "%s/%s-%s%d.log", target_dir, x->name, ps ? "ps" : "worker", idx);
		cr_assert_lt(k, 300);
		const char *args[] = { ps ? "ps" : "worker", "--index", index, "--config", x->cfg,
				       !ps && idx == 0 && dump ? "--dump-params" : NULL, dump, NULL };
		w->pids[i] = spawn_pstrain(args, out[i], ps ? x->ps_env : idx == x->W - 1 ? x->slow : NULL);
		if (i == x->nps - 1)
			target_nap_ms(200);   /* not needed (workers retry), only quicker */
	}
	wait_children_sampling(w->pids, n, st, RUN_S, 50, wt ? watch_sample : NULL, w);
	assert_exits_zero(st, out, n, x->name);
	const char *chief = slurp(out[n - 1]);
	cr_assert_not_null(strstr(chief, "done: "), "%s", chief);
	for (int i = 0; i < x->nps; i++)
		cr_assert_null(strstr(slurp(out[i]), "closed worker"), "%s", slurp(out[i]));
}

/* Index of the first float that differs bit for bit, or -1; n: each file's floats. */
static long dump_diff(const char *a, const char *b, size_t *n)
{
	unsigned char *pa, *pb;
	size_t la, lb;
	read_all(a, &pa, &la);
	read_all(b, &pb, &lb);
	cr_assert_eq(la, lb, "%s: %zu bytes, %s: %zu", a, la, b, lb);
	long at = -1;
	for (size_t i = 0; i + 4 <= la && at < 0; i += 4)
		if (memcmp(pa + i, pb + i, 4))
			at = (long)(i / 4);
	*n = la / 4;
	free(pa);
	free(pb);
	return at;
}

/* The chief's or local's "test logloss L AUC A" text. */
static void figures(const char *log, char *out, size_t len, double *auc)
{
	const char *at = strstr(log, "done: ");
	cr_assert_not_null(at, "%s", log);
	at = strstr(at, "test logloss ");
	cr_assert_not_null(at, "%s", log);
	const char *end = strchr(at, ',');
	snprintf(out, len, "%.*s", (int)(end - at), at);
	const char *a = strstr(out, "AUC ");
	cr_assert(a && sscanf(a, "AUC %lf", auc) == 1, "%s", out);
}

#define EMBED "embedding 26 100 4"
#define EMBED_FLOATS (953 + 2600 * 4)

/* The reference a cluster run here is held to: `pstrain local` on the
 * config named name (EMBED, steps long, train's lines), dumping to dump
 * (len bytes: target_dir/name.bin); its log, the caller's to free. */
static char *local_reference(const char *name, int steps, const char *train, char *dump, size_t len)
{
	struct ctr l;
	ctr_config(&l, name, 1, 1, steps, EMBED, train, "");
	snprintf(dump, len, "%s/%s.bin", target_dir, name);
	return strdup(run_local(&l, dump, 0));
}

/* The run of x, dumped, equals `local`'s bit for bit (parameters, tables)
 * and prints the same figures. */
static void assert_equals_local(const struct ctr *x, const char *local_dump, const char *local_log)
{
	char dump[300], out[8][300], a[96], b[96];
	double auc;
	snprintf(dump, sizeof(dump), "%s/%s.bin", target_dir, x->name);
	run_cluster(x, dump, out, NULL);
	size_t n;
	long at = dump_diff(local_dump, dump, &n);
	cr_assert_eq(n, (size_t)EMBED_FLOATS, "%s: the parameters and the tables", x->name);
	cr_assert_eq(at, -1, "%s: float %ld of %zu differs from local's (%s)", x->name, at, n,
		     at >= 953 ? "a table's" : "a parameter");
	figures(local_log, a, sizeof(a), &auc);
	figures(slurp(out[x->nps + x->W - 1]), b, sizeof(b), &auc);
	cr_assert_str_eq(a, b, "%s", x->name);
	/* Each ps says which rows it holds. */
	cr_assert_not_null(strstr(slurp(out[0]), "ps 0: embedding rows [0, "), "%s", slurp(out[0]));
}

/* The chief's count of steps whose rows came in the exchange before
 * theirs (worker_embed_ahead), of 60. */
static long rows_came_ahead(const struct ctr *x)
{
	char path[300];
	snprintf(path, sizeof(path), "%s/%s-worker0.log", target_dir, x->name);
	const char *chief = slurp(path), *at = strstr(chief, "the rows of ");
	long took = -1, pulls = -1;
	cr_assert(at && sscanf(at, "the rows of %ld of %ld steps", &took, &pulls) == 2, "%s", chief);
	cr_assert_eq(pulls, 60, "%s", chief);
	return took;
}

/* What ps k of run name says of its SPUSHes: how many came packed. */
static unsigned long pushes_packed(const char *name, int k)
{
	char path[300];
	snprintf(path, sizeof(path), "%s/%s-ps%d.log", target_dir, name, k);
	const char *ps = slurp(path), *at = strstr(ps, "dropped as stale, ");
	unsigned long n = 0;
	cr_assert(at && sscanf(at, "dropped as stale, %lu came packed", &n) == 1, "%s", ps);
	return n;
}

Test(sparse, one_worker_sync_equals_local_bit_for_bit)
{
	struct ctr one, two;
	char dump[300];
	char *log = local_reference("local", 60, "", dump, sizeof(dump));
	ctr_config(&one, "one-ps", 1, 1, 60, EMBED, "", "");
	assert_equals_local(&one, dump, log);
	ctr_config(&two, "two-ps", 2, 1, 60, EMBED, "", "");
	assert_equals_local(&two, dump, log);
	/* Sync, one slice a step, no evaluation before the end: every
	 * step's rows but the first's came in the exchange before theirs. */
	cr_assert_eq(rows_came_ahead(&one), 59);
	cr_assert_eq(rows_came_ahead(&two), 59);
	/* Over TCP, packed (ids and float32 both ways: net/msg_rows.h): the
	 * same bits, and each ps says its pushes came packed. */
	struct ctr packed;
	ctr_config(&packed, "two-ps-packed", 2, 1, 60, EMBED, "", "local_socket = false\nwire_pack = true\n");
	assert_equals_local(&packed, dump, log);
	for (int k = 0; k < 2; k++)
		cr_assert_eq(pushes_packed("two-ps-packed", k), 60, "ps %d", k);
	free(log);
}

/* The ids go packed on every TCP link whatever auto decides of float32
 * (link_packs_ids), and nothing goes packed with wire_pack = false. */
Test(sparse, row_ids_packed_on_tcp_unless_wire_pack_is_false)
{
	struct ctr a, off;
	char dump[300];
	char *log = local_reference("ids-local", 60, "", dump, sizeof(dump));
	ctr_config(&a, "ids-auto", 2, 1, 60, EMBED, "", "local_socket = false\nwire_pack = auto\n");
	assert_equals_local(&a, dump, log);
	ctr_config(&off, "ids-off", 2, 1, 60, EMBED, "", "local_socket = false\nwire_pack = false\n");
	assert_equals_local(&off, dump, log);
	for (int k = 0; k < 2; k++) {
		cr_expect_eq(pushes_packed("ids-auto", k), 60, "ps %d, wire_pack = auto", k);
		cr_expect_eq(pushes_packed("ids-off", k), 0, "ps %d, wire_pack = false", k);
	}
	free(log);
}

/* How many of a dump's table values (after the dense parameters) have
 * any of their low 16 bits set, that is, are not bfloat16 values. */
static size_t tables_not_bf16(const char *dump)
{
	unsigned char *p;
	size_t len, wide = 0;
	read_all(dump, &p, &len);
	cr_assert_eq(len, (size_t)EMBED_FLOATS * 4, "%s: %zu bytes", dump, len);
	for (size_t i = 953; i < (size_t)EMBED_FLOATS; i++) {
		uint32_t u;
		memcpy(&u, p + 4 * i, 4);
		wide += (u & 0xffffu) != 0;
	}
	free(p);
	return wide;
}

/* Rows travel as wire_dtype says: with bf16 (both ways) every table value
 * the worker pulls, its dump included, is a bf16 value; with bf16_grads
 * only the gradients are, so the rows come whole (the same check fails on
 * them, as it must be able to). Each end refuses rows in another dtype
 * than its config says, so the two runs finishing also says that ROWS
 * and SPUSH were each in the dtype the other end expected. */
Test(sparse, rows_travel_as_wire_dtype_says)
{
	struct ctr x;
	char dump[300], out[8][300], a[96], b[96];
	double auc, auc32;
	ctr_config(&x, "rows-bf16", 2, 1, 60, EMBED, "", "wire_dtype = bf16\n");
	snprintf(dump, sizeof(dump), "%s/rows-bf16.bin", target_dir);
	run_cluster(&x, dump, out, NULL);
	size_t wide = tables_not_bf16(dump);
	cr_assert_eq(wide, 0, "bf16: %zu table values pulled with more than bf16's bits", wide);
	figures(slurp(out[2]), a, sizeof(a), &auc);
	ctr_config(&x, "rows-fp32", 2, 1, 60, EMBED, "", "");
	run_cluster(&x, NULL, out, NULL);
	figures(slurp(out[2]), b, sizeof(b), &auc32);
	cr_assert_lt(fabs(auc - auc32), 0.02, "bf16 rows: %s; fp32: %s", a, b);
	ctr_config(&x, "rows-bf16-grads", 2, 1, 60, EMBED, "", "wire_dtype = bf16_grads\n");
	snprintf(dump, sizeof(dump), "%s/rows-bf16-grads.bin", target_dir);
	run_cluster(&x, dump, out, NULL);
	wide = tables_not_bf16(dump);
	cr_assert_gt(wide, (size_t)EMBED_FLOATS / 2, "bf16_grads: only %zu table values have float32's bits", wide);
}

/* Lazy Adam's step counter is per version on every ps alike; a lone
 * async worker's rows are never stale (scale 1). */
Test(sparse, lazy_adam_and_async_equal_local)
{
	struct ctr x;
	char dump[300];
	char *log = local_reference("lazy-local", 60, "embedding_optimizer = lazy_adam\n", dump, sizeof(dump));
	ctr_config(&x, "lazy-two-ps", 2, 1, 60, EMBED, "embedding_optimizer = lazy_adam\n", "");
	assert_equals_local(&x, dump, log);
	free(log);
	log = local_reference("async-local", 60, "", dump, sizeof(dump));
	ctr_config(&x, "async-two-ps", 2, 1, 60, EMBED, "mode = async\n", "");
	assert_equals_local(&x, dump, log);
	free(log);
}

/* [train] slices = 4 (docs/ELASTIC.md): a global batch of 4 slices that
 * does not depend on the workers. One worker training all 4 over one ps,
 * and two workers training 2 each over two ps, end on `local`'s
 * parameters and tables with the same slices, bit for bit: each slice's
 * rows are pulled and pushed apart, and every ps and `local` fold them in
 * slice order (grad_fold_rows). */
Test(sparse, slices_end_on_local_bit_for_bit)
{
	struct ctr x;
	char dump[300];
	char *log = local_reference("sl-local", 40, "slices = 4\n", dump, sizeof(dump));
	cr_assert_not_null(strstr(log, "batch 4 slices x 32"), "%s", log);
	ctr_config(&x, "sl-w1", 1, 1, 40, EMBED, "slices = 4\n", "");
	assert_equals_local(&x, dump, log);
	ctr_config(&x, "sl-w2", 2, 2, 40, EMBED, "slices = 4\n", "");
	assert_equals_local(&x, dump, log);
	free(log);
}

/* Async with slices: each worker's slices pushed and applied one by one
 * (4 versions a step, each slice's rows pushed on their own): two workers
 * train as well as two sync ones with the same slices, within a
 * tolerance, and every ps's rows went as many versions as its dense
 * shard, one per slice pushed: more than one per worker's step (the
 * shards' count ends the run, so not exactly 4 x 150). */
Test(sparse, async_slices_train_as_sync_does)
{
	struct ctr x;
	char out[8][300], a[96];
	double auc_sync, auc_async;
	ctr_config(&x, "sl-sync", 2, 2, 150, EMBED, "slices = 4\n", "");
	run_cluster(&x, NULL, out, NULL);
	figures(slurp(out[3]), a, sizeof(a), &auc_sync);
	ctr_config(&x, "sl-async", 2, 2, 150, EMBED, "slices = 4\nmode = async\n", "");
	run_cluster(&x, NULL, out, NULL);
	figures(slurp(out[3]), a, sizeof(a), &auc_async);
	for (int k = 0; k < 2; k++) {
		const char *ps = slurp(out[k]), *done = strstr(ps, "workers done: version "), *rows;
		unsigned long long v = 0, rv = 0;
		cr_assert(done && sscanf(done, "workers done: version %llu", &v) == 1, "%s", ps);
		rows = strstr(done, "embedding rows [");
		cr_assert(rows && (rows = strstr(rows, "version ")) && sscanf(rows, "version %llu", &rv) == 1, "%s", ps);
		cr_assert_eq(rv, v, "ps %d: rows at version %llu, the dense shard at %llu:\n%s", k, rv, v, ps);
		cr_assert(v > 2 * 150 && v <= 4 * 150, "ps %d: version %llu after 150 steps of 4 slices:\n%s", k, v, ps);
	}
	cr_log_info("4 slices, two workers: sync AUC %.4f, async %.4f\n", auc_sync, auc_async);
	cr_assert_gt(auc_sync, 0.65);
	cr_assert_lt(fabs(auc_async - auc_sync), 0.03, "sync AUC %.4f, async %.4f", auc_sync, auc_async);
}

/* Starts process `role` `index` of x's config (with env, if not NULL);
 * the chief dumps to dump (NULL: none). Its log at out. */
static pid_t start_one(const struct ctr *x, const char *role, int index, const char *dump, const char *env,
		       char *out)
{
	char idx[16];
	snprintf(idx, sizeof(idx), "%d", index);
	snprintf(out, 300, "%.200s/%.30s-%s%d.log", target_dir, x->name, role, index);
	int chief = !strcmp(role, "worker") && index == 0 && dump;
	const char *args[] = { role, "--index", idx, "--config", x->cfg, chief ? "--dump-params" : NULL, dump, NULL };
	return spawn_pstrain(args, out, env);
}

static void await_log(const char *path, const char *text)
{
	cr_assert(wait_for_text(path, text), "no \"%s\" in %s:\n%s", text, path, slurp(path));
}

/* An elastic worker set (docs/ELASTIC.md) on a click-through model: 3
 * workers listed, min_workers 1, 4 slices, 2 ps. Workers 0 and 1 train;
 * worker 2 joins and kills itself in its first step right after pushing
 * its slice's rows (PSTRAIN_CKPT_CRASH=rows), so both ps step their rows
 * while their dense shards wait for its slice. Past peer_timeout ps 0
 * gives that slice to the others, which train the step again: the ps
 * answer their pulls with the rows as that step had them
 * (psrows_read_at; with the next step's rows the test fails). Then worker
 * 1 leaves (SIGTERM) and the chief ends alone, on `local --set
 * train.slices=4`'s parameters and tables, bit for bit. */
Test(sparse, elastic_workers_end_on_local_slices, .timeout = 300)
{
	/* Long enough (about 10 s) that the leave lands before the end
	 * after the lost worker's peer_timeout (1 s) and its step again. */
	enum { T = 1000 };
	struct ctr x;
	char ldump[300], dump[300], out[5][300];
	char *log = local_reference("el-local", T, "slices = 4\n", ldump, sizeof(ldump));
	ctr_config(&x, "el", 2, 3, T, EMBED, "slices = 4\n", "min_workers = 1\npeer_timeout = 1\n");
	snprintf(dump, sizeof(dump), "%s/el.bin", target_dir);
	pid_t pids[5];
	int st[5];
	const char *slow = "PSTRAIN_STEP_DELAY_MS=4";
	for (int k = 0; k < 2; k++)
		pids[k] = start_one(&x, "ps", k, NULL, NULL, out[k]);
	pids[3] = start_one(&x, "worker", 1, NULL, slow, out[3]);
	pids[2] = start_one(&x, "worker", 0, dump, slow, out[2]);
	await_log(out[0], "workers 0, 1 train the 4 slices");
	pids[4] = start_one(&x, "worker", 2, NULL, "PSTRAIN_CKPT_CRASH=rows", out[4]);
	await_log(out[0], "workers 0, 1, 2 train the 4 slices");
	await_log(out[0], "again (a worker was lost)");
	cr_assert_eq(kill(pids[3], SIGTERM), 0);
	wait_children(pids, 4, st, RUN_S);
	assert_exits_zero(st, out, 4, "el");
	cr_assert_not_null(strstr(slurp(out[0]), "worker 1 leaves"), "%s", slurp(out[0]));
	int st4;
	wait_children(&pids[4], 1, &st4, 1);
	size_t n;
	long at = dump_diff(ldump, dump, &n);
	cr_assert_eq(at, -1, "float %ld of %zu differs from local's (%s)", at, n, at >= 953 ? "a table's" : "a parameter");
	free(log);
}

/* A worker waits for its batch's rows inside its compute, yet that wait
 * is the link's: the worker counts it as communication (its autoflows,
 * [cluster] wire_pack's, decide from compute against communication). The
 * ps answers each request for rows 40 ms late (a test hook). */
Test(sparse, waiting_for_rows_counts_as_communication)
{
	struct ctr x;
	char out[8][300];
	double compute, comm;
	long steps;
	ctr_config(&x, "rows-wait", 1, 1, 12, EMBED, "", "");
	x.ps_env = "PSTRAIN_ROWS_DELAY_MS=40";
	run_cluster(&x, NULL, out, NULL);
	const char *log = slurp(out[1]), *at = strstr(log, "per step: compute ");
	cr_assert(at && sscanf(at, "per step: compute %lf ms, communication %lf ms (%ld steps", &compute, &comm,
			       &steps) == 3, "%s", log);
	cr_assert_gt(steps, 0, "%s", log);
	cr_assert_geq(comm, 38.0, "the rows' wait is not communication: %s", at);
	cr_assert_lt(compute, 20.0, "the rows' wait is compute: %s", at);
}

/* Two workers: the same bits over one ps and over two; async trains as
 * well as sync, within a tolerance; every push reached every ps. */
Test(sparse, two_workers_sync_and_async)
{
	struct ctr one, two, as;
	char d1[300], d2[300], out[8][300], a[96];
	double auc_sync, auc_async, auc;
	ctr_config(&one, "w2-one-ps", 1, 2, 200, EMBED, "", "");
	snprintf(d1, sizeof(d1), "%s/w2-one.bin", target_dir);
	run_cluster(&one, d1, out, NULL);
	figures(slurp(out[2]), a, sizeof(a), &auc);
	ctr_config(&two, "w2-two-ps", 2, 2, 200, EMBED, "", "");
	snprintf(d2, sizeof(d2), "%s/w2-two.bin", target_dir);
	run_cluster(&two, d2, out, NULL);
	figures(slurp(out[3]), a, sizeof(a), &auc_sync);
	cr_assert_eq(auc, auc_sync);
	size_t n;
	long at = dump_diff(d1, d2, &n);
	cr_assert_eq(at, -1, "float %ld of %zu differs between one ps and two", at, n);
	for (int k = 0; k < 2; k++)
		cr_assert_not_null(strstr(slurp(out[k]), "all 2 workers done: version 200"), "%s", slurp(out[k]));
	ctr_config(&as, "w2-async", 2, 2, 200, EMBED, "mode = async\n", "");
	run_cluster(&as, NULL, out, NULL);
	figures(slurp(out[3]), a, sizeof(a), &auc_async);
	cr_log_info("two workers: sync AUC %.4f, async %.4f\n", auc_sync, auc_async);
	cr_assert_gt(auc_sync, 0.65);
	cr_assert_lt(fabs(auc_async - auc_sync), 0.03, "sync AUC %.4f, async %.4f", auc_sync, auc_async);
}

/* Three workers, two replicas to aggregate: each version takes the first
 * two pushes of rows as of dense gradients; the third's are stale. The
 * third worker pauses before each step: on 2 loaded CPUs the three could
 * otherwise take turns so evenly that no push ever came late. */
Test(sparse, backup_workers)
{
	struct ctr x;
	char out[8][300], a[96];
	double auc;
	ctr_config(&x, "backup", 2, 3, 150, EMBED, "replicas_to_aggregate = 2\n", "");
	x.slow = "PSTRAIN_STEP_DELAY_MS=15";
	run_cluster(&x, NULL, out, NULL);
	figures(slurp(out[4]), a, sizeof(a), &auc);
	cr_assert_gt(auc, 0.6, "%s", a);
	for (int k = 0; k < 2; k++) {
		const char *ps = slurp(out[k]), *at = strstr(ps, "all 3 workers done: version 150, ");
		cr_assert_not_null(at, "%s", ps);
		unsigned long applied, stale;
		cr_assert_eq(sscanf(at, "all 3 workers done: version 150, %lu gradients applied, %lu dropped as stale",
				    &applied, &stale), 2, "%s", ps);
		cr_assert_gt(stale, 0, "%s", ps);
		at = strstr(ps, "embedding rows [");
		at = at ? strstr(at + 1, "embedding rows [") : NULL;
		at = at ? strstr(at, "): version 150, ") : NULL;
		cr_assert(at && sscanf(at, "): version 150, %lu pushes applied, %lu dropped as stale", &applied, &stale) == 2,
			  "%s", ps);
		cr_assert(applied >= 300 && stale > 0, "rows: %lu applied, %lu stale:\n%s", applied, stale, ps);
	}
}

/* 26 tables of 100,000 rows of 32: 317 MiB, 635 with Adagrad's state;
 * [ps] memory_limit = 400 MiB. local and one ps refuse with one line;
 * two ps hold 317.4 MiB each and train one worker, whose memory is a
 * batch's rows: it never comes near the tables'. */
Test(sparse, tables_larger_than_one_process_train_over_two_ps, .timeout = 300)
{
	struct ctr x;
	char out[8][300];
	const char *big = "embedding 26 100000 32";
	ctr_config(&x, "big-local", 1, 1, 20, big, "", "");
	FILE *f = fopen(x.cfg, "a");
	cr_assert_not_null(f);
	fputs("[ps]\nmemory_limit = 400\n", f);
	cr_assert_eq(fclose(f), 0);
	const char *tail = "needs 634.8 MiB for its parameters, embedding rows and their optimizer state, more than [ps] memory_limit = 400 MiB: spread the tables over more ps ([cluster] ps)\n";
	char *log = run_local(&x, NULL, 2);
	cr_assert_not_null(strstr(log, "pstrain: the model "), "%s", log);
	cr_assert_not_null(strstr(log, tail), "%s", log);

	snprintf(out[0], sizeof(out[0]), "%s/big-one-ps.log", target_dir);
	const char *ps[] = { "ps", "--index", "0", "--config", x.cfg, NULL };
	pid_t p = spawn_pstrain(ps, out[0], NULL);
	int st;
	wait_children(&p, 1, &st, 60);
	cr_assert_eq(st, 2, "one ps: exit %d: %s", st, slurp(out[0]));
	cr_assert_not_null(strstr(slurp(out[0]), "pstrain: ps 0's shard (parameters [0, "), "%s", slurp(out[0]));
	cr_assert_not_null(strstr(slurp(out[0]), "embedding rows [0, 2600000)) "), "%s", slurp(out[0]));
	/* the same line, its figure with a sync step's buffers (psrows.h) */
	cr_assert_not_null(strstr(slurp(out[0]), strstr(tail, " MiB for its parameters")), "%s", slurp(out[0]));

	ctr_config(&x, "big-two-ps", 2, 1, 20, big, "", "");
	f = fopen(x.cfg, "a");
	cr_assert_not_null(f);
	fputs("[ps]\nmemory_limit = 400\n", f);
	cr_assert_eq(fclose(f), 0);
	struct watch w;
	run_cluster(&x, NULL, out, &w);
	for (int k = 0; k < 2; k++)
		cr_assert_not_null(strstr(slurp(out[k]), k ? "embedding rows [1300000, 2600000) of 2600000, 317.4 MiB"
							 : "embedding rows [0, 1300000) of 2600000, 317.4 MiB"),
				   "%s", slurp(out[k]));
	cr_log_info("resident at most: ps %ld and %ld KiB, worker %ld KiB\n", w.hwm_kib[0], w.hwm_kib[1],
		    w.hwm_kib[2]);
	/* A ps: its rows (158.7 MiB, written at start; the accumulator's
	 * zeros are pages the kernel gives as they are touched) and not much
	 * more than its whole shard; the worker: a batch's rows, evaluation
	 * chunks of 1024 samples, far below one ps's share. */
	for (int k = 0; k < 2; k++)
		cr_assert(w.hwm_kib[k] > 158 * 1024 && w.hwm_kib[k] < 317 * 1024 + 96 * 1024, "ps %d: %ld KiB", k,
			  w.hwm_kib[k]);
	cr_assert(w.hwm_kib[2] > 0 && w.hwm_kib[2] < 96 * 1024, "worker: %ld KiB", w.hwm_kib[2]);
}

/* ---- a key holder's row messages ----------------------------------------- */

/* The refusals' ps: `embedding 26 400 4`, 10,400 rows, all on ps 0; a
 * SPULL may ask for all of them (1024 samples x 26 fields would be more),
 * a SPUSH carries at most 32 x 26 = 832 rows (a batch's). */
#define KH_ROWS 10400u
#define KH_PUSH_CAP 832u

static void kh_target_train(struct target *t, struct ctr *x, int W, const char *train)
{
	char path[300], err[CONFIG_ERR_MAX];
	ctr_config(x, "kh", 1, W, 20, "embedding 26 400 4", train, "");
	snprintf(t->cfg, sizeof(t->cfg), "%s", x->cfg);
	snprintf(t->log, sizeof(t->log), "%s/ps0.log", target_dir);
	t->port = x->port[0];
	snprintf(path, sizeof(path), "%s/cluster.key", target_dir);
	cr_assert_eq(key_load(t->key, path, err, sizeof(err)), 0, "%s", err);
	struct config *c = malloc(sizeof(*c));
	cr_assert_not_null(c);
	cr_assert_eq(config_load(c, t->cfg, NULL, 0, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(config_hash(c, t->hash), 0);
	free(c);
	target_start(t, NULL);
}

static void kh_target(struct target *t, struct ctr *x, int W)
{
	kh_target_train(t, x, W, "");
}

/* A row message as its bytes, by hand (ids in any order): the header,
 * count ids (SPULL, SPUSH), count x 4 values (ROWS, SPUSH). */
static size_t kh_rows(uint8_t *buf, uint8_t type, uint64_t version, uint32_t total, uint32_t first,
		      const uint64_t *ids, uint32_t count, float value, uint32_t worker)
{
	memset(buf, 0, MSG_ROWS_HDR_BYTES);
	buf[0] = type;
	wire_put_u64(buf + 8, version);
	wire_put_u32(buf + 16, total);
	wire_put_u32(buf + 20, first);
	wire_put_u32(buf + 24, count);
	wire_put_u32(buf + 28, worker);
	size_t at = MSG_ROWS_HDR_BYTES;
	for (uint32_t i = 0; type != WIRE_ROWS && i < count; i++, at += 8)
		wire_put_u64(buf + at, ids[i]);
	for (uint32_t i = 0; type != WIRE_SPULL && i < 4 * count; i++, at += 4)
		wire_put_f32(buf + at, i == 1 ? value : 0.25f);
	return at;
}

static void kh_send(int fd, struct hs_result *hr, const uint8_t *m, size_t len)
{
	static uint8_t f[FRAME_BYTES_MAX];
	size_t flen;
	char err[256];
	cr_assert_eq(frame_seal(&hr->send, f, sizeof(f), m, len, &flen, err, sizeof(err)), 0, "%s", err);
	target_send(fd, f, flen);
}

static void kh_send_rows(int fd, struct hs_result *hr, uint8_t type, uint64_t version, uint32_t total,
			 uint32_t first, const uint64_t *ids, uint32_t count, float value, uint32_t worker)
{
	static uint8_t m[FRAME_MAX];
	kh_send(fd, hr, m, kh_rows(m, type, version, total, first, ids, count, value, worker));
}

/* ids 0, 1, ..., n - 1 (at most KH_ROWS + 1). */
static const uint64_t *kh_ids(void)
{
	static uint64_t ids[KH_ROWS + 1];
	for (uint32_t i = 0; i <= KH_ROWS; i++)
		ids[i] = i;
	return ids;
}

static void spull_row_out_of_range(int fd, struct hs_result *hr, uint32_t w)
{
	(void)w;
	uint64_t id = KH_ROWS;
	kh_send_rows(fd, hr, WIRE_SPULL, 0, 1, 0, &id, 1, 0, 0);
}

static void spull_unsorted(int fd, struct hs_result *hr, uint32_t w)
{
	(void)w;
	uint64_t ids[2] = { 9, 4 };
	kh_send_rows(fd, hr, WIRE_SPULL, 0, 2, 0, ids, 2, 0, 0);
}

static void spull_duplicate(int fd, struct hs_result *hr, uint32_t w)
{
	(void)w;
	uint64_t ids[2] = { 9, 9 };
	kh_send_rows(fd, hr, WIRE_SPULL, 0, 2, 0, ids, 2, 0, 0);
}

/* 8193 rows: 8192 in the first message, the last one of those again in
 * the second. */
static void spull_duplicate_across_messages(int fd, struct hs_result *hr, uint32_t w)
{
	(void)w;
	kh_send_rows(fd, hr, WIRE_SPULL, 0, 8193, 0, kh_ids(), 8192, 0, 0);
	kh_send_rows(fd, hr, WIRE_SPULL, 0, 8193, 8192, kh_ids() + 8191, 1, 0, 0);
}

static void spull_over_capacity(int fd, struct hs_result *hr, uint32_t w)
{
	(void)w;
	kh_send_rows(fd, hr, WIRE_SPULL, 0, KH_ROWS + 1, 0, kh_ids(), 8192, 0, 0);
}

static void spull_out_of_order(int fd, struct hs_result *hr, uint32_t w)
{
	(void)w;
	kh_send_rows(fd, hr, WIRE_SPULL, 0, 2, 1, kh_ids() + 5, 1, 0, 0);
}

/* A HEARTBEAT between the two messages of one SPULL. */
static void other_message_among_a_set(int fd, struct hs_result *hr, uint32_t w)
{
	(void)w;
	uint8_t m[MSG_HEARTBEAT_BYTES];
	size_t len;
	char err[256];
	struct msg_heartbeat hb;
	memset(&hb, 0, sizeof(hb));
	kh_send_rows(fd, hr, WIRE_SPULL, 0, 8193, 0, kh_ids(), 8192, 0, 0);
	cr_assert_eq(msg_encode_heartbeat(m, sizeof(m), &hb, &len, err, sizeof(err)), 0, "%s", err);
	kh_send(fd, hr, m, len);
}

static void spush_nan(int fd, struct hs_result *hr, uint32_t w)
{
	kh_send_rows(fd, hr, WIRE_SPUSH, 0, 3, 0, kh_ids() + 1, 3, NAN, w);
}

static void spush_inf(int fd, struct hs_result *hr, uint32_t w)
{
	kh_send_rows(fd, hr, WIRE_SPUSH, 0, 3, 0, kh_ids() + 1, 3, -INFINITY, w);
}

static void spush_naming_another_worker(int fd, struct hs_result *hr, uint32_t w)
{
	kh_send_rows(fd, hr, WIRE_SPUSH, 0, 1, 0, kh_ids(), 1, 0, w - 1);
}

static void spush_ahead_of_the_rows(int fd, struct hs_result *hr, uint32_t w)
{
	kh_send_rows(fd, hr, WIRE_SPUSH, 5, 1, 0, kh_ids(), 1, 0, w);
}

static void spush_over_capacity(int fd, struct hs_result *hr, uint32_t w)
{
	kh_send_rows(fd, hr, WIRE_SPUSH, 0, KH_PUSH_CAP + 1, 0, kh_ids(), KH_PUSH_CAP + 1, 0, w);
}

static void rows_from_a_worker(int fd, struct hs_result *hr, uint32_t w)
{
	(void)w;
	kh_send_rows(fd, hr, WIRE_ROWS, 0, 1, 0, NULL, 1, 0, 0);
}

typedef void kh_fn(int fd, struct hs_result *hr, uint32_t w);
static kh_fn *const kh_fns[] = { spull_row_out_of_range, spull_unsorted, spull_duplicate,
				 spull_duplicate_across_messages, spull_over_capacity, spull_out_of_order,
				 other_message_among_a_set, spush_nan, spush_inf, spush_naming_another_worker,
				 spush_ahead_of_the_rows, spush_over_capacity, rows_from_a_worker };

struct kh_refusal {
	char name[40];
	int W;        /* workers; the key holder is worker W - 1 */
	int fn;       /* kh_fns[fn] sends it */
	uint32_t code;
	char says[96];
};

static struct kh_refusal kh_refusals[] = {
	{ "spull_row_out_of_range", 1, 0, ERANGE, "SPULL: row 10400 is not one of this ps's rows [0, 10400)" },
	{ "spull_unsorted", 1, 1, EPROTO, "SPULL: row 4 after row 9" },
	{ "spull_duplicate", 1, 2, EPROTO, "SPULL: row 9 again after row 9" },
	{ "spull_duplicate_across_messages", 1, 3, EPROTO, "SPULL: row 8191 after row 8191" },
	{ "spull_over_capacity", 1, 4, EPROTO, "SPULL: 10401 rows, more than the 10400 one batch can touch" },
	{ "spull_out_of_order", 1, 5, EPROTO, "SPULL: rows [1, 2) where rows [0, 2) were due" },
	{ "other_message_among_a_set", 1, 6, EPROTO, "HEARTBEAT among the messages of a SPULL" },
	{ "spush_nan", 1, 7, EDOM, "SPUSH for version 0 refused: the gradient of row 1, element 1, is NaN" },
	{ "spush_inf", 1, 8, EDOM, "SPUSH for version 0 refused: the gradient of row 1, element 1, is -inf" },
	{ "spush_naming_another_worker", 2, 9, EPROTO, "SPUSH names worker 0 on worker 1's connection" },
	{ "spush_ahead_of_the_rows", 1, 10, EPROTO, "SPUSH for version 5 refused: the rows are at version 0" },
	{ "spush_over_capacity", 1, 11, EPROTO, "SPUSH: 833 rows, more than the 832 one batch can touch" },
	{ "rows_from_a_worker", 1, 12, EPROTO, "unexpected ROWS message" },
};

ParameterizedTestParameters(sparse, row_request_that_cannot_be_honoured)
{
	return cr_make_param_array(struct kh_refusal, kh_refusals, sizeof(kh_refusals) / sizeof(kh_refusals[0]));
}

/* The next message but HEARTBEATs is ERROR(code) saying says; then the
 * ps closes the connection. */
static void kh_expect_error(int fd, struct hs_result *hr, const struct kh_refusal *rf)
{
	static uint8_t buf[FRAME_CT_MAX];
	size_t len;
	char err[256];
	int type = target_recv_msg(fd, hr, buf, &len, rf->name);
	cr_assert_eq(type, WIRE_ERROR, "%s: answered with %s", rf->name, wire_msg_name((uint8_t)type));
	struct msg_error me;
	cr_assert_eq(msg_decode_error(buf, len, &me, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(me.code, rf->code, "%s: code %u (%s)", rf->name, me.code, me.text);
	cr_assert_not_null(strstr(me.text, rf->says), "%s: \"%s\"", rf->name, me.text);
	target_expect_closed(fd, IO_MS);
}

/* Each gets an ERROR with the reason and one log line naming the worker,
 * and the ps trains real workers to the end: a key holder neither stops
 * it nor touches its rows. */
ParameterizedTest(struct kh_refusal *rf, sparse, row_request_that_cannot_be_honoured)
{
	struct target t;
	struct ctr x;
	kh_target(&t, &x, rf->W);
	uint32_t w = (uint32_t)rf->W - 1;
	struct hs_result hr;
	int fd = target_peer(&t, w, &hr, 1);
	kh_fns[rf->fn](fd, &hr, w);
	kh_expect_error(fd, &hr, rf);
	char who[64];
	snprintf(who, sizeof(who), "closed worker %u's connection", w);
	target_assert_logged(&t, fd, who);
	target_assert_logged(&t, fd, rf->says);
	close(fd);
	target_wipe(&hr);

	char out[3][300];
	pid_t pids[3] = { t.pid };
	int st[3];
	snprintf(out[0], sizeof(out[0]), "%s", t.log);
	for (int i = 0; i < rf->W; i++) {
		char idx[16];
		snprintf(idx, sizeof(idx), "%d", i);
		snprintf(out[1 + i], sizeof(out[1 + i]), "%s/worker%d.log", target_dir, i);
		const char *args[] = { "worker", "--index", idx, "--config", t.cfg, NULL };
		pids[1 + i] = target_spawn(args, out[1 + i]);
	}
	wait_children(pids, 1 + rf->W, st, RUN_S);
	assert_exits_zero(st, out, 1 + rf->W, rf->name);
	cr_assert_not_null(strstr(slurp(out[1]), "done: 20 steps"), "%s", slurp(out[1]));
}

/* Async, as a dense PUSH (keyholder/async_push_from_before_a_rollback_is_stale):
 * after a ROLLBACK (another worker's recovery), rows pushed at a version
 * the rows had before it are dropped as stale, so that their worker goes
 * on to learn of the rollback from its next pull; rows tagged above every
 * version the rows had are still refused. Refused, they ended the worker. */
Test(sparse, async_rows_from_before_a_rollback_are_stale)
{
	struct target t;
	struct ctr x;
	kh_target_train(&t, &x, 1, "mode = async\n");
	struct hs_result hr;
	int fd = target_peer(&t, 0, &hr, 1);
	static uint8_t m[MSG_CHUNK_BYTES(953, WIRE_F32)];
	static float g[953];
	size_t len;
	char err[256];
	/* Three steps of rows and dense gradient: the shard must have moved
	 * for a ROLLBACK to rewind anything. */
	for (uint64_t v = 0; v < 3; v++) {
		kh_send_rows(fd, &hr, WIRE_SPUSH, v, 3, 0, kh_ids() + 1, 3, 0.5f, 0);
		cr_assert_eq(target_ack_status(fd, &hr, "rows"), MSG_ACK_APPLIED, "rows at %llu", (unsigned long long)v);
		struct msg_chunk ch = { .type = WIRE_PUSH, .shard = 0, .version = v, .worker = 0, .offset = 0,
					.count = 953 };
		cr_assert_eq(msg_encode_chunk(m, sizeof(m), &ch, g, &len, err, sizeof(err)), 0, "%s", err);
		kh_send(fd, &hr, m, len);
		cr_assert_eq(target_ack_status(fd, &hr, "a push"), MSG_ACK_APPLIED, "push at %llu", (unsigned long long)v);
	}
	struct msg_rollback rb = { .step = 0 };
	cr_assert_eq(msg_encode_rollback(m, sizeof(m), &rb, &len, err, sizeof(err)), 0, "%s", err);
	kh_send(fd, &hr, m, len);
	const char *rolled = "ps 0: rolled back from version 3 to step 0";
	cr_assert_not_null(strstr(target_wait_log(&t, rolled), rolled), "%s", slurp(t.log));
	kh_send_rows(fd, &hr, WIRE_SPUSH, 2, 3, 0, kh_ids() + 1, 3, 0.5f, 0);
	cr_assert_eq(target_ack_status(fd, &hr, "rows from before the rollback"), MSG_ACK_STALE);
	kh_send_rows(fd, &hr, WIRE_SPUSH, 4, 3, 0, kh_ids() + 1, 3, 0.5f, 0);
	struct kh_refusal above = { "rows above every version", 1, 0, EPROTO, "the rows are at version 0" };
	kh_expect_error(fd, &hr, &above);
	close(fd);
	target_wipe(&hr);
}

/* ps 0 and 1 and worker 0 of x, logs in out[0..2] as TAG-ps0.log ...;
 * the chief with env (NULL: none). */
/* The same with ps 1's environment ps1_env (NULL: none). */
static void restart_start_ps1(const struct ctr *x, const char *tag, const char *env, const char *ps1_env, pid_t *pids,
			      char (*out)[300])
{
	for (int i = 0; i < 3; i++) {
		const char *role = i < 2 ? "ps" : "worker", *idx = i == 1 ? "1" : "0";
		snprintf(out[i], 300, "%s/%s-%s%s.log", target_dir, tag, role, idx);
		const char *args[] = { role, "--index", idx, "--config", x->cfg, NULL };
		pids[i] = target_spawn_env(args, out[i], i == 2 ? env : i == 1 ? ps1_env : NULL);
	}
}

static void restart_start(const struct ctr *x, const char *tag, const char *env, pid_t *pids, char (*out)[300])
{
	restart_start_ps1(x, tag, env, NULL, pids, out);
}

/* ps 1 killed (unless it is gone already: pids[1] -1) and started again
 * (its log out[3]); ps 0, the worker and the new ps 1 must all end with
 * status 0. */
static void restart_ps1(const struct ctr *x, const char *tag, pid_t *pids, char (*out)[300])
{
	int killed, st[3];
	if (pids[1] > 0) {
		kill(pids[1], SIGKILL);
		wait_children(&pids[1], 1, &killed, 10);
	}
	snprintf(out[3], 300, "%s/%s-ps1-again.log", target_dir, tag);
	const char *again[] = { "ps", "--index", "1", "--config", x->cfg, NULL };
	pids[3] = target_spawn(again, out[3]);
	pid_t rest[3] = { pids[0], pids[2], pids[3] };
	char logs[3][300];
	snprintf(logs[0], 300, "%s", out[0]);
	snprintf(logs[1], 300, "%s", out[2]);
	snprintf(logs[2], 300, "%s", out[3]);
	wait_children(rest, 3, st, RUN_S);
	assert_exits_zero(st, logs, 3, "after the restart");
}

/* A ps killed mid-run and started again: it resumes its dense shard and
 * its embedding rows from the newest checkpoint, the other ps rolls back
 * to it, and the worker recovers and trains to the end. train: more
 * [train] lines; crash: ps 1's PSTRAIN_CKPT_CRASH (NULL: the test kills
 * it once it has saved a checkpoint). */
static void restarted_ps(const char *tag, const char *train, const char *crash)
{
	struct ctr x;
	char out[4][300], lines[160];
	snprintf(lines, sizeof(lines), "checkpoint_dir = ck\ncheckpoint_every = 200\n%s", train);
	ctr_config(&x, tag, 2, 1, 3000, EMBED, lines, "peer_timeout = 10\n");
	pid_t pids[4];
	restart_start_ps1(&x, tag, NULL, crash, pids, out);
	if (crash) {
		int st;
		wait_children(&pids[1], 1, &st, RUN_S);
		cr_assert_eq(st, 128 + SIGKILL, "ps 1 should have killed itself (%s): %d\n%s", crash, st, slurp(out[1]));
		pids[1] = -1;
	} else {
		/* Past a checkpoint, so that ps 0 has gone on from it and
		 * rolls back (the writer is behind the training; which step
		 * it saved first depends on the disk: on a loaded machine 400
		 * to 800 were skipped). */
		cr_assert(wait_for_text(out[1], "checkpoint: saved shard 1 of 2 in "), "%s", slurp(out[1]));
		target_nap_ms(150);
	}
	restart_ps1(&x, tag, pids, out);
	const char *w = slurp(out[2]), *ps1 = slurp(out[3]);
	cr_assert_not_null(strstr(w, "done: 3000 steps"), "%s", w);
	cr_assert_not_null(strstr(w, "lost ps 1"), "%s", w);
	cr_assert_not_null(strstr(ps1, "ps 1: resuming from "), "%s", ps1);
	/* its rows came back from the checkpoint it resumed from, with the
	 * dense shard (ps_store.c's resume) */
	cr_assert_not_null(strstr(ps1, "ps 1: embedding rows [1300, 2600) loaded from step "), "%s", ps1);
	cr_assert_not_null(strstr(ps1, "embedding rows [1300, 2600): version 3000, "), "%s", ps1);
	const char *ps0 = slurp(out[0]);
	cr_assert_not_null(strstr(ps0, "ps 0: rolled back from version "), "%s", ps0);
	/* The rows' version went back with the shard's: the redone steps
	 * were applied again, none was stale (pushes at or past the run's
	 * end would be, had the rows stayed ahead). */
	const char *rows = strstr(ps0, "embedding rows [0, 1300): version 3000, ");
	cr_assert_not_null(rows, "%s", ps0);
	unsigned long applied, stale;
	cr_assert_eq(sscanf(rows, "embedding rows [0, 1300): version 3000, %lu pushes applied, %lu dropped as stale",
			    &applied, &stale), 2, "%s", ps0);
	cr_assert(applied > 3000 && stale == 0, "%s", ps0);
}

Test(sparse, a_restarted_ps_is_recovered_from)
{
	restarted_ps("restart", "", NULL);
}

/* The same with the worker training 2 slices a step, ps 1 gone as it
 * takes the worker's request for the first slice's rows at step 700
 * (test hook): that pull is in the middle of the step, before its
 * exchange, and a ps lost there is a lost ps too (it once ended the
 * worker as the step's own failure). */
Test(sparse, a_ps_lost_between_slices_is_recovered_from, .timeout = 300)
{
	restarted_ps("restart-sl", "slices = 2\n", "PSTRAIN_CKPT_CRASH=spull:700");
}

/* A click-through model's final evaluation pulls its rows from the ps: ps
 * 1 killed while the chief is about to evaluate (test hook
 * PSTRAIN_FINAL_EVAL_DELAY_MS) and started again resumes from a
 * checkpoint before the end, so the chief recovers as from a ps lost in
 * training, trains the rolled-back steps again and evaluates at the end;
 * before, the lost rows ended the chief. */
Test(sparse, a_ps_lost_during_the_final_evaluation)
{
	struct ctr x;
	char out[4][300];
	ctr_config(&x, "finaleval", 2, 1, 400, EMBED, "checkpoint_dir = ck\ncheckpoint_every = 100\n",
		   "peer_timeout = 10\n");
	pid_t pids[4];
	restart_start(&x, "finaleval", "PSTRAIN_FINAL_EVAL_DELAY_MS=4000", pids, out);
	/* Step 300's checkpoint saved: the last 100 steps take well under
	 * 1.5 s even on a loaded machine, and the chief then sleeps 4 s
	 * before evaluating (the final checkpoint is asked for after it). The
	 * chief's line below says the loss came in the evaluation. */
	cr_assert(wait_for_text(out[0], "step-00000300"), "%s", slurp(out[0]));
	target_nap_ms(1500);
	restart_ps1(&x, "finaleval", pids, out);
	const char *w = slurp(out[2]), *ps1 = slurp(out[3]);
	cr_assert_not_null(strstr(w, "worker 0: ps 1 was lost during the final evaluation"), "%s", w);
	cr_assert_not_null(strstr(w, "done: 400 steps"), "%s", w);
	cr_assert_not_null(strstr(w, " AUC 0."), "%s", w);
	cr_assert_not_null(strstr(ps1, "ps 1: resuming from "), "%s", ps1);
}
