/* A dense layer's weight gradient as its two factors (factors.h). */
#include "factors.h"
#include "layers.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int factors_init(struct factors *f, const struct model *m, int max_batch)
{
	memset(f, 0, sizeof(*f));
	f->max_batch = max_batch;
	for (int i = 0; i < m->nlayers; i++) {
		const struct layer *l = &m->layers[i];
		if (l->kind != LAYER_DENSE)
			continue;
		f->a[i] = malloc((size_t)max_batch * (size_t)l->in * sizeof(float));
		if (!f->a[i]) {
			factors_free(f);
			return -ENOMEM;
		}
	}
	return 0;
}

void factors_free(struct factors *f)
{
	for (int i = 0; i < MODEL_MAX_LAYERS; i++)
		free(f->a[i]);
	memset(f, 0, sizeof(*f));
}

void factors_begin(struct factors *f, int B)
{
	f->n = 0;
	f->B = B;
}

/* Run [lo, hi) of dense layer l (lo < hi), filled in. */
static struct factor_run run_of(const struct layer *l, int i, size_t lo, size_t hi)
{
	size_t C = (size_t)l->in, q0 = lo - l->woff, q1 = hi - l->woff;
	struct factor_run r = { .lo = lo, .hi = hi, .layer = i };
	r.row0 = (int)(q0 / C);
	r.rows = (int)((q1 + C - 1) / C) - r.row0;
	return r;
}

void factors_plan(struct factors *f, const struct model *m, size_t sb, size_t se, size_t piece,
		  double bytes)
{
	for (int i = 0; i < m->nlayers && f->n < FACTORS_MAX_RUNS; i++) {
		const struct layer *l = &m->layers[i];
		if (l->kind != LAYER_DENSE)
			continue;
		size_t w0 = l->woff, w1 = l->woff + (size_t)l->in * (size_t)l->out;
		size_t lo = w0 > sb ? w0 : sb, hi = w1 < se ? w1 : se;
		if (lo >= hi)
			continue;
		/* whole pieces only: the first that starts at or after lo, up
		 * to the last that ends by hi (the shard's last may be short) */
		lo = sb + (lo - sb + piece - 1) / piece * piece;
		if (hi != se)
			hi = sb + (hi - sb) / piece * piece;
		if (lo >= hi)
			continue;
		struct factor_run r = run_of(l, i, lo, hi);
		double fac = 4.0 * (double)f->B * (double)(l->in + r.rows);
		if (fac <= FACTORS_SHARE * bytes * (double)(hi - lo))
			f->run[f->n++] = r;
	}
}

const struct factor_run *factors_at(const struct factors *f, size_t lo)
{
	for (int k = 0; k < f->n; k++)
		if (f->run[k].lo == lo)
			return &f->run[k];
	return NULL;
}

size_t factors_count(const struct model *m, const struct factor_run *r, int B)
{
	return (size_t)B * ((size_t)m->layers[r->layer].in + (size_t)r->rows);
}

void factors_write(const struct factors *f, const struct model *m, const struct factor_run *r,
		   size_t from, size_t to, uint8_t *out)
{
	const struct layer *l = &m->layers[r->layer];
	size_t na = (size_t)f->B * (size_t)l->in, rows = (size_t)r->rows;
	const float *a = f->a[r->layer], *dz = f->dz[r->layer];
	for (size_t e = from; e < to; e++, out += 4) {
		float v;
		if (e < na) {
			v = a[e];
		} else {
			size_t b = (e - na) / rows, j = (e - na) % rows;
			v = dz[b * (size_t)l->out + (size_t)r->row0 + j];
		}
		uint32_t u;
		memcpy(&u, &v, 4);
		out[0] = (uint8_t)u;
		out[1] = (uint8_t)(u >> 8);
		out[2] = (uint8_t)(u >> 16);
		out[3] = (uint8_t)(u >> 24);
	}
}

void factors_expand(float *g, const float *fac, int B, int in, int rows)
{
	memset(g, 0, (size_t)rows * (size_t)in * sizeof(float));
	dense_wgrad_rows(g, fac + (size_t)B * (size_t)in, fac, B, in, rows, 0, rows);
}
