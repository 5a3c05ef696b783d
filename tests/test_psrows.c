/* A ps's embedding rows as pure state (cluster/psrows.h): a sync step over
 * pushes of different rows equals the dense computation (each worker's
 * gradient as a full table with zeros where it touched nothing, summed in
 * worker-index order and divided by R) bit for bit; the step counter of
 * lazy Adam moves once per version; async applies on arrival with the
 * staleness rules; backup workers' late pushes are stale; every refusal
 * leaves the rows as they were. */
#include <criterion/criterion.h>

#include "leak.h"

#include "../cluster/psrows.h"
#include "../core/config/config.h"
#include "../core/nn/model.h"
#include "../core/nn/optim.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

TestSuite(psrows, .fini = leak_check);

#define D 4

/* W workers, R replicas (0: W), extra [train] lines; tables 2 x 50 of D. */
static void make_config(struct config *c, struct model *m, int W, int R, const char *train)
{
	char text[4096], err[CONFIG_ERR_MAX];
	int len = snprintf(text, sizeof(text), "[cluster]\nworkers = ");
	for (int w = 0; w < W; w++)
		len += snprintf(text + len, sizeof(text) - (size_t)len, "%s127.0.0.1:%d", w ? ", " : "", 3000 + w);
	len += snprintf(text + len, sizeof(text) - (size_t)len,
			"\n[train]\nreplicas_to_aggregate = %d\nseed = 11\nsteps = 100\nembedding_learning_rate = 0.5\n%s\n"
			"[model]\ninput = 3\nlayer = embedding 2 50 %d\nlayer = dense 1\nloss = sigmoid_cross_entropy\n",
			R, train, D);
	cr_assert_eq(config_parse_string(c, "t.ini", text, err, sizeof(err)), 0, "%s\n%s", err, text);
	cr_assert_eq(model_build(m, &c->model, err, sizeof(err)), 0, "%s", err);
}

/* Worker w's push: rows ids (n) of [r0, r1), values from (w, row, d). */
static size_t pushed_rows(int w, uint64_t r0, uint64_t *ids, float *vals)
{
	static const uint64_t rows[3][6] = { { 1, 2, 5, 9 }, { 0, 2, 3, 9, 11 }, { 2, 4, 9, 10, 11, 12 } };
	static const size_t n[3] = { 4, 5, 6 };
	for (size_t i = 0; i < n[w]; i++) {
		ids[i] = r0 + rows[w][i];
		for (int d = 0; d < D; d++)
			vals[i * D + (size_t)d] = (float)(0.1 * (w + 1) + 0.37 * (double)rows[w][i] - 0.11 * d) / 3.0f;
	}
	return n[w];
}

static int bitwise_equal(const float *a, const float *b, size_t n)
{
	return memcmp(a, b, n * sizeof(float)) == 0;
}

/* Pushes of 3 slices arriving in order 2, 0, 1 make one step whose rows
 * are the dense computation's, with both optimizers: from 3 workers (a
 * slice each), or from W workers with [train] slices = 3 (any worker may
 * push any slice; the slice is what orders the sum). */
static void sync_equals_dense(const char *optimizer, int W)
{
	struct config c;
	struct model m;
	char train[96], err[256];
	snprintf(train, sizeof(train), "embedding_optimizer = %s\n%s", optimizer, W == 3 ? "" : "slices = 3");
	make_config(&c, &m, W, 0, train);
	struct psrows s;
	uint64_t r0 = 30, r1 = 50;
	size_t n = (size_t)(r1 - r0);
	cr_assert_eq(psrows_init(&s, &m.embed, r0, r1, &c, 100, 8, err, sizeof(err)), 0, "%s", err);

	/* the reference: the same initial rows, the dense sum, one step */
	float *ref = malloc(n * D * sizeof(float)), *G = calloc(n * D, sizeof(float));
	cr_assert(ref && G);
	embed_init_rows(&m.embed, ref, r0, r1, c.train.seed);
	cr_assert(bitwise_equal(ref, s.table, n * D), "the rows start as `local`'s do");
	struct sparse_optim o;
	struct sparse_config sc = s.opt.cfg;
	cr_assert_eq(sparse_optim_init(&o, &sc, n, D), 0);
	for (int w = 0; w < 3; w++) {
		uint64_t ids[8] = { 0 };
		float vals[8 * D] = { 0 }, full[20 * D] = { 0 };
		size_t k = pushed_rows(w, r0, ids, vals);
		for (size_t i = 0; i < k; i++)
			for (int d = 0; d < D && ids[i] - r0 < 20; d++)
				full[(ids[i] - r0) * D + (size_t)d] = vals[i * D + (size_t)d];
		for (size_t i = 0; i < n * D; i++)
			G[i] = w == 0 ? full[i] : G[i] + full[i];
	}
	uint64_t uni[20];
	float gu[20 * D];
	size_t u = 0;
	for (size_t r = 0; r < n; r++) {
		int touched = 0;
		for (int w = 0; w < 3; w++) {
			uint64_t ids[8] = { 0 };
			float vals[8 * D] = { 0 };
			size_t k = pushed_rows(w, r0, ids, vals);
			for (size_t i = 0; i < k; i++)
				touched |= ids[i] - r0 == r;
		}
		if (!touched)
			continue;
		for (int d = 0; d < D; d++)
			gu[u * D + (size_t)d] = G[r * D + (size_t)d] / 3.0f;
		uni[u++] = r;
	}
	sparse_optim_step(&o, ref, uni, gu, u, sc.lr);

	static const int order[3] = { 2, 0, 1 };
	for (int i = 0; i < 3; i++) {
		uint64_t ids[8] = { 0 };
		float vals[8 * D] = { 0 };
		size_t k = pushed_rows(order[i], r0, ids, vals);
		enum psshard_outcome oc;
		cr_assert_eq(psrows_push(&s, order[i], 0, ids, vals, k, &oc), 0);
		cr_assert_eq(oc, i < 2 ? PSSHARD_WAITING : PSSHARD_APPLIED);
		cr_assert_eq(s.version, i < 2 ? 0u : 1u);
	}
	cr_assert(bitwise_equal(ref, s.table, n * D), "%s, %d workers: the step is the dense computation's", optimizer, W);
	cr_assert_eq(s.opt.t, 1);
	/* a version nobody touched still steps lazy Adam's counter */
	for (int w = 0; w < 3; w++) {
		enum psshard_outcome oc;
		cr_assert_eq(psrows_push(&s, w, 1, NULL, NULL, 0, &oc), 0);
	}
	cr_assert(s.version == 2 && s.opt.t == 2);
	cr_assert(bitwise_equal(ref, s.table, n * D), "an empty step moves no row");
	/* a fourth slice is no slice of this step */
	enum psshard_outcome oc;
	cr_assert_eq(psrows_push(&s, 3, 2, NULL, NULL, 0, &oc), -EINVAL);
	sparse_optim_free(&o);
	psrows_free(&s);
	free(ref);
	free(G);
}

Test(psrows, sync_step_equals_the_dense_computation)
{
	sync_equals_dense("adagrad", 3);
	sync_equals_dense("lazy_adam", 3);
	sync_equals_dense("adagrad", 2);
	sync_equals_dense("lazy_adam", 1);
}

/* Every refusal leaves the rows, the waiting pushes and the version. */
Test(psrows, refusals_change_nothing)
{
	struct config c;
	struct model m;
	char err[256];
	make_config(&c, &m, 2, 0, "");
	struct psrows s;
	cr_assert_eq(psrows_init(&s, &m.embed, 10, 20, &c, 100, 4, err, sizeof(err)), 0, "%s", err);
	uint64_t ok[2] = { 10, 19 };
	float v[5 * D] = { 0 };
	enum psshard_outcome oc;
	cr_assert_eq(psrows_push(&s, 0, 0, ok, v, 2, &oc), 0);
	cr_assert_eq(oc, PSSHARD_WAITING);
	float before[10 * D];
	memcpy(before, s.table, sizeof(before));
	static const struct {
		const char *name;
		int worker;
		uint64_t version;
		uint64_t ids[5];
		size_t n;
		int nan;
		int want;
	} rows[] = {
		{ "row below the range", 1, 0, { 9 }, 1, 0, -EINVAL },
		{ "row past the range", 1, 0, { 20 }, 1, 0, -EINVAL },
		{ "unsorted", 1, 0, { 12, 11 }, 2, 0, -EINVAL },
		{ "duplicate", 1, 0, { 12, 12 }, 2, 0, -EINVAL },
		{ "over the capacity", 1, 0, { 10, 11, 12, 13, 14 }, 5, 0, -EINVAL },
		{ "no such worker", 2, 0, { 11 }, 1, 0, -EINVAL },
		{ "a version ahead", 1, 1, { 11 }, 1, 0, -ERANGE },
		{ "twice for one version", 0, 0, { 11 }, 1, 0, -EALREADY },
		{ "NaN", 1, 0, { 11, 12 }, 2, 1, -EDOM },
		{ "infinity", 1, 0, { 11, 12 }, 2, 2, -EDOM },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		float g[5 * D] = { 0 };
		if (rows[i].nan)
			g[D + 3] = rows[i].nan == 1 ? NAN : -INFINITY;
		int r = psrows_push(&s, rows[i].worker, rows[i].version, rows[i].ids, g, rows[i].n, &oc);
		cr_assert_eq(r, rows[i].want, "%s: %d", rows[i].name, r);
		cr_assert(s.version == 0 && s.nwaiting == 1 && psrows_has_pushed(&s, 0) && !psrows_has_pushed(&s, 1),
			  "%s", rows[i].name);
		cr_assert(bitwise_equal(before, s.table, 10 * D), "%s", rows[i].name);
	}
	cr_assert_eq(psrows_bad_id(&s, rows[2].ids, 2), 1);
	cr_assert_eq(psrows_bad_id(&s, ok, 2), 2);
	/* the rewind of a rollback: at the version given, nothing waiting */
	psrows_rewind(&s, 7);
	cr_assert(s.version == 7 && s.nwaiting == 0 && !psrows_has_pushed(&s, 0));
	psrows_free(&s);
}

/* Backup workers: the first R pushes of a version step it; a later one,
 * or one at the run's last step, is stale and not read. */
Test(psrows, backup_workers_and_the_last_step)
{
	struct config c;
	struct model m;
	char err[256];
	make_config(&c, &m, 3, 2, "");
	struct psrows s;
	cr_assert_eq(psrows_init(&s, &m.embed, 0, 100, &c, 2, 0, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(s.cap, 100u, "cap 0: the range's rows");
	uint64_t id[1] = { 5 };
	float g[D] = { 1, 2, 3, 4 };
	enum psshard_outcome oc;
	cr_assert_eq(psrows_push(&s, 2, 0, id, g, 1, &oc), 0);
	cr_assert_eq(psrows_push(&s, 0, 0, id, g, 1, &oc), 0);
	cr_assert(oc == PSSHARD_APPLIED && s.version == 1);
	float nan[D] = { NAN, NAN, NAN, NAN };
	cr_assert_eq(psrows_push(&s, 1, 0, id, nan, 1, &oc), 0, "a stale push is not read");
	cr_assert_eq(oc, PSSHARD_STALE);
	cr_assert_eq(psrows_push(&s, 1, 1, id, g, 1, &oc), 0);
	cr_assert_eq(psrows_push(&s, 0, 1, id, g, 1, &oc), 0);
	cr_assert(oc == PSSHARD_APPLIED && s.version == 2);
	cr_assert_eq(psrows_push(&s, 0, 2, id, g, 1, &oc), 0);
	cr_assert_eq(oc, PSSHARD_STALE, "at the run's end (total 2)");
	cr_assert(s.dropped_stale == 2 && s.received == 6);
	psrows_free(&s);
}

/* Async: on arrival, each push's step divided by its staleness + 1 (the
 * learning rate scaled), past max_staleness dropped; a ps with no rows
 * at all still counts versions. */
Test(psrows, async_staleness)
{
	struct config c;
	struct model m;
	char err[256];
	make_config(&c, &m, 2, 0, "mode = async\nmax_staleness = 2\n");
	struct psrows s;
	cr_assert_eq(psrows_init(&s, &m.embed, 0, 100, &c, 100, 8, err, sizeof(err)), 0, "%s", err);
	float *ref = malloc(100 * D * sizeof(float));
	cr_assert_not_null(ref);
	memcpy(ref, s.table, 100 * D * sizeof(float));
	struct sparse_optim o;
	struct sparse_config sc = s.opt.cfg;
	cr_assert_eq(sparse_optim_init(&o, &sc, 100, D), 0);
	uint64_t id[2] = { 3, 40 };
	float g[2 * D] = { 1, -2, 3, 0.25f, 0.5f, 0.5f, -1, 2 };
	enum psshard_outcome oc;
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(psrows_push(&s, i % 2, 0, id, g, 2, &oc), 0);
		cr_assert_eq(oc, PSSHARD_APPLIED);
		sparse_optim_step(&o, ref, id, g, 2, sc.lr * (1.0f / (float)(i + 1)));
	}
	cr_assert(bitwise_equal(ref, s.table, 100 * D), "staleness_lr: lr / (age + 1)");
	cr_assert(s.version == 3 && s.age_max == 2 && s.age_sum == 3);
	cr_assert_eq(psrows_push(&s, 0, 0, id, g, 2, &oc), 0);
	cr_assert_eq(oc, PSSHARD_STALE, "3 versions old, max_staleness 2");
	cr_assert_eq(psrows_push(&s, 0, 4, id, g, 2, &oc), -ERANGE);
	sparse_optim_free(&o);
	psrows_free(&s);
	free(ref);

	struct psrows e;
	cr_assert_eq(psrows_init(&e, &m.embed, 100, 100, &c, 100, 8, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(psrows_push(&e, 1, 0, NULL, NULL, 0, &oc), 0);
	cr_assert(oc == PSSHARD_APPLIED && e.version == 1);
	psrows_free(&e);
	cr_assert_eq(psrows_init(&e, &m.embed, 90, 101, &c, 100, 8, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "not a range of the tables' 100 rows"), "%s", err);
	psrows_free(&e);
}

/* Sync: after a step, the rows it was trained on can still be read (a
 * step trained again after a worker was lost between its rows' push and
 * its dense push): its union as it was, the rest from the table; the
 * version read is the one asked for. Two steps on, or after a rewind,
 * only the current. Elastic or not, the same. */
static void reads_the_step_before(int elastic)
{
	struct config c;
	struct model m;
	char err[256];
	make_config(&c, &m, 2, 0, "slices = 2");
	if (elastic)
		c.cluster.min_workers = 1;   /* as config.c resolves it */
	cr_assert_eq(config_elastic(&c), elastic);
	struct psrows s;
	uint64_t r0 = 10, r1 = 40;
	cr_assert_eq(psrows_init(&s, &m.embed, r0, r1, &c, 100, 8, err, sizeof(err)), 0, "%s", err);
	size_t n = (size_t)(r1 - r0);
	float *v0 = malloc(n * D * sizeof(float)), *got = malloc(n * D * sizeof(float));
	cr_assert(v0 && got);
	memcpy(v0, s.table, n * D * sizeof(float));
	uint64_t all[30];
	for (size_t i = 0; i < n; i++)
		all[i] = r0 + i;
	enum psshard_outcome oc;
	for (int sl = 0; sl < 2; sl++) {
		uint64_t ids[8];
		float vals[8 * D];
		size_t k = pushed_rows(sl, r0, ids, vals);
		cr_assert_eq(psrows_push(&s, sl, 0, ids, vals, k, &oc), 0);
	}
	cr_assert(oc == PSSHARD_APPLIED && s.version == 1);
	cr_assert(!bitwise_equal(v0, s.table, n * D), "the step moved rows");
	cr_assert_eq(psrows_read_at(&s, 0, all, n, got), 0u);
	cr_assert(bitwise_equal(v0, got, n * D), "version 0 read back after the step");
	cr_assert_eq(psrows_read_at(&s, 1, all, n, got), 1u);
	cr_assert(bitwise_equal(s.table, got, n * D), "version 1: the table");
	/* some rows alone: the lookup walks the kept union in step */
	uint64_t few[3] = { r0 + 2, r0 + 4, r0 + 9 };
	cr_assert_eq(psrows_read_at(&s, 0, few, 3, got), 0u);
	for (int i = 0; i < 3; i++)
		cr_assert(bitwise_equal(v0 + (few[i] - r0) * D, got + (size_t)i * D, D), "row %llu",
			  (unsigned long long)few[i]);
	for (int sl = 0; sl < 2; sl++)
		cr_assert_eq(psrows_push(&s, sl, 1, NULL, NULL, 0, &oc), 0);
	cr_assert_eq(psrows_read_at(&s, 0, all, n, got), 2u, "two steps back: the current rows");
	cr_assert(bitwise_equal(s.table, got, n * D));
	psrows_rewind(&s, 5);
	cr_assert_eq(psrows_read_at(&s, 4, all, n, got), 5u, "after a rollback: the current rows");
	psrows_free(&s);
	free(v0);
	free(got);
}

Test(psrows, sync_reads_the_step_before)
{
	reads_the_step_before(0);
	reads_the_step_before(1);
}
