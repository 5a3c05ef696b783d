/* The CPU backend: host memory and the reference kernels of layers.c.
 *
 * The backend's ctx is its thread count, held in the pointer itself, so a
 * struct backend can be copied freely and needs no freeing. Dense layers
 * get their threads from OpenBLAS; convolutions, pooling, batchnorm and the
 * activations of a batch spread over the same number of threads of their
 * own (core/nn/parallel.h), split so that results do not depend on the count. */
#include "backend.h"
#include "embed.h"
#include "layers.h"
#include "parallel.h"

#include <cblas.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ctx_threads(void *ctx)
{
	return (int)(intptr_t)ctx;
}

/* Work smaller than this many values runs on the calling thread alone:
 * starting a thread costs about as much as passing over it. */
#define PAR_MIN_VALUES ((size_t)1 << 16)

static int threads_for(void *ctx, size_t values)
{
	return values < PAR_MIN_VALUES ? 1 : ctx_threads(ctx);
}

static int cpu_alloc(void *ctx, void **p, size_t bytes)
{
	(void)ctx;
	/* 64-byte alignment keeps sgemm's and the vector loops' loads aligned. */
	size_t n = (bytes + 63) & ~(size_t)63;
	*p = aligned_alloc(64, n ? n : 64);
	return *p ? 0 : -ENOMEM;
}

static void cpu_release(void *ctx, void *p)
{
	(void)ctx;
	free(p);
}

static int cpu_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
	(void)ctx;
	if (dst != src)
		memcpy(dst, src, bytes);
	return 0;
}

static int cpu_zero(void *ctx, void *p, size_t bytes)
{
	(void)ctx;
	memset(p, 0, bytes);
	return 0;
}

static int cpu_dense_forward(void *ctx, float *out, const float *inp, const float *weight,
			     const float *bias, int B, int C, int OC)
{
	(void)ctx;
	dense_forward(out, inp, weight, bias, B, C, OC);
	return 0;
}

static int cpu_dense_forward_rows(void *ctx, float *out, const float *inp, const float *weight,
				  const float *bias, int B, int C, int OC, int o0, int o1)
{
	(void)ctx;
	dense_forward_rows(out, inp, weight, bias, B, C, OC, o0, o1);
	return 0;
}

static int cpu_dense_backward(void *ctx, float *dinp, float *dweight, float *dbias,
			      const float *dout, const float *inp, const float *weight,
			      int B, int C, int OC)
{
	(void)ctx;
	dense_backward(dinp, dweight, dbias, dout, inp, weight, B, C, OC);
	return 0;
}

static int cpu_dense_wgrad(void *ctx, float *dweight, const float *dout, const float *inp, int B,
			   int C, int OC, int o0, int o1)
{
	(void)ctx;
	dense_wgrad_rows(dweight, dout, inp, B, C, OC, o0, o1);
	return 0;
}

static int act_kind(enum layer_kind k)
{
	return k == LAYER_RELU || k == LAYER_TANH || k == LAYER_SIGMOID;
}

static int act_forward_range(enum layer_kind k, float *out, const float *inp, size_t N)
{
	switch (k) {
	case LAYER_RELU: relu_forward(out, inp, N); return 0;
	case LAYER_TANH: tanh_forward(out, inp, N); return 0;
	case LAYER_SIGMOID: sigmoid_forward(out, inp, N); return 0;
	default: return -EINVAL;
	}
}

static int act_backward_range(enum layer_kind k, float *dinp, const float *dout,
			      const float *out, size_t N)
{
	switch (k) {
	case LAYER_RELU: relu_backward(dinp, dout, out, N); return 0;
	case LAYER_TANH: tanh_backward(dinp, dout, out, N); return 0;
	case LAYER_SIGMOID: sigmoid_backward(dinp, dout, out, N); return 0;
	default: return -EINVAL;
	}
}

/* An elementwise pass split into contiguous element ranges: each element's
 * value is computed the same way in whichever range it falls. */
struct act_job {
	enum layer_kind k;
	float *dst;
	const float *a, *b;   /* forward: inp; backward: dout, out */
	size_t N;
	int backward;
};

static void act_share(void *arg, int t, int nt)
{
	const struct act_job *j = arg;
	size_t lo, hi;
	parallel_share(j->N, t, nt, &lo, &hi);
	/* Ranges start on 16-value boundaries, so each thread's vector loop
	 * is aligned as a whole-array pass would be. */
	lo = t ? (lo + 15) & ~(size_t)15 : 0;
	hi = t + 1 < nt ? (hi + 15) & ~(size_t)15 : j->N;
	if (hi > j->N)
		hi = j->N;
	if (lo >= hi)
		return;
	if (j->backward)
		act_backward_range(j->k, j->dst + lo, j->a + lo, j->b + lo, hi - lo);
	else
		act_forward_range(j->k, j->dst + lo, j->a + lo, hi - lo);
}

static int cpu_act_forward(void *ctx, enum layer_kind k, float *out, const float *inp, size_t N)
{
	int nt = threads_for(ctx, N);
	if (nt == 1 || !act_kind(k))
		return act_forward_range(k, out, inp, N);
	struct act_job j = { .k = k, .dst = out, .a = inp, .N = N };
	parallel_run(nt, act_share, &j);
	return 0;
}

static int cpu_act_backward(void *ctx, enum layer_kind k, float *dinp, const float *dout,
			    const float *out, size_t N)
{
	int nt = threads_for(ctx, N);
	if (nt == 1 || !act_kind(k))
		return act_backward_range(k, dinp, dout, out, N);
	struct act_job j = { .k = k, .dst = dinp, .a = dout, .b = out, .N = N, .backward = 1 };
	parallel_run(nt, act_share, &j);
	return 0;
}

static int cpu_xent_forward(void *ctx, float *probs, double *meter, const float *logits,
			    const int32_t *labels, int B, int C)
{
	(void)ctx;
	int right = 0;
	meter[0] += softmax_xent_forward(probs, &right, logits, labels, B, C);
	meter[1] += right;
	return 0;
}

static int cpu_xent_backward(void *ctx, float *dlogits, const float *probs,
			     const int32_t *labels, int B, int C, float scale)
{
	(void)ctx;
	softmax_xent_backward(dlogits, probs, labels, B, C, scale);
	return 0;
}

/* The probabilities go straight into dlogits, which the backward then
 * turns into the gradient in place (it may alias its input). */
static int cpu_xent_train(void *ctx, float *dlogits, double *meter, const float *logits,
			  const int32_t *labels, int B, int C, float scale)
{
	int e = cpu_xent_forward(ctx, dlogits, meter, logits, labels, B, C);
	if (!e)
		e = cpu_xent_backward(ctx, dlogits, dlogits, labels, B, C, scale);
	return e;
}

static int cpu_sigmoid_xent_forward(void *ctx, float *probs, double *meter, const float *logits,
				    const int32_t *labels, int B)
{
	(void)ctx;
	int right = 0;
	meter[0] += sigmoid_xent_forward(probs, &right, logits, labels, B);
	meter[1] += right;
	return 0;
}

static int cpu_sigmoid_xent_backward(void *ctx, float *dlogits, const float *probs,
				     const int32_t *labels, int B, float scale)
{
	(void)ctx;
	sigmoid_xent_backward(dlogits, probs, labels, B, scale);
	return 0;
}

static int cpu_sigmoid_xent_train(void *ctx, float *dlogits, double *meter, const float *logits,
				  const int32_t *labels, int B, float scale)
{
	int e = cpu_sigmoid_xent_forward(ctx, dlogits, meter, logits, labels, B);
	if (!e)
		e = cpu_sigmoid_xent_backward(ctx, dlogits, dlogits, labels, B, scale);
	return e;
}

static int cpu_embed_gather(void *ctx, float *U, const float *table, const uint64_t *rows, size_t u,
			    int DIM)
{
	(void)ctx;
	embed_gather_rows(U, table, rows, u, DIM);
	return 0;
}

static int cpu_embed_forward(void *ctx, float *out, const float *x, const float *U,
			     const uint32_t *off, const uint32_t *idx, int B, int F, int D, int DIM,
			     enum embed_pool pool)
{
	(void)ctx;
	embed_forward(out, x, U, off, idx, B, F, D, DIM, pool);
	return 0;
}

static int cpu_embed_backward(void *ctx, float *dU, const float *dout, const uint32_t *roff,
			      const uint32_t *rseg, const uint32_t *off, size_t u, int F, int D,
			      int DIM, enum embed_pool pool)
{
	(void)ctx;
	embed_backward(dU, dout, roff, rseg, off, u, F, D, DIM, pool);
	return 0;
}

static int cpu_gather(void *ctx, float *x, int32_t *y, const float *data_x, const int32_t *data_y,
		      const uint32_t *order, size_t at, int B, size_t D)
{
	(void)ctx;
	order += at;
	for (int b = 0; b < B; b++) {
		memcpy(x + (size_t)b * D, data_x + (size_t)order[b] * D, D * sizeof(float));
		y[b] = data_y[order[b]];
	}
	return 0;
}

/* keep is always NULL here (no conv_keep_floats): the CPU's chunks are
 * cache-sized, and rebuilding a chunk's columns costs less than reading a
 * batch's back from memory. */
static int cpu_conv_forward(void *ctx, float *out, float *col, float *keep, const float *inp,
			    const float *weight, const float *bias, int B, int OC,
			    const struct window *w)
{
	(void)keep;
	conv_forward_mt(out, col, inp, weight, bias, B, OC, w, ctx_threads(ctx));
	return 0;
}

static int cpu_conv_backward(void *ctx, float *dinp, float *dweight, float *dbias, float *col,
			     const float *keep, const float *dout, const float *inp,
			     const float *weight, int B, int OC, const struct window *w)
{
	(void)keep;
	conv_backward_mt(dinp, dweight, dbias, col, dout, inp, weight, B, OC, w, ctx_threads(ctx));
	return 0;
}

/* Pooling split by samples: every (sample, channel) plane is independent. */
struct pool_job {
	enum layer_kind k;
	float *dst;
	const float *a, *b;   /* forward: inp; backward: dout, inp */
	int B, backward;
	const struct window *w;
};

static void pool_range(const struct pool_job *j, int b0, int nb)
{
	const struct window *w = j->w;
	size_t in_n = (size_t)w->C * w->H * w->W, out_n = (size_t)w->C * w->OH * w->OW;
	if (!j->backward) {
		if (j->k == LAYER_MAXPOOL)
			maxpool_forward(j->dst + b0 * out_n, j->a + b0 * in_n, nb, w);
		else
			avgpool_forward(j->dst + b0 * out_n, j->a + b0 * in_n, nb, w);
	} else {
		if (j->k == LAYER_MAXPOOL)
			maxpool_backward(j->dst + b0 * in_n, j->a + b0 * out_n, j->b + b0 * in_n, nb, w);
		else
			avgpool_backward(j->dst + b0 * in_n, j->a + b0 * out_n, nb, w);
	}
}

static void pool_share(void *arg, int t, int nt)
{
	const struct pool_job *j = arg;
	size_t lo, hi;
	parallel_share((size_t)j->B, t, nt, &lo, &hi);
	if (hi > lo)
		pool_range(j, (int)lo, (int)(hi - lo));
}

static int pool_run(void *ctx, struct pool_job *j)
{
	if (j->k != LAYER_MAXPOOL && j->k != LAYER_AVGPOOL)
		return -EINVAL;
	const struct window *w = j->w;
	int nt = threads_for(ctx, (size_t)j->B * w->C * w->H * w->W);
	if (nt > j->B)
		nt = j->B;
	if (nt <= 1)
		pool_range(j, 0, j->B);
	else
		parallel_run(nt, pool_share, j);
	return 0;
}

static int cpu_pool_forward(void *ctx, enum layer_kind k, float *out, const float *inp, int B,
			    const struct window *w)
{
	struct pool_job j = { .k = k, .dst = out, .a = inp, .B = B, .w = w };
	return pool_run(ctx, &j);
}

static int cpu_pool_backward(void *ctx, enum layer_kind k, float *dinp, const float *dout,
			     const float *inp, int B, const struct window *w)
{
	struct pool_job j = { .k = k, .dst = dinp, .a = dout, .b = inp, .B = B, .backward = 1, .w = w };
	return pool_run(ctx, &j);
}

static int cpu_dropout_forward(void *ctx, float *out, const float *inp, float p, uint64_t key,
			       int layer, size_t N)
{
	(void)ctx;
	dropout_forward(out, inp, p, dropout_layer_key(key, layer), N);
	return 0;
}

static int cpu_dropout_backward(void *ctx, float *dinp, const float *dout, float p, uint64_t key,
				int layer, size_t N)
{
	(void)ctx;
	dropout_backward(dinp, dout, p, dropout_layer_key(key, layer), N);
	return 0;
}

static int cpu_batchnorm_forward(void *ctx, float *out, float *mean, float *var, const float *inp,
				 const float *gamma, const float *beta, const float *run_mean,
				 const float *run_var, int B, int C, int HW)
{
	batchnorm_forward_mt(out, mean, var, inp, gamma, beta, run_mean, run_var, B, C, HW,
			     threads_for(ctx, (size_t)B * C * HW));
	return 0;
}

static int cpu_batchnorm_backward(void *ctx, float *dinp, float *dgamma, float *dbeta,
				  float *drun_mean, float *drun_var, const float *dout,
				  const float *inp, const float *gamma, const float *mean,
				  const float *var, const float *run_mean, const float *run_var,
				  float stat_scale, int B, int C, int HW)
{
	batchnorm_backward_mt(dinp, dgamma, dbeta, drun_mean, drun_var, dout, inp, gamma, mean,
			      var, run_mean, run_var, stat_scale, B, C, HW,
			      threads_for(ctx, (size_t)B * C * HW));
	return 0;
}

static const struct backend_ops cpu_ops = {
	.name = "cpu",
	.alloc = cpu_alloc,
	.release = cpu_release,
	.upload = cpu_copy,
	.download = cpu_copy,
	.zero = cpu_zero,
	.dense_forward = cpu_dense_forward,
	.dense_backward = cpu_dense_backward,
	.dense_wgrad = cpu_dense_wgrad,
	.dense_forward_rows = cpu_dense_forward_rows,
	.act_forward = cpu_act_forward,
	.act_backward = cpu_act_backward,
	.conv_forward = cpu_conv_forward,
	.conv_backward = cpu_conv_backward,
	.pool_forward = cpu_pool_forward,
	.pool_backward = cpu_pool_backward,
	.dropout_forward = cpu_dropout_forward,
	.dropout_backward = cpu_dropout_backward,
	.batchnorm_forward = cpu_batchnorm_forward,
	.batchnorm_backward = cpu_batchnorm_backward,
	.xent_forward = cpu_xent_forward,
	.xent_backward = cpu_xent_backward,
	.xent_train = cpu_xent_train,
	.gather = cpu_gather,
	.sigmoid_xent_forward = cpu_sigmoid_xent_forward,
	.sigmoid_xent_backward = cpu_sigmoid_xent_backward,
	.sigmoid_xent_train = cpu_sigmoid_xent_train,
	.embed_gather = cpu_embed_gather,
	.embed_forward = cpu_embed_forward,
	.embed_backward = cpu_embed_backward,
};

void backend_cpu(struct backend *b, int threads)
{
	b->ops = &cpu_ops;
	b->ctx = (void *)(intptr_t)layers_set_threads(threads);
	snprintf(b->where, sizeof(b->where), "cpu:0");
}
