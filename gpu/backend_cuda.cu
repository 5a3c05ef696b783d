/* The CUDA backend: struct backend_ops over one GPU, with GEMMs in cuBLAS
 * (fp32; TF32 tensor cores only when asked), the other kernels in
 * kernels.cu, and every buffer from the device's arena.
 *
 * All work of one backend goes to its own stream, in order; only download
 * and the loss (whose sums the host needs) wait for it. Every CUDA and
 * cuBLAS return code is checked; the failing call is named in the
 * backend's error text (gpu_backend_error), which the caller prefixes with
 * the layer. */
extern "C" {
#include "../core/backend.h"
#include "../core/layers.h"
#include "gpu.h"
}

#include "arena.h"
#include "cublas.h"
#include "kernels.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gpu_ctx {
	int device;
	cudaStream_t stream;
	struct cublas_api api;
	cublasHandle_t blas;
	struct gpu_arena arena;
	/* Per-row loss and hits of the last xent_forward, on the device and
	 * in pinned host memory; sized for the largest batch seen. */
	double *row_loss, *host_loss;
	int *row_right, *host_right;
	int rows;
	cudaEvent_t mark[2];   // gpu_mark's start and end
	cudaEvent_t copied;    // after a gpu_copy into this device: the source's stream waits on it
	char err[320];
};

static int cuda_fail(struct gpu_ctx *g, cudaError_t e, const char *call)
{
	cudaGetLastError();   // clear a non-sticky error so the next call is not blamed
	snprintf(g->err, sizeof(g->err), "gpu:%d: %s: %s", g->device, call, cudaGetErrorString(e));
	return -EIO;
}

#define CK(g, call)                                                  \
	do {                                                         \
		cudaError_t e_ = (call);                             \
		if (e_ != cudaSuccess)                               \
			return cuda_fail((g), e_, #call);            \
	} while (0)

/* Launchers return a cudaError_t as int. */
#define CKL(g, what, call)                                           \
	do {                                                         \
		int e_ = (call);                                     \
		if (e_)                                              \
			return cuda_fail((g), (cudaError_t)e_, what); \
	} while (0)

#define CKB(g, what, call)                                                                     \
	do {                                                                                   \
		cublasStatus_t s_ = (call);                                                    \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                             \
			snprintf((g)->err, sizeof((g)->err), "gpu:%d: %s: %s", (g)->device, what, \
				 cublas_status_name(s_));                                      \
			return -EIO;                                                           \
		}                                                                              \
	} while (0)

static int use(struct gpu_ctx *g)
{
	CK(g, cudaSetDevice(g->device));
	return 0;
}

static int g_alloc(void *ctx, void **p, size_t bytes)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	return r ? r : arena_alloc(&g->arena, p, bytes, g->err, sizeof(g->err));
}

static void g_release(void *ctx, void *p)
{
	/* Arena memory is returned all at once when the backend closes. */
	(void)ctx;
	(void)p;
}

static int g_upload(void *ctx, void *dst, const void *src, size_t bytes)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CK(g, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g->stream));
	/* The source is the caller's (often pageable) memory, which it may
	 * reuse as soon as we return. */
	CK(g, cudaStreamSynchronize(g->stream));
	return 0;
}

static int g_download(void *ctx, void *dst, const void *src, size_t bytes)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CK(g, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g->stream));
	CK(g, cudaStreamSynchronize(g->stream));
	return 0;
}

static int g_zero(void *ctx, void *p, size_t bytes)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CK(g, cudaMemsetAsync(p, 0, bytes, g->stream));
	return 0;
}

/* Row-major (rows, cols) arrays are column-major (cols, rows) to cuBLAS,
 * so each product below is the transposed one, with the operands swapped:
 *   out (B,OC) = inp (B,C) W^T        -> out^T = W inp^T     : gemm(T, N)
 *   dinp (B,C) = dout (B,OC) W        -> dinp^T = W^T dout^T : gemm(N, N)
 *   dW (OC,C) += dout^T (OC,B) inp    -> dW^T += inp^T dout  : gemm(N, T) */
static int g_dense_forward(void *ctx, float *out, const float *inp, const float *weight,
			   const float *bias, int B, int C, int OC)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	float one = 1.0f, beta = bias ? 1.0f : 0.0f;
	if (bias)
		CKL(g, "bias fill kernel", gk_bias_fill(g->stream, out, bias, B, OC));
	CKB(g, "cublasSgemm (forward)",
	    g->api.sgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, B, C, &one, weight, C, inp, C, &beta,
			 out, OC));
	return 0;
}

static int g_dense_backward(void *ctx, float *dinp, float *dweight, float *dbias,
			    const float *dout, const float *inp, const float *weight, int B, int C,
			    int OC)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	float one = 1.0f, zero = 0.0f;
	if (dinp)
		CKB(g, "cublasSgemm (input gradient)",
		    g->api.sgemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, C, B, OC, &one, weight, C, dout,
				 OC, &zero, dinp, C));
	CKB(g, "cublasSgemm (weight gradient)",
	    g->api.sgemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, B, &one, inp, C, dout, OC, &one,
			 dweight, C));
	if (dbias)
		CKL(g, "bias gradient kernel", gk_bias_grad(g->stream, dbias, dout, B, OC));
	return 0;
}

static int act_of(enum layer_kind k, enum gk_act *a)
{
	switch (k) {
	case LAYER_RELU: *a = GK_RELU; return 0;
	case LAYER_TANH: *a = GK_TANH; return 0;
	case LAYER_SIGMOID: *a = GK_SIGMOID; return 0;
	default: return -EINVAL;
	}
}

static int g_act_forward(void *ctx, enum layer_kind k, float *out, const float *inp, size_t N)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	enum gk_act a;
	int r = use(g);
	if (!r && (r = act_of(k, &a)) < 0)
		snprintf(g->err, sizeof(g->err), "gpu:%d: no activation kernel for %s", g->device,
			 layer_kind_name(k));
	if (r)
		return r;
	CKL(g, "activation forward kernel", gk_act_forward(g->stream, a, out, inp, N));
	return 0;
}

static int g_act_backward(void *ctx, enum layer_kind k, float *dinp, const float *dout,
			  const float *out, size_t N)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	enum gk_act a;
	int r = use(g);
	if (!r && (r = act_of(k, &a)) < 0)
		snprintf(g->err, sizeof(g->err), "gpu:%d: no activation kernel for %s", g->device,
			 layer_kind_name(k));
	if (r)
		return r;
	CKL(g, "activation backward kernel", gk_act_backward(g->stream, a, dinp, dout, out, N));
	return 0;
}

static int rows_reserve(struct gpu_ctx *g, int B)
{
	if (B <= g->rows)
		return 0;
	/* Arena space cannot be returned, so grow in large steps; in practice
	 * this happens once, at the first (largest) batch. */
	int rows = B > 4096 ? B : 4096;
	cudaFreeHost(g->host_loss);
	cudaFreeHost(g->host_right);
	g->host_loss = NULL;
	g->host_right = NULL;
	g->rows = 0;
	int r = arena_alloc(&g->arena, (void **)&g->row_loss, (size_t)rows * sizeof(double), g->err,
			    sizeof(g->err));
	if (!r)
		r = arena_alloc(&g->arena, (void **)&g->row_right, (size_t)rows * sizeof(int), g->err,
				sizeof(g->err));
	if (r)
		return r;
	CK(g, cudaMallocHost((void **)&g->host_loss, (size_t)rows * sizeof(double)));
	CK(g, cudaMallocHost((void **)&g->host_right, (size_t)rows * sizeof(int)));
	g->rows = rows;
	return 0;
}

static int g_xent_forward(void *ctx, float *probs, double *loss_sum, int *correct,
			  const float *logits, const int32_t *labels, int B, int C)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (!r)
		r = rows_reserve(g, B);
	if (r)
		return r;
	CKL(g, "softmax cross-entropy kernel",
	    gk_xent_forward(g->stream, probs, g->row_loss, g->row_right, logits, labels, B, C));
	CK(g, cudaMemcpyAsync(g->host_loss, g->row_loss, (size_t)B * sizeof(double),
			      cudaMemcpyDeviceToHost, g->stream));
	CK(g, cudaMemcpyAsync(g->host_right, g->row_right, (size_t)B * sizeof(int),
			      cudaMemcpyDeviceToHost, g->stream));
	CK(g, cudaStreamSynchronize(g->stream));
	double sum = 0.0;
	int right = 0;
	for (int b = 0; b < B; b++) {   // in row order, as the CPU sums
		sum += g->host_loss[b];
		right += g->host_right[b];
	}
	*loss_sum = sum;
	if (correct)
		*correct = right;
	return 0;
}

static int g_xent_backward(void *ctx, float *dlogits, const float *probs, const int32_t *labels,
			   int B, int C, float scale)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "softmax cross-entropy backward kernel",
	    gk_xent_backward(g->stream, dlogits, probs, labels, B, C, scale));
	return 0;
}

/* ---- convolutional layers ---------------------------------------------- */

/* Samples per chunk: what the CPU backend's scratch (conv_col_size) holds,
 * so one replica buffer serves both backends. */
static int conv_chunk_of(const struct window *w, int OC, int B)
{
	size_t per = ((size_t)w->C * w->K * w->K + (size_t)OC) * (size_t)w->OH * w->OW;
	size_t padded = (size_t)w->C * (size_t)(w->H + 2 * w->P) * (size_t)(w->W + 2 * w->P);
	size_t n = (conv_col_size(w, OC, B) - padded) / per;
	return n < 1 ? 1 : n > (size_t)B ? B : (int)n;
}

/* Per chunk of nb samples (core/conv.c has the layout):
 *   col (ckk, ld) = im2col; tmp (OC, ld) = weight (OC, ckk) col, i.e. in
 *   cuBLAS's column-major terms tmp^T (ld, OC) = col^T (ld, ckk) weight^T. */
static int g_conv_forward(void *ctx, float *out, float *col, const float *inp, const float *weight,
			  const float *bias, int B, int OC, const struct window *w)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	int ckk = w->C * w->K * w->K, Bc = conv_chunk_of(w, OC, B);
	size_t ohw = (size_t)w->OH * w->OW, in_n = (size_t)w->C * w->H * w->W;
	float one = 1.0f, zero = 0.0f;
	for (int b0 = 0; b0 < B; b0 += Bc) {
		int nb = B - b0 < Bc ? B - b0 : Bc;
		size_t ld = (size_t)nb * ohw;
		float *tmp = col + (size_t)ckk * ld;
		CKL(g, "im2col kernel", gk_im2col(g->stream, col, ld, inp + (size_t)b0 * in_n, nb, w));
		CKB(g, "cublasSgemm (conv forward)",
		    g->api.sgemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)ld, OC, ckk, &one, col, (int)ld,
				 weight, ckk, &zero, tmp, (int)ld));
		CKL(g, "conv scatter kernel",
		    gk_conv_scatter(g->stream, out + (size_t)b0 * OC * ohw, tmp, ld, bias, nb, OC, ohw));
	}
	return 0;
}

/*   tmp (OC, ld) = dout gathered; dweight (OC, ckk) += tmp col^T, i.e.
 *   dweight^T (ckk, OC) += col (ckk, ld) tmp^T: gemm(T, N);
 *   dcol (ckk, ld) = weight^T tmp, i.e. dcol^T (ld, ckk) = tmp^T weight:
 *   gemm(N, T); then col2im into dinp. */
static int g_conv_backward(void *ctx, float *dinp, float *dweight, float *dbias, float *col,
			   const float *dout, const float *inp, const float *weight, int B, int OC,
			   const struct window *w)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	int ckk = w->C * w->K * w->K, Bc = conv_chunk_of(w, OC, B);
	size_t ohw = (size_t)w->OH * w->OW, in_n = (size_t)w->C * w->H * w->W;
	float one = 1.0f, zero = 0.0f;
	for (int b0 = 0; b0 < B; b0 += Bc) {
		int nb = B - b0 < Bc ? B - b0 : Bc;
		size_t ld = (size_t)nb * ohw;
		float *tmp = col + (size_t)ckk * ld;
		CKL(g, "conv gather kernel",
		    gk_conv_gather(g->stream, tmp, ld, dout + (size_t)b0 * OC * ohw, nb, OC, ohw));
		CKL(g, "im2col kernel", gk_im2col(g->stream, col, ld, inp + (size_t)b0 * in_n, nb, w));
		CKB(g, "cublasSgemm (conv weight gradient)",
		    g->api.sgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, ckk, OC, (int)ld, &one, col, (int)ld,
				 tmp, (int)ld, &one, dweight, ckk));
		if (dbias)
			CKL(g, "conv bias gradient kernel", gk_row_sums_add(g->stream, dbias, tmp, ld, OC));
		if (!dinp)
			continue;
		CKB(g, "cublasSgemm (conv input gradient)",
		    g->api.sgemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)ld, ckk, OC, &one, tmp, (int)ld,
				 weight, ckk, &zero, col, (int)ld));
		CKL(g, "col2im kernel",
		    gk_col2im(g->stream, dinp + (size_t)b0 * in_n, col, ld, nb, w));
	}
	return 0;
}

static int g_pool_forward(void *ctx, enum layer_kind k, float *out, const float *inp, int B,
			  const struct window *w)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "pooling forward kernel", gk_pool_forward(g->stream, k == LAYER_MAXPOOL, out, inp, B, w));
	return 0;
}

static int g_pool_backward(void *ctx, enum layer_kind k, float *dinp, const float *dout,
			   const float *inp, int B, const struct window *w)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "pooling backward kernel",
	    gk_pool_backward(g->stream, k == LAYER_MAXPOOL, dinp, dout, inp, B, w));
	return 0;
}

/* Forward and backward are the same mask applied to different vectors. */
static int g_dropout(void *ctx, float *out, const float *inp, float p, uint64_t key, size_t N)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "dropout kernel", gk_dropout(g->stream, out, inp, p, key, N));
	return 0;
}

static int g_batchnorm_forward(void *ctx, float *out, float *mean, float *var, const float *inp,
			       const float *gamma, const float *beta, const float *run_mean,
			       const float *run_var, int B, int C, int HW)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "batchnorm forward kernel",
	    gk_batchnorm_forward(g->stream, out, mean, var, inp, gamma, beta, run_mean, run_var, B, C,
				 HW));
	return 0;
}

static int g_batchnorm_backward(void *ctx, float *dinp, float *dgamma, float *dbeta,
				float *drun_mean, float *drun_var, const float *dout,
				const float *inp, const float *gamma, const float *mean,
				const float *var, const float *run_mean, const float *run_var,
				float stat_scale, int B, int C, int HW)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "batchnorm backward kernel",
	    gk_batchnorm_backward(g->stream, dinp, dgamma, dbeta, drun_mean, drun_var, dout, inp,
				  gamma, mean, var, run_mean, run_var, stat_scale, B, C, HW));
	return 0;
}

static const struct backend_ops cuda_ops = {
	.name = "cuda",
	.alloc = g_alloc,
	.release = g_release,
	.upload = g_upload,
	.download = g_download,
	.zero = g_zero,
	.dense_forward = g_dense_forward,
	.dense_backward = g_dense_backward,
	.act_forward = g_act_forward,
	.act_backward = g_act_backward,
	.conv_forward = g_conv_forward,
	.conv_backward = g_conv_backward,
	.pool_forward = g_pool_forward,
	.pool_backward = g_pool_backward,
	.dropout_forward = g_dropout,
	.dropout_backward = g_dropout,
	.batchnorm_forward = g_batchnorm_forward,
	.batchnorm_backward = g_batchnorm_backward,
	.xent_forward = g_xent_forward,
	.xent_backward = g_xent_backward,
};

static void ctx_free(struct gpu_ctx *g)
{
	if (!g)
		return;
	cudaSetDevice(g->device);
	if (g->stream)
		cudaStreamSynchronize(g->stream);
	if (g->blas && g->api.destroy)
		g->api.destroy(g->blas);
	cublas_unload(&g->api);
	cudaFreeHost(g->host_loss);
	cudaFreeHost(g->host_right);
	arena_free(&g->arena);
	for (int i = 0; i < 2; i++)
		if (g->mark[i])
			cudaEventDestroy(g->mark[i]);
	if (g->copied)
		cudaEventDestroy(g->copied);
	if (g->stream)
		cudaStreamDestroy(g->stream);
	cudaGetLastError();
	free(g);
}

static int ctx_open(struct gpu_ctx *g, int device, const struct gpu_options *o)
{
	size_t free_b = 0, total_b = 0;
	CK(g, cudaSetDevice(device));
	CK(g, cudaMemGetInfo(&free_b, &total_b));
	CK(g, cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
	int r = cublas_load(&g->api, g->err, sizeof(g->err));
	if (r)
		return r;
	CK(g, cudaEventCreate(&g->mark[0]));
	CK(g, cudaEventCreate(&g->mark[1]));
	CK(g, cudaEventCreateWithFlags(&g->copied, cudaEventDisableTiming));
	CKB(g, "cublasCreate", g->api.create(&g->blas));
	CKB(g, "cublasSetStream", g->api.set_stream(g->blas, g->stream));
	/* Plain fp32 unless TF32 is asked for: results then match the CPU to
	 * float32 rounding, which the tests rely on. */
	CKB(g, "cublasSetMathMode",
	    g->api.set_math_mode(g->blas, o->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
	/* The context and cuBLAS already hold some memory, so a fraction near 1
	 * can never be had in full: take at most what is free less a margin
	 * for cuBLAS's workspace. */
	size_t cap = (size_t)(o->memory_fraction * (double)total_b);
	size_t margin = (size_t)256 << 20;
	if (cap > free_b - (free_b < margin ? free_b : margin))
		cap = free_b - (free_b < margin ? free_b : margin);
	return arena_init(&g->arena, device, cap, o->allow_growth, g->err, sizeof(g->err));
}

extern "C" int gpu_backend_open(struct backend *b, int device, const struct gpu_options *o,
				char *err, size_t errlen)
{
	memset(b, 0, sizeof(*b));
	/* -ENODEV: no code for this GPU's compute capability (soft placement uses the CPU) */
	if (int e = gpu_arch_check(device, err, errlen))
		return e;
	struct gpu_ctx *g = (struct gpu_ctx *)calloc(1, sizeof(*g));
	if (!g) {
		snprintf(err, errlen, "gpu:%d: out of host memory", device);
		return -ENOMEM;
	}
	g->device = device;
	int r = ctx_open(g, device, o);
	if (r) {
		snprintf(err, errlen, "%s", g->err);
		ctx_free(g);
		return r;
	}
	b->ops = &cuda_ops;
	b->ctx = g;
	snprintf(b->where, sizeof(b->where), "gpu:%d", device);
	return 0;
}

extern "C" void gpu_backend_close(struct backend *b)
{
	if (!b || b->ops != &cuda_ops)
		return;
	ctx_free((struct gpu_ctx *)b->ctx);
	memset(b, 0, sizeof(*b));
}

extern "C" const char *gpu_backend_error(const struct backend *b)
{
	return b && b->ops == &cuda_ops ? ((const struct gpu_ctx *)b->ctx)->err : "";
}

extern "C" size_t gpu_backend_used(const struct backend *b)
{
	return b && b->ops == &cuda_ops ? ((const struct gpu_ctx *)b->ctx)->arena.handed : 0;
}

extern "C" int gpu_optim_step(const struct backend *b, const struct gk_optim *o, float *params,
			      float *grads, float *m, float *v, size_t n, int zero)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "optimizer kernel", gk_optim_step(g->stream, o, params, grads, m, v, n, zero));
	return 0;
}

extern "C" int gpu_sync(const struct backend *b)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r)
		return r;
	CK(g, cudaStreamSynchronize(g->stream));
	return 0;
}

extern "C" int gpu_add(const struct backend *b, float *y, const float *x, size_t n)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "gradient sum kernel", gk_add(g->stream, y, x, n));
	return 0;
}

extern "C" int gpu_copy(const struct backend *dst_b, void *dst, const struct backend *src_b,
			const void *src, size_t bytes)
{
	struct gpu_ctx *d = (struct gpu_ctx *)dst_b->ctx, *s = (struct gpu_ctx *)src_b->ctx;
	int r = use(s);
	if (r)
		return r;
	CK(s, cudaStreamSynchronize(s->stream));
	if (d->device != s->device) {
		int can = 0;
		CK(d, cudaDeviceCanAccessPeer(&can, d->device, s->device));
		if (can) {
			CK(d, cudaSetDevice(d->device));
			cudaError_t e = cudaDeviceEnablePeerAccess(s->device, 0);
			if (e == cudaErrorPeerAccessAlreadyEnabled)
				cudaGetLastError();
			else if (e != cudaSuccess)
				return cuda_fail(d, e, "cudaDeviceEnablePeerAccess");
		}
	}
	r = use(d);
	if (r)
		return r;
	CK(d, cudaMemcpyPeerAsync(dst, d->device, src, s->device, bytes, d->stream));
	if (d != s) {
		/* The source's later work (zeroing a gradient that was just
		 * read, the next optimizer step on parameters being
		 * broadcast) must wait for the copy, which runs on the
		 * destination's stream. */
		CK(d, cudaEventRecord(d->copied, d->stream));
		r = use(s);
		if (r)
			return r;
		CK(s, cudaStreamWaitEvent(s->stream, d->copied, 0));
	}
	return 0;
}

extern "C" int gpu_backend_device(const struct backend *b)
{
	return b && b->ops == &cuda_ops ? ((const struct gpu_ctx *)b->ctx)->device : -1;
}

extern "C" int gpu_mark(const struct backend *b, int end)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r)
		return r;
	CK(g, cudaEventRecord(g->mark[end ? 1 : 0], g->stream));
	return 0;
}

extern "C" int gpu_marked_ms(const struct backend *b, double *ms)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	float f = 0;
	int r = use(g);
	if (r)
		return r;
	CK(g, cudaEventSynchronize(g->mark[1]));
	CK(g, cudaEventElapsedTime(&f, g->mark[0], g->mark[1]));
	*ms = f;
	return 0;
}
