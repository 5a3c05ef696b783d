/* CUDA twins of batch normalization (core/nn/batchnorm.c): the same
 * semantics (sums in double, the biased variance, PyTorch's running
 * statistics' momentum); only summation order differs. The normalization
 * and the input gradient round as the CPU's, one operation at a time
 * (bn_coef says why).
 *
 * The per-channel sums (forward: of x - k and its square; backward: of dy
 * and dy * xhat) are split over many blocks a channel and met by the last
 * one (gpu/chansum.cuh). The elementwise parts (y = a x + d, the input
 * gradient) are kernels of their own over all B*C*HW values. */
extern "C" {
#include "../core/nn/layers.h"
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

/* a = gamma / sqrt(var + eps) and d = beta - a mean (the batch's
 * statistics in training, the running ones in evaluation), each operation
 * rounded as the CPU twin rounds it (bn_forward_channels): nvcc would
 * contract d and bn_y's a x + d into FMAs. Where the variance is well
 * under eps and the mean is not small, a x and a mean are large and
 * cancel, so a fused rounding moved y by 1.1e-5 of the largest output
 * (gpu_kernels case 31: 3 values a channel) and by 6e-4 around 10 (case
 * 34); the statistics themselves agreed bit for bit. The __f*_rn
 * intrinsics are never contracted, nor changed by fast-math flags. */
__device__ static void bn_coef(float gamma, float var, float beta, float mean, float &a, float &d)
{
	a = __fdiv_rn(gamma, __fsqrt_rn(__fadd_rn(var, BATCHNORM_EPS)));
	d = __fsub_rn(beta, __fmul_rn(a, mean));
}

/* 1 / sqrt(var + eps), rounded as the CPU's backward rounds it. */
__device__ static float bn_invstd(float var)
{
	return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, BATCHNORM_EPS)));
}

/* y = a x + d, rounded as chan_affine's; relu: then relu_forward's
 * x < 0 ? 0 : x (a NaN stays NaN). */
__device__ static float bn_y(float x, float a, float d, int relu)
{
	float y = __fadd_rn(__fmul_rn(a, x), d);
	return relu && y < 0.0f ? 0.0f : y;
}

template <typename I>
__global__ void bn_apply_kernel(float *out, const float *inp, const float *mean, const float *var,
				const float *gamma, const float *beta, int C, I HW, I total, int relu)
{
	GRID_STRIDE_T(I, i, total) {
		int c = (int)(i / HW % (I)C);
		float a, d;
		bn_coef(gamma[c], var[c], beta[c], mean[c], a, d);
		out[i] = bn_y(inp[i], a, d, relu);
	}
}

/* act (B, C, H, W) = relu(a x + d) and out (B, C, OH, OW) = its pooling
 * over windows that tile each plane (S = K, P = 0): one thread a tile of
 * K x K inputs, which it normalizes, keeps in act (relu's and max
 * pooling's backward read it) and pools as pool_forward_kernel does (the
 * first maximum; the sum in row order, times 1 / K^2). Tiles past the
 * last whole window (when K does not divide H or W) go to act only. */
template <typename I>
__global__ void bn_relu_pool_kernel(float *act, float *out, const float *inp, const float *mean,
				    const float *var, const float *gamma, const float *beta, int C,
				    I planes, struct window w, int max, int TH, int TW)
{
	I n = planes * (I)TH * TW, hw = (I)w.H * w.W;
	float inv = 1.0f / (float)(w.K * w.K);
	GRID_STRIDE_T(I, idx, n) {
		I row = idx / (I)TW, p = row / (I)TH;
		int tw = (int)(idx - row * TW), th = (int)(row - p * TH);
		int c = (int)(p % (I)C);
		float a, d;
		bn_coef(gamma[c], var[c], beta[c], mean[c], a, d);
		int h0 = th * w.K, x0 = tw * w.K;
		int h1 = h0 + w.K < w.H ? h0 + w.K : w.H, x1 = x0 + w.K < w.W ? x0 + w.K : w.W;
		float m = 0.0f, sum = 0.0f;
		for (int h = h0; h < h1; h++)
			for (int x = x0; x < x1; x++) {
				I at = p * hw + (I)h * w.W + x;
				float y = bn_y(inp[at], a, d, 1);
				act[at] = y;
				if ((h == h0 && x == x0) || y > m)
					m = y;
				sum += y;
			}
		if (th < w.OH && tw < w.OW)
			out[p * ((I)w.OH * w.OW) + (I)th * w.OW + tw] = max ? m : sum * inv;
	}
}

/* Where batchnorm's output gradient comes from. Plain (act NULL): dout
 * (B, C, HW). Fused with the relu after it and the pooling after that
 * (gk_bn_relu_backward): relu_backward(pool_backward(dout)) with dout the
 * pooled gradient (B, C, OH, OW) (w.K = 0: no pooling, dout (B, C, HW)),
 * kept in g for the input gradient. */
struct bn_dy {
	const float *dout, *act;
	float *g;
	struct window w;
	int max;
};

/* The gradient at element q of plane p (b C + c), at = p HW + q. A
 * tiling window holds each input at most once: the pooled gradient of
 * that window, to the first maximum only (max pooling's rule) or a K^2-th
 * of it to each (average pooling's), none to an input no window holds. */
template <typename I>
__device__ static float bn_dy_at(const struct bn_dy &d, I p, I q, I at)
{
	if (!d.act)
		return d.dout[at];
	float gv = 0.0f;
	if (!d.w.K) {
		gv = d.dout[at];
	} else {
		const struct window &w = d.w;
		int h = (int)(q / (I)w.W), x = (int)q - h * w.W;
		int oh = h / w.K, ow = x / w.K;
		if (oh < w.OH && ow < w.OW) {
			float dy = d.dout[p * ((I)w.OH * w.OW) + (I)oh * w.OW + ow];
			if (!d.max) {
				gv = dy * (1.0f / (float)(w.K * w.K));
			} else {
				const float *x0 = d.act + p * ((I)w.H * w.W) + (I)(oh * w.K) * w.W + ow * w.K;
				int best = 0;
				for (int kh = 0; kh < w.K; kh++)
					for (int kw = 0; kw < w.K; kw++)
						if (x0[kh * w.W + kw] > x0[best])
							best = kh * w.W + kw;
				gv = best == (h - oh * w.K) * w.W + (x - ow * w.K) ? dy : 0.0f;
			}
		}
	}
	gv = d.act[at] > 0.0f ? gv : 0.0f;   /* relu's backward, as gk_act_backward's */
	d.g[at] = gv;
	return gv;
}

/* sum dy and sum dy * xhat of channel c; the last block adds them to
 * dbeta and dgamma, the running statistics' updates to drun_mean and
 * drun_var, and keeps the sums as floats in sums[2c], sums[2c+1] (NULL:
 * no input gradient follows). */
template <typename I>
__global__ void bn_dsums_kernel(float *sums, float *dgamma, float *dbeta, float *drun_mean,
				float *drun_var, struct bn_dy dd, const float *inp,
				const float *mean, const float *var, const float *run_mean,
				const float *run_var, float stat_scale, int C, I HW, I n,
				double *partial, unsigned *tickets)
{
	int c = blockIdx.x;
	I stride = (I)C * HW, base = (I)c * HW;
	float mu = mean[c];
	float invstd = bn_invstd(var[c]);
	double a = 0.0, b = 0.0;
	CHAN_LOOP(I, j, n) {
		I p = j / HW, at = base + p * stride + (j - p * HW);
		float dy = bn_dy_at(dd, p * (I)C + (I)c, j - p * HW, at);
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

/* dx = gamma invstd / n (n dy - sum dy - xhat sum(dy xhat)), rounded as
 * chan_dinp's (no FMAs: bn_coef says why); dinp may alias dout (each
 * element is read, then written, by one thread). */
template <typename I>
__global__ void bn_dinp_kernel(float *dinp, const float *dout, const float *inp,
			       const float *gamma, const float *mean, const float *var,
			       const float *sums, int C, I HW, I total, float fn)
{
	GRID_STRIDE_T(I, i, total) {
		int c = (int)(i / HW % (I)C);
		float invstd = bn_invstd(var[c]);
		float xhat = __fmul_rn(__fsub_rn(inp[i], mean[c]), invstd);
		float k = __fdiv_rn(__fmul_rn(gamma[c], invstd), fn);
		float t = __fsub_rn(__fmul_rn(fn, dout[i]), sums[2 * c]);
		dinp[i] = __fmul_rn(k, __fsub_rn(t, __fmul_rn(xhat, sums[2 * c + 1])));
	}
}

extern "C" size_t gk_bn_partials(void)
{
	return 2 * (size_t)GK_BN_SLOTS;
}

/* What gk_bn_relu_* accept as the pooling after the relu: a window over
 * the batchnorm's planes that tiles them (S = K, P = 0). */
static int tiles(const struct window *w, int C, int HW)
{
	return w->C == C && w->H * w->W == HW && w->S == w->K && w->P == 0 && w->K >= 1;
}

static int bn_forward(void *stream, float *out, float *pooled, float *mean, float *var,
		      const float *inp, const float *gamma, const float *beta, const float *run_mean,
		      const float *run_var, int B, int C, int HW, int relu, const struct window *w,
		      int max, const struct gk_bn_scratch *s)
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
	const float *m = mean ? mean : run_mean, *v = mean ? var : run_var;
	if (!w) {
		LAUNCH_I(fits, bn_apply_kernel, blocks_for(total), THREADS, stream, out, inp, m, v, gamma,
			 beta, C, HW, total, relu);
		return launched();
	}
	int TH = (w->H + w->K - 1) / w->K, TW = (w->W + w->K - 1) / w->K;
	size_t planes = (size_t)B * C, nt = planes * TH * TW;
	LAUNCH_I(fits, bn_relu_pool_kernel, blocks_for(nt), THREADS, stream, out, pooled, inp, m, v,
		 gamma, beta, C, planes, *w, max, TH, TW);
	return launched();
}

extern "C" int gk_batchnorm_forward(void *stream, float *out, float *mean, float *var,
				    const float *inp, const float *gamma, const float *beta,
				    const float *run_mean, const float *run_var, int B, int C,
				    int HW, const struct gk_bn_scratch *s)
{
	return bn_forward(stream, out, NULL, mean, var, inp, gamma, beta, run_mean, run_var, B, C, HW,
			  0, NULL, 0, s);
}

extern "C" int gk_bn_relu_forward(void *stream, float *act, float *out, float *mean, float *var,
				  const float *inp, const float *gamma, const float *beta,
				  const float *run_mean, const float *run_var, int B, int C, int HW,
				  const struct window *w, int max, const struct gk_bn_scratch *s)
{
	if (w && !tiles(w, C, HW))
		return (int)cudaErrorInvalidValue;
	return bn_forward(stream, act, out, mean, var, inp, gamma, beta, run_mean, run_var, B, C, HW,
			  1, w, max, s);
}

static int bn_backward(void *stream, float *dinp, float *dgamma, float *dbeta, float *drun_mean,
		       float *drun_var, const struct bn_dy *dd, const float *inp, const float *gamma,
		       const float *mean, const float *var, const float *run_mean,
		       const float *run_var, float stat_scale, int B, int C, int HW,
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
		 drun_mean, drun_var, *dd, inp, mean, var, run_mean, run_var, stat_scale, C, HW, n,
		 s ? s->partial : NULL, s ? s->tickets : NULL);
	int e = launched();
	if (e || !dinp)
		return e;
	LAUNCH_I(fits, bn_dinp_kernel, blocks_for(total), THREADS, stream, dinp,
		 dd->act ? dd->g : dd->dout, inp, gamma, mean, var, s->sums, C, HW, total, (float)n);
	return launched();
}

extern "C" int gk_batchnorm_backward(void *stream, float *dinp, float *dgamma, float *dbeta,
				     float *drun_mean, float *drun_var, const float *dout,
				     const float *inp, const float *gamma, const float *mean,
				     const float *var, const float *run_mean, const float *run_var,
				     float stat_scale, int B, int C, int HW,
				     const struct gk_bn_scratch *s)
{
	struct bn_dy dd = {};
	dd.dout = dout;
	return bn_backward(stream, dinp, dgamma, dbeta, drun_mean, drun_var, &dd, inp, gamma, mean,
			   var, run_mean, run_var, stat_scale, B, C, HW, s);
}

extern "C" int gk_bn_relu_backward(void *stream, float *dinp, float *g, float *dgamma,
				   float *dbeta, float *drun_mean, float *drun_var,
				   const float *dout, const float *act, const float *inp,
				   const float *gamma, const float *mean, const float *var,
				   const float *run_mean, const float *run_var, float stat_scale, int B,
				   int C, int HW, const struct window *w, int max,
				   const struct gk_bn_scratch *s)
{
	if ((w && !tiles(w, C, HW)) || !g || !act)
		return (int)cudaErrorInvalidValue;
	struct bn_dy dd = {};
	dd.dout = dout;
	dd.act = act;
	dd.g = g;
	dd.max = max;
	if (w)
		dd.w = *w;   /* else K = 0: no pooling */
	return bn_backward(stream, dinp, dgamma, dbeta, drun_mean, drun_var, &dd, inp, gamma, mean,
			   var, run_mean, run_var, stat_scale, B, C, HW, s);
}
