/* A gradient that becomes final piece by piece while readers send it.
 *
 * A worker in sync piece mode pushes each shard's gradient in pieces; the
 * backward pass can make those pieces final long before it ends (a dense
 * layer's weight gradient, row block by row block, once every layer's
 * input gradient is known). A gradflow is the meeting point: the step
 * marks ranges of the flat vector final (gradflow_mark), and each reader,
 * one per stream (a shard: a range of the vector it sends in order),
 * waits until the final prefix of its range reaches what it wants to send
 * (gradflow_wait). The step asks which stream is furthest behind
 * (gradflow_behind) to decide what to compute next, so that every link
 * has something to send early rather than one after the other.
 *
 * The same meeting point serves the other direction: a worker's link
 * threads mark the parameters final as they arrive, and the forward pass
 * of the next step waits on the ranges each layer needs
 * (gradflow_wait_at).
 *
 * One producer thread, any number of readers. The final ranges are kept
 * merged, so their number stays small (at most one more than the marks
 * not yet joined to a neighbour). */
#ifndef PSTRAIN_CORE_GRADFLOW_H
#define PSTRAIN_CORE_GRADFLOW_H

#include <pthread.h>
#include <stddef.h>

#define GRADFLOW_MAX_STREAMS 64

struct factors;

struct gradflow_span {
	size_t lo, hi;
};

struct gradflow {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	size_t n;                    /* the vector's length */
	int nstreams;
	size_t begin[GRADFLOW_MAX_STREAMS], end[GRADFLOW_MAX_STREAMS];
	struct gradflow_span *done;  /* (cap) final ranges, sorted, disjoint, not touching */
	int ndone, cap;
	size_t want[GRADFLOW_MAX_STREAMS]; /* a waiting reader's target; 0: none */
	unsigned char later[GRADFLOW_MAX_STREAMS]; /* gradflow_later's */
	size_t at_lo, at_want;       /* gradflow_wait_at's reader: [at_lo, at_want); 0, 0: none */
	int failed;                  /* the step ended without making it all final */
	struct factors *fx;          /* NULL, or the step's runs sent as factors
				      * (factors.h): planned before the step, kept
				      * by it, read by the links once final */
};

/* Streams k = 0..nstreams-1 over [begin[k], end[k]) of a vector of n
 * values (ranges inside [0, n), nstreams <= GRADFLOW_MAX_STREAMS). cap:
 * how many separate final ranges may exist at once. -EINVAL, -ENOMEM. */
int gradflow_init(struct gradflow *f, size_t n, int nstreams, const size_t *begin,
		  const size_t *end, int cap);
void gradflow_free(struct gradflow *f); /* accepts a zeroed struct */

/* A new step: nothing final, not failed. */
void gradflow_reset(struct gradflow *f);
/* [lo, hi) is final; wakes the readers. -ENOSPC when it would make more
 * than cap separate ranges (the flow is then failed). */
int gradflow_mark(struct gradflow *f, size_t lo, size_t hi);
/* The step failed: every reader's wait ends with -ECANCELED. */
void gradflow_fail(struct gradflow *f);
/* Whether all of [0, n) is final. */
int gradflow_complete(struct gradflow *f);

/* The end of the final prefix of stream k (its begin when none). */
size_t gradflow_frontier(struct gradflow *f, int k);
/* Whether stream k is one that gains nothing from an early start (a
 * reader that does not wait on a wire: a ps on this host, over its Unix
 * socket). gradflow_behind leaves such streams to the end, so the step
 * first makes final what crosses a link, and the CPU that moving the
 * rest would take is not taken from the step while the wire waits. */
void gradflow_later(struct gradflow *f, int k, int later);
int gradflow_is_later(struct gradflow *f, int k);

/* The stream whose final prefix is the smallest part of its range among
 * those not complete and not later, and its frontier; -1 when every such
 * stream is complete. */
int gradflow_behind(struct gradflow *f, size_t *frontier);
/* Waits until stream k's frontier is at least want (clipped to its end);
 * *have: the frontier then. 0, or -ECANCELED once failed. */
int gradflow_wait(struct gradflow *f, int k, size_t want, size_t *have);
/* Waits until [lo, want) is final whatever stream holds it (want clipped
 * to n); *have: the end of the final range from lo then, want or more.
 * One such reader at a time (the compute thread of a worker that starts
 * its forward pass on the parameters that have arrived). 0, or
 * -ECANCELED once failed. */
int gradflow_wait_at(struct gradflow *f, size_t lo, size_t want, size_t *have);

#endif
