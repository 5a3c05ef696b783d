/* See ps_store.h. */
#include "ps_store.h"
#include "psrows.h"
#include "role.h"

#include "../base/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void snap_free(struct ps_snap *sn)
{
	free(sn->p);
	free(sn->m);
	free(sn->v);
	free(sn->rt);
	free(sn->rm);
	free(sn->rv);
	memset(sn, 0, sizeof(*sn));
}

/* Room for a copy of sh (moments where its optimizer has them). -ENOMEM
 * leaves sn empty. */
static int snap_alloc(struct ps_snap *sn, const struct psshard *sh)
{
	size_t bytes = sh->n * sizeof(float);
	memset(sn, 0, sizeof(*sn));
	sn->p = malloc(bytes);
	sn->m = sh->opt.m ? malloc(bytes) : NULL;
	sn->v = sh->opt.v ? malloc(bytes) : NULL;
	if (!sn->p || (sh->opt.m && !sn->m) || (sh->opt.v && !sn->v)) {
		snap_free(sn);
		return -ENOMEM;
	}
	return 0;
}

/* Room for a copy of the embedding rows and their optimizer's state,
 * when the ps holds rows. A checkpoint copies them as it copies the dense
 * shard, so that the writer writes one version of both while training
 * goes on; it costs the rows' memory again while the copy waits. */
static int snap_rows_alloc(struct ps_snap *sn, const struct psrows *r)
{
	if (!r)
		return 0;
	size_t bytes = r->n * (size_t)r->dim * sizeof(float);
	sn->rt = malloc(bytes ? bytes : 1);
	sn->rm = r->opt.m ? malloc(bytes ? bytes : 1) : NULL;
	sn->rv = r->opt.v ? malloc(bytes ? bytes : 1) : NULL;
	return !sn->rt || (r->opt.m && !sn->rm) || (r->opt.v && !sn->rv) ? -ENOMEM : 0;
}

static void snap_rows_copy(struct ps_snap *sn, const struct psrows *r)
{
	if (!r)
		return;
	size_t bytes = r->n * (size_t)r->dim * sizeof(float);
	memcpy(sn->rt, r->table, bytes);
	if (sn->rm)
		memcpy(sn->rm, r->opt.m, bytes);
	if (sn->rv)
		memcpy(sn->rv, r->opt.v, bytes);
	sn->rt_t = r->opt.t;
}

/* Saves the shard as checkpoint `step`; called with mu held, so the
 * state is exactly version `step` (sync: no push can apply meanwhile;
 * async: `step` is the chief's label and the state is the shard's as it is
 * now). Only the copy happens here; the writer thread writes it. Copies
 * wait in a queue of keep_checkpoints (at most PS_STORE_QUEUE_MAX): every
 * ps then writes every step the chief asks for, so the steps are complete,
 * unless the disk falls that far behind, when the oldest waiting copy is
 * dropped (logged; that step stays incomplete, and the newest ones are
 * still written everywhere). A failure is reported and training goes on:
 * the checkpoint stays incomplete and the previous one remains the
 * newest. */
static void store_save(struct ps_store *st, uint64_t step, double acc)
{
	struct psshard *sh = st->sh;
	size_t bytes = sh->n * sizeof(float);
	struct ps_snap sn = { 0 };
	if (st->qlen == st->qcap) {
		sn = st->q[0];
		role_log(st->out, "ps %d: checkpoint at step %llu not written: %d newer ones wait (the disk is slower than checkpoint_every)",
			 st->index, (unsigned long long)sn.step, st->qlen);
		memmove(st->q, st->q + 1, (size_t)(st->qlen - 1) * sizeof(st->q[0]));
		st->qlen--;
	} else {
		if (snap_alloc(&sn, sh) || snap_rows_alloc(&sn, st->rows)) {
			snap_free(&sn);
			role_log(st->out, "ps %d: checkpoint at step %llu failed, training goes on: out of memory for a copy of the shard",
				 st->index, (unsigned long long)step);
			return;
		}
	}
	sn.step = step;
	sn.t = sh->opt.t;
	sn.acc = acc;
	memcpy(sn.p, sh->params, bytes);
	if (sn.m)
		memcpy(sn.m, sh->opt.m, bytes);
	if (sn.v)
		memcpy(sn.v, sh->opt.v, bytes);
	snap_rows_copy(&sn, st->rows);
	st->q[st->qlen++] = sn;
	pthread_cond_signal(&st->wcv);
}

/* Drops every copy still waiting (under mu). */
static void store_queue_clear(struct ps_store *st)
{
	for (int i = 0; i < st->qlen; i++)
		snap_free(&st->q[i]);
	st->qlen = 0;
}

/* The writer thread: writes each queued copy, until wstop and nothing is
 * queued. Its log lines are collected and printed after the write, so
 * that the output lock is not held across a slow disk either. */
static void *store_writer(void *arg)
{
	struct ps_store *st = arg;
	pthread_mutex_lock(st->mu);
	for (;;) {
		while (!st->qlen && !st->wstop)
			pthread_cond_wait(&st->wcv, st->mu);
		if (!st->qlen)
			break;
		struct ps_snap sn = st->q[0];
		memmove(st->q, st->q + 1, (size_t)(st->qlen - 1) * sizeof(st->q[0]));
		st->qlen--;
		pthread_mutex_unlock(st->mu);

		struct ckpt_rows rows = { 0 };
		if (st->rows)
			rows = (struct ckpt_rows){ .r0 = st->rows->r0, .r1 = st->rows->r1, .table = sn.rt,
						   .m = sn.rm, .v = sn.rv, .t = sn.rt_t };
		struct ckpt_state cs = { .params = sn.p, .m = sn.m, .v = sn.v, .t = sn.t,
					 .test_acc = sn.acc >= 0 ? &sn.acc : NULL,
					 .rows = st->rows ? &rows : NULL };
		char e[CONFIG_ERR_MAX], *text = NULL;
		size_t tlen = 0;
		FILE *log = open_memstream(&text, &tlen);
		int r = checkpoint_save_shard(st->c->train.checkpoint_dir, st->lay, (long)sn.step, st->index,
					      &cs, st->sh->mode == MODE_ASYNC, st->c->train.keep_checkpoints,
					      log, e, sizeof(e));
		if (log && fclose(log) == 0 && text && tlen) {
			flockfile(st->out);
			fputs(text, st->out);
			fflush(st->out);
			funlockfile(st->out);
		}
		free(text);
		if (r)
			role_log(st->out, "ps %d: checkpoint at step %llu failed, training goes on: %s",
				 st->index, (unsigned long long)sn.step, e);
		uint64_t step = sn.step;
		snap_free(&sn);
		pthread_mutex_lock(st->mu);
		/* the newest: a rollback may have made a lower step the latest */
		if (!r && (!st->has_last || step > st->last)) {
			st->last = step;
			st->has_last = 1;
		}
	}
	pthread_mutex_unlock(st->mu);
	return NULL;
}

/* Versions per step of the run: async versions count pushes, one a slice
 * of the step (config_slices), however many workers pushed them. */
static uint64_t store_per_step(const struct ps_store *st)
{
	return st->sh->mode == MODE_ASYNC ? (uint64_t)config_slices(st->c, 1) : 1;
}

/* Puts a loaded checkpoint (ld, into scratch or the shard's own arrays)
 * at its version: step x store_per_step. Adam's update count t comes
 * along where it means the same thing here (same mode, shards that
 * agree), else it is the version, which is what t is in a run that got
 * there without a break. */
static uint64_t store_version_of(const struct ps_store *st, const struct ckpt_load *ld, long *t)
{
	uint64_t v = (uint64_t)ld->step * store_per_step(st);
	int same = ld->async < 0 || ld->async == (st->sh->mode == MODE_ASYNC);
	*t = ld->t >= 0 && same ? ld->t : (long)v;
	return v;
}

/* The shard from the newest complete checkpoint. */
static int store_resume(struct ps_store *st, char *err, size_t errlen)
{
	const struct config *c = st->c;
	struct psshard *sh = st->sh;
	struct ckpt_rows_load rl = { 0 };
	struct ckpt_load ld = { .l = st->lay, .resume = 1, .begin = sh->range.begin, .end = sh->range.end,
				.params = sh->params, .m = sh->opt.m, .v = sh->opt.v };
	if (st->rows) {
		rl = (struct ckpt_rows_load){ .a = st->rows->r0, .b = st->rows->r1, .table = st->rows->table,
					      .m = st->rows->opt.m, .v = st->rows->opt.v };
		ld.rows = &rl;
	}
	flockfile(st->out);
	int e = checkpoint_restore(c->train.checkpoint_dir, &ld, st->out, err, errlen);
	funlockfile(st->out);
	if (e == -ENOENT)
		return 0;
	if (e)
		return e;
	psshard_rewind(sh, store_version_of(st, &ld, &sh->opt.t));
	if (st->rows) {
		st->rows->opt.t = rl.t >= 0 ? rl.t : (long)psshard_version(sh);
		role_log(st->out, "ps %d: embedding rows [%llu, %llu) loaded from step %ld's checkpoint with the parameters",
			 st->index, (unsigned long long)rl.a, (unsigned long long)rl.b, ld.step);
	}
	st->last = (uint64_t)ld.step;
	st->has_last = 1;
	char sd[CKPT_PATH_MAX], acc[48] = "not recorded";
	checkpoint_step_dir(sd, sizeof(sd), c->train.checkpoint_dir, ld.step);
	long total = sh->total / (long)store_per_step(st);
	if (ld.step < total) {
		role_log(st->out, "ps %d: resuming from %s", st->index, sd);
		/* ps 0 alone says it: every ps read the same manifest. */
		char note[CKPT_PATH_MAX + 256];
		if (st->index == 0 && checkpoint_batch_note(st->lay, ld.slices, ld.batch, sd, note, sizeof(note)))
			role_log(st->out, "ps 0: warning: %s", note);
		return 0;
	}
	if (ld.test_acc >= 0)
		snprintf(acc, sizeof(acc), "%.2f%%", 100 * ld.test_acc);
	role_log(st->out, "ps %d: run finished: %s is step %ld%s this run's %ld steps (test accuracy %s); serving it until the workers have seen that; to train on, raise [train] steps or epochs on every process; to start over, --fresh or another checkpoint_dir",
		 st->index, sd, ld.step, ld.step == total ? " of" : ", past", total, acc);
	return 0;
}

int ps_store_open(struct ps_store *st, pthread_mutex_t *mu, struct psshard *sh, struct psrows *rows,
		  const struct model *m, const struct config *c, int index, int fresh, FILE *out,
		  char *err, size_t errlen)
{
	*st = (struct ps_store){ .mu = mu, .sh = sh, .rows = rows, .m = m, .c = c, .out = out, .index = index };
	if (!c->train.checkpoint_dir[0])
		return 0;
	st->lay = malloc(sizeof(*st->lay));
	if (!st->lay)
		return err_set(err, errlen, -ENOMEM, "out of memory");
	int e = ckpt_layout_init_cluster(st->lay, m, c->cluster.nps, c, err, errlen);
	if (!e && !fresh)
		e = store_resume(st, err, errlen);
	if (e)
		return e;
	int keep = c->train.keep_checkpoints;
	st->qcap = keep < 1 ? 1 : keep > PS_STORE_QUEUE_MAX ? PS_STORE_QUEUE_MAX : keep;
	pthread_cond_init(&st->wcv, NULL);
	st->writer_on = pthread_create(&st->writer, NULL, store_writer, st) == 0;
	if (!st->writer_on) {
		pthread_cond_destroy(&st->wcv);
		return err_set(err, errlen, -ENOMEM, "cannot start the checkpoint writer thread");
	}
	return 0;
}

void ps_store_close(struct ps_store *st)
{
	if (st->writer_on) {
		pthread_mutex_lock(st->mu);
		st->wstop = 1;
		pthread_cond_signal(&st->wcv);
		pthread_mutex_unlock(st->mu);
		pthread_join(st->writer, NULL);
		pthread_cond_destroy(&st->wcv);
		st->writer_on = 0;
	}
	store_queue_clear(st);
	free(st->lay);
	st->lay = NULL;
}

/* Sync with backup workers: this ps saves each multiple of
 * checkpoint_every as its shard reaches it (ps_store_pushed). */
static int store_saves_itself(const struct ps_store *st)
{
	const struct psshard *sh = st->sh;
	return sh->mode == MODE_SYNC && sh->replicas < sh->workers && st->c->train.checkpoint_every > 0;
}

/* CHECKPOINT from the chief. Sync: it sends it after pulling version
 * `step` and before pushing for it; with replicas_to_aggregate < workers
 * the shard may have moved on already, and that step is skipped here.
 * Async: shards have no common version; `step` is a label the chief chose
 * (ps 0's version as it pulled it) and every ps saves what it has now
 * under it, so the shards of one checkpoint are as far apart as the
 * shards of a running async cluster always are. */
void ps_store_checkpoint(struct ps_store *st, uint64_t step, double acc)
{
	pthread_mutex_lock(st->mu);
	uint64_t v = psshard_version(st->sh);
	if (!st->lay)
		;
	else if (store_saves_itself(st) && acc < 0 && step <= st->saved_self)
		;   /* saved when the shard reached it (ps_store_pushed) */
	else if (v == step || st->sh->mode == MODE_ASYNC)
		store_save(st, step, acc);
	else if (v < step)
		st->pending = step, st->pending_acc = acc;
	else
		role_log(st->out, "ps %d: checkpoint at step %llu skipped: shard already at version %llu",
			 st->index, (unsigned long long)step, (unsigned long long)v);
	if (st->lay && store_saves_itself(st) && v == step && step > st->saved_self)
		st->saved_self = step;
	pthread_mutex_unlock(st->mu);
}

void ps_store_pushed(struct ps_store *st)
{
	const struct psshard *sh = st->sh;
	uint64_t v = psshard_version(sh);
	long every = st->c->train.checkpoint_every;
	if (st->pending && v == st->pending) {
		store_save(st, v, st->pending_acc);
		st->pending = 0;
		if (store_saves_itself(st))
			st->saved_self = v;
	}
	/* Backup workers: the others may take the shard past the chief's
	 * step before its CHECKPOINT arrives, or the chief may pull a version
	 * past several multiples at once, so each ps saves every multiple of
	 * checkpoint_every itself as its shard reaches it (all ps the same
	 * versions; the final one, with its accuracy, still comes from the
	 * chief). Without them the chief's own push is needed to move on,
	 * and its CHECKPOINT always comes first. */
	if (st->lay && store_saves_itself(st) && v > 0 && v % (uint64_t)every == 0 &&
	    v < (uint64_t)sh->total && v != st->saved_self) {
		store_save(st, v, -1);
		st->saved_self = v;
	}
}

int ps_store_last(const struct ps_store *st, uint64_t *step)
{
	*step = st->has_last ? st->last : 0;
	return st->has_last;
}

/* ROLLBACK from a worker: a restarted ps resumed from checkpoint `step`
 * while this one went on, so this one goes back to the same step (step 0:
 * the initial parameters). Already at `step`, it keeps what it has: the
 * gradients waiting for it were computed from that version.
 *
 * Atomic: the checkpoint is loaded into a scratch copy and put in place
 * only once all of it has loaded, so every failure leaves the shard as it
 * was (checkpoint_load fills its arrays tensor by tensor: a file that
 * fails half way used to leave a shard half restored, serving a mix of two
 * steps). Under mu throughout, as before: no push or pull sees the shard
 * between the check and the commit; rollbacks are rare, and a ps that
 * waits for one is rolling back anyway. The copy costs one more shard's
 * worth of memory while it lasts, which a ps short of it refuses
 * (-ENOMEM) rather than half do.
 *
 * A failure is the caller's to report to the worker that asked; the ps
 * goes on (docs/PROTOCOL.md, "Failures"). */
int ps_store_rollback(struct ps_store *st, uint64_t *step_io, char *err, size_t errlen)
{
	const struct config *c = st->c;
	struct psshard *sh = st->sh;
	uint64_t step = *step_io;
	struct ps_snap sn;
	if (psshard_version(sh) == step)
		return 1;
	if (snap_alloc(&sn, sh))
		return err_set(err, errlen, -ENOMEM, "out of memory for a copy of the shard (%zu parameters)",
			       sh->n);
	struct ckpt_load ld = { .l = st->lay, .resume = 1, .begin = sh->range.begin, .end = sh->range.end,
				.params = sn.p, .m = sn.m, .v = sn.v };
	long t = 0;
	int init = step == 0, r = 0;
	if (!init && sh->mode == MODE_ASYNC) {
		/* Async shards are never all at one version, so a worker may
		 * have seen the restarted shard a few pushes past its
		 * checkpoint: the newest complete checkpoint at or below
		 * version `step` (labels are steps of the run, W versions
		 * each) is the one it resumed from (none: it started over). */
		if (st->lay)
			r = checkpoint_restore_upto(c->train.checkpoint_dir, (long)(step / store_per_step(st)),
						    &ld, NULL, err, errlen);
		if (!st->lay || r == -ENOENT)
			init = 1, r = 0;
		step = init ? 0 : store_version_of(st, &ld, &t);
	} else if (!init && !st->lay) {
		r = err_set(err, errlen, -ENOENT, "checkpoints are off (checkpoint_dir is empty)");
	} else if (!init) {
		char dir[CKPT_PATH_MAX];
		struct stat sb;
		checkpoint_step_dir(dir, sizeof(dir), c->train.checkpoint_dir, (long)step);
		if (stat(dir, &sb) != 0)
			r = err_set(err, errlen, -ENOENT, "there is no checkpoint of that step (%s: %s)", dir,
				    strerror(errno));
		else
			r = checkpoint_load(dir, &ld, err, errlen);
		if (!r && (uint64_t)ld.step != step)
			r = err_set(err, errlen, -EINVAL, "%s holds step %ld", dir, ld.step);
		if (!r)
			store_version_of(st, &ld, &t);
	}
	if (r) {
		snap_free(&sn);
		return r;
	}
	if (init) {
		model_init_params(st->m, sn.p, sh->range.begin, sh->range.end, c->train.seed);
		if (sn.m)
			memset(sn.m, 0, sh->n * sizeof(float));
		if (sn.v)
			memset(sn.v, 0, sh->n * sizeof(float));
	}
	/* Every check passed: commit. */
	memcpy(sh->params, sn.p, sh->n * sizeof(float));
	if (sh->opt.m)
		memcpy(sh->opt.m, sn.m, sh->n * sizeof(float));
	if (sh->opt.v)
		memcpy(sh->opt.v, sn.v, sh->n * sizeof(float));
	snap_free(&sn);
	sh->opt.t = t;
	psshard_rewind(sh, step);
	*step_io = step;
	st->pending = 0;
	st->saved_self = step;   /* steps past it are of the history just abandoned */
	/* Copies not written yet are of the history just abandoned. */
	for (int i = 0; i < st->qlen; i++)
		role_log(st->out, "ps %d: checkpoint at step %llu not written: rolled back", st->index,
			 (unsigned long long)st->q[i].step);
	store_queue_clear(st);
	return 0;
}
