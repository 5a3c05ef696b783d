/* A ps shard's disk side (docs/CHECKPOINTS.md): resuming from the newest
 * complete checkpoint at start, CHECKPOINT (a copy of the shard queued
 * under the ps's lock, written by a writer thread without it, so pushes,
 * pulls and heartbeats never wait for a disk), and ROLLBACK to a step.
 *
 * The store shares the ps's mutex: it guards the shard and everything
 * here. Functions marked "under mu" expect the caller to hold it. */
#ifndef PSTRAIN_CLUSTER_PS_STORE_H
#define PSTRAIN_CLUSTER_PS_STORE_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "../core/ckpt/checkpoint.h"
#include "../core/config/config.h"
#include "../core/nn/model.h"
#include "psshard.h"

#define PS_STORE_QUEUE_MAX 8 /* copies of its shard a ps holds for its writer at most */

struct ps_snap {
	uint64_t step;
	float *p, *m, *v; /* (n) each; m, v NULL as in the optimizer */
	long t;
	float *rt, *rm, *rv; /* the embedding rows' copy ((r1 - r0) x DIM each; NULL: none) */
	long rt_t;           /* their sparse optimizer's steps */
	double acc;       /* the run's final test accuracy, < 0: none (not the final checkpoint) */
};

struct psrows;
struct ps_store {
	pthread_mutex_t *mu;      /* the ps's */
	struct psshard *sh;
	struct psrows *rows;      /* the embedding rows it holds (cluster/psrows.h); NULL: none */
	const struct model *m;
	const struct config *c;
	FILE *out;
	int index;
	struct ckpt_layout *lay;  /* NULL: checkpoints off */
	uint64_t pending;         /* CHECKPOINT step not reached yet; 0: none */
	double pending_acc;       /* its accuracy (ps_store_checkpoint) */
	struct ps_snap q[PS_STORE_QUEUE_MAX]; /* copies waiting for the writer, oldest first */
	uint64_t saved_self;      /* sync with backup workers: the newest multiple of
				   * checkpoint_every this ps saved on its own */
	int qlen, qcap;           /* qcap: min(keep_checkpoints, PS_STORE_QUEUE_MAX) */
	uint64_t last;            /* the newest step written whole or resumed from */
	int has_last;
	pthread_t writer;
	pthread_cond_t wcv;       /* a copy queued, or wstop */
	int writer_on, wstop;
};

/* Sets up the checkpoint layout and, unless fresh, puts the shard at the
 * newest complete checkpoint, written by any layout and either mode
 * (docs/CHECKPOINTS.md): its version becomes the checkpoint's step, times
 * the workers in async mode, where versions count pushes; then starts the
 * writer. A checkpoint at or past the run's end is logged as a finished
 * run. With checkpoint_dir empty there is nothing to do. On failure st is
 * left for ps_store_close. */
int ps_store_open(struct ps_store *st, pthread_mutex_t *mu, struct psshard *sh, struct psrows *rows,
		  const struct model *m, const struct config *c, int index, int fresh, FILE *out,
		  char *err, size_t errlen);

/* Writes the copies still queued (the last checkpoint asked for is written
 * before the ps exits), stops the writer and frees. Accepts a zeroed st. */
void ps_store_close(struct ps_store *st);

/* CHECKPOINT(step) from the chief; takes mu. acc: the run's final test
 * accuracy, which the final checkpoint records (< 0: none). */
void ps_store_checkpoint(struct ps_store *st, uint64_t step, double acc);

/* After a push (under mu): saves the checkpoint waiting for this version;
 * with backup workers, each multiple of checkpoint_every it reaches. */
void ps_store_pushed(struct ps_store *st);

/* The newest checkpoint step this ps wrote whole (its shard file and
 * everything it writes), or resumed from, in *step: 1, or 0 if none
 * (under mu). Whether the other shards of that step are complete is
 * theirs to say. */
int ps_store_last(const struct ps_store *st, uint64_t *step);

/* ROLLBACK(*step) (under mu): restores checkpoint *step into the shard
 * (0: the initial parameters) and rewinds it there. Async: the newest
 * complete checkpoint at or below *step, which *step becomes. Returns 1 if
 * the shard was already there (it keeps what it has), 0 when rolled back,
 * or a negative errno with err, the shard untouched: -ENOENT (no
 * checkpoint of that step, or checkpoints are off), -EINVAL (it exists
 * but does not load), -ENOMEM (no room for the scratch copy the
 * checkpoint is loaded into before it replaces the shard). */
int ps_store_rollback(struct ps_store *st, uint64_t *step, char *err, size_t errlen);

#endif
