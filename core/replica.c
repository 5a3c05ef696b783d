/* Forward and backward passes of one replica through its backend. */
#include "replica.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static int act_shares_input(const struct model *m, int i)
{
	/* An activation's backward needs only its own output, and a dense
	 * layer's backward needs only its input, so an activation may overwrite
	 * the dense output it follows. After another activation it may not:
	 * that one still needs its output for its own backward. */
	return m->layers[i].kind != LAYER_DENSE && i > 0 && m->layers[i - 1].kind == LAYER_DENSE;
}

int replica_init(struct replica *r, const struct model *m, const struct backend *be,
		 int max_batch, char *err, size_t errlen)
{
	memset(r, 0, sizeof(*r));
	r->m = m;
	r->be = *be;
	r->max_batch = max_batch;
	const struct backend_ops *o = be->ops;
	size_t B = (size_t)max_batch;
	int e = o->alloc(be->ctx, (void **)&r->x, B * (size_t)m->inputs * sizeof(float));
	if (!e)
		e = o->alloc(be->ctx, (void **)&r->y, B * sizeof(int32_t));
	for (int i = 0; !e && i < m->nlayers; i++) {
		if (act_shares_input(m, i))
			r->act[i] = r->act[i - 1];
		else
			e = o->alloc(be->ctx, (void **)&r->act[i], B * (size_t)m->layers[i].out * sizeof(float));
	}
	if (!e)
		e = o->alloc(be->ctx, (void **)&r->probs, B * (size_t)m->outputs * sizeof(float));
	for (int i = 0; !e && i < 2; i++)
		e = o->alloc(be->ctx, (void **)&r->grad[i], B * (size_t)m->max_width * sizeof(float));
	if (e) {
		snprintf(err, errlen, "%s: cannot allocate buffers for batch %d: %s",
			 be->where, max_batch, strerror(-e));
		replica_free(r);
		return e;
	}
	return 0;
}

void replica_free(struct replica *r)
{
	if (!r || !r->be.ops)
		return;
	const struct backend_ops *o = r->be.ops;
	o->release(r->be.ctx, r->x);
	o->release(r->be.ctx, r->y);
	for (int i = 0; r->m && i < r->m->nlayers; i++)
		if (!act_shares_input(r->m, i))
			o->release(r->be.ctx, r->act[i]);
	o->release(r->be.ctx, r->probs);
	o->release(r->be.ctx, r->grad[0]);
	o->release(r->be.ctx, r->grad[1]);
	memset(r, 0, sizeof(*r));
}

int replica_load(struct replica *r, const float *x, const int32_t *y, int B)
{
	if (B < 1 || B > r->max_batch)
		return -EINVAL;
	const struct backend_ops *o = r->be.ops;
	int e = o->upload(r->be.ctx, r->x, x, (size_t)B * (size_t)r->m->inputs * sizeof(float));
	if (!e)
		e = o->upload(r->be.ctx, r->y, y, (size_t)B * sizeof(int32_t));
	return e;
}

int replica_forward(struct replica *r, const float *params, int B, double *loss_sum, int *correct)
{
	const struct model *m = r->m;
	const struct backend_ops *o = r->be.ops;
	const float *in = r->x;   /* (B, layer.in) */
	int e = 0;
	for (int i = 0; !e && i < m->nlayers; i++) {
		const struct layer *l = &m->layers[i];
		if (l->kind == LAYER_DENSE)
			e = o->dense_forward(r->be.ctx, r->act[i], in, params + l->woff, params + l->boff,
					     B, l->in, l->out);
		else
			e = o->act_forward(r->be.ctx, l->kind, r->act[i], in, (size_t)B * (size_t)l->out);
		in = r->act[i];
	}
	if (!e)
		e = o->xent_forward(r->be.ctx, r->probs, loss_sum, correct, in, r->y, B, m->outputs);
	return e;
}

int replica_backward(struct replica *r, const float *params, float *grads, int B, float scale)
{
	const struct model *m = r->m;
	const struct backend_ops *o = r->be.ops;
	int cur = 0;
	float *dout = r->grad[cur];   /* (B, layer.out) */
	int e = o->xent_backward(r->be.ctx, dout, r->probs, r->y, B, m->outputs, scale);
	for (int i = m->nlayers - 1; !e && i >= 0; i--) {
		const struct layer *l = &m->layers[i];
		const float *inp = i > 0 ? r->act[i - 1] : r->x;
		if (l->kind == LAYER_DENSE) {
			/* The first layer's input gradient would be the data's: skip it. */
			float *dinp = i > 0 ? r->grad[cur ^ 1] : NULL;
			e = o->dense_backward(r->be.ctx, dinp, grads + l->woff, grads + l->boff, dout, inp,
					      params + l->woff, B, l->in, l->out);
			cur ^= 1;
			dout = dinp;
		} else {
			e = o->act_backward(r->be.ctx, l->kind, dout, dout, r->act[i], (size_t)B * (size_t)l->out);
		}
	}
	return e;
}

int replica_evaluate(struct replica *r, const float *params, const struct dataset *ds,
		    double *loss, double *acc)
{
	double loss_sum = 0;
	long right = 0;
	for (size_t off = 0; off < ds->n; off += (size_t)r->max_batch) {
		int B = (int)(ds->n - off < (size_t)r->max_batch ? ds->n - off : (size_t)r->max_batch);
		double l;
		int c;
		int e = replica_load(r, ds->x + off * ds->d, ds->y + off, B);
		if (!e)
			e = replica_forward(r, params, B, &l, &c);
		if (e)
			return e;
		loss_sum += l;
		right += c;
	}
	*loss = loss_sum / (double)ds->n;
	*acc = (double)right / (double)ds->n;
	return 0;
}
