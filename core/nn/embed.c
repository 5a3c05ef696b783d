/* The embedding layer's row function, initial values and CPU kernels; see
 * embed.h. Nothing here allocates. */
#include "embed.h"
#include "rng.h"

#include <string.h>

uint64_t embed_hash(uint32_t id, int field)
{
	uint64_t z = ((uint64_t)(uint32_t)field << 32 | id) + 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

uint64_t embed_row(const struct embed_spec *s, int field, uint32_t id)
{
	uint64_t base = s->shared ? 0 : (uint64_t)field * (uint64_t)s->rows;
	return base + embed_hash(id, field) % (uint64_t)s->rows;
}

void embed_init_rows(const struct embed_spec *s, float *out, uint64_t r0, uint64_t r1,
		     uint64_t seed)
{
	// out ((r1 - r0), DIM)
	size_t DIM = (size_t)s->dim;
	for (uint64_t r = r0; r < r1; r++)
		for (size_t d = 0; d < DIM; d++) {
			double u = rng_uniform(seed, RNG_EMBED, r * DIM + d);
			out[(size_t)(r - r0) * DIM + d] = (float)(EMBED_INIT * (2.0 * u - 1.0));
		}
}

void embed_gather_rows(float *U, const float *table, const uint64_t *rows, size_t u, int DIM)
{
	// U (u, DIM), table (R, DIM), rows (u)
	for (size_t k = 0; k < u; k++) {
		embed_prefetch(table, rows, 0, k, u, DIM, 0);
		memcpy(U + k * (size_t)DIM, table + rows[k] * (uint64_t)DIM, (size_t)DIM * sizeof(float));
	}
}

void embed_forward(float *out, const float *x, const float *U, const uint32_t *off,
		   const uint32_t *idx, int B, int F, int D, int DIM, enum embed_pool pool)
{
	// out (B, F*DIM + D), x (B, D), U (u, DIM), off (B*F + 1), idx (nnz)
	size_t ld = (size_t)F * DIM + (size_t)D;
	for (int b = 0; b < B; b++) {
		float *o = out + (size_t)b * ld;   // (F*DIM + D)
		for (int f = 0; f < F; f++) {
			size_t s = (size_t)b * F + (size_t)f;
			float *of = o + (size_t)f * DIM;   // (DIM)
			for (int d = 0; d < DIM; d++)
				of[d] = 0.0f;
			for (uint32_t k = off[s]; k < off[s + 1]; k++) {
				const float *row = U + (size_t)idx[k] * DIM;   // (DIM)
				for (int d = 0; d < DIM; d++)
					of[d] += row[d];
			}
			uint32_t n = off[s + 1] - off[s];
			if (pool == EMBED_MEAN && n > 1)
				for (int d = 0; d < DIM; d++)
					of[d] /= (float)n;
		}
		if (D)
			memcpy(o + (size_t)F * DIM, x + (size_t)b * D, (size_t)D * sizeof(float));
	}
}

void embed_backward(float *dU, const float *dout, const uint32_t *roff, const uint32_t *rseg,
		    const uint32_t *off, size_t u, int F, int D, int DIM, enum embed_pool pool)
{
	// dU (u, DIM), dout (B, F*DIM + D), roff (u + 1), rseg (nnz), off (B*F + 1)
	size_t ld = (size_t)F * DIM + (size_t)D;
	for (size_t k = 0; k < u; k++) {
		float *g = dU + k * (size_t)DIM;   // (DIM)
		for (int d = 0; d < DIM; d++)
			g[d] = 0.0f;
		for (uint32_t j = roff[k]; j < roff[k + 1]; j++) {
			uint32_t s = rseg[j];
			const float *go = dout + (size_t)(s / (uint32_t)F) * ld + (size_t)(s % (uint32_t)F) * DIM;
			uint32_t n = off[s + 1] - off[s];
			if (pool == EMBED_MEAN && n > 1)
				for (int d = 0; d < DIM; d++)
					g[d] += go[d] / (float)n;
			else
				for (int d = 0; d < DIM; d++)
					g[d] += go[d];
		}
	}
}
