/* CUDA twins of the convolutional-network layers of the CPU backend:
 * im2col/col2im and the layout moves around conv's GEMMs (core/conv.c),
 * pooling (core/pool.c), dropout (core/layers.c) and batch normalization
 * (core/batchnorm.c). Semantics follow the CPU code exactly (first maximum
 * in max pooling, sums in double in batchnorm, the same dropout hash);
 * only summation order differs.
 *
 * Backward kernels that SET their input gradient are written as gathers
 * (one thread per input element sums what reaches it), so they need no
 * clearing pass and no atomics, and overlapping windows add up. */
extern "C" {
#include "../core/layers.h"
}
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

__global__ void conv_scatter_kernel(float *out, const float *tmp, size_t ld, const float *bias,
				    int nb, int OC, size_t ohw)
{
	size_t n = (size_t)nb * OC * ohw;
	GRID_STRIDE(idx, n) {
		size_t i = idx % ohw;
		int o = (int)(idx / ohw % OC), b = (int)(idx / ohw / OC);
		out[idx] = tmp[(size_t)o * ld + (size_t)b * ohw + i] + (bias ? bias[o] : 0.0f);
	}
}

__global__ void conv_gather_kernel(float *tmp, size_t ld, const float *dout, int nb, int OC,
				   size_t ohw)
{
	size_t n = (size_t)nb * OC * ohw;
	GRID_STRIDE(idx, n) {
		size_t i = idx % ohw;
		int o = (int)(idx / ohw % OC), b = (int)(idx / ohw / OC);
		tmp[(size_t)o * ld + (size_t)b * ohw + i] = dout[idx];
	}
}

extern "C" int gk_conv_scatter(void *stream, float *out, const float *tmp, size_t ld,
			       const float *bias, int nb, int OC, size_t ohw)
{
	size_t n = (size_t)nb * OC * ohw;
	conv_scatter_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(out, tmp, ld, bias,
										nb, OC, ohw);
	return launched();
}

extern "C" int gk_conv_gather(void *stream, float *tmp, size_t ld, const float *dout, int nb,
			      int OC, size_t ohw)
{
	size_t n = (size_t)nb * OC * ohw;
	conv_gather_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(tmp, ld, dout, nb,
									       OC, ohw);
	return launched();
}

/* One block per row; partial sums in double, then a tree in shared memory. */
__global__ void row_sums_add_kernel(float *dst, const float *src, size_t ld)
{
	__shared__ double part[THREADS];
	const float *row = src + (size_t)blockIdx.x * ld;
	double s = 0.0;
	for (size_t i = threadIdx.x; i < ld; i += blockDim.x)
		s += row[i];
	part[threadIdx.x] = s;
	__syncthreads();
	for (int k = blockDim.x / 2; k > 0; k >>= 1) {
		if ((int)threadIdx.x < k)
			part[threadIdx.x] += part[threadIdx.x + k];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		dst[blockIdx.x] += (float)part[0];
}

extern "C" int gk_row_sums_add(void *stream, float *dbias, const float *tmp, size_t ld, int OC)
{
	if (OC <= 0)
		return 0;
	row_sums_add_kernel<<<(unsigned)OC, THREADS, 0, (cudaStream_t)stream>>>(dbias, tmp, ld);
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

/* core/rng.c's rng_hash, bit for bit: the masks must be the CPU's. */
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
	/* dropout_threshold() of core/layers.c */
	double t = (double)p * 4294967296.0;
	uint32_t thr = t >= 4294967295.0 ? 0xffffffffu : (uint32_t)t;
	dropout_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(
		out, inp, thr, 1.0f / (1.0f - p), key, layer, step, n);
	return launched();
}

/* ---- batch normalization ---------------------------------------------------- */

/* The per-channel sums (forward: of x - k and its square; backward: of dy
 * and dy * xhat) run over a grid of C x split blocks: blockIdx.x is the
 * channel, blockIdx.y its part, so a channel's B*HW values are shared by
 * up to BN_MAX_SPLIT blocks of about BN_PER_BLOCK values each instead of
 * one block per channel (32-64 blocks on 132 SMs for the example CNN).
 * Each block's two sums are made in double by warp shuffles in a fixed
 * order; the blocks' sums meet in scratch and the last block of the
 * channel to finish (a ticket, as the bias gradient's) adds them in block
 * order: one pass over the data, the same bits every run. The elementwise
 * parts (y = a x + d, the input gradient) are kernels of their own over
 * all B*C*HW values. */
#define BN_PER_BLOCK 2048
#define BN_MAX_SPLIT 256

/* The block's sums of a and b, in thread 0's. */
__device__ static void block_sum2(double &a, double &b)
{
	__shared__ double sa[THREADS / 32], sb[THREADS / 32];
	for (int o = 16; o > 0; o >>= 1) {
		a += __shfl_down_sync(0xffffffffu, a, o);
		b += __shfl_down_sync(0xffffffffu, b, o);
	}
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	if (lane == 0) {
		sa[warp] = a;
		sb[warp] = b;
	}
	__syncthreads();
	if (warp == 0) {
		int nw = (int)(blockDim.x >> 5);
		a = lane < nw ? sa[lane] : 0.0;
		b = lane < nw ? sb[lane] : 0.0;
		for (int o = 16; o > 0; o >>= 1) {
			a += __shfl_down_sync(0xffffffffu, a, o);
			b += __shfl_down_sync(0xffffffffu, b, o);
		}
	}
}

/* After block_sum2: whether this block holds its channel's whole sums in
 * thread 0's a and b (it is the channel's only block, or the last of them
 * to finish, which then adds every block's sums in block order and leaves
 * the ticket at zero). */
__device__ static bool bn_last(double &a, double &b, double *partial, unsigned *tickets)
{
	__shared__ bool last;
	unsigned split = gridDim.y, c = blockIdx.x;
	if (split == 1)
		return true;
	if (threadIdx.x == 0) {
		size_t slot = (size_t)c * split + blockIdx.y;
		partial[2 * slot] = a;
		partial[2 * slot + 1] = b;
		__threadfence();
		last = atomicAdd(&tickets[c], 1u) == split - 1;
	}
	__syncthreads();
	if (!last)
		return false;
	if (threadIdx.x == 0) {
		const double *p = partial + 2 * (size_t)c * split;
		a = b = 0.0;
		for (unsigned j = 0; j < split; j++) {
			a += __ldcg(&p[2 * j]);   // past L1: written by other SMs
			b += __ldcg(&p[2 * j + 1]);
		}
		tickets[c] = 0;
	}
	return true;
}

/* Element j of channel c over (B, HW): plane b = j / HW, offset j % HW. */
#define BN_LOOP(I, j, n) \
	for (I j = blockIdx.y * (I)blockDim.x + threadIdx.x; j < (n); j += (I)gridDim.y * blockDim.x)

/* mean and var of channel c in one pass: the sums of d = x - k and d^2,
 * with k a value of the channel, so that E[d^2] - E[d]^2 does not cancel
 * the way E[x^2] - E[x]^2 would for a channel far from zero; in double,
 * this agrees with the CPU's two passes to float rounding. */
template <typename I>
__global__ void bn_stats_kernel(float *mean, float *var, const float *inp, int C, I HW, I n,
				double *partial, unsigned *tickets)
{
	int c = blockIdx.x;
	I stride = (I)C * HW;
	const float *x = inp + (I)c * HW;
	double k = (double)x[0], s = 0.0, q = 0.0;
	BN_LOOP(I, j, n) {
		I b = j / HW;
		double d = (double)x[b * stride + (j - b * HW)] - k;
		s += d;
		q += d * d;
	}
	block_sum2(s, q);
	if (!bn_last(s, q, partial, tickets) || threadIdx.x != 0)
		return;
	double m = s / (double)n, v = q / (double)n - m * m;
	mean[c] = (float)(k + m);
	var[c] = (float)(v > 0.0 ? v : 0.0);
}

/* y = a x + d with a = gamma / sqrt(var + eps), d = beta - a mean (the
 * batch's statistics in training, the running ones in evaluation), as
 * the CPU computes them. */
template <typename I>
__global__ void bn_apply_kernel(float *out, const float *inp, const float *mean, const float *var,
				const float *gamma, const float *beta, int C, I HW, I total)
{
	GRID_STRIDE_T(I, i, total) {
		int c = (int)(i / HW % (I)C);
		float a = gamma[c] / sqrtf(var[c] + BATCHNORM_EPS);
		out[i] = a * inp[i] + (beta[c] - a * mean[c]);
	}
}

/* sum dy and sum dy * xhat of channel c; the last block adds them to
 * dbeta and dgamma, the running statistics' updates to drun_mean and
 * drun_var, and keeps the sums as floats in sums[2c], sums[2c+1] (NULL:
 * no input gradient follows). */
template <typename I>
__global__ void bn_dsums_kernel(float *sums, float *dgamma, float *dbeta, float *drun_mean,
				float *drun_var, const float *dout, const float *inp,
				const float *mean, const float *var, const float *run_mean,
				const float *run_var, float stat_scale, int C, I HW, I n,
				double *partial, unsigned *tickets)
{
	int c = blockIdx.x;
	I stride = (I)C * HW, base = (I)c * HW;
	float mu = mean[c];
	float invstd = 1.0f / sqrtf(var[c] + BATCHNORM_EPS);
	double a = 0.0, b = 0.0;
	BN_LOOP(I, j, n) {
		I p = j / HW, at = base + p * stride + (j - p * HW);
		float dy = dout[at];
		a += dy;
		b += (double)dy * (double)((inp[at] - mu) * invstd);
	}
	block_sum2(a, b);
	if (!bn_last(a, b, partial, tickets) || threadIdx.x != 0)
		return;
	dbeta[c] += (float)a;
	dgamma[c] += (float)b;
	double unbiased = n > 1 ? (double)var[c] * (double)n / (double)(n - 1) : (double)var[c];
	drun_mean[c] += stat_scale * BATCHNORM_MOMENTUM * (mu - run_mean[c]);
	drun_var[c] += (float)(stat_scale * BATCHNORM_MOMENTUM * (unbiased - run_var[c]));
	if (sums) {
		sums[2 * c] = (float)a;
		sums[2 * c + 1] = (float)b;
	}
}

/* dx = gamma invstd / n (n dy - sum dy - xhat sum(dy xhat)); dinp may
 * alias dout (each element is read, then written, by one thread). */
template <typename I>
__global__ void bn_dinp_kernel(float *dinp, const float *dout, const float *inp,
			       const float *gamma, const float *mean, const float *var,
			       const float *sums, int C, I HW, I total, float fn)
{
	GRID_STRIDE_T(I, i, total) {
		int c = (int)(i / HW % (I)C);
		float invstd = 1.0f / sqrtf(var[c] + BATCHNORM_EPS);
		float xhat = (inp[i] - mean[c]) * invstd;
		dinp[i] = gamma[c] * invstd / fn * (fn * dout[i] - sums[2 * c] - xhat * sums[2 * c + 1]);
	}
}

extern "C" size_t gk_bn_partials(void)
{
	return 2 * (size_t)GK_BN_SLOTS;
}

/* Blocks per channel: about BN_PER_BLOCK values each, at most
 * BN_MAX_SPLIT, and no more than the scratch's slots hold for C channels
 * (one, without scratch or past GK_BN_SLOTS / 2 channels). */
static unsigned bn_split(int C, size_t n, const struct gk_bn_scratch *s)
{
	if (!s || !s->partial || !s->tickets)
		return 1;
	size_t k = (n + BN_PER_BLOCK - 1) / BN_PER_BLOCK, cap = GK_BN_SLOTS / (size_t)C;
	k = k < cap ? k : cap;
	k = k < BN_MAX_SPLIT ? k : BN_MAX_SPLIT;
	return (unsigned)(k < 1 ? 1 : k);
}

extern "C" int gk_batchnorm_forward(void *stream, float *out, float *mean, float *var,
				    const float *inp, const float *gamma, const float *beta,
				    const float *run_mean, const float *run_var, int B, int C,
				    int HW, const struct gk_bn_scratch *s)
{
	if (C <= 0 || B <= 0)
		return 0;
	size_t n = (size_t)B * HW, total = n * C;
	int fits = FITS32(total);
	if (mean) {
		dim3 grid((unsigned)C, bn_split(C, n, s));
		LAUNCH_I(fits, bn_stats_kernel, grid, THREADS, stream, mean, var, inp, C, HW, n,
			 s ? s->partial : NULL, s ? s->tickets : NULL);
		int e = launched();
		if (e)
			return e;
	}
	LAUNCH_I(fits, bn_apply_kernel, blocks_for(total), THREADS, stream, out, inp,
		 mean ? mean : run_mean, mean ? var : run_var, gamma, beta, C, HW, total);
	return launched();
}

extern "C" int gk_batchnorm_backward(void *stream, float *dinp, float *dgamma, float *dbeta,
				     float *drun_mean, float *drun_var, const float *dout,
				     const float *inp, const float *gamma, const float *mean,
				     const float *var, const float *run_mean, const float *run_var,
				     float stat_scale, int B, int C, int HW,
				     const struct gk_bn_scratch *s)
{
	if (C <= 0 || B <= 0)
		return 0;
	if (dinp && (!s || !s->sums))
		return (int)cudaErrorInvalidValue;   /* the input gradient needs the sums kept */
	size_t n = (size_t)B * HW, total = n * C;
	int fits = FITS32(total);
	dim3 grid((unsigned)C, bn_split(C, n, s));
	LAUNCH_I(fits, bn_dsums_kernel, grid, THREADS, stream, dinp ? s->sums : NULL, dgamma, dbeta,
		 drun_mean, drun_var, dout, inp, mean, var, run_mean, run_var, stat_scale, C, HW, n,
		 s ? s->partial : NULL, s ? s->tickets : NULL);
	int e = launched();
	if (e || !dinp)
		return e;
	LAUNCH_I(fits, bn_dinp_kernel, blocks_for(total), THREADS, stream, dinp, dout, inp, gamma,
		 mean, var, s->sums, C, HW, total, (float)n);
	return launched();
}
