/* Evaluation metrics of a binary classifier (click-through models): the
 * mean log loss of predicted probabilities and the area under the ROC
 * curve of scores. The trainer's evaluation, `pstrain synth`'s planted
 * ceiling and the benchmarks all use these two, so their figures compare. */
#ifndef PSTRAIN_METRICS_H
#define PSTRAIN_METRICS_H

#include <stddef.h>
#include <stdint.h>

/* Probabilities are clamped to [METRICS_EPS, 1 - METRICS_EPS] before the
 * log, as scikit-learn's log_loss does, so one confident miss costs a
 * finite 34.5 rather than infinity. */
#define METRICS_EPS 1e-15

/* One sample for metrics_auc's sort; the caller owns n of them. */
struct metrics_pair {
	float score;
	int32_t label;
};

/* -mean(y log p + (1 - y) log(1 - p)) over n samples with labels 0 or 1;
 * 0 when n is 0. */
double metrics_logloss(const float *p, const int32_t *y, size_t n);

/* The probability that a random positive scores above a random negative
 * (ties count one half): the Mann-Whitney U statistic over both classes'
 * sizes, from one sort. Any monotone score works (logits or
 * probabilities). scratch holds n pairs. NaN when either class is empty,
 * since AUC is not defined then. */
double metrics_auc(const float *score, const int32_t *y, size_t n, struct metrics_pair *scratch);

#endif
