/* parallel_run: see parallel.h. */
#include "parallel.h"

#include <pthread.h>

/* More would only matter on machines this trainer does not target; the
 * kernels cap their own parallelism lower (conv: CONV_SLICES). */
#define PARALLEL_MAX 64

struct share {
	void (*fn)(void *arg, int t, int nt);
	void *arg;
	int t, nt;
};

static void *share_main(void *p)
{
	struct share *s = p;
	s->fn(s->arg, s->t, s->nt);
	return NULL;
}

void parallel_run(int threads, void (*fn)(void *arg, int t, int nt), void *arg)
{
	int nt = threads < 1 ? 1 : threads > PARALLEL_MAX ? PARALLEL_MAX : threads;
	struct share sh[PARALLEL_MAX];
	pthread_t th[PARALLEL_MAX];
	int started[PARALLEL_MAX];
	for (int t = 0; t < nt - 1; t++) {
		sh[t] = (struct share){ fn, arg, t, nt };
		started[t] = pthread_create(&th[t], NULL, share_main, &sh[t]) == 0;
	}
	fn(arg, nt - 1, nt);
	for (int t = 0; t < nt - 1; t++) {
		if (started[t])
			pthread_join(th[t], NULL);
		else
			fn(arg, t, nt);
	}
}
