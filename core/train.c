/* The local training loop: load data, build the model, initialize the flat
 * parameter vector, then for each step gather a shuffled batch, run forward
 * and backward on the devices (core/devices.c), and apply the optimizer. */
#include "train.h"
#include "tblog.h"

#include "backend.h"
#include "checkpoint.h"
#include "data.h"
#include "devices.h"
#include "job.h"
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

int train_local(const struct config *c, FILE *out, int tty, const volatile sig_atomic_t *stop,
		struct train_result *res, char *err, size_t errlen)
{
	return train_run(c, NULL, out, tty, stop, res, err, errlen);
}

/* Saves the whole run as checkpoint `step`, one shard over all of P, from
 * the devices' state through the host copies params and opt; acc (may be
 * NULL): the final test accuracy, which the last checkpoint records. */
static int save(const struct config *c, const struct train_ckpt *ck, const struct ckpt_layout *lay,
		struct devices *dev, float *params, struct optim *opt, long step, const double *acc,
		FILE *out, char *err, size_t errlen)
{
	int e = devices_get_params(dev, params, err, errlen);
	if (!e)
		e = devices_get_optim(dev, opt, err, errlen);
	if (e)
		return e;
	struct ckpt_state st = { .params = params, .m = opt->m, .v = opt->v, .t = opt->t, .test_acc = acc };
	return checkpoint_save(ck->dir, lay, step, &st, c->train.keep_checkpoints, out, err, errlen);
}

/* The checkpoint layout of this run in *lay (allocated; the caller
 * frees), and unless ck->fresh the newest usable checkpoint in ck->dir,
 * of any layout or mode, loaded into params and opt: its step in *start
 * (0 when there is none), and in *acc the final test accuracy it
 * recorded (-1: none). */
static int resume(const struct config *c, const struct train_ckpt *ck, const struct model *m,
		  struct ckpt_layout **lay, float *params, struct optim *opt, long *start, double *acc,
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
	struct ckpt_load ld = { .l = *lay, .resume = 1, .begin = 0, .end = m->nparams, .params = params,
				.m = opt->m, .v = opt->v };
	e = checkpoint_restore(ck->dir, &ld, out, err, errlen);
	if (e == -ENOENT)
		return 0;
	if (e)
		return e;
	*start = ld.step;
	*acc = ld.test_acc;
	/* An async cluster's shards count updates apart (ld.t = -1 where
	 * they disagree); here there is one update per step. */
	opt->t = ld.t >= 0 && ld.async != 1 ? ld.t : ld.step;
	return 0;
}

/* A finished run started again (its checkpoint at or past this run's
 * last step): one line, and nothing trained. */
static void say_finished(const struct train_ckpt *ck, long step, long total, double acc, FILE *out)
{
	char sd[CKPT_PATH_MAX], a[32] = "not recorded";
	checkpoint_step_dir(sd, sizeof(sd), ck->dir, step);
	if (acc >= 0)
		snprintf(a, sizeof(a), "%.2f%%", 100 * acc);
	fprintf(out, "run finished: %s is step %ld%s this run's %ld steps (test accuracy %s); to train on, raise [train] steps or epochs; to start over, pass --fresh or set another checkpoint_dir\n",
		sd, step, step == total ? " of" : ", past", total, a);
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
	struct job j;
	struct devices dev = { 0 };
	struct optim opt = { 0 };
	float *params = NULL;
	uint32_t *perm = NULL;
	struct tblog tb = { 0 };
	int e;

	memset(res, 0, sizeof(*res));
	double t0 = progress_now();
	e = job_load(&j, c, 1, 1, err, errlen);
	if (e)
		goto out;

	int B = j.B;
	long spe = j.spe, total = j.total;
	int max_batch = B > EVAL_BATCH ? B : EVAL_BATCH;
	/* The host copy of the parameters: initialization, checkpoints and
	 * resume go through it; the step runs on the devices' own copies. */
	params = malloc(j.m.nparams * sizeof(float));
	perm = malloc(j.train.n * sizeof(uint32_t));
	if (!params || !perm || optim_init(&opt, &c->train.optim, j.m.nparams) ||
	    optim_plain_tensors(&opt, &j.m, 0)) {
		snprintf(err, errlen, "out of memory for %zu parameters", j.m.nparams);
		e = -ENOMEM;
		goto out;
	}
	model_init_params(&j.m, params, 0, j.m.nparams, c->train.seed);
	if (ck && !ck->dir[0])
		ck = NULL;
	double acc = -1;
	e = ck ? resume(c, ck, &j.m, &lay, params, &opt, &start, &acc, out, err, errlen) : 0;
	if (e)
		goto out;
	/* The devices are opened once the checkpoint is read: a finished run
	 * that recorded its accuracy says so and needs none. */
	if (!(ck && start >= total && acc >= 0))
		e = devices_open(&dev, c, &j.m, &c->train.optim, max_batch, "/job:localhost/replica:0/task:0",
				 out, err, errlen);
	if (e)
		goto out;
	if (ck && start >= total) {
		if (acc < 0) {   /* not recorded: the checkpoint of a run with more steps */
			e = devices_set_params(&dev, params, err, errlen);
			if (!e)
				e = devices_evaluate(&dev, &j.test, &res->test_loss, &acc, err, errlen);
			if (e)
				goto out;
		}
		say_finished(ck, start, total, acc, out);
		res->finished = 1;
		res->steps = res->start_step = start;
		res->total_steps = total;
		res->test_acc = acc;
		goto out;
	}
	if (start > 0) {
		char sd[CKPT_PATH_MAX];
		checkpoint_step_dir(sd, sizeof(sd), ck->dir, start);
		fprintf(out, "resuming from %s\n", sd);
	}
	int resident = 0;
	e = devices_set_params(&dev, params, err, errlen);
	if (!e)
		e = devices_set_optim(&dev, &opt, err, errlen);
	if (!e)
		e = devices_set_data(&dev, &j.train, &resident, err, errlen);
	if (e)
		goto out;
	if (ck && ck->intro)
		fprintf(out, "%s\n", ck->intro);
	fprintf(out, "training: %zu train / %zu test samples, %zu parameters, batch %d, %ld steps (%ld per epoch), %s%s%s\n",
		j.train.n, j.test.n, j.m.nparams, B, total, spe, dev.be[0].where,
		dev.n > 1 ? " and more replicas" : "",
		dev.gpu ? resident ? ", data on the GPU" : ", data staged from the host" : "");

	struct progress pg;
	progress_init(&pg, out, tty, total, spe);
	char tbe[CONFIG_ERR_MAX];
	if (tblog_open(&tb, c->train.log_dir, tbe, sizeof(tbe)))
		fprintf(out, "warning: no TensorBoard logs: %s\n", tbe);
	long step;
	long epoch_loaded = -1;
	res->start_step = start;
	for (step = start; step < total && !*stop; step++) {
		/* From before the epoch's order is copied: that copy waits for
		 * the steps queued before it, which is training time. */
		double ts = progress_now();
		if (step / spe != epoch_loaded) {
			epoch_loaded = step / spe;
			if ((e = epoch_order(&dev, perm, j.train.n, c->train.seed, epoch_loaded, err, errlen)))
				goto fail;
		}
		char why[CONFIG_ERR_MAX];
		e = devices_train_step(&dev, job_batch_at(&j, step, 0), B,
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
			if (save(c, ck, lay, &dev, params, &opt, step + 1, NULL, out, why, sizeof(why)))
				fprintf(out, "warning: checkpoint at step %ld failed, training goes on: %s\n", step + 1, why);
		}
		if (eval_now && !last) {
			double tl, ta;
			e = devices_evaluate(&dev, &j.test, &tl, &ta, err, errlen);
			if (e)
				goto fail;
			progress_eval(&pg, step + 1, tl, ta);
			tblog_eval(&tb, step + 1, &pg, optim_lr(&c->train.optim, step, total));
		}
	}
	/* Stopped or finished: always end with a real evaluation, which the
	 * last checkpoint records (a finished run started again says it). */
	e = devices_evaluate(&dev, &j.test, &res->test_loss, &res->test_acc, err, errlen);
	if (e)
		goto fail;
	if (ck && step > start) {
		progress_clear(&pg);
		e = save(c, ck, lay, &dev, params, &opt, step, &res->test_acc, out, err, errlen);
		if (e)
			goto out;
	}
	if (!*stop || step == total) {
		progress_eval(&pg, step, res->test_loss, res->test_acc);
		tblog_eval(&tb, step, &pg, optim_lr(&c->train.optim, step > 0 ? step - 1 : 0, total));
	}
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
	tblog_close(&tb);
	free(lay);
	optim_free(&opt);
	devices_close(&dev);
	free(params);
	free(perm);
	job_free(&j);
	return e;
}
