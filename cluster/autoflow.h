/* [cluster] overlap = auto: whether a worker pushes while computing, from
 * where its steps' time goes.
 *
 * Pushing the gradient while backward still runs can hide at most the
 * backward pass, and the sealing and sending beside it take CPU from the
 * step. So it pays where the wire limits a step and costs where the CPUs
 * do (docs/NETWORK.md: +6% at 1 Gbit/s, -16% at 10 Gbit/s on the same 2
 * CPUs). Which one a cluster is shows in the worker's own step: where
 * the exchange after the compute takes several times the compute, the
 * step waits for the link; where it takes about as long, the CPUs are
 * the limit. netlab's medians: 4 to 6x at 1 Gbit/s, 0.7 to 1.6x at 10.
 *
 * Trying both ways and keeping the faster (reverted in 4db4a06) could not
 * tell a 4% effect from the noise of 50 steps; this ratio differs by 3x
 * or more between the two cases, and a median of 20 steps shows it.
 *
 * A worker starts pushing after computing, then every AUTOFLOW_WINDOW
 * steps compares the window's median exchange with its median compute:
 * it switches on above AUTOFLOW_ON, off below AUTOFLOW_OFF (pushing while
 * computing shortens the exchange and stretches the compute, so the band
 * between keeps it from flipping), and after AUTOFLOW_SWITCHES switches
 * keeps the way it has. Each worker decides for itself: the ps take
 * either way from any worker at any step.
 *
 * The band is wide because what "on" does shrinks the exchange most
 * where it pays: at 1 Gbit/s, wire_pack's parameters as XORs (about 0.6
 * of float32's bytes) and pushing while computing brought the exchange
 * from 4.6x the compute down to 1.4-2.6x in windows of netlab's, where
 * the off threshold was 1.5 and switched it off again at a cost of 13%;
 * on at 10 Gbit/s, where the CPUs limit the step, it is 0.7x. On a 2 ms
 * round trip at 1 Gbit/s it still flipped (on at 5.0x, off at 0.9x, on
 * at 3.2x, off at 1.0x for good: 35.7 steps/s where the runs that stayed
 * on made 45): so the last switch goes to whichever way's last window
 * stepped faster, both having been measured, not to the ratio's.
 *
 * Between the thresholds the ratio cannot tell which limits the step: a
 * short compute makes a link-bound exchange look only 2-3x as long (the
 * click-through model at 1 Gbit/s: compute 1.4 ms, exchange 2.0-2.9x it,
 * and packing made 238 steps/s against 189 unpacked, 5 rounds). Where
 * `probe` is set (wire_pack's), the first window in the band tries the
 * other way for a window and keeps whichever of the two stepped faster;
 * later windows in the band keep the way (comparing a new window with
 * the other way's old one compared noise: in the lab it flipped back
 * and forth on 4.0 against 4.5 ms). overlap's keeps the ratio's rule:
 * its two ways differ there by less than a window's noise (above). */
#ifndef PSTRAIN_CLUSTER_AUTOFLOW_H
#define PSTRAIN_CLUSTER_AUTOFLOW_H

#include <stdio.h>

#define AUTOFLOW_SKIP 10      /* steps not timed at the start and after a switch */
#define AUTOFLOW_WINDOW 20    /* steps a decision looks at */
#define AUTOFLOW_ON 3.0       /* off: switch on when exchange > 3 x compute */
#define AUTOFLOW_OFF 1.0      /* on: switch off when exchange < compute */
#define AUTOFLOW_SWITCHES 4   /* then keep the way */

struct autoflow {
	int mode;      /* CONFIG_OVERLAP_{OFF,ON,AUTO} */
	int on;        /* whether the next step pushes while computing */
	int skip;      /* steps still to leave out */
	int n;         /* steps in the window */
	int switches;
	int windows;   /* decisions made */
	int probe;     /* in the band, try both ways and keep the faster (above) */
	int probed;    /* the band's trial has been made */
	int trying;    /* the way now was switched to to be measured */
	int by_time;   /* the last decision compared the ways' steps */
	double ratio;  /* the last window's median exchange / median compute */
	double step[2]; /* the last window's median compute + median exchange, off and on (0: none) */
	double compute[AUTOFLOW_WINDOW], exchange[AUTOFLOW_WINDOW]; /* seconds */
};

/* mode from [cluster] overlap or wire_pack: on and off are fixed; auto
 * starts off, probe 0 (the caller sets it). */
void autoflow_init(struct autoflow *a, int mode);

/* Whether the next step pushes while computing. */
static inline int autoflow_wants(const struct autoflow *a)
{
	return a->on;
}

/* What a step's record decided, for the log. */
enum autoflow_said {
	AUTOFLOW_QUIET,    /* nothing new */
	AUTOFLOW_KEPT,     /* the first decision, and the way stays */
	AUTOFLOW_SWITCHED, /* a->on says the new way, a->ratio why */
	AUTOFLOW_LAST,     /* switched, and that was the last switch */
	AUTOFLOW_SETTLED,  /* the last switch was due, and the way stays */
	AUTOFLOW_TRYING,   /* switched to the way not yet measured (probe) */
	AUTOFLOW_COMPARED, /* a trial's window is in, and the way stays */
};

/* A step took compute seconds, then exchange seconds (pushing, and
 * waiting for the new parameters). */
enum autoflow_said autoflow_record(struct autoflow *a, double compute, double exchange);

/* What a's record decided at step (nothing if said is quiet), one line to
 * out for worker `index`'s [cluster] key: its ratio, and the way it now
 * goes, on or off. */
void autoflow_say(const struct autoflow *a, FILE *out, int index, const char *key, enum autoflow_said said,
		  long step, const char *on, const char *off);

#endif
