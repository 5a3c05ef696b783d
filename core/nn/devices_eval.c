/* Evaluation on the devices (devices.h's devices_eval): replica 0 over a
 * dataset in chunks. A model with neither an embedding layer nor a binary
 * loss is replica_evaluate's, unchanged; the others go chunk by chunk here,
 * planning each chunk's embedding rows from the tables and, for a binary
 * model, keeping every sample's probability for the log loss and the AUC. */
#include "devices_embed.h"
#include "devices_priv.h"

#include "../../base/err.h"
#include "../../gpu/gpu.h"
#include "../metrics.h"
#include "../progress.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int eval_fail(struct devices *d, int e, char *err, size_t errlen)
{
	const char *layer = d->rep[0].failed;
	const char *g = d->gpu ? gpu_backend_error(&d->be[d->be_of[0]]) : "";
	return err_set(err, errlen, e, "evaluation%s%s on %s: %s", layer ? " in " : "", layer ? layer : "",
		       d->be[d->be_of[0]].where, *g ? g : strerror(-e));
}

/* Where an evaluation's embedding rows come from: a table in the
 * replica's memory, or a fetch into U, host memory of the replica's
 * rows capacity (the fetch's message in err). */
struct eval_rows {
	const float *table;
	const struct embed_fetch *fetch;
	float *U;
	char *err;
	size_t errlen;
};

/* The chunks' forward passes: summed loss and right answers, and with
 * scores (n) each sample's probability. plan: the embedding's (NULL: none). */
static int eval_chunks(struct replica *r, const float *params, const struct eval_rows *er, const struct dataset *ds,
		       struct embed_plan *plan, float *scores, double *loss, double *right)
{
	const struct embed_spec *s = &r->m->embed;
	*loss = *right = 0;
	for (size_t off = 0; off < ds->n; off += (size_t)r->max_batch) {
		int B = (int)(ds->n - off < (size_t)r->max_batch ? ds->n - off : (size_t)r->max_batch);
		double l;
		int c;
		int e = replica_load(r, ds->x + off * ds->d, ds->y + off, B);
		if (!e && plan)
			e = embed_plan_build(plan, s, NULL, ds->ids + off * ds->f, B);
		if (!e && plan && er->fetch) {
			e = er->fetch->fetch(er->fetch->ctx, plan->rows, plan->u, er->U, er->err, er->errlen);
			if (e)
				return e;
			e = replica_embed_load_rows(r, plan, er->U);
		} else if (!e && plan) {
			e = replica_embed_load(r, plan, er->table);
		}
		if (!e)
			e = replica_forward(r, params, B, 0, 0, &l, &c);
		if (!e && scores)
			e = r->be.ops->download(r->be.ctx, scores + off, r->probs, (size_t)B * sizeof(float));
		if (e)
			return e;
		*loss += l;
		*right += c;
	}
	return 0;
}

static int eval_replica(struct replica *r, const float *params, const struct eval_rows *er,
			const struct dataset *ds, struct eval_result *ev)
{
	const struct embed_spec *s = &r->m->embed;
	memset(ev, 0, sizeof(*ev));
	ev->auc = NAN;
	ev->binary = r->m->loss == LOSS_SIGMOID_XENT;
	if (!ev->binary && !s->fields)
		return replica_evaluate(r, params, ds, &ev->loss, &ev->acc);
	if (s->fields && ((!er->table && !er->fetch) || ds->f != (size_t)s->fields || !ds->ids))
		return -EINVAL;
	/* A plan of its own: a step's, which devices_apply still needs, stays. */
	struct embed_plan plan = { 0 };
	size_t segs = (size_t)r->max_batch * (size_t)s->fields;
	float *scores = ev->binary ? malloc((ds->n ? ds->n : 1) * sizeof(float)) : NULL;
	struct metrics_pair *pairs = ev->binary ? malloc((ds->n ? ds->n : 1) * sizeof(*pairs)) : NULL;
	struct eval_rows rows = *er;
	rows.U = er->fetch ? malloc((r->e_max_u ? r->e_max_u : 1) * (size_t)s->dim * sizeof(float)) : NULL;
	double loss, right;
	int e = (ev->binary && (!scores || !pairs)) || (er->fetch && !rows.U) ||
				(s->fields && embed_plan_init(&plan, segs, segs)) ? -ENOMEM : 0;
	if (!e)
		e = eval_chunks(r, params, &rows, ds, s->fields ? &plan : NULL, scores, &loss, &right);
	if (!e) {
		ev->acc = ds->n ? right / (double)ds->n : 0;
		ev->loss = ds->n ? loss / (double)ds->n : 0;
	}
	if (!e && ev->binary) {
		ev->loss = metrics_logloss(scores, ds->y, ds->n);
		ev->auc = metrics_auc(scores, ds->y, ds->n, pairs);
	}
	embed_plan_free(&plan);
	free(scores);
	free(pairs);
	free(rows.U);
	return e;
}

int devices_eval_replica(struct replica *r, const float *params, const float *table,
			 const struct dataset *ds, struct eval_result *ev)
{
	struct eval_rows er = { .table = table };
	return eval_replica(r, params, &er, ds, ev);
}

void devices_show_eval(struct progress *pg, long step, const struct eval_result *ev)
{
	if (ev->binary)
		progress_eval_auc(pg, step, ev->loss, ev->auc);
	else
		progress_eval(pg, step, ev->loss, ev->acc);
}

int devices_eval(struct devices *d, const struct dataset *ds, struct eval_result *ev, char *err,
		 size_t errlen)
{
	const struct embed_spec *s = &d->m->embed;
	devices_forget_pass(d);   /* its activations are gone */
	d->rep[0].failed = NULL;
	if (s->fields && (!d->emb || ds->f != (size_t)s->fields || !ds->ids)) {
		memset(ev, 0, sizeof(*ev));
		return err_set(err, errlen, -EINVAL, "evaluation: %s", !d->emb ? "the devices have no embedding tables (devices_embed_open)"
			       : "the set's categorical fields are not the embedding layer's");
	}
	char ferr[CONFIG_ERR_MAX] = "";
	struct eval_rows er = { .table = d->emb ? d->emb->table : NULL, .err = ferr, .errlen = sizeof(ferr) };
	if (d->emb && !d->emb->table)
		er.fetch = &d->emb->fetch;
	int e = eval_replica(&d->rep[0], d->params[0], &er, ds, ev);
	if (e && ferr[0])
		return err_set(err, errlen, e, "%s", ferr);
	if (e == -ENOMEM)
		return err_set(err, errlen, e, "evaluation: out of memory for %zu samples", ds->n);
	return e ? eval_fail(d, e, err, errlen) : 0;
}
