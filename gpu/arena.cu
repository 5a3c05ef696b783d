/* The GPU memory arena; see arena.h. */
#include "arena.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

static size_t align_up(size_t n)
{
	return (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
}

static double gib(size_t n)
{
	return (double)n / (double)(1u << 30);
}

static int chunk_add(struct gpu_arena *a, size_t size, char *err, size_t errlen)
{
	if (a->nchunks == ARENA_MAX_CHUNKS) {
		snprintf(err, errlen, "gpu:%d: memory arena has %d chunks already", a->device,
			 ARENA_MAX_CHUNKS);
		return -ENOMEM;
	}
	void *p = NULL;
	cudaError_t e = cudaMalloc(&p, size);
	if (e != cudaSuccess) {
		cudaGetLastError();
		size_t free_b = 0, total_b = 0;
		cudaMemGetInfo(&free_b, &total_b);
		snprintf(err, errlen, "gpu:%d: cudaMalloc of %zu bytes (%.2f GiB) failed: %s "
			 "(%.2f of %.2f GiB free); lower [gpu] memory_fraction or set allow_growth = true",
			 a->device, size, gib(size), cudaGetErrorString(e), gib(free_b), gib(total_b));
		return -ENOMEM;
	}
	a->chunk[a->nchunks++] = (struct arena_chunk){ (char *)p, size, 0 };
	return 0;
}

int arena_init(struct gpu_arena *a, int device, size_t cap, int growth, char *err, size_t errlen)
{
	memset(a, 0, sizeof(*a));
	a->device = device;
	a->cap = cap & ~(size_t)(ARENA_ALIGN - 1);
	a->growth = growth;
	return growth ? 0 : chunk_add(a, a->cap, err, errlen);
}

int arena_alloc(struct gpu_arena *a, void **p, size_t bytes, char *err, size_t errlen)
{
	size_t n = align_up(bytes ? bytes : 1);
	*p = NULL;
	a->wanted += n;
	struct arena_chunk *c = a->nchunks ? &a->chunk[a->nchunks - 1] : NULL;
	if (!c || c->size - c->used < n) {
		size_t taken = 0;
		for (int i = 0; i < a->nchunks; i++)
			taken += a->chunk[i].size;
		size_t room = a->cap - taken;
		/* Without growth the one chunk is the cap: nothing more to take. */
		if (!a->growth || room < n) {
			snprintf(err, errlen, "gpu:%d: needs at least %zu bytes (%.2f GiB) but "
				 "memory_fraction allows %zu (%.2f GiB)", a->device, a->wanted,
				 gib(a->wanted), a->cap, gib(a->cap));
			return -ENOMEM;
		}
		/* Chunks grow with what is taken, so ARENA_MAX_CHUNKS of them
		 * reach any cap. */
		size_t size = taken > ARENA_CHUNK ? taken : ARENA_CHUNK;
		if (size < n)
			size = n;
		if (size > room)
			size = room;
		int r = chunk_add(a, size, err, errlen);
		if (r < 0)
			return r;
		c = &a->chunk[a->nchunks - 1];
	}
	*p = c->base + c->used;
	c->used += n;
	a->handed += n;
	return 0;
}

void arena_free(struct gpu_arena *a)
{
	for (int i = 0; i < a->nchunks; i++)
		cudaFree(a->chunk[i].base);
	memset(a, 0, sizeof(*a));
}
