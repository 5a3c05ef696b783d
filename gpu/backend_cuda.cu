/* The CUDA backend: struct backend_ops over one GPU, with GEMMs in cuBLAS
 * (fp32; TF32 tensor cores only when asked), the other kernels in
 * kernels.cu, and every buffer from the device's arena.
 *
 * All work of one backend goes to its own stream, in order; only upload
 * (from pageable memory), download and the staged batches' buffers wait
 * for it: a training step never does. The loss and the right answers are
 * summed on the device into the replica's meter. Every CUDA and
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
	void *blas_work;   // cuBLAS's workspace, BLAS_WORK bytes (outside the arena's cap)
	struct gpu_arena arena;
	/* Scratch of the loss and the bias gradients (g_reserve): per-row
	 * loss and right answers, the bias gradient's partial sums and
	 * tickets, for batches up to `rows` rows of up to `width` floats. */
	double *row_loss, *row_right;
	float *partial;
	unsigned *tickets;
	int rows, width;
	/* Staged batches (gpu_stage_*): pinned host and device buffers, the
	 * copy stream, an event when each buffer has landed and when the
	 * compute stream is done with it. */
	cudaStream_t copy;
	float *stage_hx[2], *stage_dx[2];
	int32_t *stage_hy[2], *stage_dy[2];
	cudaEvent_t stage_loaded[2], stage_free[2];
	int stage_rows, stage_next;
	size_t stage_D;
	/* A training step captured as a CUDA graph (gpu_graph_*): while
	 * capturing, the gather and optimizer kernels read their per-step
	 * values from *step, which gk_step_set fills before each replay. */
	int capturing;
	struct gk_step *step;
	cudaGraphExec_t graph;
	cudaEvent_t mark[2];   // gpu_mark's start and end
	cudaEvent_t ready;     // gpu_copy from this backend: its queued work is done
	cudaEvent_t copied;    // after a gpu_copy into this backend: the source's stream waits on it
	unsigned long long peers;   // devices whose peer access was tried (bit per device < 64)
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
	float one = 1.0f, zero = 0.0f;
	CKB(g, "cublasSgemm (forward)",
	    g->api.sgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, B, C, &one, weight, C, inp, C, &zero,
			 out, OC));
	CKL(g, "bias kernel", gk_bias_act(g->stream, GK_NONE, out, bias, B, OC));
	return 0;
}

static int act_of(enum layer_kind k, enum gk_act *a);

/* The GEMM, then bias and activation in one pass over its output. */
static int g_dense_act_forward(void *ctx, float *out, const float *inp, const float *weight,
			       const float *bias, int B, int C, int OC, enum layer_kind act)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	enum gk_act a;
	int r = use(g);
	if (!r && (r = act_of(act, &a)) < 0)
		snprintf(g->err, sizeof(g->err), "gpu:%d: no activation kernel for %s", g->device,
			 layer_kind_name(act));
	if (r)
		return r;
	float one = 1.0f, zero = 0.0f;
	CKB(g, "cublasSgemm (forward)",
	    g->api.sgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, B, C, &one, weight, C, inp, C, &zero,
			 out, OC));
	CKL(g, "bias and activation kernel", gk_bias_act(g->stream, a, out, bias, B, OC));
	return 0;
}

/* The bias gradient's scratch when it covers B rows of OC, else NULL (the
 * kernel then runs one block row over every row). */
static float *partial_for(const struct gpu_ctx *g, int B, int OC)
{
	return B <= g->rows && OC <= g->width ? g->partial : NULL;
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
	if (dbias)   /* GK_NONE: dout is only read */
		CKL(g, "bias gradient kernel",
		    gk_act_bias_backward(g->stream, GK_NONE, (float *)dout, dbias, NULL, B, OC,
					 partial_for(g, B, OC), g->tickets));
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

static int g_act_bias_backward(void *ctx, enum layer_kind k, float *dout, float *dbias,
			       const float *out, int B, int OC)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	enum gk_act a = GK_NONE;
	int r = use(g);
	if (!r && k != LAYER_DENSE && (r = act_of(k, &a)) < 0)
		snprintf(g->err, sizeof(g->err), "gpu:%d: no activation kernel for %s", g->device,
			 layer_kind_name(k));
	if (r)
		return r;
	CKL(g, "activation and bias gradient kernel",
	    gk_act_bias_backward(g->stream, a, dout, dbias, out, B, OC, partial_for(g, B, OC),
				 g->tickets));
	return 0;
}

/* Scratch for batches up to max_batch rows of up to width floats: taken
 * from the arena before the first step (replica_init), so the step takes
 * none. Arena space cannot be returned; a larger request takes new. */
static int g_reserve(void *ctx, int max_batch, int width)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r || (max_batch <= g->rows && width <= g->width))
		return r;
	int rows = max_batch > g->rows ? max_batch : g->rows;
	int w = width > g->width ? width : g->width;
	double *loss, *right;
	float *partial;
	unsigned *tickets;
	r = arena_alloc(&g->arena, (void **)&loss, (size_t)rows * sizeof(double), g->err,
			sizeof(g->err));
	if (!r)
		r = arena_alloc(&g->arena, (void **)&right, (size_t)rows * sizeof(double), g->err,
				sizeof(g->err));
	if (!r)
		r = arena_alloc(&g->arena, (void **)&partial, gk_bias_partials(rows, w) * sizeof(float),
				g->err, sizeof(g->err));
	if (!r)
		r = arena_alloc(&g->arena, (void **)&tickets, gk_bias_tickets(w) * sizeof(unsigned),
				g->err, sizeof(g->err));
	if (r)
		return r;
	/* The tickets start at zero and every launch leaves them there. */
	CK(g, cudaMemsetAsync(tickets, 0, gk_bias_tickets(w) * sizeof(unsigned), g->stream));
	g->row_loss = loss;
	g->row_right = right;
	g->partial = partial;
	g->tickets = tickets;
	g->rows = rows;
	g->width = w;
	return 0;
}

static int rows_check(struct gpu_ctx *g, int B)
{
	if (B <= g->rows)
		return 0;
	snprintf(g->err, sizeof(g->err), "gpu:%d: a batch of %d rows but scratch was reserved for %d",
		 g->device, B, g->rows);
	return -EINVAL;
}

static int g_xent_forward(void *ctx, float *probs, double *meter, const float *logits,
			  const int32_t *labels, int B, int C)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (!r)
		r = rows_check(g, B);
	if (r)
		return r;
	CKL(g, "softmax cross-entropy kernel",
	    gk_xent_rows(g->stream, probs, g->row_loss, g->row_right, logits, labels, B, C, 0, 0.0f));
	CKL(g, "loss sum kernel", gk_meter_add(g->stream, meter, g->row_loss, g->row_right, B));
	return 0;
}

static int g_xent_train(void *ctx, float *dlogits, double *meter, const float *logits,
			const int32_t *labels, int B, int C, float scale)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (!r)
		r = rows_check(g, B);
	if (r)
		return r;
	CKL(g, "softmax cross-entropy kernel",
	    gk_xent_rows(g->stream, dlogits, g->row_loss, g->row_right, logits, labels, B, C, 1,
			 scale));
	CKL(g, "loss sum kernel", gk_meter_add(g->stream, meter, g->row_loss, g->row_right, B));
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

static int g_gather(void *ctx, float *x, int32_t *y, const float *data_x, const int32_t *data_y,
		    const uint32_t *order, size_t at, int B, size_t D)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "batch gather kernel",
	    gk_gather(g->stream, x, y, data_x, data_y, order, at, g->capturing ? g->step : NULL, B, D));
	return 0;
}

/* ---- convolutional layers ---------------------------------------------- */

/* Samples per conv GEMM: the whole batch where its im2col columns and GEMM
 * output fit an eighth of the arena's cap, else as many as do (at least
 * one). A GEMM over the batch is what keeps a GPU busy; the CPU's
 * cache-sized chunks (conv_col_size) made ~280 small launches a step. The
 * count depends on B only through the min, so a chunk for any batch up to
 * the one the scratch was sized for fits it. */
static size_t conv_per_sample(const struct window *w, int OC)
{
	return ((size_t)w->C * w->K * w->K + (size_t)OC) * (size_t)w->OH * w->OW;
}

static int conv_chunk_of(const struct gpu_ctx *g, const struct window *w, int OC, int B)
{
	size_t n = g->arena.cap / 8 / sizeof(float) / conv_per_sample(w, OC);
	return n < 1 ? 1 : n > (size_t)B ? B : (int)n;
}

static size_t g_conv_col_floats(void *ctx, const struct window *w, int OC, int B)
{
	const struct gpu_ctx *g = (const struct gpu_ctx *)ctx;
	return (size_t)conv_chunk_of(g, w, OC, B) * conv_per_sample(w, OC);
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
	int ckk = w->C * w->K * w->K, Bc = conv_chunk_of(g, w, OC, B);
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
	int ckk = w->C * w->K * w->K, Bc = conv_chunk_of(g, w, OC, B);
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
	.xent_train = g_xent_train,
	.gather = g_gather,
	.dense_act_forward = g_dense_act_forward,
	.act_bias_backward = g_act_bias_backward,
	.conv_col_floats = g_conv_col_floats,
	.reserve = g_reserve,
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
	cudaFree(g->blas_work);
	if (g->graph)
		cudaGraphExecDestroy(g->graph);
	if (g->copy)
		cudaStreamSynchronize(g->copy);
	arena_free(&g->arena);
	for (int i = 0; i < 2; i++) {
		cudaFreeHost(g->stage_hx[i]);
		cudaFreeHost(g->stage_hy[i]);
		cudaEvent_t ev[] = { g->mark[i], g->stage_loaded[i], g->stage_free[i] };
		for (size_t k = 0; k < sizeof(ev) / sizeof(ev[0]); k++)
			if (ev[k])
				cudaEventDestroy(ev[k]);
	}
	if (g->ready)
		cudaEventDestroy(g->ready);
	if (g->copied)
		cudaEventDestroy(g->copied);
	if (g->copy)
		cudaStreamDestroy(g->copy);
	if (g->stream)
		cudaStreamDestroy(g->stream);
	cudaGetLastError();
	free(g);
}

/* What cuBLAS recommends for Hopper (4 MiB would do before it). Given
 * explicitly so that a captured step never has cuBLAS allocate, and taken
 * from the margin below, not from the arena's cap. */
#define BLAS_WORK ((size_t)32 << 20)

static int ctx_open(struct gpu_ctx *g, int device, const struct gpu_options *o)
{
	size_t free_b = 0, total_b = 0;
	CK(g, cudaSetDevice(device));
	CK(g, cudaMemGetInfo(&free_b, &total_b));
	CK(g, cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
	int r = cublas_load(&g->api, g->err, sizeof(g->err));
	if (r)
		return r;
	CK(g, cudaStreamCreateWithFlags(&g->copy, cudaStreamNonBlocking));
	CK(g, cudaEventCreate(&g->mark[0]));
	CK(g, cudaEventCreate(&g->mark[1]));
	CK(g, cudaEventCreateWithFlags(&g->ready, cudaEventDisableTiming));
	CK(g, cudaEventCreateWithFlags(&g->copied, cudaEventDisableTiming));
	for (int i = 0; i < 2; i++) {
		CK(g, cudaEventCreateWithFlags(&g->stage_loaded[i], cudaEventDisableTiming));
		CK(g, cudaEventCreateWithFlags(&g->stage_free[i], cudaEventDisableTiming));
	}
	CKB(g, "cublasCreate", g->api.create(&g->blas));
	CKB(g, "cublasSetStream", g->api.set_stream(g->blas, g->stream));
	/* After SetStream, which puts the default workspace back. */
	CK(g, cudaMalloc(&g->blas_work, BLAS_WORK));
	CKB(g, "cublasSetWorkspace", g->api.set_workspace(g->blas, g->blas_work, BLAS_WORK));
	/* Plain fp32 unless TF32 is asked for: results then match the CPU to
	 * float32 rounding, which the tests rely on. */
	CKB(g, "cublasSetMathMode",
	    g->api.set_math_mode(g->blas, o->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
	/* The context and cuBLAS already hold some memory, so a fraction near 1
	 * can never be had in full: take at most what is free less a margin
	 * for cuBLAS's own (its kernels' modules; the workspace is taken). */
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

extern "C" size_t gpu_backend_room(const struct backend *b)
{
	if (!b || b->ops != &cuda_ops)
		return 0;
	return arena_room(&((const struct gpu_ctx *)b->ctx)->arena);
}

extern "C" int gpu_stage_reserve(const struct backend *b, int max_batch, size_t D)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r || (max_batch <= g->stage_rows && D == g->stage_D))
		return r;
	if (g->stage_rows) {
		snprintf(g->err, sizeof(g->err), "gpu:%d: staged batches were sized already", g->device);
		return -EINVAL;
	}
	size_t xb = (size_t)max_batch * D * sizeof(float), yb = (size_t)max_batch * sizeof(int32_t);
	for (int i = 0; i < 2; i++) {
		r = arena_alloc(&g->arena, (void **)&g->stage_dx[i], xb, g->err, sizeof(g->err));
		if (!r)
			r = arena_alloc(&g->arena, (void **)&g->stage_dy[i], yb, g->err, sizeof(g->err));
		if (r)
			return r;
		CK(g, cudaMallocHost((void **)&g->stage_hx[i], xb));
		CK(g, cudaMallocHost((void **)&g->stage_hy[i], yb));
	}
	g->stage_rows = max_batch;
	g->stage_D = D;
	return 0;
}

extern "C" int gpu_stage_batch(const struct backend *b, const float *data_x, const int32_t *data_y,
			       size_t D, const uint32_t *idx, int B, const float **x,
			       const int32_t **y)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r)
		return r;
	if (B < 1 || B > g->stage_rows || D != g->stage_D) {
		snprintf(g->err, sizeof(g->err), "gpu:%d: a staged batch of %d rows of %zu, buffers for %d of %zu",
			 g->device, B, D, g->stage_rows, g->stage_D);
		return -EINVAL;
	}
	int s = g->stage_next;
	/* The step two back read this buffer; wait until it has. An event
	 * never recorded counts as done. */
	CK(g, cudaEventSynchronize(g->stage_free[s]));
	for (int i = 0; i < B; i++) {
		memcpy(g->stage_hx[s] + (size_t)i * D, data_x + (size_t)idx[i] * D, D * sizeof(float));
		g->stage_hy[s][i] = data_y[idx[i]];
	}
	CK(g, cudaMemcpyAsync(g->stage_dx[s], g->stage_hx[s], (size_t)B * D * sizeof(float),
			      cudaMemcpyHostToDevice, g->copy));
	CK(g, cudaMemcpyAsync(g->stage_dy[s], g->stage_hy[s], (size_t)B * sizeof(int32_t),
			      cudaMemcpyHostToDevice, g->copy));
	CK(g, cudaEventRecord(g->stage_loaded[s], g->copy));
	CK(g, cudaStreamWaitEvent(g->stream, g->stage_loaded[s], 0));
	*x = g->stage_dx[s];
	*y = g->stage_dy[s];
	return 0;
}

extern "C" int gpu_stage_release(const struct backend *b)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r)
		return r;
	CK(g, cudaEventRecord(g->stage_free[g->stage_next], g->stream));
	g->stage_next ^= 1;
	return 0;
}

extern "C" int gpu_optim_step(const struct backend *b, const struct gk_optim *o, float *params,
			      float *grads, float *m, float *v, size_t n, int zero)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "optimizer kernel",
	    gk_optim_step(g->stream, o, g->capturing ? g->step : NULL, params, grads, m, v, n, zero));
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

/* Peer access from d's device to s's, tried once per pair: where the
 * hardware has none, cudaMemcpyPeerAsync stages through the host itself. */
static int peer_enable(struct gpu_ctx *d, const struct gpu_ctx *s)
{
	unsigned long long bit = s->device < 64 ? 1ull << s->device : 0;
	if (d->device == s->device || (d->peers & bit))
		return 0;
	int can = 0;
	CK(d, cudaDeviceCanAccessPeer(&can, d->device, s->device));
	if (can) {
		cudaError_t e = cudaDeviceEnablePeerAccess(s->device, 0);
		if (e == cudaErrorPeerAccessAlreadyEnabled)
			cudaGetLastError();
		else if (e != cudaSuccess)
			return cuda_fail(d, e, "cudaDeviceEnablePeerAccess");
	}
	d->peers |= bit;
	return 0;
}

extern "C" int gpu_copy(const struct backend *dst_b, void *dst, const struct backend *src_b,
			const void *src, size_t bytes)
{
	struct gpu_ctx *d = (struct gpu_ctx *)dst_b->ctx, *s = (struct gpu_ctx *)src_b->ctx;
	int r = use(s);
	if (r)
		return r;
	/* The copy waits on the device for the source's queued work (which
	 * wrote src), not on the host. */
	CK(s, cudaEventRecord(s->ready, s->stream));
	r = use(d);
	if (!r)
		r = peer_enable(d, s);
	if (r)
		return r;
	CK(d, cudaStreamWaitEvent(d->stream, s->ready, 0));
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

/* ---- a training step as a CUDA graph ----------------------------------- */

extern "C" int gpu_graph_begin(const struct backend *b)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (!r && !g->step)
		r = arena_alloc(&g->arena, (void **)&g->step, sizeof(struct gk_step), g->err,
				sizeof(g->err));
	if (r)
		return r;
	/* Thread-local: a call that may not be captured (a host wait, an
	 * allocation) fails here instead of in another thread's work. */
	CK(g, cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
	g->capturing = 1;
	return 0;
}

extern "C" int gpu_graph_end(const struct backend *b, int failed)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	cudaGraph_t graph = NULL;
	g->capturing = 0;
	/* Always ended, so the stream leaves capture mode even after a
	 * failure inside it. */
	cudaError_t e = cudaStreamEndCapture(g->stream, &graph);
	if (failed || e != cudaSuccess) {
		if (graph)
			cudaGraphDestroy(graph);
		cudaGetLastError();
		return failed ? failed : cuda_fail(g, e, "cudaStreamEndCapture");
	}
	e = cudaGraphInstantiate(&g->graph, graph, 0);
	cudaGraphDestroy(graph);   /* the executable graph keeps what it needs */
	if (e != cudaSuccess) {
		g->graph = NULL;
		return cuda_fail(g, e, "cudaGraphInstantiate");
	}
	return 0;
}

extern "C" int gpu_graph_launch(const struct backend *b, const struct gk_step *step)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "step values kernel", gk_step_set(g->stream, g->step, step));
	CK(g, cudaGraphLaunch(g->graph, g->stream));
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
