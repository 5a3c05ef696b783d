/* The distributed roles: `pstrain ps --index N` serves one shard of the
 * parameter vector, `pstrain worker --index N` trains against every shard
 * (DESIGN §5–7, docs/PROTOCOL.md). Both read the same cluster.ini; sockets,
 * handshake, frames and messages come from net/, the shard's update rules
 * from cluster/psshard.c and the step from core/nn/devices.c. This header is
 * the roles' whole API: only main.c includes anything from cluster/.
 * `pstrain status` (observe.c) is here too: it speaks to the ps as an
 * observer.
 *
 * Batches: a step trains S slices of B samples ([train] slices: one per
 * worker unless set; core/job.h says which samples), each worker its
 * share of them (cluster/view.h), each slice's gradient pushed on its own
 * and summed by every ps in slice order. So a sync run computes what
 * `local --set train.slices=S` computes, bit for bit on the same kernels,
 * however many workers there are (docs/ELASTIC.md).
 *
 * Errors: 0 done; else a negative errno with one line in err:
 *   -EINVAL, -ENOENT  config, key or data the user must fix (exit 2)
 *   -ECONNABORTED     a peer failed: unreachable, handshake refused, lost
 *                     mid-run, or it sent something malformed (exit 3)
 *   -EINTR            *stop was set (exit 130)
 *   other             runtime failure (exit 1) */
#ifndef PSTRAIN_CLUSTER_CLUSTER_H
#define PSTRAIN_CLUSTER_CLUSTER_H

#include <signal.h>
#include <stdio.h>

#include "../core/config/config.h"
#include "../core/train.h"

/* Checkpoints (docs/CHECKPOINTS.md): unless fresh, the ps starts from its
 * shard of the newest complete checkpoint in [train] checkpoint_dir
 * (version = its step; in async mode the step is the chief's label), and
 * saves its shard when the chief sends CHECKPOINT, from a writer thread.
 * Workers need no checkpoint: they continue from the version the shards
 * report (sync: the same on every shard; async: the lowest, divided by
 * the slices of a step). */
int cluster_ps(const struct config *c, int index, int fresh, FILE *out,
	       const volatile sig_atomic_t *stop, char *err, size_t errlen);

/* res: the final evaluation (the chief evaluates; other workers leave
 * test_loss and test_acc at 0). dump: if not NULL, the chief writes the
 * final parameter vector there as raw host-order float32 (for tests). */
int cluster_worker(const struct config *c, int index, FILE *out, int tty,
		   const volatile sig_atomic_t *stop, const char *dump, struct train_result *res,
		   char *err, size_t errlen);

/* `pstrain status`: asks every ps of c's [cluster] for its REPORT as an
 * observer (the cluster key's third role: it may only ask, never change
 * anything, and is never counted as a worker) and prints one row per shard
 * to out, or with json one JSON object per round; each ps that did not
 * answer gets a line on errout naming it and why. watch_s > 0: again every
 * watch_s seconds, on the same connections (reconnecting to those that
 * failed), until every ps reports the run complete or its final
 * checkpoint, or *stop is set; a first round that no ps answers ends it
 * as a single round does. 0 when every ps answered (in the last round),
 * -ECONNABORTED when some did not, -EINTR when stopped, -EINVAL for the
 * key. */
int cluster_status(const struct config *c, int json, double watch_s, FILE *out, FILE *errout,
		   const volatile sig_atomic_t *stop, char *err, size_t errlen);

#endif
