/* A fixed set of threads that run small jobs (sealing or opening one frame)
 * for the connections of one process. net/pipe.c is its user: it keeps the
 * frames of one tensor in order on the wire; this module only runs jobs and
 * says when each is finished. No sockets, no crypto, no printing.
 *
 * The threads are created once, by cryptopool_new, and joined by
 * cryptopool_destroy: never a thread per frame or per message. Any number
 * of connection threads may submit jobs at once (a ps shares one pool among
 * all its connections); jobs run in submission order, each on one pool
 * thread. */
#ifndef PSTRAIN_NET_CRYPTOPOOL_H
#define PSTRAIN_NET_CRYPTOPOOL_H

#include <pthread.h>
#include <stddef.h>

#define CRYPTOPOOL_MUST_CHECK __attribute__((warn_unused_result))

/* Most threads a pool has: also the cap of the automatic count. Past about
 * 8 cores one connection's bytes are bound by the socket copies and memory
 * bandwidth, not by AES-GCM. */
#define CRYPTOPOOL_MAX_THREADS 8

struct cryptopool;

/* One job, owned by the submitter (typically embedded in a bigger struct):
 * set run and arg, submit, then wait before reusing or freeing it. The
 * other fields are the pool's. */
struct cryptopool_job {
	void (*run)(void *arg); /* called once on a pool thread */
	void *arg;
	struct cryptopool_job *next;
	pthread_cond_t *wake; /* signalled when done (under the pool's lock) */
	int done;
};

/* The thread count for a configured value: n >= 1 is n (capped at
 * CRYPTOPOOL_MAX_THREADS); 0 means automatic: one per CPU in this process's
 * affinity mask beyond the first, at least 1, at most
 * CRYPTOPOOL_MAX_THREADS. 1 means "no pool": the connection's own thread
 * seals and opens. */
int cryptopool_threads_for(int configured);

/* Starts a pool of `threads` (1..CRYPTOPOOL_MAX_THREADS) threads. -EINVAL
 * for another count, -ENOMEM or pthread_create's error (no thread is left
 * running then), with a one-line reason in err. */
CRYPTOPOOL_MUST_CHECK int cryptopool_new(struct cryptopool **out, int threads, char *err,
					 size_t errlen);

/* Stops and joins the threads and frees the pool. Every submitted job must
 * have been waited for. Accepts NULL. */
void cryptopool_destroy(struct cryptopool *p);

/* How many threads the pool runs. */
int cryptopool_size(const struct cryptopool *p);

/* Queues job j. wake is a condition variable of the submitter's (one per
 * submitting thread is enough) that is signalled when j finishes. */
void cryptopool_submit(struct cryptopool *p, struct cryptopool_job *j, pthread_cond_t *wake);

/* Waits until job j has run. j->wake must be the cv it was submitted with. */
void cryptopool_wait(struct cryptopool *p, struct cryptopool_job *j);

/* Whether job j has run (never blocks on the job; takes the pool's lock). */
int cryptopool_done(struct cryptopool *p, struct cryptopool_job *j);

#endif
