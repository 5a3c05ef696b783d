/* See gradfold.h. */
#include "gradfold.h"

void grad_fold_add(float *restrict acc, const float *restrict g, size_t n)
{
	for (size_t i = 0; i < n; i++)
		acc[i] += g[i];
}

void grad_fold_finish(float *acc, int S, size_t n)
{
	float d = (float)S;
	if (S == 1) /* x / 1 is x, bit for bit */
		return;
	for (size_t i = 0; i < n; i++)
		acc[i] /= d;
}

size_t grad_fold_rows(int k, const uint64_t *const *ids, const float *const *vals, const size_t *cnt, int dim,
		      int S, size_t *cur, uint64_t *uids, float *usum)
{
	size_t D = (size_t)dim, u = 0;
	for (int i = 0; i < k; i++)
		cur[i] = 0;
	for (;;) {
		uint64_t low = UINT64_MAX;
		for (int i = 0; i < k; i++)
			if (cur[i] < cnt[i] && ids[i][cur[i]] < low)
				low = ids[i][cur[i]];
		if (low == UINT64_MAX)
			return u;
		float *acc = usum + u * D;   // (D)
		int first = 1;
		for (int i = 0; i < k; i++) {
			if (cur[i] >= cnt[i] || ids[i][cur[i]] != low)
				continue;
			const float *g = vals[i] + cur[i]++ * D;   // (D)
			if (first)
				for (size_t d = 0; d < D; d++)
					acc[d] = g[d];
			else
				grad_fold_add(acc, g, D);
			first = 0;
		}
		grad_fold_finish(acc, S, D);
		uids[u++] = low;
	}
}
