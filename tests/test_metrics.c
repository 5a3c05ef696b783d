/* Log loss and AUC against values worked by hand and against the
 * definition (every positive-negative pair counted). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "../core/metrics.h"

Test(metrics, logloss_matches_the_definition_and_clamps)
{
	float p[4] = { 0.9f, 0.2f, 0.5f, 0.0f };
	int32_t y[4] = { 1, 0, 1, 0 };
	double want = -(log((double)0.9f) + log(1 - (double)0.2f) + log(0.5) + log(1 - METRICS_EPS)) / 4;
	cr_expect(fabs(metrics_logloss(p, y, 4) - want) < 1e-12, "%g vs %g", metrics_logloss(p, y, 4), want);
	float miss = 0.0f;
	int32_t one = 1;
	cr_expect(fabs(metrics_logloss(&miss, &one, 1) - -log(METRICS_EPS)) < 1e-9, "a confident miss is finite");
	cr_expect_eq(metrics_logloss(p, y, 0), 0);
}

Test(metrics, auc_of_hand_worked_cases)
{
	struct metrics_pair s[4];
	float perfect[4] = { 0.1f, 0.2f, 0.8f, 0.9f };
	int32_t y[4] = { 0, 0, 1, 1 };
	cr_expect_eq(metrics_auc(perfect, y, 4, s), 1.0);
	float inverse[4] = { 0.9f, 0.8f, 0.2f, 0.1f };
	cr_expect_eq(metrics_auc(inverse, y, 4, s), 0.0);
	float ties[4] = { 0.5f, 0.5f, 0.5f, 0.5f };
	cr_expect_eq(metrics_auc(ties, y, 4, s), 0.5);
	/* of the four positive-negative pairs, three ordered and one tied */
	float mixed[4] = { 0.1f, 0.6f, 0.6f, 0.9f };
	cr_expect_eq(metrics_auc(mixed, y, 4, s), 3.5 / 4);
	int32_t onlypos[4] = { 1, 1, 1, 1 };
	cr_expect(isnan(metrics_auc(perfect, onlypos, 4, s)));
}

/* Against the O(n^2) definition on random scores with many ties. */
Test(metrics, auc_equals_the_pairwise_count)
{
	enum { N = 500 };
	float sc[N];
	int32_t y[N];
	struct metrics_pair s[N];
	srand(7);
	for (int i = 0; i < N; i++) {
		sc[i] = (float)(rand() % 40) / 8.0f;
		y[i] = rand() % 3 == 0;
	}
	double num = 0, den = 0;
	for (int i = 0; i < N; i++)
		for (int j = 0; j < N; j++)
			if (y[i] && !y[j]) {
				den += 1;
				num += sc[i] > sc[j] ? 1 : sc[i] == sc[j] ? 0.5 : 0;
			}
	double got = metrics_auc(sc, y, N, s);
	cr_expect(fabs(got - num / den) < 1e-12, "%.15f vs %.15f", got, num / den);
}
