/* A worker's embedding layer (issue 39): its devices hold a batch's rows,
 * never the tables, which the ps hold by row (link_sparse.h). Before a
 * step's compute the batch's unique rows are pulled from the ps that hold
 * them onto the devices; after it their gradient rows are staged to go up
 * with the dense gradient, first, in the same exchange; an evaluation
 * pulls each chunk's rows. In sync, where nothing comes between two steps
 * (worker.c decides), the next step's rows are pulled in that exchange
 * too, after its PUSH. The worker's loop calls these at those points and
 * nothing else changes: the dense exchange is the one a model without an
 * embedding has, with the rows' SPUSH in front and their SPULL behind. */
#ifndef PSTRAIN_CLUSTER_WORKER_EMBED_H
#define PSTRAIN_CLUSTER_WORKER_EMBED_H

#include <stddef.h>
#include <stdio.h>

#include "link_sparse.h"
#include "links.h"
#include "../core/nn/devices.h"

struct worker_embed;

/* For a model with an embedding layer (else *we stays NULL, 0): the
 * devices' layer without tables (devices_embed_open_remote), its
 * evaluations' rows pulled over lk, and which ps holds which rows. Before
 * the overlap is decided (the flow refuses an embedding). */
int worker_embed_open(struct worker_embed **we, int index, struct devices *dev, struct links *lk,
		      const struct config *c, const struct model *m, char *err, size_t errlen);
void worker_embed_close(struct worker_embed *we); /* accepts NULL */

/* The rows of step's batch order[first .. first + B) onto the devices,
 * for the devices_step of that very batch: none to pull where the last
 * exchange brought them (worker_embed_ahead) at the version it pulled. A
 * link's failure is the links' (lk->lost set for a lost one). */
int worker_embed_pull(struct worker_embed *we, long step, size_t first, int B, double *waited, char *err,
		      size_t errlen);
/* Sync, after step - 1's compute: step's batch planned on the devices and
 * its rows staged to be pulled in the exchange that pushes step - 1's
 * gradient (links_rows_ahead), for worker_embed_pull to find. -EINVAL
 * for a batch the devices refuse, with one line. */
int worker_embed_ahead(struct worker_embed *we, long step, size_t first, int B, char *err, size_t errlen);
/* Whatever an exchange that failed brought ahead is not to be used: a
 * recovery may give the same version other rows. Accepts NULL. */
void worker_embed_forget(struct worker_embed *we);
/* At the end: of the steps' rows pulled, how many came ahead. */
void worker_embed_say(const struct worker_embed *we, FILE *out);
/* After that step: its gradient rows, checked finite (-EDOM with the
 * worker's line otherwise, as for the dense gradient: step names it), to
 * the ps as slice `slice`'s: staged for the next exchange that pushes a
 * gradient (links_rows_stage), or with now pushed at once, every ACK
 * read (a link's failure is the links', as for a pull). Both add to
 * *waited the seconds spent in the links' calls: the step's waits on its
 * links, not its compute. */
int worker_embed_push(struct worker_embed *we, long step, int slice, int now, double *waited, char *err,
		      size_t errlen);

/* --dump-params (test builds): the n parameters at params, then, with
 * an embedding (we not NULL), every row of the tables as the ps hold
 * them now, (R, DIM) float32 in host order, pulled a batch's worth at a
 * time. */
int worker_dump(const char *path, const float *params, size_t n, struct worker_embed *we, char *err,
		size_t errlen);

#endif
