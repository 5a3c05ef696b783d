/* The local training loop: load data, build the model, initialize the flat
 * parameter vector, then for each step gather a shuffled batch, run forward
 * and backward on the replica, and apply the optimizer. */
#include "train.h"

#include "../gpu/gpu.h"
#include "backend.h"
#include "data.h"
#include "model.h"
#include "optim.h"
#include "progress.h"
#include "replica.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Evaluation runs in chunks of max(batch_size, EVAL_BATCH) samples, so the
 * test set never needs buffers of its own size. */
#define EVAL_BATCH 1024

int train_placement(const struct config *c, FILE *out, char *err, size_t errlen)
{
	char why[256];
	int n = 0;
	int r = gpu_count(&n, why, sizeof(why));
	if (r == 0) {
		for (int i = 0; !c->gpu.all && i < c->gpu.ndevices; i++)
			if (c->gpu.devices[i] >= n) {
				snprintf(why, sizeof(why), "[gpu] devices lists gpu:%d but only %d GPU%s visible",
					 c->gpu.devices[i], n, n == 1 ? " is" : "s are");
				r = -ENODEV;
			}
	}
	if (r == 0) {
		/* The CUDA kernels come with the GPU backend; until then a GPU is
		 * found and reported but the step runs on the CPU. */
		snprintf(why, sizeof(why), "%d GPU%s visible, but this build has no CUDA training backend yet",
			 n, n == 1 ? "" : "s");
		r = -ENODEV;
	}
	if (!c->gpu.soft_placement) {
		snprintf(err, errlen, "%s: %s; set [gpu] soft_placement = true to train on the CPU",
			 c->path, why);
		return r;
	}
	fprintf(out, "placement: %s; training on the CPU\n", why);
	return 0;
}


static int check_fit(const struct config *c, const struct model *m, const struct dataset *train,
		     const struct dataset *test, char *err, size_t errlen)
{
	const char *src = c->data.format == DATA_IDX ? c->data.train_images : c->data.train_csv;
	if (train->d != (size_t)m->inputs || test->d != (size_t)m->inputs) {
		snprintf(err, errlen, "%s: samples have %zu features but [model] input = %dx%dx%d has %d",
			 src, train->d != (size_t)m->inputs ? train->d : test->d,
			 c->model.in_h, c->model.in_w, c->model.in_c, m->inputs);
		return -EINVAL;
	}
	int classes = train->classes > test->classes ? train->classes : test->classes;
	if (classes > m->outputs) {
		snprintf(err, errlen, "%s: labels go up to %d but the last layer has %d outputs; make it dense %d",
			 src, classes - 1, m->outputs, classes);
		return -EINVAL;
	}
	if ((size_t)c->train.batch_size > train->n) {
		snprintf(err, errlen, "%s: [train] batch_size %d is larger than the %zu training samples",
			 c->path, c->train.batch_size, train->n);
		return -EINVAL;
	}
	return 0;
}

int train_local(const struct config *c, FILE *out, int tty, const volatile sig_atomic_t *stop,
		struct train_result *res, char *err, size_t errlen)
{
	struct dataset train = { 0 }, test = { 0 };
	struct model m;
	struct replica rep = { 0 };
	struct optim opt = { 0 };
	struct backend be = { 0 };
	float *params = NULL, *grads = NULL, *xb = NULL;
	int32_t *yb = NULL;
	uint32_t *perm = NULL;
	int e;

	memset(res, 0, sizeof(*res));
	double t0 = progress_now();
	e = train_placement(c, out, err, errlen);
	if (e)
		return e;
	e = model_build(&m, &c->model, err, errlen);
	if (e)
		return e;
	e = data_load(&train, &test, &c->data, c->train.seed, err, errlen);
	if (e) {
		/* A file that is missing, unreadable, a directory, malformed or
		 * absurdly large is the user's input to fix (exit 2); only running
		 * out of memory or a failing disk is a runtime failure. */
		if (e != -ENOMEM && e != -EIO)
			e = -EINVAL;
		goto out;
	}
	e = check_fit(c, &m, &train, &test, err, errlen);
	if (e)
		goto out;

	int B = c->train.batch_size;
	/* The remainder of each shuffled epoch is dropped, so every step has a
	 * full batch and a step means the same thing locally and in a cluster. */
	long spe = (long)(train.n / (size_t)B);
	long total = c->train.steps > 0 ? c->train.steps : c->train.epochs * spe;
	backend_cpu(&be, c->train.threads);
	int max_batch = B > EVAL_BATCH ? B : EVAL_BATCH;
	e = replica_init(&rep, &m, &be, max_batch, err, errlen);
	if (e)
		goto out;
	/* Parameters and gradients live in the backend's memory, like the
	 * replica's buffers. The optimizer below runs on host pointers, which
	 * is right only for the CPU backend; the CUDA backend brings its own
	 * optimizer op (see backend.h). */
	if (be.ops->alloc(be.ctx, (void **)&params, m.nparams * sizeof(float)))
		params = NULL;   /* reported with the others below */
	if (be.ops->alloc(be.ctx, (void **)&grads, m.nparams * sizeof(float)))
		grads = NULL;
	xb = malloc((size_t)B * train.d * sizeof(float));
	yb = malloc((size_t)B * sizeof(int32_t));
	perm = malloc(train.n * sizeof(uint32_t));
	if (!params || !grads || !xb || !yb || !perm || optim_init(&opt, &c->train.optim, m.nparams) ||
	    optim_plain_tensors(&opt, &m, 0)) {
		snprintf(err, errlen, "out of memory for %zu parameters", m.nparams);
		e = -ENOMEM;
		goto out;
	}
	model_init_params(&m, params, 0, m.nparams, c->train.seed);
	/* Backward accumulates; optim_step_zero clears the gradients after each
	 * update, so only the first step needs them zeroed here. */
	e = be.ops->zero(be.ctx, grads, m.nparams * sizeof(float));
	if (e) {
		snprintf(err, errlen, "%s: cannot zero the gradients: %s", be.where, strerror(-e));
		goto out;
	}
	fprintf(out, "training: %zu train / %zu test samples, %zu parameters, batch %d, %ld steps (%ld per epoch), %s\n",
		train.n, test.n, m.nparams, B, total, spe, be.where);

	struct progress pg;
	progress_init(&pg, out, tty, total, spe);
	long step;
	long epoch_loaded = -1;
	for (step = 0; step < total && !*stop; step++) {
		long epoch = step / spe;
		if (epoch != epoch_loaded) {
			data_permute(perm, train.n, c->train.seed, (uint64_t)epoch);
			epoch_loaded = epoch;
		}
		double ts = progress_now();
		double loss;
		int right;
		dataset_gather(&train, perm + (size_t)(step % spe) * (size_t)B, (size_t)B, xb, yb);
		e = replica_load(&rep, xb, yb, B);
		if (!e)
			e = replica_forward(&rep, params, B, 1, replica_key(c->train.seed, step, 0), &loss, &right);
		if (!e)
			e = replica_backward(&rep, params, grads, B, 1.0f / (float)B);
		if (e) {
			progress_clear(&pg);
			snprintf(err, errlen, "step %ld on %s: %s", step, be.where, strerror(-e));
			goto out;
		}
		optim_step_zero(&opt, params, grads, optim_lr(&c->train.optim, step, total));
		progress_step(&pg, step, B, progress_now() - ts, loss / B, (double)right / B);

		int last = step + 1 == total;
		int eval_now = c->train.eval_every > 0 ? (step + 1) % c->train.eval_every == 0
						       : (step + 1) % spe == 0;
		if (eval_now && !last) {
			double tl, ta;
			e = replica_evaluate(&rep, params, &test, &tl, &ta);
			if (e)
				goto eval_fail;
			progress_eval(&pg, step + 1, tl, ta);
		}
	}
	/* Stopped or finished: always end with a real evaluation. */
	e = replica_evaluate(&rep, params, &test, &res->test_loss, &res->test_acc);
	if (e)
		goto eval_fail;
	if (!*stop || step == total)
		progress_eval(&pg, step, res->test_loss, res->test_acc);
	progress_clear(&pg);
	res->steps = step;
	res->total_steps = total;
	res->wall = progress_now() - t0;
	res->samples_per_s = pg.train_time > 0 ? (double)pg.samples / pg.train_time : 0;
	res->stopped = step < total;
	e = 0;
	goto out;
eval_fail:
	progress_clear(&pg);
	snprintf(err, errlen, "evaluation on %s: %s", be.where, strerror(-e));
out:
	optim_free(&opt);
	replica_free(&rep);
	if (be.ops) {
		be.ops->release(be.ctx, params);
		be.ops->release(be.ctx, grads);
	}
	free(xb);
	free(yb);
	free(perm);
	dataset_free(&train);
	dataset_free(&test);
	return e;
}
