/* Training-step throughput of the CUDA backend, the work bench/torch_mlp.py
 * --device cuda times: forward, backward and the momentum-SGD update over
 * random batches, after a warm-up, timed with CUDA events on the stream.
 * Unlike the PyTorch script, each step also uploads its batch from host
 * memory, as `pstrain local` does. The GEMM-only floor is the same
 * model's three GEMMs per dense layer (forward, input and weight gradient)
 * without bias, activation, loss or optimizer: no step can be faster. (For
 * the cnn it covers the dense layers only, so it is a loose floor there.)
 *
 *   build/bench/gpu_mlp [--model mlp|wide|cnn] [--batch B] [--steps N]
 *                       [--devices LIST] [--tf32] [--csv]
 */
#include "../core/config.h"
#include "../core/devices.h"
#include "../core/model.h"
#include "../core/optim.h"
#include "../core/rng.h"
#include "../gpu/gpu.h"

#include "models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Milliseconds per pass of the GEMMs alone, on replica 0's device. */
static int gemm_floor(struct devices *d, int B, int reps, double *ms)
{
	struct backend *b = &d->be[0];
	const struct model *m = d->m;
	struct replica *r = &d->rep[0];
	int e = gpu_mark(b, 0);
	for (int k = 0; !e && k < reps; k++) {
		const float *in = r->x;
		for (int i = 0; !e && i < m->nlayers; i++) {
			const struct layer *l = &m->layers[i];
			if (l->kind == LAYER_DENSE) {
				const float *w = d->params[0] + l->woff;
				e = b->ops->dense_forward(b->ctx, r->act[i], in, w, NULL, B, l->in, l->out);
				if (!e)
					e = b->ops->dense_backward(b->ctx, i ? r->grad[1] : NULL,
								   d->grads[0] + l->woff, NULL, r->grad[0],
								   in, w, B, l->in, l->out);
			}
			in = r->act[i];   /* a dense layer's input is whatever precedes it */
		}
	}
	if (!e)
		e = gpu_mark(b, 1);
	if (!e)
		e = gpu_marked_ms(b, ms);
	*ms /= reps;
	return e;
}

int main(int argc, char **argv)
{
	const char *model = arg_str(argc, argv, "--model", "mlp");
	int B = atoi(arg_str(argc, argv, "--batch", "256"));
	int steps = atoi(arg_str(argc, argv, "--steps", "200"));
	const char *devs = arg_str(argc, argv, "--devices", "0");
	int csv = arg_flag(argc, argv, "--csv");
	int tf32 = arg_flag(argc, argv, "--tf32");
	const struct bench_model *bm = bench_model_find(model);
	if (!bm || B < 1 || steps < 1) {
		fprintf(stderr, "usage: gpu_mlp [--model mlp|wide|cnn] [--batch B] [--steps N] [--devices LIST] [--tf32] [--csv]\n");
		return 2;
	}
	char text[1024], err[1024];
	snprintf(text, sizeof(text),
		 "[train]\nbatch_size = %d\noptimizer = momentum\nlearning_rate = 0.05\nmomentum = 0.9\n"
		 "[gpu]\ndevices = %s\nsoft_placement = false\ntf32 = %s\n"
		 "[model]\ninput = %s\n%s",
		 B, devs, tf32 ? "true" : "false", bm->input, bm->layers);
	struct config c;
	struct model m;
	if (config_parse_string(&c, "gpu_mlp", text, err, sizeof(err)) ||
	    model_build(&m, &c.model, err, sizeof(err))) {
		fprintf(stderr, "gpu_mlp: %s\n", err);
		return 2;
	}
	struct devices d;
	FILE *quiet = fopen("/dev/null", "w");
	int e = devices_open(&d, &c, &m, &c.train.optim, B, "/job:bench/task:0", quiet, err, sizeof(err));
	fclose(quiet);
	if (e) {
		printf("gpu_mlp: skipped (%s)\n", err);
		return 0;
	}
	/* 16 batches of random data, as the PyTorch script uses. */
	const int nb = 16;
	size_t per = (size_t)B * (size_t)m.inputs;
	int classes = m.outputs;
	float *x = malloc(per * nb * sizeof(float)), *p = malloc(m.nparams * sizeof(float));
	int32_t *y = malloc((size_t)B * nb * sizeof(int32_t));
	struct optim opt;
	if (!x || !p || !y || optim_init(&opt, &c.train.optim, m.nparams)) {
		fprintf(stderr, "gpu_mlp: out of memory\n");
		return 1;
	}
	for (size_t i = 0; i < per * nb; i++)
		x[i] = (float)rng_uniform(1, RNG_DATA, i);
	for (size_t i = 0; i < (size_t)B * nb; i++)
		y[i] = (int32_t)(rng_hash(1, RNG_DATA + 1, i) % (uint64_t)classes);
	model_init_params(&m, p, 0, m.nparams, 1);
	e = devices_set_params(&d, p, err, sizeof(err));

	double loss = 0, ms = 0, floor_ms = 0;
	int right;
	for (int s = 0; !e && s < 20 + steps; s++) {
		if (s == 20)
			e = gpu_mark(&d.be[0], 0);
		int k = s % nb;
		if (!e)
			e = devices_step(&d, x + per * (size_t)k, y + (size_t)B * k, B, (uint64_t)s, &loss,
					 &right, err, sizeof(err));
		if (!e)
			e = devices_apply(&d, &opt, c.train.optim.lr, err, sizeof(err));
	}
	/* Work queued on other devices (the parameter broadcast) belongs to
	 * the timed steps too. */
	for (int k = 1; !e && k < d.nbe; k++)
		e = gpu_sync(&d.be[k]);
	if (!e)
		e = gpu_mark(&d.be[0], 1);
	if (!e)
		e = gpu_marked_ms(&d.be[0], &ms);
	if (!e)
		e = gemm_floor(&d, B / d.n, 20, &floor_ms);
	if (e) {
		fprintf(stderr, "gpu_mlp: %s%s\n", err, *err ? "" : gpu_backend_error(&d.be[0]));
		return 1;
	}
	ms /= steps;
	double sps = B / (ms / 1e3);
	if (csv)
		printf("pstrain,cuda,%s,%d,%.1f,%.4f,%.4f\n", model, B, sps, ms, floor_ms);
	else
		printf("pstrain cuda %s: batch %d on %s: %.0f samples/s, %.3f ms/step, GEMM floor %.3f ms "
		       "(%.0f%% of the step), last loss %.3f\n", model, B, d.be[0].where, sps, ms, floor_ms,
		       100.0 * floor_ms / ms, loss / B);
	optim_free(&opt);
	devices_close(&d);
	free(x), free(p), free(y);
	return 0;
}
