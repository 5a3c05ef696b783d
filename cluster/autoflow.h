/* [cluster] overlap = auto: whether pushing while computing pays on this
 * cluster, found by trying it.
 *
 * It pays where the link limits a step (the gradient is on the wire
 * while backward still runs) and costs where the CPU does (the sealing
 * beside the step takes a core from it): docs/NETWORK.md measured +5%
 * at 1 Gbit/s and -6% at 10 Gbit/s on the same 2 CPUs. Which one a
 * cluster is cannot be known before it runs, so a worker alternates
 * spans of steps without and with it, then keeps the one whose median
 * step was shorter. The spans go by step number, so the workers of a
 * sync run (which take their steps together) try the same way at the
 * same time, and each decides for itself on what it saw. */
#ifndef PSTRAIN_CLUSTER_AUTOFLOW_H
#define PSTRAIN_CLUSTER_AUTOFLOW_H

#define AUTOFLOW_SKIP 10   /* steps first, untimed: connections, caches, page faults */
#define AUTOFLOW_SPAN 10   /* steps a span */
#define AUTOFLOW_SPANS 6   /* without, with, without, ... */

struct autoflow {
	int mode;          /* CONFIG_OVERLAP_{OFF,ON,AUTO} */
	long from;         /* the first timed step */
	int decided;       /* auto: -1 trying; 0 or 1 the choice */
	double ms[2];      /* auto, decided: median step without and with */
	double t[2][AUTOFLOW_SPANS / 2 * AUTOFLOW_SPAN]; /* seconds of each timed step */
	int n[2];
};

/* mode from [cluster] overlap; trials, if any, start at step. */
void autoflow_init(struct autoflow *a, int mode, long step);
/* Whether step pushes while computing. */
int autoflow_wants(const struct autoflow *a, long step);
/* Step took seconds (its compute and exchange). 1 when this made the
 * choice (a->decided, a->ms), else 0. */
int autoflow_record(struct autoflow *a, long step, double seconds);

#endif
