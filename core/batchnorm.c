/* Batch normalization over NCHW activations, per channel over (B, H, W).
 * A dense layer's output (B, C) is the case HW = 1, so one kernel serves
 * both. Sums are in double: a channel of a batch of 256 28x28 images has
 * 200,000 values, enough for a float sum to lose digits of the mean. */
#include "layers.h"

#include <math.h>
#include <stddef.h>

void batchnorm_forward(float *out, float *mean, float *var, const float *inp,
		       const float *gamma, const float *beta, const float *run_mean,
		       const float *run_var, int B, int C, int HW)
{
	// out (B, C, HW), mean (C), var (C), inp (B, C, HW), gamma, beta, run_* (C)
	size_t n = (size_t)B * HW;
	for (int c = 0; c < C; c++) {
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

void batchnorm_backward(float *dinp, float *dgamma, float *dbeta, float *drun_mean,
			float *drun_var, const float *dout, const float *inp,
			const float *gamma, const float *mean, const float *var,
			const float *run_mean, const float *run_var, float stat_scale,
			int B, int C, int HW)
{
	// dinp (B, C, HW), dout (B, C, HW), inp (B, C, HW), the rest (C)
	size_t n = (size_t)B * HW;
	for (int c = 0; c < C; c++) {
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
