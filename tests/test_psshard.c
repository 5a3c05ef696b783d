/* Tests of cluster/psshard.c: shard init equals the slice of a whole-model
 * init; sync mode with R = W reproduces `local` with batch W·B over several
 * versions, for 2 and 3 ps shards and every optimizer; the average is
 * summed in worker-index order whatever the arrival order; stale, duplicate
 * and ahead-of-time pushes; backup workers (R < W); async apply-on-arrival
 * and max_staleness; the staleness-aware step (staleness_lr) for sgd,
 * momentum and adam, off with the switch and never in sync; and pushes
 * that never allocate. */
#include <criterion/criterion.h>

#include "leak.h"

#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/nn/backend.h"
#include "../core/config/config.h"
#include "../core/nn/model.h"
#include "../core/nn/optim.h"
#include "../cluster/psshard.h"
#include "../core/nn/replica.h"
#include "../core/nn/rng.h"
#include "../core/shard.h"

TestSuite(psshard, .fini = leak_check);

#define MLP "[model]\ninput = 6\nlayer = dense 16\nlayer = relu\nlayer = dense 8\nlayer = tanh\nlayer = dense 3\n"

/* A config with W workers, R replicas_to_aggregate (0 = W), and extra
 * [train] lines; the model is model_text. */
static void make_config(struct config *c, struct model *m, int W, int R, const char *train,
			const char *model_text)
{
	char text[8192], err[CONFIG_ERR_MAX];
	int len = snprintf(text, sizeof(text), "[cluster]\nworkers = ");
	for (int w = 0; w < W; w++)
		len += snprintf(text + len, sizeof(text) - (size_t)len, "%s127.0.0.1:%d", w ? ", " : "", 3000 + w);
	len += snprintf(text + len, sizeof(text) - (size_t)len,
			"\n[train]\nreplicas_to_aggregate = %d\nseed = 11\nsteps = 100\n%s\n%s", R, train, model_text);
	cr_assert_lt(len, (int)sizeof(text));
	cr_assert_eq(config_parse_string(c, "t.ini", text, err, sizeof(err)), 0, "%s\n%s", err, text);
	cr_assert_eq(model_build(m, &c->model, err, sizeof(err)), 0, "%s", err);
}

/* Index of the first bitwise difference, or n. */
static size_t first_diff(const float *a, const float *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp(&a[i], &b[i], sizeof(float)))
			return i;
	return n;
}

Test(psshard, init_equals_slice_of_whole_init)
{
	struct config c;
	struct model m;
	char err[256];
	make_config(&c, &m, 2, 0, "", MLP);
	size_t P = m.nparams;
	cr_assert_eq(P, 6 * 16 + 16 + 16 * 8 + 8 + 8 * 3 + 3);
	float *whole = malloc(P * sizeof(float));
	cr_assert_not_null(whole);
	model_init_params(&m, whole, 0, P, c.train.seed);
	size_t nonzero = 0;
	for (size_t i = 0; i < P; i++)
		nonzero += whole[i] != 0.0f;
	cr_assert_gt(nonzero, P / 2);

	const int counts[] = { 1, 2, 3, 7 };
	for (size_t j = 0; j < sizeof(counts) / sizeof(counts[0]); j++) {
		int nps = counts[j];
		struct shard sh[7];
		shard_plan(sh, nps, P);
		for (int k = 0; k < nps; k++) {
			struct psshard s;
			cr_assert_eq(psshard_init(&s, &m, &sh[k], &c, 100, err, sizeof(err)), 0, "%s", err);
			cr_assert_eq(s.n, sh[k].end - sh[k].begin);
			cr_assert_eq(psshard_version(&s), 0);
			cr_assert_eq(s.workers, 2);
			cr_assert_eq(s.replicas, 2);
			cr_assert_eq(s.mode, MODE_SYNC);
			size_t bad = first_diff(psshard_params(&s), whole + sh[k].begin, s.n);
			cr_assert_eq(bad, s.n, "%d ps, shard %d: element %zu differs", nps, k, bad);
			psshard_free(&s);
		}
	}
	free(whole);
}

Test(psshard, init_rejects_bad_ranges_and_counts)
{
	struct config c;
	struct model m;
	struct psshard s;
	char err[256];
	make_config(&c, &m, 2, 0, "", MLP);
	size_t P = m.nparams;

	struct shard empty = { 5, 5 }, beyond = { 10, P + 1 }, reversed = { 9, 3 };
	cr_assert_eq(psshard_init(&s, &m, &empty, &c, 100, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "ps shard [5, 5) is not a nonempty range of the model's 275 parameters");
	psshard_free(&s);
	cr_assert_eq(psshard_init(&s, &m, &beyond, &c, 100, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "[10, 276)") != NULL, "%s", err);
	psshard_free(&s);
	cr_assert_eq(psshard_init(&s, &m, &reversed, &c, 100, err, sizeof(err)), -EINVAL);
	psshard_free(&s);

	struct shard all = { 0, P };
	c.train.replicas_to_aggregate = 3;   /* config resolves it to <= W; check anyway */
	cr_assert_eq(psshard_init(&s, &m, &all, &c, 100, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "ps shard: replicas_to_aggregate 3 (expected 1..2 workers)");
	psshard_free(&s);
	c.train.replicas_to_aggregate = 2;
	c.train.optim.kind = (enum optim_kind)7;
	cr_assert_eq(psshard_init(&s, &m, &all, &c, 100, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "ps shard: unknown optimizer 7");
	psshard_free(&s);
	psshard_free(NULL);
}

/* Synthetic classification data: x (N, D), y (N). */
static void make_data(float *x, int32_t *y, int N, int D, int K)
{
	for (int i = 0; i < N; i++) {
		y[i] = i % K;
		for (int j = 0; j < D; j++)
			x[(size_t)i * D + j] = (float)(rng_normal(5, RNG_DATA, (uint64_t)i * D + j) +
						       (j % K == y[i] ? 1.5 : 0.0));
	}
}

/* grads (P) = backward over samples [first, first + B) at params, scaled. */
static void gradient(struct replica *r, const float *params, float *grads, const float *x,
		     const int32_t *y, int first, int B, float scale)
{
	const struct model *m = r->m;
	double loss;
	int right;
	memset(grads, 0, m->nparams * sizeof(float));
	cr_assert_eq(replica_load(r, x + (size_t)first * m->inputs, y + first, B), 0);
	cr_assert_eq(replica_forward(r, params, B, 1, 0, &loss, &right), 0);
	cr_assert_eq(replica_backward(r, params, grads, B, scale), 0);
}

/* Sync against local: the two runs differ only in the order the per-sample
 * gradient terms are summed, ((s_0 + ... + s_B-1)/B + (s_B + ...)/B + ...)/W
 * against (s_0 + ... + s_WB-1)/(WB) (with W a power of two the scales are
 * the same float), so the gradients differ by a few roundings of their own
 * size and the parameters by lr times that. Observed over the cases below
 * (6 versions each): at most 2 ulps (1.4e-7 relative) where |p| >= 0.1, and
 * at most 1.2e-7 absolute anywhere; parameters near zero (biases starting
 * at 0) differ by at most 5.1e-9. Hence |sharded - local| <= RTOL |local| +
 * ATOL: 1e-6 relative, with an absolute floor of 2e-8 for values near zero,
 * where a relative bound means nothing. A real bug (a missing 1/W, the lr of
 * the wrong step, a dropped worker) moves parameters by about lr |g|, 1e-3
 * or more. */
#define EQUIV_RTOL 1e-6
#define EQUIV_ATOL 2e-8

struct equiv_case {
	const char *train;
	int nps, W, B, steps;
};

/* worst: [0] largest relative difference where |p| >= 0.1, [1] largest
 * absolute difference; both kept across calls. */
static void run_equivalence(const struct equiv_case *q, double worst[2])
{
	struct config c;
	struct model m;
	struct replica rep;
	struct backend be;
	char err[256];
	make_config(&c, &m, q->W, 0, q->train, MLP);
	size_t P = m.nparams;
	int W = q->W, B = q->B, N = W * B * q->steps;
	long total = q->steps;

	float *x = malloc((size_t)N * m.inputs * sizeof(float));
	int32_t *y = malloc((size_t)N * sizeof(int32_t));
	float *local = malloc(P * sizeof(float)), *lgrad = malloc(P * sizeof(float));
	float *pulled = malloc(P * sizeof(float)), *ref = malloc(P * sizeof(float));
	float *wgrad = malloc((size_t)W * P * sizeof(float)), *sum = malloc(P * sizeof(float));
	cr_assert(x && y && local && lgrad && pulled && ref && wgrad && sum);
	make_data(x, y, N, m.inputs, m.outputs);
	backend_cpu(&be, 1);
	cr_assert_eq(replica_init(&rep, &m, &be, W * B, err, sizeof(err)), 0, "%s", err);

	struct shard sh[3];
	struct psshard ps[3];
	cr_assert_leq(q->nps, 3);
	shard_plan(sh, q->nps, P);
	for (int k = 0; k < q->nps; k++)
		cr_assert_eq(psshard_init(&ps[k], &m, &sh[k], &c, total, err, sizeof(err)), 0, "%s", err);

	/* local: the whole vector, one optimizer, batch W·B */
	struct optim lopt, ropt;
	cr_assert_eq(optim_init(&lopt, &c.train.optim, P), 0);
	cr_assert_eq(optim_init(&ropt, &c.train.optim, P), 0);
	model_init_params(&m, local, 0, P, c.train.seed);
	memcpy(ref, local, P * sizeof(float));

	for (int v = 0; v <= q->steps; v++) {
		/* PULL from every shard */
		for (int k = 0; k < q->nps; k++) {
			cr_assert_eq(psshard_version(&ps[k]), (uint64_t)v);
			memcpy(pulled + sh[k].begin, psshard_params(&ps[k]), ps[k].n * sizeof(float));
		}
		/* The shards do exactly "sum in worker-index order, divide by W,
		 * step" (bitwise), and that is local up to summation order. */
		size_t bad = first_diff(pulled, ref, P);
		cr_assert_eq(bad, P, "%d ps, W %d, version %d: p[%zu] = %a, index-order reference %a",
			     q->nps, W, v, bad, bad < P ? pulled[bad] : 0.0, bad < P ? ref[bad] : 0.0);
		size_t moved = 0;
		for (size_t i = 0; i < P; i++) {
			double d = fabs((double)pulled[i] - local[i]);
			cr_assert(d <= EQUIV_ATOL + EQUIV_RTOL * fabs(local[i]),
				  "%d ps, W %d, version %d: p[%zu] = %.9g sharded, %.9g local",
				  q->nps, W, v, i, (double)pulled[i], (double)local[i]);
			if (fabs(local[i]) >= 0.1 && d / fabs(local[i]) > worst[0])
				worst[0] = d / fabs(local[i]);
			worst[1] = d > worst[1] ? d : worst[1];
			if (v > 0) {
				float init;
				model_init_params(&m, &init, i, i + 1, c.train.seed);
				moved += pulled[i] != init;
			}
		}
		/* It trained: most parameters moved (the comparison could fail). */
		if (v > 0)
			cr_assert_gt(moved, P * 3 / 4, "version %d: only %zu of %zu moved", v, moved, P);
		if (v == q->steps)
			break;

		/* W workers, each on its own B samples of this step's W·B */
		for (int w = 0; w < W; w++)
			gradient(&rep, pulled, wgrad + (size_t)w * P, x, y, (v * W + w) * B, B, 1.0f / (float)B);
		/* PUSH in an order that is not the index order (reversed, or
		 * rotated on odd versions), each worker's gradient to every shard. */
		for (int a = 0; a < W; a++) {
			int w = v % 2 ? (a + 1) % W : W - 1 - a;
			for (int k = 0; k < q->nps; k++) {
				enum psshard_outcome o;
				cr_assert_eq(psshard_push(&ps[k], w, (uint64_t)v, wgrad + (size_t)w * P + sh[k].begin, &o), 0);
				cr_assert_eq(o, a == W - 1 ? PSSHARD_APPLIED : PSSHARD_WAITING,
					     "version %d, arrival %d: %s", v, a, psshard_outcome_name(o));
			}
		}
		float lr = optim_lr(&c.train.optim, v, total);
		/* the index-order reference */
		memcpy(sum, wgrad, P * sizeof(float));
		for (int w = 1; w < W; w++)
			for (size_t i = 0; i < P; i++)
				sum[i] += wgrad[(size_t)w * P + i];
		for (size_t i = 0; i < P; i++)
			sum[i] /= (float)W;
		optim_step(&ropt, ref, sum, lr);
		/* local: one batch of the same W·B samples */
		gradient(&rep, local, lgrad, x, y, v * W * B, W * B, 1.0f / (float)(W * B));
		optim_step(&lopt, local, lgrad, lr);
	}
	for (int k = 0; k < q->nps; k++) {
		cr_assert_eq(ps[k].applied, (uint64_t)q->steps);
		cr_assert_eq(ps[k].received, (uint64_t)(q->steps * W));
		cr_assert_eq(ps[k].dropped_stale, 0);
		psshard_free(&ps[k]);
	}
	optim_free(&lopt);
	optim_free(&ropt);
	replica_free(&rep);
	free(x);
	free(y);
	free(local);
	free(lgrad);
	free(pulled);
	free(ref);
	free(wgrad);
	free(sum);
}

Test(psshard, sync_equals_local_with_the_whole_batch)
{
	static const char *const optims[] = {
		"optimizer = sgd\nlearning_rate = 0.1\n",
		"optimizer = momentum\nlearning_rate = 0.05\nweight_decay = 0.01\nnesterov = true\n"
		"lr_schedule = cosine\nwarmup_steps = 2\n",
		"optimizer = adam\nlearning_rate = 0.01\nlr_schedule = step\nlr_decay_steps = 2\nlr_decay_rate = 0.5\n",
	};
	static const int shapes[][3] = { /* nps, W, B */
		{ 2, 2, 8 }, { 3, 4, 5 }, { 2, 3, 7 }, { 3, 2, 16 },
	};
	double worst[2] = { 0, 0 };
	for (size_t i = 0; i < sizeof(optims) / sizeof(optims[0]); i++)
		for (size_t j = 0; j < sizeof(shapes) / sizeof(shapes[0]); j++) {
			struct equiv_case q = { optims[i], shapes[j][0], shapes[j][1], shapes[j][2], 6 };
			run_equivalence(&q, worst);
		}
	cr_log_info("sync vs local: largest difference %.3g relative (|p| >= 0.1), %.3g absolute; "
		    "tolerance %g |p| + %g", worst[0], worst[1], EQUIV_RTOL, EQUIV_ATOL);
}

/* A shard over the whole tiny model "input = 3, dense 2" (P = 8: weights
 * [0, 6), biases [6, 8) which start at 0), optimizer `optim` with lr 1. */
static void tiny_with(struct psshard *s, struct model *m, int W, int R, const char *optim,
		      const char *extra)
{
	struct config c;
	char err[256], train[512];
	snprintf(train, sizeof(train), "optimizer = %s\nlearning_rate = 1\n%s", optim, extra);
	make_config(&c, m, W, R, train, "[model]\ninput = 3\nlayer = dense 2\n");
	cr_assert_eq(m->nparams, 8);
	struct shard all = { 0, 8 };
	cr_assert_eq(psshard_init(s, m, &all, &c, 100, err, sizeof(err)), 0, "%s", err);
}

/* The same with SGD. */
static void tiny(struct psshard *s, struct model *m, int W, int R, const char *extra)
{
	tiny_with(s, m, W, R, "sgd", extra);
}

static void fill(float *g, size_t n, float value)
{
	for (size_t i = 0; i < n; i++)
		g[i] = value;
}

/* Piece mode (sync, R = W): a shard of 4 pieces (the last one short)
 * takes each piece's gradients on their own and steps a piece as soon as
 * both workers' are in; the parameters equal the whole-shard rule bit for
 * bit (the mean in worker order, then adam with weight decay over the
 * whole vector) after every version; a piece ahead takes nothing until
 * the others catch up, a piece given twice is a duplicate, an old one is
 * stale and counted once per gradient. */
Test(psshard, pieces_step_on_their_own_and_equal_the_whole_rule)
{
	static struct config c;
	struct model m;
	struct psshard s;
	char err[256];
	make_config(&c, &m, 2, 0, "optimizer = adam\nweight_decay = 0.01\nlearning_rate = 0.01\nlr_schedule = cosine\n",
		    "[model]\ninput = 60\nlayer = dense 800\nlayer = relu\nlayer = dense 10\n");
	size_t P = m.nparams, lo, hi;
	cr_assert_eq(P, 60 * 800 + 800 + 800 * 10 + 10);
	struct shard r = { 0, P };
	cr_assert_eq(psshard_init(&s, &m, &r, &c, 100, err, sizeof(err)), 0, "%s", err);
	cr_assert(psshard_pieces(&s));
	cr_assert_eq(s.npieces, 4);
	psshard_piece_range(&s, 3, &lo, &hi);
	cr_assert(lo == 3 * PSSHARD_PIECE && hi == P);

	struct optim ref;
	float *want = malloc(P * sizeof(float)), *acc = malloc(P * sizeof(float));
	float *before = malloc(P * sizeof(float));
	float *g[2] = { malloc(P * sizeof(float)), malloc(P * sizeof(float)) };
	cr_assert(want && acc && before && g[0] && g[1]);
	cr_assert_eq(optim_init(&ref, &c.train.optim, P), 0);
	model_init_params(&m, want, 0, P, c.train.seed);
	enum psshard_outcome o;
	for (uint64_t v = 0; v < 3; v++) {
		for (int w = 0; w < 2; w++)
			for (size_t i = 0; i < P; i++)
				g[w][i] = 0.01f * (float)((i * 7 + v * 13 + (size_t)w * 5) % 23) - 0.1f;
		/* worker 1 sends everything, worker 0 pieces 2, 0, 1, 3 */
		for (size_t j = 0; j < 4; j++) {
			psshard_piece_range(&s, j, &lo, &hi);
			cr_assert_eq(psshard_push_piece(&s, 1, v, j, g[1] + lo, j == 3, &o), 0);
			cr_assert_eq(o, PSSHARD_WAITING);
		}
		cr_assert(psshard_has_pushed(&s, 1));
		cr_assert_not(psshard_has_pushed(&s, 0));
		const size_t order[4] = { 2, 0, 1, 3 };
		for (size_t k = 0; k < 4; k++) {
			size_t j = order[k];
			psshard_piece_range(&s, j, &lo, &hi);
			if (k == 1) {
				/* The gradient that would complete the piece, with
				 * a NaN at its end: refused, and the piece is as it
				 * was (it is summed from the sender's buffer, so it
				 * must be checked whole before any of it is used). */
				memcpy(acc, g[0] + lo, (hi - lo) * sizeof(float));
				acc[hi - lo - 1] = NAN;
				memcpy(before, psshard_params(&s), P * sizeof(float));
				cr_assert_eq(psshard_push_piece(&s, 0, v, j, acc, 0, &o), -EDOM);
				cr_assert_eq(psshard_piece_version(&s, j), v);
				cr_assert_eq(first_diff(psshard_params(&s), before, P), P);
			}
			cr_assert_eq(psshard_push_piece(&s, 0, v, j, g[0] + lo, k == 3, &o), 0);
			cr_assert_eq(o, PSSHARD_APPLIED);
			cr_assert_eq(psshard_piece_version(&s, j), v + 1);
			cr_assert_eq(psshard_version(&s), k == 3 ? v + 1 : v, "piece %zu", j);
			if (k == 0) {
				/* piece 2 is ahead: nothing for it until v moves */
				cr_assert_eq(psshard_push_piece(&s, 1, v + 1, 2, g[1] + lo, 0, &o), -ERANGE);
				/* the same worker's piece 0 again: a duplicate */
				psshard_piece_range(&s, 0, &lo, &hi);
				cr_assert_eq(psshard_push_piece(&s, 1, v, 0, g[1] + lo, 0, &o), -EALREADY);
			}
		}
		/* v again: stale, counted once (on the last piece) */
		uint64_t stale = s.dropped_stale;
		psshard_piece_range(&s, 3, &lo, &hi);
		cr_assert_eq(psshard_push_piece(&s, 1, v, 3, g[1] + lo, 1, &o), 0);
		cr_assert_eq(o, PSSHARD_STALE);
		cr_assert_eq(s.dropped_stale, stale + 1);

		for (size_t i = 0; i < P; i++)
			acc[i] = (g[0][i] + g[1][i]) / 2.0f;
		optim_step(&ref, want, acc, optim_lr(&c.train.optim, (long)v, 100));
		size_t d = first_diff(psshard_params(&s), want, P);
		cr_assert_eq(d, P, "version %llu: parameter %zu is %a, the whole rule gives %a",
			     (unsigned long long)v + 1, d, (double)psshard_params(&s)[d], (double)want[d]);
		cr_assert_eq(s.opt.t, ref.t);
	}
	cr_assert_eq(s.received, 6 + 3);
	cr_assert_eq(s.applied, 3);
	optim_free(&ref);
	free(want);
	free(acc);
	free(before);
	free(g[0]);
	free(g[1]);
	psshard_free(&s);
}

/* The version before (psshard_keep_prev), for XOR pulls: from the keep on,
 * each piece's values from before its update, for that update's
 * version only and only once every piece in the range has it; nothing
 * after a rewind until the next update; refused outside piece mode. */
Test(psshard, pieces_keep_the_version_before)
{
	static struct config c;
	struct model m;
	struct psshard s;
	char err[256];
	make_config(&c, &m, 2, 0, "", "[model]\ninput = 60\nlayer = dense 800\nlayer = relu\nlayer = dense 10\n");
	size_t P = m.nparams, lo, hi;
	struct shard r = { 0, P };
	cr_assert_eq(psshard_init(&s, &m, &r, &c, 100, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(s.npieces, 4);
	float *g = malloc(P * sizeof(float)), *v1 = malloc(P * sizeof(float));
	cr_assert(g && v1);
	for (size_t i = 0; i < P; i++)
		g[i] = 0.001f * (float)(i % 17) - 0.008f;
	enum psshard_outcome o;
	/* version 0 -> 1 before the keep: nothing kept */
	for (int w = 0; w < 2; w++)
		cr_assert_eq(psshard_push(&s, w, 0, g, &o), 0);
	cr_assert_eq(psshard_version(&s), 1);
	cr_assert_null(psshard_prev(&s, 0, 4, 1));
	cr_assert_eq(psshard_keep_prev(&s), 0);
	cr_assert_eq(psshard_keep_prev(&s), 0, "a second keep changes nothing");
	cr_assert_null(psshard_prev(&s, 0, 4, 1), "kept from the next update on, not before");
	memcpy(v1, psshard_params(&s), P * sizeof(float));
	/* 1 -> 2 piece by piece: piece 1 first */
	psshard_piece_range(&s, 1, &lo, &hi);
	for (int w = 0; w < 2; w++)
		cr_assert_eq(psshard_push_piece(&s, w, 1, 1, g + lo, 0, &o), 0);
	const float *prev = psshard_prev(&s, 1, 2, 2);
	cr_assert_not_null(prev);
	cr_assert_eq(memcmp(prev + lo, v1 + lo, (hi - lo) * sizeof(float)), 0, "piece 1 as it was at version 1");
	cr_assert_null(psshard_prev(&s, 0, 2, 2), "piece 0 is not at 2 yet");
	cr_assert_null(psshard_prev(&s, 1, 2, 1), "only the version its update made");
	for (size_t j = 0; j < 4; j++) {
		if (j == 1)
			continue;
		psshard_piece_range(&s, j, &lo, &hi);
		for (int w = 0; w < 2; w++)
			cr_assert_eq(psshard_push_piece(&s, w, 1, j, g + lo, j == 3, &o), 0);
	}
	cr_assert_eq(psshard_version(&s), 2);
	prev = psshard_prev(&s, 0, 4, 2);
	cr_assert_not_null(prev);
	cr_assert_eq(memcmp(prev, v1, P * sizeof(float)), 0, "the whole shard as it was at version 1");
	cr_assert_neq(memcmp(psshard_params(&s), v1, P * sizeof(float)), 0);
	psshard_rewind(&s, 2);
	cr_assert_null(psshard_prev(&s, 0, 4, 2), "a rewind says nothing of what the pieces held");
	psshard_free(&s);

	make_config(&c, &m, 2, 0, "mode = async\n", MLP);
	r = (struct shard){ 0, m.nparams };
	cr_assert_eq(psshard_init(&s, &m, &r, &c, 100, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(psshard_keep_prev(&s), -EINVAL);
	cr_assert_null(psshard_prev(&s, 0, 1, 1));
	psshard_free(&s);
	free(g);
	free(v1);
}

/* One worker (R = W = 1), 12 pieces: its gradient is stepped where it
 * lies (with SGD at learning rate 1 the pieces are exactly p - g); and
 * psshard_lead_moves, which wakes the streamers, moves only when the
 * leading pieces at the next version grow, and at a rewind: pieces
 * applied past a gap (backward pushes the last layers first) are no news
 * to a streamer waiting on piece 0; psshard_lead says how many lead. */
Test(psshard, one_worker_pieces_and_the_lead_that_wakes_streamers)
{
	static struct config c;
	struct model m;
	struct psshard s;
	char err[256];
	make_config(&c, &m, 1, 0, "optimizer = sgd\nlearning_rate = 1\n",
		    "[model]\ninput = 200\nlayer = dense 900\nlayer = relu\nlayer = dense 10\n");
	size_t P = m.nparams, lo, hi;
	struct shard r = { 0, P };
	cr_assert_eq(psshard_init(&s, &m, &r, &c, 100, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(s.npieces, 12);
	float *g = malloc(P * sizeof(float)), *p0 = malloc(P * sizeof(float));
	cr_assert(g && p0);
	for (size_t i = 0; i < P; i++)
		g[i] = 0.001f * (float)(i % 23) - 0.011f;
	memcpy(p0, psshard_params(&s), P * sizeof(float));
	enum psshard_outcome o;
	uint64_t moves = psshard_lead_moves(&s);
	for (size_t j = 12; j-- > 1;) {
		psshard_piece_range(&s, j, &lo, &hi);
		cr_assert_eq(psshard_push_piece(&s, 0, 0, j, g + lo, 0, &o), 0);
		cr_assert_eq(o, PSSHARD_APPLIED);
		cr_assert_eq(psshard_lead_moves(&s), moves, "piece %zu applied past the gap at 0", j);
	}
	psshard_piece_range(&s, 0, &lo, &hi);
	cr_assert_eq(psshard_push_piece(&s, 0, 0, 0, g + lo, 0, &o), 0);
	cr_assert_eq(psshard_lead_moves(&s), moves + 1, "piece 0 makes all 12 lead");
	cr_assert_eq(psshard_version(&s), 1);
	cr_assert_eq(psshard_lead(&s), 0, "none lead at the new version yet");
	const float *p1 = psshard_params(&s);
	for (size_t i = 0; i < P; i++)
		cr_assert_eq(p1[i], p0[i] - g[i], "value %zu: %a, not %a - %a", i, p1[i], p0[i], g[i]);
	/* in order: the lead grows with every piece */
	moves = psshard_lead_moves(&s);
	for (size_t j = 0; j < 12; j++) {
		psshard_piece_range(&s, j, &lo, &hi);
		cr_assert_eq(psshard_push_piece(&s, 0, 1, j, g + lo, j == 11, &o), 0);
		cr_assert_eq(psshard_lead_moves(&s), moves + j + 1, "after piece %zu", j);
		if (j < 11)
			cr_assert_eq(psshard_lead(&s), j + 1, "after piece %zu", j);
	}
	cr_assert_eq(psshard_version(&s), 2);
	moves = psshard_lead_moves(&s);
	psshard_rewind(&s, 1);
	cr_assert_eq(psshard_lead_moves(&s), moves + 1, "a rewind is news");
	psshard_free(&s);
	free(g);
	free(p0);
}

/* Backup workers (R < W) and async keep the whole-shard rule. */
Test(psshard, pieces_only_when_every_worker_counts)
{
	static struct config c;
	struct model m;
	struct psshard s;
	char err[256];
	const struct {
		int W, R;
		const char *train;
		int pieces;
	} cases[] = { { 2, 2, "", 1 }, { 3, 2, "", 0 }, { 2, 0, "mode = async\n", 0 } };
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		make_config(&c, &m, cases[k].W, cases[k].R, cases[k].train, MLP);
		struct shard r = { 0, m.nparams };
		cr_assert_eq(psshard_init(&s, &m, &r, &c, 100, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(psshard_pieces(&s), cases[k].pieces, "case %zu", k);
		enum psshard_outcome o;
		float g[1] = { 0 };
		if (!cases[k].pieces)
			cr_assert_eq(psshard_push_piece(&s, 0, 0, 0, g, 1, &o), -EINVAL);
		psshard_free(&s);
	}
}

Test(psshard, sum_is_in_worker_index_order)
{
	/* g0 = 1, g1 = -1, g2 = 1e-8: (g0 + g1) + g2 = 1e-8, but arrival order
	 * 2, 1, 0 would give (1e-8 + -1) + 1 = 0 in float. */
	struct psshard s;
	struct model m;
	tiny(&s, &m, 3, 3, "");
	float init[8], g[3][8];
	memcpy(init, psshard_params(&s), sizeof(init));
	fill(g[0], 8, 1.0f);
	fill(g[1], 8, -1.0f);
	fill(g[2], 8, 1e-8f);
	volatile float a = 1e-8f, b = -1.0f, one = 1.0f;
	cr_assert_eq((a + b) + one, 0.0f, "the arrival-order sum must differ for this test to mean anything");
	enum psshard_outcome o;
	for (int w = 2; w >= 0; w--) {
		cr_assert_eq(psshard_push(&s, w, 0, g[w], &o), 0);
		cr_assert_eq(o, w ? PSSHARD_WAITING : PSSHARD_APPLIED);
		cr_assert_eq(psshard_waiting(&s), w ? 3 - w : 0);
	}
	float want = 1e-8f / 3.0f;
	for (int i = 0; i < 8; i++)
		cr_assert_eq(psshard_params(&s)[i], init[i] - want, "p[%d] = %a, want %a", i,
			     (double)psshard_params(&s)[i], (double)(init[i] - want));
	cr_assert_eq(psshard_params(&s)[6], -want);   /* a bias: started at 0 */
	cr_assert_neq(psshard_params(&s)[6], 0.0f);
	cr_assert_eq(psshard_version(&s), 1);
	psshard_free(&s);
}

Test(psshard, sync_stale_duplicate_and_ahead)
{
	struct psshard s;
	struct model m;
	tiny(&s, &m, 2, 2, "");
	float g[8], before[8];
	enum psshard_outcome o = PSSHARD_APPLIED;
	fill(g, 8, 0.5f);

	cr_assert_eq(psshard_push(&s, 1, 0, g, &o), 0);
	cr_assert_eq(o, PSSHARD_WAITING);
	memcpy(before, psshard_params(&s), sizeof(before));
	/* the same worker again for v: an error, nothing changes */
	cr_assert_eq(psshard_push(&s, 1, 0, g, &o), -EALREADY);
	/* ahead of the shard: an error */
	cr_assert_eq(psshard_push(&s, 0, 1, g, &o), -ERANGE);
	/* no such worker */
	cr_assert_eq(psshard_push(&s, 2, 0, g, &o), -EINVAL);
	cr_assert_eq(psshard_push(&s, -1, 0, g, &o), -EINVAL);
	cr_assert_eq(psshard_waiting(&s), 1);
	cr_assert_eq(s.received, 1);
	cr_assert_eq(psshard_version(&s), 0);
	cr_assert_eq(first_diff(psshard_params(&s), before, 8), 8);

	cr_assert_eq(psshard_push(&s, 0, 0, g, &o), 0);
	cr_assert_eq(o, PSSHARD_APPLIED);
	cr_assert_eq(psshard_version(&s), 1);
	for (int i = 0; i < 8; i++)
		cr_assert_eq(psshard_params(&s)[i], before[i] - 0.5f);

	/* version 0 again, from either worker: stale, counted, no change */
	memcpy(before, psshard_params(&s), sizeof(before));
	cr_assert_eq(psshard_push(&s, 0, 0, g, &o), 0);
	cr_assert_eq(o, PSSHARD_STALE);
	cr_assert_eq(psshard_push(&s, 1, 0, g, &o), 0);
	cr_assert_eq(o, PSSHARD_STALE);
	cr_assert_eq(s.dropped_stale, 2);
	cr_assert_eq(psshard_waiting(&s), 0);
	cr_assert_eq(first_diff(psshard_params(&s), before, 8), 8);
	/* and the workers can push for version 1: the bitmap was cleared */
	cr_assert_eq(psshard_push(&s, 1, 1, g, &o), 0);
	cr_assert_eq(o, PSSHARD_WAITING);
	cr_assert_eq(psshard_push(&s, 0, 1, g, &o), 0);
	cr_assert_eq(o, PSSHARD_APPLIED);
	cr_assert_eq(psshard_version(&s), 2);
	cr_assert_eq(s.applied, 2);
	cr_assert_eq(s.received, 6);
	psshard_free(&s);
}

Test(psshard, backup_workers_do_not_count_once_v_moved_on)
{
	/* W = 3, R = 2: the first two distinct workers make the step; the
	 * third (the backup) is stale for v and changes nothing. */
	struct psshard s;
	struct model m;
	tiny(&s, &m, 3, 2, "");
	cr_assert_eq(s.replicas, 2);
	float g[3][8], init[8], after[8];
	for (int w = 0; w < 3; w++)
		for (int i = 0; i < 8; i++)
			g[w][i] = (float)(w + 1) * 0.25f + (float)i * 0.125f;
	memcpy(init, psshard_params(&s), sizeof(init));
	enum psshard_outcome o;
	cr_assert_eq(psshard_push(&s, 2, 0, g[2], &o), 0);
	cr_assert_eq(o, PSSHARD_WAITING);
	cr_assert_eq(psshard_push(&s, 0, 0, g[0], &o), 0);
	cr_assert_eq(o, PSSHARD_APPLIED);
	cr_assert_eq(psshard_version(&s), 1);
	for (int i = 0; i < 8; i++)
		cr_assert_eq(psshard_params(&s)[i], init[i] - (g[0][i] + g[2][i]) / 2.0f, "p[%d]", i);
	memcpy(after, psshard_params(&s), sizeof(after));

	cr_assert_eq(psshard_push(&s, 1, 0, g[1], &o), 0);   /* the slow one */
	cr_assert_eq(o, PSSHARD_STALE);
	cr_assert_eq(s.dropped_stale, 1);
	cr_assert_eq(first_diff(psshard_params(&s), after, 8), 8);
	cr_assert_eq(psshard_version(&s), 1);

	/* version 1: the backup is now among the first two */
	cr_assert_eq(psshard_push(&s, 1, 1, g[1], &o), 0);
	cr_assert_eq(o, PSSHARD_WAITING);
	cr_assert_eq(psshard_push(&s, 2, 1, g[2], &o), 0);
	cr_assert_eq(o, PSSHARD_APPLIED);
	for (int i = 0; i < 8; i++)
		cr_assert_eq(psshard_params(&s)[i], after[i] - (g[1][i] + g[2][i]) / 2.0f, "p[%d]", i);
	cr_assert_eq(psshard_push(&s, 0, 1, g[0], &o), 0);
	cr_assert_eq(o, PSSHARD_STALE);
	cr_assert_eq(s.dropped_stale, 2);
	cr_assert_eq(s.applied, 2);
	psshard_free(&s);
}

Test(psshard, async_applies_on_arrival_with_lr_of_the_version)
{
	/* SGD, lr 1 with warmup 4: the k-th update uses lr (k+1)/4. The
	 * gradients are up to 3 versions old; staleness_lr is off so that
	 * only the schedule shows (the tests below scale). */
	struct psshard s;
	struct model m;
	tiny(&s, &m, 2, 0, "mode = async\nwarmup_steps = 4\nstaleness_lr = false\n");
	cr_assert_eq(s.mode, MODE_ASYNC);
	cr_assert_null(s.slots);
	float g[8], p[8];
	memcpy(p, psshard_params(&s), sizeof(p));
	enum psshard_outcome o;
	/* both workers pulled version 0; each push applies at once */
	for (int k = 0; k < 4; k++) {
		fill(g, 8, (float)(k + 1));
		int w = k % 2;
		cr_assert_eq(psshard_push(&s, w, 0, g, &o), 0);
		cr_assert_eq(o, PSSHARD_APPLIED);
		cr_assert_eq(psshard_version(&s), (uint64_t)k + 1);
		float lr = (float)(k + 1) / 4.0f;
		for (int i = 0; i < 8; i++) {
			p[i] -= lr * g[i];
			cr_assert_eq(psshard_params(&s)[i], p[i], "update %d p[%d] = %a, want %a", k, i,
				     (double)psshard_params(&s)[i], (double)p[i]);
		}
	}
	/* duplicates are fine in async; ahead is still an error */
	cr_assert_eq(psshard_push(&s, 0, 5, g, &o), -ERANGE);
	cr_assert_eq(s.dropped_stale, 0);
	cr_assert_eq(s.applied, 4);
	psshard_free(&s);
}

Test(psshard, async_max_staleness_drops_old_gradients)
{
	struct psshard s;
	struct model m;
	tiny(&s, &m, 2, 0, "mode = async\nmax_staleness = 2\n");
	float g[8], before[8];
	fill(g, 8, 0.25f);
	enum psshard_outcome o;
	/* versions 0, 1, 2 applied from a gradient of version 0: ages 0, 1, 2 */
	for (int k = 0; k < 3; k++) {
		cr_assert_eq(psshard_push(&s, 0, 0, g, &o), 0);
		cr_assert_eq(o, PSSHARD_APPLIED, "age %d", k);
	}
	memcpy(before, psshard_params(&s), sizeof(before));
	/* v = 3: a version-0 gradient is 3 old, over the bound */
	cr_assert_eq(psshard_push(&s, 1, 0, g, &o), 0);
	cr_assert_eq(o, PSSHARD_STALE);
	cr_assert_eq(s.dropped_stale, 1);
	cr_assert_eq(psshard_version(&s), 3);
	cr_assert_eq(first_diff(psshard_params(&s), before, 8), 8);
	/* version 1 is 2 old: applied */
	cr_assert_eq(psshard_push(&s, 1, 1, g, &o), 0);
	cr_assert_eq(o, PSSHARD_APPLIED);
	cr_assert_eq(s.received, 5);
	psshard_free(&s);

	/* max_staleness = 0: no bound, even 1000 versions old */
	tiny(&s, &m, 2, 0, "mode = async\n");
	for (int k = 0; k < 1000; k++)
		cr_assert_eq(psshard_push(&s, 0, 0, g, &o), 0);
	cr_assert_eq(o, PSSHARD_APPLIED);
	cr_assert_eq(s.dropped_stale, 0);
	cr_assert_eq(psshard_version(&s), 1000);
	psshard_free(&s);
}

/* Sync: nothing is applied past the run's last version (backup workers
 * may push there, each shard being at its own version). */
Test(psshard, sync_applies_nothing_past_the_last_step)
{
	struct psshard s;
	struct model m;
	tiny(&s, &m, 2, 1, "");
	s.total = 3;
	float g[8];
	fill(g, 8, 1e-3f);
	enum psshard_outcome o;
	for (uint64_t v = 0; v < 3; v++) {
		cr_assert_eq(psshard_push(&s, 0, v, g, &o), 0);
		cr_assert_eq(o, PSSHARD_APPLIED);
	}
	cr_assert_eq(psshard_push(&s, 1, 3, g, &o), 0);
	cr_assert_eq(o, PSSHARD_STALE, "a push tagged with the last version is past the run");
	cr_assert_eq(psshard_version(&s), 3);
	cr_assert_eq(s.dropped_stale, 1);
	psshard_free(&s);
}

/* p[i] - g[i] * (1 / tau) for sgd with lr 1: what the shard must compute,
 * in the same float operations (g * scale, then p - 1 * that). */
static float sgd_scaled(float p, float g, float tau)
{
	volatile float scale = 1.0f / tau;
	return p - 1.0f * (g * scale);
}

Test(psshard, async_step_is_divided_by_staleness)
{
	/* SGD, lr 1, staleness_lr on by default: a gradient of version t
	 * applied at version v moves p by g / tau, tau = v - t + 1. */
	struct psshard s;
	struct model m;
	tiny(&s, &m, 2, 0, "mode = async\n");
	cr_assert_eq(s.staleness_lr, 1, "staleness_lr must be on by default");
	float g[8], p[8];
	fill(g, 8, 0.75f);
	memcpy(p, psshard_params(&s), sizeof(p));
	enum psshard_outcome o;
	/* {version tag, tau}: v runs 0, 1, ... as each applies */
	static const struct { uint64_t tag; int tau; } pushes[] = {
		{ 0, 1 },   /* v 0: fresh */
		{ 0, 2 },   /* v 1 */
		{ 0, 3 },   /* v 2 */
		{ 3, 1 },   /* v 3: fresh again */
		{ 0, 5 },   /* v 4 */
		{ 0, 6 },   /* v 5 */
		{ 6, 1 },   /* v 6 */
		{ 0, 8 },   /* v 7 */
	};
	for (size_t k = 0; k < sizeof(pushes) / sizeof(pushes[0]); k++) {
		int tau = pushes[k].tau;
		cr_assert_eq(psshard_push(&s, (int)k % 2, pushes[k].tag, g, &o), 0);
		cr_assert_eq(o, PSSHARD_APPLIED);
		for (int i = 0; i < 8; i++) {
			float want = sgd_scaled(p[i], g[i], (float)tau);
			/* tau a power of two: exact, the plain formula too */
			if ((tau & (tau - 1)) == 0)
				cr_assert_eq(want, p[i] - 0.75f / (float)tau);
			cr_assert_eq(psshard_params(&s)[i], want, "push %zu (tau %d) p[%d] = %a, want %a", k,
				     tau, i, (double)psshard_params(&s)[i], (double)want);
			p[i] = want;
		}
	}
	/* the biases started at 0 and saw every step */
	cr_assert_neq(psshard_params(&s)[6], 0.0f);
	cr_assert_eq(s.age_sum, 0 + 1 + 2 + 0 + 4 + 5 + 0 + 7);
	cr_assert_eq(s.age_max, 7);
	psshard_free(&s);
}

Test(psshard, async_staleness_lr_off_applies_the_full_step)
{
	struct psshard s;
	struct model m;
	tiny(&s, &m, 2, 0, "mode = async\nstaleness_lr = false\n");
	cr_assert_eq(s.staleness_lr, 0);
	float g[8], p[8];
	fill(g, 8, 0.75f);
	enum psshard_outcome o;
	for (int k = 0; k < 4; k++) {   /* ages 0..3, all unscaled */
		memcpy(p, psshard_params(&s), sizeof(p));
		cr_assert_eq(psshard_push(&s, k % 2, 0, g, &o), 0);
		for (int i = 0; i < 8; i++)
			cr_assert_eq(psshard_params(&s)[i], p[i] - 0.75f, "age %d p[%d]", k, i);
	}
	cr_assert_eq(s.age_sum, 6, "the ages are counted with the switch off too");
	psshard_free(&s);
}

Test(psshard, async_momentum_keeps_the_scaled_gradient)
{
	/* momentum 0.5, lr 1: a gradient 1 version old (tau 2) enters the
	 * buffer halved, so it is halved in the next step as well. Scaling
	 * the lr instead would give p -= g0 / 2, then p -= 0.5 g0 + g1. */
	struct psshard s;
	struct model m;
	tiny_with(&s, &m, 2, 0, "momentum", "mode = async\nmomentum = 0.5\n");
	float g0[8], g1[8], p[8], buf[8];
	fill(g0, 8, 0.75f);
	fill(g1, 8, -0.25f);
	memcpy(p, psshard_params(&s), sizeof(p));
	enum psshard_outcome o;
	cr_assert_eq(psshard_push(&s, 0, 0, g1, &o), 0);   /* v 0 -> 1, fresh */
	cr_assert_eq(psshard_push(&s, 1, 0, g0, &o), 0);   /* v 1: age 1, tau 2 */
	cr_assert_eq(psshard_push(&s, 0, 2, g1, &o), 0);   /* v 2: fresh */
	for (int i = 0; i < 8; i++) {
		buf[i] = g1[i];
		p[i] -= buf[i];
		buf[i] = 0.5f * buf[i] + g0[i] * 0.5f;
		p[i] -= buf[i];
		buf[i] = 0.5f * buf[i] + g1[i];
		p[i] -= buf[i];
		cr_assert_eq(s.opt.m[i], buf[i], "m[%d] = %a, want %a", i, (double)s.opt.m[i], (double)buf[i]);
		cr_assert_eq(psshard_params(&s)[i], p[i], "p[%d] = %a, want %a", i,
			     (double)psshard_params(&s)[i], (double)p[i]);
	}
	psshard_free(&s);
}

Test(psshard, async_adam_divides_the_step_size)
{
	/* Adam's step does not change when its gradients are scaled, so there
	 * the step size is divided: a gradient of tau 2 does what optim_step
	 * with lr / 2 does on the same state. */
	struct psshard s;
	struct model m;
	tiny_with(&s, &m, 2, 0, "adam", "mode = async\n");
	struct optim ref;
	cr_assert_eq(optim_init(&ref, &s.opt.cfg, 8), 0);
	float g[8], p[8];
	for (int i = 0; i < 8; i++)
		g[i] = 0.125f * (float)(i + 1);
	memcpy(p, psshard_params(&s), sizeof(p));
	enum psshard_outcome o;
	cr_assert_eq(psshard_push(&s, 0, 0, g, &o), 0);   /* fresh */
	optim_step(&ref, p, g, 1.0f);
	cr_assert_eq(first_diff(psshard_params(&s), p, 8), 8);
	cr_assert_eq(psshard_push(&s, 1, 0, g, &o), 0);   /* tau 2 */
	optim_step(&ref, p, g, 0.5f);
	size_t d = first_diff(psshard_params(&s), p, 8);
	cr_assert_eq(d, 8, "p[%zu] = %a, want %a", d, (double)psshard_params(&s)[d % 8], (double)p[d % 8]);
	cr_assert_eq(first_diff(s.opt.m, ref.m, 8), 8, "adam's moments take the unscaled gradient");
	cr_assert_eq(first_diff(s.opt.v, ref.v, 8), 8);
	optim_free(&ref);
	psshard_free(&s);
}

Test(psshard, sync_is_the_same_with_or_without_staleness_lr)
{
	/* Sync averages gradients of version v only; staleness_lr changes
	 * nothing there, bit for bit, with momentum and a stale drop. */
	static const char *const sw[] = { "staleness_lr = true\n", "staleness_lr = false\n" };
	float after[2][8];
	for (int k = 0; k < 2; k++) {
		struct psshard s;
		struct model m;
		tiny_with(&s, &m, 2, 0, "momentum", sw[k]);
		cr_assert_eq(s.staleness_lr, !k);
		float g[2][8];
		enum psshard_outcome o;
		for (int v = 0; v < 3; v++) {
			for (int i = 0; i < 8; i++) {
				g[0][i] = 0.25f * (float)(v + 1);
				g[1][i] = -0.125f * (float)(i + v);
			}
			cr_assert_eq(psshard_push(&s, 1, (uint64_t)v, g[1], &o), 0);
			cr_assert_eq(psshard_push(&s, 0, (uint64_t)v, g[0], &o), 0);
			cr_assert_eq(o, PSSHARD_APPLIED);
			if (v)   /* version v - 1 again: dropped */
				cr_assert_eq(psshard_push(&s, 0, (uint64_t)v - 1, g[0], &o), 0);
		}
		cr_assert_eq(s.dropped_stale, 2);
		memcpy(after[k], psshard_params(&s), sizeof(after[k]));
		psshard_free(&s);
	}
	cr_assert_eq(first_diff(after[0], after[1], 8), 8);
}

Test(psshard, pushes_never_allocate)
{
	/* The allocator's in-use byte count is the same after 3000 pushes (sync
	 * with backups and stale drops, then async) as before. Under ASan,
	 * mallinfo2 is not the allocator in use and reads 0 == 0; the normal
	 * build is the one that checks. */
	static const char *const modes[] = { "", "mode = async\nmax_staleness = 3\n" };
	for (int k = 0; k < 2; k++) {
		struct psshard s;
		struct model m;
		tiny(&s, &m, 4, 3, modes[k]);
		s.total = 1000000;   /* 3000 pushes, all within the run */
		float g[8];
		fill(g, 8, 1e-3f);
		float *slots = s.slots, *params = s.params;
		enum psshard_outcome o;
		int errors = 0;
		size_t before = mallinfo2().uordblks;
		for (int i = 0; i < 3000; i++) {
			uint64_t v = psshard_version(&s);
			uint64_t tag = i % 5 == 4 && v > 4 ? v - 4 : v;
			errors += psshard_push(&s, i % 4, tag, g, &o) != 0;
		}
		size_t after = mallinfo2().uordblks;
		cr_assert_eq(after, before, "%s: %zu bytes in use before 3000 pushes, %zu after",
			     k ? "async" : "sync", before, after);
		cr_assert_eq(errors, 0);
		cr_assert_eq(s.slots, slots);
		cr_assert_eq(s.params, params);
		cr_assert_gt(s.applied, 500);
		cr_assert_gt(s.dropped_stale, 0);
		psshard_free(&s);
	}
}
