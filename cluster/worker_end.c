/* The end of a worker's run (worker_priv.h): the chief's final pull,
 * evaluation and checkpoint, a finished run found at start, and DONE with
 * the wait for every ps to call the run complete; a ps lost in any of them
 * is recovered from as in training, which may send the worker back to
 * train rolled-back steps again. */
#include "worker_priv.h"
#include "recovery.h"

#include "../base/err.h"

#include <errno.h>
#include <string.h>

/* A ps lost while the chief finishes step: the recovery of the loop,
 * which may roll back to a step to train again from (*again, wr->step);
 * else the parameters are the shards' again and the chief goes on. */
static int worker_final_recover(struct worker *wr, long step, int *again, char *err, size_t errlen)
{
	long at = step;
	int e = worker_recover(wr, &at, err, errlen);
	if (!e && (wr->c->train.mode == MODE_SYNC || at != step) && at < wr->total) {
		wr->step = wr->start = at;
		*again = 1;
	}
	return e;
}

/* The chief's test figures of the final parameters. An embedding model's
 * evaluation pulls its rows from the ps, so a ps lost meanwhile is
 * recovered from as after the final pull, and the evaluation run again. */
static int worker_final_eval(struct worker *wr, long step, struct eval_result *ev, int *again, char *err,
			     size_t errlen)
{
	if (wr->hooks.final_eval_delay_ms)
		role_nap_ms(wr->hooks.final_eval_delay_ms);
	wr->lk.lost = -1;
	int e = devices_report(&wr->dev, &wr->pg, step - 1, err, errlen);
	if (!e)
		e = devices_eval(&wr->dev, &wr->s.job.test, ev, err, errlen);
	if (e && wr->emb && wr->lk.lost >= 0) {
		role_log(wr->out, "worker %d: ps %d was lost during the final evaluation (%s): recovering as in training",
			 wr->index, wr->lk.lost, err);
		e = worker_final_recover(wr, step, again, err, errlen);
		if (!e && !*again)
			e = devices_eval(&wr->dev, &wr->s.job.test, ev, err, errlen);
	}
	return e;
}

/* After the last step: the chief pulls the final parameters, evaluates
 * them (res) and asks for the final checkpoint, which records the test
 * accuracy; the others log their figures. *again: the final pull (or an
 * embedding model's evaluation) found a lost ps whose recovery went back
 * to a step to train again from (wr->step). */
int worker_final(struct worker *wr, const char *dump, struct train_result *res, int *again,
			char *err, size_t errlen)
{
	long step = wr->step;
	int e = 0;
	*again = 0;
	if (wr->finished)
		return dump ? worker_dump(dump, wr->params, wr->s.job.m.nparams, wr->emb, err, errlen) : 0;
	if (!wr->chief)
		return worker_meter_line(wr, err, errlen);
	if (step > wr->start && wr->phase == STEP_UNPULLED) {
		e = worker_pull(wr, err, errlen);
		/* The last step's shards were lost: the same recovery as in
		 * the loop. */
		if (e && wr->lk.lost >= 0)
			e = worker_final_recover(wr, step, again, err, errlen);
		if (e || *again)
			return e;
	}
	struct eval_result ev;
	e = worker_final_eval(wr, step, &ev, again, err, errlen);
	if (e || *again)
		return e;
	res->test_loss = ev.loss;
	res->test_acc = ev.acc;
	res->binary = ev.binary;
	res->test_auc = ev.auc;
	if (wr->ckpts && step > wr->start)
		e = links_checkpoint(&wr->lk, ckpt_label(wr, step), res->test_acc, err, errlen);
	if (e)
		return e;
	devices_show_eval(&wr->pg, step, &ev);
	worker_log_eval(wr, step);
	return dump ? worker_dump(dump, wr->params, wr->s.job.m.nparams, wr->emb, err, errlen) : 0;
}

/* A finished run started again, or one that the other workers finished
 * before this one connected (backup workers): the shards are at or past
 * this run's last step. One line says so, with the test accuracy of the
 * parameters they hold (evaluated here: a worker does not read
 * checkpoints), and the worker goes on to say DONE as after training.
 * The chief asks for the final checkpoint of a run that ends here: a
 * finished run's exists already and is not written again, and one the
 * others finished has none yet. */
int worker_found_finished(struct worker *wr, struct train_result *res, char *err, size_t errlen)
{
	int e = devices_evaluate(&wr->dev, &wr->s.job.test, &res->test_loss, &res->test_acc, err, errlen);
	if (!e && wr->ckpts && wr->start == wr->total)
		e = links_checkpoint(&wr->lk, ckpt_label(wr, wr->start), res->test_acc, err, errlen);
	if (e)
		return e;
	wr->finished = 1;
	res->finished = 1;
	role_log(wr->out, "worker %d: run finished: the shards are at step %ld%s this run's %ld steps (test accuracy %.2f%%); to train on, raise [train] steps or epochs on every process; to start over, restart every ps with --fresh or another checkpoint_dir",
		 wr->index, wr->start, wr->start == wr->total ? " of" : ", past", wr->total, 100 * res->test_acc);
	return 0;
}

/* A worker that has trained its last step says DONE and stays until every
 * ps reports the run complete (the chief has said DONE, after its final
 * checkpoint and evaluation), polling with STATUS every 100 ms, so that a
 * ps killed and restarted meanwhile can still roll it back. The chief
 * itself, or a worker finishing after it, leaves at once. A lost ps is
 * recovered from as during training; if the shards went back, *again is
 * set, with wr->step the step to train again from, else DONE is said
 * again on the new connections. */
int worker_finish(struct worker *wr, int *again, char *err, size_t errlen)
{
	struct links *lk = &wr->lk;
	long step = wr->step;
	*again = 0;
	for (;;) {
		int r = links_done(lk, 0, err, errlen), complete = 0;
		while (!r) {
			r = links_status(lk, &complete, err, errlen);
			if (r || complete)
				break;
			if (*wr->stop)
				return err_set(err, errlen, -EINTR, "worker %d: interrupted while waiting for the others to finish",
					       wr->index);
			role_nap_ms(100);
		}
		if (!r) {
			/* Unsent, a ps waits peer_timeout for this worker
			 * to come back, then finishes all the same. */
			char e2[CONFIG_ERR_MAX];
			(void)links_done(lk, 1, e2, sizeof(e2));
			return 0;
		}
		if (lk->lost < 0)
			return r;
		char why[CONFIG_ERR_MAX];
		long at = step;
		snprintf(why, sizeof(why), "%s", err);
		r = recovery_resync(lk, wr->params, &at, why, err, errlen);
		if (r)
			return r;
		if (at != step) {
			r = devices_set_params(&wr->dev, wr->params, err, errlen);
			if (r)
				return r;
			wr->step = wr->start = at;
			wr->phase = STEP_PULLED;
			*again = 1;
			return 0;
		}
	}
}

