/* The embedding tables of a run's devices: each batch's plan and its rows
 * into the replica before the forward pass, and after the dense optimizer
 * the sparse one (a local run, which holds the tables), or the batch's
 * gradient rows handed to the caller (a worker, whose ps hold them). See
 * devices.h (devices_embed_open, devices_embed_open_remote) and
 * devices_embed.h. */
#include "devices_embed.h"
#include "gradfold.h"

#include "../../base/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A slot's plan and IDs, and remote its rows' buffer (u floats). */
static int slot_new(struct devices_embed_slot *sl, size_t segs, size_t u, int remote)
{
	if (embed_plan_init(&sl->plan, segs, segs) || !(sl->ids = malloc(segs * sizeof(uint32_t))))
		return -ENOMEM;
	if (remote && !(sl->U = malloc((u ? u : 1) * sizeof(float))))
		return -ENOMEM;
	return 0;
}

static void slot_free(struct devices_embed_slot *sl)
{
	embed_plan_free(&sl->plan);
	free(sl->ids);
	free(sl->U);
}

static void embed_free(struct devices_embed *em)
{
	for (int s = 0; s < 2; s++)
		slot_free(&em->slot[s]);
	free(em->dU);
	free(em->sl_rows);
	free(em->sl_dU);
	free(em->sl_n);
	free(em->sl_cur);
	free(em->fold_rows);
	free(em->fold_dU);
	free(em);
}

/* The state both kinds share: the plan and the batch's IDs (remote, two
 * of them, and the host buffers of each batch's rows and of the last
 * one's gradient). */
static int embed_new(struct devices *d, int remote, char *err, size_t errlen)
{
	const struct embed_spec *s = &d->m->embed;
	if (!s->fields)
		return err_set(err, errlen, -EINVAL, "the model has no embedding layer");
	if (d->n != 1)
		return err_set(err, errlen, -EOPNOTSUPP,
			       "an embedding layer trains on one replica for now, not on %d %s replicas",
			       d->n, d->gpu ? "GPU" : "CPU");
	struct devices_embed *em = calloc(1, sizeof(*em));
	size_t segs = (size_t)d->max_batch * (size_t)s->fields, R = embed_total_rows(s);
	size_t u = (segs < R ? segs : R) * (size_t)s->dim;
	int ok = em && !slot_new(&em->slot[0], segs, u, remote) && (!remote || !slot_new(&em->slot[1], segs, u, 1));
	/* Host copies: remote, of the gradient; local on a GPU, of the
	 * gradient the sparse optimizer reads on the host. */
	if (ok && (remote || d->gpu))
		ok = (em->dU = malloc((u ? u : 1) * sizeof(float))) != NULL;
	if (!ok) {
		if (em)
			embed_free(em);
		return err_set(err, errlen, -ENOMEM, "out of memory for the embedding plan of %zu IDs", segs);
	}
	d->emb = em;
	return 0;
}

int devices_embed_open(struct devices *d, float *table, struct sparse_optim *o, char *err,
		       size_t errlen)
{
	const struct embed_spec *s = &d->m->embed;
	if (s->fields && (o->rows != embed_total_rows(s) || o->dim != s->dim))
		return err_set(err, errlen, -EINVAL, "a sparse optimizer over %llu rows of %d for tables of %llu of %d",
			       (unsigned long long)o->rows, o->dim, (unsigned long long)embed_total_rows(s),
			       s->dim);
	int e = embed_new(d, 0, err, errlen);
	if (e)
		return e;
	d->emb->table = table;
	d->emb->opt = o;
	return 0;
}

int devices_embed_open_remote(struct devices *d, const struct embed_fetch *f, char *err, size_t errlen)
{
	int e = embed_new(d, 1, err, errlen);
	if (!e)
		d->emb->fetch = *f;
	return e;
}

void devices_embed_close(struct devices *d)
{
	if (!d->emb)
		return;
	embed_free(d->emb);
	d->emb = NULL;
}

/* The plan of the batch order[at .. at + B) into slot sl. */
static int embed_plan_of(struct devices *d, struct devices_embed_slot *sl, size_t at, int B)
{
	const struct embed_spec *s = &d->m->embed;
	if (d->data->f != (size_t)s->fields || !d->data->ids)
		return -EINVAL;   /* job_load said so with the file's name first */
	dataset_gather_ids(d->data, d->host_order + at, (size_t)B, sl->ids);
	return embed_plan_build(&sl->plan, s, NULL, sl->ids, B);
}

int devices_embed_plan(struct devices *d, size_t at, int B, const struct embed_plan **plan, float **U,
		       char *err, size_t errlen)
{
	struct devices_embed *em = d->emb;
	if (!em || em->table)
		return err_set(err, errlen, -EINVAL, "the devices' embedding rows are not the caller's");
	/* Never the last batch's slot: its rows may still be going up. */
	struct devices_embed_slot *sl = &em->slot[em->last ^ 1];
	sl->planned = 0;
	if (!d->norder || at > d->norder || B < 1 || B > d->max_batch || (size_t)B > d->norder - at)
		return err_set(err, errlen, -EINVAL, "samples %zu to %zu of an order of %zu", at, at + (size_t)B,
			       d->norder);
	int e = embed_plan_of(d, sl, at, B);
	if (e)
		return err_set(err, errlen, e, "the embedding plan of a batch of %d", B);
	sl->at = at;
	sl->B = B;
	sl->planned = 1;
	*plan = &sl->plan;
	*U = sl->U;
	return 0;
}

int devices_embed_grads(struct devices *d, const uint64_t **rows, size_t *u, const float **dU, char *err,
			size_t errlen)
{
	struct devices_embed *em = d->emb;
	if (!em || em->table || !em->pending)
		return err_set(err, errlen, -EINVAL, "no embedding batch has a gradient");
	struct replica *r = &d->rep[0];
	const struct embed_plan *p = &em->slot[em->last].plan;
	size_t n = p->u * (size_t)d->m->embed.dim;
	int e = n ? r->be.ops->download(r->be.ctx, em->dU, r->dU, n * sizeof(float)) : 0;
	if (e)
		return err_set(err, errlen, e, "the embedding rows' gradient: %s", strerror(-e));
	*rows = p->rows;
	*u = p->u;
	*dU = em->dU;
	return 0;
}

int devices_embed_batch(struct devices *d, int r, size_t at, int B)
{
	struct devices_embed *em = d->emb;
	int e = -EINVAL;
	em->pending = 0;
	if (em->table) {
		e = embed_plan_of(d, &em->slot[0], at, B);
		if (!e)
			e = replica_embed_load(&d->rep[r], &em->slot[0].plan, em->table);
	} else {
		/* The rows devices_embed_plan asked the caller for, of this
		 * very batch: once. */
		for (int s = 0; s < 2; s++) {
			struct devices_embed_slot *sl = &em->slot[s];
			if (e && sl->planned && sl->at == at && sl->B == B) {
				em->last = s;
				e = 0;
			}
			sl->planned = 0;
		}
		if (!e)
			e = replica_embed_load_rows(&d->rep[r], &em->slot[em->last].plan, em->slot[em->last].U);
	}
	em->pending = !e;
	return e;
}

int devices_embed_apply(struct devices *d)
{
	struct devices_embed *em = d->emb;
	if (!em || !em->pending || !em->table)
		return 0;
	struct replica *r = &d->rep[0];
	/* On a GPU the host's copy, even of no rows: r->dU is device memory. */
	const float *dU = d->gpu ? em->dU : r->dU;
	const struct embed_plan *p = &em->slot[0].plan;
	size_t n = p->u * (size_t)d->m->embed.dim;
	if (d->gpu && n) {
		int e = r->be.ops->download(r->be.ctx, em->dU, r->dU, n * sizeof(float));
		if (e)
			return e;
	}
	sparse_optim_step(em->opt, em->table, p->rows, dU, p->u, em->opt->cfg.lr);
	em->pending = 0;
	return 0;
}

int devices_embed_slices(struct devices *d, int S, char *err, size_t errlen)
{
	struct devices_embed *em = d->emb;
	const struct embed_spec *s = &d->m->embed;
	if (!em || !em->table || S < 1)
		return err_set(err, errlen, -EINVAL, "slices of an embedding need the tables on the devices");
	size_t R = embed_total_rows(s), segs = (size_t)d->max_batch * (size_t)s->fields, D = (size_t)s->dim;
	segs = segs < R ? segs : R;
	size_t n = (size_t)S * (segs ? segs : 1);
	em->sl_rows = malloc(n * sizeof(uint64_t));
	em->sl_dU = malloc(n * D * sizeof(float));
	em->sl_n = calloc((size_t)S, sizeof(size_t));
	em->sl_cur = calloc((size_t)S, sizeof(size_t));
	em->fold_rows = malloc(n * sizeof(uint64_t));
	em->fold_dU = malloc(n * D * sizeof(float));
	if (!em->sl_rows || !em->sl_dU || !em->sl_n || !em->sl_cur || !em->fold_rows || !em->fold_dU)
		return err_set(err, errlen, -ENOMEM, "out of memory for %d slices of embedding rows", S);
	em->S = S;
	em->segs = segs;
	return 0;
}

int devices_embed_keep(struct devices *d, int s)
{
	struct devices_embed *em = d->emb;
	struct replica *r = &d->rep[0];
	const struct embed_plan *p = &em->slot[0].plan;
	size_t D = (size_t)d->m->embed.dim, u = p->u;
	if (s < 0 || s >= em->S || u > em->segs)
		return -EINVAL;
	float *dst = em->sl_dU + (size_t)s * em->segs * D;
	int e = u ? r->be.ops->download(r->be.ctx, dst, r->dU, u * D * sizeof(float)) : 0;
	if (e)
		return e;
	memcpy(em->sl_rows + (size_t)s * em->segs, p->rows, u * sizeof(uint64_t));
	em->sl_n[s] = u;
	em->pending = 0;
	return 0;
}

void devices_embed_fold(struct devices *d, int S)
{
	struct devices_embed *em = d->emb;
	size_t D = (size_t)d->m->embed.dim;
	const uint64_t *rows[CONFIG_MAX_HOSTS];
	const float *vals[CONFIG_MAX_HOSTS];
	for (int s = 0; s < S; s++) {
		rows[s] = em->sl_rows + (size_t)s * em->segs;
		vals[s] = em->sl_dU + (size_t)s * em->segs * D;
	}
	size_t u = grad_fold_rows(S, rows, vals, em->sl_n, d->m->embed.dim, S, em->sl_cur, em->fold_rows,
				  em->fold_dU);
	sparse_optim_step(em->opt, em->table, em->fold_rows, em->fold_dU, u, em->opt->cfg.lr);
}
