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
	long steps_seen;      /* progress_tick calls: a resumed run starts far past step 0 */
	long absorbed;        /* steps whose figures the running loss/accuracy hold */
	long pending;         /* steps ticked since the last progress_step */
	double loss;          /* running train loss and accuracy (recent batches) */
	double acc;
	double test_loss, test_acc;
	int have_test;
	int binary;           /* a click-through model's: test log loss and AUC, no accuracy */
	double test_auc;
	unsigned long long stale;   /* cluster: this worker's pushes a shard dropped
				     * as stale; shown when nonzero */
	int drawn;            /* a tty line is on screen */
};

double progress_now(void);
void progress_init(struct progress *p, FILE *f, int tty, long total_steps, long steps_per_epoch);
/* After training step `step` (0-based), which took secs of the host's time
 * (with a GPU, the time to queue it; the queue keeps the two close). */
void progress_tick(struct progress *p, long step, double secs);
/* Whether the tty line is due for a redraw after step: the caller then
 * reads the figures (devices_meter, which waits for the GPU) and calls
 * progress_step. Reading them every step would stall the GPU each step. */
int progress_due(const struct progress *p, long step);
/* The steps ticked since the last call trained `samples` samples with
 * summed loss loss_sum and right_sum right answers: the running loss and
 * accuracy take them in, weighted as that many steps of an exponential
 * average over about 10 steps (so a reading after many steps is about
 * their mean), and a tty line is redrawn. */
void progress_step(struct progress *p, long step, long samples, double loss_sum, double right_sum);
void progress_eval(struct progress *p, long step, double test_loss, double test_acc);
/* A binary model (loss = sigmoid_cross_entropy), after progress_init:
 * its lines show the test log loss and AUC (progress_eval_auc) and no
 * accuracy, which says little where one label is rare; TensorBoard's
 * scalars follow (tblog_eval). */
void progress_set_binary(struct progress *p);
void progress_eval_auc(struct progress *p, long step, double test_logloss, double test_auc);
/* Clears the tty line so the next message starts on a fresh line. */
void progress_clear(struct progress *p);

/* "512 B", "1.3 MiB": a byte count for people. */
void progress_bytes(char *buf, size_t len, double bytes);

#endif
