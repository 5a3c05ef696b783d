/* CUDA twins of batch normalization (core/batchnorm.c): the same
 * semantics (sums in double, the biased variance, PyTorch's running
 * statistics' momentum); only summation order differs.
 *
 * The per-channel sums (forward: of x - k and its square; backward: of dy
 * and dy * xhat) are split over many blocks a channel and met by the last
 * one (gpu/chansum.cuh). The elementwise parts (y = a x + d, the input
 * gradient) are kernels of their own over all B*C*HW values. */
extern "C" {
#include "../core/layers.h"
}
#include "chansum.cuh"
#include "kernels.h"
#include "launch.h"

#include <cuda_runtime.h>

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
	CHAN_LOOP(I, j, n) {
		I b = j / HW;
		double d = (double)x[b * stride + (j - b * HW)] - k;
		s += d;
		q += d * d;
	}
	block_sum2(s, q);
	if (!chan_last(s, q, partial, tickets) || threadIdx.x != 0)
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
	CHAN_LOOP(I, j, n) {
		I p = j / HW, at = base + p * stride + (j - p * HW);
		float dy = dout[at];
		a += dy;
		b += (double)dy * (double)((inp[at] - mu) * invstd);
	}
	block_sum2(a, b);
	if (!chan_last(a, b, partial, tickets) || threadIdx.x != 0)
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
		dim3 grid((unsigned)C, chan_split(C, n, s));
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
	dim3 grid((unsigned)C, chan_split(C, n, s));
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
