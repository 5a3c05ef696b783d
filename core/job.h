/* What every process derives from the config before it trains or serves:
 * the model, the data, whether they fit each other, the steps per epoch,
 * the steps of the run, and which samples a step's batch is. `local`
 * (core/train.c), the ps and the worker (cluster/) all start here, so a
 * step means the same thing everywhere.
 *
 * Batches: at step s of epoch e = s / spe every process takes the epoch's
 * permutation (data_permute(seed, e)); worker w of W uses samples
 * [(s mod spe)·W·B + w·B, +B) of it, spe = floor(n / (W·B)). `local` is
 * W = 1. The W batches of one step are disjoint and together are exactly
 * `local`'s batch of W·B at that step.
 *
 * A streamed training set (data_load_train: a Criteo file larger than
 * max_resident_mb) has no permutation of all n samples in memory: the
 * epoch's order is its windows' in file order, each shuffled within
 * (stream.h), and positions count within the window, which is a whole
 * number of steps long. train is then the window the current step reads;
 * job_slice says when that changes and job_order puts the next one in
 * place. Unstreamed, a slice is an epoch and job_order is data_permute. */
#ifndef PSTRAIN_JOB_H
#define PSTRAIN_JOB_H

#include <stddef.h>

#include "config/config.h"
#include "data/data.h"
#include "data/stream.h"
#include "nn/model.h"

struct job {
	struct model m;
	struct dataset train, test; /* empty when not loaded (want_data 0);
				     * train is a window when streamed */
	struct stream stream;       /* the training file, when streamed */
	int streamed;
	size_t n;                   /* training samples in all */
	int W, B;                   /* workers (1 for local), batch per worker */
	long spe;                   /* steps per epoch; 0 without data */
	long spw;                   /* steps per window: spe unless streamed */
	long total;                 /* steps the run trains */
	int borrowed;               /* the sets are the caller's (job_load_sets) */
};

/* Builds the model and, unless want_data is 0 and [train] steps is set
 * (a ps needs the data only for the step count its lr schedule runs
 * over), loads the data and checks that it fits the model and one step of
 * W batches. Returns 0, -EINVAL for anything the user must fix (a data
 * file that cannot be used, whatever the errno), -ENOMEM or -EIO, with
 * one line in err. On failure j is left for job_free. */
int job_load(struct job *j, const struct config *c, int W, int want_data, char *err,
	     size_t errlen);
/* job_load (W = 1) with sets already in memory in place of the config's
 * [data] files: train and test are copied by value and borrowed, so
 * job_free leaves their buffers alone; the same checks of fit. */
int job_load_sets(struct job *j, const struct config *c, const struct dataset *train,
		  const struct dataset *test, char *err, size_t errlen);
void job_free(struct job *j); /* accepts a zeroed struct */

/* The position in the epoch's order (a streamed set: in its window's) of
 * the first sample of worker w's batch at step. */
size_t job_batch_at(const struct job *j, long step, int w);

/* Which part of the run's order step is in: its epoch, or (streamed) its
 * epoch and window. When it changes, job_order must run before the step. */
long job_slice(const struct job *j, long step);

/* step's order into perm (train.n entries, at most the n of the first
 * train this job loaded), after its window into train when streamed.
 * Returns 0 or a negative errno with one line in err. */
int job_order(struct job *j, long step, uint64_t seed, uint32_t *perm, char *err, size_t errlen);

#endif
