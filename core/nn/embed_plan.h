/* A batch's embedding plan: from the categorical IDs of its segments
 * (sample, field) to the unique table rows the batch touches and the two
 * indexes the kernels (embed.h) walk, one per direction:
 *
 *   rows (u)          the unique global rows, ascending: what a batch-local
 *                     table U (u, DIM) holds, gathered from the full table
 *                     (or, in a cluster, pulled from the ps that own them)
 *   off (B*F + 1)     segment s's entries are [off[s], off[s+1])
 *   idx (nnz)         entry k's row, as an index into rows and U
 *   roff (u + 1)      row k's entries are rseg[roff[k] .. roff[k+1])
 *   rseg (nnz)        those entries' segments, in ascending entry order
 *
 * Entries are numbered segment by segment in list order, so "ascending
 * entry" is sample-major, then field, then position in the field: the order
 * embed_backward adds a row's gradient in. The plan is made on the host:
 * the rows are what a worker must fetch before anything runs on a device.
 * Building it is a stable radix sort of (row, entry) pairs, linear in the
 * batch's IDs and independent of the table's size. */
#ifndef PSTRAIN_EMBED_PLAN_H
#define PSTRAIN_EMBED_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "embed.h"

struct embed_pair;   /* embed_plan.c's sort record */

struct embed_plan {
	int B, F;
	size_t u, nnz;
	uint64_t *rows;   /* (u) */
	uint32_t *off;    /* (B*F + 1) */
	uint32_t *idx;    /* (nnz) */
	uint32_t *roff;   /* (u + 1) */
	uint32_t *rseg;   /* (nnz) */
	size_t max_segs, max_nnz;    /* capacity: segments B*F, entries */
	struct embed_pair *pair[2];  /* (max_nnz) the sort's ping-pong buffers */
};

/* Buffers for batches of up to max_segs segments (B*F) and max_nnz IDs,
 * taken once, so that building a plan in a step allocates nothing.
 * Returns 0, -EINVAL (max_nnz over 2^32 - 1) or -ENOMEM; on failure p is
 * left for embed_plan_free. */
int embed_plan_init(struct embed_plan *p, size_t max_segs, size_t max_nnz);
void embed_plan_free(struct embed_plan *p);   /* accepts NULL and zeroed structs */

/* The plan of a batch of B samples of s->fields fields. seg (B*F + 1) NULL:
 * ids (B, F) holds one ID per segment (the dataset's layout); otherwise
 * segment t's IDs are ids[seg[t] .. seg[t+1]) (seg[0] = 0, non-decreasing:
 * multi-valued fields). DATA_ID_NONE (dataset.h) is no ID at all: it adds
 * no entry. -EINVAL for a batch or a list over the capacity or a seg that
 * goes backwards. */
int embed_plan_build(struct embed_plan *p, const struct embed_spec *s, const uint32_t *seg,
		     const uint32_t *ids, int B);

#endif
