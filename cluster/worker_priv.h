/* The worker role's state and the functions its two files share:
 * worker.c (opening, the training loop) and worker_end.c (the end of a
 * run: the chief's final evaluation and checkpoint, DONE, and a lost ps
 * met meanwhile). Private to them. */
#ifndef PSTRAIN_WORKER_PRIV_H
#define PSTRAIN_WORKER_PRIV_H

#include "../core/nn/factors.h"
#include "../base/hooks.h"
#include "autoflow.h"
#include "links.h"
#include "role.h"
#include "view.h"
#include "worker_embed.h"

#include "../core/nn/devices.h"
#include "../core/nn/gradflow.h"
#include "../core/progress.h"
#include "../core/tblog.h"
#include "../core/train.h"

#include <signal.h>
#include <stdio.h>

/* Where a worker is with the step it trains next (wr->step). */
enum step_phase {
	STEP_UNPULLED,  /* its parameters are still at the shards: pull first */
	STEP_PULLED,    /* they are on the devices (the last exchange, or a recovery) */
	STEP_FORWARDED, /* and its forward pass ran while they arrived (worker_preforward) */
	STEP_COMPUTING, /* its gradient is being made: the devices hold no next step's yet */
};

/* How one step's gradient goes up (worker_way). */
enum step_way {
	WAY_PUSH,         /* after the compute, and no parameters come back: the
			   * last step of a worker other than the chief */
	WAY_AFTER,        /* after the compute, the next parameters coming back */
	WAY_FLOW,         /* piece by piece while backward makes them final */
	WAY_FLOW_FORWARD, /* and the next step's forward pass runs as its
			   * parameters arrive */
};

struct worker {
	const struct config *c;
	const volatile sig_atomic_t *stop;
	FILE *out;
	struct role_setup s;
	struct test_hooks hooks;     /* base/hooks.h */
	struct devices dev;
	struct links lk;
	struct worker_embed *emb; /* the embedding layer's rows (NULL: none) */
	struct gradflow flow;    /* the gradient as backward makes it final */
	struct gradflow pflow;   /* the next step's parameters as they arrive */
	struct factors fx;       /* the runs a step sends as factors (flow.fx; core/nn/factors.h) */
	int preforward;          /* the next step's forward pass may wait on pflow */
	enum step_phase phase;   /* what the devices hold for wr->step */
	double t_pre;            /* a forward pass run early: its compute, not its waits (seconds) */
	double t_rows;           /* the step's seconds in its rows' links' calls: communication,
				  * though worker_compute waits for them */
	long preforwarded;       /* steps whose forward pass ran so */
	struct autoflow af;      /* whether a step does */
	struct autoflow packf;   /* whether float32 goes packed to other hosts ([cluster] wire_pack) */
	struct progress pg;
	float *params, *grads;   /* (P) */
	int own_host;            /* params and grads are separate host copies */
	uint32_t *perm;          /* (n) the epoch's order */
	int index, chief, W, B, ckpts, tty;
	int S;                   /* slices of a step (config_slices) */
	int nmine, mine[VIEW_MAX]; /* this worker's slices, in slice order (cluster/view.h) */
	int elastic, live;       /* config_elastic; the workers in the step's view */
	int left;                /* elastic: it left after a SIGTERM (LEAVE said, last slices pushed) */
	long total, spe;
	long step, start;        /* the step to train next; where training (re)started */
	long ckpt_at, ckpt_start; /* sync: the step of the last CHECKPOINT asked for since
				   * training (re)started at ckpt_start */
	long epoch_loaded;
	int finished;            /* the shards were at the run's end when it started */
	double t_compute, t_comm; /* seconds in worker_compute; in pulls and pushes */
	long timed;              /* steps counted in them */
	struct tblog tb;         /* the chief's TensorBoard events ([train] log_dir) */
	double tb_compute, tb_comm; /* t_compute, t_comm at the last event */
	long tb_timed;
};

/* worker.c */
int worker_pull(struct worker *wr, char *err, size_t errlen);
/* The loop's recovery from a lost ps: the shards resynced, *at the step
 * to go on from, the parameters on the devices. */
int worker_recover(struct worker *wr, long *at, char *err, size_t errlen);
int worker_meter_line(struct worker *wr, char *err, size_t errlen);
void worker_log_eval(struct worker *wr, long step);
long ckpt_label(const struct worker *wr, long step);

/* worker_end.c: after the last step (cluster_worker's loop). */
int worker_final(struct worker *wr, const char *dump, struct train_result *res, int *again, char *err,
		 size_t errlen);
int worker_found_finished(struct worker *wr, struct train_result *res, char *err, size_t errlen);
int worker_finish(struct worker *wr, int *again, char *err, size_t errlen);

#endif
