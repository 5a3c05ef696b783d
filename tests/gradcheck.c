/* See gradcheck.h. */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include "gradcheck.h"

#include <math.h>
#include <stdlib.h>

static uint64_t test_rng = 0x1234abcdULL;

void gradcheck_seed(uint64_t seed)
{
	test_rng = seed;
}

double rand_uniform(void)
{
	uint64_t z = (test_rng += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	z ^= z >> 31;
	return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

float *rand_array(size_t n, double scale)
{
	float *a = malloc(n * sizeof(float) + 4);
	cr_assert(a != NULL);
	for (size_t i = 0; i < n; i++)
		a[i] = (float)(scale * rand_uniform());
	return a;
}

float *zero_array(size_t n)
{
	float *a = calloc(n + 1, sizeof(float));
	cr_assert(a != NULL);
	return a;
}

void nan_fill(float *a, size_t n)
{
	for (size_t i = 0; i < n; i++)
		a[i] = NAN;
}

double dot_double(const float *a, const float *b, size_t n)
{
	double s = 0.0;
	for (size_t i = 0; i < n; i++)
		s += (double)a[i] * (double)b[i];
	return s;
}

static double numeric_grad(float *x, double h, objective_fn f, void *ctx)
{
	float orig = *x;
	*x = (float)(orig + h);      double p1 = f(ctx);
	*x = (float)(orig - h);      double m1 = f(ctx);
	*x = (float)(orig + 2 * h);  double p2 = f(ctx);
	*x = (float)(orig - 2 * h);  double m2 = f(ctx);
	*x = orig;
	return (8.0 * (p1 - m1) - (p2 - m2)) / (12.0 * h);
}

double check_grad(const char *what, float *param, const float *ga, size_t n, double h,
		  objective_fn f, void *ctx)
{
	double *gn = malloc(n * sizeof(double) + 8);
	cr_assert(gn != NULL);
	double diff2 = 0.0, a2 = 0.0, n2 = 0.0, amax = 0.0;
	for (size_t i = 0; i < n; i++) {
		gn[i] = numeric_grad(&param[i], h, f, ctx);
		double d = (double)ga[i] - gn[i];
		diff2 += d * d;
		a2 += (double)ga[i] * ga[i];
		n2 += gn[i] * gn[i];
		if (fabs(gn[i]) > amax)
			amax = fabs(gn[i]);
	}
	double denom = sqrt(a2) + sqrt(n2);
	double rel = sqrt(diff2) / (denom > 1e-30 ? denom : 1e-30);
	double worst = 0.0;
	for (size_t i = 0; i < n; i++) {
		double scale = fabs(ga[i]) + fabs(gn[i]);
		if (scale < 1e-2 * amax)
			scale = 1e-2 * amax;
		double e = scale > 0 ? fabs(ga[i] - gn[i]) / scale : 0.0;
		if (e > worst)
			worst = e;
		cr_assert(e < 10 * GRAD_TOL, "%s[%zu]: analytic %.9g numeric %.9g (rel %.3g)",
			  what, i, (double)ga[i], gn[i], e);
	}
	cr_assert(denom > 0.0 || n == 0, "%s: gradient is all zero, check is vacuous", what);
	cr_assert(rel < GRAD_TOL, "%s: norm-wise relative error %.3g", what, rel);
	cr_log_info("%s: n=%zu norm-wise rel err %.3g, worst element %.3g", what, n, rel, worst);
	free(gn);
	return rel;
}
