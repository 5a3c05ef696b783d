/* Sparse optimizers for embedding tables: each step updates only the rows a
 * batch touched (their unique rows and gradients, embed_plan.h), so a step
 * costs the batch's rows, never the table's. The state is indexed like the
 * table, row for row; a ps will run the same code over its shard's rows.
 *
 *   adagrad:    a += g^2;  w -= lr * g / (sqrt(a) + eps)
 *               a starts at SPARSE_ADAGRAD_INIT = 0, eps = SPARSE_ADAGRAD_EPS
 *               (PyTorch's Adagrad and its defaults). Not TensorFlow's 0.1:
 *               a rare row's gradient is a batch mean, 1/B of one sample's,
 *               and from a = 0.1 such a row hardly moves (26 Zipf fields of
 *               2000 IDs, 200,000 samples, batch 256, one epoch: test AUC
 *               0.54 at lr 0.05 and 0.71 at lr 2 from 0.1, 0.72 at lr 0.05
 *               from 0, whose steps do not depend on the gradient's scale)
 *   lazy_adam:  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *               w -= lr/(1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
 *               for the touched rows only: the moments of a row no batch
 *               touched do not decay (TensorFlow Addons' LazyAdam); t
 *               counts steps of the whole table, not of the row, so the
 *               bias correction is the step's, as TensorFlow's is. Each
 *               touched row's update is optim.h's adam (no weight decay)
 *               bit for bit, which tests/test_embed.c checks.
 *
 * No weight decay: a decay applied only when a row is touched would shrink
 * frequent IDs and spare rare ones, the opposite of what it is for. */
#ifndef PSTRAIN_SPARSE_OPTIM_H
#define PSTRAIN_SPARSE_OPTIM_H

#include <stddef.h>
#include <stdint.h>

enum sparse_kind {
	SPARSE_ADAGRAD,
	SPARSE_LAZY_ADAM,
};

#define SPARSE_ADAGRAD_INIT 0.0f
#define SPARSE_ADAGRAD_EPS 1e-10f

struct sparse_config {
	enum sparse_kind kind;
	float lr;
	float beta1, beta2, eps;   /* lazy_adam ([train] adam_beta1, adam_beta2, adam_epsilon) */
};

struct sparse_optim {
	struct sparse_config cfg;
	uint64_t rows;    /* R */
	int dim;          /* DIM */
	float *m;         /* (R, DIM) adagrad's accumulator, or lazy_adam's first moment */
	float *v;         /* (R, DIM) lazy_adam's second moment; NULL for adagrad */
	long t;           /* steps applied */
};

/* "adagrad" or "lazy_adam": the [train] embedding_optimizer value. */
const char *sparse_kind_name(enum sparse_kind k);

/* State for a table of R rows of DIM, at its starting values. Returns 0,
 * -EINVAL for an unknown kind, or -ENOMEM; on failure o is left freeable. */
int sparse_optim_init(struct sparse_optim *o, const struct sparse_config *c, uint64_t R, int dim);
void sparse_optim_free(struct sparse_optim *o);   /* accepts NULL and zeroed structs */

/* One step: table (R, DIM) rows rows[0 .. u) (distinct, each < R) take
 * their gradients g (u, DIM) with learning rate lr; t moves by one. Rows not
 * listed and their state are not read or written. */
void sparse_optim_step(struct sparse_optim *o, float *table, const uint64_t *rows, const float *g,
		       size_t u, float lr);

#endif
