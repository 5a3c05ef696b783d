/* Log loss and ROC AUC; see metrics.h. */
#include "metrics.h"

#include <math.h>
#include <stdlib.h>

double metrics_logloss(const float *p, const int32_t *y, size_t n)
{
	double sum = 0;
	for (size_t i = 0; i < n; i++) {
		double q = p[i];
		q = q < METRICS_EPS ? METRICS_EPS : q > 1 - METRICS_EPS ? 1 - METRICS_EPS : q;
		sum -= y[i] ? log(q) : log1p(-q);
	}
	return n ? sum / (double)n : 0;
}

static int pair_cmp(const void *a, const void *b)
{
	float x = ((const struct metrics_pair *)a)->score, z = ((const struct metrics_pair *)b)->score;
	return (x > z) - (x < z);
}

double metrics_auc(const float *score, const int32_t *y, size_t n, struct metrics_pair *scratch)
{
	size_t pos = 0;
	for (size_t i = 0; i < n; i++) {
		scratch[i].score = score[i];
		scratch[i].label = y[i] != 0;
		pos += y[i] != 0;
	}
	size_t neg = n - pos;
	if (!pos || !neg)
		return NAN;
	qsort(scratch, n, sizeof(*scratch), pair_cmp);
	/* Sum of the positives' ranks (1-based), a run of equal scores
	 * sharing its mean rank. */
	double ranks = 0;
	for (size_t i = 0; i < n;) {
		size_t j = i, p = 0;
		while (j < n && scratch[j].score == scratch[i].score)
			p += (size_t)scratch[j++].label;
		ranks += (double)p * ((double)(i + 1) + (double)j) / 2;
		i = j;
	}
	return (ranks - (double)pos * (double)(pos + 1) / 2) / ((double)pos * (double)neg);
}
