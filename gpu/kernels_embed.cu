/* CUDA twins of the embedding layer's kernels (core/nn/embed.c): the
 * unique-row gather, the pooled forward and the gradient's scatter-add,
 * and gpu.h's gpu_embed_* that queue them on a backend's stream.
 *
 * One thread per output value, each adding its terms in the order the CPU
 * twin does (a pooled vector: its segment's entries in list order; a row's
 * gradient: its entries in ascending entry order, from the plan's
 * transposed index), with __fadd_rn and __fdiv_rn so that nvcc fuses no
 * multiply-add and divides exactly: the sums are the CPU's bit for bit, and
 * no atomics make them depend on scheduling. The price is that a hot row's
 * gradient is one thread's loop over all its entries (a Zipf field's most
 * frequent ID may appear in most of a batch's samples); a fixed-order tree
 * over the entries would spread that and is left until a GPU run measures
 * it. Nothing here allocates or waits. */
extern "C" {
#include "../core/nn/backend.h"
#include "gpu.h"
}
#include "ctx.h"
#include "kernels.h"
#include "launch.h"

#include <cuda_runtime.h>

__global__ void embed_gather_kernel(float *U, const float *table, const uint64_t *rows, size_t n,
				    int DIM)
{
	GRID_STRIDE(i, n) {
		size_t k = i / (size_t)DIM, d = i - k * (size_t)DIM;
		U[i] = table[rows[k] * (uint64_t)DIM + d];
	}
}

__global__ void embed_forward_kernel(float *out, const float *x, const float *U, const uint32_t *off,
				     const uint32_t *idx, size_t n, int F, int D, int DIM, int pool)
{
	size_t ld = (size_t)F * DIM + (size_t)D, fd = (size_t)F * DIM;
	GRID_STRIDE(i, n) {
		size_t b = i / ld, col = i - b * ld;
		if (col >= fd) {
			out[i] = x[b * (size_t)D + (col - fd)];
			continue;
		}
		size_t f = col / (size_t)DIM, d = col - f * (size_t)DIM, s = b * (size_t)F + f;
		uint32_t lo = off[s], hi = off[s + 1];
		float sum = 0.0f;
		for (uint32_t k = lo; k < hi; k++)
			sum = __fadd_rn(sum, U[(size_t)idx[k] * DIM + d]);
		if (pool == 1 && hi - lo > 1)
			sum = __fdiv_rn(sum, (float)(hi - lo));
		out[i] = sum;
	}
}

__global__ void embed_backward_kernel(float *dU, const float *dout, const uint32_t *roff,
				      const uint32_t *rseg, const uint32_t *off, size_t n, int F, int D,
				      int DIM, int pool)
{
	size_t ld = (size_t)F * DIM + (size_t)D;
	GRID_STRIDE(i, n) {
		size_t k = i / (size_t)DIM, d = i - k * (size_t)DIM;
		float g = 0.0f;
		for (uint32_t j = roff[k]; j < roff[k + 1]; j++) {
			uint32_t s = rseg[j], b = s / (uint32_t)F, f = s - b * (uint32_t)F;
			uint32_t cnt = off[s + 1] - off[s];
			float v = dout[(size_t)b * ld + (size_t)f * DIM + d];
			g = __fadd_rn(g, pool == 1 && cnt > 1 ? __fdiv_rn(v, (float)cnt) : v);
		}
		dU[i] = g;
	}
}

extern "C" int gk_embed_gather(void *stream, float *U, const float *table, const uint64_t *rows,
			       size_t u, int DIM)
{
	size_t n = u * (size_t)DIM;
	if (!n)
		return 0;
	embed_gather_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(U, table, rows, n, DIM);
	return launched();
}

extern "C" int gk_embed_forward(void *stream, float *out, const float *x, const float *U,
				const uint32_t *off, const uint32_t *idx, int B, int F, int D, int DIM,
				int pool)
{
	size_t n = (size_t)B * ((size_t)F * DIM + (size_t)D);
	if (!n)
		return 0;
	embed_forward_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(out, x, U, off, idx, n, F,
										   D, DIM, pool);
	return launched();
}

extern "C" int gk_embed_backward(void *stream, float *dU, const float *dout, const uint32_t *roff,
				 const uint32_t *rseg, const uint32_t *off, size_t u, int F, int D,
				 int DIM, int pool)
{
	size_t n = u * (size_t)DIM;
	if (!n)
		return 0;
	embed_backward_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(dU, dout, roff, rseg, off,
										    n, F, D, DIM, pool);
	return launched();
}

/* ---- sigmoid cross-entropy (layers.h's sigmoid_xent_*) ------------------
 * One thread per row: the loss in double and the probability as the CPU
 * twin computes them (exp only of -|z|), so they agree to expf's and
 * log1p's last bits; the row sums go through gk_meter_add like softmax's. */
__global__ void sigmoid_xent_rows_kernel(float *out, double *row_loss, double *row_right,
					 const float *logits, const int32_t *labels, int B, int train,
					 float scale)
{
	GRID_STRIDE(i, (size_t)B) {
		float z = logits[i];   /* read before out is written: they may alias */
		int y = labels[i] != 0;
		double zd = (double)z;
		row_loss[i] = (zd > 0.0 ? zd : 0.0) - zd * y + log1p(exp(-fabs(zd)));
		row_right[i] = (z > 0.0f) == y ? 1.0 : 0.0;
		float p;
		if (z >= 0.0f) {
			p = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-z)));
		} else {
			float e = expf(z);
			p = __fdiv_rn(e, __fadd_rn(1.0f, e));
		}
		out[i] = train ? __fmul_rn(__fsub_rn(p, y ? 1.0f : 0.0f), scale) : p;
	}
}

__global__ void sigmoid_xent_backward_kernel(float *dlogits, const float *probs, const int32_t *labels,
					     int B, float scale)
{
	GRID_STRIDE(i, (size_t)B)
		dlogits[i] = __fmul_rn(__fsub_rn(probs[i], labels[i] != 0 ? 1.0f : 0.0f), scale);
}

extern "C" int gk_sigmoid_xent_rows(void *stream, float *out, double *row_loss, double *row_right,
				    const float *logits, const int32_t *labels, int B, int train,
				    float scale)
{
	if (B <= 0)
		return 0;
	sigmoid_xent_rows_kernel<<<blocks_for((size_t)B), THREADS, 0, (cudaStream_t)stream>>>(
		out, row_loss, row_right, logits, labels, B, train, scale);
	return launched();
}

extern "C" int gk_sigmoid_xent_backward(void *stream, float *dlogits, const float *probs,
					const int32_t *labels, int B, float scale)
{
	if (B <= 0)
		return 0;
	sigmoid_xent_backward_kernel<<<blocks_for((size_t)B), THREADS, 0, (cudaStream_t)stream>>>(
		dlogits, probs, labels, B, scale);
	return launched();
}

extern "C" int gpu_embed_gather(const struct backend *b, float *U, const float *table,
				const uint64_t *rows, size_t u, int DIM)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "embedding gather kernel", gk_embed_gather(g->stream, U, table, rows, u, DIM));
	return 0;
}
