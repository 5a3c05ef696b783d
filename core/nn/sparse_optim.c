/* Sparse optimizers over the touched rows of a table; see sparse_optim.h. */
#include "sparse_optim.h"
#include "embed.h"
#include "../../base/bigmem.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *sparse_kind_name(enum sparse_kind k)
{
	static const char *const names[] = { "adagrad", "lazy_adam" };
	return (unsigned)k < sizeof(names) / sizeof(names[0]) ? names[k] : "unknown";
}

int sparse_optim_init(struct sparse_optim *o, const struct sparse_config *c, uint64_t R, int dim)
{
	memset(o, 0, sizeof(*o));
	o->cfg = *c;
	o->rows = R;
	o->dim = dim;
	if (c->kind != SPARSE_ADAGRAD && c->kind != SPARSE_LAZY_ADAM)
		return -EINVAL;
	size_t n = (size_t)R * (size_t)dim;
	if (dim < 1 || n / (size_t)dim != R)
		return -EINVAL;
	o->m = n ? bigmem_alloc(n * sizeof(float)) : NULL;
	if (n && !o->m)
		goto err;
	if (c->kind == SPARSE_ADAGRAD) {
		for (size_t i = 0; SPARSE_ADAGRAD_INIT != 0.0f && i < n; i++)
			o->m[i] = SPARSE_ADAGRAD_INIT;   /* bigmem's are zeros already */
		return 0;
	}
	o->v = n ? bigmem_alloc(n * sizeof(float)) : NULL;
	if (n && !o->v)
		goto err;
	return 0;
err:
	sparse_optim_free(o);
	return -ENOMEM;
}

void sparse_optim_free(struct sparse_optim *o)
{
	if (!o)
		return;
	size_t n = (size_t)o->rows * (size_t)o->dim * sizeof(float);
	bigmem_free(o->m, n);
	bigmem_free(o->v, n);
	o->m = o->v = NULL;
}

static void adagrad_row(float *restrict w, float *restrict a, const float *restrict g, int dim,
			float lr)
{
	// w (dim), a (dim), g (dim)
	for (int d = 0; d < dim; d++) {
		float ad = a[d] + g[d] * g[d];
		a[d] = ad;
		w[d] -= lr * g[d] / (sqrtf(ad) + SPARSE_ADAGRAD_EPS);
	}
}

/* optim.c's adam_step for one row with weight decay 0, written the same
 * way so that its rounding is the same (g + 0 * w is g). */
static void adam_row(float *restrict w, float *restrict m, float *restrict v,
		     const float *restrict g, int dim, float step_size, float inv_sqrt_bc2, float b1,
		     float b2, float eps)
{
	// w (dim), m (dim), v (dim), g (dim)
	for (int d = 0; d < dim; d++) {
		float gd = g[d];
		float mi = b1 * m[d] + (1.0f - b1) * gd;
		float vi = b2 * v[d] + (1.0f - b2) * gd * gd;
		m[d] = mi;
		v[d] = vi;
		w[d] -= step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
	}
}

void sparse_optim_step(struct sparse_optim *o, float *table, const uint64_t *rows, const float *g,
		       size_t u, float lr)
{
	// table (R, DIM), rows (u), g (u, DIM)
	const struct sparse_config *c = &o->cfg;
	size_t dim = (size_t)o->dim;
	long t = ++o->t;
	if (c->kind == SPARSE_ADAGRAD) {
		for (size_t k = 0; k < u; k++) {
			embed_prefetch(table, rows, 0, k, u, o->dim, 1);
			embed_prefetch(o->m, rows, 0, k, u, o->dim, 1);
			adagrad_row(table + rows[k] * dim, o->m + rows[k] * dim, g + k * dim, o->dim, lr);
		}
		return;
	}
	/* As optim.c: the bias corrections once per step in double. */
	double bc1 = 1.0 - pow(c->beta1, (double)t);
	double bc2 = 1.0 - pow(c->beta2, (double)t);
	float step_size = (float)(lr / bc1);
	float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
	for (size_t k = 0; k < u; k++) {
		size_t at = rows[k] * dim;
		embed_prefetch(table, rows, 0, k, u, o->dim, 1);
		embed_prefetch(o->m, rows, 0, k, u, o->dim, 1);
		embed_prefetch(o->v, rows, 0, k, u, o->dim, 1);
		adam_row(table + at, o->m + at, o->v + at, g + k * dim, o->dim, step_size, inv_sqrt_bc2,
			 c->beta1, c->beta2, c->eps);
	}
}
