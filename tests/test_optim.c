/* Tests of core/nn/optim.c: each optimizer against updates worked out by hand
 * and against the optim.h formulas evaluated in double over a few steps,
 * shard independence, state handling, and every learning-rate schedule
 * around its boundaries. */
#include <criterion/criterion.h>

#include "leak.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "../core/nn/optim.h"

/* float results against double expectations: a few float roundings of
 * values near 1. */
#define TOL 2e-6

static void assert_close(const float *got, const double *want, size_t n,
			 const char *what, int step)
{
	for (size_t i = 0; i < n; i++)
		cr_assert(fabs(got[i] - want[i]) <= TOL * (1.0 + fabs(want[i])),
			  "%s step %d p[%zu] = %.9g, want %.9g",
			  what, step, i, (double)got[i], want[i]);
}

static struct optim_config sgd_config(float lr, float wd)
{
	return (struct optim_config){.kind = OPTIM_SGD, .lr = lr, .weight_decay = wd};
}

TestSuite(optim, .fini = leak_check);

Test(optim, sgd_by_hand)
{
	struct optim_config cfg = sgd_config(0.1f, 0.01f);
	struct optim o;
	cr_assert_eq(optim_init(&o, &cfg, 3), 0);
	cr_assert(o.m == NULL && o.v == NULL && o.t == 0);
	float p[3] = {1.0f, -2.0f, 0.5f};
	const float g[3] = {0.1f, 0.2f, -0.3f};
	/* g + wd p = {0.11, 0.18, -0.295}; p - 0.1 * that: */
	optim_step(&o, p, g, 0.1f);
	assert_close(p, (const double[]){0.989, -2.018, 0.5295}, 3, "sgd", 1);
	cr_assert_eq(o.t, 1);
	/* Second step: g + wd p = {0.10989, 0.17982, -0.294705}. */
	optim_step(&o, p, g, 0.1f);
	assert_close(p, (const double[]){0.978011, -2.035982, 0.5589705}, 3, "sgd", 2);
	cr_assert_eq(o.t, 2);
	optim_free(&o);
}

Test(optim, momentum_by_hand)
{
	/* Constant gradient, no decay: v = 0.5, 0.95, 1.355 and
	 * p = 1 - 0.1 v cumulatively. */
	struct optim_config cfg = {.kind = OPTIM_MOMENTUM, .lr = 0.1f, .momentum = 0.9f};
	struct optim o;
	cr_assert_eq(optim_init(&o, &cfg, 2), 0);
	cr_assert(o.m != NULL && o.v == NULL);
	cr_assert(o.m[0] == 0.0f && o.m[1] == 0.0f, "state must start at zero");
	float p[2] = {1.0f, -2.0f};
	const float g[2] = {0.5f, -1.0f};
	const double want[3][2] = {{0.95, -1.9}, {0.855, -1.71}, {0.7195, -1.439}};
	for (int s = 0; s < 3; s++) {
		optim_step(&o, p, g, 0.1f);
		assert_close(p, want[s], 2, "momentum", s + 1);
	}
	cr_assert(fabsf(o.m[0] - 1.355f) < 1e-6f, "v = %g", (double)o.m[0]);
	optim_free(&o);
}

Test(optim, nesterov_by_hand)
{
	/* update = g + 0.9 v with v as above: 0.95, 1.355, 1.7195. */
	struct optim_config cfg = {.kind = OPTIM_MOMENTUM, .lr = 0.1f, .momentum = 0.9f,
				   .nesterov = 1};
	struct optim o;
	cr_assert_eq(optim_init(&o, &cfg, 1), 0);
	float p[1] = {1.0f};
	const float g[1] = {0.5f};
	const double want[3] = {0.905, 0.7695, 0.59755};
	for (int s = 0; s < 3; s++) {
		optim_step(&o, p, g, 0.1f);
		assert_close(p, &want[s], 1, "nesterov", s + 1);
	}
	optim_free(&o);
}

Test(optim, adam_by_hand)
{
	/* Step 1: bias correction makes m_hat = g and v_hat = g^2, so the
	 * step is lr * g / (|g| + eps) = 0.01 * 0.5 / (0.5 + 1e-8).
	 * Step 2 (g = -0.25): m = 0.02, v = 0.00031225, bc1 = 0.19,
	 * bc2 = 0.001999: p = 0.99 - 0.01 * 0.105263 / 0.395225. */
	struct optim_config cfg = {.kind = OPTIM_ADAM, .lr = 0.01f, .beta1 = 0.9f,
				   .beta2 = 0.999f, .eps = 1e-8f};
	struct optim o;
	cr_assert_eq(optim_init(&o, &cfg, 1), 0);
	cr_assert(o.m != NULL && o.v != NULL);
	float p[1] = {1.0f};
	optim_step(&o, p, (const float[]){0.5f}, 0.01f);
	assert_close(p, (const double[]){0.9900000002}, 1, "adam", 1);
	optim_step(&o, p, (const float[]){-0.25f}, 0.01f);
	assert_close(p, (const double[]){0.9873366298707846}, 1, "adam", 2);
	cr_assert(fabsf(o.m[0] - 0.02f) < 1e-8f, "m = %g", (double)o.m[0]);
	/* 1 - 0.999f is 0.00099998713, not 0.001: allow for it. */
	cr_assert(fabsf(o.v[0] - 0.00031225f) < 1e-8f, "v = %g", (double)o.v[0]);
	cr_assert_eq(o.t, 2);
	optim_free(&o);
}

/* The optim.h formulas in double, applied to the float parameters and
 * gradients the float code sees, for three steps with changing gradients,
 * a changing lr and weight decay. */
enum { NP = 5, NSTEPS = 3 };
static const float p0[NP] = {1.0f, -2.0f, 0.5f, 0.0f, 3.0f};
static const float grads[NSTEPS][NP] = {
	{0.1f, 0.2f, -0.3f, 0.0f, 1.5f},
	{-0.4f, 0.25f, 0.05f, 1e-3f, 1.0f},
	{0.3f, -0.1f, -0.2f, -2.0f, 0.5f},
};
static const float lrs[NSTEPS] = {0.1f, 0.05f, 0.02f};

static void reference_run(const struct optim_config *c, double out[NSTEPS][NP])
{
	double p[NP], m[NP] = {0}, v[NP] = {0};
	for (int i = 0; i < NP; i++)
		p[i] = p0[i];
	for (int s = 0; s < NSTEPS; s++) {
		int t = s + 1;
		double lr = lrs[s];
		for (int i = 0; i < NP; i++) {
			double g = grads[s][i] + (double)c->weight_decay * p[i];
			switch (c->kind) {
			case OPTIM_SGD:
				p[i] -= lr * g;
				break;
			case OPTIM_MOMENTUM:
				m[i] = c->momentum * m[i] + g;
				p[i] -= lr * (c->nesterov ? g + c->momentum * m[i] : m[i]);
				break;
			case OPTIM_ADAM:
				m[i] = c->beta1 * m[i] + (1 - (double)c->beta1) * g;
				v[i] = c->beta2 * v[i] + (1 - (double)c->beta2) * g * g;
				p[i] -= lr * (m[i] / (1 - pow(c->beta1, t)))
					/ (sqrt(v[i] / (1 - pow(c->beta2, t))) + c->eps);
				break;
			}
			out[s][i] = p[i];
		}
	}
}

static void check_against_reference(const struct optim_config *c, const char *what)
{
	double want[NSTEPS][NP];
	reference_run(c, want);
	struct optim o;
	cr_assert_eq(optim_init(&o, c, NP), 0);
	float p[NP];
	memcpy(p, p0, sizeof(p));
	for (int s = 0; s < NSTEPS; s++) {
		optim_step(&o, p, grads[s], lrs[s]);
		assert_close(p, want[s], NP, what, s + 1);
	}
	/* The reference must actually have moved the parameters, or the
	 * comparison says nothing. */
	for (int i = 0; i < NP; i++)
		cr_assert(want[NSTEPS - 1][i] != p0[i], "%s: p[%d] never moved", what, i);
	cr_assert_eq(o.t, NSTEPS);
	optim_free(&o);
}

Test(optim, all_against_double_reference)
{
	check_against_reference(&(struct optim_config){.kind = OPTIM_SGD,
		.weight_decay = 0.05f}, "sgd wd");
	check_against_reference(&(struct optim_config){.kind = OPTIM_MOMENTUM,
		.momentum = 0.9f, .weight_decay = 0.05f}, "momentum wd");
	check_against_reference(&(struct optim_config){.kind = OPTIM_MOMENTUM,
		.momentum = 0.8f, .nesterov = 1, .weight_decay = 0.05f}, "nesterov wd");
	check_against_reference(&(struct optim_config){.kind = OPTIM_ADAM,
		.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f}, "adam");
	check_against_reference(&(struct optim_config){.kind = OPTIM_ADAM,
		.beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-3f, .weight_decay = 0.1f},
		"adam wd");
}

Test(optim, weight_decay_alone_shrinks)
{
	/* Zero gradient: sgd with decay is p *= (1 - lr wd) exactly. */
	struct optim_config cfg = sgd_config(0.5f, 0.1f);
	struct optim o;
	cr_assert_eq(optim_init(&o, &cfg, 2), 0);
	float p[2] = {2.0f, -4.0f};
	optim_step(&o, p, (const float[]){0.0f, 0.0f}, 0.5f);
	cr_assert(fabsf(p[0] - 1.9f) < 1e-6f && fabsf(p[1] + 3.8f) < 1e-6f,
		  "p = %g %g", (double)p[0], (double)p[1]);
	optim_free(&o);
}

Test(optim, shards_match_whole)
{
	/* A ps shard steps its slice alone: the result must be bitwise what
	 * the whole range gives. */
	struct optim_config cfg = {.kind = OPTIM_ADAM, .beta1 = 0.9f, .beta2 = 0.999f,
				   .eps = 1e-8f, .weight_decay = 0.01f};
	for (int kind = OPTIM_SGD; kind <= OPTIM_ADAM; kind++) {
		cfg.kind = kind;
		cfg.momentum = 0.9f;
		struct optim whole, lo, hi;
		cr_assert_eq(optim_init(&whole, &cfg, NP), 0);
		cr_assert_eq(optim_init(&lo, &cfg, 2), 0);
		cr_assert_eq(optim_init(&hi, &cfg, NP - 2), 0);
		float a[NP], b[NP];
		memcpy(a, p0, sizeof(a));
		memcpy(b, p0, sizeof(b));
		for (int s = 0; s < NSTEPS; s++) {
			optim_step(&whole, a, grads[s], lrs[s]);
			optim_step(&lo, b, grads[s], lrs[s]);
			optim_step(&hi, b + 2, grads[s] + 2, lrs[s]);
		}
		cr_assert(memcmp(a, b, sizeof(a)) == 0, "kind %d: shards differ", kind);
		optim_free(&whole);
		optim_free(&lo);
		optim_free(&hi);
	}
}

Test(optim, init_and_free)
{
	struct optim o;
	struct optim_config cfg = {.kind = OPTIM_ADAM};
	cr_assert_eq(optim_init(&o, &cfg, 0), 0);
	cr_assert_eq(o.n, 0);
	optim_free(&o);
	cr_assert_eq(optim_init(&o, &cfg, 1000), 0);
	for (size_t i = 0; i < 1000; i++)
		cr_assert(o.m[i] == 0.0f && o.v[i] == 0.0f);
	optim_free(&o);
	cr_assert(o.m == NULL && o.v == NULL);
	optim_free(&o);   // twice is harmless
	optim_free(NULL);
	struct optim zeroed = {0};
	optim_free(&zeroed);

	cfg.kind = (enum optim_kind)42;
	cr_assert_eq(optim_init(&o, &cfg, 4), -EINVAL);
	optim_free(&o);
}

/* The state each rule needs, one row per case: what is missing is named,
 * what is there (or not needed, or an empty range) passes. */
Test(optim, state_check_names_what_is_missing)
{
	float buf[4];
	static const struct {
		int kind;
		size_t n;
		int has_m, has_v, want;
		const char *text;
	} rows[] = {
		{ OPTIM_SGD, 4, 0, 0, 0, NULL },
		{ OPTIM_MOMENTUM, 4, 1, 0, 0, NULL },
		{ OPTIM_ADAM, 4, 1, 1, 0, NULL },
		{ OPTIM_ADAM, 0, 0, 0, 0, NULL },
		{ OPTIM_MOMENTUM, 4, 0, 0, -EINVAL, "momentum needs its momentum buffer (m) over 4" },
		{ OPTIM_MOMENTUM, 4, 0, 1, -EINVAL, "momentum buffer (m)" },
		{ OPTIM_ADAM, 4, 1, 0, -EINVAL, "adam needs its second moment (v) over 4" },
		{ OPTIM_ADAM, 4, 0, 1, -EINVAL, "adam needs its first moment (m)" },
		{ OPTIM_ADAM, 4, 0, 0, -EINVAL, "first moment (m)" },
		{ 7, 4, 1, 1, -EINVAL, "unknown optimizer kind 7" },
		{ -1, 4, 1, 1, -EINVAL, "unknown optimizer kind -1" },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		char err[160] = "";
		int r = optim_state_check(rows[i].kind, rows[i].n, rows[i].has_m ? buf : NULL,
					  rows[i].has_v ? buf : NULL, err, sizeof(err));
		cr_expect_eq(r, rows[i].want, "row %zu: %d, want %d (%s)", i, r, rows[i].want, err);
		if (rows[i].text)
			cr_expect_not_null(strstr(err, rows[i].text), "row %zu: \"%s\" lacks \"%s\"", i,
					   err, rows[i].text);
		else
			cr_expect_str_empty(err, "row %zu: a message without a failure: %s", i, err);
	}
}

/* ---- learning-rate schedules -------------------------------------------- */

static void assert_lr(const struct optim_config *c, long step, long total, double want)
{
	float got = optim_lr(c, step, total);
	cr_assert(fabs(got - want) <= 1e-6 * fabs(want) + 1e-9,
		  "schedule %d warmup %ld step %ld/%ld: lr %.9g, want %.9g",
		  (int)c->schedule, c->warmup_steps, step, total, (double)got, want);
}

Test(optim, lr_constant_and_warmup)
{
	struct optim_config c = {.lr = 0.1f, .schedule = LR_CONSTANT};
	assert_lr(&c, 0, 100, 0.1);
	assert_lr(&c, 99, 100, 0.1);
	c.warmup_steps = 4;
	assert_lr(&c, 0, 100, 0.025);   // lr / warmup
	assert_lr(&c, 1, 100, 0.05);
	assert_lr(&c, 3, 100, 0.1);     // last warmup step reaches lr
	assert_lr(&c, 4, 100, 0.1);
	assert_lr(&c, 99, 100, 0.1);
	c.warmup_steps = 1;
	assert_lr(&c, 0, 100, 0.1);
}

Test(optim, lr_step)
{
	struct optim_config c = {.lr = 1.0f, .schedule = LR_STEP, .decay_steps = 10,
				 .decay_rate = 0.5f};
	assert_lr(&c, 0, 100, 1.0);
	assert_lr(&c, 9, 100, 1.0);
	assert_lr(&c, 10, 100, 0.5);
	assert_lr(&c, 19, 100, 0.5);
	assert_lr(&c, 25, 100, 0.25);
	assert_lr(&c, 99, 100, 0.001953125);   // 0.5^9
	/* After warmup the decay counts from the end of warmup. */
	c.warmup_steps = 5;
	assert_lr(&c, 0, 100, 0.2);
	assert_lr(&c, 4, 100, 1.0);
	assert_lr(&c, 5, 100, 1.0);
	assert_lr(&c, 14, 100, 1.0);
	assert_lr(&c, 15, 100, 0.5);
	assert_lr(&c, 35, 100, 0.125);
	/* decay_steps <= 0 never decays. */
	c.warmup_steps = 0;
	c.decay_steps = 0;
	assert_lr(&c, 1000, 2000, 1.0);
	c.decay_steps = -3;
	assert_lr(&c, 1000, 2000, 1.0);
}

Test(optim, lr_cosine)
{
	struct optim_config c = {.lr = 1.0f, .schedule = LR_COSINE};
	assert_lr(&c, 0, 100, 1.0);
	assert_lr(&c, 25, 100, 0.8535533905932737);   // (1 + cos(pi/4)) / 2
	assert_lr(&c, 50, 100, 0.5);
	assert_lr(&c, 75, 100, 0.1464466094067262);
	assert_lr(&c, 100, 100, 0.0);
	assert_lr(&c, 150, 100, 0.0);                   // clamped past the end
	c.lr = 0.2f;
	c.warmup_steps = 10;
	assert_lr(&c, 0, 110, 0.02);
	assert_lr(&c, 9, 110, 0.2);
	assert_lr(&c, 10, 110, 0.2);                    // cosine starts here
	assert_lr(&c, 35, 110, 0.2 * 0.8535533905932737);
	assert_lr(&c, 60, 110, 0.1);
	assert_lr(&c, 110, 110, 0.0);
	/* No steps after warmup: keep lr rather than divide by zero. */
	assert_lr(&c, 10, 10, 0.2);
	assert_lr(&c, 12, 5, 0.2);
}
