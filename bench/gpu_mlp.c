/* Training-step throughput of the CUDA backend, the work bench/torch_mlp.py
 * --device cuda times: forward, backward and the momentum-SGD update, on a
 * synthetic training set that devices_set_data makes resident on the GPU
 * (as PyTorch's tensors are), batches gathered there in a shuffled order.
 *
 * Timing (docs/BENCHMARKS.md, "GPU training throughput"): steps in a loop
 * for at least --warmup seconds of wall time, then a sync; then --repeats
 * loops of steps, each running until --seconds of wall time have passed,
 * bracketed by CUDA events on replica 0's stream around whole steps
 * (devices_train_step) and synchronized at the end. The host runs
 * ahead of the GPU, so the events see the GPU's throughput including any gap
 * the host leaves. Median and best over the repeats.
 *
 * The GEMM-only floor is the model's GEMMs alone, each as one cuBLAS call
 * over the whole per-replica batch: per dense layer forward, weight gradient
 * and (not for the first layer) input gradient; a conv layer counts as the
 * GEMMs of its im2col form (B*OH*OW rows, C*K*K columns, OC filters), as
 * pstrain computes it. No bias, activation, pooling, batchnorm, loss,
 * optimizer or im2col: no pstrain step can be faster. (cuDNN may use fewer
 * FLOPs than im2col, so PyTorch can beat this floor on convolutions.)
 *
 * The TF32 probe multiplies random (256 x 1024) by (1024 x 256) matrices
 * through the backend's dense_forward and compares with a double reference:
 * a maximum error around 1e-3 of the largest value means TF32 tensor cores,
 * around 1e-6 means fp32 math. It shows the [gpu] tf32 setting took effect.
 *
 *   build/bench/gpu_mlp [--model NAME] [--batch B] [--tf32 on|off] [--graphs on|off] [--devices LIST]
 *                       [--warmup S] [--seconds S] [--repeats N] [--csv] [--cpu]
 *
 * NAME is an entry of bench/models.h. With --csv the last line is
 *   pstrain,cuda,MODEL,B,REPLICAS,BEST,MEDIAN,TF32,pstrain,REPEATS,MS_MEDIAN,FLOOR_MS,DATA,RATES,PROBE
 * (samples/s; DATA is "resident" or "host"; RATES each repeat's samples/s
 * joined by ';'), the line bench/gpu_mlp reads; the lines before it start
 * with '#'. Without a GPU it prints "gpu_mlp: skipped (reason)" and exits 0.
 *
 * --cpu runs the same program on one CPU replica (devices_open_cpu) with
 * wall-clock timing, so that it can be checked on a machine without a GPU;
 * its figures compare with nothing.
 */
#include "../core/config/config.h"
#include "../core/data/data.h"
#include "../core/nn/devices.h"
#include "../core/nn/model.h"
#include "../core/nn/optim.h"
#include "../core/nn/rng.h"
#include "../gpu/gpu.h"

#include "models.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REPEATS_MAX 64
/* The synthetic training set: 16 batches, at most this many bytes of
 * features (at least one batch). bench/torch_mlp.py uses the same rule. */
#define DATA_BATCHES 16
#define DATA_BYTES_MAX ((size_t)256 << 20)

static double wall_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *arg_str(int argc, char **argv, const char *name, const char *def)
{
	for (int i = 1; i + 1 < argc; i++)
		if (strcmp(argv[i], name) == 0)
			return argv[i + 1];
	return def;
}

static int arg_flag(int argc, char **argv, const char *name)
{
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], name) == 0)
			return 1;
	return 0;
}

/* Strict numbers: the whole argument, in range, or usage. */
static int parse_long(const char *s, long lo, long hi, long *v)
{
	char *end;
	errno = 0;
	long x = strtol(s, &end, 10);
	if (errno || end == s || *end || x < lo || x > hi)
		return -1;
	*v = x;
	return 0;
}

static int parse_double(const char *s, double lo, double hi, double *v)
{
	char *end;
	errno = 0;
	double x = strtod(s, &end);
	if (errno || end == s || *end || !(x >= lo && x <= hi))
		return -1;
	*v = x;
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(const double *v, int n)
{
	double s[REPEATS_MAX];
	memcpy(s, v, (size_t)n * sizeof(double));
	qsort(s, (size_t)n, sizeof(double), cmp_double);
	return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* A timed stretch of work on b: CUDA events on its stream, or on the CPU
 * backend (--cpu) the wall clock, its work being done when a call returns. */
struct timer {
	const struct backend *b;
	int gpu;
	double t0;
};

static int timer_start(struct timer *t)
{
	t->t0 = wall_now();
	return t->gpu ? gpu_mark(t->b, 0) : 0;
}

static int timer_stop(struct timer *t, double *ms)
{
	if (!t->gpu) {
		*ms = 1e3 * (wall_now() - t->t0);
		return 0;
	}
	int e = gpu_mark(t->b, 1);
	return e ? e : gpu_marked_ms(t->b, ms);
}

/* Device buffer of n floats from b's arena: random values in [-1, 1) from
 * rng stream index seed, or zeros when seed is 0. */
static int dev_floats(const struct backend *b, float **p, size_t n, uint64_t seed)
{
	int e = b->ops->alloc(b->ctx, (void **)p, n * sizeof(float));
	if (e || !seed)
		return e ? e : b->ops->zero(b->ctx, *p, n * sizeof(float));
	float *h = malloc(n * sizeof(float));
	if (!h)
		return -ENOMEM;
	struct rng r;
	rng_seed(&r, 2, RNG_DATA, seed);
	for (size_t i = 0; i < n; i++)
		h[i] = (float)(2.0 * rng_next_uniform(&r) - 1.0);
	e = b->ops->upload(b->ctx, *p, h, n * sizeof(float));
	free(h);
	return e;
}

/* The TF32 probe (top of file): *rel = max |gpu - ref| / max |ref|. */
static int tf32_probe(const struct backend *b, double *rel)
{
	enum { PB = 256, PC = 1024, POC = 256 };
	float *x = NULL, *w = NULL, *y = NULL;
	float *hx = malloc(sizeof(float) * PB * PC), *hw = malloc(sizeof(float) * POC * PC);
	float *hy = malloc(sizeof(float) * PB * POC);
	int e = !hx || !hw || !hy ? -ENOMEM : 0;
	if (!e)
		e = dev_floats(b, &x, (size_t)PB * PC, 11);
	if (!e)
		e = dev_floats(b, &w, (size_t)POC * PC, 12);
	if (!e)
		e = dev_floats(b, &y, (size_t)PB * POC, 0);
	if (!e)
		e = b->ops->dense_forward(b->ctx, y, x, w, NULL, PB, PC, POC);
	if (!e)
		e = b->ops->download(b->ctx, hx, x, sizeof(float) * PB * PC);
	if (!e)
		e = b->ops->download(b->ctx, hw, w, sizeof(float) * POC * PC);
	if (!e)
		e = b->ops->download(b->ctx, hy, y, sizeof(float) * PB * POC);
	if (!e) {
		/* y (B, OC) = x (B, C) . w (OC, C)^T, as dense_forward. */
		double emax = 0, rmax = 0;
		for (int i = 0; i < PB; i++)
			for (int o = 0; o < POC; o++) {
				double s = 0;
				for (int k = 0; k < PC; k++)
					s += (double)hx[i * PC + k] * (double)hw[o * PC + k];
				emax = fmax(emax, fabs(s - (double)hy[i * POC + o]));
				rmax = fmax(rmax, fabs(s));
			}
		*rel = rmax > 0 ? emax / rmax : 0;
	}
	if (y)
		b->ops->release(b->ctx, y);
	if (w)
		b->ops->release(b->ctx, w);
	if (x)
		b->ops->release(b->ctx, x);
	free(hx), free(hw), free(hy);
	return e;
}

/* The GEMM shapes of layer l at batch B (top of file); 0 if it has none. */
static int gemm_shape(const struct layer *l, int B, size_t *rows, int *C, int *OC)
{
	if (l->kind == LAYER_DENSE) {
		*rows = (size_t)B, *C = l->in, *OC = l->out;
		return 1;
	}
	if (l->kind == LAYER_CONV) {
		*rows = (size_t)B * (size_t)l->OH * (size_t)l->OW;
		*C = l->C * l->win.K * l->win.K, *OC = l->OC;
		return 1;
	}
	return 0;
}

/* One pass of the floor's GEMMs on b; buffers as sized in gemm_floor. */
static int gemm_pass(const struct backend *b, const struct model *m, int B, float *x, float *dx,
		     float *y, float *dy, float *w, float *dw)
{
	int e = 0;
	for (int i = 0; !e && i < m->nlayers; i++) {
		size_t rows;
		int C, OC;
		if (!gemm_shape(&m->layers[i], B, &rows, &C, &OC))
			continue;
		e = b->ops->dense_forward(b->ctx, y, x, w, NULL, (int)rows, C, OC);
		if (!e)   /* the first layer's input gradient would be the data's */
			e = b->ops->dense_backward(b->ctx, i ? dx : NULL, dw, NULL, dy, x, w, (int)rows, C, OC);
	}
	return e;
}

/* Milliseconds per pass of the GEMMs alone on b (best of 3 event-timed
 * loops of at least 0.2 s each, after 0.2 s of warm-up). */
static int gemm_floor(const struct backend *b, int gpu, const struct model *m, int B, double *ms)
{
	size_t in = 0, out = 0, wn = 0;
	for (int i = 0; i < m->nlayers; i++) {
		size_t rows;
		int C, OC;
		if (!gemm_shape(&m->layers[i], B, &rows, &C, &OC))
			continue;
		in = rows * C > in ? rows * C : in;
		out = rows * OC > out ? rows * OC : out;
		wn = (size_t)C * OC > wn ? (size_t)C * OC : wn;
	}
	float *x = NULL, *dx = NULL, *y = NULL, *dy = NULL, *w = NULL, *dw = NULL;
	int e = dev_floats(b, &x, in, 21);
	if (!e)
		e = dev_floats(b, &dx, in, 0);
	if (!e)
		e = dev_floats(b, &y, out, 0);
	if (!e)
		e = dev_floats(b, &dy, out, 22);
	if (!e)
		e = dev_floats(b, &w, wn, 23);
	if (!e)
		e = dev_floats(b, &dw, wn, 0);
	double t0 = wall_now();
	while (!e && wall_now() - t0 < 0.2)
		e = gemm_pass(b, m, B, x, dx, y, dy, w, dw);
	if (!e && gpu)
		e = gpu_sync(b);
	*ms = INFINITY;
	struct timer tm = { b, gpu, 0 };
	for (int r = 0; !e && r < 3; r++) {
		long n = 0;
		double t;
		e = timer_start(&tm);
		for (t0 = wall_now(); !e && (n == 0 || wall_now() - t0 < 0.2); n++)
			e = gemm_pass(b, m, B, x, dx, y, dy, w, dw);
		if (!e)
			e = timer_stop(&tm, &t);
		if (!e && t / (double)n < *ms)
			*ms = t / (double)n;
	}
	float *bufs[] = { dw, w, dy, y, dx, x };
	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		if (bufs[i])
			b->ops->release(b->ctx, bufs[i]);
	return e;
}

/* One timed unit: a training step over the batch at order position at,
 * then the optimizer, as `pstrain local` runs it (a CUDA graph from the
 * second step on where devices_train_step can, unless --graphs off). */
static int step(struct devices *d, struct optim *o, float lr, size_t at, int B, long s, char *err,
		size_t errlen)
{
	return devices_train_step(d, at, B, replica_key(1, s, 0), o, lr, err, errlen);
}

/* Waits for the backends other than replica 0's (their parameter copies
 * belong to the timed steps too); replica 0's stream is waited for by its
 * event. Nothing to wait for on the CPU. */
static int sync_others(const struct devices *d)
{
	int e = 0;
	for (int k = 1; d->gpu && !e && k < d->nbe; k++)
		e = gpu_sync(&d->be[k]);
	return e;
}

static void usage(void)
{
	fprintf(stderr, "usage: gpu_mlp [--model NAME] [--batch B] [--tf32 on|off] [--graphs on|off] [--devices LIST] "
			"[--warmup S] [--seconds S] [--repeats N] [--csv] [--cpu]\n  NAME:");
	for (size_t i = 0; i < sizeof(bench_models) / sizeof(bench_models[0]); i++)
		fprintf(stderr, " %s", bench_models[i].name);
	fprintf(stderr, "\n");
}

int main(int argc, char **argv)
{
	const char *model = arg_str(argc, argv, "--model", "mlp");
	const char *devs = arg_str(argc, argv, "--devices", "0");
	const char *tf32s = arg_str(argc, argv, "--tf32", "off");
	const char *graphss = arg_str(argc, argv, "--graphs", "on");
	int csv = arg_flag(argc, argv, "--csv");
	int cpu = arg_flag(argc, argv, "--cpu");
	long B, repeats;
	double warmup, seconds;
	const struct bench_model *bm = bench_model_find(model);
	int tf32 = strcmp(tf32s, "on") == 0, graphs = strcmp(graphss, "on") == 0;
	if (!bm || parse_long(arg_str(argc, argv, "--batch", "256"), 1, 1 << 20, &B) ||
	    parse_long(arg_str(argc, argv, "--repeats", "3"), 1, REPEATS_MAX, &repeats) ||
	    parse_double(arg_str(argc, argv, "--warmup", "0.5"), 0, 600, &warmup) ||
	    parse_double(arg_str(argc, argv, "--seconds", "0.5"), 0.001, 600, &seconds) ||
	    (!tf32 && strcmp(tf32s, "off") != 0) || (!graphs && strcmp(graphss, "off") != 0)) {
		usage();
		return 2;
	}
	char text[2048], err[1024] = "";
	int len = snprintf(text, sizeof(text),
			   "[train]\nbatch_size = %ld\noptimizer = momentum\nlearning_rate = 0.05\nmomentum = 0.9\n"
			   "[gpu]\ndevices = %s\nsoft_placement = false\ntf32 = %s\ncuda_graphs = %s\n"
			   "[model]\ninput = %s\n%s",
			   B, devs, tf32 ? "true" : "false", graphs ? "true" : "false", bm->input, bm->layers);
	struct config c;
	struct model m;
	if (len < 0 || (size_t)len >= sizeof(text)) {
		fprintf(stderr, "gpu_mlp: config text too long\n");
		return 2;
	}
	if (config_parse_string(&c, "gpu_mlp", text, err, sizeof(err)) ||
	    model_build(&m, &c.model, err, sizeof(err))) {
		fprintf(stderr, "gpu_mlp: %s\n", err);
		return 2;
	}
	struct devices d;
	int e;
	if (cpu) {
		e = devices_open_cpu(&d, &m, &c.train.optim, 1, 1, (int)B, err, sizeof(err));
	} else {
		FILE *quiet = fopen("/dev/null", "w");
		e = devices_open(&d, &c, &m, &c.train.optim, (int)B, "/job:bench/task:0", quiet, err,
				 sizeof(err));
		if (quiet)
			fclose(quiet);
	}
	if (e) {
		printf("gpu_mlp: skipped (%s)\n", err);
		return 0;
	}
	struct gpu_info gi;
	if (!d.gpu)
		snprintf(gi.name, sizeof(gi.name), "the CPU, 1 thread: a check of this program, not a benchmark");
	else if (gpu_query(gpu_backend_device(&d.be[0]), &gi, err, sizeof(err)))
		snprintf(gi.name, sizeof(gi.name), "?");
	struct timer tm = { &d.be[0], d.gpu, 0 };

	/* The synthetic training set (top of file) and its shuffled order. */
	struct dataset ds = { .d = (size_t)m.inputs, .classes = m.outputs };
	size_t cap = DATA_BYTES_MAX / (sizeof(float) * ds.d);
	ds.n = (size_t)B * DATA_BATCHES < cap ? (size_t)B * DATA_BATCHES : cap;
	if (ds.n < (size_t)B)
		ds.n = (size_t)B;
	size_t nb = ds.n / (size_t)B;   /* batches per pass over the order */
	ds.x = malloc(ds.n * ds.d * sizeof(float));
	ds.y = malloc(ds.n * sizeof(int32_t));
	uint32_t *order = malloc(ds.n * sizeof(uint32_t));
	float *p = malloc(m.nparams * sizeof(float));
	struct optim opt;
	if (!ds.x || !ds.y || !order || !p || optim_init(&opt, &c.train.optim, m.nparams)) {
		fprintf(stderr, "gpu_mlp: out of memory\n");
		return 1;
	}
	struct rng r;
	rng_seed(&r, 1, RNG_DATA, 0);
	for (size_t i = 0; i < ds.n * ds.d; i++)
		ds.x[i] = (float)rng_next_uniform(&r);
	for (size_t i = 0; i < ds.n; i++)
		ds.y[i] = (int32_t)rng_below(&r, (uint64_t)ds.classes);
	data_permute(order, ds.n, 1, 0);
	model_init_params(&m, p, 0, m.nparams, 1);

	int resident = 0;
	double probe = -1, floor_ms = 0, ms[REPEATS_MAX], rate[REPEATS_MAX], loss = 0;
	long nsteps[REPEATS_MAX], warm_steps = 0, s = 0;
	e = devices_set_params(&d, p, err, sizeof(err));
	if (!e)
		e = devices_set_data(&d, &ds, &resident, err, sizeof(err));
	if (!e)
		e = devices_set_order(&d, order, ds.n, err, sizeof(err));
	if (!e)
		e = tf32_probe(&d.be[0], &probe);

	/* Warm-up: whole steps for at least `warmup` seconds of wall time. */
	double t0 = wall_now(), warm_s = 0;
	while (!e && (warm_steps < 2 || wall_now() - t0 < warmup)) {
		e = step(&d, &opt, c.train.optim.lr, (size_t)(s % (long)nb) * (size_t)B, (int)B, s, err,
			 sizeof(err));
		s++, warm_steps++;
	}
	if (!e)
		e = sync_others(&d);
	if (!e && d.gpu)
		e = gpu_sync(&d.be[0]);
	warm_s = wall_now() - t0;
	double ml;
	long right, samples;
	if (!e)   /* clears the warm-up's sums */
		e = devices_meter(&d, &ml, &right, &samples, err, sizeof(err));

	/* The timed repeats. */
	for (int k = 0; !e && k < repeats; k++) {
		long n = 0;
		e = timer_start(&tm);
		for (t0 = wall_now(); !e && (n == 0 || wall_now() - t0 < seconds); n++, s++)
			e = step(&d, &opt, c.train.optim.lr, (size_t)(s % (long)nb) * (size_t)B, (int)B, s,
				 err, sizeof(err));
		if (!e)
			e = sync_others(&d);
		if (!e)
			e = timer_stop(&tm, &ms[k]);
		if (!e)
			e = devices_meter(&d, &ml, &right, &samples, err, sizeof(err));
		if (!e && samples != n * B) {
			snprintf(err, sizeof(err), "the meter counted %ld samples for %ld steps of %ld", samples,
				 n, B);
			e = -EIO;
		}
		nsteps[k] = n;
		rate[k] = e ? 0 : (double)(n * B) / (ms[k] / 1e3);
		loss = samples ? ml / (double)samples : 0;
	}
	if (!e)
		e = gemm_floor(&d.be[0], d.gpu, &m, (int)B / d.n, &floor_ms);
	if (e) {
		fprintf(stderr, "gpu_mlp: %s%s\n", err, *err ? "" : gpu_backend_error(&d.be[0]));
		return 1;
	}

	double med = median(rate, (int)repeats), best = 0, ms_min = INFINITY;
	for (int k = 0; k < repeats; k++) {
		best = rate[k] > best ? rate[k] : best;
		ms_min = ms[k] < ms_min ? ms[k] : ms_min;
	}
	double step_ms = 1e3 * (double)B / med;
	printf("# pstrain gpu_mlp: model %s (%zu parameters), batch %ld over %d replica(s) on %s (%s)\n",
	       model, m.nparams, B, d.n, d.be[0].where, gi.name);
	printf("# tf32 %s ([gpu] tf32 = %s); probe GEMM max error %.1e of the largest value (%s)\n",
	       tf32 ? "on" : "off", tf32 ? "true" : "false", probe,
	       probe > 3e-5 ? "TF32 math" : "fp32 math");
	printf("# steps: %s\n", d.graph_state == 1 ? "one CUDA graph each (devices_train_step)"
				: d.graph_state < 0 ? "kernel by kernel: the graph's capture failed"
				: graphs && d.gpu ? "kernel by kernel: this model or placement takes no graph"
				: "kernel by kernel");
	printf("# data: %zu synthetic samples, %s; batches gathered in a shuffled order\n", ds.n,
	       !d.gpu ? "in host memory" : resident ? "resident on the GPU"
	       : "NOT resident: gathered on the host and uploaded");
	printf("# warm-up %.2f s (%ld steps); %ld repeats of >= %.2f s timed with %s\n", warm_s,
	       warm_steps, repeats, seconds, d.gpu ? "CUDA events" : "the wall clock");
	for (int k = 0; k < repeats; k++)
		printf("#   repeat %d: %ld steps in %.1f ms: %.0f samples/s\n", k + 1, nsteps[k], ms[k],
		       rate[k]);
	printf("# median %.0f samples/s (%.4f ms/step), best %.0f; shortest repeat %.1f ms\n", med, step_ms,
	       best, ms_min);
	printf("# GEMM-only floor %.4f ms/step (dense and im2col-conv GEMMs of one replica's share) = "
	       "%.0f samples/s; the median runs at %.0f%% of it\n", floor_ms, 1e3 * (double)B / floor_ms,
	       100.0 * floor_ms / step_ms);
	printf("# loss over the last repeat %.4f\n", loss);
	if (csv) {
		printf("pstrain,%s,%s,%ld,%d,%.1f,%.1f,%d,pstrain,%ld,%.5f,%.5f,%s,", d.gpu ? "cuda" : "cpu",
		       model, B, d.n, best, med, tf32, repeats, step_ms, floor_ms,
		       resident ? "resident" : "host");
		for (int k = 0; k < repeats; k++)
			printf("%s%.1f", k ? ";" : "", rate[k]);
		printf(",%.2e\n", probe);
	}
	optim_free(&opt);
	devices_close(&d);
	free(ds.x), free(ds.y), free(order), free(p);
	return 0;
}
