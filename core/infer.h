/* Using a checkpoint's weights without training: test-set evaluation
 * (`pstrain eval`) and per-sample predictions (`pstrain predict`). The
 * model comes from the config and must match the checkpoint's (same
 * tensor names and shapes); the shard layout and optimizer may differ,
 * since only the parameters are read. */
#ifndef PSTRAIN_INFER_H
#define PSTRAIN_INFER_H

#include <stdio.h>

#include "config/config.h"

struct infer_result {
	char stepdir[DATA_PATH_MAX + 96];   /* the checkpoint used */
	long step;
	size_t samples;
	double loss, acc;                    /* eval only */
	int binary;                          /* loss = sigmoid_cross_entropy: loss is */
	double auc;                          /* the log loss, auc the ROC AUC */
};

/* ckpt: a step directory or a checkpoint_dir (its newest complete one).
 * Loss and accuracy over the config's test set. Returns 0, -EINVAL (bad
 * checkpoint, data or mismatch; err says which file and why), -ENOENT or
 * another negative errno. */
int infer_eval(const struct config *c, const char *ckpt, struct infer_result *res, char *err,
	       size_t errlen);

/* One line per sample of input to out: the predicted label, then with
 * probs the class probabilities, comma-separated ("3,0.01,0.02,..."); for
 * a binary model (loss = sigmoid_cross_entropy) the label is 1 where the
 * probability of 1 is above 0.5, and that probability follows ("1,0.73"). */
int infer_predict(const struct config *c, const char *ckpt, const char *input, int probs, FILE *out,
		  struct infer_result *res, char *err, size_t errlen);

#endif
