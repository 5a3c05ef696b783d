/* Datasets as the trainer sees them: data_load picks the loader the config
 * names (idx.c, csv.c), splits a single CSV into train and test, standardizes
 * CSV features with the training statistics and makes the class counts of
 * the two sets agree. Also the per-epoch sample order. Parsing itself lives
 * in the loaders. */
#include "data.h"
#include "criteo.h"
#include "csv.h"
#include "idx.h"
#include "stream.h"
#include "../nn/rng.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void data_permute(uint32_t *perm, size_t n, uint64_t seed, uint64_t epoch)
{
	struct rng r;
	size_t i;

	for (i = 0; i < n; i++)
		perm[i] = (uint32_t)i;
	rng_seed(&r, seed, RNG_SHUFFLE, epoch);
	/* Fisher-Yates from the top: each of the n! orders equally likely. */
	for (i = n; i > 1; i--) {
		size_t j = (size_t)rng_below(&r, i);
		uint32_t t = perm[i - 1];

		perm[i - 1] = perm[j];
		perm[j] = t;
	}
}

/* Moves a seeded random ntest of all's rows into test and the rest into
 * train, each keeping the file's order. Frees all only on success. */
static int data_split(struct dataset *train, struct dataset *test,
		      struct dataset *all, size_t ntest, uint64_t seed)
{
	struct dataset tr = { 0 }, te = { 0 };
	unsigned char *is_test = NULL;
	uint32_t *perm = NULL;
	size_t i, j, k, ntrain = all->n - ntest;
	struct rng r;

	is_test = calloc(all->n, 1);
	perm = malloc(all->n * sizeof(*perm));
	tr.x = malloc(ntrain * all->d * sizeof(*tr.x));
	tr.y = malloc(ntrain * sizeof(*tr.y));
	te.x = malloc(ntest * all->d * sizeof(*te.x));
	te.y = malloc(ntest * sizeof(*te.y));
	tr.ids = all->f ? malloc(ntrain * all->f * sizeof(*tr.ids)) : NULL;
	te.ids = all->f ? malloc(ntest * all->f * sizeof(*te.ids)) : NULL;
	if (!is_test || !perm || !tr.x || !tr.y || !te.x || !te.y || (all->f && (!tr.ids || !te.ids))) {
		free(is_test);
		free(perm);
		dataset_free(&tr);
		dataset_free(&te);
		return -ENOMEM;
	}

	/* A partial Fisher-Yates draws ntest distinct rows, uniformly. */
	for (i = 0; i < all->n; i++)
		perm[i] = (uint32_t)i;
	rng_seed(&r, seed, RNG_SPLIT, 0);
	for (i = 0; i < ntest; i++) {
		size_t s = i + (size_t)rng_below(&r, all->n - i);
		uint32_t t = perm[i];

		perm[i] = perm[s];
		perm[s] = t;
		is_test[perm[i]] = 1;
	}

	tr.n = ntrain;
	te.n = ntest;
	tr.d = te.d = all->d;
	tr.f = te.f = all->f;
	tr.classes = te.classes = all->classes;
	for (i = j = k = 0; i < all->n; i++) {
		struct dataset *to = is_test[i] ? &te : &tr;
		size_t at = is_test[i] ? k++ : j++;

		memcpy(to->x + at * all->d, all->x + i * all->d,
		       all->d * sizeof(*all->x));
		to->y[at] = all->y[i];
		if (all->f)
			memcpy(to->ids + at * all->f, all->ids + i * all->f, all->f * sizeof(*all->ids));
	}
	free(is_test);
	free(perm);
	dataset_free(all);
	*train = tr;
	*test = te;
	return 0;
}

/* Standardizes every column of train with its own mean and (population)
 * std and applies the same to test, which must not leak into the
 * statistics. A constant column gets std 1 so it becomes all zeros. */
static int data_standardize(struct dataset *train, struct dataset *test)
{
	size_t D = train->d, i, c;
	double *mean, *sd;

	mean = calloc(D, sizeof(*mean));
	sd = calloc(D, sizeof(*sd));
	if (!mean || !sd) {
		free(mean);
		free(sd);
		return -ENOMEM;
	}
	/* Two passes in double: one-pass sums of squares cancel badly
	 * for columns with a large mean and a small spread. */
	for (i = 0; i < train->n; i++)
		for (c = 0; c < D; c++)
			mean[c] += train->x[i * D + c];
	for (c = 0; c < D; c++)
		mean[c] /= (double)train->n;
	for (i = 0; i < train->n; i++)
		for (c = 0; c < D; c++) {
			double t = train->x[i * D + c] - mean[c];

			sd[c] += t * t;
		}
	for (c = 0; c < D; c++) {
		sd[c] = sqrt(sd[c] / (double)train->n);
		if (!(sd[c] > 0))
			sd[c] = 1;
	}
	for (i = 0; i < train->n; i++)
		for (c = 0; c < D; c++)
			train->x[i * D + c] =
				(float)((train->x[i * D + c] - mean[c]) / sd[c]);
	for (i = 0; i < test->n; i++)
		for (c = 0; c < D; c++)
			test->x[i * D + c] =
				(float)((test->x[i * D + c] - mean[c]) / sd[c]);
	free(mean);
	free(sd);
	return 0;
}

/* Splits round(test_fraction * N) rows of all off as the test set, or
 * says which part that would leave empty; frees all either way. */
static int data_split_fraction(struct dataset *train, struct dataset *test, struct dataset *all,
			       const struct data_config *dc, uint64_t seed, char *err, size_t errlen)
{
	double ntest = floor(dc->test_fraction * (double)all->n + 0.5);
	int ret = -EINVAL;

	if (ntest < 1 || ntest > (double)all->n - 1)
		snprintf(err, errlen, "%s: test_fraction %g of %zu rows leaves %s empty",
			 dc->train_csv, dc->test_fraction, all->n,
			 ntest < 1 ? "the test set" : "the training set");
	else if ((ret = data_split(train, test, all, (size_t)ntest, seed)) < 0)
		snprintf(err, errlen, "%s: out of memory splitting %zu rows",
			 dc->train_csv, all->n);
	dataset_free(all);
	return ret;
}

static int data_need(const char *path, const char *key, char *err,
		     size_t errlen)
{
	if (path[0])
		return 0;
	snprintf(err, errlen, "[data] %s is not set", key);
	return -EINVAL;
}

static int data_load_idx(struct dataset *train, struct dataset *test,
			 const struct data_config *dc, char *err, size_t errlen)
{
	int ret;

	if ((ret = data_need(dc->train_images, "train_images", err, errlen)) < 0 ||
	    (ret = data_need(dc->train_labels, "train_labels", err, errlen)) < 0 ||
	    (ret = data_need(dc->test_images, "test_images", err, errlen)) < 0 ||
	    (ret = data_need(dc->test_labels, "test_labels", err, errlen)) < 0)
		return ret;
	ret = idx_load(train, dc->train_images, dc->train_labels, err, errlen);
	if (ret < 0)
		return ret;
	ret = idx_load(test, dc->test_images, dc->test_labels, err, errlen);
	if (ret < 0)
		return ret;
	if (test->d != train->d) {
		snprintf(err, errlen, "%s has %zu pixels per image but %s has %zu",
			 dc->test_images, test->d, dc->train_images, train->d);
		return -EINVAL;
	}
	return 0;
}

/* Train and test as read (and split), before standardizing. */
static int data_load_csv_raw(struct dataset *train, struct dataset *test,
			     const struct data_config *dc, uint64_t seed,
			     char *err, size_t errlen)
{
	struct dataset all = { 0 };
	int ret;

	ret = data_need(dc->train_csv, "train_csv", err, errlen);
	if (ret < 0)
		return ret;
	if (dc->test_csv[0]) {
		ret = csv_load(train, dc->train_csv, dc->label_column,
			       dc->header, err, errlen);
		if (ret < 0)
			return ret;
		ret = csv_load(test, dc->test_csv, dc->label_column,
			       dc->header, err, errlen);
		if (ret < 0)
			return ret;
		if (test->d != train->d) {
			snprintf(err, errlen, "%s has %zu feature columns but %s has %zu",
				 dc->test_csv, test->d, dc->train_csv, train->d);
			return -EINVAL;
		}
	} else {
		if (!(dc->test_fraction > 0 && dc->test_fraction < 1)) {
			snprintf(err, errlen, "[data] test_fraction %g is not in (0,1)",
				 dc->test_fraction);
			return -EINVAL;
		}
		ret = csv_load(&all, dc->train_csv, dc->label_column,
			       dc->header, err, errlen);
		if (ret < 0)
			return ret;
		return data_split_fraction(train, test, &all, dc, seed, err, errlen);
	}
	return 0;
}

/* A Criteo file held whole, or refused when it holds more than
 * max_resident_mb: the caller says what to do then (what). */
static int data_criteo_whole(struct dataset *ds, const char *path, const struct data_config *dc,
			     const char *what, char *err, size_t errlen)
{
	size_t n, max = ((size_t)dc->max_resident_mb << 20) / CRITEO_ROW_BYTES;
	int ret = criteo_load(ds, path, max, &n, err, errlen);

	if (ret == 0 && n > max) {
		dataset_free(ds);
		snprintf(err, errlen, "%s: %zu samples take %zu MiB, more than [data] max_resident_mb = %d; %s",
			 path, n, (n * CRITEO_ROW_BYTES + (1u << 20) - 1) >> 20, dc->max_resident_mb, what);
		return -EFBIG;
	}
	return ret;
}

static int data_criteo_test(struct dataset *test, const struct data_config *dc, char *err, size_t errlen)
{
	return data_criteo_whole(test, dc->test_csv, dc, "a test set is held whole: raise it or use a shorter test file",
				 err, errlen);
}

static int data_load_criteo(struct dataset *train, struct dataset *test, const struct data_config *dc,
			    uint64_t seed, char *err, size_t errlen)
{
	static const char stream[] = "a training file that large is streamed only with a test_csv (docs/CTR.md)";
	struct dataset all = { 0 };
	int ret = data_need(dc->train_csv, "train_csv", err, errlen);

	if (ret == 0 && dc->test_csv[0]) {
		ret = data_criteo_whole(train, dc->train_csv, dc, stream, err, errlen);
		if (ret == 0)
			ret = data_criteo_test(test, dc, err, errlen);
	} else if (ret == 0) {
		ret = data_criteo_whole(&all, dc->train_csv, dc, stream, err, errlen);
		if (ret == 0)
			ret = data_split_fraction(train, test, &all, dc, seed, err, errlen);
	}
	return ret;
}

static int data_load_csv(struct dataset *train, struct dataset *test,
			 const struct data_config *dc, uint64_t seed,
			 char *err, size_t errlen)
{
	int ret = data_load_csv_raw(train, test, dc, seed, err, errlen);
	if (ret < 0)
		return ret;
	ret = data_standardize(train, test);
	if (ret < 0)
		snprintf(err, errlen, "%s: out of memory standardizing", dc->train_csv);
	return ret;
}

int data_load(struct dataset *train, struct dataset *test,
	      const struct data_config *dc, uint64_t seed,
	      char *err, size_t errlen)
{
	int ret;

	memset(train, 0, sizeof(*train));
	memset(test, 0, sizeof(*test));
	switch (dc->format) {
	case DATA_IDX:
		ret = data_load_idx(train, test, dc, err, errlen);
		break;
	case DATA_CSV:
		ret = data_load_csv(train, test, dc, seed, err, errlen);
		break;
	case DATA_CRITEO:
		ret = data_load_criteo(train, test, dc, seed, err, errlen);
		break;
	default:
		snprintf(err, errlen, "[data] unknown format %d", (int)dc->format);
		ret = -EINVAL;
		break;
	}
	if (ret < 0) {
		dataset_free(train);
		dataset_free(test);
		return ret;
	}
	/* The model has one output per class whichever set a label is in. */
	if (test->classes > train->classes)
		train->classes = test->classes;
	test->classes = train->classes;
	return 0;
}

int data_load_train(struct dataset *train, struct dataset *test, struct stream *s, int *streamed,
		    const struct data_config *dc, size_t per_step, uint64_t seed, char *err, size_t errlen)
{
	memset(s, 0, sizeof(*s));
	*streamed = 0;
	if (dc->format != DATA_CRITEO || !dc->train_csv[0] || !dc->test_csv[0])
		return data_load(train, test, dc, seed, err, errlen);
	/* One read of the file: it is checked and counted while window 0 is
	 * kept, and a file that fits in that window is simply held. */
	size_t window = stream_window_rows((uint64_t)dc->max_resident_mb << 20, per_step);
	int ret = stream_open(s, dc->train_csv, window, train, err, errlen);
	if (ret == 0)
		ret = data_criteo_test(test, dc, err, errlen);
	if (ret < 0) {
		stream_close(s);
		dataset_free(train);
		return ret;
	}
	*streamed = s->n > window;
	if (!*streamed)
		stream_close(s);
	return 0;
}

int data_load_test(struct dataset *test, const struct data_config *dc, uint64_t seed, char *err, size_t errlen)
{
	struct dataset train = { 0 };
	int ret;

	if (dc->format == DATA_CRITEO && dc->test_csv[0]) {
		memset(test, 0, sizeof(*test));
		return data_criteo_test(test, dc, err, errlen);
	}
	ret = data_load(&train, test, dc, seed, err, errlen);
	dataset_free(&train);
	return ret;
}

int data_load_input(struct dataset *in, const struct data_config *dc, uint64_t seed, const char *path,
		    char *err, size_t errlen)
{
	struct dataset train = { 0 }, test = { 0 };
	int ret;

	memset(in, 0, sizeof(*in));
	if (dc->format == DATA_IDX)
		return idx_load_images(in, path, err, errlen);
	if (dc->format == DATA_CRITEO)
		return data_criteo_whole(in, path, dc, "predict on a shorter file", err, errlen);
	ret = data_load_csv_raw(&train, &test, dc, seed, err, errlen);
	if (ret == 0)
		ret = csv_load(in, path, dc->label_column, dc->header, err, errlen);
	if (ret == 0 && in->d != train.d) {
		snprintf(err, errlen, "%s has %zu feature columns but %s has %zu (the label column must be there too; its value is ignored)",
			 path, in->d, dc->train_csv, train.d);
		ret = -EINVAL;
	}
	if (ret == 0) {
		ret = data_standardize(&train, in);
		if (ret < 0)
			snprintf(err, errlen, "%s: out of memory standardizing", path);
	}
	dataset_free(&train);
	dataset_free(&test);
	if (ret < 0)
		dataset_free(in);
	return ret;
}
