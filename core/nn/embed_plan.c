/* A batch's embedding plan; see embed_plan.h. */
#include "embed_plan.h"

#include "../data/dataset.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct embed_pair {
	uint64_t row;
	uint32_t seg;    /* the entry's segment */
	uint32_t entry;
};

/* 11-bit digits: a 2048-bin histogram stays in L1, and the 2.6 million rows
 * of Criteo's 26 fields x 100,000 need two passes. */
#define RADIX_BITS 11
#define RADIX_BINS (1u << RADIX_BITS)

int embed_plan_init(struct embed_plan *p, size_t max_segs, size_t max_nnz)
{
	memset(p, 0, sizeof(*p));
	if (max_nnz > UINT32_MAX || max_segs > UINT32_MAX - 1)
		return -EINVAL;
	size_t n = max_nnz ? max_nnz : 1;
	p->max_segs = max_segs;
	p->max_nnz = max_nnz;
	p->rows = malloc(n * sizeof(*p->rows));
	p->off = malloc((max_segs + 1) * sizeof(*p->off));
	p->idx = malloc(n * sizeof(*p->idx));
	p->roff = malloc((n + 1) * sizeof(*p->roff));
	p->rseg = malloc(n * sizeof(*p->rseg));
	p->pair[0] = malloc(n * sizeof(struct embed_pair));
	p->pair[1] = malloc(n * sizeof(struct embed_pair));
	if (!p->rows || !p->off || !p->idx || !p->roff || !p->rseg || !p->pair[0] || !p->pair[1])
		return -ENOMEM;
	return 0;
}

void embed_plan_free(struct embed_plan *p)
{
	if (!p)
		return;
	free(p->rows);
	free(p->off);
	free(p->idx);
	free(p->roff);
	free(p->rseg);
	free(p->pair[0]);
	free(p->pair[1]);
	memset(p, 0, sizeof(*p));
}

/* The entries of every segment in order into pair[0], and off. */
static int plan_entries(struct embed_plan *p, const struct embed_spec *s, const uint32_t *seg,
			const uint32_t *ids, size_t nseg)
{
	size_t n = 0;
	int F = s->fields;
	for (size_t t = 0; t < nseg; t++) {
		size_t lo = seg ? seg[t] : t, hi = seg ? seg[t + 1] : t + 1;
		if (hi < lo)
			return -EINVAL;
		p->off[t] = (uint32_t)n;
		for (size_t k = lo; k < hi; k++) {
			if (ids[k] == DATA_ID_NONE)
				continue;
			if (n == p->max_nnz)
				return -EINVAL;
			struct embed_pair *e = &p->pair[0][n];
			e->row = embed_row(s, (int)(t % (size_t)F), ids[k]);
			e->seg = (uint32_t)t;
			e->entry = (uint32_t)n;
			n++;
		}
	}
	p->off[nseg] = (uint32_t)n;
	p->nnz = n;
	return 0;
}

/* Stable LSD radix sort of pair[0] by row, over the digits R - 1 needs;
 * returns the buffer that holds the result. Stable, so equal rows keep
 * their entries in ascending order. */
static struct embed_pair *plan_sort(struct embed_plan *p, uint64_t R)
{
	_Static_assert(RADIX_BINS <= 4096, "the histogram lives on the stack");
	size_t count[RADIX_BINS];
	struct embed_pair *src = p->pair[0], *dst = p->pair[1];
	for (unsigned shift = 0; shift < 64 && ((R - 1) >> shift) != 0; shift += RADIX_BITS) {
		memset(count, 0, sizeof(count));
		for (size_t i = 0; i < p->nnz; i++)
			count[(src[i].row >> shift) & (RADIX_BINS - 1)]++;
		size_t at = 0;
		for (unsigned b = 0; b < RADIX_BINS; b++) {
			size_t c = count[b];
			count[b] = at;
			at += c;
		}
		for (size_t i = 0; i < p->nnz; i++)
			dst[count[(src[i].row >> shift) & (RADIX_BINS - 1)]++] = src[i];
		struct embed_pair *t = src;
		src = dst;
		dst = t;
	}
	return src;
}

int embed_plan_build(struct embed_plan *p, const struct embed_spec *s, const uint32_t *seg,
		     const uint32_t *ids, int B)
{
	size_t nseg = (size_t)B * (size_t)s->fields;
	p->B = 0;
	p->u = p->nnz = 0;
	if (B < 0 || nseg > p->max_segs || (seg && seg[0] != 0))
		return -EINVAL;
	int e = plan_entries(p, s, seg, ids, nseg);
	if (e)
		return e;
	const struct embed_pair *sorted = plan_sort(p, embed_total_rows(s));
	size_t u = 0;
	for (size_t j = 0; j < p->nnz; j++) {
		if (j == 0 || sorted[j].row != sorted[j - 1].row) {
			p->rows[u] = sorted[j].row;
			p->roff[u] = (uint32_t)j;
			u++;
		}
		p->rseg[j] = sorted[j].seg;
		p->idx[sorted[j].entry] = (uint32_t)(u - 1);
	}
	p->roff[u] = (uint32_t)p->nnz;
	p->u = u;
	p->B = B;
	p->F = s->fields;
	return 0;
}
