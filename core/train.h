/* Training in one process (`pstrain local`): data, model, replica and
 * optimizer wired into the step loop, with evaluation and progress. */
#ifndef PSTRAIN_TRAIN_H
#define PSTRAIN_TRAIN_H

#include <signal.h>
#include <stdio.h>

#include "config/config.h"

struct train_result {
	long steps;             /* steps completed */
	long total_steps;
	double test_loss;       /* a binary model's: the log loss (metrics.h) */
	double test_acc;        /* in [0,1] */
	int binary;             /* loss = sigmoid_cross_entropy: test_auc is its ROC AUC */
	double test_auc;        /* NaN for other models */
	double wall;            /* seconds, start to end including evaluation */
	double samples_per_s;   /* training steps only */
	int stopped;            /* ended early because *stop was set */
	long start_step;        /* step the run resumed from (0 when fresh) */
	int finished;           /* it resumed at or past its end: nothing trained, said so */
};

/* Trains as the config says. `stop` is polled between steps (set from a
 * signal handler). Returns 0 when done or stopped early (res->stopped; the
 * result still holds a final evaluation), -EINVAL for bad input (a data
 * file that cannot be used, a model that does not fit the data), other
 * negative errnos for runtime failures; the message is in err. Progress
 * goes to out; tty selects the redrawn line. */
int train_local(const struct config *c, FILE *out, int tty, const volatile sig_atomic_t *stop,
		struct train_result *res, char *err, size_t errlen);

/* Checkpointing for train_run: what `pstrain local` passes. */
struct train_ckpt {
	const char *dir;   /* checkpoint_dir; "" = neither resume nor save */
	int fresh;         /* --fresh: start from scratch even if dir holds checkpoints */
	const char *intro; /* a line said just before training starts (main's BLAS
			    * kernels), not for a finished run; NULL: none */
	const char *dump;  /* --dump-params (test builds): after the last step the
			    * parameters, then an embedding's tables, as raw
			    * host-order float32 go there; NULL: none */
};

/* train_local with checkpoints (ck may be NULL: none; that is train_local,
 * which library callers and tests use so nothing lands on disk). Unless
 * fresh, the run resumes from the newest usable checkpoint in ck->dir:
 * weights, optimizer state and the step, so the lr schedule and the data
 * order (a function of seed and epoch) continue where they stopped. It
 * saves every [train] checkpoint_every steps (a failure there is reported
 * on out and training goes on) and once at the end or when stopped (a
 * failure there is an error). A checkpoint dir whose checkpoints are all
 * refused is -EINVAL: starting over silently would lose the run. */
int train_run(const struct config *c, const struct train_ckpt *ck, FILE *out, int tty,
	      const volatile sig_atomic_t *stop, struct train_result *res, char *err, size_t errlen);

/* train_local on sets already in memory instead of the config's [data]
 * files (a program that makes its own data; the tests' synthetic
 * click-through sets): the config's model and [train] keys as for
 * train_local, no checkpoints. train and test are borrowed, not freed;
 * they must fit the model as a loaded set must (job.h). */
int train_sets(const struct config *c, const struct dataset *train, const struct dataset *test,
	       FILE *out, const volatile sig_atomic_t *stop, struct train_result *res, char *err,
	       size_t errlen);

#endif
