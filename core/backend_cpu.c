/* The CPU backend: host memory and the reference kernels of layers.c. */
#include "backend.h"
#include "layers.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int cpu_dense_backward(void *ctx, float *dinp, float *dweight, float *dbias,
			      const float *dout, const float *inp, const float *weight,
			      int B, int C, int OC)
{
	(void)ctx;
	dense_backward(dinp, dweight, dbias, dout, inp, weight, B, C, OC);
	return 0;
}

static int cpu_act_forward(void *ctx, enum layer_kind k, float *out, const float *inp, size_t N)
{
	(void)ctx;
	switch (k) {
	case LAYER_RELU: relu_forward(out, inp, N); return 0;
	case LAYER_TANH: tanh_forward(out, inp, N); return 0;
	case LAYER_SIGMOID: sigmoid_forward(out, inp, N); return 0;
	default: return -EINVAL;
	}
}

static int cpu_act_backward(void *ctx, enum layer_kind k, float *dinp, const float *dout,
			    const float *out, size_t N)
{
	(void)ctx;
	switch (k) {
	case LAYER_RELU: relu_backward(dinp, dout, out, N); return 0;
	case LAYER_TANH: tanh_backward(dinp, dout, out, N); return 0;
	case LAYER_SIGMOID: sigmoid_backward(dinp, dout, out, N); return 0;
	default: return -EINVAL;
	}
}

static int cpu_xent_forward(void *ctx, float *probs, double *loss_sum, int *correct,
			    const float *logits, const int32_t *labels, int B, int C)
{
	(void)ctx;
	*loss_sum = softmax_xent_forward(probs, correct, logits, labels, B, C);
	return 0;
}

static int cpu_xent_backward(void *ctx, float *dlogits, const float *probs,
			     const int32_t *labels, int B, int C, float scale)
{
	(void)ctx;
	softmax_xent_backward(dlogits, probs, labels, B, C, scale);
	return 0;
}

static int cpu_conv_forward(void *ctx, float *out, float *col, const float *inp,
			    const float *weight, const float *bias, int B, int OC,
			    const struct window *w)
{
	(void)ctx;
	conv_forward(out, col, inp, weight, bias, B, OC, w);
	return 0;
}

static int cpu_conv_backward(void *ctx, float *dinp, float *dweight, float *dbias, float *col,
			     const float *dout, const float *inp, const float *weight, int B,
			     int OC, const struct window *w)
{
	(void)ctx;
	conv_backward(dinp, dweight, dbias, col, dout, inp, weight, B, OC, w);
	return 0;
}

static int cpu_pool_forward(void *ctx, enum layer_kind k, float *out, const float *inp, int B,
			    const struct window *w)
{
	(void)ctx;
	switch (k) {
	case LAYER_MAXPOOL: maxpool_forward(out, inp, B, w); return 0;
	case LAYER_AVGPOOL: avgpool_forward(out, inp, B, w); return 0;
	default: return -EINVAL;
	}
}

static int cpu_pool_backward(void *ctx, enum layer_kind k, float *dinp, const float *dout,
			     const float *inp, int B, const struct window *w)
{
	(void)ctx;
	switch (k) {
	case LAYER_MAXPOOL: maxpool_backward(dinp, dout, inp, B, w); return 0;
	case LAYER_AVGPOOL: avgpool_backward(dinp, dout, B, w); return 0;
	default: return -EINVAL;
	}
}

static int cpu_dropout_forward(void *ctx, float *out, const float *inp, float p, uint64_t key,
			       size_t N)
{
	(void)ctx;
	dropout_forward(out, inp, p, key, N);
	return 0;
}

static int cpu_dropout_backward(void *ctx, float *dinp, const float *dout, float p, uint64_t key,
				size_t N)
{
	(void)ctx;
	dropout_backward(dinp, dout, p, key, N);
	return 0;
}

static int cpu_batchnorm_forward(void *ctx, float *out, float *mean, float *var, const float *inp,
				 const float *gamma, const float *beta, const float *run_mean,
				 const float *run_var, int B, int C, int HW)
{
	(void)ctx;
	batchnorm_forward(out, mean, var, inp, gamma, beta, run_mean, run_var, B, C, HW);
	return 0;
}

static int cpu_batchnorm_backward(void *ctx, float *dinp, float *dgamma, float *dbeta,
				  float *drun_mean, float *drun_var, const float *dout,
				  const float *inp, const float *gamma, const float *mean,
				  const float *var, const float *run_mean, const float *run_var,
				  float stat_scale, int B, int C, int HW)
{
	(void)ctx;
	batchnorm_backward(dinp, dgamma, dbeta, drun_mean, drun_var, dout, inp, gamma, mean, var,
			   run_mean, run_var, stat_scale, B, C, HW);
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
};

void backend_cpu(struct backend *b, int threads)
{
	layers_set_threads(threads);
	b->ops = &cpu_ops;
	b->ctx = NULL;
	snprintf(b->where, sizeof(b->where), "cpu:0");
}
