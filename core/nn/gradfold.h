/* The one definition of how a step's slice gradients become its gradient
 * (docs/ELASTIC.md): g_0, then + g_1, + g_2, ... in slice order, element
 * by element in float32 (a left fold), then divided by the number of
 * slices S. A ps shard (cluster/psshard.c) and `local` with [train]
 * slices > 1 (core/nn/devices_slices.c) both call these, so the two
 * cannot drift apart: the same sums in the same order give the same bits,
 * whichever process computed which slice.
 *
 * Division, not multiplication by 1/S: for S a power of two both are
 * exact, and otherwise this is the correctly rounded mean. Any other
 * order (arrival order, a tree, a worker pre-summing its own slices)
 * rounds differently.
 *
 * Embedding rows fold the same way, row by row: a slice that did not
 * touch a row adds nothing to it (where the dense fold would add its
 * zero, which changes no bits but a -0's sign), and the sum of those
 * that did is divided by S, all S, not by how many touched it. */
#ifndef PSTRAIN_GRADFOLD_H
#define PSTRAIN_GRADFOLD_H

#include <stddef.h>
#include <stdint.h>

/* acc (n) += g (n): the next slice in order. */
void grad_fold_add(float *restrict acc, const float *restrict g, size_t n);

/* acc (n) /= S: the fold of all S slices becomes their mean. */
void grad_fold_finish(float *acc, int S, size_t n);

/* The rows of k slices, in slice order: slice i's cnt[i] row ids ids[i]
 * (strictly ascending) with its gradient rows vals[i] (cnt[i], dim). Their
 * union, ascending, into uids (u), and each union row's fold, finished
 * with S, into usum (u, dim); u returned. cur (k) is scratch. uids and
 * usum must hold the sum of cnt. */
size_t grad_fold_rows(int k, const uint64_t *const *ids, const float *const *vals, const size_t *cnt, int dim,
		      int S, size_t *cur, uint64_t *uids, float *usum);

#endif
