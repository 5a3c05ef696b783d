/* Tests of core/nn/factors.c: the rows a ps makes from a run's factors are
 * the worker's own, bit for bit (the worker's gradient made in its flow's
 * row blocks into a zeroed vector, at random shapes, batches and blocks);
 * a run's factor stream is A then the run's columns of dZ; the plan
 * takes whole pieces of a shard inside one dense weight, only where the
 * factors save enough bytes; and the split backward keeps a run's
 * factors, leaves its rows out and makes it values where the factors are
 * not finite. */
#include <criterion/criterion.h>

#include "leak.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../core/config/config.h"
#include "../core/nn/backend.h"
#include "../core/nn/factors.h"
#include "../core/nn/gradflow.h"
#include "../core/nn/layers.h"
#include "../core/nn/optim.h"
#include "../core/nn/replica.h"
#include "../core/nn/rng.h"

TestSuite(factors, .fini = leak_check);

static uint32_t next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return (uint32_t)(*s >> 16);
}

static float uni(uint64_t *s)
{
	return (float)(next(s) % 200001) / 100000.0f - 1.0f;
}

/* The worker's weight gradient (OC, C) made in random row blocks, as its
 * flow does; the ps's rows [r0, r0 + rows) from the factor stream; the
 * same bits. */
Test(factors, expanded_rows_are_the_workers_bits)
{
	uint64_t s = 88172645463325252ull;
	for (int t = 0; t < 40; t++) {
		int B = 1 + (int)(next(&s) % 150), C = 1 + (int)(next(&s) % 300), OC = 1 + (int)(next(&s) % 200);
		float *dz = malloc((size_t)B * OC * sizeof(float)), *a = malloc((size_t)B * C * sizeof(float));
		float *w = calloc((size_t)OC * C, sizeof(float));
		cr_assert(dz && a && w);
		for (size_t i = 0; i < (size_t)B * OC; i++)
			dz[i] = uni(&s) * (next(&s) % 5 == 0 ? 0.0f : 1e-2f);
		for (size_t i = 0; i < (size_t)B * C; i++)
			a[i] = uni(&s) * (next(&s) % 3 == 0 ? 0.0f : 3.0f);
		for (int o = 0; o < OC;) {
			int e = o + 1 + (int)(next(&s) % 37);
			e = e > OC ? OC : e;
			dense_wgrad_rows(w, dz, a, B, C, OC, o, e);
			o = e;
		}
		int r0 = (int)(next(&s) % (unsigned)OC), rows = 1 + (int)(next(&s) % (unsigned)(OC - r0));
		float *fac = malloc((size_t)B * (C + rows) * sizeof(float));
		float *g = malloc((size_t)rows * C * sizeof(float));
		cr_assert(fac && g);
		memcpy(fac, a, (size_t)B * C * sizeof(float));
		for (int b = 0; b < B; b++)
			for (int j = 0; j < rows; j++)
				fac[(size_t)B * C + (size_t)b * rows + j] = dz[(size_t)b * OC + r0 + j];
		factors_expand(g, fac, B, C, rows);
		cr_assert_eq(memcmp(g, w + (size_t)r0 * C, (size_t)rows * C * sizeof(float)), 0,
			     "B %d C %d OC %d rows [%d, %d): the ps's rows differ from the worker's", B, C, OC, r0,
			     r0 + rows);
		free(dz);
		free(a);
		free(w);
		free(fac);
		free(g);
	}
}

static void build(struct config *c, struct model *m, const char *ini)
{
	char err[512];
	cr_assert_eq(config_parse_string(c, "t.ini", ini, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(m, &c->model, err, sizeof(err)), 0, "%s", err);
}

/* 784-512-512-10, batch 128, two shards of pieces of 16384: the first
 * shard is nearly all dense1's weight, the second dense1's last rows,
 * dense2's weight and dense3's. */
static const char *mlp = "[model]\ninput = 784\nlayer = dense 512\nlayer = relu\nlayer = dense 512\n"
			 "layer = relu\nlayer = dense 10\n";

Test(factors, a_plan_is_whole_pieces_inside_a_dense_weight_that_save_bytes)
{
	struct config c;
	struct model m;
	build(&c, &m, mlp);
	struct factors f;
	cr_assert_eq(factors_init(&f, &m, 128), 0);
	size_t P = m.nparams, half = P / 2 + P % 2, piece = 16384;
	factors_begin(&f, 128);
	factors_plan(&f, &m, 0, half, piece, 3.5);
	factors_plan(&f, &m, half, P, piece, 3.5);
	cr_assert_eq(f.n, 2, "%d runs", f.n);
	const struct layer *d1 = &m.layers[0], *d2 = &m.layers[2];
	/* dense1 from the first shard: all of it, its last piece short */
	cr_assert_eq(f.run[0].layer, 0);
	cr_assert_eq(f.run[0].lo, 0);
	cr_assert_eq(f.run[0].hi, half);
	cr_assert_eq(f.run[0].row0, 0);
	cr_assert_eq(f.run[0].rows, (int)((f.run[0].hi + 783) / 784));
	/* dense2 from the second: pieces counted from the shard's begin */
	cr_assert_eq(f.run[1].layer, 2);
	cr_assert_eq((f.run[1].lo - half) % piece, 0);
	cr_assert_geq(f.run[1].lo, d2->woff);
	cr_assert_lt(f.run[1].lo - d2->woff, piece);
	cr_assert_leq(f.run[1].hi, d2->woff + 512 * 512);
	cr_assert_gt(f.run[1].hi + piece, d2->woff + 512 * 512);
	cr_assert_eq(factors_at(&f, f.run[1].lo), &f.run[1]);
	cr_assert_null(factors_at(&f, f.run[1].lo + 1));
	/* a batch as large as the layer saves nothing */
	factors_begin(&f, 600);
	factors_plan(&f, &m, 0, P, piece, 4.0);
	cr_assert_eq(f.n, 0, "%d runs at batch 600", f.n);
	/* nor does a weight with no whole piece in the shard */
	factors_begin(&f, 8);
	factors_plan(&f, &m, d1->woff + 784 * 512 - 100, P, piece, 4.0);
	for (int k = 0; k < f.n; k++)
		cr_assert_neq(f.run[k].layer, 0);
	factors_free(&f);
}

/* The stream: A (B x in), then dZ's columns [row0, row0 + rows), sample
 * by sample; any window of it, little-endian. */
Test(factors, the_stream_is_the_input_then_the_runs_columns)
{
	struct config c;
	struct model m;
	build(&c, &m, "[model]\ninput = 5\nlayer = dense 7\nlayer = dense 3\n");
	struct factors f;
	cr_assert_eq(factors_init(&f, &m, 4), 0);
	factors_begin(&f, 3);
	float dz[3 * 7];
	for (int i = 0; i < 15; i++)
		f.a[0][i] = (float)i + 0.5f;
	for (int i = 0; i < 21; i++)
		dz[i] = -(float)i;
	f.dz[0] = dz;
	struct factor_run r = { .lo = 10, .hi = 25, .layer = 0, .row0 = 2, .rows = 3, .on = 1 };
	size_t n = factors_count(&m, &r, 3);
	cr_assert_eq(n, 3 * (5 + 3));
	uint8_t out[4 * 24];
	factors_write(&f, &m, &r, 0, 10, out);
	factors_write(&f, &m, &r, 10, n, out + 40);
	for (size_t e = 0; e < n; e++) {
		uint32_t u = out[4 * e] | (uint32_t)out[4 * e + 1] << 8 | (uint32_t)out[4 * e + 2] << 16 |
			     (uint32_t)out[4 * e + 3] << 24;
		float v, want = e < 15 ? (float)e + 0.5f : dz[(e - 15) / 3 * 7 + 2 + (e - 15) % 3];
		memcpy(&v, &u, 4);
		cr_assert_eq(v, want, "value %zu: %g, expected %g", e, v, want);
	}
	factors_free(&f);
}

static int mark(void *ctx, size_t lo, size_t hi)
{
	return gradflow_mark(ctx, lo, hi);
}

/* The split backward with a plan (784-512-512-10, batch 16, two shards):
 * every run is final with its factors kept and its whole rows never
 * computed (still zero in the gradient), the rows the ps makes of the
 * factors are the whole step's to float rounding, and the rest of the
 * gradient is too. With a NaN in the data (which reaches every layer),
 * every run is made as values instead, where the flow's check finds the
 * NaN. */
static void split_with_factors(int poison)
{
	char err[512];
	struct config c;
	struct model m;
	cr_assert_eq(config_parse_string(&c, "t.ini", "[train]\nbatch_size = 16\n[model]\ninput = 784\n"
				  "layer = dense 512\nlayer = relu\nlayer = dense 512\nlayer = relu\nlayer = dense 10\n",
				  err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(&m, &c.model, err, sizeof(err)), 0, "%s", err);
	int B = 16;
	size_t P = m.nparams, b[2] = { 0, P / 2 }, e[2] = { P / 2, P };
	float *x = malloc((size_t)B * 784 * sizeof(float)), *p = malloc(P * sizeof(float));
	float *g1 = calloc(P, sizeof(float)), *g2 = calloc(P, sizeof(float));
	int32_t y[16];
	cr_assert(x && p && g1 && g2);
	for (size_t i = 0; i < (size_t)B * 784; i++)
		x[i] = i % 3 ? (float)rng_uniform(7, RNG_DATA, i) : 0.0f;
	if (poison)
		x[5] = NAN;
	for (int i = 0; i < B; i++)
		y[i] = i % 10;
	model_init_params(&m, p, 0, P, 3);
	struct backend be;
	backend_cpu(&be, 1);
	struct replica r1, r2;
	cr_assert_eq(replica_init(&r1, &m, &be, B, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(replica_init(&r2, &m, &be, B, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(replica_flow_init(&r2), 0);
	struct gradflow f;
	cr_assert_eq(gradflow_init(&f, P, 2, b, e, 1 << 16), 0);
	struct factors fx;
	cr_assert_eq(factors_init(&fx, &m, B), 0);
	factors_begin(&fx, B);
	for (int k = 0; k < 2; k++)
		factors_plan(&fx, &m, b[k], e[k], 16384, 3.5);
	cr_assert_geq(fx.n, 2, "%d runs", fx.n); /* at batch 16, dense1's rest on shard 1 too */
	f.fx = &fx;
	uint64_t key = replica_key(1, 5, 0);
	cr_assert_eq(replica_load(&r1, x, y, B), 0);
	cr_assert_eq(replica_train(&r1, p, g1, r1.x, r1.y, B, key, 1.0f / B), 0);
	cr_assert_eq(replica_load(&r2, x, y, B), 0);
	cr_assert_eq(replica_train_flow(&r2, p, g2, r2.x, r2.y, B, key, 1.0f / B, &f, mark, &f), 0);
	cr_assert(gradflow_complete(&f));
	float gmax = 0;
	for (size_t i = 0; i < P; i++)
		gmax = isfinite(g1[i]) ? fmaxf(gmax, fabsf(g1[i])) : gmax;
	for (int k = 0; k < fx.n; k++) {
		const struct factor_run *r = &fx.run[k];
		const struct layer *l = &m.layers[r->layer];
		if (poison) { /* the NaN reaches every layer's input or output gradient */
			cr_assert_eq(r->on, 0, "run %d kept factors with a NaN in them", k);
			continue;
		}
		cr_assert_eq(r->on, 1, "run %d", k);
		size_t n = factors_count(&m, r, B), C = (size_t)l->in;
		uint8_t *bytes = malloc(4 * n);
		float *fac = malloc(n * sizeof(float)), *rows = malloc((size_t)r->rows * C * sizeof(float));
		cr_assert(bytes && fac && rows);
		factors_write(&fx, &m, r, 0, n, bytes);
		memcpy(fac, bytes, 4 * n); /* little-endian float32: this host's */
		factors_expand(rows, fac, B, l->in, r->rows);
		size_t first = l->woff + (size_t)r->row0 * C;
		for (size_t i = r->lo; i < r->hi; i++) {
			cr_assert_leq(fabsf(rows[i - first] - g1[i]), 1e-5f * fabsf(g1[i]) + 1e-6f * gmax,
				      "run %d, parameter %zu: %g from the factors, %g whole", k, i,
				      (double)rows[i - first], (double)g1[i]);
			size_t row = (i - l->woff) / C;
			if (l->woff + row * C >= r->lo && l->woff + (row + 1) * C <= r->hi)
				cr_assert_eq(g2[i], 0.0f, "parameter %zu of a run's whole row was computed", i);
		}
		free(bytes);
		free(fac);
		free(rows);
	}
	/* the rest: made as values, the whole step's */
	for (size_t i = 0; i < P; i++) {
		int in_run = 0;
		for (int k = 0; k < fx.n; k++)
			in_run |= fx.run[k].on && i >= fx.run[k].lo && i < fx.run[k].hi;
		if (in_run || !isfinite(g1[i]))
			continue;
		cr_assert_leq(fabsf(g1[i] - g2[i]), 1e-5f * fabsf(g1[i]) + 1e-6f * gmax,
			      "parameter %zu: %g split, %g whole", i, (double)g2[i], (double)g1[i]);
	}
	if (poison)
		cr_assert_lt(optim_nonfinite(g2, P), P, "the NaN did not reach the values the flow checks");
	factors_free(&fx);
	gradflow_free(&f);
	replica_free(&r1);
	replica_free(&r2);
	free(x);
	free(p);
	free(g1);
	free(g2);
}

Test(factors, the_split_backward_keeps_a_runs_factors_and_leaves_its_rows_out)
{
	split_with_factors(0);
}

Test(factors, factors_that_are_not_finite_go_as_values)
{
	split_with_factors(1);
}
