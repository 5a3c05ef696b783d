/* The embedding layer's parts on their own: the row function (pinned), the
 * initial values, a batch's plan, the CPU kernels against hand-worked
 * multi-valued cases, finite differences and an independent order of sums,
 * the sigmoid cross-entropy, and the sparse optimizers against dense ones
 * applied to the same rows. */
#include <criterion/criterion.h>

#include "gradcheck.h"
#include "leak.h"

#include "../core/data/dataset.h"
#include "../core/nn/embed.h"
#include "../core/nn/embed_plan.h"
#include "../core/nn/layers.h"
#include "../core/nn/optim.h"
#include "../core/nn/sparse_optim.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void seed_rng(void)
{
	gradcheck_seed(0x5eed0039ULL);
}

TestSuite(embed, .init = seed_rng, .fini = leak_check);

Test(embed, row_function_is_pinned)
{
	/* splitmix64's first output for 0 is the classic 0xe220a8397b1dcdaf:
	 * the function is the documented one, and must never change (the rows
	 * of every table, shard and checkpoint depend on it). */
	cr_assert_eq(embed_hash(0, 0), 0xe220a8397b1dcdafULL);
	cr_assert_eq(embed_hash(1, 0), 0x910a2dec89025cc1ULL);
	cr_assert_eq(embed_hash(0, 1), 0xc42c5a1aa3820138ULL);
	cr_assert_eq(embed_hash(0x68fd1e64, 25), 0xd072423b79495ae8ULL);
	cr_assert_eq(embed_hash(0xfffffffe, 3), 0x65aeebb85d7c33e1ULL);

	struct embed_spec per = { .fields = 26, .rows = 100000, .dim = 8 };
	struct embed_spec shared = per;
	shared.shared = 1;
	cr_assert_eq(embed_total_rows(&per), 2600000);
	cr_assert_eq(embed_total_rows(&shared), 100000);
	cr_assert_eq(embed_row(&per, 0, 0), 7535);
	cr_assert_eq(embed_row(&per, 25, 0x68fd1e64), 25ULL * 100000 + 79688);
	cr_assert_eq(embed_row(&shared, 25, 0x68fd1e64), 79688);
	cr_assert_eq(embed_row(&shared, 1, 0), 56, "the field takes part in a shared table's hash");
}

Test(embed, initial_rows_are_a_function_of_the_row)
{
	struct embed_spec s = { .fields = 3, .rows = 50, .dim = 5 };
	size_t R = embed_total_rows(&s), n = R * 5;
	float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
	embed_init_rows(&s, a, 0, R, 9);
	/* Any split of the rows (ps shards) gives the same table. */
	uint64_t cuts[] = { 0, 1, 49, 50, 51, 149, 150 };
	for (size_t i = 0; i + 1 < sizeof(cuts) / sizeof(cuts[0]); i++)
		embed_init_rows(&s, b + cuts[i] * 5, cuts[i], cuts[i + 1], 9);
	cr_assert(memcmp(a, b, n * sizeof(float)) == 0, "a split init differs from a whole one");
	double lo = 1, hi = -1;
	for (size_t i = 0; i < n; i++) {
		lo = fmin(lo, a[i]);
		hi = fmax(hi, a[i]);
	}
	cr_assert(lo >= -EMBED_INIT && hi <= EMBED_INIT && hi - lo > 1.5 * EMBED_INIT, "range [%g, %g]", lo, hi);
	embed_init_rows(&s, b, 0, R, 10);
	cr_assert(memcmp(a, b, n * sizeof(float)) != 0, "another seed, another table");
	free(a);
	free(b);
}

/* A batch of 2 samples x 3 fields whose lists are
 *   (0,0): 5 5 7   (0,1): -      (0,2): 9
 *   (1,0): 7       (1,1): 3 NONE (1,2): 5
 * over a shared table, so that rows repeat across fields only when the
 * field hash agrees: the plan is checked against rows computed here. */
static const uint32_t multi_seg[7] = { 0, 3, 3, 4, 5, 7, 8 };
static const uint32_t multi_ids[8] = { 5, 5, 7, 9, 7, 3, DATA_ID_NONE, 5 };

Test(embed, plan_of_a_multi_valued_batch)
{
	struct embed_spec s = { .fields = 3, .rows = 1000, .dim = 2, .shared = 1 };
	struct embed_plan p;
	cr_assert_eq(embed_plan_init(&p, 6, 8), 0);
	cr_assert_eq(embed_plan_build(&p, &s, multi_seg, multi_ids, 2), 0);
	cr_assert_eq(p.nnz, 7, "the NONE adds no entry");
	uint32_t want_off[7] = { 0, 3, 3, 4, 5, 6, 7 };
	cr_assert(memcmp(p.off, want_off, sizeof(want_off)) == 0);
	/* Each entry's row through idx is the row of its (field, ID). */
	int fields[7] = { 0, 0, 0, 2, 0, 1, 2 };
	uint32_t ids[7] = { 5, 5, 7, 9, 7, 3, 5 };
	for (int k = 0; k < 7; k++)
		cr_assert_eq(p.rows[p.idx[k]], embed_row(&s, fields[k], ids[k]), "entry %d", k);
	/* Rows unique and ascending; each row's entries ascending and its own. */
	for (size_t k = 1; k < p.u; k++)
		cr_assert_lt(p.rows[k - 1], p.rows[k]);
	cr_assert_eq(p.roff[0], 0);
	cr_assert_eq(p.roff[p.u], 7);
	size_t seen = 0;
	for (size_t k = 0; k < p.u; k++)
		for (uint32_t j = p.roff[k]; j < p.roff[k + 1]; j++, seen++) {
			if (j > p.roff[k])
				cr_assert_leq(p.rseg[j - 1], p.rseg[j], "row %zu: entries out of order", k);
			uint32_t t = p.rseg[j];
			int found = 0;
			for (uint32_t e = p.off[t]; e < p.off[t + 1]; e++)
				found |= p.idx[e] == k;
			cr_assert(found, "row %zu lists segment %u, which does not hold it", k, t);
		}
	cr_assert_eq(seen, 7);
	/* (0,0) holds 5 twice: its row lists that segment twice. */
	uint32_t k5 = p.idx[0], twice = 0;
	for (uint32_t j = p.roff[k5]; j < p.roff[k5 + 1]; j++)
		twice += p.rseg[j] == 0;
	cr_assert_eq(twice, 2);

	/* Capacity and a list that goes backwards are refused. */
	cr_assert_eq(embed_plan_build(&p, &s, multi_seg, multi_ids, 3), -EINVAL, "9 segments > 6");
	uint32_t back[7] = { 0, 3, 2, 4, 5, 7, 8 };
	cr_assert_eq(embed_plan_build(&p, &s, back, multi_ids, 2), -EINVAL);
	struct embed_plan small;
	cr_assert_eq(embed_plan_init(&small, 6, 6), 0);
	cr_assert_eq(embed_plan_build(&small, &s, multi_seg, multi_ids, 2), -EINVAL, "7 IDs > 6");
	embed_plan_free(&small);
	embed_plan_free(&p);
}

Test(embed, plan_of_one_id_per_field_over_large_tables)
{
	/* Rows past 2^32 (3 passes of the radix sort) keep their order. */
	struct embed_spec s = { .fields = 4, .rows = 2000000000, .dim = 1 };
	uint32_t ids[3 * 4] = { 1, 2, 3, 4, 1, DATA_ID_NONE, 3, 8, 1, 2, 3, 4 };
	struct embed_plan p;
	cr_assert_eq(embed_plan_init(&p, 12, 12), 0);
	cr_assert_eq(embed_plan_build(&p, &s, NULL, ids, 3), 0);
	cr_assert_eq(p.nnz, 11);
	cr_assert_eq(p.u, 5, "fields 0 and 2 repeat (3 times), 1 twice, 3 has 4 and 8");
	for (size_t k = 1; k < p.u; k++)
		cr_assert_lt(p.rows[k - 1], p.rows[k]);
	cr_assert_gt(p.rows[p.u - 1], (uint64_t)1 << 32);
	for (int t = 0, k = 0; t < 12; t++)
		if (ids[t] != DATA_ID_NONE)
			cr_assert_eq(p.rows[p.idx[k++]], embed_row(&s, t % 4, ids[t]));
	embed_plan_free(&p);
}

/* The multi-valued batch over a table whose rows are worked by hand:
 * U[k] = (10k + 1, 10k + 2) for the plan's k-th row. */
Test(embed, forward_pools_by_hand)
{
	struct embed_spec s = { .fields = 3, .rows = 1000, .dim = 2, .shared = 1 };
	struct embed_plan p;
	cr_assert_eq(embed_plan_init(&p, 6, 8), 0);
	cr_assert_eq(embed_plan_build(&p, &s, multi_seg, multi_ids, 2), 0);
	float U[16];
	for (size_t k = 0; k < p.u; k++) {
		U[2 * k] = 10.0f * k + 1;
		U[2 * k + 1] = 10.0f * k + 2;
	}
	float x[2 * 2] = { 0.5f, -1.0f, 2.0f, 3.0f }, out[2 * 8];
	for (int pool = 0; pool < 2; pool++) {
		nan_fill(out, 16);
		embed_forward(out, x, U, p.off, p.idx, 2, 3, 2, 2, (enum embed_pool)pool);
		for (int t = 0; t < 6; t++) {
			float want[2] = { 0, 0 };
			uint32_t n = p.off[t + 1] - p.off[t];
			for (uint32_t e = p.off[t]; e < p.off[t + 1]; e++)
				for (int d = 0; d < 2; d++)
					want[d] += U[2 * p.idx[e] + d];
			for (int d = 0; d < 2; d++) {
				if (pool == EMBED_MEAN && n)
					want[d] /= (float)n;
				cr_assert_eq(out[(t / 3) * 8 + (t % 3) * 2 + d], want[d], "pool %d segment %d", pool, t);
			}
		}
		cr_assert(out[2] == 0.0f && out[3] == 0.0f, "an empty field pools to 0");
		cr_assert_eq(out[6], 0.5f);
		cr_assert_eq(out[7], -1.0f);
		cr_assert_eq(out[14], 2.0f);
		cr_assert_eq(out[15], 3.0f, "the numeric features follow the fields");
	}
	/* (0,0) = rows of 5, 5, 7: the sum counts 5 twice. */
	uint32_t k5 = p.idx[0], k7 = p.idx[2];
	embed_forward(out, x, U, p.off, p.idx, 2, 3, 2, 2, EMBED_SUM);
	cr_assert_eq(out[0], 2 * U[2 * k5] + U[2 * k7]);
	embed_forward(out, x, U, p.off, p.idx, 2, 3, 2, 2, EMBED_MEAN);
	cr_assert_eq(out[0], (2 * U[2 * k5] + U[2 * k7]) / 3.0f);
	embed_plan_free(&p);
}

struct fwd_ctx {
	const struct embed_plan *p;
	float *U;
	const float *x, *w;
	int B, F, D, DIM;
	enum embed_pool pool;
	float *out;
};

/* sum(out * w): its gradient in out is w. */
static double fwd_objective(void *arg)
{
	struct fwd_ctx *c = arg;
	embed_forward(c->out, c->x, c->U, c->p->off, c->p->idx, c->B, c->F, c->D, c->DIM, c->pool);
	return dot_double(c->out, c->w, (size_t)c->B * ((size_t)c->F * c->DIM + c->D));
}

/* Random multi-valued lists: 0 to 3 IDs from a small range per segment
 * (repeats within and across segments), some NONE. */
static void random_lists(uint32_t *seg, uint32_t *ids, int nseg)
{
	int n = 0;
	seg[0] = 0;
	for (int t = 0; t < nseg; t++) {
		int c = (int)((rand_uniform() + 1) * 2);   // 0..3
		for (int i = 0; i < c; i++)
			ids[n++] = rand_uniform() > 0.9 ? DATA_ID_NONE : (uint32_t)((rand_uniform() + 1) * 4);
		seg[t + 1] = (uint32_t)n;
	}
}

/* p: the plan of B samples of s's fields over random_lists. */
static void random_plan(struct embed_plan *p, const struct embed_spec *s, int B)
{
	int nseg = B * s->fields;
	uint32_t *seg = malloc((size_t)(nseg + 1) * sizeof(uint32_t)), *ids = malloc((size_t)nseg * 3 * sizeof(uint32_t));
	cr_assert(seg && ids);
	random_lists(seg, ids, nseg);
	cr_assert_eq(embed_plan_init(p, (size_t)nseg, (size_t)nseg * 3), 0);
	cr_assert_eq(embed_plan_build(p, s, seg, ids, B), 0);
	free(seg);
	free(ids);
}

Test(embed, backward_matches_finite_differences)
{
	enum { B = 5, F = 3, D = 2, DIM = 4 };
	struct embed_spec s = { .fields = F, .rows = 6, .dim = DIM };
	struct embed_plan p;
	random_plan(&p, &s, B);
	size_t ld = F * DIM + D;
	for (int pool = 0; pool < 2; pool++) {
		float *U = rand_array(p.u * DIM, 1.0), *x = rand_array(B * D, 1.0), *w = rand_array(B * ld, 1.0);
		float *dU = rand_array(p.u * DIM, 1.0), *out = zero_array(B * ld);
		nan_fill(dU, p.u * DIM);
		embed_backward(dU, w, p.roff, p.rseg, p.off, p.u, F, D, DIM, (enum embed_pool)pool);
		struct fwd_ctx c = { &p, U, x, w, B, F, D, DIM, (enum embed_pool)pool, out };
		check_grad(pool ? "embedding (mean)" : "embedding (sum)", U, dU, p.u * DIM, 1e-2, fwd_objective, &c);
		free(U);
		free(x);
		free(w);
		free(dU);
		free(out);
	}
	embed_plan_free(&p);
}

Test(embed, backward_adds_in_ascending_entry_order)
{
	/* Many entries per row over a handful of rows, with values of very
	 * different sizes, so that another order of the sums would round
	 * differently; the reference scatters every entry into its row in
	 * entry order, which must be the kernel's result bit for bit. */
	enum { B = 64, F = 4, D = 1, DIM = 3, NSEG = B * F };
	struct embed_spec s = { .fields = F, .rows = 3, .dim = DIM, .shared = 1 };
	struct embed_plan p;
	random_plan(&p, &s, B);
	size_t ld = F * DIM + D;
	float *dout = rand_array(B * ld, 1.0);
	for (size_t i = 0; i < B * ld; i++)
		dout[i] *= powf(10.0f, (float)(i % 7) - 3.0f);
	for (int pool = 0; pool < 2; pool++) {
		float *dU = zero_array(p.u * DIM), *ref = zero_array(p.u * DIM);
		embed_backward(dU, dout, p.roff, p.rseg, p.off, p.u, F, D, DIM, (enum embed_pool)pool);
		for (int t = 0; t < NSEG; t++) {
			uint32_t n = p.off[t + 1] - p.off[t];
			for (uint32_t e = p.off[t]; e < p.off[t + 1]; e++)
				for (int d = 0; d < DIM; d++) {
					float g = dout[(t / F) * ld + (t % F) * DIM + d];
					ref[p.idx[e] * DIM + d] += pool == EMBED_MEAN && n > 1 ? g / (float)n : g;
				}
		}
		cr_assert(memcmp(dU, ref, p.u * DIM * sizeof(float)) == 0, "pool %d: not the entry order's sums", pool);
		free(dU);
		free(ref);
	}
	free(dout);
	embed_plan_free(&p);
}

Test(embed, gather_copies_the_listed_rows)
{
	float table[5 * 3];
	for (int i = 0; i < 15; i++)
		table[i] = (float)i;
	uint64_t rows[3] = { 4, 0, 2 };
	float U[9];
	embed_gather_rows(U, table, rows, 3, 3);
	float want[9] = { 12, 13, 14, 0, 1, 2, 6, 7, 8 };
	cr_assert(memcmp(U, want, sizeof(want)) == 0);
}

struct bce_ctx {
	float *z, *p;
	const int32_t *y;
	int B;
	float scale;
};

static double bce_objective(void *arg)
{
	struct bce_ctx *c = arg;
	return c->scale * sigmoid_xent_forward(c->p, NULL, c->z, c->y, c->B);
}

Test(embed, sigmoid_cross_entropy)
{
	enum { B = 9 };
	int32_t y[B] = { 0, 1, 1, 0, 1, 0, 0, 1, 1 };
	float *z = rand_array(B, 3.0), *p = zero_array(B), *g = zero_array(B);
	sigmoid_xent_forward(p, NULL, z, y, B);
	sigmoid_xent_backward(g, p, y, B, 1.0f / B);
	struct bce_ctx c = { z, zero_array(B), y, B, 1.0f / B };
	check_grad("sigmoid cross-entropy", z, g, B, 1e-2, bce_objective, &c);
	free(c.p);

	/* Far from 0 in float the probability rounds to 0 or 1; the loss
	 * stays finite and right (from the logit), as does the count. */
	float zz[4] = { 100.0f, -100.0f, 100.0f, 0.0f };
	int32_t yy[4] = { 1, 1, 0, 0 };
	float pp[4];
	int right = -1;
	double l = sigmoid_xent_forward(pp, &right, zz, yy, 4);
	cr_assert(fabs(l - (100.0 + 100.0 + log(2.0))) < 1e-9, "loss %.12g", l);
	cr_assert_eq(right, 2, "100 -> 1 is right, -100 -> 1 and 100 -> 0 wrong, 0 -> 0 right");
	cr_assert_eq(pp[0], 1.0f);
	cr_assert_eq(pp[3], 0.5f);
	sigmoid_xent_backward(pp, pp, yy, 4, 0.5f);
	cr_assert_eq(pp[1], -0.5f, "aliasing: probs in, gradient out");
	free(z);
	free(p);
	free(g);
}

/* Three steps over overlapping sets of rows of a 7-row table. */
static const uint64_t step_rows[3][4] = { { 0, 3, 6, 0 }, { 3, 4, 0, 0 }, { 1, 3, 6, 0 } };
static const size_t step_u[3] = { 3, 2, 3 };

/* Random gradients g of the three steps and a random table w (7, 5),
 * copied into w0 and ref. */
static void sparse_start(float g[3][4 * 5], float *w, float *w0, float *ref)
{
	for (int s = 0; s < 3; s++)
		for (int i = 0; i < 20; i++)
			g[s][i] = (float)rand_uniform();
	for (int i = 0; i < 35; i++)
		w[i] = w0[i] = ref[i] = (float)rand_uniform();
}

static void sparse_run(enum sparse_kind kind, float *w, struct sparse_optim *o, float g[3][4 * 5])
{
	struct sparse_config c = { .kind = kind, .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f };
	cr_assert_eq(sparse_optim_init(o, &c, 7, 5), 0);
	for (int s = 0; s < 3; s++)
		sparse_optim_step(o, w, step_rows[s], g[s], step_u[s], 0.1f);
	cr_assert_eq(o->t, 3);
}

Test(embed, adagrad_updates_only_the_touched_rows)
{
	float g[3][4 * 5], w[7 * 5], w0[7 * 5], ref[7 * 5], acc[7 * 5];
	sparse_start(g, w, w0, ref);
	for (int i = 0; i < 35; i++)
		acc[i] = SPARSE_ADAGRAD_INIT;
	struct sparse_optim o;
	sparse_run(SPARSE_ADAGRAD, w, &o, g);
	/* The reference: dense Adagrad over each step's rows as a matrix. */
	for (int s = 0; s < 3; s++)
		for (size_t k = 0; k < step_u[s]; k++)
			for (int d = 0; d < 5; d++) {
				size_t i = step_rows[s][k] * 5 + d;
				float gd = g[s][k * 5 + d];
				acc[i] += gd * gd;
				ref[i] -= 0.1f * gd / (sqrtf(acc[i]) + SPARSE_ADAGRAD_EPS);
			}
	cr_assert(memcmp(w, ref, sizeof(w)) == 0, "adagrad rows differ from the dense rule's");
	cr_assert(memcmp(o.m, acc, sizeof(acc)) == 0, "accumulators differ");
	for (int d = 0; d < 5; d++) {
		cr_assert_eq(w[2 * 5 + d], w0[2 * 5 + d], "row 2 was never touched");
		cr_assert_eq(w[5 * 5 + d], w0[5 * 5 + d], "row 5 was never touched");
		cr_assert_eq(o.m[2 * 5 + d], SPARSE_ADAGRAD_INIT);
	}
	sparse_optim_free(&o);
}

Test(embed, lazy_adam_is_adam_on_the_touched_rows)
{
	float g[3][4 * 5], w[7 * 5], w0[7 * 5], ref[7 * 5], m[7 * 5] = { 0 }, v[7 * 5] = { 0 };
	sparse_start(g, w, w0, ref);
	struct sparse_optim o;
	sparse_run(SPARSE_LAZY_ADAM, w, &o, g);
	/* The reference: optim.h's adam over each step's rows gathered into a
	 * dense block, at the step's t, then scattered back. */
	struct optim_config oc = { .kind = OPTIM_ADAM, .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f };
	for (int s = 0; s < 3; s++) {
		size_t n = step_u[s] * 5;
		float bp[20], bm[20], bv[20];
		struct optim a;
		cr_assert_eq(optim_init(&a, &oc, n), 0);
		for (size_t k = 0; k < step_u[s]; k++) {
			memcpy(bp + k * 5, ref + step_rows[s][k] * 5, 5 * sizeof(float));
			memcpy(a.m + k * 5, m + step_rows[s][k] * 5, 5 * sizeof(float));
			memcpy(a.v + k * 5, v + step_rows[s][k] * 5, 5 * sizeof(float));
		}
		a.t = s;
		optim_step(&a, bp, g[s], 0.1f);
		memcpy(bm, a.m, n * sizeof(float));
		memcpy(bv, a.v, n * sizeof(float));
		for (size_t k = 0; k < step_u[s]; k++) {
			memcpy(ref + step_rows[s][k] * 5, bp + k * 5, 5 * sizeof(float));
			memcpy(m + step_rows[s][k] * 5, bm + k * 5, 5 * sizeof(float));
			memcpy(v + step_rows[s][k] * 5, bv + k * 5, 5 * sizeof(float));
		}
		optim_free(&a);
	}
	cr_assert(memcmp(w, ref, sizeof(w)) == 0, "lazy adam's rows differ from adam's, bit for bit");
	cr_assert(memcmp(o.m, m, sizeof(m)) == 0 && memcmp(o.v, v, sizeof(v)) == 0, "moments differ");
	for (int d = 0; d < 5; d++) {
		cr_assert_eq(w[2 * 5 + d], w0[2 * 5 + d], "row 2 was never touched");
		cr_assert_eq(o.m[5 * 5 + d], 0.0f, "row 5's moments never decay or move");
	}
	sparse_optim_free(&o);
}
