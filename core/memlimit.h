/* [ps] memory_limit: the MiB one process may give the model it holds (a
 * ps its shard, a local run the whole model): the parameters, the
 * embedding rows, and their optimizer state, the memory that grows with
 * the model. A ps checks its shard at start, a local run its model, with
 * the same line, so that a model too large for one process is told to
 * spread over several ps rather than found out by the allocator (or the
 * kernel's OOM killer) part way into a run. What comes on top (buffers
 * per connection, a sync ps's gradient slots, the data) is not counted:
 * it is bounded by the batch and the workers, not the model, and
 * docs/CONFIG.md says so. */
#ifndef PSTRAIN_MEMLIMIT_H
#define PSTRAIN_MEMLIMIT_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of n parameters with the state of optimizer kind (enum
 * optim_kind: none for sgd, one vector for momentum, two for adam). */
uint64_t memlimit_dense(uint64_t n, int kind);
/* Bytes of rows embedding rows of width dim with the state of sparse
 * optimizer kind (enum sparse_kind: one accumulator for adagrad, two
 * moments for lazy_adam). */
uint64_t memlimit_rows(uint64_t rows, int dim, int kind);

/* 0 when limit_mib is 0 (no limit) or bytes fit it; else -EINVAL and one
 * line in err: "WHO needs 1.2 GiB for its parameters, embedding rows and
 * their optimizer state, more than [ps] memory_limit = 64 MiB: spread the
 * tables over more ps ([cluster] ps)". */
int memlimit_check(const char *who, uint64_t bytes, int limit_mib, char *err, size_t errlen);

#endif
