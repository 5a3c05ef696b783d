/* bench/rows_step: a click-through step's row work on one ps, alone: the
 * sparse optimizer over the unique rows of a push (Adagrad and lazy Adam)
 * and the gather of a pull's rows, over tables far larger than the caches,
 * in microseconds a step. build/bench/rows_step is built as pstrain is;
 * build/bench/rows_step_plain the same sources without the prefetch
 * (EMBED_AHEAD=0, core/nn/embed.h), build/bench/rows_step_4k without
 * huge pages (BIGMEM_HUGE=0, base/bigmem.h). Run them in turns for a before and
 * after on one machine (docs/BENCHMARKS.md, "rows_step"):
 *
 *   for i in 1 2 3; do build/bench/rows_step; build/bench/rows_step_plain; done
 *
 * Options: --rows R (5,200,000: one of 2 ps of bench/ctr.ini's tables),
 * --dim D (16), --touch U (3,300: about a step's rows on one ps there, 2
 * workers' batches of 256 x 26 IDs, roughly half of them distinct, over 2
 * ps; an estimate, not a count), --steps N (300). */
#include "../base/bigmem.h"
#include "../core/nn/embed.h"
#include "../core/nn/sparse_optim.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* What the kernel gave: the process's AnonHugePages. */
static double huge_mib(void)
{
	FILE *f = fopen("/proc/self/smaps_rollup", "r");
	char line[256];
	double kb = 0;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "AnonHugePages: %lf kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb / 1024;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* u distinct rows of R, ascending (as a plan gives them), from a fixed
 * xorshift so every binary draws the same. */
static size_t draw(uint64_t *rows, size_t u, uint64_t R, uint64_t *state)
{
	for (size_t k = 0; k < u; k++) {
		*state ^= *state << 13;
		*state ^= *state >> 7;
		*state ^= *state << 17;
		rows[k] = *state % R;
	}
	qsort(rows, u, sizeof(*rows), cmp_u64);
	size_t n = 0;
	for (size_t k = 0; k < u; k++)
		if (!n || rows[k] != rows[n - 1])
			rows[n++] = rows[k];
	return n;
}

int main(int argc, char **argv)
{
	uint64_t R = 5200000;
	int dim = 16, steps = 300;
	size_t touch = 3300;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--rows"))
			R = strtoull(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--dim"))
			dim = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--touch"))
			touch = strtoull(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--steps"))
			steps = atoi(argv[i + 1]);
	}
	if (R < 1 || dim < 1 || dim > EMBED_MAX_DIM || touch < 1 || touch > R || steps < 1) {
		fprintf(stderr, "rows_step: --rows R >= 1, --dim 1..%d, --touch 1..R, --steps >= 1\n", EMBED_MAX_DIM);
		return 2;
	}
	size_t n = (size_t)R * (size_t)dim;
	float *table = bigmem_alloc(n * sizeof(float)), *g = malloc(touch * (size_t)dim * sizeof(float));
	float *U = malloc(touch * (size_t)dim * sizeof(float));
	uint64_t *rows = malloc(touch * sizeof(uint64_t));
	struct sparse_optim opt[2];
	struct sparse_config cfg[2] = { { .kind = SPARSE_ADAGRAD, .lr = 0.1f },
					{ .kind = SPARSE_LAZY_ADAM, .lr = 0.001f, .beta1 = 0.9f, .beta2 = 0.999f,
					  .eps = 1e-7f } };
	if (!table || !g || !U || !rows || sparse_optim_init(&opt[0], &cfg[0], R, dim) ||
	    sparse_optim_init(&opt[1], &cfg[1], R, dim)) {
		fprintf(stderr, "rows_step: out of memory for %llu rows of %d\n", (unsigned long long)R, dim);
		return 1;
	}
	/* Every page written once, so no step meets a first touch. */
	for (size_t i = 0; i < n; i++) {
		table[i] = 0.01f;
		opt[0].m[i] = opt[1].m[i] = opt[1].v[i] = 0.0f;
	}
	for (size_t i = 0; i < touch * (size_t)dim; i++)
		g[i] = 1e-3f * (float)(i % 7);
	static const char *const what[3] = { "adagrad step", "lazy_adam step", "gather" };
	double t[3] = { 0 };
	uint64_t state = 88172645463325252ull;
	for (int s = 0; s < steps; s++)
		for (int k = 0; k < 3; k++) {
			size_t u = draw(rows, touch, R, &state);
			double t0 = now_s();
			if (k < 2)
				sparse_optim_step(&opt[k], table, rows, g, u, cfg[k].lr);
			else
				embed_gather_rows(U, table, rows, u, dim);
			t[k] += now_s() - t0;
		}
	printf("rows_step (prefetch %d ahead, %s pages): %llu rows of %d, %zu touched a step, %d steps:", EMBED_AHEAD,
	       BIGMEM_HUGE ? "2 MiB" : "4 KiB", (unsigned long long)R, dim, touch, steps);
	for (int k = 0; k < 3; k++)
		printf("%s %s %.0f us", k ? "," : "", what[k], 1e6 * t[k] / steps);
	printf(" (%.0f MiB in huge pages)\n", huge_mib());
	sparse_optim_free(&opt[0]);
	sparse_optim_free(&opt[1]);
	bigmem_free(table, n * sizeof(float));
	free(g), free(U), free(rows);
	return 0;
}
