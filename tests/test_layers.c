/* Tests of core/nn/layers.c: finite-difference gradient checks of every layer
 * and the loss, the gradient contract (dinp set, dweight/dbias
 * accumulated), dense against a naive loop, and softmax edge cases.
 *
 * Gradient checks use a random scalar objective L = sum(out * R) with R
 * fixed, accumulated in double, and the fourth-order central difference
 *   L'(x) ~ (8 (L(x+h) - L(x-h)) - (L(x+2h) - L(x-2h))) / 12h
 * with h a power of two, so x +- h and x +- 2h are exact in float and the
 * stencil is evenly spaced. The layers run in float32; the fourth-order
 * stencil lets h be large enough (2^-5) that float32 rounding of the
 * forward divided by h stays near 1e-6, while its truncation error
 * (~h^4) stays below that. Perturbing one input only changes the outputs
 * that depend on it; the others are recomputed bit-identically and cancel,
 * so the noise does not grow with the size of the layer.
 * Run with --verbose to see the measured errors. */
#include <criterion/criterion.h>

#include "leak.h"
#include <criterion/logging.h>

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gradcheck.h"
#include "../core/nn/layers.h"

/* ---- dense -------------------------------------------------------------- */

struct dense_ctx {
	float *out, *inp, *weight, *bias, *R;
	int B, C, OC;
};

static double dense_objective(void *p)
{
	struct dense_ctx *c = p;
	dense_forward(c->out, c->inp, c->weight, c->bias, c->B, c->C, c->OC);
	return dot_double(c->out, c->R, (size_t)c->B * c->OC);
}

static void dense_gradcheck(int B, int C, int OC, int with_bias)
{
	struct dense_ctx c = {
		.out = zero_array((size_t)B * OC),
		.inp = rand_array((size_t)B * C, 1.0),
		.weight = rand_array((size_t)OC * C, 1.0),
		.bias = with_bias ? rand_array((size_t)OC, 1.0) : NULL,
		.R = rand_array((size_t)B * OC, 1.0),
		.B = B, .C = C, .OC = OC,
	};
	float *dinp = zero_array((size_t)B * C);
	float *dweight = zero_array((size_t)OC * C);
	float *dbias = with_bias ? zero_array((size_t)OC) : NULL;
	nan_fill(dinp, (size_t)B * C);   // backward must set, not add

	dense_backward(dinp, dweight, dbias, c.R, c.inp, c.weight, B, C, OC);

	/* dense is linear in each input, so the stencil is exact and h only
	 * trades against rounding: take it large. */
	char what[64];
	snprintf(what, sizeof(what), "dense B=%d C=%d OC=%d dinp", B, C, OC);
	check_grad(what, c.inp, dinp, (size_t)B * C, 0.25, dense_objective, &c);
	snprintf(what, sizeof(what), "dense B=%d C=%d OC=%d dweight", B, C, OC);
	check_grad(what, c.weight, dweight, (size_t)OC * C, 0.25, dense_objective, &c);
	if (with_bias) {
		snprintf(what, sizeof(what), "dense B=%d C=%d OC=%d dbias", B, C, OC);
		check_grad(what, c.bias, dbias, (size_t)OC, 0.25, dense_objective, &c);
	}
	free(c.out); free(c.inp); free(c.weight); free(c.bias); free(c.R);
	free(dinp); free(dweight); free(dbias);
}

/* The seed these tests have always drawn from. */
static void seed(void)
{
	gradcheck_seed(0x1234abcdULL);
}

TestSuite(layers, .init = seed, .fini = leak_check);

Test(layers, dense_gradcheck)
{
	static const int shapes[][3] = {
		{1, 1, 1}, {1, 5, 33}, {3, 33, 5}, {7, 5, 1},
		{7, 33, 33}, {3, 1, 5}, {1, 33, 1}, {7, 1, 33},
	};
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		dense_gradcheck(shapes[i][0], shapes[i][1], shapes[i][2], 1);
	dense_gradcheck(3, 5, 7, 0);
	dense_gradcheck(1, 33, 5, 0);
}

/* Naive reference in double. */
static void dense_forward_naive(double *out, const float *inp, const float *weight,
				const float *bias, int B, int C, int OC)
{
	for (int b = 0; b < B; b++)
		for (int o = 0; o < OC; o++) {
			double s = bias ? bias[o] : 0.0;
			for (int c = 0; c < C; c++)
				s += (double)inp[b * C + c] * weight[o * C + c];
			out[b * OC + o] = s;
		}
}

Test(layers, dense_forward_matches_naive)
{
	static const int shapes[][3] = {
		{1, 1, 1}, {3, 5, 7}, {7, 33, 1}, {64, 300, 70}, {257, 129, 65},
	};
	for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
		int B = shapes[k][0], C = shapes[k][1], OC = shapes[k][2];
		for (int with_bias = 0; with_bias <= 1; with_bias++) {
			float *inp = rand_array((size_t)B * C, 1.0);
			float *weight = rand_array((size_t)OC * C, 1.0);
			float *bias = with_bias ? rand_array((size_t)OC, 1.0) : NULL;
			float *out = zero_array((size_t)B * OC);
			double *ref = malloc((size_t)B * OC * sizeof(double));
			nan_fill(out, (size_t)B * OC);   // beta = 0 must not read out
			dense_forward(out, inp, weight, bias, B, C, OC);
			dense_forward_naive(ref, inp, weight, bias, B, C, OC);
			for (size_t i = 0; i < (size_t)B * OC; i++) {
				/* Rounding of a C-term float dot product of
				 * values in [-1, 1] is well under C * 2^-24. */
				double tol = 1e-6 * (C + 1);
				cr_assert(fabs(out[i] - ref[i]) <= tol,
					  "B=%d C=%d OC=%d bias=%d out[%zu] = %.9g, naive %.9g",
					  B, C, OC, with_bias, i, (double)out[i], ref[i]);
			}
			free(inp); free(weight); free(bias); free(out); free(ref);
		}
	}
}

Test(layers, dense_backward_accumulates)
{
	int B = 7, C = 33, OC = 5;
	float *inp = rand_array((size_t)B * C, 1.0);
	float *weight = rand_array((size_t)OC * C, 1.0);
	float *dout = rand_array((size_t)B * OC, 1.0);
	float *dinp1 = zero_array((size_t)B * C), *dinp2 = zero_array((size_t)B * C);
	float *dw = zero_array((size_t)OC * C), *db = zero_array((size_t)OC);

	dense_backward(dinp1, dw, db, dout, inp, weight, B, C, OC);
	float *dw1 = malloc((size_t)OC * C * sizeof(float));
	float *db1 = malloc((size_t)OC * sizeof(float));
	memcpy(dw1, dw, (size_t)OC * C * sizeof(float));
	memcpy(db1, db, (size_t)OC * sizeof(float));
	for (int i = 0; i < OC * C; i++)
		cr_assert(dw1[i] != 0.0f, "dweight[%d] not written", i);

	/* Garbage in dinp2 must not leak into the result. */
	for (int i = 0; i < B * C; i++)
		dinp2[i] = 1e6f;
	dense_backward(dinp2, dw, db, dout, inp, weight, B, C, OC);
	for (int i = 0; i < OC * C; i++)
		cr_assert(fabsf(dw[i] - 2 * dw1[i]) <= 1e-6f * fabsf(dw1[i]),
			  "dweight[%d] = %.9g after two calls, once gave %.9g",
			  i, (double)dw[i], (double)dw1[i]);
	for (int i = 0; i < OC; i++)
		cr_assert(fabsf(db[i] - 2 * db1[i]) <= 1e-6f * fabsf(db1[i]),
			  "dbias[%d] = %.9g after two calls, once gave %.9g",
			  i, (double)db[i], (double)db1[i]);
	for (int i = 0; i < B * C; i++)
		cr_assert(dinp2[i] == dinp1[i], "dinp[%d] changed: %.9g vs %.9g",
			  i, (double)dinp2[i], (double)dinp1[i]);

	free(inp); free(weight); free(dout); free(dinp1); free(dinp2);
	free(dw); free(db); free(dw1); free(db1);
}

Test(layers, dense_backward_null_dinp_and_dbias)
{
	int B = 3, C = 5, OC = 33;
	float *inp = rand_array((size_t)B * C, 1.0);
	float *weight = rand_array((size_t)OC * C, 1.0);
	float *dout = rand_array((size_t)B * OC, 1.0);
	float *dinp = zero_array((size_t)B * C);
	float *dw_a = zero_array((size_t)OC * C), *db_a = zero_array((size_t)OC);
	float *dw_b = zero_array((size_t)OC * C), *db_b = zero_array((size_t)OC);
	float *dw_c = zero_array((size_t)OC * C);

	dense_backward(dinp, dw_a, db_a, dout, inp, weight, B, C, OC);
	dense_backward(NULL, dw_b, db_b, dout, inp, weight, B, C, OC);
	dense_backward(NULL, dw_c, NULL, dout, inp, weight, B, C, OC);
	for (int i = 0; i < OC * C; i++) {
		cr_assert(dw_a[i] == dw_b[i], "dweight[%d] differs without dinp", i);
		cr_assert(dw_a[i] == dw_c[i], "dweight[%d] differs without dinp, dbias", i);
	}
	for (int i = 0; i < OC; i++) {
		float s = 0.0f;
		for (int b = 0; b < B; b++)
			s += dout[b * OC + i];
		cr_assert(db_a[i] == db_b[i], "dbias[%d] differs without dinp", i);
		cr_assert(fabsf(db_a[i] - s) <= 1e-6f, "dbias[%d] = %.9g, want %.9g",
			  i, (double)db_a[i], (double)s);
	}
	free(inp); free(weight); free(dout); free(dinp);
	free(dw_a); free(db_a); free(dw_b); free(db_b); free(dw_c);
}

/* ---- activations -------------------------------------------------------- */

typedef void (*act_fwd_fn)(float *out, const float *inp, size_t N);
typedef void (*act_bwd_fn)(float *dinp, const float *dout, const float *out, size_t N);

struct act_ctx {
	act_fwd_fn fwd;
	float *out, *inp, *R;
	size_t N;
};

static double act_objective(void *p)
{
	struct act_ctx *c = p;
	c->fwd(c->out, c->inp, c->N);
	return dot_double(c->out, c->R, c->N);
}

static void act_gradcheck(const char *name, act_fwd_fn fwd, act_bwd_fn bwd,
			  size_t N, double scale, double h, double avoid)
{
	struct act_ctx c = {
		.fwd = fwd,
		.out = zero_array(N),
		.inp = rand_array(N, scale),
		.R = rand_array(N, 1.0),
		.N = N,
	};
	/* Keep inputs off a kink at 0 by more than the stencil's reach. */
	for (size_t i = 0; i < N; i++)
		if (fabsf(c.inp[i]) < avoid)
			c.inp[i] = copysignf((float)avoid + fabsf(c.inp[i]), c.inp[i]);
	float *dinp = zero_array(N);
	nan_fill(dinp, N);
	fwd(c.out, c.inp, N);
	bwd(dinp, c.R, c.out, N);
	char what[64];
	snprintf(what, sizeof(what), "%s N=%zu dinp", name, N);
	check_grad(what, c.inp, dinp, N, h, act_objective, &c);
	free(c.out); free(c.inp); free(c.R); free(dinp);
}

Test(layers, activation_gradcheck)
{
	static const size_t sizes[] = {1, 5, 33, 231};
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		size_t N = sizes[k];
		act_gradcheck("relu", relu_forward, relu_backward, N, 2.0, 0x1p-5, 4 * 0x1p-5 + 0x1p-6);
		act_gradcheck("tanh", tanh_forward, tanh_backward, N, 3.0, 0x1p-5, 0.0);
		act_gradcheck("sigmoid", sigmoid_forward, sigmoid_backward, N, 6.0, 0x1p-5, 0.0);
	}
}

Test(layers, activation_values)
{
	static const float xs[] = {
		-1e4f, -100.0f, -20.0f, -3.5f, -1.0f, -1e-3f, 0.0f,
		1e-3f, 0.5f, 2.0f, 20.0f, 100.0f, 1e4f,
	};
	size_t N = sizeof(xs) / sizeof(xs[0]);
	float out[sizeof(xs) / sizeof(xs[0])];

	relu_forward(out, xs, N);
	for (size_t i = 0; i < N; i++)
		cr_assert(out[i] == (xs[i] > 0 ? xs[i] : 0.0f), "relu(%g) = %g",
			  (double)xs[i], (double)out[i]);
	tanh_forward(out, xs, N);
	for (size_t i = 0; i < N; i++)
		cr_assert(fabs(out[i] - tanh((double)xs[i])) <= 2e-7,
			  "tanh(%g) = %.9g", (double)xs[i], (double)out[i]);
	sigmoid_forward(out, xs, N);
	for (size_t i = 0; i < N; i++) {
		double ref = 1.0 / (1.0 + exp(-(double)xs[i]));
		/* Relative for the tiny values of large negative x: the
		 * stable form keeps them instead of rounding to 0. */
		double tol = 2e-7 * ref + 1e-44;
		cr_assert(isfinite(out[i]) && fabs(out[i] - ref) <= tol,
			  "sigmoid(%g) = %.9g, want %.9g", (double)xs[i], (double)out[i], ref);
	}
	cr_assert(out[1] > 0.0f, "sigmoid(-100) underflowed to 0");

	/* NaN stays NaN through relu rather than being masked to 0. */
	float nanin = NAN, nanout = 0.0f;
	relu_forward(&nanout, &nanin, 1);
	cr_assert(isnan(nanout));
}

Test(layers, activation_in_place)
{
	size_t N = 33;
	act_fwd_fn fwds[] = {relu_forward, tanh_forward, sigmoid_forward};
	act_bwd_fn bwds[] = {relu_backward, tanh_backward, sigmoid_backward};
	for (int k = 0; k < 3; k++) {
		float *x = rand_array(N, 3.0), *dout = rand_array(N, 1.0);
		float *out = zero_array(N), *dinp = zero_array(N);
		fwds[k](out, x, N);
		bwds[k](dinp, dout, out, N);
		fwds[k](x, x, N);
		bwds[k](dout, dout, x, N);
		for (size_t i = 0; i < N; i++) {
			cr_assert(x[i] == out[i], "activation %d in place: out[%zu]", k, i);
			cr_assert(dout[i] == dinp[i], "activation %d in place: dinp[%zu]", k, i);
		}
		free(x); free(dout); free(out); free(dinp);
	}
}

/* ---- softmax + cross-entropy -------------------------------------------- */

struct xent_ctx {
	float *probs, *logits;
	int32_t *labels;
	int B, C;
};

static double xent_objective(void *p)
{
	struct xent_ctx *c = p;
	return softmax_xent_forward(c->probs, NULL, c->logits, c->labels, c->B, c->C);
}

static void xent_gradcheck(int B, int C, double scale_logits)
{
	struct xent_ctx c = {
		.probs = zero_array((size_t)B * C),
		.logits = rand_array((size_t)B * C, scale_logits),
		.labels = malloc((size_t)B * sizeof(int32_t)),
		.B = B, .C = C,
	};
	for (int b = 0; b < B; b++)
		c.labels[b] = (int32_t)((unsigned)(b * 7 + 3) % (unsigned)C);
	float *dlogits = zero_array((size_t)B * C);
	nan_fill(dlogits, (size_t)B * C);
	softmax_xent_forward(c.probs, NULL, c.logits, c.labels, B, C);
	/* scale 1: the gradient of the summed loss the forward returns. */
	softmax_xent_backward(dlogits, c.probs, c.labels, B, C, 1.0f);
	char what[64];
	snprintf(what, sizeof(what), "xent B=%d C=%d dlogits", B, C);
	check_grad(what, c.logits, dlogits, (size_t)B * C, 0x1p-5, xent_objective, &c);
	free(c.probs); free(c.logits); free(c.labels); free(dlogits);
}

Test(layers, xent_one_class)
{
	/* One class: p = 1, loss 0 and gradient 0 whatever the logit. */
	float logits[3] = {5.0f, -1e4f, 0.0f}, probs[3], d[3];
	int32_t labels[3] = {0, 0, 0};
	int correct = -1;
	double loss = softmax_xent_forward(probs, &correct, logits, labels, 3, 1);
	softmax_xent_backward(d, probs, labels, 3, 1, 1.0f);
	cr_assert(loss == 0.0, "loss %g", loss);
	cr_assert_eq(correct, 3);
	for (int i = 0; i < 3; i++)
		cr_assert(probs[i] == 1.0f && d[i] == 0.0f, "row %d: p %g d %g",
			  i, (double)probs[i], (double)d[i]);
}

Test(layers, xent_gradcheck_shapes)
{
	static const int shapes[][2] = {{1, 5}, {3, 2}, {7, 10}, {3, 33}, {1, 33}};
	for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++)
		xent_gradcheck(shapes[k][0], shapes[k][1], 3.0);
}

Test(layers, xent_backward_scale_and_alias)
{
	int B = 3, C = 5;
	float *logits = rand_array((size_t)B * C, 2.0);
	int32_t labels[3] = {4, 0, 2};
	float *probs = zero_array((size_t)B * C), *d = zero_array((size_t)B * C);
	softmax_xent_forward(probs, NULL, logits, labels, B, C);
	softmax_xent_backward(d, probs, labels, B, C, 0.25f);
	for (int b = 0; b < B; b++)
		for (int i = 0; i < C; i++) {
			float want = (probs[b * C + i] - (i == labels[b] ? 1.0f : 0.0f)) * 0.25f;
			cr_assert(fabsf(d[b * C + i] - want) <= 1e-7f,
				  "dlogits[%d][%d] = %g, want %g", b, i,
				  (double)d[b * C + i], (double)want);
		}
	/* In place: probs aliasing logits, dlogits aliasing probs. */
	double loss = softmax_xent_forward(probs, NULL, logits, labels, B, C);
	double loss2 = softmax_xent_forward(logits, NULL, logits, labels, B, C);
	cr_assert(loss == loss2, "in-place loss %.17g vs %.17g", loss2, loss);
	for (int i = 0; i < B * C; i++)
		cr_assert(logits[i] == probs[i], "in-place probs[%d]", i);
	softmax_xent_backward(probs, probs, labels, B, C, 0.25f);
	for (int i = 0; i < B * C; i++)
		cr_assert(probs[i] == d[i], "in-place dlogits[%d]", i);
	free(logits); free(probs); free(d);
}

Test(layers, xent_values)
{
	/* Against a double reference on random rows. */
	int B = 7, C = 10;
	float *logits = rand_array((size_t)B * C, 4.0);
	float *probs = zero_array((size_t)B * C);
	int32_t labels[7] = {0, 9, 3, 3, 5, 1, 8};
	double loss = softmax_xent_forward(probs, NULL, logits, labels, B, C);
	double want = 0.0;
	for (int b = 0; b < B; b++) {
		double mx = -INFINITY, s = 0.0;
		for (int i = 0; i < C; i++)
			mx = fmax(mx, logits[b * C + i]);
		for (int i = 0; i < C; i++)
			s += exp(logits[b * C + i] - mx);
		for (int i = 0; i < C; i++) {
			double p = exp(logits[b * C + i] - mx) / s;
			cr_assert(fabs(probs[b * C + i] - p) <= 1e-6 * p + 1e-9,
				  "probs[%d][%d] = %.9g, want %.9g", b, i,
				  (double)probs[b * C + i], p);
		}
		want += log(s) - (logits[b * C + labels[b]] - mx);
	}
	cr_assert(fabs(loss - want) <= 1e-6 * want, "loss %.12g, want %.12g", loss, want);
	free(logits); free(probs);
}

Test(layers, xent_huge_logits)
{
	enum { B = 4, C = 3 };
	const float logits[B * C] = {
		1e4f, 1e4f, -1e4f,      // label 0: tie of two, loss log 2
		1e4f, 0.0f, -1e4f,      // label 1: loss 1e4
		-1e4f, -1e4f, -1e4f,    // label 2: loss log 3
		-1e4f, 1e4f, 9999.0f,   // label 1: loss log(1 + e^-1)
	};
	const int32_t labels[B] = {0, 1, 2, 1};
	const double want[B] = {log(2.0), 1e4, log(3.0), log1p(exp(-1.0))};
	float probs[B * C];
	int correct = -1;
	double loss = softmax_xent_forward(probs, &correct, logits, labels, B, C);
	cr_assert(isfinite(loss), "loss %g is not finite", loss);
	double want_sum = want[0] + want[1] + want[2] + want[3];
	cr_assert(fabs(loss - want_sum) <= 1e-9 * want_sum, "loss %.17g, want %.17g",
		  loss, want_sum);
	for (int b = 0; b < B; b++) {
		double s = 0.0;
		for (int i = 0; i < C; i++) {
			cr_assert(isfinite(probs[b * C + i]) && probs[b * C + i] >= 0.0f,
				  "probs[%d][%d] = %g", b, i, (double)probs[b * C + i]);
			s += probs[b * C + i];
		}
		cr_assert(fabs(s - 1.0) <= 1e-6, "row %d sums to %.9g", b, s);
	}
	cr_assert(probs[0] == 0.5f && probs[1] == 0.5f && probs[2] == 0.0f);
	cr_assert(probs[3] == 1.0f);
	/* Row 0 ties at index 0 and 1: the first wins, so it is correct;
	 * row 2 is a three-way tie, argmax 0, label 2: wrong. */
	cr_assert_eq(correct, 2, "correct = %d", correct);
}

Test(layers, xent_correct_count)
{
	enum { B = 5, C = 4 };
	const float logits[B * C] = {
		0.1f, 0.9f, 0.3f, 0.2f,    // argmax 1
		2.0f, -1.0f, 0.0f, 1.0f,   // argmax 0
		-5.0f, -4.0f, -3.0f, -2.0f,// argmax 3
		0.0f, 0.0f, 1.0f, 1.0f,    // argmax 2 (first of the tie)
		7.0f, 7.5f, 7.25f, 0.0f,   // argmax 1
	};
	const int32_t labels[B] = {1, 1, 3, 3, 1};
	float probs[B * C];
	int correct = -1;
	softmax_xent_forward(probs, &correct, logits, labels, B, C);
	cr_assert_eq(correct, 3, "correct = %d, want 3", correct);
	/* NULL correct must be accepted. */
	double l = softmax_xent_forward(probs, NULL, logits, labels, B, C);
	cr_assert(isfinite(l) && l > 0.0);
}

/* ---- a whole chain: dense -> tanh -> dense -> relu -> dense -> xent ----- */

struct chain_ctx {
	int B, C, H, K;
	float *x, *w1, *b1, *w2, *b2, *w3, *b3;
	float *h1, *a1, *h2, *a2, *logits, *probs;
	int32_t *labels;
};

static double chain_objective(void *p)
{
	struct chain_ctx *c = p;
	dense_forward(c->h1, c->x, c->w1, c->b1, c->B, c->C, c->H);
	tanh_forward(c->a1, c->h1, (size_t)c->B * c->H);
	dense_forward(c->h2, c->a1, c->w2, c->b2, c->B, c->H, c->H);
	relu_forward(c->a2, c->h2, (size_t)c->B * c->H);
	dense_forward(c->logits, c->a2, c->w3, c->b3, c->B, c->H, c->K);
	return softmax_xent_forward(c->probs, NULL, c->logits, c->labels, c->B, c->K)
	       / c->B;
}

Test(layers, chain_gradcheck)
{
	struct chain_ctx c = {.B = 3, .C = 7, .H = 5, .K = 4};
	int B = c.B, C = c.C, H = c.H, K = c.K;
	c.x = rand_array((size_t)B * C, 1.0);
	c.w1 = rand_array((size_t)H * C, 0.7); c.b1 = rand_array(H, 0.3);
	c.w2 = rand_array((size_t)H * H, 0.7); c.b2 = rand_array(H, 0.3);
	c.w3 = rand_array((size_t)K * H, 0.7); c.b3 = rand_array(K, 0.3);
	c.h1 = zero_array((size_t)B * H); c.a1 = zero_array((size_t)B * H);
	c.h2 = zero_array((size_t)B * H); c.a2 = zero_array((size_t)B * H);
	c.logits = zero_array((size_t)B * K); c.probs = zero_array((size_t)B * K);
	c.labels = malloc(B * sizeof(int32_t));
	for (int b = 0; b < B; b++)
		c.labels[b] = b % K;

	chain_objective(&c);
	/* relu's kink: this seed must keep every pre-activation clear of 0
	 * by more than the stencil can move it; fail loudly if not. */
	for (int i = 0; i < B * H; i++)
		cr_assert(fabsf(c.h2[i]) > 0.05f, "h2[%d] = %g too near the relu kink",
			  i, (double)c.h2[i]);

	float *dw1 = zero_array((size_t)H * C), *db1 = zero_array(H);
	float *dw2 = zero_array((size_t)H * H), *db2 = zero_array(H);
	float *dw3 = zero_array((size_t)K * H), *db3 = zero_array(K);
	float *dlogits = zero_array((size_t)B * K), *da2 = zero_array((size_t)B * H);
	float *da1 = zero_array((size_t)B * H), *dx = zero_array((size_t)B * C);
	softmax_xent_backward(dlogits, c.probs, c.labels, B, K, 1.0f / B);
	dense_backward(da2, dw3, db3, dlogits, c.a2, c.w3, B, H, K);
	relu_backward(da2, da2, c.a2, (size_t)B * H);
	dense_backward(da1, dw2, db2, da2, c.a1, c.w2, B, H, H);
	tanh_backward(da1, da1, c.a1, (size_t)B * H);
	dense_backward(dx, dw1, db1, da1, c.x, c.w1, B, C, H);

	/* Smaller h than for single layers: the chain's fourth derivatives
	 * are larger, and perturbations must not cross the relu kink. */
	double h = 0x1p-7;
	check_grad("chain dx", c.x, dx, (size_t)B * C, h, chain_objective, &c);
	check_grad("chain dw1", c.w1, dw1, (size_t)H * C, h, chain_objective, &c);
	check_grad("chain db1", c.b1, db1, H, h, chain_objective, &c);
	check_grad("chain dw2", c.w2, dw2, (size_t)H * H, h, chain_objective, &c);
	check_grad("chain db2", c.b2, db2, H, h, chain_objective, &c);
	check_grad("chain dw3", c.w3, dw3, (size_t)K * H, h, chain_objective, &c);
	check_grad("chain db3", c.b3, db3, K, h, chain_objective, &c);

	float *bufs[] = {c.x, c.w1, c.b1, c.w2, c.b2, c.w3, c.b3, c.h1, c.a1, c.h2,
			 c.a2, c.logits, c.probs, dw1, db1, dw2, db2, dw3, db3,
			 dlogits, da2, da1, dx};
	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		free(bufs[i]);
	free(c.labels);
}

Test(layers, set_threads)
{
	layers_set_threads(1);
	cr_assert_eq(openblas_get_num_threads(), 1);
	layers_set_threads(0);
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int n = openblas_get_num_threads();
	/* OpenBLAS caps the count at the maximum it was built for. */
	cr_assert(n >= 1 && n <= ncpu, "threads %d, cpus %ld", n, ncpu);
	if (ncpu >= 2)
		cr_assert(n >= 2, "layers_set_threads(0) kept %d thread(s) on %ld cpus", n, ncpu);
}
