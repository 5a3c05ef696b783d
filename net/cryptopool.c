/* The pool of crypto threads (see cryptopool.h). One mutex guards the queue
 * and every job's done flag; each submitter brings its own condition
 * variable so that finishing a job wakes only the thread waiting for it, not
 * every connection of a ps.
 *
 * Rejected: a lock-free ring per connection (faster by a few microseconds
 * per 1 MiB frame, which takes ~700 us to seal: not worth the subtlety), and
 * a pool per connection (64 connections x 8 threads on a ps). */
#include "cryptopool.h"
#include "../base/err.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct cryptopool {
	pthread_mutex_t mu;
	pthread_cond_t work; /* a job was queued, or stop */
	struct cryptopool_job *head, *tail;
	int stop;
	int nthreads;
	pthread_t threads[CRYPTOPOOL_MAX_THREADS];
};

int cryptopool_threads_for(int configured)
{
	if (configured >= 1)
		return configured > CRYPTOPOOL_MAX_THREADS ? CRYPTOPOOL_MAX_THREADS : configured;
	/* The affinity mask, not the machine: under taskset or a cpuset the
	 * CPUs we may not use would only add contention. */
	cpu_set_t set;
	long n = 0;
	if (sched_getaffinity(0, sizeof set, &set) == 0)
		n = CPU_COUNT(&set);
	if (n <= 0)
		n = sysconf(_SC_NPROCESSORS_ONLN);
	n -= 1; /* the first CPU runs the connection's own thread (I/O) */
	if (n < 1)
		n = 1;
	return n > CRYPTOPOOL_MAX_THREADS ? CRYPTOPOOL_MAX_THREADS : (int)n;
}

static void *pool_main(void *arg)
{
	struct cryptopool *p = arg;
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->head && !p->stop)
			pthread_cond_wait(&p->work, &p->mu);
		if (!p->head)
			break; /* stop, and nothing left to run */
		struct cryptopool_job *j = p->head;
		p->head = j->next;
		if (!p->head)
			p->tail = NULL;
		pthread_mutex_unlock(&p->mu);
		j->run(j->arg);
		pthread_mutex_lock(&p->mu);
		j->done = 1;
		pthread_cond_broadcast(j->wake);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int cryptopool_new(struct cryptopool **out, int threads, char *err, size_t errlen)
{
	if (threads < 1 || threads > CRYPTOPOOL_MAX_THREADS)
		return err_set(err, errlen, -EINVAL, "crypto pool of %d threads (1..%d)", threads,
			       CRYPTOPOOL_MAX_THREADS);
	struct cryptopool *p = calloc(1, sizeof *p);
	if (!p)
		return err_set(err, errlen, -ENOMEM, "out of memory for the crypto pool");
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->work, NULL);
	for (int i = 0; i < threads; i++) {
		int r = pthread_create(&p->threads[i], NULL, pool_main, p);
		if (r) {
			cryptopool_destroy(p); /* joins the ones started */
			return err_set(err, errlen, -r, "cannot start crypto thread %d of %d: %s",
				       i + 1, threads, strerror(r));
		}
		p->nthreads = i + 1;
	}
	*out = p;
	return 0;
}

void cryptopool_destroy(struct cryptopool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = 1;
	pthread_cond_broadcast(&p->work);
	pthread_mutex_unlock(&p->mu);
	for (int i = 0; i < p->nthreads; i++)
		pthread_join(p->threads[i], NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->work);
	free(p);
}

int cryptopool_size(const struct cryptopool *p)
{
	return p->nthreads;
}

void cryptopool_submit(struct cryptopool *p, struct cryptopool_job *j, pthread_cond_t *wake)
{
	j->next = NULL;
	j->wake = wake;
	pthread_mutex_lock(&p->mu);
	j->done = 0;
	if (p->tail)
		p->tail->next = j;
	else
		p->head = j;
	p->tail = j;
	pthread_cond_signal(&p->work);
	pthread_mutex_unlock(&p->mu);
}

void cryptopool_wait(struct cryptopool *p, struct cryptopool_job *j)
{
	pthread_mutex_lock(&p->mu);
	while (!j->done)
		pthread_cond_wait(j->wake, &p->mu);
	pthread_mutex_unlock(&p->mu);
}

int cryptopool_done(struct cryptopool *p, struct cryptopool_job *j)
{
	pthread_mutex_lock(&p->mu);
	int d = j->done;
	pthread_mutex_unlock(&p->mu);
	return d;
}
