/* The local training loop: load data, build the model, initialize the flat
 * parameter vector, then for each step gather a shuffled batch, run forward
 * and backward on the devices (core/nn/devices.c), and apply the optimizer. */
#include "train.h"
#include "../base/bigmem.h"
#include "../base/err.h"
#include "tblog.h"

#include "nn/backend.h"
#include "ckpt/checkpoint.h"
#include "data/data.h"
#include "nn/devices.h"
#include "job.h"
#include "memlimit.h"
#include "nn/model.h"
#include "nn/optim.h"
#include "progress.h"
#include "nn/replica.h"
#include "nn/sparse_optim.h"

#include <errno.h>
#include <math.h>
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

/* A local run from its job's load to its close: what the steps between
 * share. */
struct run {
	const struct config *c;
	const struct train_ckpt *ck;   /* NULL: neither resume nor save */
	FILE *out;
	struct job j;
	struct devices dev;
	struct optim opt;
	struct ckpt_layout *lay;
	float *params;                 /* the host copy: init, checkpoints, resume */
	float *fold, *fold_g;          /* (P) [train] slices > 1: the step's fold and a slice */
	uint32_t *perm;                /* (train.n) the epoch's order */
	struct tblog tb;
	struct progress pg;
	long start;                    /* the step it resumes at */
	double acc;                    /* the resumed checkpoint's recorded test
					* accuracy, -1: none */
	int was_slices, was_batch;     /* its global batch (0: not recorded) */
	const struct dataset *given_train, *given_test;   /* train_sets's; NULL: [data]'s */
	float *table;                  /* (R, DIM) the embedding tables; NULL: none */
	struct sparse_optim sopt;      /* their optimizer */
	const char *dump;              /* train_ckpt's dump; NULL: none */
};

/* Saves the whole run as checkpoint `step`, one shard over all of P and
 * all rows of the tables, from the devices' state through the host copies
 * r->params and r->opt (the tables are the host's already); acc (may be
 * NULL): the final test accuracy, which the last checkpoint records. */
static int save(struct run *r, long step, const double *acc, char *err, size_t errlen)
{
	int e = devices_get_params(&r->dev, r->params, err, errlen);
	if (!e)
		e = devices_get_optim(&r->dev, &r->opt, err, errlen);
	if (e)
		return e;
	struct ckpt_rows rows = { .r0 = 0, .r1 = r->sopt.rows, .table = r->table, .m = r->sopt.m, .v = r->sopt.v,
				  .t = r->sopt.t };
	struct ckpt_state st = { .params = r->params, .m = r->opt.m, .v = r->opt.v, .t = r->opt.t, .test_acc = acc,
				 .rows = r->table ? &rows : NULL };
	return checkpoint_save(r->ck->dir, r->lay, step, &st, r->c->train.keep_checkpoints, r->out, err, errlen);
}

/* The checkpoint layout of this run in r->lay (allocated; run_close
 * frees it), and unless ck->fresh the newest usable checkpoint in ck->dir,
 * of any layout or mode, loaded into r->params and r->opt, and the tables
 * and their optimizer: its step in r->start (0 when there is none), and in
 * r->acc the final test accuracy it recorded (-1: none). */
static int resume(struct run *r, char *err, size_t errlen)
{
	r->lay = malloc(sizeof(*r->lay));
	if (!r->lay) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	int e = ckpt_layout_init(r->lay, &r->j.m, 1, r->c, err, errlen);
	if (e || r->ck->fresh)
		return e;
	struct ckpt_rows_load rows = { .a = 0, .b = r->sopt.rows, .table = r->table, .m = r->sopt.m, .v = r->sopt.v };
	struct ckpt_load ld = { .l = r->lay, .resume = 1, .begin = 0, .end = r->j.m.nparams, .params = r->params,
				.m = r->opt.m, .v = r->opt.v, .rows = r->table ? &rows : NULL };
	e = checkpoint_restore(r->ck->dir, &ld, r->out, err, errlen);
	if (e == -ENOENT)
		return 0;
	if (e)
		return e;
	r->start = ld.step;
	r->acc = ld.test_acc;
	r->was_slices = ld.slices;
	r->was_batch = ld.batch;
	/* An async cluster's shards count updates apart (ld.t = -1 where
	 * they disagree); here there is one update per step. */
	r->opt.t = ld.t >= 0 && ld.async != 1 ? ld.t : ld.step;
	r->sopt.t = rows.t >= 0 && ld.async != 1 ? rows.t : ld.step;
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

/* step's order of the training samples (an epoch's, or a streamed set's
 * window's) onto the devices. */
static int epoch_order(struct devices *dev, struct job *j, uint32_t *perm, uint64_t seed, long step,
		       char *err, size_t errlen)
{
	int e = job_order(j, step, seed, perm, err, errlen);
	return e ? e : devices_set_order(dev, perm, j->train.n, err, errlen);
}

/* The embedding tables at their initial values and their sparse optimizer,
 * in host memory (a local run holds the whole tables); a resume replaces
 * both with a checkpoint's. */
static int run_tables(struct run *r, char *err, size_t errlen)
{
	const struct config *c = r->c;
	const struct embed_spec *s = &r->j.m.embed;
	if (!s->fields)
		return 0;
	uint64_t R = embed_total_rows(s);
	size_t n = (size_t)R * (size_t)s->dim;
	struct sparse_config sc = { .kind = (enum sparse_kind)c->train.embed_optimizer, .lr = c->train.embed_lr,
				    .beta1 = c->train.optim.beta1, .beta2 = c->train.optim.beta2,
				    .eps = c->train.optim.eps };
	r->table = n / (size_t)s->dim == R ? bigmem_alloc(n * sizeof(float)) : NULL;
	if (!r->table || sparse_optim_init(&r->sopt, &sc, R, s->dim)) {
		char size[32];
		progress_bytes(size, sizeof(size), (double)R * s->dim * sizeof(float));
		snprintf(err, errlen, "out of memory for the embedding tables: %llu rows x %d (%s, and %s the optimizer's state)",
			 (unsigned long long)R, s->dim, size, sc.kind == SPARSE_ADAGRAD ? "as much again for" : "twice that for");
		return -ENOMEM;
	}
	embed_init_rows(s, r->table, 0, R, c->train.seed);
	return 0;
}

/* [ps] memory_limit: a local run holds the whole model, so the limit a ps
 * puts on its shard is this run's too, with the same line (memlimit.h). */
static int run_fits(struct run *r, char *err, size_t errlen)
{
	const struct config *c = r->c;
	const struct embed_spec *s = &r->j.m.embed;
	uint64_t bytes = memlimit_dense(r->j.m.nparams, (int)c->train.optim.kind);
	if (s->fields)
		bytes += memlimit_rows(embed_total_rows(s), s->dim, c->train.embed_optimizer);
	return memlimit_check("the model", bytes, c->ps.memory_limit, err, errlen);
}

/* The job, the host copies, and the checkpoint to resume from. */
static int run_open(struct run *r, char *err, size_t errlen)
{
	const struct config *c = r->c;
	int e = r->given_train ? job_load_sets(&r->j, c, r->given_train, r->given_test, err, errlen)
			       : job_load(&r->j, c, config_slices(c, 0), 1, err, errlen);
	if (!e)
		e = run_fits(r, err, errlen);
	if (!e)
		e = run_tables(r, err, errlen);
	if (e)
		return e;
	size_t P = r->j.m.nparams;
	r->params = malloc(P * sizeof(float));
	r->perm = malloc(r->j.train.n * sizeof(uint32_t));
	if (r->j.S > 1) {
		r->fold = malloc(P * sizeof(float));
		r->fold_g = malloc(P * sizeof(float));
	}
	if (!r->params || !r->perm || (r->j.S > 1 && (!r->fold || !r->fold_g)) || optim_init(&r->opt, &c->train.optim, P) ||
	    optim_plain_tensors(&r->opt, &r->j.m, 0)) {
		snprintf(err, errlen, "out of memory for %zu parameters", P);
		return -ENOMEM;
	}
	model_init_params(&r->j.m, r->params, 0, P, c->train.seed);
	r->acc = -1;
	return r->ck ? resume(r, err, errlen) : 0;
}

static int run_devices(struct run *r, char *err, size_t errlen)
{
	int max_batch = r->j.B > EVAL_BATCH ? r->j.B : EVAL_BATCH;
	int e = devices_open(&r->dev, r->c, &r->j.m, &r->c->train.optim, max_batch, "/job:localhost/replica:0/task:0",
			     r->out, err, errlen);
	if (!e && r->table)
		e = devices_embed_open(&r->dev, r->table, &r->sopt, err, errlen);
	if (!e && r->table && r->j.S > 1)
		e = devices_embed_slices(&r->dev, r->j.S, err, errlen);
	return e;
}

/* A checkpoint at or past the last step: said in one line, nothing
 * trained; the devices are opened only to evaluate a checkpoint that did
 * not record its accuracy (one of a run with more steps). */
static int run_say_finished(struct run *r, struct train_result *res, char *err, size_t errlen)
{
	int e = 0;
	if (r->acc < 0) {
		e = run_devices(r, err, errlen);
		if (!e)
			e = devices_set_params(&r->dev, r->params, err, errlen);
		if (!e)
			e = devices_evaluate(&r->dev, &r->j.test, &res->test_loss, &r->acc, err, errlen);
		if (e)
			return e;
	}
	say_finished(r->ck, r->start, r->j.total, r->acc, r->out);
	res->finished = 1;
	res->steps = res->start_step = r->start;
	res->total_steps = r->j.total;
	res->test_acc = r->acc;
	return 0;
}

/* The devices with the parameters, optimizer state and data; the lines
 * said before the first step; progress and TensorBoard. */
static int run_ready(struct run *r, int tty, char *err, size_t errlen)
{
	int resident = 0;
	int e = run_devices(r, err, errlen);
	if (!e && r->start > 0) {
		char sd[CKPT_PATH_MAX];
		checkpoint_step_dir(sd, sizeof(sd), r->ck->dir, r->start);
		fprintf(r->out, "resuming from %s\n", sd);
		char note[CKPT_PATH_MAX + 256];
		if (checkpoint_batch_note(r->lay, r->was_slices, r->was_batch, sd, note, sizeof(note)))
			fprintf(r->out, "warning: %s\n", note);
	}
	if (!e)
		e = devices_set_params(&r->dev, r->params, err, errlen);
	if (!e)
		e = devices_set_optim(&r->dev, &r->opt, err, errlen);
	/* A streamed window changes under the devices: its batches are
	 * gathered on the host, never from a copy on the GPU. */
	r->dev.stage_only |= r->j.streamed;
	if (!e)
		e = devices_set_data(&r->dev, &r->j.train, &resident, err, errlen);
	if (e)
		return e;
	if (r->ck && r->ck->intro)
		fprintf(r->out, "%s\n", r->ck->intro);
	char batch[64];
	if (r->j.S > 1)
		snprintf(batch, sizeof(batch), "%d slices x %d", r->j.S, r->j.B);
	else
		snprintf(batch, sizeof(batch), "%d", r->j.B);
	fprintf(r->out, "training: %zu train / %zu test samples, %zu parameters, batch %s, %ld steps (%ld per epoch), %s%s%s\n",
		r->j.n, r->j.test.n, r->j.m.nparams, batch, r->j.total, r->j.spe, r->dev.be[0].where,
		r->dev.n > 1 ? " and more replicas" : "",
		r->dev.gpu ? resident ? ", data on the GPU" : ", data staged from the host" : "");
	if (r->table) {
		char size[32];
		const struct embed_spec *s = &r->j.m.embed;
		progress_bytes(size, sizeof(size), (double)embed_total_rows(s) * s->dim * sizeof(float));
		fprintf(r->out, "embedding: %llu rows x %d (%s) in %d table%s, %s at learning rate %g\n",
			(unsigned long long)embed_total_rows(s), s->dim, size, s->shared ? 1 : s->fields,
			s->shared || s->fields == 1 ? "" : "s", sparse_kind_name(r->sopt.cfg.kind),
			(double)r->sopt.cfg.lr);
	}
	progress_init(&r->pg, r->out, tty, r->j.total, r->j.spe);
	if (r->j.m.loss == LOSS_SIGMOID_XENT)
		progress_set_binary(&r->pg);
	char tbe[CONFIG_ERR_MAX];
	if (tblog_open(&r->tb, r->c->train.log_dir, tbe, sizeof(tbe)))
		fprintf(r->out, "warning: no TensorBoard logs: %s\n", tbe);
	return 0;
}

/* An evaluation's figures into the progress line and TensorBoard. */
static void run_show_eval(struct run *r, long step, const struct eval_result *ev, double lr)
{
	devices_show_eval(&r->pg, step, ev);
	tblog_eval(&r->tb, step, &r->pg, lr);
}

/* After step's training: the loss when it is shown, a checkpoint and an
 * evaluation when they are due. */
static int run_after_step(struct run *r, long step, int stopping, char *err, size_t errlen, double ts)
{
	const struct config *c = r->c;
	long total = r->j.total, spe = r->j.spe;
	int last = step + 1 == total;
	int eval_now = c->train.eval_every > 0 ? (step + 1) % c->train.eval_every == 0 : (step + 1) % spe == 0;
	int ckpt_now = r->ck && c->train.checkpoint_every > 0 && (step + 1) % c->train.checkpoint_every == 0 &&
		       !last;
	/* The loss is read only when it is shown, or before an evaluation or
	 * a checkpoint would wait for the GPU anyway: reading waits for the
	 * queued steps, which is training time too. */
	int read = progress_due(&r->pg, step) || eval_now || ckpt_now || last || stopping;
	double loss = 0;
	long right = 0, n = 0;
	int e;
	if (read && (e = devices_meter(&r->dev, &loss, &right, &n, err, errlen)))
		return e;
	progress_tick(&r->pg, step, progress_now() - ts);
	if (read)
		progress_step(&r->pg, step, n, loss, (double)right);
	if (ckpt_now) {
		char why[CONFIG_ERR_MAX];
		progress_clear(&r->pg);
		if (save(r, step + 1, NULL, why, sizeof(why)))
			fprintf(r->out, "warning: checkpoint at step %ld failed, training goes on: %s\n", step + 1, why);
	}
	if (eval_now && !last) {
		struct eval_result ev;
		e = devices_eval(&r->dev, &r->j.test, &ev, err, errlen);
		if (e)
			return e;
		run_show_eval(r, step + 1, &ev, optim_lr(&c->train.optim, step, total));
	}
	return 0;
}

/* --dump-params: the parameters, then the tables (a worker's dump has the
 * same layout: cluster/worker_embed.h). */
static int run_dump(struct run *r, char *err, size_t errlen)
{
	size_t P = r->j.m.nparams, T = r->table ? (size_t)embed_total_rows(&r->j.m.embed) * (size_t)r->j.m.embed.dim : 0;
	int e = devices_get_params(&r->dev, r->params, err, errlen);
	if (e)
		return e;
	FILE *f = fopen(r->dump, "wb");
	int ok = f && fwrite(r->params, sizeof(float), P, f) == P && (!T || fwrite(r->table, sizeof(float), T, f) == T);
	if (f && fclose(f))
		ok = 0;
	return ok ? 0 : err_set(err, errlen, -EIO, "%s: cannot write parameters: %s", r->dump, strerror(errno));
}

/* Stopped or finished: always end with a real evaluation, which the last
 * checkpoint records (a finished run started again says it). */
static int run_end(struct run *r, long step, const volatile sig_atomic_t *stop, double t0,
		   struct train_result *res, char *err, size_t errlen)
{
	long total = r->j.total;
	struct eval_result ev;
	int e = devices_eval(&r->dev, &r->j.test, &ev, err, errlen);
	if (!e && r->dump)
		e = run_dump(r, err, errlen);
	if (e)
		return e;
	res->test_loss = ev.loss;
	res->test_acc = ev.acc;
	res->binary = ev.binary;
	res->test_auc = ev.auc;
	if (r->ck && step > r->start) {
		progress_clear(&r->pg);
		e = save(r, step, &res->test_acc, err, errlen);
		if (e)
			return e;
	}
	if (!*stop || step == total)
		run_show_eval(r, step, &ev, optim_lr(&r->c->train.optim, step > 0 ? step - 1 : 0, total));
	progress_clear(&r->pg);
	res->steps = step;
	res->total_steps = total;
	res->wall = progress_now() - t0;
	res->samples_per_s = r->pg.train_time > 0 ? (double)r->pg.samples / r->pg.train_time : 0;
	res->stopped = step < total;
	return 0;
}

static void run_close(struct run *r)
{
	progress_clear(&r->pg);   /* after a failure: err says what failed where */
	tblog_close(&r->tb);
	free(r->lay);
	optim_free(&r->opt);
	devices_close(&r->dev);
	sparse_optim_free(&r->sopt);
	bigmem_free(r->table, embed_table_bytes(&r->j.m.embed));
	free(r->params);
	free(r->fold);
	free(r->fold_g);
	free(r->perm);
	job_free(&r->j);
}

/* step's training: its one batch (as a CUDA graph where it can be), or
 * its S slices, each made apart and folded in slice order (the numbers of
 * a cluster's step, however many workers computed them). */
static int run_step(struct run *r, long step, char *err, size_t errlen)
{
	const struct config *c = r->c;
	float lr = optim_lr(&c->train.optim, step, r->j.total);
	int S = r->j.S;
	if (S == 1)
		return devices_train_step(&r->dev, job_slice_at(&r->j, step, 0), r->j.B,
					  replica_key(c->train.seed, step, 0), &r->opt, lr, err, errlen);
	size_t at[CONFIG_MAX_HOSTS];
	uint64_t key[CONFIG_MAX_HOSTS];
	for (int k = 0; k < S; k++) {
		at[k] = job_slice_at(&r->j, step, k);
		key[k] = replica_key(c->train.seed, step, k);
	}
	return devices_slices_step(&r->dev, S, at, r->j.B, key, r->fold, r->fold_g, &r->opt, lr, err, errlen);
}

/* The whole run of r, whose config, checkpoints, output and sets are set. */
static int run_all(struct run *r, int tty, const volatile sig_atomic_t *stop, struct train_result *res,
		   char *err, size_t errlen)
{
	const struct config *c = r->c;
	double t0 = progress_now();
	memset(res, 0, sizeof(*res));
	res->test_auc = NAN;
	int e = run_open(r, err, errlen);
	if (!e && r->ck && r->start >= r->j.total) {
		e = run_say_finished(r, res, err, errlen);
	} else if (!e && !(e = run_ready(r, tty, err, errlen))) {
		long step, epoch_loaded = -1;
		res->start_step = r->start;
		for (step = r->start; step < r->j.total && !*stop && !e; step++) {
			/* From before the epoch's order is copied: that copy waits
			 * for the steps queued before it, which is training time. */
			double ts = progress_now();
			char why[CONFIG_ERR_MAX];
			if (job_part(&r->j, step) != epoch_loaded) {
				epoch_loaded = job_part(&r->j, step);
				e = epoch_order(&r->dev, &r->j, r->perm, c->train.seed, step, err, errlen);
				if (e)
					break;
			}
			e = run_step(r, step, why, sizeof(why));
			if (e) {
				progress_clear(&r->pg);
				snprintf(err, errlen, "step %ld: %s", step, why);
				break;
			}
			e = run_after_step(r, step, *stop, err, errlen, ts);
		}
		if (!e)
			e = run_end(r, step, stop, t0, res, err, errlen);
	}
	run_close(r);
	return e;
}

int train_run(const struct config *c, const struct train_ckpt *ck, FILE *out, int tty,
	      const volatile sig_atomic_t *stop, struct train_result *res, char *err, size_t errlen)
{
	struct run r = { .c = c, .ck = ck && ck->dir[0] ? ck : NULL, .out = out, .dump = ck ? ck->dump : NULL };
	return run_all(&r, tty, stop, res, err, errlen);
}

int train_sets(const struct config *c, const struct dataset *train, const struct dataset *test,
	       FILE *out, const volatile sig_atomic_t *stop, struct train_result *res, char *err,
	       size_t errlen)
{
	struct run r = { .c = c, .out = out, .given_train = train, .given_test = test };
	return run_all(&r, 0, stop, res, err, errlen);
}
