/* Batch normalization over NCHW activations, per channel over (B, H, W).
 * A dense layer's output (B, C) is the case HW = 1, so one kernel serves
 * both. Sums are in double: a channel of a batch of 256 28x28 images has
 * 200,000 values, enough for a float sum to lose digits of the mean. */
#include "layers.h"
#include "parallel.h"

#include <math.h>
#include <stddef.h>

/* The per-channel passes get AVX2 and AVX-512 copies picked at load time,
 * as in layers.c. Each sum runs in eight interleaved partial sums: the
 * compiler may not reorder a sum by itself, and one serial chain of double
 * adds bound batchnorm at ~14% of a Fashion CNN step (perf, 1 thread). */
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

/* Channel planes: B planes of HW values, plane b at x + b * stride. */

VECTOR_CLONES
static double chan_sum(const float *x, size_t stride, int B, int HW)
{
	double acc[8] = { 0 }, s = 0.0;
	for (int b = 0; b < B; b++) {
		const float *p = x + (size_t)b * stride;
		int i = 0;
		for (; i + 8 <= HW; i += 8)
			for (int k = 0; k < 8; k++)
				acc[k] += p[i + k];
		for (; i < HW; i++)
			s += p[i];
	}
	for (int k = 0; k < 8; k++)
		s += acc[k];
	return s;
}

/* Sum of (x - m)^2. */
VECTOR_CLONES
static double chan_sqdev(const float *x, size_t stride, int B, int HW, double m)
{
	double acc[8] = { 0 }, s = 0.0;
	for (int b = 0; b < B; b++) {
		const float *p = x + (size_t)b * stride;
		int i = 0;
		for (; i + 8 <= HW; i += 8)
			for (int k = 0; k < 8; k++)
				acc[k] += ((double)p[i + k] - m) * ((double)p[i + k] - m);
		for (; i < HW; i++)
			s += ((double)p[i] - m) * ((double)p[i] - m);
	}
	for (int k = 0; k < 8; k++)
		s += acc[k];
	return s;
}

/* *sdy = sum of dy, *sdyx = sum of dy * xhat, xhat = (x - mu) * invstd. */
VECTOR_CLONES
static void chan_dsums(double *sdy, double *sdyx, const float *x, const float *dy, size_t stride,
		       int B, int HW, float mu, float invstd)
{
	double a1[8] = { 0 }, a2[8] = { 0 }, s1 = 0.0, s2 = 0.0;
	for (int b = 0; b < B; b++) {
		const float *p = x + (size_t)b * stride, *g = dy + (size_t)b * stride;
		int i = 0;
		for (; i + 8 <= HW; i += 8) {
			for (int k = 0; k < 8; k++) {
				a1[k] += g[i + k];
				a2[k] += (double)g[i + k] * (double)((p[i + k] - mu) * invstd);
			}
		}
		for (; i < HW; i++) {
			s1 += g[i];
			s2 += (double)g[i] * (double)((p[i] - mu) * invstd);
		}
	}
	for (int k = 0; k < 8; k++) {
		s1 += a1[k];
		s2 += a2[k];
	}
	*sdy = s1;
	*sdyx = s2;
}

/* y = a x + d over the channel's planes. */
VECTOR_CLONES
static void chan_affine(float *y, const float *x, size_t stride, int B, int HW, float a, float d)
{
	for (int b = 0; b < B; b++) {
		float *q = y + (size_t)b * stride;
		const float *p = x + (size_t)b * stride;
		for (int i = 0; i < HW; i++)
			q[i] = a * p[i] + d;
	}
}

/* dx = k (n dy - mdy - xhat mdyx). */
VECTOR_CLONES
static void chan_dinp(float *dx, const float *x, const float *dy, size_t stride, int B, int HW,
		      float mu, float invstd, float k, float n, float mdy, float mdyx)
{
	for (int b = 0; b < B; b++) {
		float *q = dx + (size_t)b * stride;
		const float *p = x + (size_t)b * stride, *g = dy + (size_t)b * stride;
		for (int i = 0; i < HW; i++) {
			float xhat = (p[i] - mu) * invstd;
			q[i] = k * (n * g[i] - mdy - xhat * mdyx);
		}
	}
}

/* Every channel is computed alone, so the work splits by channels over
 * threads without changing a bit of the result. */
struct bn_job {
	float *out, *mean, *var, *dgamma, *dbeta, *drun_mean, *drun_var;
	const float *inp, *dout, *gamma, *beta, *run_mean, *run_var;
	const float *cmean, *cvar;   /* backward's mean and var */
	float stat_scale;
	int B, C, HW;
};

/* Channels [c0, c1) of batchnorm_forward. */
static void bn_forward_channels(const struct bn_job *j, int c0, int c1)
{
	int B = j->B, C = j->C, HW = j->HW;
	size_t n = (size_t)B * HW, stride = (size_t)C * HW;
	for (int c = c0; c < c1; c++) {
		const float *x = j->inp + (size_t)c * HW;   // (B planes of HW)
		float mu, v;
		if (j->mean) {
			double m = chan_sum(x, stride, B, HW) / (double)n;
			/* Two passes: E[(x - mean)^2] does not cancel the way
			 * E[x^2] - mean^2 does. */
			double q = chan_sqdev(x, stride, B, HW, m);
			mu = (float)m;
			v = (float)(q / (double)n);
			j->mean[c] = mu;
			j->var[c] = v;
		} else {
			mu = j->run_mean[c];
			v = j->run_var[c];
		}
		float a = j->gamma[c] / sqrtf(v + BATCHNORM_EPS);
		chan_affine(j->out + (size_t)c * HW, x, stride, B, HW, a, j->beta[c] - a * mu);
	}
}

/* Channels [c0, c1) of batchnorm_backward. */
static void bn_backward_channels(const struct bn_job *j, int c0, int c1)
{
	int B = j->B, C = j->C, HW = j->HW;
	size_t n = (size_t)B * HW, stride = (size_t)C * HW;
	for (int c = c0; c < c1; c++) {
		const float *x = j->inp + (size_t)c * HW, *dy = j->dout + (size_t)c * HW;
		float mu = j->cmean[c], var = j->cvar[c];
		float invstd = 1.0f / sqrtf(var + BATCHNORM_EPS);
		/* xhat = (x - mean) * invstd;
		 * dx = gamma * invstd / n * (n dy - sum dy - xhat sum(dy xhat)) */
		double sdy, sdyx;
		chan_dsums(&sdy, &sdyx, x, dy, stride, B, HW, mu, invstd);
		j->dbeta[c] += (float)sdy;
		j->dgamma[c] += (float)sdyx;
		double unbiased = n > 1 ? (double)var * (double)n / (double)(n - 1) : (double)var;
		j->drun_mean[c] += j->stat_scale * BATCHNORM_MOMENTUM * (mu - j->run_mean[c]);
		j->drun_var[c] += (float)(j->stat_scale * BATCHNORM_MOMENTUM * (unbiased - j->run_var[c]));
		if (!j->out)
			continue;
		chan_dinp(j->out + (size_t)c * HW, x, dy, stride, B, HW, mu, invstd,
			  j->gamma[c] * invstd / (float)n, (float)n, (float)sdy, (float)sdyx);
	}
}

static void bn_forward_share(void *arg, int t, int nt)
{
	const struct bn_job *j = arg;
	size_t lo, hi;
	parallel_share((size_t)j->C, t, nt, &lo, &hi);
	bn_forward_channels(j, (int)lo, (int)hi);
}

static void bn_backward_share(void *arg, int t, int nt)
{
	const struct bn_job *j = arg;
	size_t lo, hi;
	parallel_share((size_t)j->C, t, nt, &lo, &hi);
	bn_backward_channels(j, (int)lo, (int)hi);
}

void batchnorm_forward_mt(float *out, float *mean, float *var, const float *inp,
			  const float *gamma, const float *beta, const float *run_mean,
			  const float *run_var, int B, int C, int HW, int threads)
{
	// out (B, C, HW), mean (C), var (C), inp (B, C, HW), gamma, beta, run_* (C)
	struct bn_job j = { .out = out, .mean = mean, .var = var, .inp = inp, .gamma = gamma,
			    .beta = beta, .run_mean = run_mean, .run_var = run_var,
			    .B = B, .C = C, .HW = HW };
	if (threads > C)
		threads = C;
	if (threads <= 1)
		bn_forward_channels(&j, 0, C);
	else
		parallel_run(threads, bn_forward_share, &j);
}

void batchnorm_backward_mt(float *dinp, float *dgamma, float *dbeta, float *drun_mean,
			   float *drun_var, const float *dout, const float *inp,
			   const float *gamma, const float *mean, const float *var,
			   const float *run_mean, const float *run_var, float stat_scale,
			   int B, int C, int HW, int threads)
{
	// dinp (B, C, HW), dout (B, C, HW), inp (B, C, HW), the rest (C)
	struct bn_job j = { .out = dinp, .dgamma = dgamma, .dbeta = dbeta, .drun_mean = drun_mean,
			    .drun_var = drun_var, .dout = dout, .inp = inp, .gamma = gamma,
			    .cmean = mean, .cvar = var, .run_mean = run_mean, .run_var = run_var,
			    .stat_scale = stat_scale, .B = B, .C = C, .HW = HW };
	if (threads > C)
		threads = C;
	if (threads <= 1)
		bn_backward_channels(&j, 0, C);
	else
		parallel_run(threads, bn_backward_share, &j);
}

void batchnorm_forward(float *out, float *mean, float *var, const float *inp,
		       const float *gamma, const float *beta, const float *run_mean,
		       const float *run_var, int B, int C, int HW)
{
	batchnorm_forward_mt(out, mean, var, inp, gamma, beta, run_mean, run_var, B, C, HW, 1);
}

void batchnorm_backward(float *dinp, float *dgamma, float *dbeta, float *drun_mean,
			float *drun_var, const float *dout, const float *inp,
			const float *gamma, const float *mean, const float *var,
			const float *run_mean, const float *run_var, float stat_scale,
			int B, int C, int HW)
{
	batchnorm_backward_mt(dinp, dgamma, dbeta, drun_mean, drun_var, dout, inp, gamma, mean, var,
			      run_mean, run_var, stat_scale, B, C, HW, 1);
}
