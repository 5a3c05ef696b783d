/* Final ranges of a gradient and the readers waiting on them (gradflow.h). */
#include "gradflow.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int gradflow_init(struct gradflow *f, size_t n, int nstreams, const size_t *begin,
		  const size_t *end, int cap)
{
	memset(f, 0, sizeof(*f));
	if (nstreams < 0 || nstreams > GRADFLOW_MAX_STREAMS || cap < 1)
		return -EINVAL;
	for (int k = 0; k < nstreams; k++)
		if (begin[k] > end[k] || end[k] > n)
			return -EINVAL;
	f->done = calloc((size_t)cap, sizeof(*f->done));
	if (!f->done)
		return -ENOMEM;
	f->cap = cap;
	f->n = n;
	f->nstreams = nstreams;
	memcpy(f->begin, begin, (size_t)nstreams * sizeof(*begin));
	memcpy(f->end, end, (size_t)nstreams * sizeof(*end));
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);
	return 0;
}

void gradflow_free(struct gradflow *f)
{
	if (!f || !f->done)
		return;
	pthread_mutex_destroy(&f->mu);
	pthread_cond_destroy(&f->cv);
	free(f->done);
	memset(f, 0, sizeof(*f));
}

void gradflow_reset(struct gradflow *f)
{
	pthread_mutex_lock(&f->mu);
	f->ndone = 0;
	f->failed = 0;
	memset(f->want, 0, sizeof(f->want));
	f->at_lo = f->at_want = 0;
	pthread_mutex_unlock(&f->mu);
}

/* Under mu: inserts [lo, hi) and merges it with every range it overlaps
 * or touches. */
static int spans_add(struct gradflow *f, size_t lo, size_t hi)
{
	int i = 0, j;
	while (i < f->ndone && f->done[i].hi < lo)
		i++;
	/* done[i..j) overlap or touch [lo, hi) */
	for (j = i; j < f->ndone && f->done[j].lo <= hi; j++) {
		lo = f->done[j].lo < lo ? f->done[j].lo : lo;
		hi = f->done[j].hi > hi ? f->done[j].hi : hi;
	}
	if (j == i) {
		if (f->ndone == f->cap)
			return -ENOSPC;
		memmove(&f->done[i + 1], &f->done[i], (size_t)(f->ndone - i) * sizeof(*f->done));
		f->ndone++;
	} else if (j > i + 1) {
		memmove(&f->done[i + 1], &f->done[j], (size_t)(f->ndone - j) * sizeof(*f->done));
		f->ndone -= j - i - 1;
	}
	f->done[i] = (struct gradflow_span){ lo, hi };
	return 0;
}

void gradflow_fail(struct gradflow *f)
{
	pthread_mutex_lock(&f->mu);
	f->failed = 1;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

/* Under mu: the end of the final range that holds at, or at. */
static size_t reach(const struct gradflow *f, size_t at)
{
	for (int i = 0; i < f->ndone && f->done[i].lo <= at; i++)
		if (f->done[i].hi > at)
			return f->done[i].hi;
	return at;
}

static size_t frontier_locked(const struct gradflow *f, int k)
{
	size_t r = reach(f, f->begin[k]);
	return r < f->end[k] ? r : f->end[k];
}

int gradflow_mark(struct gradflow *f, size_t lo, size_t hi)
{
	if (lo > hi || hi > f->n)
		return -EINVAL;
	if (lo == hi)
		return 0;
	pthread_mutex_lock(&f->mu);
	int r = spans_add(f, lo, hi), wake = r != 0;
	if (r)
		f->failed = 1;
	/* Only a reader whose target is now reached is woken: the step
	 * marks a block at a time, and every needless wake-up takes a CPU
	 * from the step itself. */
	for (int k = 0; !wake && k < f->nstreams; k++)
		wake = f->want[k] && frontier_locked(f, k) >= f->want[k];
	if (!wake && f->at_want)
		wake = reach(f, f->at_lo) >= f->at_want;
	if (wake)
		pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	return r;
}

int gradflow_complete(struct gradflow *f)
{
	pthread_mutex_lock(&f->mu);
	int all = f->n == 0 || reach(f, 0) >= f->n;
	pthread_mutex_unlock(&f->mu);
	return all;
}

size_t gradflow_frontier(struct gradflow *f, int k)
{
	pthread_mutex_lock(&f->mu);
	size_t r = frontier_locked(f, k);
	pthread_mutex_unlock(&f->mu);
	return r;
}

void gradflow_later(struct gradflow *f, int k, int later)
{
	pthread_mutex_lock(&f->mu);
	f->later[k] = later != 0;
	pthread_mutex_unlock(&f->mu);
}

int gradflow_is_later(struct gradflow *f, int k)
{
	pthread_mutex_lock(&f->mu);
	int later = f->later[k];
	pthread_mutex_unlock(&f->mu);
	return later;
}

int gradflow_behind(struct gradflow *f, size_t *frontier)
{
	int best = -1;
	double least = 2.0;
	pthread_mutex_lock(&f->mu);
	for (int k = 0; k < f->nstreams; k++) {
		size_t at = frontier_locked(f, k);
		if (at >= f->end[k] || f->later[k])
			continue;
		double part = (double)(at - f->begin[k]) / (double)(f->end[k] - f->begin[k]);
		if (part < least) {
			least = part;
			best = k;
			*frontier = at;
		}
	}
	pthread_mutex_unlock(&f->mu);
	return best;
}

int gradflow_wait(struct gradflow *f, int k, size_t want, size_t *have)
{
	if (want > f->end[k])
		want = f->end[k];
	pthread_mutex_lock(&f->mu);
	size_t at;
	while ((at = frontier_locked(f, k)) < want && !f->failed) {
		f->want[k] = want;
		pthread_cond_wait(&f->cv, &f->mu);
	}
	f->want[k] = 0;
	int failed = at < want;
	pthread_mutex_unlock(&f->mu);
	*have = at;
	return failed ? -ECANCELED : 0;
}

int gradflow_wait_at(struct gradflow *f, size_t lo, size_t want, size_t *have)
{
	if (want > f->n)
		want = f->n;
	pthread_mutex_lock(&f->mu);
	size_t at;
	while ((at = reach(f, lo)) < want && !f->failed) {
		f->at_lo = lo;
		f->at_want = want;
		pthread_cond_wait(&f->cv, &f->mu);
	}
	f->at_lo = f->at_want = 0;
	int failed = at < want;
	pthread_mutex_unlock(&f->mu);
	*have = at;
	return failed ? -ECANCELED : 0;
}
