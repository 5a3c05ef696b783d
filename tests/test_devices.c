/* The batch split over replicas and the gradient sum (core/nn/devices.c).
 * Several CPU replicas run here in CI and must give the gradient of one
 * replica with the whole batch; the same check over `devices = 0,0` on a
 * GPU says it was skipped where there is none. */
#include <criterion/criterion.h>

#include "leak.h"

#include "../core/config/config.h"
#include "../core/nn/devices.h"
#include "../core/nn/model.h"
#include "../core/nn/rng.h"
#include "../gpu/gpu.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(devices, .fini = leak_check);

static void small_model(struct model *m)
{
	struct model_spec s = { .in_h = 4, .in_w = 5, .in_c = 1, .nlayers = 4 };
	s.layers[0] = (struct layer_spec){ .kind = LAYER_DENSE, .units = 9 };
	s.layers[1] = (struct layer_spec){ .kind = LAYER_TANH };
	s.layers[2] = (struct layer_spec){ .kind = LAYER_DENSE, .units = 4 };
	s.layers[3] = (struct layer_spec){ .kind = LAYER_DENSE, .units = 3 };
	char err[256];
	cr_assert_eq(model_build(m, &s, err, sizeof(err)), 0, "%s", err);
}

static void batch(const struct model *m, int B, float *x, int32_t *y, uint64_t seed)
{
	for (size_t i = 0; i < (size_t)B * (size_t)m->inputs; i++)
		x[i] = (float)(2.0 * rng_uniform(seed, RNG_DATA, i) - 1.0);
	for (int b = 0; b < B; b++)
		y[b] = (int32_t)(rng_uniform(seed, RNG_DATA + 1, (uint64_t)b) * m->outputs) % m->outputs;
}

/* steps batches of B, batch s from seed + s, one after another in x, y. */
static void batches(const struct model *m, int B, int steps, float *x, int32_t *y, uint64_t seed)
{
	for (int s = 0; s < steps; s++)
		batch(m, B, x + (size_t)s * B * m->inputs, y + s * B, seed + (uint64_t)s);
}

/* Skips the test, saying what was not checked, where no GPU is usable. */
static void gpu_or_skip(const char *what)
{
	int n = 0;
	char why[256];
	if (gpu_count(&n, why, sizeof(why)) < 0) {
		fprintf(stderr, "devices: SKIPPED %s (needs a GPU: %s)\n", what, why);
		cr_skip_test("needs a GPU: %s", why);
	}
}

/* The training set of rows x (n, inputs), y (n) and the order 0..n-1, so
 * that devices_step(d, s * B, B, ...) trains on rows s*B .. s*B+B-1. */
static void data_rows(struct devices *d, struct dataset *ds, uint32_t *order, float *x, int32_t *y,
		      size_t n)
{
	char err[256];
	*ds = (struct dataset){ .x = x, .y = y, .n = n, .d = (size_t)d->m->inputs, .classes = 3 };
	for (size_t i = 0; i < n; i++)
		order[i] = (uint32_t)i;
	cr_assert_eq(devices_set_data(d, ds, NULL, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_set_order(d, order, n, err, sizeof(err)), 0, "%s", err);
}

/* The summed loss of the steps since the last reading. */
static double meter_loss(struct devices *d, long want_samples)
{
	double loss;
	long right, n;
	char err[256];
	cr_assert_eq(devices_meter(d, &loss, &right, &n, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(n, want_samples, "the meter counted %ld samples, want %ld", n, want_samples);
	cr_assert(right >= 0 && right <= n, "%ld right answers of %ld", right, n);
	return loss;
}

/* Gradient (P) and summed loss of one step on d over x (B, inputs), y (B). */
static double grad_of(struct devices *d, int B, float *x, int32_t *y, const float *params,
		      float *grad)
{
	char err[512];
	struct dataset ds;
	uint32_t *order = malloc(sizeof(uint32_t) * (size_t)B);
	data_rows(d, &ds, order, x, y, (size_t)B);
	cr_assert_eq(devices_set_params(d, params, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_step(d, 0, B, 1, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_get_grads(d, grad, err, sizeof(err)), 0, "%s", err);
	free(order);
	return meter_loss(d, B);
}

/* Gradient (P) and summed loss of one step on n CPU replicas. */
static double grad_on(const struct model *m, int n, int B, float *x, int32_t *y,
		      const float *params, float *grad)
{
	struct devices d;
	char err[256];
	cr_assert_eq(devices_open_cpu(&d, m, NULL, n, 1, B, err, sizeof(err)), 0, "%s", err);
	double loss = grad_of(&d, B, x, y, params, grad);
	devices_close(&d);
	return loss;
}

static double max_rel(const float *a, const float *b, size_t n)
{
	double worst = 0, scale = 1e-30;
	for (size_t i = 0; i < n; i++)
		scale = fmax(scale, fabs(b[i]));
	for (size_t i = 0; i < n; i++)
		worst = fmax(worst, fabs((double)a[i] - b[i]));
	return worst / scale;
}

/* Uneven splits (13 over 2, 3 and 5) sum to the whole batch's average. */
Test(devices, replicas_sum_to_the_whole_batch)
{
	struct model m;
	small_model(&m);
	const int B = 13;
	float *x = malloc(sizeof(float) * B * (size_t)m.inputs), *p = malloc(sizeof(float) * m.nparams);
	int32_t y[B];
	float *g1 = malloc(sizeof(float) * m.nparams), *gn = malloc(sizeof(float) * m.nparams);
	batch(&m, B, x, y, 7);
	model_init_params(&m, p, 0, m.nparams, 3);
	double l1 = grad_on(&m, 1, B, x, y, p, g1);
	double norm = 0;
	for (size_t i = 0; i < m.nparams; i++)
		norm += fabs(g1[i]);
	cr_assert_gt(norm, 1e-3, "the reference gradient is zero; the test would prove nothing");
	const int ns[] = { 2, 3, 5 };
	for (size_t k = 0; k < 3; k++) {
		double ln = grad_on(&m, ns[k], B, x, y, p, gn);
		cr_expect_lt(fabs(ln - l1) / l1, 1e-6, "%d replicas: loss %.9g vs %.9g", ns[k], ln, l1);
		cr_expect_lt(max_rel(gn, g1, m.nparams), 1e-6, "%d replicas: gradient differs (rel %.3g)",
			     ns[k], max_rel(gn, g1, m.nparams));
	}
	free(x), free(p), free(g1), free(gn);
}

/* After optimizer steps every replica holds the same parameters, the ones
 * one replica reaches, and the gradients start each step from zero. */
Test(devices, apply_keeps_replicas_in_step)
{
	struct model m;
	small_model(&m);
	const int B = 9, steps = 4;
	float *x = malloc(sizeof(float) * B * steps * (size_t)m.inputs), *p = malloc(sizeof(float) * m.nparams);
	float *a = malloc(sizeof(float) * m.nparams), *b = malloc(sizeof(float) * m.nparams);
	int32_t y[B * steps];
	uint32_t order[B * steps];
	struct dataset ds;
	batches(&m, B, steps, x, y, 100);
	struct optim_config oc = { .kind = OPTIM_MOMENTUM, .lr = 0.1f, .momentum = 0.9f };
	model_init_params(&m, p, 0, m.nparams, 5);
	char err[256];
	float *res[2] = { a, b };
	const int ns[2] = { 1, 3 };
	for (int k = 0; k < 2; k++) {
		struct devices d;
		struct optim o;
		cr_assert_eq(optim_init(&o, &oc, m.nparams), 0);
		cr_assert_eq(devices_open_cpu(&d, &m, &oc, ns[k], 1, B, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(devices_set_params(&d, p, err, sizeof(err)), 0, "%s", err);
		data_rows(&d, &ds, order, x, y, (size_t)B * steps);
		for (int s = 0; s < steps; s++) {
			cr_assert_eq(devices_step(&d, (size_t)s * B, B, 1, err, sizeof(err)), 0, "%s", err);
			cr_assert_eq(devices_apply(&d, &o, oc.lr, err, sizeof(err)), 0, "%s", err);
		}
		for (int r = 1; r < d.n; r++)
			cr_assert_eq(memcmp(d.params[r], d.params[0], sizeof(float) * m.nparams), 0,
				     "replica %d drifted from replica 0", r);
		cr_assert_eq(devices_get_params(&d, res[k], err, sizeof(err)), 0, "%s", err);
		devices_close(&d);
		optim_free(&o);
	}
	cr_expect_lt(max_rel(b, a, m.nparams), 1e-5, "3 replicas end %.3g away from 1",
		     max_rel(b, a, m.nparams));
	cr_expect_neq(memcmp(a, p, sizeof(float) * m.nparams), 0, "the optimizer changed nothing");
	free(x), free(p), free(a), free(b);
}

Test(devices, a_batch_smaller_than_the_replicas_is_refused)
{
	struct model m;
	small_model(&m);
	struct devices d;
	char err[256] = "";
	cr_assert_eq(devices_open_cpu(&d, &m, NULL, 4, 1, 8, err, sizeof(err)), 0, "%s", err);
	float x[3 * 20] = { 0 };
	int32_t y[3] = { 0 };
	uint32_t order[3];
	struct dataset ds;
	data_rows(&d, &ds, order, x, y, 3);
	cr_expect_lt(devices_step(&d, 0, 3, 1, err, sizeof(err)), 0);
	cr_expect_not_null(strstr(err, "4 replicas"), "%s", err);
	devices_close(&d);
}

/* The meter sums every step since it was last read, over every replica,
 * and is empty after a reading. */
Test(devices, meter_sums_steps_until_read)
{
	struct model m;
	small_model(&m);
	const int B = 10;
	float *x = malloc(sizeof(float) * 2 * B * (size_t)m.inputs), *p = malloc(sizeof(float) * m.nparams);
	float *g = malloc(sizeof(float) * m.nparams);
	int32_t y[2 * B];
	uint32_t order[2 * B];
	batch(&m, 2 * B, x, y, 21);
	model_init_params(&m, p, 0, m.nparams, 23);
	double one[2];
	for (int s = 0; s < 2; s++)
		one[s] = grad_on(&m, 1, B, x + (size_t)s * B * m.inputs, y + s * B, p, g);
	struct devices d;
	struct dataset ds;
	char err[256];
	cr_assert_eq(devices_open_cpu(&d, &m, NULL, 3, 1, B, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_set_params(&d, p, err, sizeof(err)), 0, "%s", err);
	data_rows(&d, &ds, order, x, y, 2 * B);
	for (int s = 0; s < 2; s++)
		cr_assert_eq(devices_step(&d, (size_t)s * B, B, 1, err, sizeof(err)), 0, "%s", err);
	double both = meter_loss(&d, 2 * B);
	cr_expect_lt(fabs(both - (one[0] + one[1])) / both, 1e-6, "meter %.9g, steps %.9g + %.9g", both,
		     one[0], one[1]);
	cr_expect_eq(meter_loss(&d, 0), 0.0, "a second reading must find the meter empty");
	devices_close(&d);
	free(x), free(p), free(g);
}

/* A step trains on the rows its order names: a permuted order over the
 * set gives, bit for bit, the step over the rows moved into that order. */
Test(devices, steps_follow_the_order)
{
	struct model m;
	small_model(&m);
	const int n = 12, B = 5, at = 4;
	float *x = malloc(sizeof(float) * n * (size_t)m.inputs), *xs = malloc(sizeof(float) * B * (size_t)m.inputs);
	float *p = malloc(sizeof(float) * m.nparams);
	float *ga = malloc(sizeof(float) * m.nparams), *gb = malloc(sizeof(float) * m.nparams);
	int32_t y[n], ys[B];
	uint32_t order[n], perm[n];
	batch(&m, n, x, y, 31);
	model_init_params(&m, p, 0, m.nparams, 37);
	for (int i = 0; i < n; i++)
		perm[i] = (uint32_t)((i * 7 + 3) % n);
	for (int b = 0; b < B; b++) {
		memcpy(xs + (size_t)b * m.inputs, x + (size_t)perm[at + b] * m.inputs, sizeof(float) * m.inputs);
		ys[b] = y[perm[at + b]];
	}
	struct devices d;
	struct dataset ds;
	char err[256];
	cr_assert_eq(devices_open_cpu(&d, &m, NULL, 2, 1, B, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_set_params(&d, p, err, sizeof(err)), 0, "%s", err);
	data_rows(&d, &ds, order, x, y, n);
	cr_assert_eq(devices_set_order(&d, perm, n, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_step(&d, at, B, 1, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_get_grads(&d, ga, err, sizeof(err)), 0, "%s", err);
	devices_close(&d);
	cr_assert_eq(devices_open_cpu(&d, &m, NULL, 2, 1, B, err, sizeof(err)), 0, "%s", err);
	grad_of(&d, B, xs, ys, p, gb);
	devices_close(&d);
	cr_expect_eq(memcmp(ga, gb, sizeof(float) * m.nparams), 0,
		     "the step over order[%d..%d) is not the step over those rows", at, at + B);
	free(x), free(xs), free(p), free(ga), free(gb);
}

/* Positions past the order, an order of the wrong length and a set of the
 * wrong width are refused with a reason, never read. */
Test(devices, steps_outside_the_order_are_refused)
{
	struct model m;
	small_model(&m);
	float x[6 * 20] = { 0 };
	int32_t y[6] = { 0 };
	uint32_t order[6];
	struct devices d;
	struct dataset ds;
	char err[256] = "";
	cr_assert_eq(devices_open_cpu(&d, &m, NULL, 1, 1, 4, err, sizeof(err)), 0, "%s", err);
	cr_expect_lt(devices_step(&d, 0, 4, 1, err, sizeof(err)), 0, "a step before any order");
	data_rows(&d, &ds, order, x, y, 6);
	cr_expect_lt(devices_step(&d, 3, 4, 1, err, sizeof(err)), 0, "samples 3..7 of 6");
	cr_expect_not_null(strstr(err, "of an order of 6"), "%s", err);
	cr_expect_lt(devices_step(&d, (size_t)-2, 4, 1, err, sizeof(err)), 0, "an offset that wraps");
	cr_expect_eq(devices_step(&d, 2, 4, 1, err, sizeof(err)), 0, "%s", err);
	cr_expect_lt(devices_set_order(&d, order, 5, err, sizeof(err)), 0);
	cr_expect_not_null(strstr(err, "training set of 6"), "%s", err);
	struct dataset wide = ds;
	wide.d = 21;
	cr_expect_lt(devices_set_data(&d, &wide, NULL, err, sizeof(err)), 0);
	cr_expect_not_null(strstr(err, "21 features"), "%s", err);
	devices_close(&d);
}

/* The devices an ini asks for, with state for the optimizer oc that the
 * test then steps (NULL: the ini's own): the devices size their state for
 * it, and the first GPU run's two illegal memory accesses were tests
 * that opened for the default momentum and stepped Adam. */
static int open_from(struct devices *d, const struct model *m, const char *ini,
		     const struct optim_config *oc, char *out, size_t outlen, char *err, size_t errlen)
{
	struct config c;
	cr_assert_eq(config_parse_string(&c, "dev.ini", ini, err, errlen), 0, "%s", err);
	FILE *f = fmemopen(out, outlen, "w");
	cr_assert_not_null(f);
	int r = devices_open(d, &c, m, oc ? oc : &c.train.optim, 16, "/job:localhost/task:0", f, err,
			     errlen);
	fclose(f);
	return r;
}

/* Without a GPU (CI): soft placement trains on one CPU replica and says
 * why; strict placement refuses with the reason. */
Test(devices, placement_without_a_gpu)
{
	int n = 0;
	char why[256];
	if (gpu_count(&n, why, sizeof(why)) == 0)
		cr_skip_test("a GPU is present: the no-GPU placement cannot be checked here");
	struct model m;
	small_model(&m);
	struct devices d;
	char out[2048] = "", err[512] = "";
	cr_assert_eq(open_from(&d, &m, "[gpu]\nsoft_placement = true\nlog_placement = true\n", NULL, out,
			       sizeof(out), err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(d.n, 1);
	cr_expect_eq(d.gpu, 0);
	cr_expect_not_null(strstr(out, "training on the CPU"), "%s", out);
	cr_expect_not_null(strstr(out, "dense1 [20x9] forward -> /job:localhost/task:0/cpu:0"), "%s", out);
	cr_expect_not_null(strstr(out, "optimizer -> /job:localhost/task:0/cpu:0"), "%s", out);
	devices_close(&d);
	cr_expect_lt(open_from(&d, &m, "[gpu]\nsoft_placement = false\n", NULL, out, sizeof(out), err,
			       sizeof(err)), 0);
	cr_expect_not_null(strstr(err, "soft_placement"), "%s", err);
}

/* devices = 0,0 (two replicas on one GPU, through the multi-GPU sum) gives
 * the gradient of devices = 0 with the same batch. */
Test(devices, two_replicas_on_one_gpu_match_one)
{
	gpu_or_skip("the devices = 0,0 check");
	struct model m;
	small_model(&m);
	const int B = 15;
	float *x = malloc(sizeof(float) * B * (size_t)m.inputs), *p = malloc(sizeof(float) * m.nparams);
	float *g[2] = { malloc(sizeof(float) * m.nparams), malloc(sizeof(float) * m.nparams) };
	int32_t y[B];
	double loss[2];
	batch(&m, B, x, y, 11);
	model_init_params(&m, p, 0, m.nparams, 13);
	const char *ini[2] = { "[gpu]\ndevices = 0\nsoft_placement = false\nmemory_fraction = 0.05\n",
			       "[gpu]\ndevices = 0,0\nsoft_placement = false\nmemory_fraction = 0.05\n" };
	for (int k = 0; k < 2; k++) {
		struct devices d;
		char out[1024], err[512];
		cr_assert_eq(open_from(&d, &m, ini[k], NULL, out, sizeof(out), err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(d.n, k + 1);
		cr_assert_eq(d.nbe, k + 1, "each replica has a backend of its own");
		loss[k] = grad_of(&d, B, x, y, p, g[k]);
		devices_close(&d);
	}
	cr_expect_lt(max_rel(g[1], g[0], m.nparams), 1e-5, "0,0 differs from 0 (rel %.3g)",
		     max_rel(g[1], g[0], m.nparams));
	cr_expect_lt(fabs(loss[1] - loss[0]) / loss[0], 1e-5, "0,0 loss %.9g vs %.9g", loss[1], loss[0]);
	free(x), free(p), free(g[0]), free(g[1]);
}

/* Optimizer steps on the GPU (one replica and two on one GPU) end where the
 * CPU ends: parameters, step count and Adam's moments. */
Test(devices, gpu_optimizer_steps_match_the_cpu)
{
	gpu_or_skip("the GPU optimizer check");
	struct model m;
	small_model(&m);
	const int B = 12, steps = 3;
	float *x = malloc(sizeof(float) * B * steps * (size_t)m.inputs), *p = malloc(sizeof(float) * m.nparams);
	int32_t y[B * steps];
	uint32_t order[B * steps];
	struct dataset ds;
	batches(&m, B, steps, x, y, 200);
	struct optim_config oc = { .kind = OPTIM_ADAM, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f,
				   .eps = 1e-8f, .weight_decay = 1e-3f };
	model_init_params(&m, p, 0, m.nparams, 17);
	const char *ini[3] = { NULL, "[gpu]\ndevices = 0\nsoft_placement = false\nmemory_fraction = 0.05\n",
			       "[gpu]\ndevices = 0,0\nsoft_placement = false\nmemory_fraction = 0.05\n" };
	float *res[3], *mom[3], *sec[3];
	long t[3];
	for (int k = 0; k < 3; k++) {
		struct devices d;
		struct optim o;
		char out[1024], err[512];
		cr_assert_eq(optim_init(&o, &oc, m.nparams), 0);
		if (k == 0)
			cr_assert_eq(devices_open_cpu(&d, &m, &oc, 1, 1, B, err, sizeof(err)), 0, "%s", err);
		else
			cr_assert_eq(open_from(&d, &m, ini[k], &oc, out, sizeof(out), err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(devices_set_params(&d, p, err, sizeof(err)), 0, "%s", err);
		data_rows(&d, &ds, order, x, y, (size_t)B * steps);
		for (int s = 0; s < steps; s++) {
			cr_assert_eq(devices_step(&d, (size_t)s * B, B, 1, err, sizeof(err)), 0, "%s", err);
			cr_assert_eq(devices_apply(&d, &o, oc.lr, err, sizeof(err)), 0, "%s", err);
		}
		res[k] = malloc(sizeof(float) * m.nparams);
		cr_assert_eq(devices_get_params(&d, res[k], err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(devices_get_optim(&d, &o, err, sizeof(err)), 0, "%s", err);
		mom[k] = malloc(sizeof(float) * m.nparams);
		sec[k] = malloc(sizeof(float) * m.nparams);
		memcpy(mom[k], o.m, sizeof(float) * m.nparams);
		memcpy(sec[k], o.v, sizeof(float) * m.nparams);
		t[k] = o.t;
		devices_close(&d);
		optim_free(&o);
	}
	for (int k = 1; k < 3; k++) {
		cr_expect_eq(t[k], t[0], "step count %ld vs %ld", t[k], t[0]);
		cr_expect_lt(max_rel(res[k], res[0], m.nparams), 1e-5, "%s: parameters differ (rel %.3g)",
			     ini[k], max_rel(res[k], res[0], m.nparams));
		cr_expect_lt(max_rel(mom[k], mom[0], m.nparams), 1e-5, "%s: first moment differs", ini[k]);
		cr_expect_lt(max_rel(sec[k], sec[0], m.nparams), 1e-5, "%s: second moment differs", ini[k]);
	}
	for (int k = 0; k < 3; k++)
		free(res[k]), free(mom[k]), free(sec[k]);
	free(x), free(p);
}

/* Steps of batch B over `steps` batches of x, y on one GPU with [gpu]
 * cuda_graphs on or off, the batch position, learning rate and (with
 * vary_key) the dropout key changing from step to step: the values a
 * replayed graph reads from device memory. Ends with the parameters in
 * res, the optimizer's last state buffer (Adam's v, momentum's m) in st,
 * and returns the summed loss. */
static double graph_steps(const struct model *m, const struct optim_config *oc, int graphs, int B,
			  int steps, int vary_key, const float *p, float *x, int32_t *y, float *res,
			  float *st)
{
	static const char *const ini[2] = {
		"[gpu]\ndevices = 0\nsoft_placement = false\nmemory_fraction = 0.05\ncuda_graphs = false\n",
		"[gpu]\ndevices = 0\nsoft_placement = false\nmemory_fraction = 0.05\ncuda_graphs = true\n" };
	struct devices d;
	struct optim o;
	struct dataset ds;
	char out[1024], err[512];
	uint32_t *order = malloc(sizeof(uint32_t) * (size_t)B * steps);
	cr_assert_eq(optim_init(&o, oc, m->nparams), 0);
	cr_assert_eq(open_from(&d, m, ini[graphs], oc, out, sizeof(out), err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_set_params(&d, p, err, sizeof(err)), 0, "%s", err);
	data_rows(&d, &ds, order, x, y, (size_t)B * steps);
	for (int s = 0; s < steps; s++) {
		uint64_t key = vary_key ? replica_key(23, s, 0) : 1;
		cr_assert_eq(devices_train_step(&d, (size_t)((s * 5) % steps) * B, B, key, &o,
						0.01f * (float)(s + 1), err, sizeof(err)), 0, "%s", err);
	}
	cr_assert_eq(d.graph_state, graphs, "%s: graph state %d", ini[graphs], d.graph_state);
	double loss = meter_loss(&d, (long)B * steps);
	cr_assert_eq(devices_get_params(&d, res, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_get_optim(&d, &o, err, sizeof(err)), 0, "%s", err);
	memcpy(st, oc->kind == OPTIM_ADAM ? o.v : o.m, sizeof(float) * m->nparams);
	devices_close(&d);
	optim_free(&o);
	free(order);
	return loss;
}

/* graph_steps with graphs off and on agree bit for bit. */
static void graph_matches(const struct model *m, const struct optim_config *oc, int B, int steps,
			  int vary_key, uint64_t seed)
{
	size_t P = m->nparams;
	float *x = malloc(sizeof(float) * B * steps * (size_t)m->inputs), *p = malloc(sizeof(float) * P);
	int32_t *y = malloc(sizeof(int32_t) * (size_t)B * steps);
	float *res[2] = { malloc(sizeof(float) * P), malloc(sizeof(float) * P) };
	float *st[2] = { malloc(sizeof(float) * P), malloc(sizeof(float) * P) };
	double loss[2];
	batches(m, B, steps, x, y, seed);
	model_init_params(m, p, 0, P, seed + 1);
	for (int k = 0; k < 2; k++)
		loss[k] = graph_steps(m, oc, k, B, steps, vary_key, p, x, y, res[k], st[k]);
	cr_expect_eq(memcmp(res[1], res[0], sizeof(float) * P), 0,
		     "graph replay ends on other parameters (rel %.3g)", max_rel(res[1], res[0], P));
	cr_expect_eq(memcmp(st[1], st[0], sizeof(float) * P), 0, "the optimizer's state differs");
	cr_expect_eq(loss[1], loss[0], "loss %.17g with graphs, %.17g without", loss[1], loss[0]);
	for (int k = 0; k < 2; k++)
		free(res[k]), free(st[k]);
	free(x), free(y), free(p);
}

/* A step replayed as a CUDA graph computes what the same step queued
 * kernel by kernel computes, bit for bit: parameters, Adam's moments and
 * the loss, over steps whose learning rate and batch position change (the
 * values the graph reads from device memory). */
Test(devices, gpu_graph_steps_match_kernel_by_kernel)
{
	gpu_or_skip("the CUDA graph check");
	struct model m;
	small_model(&m);
	struct optim_config oc = { .kind = OPTIM_ADAM, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f,
				   .eps = 1e-8f, .weight_decay = 1e-3f };
	graph_matches(&m, &oc, 16, 6, 0, 300);
}

/* A small CNN in the example's layer order (conv, batchnorm, relu,
 * maxpool; dense, relu, dropout, dense), on sizes that are multiples of
 * nothing. */
static void small_cnn(struct model *m)
{
	static const char *const text[] = { "conv 3x3 5 pad=same", "batchnorm", "relu", "maxpool 2",
					    "dense 7", "relu", "dropout 0.5", "dense 3" };
	struct model_spec s = { .in_h = 9, .in_w = 11, .in_c = 2, .nlayers = 8 };
	char err[256];
	for (int i = 0; i < s.nlayers; i++)
		cr_assert_eq(layer_spec_parse(&s.layers[i], text[i], err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(m, &s, err, sizeof(err)), 0, "%s", err);
}

/* The CNN step, dropout included, as one CUDA graph: the replay matches
 * kernel by kernel bit for bit (parameters with batchnorm's running
 * statistics, momentum's buffer, the loss) with a new dropout key every
 * step, which the graph must read from device memory (a key frozen at
 * capture would drop other units from the third step on). */
Test(devices, gpu_cnn_graph_steps_match_kernel_by_kernel)
{
	gpu_or_skip("the CNN's CUDA graph check");
	struct model m;
	small_cnn(&m);
	struct optim_config oc = { .kind = OPTIM_MOMENTUM, .lr = 0.05f, .momentum = 0.9f,
				   .weight_decay = 5e-4f };
	graph_matches(&m, &oc, 13, 6, 1, 400);
}

/* The CNN's step on a GPU (batchnorm, relu and max pooling fused there,
 * the parts one by one on the CPU; the same dropout masks) gives the
 * CPU's gradient, batchnorm's running statistics' slots included, and
 * loss, to float rounding. */
Test(devices, gpu_cnn_step_matches_the_cpu)
{
	gpu_or_skip("the CNN's GPU step against the CPU");
	struct model m;
	small_cnn(&m);
	const int B = 13;
	float *x = malloc(sizeof(float) * B * (size_t)m.inputs), *p = malloc(sizeof(float) * m.nparams);
	float *g[2] = { malloc(sizeof(float) * m.nparams), malloc(sizeof(float) * m.nparams) };
	int32_t y[B];
	double loss[2];
	batch(&m, B, x, y, 500);
	model_init_params(&m, p, 0, m.nparams, 501);
	struct devices d;
	char out[1024], err[512];
	loss[0] = grad_on(&m, 1, B, x, y, p, g[0]);
	cr_assert_eq(open_from(&d, &m, "[gpu]\ndevices = 0\nsoft_placement = false\nmemory_fraction = 0.05\n",
			       NULL, out, sizeof(out), err, sizeof(err)), 0, "%s", err);
	loss[1] = grad_of(&d, B, x, y, p, g[1]);
	devices_close(&d);
	cr_expect_lt(max_rel(g[1], g[0], m.nparams), 1e-4, "GPU gradient differs from the CPU's (rel %.3g)",
		     max_rel(g[1], g[0], m.nparams));
	cr_expect_lt(fabs(loss[1] - loss[0]) / loss[0], 1e-5, "GPU loss %.9g vs CPU %.9g", loss[1], loss[0]);
	free(x), free(p), free(g[0]), free(g[1]);
}

/* Devices opened for one optimizer refuse another, whose state they never
 * sized, with one line naming both, and step nothing; devices opened for
 * none refuse any. Through [gpu] soft placement this runs on the CPU in CI
 * and on the GPU where there is one (where stepping Adam on momentum's
 * state went through NULL); devices_open_cpu refuses the same. */
Test(devices, another_optimizer_is_refused)
{
	struct model m;
	small_model(&m);
	const int B = 6;
	float *x = malloc(sizeof(float) * B * (size_t)m.inputs), *p = malloc(sizeof(float) * m.nparams);
	float *after = malloc(sizeof(float) * m.nparams);
	int32_t y[B];
	uint32_t order[B];
	struct dataset ds;
	batch(&m, B, x, y, 600);
	model_init_params(&m, p, 0, m.nparams, 43);
	struct optim_config mom = { .kind = OPTIM_MOMENTUM, .lr = 0.1f, .momentum = 0.9f };
	struct optim_config adam = { .kind = OPTIM_ADAM, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f,
				     .eps = 1e-8f };
	static const char *const want[3] = { "sized for momentum", "sized for momentum",
					     "opened without an optimizer" };
	for (int k = 0; k < 3; k++) {
		struct devices d;
		struct optim o, right;
		char out[1024], err[512] = "";
		cr_assert_eq(optim_init(&o, &adam, m.nparams), 0);
		cr_assert_eq(optim_init(&right, &mom, m.nparams), 0);
		if (k == 0)
			cr_assert_eq(open_from(&d, &m, "[gpu]\nsoft_placement = true\nmemory_fraction = 0.05\n",
					       &mom, out, sizeof(out), err, sizeof(err)), 0, "%s", err);
		else
			cr_assert_eq(devices_open_cpu(&d, &m, k == 1 ? &mom : NULL, 1, 1, B, err, sizeof(err)), 0,
				     "%s", err);
		cr_assert_eq(devices_set_params(&d, p, err, sizeof(err)), 0, "%s", err);
		data_rows(&d, &ds, order, x, y, B);
		cr_assert_eq(devices_step(&d, 0, B, 1, err, sizeof(err)), 0, "%s", err);
		for (int c = 0; c < 4; c++) {
			err[0] = 0;
			int r = c == 0	 ? devices_apply(&d, &o, 0.01f, err, sizeof(err))
				: c == 1 ? devices_train_step(&d, 0, B, 1, &o, 0.01f, err, sizeof(err))
				: c == 2 ? devices_set_optim(&d, &o, err, sizeof(err))
					 : devices_get_optim(&d, &o, err, sizeof(err));
			cr_expect_eq(r, -EINVAL, "%s, call %d: %d (%s)", d.be[0].where, c, r, err);
			cr_expect_not_null(strstr(err, want[k]), "%s, call %d: \"%s\"", d.be[0].where, c, err);
			cr_expect_not_null(strstr(err, "adam"), "call %d: \"%s\" does not name adam", c, err);
			cr_expect_null(strchr(err, '\n'), "call %d: more than one line: %s", c, err);
		}
		cr_expect_eq(o.t, 0, "a refused optimizer counted %ld steps", o.t);
		cr_assert_eq(devices_get_params(&d, after, err, sizeof(err)), 0, "%s", err);
		cr_expect_eq(memcmp(after, p, sizeof(float) * m.nparams), 0, "%s: a refusal stepped",
			     d.be[0].where);
		/* The refusals leave the devices usable with their own optimizer. */
		int r = devices_apply(&d, &right, 0.1f, err, sizeof(err));
		cr_expect_eq(r, k < 2 ? 0 : -EINVAL, "momentum on devices %d: %d (%s)", k, r, err);
		devices_close(&d);
		optim_free(&o);
		optim_free(&right);
	}
	free(x), free(p), free(after);
}

/* On the CPU the optimizer holds its own state: one whose kind was changed
 * after optim_init, so that its rule needs a buffer it never allocated, is
 * refused before the rule writes through NULL, as the GPU's launcher
 * refuses it (gpu_kernels' optimizer_refuses_missing_state). */
Test(devices, cpu_optimizer_without_its_state_is_refused)
{
	struct model m;
	small_model(&m);
	const int B = 4;
	float *x = malloc(sizeof(float) * B * (size_t)m.inputs), *p = malloc(sizeof(float) * m.nparams);
	int32_t y[B];
	uint32_t order[B];
	struct dataset ds;
	batch(&m, B, x, y, 700);
	model_init_params(&m, p, 0, m.nparams, 47);
	const struct optim_config init[2] = { { .kind = OPTIM_MOMENTUM, .lr = 0.1f, .momentum = 0.9f },
					      { .kind = OPTIM_SGD, .lr = 0.1f } };
	const enum optim_kind as[2] = { OPTIM_ADAM, OPTIM_MOMENTUM };
	const char *want[2] = { "second moment (v)", "momentum buffer (m)" };
	for (int k = 0; k < 2; k++) {
		struct devices d;
		struct optim o;
		struct optim_config oc = init[k];
		oc.kind = as[k];
		char err[512] = "";
		cr_assert_eq(optim_init(&o, &init[k], m.nparams), 0);
		o.cfg.kind = as[k];
		cr_assert_eq(devices_open_cpu(&d, &m, &oc, 1, 1, B, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(devices_set_params(&d, p, err, sizeof(err)), 0, "%s", err);
		data_rows(&d, &ds, order, x, y, B);
		cr_assert_eq(devices_step(&d, 0, B, 1, err, sizeof(err)), 0, "%s", err);
		int r = devices_apply(&d, &o, 0.1f, err, sizeof(err));
		cr_expect_eq(r, -EINVAL, "%s initialised as %s: %d (%s)", optim_kind_name(as[k]),
			     optim_kind_name(init[k].kind), r, err);
		cr_expect_not_null(strstr(err, want[k]), "\"%s\" lacks \"%s\"", err, want[k]);
		cr_expect_eq(o.t, 0, "a refused optimizer counted %ld steps", o.t);
		devices_close(&d);
		optim_free(&o);
	}
	free(x), free(p);
}

/* Without a GPU the whole step is devices_step then devices_apply. */
Test(devices, train_step_is_step_then_apply_on_the_cpu)
{
	struct model m;
	small_model(&m);
	const int B = 8, steps = 3;
	float *x = malloc(sizeof(float) * B * steps * (size_t)m.inputs), *p = malloc(sizeof(float) * m.nparams);
	float *a = malloc(sizeof(float) * m.nparams), *b = malloc(sizeof(float) * m.nparams);
	int32_t y[B * steps];
	uint32_t order[B * steps];
	struct dataset ds;
	batches(&m, B, steps, x, y, 400);
	model_init_params(&m, p, 0, m.nparams, 29);
	struct optim_config oc = { .kind = OPTIM_MOMENTUM, .lr = 0.1f, .momentum = 0.9f };
	for (int k = 0; k < 2; k++) {
		struct devices d;
		struct optim o;
		char err[256];
		cr_assert_eq(optim_init(&o, &oc, m.nparams), 0);
		cr_assert_eq(devices_open_cpu(&d, &m, &oc, 2, 1, B, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(devices_set_params(&d, p, err, sizeof(err)), 0, "%s", err);
		data_rows(&d, &ds, order, x, y, (size_t)B * steps);
		for (int s = 0; s < steps; s++) {
			if (k) {
				cr_assert_eq(devices_train_step(&d, (size_t)s * B, B, 1, &o, 0.1f, err, sizeof(err)), 0,
					     "%s", err);
			} else {
				cr_assert_eq(devices_step(&d, (size_t)s * B, B, 1, err, sizeof(err)), 0, "%s", err);
				cr_assert_eq(devices_apply(&d, &o, 0.1f, err, sizeof(err)), 0, "%s", err);
			}
		}
		cr_assert_eq(devices_get_params(&d, k ? b : a, err, sizeof(err)), 0, "%s", err);
		cr_expect_eq(o.t, steps, "the optimizer counted %ld steps", o.t);
		devices_close(&d);
		optim_free(&o);
	}
	cr_expect_eq(memcmp(a, b, sizeof(float) * m.nparams), 0, "devices_train_step is not step + apply");
	cr_expect_neq(memcmp(a, p, sizeof(float) * m.nparams), 0, "the optimizer changed nothing");
	free(x), free(p), free(a), free(b);
}

/* Batches staged from the host through the two pinned buffers (a set too
 * large for the GPU) train exactly as batches gathered on the GPU: four
 * steps, so each buffer is refilled after its step has read it. */
Test(devices, gpu_staged_batches_match_resident_ones)
{
	gpu_or_skip("the staged-batch check");
	struct model m;
	small_model(&m);
	const int B = 10, steps = 4;
	float *x = malloc(sizeof(float) * B * steps * (size_t)m.inputs), *p = malloc(sizeof(float) * m.nparams);
	int32_t y[B * steps];
	uint32_t order[B * steps];
	struct dataset ds;
	batches(&m, B, steps, x, y, 500);
	model_init_params(&m, p, 0, m.nparams, 41);
	struct optim_config oc = { .kind = OPTIM_MOMENTUM, .lr = 0.1f, .momentum = 0.9f };
	const char *ini = "[gpu]\ndevices = 0\nsoft_placement = false\nmemory_fraction = 0.05\n";
	float *res[2];
	double loss[2];
	for (int k = 0; k < 2; k++) {
		struct devices d;
		struct optim o;
		char out[1024], err[512];
		int resident = -1;
		cr_assert_eq(optim_init(&o, &oc, m.nparams), 0);
		cr_assert_eq(open_from(&d, &m, ini, &oc, out, sizeof(out), err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(devices_set_params(&d, p, err, sizeof(err)), 0, "%s", err);
		d.stage_only = k;
		ds = (struct dataset){ .x = x, .y = y, .n = (size_t)B * steps, .d = (size_t)m.inputs, .classes = 3 };
		for (int i = 0; i < B * steps; i++)
			order[i] = (uint32_t)((i * 7) % (B * steps));
		cr_assert_eq(devices_set_data(&d, &ds, &resident, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(resident, !k, "stage_only %d: resident %d", k, resident);
		cr_assert_eq(devices_set_order(&d, order, ds.n, err, sizeof(err)), 0, "%s", err);
		for (int s = 0; s < steps; s++)
			cr_assert_eq(devices_train_step(&d, (size_t)s * B, B, 1, &o, 0.1f, err, sizeof(err)), 0,
				     "%s", err);
		loss[k] = meter_loss(&d, (long)B * steps);
		res[k] = malloc(sizeof(float) * m.nparams);
		cr_assert_eq(devices_get_params(&d, res[k], err, sizeof(err)), 0, "%s", err);
		devices_close(&d);
		optim_free(&o);
	}
	cr_expect_eq(memcmp(res[1], res[0], sizeof(float) * m.nparams), 0,
		     "staged batches end elsewhere (rel %.3g)", max_rel(res[1], res[0], m.nparams));
	cr_expect_eq(loss[1], loss[0], "loss %.17g staged, %.17g resident", loss[1], loss[0]);
	free(res[0]), free(res[1]), free(x), free(p);
}
