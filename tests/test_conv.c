/* Tests of the spatial kernels (core/nn/conv.c, core/nn/pool.c), batchnorm and
 * dropout: finite-difference gradient checks as in test_layers.c (objective
 * L = sum(out * R), fourth-order central differences in float32 with h a
 * power of two), conv against a naive float64 reference on shapes large
 * enough to be split into several chunks, and the behaviour of dropout and
 * batchnorm in training and evaluation. */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include "leak.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/nn/backend.h"
#include "gradcheck.h"
#include "../core/nn/layers.h"
#include "../core/nn/rng.h"

/* The seed these tests have always drawn from. */
static void seed(void)
{
	gradcheck_seed(0x5eed5eedULL);
}

TestSuite(conv, .init = seed, .fini = leak_check);

/* ---- conv ---------------------------------------------------------------- */

struct conv_ctx {
	float *out, *col, *inp, *weight, *bias, *R;
	int B, OC;
	struct window w;
};

static size_t conv_out_n(const struct conv_ctx *c)
{
	return (size_t)c->B * c->OC * c->w.OH * c->w.OW;
}

static double conv_objective(void *p)
{
	struct conv_ctx *c = p;
	conv_forward(c->out, c->col, c->inp, c->weight, c->bias, c->B, c->OC, &c->w);
	return dot_double(c->out, c->R, conv_out_n(c));
}

static void conv_gradcheck(int B, int C, int H, int W, int OC, int K, int S, int P)
{
	struct conv_ctx c = { .B = B, .OC = OC, .w = { .C = C, .H = H, .W = W, .K = K, .S = S, .P = P } };
	cr_assert_eq(window_init(&c.w), 0);
	size_t nin = (size_t)B * C * H * W, nw = (size_t)OC * C * K * K;
	c.inp = rand_array(nin, 1.0);
	c.weight = rand_array(nw, 0.5);
	c.bias = rand_array((size_t)OC, 0.5);
	c.out = zero_array(conv_out_n(&c));
	c.R = rand_array(conv_out_n(&c), 1.0);
	c.col = zero_array(conv_col_size(&c.w, OC, B));
	float *dinp = zero_array(nin), *dw = zero_array(nw), *db = zero_array((size_t)OC);
	nan_fill(dinp, nin);   /* dinp is set, never read */
	conv_backward(dinp, dw, db, c.col, c.R, c.inp, c.weight, B, OC, &c.w);
	char what[96];
	snprintf(what, sizeof(what), "conv B%d C%d %dx%d OC%d K%d S%d P%d", B, C, H, W, OC, K, S, P);
	double h = 0x1p-5;
	char name[128];
	snprintf(name, sizeof(name), "%s dinp", what);
	check_grad(name, c.inp, dinp, nin, h, conv_objective, &c);
	snprintf(name, sizeof(name), "%s dweight", what);
	check_grad(name, c.weight, dw, nw, h, conv_objective, &c);
	snprintf(name, sizeof(name), "%s dbias", what);
	check_grad(name, c.bias, db, (size_t)OC, h, conv_objective, &c);
	free(c.inp); free(c.weight); free(c.bias); free(c.out); free(c.R); free(c.col);
	free(dinp); free(dw); free(db);
}

Test(conv, gradcheck_strides_and_padding)
{
	static const int shapes[][8] = {
		/* B  C  H  W OC  K  S  P */
		{ 2, 3, 5, 5, 4, 3, 1, 1 },   /* "same" 3x3 */
		{ 2, 2, 6, 6, 3, 5, 1, 2 },   /* "same" 5x5 */
		{ 2, 2, 7, 6, 3, 3, 2, 0 },   /* stride 2, odd and non-square input */
		{ 1, 3, 7, 7, 2, 3, 2, 1 },   /* stride 2 with padding */
		{ 2, 2, 5, 4, 3, 1, 1, 0 },   /* pointwise */
		{ 1, 2, 9, 8, 2, 4, 3, 2 },   /* even kernel, stride 3 */
		{ 3, 1, 4, 4, 2, 4, 1, 0 },   /* kernel as large as the input */
	};
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		const int *s = shapes[i];
		conv_gradcheck(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]);
	}
}

/* Direct convolution in double: out (B, OC, OH, OW). */
static void conv_naive(double *out, const float *inp, const float *weight, const float *bias,
		       int B, int OC, const struct window *w)
{
	for (int b = 0; b < B; b++)
		for (int o = 0; o < OC; o++)
			for (int oh = 0; oh < w->OH; oh++)
				for (int ow = 0; ow < w->OW; ow++) {
					double s = bias[o];
					for (int c = 0; c < w->C; c++)
						for (int kh = 0; kh < w->K; kh++)
							for (int kw = 0; kw < w->K; kw++) {
								int ih = oh * w->S - w->P + kh, iw = ow * w->S - w->P + kw;
								if (ih < 0 || ih >= w->H || iw < 0 || iw >= w->W)
									continue;
								s += (double)inp[(((size_t)b * w->C + c) * w->H + ih) * w->W + iw] *
								     weight[(((size_t)o * w->C + c) * w->K + kh) * w->K + kw];
							}
					out[(((size_t)b * OC + o) * w->OH + oh) * w->OW + ow] = s;
				}
}

/* Shapes whose scratch exceeds one chunk, so the slicing and chunking are
 * exercised: forward against the naive loop, and backward's dinp and
 * dweight against the adjoint identities <dout, conv(x)> = <dinp, x> and
 * <dout, conv_w(x)> = <dweight, w> (conv is linear in each). */
Test(conv, chunked_matches_naive)
{
	static const int shapes[][8] = {
		{ 11, 64, 40, 40, 4, 5, 1, 2 },   /* 8 slices of 1-2 samples, a chunk per sample */
		{ 13, 64, 48, 47, 4, 5, 2, 2 },
		{ 45, 1, 28, 28, 32, 5, 1, 2 },   /* slices of 5-6: chunks of 5, or 2 of 3 */
	};
	for (size_t t = 0; t < sizeof(shapes) / sizeof(shapes[0]); t++) {
		const int *s = shapes[t];
		int B = s[0], OC = s[4];
		struct window w = { .C = s[1], .H = s[2], .W = s[3], .K = s[5], .S = s[6], .P = s[7] };
		cr_assert_eq(window_init(&w), 0);
		size_t nin = (size_t)B * w.C * w.H * w.W, nw = (size_t)OC * w.C * w.K * w.K;
		size_t nout = (size_t)B * OC * w.OH * w.OW;
		size_t ncol = conv_col_size(&w, OC, B);
		size_t per = ((size_t)w.C * w.K * w.K + OC) * w.OH * w.OW;
		cr_assert(ncol < per * (size_t)B, "shape %zu does not split into chunks", t);
		float *inp = rand_array(nin, 1.0), *weight = rand_array(nw, 0.2), *zero = zero_array((size_t)OC);
		float *bias = rand_array((size_t)OC, 0.5), *out = zero_array(nout), *col = zero_array(ncol);
		double *ref = malloc(nout * sizeof(double));
		cr_assert(ref);
		conv_forward(out, col, inp, weight, bias, B, OC, &w);
		conv_naive(ref, inp, weight, bias, B, OC, &w);
		/* Errors relative to the largest output: sums of C*K*K float
		 * products cancel, so small outputs carry the big ones' rounding. */
		double worst = 0, big = 0;
		for (size_t i = 0; i < nout; i++) {
			if (fabs(out[i] - ref[i]) > worst)
				worst = fabs(out[i] - ref[i]);
			if (fabs(ref[i]) > big)
				big = fabs(ref[i]);
		}
		cr_assert_lt(worst / big, 1e-5, "forward shape %zu: worst error %g of %g", t, worst, big);

		float *dout = rand_array(nout, 1.0), *dinp = zero_array(nin), *dw = zero_array(nw);
		float *db = zero_array((size_t)OC);
		nan_fill(dinp, nin);
		conv_backward(dinp, dw, db, col, dout, inp, weight, B, OC, &w);
		conv_naive(ref, inp, weight, zero, B, OC, &w);
		double lhs = 0, rhs_x = dot_double(dinp, inp, nin), rhs_w = dot_double(dw, weight, nw);
		for (size_t i = 0; i < nout; i++)
			lhs += (double)dout[i] * ref[i];
		cr_assert_lt(fabs(lhs - rhs_x), 1e-4 * (fabs(lhs) + 1), "dinp: <dout, y> %g vs <dinp, x> %g", lhs, rhs_x);
		cr_assert_lt(fabs(lhs - rhs_w), 1e-4 * (fabs(lhs) + 1), "dweight: <dout, y> %g vs <dw, w> %g", lhs, rhs_w);
		double sb = 0;
		for (size_t i = 0; i < nout; i++)
			sb += dout[i];
		double sdb = 0;
		for (int o = 0; o < OC; o++)
			sdb += db[o];
		cr_assert_lt(fabs(sb - sdb), 1e-3 * (fabs(sb) + 1), "dbias sums to %g, dout to %g", sdb, sb);
		free(inp); free(weight); free(zero); free(bias); free(out); free(col); free(ref);
		free(dout); free(dinp); free(dw); free(db);
	}
}

Test(conv, backward_accumulates_dweight)
{
	struct window w = { .C = 2, .H = 5, .W = 5, .K = 3, .S = 1, .P = 1 };
	cr_assert_eq(window_init(&w), 0);
	int B = 2, OC = 3;
	size_t nin = (size_t)B * 2 * 25, nw = (size_t)OC * 2 * 9, nout = (size_t)B * OC * 25;
	float *inp = rand_array(nin, 1), *weight = rand_array(nw, 1), *dout = rand_array(nout, 1);
	float *col = zero_array(conv_col_size(&w, OC, B)), *dw1 = zero_array(nw), *dw2 = zero_array(nw);
	float *db1 = zero_array((size_t)OC), *db2 = zero_array((size_t)OC);
	conv_backward(NULL, dw1, db1, col, dout, inp, weight, B, OC, &w);
	conv_backward(NULL, dw2, db2, col, dout, inp, weight, B, OC, &w);
	conv_backward(NULL, dw2, db2, col, dout, inp, weight, B, OC, &w);
	for (size_t i = 0; i < nw; i++)
		cr_assert_float_eq(dw2[i], 2 * dw1[i], 1e-4 * (1 + fabsf(dw1[i])));
	for (int o = 0; o < OC; o++)
		cr_assert_float_eq(db2[o], 2 * db1[o], 1e-4 * (1 + fabsf(db1[o])));
	free(inp); free(weight); free(dout); free(col); free(dw1); free(dw2); free(db1); free(db2);
}

Test(conv, window_shapes)
{
	struct window w = { .C = 1, .H = 28, .W = 28, .K = 5, .S = 1, .P = 2 };
	cr_assert_eq(window_init(&w), 0);
	cr_assert_eq(w.OH, 28);
	cr_assert_eq(w.OW, 28);
	w = (struct window){ .C = 1, .H = 7, .W = 8, .K = 3, .S = 2, .P = 0 };
	cr_assert_eq(window_init(&w), 0);
	cr_assert_eq(w.OH, 3);   /* floor((7 - 3) / 2) + 1, as PyTorch */
	cr_assert_eq(w.OW, 3);
	w = (struct window){ .C = 1, .H = 3, .W = 3, .K = 5, .S = 1, .P = 0 };
	cr_assert_eq(window_init(&w), -EINVAL);
	w = (struct window){ .C = 1, .H = 3, .W = 3, .K = 5, .S = 1, .P = 1 };
	cr_assert_eq(window_init(&w), 0);
	cr_assert_eq(w.OH, 1);
}

/* ---- pooling --------------------------------------------------------------- */

struct pool_ctx {
	float *out, *inp, *R;
	int B, max;
	struct window w;
};

static size_t pool_out_n(const struct pool_ctx *c)
{
	return (size_t)c->B * c->w.C * c->w.OH * c->w.OW;
}

static double pool_objective(void *p)
{
	struct pool_ctx *c = p;
	if (c->max)
		maxpool_forward(c->out, c->inp, c->B, &c->w);
	else
		avgpool_forward(c->out, c->inp, c->B, &c->w);
	return dot_double(c->out, c->R, pool_out_n(c));
}

static void pool_gradcheck(int max, int B, int C, int H, int W, int K, int S)
{
	struct pool_ctx c = { .B = B, .max = max, .w = { .C = C, .H = H, .W = W, .K = K, .S = S } };
	cr_assert_eq(window_init(&c.w), 0);
	size_t nin = (size_t)B * C * H * W;
	/* Distinct values at least 0.1 apart (a shuffled ramp): the stencil
	 * moves an input by at most 2h = 1/16, so no window's argmax changes. */
	c.inp = zero_array(nin);
	for (size_t i = 0; i < nin; i++)
		c.inp[i] = (float)(0.1 * (double)i - 0.05 * (double)nin);
	for (size_t i = nin - 1; i > 0; i--) {
		size_t j = (size_t)((rand_uniform() + 1.0) * 0.5 * (double)(i + 1));
		if (j > i)
			j = i;
		float t = c.inp[i];
		c.inp[i] = c.inp[j];
		c.inp[j] = t;
	}
	c.out = zero_array(pool_out_n(&c));
	c.R = rand_array(pool_out_n(&c), 1.0);
	float *dinp = zero_array(nin);
	nan_fill(dinp, nin);
	if (max)
		maxpool_backward(dinp, c.R, c.inp, B, &c.w);
	else
		avgpool_backward(dinp, c.R, B, &c.w);
	char what[96];
	snprintf(what, sizeof(what), "%s B%d C%d %dx%d K%d S%d dinp", max ? "maxpool" : "avgpool",
		 B, C, H, W, K, S);
	check_grad(what, c.inp, dinp, nin, 0x1p-5, pool_objective, &c);
	free(c.inp); free(c.out); free(c.R); free(dinp);
}

Test(conv, pool_gradcheck)
{
	static const int shapes[][5] = {
		/* C  H  W  K  S */
		{ 2, 4, 4, 2, 2 },
		{ 2, 7, 7, 2, 2 },   /* odd: the last row and column are dropped */
		{ 3, 7, 6, 3, 2 },   /* overlapping windows */
		{ 1, 9, 9, 3, 3 },
		{ 2, 5, 5, 2, 1 },
	};
	for (int max = 0; max < 2; max++)
		for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
			pool_gradcheck(max, 2, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4]);
}

Test(conv, pool_values)
{
	/* One 4x4 plane, 2x2 windows: max takes the first of tied maxima. */
	float inp[16] = { 1, 2, 5, 5,
			  3, 4, 0, 1,
			  -1, -2, 7, 7,
			  -3, -4, 7, 7 };
	float out[4], dinp[16];
	struct window w = { .C = 1, .H = 4, .W = 4, .K = 2, .S = 2 };
	cr_assert_eq(window_init(&w), 0);
	maxpool_forward(out, inp, 1, &w);
	float want[4] = { 4, 5, -1, 7 };
	for (int i = 0; i < 4; i++)
		cr_assert_eq(out[i], want[i], "max[%d] = %g", i, (double)out[i]);
	float dout[4] = { 1, 2, 3, 4 };
	maxpool_backward(dinp, dout, inp, 1, &w);
	float wantd[16] = { 0, 0, 2, 0,
			    0, 1, 0, 0,
			    3, 0, 4, 0,
			    0, 0, 0, 0 };
	for (int i = 0; i < 16; i++)
		cr_assert_eq(dinp[i], wantd[i], "dinp[%d] = %g", i, (double)dinp[i]);
	avgpool_forward(out, inp, 1, &w);
	float wanta[4] = { 2.5f, 2.75f, -2.5f, 7 };
	for (int i = 0; i < 4; i++)
		cr_assert_float_eq(out[i], wanta[i], 1e-6, "avg[%d] = %g", i, (double)out[i]);
}

/* ---- batchnorm ------------------------------------------------------------- */

struct bn_ctx {
	float *out, *mean, *var, *inp, *gamma, *beta, *rm, *rv, *R;
	int B, C, HW;
};

static double bn_objective(void *p)
{
	struct bn_ctx *c = p;
	batchnorm_forward(c->out, c->mean, c->var, c->inp, c->gamma, c->beta, c->rm, c->rv,
			  c->B, c->C, c->HW);
	return dot_double(c->out, c->R, (size_t)c->B * c->C * c->HW);
}

static void bn_gradcheck(int B, int C, int HW)
{
	struct bn_ctx c = { .B = B, .C = C, .HW = HW };
	size_t n = (size_t)B * C * HW;
	c.inp = rand_array(n, 2.0);
	c.gamma = rand_array((size_t)C, 1.0);
	c.beta = rand_array((size_t)C, 1.0);
	c.rm = rand_array((size_t)C, 1.0);
	c.rv = zero_array((size_t)C);
	for (int i = 0; i < C; i++)
		c.rv[i] = 0.5f + (float)i;
	c.mean = zero_array((size_t)C);
	c.var = zero_array((size_t)C);
	c.out = zero_array(n);
	c.R = rand_array(n, 1.0);
	bn_objective(&c);
	float *dinp = zero_array(n), *dg = zero_array((size_t)C), *db = zero_array((size_t)C);
	float *drm = zero_array((size_t)C), *drv = zero_array((size_t)C);
	nan_fill(dinp, n);
	batchnorm_backward(dinp, dg, db, drm, drv, c.R, c.inp, c.gamma, c.mean, c.var, c.rm, c.rv,
			   0.5f, B, C, HW);
	char what[64];
	snprintf(what, sizeof(what), "batchnorm B%d C%d HW%d", B, C, HW);
	char name[96];
	double h = 0x1p-6;
	snprintf(name, sizeof(name), "%s dinp", what);
	check_grad(name, c.inp, dinp, n, h, bn_objective, &c);
	snprintf(name, sizeof(name), "%s dgamma", what);
	check_grad(name, c.gamma, dg, (size_t)C, h, bn_objective, &c);
	snprintf(name, sizeof(name), "%s dbeta", what);
	check_grad(name, c.beta, db, (size_t)C, h, bn_objective, &c);

	/* The running statistics' slots: 0.5 * momentum * (batch stat - running),
	 * the variance unbiased. */
	for (int ch = 0; ch < C; ch++) {
		double s = 0, q = 0, m;
		for (int b = 0; b < B; b++)
			for (int i = 0; i < HW; i++)
				s += c.inp[((size_t)b * C + ch) * HW + i];
		m = s / (double)(B * HW);
		for (int b = 0; b < B; b++)
			for (int i = 0; i < HW; i++) {
				double d = c.inp[((size_t)b * C + ch) * HW + i] - m;
				q += d * d;
			}
		double unbiased = q / (double)(B * HW - 1);
		cr_assert_float_eq(c.mean[ch], m, 1e-5);
		cr_assert_float_eq(c.var[ch], q / (B * HW), 1e-5 * (1 + q));
		cr_assert_float_eq(drm[ch], 0.5 * 0.1 * (m - c.rm[ch]), 1e-6);
		cr_assert_float_eq(drv[ch], 0.5 * 0.1 * (unbiased - c.rv[ch]), 1e-5);
	}
	free(c.inp); free(c.gamma); free(c.beta); free(c.rm); free(c.rv); free(c.mean);
	free(c.var); free(c.out); free(c.R); free(dinp); free(dg); free(db); free(drm); free(drv);
}

Test(conv, batchnorm_gradcheck)
{
	bn_gradcheck(3, 2, 5);    /* spatial: per channel over (B, H, W) */
	bn_gradcheck(2, 3, 9);
	bn_gradcheck(4, 3, 1);    /* after dense: per feature over B */
	bn_gradcheck(7, 5, 1);
}

Test(conv, batchnorm_training_and_evaluation)
{
	int B = 4, C = 2, HW = 3;
	size_t n = (size_t)B * C * HW;
	float *inp = rand_array(n, 3.0), *out = zero_array(n), *ev = zero_array(n);
	float gamma[2] = { 1, 1 }, beta[2] = { 0, 0 }, rm[2] = { 0, 0 }, rv[2] = { 1, 1 };
	float mean[2], var[2];
	for (int i = 0; i < (int)n; i++)
		inp[i] += 5.0f;   /* far from the running mean 0 */
	batchnorm_forward(out, mean, var, inp, gamma, beta, rm, rv, B, C, HW);
	batchnorm_forward(ev, NULL, NULL, inp, gamma, beta, rm, rv, B, C, HW);
	/* Training normalizes each channel to mean 0 and variance 1. */
	for (int ch = 0; ch < C; ch++) {
		double s = 0, q = 0;
		for (int b = 0; b < B; b++)
			for (int i = 0; i < HW; i++)
				s += out[((size_t)b * C + ch) * HW + i];
		for (int b = 0; b < B; b++)
			for (int i = 0; i < HW; i++)
				q += pow(out[((size_t)b * C + ch) * HW + i] - s / (B * HW), 2);
		cr_assert_lt(fabs(s / (B * HW)), 1e-5);
		cr_assert_lt(fabs(q / (B * HW) - 1.0), 1e-3);
	}
	/* Evaluation with running stats (0, 1) is the identity up to eps. */
	for (size_t i = 0; i < n; i++)
		cr_assert_float_eq(ev[i], inp[i] / sqrtf(1 + BATCHNORM_EPS), 1e-5, "eval[%zu]", i);
	free(inp); free(out); free(ev);
}

/* ---- dropout ----------------------------------------------------------------- */

Test(conv, dropout_train_eval_and_mask)
{
	size_t N = 200000;
	float p = 0.3f;
	float *inp = rand_array(N, 1.0), *a = zero_array(N), *b = zero_array(N), *c = zero_array(N);
	for (size_t i = 0; i < N; i++)
		inp[i] += 2.0f;   /* never 0, so a zero output means dropped */
	dropout_forward(a, inp, 0.0f, 77, N);   /* evaluation: identity */
	cr_assert_eq(memcmp(a, inp, N * sizeof(float)), 0, "p = 0 is not the identity");
	dropout_forward(a, inp, p, 77, N);
	dropout_forward(b, inp, p, 77, N);
	dropout_forward(c, inp, p, 78, N);
	cr_assert_eq(memcmp(a, b, N * sizeof(float)), 0, "same key, different masks");
	size_t kept = 0, same = 0;
	for (size_t i = 0; i < N; i++) {
		if (a[i] != 0.0f) {
			kept++;
			cr_assert_float_eq(a[i], inp[i] / (1.0f - p), 1e-6, "kept value not scaled");
		}
		same += (a[i] != 0.0f) == (c[i] != 0.0f);
	}
	double ratio = (double)kept / (double)N;
	/* Binomial: sd = sqrt(0.21 / N) ~ 0.001; allow 5 sd. */
	cr_assert_lt(fabs(ratio - 0.7), 0.005, "keep ratio %g, expected 0.7", ratio);
	/* Independent masks agree on 0.7^2 + 0.3^2 = 58% of elements. */
	cr_assert_lt(fabs((double)same / (double)N - 0.58), 0.01, "masks of two keys agree on %zu", same);
	/* Backward applies the same mask and scale. */
	float *dinp = zero_array(N);
	dropout_backward(dinp, inp, p, 77, N);
	cr_assert_eq(memcmp(dinp, a, N * sizeof(float)), 0, "backward mask differs from forward");
	/* In place. */
	memcpy(b, inp, N * sizeof(float));
	dropout_forward(b, b, p, 77, N);
	cr_assert_eq(memcmp(a, b, N * sizeof(float)), 0, "in-place forward differs");
	free(inp); free(a); free(b); free(c); free(dinp);
}

/* The backend's dropout takes the step's key and the layer's index and
 * derives the layer's key itself (so that a GPU step captured as a graph
 * can read the step's key from device memory): the masks must be those the
 * replica made before, when it derived rng_hash(key, RNG_DROPOUT, layer)
 * and passed that, bit for bit, forward, backward and in place. */
Test(conv, dropout_op_derives_the_layer_key)
{
	size_t N = 30011;
	float p = 0.4f;
	float *inp = rand_array(N, 1.0), *want = zero_array(N), *got = zero_array(N);
	struct backend b;
	backend_cpu(&b, 2);
	const uint64_t key = 0x1234567887654321ULL;
	const int layers[] = { 0, 3, 11 };
	for (size_t k = 0; k < sizeof(layers) / sizeof(layers[0]); k++) {
		uint64_t lk = rng_hash(key, RNG_DROPOUT, (uint64_t)layers[k]);
		cr_assert_eq(dropout_layer_key(key, layers[k]), lk, "layer %d's key changed", layers[k]);
		dropout_forward(want, inp, p, lk, N);
		cr_assert_eq(b.ops->dropout_forward(b.ctx, got, inp, p, key, layers[k], N), 0);
		cr_expect_eq(memcmp(got, want, N * sizeof(float)), 0, "layer %d: forward mask differs",
			     layers[k]);
		dropout_backward(want, inp, p, lk, N);
		memcpy(got, inp, N * sizeof(float));
		cr_assert_eq(b.ops->dropout_backward(b.ctx, got, got, p, key, layers[k], N), 0);
		cr_expect_eq(memcmp(got, want, N * sizeof(float)), 0, "layer %d: backward mask differs",
			     layers[k]);
	}
	cr_expect_neq(dropout_layer_key(key, 3), dropout_layer_key(key, 4), "two layers share a mask");
	free(inp); free(want); free(got);
}

/* ---- fast paths against references, threads against one thread ---------- */

/* conv backward straight from the definition, in double: dinp (B, C, H, W)
 * and dweight (OC, C, K, K), both set. */
static void conv_naive_backward(double *dinp, double *dw, const float *dout, const float *inp,
				const float *weight, int B, int OC, const struct window *w)
{
	size_t nin = (size_t)B * w->C * w->H * w->W, nw = (size_t)OC * w->C * w->K * w->K;
	memset(dinp, 0, nin * sizeof(double));
	memset(dw, 0, nw * sizeof(double));
	for (int b = 0; b < B; b++)
		for (int o = 0; o < OC; o++)
			for (int oh = 0; oh < w->OH; oh++)
				for (int ow = 0; ow < w->OW; ow++) {
					double g = dout[(((size_t)b * OC + o) * w->OH + oh) * w->OW + ow];
					for (int c = 0; c < w->C; c++)
						for (int kh = 0; kh < w->K; kh++)
							for (int kw = 0; kw < w->K; kw++) {
								int ih = oh * w->S - w->P + kh, iw = ow * w->S - w->P + kw;
								if (ih < 0 || ih >= w->H || iw < 0 || iw >= w->W)
									continue;
								size_t xi = (((size_t)b * w->C + c) * w->H + ih) * w->W + iw;
								size_t wi = (((size_t)o * w->C + c) * w->K + kh) * w->K + kw;
								dinp[xi] += g * weight[wi];
								dw[wi] += g * inp[xi];
							}
				}
}

/* max |a - ref| / max |ref|, asserted below tol. */
static void assert_close(const char *what, const float *a, const double *ref, size_t n, double tol)
{
	double worst = 0, big = 0;
	size_t at = 0;
	for (size_t i = 0; i < n; i++) {
		if (fabs(a[i] - ref[i]) > worst) {
			worst = fabs(a[i] - ref[i]);
			at = i;
		}
		if (fabs(ref[i]) > big)
			big = fabs(ref[i]);
	}
	cr_assert(big > 0, "%s: reference is all zero, check is vacuous", what);
	cr_assert_lt(worst / big, tol, "%s: worst error %g at %zu (%g vs %g) of max %g", what, worst,
		     at, (double)a[at], ref[at], big);
}

static void assert_same_bits(const char *what, int threads, const float *a, const float *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		cr_assert(memcmp(&a[i], &b[i], sizeof(float)) == 0,
			  "%s with %d threads differs at %zu: %.9g vs %.9g (1 thread)", what, threads, i,
			  (double)a[i], (double)b[i]);
}

/* Odd sizes, strides and paddings: B, C, H, W, OC, K, S, P. */
static const int conv_odd_shapes[][8] = {
	{ 19, 3, 13, 11, 5, 3, 2, 1 },
	{ 37, 1, 28, 28, 8, 5, 1, 2 },   /* chunks of several samples */
	{ 10, 6, 9, 7, 4, 2, 1, 0 },
	{ 3, 2, 7, 7, 3, 3, 1, 1 },      /* fewer samples than slices */
	{ 9, 5, 12, 10, 7, 4, 3, 3 },    /* stride 3, padding wider than the overlap */
	{ 2, 32, 14, 14, 64, 5, 1, 2 },  /* the Fashion CNN's second layer */
	{ 4, 3, 6, 5, 2, 3, 1, 3 },      /* padding wider than the kernel: taps on padding only */
	{ 3, 2, 5, 40, 3, 3, 1, 1 },     /* rows of 40: blocks of 16, 16 and 8 */
};

/* Forward against the naive loop and backward's dinp and dweight against
 * their definitions, element by element, on every shape above. */
Test(conv, odd_shapes_match_reference)
{
	for (size_t u = 0; u < 2 * sizeof(conv_odd_shapes) / sizeof(conv_odd_shapes[0]); u++) {
		/* Every shape twice: the run-time pick, then the portable loops. */
		size_t t = u % (sizeof(conv_odd_shapes) / sizeof(conv_odd_shapes[0]));
		const int *s = conv_odd_shapes[t];
		int B = s[0], OC = s[4];
		struct window w = { .C = s[1], .H = s[2], .W = s[3], .K = s[5], .S = s[6], .P = s[7],
				    .scalar = u != t };
		cr_assert_eq(window_init(&w), 0, "shape %zu", t);
		size_t nin = (size_t)B * w.C * w.H * w.W, nw = (size_t)OC * w.C * w.K * w.K;
		size_t nout = (size_t)B * OC * w.OH * w.OW, ncol = conv_col_size(&w, OC, B);
		float *inp = rand_array(nin, 1.0), *weight = rand_array(nw, 0.3), *bias = rand_array((size_t)OC, 0.5);
		float *out = zero_array(nout), *col = zero_array(ncol), *dout = rand_array(nout, 1.0);
		float *dinp = zero_array(nin), *dw = zero_array(nw), *db = zero_array((size_t)OC);
		double *ref = malloc(nout * sizeof(double)), *rdinp = malloc(nin * sizeof(double));
		double *rdw = malloc(nw * sizeof(double)), *rdb = calloc((size_t)OC, sizeof(double));
		cr_assert(ref && rdinp && rdw && rdb);
		char what[64];
		nan_fill(col, ncol);   /* scratch must be written before it is read */
		nan_fill(out, nout);
		conv_forward(out, col, inp, weight, bias, B, OC, &w);
		conv_naive(ref, inp, weight, bias, B, OC, &w);
		snprintf(what, sizeof(what), "shape %zu%s forward", t, w.scalar ? " (portable loops)" : "");
		assert_close(what, out, ref, nout, 1e-5);

		nan_fill(dinp, nin);
		conv_backward(dinp, dw, db, col, dout, inp, weight, B, OC, &w);
		conv_naive_backward(rdinp, rdw, dout, inp, weight, B, OC, &w);
		for (size_t i = 0; i < nout; i++)
			rdb[i / ((size_t)w.OH * w.OW) % (size_t)OC] += dout[i];
		snprintf(what, sizeof(what), "shape %zu%s dinp", t, w.scalar ? " (portable loops)" : "");
		assert_close(what, dinp, rdinp, nin, 1e-5);
		snprintf(what, sizeof(what), "shape %zu%s dweight", t, w.scalar ? " (portable loops)" : "");
		assert_close(what, dw, rdw, nw, 1e-5);
		snprintf(what, sizeof(what), "shape %zu%s dbias", t, w.scalar ? " (portable loops)" : "");
		assert_close(what, db, rdb, (size_t)OC, 1e-5);
		free(inp); free(weight); free(bias); free(out); free(col); free(dout); free(dinp);
		free(dw); free(db); free(ref); free(rdinp); free(rdw); free(rdb);
	}
}

/* The conv kernels over 2, 3 and 8 threads give the bits of 1 thread,
 * dweight and dbias accumulated onto nonzero values included. */
Test(conv, threads_match_one_thread_bitwise)
{
	static const int threads[] = { 2, 3, 8 };
	for (size_t t = 0; t < sizeof(conv_odd_shapes) / sizeof(conv_odd_shapes[0]); t++) {
		const int *s = conv_odd_shapes[t];
		int B = s[0], OC = s[4];
		struct window w = { .C = s[1], .H = s[2], .W = s[3], .K = s[5], .S = s[6], .P = s[7] };
		cr_assert_eq(window_init(&w), 0);
		size_t nin = (size_t)B * w.C * w.H * w.W, nw = (size_t)OC * w.C * w.K * w.K;
		size_t nout = (size_t)B * OC * w.OH * w.OW, ncol = conv_col_size(&w, OC, B);
		float *inp = rand_array(nin, 1.0), *weight = rand_array(nw, 0.3), *bias = rand_array((size_t)OC, 0.5);
		float *dout = rand_array(nout, 1.0), *dw0 = rand_array(nw, 1.0), *db0 = rand_array((size_t)OC, 1.0);
		float *col = zero_array(ncol), *out1 = zero_array(nout), *dinp1 = zero_array(nin);
		float *dw1 = zero_array(nw), *db1 = zero_array((size_t)OC);
		memcpy(dw1, dw0, nw * sizeof(float));
		memcpy(db1, db0, (size_t)OC * sizeof(float));
		conv_forward_mt(out1, col, inp, weight, bias, B, OC, &w, 1);
		conv_backward_mt(dinp1, dw1, db1, col, dout, inp, weight, B, OC, &w, 1);
		for (size_t k = 0; k < sizeof(threads) / sizeof(threads[0]); k++) {
			int T = threads[k];
			float *out = zero_array(nout), *dinp = zero_array(nin);
			float *dw = zero_array(nw), *db = zero_array((size_t)OC);
			memcpy(dw, dw0, nw * sizeof(float));
			memcpy(db, db0, (size_t)OC * sizeof(float));
			nan_fill(col, ncol);
			conv_forward_mt(out, col, inp, weight, bias, B, OC, &w, T);
			conv_backward_mt(dinp, dw, db, col, dout, inp, weight, B, OC, &w, T);
			assert_same_bits("conv forward", T, out, out1, nout);
			assert_same_bits("conv dinp", T, dinp, dinp1, nin);
			assert_same_bits("conv dweight", T, dw, dw1, nw);
			assert_same_bits("conv dbias", T, db, db1, (size_t)OC);
			free(out); free(dinp); free(dw); free(db);
		}
		free(inp); free(weight); free(bias); free(dout); free(dw0); free(db0); free(col);
		free(out1); free(dinp1); free(dw1); free(db1);
	}
}

/* Pooling straight from the definition: the first maximum of each window
 * gets the gradient; windows that overlap add up. */
static void pool_naive(int max, double *out, double *dinp, const float *inp, const float *dout,
		       int B, const struct window *w)
{
	size_t nin = (size_t)B * w->C * w->H * w->W;
	memset(dinp, 0, nin * sizeof(double));
	for (int p = 0; p < B * w->C; p++)
		for (int oh = 0; oh < w->OH; oh++)
			for (int ow = 0; ow < w->OW; ow++) {
				size_t o = ((size_t)p * w->OH + oh) * w->OW + ow, best = 0;
				double s = 0, m = -INFINITY;
				for (int kh = 0; kh < w->K; kh++)
					for (int kw = 0; kw < w->K; kw++) {
						size_t i = ((size_t)p * w->H + oh * w->S + kh) * w->W + ow * w->S + kw;
						s += inp[i];
						if (inp[i] > m) {
							m = inp[i];
							best = i;
						}
					}
				if (max) {
					out[o] = m;
					dinp[best] += dout[o];
				} else {
					out[o] = s / (w->K * w->K);
					for (int kh = 0; kh < w->K; kh++)
						for (int kw = 0; kw < w->K; kw++)
							dinp[((size_t)p * w->H + oh * w->S + kh) * w->W + ow * w->S + kw] +=
								(double)dout[o] / (w->K * w->K);
				}
			}
}

Test(conv, pool_matches_reference)
{
	static const int shapes[][6] = {
		/* B  C  H   W   K  S */
		{ 3, 2, 9, 7, 3, 2 },    /* overlapping, odd */
		{ 2, 3, 7, 9, 2, 2 },    /* odd: last row and column dropped */
		{ 2, 2, 8, 8, 3, 1 },
		{ 2, 2, 11, 10, 2, 3 },  /* gaps between windows */
		{ 1, 1, 5, 5, 5, 5 },
		{ 2, 2, 6, 37, 2, 2 },   /* 2x2: a full and a partial block of 16 outputs */
		{ 1, 2, 5, 32, 2, 2 },   /* 2x2: exactly 16 outputs per row */
		{ 1, 1, 4, 65, 2, 2 },
	};
	for (int mode = 0; mode < 4; mode++) {
		int max = mode & 1;   /* mode & 2: the portable loops, not the run-time pick */
		for (size_t t = 0; t < sizeof(shapes) / sizeof(shapes[0]); t++) {
			const int *s = shapes[t];
			int B = s[0];
			struct window w = { .C = s[1], .H = s[2], .W = s[3], .K = s[4], .S = s[5], .scalar = mode >> 1 };
			cr_assert_eq(window_init(&w), 0);
			size_t nin = (size_t)B * w.C * w.H * w.W, nout = (size_t)B * w.C * w.OH * w.OW;
			float *inp = rand_array(nin, 1.0), *dout = rand_array(nout, 1.0);
			/* Ties, so "first maximum" is tested: quantize half the values. */
			for (size_t i = 0; i < nin; i += 2)
				inp[i] = roundf(inp[i] * 2) / 2;
			float *out = zero_array(nout), *dinp = zero_array(nin);
			double *ro = malloc(nout * sizeof(double)), *rd = malloc(nin * sizeof(double));
			cr_assert(ro && rd);
			nan_fill(out, nout);
			nan_fill(dinp, nin);
			if (max) {
				maxpool_forward(out, inp, B, &w);
				maxpool_backward(dinp, dout, inp, B, &w);
			} else {
				avgpool_forward(out, inp, B, &w);
				avgpool_backward(dinp, dout, B, &w);
			}
			pool_naive(max, ro, rd, inp, dout, B, &w);
			static const char *const kinds[] = { "avg", "max", "avg (portable loops)", "max (portable loops)" };
			const char *kind = kinds[mode];
			for (size_t i = 0; i < nout; i++)
				cr_assert_float_eq(out[i], ro[i], 1e-6, "%s shape %zu out[%zu] %g vs %g",
						   kind, t, i, (double)out[i], ro[i]);
			for (size_t i = 0; i < nin; i++)
				cr_assert_float_eq(dinp[i], rd[i], 1e-6, "%s shape %zu dinp[%zu] %g vs %g",
						   kind, t, i, (double)dinp[i], rd[i]);
			free(inp); free(dout); free(out); free(dinp); free(ro); free(rd);
		}
	}
}

/* The CPU backend with 3 threads against 1 thread on work big enough to be
 * split: pooling, activations and batchnorm must agree bit for bit. */
Test(conv, backend_threads_match_one_thread_bitwise)
{
	struct backend b1, b3;
	backend_cpu(&b1, 1);
	backend_cpu(&b3, 3);
	int B = 37;
	struct window w = { .C = 8, .H = 17, .W = 15, .K = 2, .S = 2 };
	cr_assert_eq(window_init(&w), 0);
	size_t nin = (size_t)B * w.C * w.H * w.W, nout = (size_t)B * w.C * w.OH * w.OW;
	cr_assert_gt(nin, (size_t)1 << 16, "too small to be split over threads");
	float *inp = rand_array(nin, 1.0), *dout = rand_array(nout, 1.0), *gin = rand_array(nin, 1.0);
	float *o1 = zero_array(nin), *o3 = zero_array(nin), *d1 = zero_array(nin), *d3 = zero_array(nin);
	static const enum layer_kind pools[] = { LAYER_MAXPOOL, LAYER_AVGPOOL };
	for (int k = 0; k < 2; k++) {
		cr_assert_eq(b1.ops->pool_forward(b1.ctx, pools[k], o1, inp, B, &w), 0);
		cr_assert_eq(b3.ops->pool_forward(b3.ctx, pools[k], o3, inp, B, &w), 0);
		assert_same_bits("pool forward", 3, o3, o1, nout);
		cr_assert_eq(b1.ops->pool_backward(b1.ctx, pools[k], d1, dout, inp, B, &w), 0);
		cr_assert_eq(b3.ops->pool_backward(b3.ctx, pools[k], d3, dout, inp, B, &w), 0);
		assert_same_bits("pool backward", 3, d3, d1, nin);
	}
	static const enum layer_kind acts[] = { LAYER_RELU, LAYER_TANH, LAYER_SIGMOID };
	for (int k = 0; k < 3; k++) {
		cr_assert_eq(b1.ops->act_forward(b1.ctx, acts[k], o1, inp, nin - 3), 0);
		cr_assert_eq(b3.ops->act_forward(b3.ctx, acts[k], o3, inp, nin - 3), 0);
		assert_same_bits("activation forward", 3, o3, o1, nin - 3);
		cr_assert_eq(b1.ops->act_backward(b1.ctx, acts[k], d1, gin, o1, nin - 3), 0);
		cr_assert_eq(b3.ops->act_backward(b3.ctx, acts[k], d3, gin, o3, nin - 3), 0);
		assert_same_bits("activation backward", 3, d3, d1, nin - 3);
	}
	/* batchnorm over the same values as (B, C, H*W). */
	int C = w.C, HW = w.H * w.W;
	float *g = rand_array((size_t)C, 1.0), *be = rand_array((size_t)C, 1.0), *rm = rand_array((size_t)C, 1.0);
	float *rv = zero_array((size_t)C), *st1 = zero_array(2 * (size_t)C), *st3 = zero_array(2 * (size_t)C);
	float *acc1 = zero_array(4 * (size_t)C), *acc3 = zero_array(4 * (size_t)C);
	for (int c = 0; c < C; c++)
		rv[c] = 0.5f + (float)c;
	cr_assert_eq(b1.ops->batchnorm_forward(b1.ctx, o1, st1, st1 + C, inp, g, be, rm, rv, B, C, HW), 0);
	cr_assert_eq(b3.ops->batchnorm_forward(b3.ctx, o3, st3, st3 + C, inp, g, be, rm, rv, B, C, HW), 0);
	assert_same_bits("batchnorm forward", 3, o3, o1, nin);
	assert_same_bits("batchnorm statistics", 3, st3, st1, 2 * (size_t)C);
	cr_assert_eq(b1.ops->batchnorm_backward(b1.ctx, d1, acc1, acc1 + C, acc1 + 2 * C, acc1 + 3 * C,
						gin, inp, g, st1, st1 + C, rm, rv, 0.5f, B, C, HW), 0);
	cr_assert_eq(b3.ops->batchnorm_backward(b3.ctx, d3, acc3, acc3 + C, acc3 + 2 * C, acc3 + 3 * C,
						gin, inp, g, st3, st3 + C, rm, rv, 0.5f, B, C, HW), 0);
	assert_same_bits("batchnorm dinp", 3, d3, d1, nin);
	assert_same_bits("batchnorm parameter slots", 3, acc3, acc1, 4 * (size_t)C);
	layers_set_threads(1);
	free(inp); free(dout); free(gin); free(o1); free(o3); free(d1); free(d3);
	free(g); free(be); free(rm); free(rv); free(st1); free(st3); free(acc1); free(acc3);
}
