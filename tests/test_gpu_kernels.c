/* Every CUDA kernel of the GPU backend against its CPU twin (core/nn/layers.c,
 * core/nn/optim.c) on fresh random inputs, through the same struct backend the
 * training loop uses. Shapes include sizes that are not multiples of any
 * block size; outputs that a kernel must SET are poisoned with NaN first so
 * an element it forgets fails the comparison, and outputs it must
 * ACCUMULATE into start from random values.
 *
 * Without a GPU (CI) each test says it was skipped, and Criterion counts it
 * as skipped, never as passed. */
#include <criterion/criterion.h>

#include "leak.h"

#include "../core/data/dataset.h"
#include "../core/nn/backend.h"
#include "../core/nn/embed_plan.h"
#include "../core/nn/layers.h"
#include "../core/nn/optim.h"
#include "../core/nn/rng.h"
#include "../gpu/gpu.h"
#include "../gpu/kernels.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

TestSuite(gpu_kernels, .fini = leak_check);

#define TOL 1e-5

/* A new seed every run ("fresh random inputs"), printed in every failure so
 * a failing case can be replayed. */
static uint64_t run_seed(void)
{
	static uint64_t seed;
	if (!seed)
		seed = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
	return seed;
}

static void open_gpu(struct backend *b, const struct gpu_options *o)
{
	char err[320] = "";
	int n = 0;
	if (gpu_count(&n, err, sizeof(err)) < 0) {
		fprintf(stderr, "gpu_kernels: SKIPPED (needs a GPU: %s)\n", err);
		cr_skip_test("needs a GPU: %s", err);
	}
	struct gpu_options def = { 0.5, 1, 0 };
	int r = gpu_backend_open(b, 0, o ? o : &def, err, sizeof(err));
	cr_assert_eq(r, 0, "a GPU is visible but the backend does not open: %s", err);
	/* What replica_init reserves: scratch for the largest batch and width
	 * the kernel tests use (about 1 MiB). The tests that open with options
	 * of their own measure the arena or need no scratch: they get none. */
	if (!o)
		cr_assert_eq(b->ops->reserve(b->ctx, 4096, 4096), 0, "%s", gpu_backend_error(b));
}

static float *host_random(size_t n, uint64_t stream, float lo, float hi)
{
	float *p = malloc(n * sizeof(float) + 1);
	cr_assert_not_null(p);
	for (size_t i = 0; i < n; i++)
		p[i] = lo + (hi - lo) * (float)rng_uniform(run_seed(), stream, i);
	return p;
}

static void *dev_from(struct backend *b, const void *src, size_t bytes)
{
	void *d = NULL;
	cr_assert_eq(b->ops->alloc(b->ctx, &d, bytes), 0, "%s", gpu_backend_error(b));
	if (src)
		cr_assert_eq(b->ops->upload(b->ctx, d, src, bytes), 0, "%s", gpu_backend_error(b));
	return d;
}

/* A device buffer of n floats, all NaN. */
static float *dev_poisoned(struct backend *b, size_t n)
{
	float *h = malloc(n * sizeof(float) + 1);
	cr_assert_not_null(h);
	for (size_t i = 0; i < n; i++)
		h[i] = NAN;
	float *d = dev_from(b, h, n * sizeof(float));
	free(h);
	return d;
}

/* Max |gpu - cpu| over max(1, max |cpu|): fp32 results whose summation
 * order differs agree to a few ulps of the largest term. A NaN (an element
 * never written) fails. */
static void expect_close(struct backend *b, const float *dev, const float *cpu, size_t n,
			 const char *what)
{
	float *got = malloc(n * sizeof(float) + 1);
	cr_assert_not_null(got);
	cr_assert_eq(b->ops->download(b->ctx, got, dev, n * sizeof(float)), 0, "%s",
		     gpu_backend_error(b));
	double scale = 1.0, worst = 0.0;
	size_t at = 0;
	for (size_t i = 0; i < n; i++)
		if (fabs(cpu[i]) > scale)
			scale = fabs(cpu[i]);
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - (double)cpu[i]);
		if (!(d <= worst)) {   // NaN lands here too
			worst = isnan(d) ? INFINITY : d;
			at = i;
		}
	}
	cr_expect_lt(worst / scale, TOL, "%s: element %zu: gpu %.9g vs cpu %.9g (rel %.3g, seed %llu)",
		     what, at, got[at], cpu[at], worst / scale, (unsigned long long)run_seed());
	free(got);
}

Test(gpu_kernels, dense_forward_and_backward)
{
	struct backend b;
	open_gpu(&b, NULL);
	/* 1000 x 70: the bias gradient in several row blocks, one column block
	 * partly full; 4096 x 10: the largest the scratch covers. */
	const int shapes[][3] = { { 1, 1, 1 }, { 7, 33, 5 }, { 130, 257, 67 }, { 256, 784, 512 },
				  { 3, 1000, 10 }, { 1000, 20, 70 }, { 4096, 16, 10 } };
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		int B = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
		size_t nin = (size_t)B * C, nw = (size_t)OC * C, nout = (size_t)B * OC;
		float *x = host_random(nin, 10 + s, -1, 1), *w = host_random(nw, 20 + s, -0.5f, 0.5f);
		float *bias = host_random(OC, 30 + s, -1, 1), *dout = host_random(nout, 40 + s, -1, 1);
		float *dw = host_random(nw, 50 + s, -1, 1), *db = host_random(OC, 60 + s, -1, 1);
		float *out = malloc(nout * sizeof(float)), *dx = malloc(nin * sizeof(float));
		float *dx_d = dev_poisoned(&b, nin), *out_d = dev_poisoned(&b, nout);
		float *x_d = dev_from(&b, x, nin * 4), *w_d = dev_from(&b, w, nw * 4);
		float *bias_d = dev_from(&b, bias, OC * 4u), *dout_d = dev_from(&b, dout, nout * 4);
		float *dw_d = dev_from(&b, dw, nw * 4), *db_d = dev_from(&b, db, OC * 4u);

		char what[64];
		dense_forward(out, x, w, bias, B, C, OC);
		cr_assert_eq(b.ops->dense_forward(b.ctx, out_d, x_d, w_d, bias_d, B, C, OC), 0, "%s",
			     gpu_backend_error(&b));
		snprintf(what, sizeof(what), "dense forward %dx%d->%d", B, C, OC);
		expect_close(&b, out_d, out, nout, what);

		dense_backward(dx, dw, db, dout, x, w, B, C, OC);
		cr_assert_eq(b.ops->dense_backward(b.ctx, dx_d, dw_d, db_d, dout_d, x_d, w_d, B, C, OC),
			     0, "%s", gpu_backend_error(&b));
		snprintf(what, sizeof(what), "dense dinp %dx%d->%d", B, C, OC);
		expect_close(&b, dx_d, dx, nin, what);
		snprintf(what, sizeof(what), "dense dweight (accumulated) %dx%d->%d", B, C, OC);
		expect_close(&b, dw_d, dw, nw, what);
		snprintf(what, sizeof(what), "dense dbias (accumulated) %dx%d->%d", B, C, OC);
		expect_close(&b, db_d, db, (size_t)OC, what);
		free(x), free(w), free(bias), free(dout), free(dw), free(db), free(out), free(dx);
	}
	gpu_backend_close(&b);
}

/* The paths training takes besides the full one: the first layer has no
 * input gradient, and the GEMM-only bench runs without bias. */
Test(gpu_kernels, dense_without_bias_or_input_gradient)
{
	struct backend b;
	open_gpu(&b, NULL);
	const int B = 7, C = 33, OC = 5;
	size_t nin = (size_t)B * C, nw = (size_t)OC * C, nout = (size_t)B * OC;
	float *x = host_random(nin, 1100, -1, 1), *w = host_random(nw, 1101, -1, 1);
	float *dout = host_random(nout, 1102, -1, 1), *dw = host_random(nw, 1103, -1, 1);
	float *out = malloc(nout * 4);
	dense_forward(out, x, w, NULL, B, C, OC);
	float *x_d = dev_from(&b, x, nin * 4), *w_d = dev_from(&b, w, nw * 4);
	float *dout_d = dev_from(&b, dout, nout * 4), *dw_d = dev_from(&b, dw, nw * 4);
	float *out_d = dev_poisoned(&b, nout);
	cr_assert_eq(b.ops->dense_forward(b.ctx, out_d, x_d, w_d, NULL, B, C, OC), 0, "%s",
		     gpu_backend_error(&b));
	expect_close(&b, out_d, out, nout, "dense forward without bias");
	dense_backward(NULL, dw, NULL, dout, x, w, B, C, OC);
	cr_assert_eq(b.ops->dense_backward(b.ctx, NULL, dw_d, NULL, dout_d, x_d, w_d, B, C, OC), 0,
		     "%s", gpu_backend_error(&b));
	expect_close(&b, dw_d, dw, nw, "dense dweight without dinp and dbias");
	free(x), free(w), free(dout), free(dw), free(out);
	gpu_backend_close(&b);
}

Test(gpu_kernels, activations)
{
	struct backend b;
	open_gpu(&b, NULL);
	const size_t sizes[] = { 1, 255, 257, 100003, 1u << 21 };
	const enum layer_kind kinds[] = { LAYER_RELU, LAYER_TANH, LAYER_SIGMOID };
	for (size_t k = 0; k < 3; k++)
		for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
			size_t n = sizes[s];
			float *x = host_random(n, 100 + s, -6, 6), *dout = host_random(n, 200 + s, -1, 1);
			float *y = malloc(n * 4), *dx = malloc(n * 4);
			struct backend cpu;
			backend_cpu(&cpu, 1);
			cpu.ops->act_forward(NULL, kinds[k], y, x, n);
			cpu.ops->act_backward(NULL, kinds[k], dx, dout, y, n);
			float *x_d = dev_from(&b, x, n * 4), *dout_d = dev_from(&b, dout, n * 4);
			float *y_d = dev_poisoned(&b, n), *dx_d = dev_poisoned(&b, n);
			char what[64];
			cr_assert_eq(b.ops->act_forward(b.ctx, kinds[k], y_d, x_d, n), 0, "%s",
				     gpu_backend_error(&b));
			snprintf(what, sizeof(what), "%s forward n=%zu", layer_kind_name(kinds[k]), n);
			expect_close(&b, y_d, y, n, what);
			/* Backward from the CPU's forward output, so only backward is tested. */
			cr_assert_eq(b.ops->upload(b.ctx, y_d, y, n * 4), 0);
			cr_assert_eq(b.ops->act_backward(b.ctx, kinds[k], dx_d, dout_d, y_d, n), 0, "%s",
				     gpu_backend_error(&b));
			snprintf(what, sizeof(what), "%s backward n=%zu", layer_kind_name(kinds[k]), n);
			expect_close(&b, dx_d, dx, n, what);
			free(x), free(dout), free(y), free(dx);
		}
	gpu_backend_close(&b);
}

/* copy_check on the copy queue (gpu/copyq.cu, gk_nonfinite) against the
 * host's optim_nonfinite, over ranges at an odd offset (4-byte aligned
 * only, as a layer's range in the gradient may be) of sizes around the
 * block and grid. The bad values are put there by a kernel on the
 * compute stream (gpu_add of a delta, not waited for), so the check sees
 * them only if copy_after orders it behind that kernel. Every case uses
 * the same slot after the one before, so an answer left from the last
 * shows: clean values, the largest finite one among them, a NaN at a
 * random place, +inf last, -inf first, an infinity made by the sum
 * (FLT_MAX + FLT_MAX). The slots grow from 1 to 2 between sizes (the
 * answers' arrays taken again), and a slot past them is refused. */
Test(gpu_kernels, gradient_check_finds_what_the_cpu_finds)
{
	struct backend b;
	open_gpu(&b, NULL);
	const size_t sizes[] = { 1, 255, 257, 100003, (1u << 21) + 3, 3211264 };
	const struct backend_ops *o = b.ops;
	cr_assert_not_null(o->copy_check, "the GPU backend has no copy_check");
	cr_assert_eq(o->copy_reserve(b.ctx, 1), 0, "%s", gpu_backend_error(&b));
	cr_expect_lt(o->copy_check(b.ctx, 1, NULL, 1), 0, "a check of a slot not reserved was queued");
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		size_t n = sizes[s];
		int slot = s >= 3;   /* slot 1 once reserve(2) grew the queue */
		if (s == 3)
			cr_assert_eq(o->copy_reserve(b.ctx, 2), 0, "%s", gpu_backend_error(&b));
		float *x = host_random(n + 1, 300 + s, -1e3f, 1e3f), *h = NULL;
		float *delta = calloc(n + 1, sizeof(float)), *sum = malloc((n + 1) * sizeof(float));
		cr_assert(delta && sum);
		cr_assert_eq(o->host_alloc(b.ctx, (void **)&h, n * sizeof(float)), 0, "%s", gpu_backend_error(&b));
		float *d = dev_from(&b, NULL, (n + 1) * sizeof(float));
		float *dd = dev_from(&b, NULL, (n + 1) * sizeof(float));
		for (int c = 0; c < 6; c++) {
			size_t at = (size_t)(rng_uniform(run_seed(), 400 + s, (uint64_t)c) * (double)n) % n;
			float *v = delta + 1;
			memset(delta, 0, (n + 1) * sizeof(float));
			x[1] = c == 5 ? FLT_MAX : 0.5f;
			if (c == 1)
				v[0] = FLT_MAX - x[1];   /* the sum: the largest finite value */
			if (c == 2)
				v[at] = NAN;
			if (c == 3)
				v[n - 1] = INFINITY;
			if (c == 4)
				v[0] = -INFINITY;
			if (c == 5)
				v[0] = FLT_MAX;
			for (size_t i = 0; i <= n; i++)
				sum[i] = x[i] + delta[i];
			int want = optim_nonfinite(sum + 1, n) < n;
			cr_assert_eq(o->upload(b.ctx, d, x, (n + 1) * sizeof(float)), 0);
			cr_assert_eq(o->upload(b.ctx, dd, delta, (n + 1) * sizeof(float)), 0);
			cr_assert_eq(gpu_add(&b, d, dd, n + 1), 0, "%s", gpu_backend_error(&b));
			cr_assert_eq(o->copy_after(b.ctx), 0, "%s", gpu_backend_error(&b));
			cr_assert_eq(o->copy_check(b.ctx, slot, d + 1, n), 0, "%s", gpu_backend_error(&b));
			cr_assert_eq(o->copy_down(b.ctx, slot, h, d + 1, n * sizeof(float)), 0, "%s",
				     gpu_backend_error(&b));
			cr_assert_eq(o->copy_wait(b.ctx, slot), 0, "%s", gpu_backend_error(&b));
			int found = o->copy_found(b.ctx, slot);
			cr_expect_eq(found, want, "n=%zu case %d (at %zu): the GPU says %d, the CPU %d (seed %llu)", n,
				     c, at, found, want, (unsigned long long)run_seed());
			size_t off = 0;   /* NaN's bits may differ (the GPU's is canonical) */
			while (off < n && (h[off] == sum[off + 1] || (isnan(h[off]) && isnan(sum[off + 1]))))
				off++;
			cr_expect_eq(off, n, "n=%zu case %d: the range that landed differs from the sum at %zu", n, c,
				     off);
		}
		o->host_free(b.ctx, h);
		free(x), free(delta), free(sum);
	}
	gpu_backend_close(&b);
}

Test(gpu_kernels, softmax_cross_entropy)
{
	struct backend b;
	open_gpu(&b, NULL);
	const int shapes[][2] = { { 1, 2 }, { 33, 10 }, { 129, 1000 }, { 3, 300 }, { 4096, 10 } };
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		int B = shapes[s][0], C = shapes[s][1];
		size_t n = (size_t)B * C;
		float *x = host_random(n, 300 + s, -8, 8);
		int32_t *y = malloc((size_t)B * sizeof(int32_t));
		for (int i = 0; i < B; i++)
			y[i] = (int32_t)(rng_uniform(run_seed(), 400 + s, (uint64_t)i) * C) % C;
		/* A tie in row 0: the first maximum must win on both sides. */
		if (C > 3) {
			x[1] = x[3] = 9.0f;
			y[0] = 3;
		}
		/* And a tie inside one GPU thread's stride (i and i + 256). */
		if (C > 300 && B > 1) {
			x[C + 5] = x[C + 5 + 256] = 20.0f;
			y[1] = 5 + 256;
		}
		float *p = malloc(n * 4), *d = malloc(n * 4);
		int right = -1;
		double loss = softmax_xent_forward(p, &right, x, y, B, C);
		softmax_xent_backward(d, p, y, B, C, 1.0f / 77);
		float *x_d = dev_from(&b, x, n * 4), *p_d = dev_poisoned(&b, n), *d_d = dev_poisoned(&b, n);
		int32_t *y_d = dev_from(&b, y, (size_t)B * sizeof(int32_t));
		/* The meter is added to: it starts from values of its own. */
		const double start[2] = { 0.5, 3.0 };
		double *meter_d = dev_from(&b, start, sizeof(start)), got[2];
		cr_assert_eq(b.ops->xent_forward(b.ctx, p_d, meter_d, x_d, y_d, B, C), 0, "%s",
			     gpu_backend_error(&b));
		char what[64];
		snprintf(what, sizeof(what), "softmax probs %dx%d", B, C);
		expect_close(&b, p_d, p, n, what);
		cr_assert_eq(b.ops->download(b.ctx, got, meter_d, sizeof(got)), 0);
		cr_expect_lt(fabs(got[0] - start[0] - loss) / (fabs(loss) + 1e-30), TOL,
			     "loss %dx%d: gpu %.12g cpu %.12g (seed %llu)", B, C, got[0] - start[0], loss,
			     (unsigned long long)run_seed());
		cr_expect_eq(got[1] - start[1], (double)right, "correct %dx%d: gpu %g cpu %d", B, C,
			     got[1] - start[1], right);
		cr_assert_eq(b.ops->upload(b.ctx, p_d, p, n * 4), 0);
		cr_assert_eq(b.ops->xent_backward(b.ctx, d_d, p_d, y_d, B, C, 1.0f / 77), 0, "%s",
			     gpu_backend_error(&b));
		snprintf(what, sizeof(what), "softmax xent backward %dx%d", B, C);
		expect_close(&b, d_d, d, n, what);

		/* Training's one pass: the same gradient and meter, and it may
		 * write over its logits. */
		float *t_d = dev_poisoned(&b, n);
		cr_assert_eq(b.ops->upload(b.ctx, meter_d, start, sizeof(start)), 0);
		cr_assert_eq(b.ops->xent_train(b.ctx, t_d, meter_d, x_d, y_d, B, C, 1.0f / 77), 0, "%s",
			     gpu_backend_error(&b));
		snprintf(what, sizeof(what), "fused softmax xent gradient %dx%d", B, C);
		expect_close(&b, t_d, d, n, what);
		cr_assert_eq(b.ops->xent_train(b.ctx, x_d, meter_d, x_d, y_d, B, C, 1.0f / 77), 0, "%s",
			     gpu_backend_error(&b));
		snprintf(what, sizeof(what), "fused softmax xent in place %dx%d", B, C);
		expect_close(&b, x_d, d, n, what);
		cr_assert_eq(b.ops->download(b.ctx, got, meter_d, sizeof(got)), 0);
		cr_expect_lt(fabs(got[0] - start[0] - 2 * loss) / (fabs(loss) + 1e-30), TOL,
			     "fused loss %dx%d twice: gpu %.12g cpu %.12g", B, C, got[0] - start[0], 2 * loss);
		cr_expect_eq(got[1] - start[1], 2.0 * right, "fused correct %dx%d twice: gpu %g cpu %d", B,
			     C, got[1] - start[1], 2 * right);
		free(x), free(y), free(p), free(d);
	}
	gpu_backend_close(&b);
}

/* A batch gathered from a training set on the device is the host's gather,
 * bit for bit, whatever the order (repeats and the last row included) and
 * wherever in the order the batch starts. */
Test(gpu_kernels, gather_rows_by_order)
{
	struct backend b;
	open_gpu(&b, NULL);
	/* {n, D, B}: B past 65535 rows (the grid's rows stride) and D past
	 * 64 blocks of 256 (its columns stride). */
	const size_t shapes[][3] = { { 1000, 37, 501 }, { 300, 784, 151 }, { 70000, 1, 4096 },
				     { 70000, 3, 69990 }, { 50, 20000, 20 } };
	const size_t at = 7;
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		size_t n = shapes[s][0], D = shapes[s][1];
		int B = (int)shapes[s][2];
		size_t no = at + (size_t)B;
		float *x = host_random(n * D, 1300 + s, -1, 1), *xb = malloc((size_t)B * D * 4);
		int32_t *y = malloc(n * sizeof(int32_t)), *yb = malloc((size_t)B * sizeof(int32_t));
		int32_t *yg = malloc((size_t)B * sizeof(int32_t));
		uint32_t *order = malloc(no * sizeof(uint32_t));
		for (size_t i = 0; i < n; i++)
			y[i] = (int32_t)(rng_hash(run_seed(), 1310 + s, i) % 1000);
		for (size_t i = 0; i < no; i++)
			order[i] = (uint32_t)(rng_hash(run_seed(), 1320 + s, i) % n);
		order[at] = (uint32_t)(n - 1);
		order[no - 1] = order[at];
		for (int i = 0; i < B; i++) {
			memcpy(xb + (size_t)i * D, x + (size_t)order[at + i] * D, D * 4);
			yb[i] = y[order[at + i]];
		}
		float *x_d = dev_from(&b, x, n * D * 4), *xb_d = dev_poisoned(&b, (size_t)B * D);
		int32_t *y_d = dev_from(&b, y, n * sizeof(int32_t));
		int32_t *yb_d = dev_from(&b, NULL, (size_t)B * sizeof(int32_t));
		uint32_t *o_d = dev_from(&b, order, no * sizeof(uint32_t));
		cr_assert_eq(b.ops->gather(b.ctx, xb_d, yb_d, x_d, y_d, o_d, at, B, D), 0, "%s",
			     gpu_backend_error(&b));
		float *got = malloc((size_t)B * D * 4);
		cr_assert_eq(b.ops->download(b.ctx, got, xb_d, (size_t)B * D * 4), 0);
		cr_assert_eq(b.ops->download(b.ctx, yg, yb_d, (size_t)B * sizeof(int32_t)), 0);
		cr_expect_eq(memcmp(got, xb, (size_t)B * D * 4), 0, "gathered rows differ (n %zu, D %zu)", n, D);
		cr_expect_eq(memcmp(yg, yb, (size_t)B * sizeof(int32_t)), 0, "gathered labels differ (n %zu)", n);
		free(x), free(xb), free(y), free(yb), free(yg), free(order), free(got);
	}
	gpu_backend_close(&b);
}

/* The fusions against the parts on the CPU: a dense layer with its
 * activation, and an activation's backward with the bias gradient of the
 * dense layer before it (several row blocks, columns not a multiple of 32,
 * and the scratch's largest shape). */
Test(gpu_kernels, fused_dense_activation_and_bias_gradient)
{
	struct backend b, cpu;
	open_gpu(&b, NULL);
	backend_cpu(&cpu, 1);
	const int shapes[][3] = { { 1, 3, 1 }, { 7, 33, 5 }, { 300, 64, 513 }, { 4096, 8, 10 },
				  { 65, 20, 32 } };
	const enum layer_kind kinds[] = { LAYER_RELU, LAYER_TANH, LAYER_SIGMOID };
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
		for (size_t k = 0; k < 3; k++) {
			int B = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
			size_t nin = (size_t)B * C, nw = (size_t)OC * C, nout = (size_t)B * OC;
			uint64_t st = 1400 + 10 * s + k;
			float *x = host_random(nin, st, -1, 1), *w = host_random(nw, st + 1, -0.5f, 0.5f);
			float *bias = host_random(OC, st + 2, -1, 1), *dout = host_random(nout, st + 3, -1, 1);
			float *db = host_random(OC, st + 4, -1, 1), *out = malloc(nout * 4);
			dense_forward(out, x, w, bias, B, C, OC);
			cpu.ops->act_forward(cpu.ctx, kinds[k], out, out, nout);
			float *x_d = dev_from(&b, x, nin * 4), *w_d = dev_from(&b, w, nw * 4);
			float *bias_d = dev_from(&b, bias, OC * 4u), *out_d = dev_poisoned(&b, nout);
			char what[96];
			cr_assert_eq(b.ops->dense_act_forward(b.ctx, out_d, x_d, w_d, bias_d, B, C, OC, kinds[k]),
				     0, "%s", gpu_backend_error(&b));
			snprintf(what, sizeof(what), "dense+%s forward %dx%d->%d", layer_kind_name(kinds[k]), B, C, OC);
			expect_close(&b, out_d, out, nout, what);

			/* Backward from the CPU's forward output. */
			float *dout_d = dev_from(&b, dout, nout * 4), *db_d = dev_from(&b, db, OC * 4u);
			cr_assert_eq(b.ops->upload(b.ctx, out_d, out, nout * 4), 0);
			cpu.ops->act_backward(cpu.ctx, kinds[k], dout, dout, out, nout);
			for (int r = 0; r < B; r++)
				for (int o = 0; o < OC; o++)
					db[o] += dout[(size_t)r * OC + o];
			cr_assert_eq(b.ops->act_bias_backward(b.ctx, kinds[k], dout_d, db_d, out_d, B, OC), 0,
				     "%s", gpu_backend_error(&b));
			snprintf(what, sizeof(what), "%s backward in place %dx%d", layer_kind_name(kinds[k]), B, OC);
			expect_close(&b, dout_d, dout, nout, what);
			snprintf(what, sizeof(what), "bias gradient after %s %dx%d (accumulated)",
				 layer_kind_name(kinds[k]), B, OC);
			expect_close(&b, db_d, db, (size_t)OC, what);
			/* Twice: the tickets must be back at zero for the next launch. */
			cr_assert_eq(b.ops->act_bias_backward(b.ctx, LAYER_DENSE, dout_d, db_d, NULL, B, OC), 0,
				     "%s", gpu_backend_error(&b));
			for (int r = 0; r < B; r++)
				for (int o = 0; o < OC; o++)
					db[o] += dout[(size_t)r * OC + o];
			snprintf(what, sizeof(what), "bias gradient alone, again %dx%d", B, OC);
			expect_close(&b, db_d, db, (size_t)OC, what);
			free(x), free(w), free(bias), free(dout), free(db), free(out);
		}
	gpu_backend_close(&b);
}

/* The optimizer kernel against optim.c for each rule, several steps. */
Test(gpu_kernels, optimizer_updates)
{
	struct backend b;
	open_gpu(&b, NULL);
	cr_assert_eq((int)OPTIM_SGD, 0);
	cr_assert_eq((int)OPTIM_MOMENTUM, 1);
	cr_assert_eq((int)OPTIM_ADAM, 2);
	const size_t n = 100003;
	const struct optim_config cfgs[] = {
		{ .kind = OPTIM_SGD, .lr = 0.1f, .weight_decay = 1e-4f },
		{ .kind = OPTIM_MOMENTUM, .lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f },
		{ .kind = OPTIM_MOMENTUM, .lr = 0.05f, .momentum = 0.9f, .nesterov = 1 },
		{ .kind = OPTIM_ADAM, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
		  .weight_decay = 1e-2f },
	};
	for (size_t c = 0; c < sizeof(cfgs) / sizeof(cfgs[0]); c++) {
		struct optim o;
		cr_assert_eq(optim_init(&o, &cfgs[c], n), 0);
		float *p = host_random(n, 500 + c, -1, 1);
		float *p_d = dev_from(&b, p, n * 4), *g_d = dev_poisoned(&b, n);
		float *m_d = dev_from(&b, NULL, n * 4), *v_d = dev_from(&b, NULL, n * 4);
		cr_assert_eq(b.ops->zero(b.ctx, m_d, n * 4), 0);
		cr_assert_eq(b.ops->zero(b.ctx, v_d, n * 4), 0);
		for (int step = 1; step <= 3; step++) {
			float *g = host_random(n, 600 + 10 * c + (size_t)step, -1, 1);
			cr_assert_eq(b.ops->upload(b.ctx, g_d, g, n * 4), 0);
			optim_step_zero(&o, p, g, cfgs[c].lr);
			double bc1 = 1.0 - pow(cfgs[c].beta1, (double)step);
			double bc2 = 1.0 - pow(cfgs[c].beta2, (double)step);
			struct gk_optim k = {
				.kind = (int)cfgs[c].kind, .lr = cfgs[c].lr, .wd = cfgs[c].weight_decay,
				.mu = cfgs[c].momentum, .nesterov = cfgs[c].nesterov, .b1 = cfgs[c].beta1,
				.b2 = cfgs[c].beta2, .eps = cfgs[c].eps,
				.step_size = cfgs[c].kind == OPTIM_ADAM ? (float)(cfgs[c].lr / bc1) : 0,
				.inv_sqrt_bc2 = cfgs[c].kind == OPTIM_ADAM ? (float)(1.0 / sqrt(bc2)) : 0,
			};
			cr_assert_eq(gpu_optim_step(&b, &k, p_d, g_d, m_d, v_d, n, 1), 0, "%s",
				     gpu_backend_error(&b));
			free(g);
		}
		char what[64];
		snprintf(what, sizeof(what), "optimizer kind %d after 3 steps", (int)cfgs[c].kind);
		expect_close(&b, p_d, p, n, what);
		float *zeros = calloc(n, sizeof(float));
		snprintf(what, sizeof(what), "optimizer kind %d zeroes the gradient", (int)cfgs[c].kind);
		expect_close(&b, g_d, zeros, n, what);
		if (o.m) {
			snprintf(what, sizeof(what), "optimizer kind %d first moment", (int)cfgs[c].kind);
			expect_close(&b, m_d, o.m, n, what);
		}
		if (o.v) {
			snprintf(what, sizeof(what), "optimizer kind %d second moment", (int)cfgs[c].kind);
			expect_close(&b, v_d, o.v, n, what);
		}
		free(zeros), free(p);
		optim_free(&o);
	}
	gpu_backend_close(&b);
}

/* A rule whose state is missing (Adam without v, momentum or Adam without
 * m) is refused with the buffer named and nothing launched: the
 * parameters and the gradient keep their values, and the stream has no
 * sticky error (the next launch and a sync succeed), where stepping
 * through NULL was an illegal memory access that ended the context. */
Test(gpu_kernels, optimizer_refuses_missing_state)
{
	struct backend b;
	open_gpu(&b, NULL);
	const size_t n = 1037;
	float *p = host_random(n, 800, -1, 1), *g = host_random(n, 801, -1, 1);
	float *p_d = dev_from(&b, p, n * 4), *g_d = dev_from(&b, g, n * 4);
	float *m_d = dev_from(&b, NULL, n * 4);
	cr_assert_eq(b.ops->zero(b.ctx, m_d, n * 4), 0);
	static const struct {
		int kind, has_m;
		const char *text;
	} rows[] = {
		{ OPTIM_ADAM, 1, "second moment (v)" },
		{ OPTIM_ADAM, 0, "first moment (m)" },
		{ OPTIM_MOMENTUM, 0, "momentum buffer (m)" },
		{ 9, 1, "unknown optimizer kind 9" },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct gk_optim k = { .kind = rows[i].kind, .lr = 0.1f, .mu = 0.9f, .b1 = 0.9f, .b2 = 0.999f,
				      .eps = 1e-8f, .step_size = 0.1f, .inv_sqrt_bc2 = 1.0f };
		int r = gpu_optim_step(&b, &k, p_d, g_d, rows[i].has_m ? m_d : NULL, NULL, n, 1);
		cr_expect_eq(r, -EINVAL, "row %zu: %d (%s)", i, r, gpu_backend_error(&b));
		cr_expect_not_null(strstr(gpu_backend_error(&b), rows[i].text), "row %zu: \"%s\"", i,
				   gpu_backend_error(&b));
		cr_expect_not_null(strstr(gpu_backend_error(&b), "not launched"), "%s", gpu_backend_error(&b));
	}
	cr_assert_eq(gpu_sync(&b), 0, "%s", gpu_backend_error(&b));
	expect_close(&b, p_d, p, n, "parameters after refused steps");
	expect_close(&b, g_d, g, n, "gradient after refused steps");
	struct gk_optim sgd = { .kind = OPTIM_SGD, .lr = 0.5f };
	cr_assert_eq(gpu_optim_step(&b, &sgd, p_d, g_d, NULL, NULL, n, 0), 0, "%s", gpu_backend_error(&b));
	cr_assert_eq(gpu_sync(&b), 0, "%s", gpu_backend_error(&b));
	for (size_t i = 0; i < n; i++)
		p[i] -= 0.5f * g[i];
	expect_close(&b, p_d, p, n, "an sgd step after the refusals");
	free(p), free(g);
	gpu_backend_close(&b);
}

/* A cap far below what a buffer needs is refused with the need and the cap,
 * before anything runs. */
Test(gpu_kernels, memory_fraction_refuses_a_tiny_cap)
{
	struct backend b;
	struct gpu_options tiny = { 1e-6, 0, 0 };   // ~100 KB of an 80 GB GPU
	open_gpu(&b, &tiny);
	void *p = NULL;
	int r = b.ops->alloc(b.ctx, &p, (size_t)64 << 20);
	cr_assert_eq(r, -ENOMEM, "a 64 MiB buffer fit a %g memory fraction", tiny.memory_fraction);
	const char *why = gpu_backend_error(&b);
	cr_assert_not_null(strstr(why, "needs"), "%s", why);
	cr_assert_not_null(strstr(why, "memory_fraction"), "%s", why);
	gpu_backend_close(&b);
}

/* With growth, memory is taken as needed up to the cap, no further. */
Test(gpu_kernels, allow_growth_grows_to_the_cap)
{
	struct backend b;
	struct gpu_options grow = { 0.01, 1, 0 };
	open_gpu(&b, &grow);
	void *p = NULL;
	cr_assert_eq(b.ops->alloc(b.ctx, &p, 1 << 20), 0, "%s", gpu_backend_error(&b));
	cr_assert_eq(gpu_backend_used(&b), (size_t)1 << 20);
	int r = 0;
	for (int i = 0; i < 100000 && !r; i++)
		r = b.ops->alloc(b.ctx, &p, (size_t)16 << 20);
	cr_assert_eq(r, -ENOMEM, "growth never stopped at the cap");
	cr_assert_not_null(strstr(gpu_backend_error(&b), "memory_fraction"), "%s", gpu_backend_error(&b));
	struct gpu_info info;
	char err[256];
	cr_assert_eq(gpu_query(0, &info, err, sizeof(err)), 0, "%s", err);
	double cap = grow.memory_fraction * (double)info.total_bytes;
	cr_expect_gt((double)gpu_backend_used(&b), cap / 2, "growth stopped at %zu bytes of a %.0f cap",
		     gpu_backend_used(&b), cap);
	gpu_backend_close(&b);
}

/* ---- convolutional layers --------------------------------------------- */

static struct window win(int C, int H, int W, int K, int S, int P)
{
	struct window w = { .C = C, .H = H, .W = W, .K = K, .S = S, .P = P };
	cr_assert_eq(window_init(&w), 0, "bad test window");
	return w;
}

/* One conv case ({B, OC, C, H, W, K, S, P}) on b against the CPU, with the
 * scratch b asks for; returns the samples per GEMM that scratch holds.
 * With keep, forward keeps its columns in a buffer of the layer's own
 * where b offers one (conv_keep_floats; else the case runs without) and
 * backward gets an input of NaNs: it must use the kept columns, not
 * rebuild them. */
static size_t conv_case_keep(struct backend *b, const int *k, uint64_t t, int keep)
{
	int B = k[0], OC = k[1];
	struct window w = win(k[2], k[3], k[4], k[5], k[6], k[7]);
	size_t nin = (size_t)B * w.C * w.H * w.W, nout = (size_t)B * OC * w.OH * w.OW;
	size_t nw = (size_t)OC * w.C * w.K * w.K, ncol = conv_col_size(&w, OC, B);
	size_t ncol_d = b->ops->conv_col_floats(b->ctx, &w, OC, B);
	float *x = host_random(nin, 700 + t, -1, 1), *wt = host_random(nw, 710 + t, -0.3f, 0.3f);
	float *bias = host_random(OC, 720 + t, -1, 1), *dout = host_random(nout, 730 + t, -1, 1);
	float *dw = host_random(nw, 740 + t, -1, 1), *db = host_random(OC, 750 + t, -1, 1);
	float *out = malloc(nout * 4), *dx = malloc(nin * 4), *col = malloc(ncol * 4);
	conv_forward(out, col, x, wt, bias, B, OC, &w);
	conv_backward(dx, dw, db, col, dout, x, wt, B, OC, &w);
	float *h_dw = host_random(nw, 740 + t, -1, 1), *h_db = host_random(OC, 750 + t, -1, 1);
	float *x_d = dev_from(b, x, nin * 4), *w_d = dev_from(b, wt, nw * 4);
	float *bias_d = dev_from(b, bias, OC * 4u), *dout_d = dev_from(b, dout, nout * 4);
	float *dw_d = dev_from(b, h_dw, nw * 4), *db_d = dev_from(b, h_db, OC * 4u);
	float *col_d = dev_poisoned(b, ncol_d), *out_d = dev_poisoned(b, nout);
	float *dx_d = dev_poisoned(b, nin);
	size_t nkeep = keep ? b->ops->conv_keep_floats(b->ctx, &w, OC, B) : 0;
	float *keep_d = nkeep ? dev_poisoned(b, nkeep) : NULL;
	char what[96];
	cr_assert_eq(b->ops->conv_forward(b->ctx, out_d, col_d, keep_d, x_d, w_d, bias_d, B, OC, &w), 0,
		     "%s", gpu_backend_error(b));
	snprintf(what, sizeof(what), "conv forward case %llu", (unsigned long long)t);
	expect_close(b, out_d, out, nout, what);
	cr_assert_eq(b->ops->conv_backward(b->ctx, dx_d, dw_d, db_d, col_d, keep_d, dout_d,
					   keep_d ? dev_poisoned(b, nin) : x_d, w_d, B, OC, &w), 0, "%s",
		     gpu_backend_error(b));
	snprintf(what, sizeof(what), "conv dinp case %llu", (unsigned long long)t);
	expect_close(b, dx_d, dx, nin, what);
	snprintf(what, sizeof(what), "conv dweight (accumulated) case %llu", (unsigned long long)t);
	expect_close(b, dw_d, dw, nw, what);
	snprintf(what, sizeof(what), "conv dbias (accumulated) case %llu", (unsigned long long)t);
	expect_close(b, db_d, db, (size_t)OC, what);
	free(x), free(wt), free(bias), free(dout), free(dw), free(db), free(out), free(dx);
	free(col), free(h_dw), free(h_db);
	size_t per = ((size_t)w.C * w.K * w.K + OC) * w.OH * w.OW;
	return keep && !keep_d ? 0 : ncol_d / per;
}

static size_t conv_case(struct backend *b, const int *k, uint64_t t)
{
	return conv_case_keep(b, k, t, 0);
}

Test(gpu_kernels, conv_forward_and_backward)
{
	struct backend b;
	open_gpu(&b, NULL);
	/* {B, OC, C, H, W, K, S, P}: the Fashion CNN's first layer, strides,
	 * padding and sizes that are not multiples of anything, a whole
	 * batch of the second layer, which the GPU does in one GEMM, and a
	 * bias gradient whose channel sums (made in the gather) are split
	 * over 24 blocks a channel. */
	const int cases[][8] = { { 3, 32, 1, 28, 28, 5, 1, 0 }, { 5, 7, 3, 9, 7, 3, 2, 1 },
				 { 2, 64, 32, 14, 14, 5, 1, 2 }, { 1, 1, 1, 1, 1, 1, 1, 0 },
				 { 256, 64, 32, 14, 14, 5, 1, 2 }, { 61, 3, 1, 28, 28, 5, 1, 2 } };
	for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
		size_t chunk = conv_case(&b, cases[t], t);
		cr_expect_eq(chunk, (size_t)cases[t][0], "case %zu: %zu samples per GEMM, want the batch",
			     t, chunk);
	}
	gpu_backend_close(&b);
}

/* Under a small cap the GPU's scratch holds part of the batch: the chunks
 * must still add up to the whole (the last one short). */
Test(gpu_kernels, conv_in_chunks_under_a_small_cap)
{
	struct backend b;
	struct gpu_options small = { 0.0005, 1, 0 };   /* 40 MiB of 80 GiB: 5 MiB of scratch */
	open_gpu(&b, &small);
	const int c[8] = { 61, 64, 32, 14, 14, 5, 1, 2 };
	size_t chunk = conv_case(&b, c, 9);
	cr_expect(chunk > 1 && chunk < (size_t)c[0], "%zu samples per GEMM: no chunking tested", chunk);
	gpu_backend_close(&b);
}

/* One pooling case on b against the CPU, max and average: forward and
 * backward (outputs poisoned first), with a tie at the first two inputs
 * (the first maximum gets the gradient on both sides). */
static void pool_case(struct backend *b, int B, const struct window *w, uint64_t t)
{
	size_t nin = (size_t)B * w->C * w->H * w->W, nout = (size_t)B * w->C * w->OH * w->OW;
	float *x = host_random(nin, 800 + t, -1, 1), *dout = host_random(nout, 810 + t, -1, 1);
	x[0] = 5.0f;
	if (nin > 1)
		x[1] = 5.0f;
	float *out = malloc(nout * 4), *dx = malloc(nin * 4);
	float *x_d = dev_from(b, x, nin * 4), *dout_d = dev_from(b, dout, nout * 4);
	for (int max = 0; max < 2; max++) {
		enum layer_kind kind = max ? LAYER_MAXPOOL : LAYER_AVGPOOL;
		if (max) {
			maxpool_forward(out, x, B, w);
			maxpool_backward(dx, dout, x, B, w);
		} else {
			avgpool_forward(out, x, B, w);
			avgpool_backward(dx, dout, B, w);
		}
		float *out_d = dev_poisoned(b, nout), *dx_d = dev_poisoned(b, nin);
		char what[128];
		cr_assert_eq(b->ops->pool_forward(b->ctx, kind, out_d, x_d, B, w), 0, "%s",
			     gpu_backend_error(b));
		snprintf(what, sizeof(what), "%s forward case %llu (B %d C %d %dx%d K %d S %d)",
			 max ? "maxpool" : "avgpool", (unsigned long long)t, B, w->C, w->H, w->W, w->K, w->S);
		expect_close(b, out_d, out, nout, what);
		cr_assert_eq(b->ops->pool_backward(b->ctx, kind, dx_d, dout_d, x_d, B, w), 0, "%s",
			     gpu_backend_error(b));
		snprintf(what, sizeof(what), "%s backward case %llu (B %d C %d %dx%d K %d S %d)",
			 max ? "maxpool" : "avgpool", (unsigned long long)t, B, w->C, w->H, w->W, w->K, w->S);
		expect_close(b, dx_d, dx, nin, what);
	}
	free(x), free(dout), free(out), free(dx);
}

Test(gpu_kernels, pooling)
{
	struct backend b;
	open_gpu(&b, NULL);
	/* {B, C, H, W, K, S}: tiled 2x2 on an odd size (a row and column no
	 * window covers), overlapping 3x3 stride 2, one window. */
	const int cases[][6] = { { 3, 4, 7, 7, 2, 2 }, { 2, 3, 9, 8, 3, 2 }, { 1, 1, 4, 4, 4, 4 } };
	for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
		const int *k = cases[t];
		struct window w = win(k[1], k[2], k[3], k[4], k[5], 0);
		pool_case(&b, k[0], &w, t);
	}
	gpu_backend_close(&b);
}

/* The same masks as the CPU, so a run's dropout does not depend on where
 * it trains: outputs must agree exactly, not just closely. */
Test(gpu_kernels, dropout_masks_match_the_cpu)
{
	struct backend b;
	open_gpu(&b, NULL);
	const size_t n = 100003;
	const float ps[] = { 0.0f, 0.1f, 0.5f, 0.9f };
	float *x = host_random(n, 900, -1, 1), *y = malloc(n * 4), *got = malloc(n * 4);
	float *x_d = dev_from(&b, x, n * 4);
	for (size_t i = 0; i < 4; i++) {
		uint64_t key = run_seed() + i;
		int layer = 3 + (int)i;
		dropout_forward(y, x, ps[i], dropout_layer_key(key, layer), n);
		float *y_d = dev_poisoned(&b, n);
		cr_assert_eq(b.ops->dropout_forward(b.ctx, y_d, x_d, ps[i], key, layer, n), 0, "%s",
			     gpu_backend_error(&b));
		cr_assert_eq(b.ops->download(b.ctx, got, y_d, n * 4), 0);
		cr_expect_eq(memcmp(got, y, n * 4), 0, "dropout p=%g: masks differ from the CPU (seed %llu)",
			     ps[i], (unsigned long long)run_seed());
	}
	free(x), free(y), free(got);
	gpu_backend_close(&b);
}

/* Dropout captured in a CUDA graph reads the step's key from device
 * memory: replayed with a key other than the one it was captured with, it
 * makes that key's masks (a frozen key would make the capture's), forward
 * and in place backward. */
Test(gpu_kernels, dropout_in_a_graph_reads_the_step_key)
{
	struct backend b;
	open_gpu(&b, NULL);
	const size_t n = 70001;
	const float p = 0.3f;
	const int layer = 5;
	float *x = host_random(n, 910, -1, 1), *y = malloc(n * 4), *dx = malloc(n * 4);
	float *got = malloc(n * 4);
	float *x_d = dev_from(&b, x, n * 4), *y_d = dev_poisoned(&b, n), *d_d = dev_poisoned(&b, n);
	cr_assert_eq(gpu_graph_begin(&b), 0, "%s", gpu_backend_error(&b));
	int f = b.ops->dropout_forward(b.ctx, y_d, x_d, p, 1, layer, n);
	if (!f)
		f = b.ops->dropout_backward(b.ctx, d_d, y_d, p, 1, layer, n);
	cr_assert_eq(gpu_graph_end(&b, f), 0, "%s", gpu_backend_error(&b));
	for (uint64_t s = 0; s < 3; s++) {
		uint64_t key = run_seed() ^ (0x9e37u * (s + 2));
		struct gk_step st = { .key = key };
		cr_assert_eq(gpu_graph_launch(&b, &st), 0, "%s", gpu_backend_error(&b));
		dropout_forward(y, x, p, dropout_layer_key(key, layer), n);
		dropout_backward(dx, y, p, dropout_layer_key(key, layer), n);
		cr_assert_eq(b.ops->download(b.ctx, got, y_d, n * 4), 0, "%s", gpu_backend_error(&b));
		cr_expect_eq(memcmp(got, y, n * 4), 0, "replay %llu: forward masks are not the step key's",
			     (unsigned long long)s);
		cr_assert_eq(b.ops->download(b.ctx, got, d_d, n * 4), 0, "%s", gpu_backend_error(&b));
		cr_expect_eq(memcmp(got, dx, n * 4), 0, "replay %llu: backward masks are not the step key's",
			     (unsigned long long)s);
	}
	free(x), free(y), free(dx), free(got);
	gpu_backend_close(&b);
}

/* How a batchnorm case runs: the input gradient in its own buffer, in
 * place over dout, or not asked for; BN_STATS: the batch statistics only
 * (a channel far from zero, whose y = a x + d cancels to a few digits on
 * both sides, and differently where the GPU fuses the multiply-add). */
enum bn_mode { BN_APART, BN_IN_PLACE, BN_NO_DINP, BN_STATS };

/* One batchnorm case {B, C, HW} on b against the CPU twin, x in [lo, hi):
 * forward (y, mean, var; poisoned first), backward (dinp set; dgamma,
 * dbeta and the running statistics' updates accumulated into random
 * values) and evaluation. */
static void bn_case(struct backend *b, int B, int C, int HW, float lo, float hi, enum bn_mode mode,
		    uint64_t t)
{
	size_t n = (size_t)B * C * HW;
	float *x = host_random(n, 1000 + t, lo, hi), *dout = host_random(n, 1010 + t, -1, 1);
	float *gamma = host_random(C, 1020 + t, 0.5f, 1.5f), *beta = host_random(C, 1030 + t, -1, 1);
	float *rm = host_random(C, 1040 + t, -1, 1), *rv = host_random(C, 1050 + t, 0.5f, 2);
	float *acc[4], *dacc[4];
	for (int i = 0; i < 4; i++) {
		acc[i] = host_random(C, 1060 + 10 * t + (size_t)i, -1, 1);
		dacc[i] = dev_from(b, acc[i], C * 4u);
	}
	float *y = malloc(n * 4), *dx = malloc(n * 4), *mean = malloc(C * 4u), *var = malloc(C * 4u);
	batchnorm_forward(y, mean, var, x, gamma, beta, rm, rv, B, C, HW);
	batchnorm_backward(mode == BN_NO_DINP ? NULL : dx, acc[0], acc[1], acc[2], acc[3], dout, x, gamma,
			   mean, var, rm, rv, 0.25f, B, C, HW);
	float *x_d = dev_from(b, x, n * 4), *dout_d = dev_from(b, dout, n * 4);
	float *g_d = dev_from(b, gamma, C * 4u), *b_d = dev_from(b, beta, C * 4u);
	float *rm_d = dev_from(b, rm, C * 4u), *rv_d = dev_from(b, rv, C * 4u);
	float *y_d = dev_poisoned(b, n), *dx_d = mode == BN_IN_PLACE ? dout_d : dev_poisoned(b, n);
	float *mean_d = dev_poisoned(b, C), *var_d = dev_poisoned(b, C);
	char what[96];
	cr_assert_eq(b->ops->batchnorm_forward(b->ctx, y_d, mean_d, var_d, x_d, g_d, b_d, rm_d, rv_d, B, C,
					       HW), 0, "%s", gpu_backend_error(b));
	snprintf(what, sizeof(what), "batchnorm mean case %llu (%dx%dx%d)", (unsigned long long)t, B, C, HW);
	expect_close(b, mean_d, mean, (size_t)C, what);
	snprintf(what, sizeof(what), "batchnorm variance case %llu (%dx%dx%d)", (unsigned long long)t, B, C, HW);
	expect_close(b, var_d, var, (size_t)C, what);
	if (mode != BN_STATS) {
		snprintf(what, sizeof(what), "batchnorm forward case %llu (%dx%dx%d)", (unsigned long long)t, B,
			 C, HW);
		expect_close(b, y_d, y, n, what);
		cr_assert_eq(b->ops->batchnorm_backward(b->ctx, mode == BN_NO_DINP ? NULL : dx_d, dacc[0],
							dacc[1], dacc[2], dacc[3], dout_d, x_d, g_d, mean_d,
							var_d, rm_d, rv_d, 0.25f, B, C, HW),
			     0, "%s", gpu_backend_error(b));
		if (mode != BN_NO_DINP) {
			snprintf(what, sizeof(what), "batchnorm dinp case %llu (%dx%dx%d%s)", (unsigned long long)t,
				 B, C, HW, mode == BN_IN_PLACE ? ", in place" : "");
			expect_close(b, dx_d, dx, n, what);
		}
		static const char *const names[4] = { "dgamma", "dbeta", "running mean update",
						       "running variance update" };
		for (int i = 0; i < 4; i++) {
			snprintf(what, sizeof(what), "batchnorm %s case %llu (%dx%dx%d)", names[i],
				 (unsigned long long)t, B, C, HW);
			expect_close(b, dacc[i], acc[i], (size_t)C, what);
		}
		/* Evaluation: the running statistics, no batch statistics. */
		batchnorm_forward(y, NULL, NULL, x, gamma, beta, rm, rv, B, C, HW);
		float *ye_d = dev_poisoned(b, n);
		cr_assert_eq(b->ops->batchnorm_forward(b->ctx, ye_d, NULL, NULL, x_d, g_d, b_d, rm_d, rv_d, B,
						       C, HW), 0, "%s", gpu_backend_error(b));
		snprintf(what, sizeof(what), "batchnorm evaluation case %llu", (unsigned long long)t);
		expect_close(b, ye_d, y, n, what);
	}
	for (int i = 0; i < 4; i++)
		free(acc[i]);
	free(x), free(dout), free(gamma), free(beta), free(rm), free(rv), free(y), free(dx);
	free(mean), free(var);
}

Test(gpu_kernels, batchnorm_forward_and_backward)
{
	struct backend b;
	open_gpu(&b, NULL);
	const int cases[][3] = { { 5, 3, 49 }, { 33, 17, 1 }, { 2, 64, 196 } };   // {B, C, HW}
	for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++)
		bn_case(&b, cases[t][0], cases[t][1], cases[t][2], -2, 3, BN_APART, t);
	gpu_backend_close(&b);
}

/* An int in [lo, hi] drawn from this run's seed. */
static int draw(uint64_t stream, uint64_t i, int lo, int hi)
{
	int v = lo + (int)(rng_uniform(run_seed(), stream, i) * (double)(hi - lo + 1));
	return v > hi ? hi : v;
}

/* Batchnorm's sums split over many blocks a channel and met by the last
 * one: random shapes (none a multiple of a block's values), a channel of
 * the example CNN's size (25 blocks a channel), one block a channel where
 * the scratch's slots run out (70001 channels), the input gradient in
 * place and not asked for, and channels far from zero, whose variance a
 * one-pass sum of squares without the shift would lose: at 1e6, and
 * 200,704 values around 10 (98 blocks a channel). Last, 3 values a
 * channel around 10 within 1e-3: a variance far under eps makes the
 * scale a large, so a x and a mean cancel in y = a x + (beta - a mean),
 * and a kernel that fuses them into FMAs where the CPU rounds each step
 * is 6e-4 off (case 31 was 1.1e-5 off at seed 1883221646121112). */
Test(gpu_kernels, batchnorm_split_sums_random_shapes)
{
	struct backend b;
	open_gpu(&b, NULL);
	for (uint64_t t = 0; t < 6; t++) {
		int B = draw(1100, t, 1, 40), C = draw(1101, t, 1, 70), HW = t % 3 ? draw(1102, t, 2, 900) : 1;
		bn_case(&b, B, C, HW, -2, 3, t == 4 ? BN_IN_PLACE : t == 5 ? BN_NO_DINP : BN_APART, 20 + t);
	}
	bn_case(&b, 64, 32, 784, -1, 2, BN_APART, 30);
	bn_case(&b, 3, 70001, 1, -1, 1, BN_NO_DINP, 31);
	bn_case(&b, 7, 5, 3001, 1e6f - 0.5f, 1e6f + 0.5f, BN_STATS, 32);
	bn_case(&b, 256, 2, 784, 9.5f, 10.5f, BN_APART, 33);
	bn_case(&b, 3, 4096, 1, 10.0f, 10.001f, BN_APART, 34);
	gpu_backend_close(&b);
}

/* The input gradient needs 2 floats a channel of scratch, reserved for the
 * model's widest layer: more channels are refused with the reason, not
 * read past the scratch. */
Test(gpu_kernels, batchnorm_refuses_more_channels_than_its_scratch)
{
	struct backend b;
	open_gpu(&b, NULL);   /* scratch for 4096 floats a row */
	const int B = 2, C = 4097;
	float *x_d = dev_poisoned(&b, (size_t)B * C), *v_d = dev_poisoned(&b, C);
	int r = b.ops->batchnorm_backward(b.ctx, x_d, v_d, v_d, v_d, v_d, x_d, x_d, v_d, v_d, v_d, v_d,
					  v_d, 1.0f, B, C, 1);
	cr_expect_eq(r, -EINVAL, "%d (%s)", r, gpu_backend_error(&b));
	cr_expect_not_null(strstr(gpu_backend_error(&b), "batchnorm over 4097 channels but scratch was reserved for 4096"),
			   "%s", gpu_backend_error(&b));
	gpu_backend_close(&b);
}

/* Forward's columns kept for backward (the example CNN's two layers at
 * batch 256, random windows): the same results as rebuilding them, with
 * backward given an input of NaNs, which it must not read; under a small
 * cap, where a GEMM takes part of the batch, none are offered. */
Test(gpu_kernels, conv_keeps_forward_columns_for_backward)
{
	struct backend b;
	open_gpu(&b, NULL);
	const int cases[][8] = { { 256, 32, 1, 28, 28, 5, 1, 2 }, { 256, 64, 32, 14, 14, 5, 1, 2 } };
	for (size_t t = 0; t < 2; t++)
		cr_expect_gt(conv_case_keep(&b, cases[t], 70 + t, 1), 0, "case %zu: no columns kept", t);
	for (uint64_t t = 0; t < 4; t++) {
		int K = draw(1600, t, 1, 5);
		int c[8] = { draw(1601, t, 1, 9), draw(1602, t, 1, 40), draw(1603, t, 1, 6),
			     draw(1604, t, K, K + 23), draw(1605, t, K, K + 23), K, draw(1606, t, 1, 3),
			     draw(1607, t, 0, K / 2 + 1) };
		cr_expect_gt(conv_case_keep(&b, c, 72 + t, 1), 0, "random case %llu: no columns kept",
			     (unsigned long long)t);
	}
	gpu_backend_close(&b);
	struct gpu_options small = { 0.0005, 1, 0 };
	open_gpu(&b, &small);
	struct window w = win(32, 14, 14, 5, 1, 2);
	cr_expect_eq(b.ops->conv_keep_floats(b.ctx, &w, 64, 61), 0, "columns kept though chunked");
	gpu_backend_close(&b);
}

/* im2col, col2im and the conv around them (32-bit index math) on random
 * windows: sizes, kernels, strides and padding drawn from this run's seed. */
Test(gpu_kernels, conv_random_shapes)
{
	struct backend b;
	open_gpu(&b, NULL);
	for (uint64_t t = 0; t < 6; t++) {
		int K = draw(1200, t, 1, 5), P = draw(1201, t, 0, K / 2 + 1);
		int c[8] = { draw(1202, t, 1, 9), draw(1203, t, 1, 40), draw(1204, t, 1, 6),
			     draw(1205, t, K, K + 23), draw(1206, t, K, K + 23), K, draw(1207, t, 1, 3), P };
		conv_case(&b, c, 40 + t);
	}
	gpu_backend_close(&b);
}

/* Max and average pooling (32-bit index math) on random windows, strides
 * past the kernel included (inputs no window covers get 0). */
Test(gpu_kernels, pooling_random_shapes)
{
	struct backend b;
	open_gpu(&b, NULL);
	for (uint64_t t = 0; t < 6; t++) {
		int K = draw(1300, t, 1, 4);
		int B = draw(1301, t, 1, 6);
		struct window w = win(draw(1302, t, 1, 7), draw(1303, t, K, K + 19), draw(1304, t, K, K + 19), K,
				      draw(1305, t, 1, 3), 0);
		pool_case(&b, B, &w, 50 + t);
	}
	gpu_backend_close(&b);
}

/* One fused batchnorm + relu (+ pooling) case on b against the CPU's
 * parts one by one (batchnorm, relu, pooling; their backward in reverse):
 * pool LAYER_RELU for none, else max or average over K x K windows that
 * tile the plane (a last row and column no window holds when K does not
 * divide H or W). Outputs poisoned; ties in x, so max pooling's first
 * maximum is tested; dinp apart, in place over g, or not asked for. */
static void bn_relu_case(struct backend *b, int B, int C, int H, int W, int K, enum layer_kind pool,
			 enum bn_mode mode, uint64_t t)
{
	int HW = H * W;
	struct window w = win(C, H, W, K, K, 0);
	const struct window *wp = pool == LAYER_RELU ? NULL : &w;
	size_t n = (size_t)B * C * HW, np = wp ? (size_t)B * C * w.OH * w.OW : n;
	float *x = host_random(n, 1400 + t, -2, 3), *dout = host_random(np, 1410 + t, -1, 1);
	for (size_t i = 0; i < n; i += 3)
		x[i] = roundf(x[i] * 2) / 2;
	float *gamma = host_random(C, 1420 + t, 0.5f, 1.5f), *beta = host_random(C, 1430 + t, -1, 1);
	float *rm = host_random(C, 1440 + t, -1, 1), *rv = host_random(C, 1450 + t, 0.5f, 2);
	float *acc[4], *dacc[4];
	for (int i = 0; i < 4; i++) {
		acc[i] = host_random(C, 1460 + 10 * t + (size_t)i, -1, 1);
		dacc[i] = dev_from(b, acc[i], C * 4u);
	}
	float *y = malloc(n * 4), *out = malloc(np * 4), *g = malloc(n * 4), *dx = malloc(n * 4);
	float *mean = malloc(C * 4u), *var = malloc(C * 4u);
	batchnorm_forward(y, mean, var, x, gamma, beta, rm, rv, B, C, HW);
	relu_forward(y, y, n);
	if (pool == LAYER_MAXPOOL) {
		maxpool_forward(out, y, B, &w);
		maxpool_backward(g, dout, y, B, &w);
	} else if (pool == LAYER_AVGPOOL) {
		avgpool_forward(out, y, B, &w);
		avgpool_backward(g, dout, B, &w);
	} else {
		memcpy(g, dout, n * 4);
	}
	relu_backward(g, g, y, n);
	batchnorm_backward(mode == BN_NO_DINP ? NULL : dx, acc[0], acc[1], acc[2], acc[3], g, x, gamma,
			   mean, var, rm, rv, 0.5f, B, C, HW);
	float *x_d = dev_from(b, x, n * 4), *dout_d = dev_from(b, dout, np * 4);
	float *g_d = dev_from(b, gamma, C * 4u), *b_d = dev_from(b, beta, C * 4u);
	float *rm_d = dev_from(b, rm, C * 4u), *rv_d = dev_from(b, rv, C * 4u);
	float *act_d = dev_poisoned(b, n), *out_d = wp ? dev_poisoned(b, np) : NULL;
	float *mean_d = dev_poisoned(b, C), *var_d = dev_poisoned(b, C);
	float *gb_d = !wp && mode == BN_IN_PLACE ? dout_d : dev_poisoned(b, n);
	float *dx_d = mode == BN_NO_DINP ? NULL : mode == BN_IN_PLACE ? gb_d : dev_poisoned(b, n);
	char what[128];
	cr_assert_eq(b->ops->bn_relu_forward(b->ctx, act_d, out_d, mean_d, var_d, x_d, g_d, b_d, rm_d, rv_d,
					     B, C, HW, pool, wp), 0, "%s", gpu_backend_error(b));
	snprintf(what, sizeof(what), "bn+relu(+%s) case %llu (%dx%dx%dx%d K %d)", layer_kind_name(pool),
		 (unsigned long long)t, B, C, H, W, K);
	expect_close(b, mean_d, mean, (size_t)C, what);
	expect_close(b, var_d, var, (size_t)C, what);
	expect_close(b, act_d, y, n, what);
	if (wp)
		expect_close(b, out_d, out, np, what);
	/* The backward from the CPU's activations: nvcc fuses the forward's
	 * multiply-adds (-std=c11 keeps the CPU's apart), so two values of a
	 * pooling window within an ulp could have their maximum on either
	 * side and the gradient routed elsewhere, which is not what this
	 * compares. */
	cr_assert_eq(b->ops->upload(b->ctx, act_d, y, n * 4), 0, "%s", gpu_backend_error(b));
	cr_assert_eq(b->ops->bn_relu_backward(b->ctx, dx_d, gb_d, dacc[0], dacc[1], dacc[2], dacc[3], dout_d,
					      act_d, x_d, g_d, mean_d, var_d, rm_d, rv_d, 0.5f, B, C, HW,
					      pool, wp), 0, "%s", gpu_backend_error(b));
	strncat(what, " backward", sizeof(what) - strlen(what) - 1);
	if (dx_d)
		expect_close(b, dx_d, dx, n, what);
	else
		expect_close(b, gb_d, g, n, what);
	for (int i = 0; i < 4; i++)
		expect_close(b, dacc[i], acc[i], (size_t)C, what);
	/* Evaluation: the running statistics. */
	batchnorm_forward(y, NULL, NULL, x, gamma, beta, rm, rv, B, C, HW);
	relu_forward(y, y, n);
	if (pool == LAYER_MAXPOOL)
		maxpool_forward(out, y, B, &w);
	else if (pool == LAYER_AVGPOOL)
		avgpool_forward(out, y, B, &w);
	float *ae_d = dev_poisoned(b, n), *oe_d = wp ? dev_poisoned(b, np) : NULL;
	cr_assert_eq(b->ops->bn_relu_forward(b->ctx, ae_d, oe_d, NULL, NULL, x_d, g_d, b_d, rm_d, rv_d, B, C,
					     HW, pool, wp), 0, "%s", gpu_backend_error(b));
	expect_close(b, ae_d, y, n, "bn+relu evaluation");
	if (wp)
		expect_close(b, oe_d, out, np, "bn+relu+pool evaluation");
	for (int i = 0; i < 4; i++)
		free(acc[i]);
	free(x), free(dout), free(gamma), free(beta), free(rm), free(rv), free(y), free(out), free(g);
	free(dx), free(mean), free(var);
}

/* Batchnorm + relu (+ pooling) fused, against the CPU's parts: the
 * example CNN's second block (64 channels of 14x14, 2x2 max pooling) at
 * a batch whose sums split over several blocks, random shapes with and
 * without pooling, average pooling, an odd plane no window covers the
 * edge of, the input gradient in place and not asked for. */
Test(gpu_kernels, batchnorm_relu_pool_fused_random_shapes)
{
	struct backend b;
	open_gpu(&b, NULL);
	bn_relu_case(&b, 37, 64, 14, 14, 2, LAYER_MAXPOOL, BN_APART, 60);
	bn_relu_case(&b, 3, 4, 7, 9, 2, LAYER_MAXPOOL, BN_NO_DINP, 61);
	for (uint64_t t = 0; t < 6; t++) {
		int K = draw(1500, t, 1, 4);
		static const enum layer_kind kinds[3] = { LAYER_MAXPOOL, LAYER_AVGPOOL, LAYER_RELU };
		static const enum bn_mode modes[3] = { BN_APART, BN_IN_PLACE, BN_NO_DINP };
		bn_relu_case(&b, draw(1501, t, 1, 9), draw(1502, t, 1, 40), draw(1503, t, K, K + 30),
			     draw(1504, t, K, K + 30), K, kinds[t % 3], modes[t / 2 % 3], 62 + t);
	}
	gpu_backend_close(&b);
}

/* A pooling whose windows do not tile the plane is not the fused
 * kernel's: refused, nothing launched. */
Test(gpu_kernels, batchnorm_relu_refuses_a_window_that_does_not_tile)
{
	struct backend b;
	open_gpu(&b, NULL);
	const int B = 2, C = 3, H = 8, W = 8;
	struct window w = win(C, H, W, 3, 2, 0);
	float *x_d = dev_poisoned(&b, (size_t)B * C * H * W), *v_d = dev_poisoned(&b, C);
	int r = b.ops->bn_relu_forward(b.ctx, x_d, x_d, v_d, v_d, x_d, v_d, v_d, v_d, v_d, B, C, H * W,
				       LAYER_MAXPOOL, &w);
	cr_expect_neq(r, 0, "a 3x3 stride 2 pooling was fused");
	cr_assert_eq(gpu_sync(&b), 0, "%s", gpu_backend_error(&b));
	gpu_backend_close(&b);
}

/* ---- the embedding layer (gpu/kernels_embed.cu) --------------------------
 * The GPU adds in the CPU's order without fused multiply-adds, so the
 * results are compared bit for bit, not to a tolerance. */

/* Every one of n floats of dev equals cpu's, bit for bit. */
static void expect_same(struct backend *b, const float *dev, const float *cpu, size_t n, const char *what)
{
	float *got = malloc(n * sizeof(float) + 1);
	cr_assert_not_null(got);
	cr_assert_eq(b->ops->download(b->ctx, got, dev, n * sizeof(float)), 0, "%s", gpu_backend_error(b));
	for (size_t i = 0; i < n; i++)
		if (memcmp(&got[i], &cpu[i], sizeof(float)) != 0) {
			cr_expect_fail("%s: element %zu of %zu: gpu %.9g vs cpu %.9g (seed %llu)", what, i, n, got[i],
				       cpu[i], (unsigned long long)run_seed());
			break;
		}
	free(got);
}

/* A batch of B samples of F fields whose lists hold 0 to maxn IDs drawn
 * from `vocab` values (so rows repeat, within a list too; one in ten is
 * missing), over a table of `rows` rows a field; the plan, the three
 * kernels on both sides, each pool. */
static void embed_case(struct backend *b, int B, int F, int D, int DIM, int rows, int maxn, int vocab,
		       uint64_t st)
{
	struct embed_spec s = { .fields = F, .rows = rows, .dim = DIM };
	size_t nseg = (size_t)B * F, cap = nseg * (size_t)maxn;
	uint32_t *seg = malloc((nseg + 1) * sizeof(uint32_t)), *ids = malloc((cap + 1) * sizeof(uint32_t));
	cr_assert(seg && ids);
	size_t n = 0;
	seg[0] = 0;
	for (size_t t = 0; t < nseg; t++) {
		int c = (int)(rng_hash(run_seed(), st, t) % (uint64_t)(maxn + 1));
		for (int i = 0; i < c; i++, n++) {
			uint64_t h = rng_hash(run_seed(), st + 1, n);
			ids[n] = h % 10 == 0 ? DATA_ID_NONE : (uint32_t)(h >> 32) % (uint32_t)vocab;
		}
		seg[t + 1] = (uint32_t)n;
	}
	struct embed_plan p;
	cr_assert_eq(embed_plan_init(&p, nseg, cap ? cap : 1), 0);
	cr_assert_eq(embed_plan_build(&p, &s, seg, ids, B), 0);
	size_t R = embed_total_rows(&s), ld = (size_t)F * DIM + D, nnz = p.nnz ? p.nnz : 1;
	float *table = host_random(R * DIM, st + 2, -1, 1), *x = host_random((size_t)B * D + 1, st + 3, -1, 1);
	float *dout = host_random((size_t)B * ld, st + 4, -1, 1);
	float *U = malloc((p.u + 1) * DIM * sizeof(float)), *out = malloc((size_t)B * ld * sizeof(float));
	float *dU = malloc((p.u + 1) * DIM * sizeof(float));
	float *table_d = dev_from(b, table, R * DIM * sizeof(float)), *x_d = dev_from(b, x, ((size_t)B * D + 1) * 4);
	float *dout_d = dev_from(b, dout, (size_t)B * ld * sizeof(float));
	uint64_t *rows_d = dev_from(b, NULL, (p.u + 1) * sizeof(uint64_t));   /* p.rows holds u */
	if (p.u)
		cr_assert_eq(b->ops->upload(b->ctx, rows_d, p.rows, p.u * sizeof(uint64_t)), 0, "%s", gpu_backend_error(b));
	uint32_t *off_d = dev_from(b, p.off, (nseg + 1) * sizeof(uint32_t));
	uint32_t *idx_d = dev_from(b, p.idx, nnz * sizeof(uint32_t));
	uint32_t *roff_d = dev_from(b, p.roff, (p.u + 1) * sizeof(uint32_t));
	uint32_t *rseg_d = dev_from(b, p.rseg, nnz * sizeof(uint32_t));
	float *U_d = dev_poisoned(b, (p.u + 1) * DIM), *out_d = dev_poisoned(b, (size_t)B * ld);
	float *dU_d = dev_poisoned(b, (p.u + 1) * DIM);
	char what[96];

	embed_gather_rows(U, table, p.rows, p.u, DIM);
	cr_assert_eq(gpu_embed_gather(b, U_d, table_d, rows_d, p.u, DIM), 0, "%s", gpu_backend_error(b));
	snprintf(what, sizeof(what), "gather (B %d F %d DIM %d, %zu rows)", B, F, DIM, p.u);
	expect_same(b, U_d, U, p.u * DIM, what);
	for (int pool = 0; pool < 2; pool++) {
		embed_forward(out, x, U, p.off, p.idx, B, F, D, DIM, (enum embed_pool)pool);
		cr_assert_eq(b->ops->embed_forward(b->ctx, out_d, x_d, U_d, off_d, idx_d, B, F, D, DIM,
						   (enum embed_pool)pool),
			     0, "%s", gpu_backend_error(b));
		snprintf(what, sizeof(what), "forward pool %d (B %d F %d D %d DIM %d)", pool, B, F, D, DIM);
		expect_same(b, out_d, out, (size_t)B * ld, what);
		embed_backward(dU, dout, p.roff, p.rseg, p.off, p.u, F, D, DIM, (enum embed_pool)pool);
		cr_assert_eq(b->ops->embed_backward(b->ctx, dU_d, dout_d, roff_d, rseg_d, off_d, p.u, F, D, DIM,
						    (enum embed_pool)pool),
			     0, "%s", gpu_backend_error(b));
		snprintf(what, sizeof(what), "backward pool %d (%zu rows, %zu entries)", pool, p.u, p.nnz);
		expect_same(b, dU_d, dU, p.u * DIM, what);
	}
	cr_assert_eq(gpu_sync(b), 0, "%s", gpu_backend_error(b));
	embed_plan_free(&p);
	free(seg), free(ids), free(table), free(x), free(dout), free(U), free(out), free(dU);
}

/* Criteo's shape (26 fields of at most one ID, 13 numeric features) at a
 * batch of 4096 over a few IDs a field, so that each row has hundreds of
 * entries; a wider vocabulary; a multi-valued batch of lists up to 5 long;
 * a table of one row; a batch with no ID at all. */
Test(gpu_kernels, embedding_gather_forward_backward)
{
	struct backend b;
	open_gpu(&b, NULL);
	embed_case(&b, 4096, 26, 13, 16, 100000, 1, 4, 1600);
	embed_case(&b, 1000, 26, 13, 16, 100000, 1, 5000, 1605);
	embed_case(&b, 37, 5, 3, 7, 50, 5, 20, 1610);
	embed_case(&b, 9, 2, 1, 33, 1, 3, 4, 1620);
	embed_case(&b, 5, 3, 2, 4, 10, 0, 4, 1630);
	gpu_backend_close(&b);
}

/* loss = sigmoid_cross_entropy (one logit a row) against layers.h's
 * sigmoid_xent_*: probabilities, meter, backward, and training's fused
 * pass, in place too. Logits span both signs and both branches of the
 * stable sigmoid, with 0 and large magnitudes. */
Test(gpu_kernels, sigmoid_cross_entropy)
{
	struct backend b;
	open_gpu(&b, NULL);
	static const int sizes[] = { 1, 37, 1000, 4096 };
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		int B = sizes[s];
		float *x = host_random((size_t)B, 700 + s, -12, 12);
		int32_t *y = malloc((size_t)B * sizeof(int32_t));
		for (int i = 0; i < B; i++)
			y[i] = rng_uniform(run_seed(), 710 + s, (uint64_t)i) < 0.3;
		x[0] = 0.0f;
		if (B > 2) {
			x[1] = 60.0f;
			x[2] = -60.0f;
		}
		float *p = malloc((size_t)B * 4), *d = malloc((size_t)B * 4);
		int right = -1;
		double loss = sigmoid_xent_forward(p, &right, x, y, B);
		sigmoid_xent_backward(d, p, y, B, 1.0f / 77);
		float *x_d = dev_from(&b, x, (size_t)B * 4), *p_d = dev_poisoned(&b, (size_t)B),
		      *d_d = dev_poisoned(&b, (size_t)B), *t_d = dev_poisoned(&b, (size_t)B);
		int32_t *y_d = dev_from(&b, y, (size_t)B * sizeof(int32_t));
		const double start[2] = { 0.5, 3.0 };
		double *meter_d = dev_from(&b, start, sizeof(start)), got[2];
		char what[64];
		cr_assert_eq(b.ops->sigmoid_xent_forward(b.ctx, p_d, meter_d, x_d, y_d, B), 0, "%s",
			     gpu_backend_error(&b));
		snprintf(what, sizeof(what), "sigmoid probs %d", B);
		expect_close(&b, p_d, p, (size_t)B, what);
		cr_assert_eq(b.ops->download(b.ctx, got, meter_d, sizeof(got)), 0);
		cr_expect_lt(fabs(got[0] - start[0] - loss) / (fabs(loss) + 1e-30), TOL,
			     "sigmoid loss %d: gpu %.12g cpu %.12g (seed %llu)", B, got[0] - start[0], loss,
			     (unsigned long long)run_seed());
		cr_expect_eq(got[1] - start[1], (double)right, "sigmoid correct %d: gpu %g cpu %d", B,
			     got[1] - start[1], right);
		cr_assert_eq(b.ops->upload(b.ctx, p_d, p, (size_t)B * 4), 0);
		cr_assert_eq(b.ops->sigmoid_xent_backward(b.ctx, d_d, p_d, y_d, B, 1.0f / 77), 0, "%s",
			     gpu_backend_error(&b));
		snprintf(what, sizeof(what), "sigmoid xent backward %d", B);
		expect_same(&b, d_d, d, (size_t)B, what);
		cr_assert_eq(b.ops->sigmoid_xent_train(b.ctx, t_d, meter_d, x_d, y_d, B, 1.0f / 77), 0, "%s",
			     gpu_backend_error(&b));
		snprintf(what, sizeof(what), "fused sigmoid xent gradient %d", B);
		expect_close(&b, t_d, d, (size_t)B, what);
		cr_assert_eq(b.ops->sigmoid_xent_train(b.ctx, x_d, meter_d, x_d, y_d, B, 1.0f / 77), 0, "%s",
			     gpu_backend_error(&b));
		snprintf(what, sizeof(what), "fused sigmoid xent in place %d", B);
		expect_close(&b, x_d, d, (size_t)B, what);
		cr_assert_eq(b.ops->download(b.ctx, got, meter_d, sizeof(got)), 0);
		cr_expect_lt(fabs(got[0] - start[0] - 3 * loss) / (fabs(loss) + 1e-30), TOL,
			     "sigmoid loss thrice %d: gpu %.12g cpu %.12g", B, got[0] - start[0], 3 * loss);
		cr_expect_eq(got[1] - start[1], 3.0 * right, "sigmoid correct thrice %d: gpu %g cpu %d", B,
			     got[1] - start[1], 3 * right);
		free(x), free(y), free(p), free(d);
	}
	gpu_backend_close(&b);
}
