/* The training and test sets as the config says: the IDX or CSV loaders
 * (idx.h, csv.h), the train/test split of a single CSV, standardization,
 * and the per-epoch sample order. Failures are one line in the caller's
 * buffer naming the file; nothing here prints or exits. */
#ifndef PSTRAIN_DATA_H
#define PSTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "csv.h"
#include "dataset.h"

#define DATA_PATH_MAX 512

enum data_format {
	DATA_IDX,
	DATA_CSV,
	DATA_CRITEO,   /* criteo.h: train_csv and test_csv in Criteo's TSV layout */
};

struct data_config {
	enum data_format format;
	char train_images[DATA_PATH_MAX];
	char train_labels[DATA_PATH_MAX];
	char test_images[DATA_PATH_MAX];
	char test_labels[DATA_PATH_MAX];
	char train_csv[DATA_PATH_MAX];
	char test_csv[DATA_PATH_MAX];   /* "" = split test_fraction off train_csv */
	int label_column;               /* 0-based column index; -1 = last column */
	enum csv_header header;
	double test_fraction;           /* (0,1), used only when test_csv is "" */
	int max_resident_mb;            /* criteo: a training set larger is streamed
					 * (stream.h); a test set larger is refused */
};

/* Loads train and test sets as the config says. IDX pixels are scaled to
 * [0,1]; CSV features are standardized with the training set's per-column
 * mean and std (a constant column gets std 1), the test set with the same
 * statistics. seed picks the test rows when a single CSV is split
 * (round(test_fraction * N) rows, at least 1 in each part, file order kept).
 * Both sets get the same classes: 1 + the largest label in either.
 * Criteo files (criteo.h) are neither scaled nor standardized (their
 * integers are log(1 + v) already) and must each fit max_resident_mb;
 * a training file that does not is for data_load_train.
 * train and test are overwritten, not freed; on failure both are zeroed.
 * Returns 0, or a negative errno with a one-line message in err. */
int data_load(struct dataset *train, struct dataset *test,
	      const struct data_config *dc, uint64_t seed,
	      char *err, size_t errlen);

struct stream;

/* data_load for a trainer that takes per_step samples a step (workers x
 * batch). The same, except that a Criteo training file with more samples
 * than a window of max_resident_mb holds (stream_window_rows) is left open
 * in s, *streamed = 1 and train holding its window 0; the test set is
 * still held whole, so it needs test_csv. Otherwise *streamed = 0 and s
 * is zeroed. s needs stream_close either way. */
int data_load_train(struct dataset *train, struct dataset *test, struct stream *s, int *streamed,
		    const struct data_config *dc, size_t per_step, uint64_t seed, char *err, size_t errlen);

/* The test set alone, as data_load makes it, without reading a Criteo
 * training file (an evaluation needs no window of it). */
int data_load_test(struct dataset *test, const struct data_config *dc, uint64_t seed, char *err, size_t errlen);

/* Samples to predict from path, prepared exactly as the config's test set
 * would be: IDX images scaled to [0,1] (no labels file needed), or a CSV in
 * the training CSV's layout (its label column is read and ignored)
 * standardized with the training set's statistics, which means the
 * training data is loaded too. Returns 0 or a negative errno with err. */
int data_load_input(struct dataset *in, const struct data_config *dc, uint64_t seed, const char *path,
		    char *err, size_t errlen);

/* perm[i] = a permutation of 0..n-1 that depends only on (seed, epoch). */
void data_permute(uint32_t *perm, size_t n, uint64_t seed, uint64_t epoch);

#endif
