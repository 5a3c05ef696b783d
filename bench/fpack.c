/* bench/fpack: how small and how fast net/fpack.c packs float32, and
 * net/xdelta.c writes it as XORs with a version before it (the values
 * after a step of about a thousandth of each, as training's), against
 * a plain memcpy (what a float32 chunk costs to encode), on one thread,
 * chunk by chunk (16384 values: what a frame carries, in cache). The
 * values are a safetensors file's (a checkpoint shard: weights and
 * optimizer state) when one is named, else weights-like ones: a bell
 * curve of scale 0.05 from a seeded generator with one exact zero in 200.
 * GB/s counts the float32 bytes.
 *
 *   make CUDA=0 BUILD=build/cpu build/cpu/bench/fpack
 *   build/cpu/bench/fpack [CKPT/shard-0-of-1.safetensors] */
#include "../net/fpack.h"
#include "../net/xdelta.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHUNK 16384

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every float of a safetensors file's data (all its tensors are F32 in a
 * pstrain checkpoint), or NULL. */
static float *load_safetensors(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	uint8_t h8[8];
	uint64_t hl = 0;
	float *v = NULL;
	if (fread(h8, 1, 8, f) == 8) {
		for (int i = 7; i >= 0; i--)
			hl = hl << 8 | h8[i];
		if (fseek(f, 0, SEEK_END) == 0) {
			long end = ftell(f);
			size_t bytes = end > 0 && (uint64_t)end > 8 + hl ? (size_t)end - 8 - hl : 0;
			*n = bytes / sizeof(float);
			v = *n ? malloc(*n * sizeof(float)) : NULL;
			if (v && (fseek(f, (long)(8 + hl), SEEK_SET) ||
				  fread(v, sizeof(float), *n, f) != *n)) {
				free(v);
				v = NULL;
			}
		}
	}
	fclose(f);
	return v;
}

static float *make_weights(size_t n)
{
	float *v = malloc(n * sizeof(float));
	uint64_t x = 88172645463325252ull;
	for (size_t i = 0; v && i < n; i++) {
		float s = 0;
		for (int k = 0; k < 4; k++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			s += (float)(x >> 40) * 0x1p-24f - 0.5f;
		}
		v[i] = i % 200 == 0 ? 0.0f : 0.05f * s;
	}
	return v;
}

/* The XORs of v after a step of about 1e-3 of each value (a seeded
 * one) with v: size, encode, check and apply (onto the base, copied back
 * each time: the copy is in the figure). */
static void xor_rows(const float *v, size_t nchunks)
{
	size_t n = nchunks * CHUNK, total = 0;
	float *next = malloc(n * sizeof(float)), *back = malloc(CHUNK * sizeof(float));
	uint8_t *bodies = malloc(nchunks * 4 * CHUNK);
	size_t *len = malloc(nchunks * sizeof(size_t));
	if (!next || !back || !bodies || !len)
		exit(1);
	uint64_t x = 2463534242ull;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		next[i] = v[i] * (1.0f + 1e-3f * ((float)(x >> 40) * 0x1p-23f - 1.0f));
	}
	for (size_t c = 0; c < nchunks; c++) {
		len[c] = xdelta_encode(bodies + c * 4 * CHUNK, 4 * CHUNK - 1, next + c * CHUNK, v + c * CHUNK, CHUNK);
		total += len[c] ? len[c] : 4 * CHUNK;
	}
	double best[3] = { 0 };
	uint8_t *buf = malloc(4 * CHUNK);
	int bad = !buf;
	for (int round = 0; round < 5 && !bad; round++)
		for (int op = 0; op < 3; op++) {
			double t0 = now();
			for (size_t c = 0; c < nchunks; c++) {
				const uint8_t *body = bodies + c * 4 * CHUNK;
				if (op == 0)
					(void)xdelta_encode(buf, 4 * CHUNK - 1, next + c * CHUNK, v + c * CHUNK, CHUNK);
				else if (op == 1 && len[c])
					bad |= xdelta_check(body, len[c], CHUNK);
				else if (op == 2 && len[c]) {
					memcpy(back, v + c * CHUNK, CHUNK * sizeof(float));
					bad |= xdelta_apply(back, body, CHUNK);
				}
				__asm__ volatile("" ::: "memory");
			}
			double gbs = (double)n * 4 / (now() - t0) / 1e9;
			best[op] = gbs > best[op] ? gbs : best[op];
		}
	if (bad) {
		fprintf(stderr, "bench/fpack: XORs refused their own encoding\n");
		exit(1);
	}
	printf("\n%-10s %8s %12s %12s %12s %12s\n", "XORs", "values", "xor/fp32", "encode GB/s", "check GB/s",
	       "apply GB/s");
	printf("%-10zu %8zu %12.4f %12.2f %12.2f %12.2f\n", nchunks, n, (double)total / (4.0 * (double)n), best[0],
	       best[1], best[2]);
	free(next);
	free(back);
	free(bodies);
	free(len);
	free(buf);
}

int main(int argc, char **argv)
{
	size_t n = 64 * CHUNK;
	float *v = argc > 1 ? load_safetensors(argv[1], &n) : make_weights(n);
	if (!v || n < CHUNK) {
		fprintf(stderr, "bench/fpack: cannot read float32 values from %s\n", argc > 1 ? argv[1] : "memory");
		return 1;
	}
	size_t nchunks = n / CHUNK, packed = 0, plain = 0;
	uint8_t *buf = malloc(4 * CHUNK), *lens = NULL;
	size_t *len = malloc(nchunks * sizeof(size_t));
	float *back = malloc(CHUNK * sizeof(float)), *copy = malloc(CHUNK * sizeof(float));
	uint8_t *bodies = malloc(nchunks * 4 * CHUNK);
	(void)lens;
	if (!buf || !len || !back || !copy || !bodies)
		return 1;
	for (size_t c = 0; c < nchunks; c++) {
		len[c] = fpack_encode(bodies + c * 4 * CHUNK, 4 * CHUNK - 1, v + c * CHUNK, CHUNK);
		packed += len[c] ? len[c] : 4 * CHUNK;
		plain += len[c] ? 0 : 1;
		if (len[c] && fpack_check(bodies + c * 4 * CHUNK, len[c], CHUNK)) {
			fprintf(stderr, "bench/fpack: chunk %zu: its own packing refused\n", c);
			return 1;
		}
	}
	/* Best of 5 passes over every chunk, each operation on its own. */
	double best[4] = { 0 };
	for (int round = 0; round < 5; round++)
		for (int op = 0; op < 4; op++) {
			double t0 = now();
			int bad = 0;
			for (size_t c = 0; c < nchunks; c++) {
				const float *src = v + c * CHUNK;
				const uint8_t *body = bodies + c * 4 * CHUNK;
				if (op == 0)
					(void)fpack_encode(buf, 4 * CHUNK - 1, src, CHUNK);
				else if (op == 1 && len[c])
					fpack_decode(back, body, CHUNK);
				else if (op == 2 && len[c])
					bad |= fpack_check(body, len[c], CHUNK);
				else if (op == 3)
					memcpy(copy, src, CHUNK * sizeof(float));
				__asm__ volatile("" ::: "memory");
			}
			double gbs = (double)nchunks * CHUNK * 4 / (now() - t0) / 1e9;
			best[op] = gbs > best[op] ? gbs : best[op];
			if (bad)
				return 1;
		}
	printf("%-10s %8s %12s %12s %12s %12s %12s\n", "chunks", "values", "packed/fp32", "encode GB/s",
	       "decode GB/s", "check GB/s", "memcpy GB/s");
	printf("%-10zu %8zu %12.4f %12.2f %12.2f %12.2f %12.2f\n", nchunks, nchunks * CHUNK,
	       (double)packed / (4.0 * (double)(nchunks * CHUNK)), best[0], best[1], best[2], best[3]);
	if (plain)
		printf("(%zu chunk%s would not shrink: sent as float32)\n", plain, plain == 1 ? "" : "s");
	xor_rows(v, nchunks);
	free(v);
	free(buf);
	free(len);
	free(back);
	free(copy);
	free(bodies);
	return 0;
}
