/* Batch normalization over NCHW activations, per channel over (B, H, W).
 * A dense layer's output (B, C) is the case HW = 1, so one kernel serves
 * both. Sums are in double: a channel of a batch of 256 28x28 images has
 * 200,000 values, enough for a float sum to lose digits of the mean. */
#include "layers.h"
#include "parallel.h"

#include <math.h>
#include <stddef.h>

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
	float *out = j->out, *mean = j->mean, *var = j->var;
	const float *inp = j->inp, *gamma = j->gamma, *beta = j->beta;
	const float *run_mean = j->run_mean, *run_var = j->run_var;
	int B = j->B, C = j->C, HW = j->HW;
	size_t n = (size_t)B * HW;
	for (int c = c0; c < c1; c++) {
		float mu, v;
		if (mean) {
			double s = 0.0;
			for (int b = 0; b < B; b++) {
				const float *x = inp + ((size_t)b * C + c) * HW;
				for (int i = 0; i < HW; i++)
					s += x[i];
			}
			double m = s / (double)n, q = 0.0;
			/* Two passes: E[(x - mean)^2] does not cancel the way
			 * E[x^2] - mean^2 does. */
			for (int b = 0; b < B; b++) {
				const float *x = inp + ((size_t)b * C + c) * HW;
				for (int i = 0; i < HW; i++)
					q += ((double)x[i] - m) * ((double)x[i] - m);
			}
			mu = (float)m;
			v = (float)(q / (double)n);
			mean[c] = mu;
			var[c] = v;
		} else {
			mu = run_mean[c];
			v = run_var[c];
		}
		float a = gamma[c] / sqrtf(v + BATCHNORM_EPS);
		float d = beta[c] - a * mu;
		for (int b = 0; b < B; b++) {
			const float *x = inp + ((size_t)b * C + c) * HW;
			float *y = out + ((size_t)b * C + c) * HW;
			for (int i = 0; i < HW; i++)
				y[i] = a * x[i] + d;
		}
	}
}

/* Channels [c0, c1) of batchnorm_backward. */
static void bn_backward_channels(const struct bn_job *j, int c0, int c1)
{
	float *dinp = j->out, *dgamma = j->dgamma, *dbeta = j->dbeta;
	float *drun_mean = j->drun_mean, *drun_var = j->drun_var;
	const float *dout = j->dout, *inp = j->inp, *gamma = j->gamma;
	const float *mean = j->cmean, *var = j->cvar, *run_mean = j->run_mean, *run_var = j->run_var;
	float stat_scale = j->stat_scale;
	int B = j->B, C = j->C, HW = j->HW;
	size_t n = (size_t)B * HW;
	for (int c = c0; c < c1; c++) {
		float mu = mean[c];
		float invstd = 1.0f / sqrtf(var[c] + BATCHNORM_EPS);
		/* xhat = (x - mean) * invstd;
		 * dx = gamma * invstd / n * (n dy - sum dy - xhat sum(dy xhat)) */
		double sdy = 0.0, sdyx = 0.0;
		for (int b = 0; b < B; b++) {
			const float *x = inp + ((size_t)b * C + c) * HW;
			const float *dy = dout + ((size_t)b * C + c) * HW;
			for (int i = 0; i < HW; i++) {
				sdy += dy[i];
				sdyx += (double)dy[i] * (double)((x[i] - mu) * invstd);
			}
		}
		dbeta[c] += (float)sdy;
		dgamma[c] += (float)sdyx;
		double unbiased = n > 1 ? (double)var[c] * (double)n / (double)(n - 1) : (double)var[c];
		drun_mean[c] += stat_scale * BATCHNORM_MOMENTUM * (mu - run_mean[c]);
		drun_var[c] += (float)(stat_scale * BATCHNORM_MOMENTUM * (unbiased - run_var[c]));
		if (!dinp)
			continue;
		float k = gamma[c] * invstd / (float)n;
		float mdy = (float)sdy, mdyx = (float)sdyx;
		for (int b = 0; b < B; b++) {
			const float *x = inp + ((size_t)b * C + c) * HW;
			const float *dy = dout + ((size_t)b * C + c) * HW;
			float *dx = dinp + ((size_t)b * C + c) * HW;
			for (int i = 0; i < HW; i++) {
				float xhat = (x[i] - mu) * invstd;
				dx[i] = k * ((float)n * dy[i] - mdy - xhat * mdyx);
			}
		}
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
