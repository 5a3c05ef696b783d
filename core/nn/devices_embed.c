/* The embedding tables of a local run's devices: each batch's plan and its
 * rows into the replica before the forward pass, and the sparse optimizer
 * after the dense one. See devices.h (devices_embed_open) and
 * devices_embed.h. */
#include "devices_embed.h"

#include "../../base/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int devices_embed_open(struct devices *d, float *table, struct sparse_optim *o, char *err,
		       size_t errlen)
{
	const struct embed_spec *s = &d->m->embed;
	if (!s->fields)
		return err_set(err, errlen, -EINVAL, "the model has no embedding layer");
	if (d->gpu || d->n != 1)
		return err_set(err, errlen, -EOPNOTSUPP,
			       "an embedding layer trains on one CPU replica for now, not on %d %s replicas",
			       d->n, d->gpu ? "GPU" : "CPU");
	if (o->rows != embed_total_rows(s) || o->dim != s->dim)
		return err_set(err, errlen, -EINVAL, "a sparse optimizer over %llu rows of %d for tables of %llu of %d",
			       (unsigned long long)o->rows, o->dim, (unsigned long long)embed_total_rows(s),
			       s->dim);
	struct devices_embed *em = calloc(1, sizeof(*em));
	size_t segs = (size_t)d->max_batch * (size_t)s->fields;
	if (!em || embed_plan_init(&em->plan, segs, segs) ||
	    !(em->ids = malloc(segs * sizeof(uint32_t)))) {
		if (em)
			embed_plan_free(&em->plan);
		free(em);
		return err_set(err, errlen, -ENOMEM, "out of memory for the embedding plan of %zu IDs", segs);
	}
	em->table = table;
	em->opt = o;
	d->emb = em;
	return 0;
}

void devices_embed_close(struct devices *d)
{
	if (!d->emb)
		return;
	embed_plan_free(&d->emb->plan);
	free(d->emb->ids);
	free(d->emb);
	d->emb = NULL;
}

int devices_embed_batch(struct devices *d, int r, size_t at, int B)
{
	struct devices_embed *em = d->emb;
	const struct embed_spec *s = &d->m->embed;
	em->pending = 0;
	if (d->data->f != (size_t)s->fields || !d->data->ids)
		return -EINVAL;   /* job_load said so with the file's name first */
	dataset_gather_ids(d->data, d->host_order + at, (size_t)B, em->ids);
	int e = embed_plan_build(&em->plan, s, NULL, em->ids, B);
	if (!e)
		e = replica_embed_load(&d->rep[r], &em->plan, em->table);
	em->pending = !e;
	return e;
}

void devices_embed_apply(struct devices *d)
{
	struct devices_embed *em = d->emb;
	if (!em || !em->pending)
		return;
	sparse_optim_step(em->opt, em->table, em->plan.rows, d->rep[0].dU, em->plan.u, em->opt->cfg.lr);
	em->pending = 0;
}
