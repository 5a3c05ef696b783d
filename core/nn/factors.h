/* A dense layer's weight gradient sent as its two factors.
 *
 * A dense layer's weight gradient over a batch of B is dZ^T A: dZ (B, out)
 * its output's gradient, A (B, in) its input. Where B is small against the
 * layer (the MLP's 784x512 weight at 128 a worker), A and the columns of
 * dZ for the rows a shard holds take fewer bytes than the rows themselves
 * (128 x (784 + 427) values against 427 x 784; on the wire their zeros,
 * half of a relu's output and gradient, cost a bit each), and the ps can
 * make the rows from them with the very GEMM the worker would have run:
 * the same products summed over the batch in the same order, so the bits
 * of the worker's own blocks (tests/test_factors.c). Nothing is rounded
 * or dropped: it is a way of sending the gradient, like packing. (A run
 * is not bit for bit another run: the worker's split backward cuts its
 * blocks where the links' timing says, and a GEMM's bits may follow the
 * block's shape; two runs without factors differ as much.)
 *
 * A run is whole pieces of one shard (psshard.h's pieces, counted from the
 * shard's begin) inside one dense weight: the ps takes a PUSH piece by
 * piece, and a run's pieces are made at once when its last one is in
 * (cluster/ps_push.c). Its factor stream is A (B x in) then the run's
 * columns of dZ (B x rows), float32; each piece's chunk carries an equal
 * share of it (docs/PROTOCOL.md, "fp32 as factors").
 *
 * The worker plans the runs of each link before a step (factors_plan), the
 * step keeps the factors (core/nn/replica.c: dZ is the replica's, A is
 * copied here since the next forward pass may overwrite it while the push
 * still goes out) and marks the runs final without computing them; the
 * link sends them (cluster/link.c). */
#ifndef PSTRAIN_CORE_FACTORS_H
#define PSTRAIN_CORE_FACTORS_H

#include "model.h"

#include <stddef.h>
#include <stdint.h>

#define FACTORS_MAX_RUNS 64
#define FACTORS_SHARE 0.75

struct factor_run {
	size_t lo, hi; /* [lo, hi) of the flat vector: whole pieces of one shard */
	int layer;     /* the dense layer whose weight holds them */
	int row0, rows; /* the weight rows they touch */
	int on;        /* set by the step: its factors are finite and kept */
};

struct factors {
	int n;                                /* runs this step */
	struct factor_run run[FACTORS_MAX_RUNS];
	int B;                                /* the step's batch */
	int max_batch;
	const float *dz[MODEL_MAX_LAYERS];    /* (B, out): the replica's, set by the step */
	float *a[MODEL_MAX_LAYERS];           /* (max_batch, in): the input, copied by the step */
};

/* Input copies for every dense layer of m. -ENOMEM. */
int factors_init(struct factors *f, const struct model *m, int max_batch);
void factors_free(struct factors *f); /* accepts a zeroed struct */

/* A new step of B samples: no runs. */
void factors_begin(struct factors *f, int B);

/* Appends the runs of shard [sb, se) (pieces of `piece` values from sb)
 * whose factors take at most FACTORS_SHARE of the bytes of the values
 * themselves at `bytes` a value: the ps's GEMM is the price of sending
 * them, so a run must save a good part of its bytes to be worth it. */
void factors_plan(struct factors *f, const struct model *m, size_t sb, size_t se, size_t piece,
		  double bytes);

/* The run that begins at lo, or NULL. */
const struct factor_run *factors_at(const struct factors *f, size_t lo);

/* Values in run r's factor stream for a batch of B: B x (in + rows). */
size_t factors_count(const struct model *m, const struct factor_run *r, int B);

/* Values [from, to) of run r's factor stream as little-endian float32
 * into out (4 x (to - from) bytes). */
void factors_write(const struct factors *f, const struct model *m, const struct factor_run *r,
		   size_t from, size_t to, uint8_t *out);

/* The ps's side: the weight rows [row0, row0 + rows) of a dense layer of
 * `in` inputs from the factor stream fac (B x (in + rows) floats: A, then
 * those rows' columns of dZ) into g (rows x in), as the worker's
 * dense_wgrad_rows would have made them into a zeroed gradient. */
void factors_expand(float *g, const float *fac, int B, int in, int rows);

#endif
