/* The GPU memory arena's CUDA side: cudaMalloc and cudaFree behind struct
 * arena_mem, and arena_init, which reads ARENA_EXACT_ENV once and opens
 * the arena. The bookkeeping is in arena.c; see arena.h. */
#include "arena.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double gib(size_t n)
{
	return (double)n / (double)(1u << 30);
}

/* Allocates on the arena's device even when another one is current (the
 * backend sets it before each call, but an exact arena allocates at every
 * arena_alloc, so make sure) and leaves the current device as it was. */
static int cuda_get(void *ctx, int device, void **p, size_t bytes, char *err, size_t errlen)
{
	(void)ctx;
	int cur = device;
	cudaGetDevice(&cur);
	cudaError_t e = cur == device ? cudaSuccess : cudaSetDevice(device);
	*p = NULL;
	if (e != cudaSuccess) {
		cudaGetLastError();
		snprintf(err, errlen, "gpu:%d: cudaSetDevice: %s", device, cudaGetErrorString(e));
		return -EIO;
	}
	e = cudaMalloc(p, bytes);
	if (e != cudaSuccess) {
		cudaGetLastError();
		size_t free_b = 0, total_b = 0;
		cudaMemGetInfo(&free_b, &total_b);
		snprintf(err, errlen, "gpu:%d: cudaMalloc of %zu bytes (%.2f GiB) failed: %s "
			 "(%.2f of %.2f GiB free)", device, bytes, gib(bytes), cudaGetErrorString(e),
			 gib(free_b), gib(total_b));
		*p = NULL;
	}
	if (cur != device)
		cudaSetDevice(cur);
	return e == cudaSuccess ? 0 : -ENOMEM;
}

static void cuda_put(void *ctx, int device, void *p)
{
	(void)ctx;
	int cur = device;
	cudaGetDevice(&cur);
	if (cur != device)
		cudaSetDevice(device);
	cudaFree(p);
	if (cur != device)
		cudaSetDevice(cur);
}

static const struct arena_mem cuda_mem = { cuda_get, cuda_put, NULL };

int arena_init(struct gpu_arena *a, int device, size_t cap, int growth, char *err, size_t errlen)
{
	char why[160];
	int exact = 0;
	if (arena_exact_parse(getenv(ARENA_EXACT_ENV), &exact, why, sizeof(why)) < 0) {
		memset(a, 0, sizeof(*a));
		snprintf(err, errlen, "gpu:%d: %s", device, why);
		return -EINVAL;
	}
	return arena_open(a, &cuda_mem, device, cap, growth, exact, err, errlen);
}
