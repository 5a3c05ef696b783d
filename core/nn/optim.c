/* Optimizer updates and learning-rate schedules over one float32 range.
 * Which range (whole model or a ps shard's slice) and when to step is the
 * caller's business; the update of element i reads only element i. */
#include "optim.h"

#include "../../base/err.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Elementwise loops get AVX2 and AVX-512 copies picked at load time, so
 * the binary stays portable to any x86-64 while using the wide units. */
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

/* M_PI is not in C11. */
static const double PI = 3.14159265358979323846;

const char *optim_kind_name(enum optim_kind k)
{
	static const char *const names[] = { "sgd", "momentum", "adam" };
	return (unsigned)k < sizeof(names) / sizeof(names[0]) ? names[k] : "unknown";
}

int optim_init(struct optim *o, const struct optim_config *c, size_t n)
{
	memset(o, 0, sizeof(*o));
	o->cfg = *c;
	o->n = n;
	if (c->kind != OPTIM_SGD && c->kind != OPTIM_MOMENTUM && c->kind != OPTIM_ADAM)
		return -EINVAL;
	/* calloc(0) may return NULL; an empty range needs no state. */
	if (n == 0)
		return 0;
	if (c->kind == OPTIM_MOMENTUM || c->kind == OPTIM_ADAM) {
		o->m = calloc(n, sizeof(float));
		if (!o->m)
			goto err;
	}
	if (c->kind == OPTIM_ADAM) {
		o->v = calloc(n, sizeof(float));
		if (!o->v)
			goto err;
	}
	return 0;
err:
	optim_free(o);
	return -ENOMEM;
}

int optim_state_check(int kind, size_t n, const float *m, const float *v, char *err,
		      size_t errlen)
{
	if (kind != OPTIM_SGD && kind != OPTIM_MOMENTUM && kind != OPTIM_ADAM)
		return err_set(err, errlen, -EINVAL, "unknown optimizer kind %d", kind);
	if (n == 0)
		return 0;   /* optim_init gives an empty range no state */
	const char *name = optim_kind_name((enum optim_kind)kind);
	if (kind != OPTIM_SGD && !m)
		return err_set(err, errlen, -EINVAL,
			       "%s needs its %s over %zu parameters, and none was allocated", name,
			       kind == OPTIM_ADAM ? "first moment (m)" : "momentum buffer (m)", n);
	if (kind == OPTIM_ADAM && !v)
		return err_set(err, errlen, -EINVAL,
			       "adam needs its second moment (v) over %zu parameters, and none was allocated",
			       n);
	return 0;
}

void optim_free(struct optim *o)
{
	if (!o)
		return;
	free(o->m);
	free(o->v);
	free(o->plain);
	o->m = NULL;
	o->v = NULL;
	o->plain = NULL;
	o->nplain = 0;
}

int optim_plain_tensors(struct optim *o, const struct model *m, size_t begin)
{
	struct tensor_info t[MODEL_MAX_TENSORS];
	int nt = model_tensors(m, t, MODEL_MAX_TENSORS);
	if (nt < 0)
		return nt;
	free(o->plain);
	o->plain = NULL;
	o->nplain = 0;
	size_t end = begin + o->n;
	for (int i = 0; i < nt; i++) {
		if (t[i].trainable)
			continue;
		size_t lo = t[i].off > begin ? t[i].off : begin;
		size_t hi = t[i].off + t[i].n < end ? t[i].off + t[i].n : end;
		if (lo >= hi)
			continue;
		/* Tensors come in parameter order, so the ranges stay sorted;
		 * adjacent ones (running mean, then variance) merge. */
		if (o->nplain && o->plain[o->nplain - 1].end == lo - begin) {
			o->plain[o->nplain - 1].end = hi - begin;
			continue;
		}
		struct optim_range *p = realloc(o->plain, (size_t)(o->nplain + 1) * sizeof(*p));
		if (!p)
			return -ENOMEM;
		o->plain = p;
		o->plain[o->nplain].begin = lo - begin;
		o->plain[o->nplain].end = hi - begin;
		o->nplain++;
	}
	return 0;
}

float optim_lr(const struct optim_config *c, long step, long total)
{
	double lr = c->lr;
	if (step < 0)
		step = 0;
	if (c->warmup_steps > 0 && step < c->warmup_steps)
		return (float)(lr * (double)(step + 1) / (double)c->warmup_steps);

	/* The schedule runs over the steps after warmup, like PyTorch's
	 * SequentialLR(LinearLR, ...): it starts at its full lr the step
	 * warmup ends, instead of jumping to wherever it would have been. */
	long warmup = c->warmup_steps > 0 ? c->warmup_steps : 0;
	long s = step - warmup;   // >= 0
	long n = total - warmup;
	switch (c->schedule) {
	case LR_CONSTANT:
		return (float)lr;
	case LR_STEP:
		if (c->decay_steps <= 0)
			return (float)lr;
		return (float)(lr * pow(c->decay_rate, (double)(s / c->decay_steps)));
	case LR_COSINE:
		if (n <= 0)
			return (float)lr;
		if (s > n)
			s = n;
		return (float)(lr * 0.5 * (1.0 + cos(PI * (double)s / (double)n)));
	}
	return (float)lr;
}

/* g = (grad + weight_decay * p) * gs; p -= lr * g */
VECTOR_CLONES
static void sgd_step(float *restrict params, float *restrict grads, size_t n, float lr, float wd,
		     float gs, int zero)
{
	// params (n), grads (n)
	for (size_t i = 0; i < n; i++) {
		float g = (grads[i] + wd * params[i]) * gs;
		params[i] -= lr * g;
		if (zero)
			grads[i] = 0.0f;
	}
}

/* g = (grad + weight_decay * p) * gs; v = mu v + g;
 * p -= lr * (nesterov ? g + mu v : v)   (PyTorch, dampening 0) */
VECTOR_CLONES
static void momentum_step(float *restrict params, float *restrict m, float *restrict grads, size_t n,
			  float lr, float wd, float gs, float mu, int nesterov, int zero)
{
	// params (n), m (n), grads (n)
	for (size_t i = 0; i < n; i++) {
		float g = (grads[i] + wd * params[i]) * gs;
		float v = mu * m[i] + g;
		m[i] = v;
		params[i] -= lr * (nesterov ? g + mu * v : v);
		if (zero)
			grads[i] = 0.0f;
	}
}

VECTOR_CLONES
static void adam_step(float *restrict params, float *restrict m, float *restrict v,
		      float *restrict grads, size_t n, long t, float lr, float wd, float b1,
		      float b2, float eps, int zero)
{
	// params (n), m (n), v (n), grads (n)
	/* Bias corrections are per step, so they are done once in double;
	 * the split into step_size and 1/sqrt(bc2) is PyTorch's, which keeps
	 * our numbers close to its. */
	double bc1 = 1.0 - pow(b1, (double)t);
	double bc2 = 1.0 - pow(b2, (double)t);
	float step_size = (float)(lr / bc1);
	float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
	for (size_t i = 0; i < n; i++) {
		float g = grads[i] + wd * params[i];
		float mi = b1 * m[i] + (1.0f - b1) * g;
		float vi = b2 * v[i] + (1.0f - b2) * g * g;
		m[i] = mi;
		v[i] = vi;
		params[i] -= step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
		if (zero)
			grads[i] = 0.0f;
	}
}

/* p += g over a plain range (see optim_plain_tensors). */
static void plain_step(float *restrict params, float *restrict grads, size_t n, int zero)
{
	// params (n), grads (n)
	for (size_t i = 0; i < n; i++) {
		params[i] += grads[i];
		if (zero)
			grads[i] = 0.0f;
	}
}

/* The rule of the optimizer over [lo, hi) of params, with g the gradient
 * of that range (g[0] is index lo's); scale as in optim_step_scaled (1 is
 * exact: x * 1.0f == x, so optim_step's bits do not change). */
static void rule_step(struct optim *o, float *params, float *g, size_t lo, size_t hi, long t,
		      float lr, float scale, int zero)
{
	const struct optim_config *c = &o->cfg;
	size_t n = hi - lo;
	if (n == 0)
		return;
	switch (c->kind) {
	case OPTIM_SGD:
		sgd_step(params + lo, g, n, lr, c->weight_decay, scale, zero);
		break;
	case OPTIM_MOMENTUM:
		momentum_step(params + lo, o->m + lo, g, n, lr, c->weight_decay, scale, c->momentum,
			      c->nesterov, zero);
		break;
	case OPTIM_ADAM:
		adam_step(params + lo, o->m + lo, o->v + lo, g, n, t, lr * scale, c->weight_decay,
			  c->beta1, c->beta2, c->eps, zero);
		break;
	}
}

/* Update number t over [lo, hi) of the slice, g the gradient of that
 * range (g[0] is index lo's, so a caller can hand over a block it summed
 * in a small buffer). zero: clear each gradient after use, saving the
 * separate pass over the gradient vector that the next step's
 * accumulation would need. The loops never write g when zero is 0, so
 * the casts in optim_step and optim_step_part are safe. The range is
 * walked as runs of trained parameters between the plain ranges, so a
 * model without batchnorm takes one run as before. */
static void step_range(struct optim *o, float *params, float *g, size_t lo, size_t hi, long t,
		       float lr, float scale, int zero)
{
	size_t at = lo;
	for (int i = 0; i < o->nplain && at < hi; i++) {
		const struct optim_range *p = &o->plain[i];
		if (p->end <= at)
			continue;
		size_t b = p->begin < at ? at : p->begin > hi ? hi : p->begin;
		size_t e = p->end > hi ? hi : p->end;
		rule_step(o, params, g + (at - lo), at, b, t, lr, scale, zero);
		plain_step(params + b, g + (b - lo), e - b, zero);
		at = e;
	}
	rule_step(o, params, g + (at - lo), at, hi, t, lr, scale, zero);
}

static void step(struct optim *o, float *params, float *grads, float lr, float scale, int zero)
{
	o->t++;
	step_range(o, params, grads, 0, o->n, o->t, lr, scale, zero);
}

void optim_step_part(struct optim *o, float *params, const float *grads, size_t lo, size_t hi,
		     float lr)
{
	step_range(o, params, (float *)grads, lo, hi, o->t + 1, lr, 1.0f, 0);
}

void optim_step_done(struct optim *o)
{
	o->t++;
}

void optim_step(struct optim *o, float *params, const float *grads, float lr)
{
	step(o, params, (float *)grads, lr, 1.0f, 0);
}

void optim_step_scaled(struct optim *o, float *params, const float *grads, float lr, float scale)
{
	step(o, params, (float *)grads, lr, scale, 0);
}

void optim_step_zero(struct optim *o, float *params, float *grads, float lr)
{
	step(o, params, grads, lr, 1.0f, 1);
}

/* A float is NaN or +-inf exactly when its 8 exponent bits are all ones.
 * Adding one exponent step to the masked exponent carries into bit 31 only
 * then, so OR-ing that sum over a block and testing bit 31 checks the
 * block with no branch per value: the loop vectorizes (memcpy is the
 * aliasing-safe bit cast; it compiles to nothing). */
#define EXP_MASK 0x7f800000u
#define EXP_STEP 0x00800000u
#define CHECK_BLOCK 4096   /* floats per early exit: 16 KiB, in L1 */

static uint32_t bits_of(float x)
{
	uint32_t b;
	memcpy(&b, &x, sizeof(b));
	return b;
}

uint32_t optim_any_nonfinite(const float *g, size_t n)
{
	uint32_t acc = 0;
	for (size_t i = 0; i < n; i++)
		acc |= (bits_of(g[i]) & EXP_MASK) + EXP_STEP;
	return acc >> 31;
}

uint32_t optim_copy_nonfinite(float *restrict dst, const float *restrict src, size_t n)
{
	uint32_t acc = 0;
	for (size_t i = 0; i < n; i++) {
		dst[i] = src[i];
		acc |= (bits_of(src[i]) & EXP_MASK) + EXP_STEP;
	}
	return acc >> 31;
}

size_t optim_nonfinite(const float *g, size_t n)
{
	for (size_t at = 0; at < n; at += CHECK_BLOCK) {
		size_t m = n - at < CHECK_BLOCK ? n - at : CHECK_BLOCK;
		if (!optim_any_nonfinite(g + at, m))
			continue;
		for (size_t i = at; i < at + m; i++)
			if ((bits_of(g[i]) & EXP_MASK) == EXP_MASK)
				return i;
	}
	return n;
}
