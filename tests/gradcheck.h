/* What the kernel tests share (tests/test_layers.c, tests/test_conv.c):
 * a seeded test RNG, arrays for poisoning outputs, and the finite-difference
 * gradient check (the method is described at the top of test_layers.c). */
#ifndef PSTRAIN_TEST_GRADCHECK_H
#define PSTRAIN_TEST_GRADCHECK_H

#include <stddef.h>
#include <stdint.h>

#define GRAD_TOL 1e-4

/* Restarts the RNG of rand_uniform; a suite's .init calls it, so every
 * test (its own process) draws the same values each run. */
void gradcheck_seed(uint64_t seed);
double rand_uniform(void);                     /* [-1, 1) */
float *rand_array(size_t n, double scale);     /* uniform in [-scale, scale) */
float *zero_array(size_t n);
void nan_fill(float *a, size_t n);
double dot_double(const float *a, const float *b, size_t n);

typedef double (*objective_fn)(void *ctx);

/* Compares the analytic gradient ga (n) of param (n) with fourth-order
 * central differences of f (step h) and returns the norm-wise relative
 * error ||ga - gn|| / (||ga|| + ||gn||), asserted below GRAD_TOL. Also
 * asserts every element: its error relative to |ga| + |gn|, floored at 1%
 * of the largest gradient so that elements that are zero up to rounding do
 * not dominate, below 10 x GRAD_TOL. */
double check_grad(const char *what, float *param, const float *ga, size_t n, double h,
		  objective_fn f, void *ctx);

#endif
