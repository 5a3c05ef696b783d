/* The local training loop: load data, build the model, initialize the flat
 * parameter vector, then for each step gather a shuffled batch, run forward
 * and backward on the devices (core/devices.c), and apply the optimizer. */
#include "train.h"

#include "backend.h"
#include "checkpoint.h"
#include "data.h"
#include "devices.h"
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
	return train_run(c, NULL, out, tty, stop, res, err, errlen);
}

/* Saves the whole run as checkpoint `step`, one shard over all of P, from
 * the devices' state through the host copies params and opt. */
static int save(const struct config *c, const struct train_ckpt *ck, const struct ckpt_layout *lay,
		struct devices *dev, float *params, struct optim *opt, long step, FILE *out,
		char *err, size_t errlen)
{
	int e = devices_get_params(dev, params, err, errlen);
	if (!e)
		e = devices_get_optim(dev, opt, err, errlen);
	if (e)
		return e;
	struct ckpt_state st = { params, opt->m, opt->v, opt->t };
	return checkpoint_save(ck->dir, lay, step, &st, c->train.keep_checkpoints, out, err, errlen);
}

/* The training and test sets of c, checked against the model m. A file
 * that is missing, unreadable, a directory, malformed or absurdly large is
 * the user's input to fix (-EINVAL, exit 2); only running out of memory or
 * a failing disk is a runtime failure. */
static int load_data(const struct config *c, const struct model *m, struct dataset *train,
		     struct dataset *test, char *err, size_t errlen)
{
	int e = data_load(train, test, &c->data, c->train.seed, err, errlen);
	if (e)
		return e != -ENOMEM && e != -EIO ? -EINVAL : e;
	return check_fit(c, m, train, test, err, errlen);
}

/* The checkpoint layout of this run in *lay (allocated; the caller
 * frees), and unless ck->fresh the newest usable checkpoint in ck->dir
 * loaded into params and opt, its step in *start (0 when there is none;
 * one past the run's total steps is an error). */
static int resume(const struct config *c, const struct train_ckpt *ck, const struct model *m,
		  struct ckpt_layout **lay, float *params, struct optim *opt, long total, long *start,
		  FILE *out, char *err, size_t errlen)
{
	*lay = malloc(sizeof(**lay));
	if (!*lay) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	int e = ckpt_layout_init(*lay, m, 1, c, err, errlen);
	if (e || ck->fresh)
		return e;
	long t = 0;
	e = checkpoint_restore(ck->dir, *lay, 1, 0, m->nparams, params, opt->m, opt->v, &t, start, out,
			       err, errlen);
	if (e == -ENOENT) {
		*start = 0;
		return 0;
	}
	if (e)
		return e;
	char sd[CKPT_PATH_MAX];
	checkpoint_step_dir(sd, sizeof(sd), ck->dir, *start);
	if (*start > total) {
		snprintf(err, errlen, "%s is beyond this run's %ld steps; raise [train] steps or epochs, or use --fresh",
			 sd, total);
		return -EINVAL;
	}
	opt->t = t;
	fprintf(out, "resuming from %s\n", sd);
	return 0;
}

/* Epoch's permutation of the n training samples onto the devices. */
static int epoch_order(struct devices *dev, uint32_t *perm, size_t n, uint64_t seed, long epoch,
		       char *err, size_t errlen)
{
	data_permute(perm, n, seed, (uint64_t)epoch);
	return devices_set_order(dev, perm, n, err, errlen);
}

int train_run(const struct config *c, const struct train_ckpt *ck, FILE *out, int tty,
	      const volatile sig_atomic_t *stop, struct train_result *res, char *err, size_t errlen)
{
	struct ckpt_layout *lay = NULL;
	long start = 0;
	struct dataset train = { 0 }, test = { 0 };
	struct model m;
	struct devices dev = { 0 };
	struct optim opt = { 0 };
	float *params = NULL;
	uint32_t *perm = NULL;
	int e;

	memset(res, 0, sizeof(*res));
	double t0 = progress_now();
	e = model_build(&m, &c->model, err, errlen);
	if (e)
		return e;
	e = load_data(c, &m, &train, &test, err, errlen);
	if (e)
		goto out;

	int B = c->train.batch_size;
	/* The remainder of each shuffled epoch is dropped, so every step has a
	 * full batch and a step means the same thing locally and in a cluster. */
	long spe = (long)(train.n / (size_t)B);
	long total = c->train.steps > 0 ? c->train.steps : c->train.epochs * spe;
	int max_batch = B > EVAL_BATCH ? B : EVAL_BATCH;
	e = devices_open(&dev, c, &m, &c->train.optim, max_batch, "/job:localhost/replica:0/task:0",
			 out, err, errlen);
	if (e)
		goto out;
	/* The host copy of the parameters: initialization, checkpoints and
	 * resume go through it; the step runs on the devices' own copies. */
	params = malloc(m.nparams * sizeof(float));
	perm = malloc(train.n * sizeof(uint32_t));
	if (!params || !perm || optim_init(&opt, &c->train.optim, m.nparams) ||
	    optim_plain_tensors(&opt, &m, 0)) {
		snprintf(err, errlen, "out of memory for %zu parameters", m.nparams);
		e = -ENOMEM;
		goto out;
	}
	model_init_params(&m, params, 0, m.nparams, c->train.seed);
	if (ck && !ck->dir[0])
		ck = NULL;
	if (ck && (e = resume(c, ck, &m, &lay, params, &opt, total, &start, out, err, errlen)))
		goto out;
	int resident = 0;
	e = devices_set_params(&dev, params, err, errlen);
	if (!e)
		e = devices_set_optim(&dev, &opt, err, errlen);
	if (!e)
		e = devices_set_data(&dev, &train, &resident, err, errlen);
	if (e)
		goto out;
	fprintf(out, "training: %zu train / %zu test samples, %zu parameters, batch %d, %ld steps (%ld per epoch), %s%s%s\n",
		train.n, test.n, m.nparams, B, total, spe, dev.be[0].where,
		dev.n > 1 ? " and more replicas" : "",
		dev.gpu ? resident ? ", data on the GPU" : ", data staged from the host" : "");

	struct progress pg;
	progress_init(&pg, out, tty, total, spe);
	long step;
	long epoch_loaded = -1;
	res->start_step = start;
	for (step = start; step < total && !*stop; step++) {
		/* From before the epoch's order is copied: that copy waits for
		 * the steps queued before it, which is training time. */
		double ts = progress_now();
		if (step / spe != epoch_loaded) {
			epoch_loaded = step / spe;
			if ((e = epoch_order(&dev, perm, train.n, c->train.seed, epoch_loaded, err, errlen)))
				goto fail;
		}
		char why[CONFIG_ERR_MAX];
		e = devices_train_step(&dev, (size_t)(step % spe) * (size_t)B, B,
				       replica_key(c->train.seed, step, 0), &opt,
				       optim_lr(&c->train.optim, step, total), why, sizeof(why));
		if (e) {
			progress_clear(&pg);
			snprintf(err, errlen, "step %ld: %s", step, why);
			goto out;
		}
		int last = step + 1 == total;
		int eval_now = c->train.eval_every > 0 ? (step + 1) % c->train.eval_every == 0
						       : (step + 1) % spe == 0;
		int ckpt_now = ck && c->train.checkpoint_every > 0 &&
			       (step + 1) % c->train.checkpoint_every == 0 && !last;
		/* The loss is read only when it is shown, or before an evaluation
		 * or a checkpoint would wait for the GPU anyway: reading waits for
		 * the queued steps, which is training time too. */
		int read = progress_due(&pg, step) || eval_now || ckpt_now || last || *stop;
		double loss = 0;
		long right = 0, n = 0;
		if (read && (e = devices_meter(&dev, &loss, &right, &n, err, errlen)))
			goto fail;
		progress_tick(&pg, step, progress_now() - ts);
		if (read)
			progress_step(&pg, step, n, loss, (double)right);
		if (ckpt_now) {
			progress_clear(&pg);
			if (save(c, ck, lay, &dev, params, &opt, step + 1, out, why, sizeof(why)))
				fprintf(out, "warning: checkpoint at step %ld failed, training goes on: %s\n", step + 1, why);
		}
		if (eval_now && !last) {
			double tl, ta;
			e = devices_evaluate(&dev, &test, &tl, &ta, err, errlen);
			if (e)
				goto fail;
			progress_eval(&pg, step + 1, tl, ta);
		}
	}
	if (ck && step > start) {
		progress_clear(&pg);
		e = save(c, ck, lay, &dev, params, &opt, step, out, err, errlen);
		if (e)
			goto out;
	}
	/* Stopped or finished: always end with a real evaluation. */
	e = devices_evaluate(&dev, &test, &res->test_loss, &res->test_acc, err, errlen);
	if (e)
		goto fail;
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
fail:
	progress_clear(&pg);   /* err says what failed where */
out:
	free(lay);
	optim_free(&opt);
	devices_close(&dev);
	free(params);
	free(perm);
	dataset_free(&train);
	dataset_free(&test);
	return e;
}
