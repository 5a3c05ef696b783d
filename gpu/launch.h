/* Launch geometry shared by the kernel files (C++, .cu only). */
#ifndef PSTRAIN_GPU_LAUNCH_H
#define PSTRAIN_GPU_LAUNCH_H

#include <cuda_runtime.h>
#include <stddef.h>

#define THREADS 256
/* Enough blocks to fill any current GPU several times over; the grid-stride
 * loops cover the rest. */
#define MAX_BLOCKS 4096

static inline unsigned blocks_for(size_t n)
{
	size_t b = (n + THREADS - 1) / THREADS;
	return (unsigned)(b < 1 ? 1 : b > MAX_BLOCKS ? MAX_BLOCKS : b);
}

/* The launch's own error (bad configuration); a kernel's faults surface at
 * the next synchronizing call, which the backend checks too. */
static inline int launched(void)
{
	return (int)cudaGetLastError();
}

#define GRID_STRIDE(i, n)                                                      \
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
	     i += (size_t)gridDim.x * blockDim.x)

#endif
