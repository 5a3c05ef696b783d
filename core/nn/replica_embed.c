/* A replica's embedding batch: the buffers of the batch-local table and the
 * plan's indexes, taken once with the replica's other buffers, and each
 * batch's plan copied in (replica.h). */
#include "replica.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int replica_embed_init(struct replica *r)
{
	const struct embed_spec *s = &r->m->embed;
	if (!s->fields)
		return 0;
	const struct backend_ops *o = r->be.ops;
	void *ctx = r->be.ctx;
	size_t segs = (size_t)r->max_batch * (size_t)s->fields, R = embed_total_rows(s);
	r->e_max_nnz = segs;
	r->e_max_u = segs < R ? segs : R;
	size_t ub = r->e_max_u * (size_t)s->dim * sizeof(float);
	int e = o->alloc(ctx, (void **)&r->U, ub);
	if (!e)
		e = o->alloc(ctx, (void **)&r->dU, ub);
	if (!e)
		e = o->alloc(ctx, (void **)&r->e_rows, r->e_max_u * sizeof(uint64_t));
	if (!e)
		e = o->alloc(ctx, (void **)&r->e_off, (segs + 1) * sizeof(uint32_t));
	if (!e)
		e = o->alloc(ctx, (void **)&r->e_idx, segs * sizeof(uint32_t));
	if (!e)
		e = o->alloc(ctx, (void **)&r->e_roff, (r->e_max_u + 1) * sizeof(uint32_t));
	if (!e)
		e = o->alloc(ctx, (void **)&r->e_rseg, segs * sizeof(uint32_t));
	if (!e && !o->embed_gather && !(r->e_stage = malloc(ub ? ub : 1)))
		e = -ENOMEM;
	return e;
}

void replica_embed_free(struct replica *r)
{
	const struct backend_ops *o = r->be.ops;
	void *ctx = r->be.ctx;
	o->release(ctx, r->U);
	o->release(ctx, r->dU);
	o->release(ctx, r->e_rows);
	o->release(ctx, r->e_off);
	o->release(ctx, r->e_idx);
	o->release(ctx, r->e_roff);
	o->release(ctx, r->e_rseg);
	free(r->e_stage);
	r->e_stage = NULL;
}

/* The plan's indexes into the replica; its rows come next (gathered from
 * a table, or uploaded as they are). */
static int embed_load_plan(struct replica *r, const struct embed_plan *p)
{
	const struct embed_spec *s = &r->m->embed;
	r->e_B = 0;
	if (!s->fields || p->F != s->fields || p->B < 1 || p->B > r->max_batch || p->nnz > r->e_max_nnz ||
	    p->u > r->e_max_u)
		return -EINVAL;
	const struct backend_ops *o = r->be.ops;
	void *ctx = r->be.ctx;
	size_t segs = (size_t)p->B * (size_t)p->F;
	int e = o->upload(ctx, r->e_off, p->off, (segs + 1) * sizeof(uint32_t));
	if (!e && p->nnz)
		e = o->upload(ctx, r->e_idx, p->idx, p->nnz * sizeof(uint32_t));
	if (!e)
		e = o->upload(ctx, r->e_roff, p->roff, (p->u + 1) * sizeof(uint32_t));
	if (!e && p->nnz)
		e = o->upload(ctx, r->e_rseg, p->rseg, p->nnz * sizeof(uint32_t));
	/* Only a backend gathering from the table reads the rows' ids; a
	 * GPU's upload would be one more wait on its stream a step. */
	if (!e && p->u && o->embed_gather)
		e = o->upload(ctx, r->e_rows, p->rows, p->u * sizeof(uint64_t));
	return e;
}

int replica_embed_load(struct replica *r, const struct embed_plan *p, const float *table)
{
	const struct backend_ops *o = r->be.ops;
	int DIM = r->m->embed.dim;
	int e = embed_load_plan(r, p);
	if (!e && p->u && o->embed_gather) {
		e = o->embed_gather(r->be.ctx, r->U, table, r->e_rows, p->u, DIM);
	} else if (!e && p->u) {
		/* The table is host memory the backend cannot read: the same
		 * copy on the host, then up. */
		embed_gather_rows(r->e_stage, table, p->rows, p->u, DIM);
		e = o->upload(r->be.ctx, r->U, r->e_stage, p->u * (size_t)DIM * sizeof(float));
	}
	if (e)
		return e;
	r->e_u = p->u;
	r->e_B = p->B;
	return 0;
}

int replica_embed_load_rows(struct replica *r, const struct embed_plan *p, const float *U)
{
	const struct backend_ops *o = r->be.ops;
	int e = embed_load_plan(r, p);
	if (!e && p->u)
		e = o->upload(r->be.ctx, r->U, U, p->u * (size_t)r->m->embed.dim * sizeof(float));
	if (e)
		return e;
	r->e_u = p->u;
	r->e_B = p->B;
	return 0;
}
