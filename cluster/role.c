/* See role.h. */
#include "role.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int role_setup_load(struct role_setup *s, const struct config *c, int want_data, char *err,
		    size_t errlen)
{
	int e = key_load(s->key, c->cluster.key_file, err, errlen);
	if (e)
		return e == -ENOMEM || e == -EIO ? e : -EINVAL;
	if (config_hash(c, s->hash))
		return snprintf(err, errlen, "out of memory"), -ENOMEM;
	e = model_build(&s->m, &c->model, err, errlen);
	if (e)
		return e;
	if (!want_data && c->train.steps > 0) {
		s->total = c->train.steps;
		return 0;
	}
	e = data_load(&s->train, &s->test, &c->data, c->train.seed, err, errlen);
	if (e)
		return e != -ENOMEM && e != -EIO ? -EINVAL : e;
	const char *src = c->data.format == DATA_IDX ? c->data.train_images : c->data.train_csv;
	if (s->train.d != (size_t)s->m.inputs || s->test.d != (size_t)s->m.inputs) {
		snprintf(err, errlen, "%s: samples have %zu features but the model's input has %d",
			 src, s->train.d, s->m.inputs);
		return -EINVAL;
	}
	int classes = s->train.classes > s->test.classes ? s->train.classes : s->test.classes;
	if (classes > s->m.outputs) {
		snprintf(err, errlen, "%s: labels go up to %d but the last layer has %d outputs",
			 src, classes - 1, s->m.outputs);
		return -EINVAL;
	}
	size_t per_step = (size_t)c->cluster.nworkers * (size_t)c->train.batch_size;
	s->spe = (long)(s->train.n / per_step);
	if (s->spe == 0) {
		snprintf(err, errlen, "%s: %zu training samples are fewer than %d workers x batch_size %d",
			 c->path, s->train.n, c->cluster.nworkers, c->train.batch_size);
		return -EINVAL;
	}
	s->total = c->train.steps > 0 ? c->train.steps : c->train.epochs * s->spe;
	return 0;
}

void role_setup_free(struct role_setup *s)
{
	dataset_free(&s->train);
	dataset_free(&s->test);
	explicit_bzero(s->key, sizeof(s->key));
}

void role_log(FILE *out, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	flockfile(out);
	vfprintf(out, fmt, ap);
	fputc('\n', out);
	fflush(out);
	funlockfile(out);
	va_end(ap);
}

void role_nap_ms(long ms)
{
	struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&t, NULL);
}

int64_t role_now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int role_cond_init(pthread_cond_t *cv)
{
	pthread_condattr_t at;
	int r = pthread_condattr_init(&at);
	if (r)
		return -r;
	r = pthread_condattr_setclock(&at, CLOCK_MONOTONIC);
	if (!r)
		r = pthread_cond_init(cv, &at);
	pthread_condattr_destroy(&at);
	return -r;
}

void role_deadline(struct timespec *dl, long ms)
{
	clock_gettime(CLOCK_MONOTONIC, dl);
	long ns = dl->tv_nsec + (ms % 1000) * 1000000L;
	dl->tv_sec += ms / 1000 + ns / 1000000000L;
	dl->tv_nsec = ns % 1000000000L;
}

int role_heartbeat_ms(const struct config *c)
{
	int ms = (int)(c->cluster.peer_timeout * 1000 / 4);
	return ms < 50 ? 50 : ms;
}

int role_peer_timeout_ms(const struct config *c)
{
	return (int)(c->cluster.peer_timeout * 1000);
}

int role_write_timeout_ms(const struct config *c)
{
	int ms = role_peer_timeout_ms(c);
	return ms < 1000 ? 1000 : ms;
}

void role_hooks_read(struct role_hooks *h)
{
	const char *fpd = getenv("PSTRAIN_FIRST_PULL_DELAY_MS");
	const char *ed = getenv("PSTRAIN_EVAL_DELAY_MS");
	h->first_pull_delay_ms = fpd ? atol(fpd) : 0;
	h->eval_delay_ms = ed ? atol(ed) : 0;
}
