/* The ps's side of a run of PUSH pieces sent as factors (ps_conn.h's
 * struct ps_factors; core/nn/factors.h): each chunk of the run is one of
 * its pieces and carries a share of the factor stream; at the last one
 * the run's weight rows are made with the worker's own GEMM and its
 * pieces aggregated as if they had come as values. Everything about the
 * run is checked against this ps's model and shard before a byte of it
 * is kept: it must be whole pieces inside one dense weight, for a batch
 * no larger than [train] batch_size, and its stream exactly as long as
 * that batch and those rows make it. */
#include "ps_conn.h"

#include "../base/err.h"
#include "../core/nn/factors.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void ps_factors_free(struct ps_factors *fx)
{
	free(fx->fac);
	free(fx->rows);
	memset(fx, 0, sizeof(*fx));
}

/* The dense layer whose weight holds all of [lo, hi) (global), or -1. */
static int run_layer(const struct model *m, size_t lo, size_t hi)
{
	for (int i = 0; i < m->nlayers; i++) {
		const struct layer *l = &m->layers[i];
		if (l->kind == LAYER_DENSE && lo >= l->woff && hi <= l->woff + (size_t)l->in * (size_t)l->out)
			return i;
	}
	return -1;
}

/* The buffers, at a connection's first run: the longest stream a batch
 * of batch_size can make, and the rows of a run as long as the shard. */
static int fx_alloc(struct ps_conn *cn, char *err, size_t errlen)
{
	struct ps_factors *fx = &cn->fx;
	const struct model *m = &cn->ps->s->job.m;
	if (fx->fac)
		return 0;
	size_t wide = 0, in = 0;
	for (int i = 0; i < m->nlayers; i++) {
		const struct layer *l = &m->layers[i];
		if (l->kind != LAYER_DENSE)
			continue;
		wide = (size_t)(l->in + l->out) > wide ? (size_t)(l->in + l->out) : wide;
		in = (size_t)l->in > in ? (size_t)l->in : in;
	}
	fx->cap = (size_t)cn->ps->c->train.batch_size * wide;
	fx->fac = malloc(fx->cap * sizeof(float));
	fx->rows = malloc((cn->ps->sh.n + 2 * in) * sizeof(float));
	if (!fx->fac || !fx->rows) {
		ps_factors_free(fx);
		return err_set(err, errlen, -ENOMEM, "out of memory for worker %d's factors", cn->w);
	}
	return 0;
}

/* The run that chunk c opens: run values from its offset, batch B. */
static int fx_open(struct ps_conn *cn, const struct msg_chunk *c, uint32_t run, uint32_t B, char *err,
		   size_t errlen)
{
	struct ps *ps = cn->ps;
	struct ps_factors *fx = &cn->fx;
	const struct model *m = &ps->s->job.m;
	uint64_t lo = c->offset, hi = lo + run, n = ps->sh.n;
	if (hi > n || (hi % PSSHARD_PIECE && hi != n))
		return err_set(err, errlen, -EPROTO, "PUSH: factors of [%llu, %llu), which does not end at one of the shard's pieces",
			       (unsigned long long)lo, (unsigned long long)hi);
	size_t g0 = ps->sh.range.begin + lo, g1 = ps->sh.range.begin + hi;
	int i = run_layer(m, g0, g1);
	if (i < 0)
		return err_set(err, errlen, -EPROTO, "PUSH: factors of [%llu, %llu), which is not inside one dense layer's weight",
			       (unsigned long long)lo, (unsigned long long)hi);
	if (B > (uint32_t)ps->c->train.batch_size)
		return err_set(err, errlen, -EPROTO, "PUSH: factors of a batch of %u, above [train] batch_size %d", B,
			       ps->c->train.batch_size);
	int r = fx_alloc(cn, err, errlen);
	if (r)
		return r;
	const struct layer *l = &m->layers[i];
	size_t C = (size_t)l->in, row0 = (g0 - l->woff) / C, nrows = (g1 - l->woff + C - 1) / C - row0;
	size_t need = (size_t)B * (C + nrows);
	if (need > fx->cap) /* B and the rows are bounded above: never */
		return err_set(err, errlen, -EPROTO, "PUSH: factors of %zu values, above the %zu a batch can make",
			       need, fx->cap);
	fx->layer = i;
	fx->row0 = (int)row0;
	fx->nrows = (int)nrows;
	fx->need = need;
	fx->have = 0;
	fx->hi = hi;
	fx->next = lo;
	fx->B = B;
	return 0;
}

/* The run is in: its rows made, then each of its pieces aggregated. */
static int fx_close(struct ps_conn *cn, uint64_t tag, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	struct ps_factors *fx = &cn->fx;
	const struct layer *l = &ps->s->job.m.layers[fx->layer];
	size_t C = (size_t)l->in, first = l->woff + (size_t)fx->row0 * C - ps->sh.range.begin;
	factors_expand(fx->rows, fx->fac, (int)fx->B, l->in, fx->nrows);
	size_t lo = fx->hi - fx->runlen, end = fx->hi;
	fx->need = 0;
	for (size_t j = lo / PSSHARD_PIECE; j * PSSHARD_PIECE < end; j++) {
		int r = ps_push_piece(cn, tag, j, fx->rows + (j * PSSHARD_PIECE - first), err, errlen);
		if (r)
			return r;
	}
	return 0;
}

int ps_factors_take(struct ps_conn *cn, const struct msg_chunk *c, char *err, size_t errlen)
{
	struct ps_factors *fx = &cn->fx;
	if (c->dtype != WIRE_F32F)
		return err_set(err, errlen, -EPROTO, "PUSH: a run of factors broke off at offset %llu, before its end %llu",
			       (unsigned long long)c->offset, (unsigned long long)fx->hi);
	uint32_t run, B;
	size_t k;
	msg_chunk_factors(c, &run, &B, &k);
	if (!fx->need) {
		int r = fx_open(cn, c, run, B, err, errlen);
		if (r)
			return r;
		fx->runlen = run;
	} else if (c->offset != fx->next || c->offset + run != fx->hi || B != fx->B) {
		return err_set(err, errlen, -EPROTO, "PUSH: factors at offset %llu of a run of %u, batch %u: not the next of the run to %llu, batch %u",
			       (unsigned long long)c->offset, run, B, (unsigned long long)fx->hi, fx->B);
	}
	if (k > fx->need - fx->have)
		return err_set(err, errlen, -EPROTO, "PUSH: more factors than the run [%llu, %llu) needs (%zu)",
			       (unsigned long long)(fx->hi - fx->runlen), (unsigned long long)fx->hi, fx->need);
	msg_chunk_factor_values(fx->fac + fx->have, c);
	fx->have += k;
	fx->next += c->count;
	if (fx->next < fx->hi)
		return 0;
	if (fx->have != fx->need)
		return err_set(err, errlen, -EPROTO, "PUSH: the run [%llu, %llu) ended with %zu of its %zu factors",
			       (unsigned long long)(fx->hi - fx->runlen), (unsigned long long)fx->hi, fx->have,
			       fx->need);
	return fx_close(cn, c->version, err, errlen);
}
