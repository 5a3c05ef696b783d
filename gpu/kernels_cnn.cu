/* CUDA twins of the convolutional-network layers of the CPU backend:
 * im2col/col2im and the layout moves around conv's GEMMs (core/nn/conv.c),
 * pooling (core/nn/pool.c) and dropout (core/nn/layers.c); batchnorm is in
 * gpu/kernels_bn.cu. Semantics follow the CPU code exactly (first maximum
 * in max pooling, the same dropout hash); only summation order differs.
 *
 * Backward kernels that SET their input gradient are written as gathers
 * (one thread per input element sums what reaches it), so they need no
 * clearing pass and no atomics, and overlapping windows add up. */
extern "C" {
#include "../core/nn/layers.h"
}
#include "chansum.cuh"
#include "kernels.h"
#include "launch.h"

#include <cuda_runtime.h>


/* ---- convolution's data movement ---------------------------------------- */

/* Index math in I (GRID_STRIDE_T): one division and a multiply-subtract
 * per split of an index, where the first version took two or three 64-bit
 * divisions per coordinate. */
template <typename I>
__global__ void im2col_kernel(float *col, I ld, const float *inp, int nb, struct window w)
{
	I ohw = (I)w.OH * w.OW, cols = (I)nb * ohw, kk = (I)w.K * w.K;
	I n = (I)w.C * kk * cols;
	GRID_STRIDE_T(I, idx, n) {
		I r = idx / cols, j = idx - r * cols;
		I c = r / kk, rk = r - c * kk;
		I b = j / ohw, q = j - b * ohw;
		int kh = (int)(rk / w.K), kw = (int)rk - kh * w.K;
		int oh = (int)(q / w.OW), ow = (int)q - oh * w.OW;
		int h = oh * w.S - w.P + kh, x = ow * w.S - w.P + kw;
		float v = 0.0f;
		if (h >= 0 && h < w.H && x >= 0 && x < w.W)
			v = inp[((b * w.C + c) * w.H + (I)h) * w.W + (I)x];
		col[r * ld + j] = v;
	}
}

template <typename I>
__global__ void col2im_kernel(float *dinp, const float *col, I ld, int nb, struct window w)
{
	I ohw = (I)w.OH * w.OW;
	I n = (I)nb * w.C * w.H * w.W;
	GRID_STRIDE_T(I, idx, n) {
		I row = idx / w.W, plane = row / w.H, b = plane / w.C;
		int x = (int)(idx - row * w.W), h = (int)(row - plane * w.H), c = (int)(plane - b * w.C);
		float s = 0.0f;
		for (int kh = 0; kh < w.K; kh++) {
			int hh = h + w.P - kh;
			if (hh < 0 || hh % w.S || hh / w.S >= w.OH)
				continue;
			for (int kw = 0; kw < w.K; kw++) {
				int xx = x + w.P - kw;
				if (xx < 0 || xx % w.S || xx / w.S >= w.OW)
					continue;
				I r = ((I)c * w.K + kh) * w.K + kw;
				s += col[r * ld + b * ohw + (I)(hh / w.S) * w.OW + (I)(xx / w.S)];
			}
		}
		dinp[idx] = s;
	}
}

extern "C" int gk_im2col(void *stream, float *col, size_t ld, const float *inp, int nb,
			 const struct window *w)
{
	size_t rows = (size_t)w->C * w->K * w->K;
	size_t n = rows * nb * w->OH * w->OW;
	int fits = FITS32(rows * ld) && FITS32(n) && FITS32((size_t)nb * w->C * w->H * w->W);
	LAUNCH_I(fits, im2col_kernel, blocks_for(n), THREADS, stream, col, ld, inp, nb, *w);
	return launched();
}

extern "C" int gk_col2im(void *stream, float *dinp, const float *col, size_t ld, int nb,
			 const struct window *w)
{
	size_t n = (size_t)nb * w->C * w->H * w->W;
	int fits = FITS32((size_t)w->C * w->K * w->K * ld) && FITS32(n);
	LAUNCH_I(fits, col2im_kernel, blocks_for(n), THREADS, stream, dinp, col, ld, nb, *w);
	return launched();
}

/* out (nb, OC, ohw) = tmp (OC, ld) + bias: one thread an output, reading
 * tmp along its rows, so both sides are read and written in runs of ohw. */
template <typename I>
__global__ void conv_scatter_kernel(float *out, const float *tmp, I ld, const float *bias, int OC,
				    I ohw, I n)
{
	GRID_STRIDE_T(I, idx, n) {
		I row = idx / ohw, b = row / (I)OC;
		I i = idx - row * ohw;
		int o = (int)(row - b * (I)OC);
		out[idx] = tmp[(I)o * ld + b * ohw + i] + (bias ? bias[o] : 0.0f);
	}
}

/* tmp (OC, ld) columns [0, nb*ohw) = dout (nb, OC, ohw) per channel, and
 * with dbias, dbias[o] += the channel's sum, in the same pass: grid (OC,
 * split), each block a share of channel o's nb*ohw values (CHAN_LOOP), its
 * sum in double met with the others' by the last block (chan_last), where
 * one block a channel summed tmp again after the gather. */
template <typename I>
__global__ void conv_gather_kernel(float *tmp, I ld, float *dbias, const float *dout, int OC,
				   I ohw, I n, double *partial, unsigned *tickets)
{
	int o = blockIdx.x;
	float *t = tmp + (I)o * ld;
	const float *src = dout + (I)o * ohw;
	I stride = (I)OC * ohw;
	double s = 0.0, unused = 0.0;
	CHAN_LOOP(I, j, n) {
		I b = j / ohw;
		float v = src[b * stride + (j - b * ohw)];
		t[j] = v;
		s += v;
	}
	if (!dbias)   /* the same for every thread of the grid */
		return;
	block_sum2(s, unused);
	if (chan_last(s, unused, partial, tickets) && threadIdx.x == 0)
		dbias[o] += (float)s;
}

extern "C" int gk_conv_scatter(void *stream, float *out, const float *tmp, size_t ld,
			       const float *bias, int nb, int OC, size_t ohw)
{
	size_t n = (size_t)nb * OC * ohw;
	int fits = FITS32(n) && FITS32((size_t)OC * ld);
	LAUNCH_I(fits, conv_scatter_kernel, blocks_for(n), THREADS, stream, out, tmp, ld, bias, OC, ohw,
		 n);
	return launched();
}

extern "C" int gk_conv_gather(void *stream, float *tmp, size_t ld, float *dbias, const float *dout,
			      int nb, int OC, size_t ohw, const struct gk_bn_scratch *s)
{
	if (OC <= 0 || nb <= 0)
		return 0;
	size_t n = (size_t)nb * ohw;
	int fits = FITS32(n * OC) && FITS32((size_t)OC * ld);
	dim3 grid((unsigned)OC, chan_split(OC, n, s));
	LAUNCH_I(fits, conv_gather_kernel, grid, THREADS, stream, tmp, ld, dbias, dout, OC, ohw, n,
		 s ? s->partial : NULL, s ? s->tickets : NULL);
	return launched();
}

/* ---- pooling -------------------------------------------------------------- */

template <typename I>
__global__ void pool_forward_kernel(int max, float *out, const float *inp, I planes,
				    struct window w)
{
	I n = planes * w.OH * w.OW, hw = (I)w.H * w.W;
	float inv = 1.0f / (float)(w.K * w.K);
	GRID_STRIDE_T(I, idx, n) {
		I row = idx / w.OW, p = row / w.OH;
		int ow = (int)(idx - row * w.OW), oh = (int)(row - p * w.OH);
		const float *x0 = inp + p * hw + (I)oh * w.S * w.W + (I)ow * w.S;
		float m = x0[0], s = 0.0f;
		for (int kh = 0; kh < w.K; kh++)
			for (int kw = 0; kw < w.K; kw++) {
				float v = x0[(I)kh * w.W + kw];
				if (v > m)
					m = v;
				s += v;
			}
		out[idx] = max ? m : s * inv;
	}
}

template <typename I>
__global__ void pool_backward_kernel(int max, float *dinp, const float *dout, const float *inp,
				     I planes, struct window w)
{
	I hw = (I)w.H * w.W, n = planes * hw;
	float inv = 1.0f / (float)(w.K * w.K);
	GRID_STRIDE_T(I, idx, n) {
		I row = idx / w.W, p = row / w.H;
		int x = (int)(idx - row * w.W), h = (int)(row - p * w.H);
		const float *xp = inp ? inp + p * hw : NULL;
		const float *dy = dout + p * w.OH * w.OW;
		/* The windows that contain (h, x): oh*S <= h < oh*S + K. */
		int oh0 = h - w.K + 1 <= 0 ? 0 : (h - w.K + w.S) / w.S;
		int ow0 = x - w.K + 1 <= 0 ? 0 : (x - w.K + w.S) / w.S;
		int oh1 = h / w.S < w.OH - 1 ? h / w.S : w.OH - 1;
		int ow1 = x / w.S < w.OW - 1 ? x / w.S : w.OW - 1;
		float s = 0.0f;
		for (int oh = oh0; oh <= oh1; oh++)
			for (int ow = ow0; ow <= ow1; ow++) {
				float g = dy[(I)oh * w.OW + ow];
				if (!max) {
					s += g * inv;
					continue;
				}
				/* The same scan as forward: the first maximum wins. */
				I at = (I)oh * w.S * w.W + (I)ow * w.S, best = at;
				for (int kh = 0; kh < w.K; kh++)
					for (int kw = 0; kw < w.K; kw++)
						if (xp[at + (I)kh * w.W + kw] > xp[best])
							best = at + (I)kh * w.W + kw;
				if (best == (I)h * w.W + x)
					s += g;
			}
		dinp[idx] = s;
	}
}

extern "C" int gk_pool_forward(void *stream, int max, float *out, const float *inp, int B,
			       const struct window *w)
{
	size_t planes = (size_t)B * w->C, n = planes * w->OH * w->OW;
	int fits = FITS32(planes * w->H * w->W) && FITS32(n);
	LAUNCH_I(fits, pool_forward_kernel, blocks_for(n), THREADS, stream, max, out, inp, planes, *w);
	return launched();
}

extern "C" int gk_pool_backward(void *stream, int max, float *dinp, const float *dout,
				const float *inp, int B, const struct window *w)
{
	size_t planes = (size_t)B * w->C, n = planes * w->H * w->W;
	int fits = FITS32(n);
	LAUNCH_I(fits, pool_backward_kernel, blocks_for(n), THREADS, stream, max, dinp, dout,
		 max ? inp : NULL, planes, *w);
	return launched();
}

/* ---- dropout ---------------------------------------------------------------- */

/* core/nn/rng.c's rng_hash, bit for bit: the masks must be the CPU's. */
__device__ static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

__device__ static uint64_t rng_hash_dev(uint64_t seed, uint64_t stream, uint64_t index)
{
	uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ULL);
	h = mix64(h ^ (stream * 0xd1b54a32d192ed03ULL));
	return mix64(h ^ (index + 0x632be59bd9b4e019ULL));
}

#define RNG_DROPOUT_STREAM 5   /* enum rng_stream's RNG_DROPOUT; a test checks the masks */

/* The layer's key from the step's (dropout_layer_key), per thread: three
 * multiplies and shifts, less than one load of the step's key costs. */
__global__ void dropout_kernel(float *out, const float *inp, uint32_t thr, float scale,
			       uint64_t key, int layer, const struct gk_step *step, size_t n)
{
	uint64_t lk = rng_hash_dev(step ? step->key : key, RNG_DROPOUT_STREAM, (uint64_t)layer);
	GRID_STRIDE(i, n) {
		uint32_t u = (uint32_t)(rng_hash_dev(lk, RNG_DROPOUT_STREAM, i) >> 32);
		out[i] = u >= thr ? inp[i] * scale : 0.0f;
	}
}

__global__ void copy_kernel(float *out, const float *inp, size_t n)
{
	GRID_STRIDE(i, n)
		out[i] = inp[i];
}

extern "C" int gk_dropout(void *stream, float *out, const float *inp, float p, uint64_t key,
			  int layer, const struct gk_step *step, size_t n)
{
	if (n == 0)
		return 0;
	if (p == 0.0f) {   // evaluation: identity, as on the CPU
		if (out != inp)
			copy_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(out, inp, n);
		return launched();
	}
	/* dropout_threshold() of core/nn/layers.c */
	double t = (double)p * 4294967296.0;
	uint32_t thr = t >= 4294967295.0 ? 0xffffffffu : (uint32_t)t;
	dropout_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(
		out, inp, thr, 1.0f / (1.0f - p), key, layer, step, n);
	return launched();
}
