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
#include "../core/nn/backend.h"
#include "../core/nn/layers.h"
#include "gpu.h"
}

#include "ctx.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
static int act_of(enum layer_kind k, enum gk_act *a)
{
	switch (k) {
	case LAYER_RELU: *a = GK_RELU; return 0;
	case LAYER_TANH: *a = GK_TANH; return 0;
	case LAYER_SIGMOID: *a = GK_SIGMOID; return 0;
	default: return -EINVAL;
	}
}

/* use(g), then the kernel's name for activation k, or the reason there is
 * none in g->err. */
static int use_act(struct gpu_ctx *g, enum layer_kind k, enum gk_act *a)
{
	int r = use(g);
	if (!r && (r = act_of(k, a)) < 0)
		snprintf(g->err, sizeof(g->err), "gpu:%d: no activation kernel for %s", g->device,
			 layer_kind_name(k));
	return r;
}

/* out = a(inp W^T + bias): the GEMM, then bias and activation in one pass
 * over its output (GK_NONE: the bias alone). */
static int dense_out(struct gpu_ctx *g, enum gk_act a, float *out, const float *inp,
		     const float *weight, const float *bias, int B, int C, int OC)
{
	float one = 1.0f, zero = 0.0f;
	CKB(g, "cublasSgemm (forward)",
	    g->api.sgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, B, C, &one, weight, C, inp, C, &zero,
			 out, OC));
	CKL(g, "bias and activation kernel", gk_bias_act(g->stream, a, out, bias, B, OC));
	return 0;
}

static int g_dense_forward(void *ctx, float *out, const float *inp, const float *weight,
			   const float *bias, int B, int C, int OC)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	return r ? r : dense_out(g, GK_NONE, out, inp, weight, bias, B, C, OC);
}

static int g_dense_act_forward(void *ctx, float *out, const float *inp, const float *weight,
			       const float *bias, int B, int C, int OC, enum layer_kind act)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	enum gk_act a;
	int r = use_act(g, act, &a);
	return r ? r : dense_out(g, a, out, inp, weight, bias, B, C, OC);
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

static int g_act_forward(void *ctx, enum layer_kind k, float *out, const float *inp, size_t N)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	enum gk_act a;
	int r = use_act(g, k, &a);
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
	int r = use_act(g, k, &a);
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
	int r = k == LAYER_DENSE ? use(g) : use_act(g, k, &a);
	if (r)
		return r;
	CKL(g, "activation and bias gradient kernel",
	    gk_act_bias_backward(g->stream, a, dout, dbias, out, B, OC, partial_for(g, B, OC),
				 g->tickets));
	return 0;
}

/* Batchnorm's split sums' scratch, of a fixed size (1.25 MiB), once. */
static int bn_reserve(struct gpu_ctx *g)
{
	if (g->bn.partial)
		return 0;
	double *partial;
	unsigned *tickets;
	int r = arena_alloc(&g->arena, (void **)&partial, gk_bn_partials() * sizeof(double), g->err,
			    sizeof(g->err));
	if (!r)
		r = arena_alloc(&g->arena, (void **)&tickets, GK_BN_SLOTS * sizeof(unsigned), g->err,
				sizeof(g->err));
	if (r)
		return r;
	CK(g, cudaMemsetAsync(tickets, 0, GK_BN_SLOTS * sizeof(unsigned), g->stream));
	g->bn.partial = partial;
	g->bn.tickets = tickets;
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
	float *bn_sums;
	if (!r)
		r = arena_alloc(&g->arena, (void **)&bn_sums, 2 * (size_t)w * sizeof(float), g->err,
				sizeof(g->err));
	if (!r)
		r = bn_reserve(g);
	if (r)
		return r;
	/* The tickets start at zero and every launch leaves them there. */
	CK(g, cudaMemsetAsync(tickets, 0, gk_bias_tickets(w) * sizeof(unsigned), g->stream));
	g->bn.sums = bn_sums;
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

/* The loss rows into out (train: their gradient with scale, else the
 * probabilities), then their sums added to meter. */
static int xent(struct gpu_ctx *g, float *out, double *meter, const float *logits,
		const int32_t *labels, int B, int C, int train, float scale)
{
	int r = use(g);
	if (!r)
		r = rows_check(g, B);
	if (r)
		return r;
	CKL(g, "softmax cross-entropy kernel",
	    gk_xent_rows(g->stream, out, g->row_loss, g->row_right, logits, labels, B, C, train, scale));
	CKL(g, "loss sum kernel", gk_meter_add(g->stream, meter, g->row_loss, g->row_right, B));
	return 0;
}

static int g_xent_forward(void *ctx, float *probs, double *meter, const float *logits,
			  const int32_t *labels, int B, int C)
{
	return xent((struct gpu_ctx *)ctx, probs, meter, logits, labels, B, C, 0, 0.0f);
}

static int g_xent_train(void *ctx, float *dlogits, double *meter, const float *logits,
			const int32_t *labels, int B, int C, float scale)
{
	return xent((struct gpu_ctx *)ctx, dlogits, meter, logits, labels, B, C, 1, scale);
}

/* loss = sigmoid_cross_entropy: as xent with one logit a row. */
static int sigmoid_xent(struct gpu_ctx *g, float *out, double *meter, const float *logits,
			const int32_t *labels, int B, int train, float scale)
{
	int r = use(g);
	if (!r)
		r = rows_check(g, B);
	if (r)
		return r;
	CKL(g, "sigmoid cross-entropy kernel",
	    gk_sigmoid_xent_rows(g->stream, out, g->row_loss, g->row_right, logits, labels, B, train, scale));
	CKL(g, "loss sum kernel", gk_meter_add(g->stream, meter, g->row_loss, g->row_right, B));
	return 0;
}

static int g_sigmoid_xent_forward(void *ctx, float *probs, double *meter, const float *logits,
				  const int32_t *labels, int B)
{
	return sigmoid_xent((struct gpu_ctx *)ctx, probs, meter, logits, labels, B, 0, 0.0f);
}

static int g_sigmoid_xent_train(void *ctx, float *dlogits, double *meter, const float *logits,
				const int32_t *labels, int B, float scale)
{
	return sigmoid_xent((struct gpu_ctx *)ctx, dlogits, meter, logits, labels, B, 1, scale);
}

static int g_sigmoid_xent_backward(void *ctx, float *dlogits, const float *probs,
				   const int32_t *labels, int B, float scale)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "sigmoid cross-entropy backward kernel",
	    gk_sigmoid_xent_backward(g->stream, dlogits, probs, labels, B, scale));
	return 0;
}

/* The embedding layer on the batch's rows; no embed_gather: the tables
 * live in host memory, and the replica uploads the rows it gathered there
 * (core/nn/replica_embed.c). */
static int g_embed_forward(void *ctx, float *out, const float *x, const float *U, const uint32_t *off,
			   const uint32_t *idx, int B, int F, int D, int DIM, enum embed_pool pool)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "embedding forward kernel", gk_embed_forward(g->stream, out, x, U, off, idx, B, F, D, DIM, (int)pool));
	return 0;
}

static int g_embed_backward(void *ctx, float *dU, const float *dout, const uint32_t *roff,
			    const uint32_t *rseg, const uint32_t *off, size_t u, int F, int D, int DIM,
			    enum embed_pool pool)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "embedding backward kernel",
	    gk_embed_backward(g->stream, dU, dout, roff, rseg, off, u, F, D, DIM, (int)pool));
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

/* A layer keeps its forward columns when one GEMM takes the whole batch
 * (so every batch up to B is one chunk, whose columns backward needs
 * whole) and they take at most a quarter of what the arena can still
 * hand out when the replica is made: the example CNN at batch 256 keeps
 * 20 MB and 160 MB, and backward skips an im2col a layer. Decided here,
 * once; a step never allocates or asks again. */
static size_t g_conv_keep_floats(void *ctx, const struct window *w, int OC, int B)
{
	const struct gpu_ctx *g = (const struct gpu_ctx *)ctx;
	size_t n = (size_t)w->C * w->K * w->K * (size_t)B * w->OH * w->OW;
	if (conv_chunk_of(g, w, OC, B) < B || n * sizeof(float) > arena_room(&g->arena) / 4)
		return 0;
	return n;
}

/* Per chunk of nb samples (core/nn/conv.c has the layout):
 *   col (ckk, ld) = im2col; tmp (OC, ld) = weight (OC, ckk) col, i.e. in
 *   cuBLAS's column-major terms tmp^T (ld, OC) = col^T (ld, ckk) weight^T. */
/* keep (conv_keep_floats): the whole batch is one chunk, its columns go
 * there and the GEMM's output to col. */
static int g_conv_forward(void *ctx, float *out, float *col, float *keep, const float *inp,
			  const float *weight, const float *bias, int B, int OC, const struct window *w)
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
		float *cols = keep && nb == B ? keep : col;
		float *tmp = cols == keep ? col : col + (size_t)ckk * ld;
		CKL(g, "im2col kernel", gk_im2col(g->stream, cols, ld, inp + (size_t)b0 * in_n, nb, w));
		CKB(g, "cublasSgemm (conv forward)",
		    g->api.sgemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)ld, OC, ckk, &one, cols, (int)ld,
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
			   const float *keep, const float *dout, const float *inp,
			   const float *weight, int B, int OC, const struct window *w)
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
		CKL(g, "conv gather and bias gradient kernel",
		    gk_conv_gather(g->stream, tmp, ld, dbias, dout + (size_t)b0 * OC * ohw, nb, OC, ohw,
				   &g->bn));
		/* forward's columns where it kept them (the whole batch) */
		const float *cols = keep && nb == B ? keep : col;
		if (cols == col)
			CKL(g, "im2col kernel",
			    gk_im2col(g->stream, col, ld, inp + (size_t)b0 * in_n, nb, w));
		CKB(g, "cublasSgemm (conv weight gradient)",
		    g->api.sgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, ckk, OC, (int)ld, &one, cols, (int)ld,
				 tmp, (int)ld, &one, dweight, ckk));
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

/* Forward and backward are the same mask applied to different vectors.
 * While a step is captured the kernel reads the step's key from *step
 * (gpu_graph_launch writes it before each replay), as the gather reads
 * the batch's position: a key passed here would be frozen in the graph. */
static int g_dropout(void *ctx, float *out, const float *inp, float p, uint64_t key, int layer,
		     size_t N)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "dropout kernel",
	    gk_dropout(g->stream, out, inp, p, key, layer, g->capturing ? g->step : NULL, N));
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
				 HW, &g->bn));
	return 0;
}

/* use(g), and where an input gradient is asked for, the channel sums'
 * scratch it reads: 2 x width floats (g_reserve), so a layer's channels
 * must fit its width. */
static int bn_use(struct gpu_ctx *g, const float *dinp, int C)
{
	int r = use(g);
	if (r || !dinp || (g->bn.sums && C <= g->width))
		return r;
	snprintf(g->err, sizeof(g->err), "gpu:%d: batchnorm over %d channels but scratch was reserved for %d",
		 g->device, C, g->bn.sums ? g->width : 0);
	return -EINVAL;
}

static int g_batchnorm_backward(void *ctx, float *dinp, float *dgamma, float *dbeta,
				float *drun_mean, float *drun_var, const float *dout,
				const float *inp, const float *gamma, const float *mean,
				const float *var, const float *run_mean, const float *run_var,
				float stat_scale, int B, int C, int HW)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = bn_use(g, dinp, C);
	if (r)
		return r;
	CKL(g, "batchnorm backward kernel",
	    gk_batchnorm_backward(g->stream, dinp, dgamma, dbeta, drun_mean, drun_var, dout, inp,
				  gamma, mean, var, run_mean, run_var, stat_scale, B, C, HW, &g->bn));
	return 0;
}

/* Batchnorm + relu (+ pooling), fused: gk_bn_relu_*; the input
 * gradient needs the channel sums' scratch as batchnorm's does. */
static int g_bn_relu_forward(void *ctx, float *act, float *out, float *mean, float *var,
			     const float *inp, const float *gamma, const float *beta,
			     const float *run_mean, const float *run_var, int B, int C, int HW,
			     enum layer_kind pool, const struct window *w)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "batchnorm, relu and pooling forward kernel",
	    gk_bn_relu_forward(g->stream, act, out, mean, var, inp, gamma, beta, run_mean, run_var, B,
			       C, HW, w, pool == LAYER_MAXPOOL, &g->bn));
	return 0;
}

static int g_bn_relu_backward(void *ctx, float *dinp, float *gbuf, float *dgamma, float *dbeta,
			      float *drun_mean, float *drun_var, const float *dout, const float *act,
			      const float *inp, const float *gamma, const float *mean,
			      const float *var, const float *run_mean, const float *run_var,
			      float stat_scale, int B, int C, int HW, enum layer_kind pool,
			      const struct window *w)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = bn_use(g, dinp, C);
	if (r)
		return r;
	CKL(g, "batchnorm, relu and pooling backward kernel",
	    gk_bn_relu_backward(g->stream, dinp, gbuf, dgamma, dbeta, drun_mean, drun_var, dout, act,
				inp, gamma, mean, var, run_mean, run_var, stat_scale, B, C, HW, w,
				pool == LAYER_MAXPOOL, &g->bn));
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
	.sigmoid_xent_forward = g_sigmoid_xent_forward,
	.sigmoid_xent_backward = g_sigmoid_xent_backward,
	.sigmoid_xent_train = g_sigmoid_xent_train,
	.embed_forward = g_embed_forward,
	.embed_backward = g_embed_backward,
	.gather = g_gather,
	.dense_act_forward = g_dense_act_forward,
	.act_bias_backward = g_act_bias_backward,
	.bn_relu_forward = g_bn_relu_forward,
	.bn_relu_backward = g_bn_relu_backward,
	.conv_col_floats = g_conv_col_floats,
	.conv_keep_floats = g_conv_keep_floats,
	.reserve = g_reserve,
	.copy_reserve = gq_reserve,
	.copy_after = gq_after,
	.copy_down = gq_down,
	.copy_wait = gq_wait,
	.copy_check = gq_check,
	.copy_found = gq_found,
	.copy_up = gq_up,
	.copy_join = gq_join,
	.host_alloc = gq_host_alloc,
	.host_free = gq_host_free,
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
	gq_free(g);
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
	/* The copy stream's only kernel is the gradient's check (copy_check),
	 * which a range's copy down waits for: the highest priority lets its
	 * blocks start before the next layers' queued ones, not after them. */
	int least = 0, greatest = 0;
	CK(g, cudaDeviceGetStreamPriorityRange(&least, &greatest));
	CK(g, cudaStreamCreateWithPriority(&g->copy, cudaStreamNonBlocking, greatest));
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

extern "C" int gpu_backend_device(const struct backend *b)
{
	return b && b->ops == &cuda_ops ? ((const struct gpu_ctx *)b->ctx)->device : -1;
}
