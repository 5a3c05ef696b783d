/* Fork-join over a fixed number of threads for the CPU kernels.
 *
 * parallel_run starts threads - 1 pthreads per call and runs the last share
 * in the caller; there is no pool, so nothing outlives a call and nothing
 * needs freeing. A start costs tens of microseconds, against milliseconds of
 * work per call in the layers that use it (conv, pooling, batchnorm,
 * activations of a whole batch). Kernels split their work into ranges that
 * do not depend on the thread count, so results are the same bit for bit
 * with any number of threads. */
#ifndef PSTRAIN_PARALLEL_H
#define PSTRAIN_PARALLEL_H

#include <stddef.h>

/* Runs fn(arg, t, nt) for t = 0 .. nt - 1, nt = threads (at least 1), each
 * in its own thread, and returns when all have. A thread that cannot be
 * started has its share run by the caller instead. */
void parallel_run(int threads, void (*fn)(void *arg, int t, int nt), void *arg);

/* [*lo, *hi): share t of nt of the range [0, n), contiguous and in order,
 * sizes differing by at most one. */
static inline void parallel_share(size_t n, int t, int nt, size_t *lo, size_t *hi)
{
	*lo = n * (size_t)t / (size_t)nt;
	*hi = n * (size_t)(t + 1) / (size_t)nt;
}

#endif
