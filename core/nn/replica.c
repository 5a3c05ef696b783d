/* Forward and backward passes of one replica through its backend. */
#include "replica.h"
#include "factors.h"
#include "optim.h"
#include "rng.h"
#include "gradflow.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static int is_activation(enum layer_kind k)
{
	return k == LAYER_RELU || k == LAYER_TANH || k == LAYER_SIGMOID;
}

/* Does layer i write its output into its input's buffer? A flatten always
 * does: NCHW (C, H, W) is already the flat vector, so it is a no-op. An
 * activation's backward needs only its own output, and the backward of a
 * dense, conv or batchnorm layer needs only its input, so an activation may
 * overwrite the output of those it follows. After another activation it may
 * not: that one still needs its output for its own backward; nor after a
 * pooling layer (max pooling rescans its input, but a flatten between may
 * hand the same buffer on). */
static int buffer_shared(const struct model *m, int i)
{
	enum layer_kind k = m->layers[i].kind;
	if (k == LAYER_FLATTEN)
		return 1;
	if (!is_activation(k) || i == 0)
		return 0;
	enum layer_kind prev = m->layers[i - 1].kind;
	return prev == LAYER_DENSE || prev == LAYER_CONV || prev == LAYER_BATCHNORM;
}

uint64_t replica_key(uint64_t seed, long step, int stream)
{
	return rng_hash(rng_hash(seed, RNG_DROPOUT, (uint64_t)step), RNG_DROPOUT, (uint64_t)stream);
}

int replica_init(struct replica *r, const struct model *m, const struct backend *be,
		 int max_batch, char *err, size_t errlen)
{
	memset(r, 0, sizeof(*r));
	r->m = m;
	r->be = *be;
	r->max_batch = max_batch;
	const struct backend_ops *o = be->ops;
	size_t B = (size_t)max_batch, ncol = 0;
	int e = o->alloc(be->ctx, (void **)&r->x, B * (size_t)m->inputs * sizeof(float));
	if (!e)
		e = o->alloc(be->ctx, (void **)&r->y, B * sizeof(int32_t));
	for (int i = 0; !e && i < m->nlayers; i++) {
		const struct layer *l = &m->layers[i];
		if (buffer_shared(m, i))
			r->act[i] = i > 0 ? r->act[i - 1] : r->x;
		else
			e = o->alloc(be->ctx, (void **)&r->act[i], B * (size_t)l->out * sizeof(float));
		if (!e && l->kind == LAYER_BATCHNORM)
			e = o->alloc(be->ctx, (void **)&r->stats[i], 2 * (size_t)l->C * sizeof(float));
		if (!e && l->kind == LAYER_CONV) {
			size_t n = o->conv_col_floats ? o->conv_col_floats(be->ctx, &l->win, l->OC, max_batch)
						      : conv_col_size(&l->win, l->OC, max_batch);
			ncol = n > ncol ? n : ncol;
			n = o->conv_keep_floats ? o->conv_keep_floats(be->ctx, &l->win, l->OC, max_batch) : 0;
			if (n)
				e = o->alloc(be->ctx, (void **)&r->keep[i], n * sizeof(float));
		}
	}
	if (!e && ncol)
		e = o->alloc(be->ctx, (void **)&r->col, ncol * sizeof(float));
	if (!e)
		e = o->alloc(be->ctx, (void **)&r->probs, B * (size_t)m->outputs * sizeof(float));
	for (int i = 0; !e && i < 2; i++)
		e = o->alloc(be->ctx, (void **)&r->grad[i], B * (size_t)m->max_width * sizeof(float));
	if (!e)
		e = replica_embed_init(r);
	if (!e)
		e = o->alloc(be->ctx, (void **)&r->meter, 4 * sizeof(double));
	if (!e)
		e = o->zero(be->ctx, r->meter, 4 * sizeof(double));
	if (!e && o->reserve)
		e = o->reserve(be->ctx, max_batch, m->max_width > m->outputs ? m->max_width : m->outputs);
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
	for (int i = 0; r->m && i < r->m->nlayers; i++) {
		if (!buffer_shared(r->m, i))
			o->release(r->be.ctx, r->act[i]);
		o->release(r->be.ctx, r->stats[i]);
		o->release(r->be.ctx, r->keep[i]);
	}
	o->release(r->be.ctx, r->col);
	o->release(r->be.ctx, r->probs);
	o->release(r->be.ctx, r->grad[0]);
	o->release(r->be.ctx, r->grad[1]);
	o->release(r->be.ctx, r->meter);
	replica_embed_free(r);
	for (int i = 0; i < MODEL_MAX_LAYERS; i++)
		free(r->dz[i]);
	free(r->rowdone);
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

int replica_gather(struct replica *r, const float *data_x, const int32_t *data_y,
		   const uint32_t *order, size_t at, int B)
{
	if (B < 1 || B > r->max_batch)
		return -EINVAL;
	return r->be.ops->gather(r->be.ctx, r->x, r->y, data_x, data_y, order, at, B,
				 (size_t)r->m->inputs);
}

static int layer_forward(struct replica *r, int i, const float *params, const float *in, int B)
{
	const struct layer *l = &r->m->layers[i];
	const struct backend_ops *o = r->be.ops;
	void *ctx = r->be.ctx;
	float *out = r->act[i];   // (B, l->out)
	size_t N = (size_t)B * (size_t)l->out;
	switch (l->kind) {
	case LAYER_DENSE:
		return o->dense_forward(ctx, out, in, params + l->woff, params + l->boff, B, l->in, l->out);
	case LAYER_CONV:
		return o->conv_forward(ctx, out, r->col, r->keep[i], in, params + l->woff,
				       params + l->boff, B, l->OC, &l->win);
	case LAYER_MAXPOOL:
	case LAYER_AVGPOOL:
		return o->pool_forward(ctx, l->kind, out, in, B, &l->win);
	case LAYER_DROPOUT:
		/* p = 0 is the identity: evaluation keeps every unit. */
		return o->dropout_forward(ctx, out, in, r->training ? l->p : 0.0f, r->key, i, N);
	case LAYER_FLATTEN:
		return 0;   /* out is in */
	case LAYER_EMBEDDING: {
		const struct embed_spec *s = &r->m->embed;
		if (r->e_B != B)
			return -EINVAL;   /* no plan of this batch (replica_embed_load) */
		return o->embed_forward(ctx, out, in, r->U, r->e_off, r->e_idx, B, s->fields, l->in, s->dim,
					s->pool);
	}
	case LAYER_BATCHNORM: {
		float *mean = r->training ? r->stats[i] : NULL;
		float *var = r->training ? r->stats[i] + l->C : NULL;
		return o->batchnorm_forward(ctx, out, mean, var, in, params + l->woff, params + l->boff,
					    params + l->moff, params + l->voff, B, l->C, l->H * l->W);
	}
	case LAYER_RELU:
	case LAYER_TANH:
	case LAYER_SIGMOID:
		return o->act_forward(ctx, l->kind, out, in, N);
	}
	return -EINVAL;
}

/* Does the backend fuse dense layer i with the activation after it (which
 * then writes into the dense layer's output, buffer_shared)? */
static int fused_with_next(const struct replica *r, int i)
{
	const struct model *m = r->m;
	return r->be.ops->dense_act_forward && m->layers[i].kind == LAYER_DENSE &&
	       i + 1 < m->nlayers && is_activation(m->layers[i + 1].kind) && buffer_shared(m, i + 1);
}

/* Layers the backend's bn_relu_* fuse with batchnorm i: 2 (the relu
 * after it, which writes into the batchnorm's buffer: buffer_shared), 3
 * (and the pooling after that, when its windows tile its input), or 0
 * (no such entries, or another order). The same answer for forward and
 * backward, so a backward undoes exactly what its forward fused. */
static int bn_group(const struct replica *r, int i)
{
	const struct model *m = r->m;
	const struct backend_ops *o = r->be.ops;
	if (!o->bn_relu_forward || !o->bn_relu_backward || m->layers[i].kind != LAYER_BATCHNORM ||
	    i + 1 >= m->nlayers || m->layers[i + 1].kind != LAYER_RELU || !buffer_shared(m, i + 1))
		return 0;
	const struct layer *p = i + 2 < m->nlayers ? &m->layers[i + 2] : NULL;
	if (p && (p->kind == LAYER_MAXPOOL || p->kind == LAYER_AVGPOOL) && p->win.S == p->win.K &&
	    p->win.P == 0)
		return 3;
	return 2;
}

/* The batchnorm whose fused group (bn_group) ends at layer i, or -1. */
static int bn_group_ending(const struct replica *r, int i)
{
	if (i >= 2 && bn_group(r, i - 2) == 3)
		return i - 2;
	if (i >= 1 && bn_group(r, i - 1) == 2)
		return i - 1;
	return -1;
}

/* Batchnorm i and the grp - 1 layers after it in one pass: the relu's
 * output in the batchnorm's buffer, the pooling's in its own. */
static int bn_group_forward(struct replica *r, int i, int grp, const float *params,
			    const float *in, int B)
{
	const struct layer *l = &r->m->layers[i];
	const struct layer *p = grp == 3 ? &r->m->layers[i + 2] : NULL;
	float *mean = r->training ? r->stats[i] : NULL;
	float *var = r->training ? r->stats[i] + l->C : NULL;
	return r->be.ops->bn_relu_forward(r->be.ctx, r->act[i], p ? r->act[i + 2] : NULL, mean, var, in,
					  params + l->woff, params + l->boff, params + l->moff,
					  params + l->voff, B, l->C, l->H * l->W,
					  p ? p->kind : LAYER_RELU, p ? &p->win : NULL);
}

/* Where forward_layers waits for parameters (replica_forward_flow,
 * replica_forward_layers), or NULL: they are all there. whole: every
 * layer waits for all of its own at once and then runs as without a
 * wait (no dense layer row block by row block). */
struct param_wait {
	int (*ready)(void *ctx, size_t lo, size_t want, size_t most, size_t unit, size_t *have);
	void *ctx;
	int whole;
};

/* Dense layer i over the weight rows as they arrive: the bias first
 * (every block of columns starts from it), then each run of whole rows
 * that is ready, in multiples of REPLICA_FORWARD_ROWS, so that the
 * product of the first rows overlaps the arrival of the last. */
static int dense_forward_arriving(struct replica *r, int i, const float *params, const float *in,
				  int B, const struct param_wait *pw)
{
	const struct layer *l = &r->m->layers[i];
	size_t C = (size_t)l->in, w = l->woff, wend = w + (size_t)l->out * C, have;
	int e = pw->ready(pw->ctx, l->boff, l->boff + (size_t)l->out, l->boff + (size_t)l->out, 1, &have);
	for (int a = 0; !e && a < l->out;) {
		int least = l->out - a < REPLICA_FORWARD_ROWS ? l->out - a : REPLICA_FORWARD_ROWS;
		e = pw->ready(pw->ctx, w + (size_t)a * C, w + (size_t)(a + least) * C, wend,
			      REPLICA_FORWARD_ROWS * C, &have);
		int b = (int)((have - w) / C);
		if (!e)
			e = r->be.ops->dense_forward_rows(r->be.ctx, r->act[i], in, params + w, params + l->boff, B,
							  l->in, l->out, a, b);
		a = b;
	}
	return e;
}

/* Every layer's forward from the batch x; the logits end in the last
 * layer's buffer, which is returned in *logits. With pw, each layer first
 * waits for its parameters. */
static int forward_layers(struct replica *r, const float *params, const float *x, int B,
			  int training, uint64_t key, const struct param_wait *pw, const float **logits)
{
	const struct model *m = r->m;
	const float *in = x;   /* (B, layer.in) */
	r->training = training;
	r->key = key;
	r->failed = NULL;
	for (int i = 0; i < m->nlayers; i++) {
		const struct layer *l = &m->layers[i];
		int e = 0, grp;
		size_t have;
		if (pw && !pw->whole && l->kind == LAYER_DENSE) {
			e = dense_forward_arriving(r, i, params, in, B, pw);
		} else if (pw && l->nparams &&
			   (e = pw->ready(pw->ctx, l->woff, l->woff + l->nparams, l->woff + l->nparams, 1, &have))) {
			/* the parameters will not come: e says why */
		} else if ((grp = bn_group(r, i)) > 0) {
			e = bn_group_forward(r, i, grp, params, in, B);
			i += e == 0 ? grp - 1 : 0;   /* the output is the last layer's buffer */
		} else if (fused_with_next(r, i)) {
			e = r->be.ops->dense_act_forward(r->be.ctx, r->act[i], in, params + l->woff,
							 params + l->boff, B, l->in, l->out,
							 m->layers[i + 1].kind);
			i += e == 0;   /* the activation is done: its output is this buffer */
		} else {
			e = layer_forward(r, i, params, in, B);
		}
		if (e) {
			r->failed = e == -ECANCELED ? NULL : l->name;
			return e;
		}
		in = r->act[i];
	}
	*logits = in;
	return 0;
}

/* The backward of batchnorm j fused with layers j+1 .. end (bn_group)
 * from *dout, their output gradient: relu's (and pooling's) backward
 * into g, the other gradient buffer when pooling makes the input larger
 * than dout, else dout itself, then batchnorm's from g, its input
 * gradient in place over g (none for a first layer: *dout NULL after). */
static int bn_group_backward(struct replica *r, int j, int end, const float *params,
			     float *grads, const float *x, int B, float scale, int *cur,
			     float **dout)
{
	const struct layer *l = &r->m->layers[j], *p = end > j + 1 ? &r->m->layers[end] : NULL;
	float *g = p ? r->grad[*cur ^ 1] : *dout;
	float *dinp = j > 0 ? g : NULL;
	int e = r->be.ops->bn_relu_backward(r->be.ctx, dinp, g, grads + l->woff, grads + l->boff,
					    grads + l->moff, grads + l->voff, *dout, r->act[j],
					    j > 0 ? r->act[j - 1] : x, params + l->woff, r->stats[j],
					    r->stats[j] + l->C, params + l->moff, params + l->voff,
					    scale * (float)B, B, l->C, l->H * l->W,
					    p ? p->kind : LAYER_RELU, p ? &p->win : NULL);
	if (e) {
		r->failed = l->name;
		return e;
	}
	if (p)
		*cur ^= 1;
	*dout = dinp;
	return 0;
}

/* Told once a layer's gradient kernels are queued (replica_train_queued):
 * fn(ctx, lo, hi) with [lo, hi) the layer's parameters. */
struct layer_done {
	int (*fn)(void *ctx, size_t lo, size_t hi);
	void *ctx;
};

/* ld (may be NULL) told that layer i's gradient is queued, if it has one. */
static int layer_queued(const struct layer_done *ld, const struct layer *l)
{
	return ld && l->nparams ? ld->fn(ld->ctx, l->woff, l->woff + l->nparams) : 0;
}

/* Every layer's backward from dout = r->grad[cur], the loss gradient.
 * defer (replica_train_flow): dense layers' weight gradients are left
 * out, each layer's dout kept in r->dz for them. ld (without defer, or
 * NULL): told after each layer's kernels, the last layer first. */
static int backward_layers(struct replica *r, const float *params, float *grads, const float *x,
			   int B, float scale, int cur, int defer, const struct layer_done *ld)
{
	const struct model *m = r->m;
	const struct backend_ops *o = r->be.ops;
	void *ctx = r->be.ctx;
	float *dout = r->grad[cur];   /* (B, layer.out) */
	int bias_done = 0;            /* the activation after a dense layer took its bias gradient */
	int e = 0;
	for (int i = m->nlayers - 1; !e && i >= 0; i--) {
		const struct layer *l = &m->layers[i];
		const float *inp = i > 0 ? r->act[i - 1] : x;
		size_t N = (size_t)B * (size_t)l->out;
		/* The first layer's input gradient would be the data's: skip it. */
		float *dinp = i > 0 ? r->grad[cur ^ 1] : NULL;
		int swap = 1, j = bn_group_ending(r, i);
		if (j >= 0) {
			e = bn_group_backward(r, j, i, params, grads, x, B, scale, &cur, &dout);
			i = j;
			if (!e)
				e = layer_queued(ld, &m->layers[j]);
			if (!dout)
				break;   /* the batchnorm was the first layer */
			continue;
		}
		switch (l->kind) {
		case LAYER_DENSE:
			/* The flow's backends keep their buffers in host memory
			 * (a CPU backend): a plain copy keeps dout. */
			if (defer)
				memcpy(r->dz[i], dout, N * sizeof(float));
			e = o->dense_backward(ctx, dinp, defer ? NULL : grads + l->woff,
					      bias_done ? NULL : grads + l->boff, dout, inp,
					      params + l->woff, B, l->in, l->out);
			bias_done = 0;
			break;
		case LAYER_CONV:
			e = o->conv_backward(ctx, dinp, grads + l->woff, grads + l->boff, r->col,
					     r->keep[i], dout, inp, params + l->woff, B, l->OC,
					     &l->win);
			break;
		case LAYER_BATCHNORM:
			e = o->batchnorm_backward(ctx, dinp, grads + l->woff, grads + l->boff,
						  grads + l->moff, grads + l->voff, dout, inp,
						  params + l->woff, r->stats[i], r->stats[i] + l->C,
						  params + l->moff, params + l->voff, scale * (float)B,
						  B, l->C, l->H * l->W);
			break;
		case LAYER_MAXPOOL:
		case LAYER_AVGPOOL:
			if (dinp)
				e = o->pool_backward(ctx, l->kind, dinp, dout, inp, B, &l->win);
			break;
		case LAYER_DROPOUT:
			swap = 0;
			if (l->p != 0.0f)
				e = o->dropout_backward(ctx, dout, dout, l->p, r->key, i, N);
			break;
		case LAYER_FLATTEN:
			swap = 0;
			break;
		case LAYER_EMBEDDING: {
			const struct embed_spec *s = &m->embed;
			e = o->embed_backward(ctx, r->dU, dout, r->e_roff, r->e_rseg, r->e_off, r->e_u,
					      s->fields, l->in, s->dim, s->pool);
			break;
		}
		case LAYER_RELU:
		case LAYER_TANH:
		case LAYER_SIGMOID:
			swap = 0;
			if (i > 0 && fused_with_next(r, i - 1) && o->act_bias_backward) {
				const struct layer *d = &m->layers[i - 1];
				e = o->act_bias_backward(ctx, l->kind, dout, grads + d->boff, r->act[i], B,
							 d->out);
				bias_done = 1;
			} else {
				e = o->act_backward(ctx, l->kind, dout, dout, r->act[i], N);
			}
			break;
		}
		if (e) {
			r->failed = l->name;
			break;
		}
		if ((e = layer_queued(ld, l)))
			break;
		if (swap) {
			cur ^= 1;
			dout = dinp;
		}
		if (!dout)
			break;   /* the first layer had no parameters */
	}
	return e;
}

/* The model's loss over logits (B, outputs): train = 1 adds it to the
 * training meter and SETS its gradient in r->grad[0]; train = 0 adds it to
 * the evaluation slots and leaves the probabilities in r->probs. */
static int loss_forward(struct replica *r, const float *logits, const int32_t *y, int B, float scale,
			int train)
{
	const struct backend_ops *o = r->be.ops;
	void *ctx = r->be.ctx;
	int e;
	if (r->m->loss == LOSS_SIGMOID_XENT && !o->sigmoid_xent_train)
		e = -EOPNOTSUPP;
	else if (r->m->loss == LOSS_SIGMOID_XENT)
		e = train ? o->sigmoid_xent_train(ctx, r->grad[0], r->meter, logits, y, B, scale)
			  : o->sigmoid_xent_forward(ctx, r->probs, r->meter + 2, logits, y, B);
	else
		e = train ? o->xent_train(ctx, r->grad[0], r->meter, logits, y, B, r->m->outputs, scale)
			  : o->xent_forward(ctx, r->probs, r->meter + 2, logits, y, B, r->m->outputs);
	if (e)
		r->failed = "the loss";
	return e;
}

/* A training forward pass and the loss, its gradient in r->grad[0]:
 * what replica_train and replica_train_flow do before backward. */
static int train_forward(struct replica *r, const float *params, const float *x, const int32_t *y,
			 int B, uint64_t key, float scale, const struct param_wait *pw)
{
	if (B < 1 || B > r->max_batch)
		return -EINVAL;
	const float *logits;
	int e = forward_layers(r, params, x, B, 1, key, pw, &logits);
	if (e)
		return e;
	return loss_forward(r, logits, y, B, scale, 1);
}

int replica_train(struct replica *r, const float *params, float *grads, const float *x,
		  const int32_t *y, int B, uint64_t key, float scale)
{
	int e = train_forward(r, params, x, y, B, key, scale, NULL);
	return e ? e : backward_layers(r, params, grads, x, B, scale, 0, 0, NULL);
}

int replica_flow_init(struct replica *r)
{
	const struct model *m = r->m;
	if (!r->be.ops->dense_wgrad)
		return -EOPNOTSUPP;
	if (r->rowdone)
		return 0;
	size_t rows = 0;
	for (int i = 0; i < m->nlayers; i++) {
		const struct layer *l = &m->layers[i];
		if (l->kind != LAYER_DENSE)
			continue;
		r->dz[i] = malloc((size_t)r->max_batch * (size_t)l->out * sizeof(float));
		if (!r->dz[i])
			return -ENOMEM;
		r->rowoff[i] = rows;
		rows += (size_t)l->out;
	}
	r->rowdone = calloc(rows ? rows : 1, 1);
	return r->rowdone ? 0 : -ENOMEM;
}

/* The dense layer whose weight holds parameter at, or -1. */
static int weight_at(const struct model *m, size_t at)
{
	for (int i = 0; i < m->nlayers; i++) {
		const struct layer *l = &m->layers[i];
		if (l->kind == LAYER_DENSE && at >= l->woff && at < l->woff + (size_t)l->out * (size_t)l->in)
			return i;
	}
	return -1;
}

/* Rows of dense layer i from row a: up to a block of about
 * REPLICA_FLOW_BLOCK values or, if more, as many as the step's blocks
 * so far, stopping at a row already done and after the row that holds
 * parameter upto - 1 (the end of the stream the block is for: what lies
 * past it can wait). Computes them and reports them final. */
static int flow_block(struct replica *r, int i, int a, size_t upto, float *grads, const float *x,
		      int B, int (*final)(void *, size_t, size_t), void *ctx)
{
	const struct layer *l = &r->m->layers[i];
	uint8_t *done = r->rowdone + r->rowoff[i];
	size_t want = r->flow_made > REPLICA_FLOW_BLOCK ? r->flow_made : REPLICA_FLOW_BLOCK;
	int C = l->in, OC = l->out, b = a;
	int most = want / (size_t)C > 1 ? (int)(want / (size_t)C) : 1;
	while (b < OC && b - a < most && !done[b] && (b == a || l->woff + (size_t)b * C < upto))
		done[b++] = 1;
	const float *inp = i > 0 ? r->act[i - 1] : x;
	int e = r->be.ops->dense_wgrad(r->be.ctx, grads + l->woff, r->dz[i], inp, B, C, OC, a, b);
	if (e) {
		r->failed = l->name;
		return e;
	}
	r->flow_made += (size_t)(b - a) * (size_t)C;
	return final(ctx, l->woff + (size_t)a * C, l->woff + (size_t)b * C);
}

/* The step's runs sent as factors (flow->fx): each whose factors are
 * finite keeps them (its layer's input copied, since the next forward
 * pass may overwrite it while the push still goes out; dZ stays the
 * replica's until the next backward), has its whole rows left out of the
 * blocks and is final at once. A run whose factors are not finite is
 * made as values, where the flow's check finds what is wrong. */
static int flow_factors(struct replica *r, const float *x, int B, struct gradflow *flow)
{
	struct factors *fx = flow->fx;
	const struct model *m = r->m;
	unsigned char copied[MODEL_MAX_LAYERS] = { 0 };
	for (int k = 0; k < fx->n; k++) {
		struct factor_run *run = &fx->run[k];
		int i = run->layer;
		const struct layer *l = &m->layers[i];
		const float *inp = i > 0 ? r->act[i - 1] : x;
		size_t C = (size_t)l->in, OC = (size_t)l->out, na = (size_t)B * C;
		int bad = B != fx->B || B > fx->max_batch || optim_nonfinite(inp, na) < na;
		for (int b = 0; b < B && !bad; b++)
			bad = optim_nonfinite(r->dz[i] + (size_t)b * OC + (size_t)run->row0, (size_t)run->rows) <
			      (size_t)run->rows;
		run->on = !bad;
		if (bad)
			continue;
		if (!copied[i])
			memcpy(fx->a[i], inp, na * sizeof(float));
		copied[i] = 1;
		fx->dz[i] = r->dz[i];
		uint8_t *done = r->rowdone + r->rowoff[i];
		for (int a = run->row0; a < run->row0 + run->rows; a++)
			done[a] |= l->woff + (size_t)a * C >= run->lo && l->woff + (size_t)(a + 1) * C <= run->hi;
		int e = gradflow_mark(flow, run->lo, run->hi);
		if (e)
			return e;
	}
	return 0;
}

int replica_forward_flow(struct replica *r, const float *params, const float *x, const int32_t *y,
			 int B, uint64_t key, float scale,
			 int (*ready)(void *ctx, size_t lo, size_t want, size_t most, size_t unit,
				      size_t *have),
			 void *ctx)
{
	if (!r->be.ops->dense_forward_rows)
		return -EOPNOTSUPP;
	struct param_wait pw = { .ready = ready, .ctx = ctx };
	return train_forward(r, params, x, y, B, key, scale, &pw);
}

int replica_train_flow(struct replica *r, const float *params, float *grads, const float *x,
		       const int32_t *y, int B, uint64_t key, float scale, struct gradflow *flow,
		       int (*final)(void *ctx, size_t lo, size_t hi), void *ctx)
{
	int e = r->rowdone ? train_forward(r, params, x, y, B, key, scale, NULL) : -EINVAL;
	return e ? e : replica_backward_flow(r, params, grads, x, B, scale, flow, final, ctx);
}

int replica_backward_flow(struct replica *r, const float *params, float *grads, const float *x, int B,
			  float scale, struct gradflow *flow, int (*final)(void *ctx, size_t lo, size_t hi),
			  void *ctx)
{
	const struct model *m = r->m;
	if (!r->rowdone || !r->training)
		return -EINVAL;
	int e = backward_layers(r, params, grads, x, B, scale, 0, 1, NULL);
	/* Everything but the dense weights is final now: the gaps between them. */
	size_t at = 0, rows = 0;
	for (int i = 0; !e && i <= m->nlayers; i++) {
		const struct layer *l = i < m->nlayers ? &m->layers[i] : NULL;
		if (l && l->kind != LAYER_DENSE)
			continue;
		size_t lo = l ? l->woff : m->nparams;
		if (lo > at)
			e = final(ctx, at, lo);
		if (l) {
			at = l->woff + (size_t)l->out * (size_t)l->in;
			rows += (size_t)l->out;
		}
	}
	if (e)
		return e;
	memset(r->rowdone, 0, rows);
	r->flow_made = 0;
	if (flow->fx && (e = flow_factors(r, x, B, flow)))
		return e;
	/* The dense weights, a block at a time, first for the stream (a
	 * shard) that has the least of its gradient final, so that every
	 * link has something to send early; then whatever no stream wants. */
	size_t f;
	int k;
	while (!e && (k = gradflow_behind(flow, &f)) >= 0) {
		int i = weight_at(m, f);
		if (i < 0)
			break;   /* a stream waiting on nothing dense: a bug upstream */
		const struct layer *l = &m->layers[i];
		e = flow_block(r, i, (int)((f - l->woff) / (size_t)l->in), flow->end[k], grads, x, B,
			       final, ctx);
	}
	for (int i = 0; !e && i < m->nlayers; i++) {
		const struct layer *l = &m->layers[i];
		for (int a = 0; !e && l->kind == LAYER_DENSE && a < l->out; a++)
			if (!r->rowdone[r->rowoff[i] + (size_t)a])
				e = flow_block(r, i, a, SIZE_MAX, grads, x, B, final, ctx);
	}
	return e;
}

int replica_forward_layers(struct replica *r, const float *params, const float *x, const int32_t *y,
			   int B, uint64_t key, float scale,
			   int (*ready)(void *ctx, size_t lo, size_t want, size_t most, size_t unit,
					size_t *have),
			   void *ctx)
{
	struct param_wait pw = { .ready = ready, .ctx = ctx, .whole = 1 };
	return train_forward(r, params, x, y, B, key, scale, &pw);
}

int replica_train_queued(struct replica *r, const float *params, float *grads, const float *x,
			 const int32_t *y, int B, uint64_t key, float scale,
			 int (*queued)(void *ctx, size_t lo, size_t hi), void *ctx)
{
	int e = train_forward(r, params, x, y, B, key, scale, NULL);
	return e ? e : replica_backward_queued(r, params, grads, x, B, scale, queued, ctx);
}

int replica_backward_queued(struct replica *r, const float *params, float *grads, const float *x,
			    int B, float scale, int (*queued)(void *ctx, size_t lo, size_t hi), void *ctx)
{
	if (!r->training)
		return -EINVAL;
	struct layer_done ld = { .fn = queued, .ctx = ctx };
	return backward_layers(r, params, grads, x, B, scale, 0, 0, &ld);
}

/* Slots [at, at + 2) of the meter into host values, then cleared. */
static int meter_take(struct replica *r, int at, double *loss_sum, double *right)
{
	double v[2];
	const struct backend_ops *o = r->be.ops;
	int e = o->download(r->be.ctx, v, r->meter + at, sizeof(v));
	if (!e)
		e = o->zero(r->be.ctx, r->meter + at, sizeof(v));
	if (!e) {
		*loss_sum = v[0];
		*right = v[1];
	}
	return e;
}

int replica_meter(struct replica *r, double *loss_sum, double *right)
{
	return meter_take(r, 0, loss_sum, right);
}

/* The loss of a forward pass goes to the evaluation slots, so reading it
 * leaves the training meter alone. */
static int forward_loss(struct replica *r, const float *params, int B, int training, uint64_t key)
{
	const float *logits;
	int e = forward_layers(r, params, r->x, B, training, key, NULL, &logits);
	return e ? e : loss_forward(r, logits, r->y, B, 0.0f, 0);
}

int replica_forward(struct replica *r, const float *params, int B, int training, uint64_t key,
		    double *loss_sum, int *correct)
{
	double l, c;
	/* Cleared first: a forward that failed may have left a sum there. */
	int e = r->be.ops->zero(r->be.ctx, r->meter + 2, 2 * sizeof(double));
	if (!e)
		e = forward_loss(r, params, B, training, key);
	if (!e)
		e = meter_take(r, 2, &l, &c);
	if (e)
		return e;
	*loss_sum = l;
	if (correct)
		*correct = (int)c;
	return 0;
}

int replica_backward(struct replica *r, const float *params, float *grads, int B, float scale)
{
	if (!r->training)
		return -EINVAL;
	const struct backend_ops *o = r->be.ops;
	int e = r->m->loss != LOSS_SIGMOID_XENT
			? o->xent_backward(r->be.ctx, r->grad[0], r->probs, r->y, B, r->m->outputs, scale)
		: o->sigmoid_xent_backward
			? o->sigmoid_xent_backward(r->be.ctx, r->grad[0], r->probs, r->y, B, scale)
			: -EOPNOTSUPP;
	if (e) {
		r->failed = "the loss";
		return e;
	}
	return backward_layers(r, params, grads, r->x, B, scale, 0, 0, NULL);
}

/* The chunks' losses add up in the meter, read once at the end (each
 * chunk's upload from host memory still waits for the device). */
int replica_evaluate(struct replica *r, const float *params, const struct dataset *ds,
		    double *loss, double *acc)
{
	double l, right;
	int e = r->be.ops->zero(r->be.ctx, r->meter + 2, 2 * sizeof(double));
	for (size_t off = 0; !e && off < ds->n; off += (size_t)r->max_batch) {
		int B = (int)(ds->n - off < (size_t)r->max_batch ? ds->n - off : (size_t)r->max_batch);
		e = replica_load(r, ds->x + off * ds->d, ds->y + off, B);
		if (!e)
			e = forward_loss(r, params, B, 0, 0);
	}
	if (!e)
		e = meter_take(r, 2, &l, &right);
	if (e)
		return e;
	*loss = l / (double)ds->n;
	*acc = right / (double)ds->n;
	return 0;
}
