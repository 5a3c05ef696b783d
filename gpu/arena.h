/* A GPU's memory arena: everything a replica and its optimizer use comes
 * from here, so the step loop never calls cudaMalloc.
 *
 * Without growth the whole cap is one cudaMalloc at open (TensorFlow's
 * per_process_gpu_memory_fraction); with growth, chunks of at least
 * ARENA_CHUNK are taken when needed, up to the cap, and kept until close
 * (allow_growth). Allocation is a bump pointer: buffers live as long as the
 * backend, which is how a training run uses them. */
#ifndef PSTRAIN_GPU_ARENA_H
#define PSTRAIN_GPU_ARENA_H

#include <stddef.h>

#define ARENA_MAX_CHUNKS 64
#define ARENA_CHUNK ((size_t)64 << 20)
#define ARENA_ALIGN 256   /* what cudaMalloc guarantees; enough for any vector load */

struct arena_chunk {
	char *base;
	size_t size, used;
};

struct gpu_arena {
	int device;
	size_t cap;        /* bytes this process may take on the device */
	size_t handed;     /* sum of (aligned) allocations handed out */
	size_t wanted;     /* handed + what was refused: the need to report */
	int growth;
	int nchunks;
	struct arena_chunk chunk[ARENA_MAX_CHUNKS];
};

/* On the current device. Returns 0, or a negative errno with the reason
 * (the cudaMalloc that failed and its size) in err. */
int arena_init(struct gpu_arena *a, int device, size_t cap, int growth, char *err, size_t errlen);

/* Returns 0, or -ENOMEM with "needs N bytes, cap M" in err; a refused
 * request still counts in a->wanted so a caller that allocates several
 * buffers can report the whole need once. */
int arena_alloc(struct gpu_arena *a, void **p, size_t bytes, char *err, size_t errlen);

void arena_free(struct gpu_arena *a);   /* accepts a zeroed struct */

#endif
