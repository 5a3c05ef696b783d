/* Datasets: loading IDX (raw or .gz) and CSV files into memory, the
 * train/test split of a single CSV, and the per-epoch sample order.
 *
 * A dataset is N samples of D float features and one int32 label each.
 * Loaders validate everything they read and report failures as one line in
 * the caller's buffer naming the file; they never print or exit. */
#ifndef PSTRAIN_DATA_H
#define PSTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#define DATA_PATH_MAX 512
/* Labels are 0..DATA_MAX_CLASSES-1; a CSV label outside is an error. */
#define DATA_MAX_CLASSES 65536

enum data_format {
	DATA_IDX,
	DATA_CSV,
};

enum csv_header {
	CSV_HEADER_AUTO,   /* a first row with any non-numeric field is a header */
	CSV_HEADER_YES,
	CSV_HEADER_NO,
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
};

struct dataset {
	float *x;         /* (N, D) features, row-major */
	int32_t *y;       /* (N) labels, 0 <= y < classes */
	size_t n;         /* N */
	size_t d;         /* D */
	int classes;      /* 1 + largest label seen */
};

/* Loads train and test sets as the config says. IDX pixels are scaled to
 * [0,1]; CSV features are standardized with the training set's per-column
 * mean and std (a constant column gets std 1), the test set with the same
 * statistics. seed picks the test rows when a single CSV is split
 * (round(test_fraction * N) rows, at least 1 in each part, file order kept).
 * Both sets get the same classes: 1 + the largest label in either.
 * train and test are overwritten, not freed; on failure both are zeroed.
 * Returns 0, or a negative errno with a one-line message in err. */
int data_load(struct dataset *train, struct dataset *test,
	      const struct data_config *dc, uint64_t seed,
	      char *err, size_t errlen);

/* IDX pair: images (magic 0x00000803, u8, N x rows x cols) and labels
 * (magic 0x00000801, u8, N). Either may be gzip-compressed (detected from
 * the content, not the name). Counts must match; D = rows * cols; no bytes
 * may follow the data. *ds is overwritten; on failure it is zeroed. */
int idx_load(struct dataset *ds, const char *images, const char *labels,
	     char *err, size_t errlen);

/* An IDX images file alone (for predict): labels are all 0, classes 0. */
int idx_load_images(struct dataset *ds, const char *images, char *err, size_t errlen);

/* One CSV file (optionally gzip-compressed), numbers only, all rows the
 * same number of fields, comma-separated without quoting. label_column is
 * 0-based or -1 for the last; labels are integers 0..DATA_MAX_CLASSES-1.
 * Features are returned as read. Messages count lines and columns from 1.
 * *ds is overwritten; on failure it is zeroed. */
int csv_load(struct dataset *ds, const char *path, int label_column,
	     enum csv_header header, char *err, size_t errlen);

/* Samples to predict from path, prepared exactly as the config's test set
 * would be: IDX images scaled to [0,1] (no labels file needed), or a CSV in
 * the training CSV's layout (its label column is read and ignored)
 * standardized with the training set's statistics, which means the
 * training data is loaded too. Returns 0 or a negative errno with err. */
int data_load_input(struct dataset *in, const struct data_config *dc, uint64_t seed, const char *path,
		    char *err, size_t errlen);

void dataset_free(struct dataset *ds);   /* accepts NULL and zeroed structs */

/* perm[i] = a permutation of 0..n-1 that depends only on (seed, epoch). */
void data_permute(uint32_t *perm, size_t n, uint64_t seed, uint64_t epoch);

/* Copies samples idx[0..B) into x (B, D) and y (B). */
void dataset_gather(const struct dataset *ds, const uint32_t *idx, size_t B,
		    float *x, int32_t *y);

#endif
