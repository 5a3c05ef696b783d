/* The QUEUED flow of core/nn/devices_flow.c: a GPU worker's gradient
 * copied down layer by layer as backward makes it and its parameters
 * copied up as they arrive, on the backend's copy queue.
 *
 * In CI the devices are one CPU replica whose backend is given a fake
 * copy queue: the same code path as a GPU's, with copies that behave as
 * late as a GPU's may. A copy down takes its values when it is queued
 * (the kernels queued before it have run) but lands in host memory only
 * when its slot is waited for, the range NaN until then; a copy up takes
 * the host's values when queued but lands in backend memory only at the
 * next join, so a layer that ran before its join would compute with the
 * NaN its parameters were set to. The gradient, the loss and the
 * bookkeeping (which ranges, in what order, each once, marked only once
 * landed) are checked against devices_step bit for bit: the same kernels
 * run. On a GPU (skipped, saying so, without one) the real queue against
 * the synchronous step, bit for bit, for an MLP and a small CNN. */
#include <criterion/criterion.h>

#include "leak.h"

#include "../core/config/config.h"
#include "../core/nn/devices.h"
#include "../core/nn/model.h"
#include "../core/nn/optim.h"
#include "../core/nn/rng.h"
#include "../gpu/gpu.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(devflow, .fini = leak_check);

#define FAKE_SLOTS 64
#define FAKE_UPS 4096

/* The fake queue's state: the backend's ops get the CPU backend's ctx,
 * so the fake keeps its own here (each test runs in its own process). */
struct fake {
	int slots, afters, joins, reused, bad_slot;
	const float *host_base;    /* the host buffer copies down land in */
	size_t poison;             /* a value whose copy down lands as NaN; SIZE_MAX: none */
	struct {
		float *host, *vals;
		size_t n;
		int pending;
	} down[FAKE_SLOTS];
	int order[FAKE_SLOTS * 4]; /* slots in the order queued */
	size_t lo[FAKE_SLOTS * 4], hi[FAKE_SLOTS * 4];
	int ndown, afters_at[FAKE_SLOTS * 4];
	struct {
		float *dst, *vals;
		size_t n;
	} up[FAKE_UPS];
	int nup, nup_done;
	long ups;
	int host_allocs, host_frees;
	/* copy_check: off (no_check: the host checks, as a backend without
	 * it), asked for a slot (check_asked, answered by that slot's next
	 * copy down from what it takes), its answers (found), and how often
	 * each was called. landed_only: the poison lands in host but was
	 * not in what the backend checked; checked_only: the other way. */
	int no_check, landed_only, checked_only;
	int check_asked[FAKE_SLOTS], found[FAKE_SLOTS], check_afters[FAKE_SLOTS];
	const float *check_src[FAKE_SLOTS];
	size_t check_n[FAKE_SLOTS];
	const float *grads_base;   /* the replica's gradient, poison's origin */
	int checks, founds, check_wrong;
};
static struct fake fk;

static int fake_reserve(void *ctx, int slots)
{
	(void)ctx;
	if (slots > FAKE_SLOTS)
		return -ENOMEM;
	fk.slots = slots;
	return 0;
}

static int fake_after(void *ctx)
{
	(void)ctx;
	fk.afters++;
	return 0;
}

static int fake_down(void *ctx, int slot, void *host, const void *src, size_t bytes)
{
	(void)ctx;
	if (slot < 0 || slot >= fk.slots) {
		fk.bad_slot++;
		return -EINVAL;
	}
	size_t n = bytes / sizeof(float), lo = (size_t)((float *)host - fk.host_base);
	fk.reused += fk.down[slot].pending;
	free(fk.down[slot].vals);
	fk.down[slot].vals = malloc(bytes);
	cr_assert_not_null(fk.down[slot].vals);
	memcpy(fk.down[slot].vals, src, bytes);
	if (fk.poison >= lo && fk.poison < lo + n && !fk.checked_only)
		fk.down[slot].vals[fk.poison - lo] = NAN;
	/* The check of this slot was of exactly this range, after the same
	 * copy_after. */
	if (fk.check_asked[slot] && (fk.check_src[slot] != src || fk.check_n[slot] * sizeof(float) != bytes ||
				     fk.check_afters[slot] != fk.afters))
		fk.check_wrong++;
	fk.check_asked[slot] = 0;
	for (size_t i = 0; i < n; i++)
		((float *)host)[i] = NAN;   /* not there until it lands */
	fk.down[slot].host = host;
	fk.down[slot].n = n;
	fk.down[slot].pending = 1;
	fk.order[fk.ndown] = slot;
	fk.lo[fk.ndown] = lo;
	fk.hi[fk.ndown] = lo + n;
	fk.afters_at[fk.ndown] = fk.afters;
	fk.ndown++;
	return 0;
}

static int fake_wait(void *ctx, int slot)
{
	(void)ctx;
	if (slot < 0 || slot >= fk.slots) {
		fk.bad_slot++;
		return -EINVAL;
	}
	/* In order, as a stream runs: a slot landed, all before it have. */
	for (int k = 0; k < fk.ndown; k++) {
		int s = fk.order[k];
		if (fk.down[s].pending) {
			memcpy(fk.down[s].host, fk.down[s].vals, fk.down[s].n * sizeof(float));
			fk.down[s].pending = 0;
		}
		if (s == slot)
			break;
	}
	return 0;
}

/* Between copy_after and copy_down, as the GPU's: the answer is made by
 * the slot's copy down (the values it takes) and read after it landed. */
static int fake_check(void *ctx, int slot, const float *src, size_t n)
{
	(void)ctx;
	if (slot < 0 || slot >= fk.slots) {
		fk.bad_slot++;
		return -EINVAL;
	}
	/* What the backend holds: the poison is in its gradient unless it
	 * only lands in host (landed_only). */
	size_t lo = (size_t)(src - fk.grads_base);
	fk.found[slot] = optim_nonfinite(src, n) < n ||
			 (!fk.landed_only && fk.poison >= lo && fk.poison < lo + n);
	fk.check_asked[slot] = 1;
	fk.check_src[slot] = src;
	fk.check_n[slot] = n;
	fk.check_afters[slot] = fk.afters;
	fk.checks++;
	return 0;
}

static int fake_found(void *ctx, int slot)
{
	(void)ctx;
	if (slot < 0 || slot >= fk.slots || fk.down[slot].pending) {
		fk.bad_slot++;   /* asked before its copy landed */
		return -EINVAL;
	}
	fk.founds++;
	return fk.found[slot];
}

static int fake_up(void *ctx, void *dst, const void *host, size_t bytes)
{
	(void)ctx;
	if (fk.nup == FAKE_UPS)
		return -ENOSPC;
	fk.up[fk.nup].vals = malloc(bytes);
	cr_assert_not_null(fk.up[fk.nup].vals);
	memcpy(fk.up[fk.nup].vals, host, bytes);
	fk.up[fk.nup].dst = dst;
	fk.up[fk.nup].n = bytes / sizeof(float);
	fk.nup++;
	fk.ups++;
	return 0;
}

static int fake_join(void *ctx)
{
	(void)ctx;
	fk.joins++;
	for (; fk.nup_done < fk.nup; fk.nup_done++) {
		memcpy(fk.up[fk.nup_done].dst, fk.up[fk.nup_done].vals, fk.up[fk.nup_done].n * sizeof(float));
		free(fk.up[fk.nup_done].vals);
		fk.up[fk.nup_done].vals = NULL;
	}
	return 0;
}

static int fake_host_alloc(void *ctx, void **p, size_t bytes)
{
	(void)ctx;
	fk.host_allocs++;
	*p = malloc(bytes);
	return *p ? 0 : -ENOMEM;
}

static void fake_host_free(void *ctx, void *p)
{
	(void)ctx;
	fk.host_frees += p != NULL;
	free(p);
}

static void fake_reset_step(void)
{
	fk.ndown = 0;
	fk.afters = 0;
}

static void fake_free(void)
{
	for (int s = 0; s < FAKE_SLOTS; s++)
		free(fk.down[s].vals);
	for (int k = fk.nup_done; k < fk.nup; k++)
		free(fk.up[k].vals);
}

/* Devices of one CPU replica whose backend has the fake queue; ops must
 * outlive them. */
static void open_fake(struct devices *d, const struct model *m, int B, struct backend_ops *ops)
{
	char err[256];
	cr_assert_eq(devices_open_cpu(d, m, NULL, 1, 1, B, err, sizeof(err)), 0, "%s", err);
	*ops = *d->be[0].ops;
	ops->copy_reserve = fake_reserve;
	ops->copy_after = fake_after;
	ops->copy_down = fake_down;
	ops->copy_wait = fake_wait;
	ops->copy_check = fk.no_check ? NULL : fake_check;
	ops->copy_found = fk.no_check ? NULL : fake_found;
	ops->copy_up = fake_up;
	ops->copy_join = fake_join;
	ops->host_alloc = fake_host_alloc;
	ops->host_free = fake_host_free;
	d->be[0].ops = ops;
	d->rep[0].be.ops = ops;
	fk.poison = SIZE_MAX;
}

static void model_of(struct model *m, const char *input, const char *const *layers, int n)
{
	struct model_spec s = { .nlayers = n };
	char err[256];
	cr_assert_eq(sscanf(input, "%dx%dx%d", &s.in_h, &s.in_w, &s.in_c), 3);
	for (int i = 0; i < n; i++)
		cr_assert_eq(layer_spec_parse(&s.layers[i], layers[i], err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(m, &s, err, sizeof(err)), 0, "%s", err);
}

/* An MLP whose first layer (100k values) takes several copies up, and a
 * CNN in the example's order (conv, batchnorm, relu, pool, dense, relu,
 * dropout, dense). */
static void mlp(struct model *m)
{
	static const char *const l[] = { "dense 128", "relu", "dense 32", "tanh", "dropout 0.3", "dense 10" };
	model_of(m, "28x28x1", l, 6);
}

static void cnn(struct model *m)
{
	static const char *const l[] = { "conv 3x3 5 pad=same", "batchnorm", "relu", "maxpool 2",
					 "dense 7", "relu", "dropout 0.5", "dense 3" };
	model_of(m, "9x11x2", l, 8);
}

static int with_params(const struct model *m)
{
	int n = 0;
	for (int i = 0; i < m->nlayers; i++)
		n += m->layers[i].nparams > 0;
	return n;
}

/* B rows of data and the order 0..B-1 on d: the step at 0 trains on them. */
struct rows {
	float *x;
	int32_t *y;
	uint32_t *order;
	struct dataset ds;
};

static void rows_make(struct rows *r, const struct model *m, int B, uint64_t seed)
{
	r->x = malloc(sizeof(float) * (size_t)B * (size_t)m->inputs);
	r->y = malloc(sizeof(int32_t) * (size_t)B);
	r->order = malloc(sizeof(uint32_t) * (size_t)B);
	cr_assert(r->x && r->y && r->order);
	for (size_t i = 0; i < (size_t)B * (size_t)m->inputs; i++)
		r->x[i] = (float)(2.0 * rng_uniform(seed, RNG_DATA, i) - 1.0);
	for (int b = 0; b < B; b++) {
		r->y[b] = (int32_t)(rng_hash(seed, RNG_DATA + 1, (uint64_t)b) % (uint64_t)m->outputs);
		r->order[b] = (uint32_t)b;
	}
	r->ds = (struct dataset){ .x = r->x, .y = r->y, .n = (size_t)B, .d = (size_t)m->inputs,
				  .classes = m->outputs };
}

static void rows_on(struct devices *d, struct rows *r)
{
	char err[256];
	cr_assert_eq(devices_set_data(d, &r->ds, NULL, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_set_order(d, r->order, r->ds.n, err, sizeof(err)), 0, "%s", err);
}

static void rows_free(struct rows *r)
{
	free(r->x);
	free(r->y);
	free(r->order);
}

static double meter(struct devices *d)
{
	double loss;
	long right, n;
	char err[256];
	cr_assert_eq(devices_meter(d, &loss, &right, &n, err, sizeof(err)), 0, "%s", err);
	return loss;
}

/* devices_step's gradient and loss with params p: the reference. */
static double whole_step(struct devices *d, const float *p, int B, uint64_t key, float *g)
{
	char err[256];
	cr_assert_eq(devices_set_params(d, p, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_zero_grads(d, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_step(d, 0, B, key, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_get_grads(d, g, err, sizeof(err)), 0, "%s", err);
	return meter(d);
}

/* Streams of a flow the way a worker has them: nps shards. */
static void flow_of(struct gradflow *f, size_t P, int nps)
{
	size_t b[4], e[4];
	for (int k = 0; k < nps; k++) {
		b[k] = P * (size_t)k / (size_t)nps;
		e[k] = P * (size_t)(k + 1) / (size_t)nps;
	}
	cr_assert_eq(gradflow_init(f, P, nps, b, e, MODEL_MAX_LAYERS + 8), 0);
}

static void bits_equal(const float *a, const float *b, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(memcmp(&a[i], &b[i], sizeof(float)), 0, "%s differs at %zu: %a against %a", what,
			     i, (double)a[i], (double)b[i]);
}

/* Skips the test, saying what was not checked, where no GPU is usable. */
static void gpu_or_skip(const char *what)
{
	int n = 0;
	char why[256];
	if (gpu_count(&n, why, sizeof(why)) < 0) {
		fprintf(stderr, "devflow: SKIPPED %s (needs a GPU: %s)\n", what, why);
		cr_skip_test("needs a GPU: %s", why);
	}
}

static void open_gpu(struct devices *d, const struct model *m, int B)
{
	struct config c;
	char err[512];
	cr_assert_eq(config_parse_string(&c, "gpu.ini", "[gpu]\ndevices = 0\nsoft_placement = false\nmemory_fraction = 0.05\n",
					 err, sizeof(err)), 0, "%s", err);
	FILE *out = fopen("/dev/null", "w");
	cr_assert_not_null(out);
	int e = devices_open(d, &c, m, &c.train.optim, B, "/job:test/task:0", out, err, sizeof(err));
	fclose(out);
	cr_assert_eq(e, 0, "%s", err);
	cr_assert_eq(d->gpu, 1);
}

/* Parameters arriving on nps streams as a worker's links bring them,
 * each stream's range in order, copied from src into dst and marked
 * final in f a piece at a time, and only while the pass waits for a
 * range that has not all come (so that each wait sees a few pieces, not
 * the whole vector, however the threads are scheduled); fail_after > 0:
 * the flow fails once that many values came. */
struct arrive {
	struct gradflow *f;
	const float *src;
	float *dst;
	size_t piece, next[4], fail_after, came;
	int nps;
};

/* The stream whose next piece the pass waiting for [lo, want) needs, or
 * -1 when all of it has come. */
static int arrive_needed(const struct arrive *a, size_t lo, size_t want)
{
	int k = 0;
	while (k < a->nps && a->f->end[k] <= lo)
		k++;
	while (k < a->nps && a->next[k] == a->f->end[k] && a->f->end[k] < want)
		k++;
	return k == a->nps || a->next[k] >= want ? -1 : k;
}

static void *arrive_main(void *arg)
{
	struct arrive *a = arg;
	for (;;) {
		int left = 0;
		for (int j = 0; j < a->nps; j++)
			left |= a->next[j] < a->f->end[j];
		if (!left)
			return NULL;
		pthread_mutex_lock(&a->f->mu);
		size_t lo = a->f->at_lo, want = a->f->at_want;
		pthread_mutex_unlock(&a->f->mu);
		int k = want ? arrive_needed(a, lo, want) : -1;
		if (k < 0) {
			usleep(20);   /* the pass is not waiting, or has what it waits for */
			continue;
		}
		if (a->fail_after && a->came >= a->fail_after) {
			gradflow_fail(a->f);
			return NULL;
		}
		size_t at = a->next[k], hi = at + a->piece < a->f->end[k] ? at + a->piece : a->f->end[k];
		memcpy(a->dst + at, a->src + at, (hi - at) * sizeof(float));
		(void)gradflow_mark(a->f, at, hi);
		a->next[k] = hi;
		a->came += hi - at;
	}
}

static void arrive_start(struct arrive *a, pthread_t *th, struct gradflow *f, const float *src, float *dst,
			 size_t piece, size_t fail_after)
{
	*a = (struct arrive){ .f = f, .src = src, .dst = dst, .piece = piece, .nps = f->nstreams,
			      .fail_after = fail_after };
	for (int k = 0; k < f->nstreams; k++)
		a->next[k] = f->begin[k];
	cr_assert_eq(pthread_create(th, NULL, arrive_main, a), 0);
}

/* A test's two devices over the same rows: a, devices_step's (the
 * reference), and d, the flow's (through the fake queue, or both on a
 * GPU); parameters p, the reference gradient g, and d's host buffers from
 * devices_host_alloc, h for the gradient and q for the parameters. */
struct rig {
	size_t P;
	struct devices a, d;
	struct backend_ops ops;   /* d's, with the fake queue */
	struct rows r;
	float *p, *g, *h, *q;
};

static void rig_open(struct rig *t, const struct model *m, int B, uint64_t seed, int gpu)
{
	char err[512];
	memset(t, 0, sizeof(*t));
	t->P = m->nparams;
	t->p = malloc(t->P * sizeof(float));
	t->g = malloc(t->P * sizeof(float));
	cr_assert(t->p && t->g);
	model_init_params(m, t->p, 0, t->P, seed);
	rows_make(&t->r, m, B, seed + 1);
	if (gpu) {
		open_gpu(&t->a, m, B);
		open_gpu(&t->d, m, B);
	} else {
		cr_assert_eq(devices_open_cpu(&t->a, m, NULL, 1, 1, B, err, sizeof(err)), 0, "%s", err);
		open_fake(&t->d, m, B, &t->ops);
	}
	rows_on(&t->a, &t->r);
	rows_on(&t->d, &t->r);
	cr_assert_eq(devices_flow_init(&t->d), 0);
	cr_assert_eq(t->d.flow, DEVICES_FLOW_QUEUED, "the backend has no copy queue");
	cr_assert(devices_flow_forwards(&t->d));
	cr_assert_eq(devices_host_alloc(&t->d, &t->h, t->P, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_host_alloc(&t->d, &t->q, t->P, err, sizeof(err)), 0, "%s", err);
	fk.host_base = t->h;
	fk.grads_base = t->d.grads[0];
}

static void rig_close(struct rig *t)
{
	devices_host_free(&t->d, t->h);
	devices_host_free(&t->d, t->q);
	devices_close(&t->d);
	devices_close(&t->a);
	fake_free();
	rows_free(&t->r);
	free(t->p);
	free(t->g);
}

/* The forward pass of the batch at 0 on d with parameters src arriving
 * into t->q (NaN first) a piece at a time over two streams; fail_after as
 * arrive's. Returns devices_forward_flow's answer. */
static int arriving_forward(struct rig *t, const float *src, uint64_t key, int B, size_t piece,
			    size_t fail_after, char *err, size_t errlen)
{
	struct gradflow pf;
	struct arrive ar;
	pthread_t th;
	double waited;
	for (size_t i = 0; i < t->P; i++)
		t->q[i] = NAN;
	flow_of(&pf, t->P, 2);
	arrive_start(&ar, &th, &pf, src, t->q, piece, fail_after);
	int e = devices_forward_flow(&t->d, 0, B, key, t->q, &pf, &waited, err, errlen);
	pthread_join(th, NULL);
	gradflow_free(&pf);
	return e;
}

/* d's gradient of the batch at 0 into t->h through the flow (after
 * arriving_forward with forwarded); the flow must end complete. */
static void flowed_step(struct rig *t, uint64_t key, int B, int forwarded)
{
	struct gradflow f;
	char err[512];
	size_t bad;
	flow_of(&f, t->P, 2);
	cr_assert_eq(devices_zero_grads(&t->d, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_step_flow(&t->d, 0, B, key, t->h, &f, forwarded, &bad, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert(gradflow_complete(&f));
	gradflow_free(&f);
}

/* The gradient through the fake queue: devices_step's, bit for bit; one
 * copy down a layer with parameters, the last layer first, each queued
 * after copy_after and covering its layer's range; together [0, P) once;
 * every one landed, marked only after (a range marked before it landed
 * holds NaN, which the step refuses). */
static void gradient_matches(const struct model *m, int B)
{
	struct rig t;
	char err[256], say[400];
	rig_open(&t, m, B, 21, 0);
	uint64_t key = rng_hash(23, RNG_DROPOUT, 1);
	double want = whole_step(&t.a, t.p, B, key, t.g);
	cr_assert_eq(fk.slots, with_params(m), "a slot for each layer with parameters");
	cr_assert_eq(fk.host_allocs, 2, "the host buffers are the backend's (pinned on a GPU)");
	cr_assert_eq(devices_set_params(&t.d, t.p, err, sizeof(err)), 0, "%s", err);
	fake_reset_step();
	flowed_step(&t, key, B, 0);
	bits_equal(t.h, t.g, t.P, "the gradient through the queue");
	cr_assert_eq(meter(&t.d), want, "the loss");
	cr_assert_eq(fk.ndown, with_params(m));
	cr_assert_eq(fk.reused + fk.bad_slot, 0);
	cr_assert_eq(fk.checks, fk.no_check ? 0 : fk.ndown, "%d of %d ranges checked by the backend", fk.checks,
		     fk.ndown);
	cr_assert_eq(fk.founds, fk.checks, "the backend's answers read %d times for %d checks", fk.founds,
		     fk.checks);
	cr_assert_eq(fk.check_wrong, 0, "%d checks were not of their copy's range", fk.check_wrong);
	size_t at = t.P;
	for (int k = 0, i = m->nlayers - 1; k < fk.ndown; k++, i--) {
		while (!m->layers[i].nparams)
			i--;
		cr_assert_eq(fk.afters_at[k], k + 1, "copy %d was not queued after the kernels before it", k);
		cr_assert_eq(fk.lo[k], m->layers[i].woff, "copy %d is not layer %s's", k, m->layers[i].name);
		cr_assert_eq(fk.hi[k], at, "copy %d does not meet the one before it", k);
		cr_assert_eq(fk.down[fk.order[k]].pending, 0, "copy %d never landed", k);
		at = fk.lo[k];
	}
	cr_assert_eq(at, 0, "the copies do not reach the vector's start");
	cr_assert_eq(t.d.fs.steps, 1);
	cr_assert_eq(t.d.fs.ranges, fk.ndown);
	devices_flow_say(&t.d, say, sizeof(say));
	cr_assert_not_null(strstr(say, "1 steps pushed their gradient as backward made it"), "%s", say);
	rig_close(&t);
	cr_assert_eq(fk.host_frees, 2);
}

Test(devflow, queued_gradient_is_devices_steps_bit_for_bit)
{
	struct model m;
	mlp(&m);
	gradient_matches(&m, 7);
	memset(&fk, 0, sizeof(fk));
	cnn(&m);
	gradient_matches(&m, 5);
	memset(&fk, 0, sizeof(fk));
	fk.no_check = 1;   /* a backend that leaves the check to the host */
	mlp(&m);
	gradient_matches(&m, 7);
}

/* The gradient's NaN and infinity check: where the backend checks each
 * range (copy_check), the host reads a range again only when the backend
 * found one, to name it; a backend without it leaves every range to the
 * host. Seen through a NaN that lands in host memory but was not in what
 * the backend checked: accepted with the check (the host did not read
 * it), refused without. A NaN in the gradient itself is refused either
 * way, named by its index. One the backend's check saw but that did not
 * land (a check of the wrong values) goes as it landed, counted and said. */
enum poison_in { IN_BOTH, IN_LANDED, IN_CHECKED };

static int step_with_poison(const struct model *m, int no_check, enum poison_in in, size_t *bad, char *say,
			    size_t saylen)
{
	struct rig t;
	char err[256];
	memset(&fk, 0, sizeof(fk));
	fk.no_check = no_check;
	rig_open(&t, m, 4, 51, 0);
	struct gradflow f;
	flow_of(&f, t.P, 2);
	cr_assert_eq(devices_set_params(&t.d, t.p, err, sizeof(err)), 0, "%s", err);
	fk.poison = m->layers[0].woff + 11;
	fk.landed_only = in == IN_LANDED;
	fk.checked_only = in == IN_CHECKED;
	*bad = SIZE_MAX;
	int e = devices_step_flow(&t.d, 0, 4, 7, t.h, &f, 0, bad, err, sizeof(err));
	cr_assert_eq(fk.bad_slot + fk.check_wrong, 0);
	cr_assert_eq(fk.checks, no_check ? 0 : fk.ndown);
	devices_flow_say(&t.d, say, saylen);
	(void)meter(&t.d);
	gradflow_free(&f);
	rig_close(&t);
	return e;
}

Test(devflow, the_backend_checks_the_gradient_where_it_can)
{
	struct model m;
	mlp(&m);
	size_t bad, want = m.layers[0].woff + 11;
	char say[512];
	cr_assert_eq(step_with_poison(&m, 0, IN_LANDED, &bad, say, sizeof(say)), 0,
		     "a range the backend found clean was read again");
	cr_assert_eq(fk.founds, fk.ndown);
	cr_assert_null(strstr(say, "did not"), "%s", say);
	cr_assert_eq(step_with_poison(&m, 1, IN_LANDED, &bad, say, sizeof(say)), -EDOM,
		     "the host did not check without the backend");
	cr_assert_eq(bad, want);
	cr_assert_eq(step_with_poison(&m, 0, IN_BOTH, &bad, say, sizeof(say)), -EDOM,
		     "a NaN the backend found was let through");
	cr_assert_eq(bad, want);
	cr_assert_eq(step_with_poison(&m, 1, IN_BOTH, &bad, say, sizeof(say)), -EDOM);
	cr_assert_eq(bad, want);
	cr_assert_eq(step_with_poison(&m, 0, IN_CHECKED, &bad, say, sizeof(say)), 0,
		     "what landed was clean");
	cr_assert_not_null(strstr(say, "; 1 ranges the backend's check found a NaN or an infinity in that the host did not"),
			   "%s", say);
}

/* The forward pass on arriving parameters through the fake queue, then
 * its backward: devices_step's gradient and loss bit for bit, although
 * the replica's parameters were NaN and the host's came piece by piece;
 * every value copied up once (big: a layer large enough to go up in
 * several copies). */
static void forward_matches(const struct model *m, int B, size_t piece, int big)
{
	struct rig t;
	char err[256], say[400];
	rig_open(&t, m, B, 31, 0);
	uint64_t key = rng_hash(33, RNG_DROPOUT, 2);
	double want = whole_step(&t.a, t.p, B, key, t.g);
	float *nan = malloc(t.P * sizeof(float));
	for (size_t i = 0; i < t.P; i++)
		nan[i] = NAN;
	cr_assert_eq(devices_set_params(&t.d, nan, err, sizeof(err)), 0, "%s", err);
	free(nan);
	cr_assert_eq(arriving_forward(&t, t.p, key, B, piece, 0, err, sizeof(err)), 0, "%s", err);
	if (big)
		cr_assert_gt(fk.ups, with_params(m), "%ld copies up: the first layer does not go up as it arrives",
			     fk.ups);
	cr_assert_eq(fk.nup_done, fk.nup, "a copy up never joined: a layer did not wait for it");
	cr_assert_geq(fk.joins, with_params(m));
	unsigned char *seen = calloc(t.P, 1);
	for (int k = 0; k < fk.nup; k++)
		for (size_t i = 0; i < fk.up[k].n; i++) {
			size_t at = (size_t)(fk.up[k].dst - t.d.params[0]) + i;
			cr_assert_eq(seen[at], 0, "parameter %zu copied up twice", at);
			seen[at] = 1;
		}
	for (size_t i = 0; i < t.P; i++)
		cr_assert(seen[i], "parameter %zu never copied up", i);
	free(seen);
	flowed_step(&t, key, B, 1);
	bits_equal(t.h, t.g, t.P, "the gradient after the forward pass on arriving parameters");
	cr_assert_eq(meter(&t.d), want, "the loss");
	cr_assert_eq(t.d.fs.forwards, 1);
	cr_assert_eq(t.d.fs.uploads, fk.ups);
	devices_flow_say(&t.d, say, sizeof(say));
	cr_assert_not_null(strstr(say, "1 forward passes took their parameters as they arrived"), "%s", say);
	rig_close(&t);
}

Test(devflow, queued_forward_takes_each_layer_as_its_pieces_arrive)
{
	struct model m;
	mlp(&m);
	forward_matches(&m, 6, 5000, 1);
	memset(&fk, 0, sizeof(fk));
	cnn(&m);
	forward_matches(&m, 5, 40, 0);
}

/* What the flow must not push or wait for: a NaN in the gradient ends
 * the step with its index, the flow failed and every copy landed; a flow
 * of parameters that fails ends the forward pass with a line and leaves
 * no copy up to land later, so that devices_set_params and a whole step
 * after it are devices_step's again; a backward with no forward pass to
 * go on from is refused. */
Test(devflow, queued_flow_refuses_what_it_cannot_push)
{
	struct model m;
	mlp(&m);
	const int B = 4;
	struct rig t;
	char err[256];
	size_t bad, have;
	rig_open(&t, &m, B, 41, 0);
	float *g2 = malloc(t.P * sizeof(float));
	double want = whole_step(&t.a, t.p, B, 7, t.g);
	struct gradflow f;
	flow_of(&f, t.P, 2);
	cr_assert_eq(devices_set_params(&t.d, t.p, err, sizeof(err)), 0, "%s", err);
	fk.poison = m.layers[2].woff + 3;   /* in the second dense layer */
	int e = devices_step_flow(&t.d, 0, B, 7, t.h, &f, 0, &bad, err, sizeof(err));
	cr_assert_eq(e, -EDOM);
	cr_assert_eq(bad, fk.poison);
	cr_assert_eq(gradflow_wait(&f, 0, t.P, &have), -ECANCELED, "the flow was not failed");
	for (int k = 0; k < fk.ndown; k++)
		cr_assert_eq(fk.down[fk.order[k]].pending, 0, "copy %d may still land in host", k);
	fk.poison = SIZE_MAX;
	(void)meter(&t.d);

	/* the parameters stop arriving half-way */
	e = arriving_forward(&t, t.p, 7, B, 3000, t.P * 3 / 4, err, sizeof(err));
	cr_assert_eq(e, -ECANCELED);
	cr_assert_not_null(strstr(err, "did not all arrive"), "%s", err);
	cr_assert_gt(fk.nup, 0, "nothing went up before the failure");
	cr_assert_eq(fk.nup_done, fk.nup, "a copy up of the pass given up may land later");
	cr_assert_eq(t.d.fs.forwards, 0);
	cr_assert_eq(devices_step_flow(&t.d, 0, B, 7, t.h, &f, 1, &bad, err, sizeof(err)), -EINVAL,
		     "a backward without its forward pass");
	cr_assert_not_null(strstr(err, "no forward pass"), "%s", err);
	cr_assert_eq(whole_step(&t.d, t.p, B, 7, g2), want);
	bits_equal(g2, t.g, t.P, "a whole step after the failures");
	gradflow_free(&f);
	free(g2);
	rig_close(&t);
}

/* The CPU backend has no copy queue: its flow is the split backward in
 * host memory as before (HOST), and devices_host_alloc is plain memory. */
/* A forward pass on arriving parameters that no backward follows (the
 * exchange failed and the worker set its parameters again, or it went on
 * another way): its loss is in the training meter, and its samples are
 * counted with it, so the meter's mean is of the samples it says. */
Test(devflow, a_forward_pass_given_up_is_counted)
{
	struct model m;
	mlp(&m);
	struct rig t;
	char err[512];
	const int B = 6;
	rig_open(&t, &m, B, 71, 0);
	uint64_t key = rng_hash(72, RNG_DROPOUT, 1);
	for (int way = 0; way < 3; way++) {
		cr_assert_eq(arriving_forward(&t, t.p, key, B, 5000, 0, err, sizeof(err)), 0, "%s", err);
		if (way == 0)
			cr_assert_eq(devices_set_params(&t.d, t.p, err, sizeof(err)), 0, "%s", err);
		else if (way == 1)
			cr_assert_eq(devices_step(&t.d, 0, B, key, err, sizeof(err)), 0, "%s", err);
		else
			flowed_step(&t, key, B, 0);
		double loss;
		long right, n;
		cr_assert_eq(devices_meter(&t.d, &loss, &right, &n, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(n, way == 0 ? B : 2 * B, "way %d: %ld samples counted for the loss of %d", way, n,
			     way == 0 ? B : 2 * B);
		cr_assert_leq(right, n, "way %d", way);
		cr_assert(loss > 0);
	}
	rig_close(&t);
}

Test(devflow, the_cpu_keeps_its_host_flow)
{
	struct model m;
	mlp(&m);
	struct devices d;
	char err[256];
	float *h;
	cr_assert_eq(devices_open_cpu(&d, &m, NULL, 1, 1, 4, err, sizeof(err)), 0, "%s", err);
	cr_assert_null(d.be[0].ops->copy_down);
	cr_assert_eq(devices_flow_init(&d), 0);
	cr_assert_eq(d.flow, DEVICES_FLOW_HOST);
	cr_assert(devices_flow_forwards(&d));
	cr_assert_eq(devices_host_alloc(&d, &h, m.nparams, err, sizeof(err)), 0, "%s", err);
	devices_host_free(&d, h);
	devices_close(&d);
	cr_assert_eq(devices_open_cpu(&d, &m, NULL, 2, 1, 4, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(devices_flow_init(&d), -EOPNOTSUPP, "two replicas");
	cr_assert_eq(d.flow, DEVICES_FLOW_NONE);
	devices_close(&d);
}

/* ---- on a GPU ------------------------------------------------------------ */

/* The real copy queue against devices_step, bit for bit (the same kernels
 * on the same GPU; only where the parameters and the gradient cross
 * differs): a step whose gradient goes down layer by layer, then steps
 * whose forward pass takes its parameters as they arrive in pinned
 * memory, each with new parameters and a new dropout key. */
static void gpu_matches(const struct model *m, int B)
{
	struct rig t;
	char err[512];
	rig_open(&t, m, B, 52, 1);
	for (int s = 0; s < 4; s++) {
		uint64_t key = rng_hash(53, RNG_DROPOUT, (uint64_t)s);
		model_init_params(m, t.p, 0, t.P, 60 + (uint64_t)s);
		double want = whole_step(&t.a, t.p, B, key, t.g);
		if (s > 0)
			cr_assert_eq(arriving_forward(&t, t.p, key, B, 2000, 0, err, sizeof(err)), 0, "%s", err);
		else
			cr_assert_eq(devices_set_params(&t.d, t.p, err, sizeof(err)), 0, "%s", err);
		flowed_step(&t, key, B, s > 0);
		bits_equal(t.h, t.g, t.P, s > 0 ? "the GPU's gradient after a forward pass on arriving parameters"
						: "the GPU's gradient copied down layer by layer");
		cr_assert_eq(meter(&t.d), want, "step %d: the loss", s);
	}
	cr_assert_eq(t.d.fs.steps, 4);
	cr_assert_eq(t.d.fs.forwards, 3);
	rig_close(&t);
}

Test(devflow, gpu_queued_mlp_matches_the_synchronous_step)
{
	gpu_or_skip("the GPU copy queue against the synchronous step (MLP)");
	struct model m;
	mlp(&m);
	gpu_matches(&m, 37);
}

/* The CNN: batchnorm, relu and pooling fused, conv's kept columns. */
Test(devflow, gpu_queued_cnn_matches_the_synchronous_step)
{
	gpu_or_skip("the GPU copy queue against the synchronous step (CNN)");
	struct model m;
	cnn(&m);
	gpu_matches(&m, 13);
}
