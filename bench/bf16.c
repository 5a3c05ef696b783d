/* bench/bf16: how fast net/bf16.c narrows float32 to bf16 and widens it
 * back, against a plain memcpy of the float32 bytes (what an fp32 chunk
 * costs to encode), on one thread, over a 1 MiB chunk's worth (262144
 * floats, in cache: the per-frame case) and over a tensor of 64 MiB of
 * floats (out of cache). GB/s counts the float32 bytes on the float side.
 *
 *   make CUDA=0 BUILD=build/cpu build/cpu/bench/bf16 && build/cpu/bench/bf16 */
#include "../net/bf16.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum op { NARROW, WIDEN, COPY };

/* Best of 5 rounds of `reps` calls over n floats: GB/s of float32 bytes. */
static double rate(enum op op, float *f, uint8_t *h, uint8_t *c, size_t n, int reps)
{
	double best = 0;
	for (int round = 0; round < 5; round++) {
		double t0 = now();
		for (int r = 0; r < reps; r++) {
			if (op == NARROW)
				bf16_from_f32(h, f, n);
			else if (op == WIDEN)
				bf16_to_f32(f, h, n);
			else
				memcpy(c, f, n * sizeof(float));
			__asm__ volatile("" ::: "memory");
		}
		double gbs = (double)reps * (double)n * 4 / (now() - t0) / 1e9;
		best = gbs > best ? gbs : best;
	}
	return best;
}

int main(void)
{
	const size_t sizes[] = { 262144, 16u << 20 };
	printf("%-12s %12s %12s %12s %14s\n", "floats", "narrow GB/s", "widen GB/s", "memcpy GB/s",
	       "(float32 bytes)");
	for (int s = 0; s < 2; s++) {
		size_t n = sizes[s];
		float *f = malloc(n * sizeof(float));
		uint8_t *h = malloc(2 * n + 4), *c = malloc(n * sizeof(float));
		if (!f || !h || !c)
			return 1;
		uint64_t x = 88172645463325252ull;
		for (size_t i = 0; i < n; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			f[i] = (float)((int64_t)(x >> 11) - (1ll << 52)) * 0x1p-60f;
		}
		memset(c, 0, n * sizeof(float));
		int reps = s == 0 ? 2000 : 20;
		/* h + 4: a chunk's payload is 36 bytes into its frame buffer. */
		double nar = rate(NARROW, f, h + 4, c, n, reps);
		double wid = rate(WIDEN, f, h + 4, c, n, reps);
		double cpy = rate(COPY, f, h, c, n, reps);
		printf("%-12zu %12.1f %12.1f %12.1f\n", n, nar, wid, cpy);
		free(f);
		free(h);
		free(c);
	}
	return 0;
}
