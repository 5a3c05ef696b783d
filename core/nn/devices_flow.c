/* The flow half of devices.h: a worker's gradient made final piece by
 * piece while backward runs, and the next forward pass on parameters that
 * are still arriving, in two ways (enum devices_flow).
 *
 * HOST, one CPU replica: the backward is split in host memory, the dense
 * weights block by block in the order the links need (replica_train_flow),
 * and the forward pass takes a dense layer's rows as they come.
 *
 * QUEUED, one replica on a backend with a copy queue (a GPU): the host
 * only queues work, so nothing is split; whole layers run exactly as in
 * devices_step (the same kernels, the same bits). As each layer's gradient
 * kernels are queued its range is queued behind them on the copy queue,
 * down into the caller's (pinned) host buffer, into a slot of its own;
 * once the whole backward is queued the host takes the slots in order,
 * each as it lands, checks it and marks it final in the flow, so the links
 * push the last layers' gradient while the first layers' backward still
 * computes. The other way, each layer of the next forward pass waits on
 * the host for its parameters to arrive, copies them up piece by piece on
 * the queue, and has the backend's work after it wait for them (one event
 * a layer): the GPU computes the first layers while the last ones' pieces
 * are still on the wire. Nothing is allocated, no thread made and no
 * stream synchronized in the exchange; the host waits there only for a
 * slot (a staged batch's buffer and an epoch's new order are waited for
 * as in any step: gpu/stream.cu, devices_set_order). */
#include "devices.h"
#include "devices_priv.h"
#include "optim.h"
#include "../progress.h"

#include "../../base/err.h"

#include "../../gpu/gpu.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The QUEUED forward pass copies up at least this many values at a time
 * (but at a layer's end): 256 KiB, four frames of the wire. A copy per
 * frame would cost more in calls (a few microseconds each) and in small
 * DMA transfers than it gains in overlap; the copy after a layer's last
 * piece is never more than this. */
#define FLOW_UP_MIN 65536

static int has_queue(const struct backend_ops *o)
{
	return o->copy_reserve && o->copy_after && o->copy_down && o->copy_wait && o->copy_up &&
	       o->copy_join;
}

int devices_flow_init(struct devices *d)
{
	/* An embedding model's tables live outside the flat vector the flow
	 * moves (core/nn/devices_embed.h). */
	if (d->n != 1 || d->emb)
		return -EOPNOTSUPP;
	if (d->flow != DEVICES_FLOW_NONE)
		return 0;
	struct backend *b = &d->be[d->be_of[0]];
	int e;
	if (has_queue(b->ops)) {
		int slots = 0;
		for (int i = 0; i < d->m->nlayers; i++)
			slots += d->m->layers[i].nparams > 0;
		e = b->ops->copy_reserve(b->ctx, slots > 0 ? slots : 1);
		d->flow = e ? DEVICES_FLOW_NONE : DEVICES_FLOW_QUEUED;
		return e;
	}
	if (d->gpu)
		return -EOPNOTSUPP;   /* a GPU backend without the queue */
	e = replica_flow_init(&d->rep[0]);
	d->flow = e ? DEVICES_FLOW_NONE : DEVICES_FLOW_HOST;
	return e;
}

int devices_flow_forwards(const struct devices *d)
{
	return d->flow == DEVICES_FLOW_QUEUED ||
	       (d->flow == DEVICES_FLOW_HOST && d->rep[0].be.ops->dense_forward_rows);
}

/* devices_priv.h */
int devices_flow_settle(struct devices *d)
{
	struct backend *b = &d->be[d->be_of[0]];
	return d->flow == DEVICES_FLOW_QUEUED ? b->ops->copy_join(b->ctx) : 0;
}

/* ---- HOST --------------------------------------------------------------- */

/* devices_step_flow's final: the range copied out and checked, then
 * marked final for the readers. */
struct flow_out {
	const float *grads;
	float *host;
	struct gradflow *flow;
	size_t bad;    /* the first non-finite value's index; P: none */
	long ranges;
};

static int flow_final(void *ctx, size_t lo, size_t hi)
{
	struct flow_out *fo = ctx;
	if (fo->host != fo->grads)
		memcpy(fo->host + lo, fo->grads + lo, (hi - lo) * sizeof(float));
	size_t i = lo + optim_nonfinite(fo->host + lo, hi - lo);
	if (i < hi) {
		fo->bad = i;
		return -EDOM;
	}
	fo->ranges++;
	return gradflow_mark(fo->flow, lo, hi);
}

/* devices_forward_flow's ready: waits for [lo, want) of the host's
 * parameters, then copies the whole units that have arrived, up to most,
 * into replica 0's. */
struct flow_in {
	struct devices *d;
	const float *host;
	struct gradflow *flow;
	double waited;     /* seconds in gradflow_wait_at */
	long uploads;
};

static int flow_ready(void *ctx, size_t lo, size_t want, size_t most, size_t unit, size_t *have)
{
	struct flow_in *fi = ctx;
	struct devices *d = fi->d;
	double t0 = progress_now();
	int e = gradflow_wait_at(fi->flow, lo, want, have);
	fi->waited += progress_now() - t0;
	if (e)
		return e;
	*have = *have >= most ? most : lo + (*have - lo) / unit * unit;
	struct backend *b = &d->be[d->be_of[0]];
	return b->ops->upload(b->ctx, d->params[0] + lo, fi->host + lo, (*have - lo) * sizeof(float));
}

/* ---- QUEUED ------------------------------------------------------------- */

/* The copies down of one step: slot k holds [lo[k], hi[k]), checked for
 * NaN and infinity by the backend where it has copy_check (checked),
 * else on the host once landed. */
struct queued_down {
	struct backend *b;
	const float *grads;   /* (P) replica 0's, in backend memory */
	float *host;          /* (P) */
	size_t lo[MODEL_MAX_LAYERS], hi[MODEL_MAX_LAYERS];
	int n, checked;
	long *disputed;       /* devices_flow_stats' */
};

/* replica_train_queued's queued: a layer's gradient kernels are queued,
 * and its range goes down behind them. */
static int queued_down(void *ctx, size_t lo, size_t hi)
{
	struct queued_down *q = ctx;
	const struct backend_ops *o = q->b->ops;
	if (q->n == MODEL_MAX_LAYERS)
		return -E2BIG;   /* more layers with parameters than a model has */
	int e = o->copy_after(q->b->ctx);
	if (!e && q->checked)
		e = o->copy_check(q->b->ctx, q->n, q->grads + lo, hi - lo);
	if (!e)
		e = o->copy_down(q->b->ctx, q->n, q->host + lo, q->grads + lo, (hi - lo) * sizeof(float));
	if (e)
		return e;
	q->lo[q->n] = lo;
	q->hi[q->n] = hi;
	q->n++;
	return 0;
}

/* Slot k's first NaN or infinity in host, or hi[k] for none. A range the
 * backend checked is read on the host only when it found one: the host's
 * scan names it, and decides (what goes on the wire is what landed). */
static size_t queued_bad(struct queued_down *q, int k, int *e)
{
	size_t lo = q->lo[k], hi = q->hi[k];
	if (q->checked) {
		int found = q->b->ops->copy_found(q->b->ctx, k);
		if (found <= 0) {
			*e = found;
			return hi;
		}
	}
	size_t i = lo + optim_nonfinite(q->host + lo, hi - lo);
	*q->disputed += q->checked && i == hi;
	return i;
}

/* Every copy as it lands, in the order queued: checked, then marked
 * final for the readers. When this returns every copy has landed, also
 * after a failure: none may write into host later. */
static int queued_land(struct queued_down *q, struct gradflow *flow, size_t *bad, long *ranges)
{
	const struct backend_ops *o = q->b->ops;
	int e = 0, k;
	for (k = 0; !e && k < q->n; k++) {
		e = o->copy_wait(q->b->ctx, k);
		size_t i = e ? q->hi[k] : queued_bad(q, k, &e);
		if (!e && i < q->hi[k]) {
			*bad = i;
			e = -EDOM;
		}
		if (!e)
			e = gradflow_mark(flow, q->lo[k], q->hi[k]);
		*ranges += !e;
	}
	/* The queue runs in order: the last slot landed, all have. */
	if (e && k < q->n)
		(void)o->copy_wait(q->b->ctx, q->n - 1);
	return e;
}

/* devices_step_flow, QUEUED: the step queued with a copy down behind each
 * layer's gradient, then the copies taken as they land. */
static int queued_step(struct devices *d, size_t at, int B, uint64_t key, struct gradflow *flow,
		       int forwarded, struct flow_out *fo)
{
	struct replica *rep = &d->rep[0];
	int k = d->be_of[0], had = forwarded, e;
	struct queued_down q = { .b = &d->be[k], .grads = d->grads[0], .host = fo->host,
				 .checked = d->be[k].ops->copy_check && d->be[k].ops->copy_found,
				 .disputed = &d->fs.disputed };
	const float *x = d->fwd_x;
	const int32_t *y;
	float scale = 1.0f / (float)B;
	if (forwarded) {
		e = replica_backward_queued(rep, d->params[0], d->grads[0], x, B, scale, queued_down, &q);
	} else {
		e = devices_batch(d, 0, at, B, &x, &y);
		had = !e;
		if (!e)
			e = replica_train_queued(rep, d->params[0], d->grads[0], x, y, B, key, scale, queued_down,
						 &q);
	}
	/* A staged batch's buffer is free to refill once its backward ran. */
	if (had && !d->data_x[k]) {
		int s = gpu_stage_release(&d->be[k]);
		e = e ? e : s;
	}
	if (!e)
		return queued_land(&q, flow, &fo->bad, &fo->ranges);
	if (q.n)
		(void)q.b->ops->copy_wait(q.b->ctx, q.n - 1);
	return e;
}

/* devices_forward_flow's ready, QUEUED: replica_forward_layers asks for a
 * whole layer [lo, want); each run of it that has arrived goes up on the
 * queue as soon as it has, and the layer's kernels, queued next, wait
 * for the last of them (copy_join). */
struct queued_up {
	struct backend *b;
	float *params;        /* (P) replica 0's, in backend memory */
	const float *host;    /* (P) */
	struct gradflow *flow;
	double waited;        /* seconds in gradflow_wait_at */
	long uploads;
};

static int queued_ready(void *ctx, size_t lo, size_t want, size_t most, size_t unit, size_t *have)
{
	struct queued_up *u = ctx;
	const struct backend_ops *o = u->b->ops;
	size_t at = lo;
	int e = 0;
	(void)unit;
	(void)most;   /* == want: whole layers */
	while (!e && at < want) {
		size_t got, ask = want - at < FLOW_UP_MIN ? want : at + FLOW_UP_MIN;
		double t0 = progress_now();
		e = gradflow_wait_at(u->flow, at, ask, &got);
		u->waited += progress_now() - t0;
		got = got < want ? got : want;
		if (!e)
			e = o->copy_up(u->b->ctx, u->params + at, u->host + at, (got - at) * sizeof(float));
		u->uploads += !e;
		at = got;
	}
	*have = at;
	return e ? e : o->copy_join(u->b->ctx);
}

/* devices_forward_flow, QUEUED: the pass queued layer by layer as the
 * parameters arrive. The copies up overwrite what the last step's
 * kernels may still read: they go after those (copy_after). Nothing here
 * waits for the copies up to have read the host vector before the next
 * exchange lets the receivers overwrite it: that holds by causality only
 * (the copy stream runs in order, so the next step's first gradient slot
 * waits behind them, and the ps sends no next parameters before that
 * gradient's first piece: pieces are strict sync, role_pieces). Were that
 * relaxed, record an event after the last copy up and wait for it at the
 * start of devices_step_flow. After a
 * failure the backend's later work (devices_set_params' upload) waits for
 * the copies queued, so that none lands after it. */
static int queued_forward(struct devices *d, const int32_t *y, int B, uint64_t key, const float *host,
			  struct gradflow *flow, struct queued_up *u)
{
	int k = d->be_of[0];
	*u = (struct queued_up){ .b = &d->be[k], .params = d->params[0], .host = host, .flow = flow };
	const struct backend_ops *o = u->b->ops;
	int e = o->copy_after(u->b->ctx);
	if (!e)
		e = replica_forward_layers(&d->rep[0], d->params[0], d->fwd_x, y, B, key, 1.0f / (float)B,
					   queued_ready, u);
	if (e) {
		(void)o->copy_join(u->b->ctx);
		if (!d->data_x[k])
			(void)gpu_stage_release(u->b);
	}
	return e;
}

/* ---- both --------------------------------------------------------------- */

/* The checks both flow paths make: one replica, set up for the flow, and
 * a batch the order holds. */
static int flow_fits(struct devices *d, size_t at, int B, char *err, size_t errlen)
{
	if (d->n == 1 && d->flow != DEVICES_FLOW_NONE && B >= 1 && B <= d->max_batch && d->norder &&
	    at <= d->norder && (size_t)B <= d->norder - at)
		return 0;
	snprintf(err, errlen, "a batch of %d at %zu cannot take the flow path", B, at);
	return -EINVAL;
}

int devices_forward_flow(struct devices *d, size_t at, int B, uint64_t key, const float *host,
			 struct gradflow *flow, double *waited, char *err, size_t errlen)
{
	struct replica *rep = &d->rep[0];
	struct flow_in fi = { .d = d, .host = host, .flow = flow };
	struct queued_up qu = { 0 };
	devices_forget_pass(d);
	*waited = 0;
	rep->failed = NULL;
	int e = flow_fits(d, at, B, err, errlen);
	if (e)
		return e;
	const int32_t *y;
	e = devices_batch(d, 0, at, B, &d->fwd_x, &y);
	if (!e && d->flow == DEVICES_FLOW_QUEUED)
		e = queued_forward(d, y, B, key, host, flow, &qu);
	else if (!e)
		e = replica_forward_flow(rep, d->params[0], d->fwd_x, y, B, key, 1.0f / (float)B, flow_ready,
					 &fi);
	/* Every parameter belongs to a layer, and every layer waited for all
	 * of its own: the replica has the whole vector now. */
	*waited = fi.waited + qu.waited;
	if (e == -ECANCELED)
		return err_set(err, errlen, e, "the parameters of the next step did not all arrive");
	if (e)
		return devices_fail(d, 0, e, "the forward pass", err, errlen);
	d->fwd_at = at;
	d->fwd_B = B;
	d->fs.forwards++;
	d->fs.uploads += qu.uploads;
	d->fs.waited += *waited;
	return 0;
}

int devices_step_flow(struct devices *d, size_t at, int B, uint64_t key, float *host,
		      struct gradflow *flow, int forwarded, size_t *bad, char *err, size_t errlen)
{
	struct replica *rep = &d->rep[0];
	size_t P = d->m->nparams;
	*bad = P;
	rep->failed = NULL;
	int e = flow_fits(d, at, B, err, errlen);
	if (!e && forwarded && (d->fwd_B != B || d->fwd_at != at))
		e = err_set(err, errlen, -EINVAL, "no forward pass of the batch of %d at %zu to go on from", B, at);
	if (e || !forwarded)
		devices_forget_pass(d);
	d->fwd_B = 0;
	if (e) {
		gradflow_fail(flow);
		return e;
	}
	struct flow_out fo = { .grads = d->grads[0], .host = host, .flow = flow, .bad = P };
	if (d->flow == DEVICES_FLOW_QUEUED) {
		e = queued_step(d, at, B, key, flow, forwarded, &fo);
	} else if (forwarded) {
		e = replica_backward_flow(rep, d->params[0], d->grads[0], d->fwd_x, B, 1.0f / (float)B, flow,
					  flow_final, &fo);
	} else {
		const float *x;
		const int32_t *y;
		e = devices_batch(d, 0, at, B, &x, &y);
		if (!e)
			e = replica_train_flow(rep, d->params[0], d->grads[0], x, y, B, key, 1.0f / (float)B,
					       flow, flow_final, &fo);
	}
	if (e) {
		gradflow_fail(flow);
		*bad = fo.bad;
		return e == -EDOM && fo.bad < P ? e : devices_fail(d, 0, e, "forward and backward", err, errlen);
	}
	d->samples += B;
	d->fs.steps++;
	d->fs.ranges += fo.ranges;
	return 0;
}

int devices_host_alloc(struct devices *d, float **p, size_t n, char *err, size_t errlen)
{
	struct backend *b = &d->be[d->be_of[0]];
	size_t bytes = (n ? n : 1) * sizeof(float);
	int e = 0;
	*p = NULL;
	if (b->ops->host_alloc)
		e = b->ops->host_alloc(b->ctx, (void **)p, bytes);
	else if (!(*p = malloc(bytes)))
		e = -ENOMEM;
	if (e) {
		*p = NULL;
		return devices_fail(d, 0, e, "host memory for the exchange", err, errlen);
	}
	return 0;
}

void devices_host_free(struct devices *d, float *p)
{
	struct backend *b = &d->be[d->be_of[0]];
	if (p && b->ops && b->ops->host_free)
		b->ops->host_free(b->ctx, p);
	else
		free(p);
}

void devices_flow_say(const struct devices *d, char *buf, size_t len)
{
	const struct devices_flow_stats *s = &d->fs;
	const char *where = d->be[d->be_of[0]].where;
	int queued = d->flow == DEVICES_FLOW_QUEUED, n = 0;
	char up[64] = "";
	buf[0] = '\0';
	if (s->steps)
		n = snprintf(buf, len, "%s: %ld steps pushed their gradient as backward made it, %.1f ranges a step%s",
			     where, s->steps, (double)s->ranges / (double)s->steps,
			     queued ? ", each layer's copied down while the layers before it computed" : "");
	if (s->forwards && n >= 0 && (size_t)n < len) {
		if (queued)
			snprintf(up, sizeof(up), "%.1f copies up a pass, ", (double)s->uploads / (double)s->forwards);
		n += snprintf(buf + n, len - (size_t)n, "%s%s%ld forward passes took their parameters as they arrived, %swaiting %.2f ms a pass for them",
			      n ? "; " : where, n ? "" : ": ", s->forwards, up, 1e3 * s->waited / (double)s->forwards);
	}
	if (s->disputed && n > 0 && (size_t)n < len)
		snprintf(buf + n, len - (size_t)n, "; %ld ranges the backend's check found a NaN or an infinity in that the host did not (pushed as landed)",
			 s->disputed);
}
