/* What every process derives from the config before it trains or serves:
 * the model, the data, whether they fit each other, the steps per epoch,
 * the steps of the run, and which samples a step's batch is. `local`
 * (core/train.c), the ps and the worker (cluster/) all start here, so a
 * step means the same thing everywhere.
 *
 * Batches: a step trains a global batch of S slices of B samples ([train]
 * slices, config_slices; B = batch_size). At step t of epoch e = t / spe
 * every process takes the epoch's permutation (data_permute(seed, e)),
 * and slice s is samples [(t mod spe)·S·B + s·B, +B) of it, spe =
 * floor(n / (S·B)): a function of the step and the slice only, never of
 * which process trains it or how many there are (docs/ELASTIC.md). The S
 * slices of one step are disjoint and together are exactly the S·B
 * samples of that step.
 *
 * A streamed training set (data_load_train: a Criteo file larger than
 * max_resident_mb) has no permutation of all n samples in memory: the
 * epoch's order is its windows' in file order, each shuffled within
 * (stream.h), and positions count within the window, which is a whole
 * number of steps long. train is then the window the current step reads;
 * job_part says when that changes and job_order puts the next one in
 * place. Unstreamed, a part is an epoch and job_order is data_permute. */
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
	int S, B;                   /* slices of a step, samples per slice */
	long spe;                   /* steps per epoch; 0 without data */
	long spw;                   /* steps per window: spe unless streamed */
	long total;                 /* steps the run trains */
	int borrowed;               /* the sets are the caller's (job_load_sets) */
};

/* Builds the model and, unless want_data is 0 and [train] steps is set
 * (a ps needs the data only for the step count its lr schedule runs
 * over), loads the data and checks that it fits the model and one step of
 * S slices. With want_data 0 the sets are freed again once counted: n,
 * spe, spw and total stay, train and test are empty. Returns 0, -EINVAL
 * for anything the user must fix (a data file that cannot be used,
 * whatever the errno), -ENOMEM or -EIO, with one line in err. On failure j is left for job_free. */
int job_load(struct job *j, const struct config *c, int S, int want_data, char *err,
	     size_t errlen);
/* job_load (S: `local`'s config_slices) with sets already in memory in place of the config's
 * [data] files: train and test are copied by value and borrowed, so
 * job_free leaves their buffers alone; the same checks of fit. */
int job_load_sets(struct job *j, const struct config *c, const struct dataset *train,
		  const struct dataset *test, char *err, size_t errlen);
void job_free(struct job *j); /* accepts a zeroed struct */

/* The position in the epoch's order (a streamed set: in its window's) of
 * the first sample of slice s (0..S-1) of step. */
size_t job_slice_at(const struct job *j, long step, int s);

/* Which part of the run's order step is in: its epoch, or (streamed) its
 * epoch and window. When it changes, job_order must run before the step. */
long job_part(const struct job *j, long step);

/* step's order into perm (train.n entries, at most the n of the first
 * train this job loaded), after its window into train when streamed.
 * Returns 0 or a negative errno with one line in err. */
int job_order(struct job *j, long step, uint64_t seed, uint32_t *perm, char *err, size_t errlen);

#endif
