/* See job.h. */
#include "job.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* The categorical fields and the labels of a click-through model: as
 * many fields as its embedding layer has (none without one), and 0/1
 * labels for sigmoid_cross_entropy. */
static int check_ctr_fit(const struct job *j, const char *src, char *err, size_t errlen)
{
	const struct model *m = &j->m;
	const struct dataset *train = &j->train, *test = &j->test;
	size_t F = (size_t)m->embed.fields, f = train->f != F ? train->f : test->f;
	if (f != F && !F) {
		snprintf(err, errlen, "%s: samples have %zu categorical fields, but the model has no embedding layer to read them (add layer = embedding %zu ROWS DIM first)",
			 src, f, f);
		return -EINVAL;
	}
	if (f != F) {
		snprintf(err, errlen, "%s: samples have %zu categorical fields, but layer %s takes %zu", src, f,
			 m->layers[0].name, F);
		return -EINVAL;
	}
	int classes = train->classes > test->classes ? train->classes : test->classes;
	if (m->loss == LOSS_SIGMOID_XENT && classes > 2) {
		snprintf(err, errlen, "%s: labels go up to %d, but loss = sigmoid_cross_entropy takes 0/1 labels",
			 src, classes - 1);
		return -EINVAL;
	}
	return 0;
}

static int check_fit(const struct config *c, const struct job *j, char *err, size_t errlen)
{
	const struct model *m = &j->m;
	const struct dataset *train = &j->train, *test = &j->test;
	const char *src = j->borrowed ? "the training set given"
			  : c->data.format == DATA_IDX ? c->data.train_images : c->data.train_csv;
	if (train->d != (size_t)m->inputs || test->d != (size_t)m->inputs) {
		snprintf(err, errlen, "%s: samples have %zu features but [model] input = %dx%dx%d has %d",
			 src, train->d != (size_t)m->inputs ? train->d : test->d,
			 c->model.in_h, c->model.in_w, c->model.in_c, m->inputs);
		return -EINVAL;
	}
	int e = check_ctr_fit(j, src, err, errlen);
	if (e)
		return e;
	int classes = train->classes > test->classes ? train->classes : test->classes;
	if (classes > m->outputs && m->loss != LOSS_SIGMOID_XENT) {
		snprintf(err, errlen, "%s: labels go up to %d but the last layer has %d outputs; make it dense %d",
			 src, classes - 1, m->outputs, classes);
		return -EINVAL;
	}
	/* The remainder of each shuffled epoch is dropped, so every step has
	 * a full batch and a step means the same thing locally and in a
	 * cluster. */
	size_t per_step = (size_t)j->S * (size_t)j->B;
	if (train->n < per_step && j->S == 1) {
		snprintf(err, errlen, "%s: [train] batch_size %d is larger than the %zu training samples",
			 c->path, j->B, train->n);
		return -EINVAL;
	}
	if (train->n < per_step) {
		snprintf(err, errlen, "%s: %zu training samples are fewer than %d slices x batch_size %d (a slice per worker unless [train] slices says otherwise)",
			 c->path, train->n, j->S, j->B);
		return -EINVAL;
	}
	return 0;
}

int job_load(struct job *j, const struct config *c, int S, int want_data, char *err,
	     size_t errlen)
{
	memset(j, 0, sizeof(*j));
	j->S = S;
	j->B = c->train.batch_size;
	int e = model_build(&j->m, &c->model, err, errlen);
	if (e)
		return e;
	if (!want_data && c->train.steps > 0) {
		j->total = c->train.steps;
		return 0;
	}
	size_t per_step = (size_t)S * (size_t)j->B;
	e = data_load_train(&j->train, &j->test, &j->stream, &j->streamed, &c->data, per_step, c->train.seed, err,
			    errlen);
	if (e) {
		/* A file that is missing, unreadable, a directory, malformed or
		 * absurdly large is the user's input to fix (exit 2); only
		 * running out of memory or a failing disk is a runtime failure. */
		return e != -ENOMEM && e != -EIO ? -EINVAL : e;
	}
	e = check_fit(c, j, err, errlen);
	if (e)
		return e;
	j->n = j->streamed ? j->stream.n : j->train.n;
	j->spe = (long)(j->n / per_step);
	j->spw = j->streamed ? (long)(j->stream.window / per_step) : j->spe;
	j->total = c->train.steps > 0 ? c->train.steps : c->train.epochs * j->spe;
	/* Loaded only to be counted (a ps, `inspect`): held for the run,
	 * the samples took a ps as much memory as a quarter of its shard
	 * (1M click-through rows: 156 MiB beside 635). */
	if (!want_data) {
		stream_close(&j->stream);
		dataset_free(&j->train);
		dataset_free(&j->test);
	}
	return 0;
}

int job_load_sets(struct job *j, const struct config *c, const struct dataset *train,
		  const struct dataset *test, char *err, size_t errlen)
{
	memset(j, 0, sizeof(*j));
	j->S = config_slices(c, 0);
	j->B = c->train.batch_size;
	j->borrowed = 1;
	int e = model_build(&j->m, &c->model, err, errlen);
	if (e)
		return e;
	j->train = *train;
	j->test = *test;
	e = check_fit(c, j, err, errlen);
	if (e)
		return e;
	j->n = j->train.n;
	j->spe = (long)(j->train.n / ((size_t)j->S * (size_t)j->B));
	j->spw = j->spe;
	j->total = c->train.steps > 0 ? c->train.steps : c->train.epochs * j->spe;
	return 0;
}

void job_free(struct job *j)
{
	stream_close(&j->stream);
	if (j->borrowed) {
		memset(j, 0, sizeof(*j));
		return;
	}
	dataset_free(&j->train);
	dataset_free(&j->test);
}

size_t job_slice_at(const struct job *j, long step, int s)
{
	return (size_t)(step % j->spe % j->spw) * (size_t)j->S * (size_t)j->B + (size_t)s * (size_t)j->B;
}

long job_part(const struct job *j, long step)
{
	long epoch = step / j->spe;
	return j->streamed ? epoch * (long)stream_windows(&j->stream) + step % j->spe / j->spw : epoch;
}

int job_order(struct job *j, long step, uint64_t seed, uint32_t *perm, char *err, size_t errlen)
{
	uint64_t epoch = (uint64_t)(step / j->spe);
	size_t k = (size_t)(step % j->spe / j->spw);
	if (!j->streamed) {
		data_permute(perm, j->train.n, seed, epoch);
		return 0;
	}
	int e = stream_fill(&j->stream, k, &j->train, err, errlen);
	if (!e)
		stream_order(perm, j->train.n, seed, epoch, k);
	return e;
}
