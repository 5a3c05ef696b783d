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

/* The same loop with indices of type I: kernels templated on I run with
 * 32-bit unsigned indices, whose divisions cost a fraction of 64-bit ones,
 * whenever every index they form fits in 31 bits (FITS32: the loop's last
 * step past n cannot wrap then), and with size_t otherwise. */
#define GRID_STRIDE_T(I, i, n)                                      \
	for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < (n); \
	     i += (I)gridDim.x * blockDim.x)
#define FITS32(x) ((size_t)(x) < ((size_t)1 << 31))

/* kernel<unsigned> where fits, else kernel<size_t>, with the same launch. */
#define LAUNCH_I(fits, kernel, grid, block, stream, ...)                                  \
	do {                                                                               \
		if (fits)                                                                  \
			kernel<unsigned><<<(grid), (block), 0, (cudaStream_t)(stream)>>>(__VA_ARGS__); \
		else                                                                       \
			kernel<size_t><<<(grid), (block), 0, (cudaStream_t)(stream)>>>(__VA_ARGS__); \
	} while (0)

#endif
