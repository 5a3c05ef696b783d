/* The embedding layer's pieces that do not depend on where they run: the
 * layer's spec, which table row a (field, ID) lands in, the tables'
 * initial values, and the CPU twins of its three kernels (gpu/kernels_embed.cu
 * has the CUDA ones, with the same arguments and the same order of sums).
 *
 * A table is (R, DIM) float32, row-major. Its rows are NOT part of the dense
 * parameter vector (model.h's P): a batch touches few of them, so forward and
 * backward run on a batch-local compact table U (u, DIM) of just the unique
 * rows the batch touches (embed_plan.h builds the index), and the sparse
 * optimizer (sparse_optim.h) updates those rows in the full table. A
 * cluster's ps will shard the tables by row, which is why the row of an ID is
 * a fixed function of the ID and its field alone (embed_row).
 *
 * Dimensions: B batch, F fields, D numeric features, DIM embedding width,
 * u unique rows of a batch, nnz IDs present in a batch. A segment is one
 * (sample, field) pair, s = b * F + f, and holds a list of IDs (one for
 * Criteo's layout, none for a missing value, several for a multi-valued
 * field); its pooled vector is the sum, or the mean, of their rows. */
#ifndef PSTRAIN_EMBED_H
#define PSTRAIN_EMBED_H

#include <stddef.h>
#include <stdint.h>

enum embed_pool {
	EMBED_SUM,
	EMBED_MEAN,   /* the sum over the segment's count; an empty segment is 0 */
};

/* `layer = embedding FIELDS ROWS DIM [shared] [pool=sum|mean]`. */
struct embed_spec {
	int fields;          /* F */
	int rows;            /* ROWS: rows of each table (of the one table when shared) */
	int dim;             /* DIM */
	int shared;          /* 1: one table for every field */
	enum embed_pool pool;
};

#define EMBED_MAX_FIELDS 1024
#define EMBED_MAX_ROWS 2147483647   /* a table's rows: int */
#define EMBED_MAX_DIM 1024

/* R: the rows of all tables together, F * ROWS (ROWS when shared). */
static inline uint64_t embed_total_rows(const struct embed_spec *s)
{
	return s->shared ? (uint64_t)s->rows : (uint64_t)s->fields * (uint64_t)s->rows;
}

/* The bytes of all tables in float32: what a holder of the whole tables
 * (local, predict) allocated, once it checked that they fit a size_t. */
static inline size_t embed_table_bytes(const struct embed_spec *s)
{
	return (size_t)embed_total_rows(s) * (size_t)s->dim * sizeof(float);
}

/* One option after "embedding FIELDS ROWS DIM": "shared", "pool=sum" or
 * "pool=mean", in any order, each at most once (*seen_pool: a pool= came
 * before; start at 0). Returns 0 or -EINVAL with one line in err
 * (core/nn/embed_spec.c, which model.c's layer parser and the config
 * fuzzer link without the kernels). */
int embed_spec_option(struct embed_spec *s, const char *opt, int *seen_pool, char *err,
		      size_t errlen);
/* The spec back as layer text: "embedding 26 100000 16 shared pool=mean". */
void embed_spec_format(const struct embed_spec *s, char *buf, size_t len);

/* splitmix64's output function over the 64-bit word (field << 32) | id:
 *   z = ((uint64_t)field << 32 | id) + 0x9e3779b97f4a7c15
 *   z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
 *   z = (z ^ (z >> 27)) * 0x94d049bb133111eb
 *   return z ^ (z >> 31)
 * Fixed for good: a table's rows (and a ps's shard of them, and a
 * checkpoint) mean something only under this function, so it never takes
 * the seed and never changes. tests/test_embed.c pins its values. */
uint64_t embed_hash(uint32_t id, int field);

/* The global row of field f's ID: (shared ? 0 : f * ROWS) + embed_hash(id,
 * f) mod ROWS. Per-field tables are laid end to end in field order, so
 * global row g of a per-field table is row g mod ROWS of field g / ROWS's.
 * The field takes part in the hash in a shared table too, so one ID in two
 * fields (a "1" in both) lands in two rows. */
uint64_t embed_row(const struct embed_spec *s, int field, uint32_t id);

/* Initial values of global rows [r0, r1) into out ((r1 - r0), DIM):
 * uniform in [-EMBED_INIT, EMBED_INIT) from (seed, RNG_EMBED, row * DIM +
 * d), Keras's default for Embedding, so any split of the rows (ps shards)
 * starts from the same table. */
#define EMBED_INIT 0.05
void embed_init_rows(const struct embed_spec *s, float *out, uint64_t r0, uint64_t r1,
		     uint64_t seed);

/* ---- kernels ---------------------------------------------------------------
 * Every sum runs in a fixed order that the GPU twins follow too, so a run is
 * reproducible bit for bit and a ps can later add the same terms in the same
 * order: a pooled vector adds its segment's entries in list order, a row's
 * gradient adds its entries in ascending entry order (sample-major, then
 * field, then position in the field's list). No products are fused, and the
 * mean divides (not multiplies by a reciprocal), which a GPU does exactly
 * too. */

/* U (u, DIM) = table (R, DIM) rows rows[0 .. u): the unique-row gather. */
void embed_gather_rows(float *U, const float *table, const uint64_t *rows, size_t u, int DIM);

/* The rows a gather or a sparse update touches are scattered over tables
 * far larger than the caches, so each is a miss: asking for the row
 * EMBED_AHEAD places ahead overlaps them (an Adagrad step over 3,300 of
 * 5.2M rows of 16 ran 1.5x faster, bench/rows_step.c). Both ends of the
 * row, for one that spans two cache lines; 0 turns it off (the bench's
 * plain build). 16: in 2 MiB pages and vectorized, Adagrad took 109, 85,
 * 80 and 82 us at 4, 8, 16 and 32 ahead, the gather 54, 45, 38, 36 (Zen
 * 4): a plateau from 12 on, so the distance is not fitted to one CPU's
 * latency. */
#ifndef EMBED_AHEAD
#define EMBED_AHEAD 16
#endif
static inline void embed_prefetch(const float *table, const uint64_t *rows, uint64_t r0, size_t k, size_t u,
				  int DIM, int write)
{
	// table's row i is global row r0 + i; rows (u) are global
	if (!EMBED_AHEAD || k + EMBED_AHEAD >= u)
		return;
	const float *p = table + (rows[k + EMBED_AHEAD] - r0) * (uint64_t)DIM;
	if (write) {
		__builtin_prefetch(p, 1);
		__builtin_prefetch(p + DIM - 1, 1);
	} else {
		__builtin_prefetch(p, 0);
		__builtin_prefetch(p + DIM - 1, 0);
	}
}

/* out (B, F*DIM + D), set: out[b, f*DIM + d] = the pool (sum or mean) over
 * entries k in [off[s], off[s+1]) of U[idx[k], d], s = b*F + f, adding in k
 * order; then x[b, :] (B, D) in the last D columns.
 * off (B*F + 1), idx (nnz) index into U (u, DIM). */
void embed_forward(float *out, const float *x, const float *U, const uint32_t *off,
		   const uint32_t *idx, int B, int F, int D, int DIM, enum embed_pool pool);

/* dU (u, DIM), SET (U is made for one batch, so there is nothing to add
 * to): dU[k, d] = the sum over j in [roff[k], roff[k+1]) of
 * dout[b, f*DIM + d] (mean: divided by segment s's count off[s+1] -
 * off[s]) with s = rseg[j] = b*F + f, adding in j order; the last D
 * columns of dout (the numeric features') are not read.
 * dout (B, F*DIM + D), roff (u + 1), rseg (nnz), off (B*F + 1). */
void embed_backward(float *dU, const float *dout, const uint32_t *roff, const uint32_t *rseg,
		    const uint32_t *off, size_t u, int F, int D, int DIM, enum embed_pool pool);

#endif
