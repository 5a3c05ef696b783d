/* Tests of CNN models end to end: building and shape errors, the tensor
 * table, initialization, `check`'s printing, replicas in training and
 * evaluation (dropout, batchnorm's running statistics), the optimizer's
 * plain ranges, and a small CNN that learns. */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include "leak.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/nn/backend.h"
#include "../core/config/config.h"
#include "../core/nn/layers.h"
#include "../core/nn/model.h"
#include "../core/nn/optim.h"
#include "../core/nn/replica.h"
#include "../core/nn/rng.h"

TestSuite(cnn, .fini = leak_check);

/* Parses "[model]\ninput = <input>\n<layers>" into c and builds m; returns
 * what model_build (or the parser) returned, with the message in err. */
static int build(struct config *c, struct model *m, const char *input, const char *layers,
		 char *err, size_t errlen)
{
	char text[2048];
	snprintf(text, sizeof(text), "[train]\nbatch_size = 8\n[model]\ninput = %s\n%s", input, layers);
	int e = config_parse_string(c, "t.ini", text, err, errlen);
	if (e)
		return e;
	return model_build(m, &c->model, err, errlen);
}

#define CNN_LAYERS \
	"layer = conv 5x5 32 pad=same\nlayer = batchnorm\nlayer = relu\nlayer = maxpool 2\n" \
	"layer = conv 5x5 64 pad=same\nlayer = relu\nlayer = maxpool 2\n" \
	"layer = dense 1024\nlayer = relu\nlayer = dropout 0.5\nlayer = dense 10\n"

Test(cnn, cnn_shapes_and_tensors)
{
	struct config c;
	struct model m;
	char err[512];
	cr_assert_eq(build(&c, &m, "28x28x1", CNN_LAYERS, err, sizeof(err)), 0, "%s", err);
	const struct layer *l = m.layers;
	cr_assert_eq(l[0].OC, 32); cr_assert_eq(l[0].OH, 28); cr_assert_eq(l[0].OW, 28);
	cr_assert_eq(l[3].OC, 32); cr_assert_eq(l[3].OH, 14);
	cr_assert_eq(l[6].OC, 64); cr_assert_eq(l[6].OH, 7); cr_assert_eq(l[6].OW, 7);
	cr_assert_eq(l[7].in, 3136, "dense after a spatial layer flattens (C, H, W)");
	cr_assert_eq(m.outputs, 10);
	size_t want = 32 * 25 + 32 + 4 * 32 + 64 * 32 * 25 + 64 + 1024 * 3136 + 1024 + 10 * 1024 + 10;
	cr_assert_eq(m.nparams, want, "%zu parameters, expected %zu", m.nparams, want);

	struct tensor_info t[MODEL_MAX_TENSORS];
	int n = model_tensors(&m, t, MODEL_MAX_TENSORS);
	cr_assert_eq(n, 12);
	static const struct { const char *name; int ndim, shape[4], trainable; } expect[] = {
		{ "conv1.weight", 4, { 32, 1, 5, 5 }, 1 },
		{ "conv1.bias", 1, { 32 }, 1 },
		{ "batchnorm1.weight", 1, { 32 }, 1 },
		{ "batchnorm1.bias", 1, { 32 }, 1 },
		{ "batchnorm1.running_mean", 1, { 32 }, 0 },
		{ "batchnorm1.running_var", 1, { 32 }, 0 },
		{ "conv2.weight", 4, { 64, 32, 5, 5 }, 1 },
		{ "conv2.bias", 1, { 64 }, 1 },
		{ "dense1.weight", 2, { 1024, 3136 }, 1 },
		{ "dense1.bias", 1, { 1024 }, 1 },
		{ "dense2.weight", 2, { 10, 1024 }, 1 },
		{ "dense2.bias", 1, { 10 }, 1 },
	};
	size_t off = 0;
	for (int i = 0; i < n; i++) {
		cr_assert_str_eq(t[i].name, expect[i].name);
		cr_assert_eq(t[i].ndim, expect[i].ndim, "%s", t[i].name);
		for (int d = 0; d < t[i].ndim; d++)
			cr_assert_eq(t[i].shape[d], expect[i].shape[d], "%s dim %d", t[i].name, d);
		cr_assert_eq(t[i].trainable, expect[i].trainable, "%s", t[i].name);
		cr_assert_eq(t[i].off, off, "%s does not follow its predecessor", t[i].name);
		off += t[i].n;
	}
	cr_assert_eq(off, m.nparams, "tensors do not tile P");
	cr_assert_eq(model_tensors(&m, t, 5), -ENOBUFS);
}

Test(cnn, check_prints_shapes)
{
	struct config c;
	struct model m;
	char err[512], buf[4096] = "";
	cr_assert_eq(build(&c, &m, "28x28x1", CNN_LAYERS, err, sizeof(err)), 0, "%s", err);
	FILE *f = fmemopen(buf, sizeof(buf) - 1, "w");
	cr_assert(f);
	model_print(f, &m);
	fclose(f);
	cr_assert(strstr(buf, "(1, 28, 28)"), "%s", buf);
	cr_assert(strstr(buf, "conv1        conv       (32, 28, 28)              832"), "%s", buf);
	cr_assert(strstr(buf, "maxpool2     maxpool    (64, 7, 7)"), "%s", buf);
	cr_assert(strstr(buf, "dense1       dense      (1024)                3212288"), "%s", buf);
	cr_assert(strstr(buf, "batchnorm1   batchnorm  (32, 28, 28)              128"), "%s", buf);
}

Test(cnn, shape_errors)
{
	static const struct {
		const char *input, *layers, *want[4];
	} rows[] = {
		{ "28x28x1", "layer = conv 5 8\nlayer = maxpool 2\nlayer = conv 5 8\nlayer = maxpool 2\nlayer = conv 5 8\nlayer = dense 10\n",
		  { "t.ini:9:", "conv3", "(8, 4, 4)", "5x5 window" } },
		{ "784", "layer = conv 3x3 4\nlayer = dense 10\n",
		  { "t.ini:5:", "conv1", "image input", "(784)" } },
		{ "28x28x1", "layer = dense 10\nlayer = maxpool 2\nlayer = dense 10\n",
		  { "t.ini:6:", "maxpool1", "flat (10)", NULL } },
		{ "8x8x1", "layer = conv 4x4 4 pad=same\nlayer = dense 10\n",
		  { "t.ini:5:", "conv1", "odd kernel", NULL } },
		{ "8x8x3", "layer = avgpool 9\nlayer = dense 10\n",
		  { "t.ini:5:", "avgpool1", "(3, 8, 8)", "9x9" } },
		{ "8x8x1", "layer = conv 3 4\nlayer = flatten\n",
		  { "the last layer is flatten1", NULL } },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct config c;
		struct model m;
		char err[512] = "";
		cr_assert_neq(build(&c, &m, rows[i].input, rows[i].layers, err, sizeof(err)), 0, "row %zu built", i);
		for (int k = 0; k < 4 && rows[i].want[k]; k++)
			cr_assert(strstr(err, rows[i].want[k]), "row %zu: \"%s\" lacks \"%s\"", i, err, rows[i].want[k]);
		cr_assert(!strchr(err, '\n'), "row %zu: message is not one line", i);
	}
}

Test(cnn, layer_spec_round_trip)
{
	static const char *const texts[] = {
		"conv 5x5 32", "conv 3x3 8 stride=2 pad=1", "conv 3x3 8 pad=same", "maxpool 2",
		"maxpool 3 stride=2", "avgpool 2", "dropout 0.5", "dropout 0", "flatten", "batchnorm",
	};
	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		struct layer_spec s;
		char err[256], buf[64];
		cr_assert_eq(layer_spec_parse(&s, texts[i], err, sizeof(err)), 0, "%s: %s", texts[i], err);
		layer_spec_format(&s, buf, sizeof(buf));
		cr_assert_str_eq(buf, texts[i]);
	}
	struct layer_spec s;
	char err[256];
	cr_assert_eq(layer_spec_parse(&s, "conv 5 16", err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(s.k, 5);
	cr_assert_eq(s.units, 16);
	cr_assert_eq(s.stride, 1);
}

Test(cnn, init_is_a_function_of_the_index)
{
	struct config c;
	struct model m;
	char err[512];
	cr_assert_eq(build(&c, &m, "12x12x2", "layer = conv 3 8\nlayer = batchnorm\nlayer = relu\nlayer = conv 3 4\nlayer = dense 10\n",
			   err, sizeof(err)), 0, "%s", err);
	float *all = malloc(m.nparams * sizeof(float)), *part = malloc(m.nparams * sizeof(float));
	cr_assert(all && part);
	model_init_params(&m, all, 0, m.nparams, 7);
	size_t cut = m.layers[1].woff + 3;   /* inside batchnorm1.weight */
	model_init_params(&m, part, 0, cut, 7);
	model_init_params(&m, part + cut, cut, m.nparams, 7);
	cr_assert_eq(memcmp(all, part, m.nparams * sizeof(float)), 0);
	const struct layer *c1 = &m.layers[0], *bn = &m.layers[1], *c2 = &m.layers[3];
	/* conv1 is followed by batchnorm then relu: He normal, std sqrt(2 / (2*3*3)). */
	double q = 0;
	size_t nw = c1->boff - c1->woff;
	for (size_t i = 0; i < nw; i++)
		q += all[c1->woff + i] * all[c1->woff + i];
	double sd = sqrt(q / nw), want = sqrt(2.0 / 18);
	cr_assert_lt(fabs(sd - want), 0.25 * want, "conv1 weight sd %g, expected %g", sd, want);
	/* conv2 is followed by dense: Glorot uniform, limit sqrt(6 / (8*9 + 4*9)). */
	double limit = sqrt(6.0 / (72 + 36));
	for (size_t i = c2->woff; i < c2->boff; i++)
		cr_assert(fabs(all[i]) <= limit, "conv2 weight %g beyond %g", all[i], limit);
	for (int i = 0; i < bn->C; i++) {
		cr_assert_eq(all[bn->woff + i], 1.0f);
		cr_assert_eq(all[bn->boff + i], 0.0f);
		cr_assert_eq(all[bn->moff + i], 0.0f);
		cr_assert_eq(all[bn->voff + i], 1.0f);
	}
	free(all);
	free(part);
}

/* A tiny dataset of 8x8 single-channel images: class k has a bright 3x3
 * square in quadrant k, plus noise. */
static void make_images(float *x, int32_t *y, int n, uint64_t seed)
{
	for (int i = 0; i < n; i++) {
		int k = (int)(rng_hash(seed, RNG_DATA, (uint64_t)i) % 4);
		y[i] = k;
		float *img = x + (size_t)i * 64;
		for (int p = 0; p < 64; p++)
			img[p] = (float)(0.3 * rng_normal(seed, RNG_DATA + 1, (uint64_t)i * 64 + p));
		int r0 = (k / 2) * 4, c0 = (k % 2) * 4;
		int dr = (int)(rng_hash(seed, RNG_DATA + 2, (uint64_t)i) % 2);
		for (int r = 0; r < 3; r++)
			for (int c = 0; c < 3; c++)
				img[(r0 + dr + r) * 8 + c0 + c] += 1.0f;
	}
}

Test(cnn, small_cnn_learns, .timeout = 60)
{
	struct config c;
	struct model m;
	char err[512];
	cr_assert_eq(build(&c, &m, "8x8x1",
			   "layer = conv 3x3 8 pad=same\nlayer = batchnorm\nlayer = relu\nlayer = maxpool 2\n"
			   "layer = conv 3 8 stride=2 pad=1\nlayer = relu\nlayer = avgpool 2\nlayer = flatten\n"
			   "layer = dense 16\nlayer = relu\nlayer = dropout 0.2\nlayer = dense 4\n",
			   err, sizeof(err)), 0, "%s", err);
	int B = 32, n = 512;
	float *x = malloc((size_t)n * 64 * sizeof(float));
	int32_t *y = malloc((size_t)n * sizeof(int32_t));
	float *p = malloc(m.nparams * sizeof(float)), *g = calloc(m.nparams, sizeof(float));
	cr_assert(x && y && p && g);
	make_images(x, y, n, 3);
	model_init_params(&m, p, 0, m.nparams, 1);
	struct backend be;
	backend_cpu(&be, 1);
	struct replica r;
	cr_assert_eq(replica_init(&r, &m, &be, B, err, sizeof(err)), 0, "%s", err);
	struct optim o;
	struct optim_config oc = { .kind = OPTIM_MOMENTUM, .lr = 0.05f, .momentum = 0.9f };
	cr_assert_eq(optim_init(&o, &oc, m.nparams), 0);
	cr_assert_eq(optim_plain_tensors(&o, &m, 0), 0);
	double first = 0, last = 0;
	int steps = 120;
	for (int s = 0; s < steps; s++) {
		int b0 = (s * B) % n;
		double loss;
		int right;
		cr_assert_eq(replica_load(&r, x + (size_t)b0 * 64, y + b0, B), 0);
		cr_assert_eq(replica_forward(&r, p, B, 1, replica_key(1, s, 0), &loss, &right), 0);
		cr_assert_eq(replica_backward(&r, p, g, B, 1.0f / B), 0);
		optim_step_zero(&o, p, g, oc.lr);
		if (s < 10)
			first += loss / B / 10;
		if (s >= steps - 10)
			last += loss / B / 10;
	}
	cr_log_info("small cnn: loss %.4f -> %.4f", first, last);
	cr_assert_lt(last, 0.3 * first, "loss %.4f -> %.4f did not fall", first, last);
	struct dataset ds = { .x = x, .y = y, .n = (size_t)n, .d = 64, .classes = 4 };
	double tl, acc;
	cr_assert_eq(replica_evaluate(&r, p, &ds, &tl, &acc), 0);
	cr_assert_gt(acc, 0.9, "accuracy %.3f after training", acc);
	/* The running statistics moved off their initial (0, 1). */
	const struct layer *bn = &m.layers[1];
	int moved = 0;
	for (int i = 0; i < bn->C; i++)
		moved += p[bn->moff + i] != 0.0f && p[bn->voff + i] != 1.0f;
	cr_assert_eq(moved, bn->C);
	optim_free(&o);
	replica_free(&r);
	free(x); free(y); free(p); free(g);
}

/* A CPU backend that fuses batchnorm + relu (+ pooling) the way the GPU
 * does, built from the CPU's parts, and counts its fused calls: the
 * replica's wiring of the fused entries (which layers, which buffers,
 * which gradient buffer ends up holding what) runs in CI against the
 * plain CPU backend. */
static int fused_calls[2];

static int parts_bn_relu_forward(void *ctx, float *act, float *out, float *mean, float *var,
				 const float *inp, const float *gamma, const float *beta,
				 const float *run_mean, const float *run_var, int B, int C, int HW,
				 enum layer_kind pool, const struct window *w)
{
	(void)ctx;
	fused_calls[0]++;
	cr_assert(!w || (w->S == w->K && w->P == 0), "a window that does not tile was fused");
	batchnorm_forward(act, mean, var, inp, gamma, beta, run_mean, run_var, B, C, HW);
	relu_forward(act, act, (size_t)B * C * HW);
	if (w && pool == LAYER_MAXPOOL)
		maxpool_forward(out, act, B, w);
	else if (w)
		avgpool_forward(out, act, B, w);
	return 0;
}

static int parts_bn_relu_backward(void *ctx, float *dinp, float *g, float *dgamma, float *dbeta,
				  float *drun_mean, float *drun_var, const float *dout,
				  const float *act, const float *inp, const float *gamma,
				  const float *mean, const float *var, const float *run_mean,
				  const float *run_var, float stat_scale, int B, int C, int HW,
				  enum layer_kind pool, const struct window *w)
{
	(void)ctx;
	fused_calls[1]++;
	size_t n = (size_t)B * C * HW;
	if (w && pool == LAYER_MAXPOOL)
		maxpool_backward(g, dout, act, B, w);
	else if (w)
		avgpool_backward(g, dout, B, w);
	else
		memmove(g, dout, n * sizeof(float));
	relu_backward(g, g, act, n);
	float *dx = dinp ? malloc(n * sizeof(float)) : NULL;
	batchnorm_backward(dx, dgamma, dbeta, drun_mean, drun_var, g, inp, gamma, mean, var, run_mean,
			   run_var, stat_scale, B, C, HW);
	if (dx)
		memcpy(dinp, dx, n * sizeof(float));
	free(dx);
	return 0;
}

/* Loss (training, then evaluation) and gradient of one step of m on be. */
static void step_on(const struct model *m, const struct backend *be, int B, const float *x,
		    const int32_t *y, const float *p, float *g, double loss[2])
{
	struct replica r;
	char err[256];
	int right;
	cr_assert_eq(replica_init(&r, m, be, B, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(replica_load(&r, x, y, B), 0);
	cr_assert_eq(replica_forward(&r, p, B, 1, replica_key(3, 1, 0), &loss[0], &right), 0);
	cr_assert_eq(replica_backward(&r, p, g, B, 1.0f / B), 0);
	cr_assert_eq(replica_forward(&r, p, B, 0, 0, &loss[1], &right), 0);
	replica_free(&r);
}

/* Through a backend with the fused entries the replica computes what it
 * computes with the parts, bit for bit (the fused backend is made of the
 * same parts), in the example's order, with the batchnorm first (no input
 * gradient), without pooling, and with a pooling that does not tile (only
 * batchnorm + relu fused); the counts say the fused entries ran. */
Test(cnn, replica_fuses_batchnorm_relu_pool_as_the_parts)
{
	static const struct {
		const char *input, *layers;
		int groups;
	} models[] = {
		{ "12x10x1", "layer = conv 3x3 5 pad=same\nlayer = batchnorm\nlayer = relu\nlayer = maxpool 2\n"
			     "layer = conv 3x3 6 pad=same\nlayer = batchnorm\nlayer = relu\nlayer = maxpool 2\n"
			     "layer = dense 9\nlayer = relu\nlayer = dropout 0.5\nlayer = dense 3\n", 2 },
		{ "7x9x2", "layer = batchnorm\nlayer = relu\nlayer = avgpool 2\nlayer = dense 3\n", 1 },
		{ "6x7x2", "layer = conv 3 4\nlayer = batchnorm\nlayer = relu\nlayer = conv 2 3\nlayer = dense 3\n", 1 },
		{ "9x9x1", "layer = conv 3x3 4 pad=same\nlayer = batchnorm\nlayer = relu\nlayer = maxpool 3 stride=2\n"
			   "layer = dense 3\n", 1 },
		/* A dense layer's input gradient would overwrite the dout it
		 * reads if the group left its result in the wrong buffer. */
		{ "30", "layer = dense 24\nlayer = batchnorm\nlayer = relu\nlayer = dense 7\nlayer = batchnorm\n"
			"layer = relu\nlayer = dense 3\n", 2 },
		{ "8x8x3", "layer = conv 3x3 2 pad=same\nlayer = batchnorm\nlayer = relu\nlayer = maxpool 2\n"
			   "layer = dense 3\n", 1 },
	};
	for (size_t k = 0; k < sizeof(models) / sizeof(models[0]); k++) {
		struct config c;
		struct model m;
		char err[512];
		cr_assert_eq(build(&c, &m, models[k].input, models[k].layers, err, sizeof(err)), 0, "%s", err);
		int B = 5;
		float *x = malloc((size_t)B * m.inputs * sizeof(float)), *p = malloc(m.nparams * sizeof(float));
		float *g[2] = { calloc(m.nparams, sizeof(float)), calloc(m.nparams, sizeof(float)) };
		int32_t y[5] = { 0, 1, 2, 1, 0 };
		cr_assert(x && p && g[0] && g[1]);
		for (int i = 0; i < B * m.inputs; i++)
			x[i] = (float)rng_normal(12 + k, RNG_DATA, (uint64_t)i);
		model_init_params(&m, p, 0, m.nparams, 5 + k);
		struct backend plain, fused;
		backend_cpu(&plain, 1);
		fused = plain;
		struct backend_ops ops = *plain.ops;
		ops.bn_relu_forward = parts_bn_relu_forward;
		ops.bn_relu_backward = parts_bn_relu_backward;
		fused.ops = &ops;
		double loss[2][2];
		memset(fused_calls, 0, sizeof(fused_calls));
		step_on(&m, &plain, B, x, y, p, g[0], loss[0]);
		cr_assert_eq(fused_calls[0] + fused_calls[1], 0);
		step_on(&m, &fused, B, x, y, p, g[1], loss[1]);
		cr_expect_eq(fused_calls[0], 2 * models[k].groups, "model %zu: %d fused forwards", k, fused_calls[0]);
		cr_expect_eq(fused_calls[1], models[k].groups, "model %zu: %d fused backwards", k, fused_calls[1]);
		cr_expect_eq(loss[1][0], loss[0][0], "model %zu: training loss %.17g fused, %.17g not", k,
			     loss[1][0], loss[0][0]);
		cr_expect_eq(loss[1][1], loss[0][1], "model %zu: evaluation loss differs", k);
		cr_expect_eq(memcmp(g[1], g[0], m.nparams * sizeof(float)), 0, "model %zu: gradients differ", k);
		free(x); free(p); free(g[0]); free(g[1]);
	}
}

/* A CPU backend that asks for conv columns to be kept (conv_keep_floats)
 * and records the keep buffers its conv entries get, in call order, then
 * runs the CPU's conv (which ignores them). */
static float *keeps_seen[8];
static int nkeeps;

static size_t keep_floats(void *ctx, const struct window *w, int OC, int B)
{
	(void)ctx;
	(void)OC;
	return (size_t)w->C * w->K * w->K * (size_t)B * w->OH * w->OW;
}

static int keep_conv_forward(void *ctx, float *out, float *col, float *keep, const float *inp,
			     const float *weight, const float *bias, int B, int OC,
			     const struct window *w)
{
	(void)ctx;
	keeps_seen[nkeeps++ % 8] = keep;
	conv_forward(out, col, inp, weight, bias, B, OC, w);
	return 0;
}

static int keep_conv_backward(void *ctx, float *dinp, float *dweight, float *dbias, float *col,
			      const float *keep, const float *dout, const float *inp,
			      const float *weight, int B, int OC, const struct window *w)
{
	(void)ctx;
	keeps_seen[nkeeps++ % 8] = (float *)keep;
	conv_backward(dinp, dweight, dbias, col, dout, inp, weight, B, OC, w);
	return 0;
}

/* Where the backend keeps conv columns, the replica takes a buffer for
 * each conv layer when it is made and hands the same one to that layer's
 * forward and backward, another to each layer; where it does not (the
 * CPU), it hands NULL. */
Test(cnn, replica_hands_each_conv_its_kept_columns)
{
	struct config c;
	struct model m;
	char err[512];
	cr_assert_eq(build(&c, &m, "9x8x2", "layer = conv 3x3 4 pad=same\nlayer = relu\nlayer = maxpool 2\n"
			   "layer = conv 2 3\nlayer = dense 3\n", err, sizeof(err)), 0, "%s", err);
	int B = 4;
	float *x = malloc((size_t)B * m.inputs * sizeof(float)), *p = malloc(m.nparams * sizeof(float));
	float *g = calloc(m.nparams, sizeof(float));
	int32_t y[4] = { 0, 1, 2, 1 };
	cr_assert(x && p && g);
	for (int i = 0; i < B * m.inputs; i++)
		x[i] = (float)rng_normal(31, RNG_DATA, (uint64_t)i);
	model_init_params(&m, p, 0, m.nparams, 32);
	for (int k = 0; k < 2; k++) {
		struct backend be;
		backend_cpu(&be, 1);
		struct backend_ops ops = *be.ops;
		ops.conv_forward = keep_conv_forward;
		ops.conv_backward = keep_conv_backward;
		if (k)
			ops.conv_keep_floats = keep_floats;
		be.ops = &ops;
		struct replica r;
		double loss;
		int right;
		nkeeps = 0;
		cr_assert_eq(replica_init(&r, &m, &be, B, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(replica_load(&r, x, y, B), 0);
		cr_assert_eq(replica_forward(&r, p, B, 1, 0, &loss, &right), 0);
		cr_assert_eq(replica_backward(&r, p, g, B, 1.0f / B), 0);
		cr_assert_eq(nkeeps, 4, "%d conv calls", nkeeps);
		/* forward conv1, conv2; backward conv2, conv1 */
		if (!k) {
			for (int i = 0; i < 4; i++)
				cr_expect_null(keeps_seen[i], "call %d got columns without asking", i);
		} else {
			cr_expect(keeps_seen[0] && keeps_seen[1] && keeps_seen[0] != keeps_seen[1],
				  "each conv its own buffer");
			cr_expect_eq(keeps_seen[3], keeps_seen[0], "conv1's backward got other columns");
			cr_expect_eq(keeps_seen[2], keeps_seen[1], "conv2's backward got other columns");
			cr_expect_eq(r.keep[0], keeps_seen[0]);
		}
		replica_free(&r);
	}
	free(x); free(p); free(g);
}

/* Flat input -> batchnorm -> dense: the running statistics follow
 * PyTorch's update, also when two replicas add into one gradient vector
 * (the sync ps's average), and evaluation uses them. */
Test(cnn, batchnorm_running_statistics)
{
	struct config c;
	struct model m;
	char err[512];
	cr_assert_eq(build(&c, &m, "3", "layer = batchnorm\nlayer = dense 2\n", err, sizeof(err)), 0, "%s", err);
	const struct layer *bn = &m.layers[0];
	int B = 16;
	float *x = malloc((size_t)2 * B * 3 * sizeof(float));
	int32_t y[32] = { 0 };
	float *p = malloc(m.nparams * sizeof(float)), *g = calloc(m.nparams, sizeof(float));
	cr_assert(x && p && g);
	model_init_params(&m, p, 0, m.nparams, 1);
	struct backend be;
	backend_cpu(&be, 1);
	struct replica r;
	cr_assert_eq(replica_init(&r, &m, &be, B, err, sizeof(err)), 0, "%s", err);
	/* lr 0: only the plain ranges (running statistics) change. */
	struct optim o;
	struct optim_config oc = { .kind = OPTIM_ADAM, .lr = 0.0f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f };
	cr_assert_eq(optim_init(&o, &oc, m.nparams), 0);
	cr_assert_eq(optim_plain_tensors(&o, &m, 0), 0);
	double rm[3] = { 0, 0, 0 }, rv[3] = { 1, 1, 1 };
	for (int s = 0; s < 20; s++) {
		/* Feature f has mean 2f + 1 and sd f + 1. */
		double mean[3] = { 0 }, q[3] = { 0 };
		for (int i = 0; i < 2 * B; i++)
			for (int f = 0; f < 3; f++)
				x[i * 3 + f] = (float)(2 * f + 1 + (f + 1) * rng_normal(5, RNG_DATA, (uint64_t)(s * 100 + i * 3 + f)));
		for (int f = 0; f < 3; f++) {
			for (int i = 0; i < 2 * B; i++)
				mean[f] += x[i * 3 + f] / (2.0 * B);
		}
		/* Two replicas of B samples each, scale 1 / 2B: the update of the
		 * mean is 0.1 * (mean over 2B - running); the variance's is the
		 * average of the two halves' unbiased variances. */
		double vhalf[3] = { 0 };
		for (int h = 0; h < 2; h++) {
			double mh[3] = { 0 };
			for (int f = 0; f < 3; f++) {
				for (int i = 0; i < B; i++)
					mh[f] += x[(h * B + i) * 3 + f] / B;
				q[f] = 0;
				for (int i = 0; i < B; i++)
					q[f] += pow(x[(h * B + i) * 3 + f] - mh[f], 2);
				vhalf[f] += q[f] / (B - 1) / 2;
			}
			double loss;
			int right;
			cr_assert_eq(replica_load(&r, x + (size_t)h * B * 3, y, B), 0);
			cr_assert_eq(replica_forward(&r, p, B, 1, replica_key(1, s, h), &loss, &right), 0);
			cr_assert_eq(replica_backward(&r, p, g, B, 1.0f / (2 * B)), 0);
		}
		optim_step_zero(&o, p, g, oc.lr);
		for (int f = 0; f < 3; f++) {
			rm[f] += 0.1 * (mean[f] - rm[f]);
			rv[f] += 0.1 * (vhalf[f] - rv[f]);
			cr_assert_float_eq(p[bn->moff + f], rm[f], 1e-4 * (1 + fabs(rm[f])), "step %d mean %d", s, f);
			cr_assert_float_eq(p[bn->voff + f], rv[f], 1e-4 * (1 + fabs(rv[f])), "step %d var %d", s, f);
		}
		/* Trainable parameters stayed (lr 0). */
		cr_assert_eq(p[bn->woff], 1.0f);
		cr_assert_eq(p[bn->boff], 0.0f);
	}
	/* Running statistics moved toward the data's (mean 1, 3, 5). */
	cr_assert_gt(p[bn->moff + 2], 4.0f * (1 - pow(0.9, 20)) );
	/* Evaluation normalizes with the running statistics: the logits are
	 * dense(gamma (x - rm) / sqrt(rv + eps) + beta). */
	double loss_eval, loss_train;
	int right;
	cr_assert_eq(replica_load(&r, x, y, B), 0);
	cr_assert_eq(replica_forward(&r, p, B, 0, 0, &loss_eval, &right), 0);
	const struct layer *d = &m.layers[1];
	float *z = r.act[1];
	for (int i = 0; i < B; i++)
		for (int o2 = 0; o2 < 2; o2++) {
			double s = p[d->boff + o2];
			for (int f = 0; f < 3; f++)
				s += p[d->woff + o2 * 3 + f] *
				     ((x[i * 3 + f] - p[bn->moff + f]) / sqrt(p[bn->voff + f] + 1e-5));
			cr_assert_float_eq(z[i * 2 + o2], s, 1e-4 * (1 + fabs(s)), "eval logit %d,%d", i, o2);
		}
	cr_assert_eq(replica_forward(&r, p, B, 1, 0, &loss_train, &right), 0);
	cr_assert_neq(loss_eval, loss_train, "training and evaluation forward agree");
	/* Backward after an evaluation forward is refused. */
	cr_assert_eq(replica_forward(&r, p, B, 0, 0, &loss_eval, &right), 0);
	cr_assert_eq(replica_backward(&r, p, g, B, 1.0f / B), -EINVAL);
	optim_free(&o);
	replica_free(&r);
	free(x); free(p); free(g);
}

Test(cnn, dropout_in_a_replica)
{
	struct config c;
	struct model m;
	char err[512];
	cr_assert_eq(build(&c, &m, "20", "layer = dense 64\nlayer = relu\nlayer = dropout 0.5\nlayer = dense 3\n",
			   err, sizeof(err)), 0, "%s", err);
	int B = 8;
	float *x = malloc((size_t)B * 20 * sizeof(float)), *p = malloc(m.nparams * sizeof(float));
	int32_t y[8] = { 0, 1, 2, 0, 1, 2, 0, 1 };
	cr_assert(x && p);
	for (int i = 0; i < B * 20; i++)
		x[i] = (float)rng_normal(9, RNG_DATA, (uint64_t)i);
	model_init_params(&m, p, 0, m.nparams, 1);
	struct backend be;
	backend_cpu(&be, 1);
	struct replica r;
	cr_assert_eq(replica_init(&r, &m, &be, B, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(replica_load(&r, x, y, B), 0);
	double e1, e2, t1, t2, t3;
	int right;
	cr_assert_eq(replica_forward(&r, p, B, 0, 1, &e1, &right), 0);
	cr_assert_eq(replica_forward(&r, p, B, 0, 2, &e2, &right), 0);
	cr_assert_eq(e1, e2, "evaluation depends on the key");
	cr_assert_eq(replica_forward(&r, p, B, 1, replica_key(1, 5, 0), &t1, &right), 0);
	cr_assert_eq(replica_forward(&r, p, B, 1, replica_key(1, 5, 0), &t2, &right), 0);
	cr_assert_eq(replica_forward(&r, p, B, 1, replica_key(1, 5, 1), &t3, &right), 0);
	cr_assert_eq(t1, t2, "the same step and stream drew different masks");
	cr_assert_neq(t1, t3, "two streams drew the same mask");
	cr_assert_neq(t1, e1, "training equals evaluation");
	replica_free(&r);
	free(x); free(p);
}

/* An explicit flatten and the implicit one of a dense after a spatial
 * layer are the same model. */
Test(cnn, flatten_is_implicit_before_dense)
{
	struct config c1, c2;
	struct model m1, m2;
	char err[512];
	cr_assert_eq(build(&c1, &m1, "6x6x2", "layer = conv 3 4\nlayer = flatten\nlayer = dense 3\n", err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(build(&c2, &m2, "6x6x2", "layer = conv 3 4\nlayer = dense 3\n", err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(m1.nparams, m2.nparams);
	cr_assert_eq(m1.layers[1].out, 64);
	int B = 4;
	float *x = malloc((size_t)B * 72 * sizeof(float)), *p = malloc(m1.nparams * sizeof(float));
	float *g1 = calloc(m1.nparams, sizeof(float)), *g2 = calloc(m1.nparams, sizeof(float));
	int32_t y[4] = { 0, 1, 2, 1 };
	cr_assert(x && p && g1 && g2);
	for (int i = 0; i < B * 72; i++)
		x[i] = (float)rng_normal(4, RNG_DATA, (uint64_t)i);
	model_init_params(&m1, p, 0, m1.nparams, 1);
	struct backend be;
	backend_cpu(&be, 1);
	struct replica r1, r2;
	cr_assert_eq(replica_init(&r1, &m1, &be, B, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(replica_init(&r2, &m2, &be, B, err, sizeof(err)), 0, "%s", err);
	double l1, l2;
	int right;
	cr_assert_eq(replica_load(&r1, x, y, B), 0);
	cr_assert_eq(replica_load(&r2, x, y, B), 0);
	cr_assert_eq(replica_forward(&r1, p, B, 1, 0, &l1, &right), 0);
	cr_assert_eq(replica_forward(&r2, p, B, 1, 0, &l2, &right), 0);
	cr_assert_eq(replica_backward(&r1, p, g1, B, 1.0f / B), 0);
	cr_assert_eq(replica_backward(&r2, p, g2, B, 1.0f / B), 0);
	cr_assert_eq(l1, l2);
	cr_assert_eq(memcmp(g1, g2, m1.nparams * sizeof(float)), 0);
	replica_free(&r1);
	replica_free(&r2);
	free(x); free(p); free(g1); free(g2);
}

/* Plain ranges are clipped to the optimizer's slice (a ps shard) and get
 * p += g; the rest gets the optimizer's rule. */
Test(cnn, optim_plain_ranges_in_a_shard)
{
	struct config c;
	struct model m;
	char err[512];
	cr_assert_eq(build(&c, &m, "4", "layer = dense 3\nlayer = batchnorm\nlayer = dense 2\n", err, sizeof(err)), 0, "%s", err);
	const struct layer *bn = &m.layers[1];
	/* A shard from the middle of the batchnorm bias to the middle of
	 * running_var. */
	size_t begin = bn->boff + 1, end = bn->voff + 2, n = end - begin;
	struct optim o;
	struct optim_config oc = { .kind = OPTIM_MOMENTUM, .lr = 0.5f, .momentum = 0.9f, .weight_decay = 0.1f };
	cr_assert_eq(optim_init(&o, &oc, n), 0);
	cr_assert_eq(optim_plain_tensors(&o, &m, begin), 0);
	cr_assert_eq(o.nplain, 1, "running mean and variance merge into one range");
	cr_assert_eq(o.plain[0].begin, bn->moff - begin);
	cr_assert_eq(o.plain[0].end, n);
	float p[16], g[16];
	for (size_t i = 0; i < n; i++) {
		p[i] = 1.0f;
		g[i] = 0.25f;
	}
	optim_step_zero(&o, p, g, 0.5f);
	for (size_t i = 0; i < n; i++) {
		size_t gi = begin + i;
		float want = gi >= bn->moff ? 1.25f : 1.0f - 0.5f * (0.25f + 0.1f * 1.0f);
		cr_assert_float_eq(p[i], want, 1e-6, "element %zu (global %zu): %g", i, gi, (double)p[i]);
		cr_assert_eq(g[i], 0.0f);
	}
	optim_free(&o);
}
