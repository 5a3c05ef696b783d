/* The distributed roles: `pstrain ps --index N` serves one shard of the
 * parameter vector, `pstrain worker --index N` trains against every shard
 * (DESIGN §5–7, docs/PROTOCOL.md). Both read the same cluster.ini; sockets,
 * handshake, frames and messages come from net/, the shard's update rules
 * from core/psshard.c and the step from core/devices.c. This header is
 * the roles' whole API: only main.c includes anything from cluster/.
 *
 * Batches: at step s of epoch e every worker takes the epoch's permutation
 * (data_permute(seed, e), as `local` does) and worker w uses samples
 * [(s mod spe)·W·B + w·B, +B) of it, spe = floor(n / (W·B)). The W batches of
 * one step are disjoint and together are exactly `local`'s batch of W·B at
 * that step, so sync mode with replicas_to_aggregate = W computes what
 * `local` computes with batch W·B (up to float summation order).
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

#include "../core/config.h"
#include "../core/train.h"

/* Checkpoints (docs/CHECKPOINTS.md): unless fresh, the ps starts from its
 * shard of the newest complete checkpoint in [train] checkpoint_dir
 * (version = its step; in async mode the step is the chief's label), and
 * saves its shard when the chief sends CHECKPOINT, from a writer thread.
 * Workers need no checkpoint: they continue from the version the shards
 * report (sync: the same on every shard; async: the lowest, divided by
 * the number of workers). */
int cluster_ps(const struct config *c, int index, int fresh, FILE *out,
	       const volatile sig_atomic_t *stop, char *err, size_t errlen);

/* res: the final evaluation (the chief evaluates; other workers leave
 * test_loss and test_acc at 0). dump: if not NULL, the chief writes the
 * final parameter vector there as raw host-order float32 (for tests). */
int cluster_worker(const struct config *c, int index, FILE *out, int tty,
		   const volatile sig_atomic_t *stop, const char *dump, struct train_result *res,
		   char *err, size_t errlen);

#endif
