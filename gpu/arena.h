/* A GPU's memory arena: everything a replica and its optimizer use comes
 * from here, so the step loop never calls cudaMalloc.
 *
 * Without growth the whole cap is one cudaMalloc at open (TensorFlow's
 * per_process_gpu_memory_fraction); with growth, chunks of at least
 * ARENA_CHUNK are taken when needed, up to the cap, and kept until close
 * (allow_growth). Allocation is a bump pointer: buffers live as long as the
 * backend, which is how a training run uses them.
 *
 * For memory checking, PSTRAIN_GPU_EXACT_ALLOC=1 in the environment when
 * the arena opens makes every arena_alloc its own allocation of exactly the
 * bytes asked for, freed one by one by arena_free. Inside one big chunk a
 * kernel that runs past the end of its buffer writes into the next buffer,
 * which compute-sanitizer's memcheck cannot tell from a legal access; with
 * a cudaMalloc per buffer it reports the overrun. The cap, ->handed,
 * ->wanted and the refusal text are the same as without it (without growth
 * a request is refused at the same point), but nothing is reserved at
 * open, and growth is moot.
 *
 * The decisions are plain C in arena.c, compiled into every build and
 * tested with host memory behind struct arena_mem; arena.cu supplies
 * cudaMalloc and cudaFree and opens the arena for the backend. */
#ifndef PSTRAIN_GPU_ARENA_H
#define PSTRAIN_GPU_ARENA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ARENA_MAX_CHUNKS 64
#define ARENA_CHUNK ((size_t)64 << 20)
#define ARENA_ALIGN 256   /* what cudaMalloc guarantees; enough for any vector load */
#define ARENA_EXACT_ENV "PSTRAIN_GPU_EXACT_ALLOC"

struct arena_chunk {
	char *base;
	size_t size, used;
};

/* Where an arena's memory comes from: cudaMalloc and cudaFree on the
 * arena's device (arena.cu), or host memory in the tests. get returns 0,
 * or a negative errno with the reason in err. */
struct arena_mem {
	int (*get)(void *ctx, int device, void **p, size_t bytes, char *err, size_t errlen);
	void (*put)(void *ctx, int device, void *p);
	void *ctx;
};

struct gpu_arena {
	const struct arena_mem *mem;
	int device;
	size_t cap;        /* bytes this process may take on the device */
	size_t handed;     /* sum of (aligned) allocations handed out */
	size_t wanted;     /* handed + what was refused: the need to report */
	int growth;
	int exact;         /* one allocation per buffer (ARENA_EXACT_ENV) */
	int nchunks;
	struct arena_chunk chunk[ARENA_MAX_CHUNKS];
	void **buf;        /* exact: the nbuf buffers handed out, room for bufroom */
	size_t nbuf, bufroom;
};

/* On `device`, with cudaMalloc; reads ARENA_EXACT_ENV (arena.cu). Returns
 * 0, or a negative errno with the reason (the cudaMalloc that failed and
 * its size, or the variable's bad value) in err. `device` is one
 * gpu_query() accepted (gpu_backend_open checks it before opening the
 * arena): cudaSetDevice is never handed an unchecked ordinal. */
int arena_init(struct gpu_arena *a, int device, size_t cap, int growth, char *err, size_t errlen);

/* arena_init with the memory and the mode given: what arena_init and the
 * tests call. Without growth or exact, takes the whole cap from mem now. */
int arena_open(struct gpu_arena *a, const struct arena_mem *mem, int device, size_t cap,
	       int growth, int exact, char *err, size_t errlen);

/* Returns 0, or -ENOMEM with "needs N bytes, cap M" in err; a refused
 * request still counts in a->wanted so a caller that allocates several
 * buffers can report the whole need once. */
int arena_alloc(struct gpu_arena *a, void **p, size_t bytes, char *err, size_t errlen);

void arena_free(struct gpu_arena *a);   /* accepts a zeroed struct */

/* The largest buffer arena_alloc can hand out now: the last chunk's tail,
 * or with growth a new chunk of what the cap leaves, whichever is more. */
size_t arena_room(const struct gpu_arena *a);

/* ARENA_EXACT_ENV's value (NULL when unset): unset, "" and "0" are off,
 * "1" is on; anything else is -EINVAL with the value quoted in err. */
int arena_exact_parse(const char *value, int *exact, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
