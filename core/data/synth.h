/* `pstrain synth`: a seeded synthetic click-through data set in Criteo's
 * layout (criteo.h), drawn from a planted model, so that a CTR trainer
 * has data with a known answer where no real click log can be installed.
 *
 * The planted model: each of the 26 fields has its own vocabulary size
 * and Zipf exponent (real feature frequencies are power laws: a few
 * values are everywhere, most are rare), a missing rate, and a normal
 * weight per value; four field pairs add a low-rank interaction (the dot
 * product of two planted rank-4 vectors); the 13 integer columns are
 * log-normal counts whose log(1 + v), the feature the loader makes, has a
 * weight. A row's label is 1 with probability sigmoid(bias + the sum), the
 * bias set for a click rate near 25% (Criteo's is 26%). The planted
 * model's own logloss and AUC on the test file are the ceiling a trainer
 * can approach; docs/CTR.md has the numbers. Same options, same bytes. */
#ifndef PSTRAIN_SYNTH_H
#define PSTRAIN_SYNTH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SYNTH_PATH_MAX 512

struct synth_opts {
	char out[SYNTH_PATH_MAX];  /* directory for train.txt and test.txt; made if missing */
	uint64_t train_rows, test_rows;
	uint64_t seed;
	uint64_t vocab;            /* the largest field's vocabulary */
	int gzip;                  /* write train.txt.gz and test.txt.gz */
};

struct synth_result {
	char train_path[SYNTH_PATH_MAX + 16], test_path[SYNTH_PATH_MAX + 16];
	double train_rate, test_rate;   /* share of rows with label 1 */
	double logloss, auc;            /* the planted model's, on the test rows */
	double base_logloss;            /* predicting train_rate for every test row */
	double seconds;
};

/* The defaults: ./ctr-synth, 1,000,000 train and 100,000 test rows, seed
 * 1, vocabulary 1,000,000. */
void synth_defaults(struct synth_opts *o);

/* One command-line option at argv[0] (argc >= 1 left): "--NAME VALUE" or
 * "--NAME=VALUE", or --gzip. Returns how many arguments it used, 0 when
 * argv[0] is not synth's, or -EINVAL with one line in err for a bad or
 * missing value. */
int synth_arg(struct synth_opts *o, char *const *argv, int argc, char *err, size_t errlen);

/* Writes the two files (each to a temporary name, then renamed) and fills
 * res. Returns 0, -EINVAL for a directory that cannot be made or used, or
 * another negative errno, with one line in err. */
int synth_write(const struct synth_opts *o, struct synth_result *res, char *err, size_t errlen);

/* The two lines `pstrain synth` prints: the files, and the ceiling. */
void synth_report(const struct synth_opts *o, const struct synth_result *res, FILE *f);

#endif
