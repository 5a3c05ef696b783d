/* Progress display for training. On a terminal: one line redrawn in place
 * (at most ~8 times a second) with step/total, epoch, loss, accuracy,
 * samples/s, elapsed and ETA. Elsewhere (logs, pipes): one plain line per
 * evaluation, so logs stay readable. */
#ifndef PSTRAIN_PROGRESS_H
#define PSTRAIN_PROGRESS_H

#include <stdio.h>

struct progress {
	FILE *f;
	int tty;
	int width;            /* terminal columns to stay within, 0 = unknown */
	long total_steps;
	long steps_per_epoch;
	double t0;            /* start, seconds on the monotonic clock */
	double train_time;    /* seconds spent in training steps (not eval) */
	double last_draw;
	long samples;         /* trained so far */
	long steps_seen;      /* progress_step calls: a resumed run starts far past step 0 */
	double loss;          /* running train loss and accuracy (recent batches) */
	double acc;
	double test_loss, test_acc;
	int have_test;
	unsigned long long stale;   /* cluster: this worker's pushes a shard dropped
				     * as stale; shown when nonzero */
	int drawn;            /* a tty line is on screen */
};

double progress_now(void);
void progress_init(struct progress *p, FILE *f, int tty, long total_steps, long steps_per_epoch);
/* After training step `step` (0-based) of B samples that took `secs`. */
void progress_step(struct progress *p, long step, int B, double secs, double loss, double acc);
void progress_eval(struct progress *p, long step, double test_loss, double test_acc);
/* Clears the tty line so the next message starts on a fresh line. */
void progress_clear(struct progress *p);

/* "512 B", "1.3 MiB": a byte count for people. */
void progress_bytes(char *buf, size_t len, double bytes);

#endif
