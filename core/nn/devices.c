/* Placement, the batch split over replicas and the gradient sum; see
 * devices.h. */
#include "devices.h"
#include "devices_priv.h"
#include "devices_embed.h"
#include "../progress.h"
#include "blas.h"
#include "optim.h"
#include "rng.h"

#include "../../base/err.h"

#include "../../gpu/gpu.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The failing call's text: replica r's backend, or replica 0's, where a
 * sum or a broadcast between the two ran (training stops at the first
 * failure, so the text is the current one). */
static const char *why_of(const struct devices *d, int r, int e)
{
	const char *g = d->gpu ? gpu_backend_error(&d->be[d->be_of[r]]) : "";
	if (!*g && d->gpu)
		g = gpu_backend_error(&d->be[d->be_of[0]]);
	return *g ? g : strerror(-e);
}

/* The GPU list the config asks for, checked against what CUDA sees. */
static int gpu_list(const struct config *c, int *list, int *n, char *why, size_t whylen)
{
	int count = 0;
	int r = gpu_count(&count, why, whylen);
	if (r < 0)
		return r;
	if (c->gpu.all || c->gpu.ndevices == 0) {
		for (int i = 0; i < count && i < DEVICES_MAX; i++)
			list[i] = i;
		*n = count < DEVICES_MAX ? count : DEVICES_MAX;
		return 0;
	}
	for (int i = 0; i < c->gpu.ndevices; i++) {
		if (c->gpu.devices[i] >= count) {
			snprintf(why, whylen, "[gpu] devices lists gpu:%d but only %d GPU%s visible",
				 c->gpu.devices[i], count, count == 1 ? " is" : "s are");
			return -ENODEV;
		}
		list[i] = c->gpu.devices[i];
	}
	*n = c->gpu.ndevices;
	return 0;
}

/* Buffers of every replica, after d->be[] and d->be_of[] are set. */
static int replicas_init(struct devices *d, int max_batch, int need_state,
			 const struct optim_config *oc, char *err, size_t errlen)
{
	size_t P = d->m->nparams, bytes = P * sizeof(float);
	d->max_batch = (max_batch + d->n - 1) / d->n;
	for (int r = 0; r < d->n; r++) {
		struct backend *b = &d->be[d->be_of[r]];
		int e = replica_init(&d->rep[r], d->m, b, d->max_batch, err, errlen);
		if (e && d->gpu && *gpu_backend_error(b)) {
			/* The arena's text has the bytes needed and the cap. */
			snprintf(err, errlen, "%s", gpu_backend_error(b));
		}
		if (e)
			return e;
		e = b->ops->alloc(b->ctx, (void **)&d->params[r], bytes);
		if (!e)
			e = b->ops->alloc(b->ctx, (void **)&d->grads[r], bytes);
		if (!e)
			e = b->ops->zero(b->ctx, d->grads[r], bytes);
		if (e) {
			snprintf(err, errlen, "%s: parameters and gradients (%zu bytes): %s", b->where,
				 2 * bytes, why_of(d, r, e));
			return e;
		}
	}
	struct backend *b0 = &d->be[d->be_of[0]];
	int e = 0;
	if (d->n > 1)
		e = b0->ops->alloc(b0->ctx, (void **)&d->stage, bytes);
	/* On a GPU the optimizer's state lives beside the parameters. */
	if (!e && need_state && oc && oc->kind != OPTIM_SGD)
		e = b0->ops->alloc(b0->ctx, (void **)&d->opt_m, bytes);
	if (!e && need_state && oc && oc->kind == OPTIM_ADAM)
		e = b0->ops->alloc(b0->ctx, (void **)&d->opt_v, bytes);
	if (!e && d->opt_m)
		e = b0->ops->zero(b0->ctx, d->opt_m, bytes);
	if (!e && d->opt_v)
		e = b0->ops->zero(b0->ctx, d->opt_v, bytes);
	if (e)
		snprintf(err, errlen, "%s: gradient staging and optimizer state: %s", b0->where,
			 why_of(d, 0, e));
	return e;
}

static void log_placement(const struct devices *d, const char *job, FILE *out)
{
	for (int i = 0; i < d->m->nlayers; i++) {
		const struct layer *l = &d->m->layers[i];
		static const char *const passes[] = { "forward", "backward" };
		for (int p = 0; p < 2; p++) {
			fprintf(out, "placement: %s [%dx%d] %s ->", l->name, l->in, l->out, passes[p]);
			for (int r = 0; r < d->n; r++)
				fprintf(out, "%s %s/%s", r ? "," : "", job, d->be[d->be_of[r]].where);
			fputc('\n', out);
		}
	}
	fprintf(out, "placement: optimizer -> %s/%s\n", job, d->be[d->be_of[0]].where);
}

/* Whether backend b has the kernels of every layer and the loss of m; a
 * model that needs one it lacks falls back like any other missing GPU
 * capability. */
static int layers_supported(const struct model *m, const struct backend *b, char *why,
			    size_t whylen)
{
	const struct backend_ops *o = b->ops;
	for (int i = 0; i < m->nlayers; i++) {
		const struct layer *l = &m->layers[i];
		int ok = 1;
		switch (l->kind) {
		case LAYER_CONV: ok = o->conv_forward && o->conv_backward; break;
		case LAYER_MAXPOOL:
		case LAYER_AVGPOOL: ok = o->pool_forward && o->pool_backward; break;
		case LAYER_DROPOUT: ok = o->dropout_forward && o->dropout_backward; break;
		case LAYER_BATCHNORM: ok = o->batchnorm_forward && o->batchnorm_backward; break;
		case LAYER_EMBEDDING: ok = o->embed_forward && o->embed_backward; break;
		default: break;
		}
		if (!ok) {
			snprintf(why, whylen, "%s has no %s kernel yet (layer %s)", b->where, o->name, l->name);
			return -ENOTSUP;
		}
	}
	if (m->loss == LOSS_SIGMOID_XENT && !(o->sigmoid_xent_train && o->sigmoid_xent_forward && o->sigmoid_xent_backward))
		return err_set(why, whylen, -ENOTSUP, "%s has no %s kernel yet (loss sigmoid_cross_entropy)", b->where, o->name);
	return 0;
}

/* A backend per replica, also for a GPU listed more than once, which then
 * shares its memory_fraction evenly among its backends. */
static int open_gpus(struct devices *d, const struct config *c, const int *list, int n,
		     const struct optim_config *oc, int max_batch, char *err, size_t errlen)
{
	d->gpu = 1;
	d->tf32 = c->gpu.tf32;
	d->n = n;
	for (int r = 0; r < n; r++) {
		int times = 0;
		for (int q = 0; q < n; q++)
			times += list[q] == list[r];
		struct gpu_options go = { c->gpu.memory_fraction / times, c->gpu.allow_growth,
					  c->gpu.tf32 };
		int e = gpu_backend_open(&d->be[r], list[r], &go, err, errlen);
		if (e)
			return e;
		d->nbe++;
		d->be_of[r] = r;
		e = layers_supported(d->m, &d->be[r], err, errlen);
		if (e)
			return e;
	}
	return replicas_init(d, max_batch, 1, oc, err, errlen);
}

int devices_open(struct devices *d, const struct config *c, const struct model *m,
		 const struct optim_config *oc, int max_batch, const char *job, FILE *out,
		 char *err, size_t errlen)
{
	memset(d, 0, sizeof(*d));
	d->m = m;
	d->log = out;
	char why[320];
	int list[DEVICES_MAX], n = 0;
	int e = gpu_list(c, list, &n, why, sizeof(why));
	if (!e) {
		e = open_gpus(d, c, list, n, oc, max_batch, why, sizeof(why));
		if (e)
			devices_close(d);
		d->m = m;
		/* Soft placement stands in for a missing GPU or kernel, not for
		 * a GPU that is there but full: training on the CPU instead
		 * would be a silent slowdown of orders of magnitude. */
		if (e == -ENOMEM) {
			snprintf(err, errlen, "%s", why);
			return e;
		}
	}
	if (e) {
		if (!c->gpu.soft_placement) {
			snprintf(err, errlen, "%s: %s; set [gpu] soft_placement = true to train on the CPU",
				 c->path, why);
			return e;
		}
		fprintf(out, "placement: %s; training on the CPU\n", why);
		e = devices_open_cpu(d, m, oc, 1, c->train.threads, max_batch, err, errlen);
		if (e)
			return e;
	} else {
		fprintf(out, "placement: %d replica%s on", d->n, d->n == 1 ? "" : "s");
		for (int r = 0; r < d->n; r++)
			fprintf(out, "%s %s", r ? "," : "", d->be[d->be_of[r]].where);
		fputc('\n', out);
	}
	if (c->gpu.log_placement)
		log_placement(d, job, out);
	d->graphs = c->gpu.cuda_graphs;
	d->opt_kind = oc ? (int)oc->kind : -1;
	return 0;
}

int devices_open_cpu(struct devices *d, const struct model *m, const struct optim_config *oc, int n,
		     int threads, int max_batch, char *err, size_t errlen)
{
	memset(d, 0, sizeof(*d));
	d->m = m;
	d->n = n;
	d->nbe = 1;
	d->opt_kind = oc ? (int)oc->kind : -1;
	backend_cpu(&d->be[0], threads);
	/* be_of[] is all zeros: every replica on the one CPU backend. */
	int e = replicas_init(d, max_batch, 0, NULL, err, errlen);
	if (e)
		devices_close(d);
	return e;
}

void devices_compute(const struct devices *d, char *out, size_t outlen)
{
	char what[160] = "?", reps[16] = "";
	if (d->n > 1)
		snprintf(reps, sizeof(reps), " x%d", d->n);
	struct gpu_info gi;
	char e[160];
	if (!d->gpu)
		blas_kernels(what, sizeof(what));
	else if (gpu_query(gpu_backend_device(&d->be[d->be_of[0]]), &gi, e, sizeof(e)) == 0)
		snprintf(what, sizeof(what), "%.100s sm_%d%d, tf32 %s", gi.name, gi.cc_major, gi.cc_minor,
			 d->tf32 ? "on" : "off");
	snprintf(out, outlen, "%s: %s%s", d->gpu ? "gpu" : "cpu", what, reps);
}

void devices_close(struct devices *d)
{
	if (!d || !d->m)
		return;
	/* Every stream done before any backend goes: a copy queued on one
	 * may read another's memory (the last parameter broadcast). */
	for (int k = 0; d->gpu && k < d->nbe; k++)
		gpu_sync(&d->be[k]);
	for (int r = 0; r < d->n; r++) {
		struct backend *b = &d->be[d->be_of[r]];
		replica_free(&d->rep[r]);
		if (b->ops) {
			b->ops->release(b->ctx, d->params[r]);
			b->ops->release(b->ctx, d->grads[r]);
		}
	}
	if (d->be[0].ops) {
		d->be[0].ops->release(d->be[0].ctx, d->stage);
		d->be[0].ops->release(d->be[0].ctx, d->opt_m);
		d->be[0].ops->release(d->be[0].ctx, d->opt_v);
	}
	for (int k = 0; k < d->nbe; k++)
		gpu_backend_close(&d->be[k]);   // no-op for the CPU backend
	devices_embed_close(d);
	free(d->host_order);
	memset(d, 0, sizeof(*d));
}

/* devices_priv.h */
int devices_fail(const struct devices *d, int r, int e, const char *what, char *err, size_t errlen)
{
	const char *layer = d->rep[r].failed;
	snprintf(err, errlen, "%s%s%s on %s: %s", what, layer ? " in " : "", layer ? layer : "",
		 d->be[d->be_of[r]].where, why_of(d, r, e));
	return e;
}

void devices_forget_pass(struct devices *d)
{
	if (!d->fwd_B)
		return;
	d->samples += d->fwd_B;
	int k = d->be_of[0];
	if (d->gpu && !d->data_x[k])
		(void)gpu_stage_release(&d->be[k]);
	d->fwd_B = 0;
}

int devices_set_params(struct devices *d, const float *host, char *err, size_t errlen)
{
	devices_forget_pass(d);
	/* After any copy up of a forward pass given up half-way. */
	int s = devices_flow_settle(d);
	if (s)
		return devices_fail(d, 0, s, "copying the parameters", err, errlen);
	for (int r = 0; r < d->n; r++) {
		struct backend *b = &d->be[d->be_of[r]];
		int e = b->ops->upload(b->ctx, d->params[r], host, d->m->nparams * sizeof(float));
		if (e)
			return devices_fail(d, r, e, "copying the parameters", err, errlen);
	}
	return 0;
}

int devices_zero_grads(struct devices *d, char *err, size_t errlen)
{
	for (int r = 0; r < d->n; r++) {
		struct backend *b = &d->be[d->be_of[r]];
		int e = b->ops->zero(b->ctx, d->grads[r], d->m->nparams * sizeof(float));
		if (e)
			return devices_fail(d, r, e, "zeroing the gradient", err, errlen);
	}
	return 0;
}

/* grads[0] += grads[r], and grads[r] = 0 for the next step. */
static int grads_gather(struct devices *d, int r)
{
	size_t P = d->m->nparams;
	struct backend *b0 = &d->be[d->be_of[0]], *br = &d->be[d->be_of[r]];
	int e;
	if (d->gpu) {
		e = gpu_copy(b0, d->stage, br, d->grads[r], P * sizeof(float));
		if (!e)
			e = gpu_add(b0, d->grads[0], d->stage, P);
	} else {
		float *g0 = d->grads[0];
		const float *gr = d->grads[r];
		for (size_t i = 0; i < P; i++)
			g0[i] += gr[i];
		e = 0;
	}
	if (!e)
		e = br->ops->zero(br->ctx, d->grads[r], P * sizeof(float));
	return e;
}

int devices_set_data(struct devices *d, const struct dataset *ds, int *resident, char *err,
		     size_t errlen)
{
	size_t xb = ds->n * ds->d * sizeof(float), yb = ds->n * sizeof(int32_t);
	int all = 1;
	if (ds->d != (size_t)d->m->inputs) {
		snprintf(err, errlen, "the training set has %zu features per sample, the model %d", ds->d,
			 d->m->inputs);
		return -EINVAL;
	}
	d->data = ds;
	for (int k = 0; k < d->nbe; k++) {
		struct backend *b = &d->be[k];
		d->data_x[k] = NULL;
		d->data_y[k] = NULL;
		if (!d->gpu) {
			d->data_x[k] = ds->x;
			d->data_y[k] = ds->y;
			continue;
		}
		/* The set and the order as one buffer, so that it is had whole
		 * or not at all (the arena cannot give back a part). */
		size_t xa = (xb + 255) & ~(size_t)255, ya = (yb + 255) & ~(size_t)255;
		size_t need = xa + ya + ds->n * sizeof(uint32_t);
		char *buf = NULL;
		int e = !d->stage_only && need <= gpu_backend_room(b)
				? b->ops->alloc(b->ctx, (void **)&buf, need) : -ENOMEM;
		if (!e)
			e = b->ops->upload(b->ctx, buf, ds->x, xb);
		if (!e)
			e = b->ops->upload(b->ctx, buf + xa, ds->y, yb);
		if (!e) {
			d->data_x[k] = (const float *)buf;
			d->data_y[k] = (const int32_t *)(buf + xa);
			d->order[k] = (uint32_t *)(buf + xa + ya);
		} else if (e == -ENOMEM) {
			e = gpu_stage_reserve(b, d->max_batch, ds->d);
			if (e)
				return devices_fail(d, k, e, "buffers for staged batches", err, errlen);
			all = 0;
		} else {
			return devices_fail(d, k, e, "copying the training set", err, errlen);
		}
	}
	if (resident)
		*resident = all;
	return 0;
}

int devices_set_order(struct devices *d, const uint32_t *order, size_t n, char *err, size_t errlen)
{
	if (!d->data || n != d->data->n) {
		snprintf(err, errlen, "an order of %zu samples for a training set of %zu", n,
			 d->data ? d->data->n : 0);
		return -EINVAL;
	}
	/* A streamed set's windows differ in size, and a resume may start
	 * in a short one. */
	if (!d->host_order || n > d->norder) {
		uint32_t *o = realloc(d->host_order, n * sizeof(uint32_t));
		if (!o) {
			snprintf(err, errlen, "out of memory for the order of %zu samples", n);
			return -ENOMEM;
		}
		d->host_order = o;
	}
	memcpy(d->host_order, order, n * sizeof(uint32_t));
	d->norder = n;
	for (int k = 0; k < d->nbe; k++) {
		struct backend *b = &d->be[k];
		if (!d->gpu) {
			d->order[k] = d->host_order;
			continue;
		}
		if (!d->data_x[k])
			continue;   /* staged: gathered on the host */
		/* On the stream, after the steps queued with the last order. */
		int e = b->ops->upload(b->ctx, d->order[k], order, n * sizeof(uint32_t));
		if (e)
			return devices_fail(d, k, e, "copying the sample order", err, errlen);
	}
	return 0;
}

/* devices_priv.h */
int devices_batch(struct devices *d, int r, size_t at, int B, const float **x, const int32_t **y)
{
	int k = d->be_of[r];
	struct replica *rep = &d->rep[r];
	if (d->data_x[k]) {
		int e = replica_gather(rep, d->data_x[k], d->data_y[k], d->order[k], at, B);
		*x = rep->x;
		*y = rep->y;
		return e;
	}
	return gpu_stage_batch(&d->be[k], d->data->x, d->data->y, d->data->d, d->host_order + at, B,
			       x, y);
}

int devices_step(struct devices *d, size_t at, int B, uint64_t key, char *err, size_t errlen)
{
	devices_forget_pass(d);
	for (int r = 0; r < d->n; r++)
		d->rep[r].failed = NULL;   // only a failing layer kernel names one
	if (B < d->n || B > d->max_batch * d->n) {
		snprintf(err, errlen, "a batch of %d cannot be split over %d replicas of at most %d",
			 B, d->n, d->max_batch);
		return -EINVAL;
	}
	if (!d->norder || at > d->norder || (size_t)B > d->norder - at) {
		snprintf(err, errlen, "samples %zu to %zu of an order of %zu", at, at + (size_t)B,
			 d->norder);
		return -EINVAL;
	}
	size_t off = 0;
	for (int r = 0; r < d->n; r++) {
		int Br = B / d->n + (r < B % d->n);
		const float *x;
		const int32_t *y;
		int e = devices_batch(d, r, at + off, Br, &x, &y);
		if (!e && d->emb)
			e = devices_embed_batch(d, r, at + off, Br);
		if (!e)
			e = replica_train(&d->rep[r], d->params[r], d->grads[r], x, y, Br,
					  r ? rng_hash(key, RNG_DROPOUT, (uint64_t)r) : key, 1.0f / (float)B);
		if (!e && !d->data_x[d->be_of[r]])
			e = gpu_stage_release(&d->be[d->be_of[r]]);
		if (e)
			return devices_fail(d, r, e, "forward and backward", err, errlen);
		off += (size_t)Br;
	}
	for (int r = 1; r < d->n; r++) {
		int e = grads_gather(d, r);
		if (e)
			return devices_fail(d, r, e, "summing the gradients", err, errlen);
	}
	d->samples += B;
	return 0;
}

int devices_meter(struct devices *d, double *loss, long *right, long *samples, char *err,
		  size_t errlen)
{
	double l = 0, c = 0;
	for (int r = 0; r < d->n; r++) {
		double lr, cr;
		int e = replica_meter(&d->rep[r], &lr, &cr);
		if (e)
			return devices_fail(d, r, e, "reading the loss", err, errlen);
		l += lr;
		c += cr;
	}
	*loss = l;
	*right = (long)c;
	*samples = d->samples;
	d->samples = 0;
	return 0;
}

int devices_report(struct devices *d, struct progress *pg, long step, char *err, size_t errlen)
{
	double loss;
	long right, n;
	int e = devices_meter(d, &loss, &right, &n, err, errlen);
	if (!e)
		progress_step(pg, step, n, loss, (double)right);
	return e;
}

int devices_get_grads(struct devices *d, float *host, char *err, size_t errlen)
{
	struct backend *b = &d->be[d->be_of[0]];
	int e = b->ops->download(b->ctx, host, d->grads[0], d->m->nparams * sizeof(float));
	return e ? devices_fail(d, 0, e, "copying the gradient out", err, errlen) : 0;
}

int devices_get_params(struct devices *d, float *host, char *err, size_t errlen)
{
	struct backend *b = &d->be[d->be_of[0]];
	int e = b->ops->download(b->ctx, host, d->params[0], d->m->nparams * sizeof(float));
	return e ? devices_fail(d, 0, e, "copying the parameters out", err, errlen) : 0;
}

/* The GPU optimizer's rule for this step: o->t counts it, and Adam's bias
 * corrections are taken in double, as optim.c does. */
static struct gk_optim gpu_rule(struct optim *o, float lr)
{
	const struct optim_config *c = &o->cfg;
	long t = ++o->t;
	double bc1 = 1.0 - pow(c->beta1, (double)t), bc2 = 1.0 - pow(c->beta2, (double)t);
	struct gk_optim k = {
		.kind = (int)c->kind, .lr = lr, .wd = c->weight_decay, .mu = c->momentum,
		.nesterov = c->nesterov, .b1 = c->beta1, .b2 = c->beta2, .eps = c->eps,
		.step_size = c->kind == OPTIM_ADAM ? (float)(lr / bc1) : 0.0f,
		.inv_sqrt_bc2 = c->kind == OPTIM_ADAM ? (float)(1.0 / sqrt(bc2)) : 0.0f,
	};
	return k;
}

/* The optimizer with rule k over replica 0's parameters on its GPU.
 * Plain ranges (batchnorm's running statistics) take p += g, as optim.c
 * does on the CPU; the rest the optimizer's rule. */
static int gpu_apply(struct devices *d, const struct optim *o, const struct gk_optim *k)
{
	size_t P = d->m->nparams, at = 0;
	struct backend *b0 = &d->be[d->be_of[0]];
	int e = 0;
	for (int i = 0; !e && i <= o->nplain; i++) {
		size_t end = i < o->nplain ? o->plain[i].begin : P;
		if (end > at)
			e = gpu_optim_step(b0, k, d->params[0] + at, d->grads[0] + at,
					   d->opt_m ? d->opt_m + at : NULL, d->opt_v ? d->opt_v + at : NULL,
					   end - at, 1);
		if (!e && i < o->nplain) {
			size_t n = o->plain[i].end - o->plain[i].begin;
			e = gpu_add(b0, d->params[0] + end, d->grads[0] + end, n);
			if (!e)
				e = b0->ops->zero(b0->ctx, d->grads[0] + end, n * sizeof(float));
			at = o->plain[i].end;
		}
	}
	return e;
}

/* The new parameters from replica 0 to the others. */
static int params_broadcast(struct devices *d, char *err, size_t errlen)
{
	size_t bytes = d->m->nparams * sizeof(float);
	struct backend *b0 = &d->be[d->be_of[0]];
	for (int r = 1; r < d->n; r++) {
		int e = 0;
		if (d->gpu)
			e = gpu_copy(&d->be[d->be_of[r]], d->params[r], b0, d->params[0], bytes);
		else
			memcpy(d->params[r], d->params[0], bytes);
		if (e)
			return devices_fail(d, r, e, "copying the new parameters", err, errlen);
	}
	return 0;
}

/* o against the state the devices were opened for (see devices.h). */
static int optim_fits(const struct devices *d, const struct optim *o, char *err, size_t errlen)
{
	const char *have = d->opt_kind < 0 ? NULL : optim_kind_name((enum optim_kind)d->opt_kind);
	if (!have)
		return err_set(err, errlen, -EINVAL,
			       "the devices were opened without an optimizer and cannot step %s",
			       optim_kind_name(o->cfg.kind));
	if ((int)o->cfg.kind != d->opt_kind)
		return err_set(err, errlen, -EINVAL,
			       "the optimizer is %s, but the devices' optimizer state was sized for %s",
			       optim_kind_name(o->cfg.kind), have);
	if (o->n != d->m->nparams)
		return err_set(err, errlen, -EINVAL, "an optimizer over %zu parameters for a model of %zu",
			       o->n, d->m->nparams);
	return 0;
}

int devices_apply(struct devices *d, struct optim *o, float lr, char *err, size_t errlen)
{
	int f = optim_fits(d, o, err, errlen);
	if (f)
		return f;
	if (!d->gpu) {
		/* The state is o's own here; a kind changed after optim_init
		 * would step through buffers it never allocated. */
		f = optim_state_check((int)o->cfg.kind, o->n, o->m, o->v, err, errlen);
		if (f)
			return f;
		optim_step_zero(o, d->params[0], d->grads[0], lr);
	} else {
		struct gk_optim k = gpu_rule(o, lr);
		int e = gpu_apply(d, o, &k);
		if (e)
			return devices_fail(d, 0, e, "the optimizer", err, errlen);
	}
	f = devices_embed_apply(d);
	if (f)
		return devices_fail(d, 0, f, "the embedding rows' gradient", err, errlen);
	return params_broadcast(d, err, errlen);
}

/* Whether a local step can be one CUDA graph: one GPU replica (several
 * would need their streams joined into the capture), the batch gathered
 * on that GPU (staging waits on the host) and no embedding layer (each
 * batch's rows, their count among the kernels' sizes, come from the host
 * before its forward). Dropout is no obstacle: its kernels read the
 * step's key from device memory (struct gk_step). */
static int graph_possible(const struct devices *d)
{
	return d->graphs && d->gpu && d->n == 1 && d->data_x[0] && !d->emb && d->graph_state >= 0;
}

/* Records the step's work (gather, forward, loss, backward, optimizer) as
 * a graph. A failure inside the capture is reported once and the run goes
 * on without graphs: they are a speed-up, not a feature to stop for. */
static void graph_capture(struct devices *d, size_t at, int B, uint64_t key, const struct optim *o,
			  const struct gk_optim *k)
{
	struct backend *b = &d->be[0];
	int e = gpu_graph_begin(b);
	if (!e) {
		const float *x;
		const int32_t *y;
		int f = devices_batch(d, 0, at, B, &x, &y);
		if (!f)
			f = replica_train(&d->rep[0], d->params[0], d->grads[0], x, y, B, key,
					  1.0f / (float)B);
		if (!f)
			f = gpu_apply(d, o, k);
		e = gpu_graph_end(b, f);
	}
	if (e) {
		d->graph_state = -1;
		if (d->log)
			fprintf(d->log, "placement: %s: no CUDA graph of the step (%s); running it kernel by kernel\n",
				b->where, gpu_backend_error(b));
		return;
	}
	d->graph_state = 1;
	d->graph_B = B;
}

int devices_train_step(struct devices *d, size_t at, int B, uint64_t key, struct optim *o,
		       float lr, char *err, size_t errlen)
{
	int f = optim_fits(d, o, err, errlen);
	if (f)
		return f;
	if (!graph_possible(d) || (d->graph_state == 1 && B != d->graph_B)) {
		int e = devices_step(d, at, B, key, err, errlen);
		return e ? e : devices_apply(d, o, lr, err, errlen);
	}
	if (B < 1 || B > d->max_batch || !d->norder || at > d->norder || (size_t)B > d->norder - at)
		return devices_step(d, at, B, key, err, errlen);   /* says what is wrong */
	struct gk_optim k = gpu_rule(o, lr);
	/* The first step runs as it is, so that cuBLAS and the kernels are
	 * loaded before anything is captured. */
	if (d->graph_state == 0 && d->graph_warm)
		graph_capture(d, at, B, key, o, &k);
	int e;
	if (d->graph_state == 1) {
		struct gk_step st = { .at = at, .lr = k.lr, .step_size = k.step_size,
				      .inv_sqrt_bc2 = k.inv_sqrt_bc2, .key = key };
		e = gpu_graph_launch(&d->be[0], &st);
		if (e)
			return devices_fail(d, 0, e, "the training step's graph", err, errlen);
		d->samples += B;
		return 0;
	}
	d->graph_warm = 1;
	e = devices_step(d, at, B, key, err, errlen);
	if (!e && (e = gpu_apply(d, o, &k)))
		return devices_fail(d, 0, e, "the optimizer", err, errlen);
	return e;
}

/* Every buffer o's kind needs, both sides; one missing on either side is
 * refused, not skipped: skipping hid the first GPU run's mismatch. */
static int optim_copy(struct devices *d, struct optim *o, int to_device, char *err, size_t errlen)
{
	int e = optim_fits(d, o, err, errlen);
	if (e || !d->gpu)
		return e;
	struct backend *b = &d->be[d->be_of[0]];
	size_t bytes = d->m->nparams * sizeof(float);
	float *dev[2] = { d->opt_m, d->opt_v }, *host[2] = { o->m, o->v };
	static const char *const names[2] = { "first", "second" };
	int need[2] = { o->cfg.kind != OPTIM_SGD, o->cfg.kind == OPTIM_ADAM };
	for (int i = 0; i < 2; i++) {
		if (!need[i])
			continue;
		if (!dev[i] || !host[i])
			return err_set(err, errlen, -EINVAL, "%s's %s state buffer is missing %s",
				       optim_kind_name(o->cfg.kind), names[i],
				       dev[i] ? "in the host's optimizer" : "on the device");
		e = to_device ? b->ops->upload(b->ctx, dev[i], host[i], bytes)
			      : b->ops->download(b->ctx, host[i], dev[i], bytes);
		if (e)
			return devices_fail(d, 0, e, "copying the optimizer state", err, errlen);
	}
	return 0;
}

int devices_get_optim(struct devices *d, struct optim *o, char *err, size_t errlen)
{
	return optim_copy(d, o, 0, err, errlen);
}

int devices_set_optim(struct devices *d, const struct optim *o, char *err, size_t errlen)
{
	return optim_copy(d, (struct optim *)o, 1, err, errlen);
}

int devices_evaluate(struct devices *d, const struct dataset *ds, double *loss, double *acc,
		     char *err, size_t errlen)
{
	struct eval_result ev;
	int e = devices_eval(d, ds, &ev, err, errlen);
	*loss = ev.loss;
	*acc = ev.acc;
	return e;
}
