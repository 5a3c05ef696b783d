/* Training-step throughput of the CPU backend on the Fashion-MNIST MLP
 * (784-512-512-10, momentum SGD), the same work bench/torch_mlp.py times:
 * gather a batch, forward, backward, optimizer step. Random data, so the
 * figure does not depend on the dataset package.
 *
 *   build/bench/cpu_mlp [--model mlp|cnn] [--threads N] [--batch B] [--seconds S] [--csv] [--flow]
 *   build/bench/cpu_mlp --describe    the CPU and the BLAS kernels chosen, one line each
 *
 * The kernels are chosen as pstrain chooses them (core/nn/blas.h), so that
 * the figure is pstrain's on this CPU; --csv adds them as the last field.
 *
 * --model cnn is the Fashion-MNIST CNN of issue 5 (conv 5x5 32 same, relu,
 * maxpool 2, conv 5x5 64 same, relu, maxpool 2, dense 1024, relu, dropout
 * 0.5, dense 10), as bench/torch_mlp.py --model cnn builds it.
 */
#include "../core/nn/backend.h"
#include "../core/nn/blas.h"
#include "../core/config/config.h"
#include "../core/data/data.h"
#include "../core/nn/gradflow.h"
#include "../core/nn/model.h"
#include "../core/nn/optim.h"
#include "../core/progress.h"
#include "../core/nn/replica.h"
#include "../core/nn/rng.h"

#include "models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CPU seconds of this process: on a shared machine, CPU time per step with
 * one thread is steadier than wall time (other processes' load drops out). */
static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int flow_mark(void *ctx, size_t lo, size_t hi)
{
	return gradflow_mark(ctx, lo, hi);
}

static int arg_int(int argc, char **argv, const char *name, int def)
{
	for (int i = 1; i + 1 < argc; i++)
		if (strcmp(argv[i], name) == 0)
			return atoi(argv[i + 1]);
	return def;
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

int main(int argc, char **argv)
{
	struct blas_choice bc;
	char blas[256], cpu[64];
	if (blas_choose(&bc) < 0) {
		blas_describe(&bc, blas, sizeof(blas));
		fprintf(stderr, "cpu_mlp: BLAS self-check failed: %s\n", blas);
		return 1;
	}
	blas_describe(&bc, blas, sizeof(blas));
	cpu_model_name(cpu, sizeof(cpu));
	if (arg_flag(argc, argv, "--describe")) {
		printf("cpu: %s\nblas: %s\n", cpu, blas);
		return 0;
	}
	int threads = arg_int(argc, argv, "--threads", 1);
	int B = arg_int(argc, argv, "--batch", 256);
	double seconds = arg_int(argc, argv, "--seconds", 3);
	int csv = arg_flag(argc, argv, "--csv");
	int flow = arg_flag(argc, argv, "--flow");
	/* A CNN step takes about a second on 2 cores: 3 steps warm it up. */
	int warm = arg_int(argc, argv, "--warmup", strcmp(arg_str(argc, argv, "--model", "mlp"), "cnn") == 0 ? 3 : 20);
	const char *model = arg_str(argc, argv, "--model", "mlp");
	const struct bench_model *bm = bench_model_find(model);
	if (!bm) {
		fprintf(stderr, "cpu_mlp: unknown --model \"%s\" (expected mlp, wide or cnn)\n", model);
		return 2;
	}
	const char *layers = getenv("BENCH_LAYERS");
	char text[1024], err[1024];
	snprintf(text, sizeof(text), "[train]\nbatch_size = %d\nthreads = %d\n[model]\ninput = %s\n%s", B, threads,
		 bm->input, layers ? layers : bm->layers);
	struct config c;
	struct model m;
	if (config_parse_string(&c, "bench", text, err, sizeof(err)) || model_build(&m, &c.model, err, sizeof(err))) {
		fprintf(stderr, "cpu_mlp: %s\n", err);
		return 2;
	}
	/* 8192 random samples: larger than the caches, like a real dataset. */
	struct dataset ds = { 0 };
	ds.n = 8192;
	ds.d = (size_t)m.inputs;
	ds.classes = m.outputs;
	ds.x = malloc(ds.n * ds.d * sizeof(float));
	ds.y = malloc(ds.n * sizeof(int32_t));
	uint32_t *perm = malloc(ds.n * sizeof(uint32_t));
	float *xb = malloc((size_t)B * ds.d * sizeof(float));
	int32_t *yb = malloc((size_t)B * sizeof(int32_t));
	float *params = malloc(m.nparams * sizeof(float));
	float *grads = malloc(m.nparams * sizeof(float));
	for (size_t i = 0; i < ds.n * ds.d; i++)
		ds.x[i] = (float)rng_uniform(1, RNG_DATA, i);
	for (size_t i = 0; i < ds.n; i++)
		ds.y[i] = (int32_t)(rng_hash(1, RNG_DATA + 1, i) % (uint64_t)m.outputs);
	data_permute(perm, ds.n, 1, 0);
	model_init_params(&m, params, 0, m.nparams, 1);
	memset(grads, 0, m.nparams * sizeof(float));

	struct backend be;
	struct replica r;
	struct optim opt;
	backend_cpu(&be, threads);
	if (replica_init(&r, &m, &be, B, err, sizeof(err)) || optim_init(&opt, &c.train.optim, m.nparams)) {
		fprintf(stderr, "cpu_mlp: %s\n", err);
		return 1;
	}
	/* --flow: the backward split as a worker pushing while it computes
	 * runs it (replica_train_flow, two streams: two ps), without links. */
	struct gradflow fl;
	size_t half = m.nparams / 2, fb[2] = { 0, half }, fe[2] = { half, m.nparams };
	double lr;
	if (flow && (replica_flow_init(&r) || gradflow_init(&fl, m.nparams, 2, fb, fe, 1 << 16))) {
		fprintf(stderr, "cpu_mlp: --flow: cannot set up\n");
		return 1;
	}
	size_t per_epoch = ds.n / (size_t)B;
	long steps = 0;
	double t0 = 0, c0 = 0, loss = 0;
	for (long s = 0;; s++) {
		if (s == warm) {   /* warm-up: page faults, thread pool start, caches */
			t0 = progress_now();
			c0 = cpu_now();
		}
		if (s > warm && progress_now() - t0 >= seconds) {
			steps = s - warm;
			break;
		}
		int right;
		dataset_gather(&ds, perm + (size_t)s % per_epoch * (size_t)B, (size_t)B, xb, yb);
		replica_load(&r, xb, yb, B);
		if (flow) {
			gradflow_reset(&fl);
			replica_train_flow(&r, params, grads, r.x, r.y, B, replica_key(1, s, 0), 1.0f / (float)B,
					   &fl, flow_mark, &fl);
			replica_meter(&r, &loss, &lr);
		} else {
			replica_forward(&r, params, B, 1, replica_key(1, s, 0), &loss, &right);
			replica_backward(&r, params, grads, B, 1.0f / (float)B);
		}
		optim_step_zero(&opt, params, grads, c.train.optim.lr);
	}
	double dt = progress_now() - t0, dc = cpu_now() - c0;
	double sps = (double)steps * B / dt;
	if (csv)
		printf("pstrain,cpu,%s,%d,%d,%.0f,%s\n", model, B, threads, sps, bc.core);
	else
		printf("pstrain cpu %s: batch %d, %d thread%s: %.0f samples/s (%.2f ms/step, %.2f CPU ms/step, %ld steps, last loss %.3f)\n"
		       "on %s; %s\n",
		       model, B, threads, threads == 1 ? "" : "s", sps, 1e3 * dt / (double)steps,
		       1e3 * dc / (double)steps, steps, loss / B, cpu, blas);
	if (flow)
		gradflow_free(&fl);
	replica_free(&r);
	optim_free(&opt);
	free(ds.x);
	free(ds.y);
	free(perm);
	free(xb);
	free(yb);
	free(params);
	free(grads);
	return 0;
}
