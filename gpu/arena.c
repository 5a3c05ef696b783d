/* The GPU memory arena's bookkeeping; see arena.h. No CUDA here: the
 * memory comes through struct arena_mem, so this file is in every build
 * and the tests run it on host memory. */
#include "arena.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t align_up(size_t n)
{
	return (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
}

static double gib(size_t n)
{
	return (double)n / (double)(1u << 30);
}

/* Adds what the user can do about memory that could not be had to the
 * reason the memory's get gave. */
static void hint(const struct gpu_arena *a, char *err, size_t errlen)
{
	size_t at = strnlen(err, errlen);
	if (at + 1 >= errlen)
		return;
	if (a->exact)
		snprintf(err + at, errlen - at, " (%s=1: one allocation per buffer)", ARENA_EXACT_ENV);
	else
		snprintf(err + at, errlen - at,
			 "; lower [gpu] memory_fraction or set allow_growth = true");
}

static int chunk_add(struct gpu_arena *a, size_t size, char *err, size_t errlen)
{
	if (a->nchunks == ARENA_MAX_CHUNKS) {
		snprintf(err, errlen, "gpu:%d: memory arena has %d chunks already", a->device,
			 ARENA_MAX_CHUNKS);
		return -ENOMEM;
	}
	void *p = NULL;
	int r = a->mem->get(a->mem->ctx, a->device, &p, size, err, errlen);
	if (r == -ENOMEM)
		hint(a, err, errlen);
	if (r < 0)
		return r;
	a->chunk[a->nchunks++] = (struct arena_chunk){ (char *)p, size, 0 };
	return 0;
}

static int refuse(const struct gpu_arena *a, char *err, size_t errlen)
{
	snprintf(err, errlen, "gpu:%d: needs at least %zu bytes (%.2f GiB) but "
		 "memory_fraction allows %zu (%.2f GiB)", a->device, a->wanted, gib(a->wanted),
		 a->cap, gib(a->cap));
	return -ENOMEM;
}

int arena_open(struct gpu_arena *a, const struct arena_mem *mem, int device, size_t cap,
	       int growth, int exact, char *err, size_t errlen)
{
	memset(a, 0, sizeof(*a));
	a->mem = mem;
	a->device = device;
	a->cap = cap & ~(size_t)(ARENA_ALIGN - 1);
	a->growth = growth;
	a->exact = exact;
	return growth || exact ? 0 : chunk_add(a, a->cap, err, errlen);
}

/* Exact mode: its own allocation of exactly `bytes` (1 for 0, so every
 * buffer has an address of its own), counted as the arena would count
 * it: n, the aligned size, against the cap. */
static int exact_alloc(struct gpu_arena *a, void **p, size_t bytes, size_t n, char *err,
		       size_t errlen)
{
	if (n > a->cap - a->handed)
		return refuse(a, err, errlen);
	if (a->nbuf == a->bufroom) {
		size_t room = a->bufroom ? 2 * a->bufroom : 64;
		void **buf = realloc(a->buf, room * sizeof(*buf));
		if (!buf) {
			snprintf(err, errlen, "gpu:%d: out of host memory for the arena's list of buffers",
				 a->device);
			return -ENOMEM;
		}
		a->buf = buf;
		a->bufroom = room;
	}
	void *q = NULL;
	int r = a->mem->get(a->mem->ctx, a->device, &q, bytes ? bytes : 1, err, errlen);
	if (r == -ENOMEM)
		hint(a, err, errlen);
	if (r < 0)
		return r;
	a->buf[a->nbuf++] = q;
	a->handed += n;
	*p = q;
	return 0;
}

int arena_alloc(struct gpu_arena *a, void **p, size_t bytes, char *err, size_t errlen)
{
	size_t n = align_up(bytes ? bytes : 1);
	*p = NULL;
	a->wanted += n;
	if (a->exact)
		return exact_alloc(a, p, bytes, n, err, errlen);
	struct arena_chunk *c = a->nchunks ? &a->chunk[a->nchunks - 1] : NULL;
	if (!c || c->size - c->used < n) {
		size_t taken = 0;
		for (int i = 0; i < a->nchunks; i++)
			taken += a->chunk[i].size;
		size_t room = a->cap - taken;
		/* Without growth the one chunk is the cap: nothing more to take. */
		if (!a->growth || room < n)
			return refuse(a, err, errlen);
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

size_t arena_room(const struct gpu_arena *a)
{
	if (a->exact)
		return a->cap - a->handed;
	size_t taken = 0, tail = 0;
	for (int i = 0; i < a->nchunks; i++)
		taken += a->chunk[i].size;
	if (a->nchunks)
		tail = a->chunk[a->nchunks - 1].size - a->chunk[a->nchunks - 1].used;
	size_t fresh = a->growth && a->nchunks < ARENA_MAX_CHUNKS ? a->cap - taken : 0;
	return tail > fresh ? tail : fresh;
}

void arena_free(struct gpu_arena *a)
{
	for (int i = 0; i < a->nchunks; i++)
		a->mem->put(a->mem->ctx, a->device, a->chunk[i].base);
	for (size_t i = 0; i < a->nbuf; i++)
		a->mem->put(a->mem->ctx, a->device, a->buf[i]);
	free(a->buf);
	memset(a, 0, sizeof(*a));
}

int arena_exact_parse(const char *value, int *exact, char *err, size_t errlen)
{
	*exact = 0;
	if (!value || !*value || strcmp(value, "0") == 0)
		return 0;
	if (strcmp(value, "1") == 0) {
		*exact = 1;
		return 0;
	}
	snprintf(err, errlen, "%s=\"%.64s\": want 1 (one cudaMalloc per buffer, for memcheck) or 0",
		 ARENA_EXACT_ENV, value);
	return -EINVAL;
}
