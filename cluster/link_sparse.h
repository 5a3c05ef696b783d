/* A worker's exchanges of embedding rows with the ps that hold them
 * (issue 39; the ps's side is ps_sparse.c, the rules psrows.h, the
 * messages net/msg_rows.h): a pull of the rows a batch touches, each ps
 * asked for the ones in its range, and a push of their gradients, each
 * ps given its own. Both go through the links' own threads as one more
 * kind of exchange (link.h's link_ex.rows): link.c's sender calls
 * link_rows_send, its receiver hands ROWS to link_rows_take and reads the
 * ACK of a push as it reads a PUSH's. The fan-out over every ps is
 * links_rows_pull / links_rows_push.
 *
 * Versions: sync asks ps k for the rows at the version of the dense
 * shard last pulled from it (link.got; a ps's rows are at its shard's
 * version or past it once every worker's push of a step is in, since a
 * worker's SPUSH goes on its connection in front of its dense PUSH, and a
 * ps takes a connection's messages in order), and an answer below that
 * went back (a rollback, a
 * restart): the link ends WENT_BACK as for PARAMS; one above it (rows a
 * step on: the others went on without a backup worker, or a step trained
 * again after a lost worker where the ps cannot give the rows as they
 * were, psrows_read_at) makes the push stale. Async asks for the newest.
 * A push is tagged with the version asked for (sync) or that its rows
 * came at (async). A
 * worker's memory is its batch's rows, whatever the tables hold. */
#ifndef PSTRAIN_CLUSTER_LINK_SPARSE_H
#define PSTRAIN_CLUSTER_LINK_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "links.h"
#include "../core/nn/model.h"
#include "../net/msg_rows.h"

enum link_rows_kind {
	LINK_ROWS_PULL, /* SPULL up, ROWS down */
	LINK_ROWS_PUSH, /* SPUSH up, ACK down */
};

/* One link's share of a sparse exchange. */
struct link_rows {
	enum link_rows_kind kind;
	const uint64_t *ids;   /* (n) global rows, ascending, all in the link's range */
	size_t n;
	float *vals;           /* (n, DIM): PULL fills it, PUSH reads it */
	int dim;
	uint8_t dtype;         /* the values' on the wire: PULL, ROWS's; PUSH, SPUSH's ([cluster] wire_dtype) */
	uint64_t version;      /* PULL: asked for (MSG_VERSION_LATEST: the newest); PUSH: its tag */
	int slice;             /* PUSH: the slice of the step its gradient is of */
	uint64_t got;          /* PULL: the version the rows came at */
	struct msg_rows_asm a; /* PULL: the answer as it arrives */
};

/* link.c's, on the link's threads. Send: x's SPULL or SPUSH messages
 * (*lost: the transport failed, else the messages did not encode).
 * Take: one ROWS message (len bytes in msg) of x's answer: 1 when the
 * answer is complete, 0 when more is due, or a negative errno with the
 * reason in err. Whether x waits for ROWS still. */
int link_rows_send(struct link *l, struct link_rows *x, int *lost, char *err, size_t errlen);
int link_rows_take(struct link_rows *x, const uint8_t *msg, size_t len, char *err, size_t errlen);
int link_rows_waiting(const struct link_rows *x);

/* A worker's fan-out: which ps holds which rows (shard_plan over the
 * tables' R rows, as psrows.h says), each link's share, and the version
 * of the rows last pulled from each ps. */
struct links_rows {
	int nps, dim;
	uint8_t param_dt, grad_dt; /* ROWS's and SPUSH's values on the wire (role_param_dtype...) */
	uint64_t *rb;          /* (nps + 1) ps k holds rows [rb[k], rb[k + 1]) */
	struct link_rows *x;   /* (nps) */
	uint64_t *tag;         /* (nps) each ps's push tag: sync, the version asked
				* for; async, the one the rows came at */
};

int links_rows_open(struct links_rows *lr, const struct config *c, const struct model *m, char *err,
		    size_t errlen);
void links_rows_close(struct links_rows *lr); /* accepts a zeroed struct */

/* The values of rows (u, ascending, distinct) into U (u, DIM), each ps
 * asked for its own (every ps is asked, for none of its rows too: a sync
 * pull is where a worker learns the rows' version). The links' call
 * rules (links.h): -ECONNABORTED with lk->lost set for a lost link or a
 * shard that went back. */
int links_rows_pull(struct links *lk, struct links_rows *lr, const uint64_t *rows, size_t u, float *U,
		    char *err, size_t errlen);
/* Slice `slice`'s gradient dU (u, DIM) of rows (u) to the ps that hold
 * them, each push tagged as lr->tag says (sync: the version the last pull
 * asked that ps for; async: the one its rows came at), every ACK read (stale ones counted). Every ps gets one, with none of
 * its rows too: a sync ps steps its rows once every slice's is in. */
int links_rows_push(struct links *lk, struct links_rows *lr, int slice, const uint64_t *rows, size_t u,
		    const float *dU, char *err, size_t errlen);
/* The same push, staged to go with the next exchange that pushes a
 * gradient (links_exchange_begin, links_exchange): each link sends its
 * SPUSH first and reads both ACKs, a round trip a step fewer than
 * links_rows_push then the exchange. rows and dU must last until then. */
void links_rows_stage(struct links *lk, struct links_rows *lr, int slice, const uint64_t *rows, size_t u,
		      const float *dU);

/* Sync: the next step's rows (u, ascending, distinct), pulled into U
 * (u, DIM) in the next exchange that pushes a gradient, after its PUSH,
 * from each ps at the version that exchange pulls (each link's got + 1,
 * as link_ask asks): the ps answers once the step's rows are in, while
 * the dense shard still streams, so the next step starts with its rows
 * and a round trip fewer. ahead is links_rows_open's, not lr's: an
 * evaluation's pulls use lr in between. rows and U must last until the
 * next step takes them (links_rows_ahead_took). */
void links_rows_ahead(struct links *lk, struct links_rows *ahead, const uint64_t *rows, size_t u, float *U);
/* Whether ahead's rows came whole, each ps's at the version of the
 * parameters now pulled from it (an exchange that failed, a recovery,
 * shards that went on without this worker: not): then lr's push tags are
 * theirs, as links_rows_pull would have set them, and 1. */
int links_rows_ahead_took(const struct links *lk, const struct links_rows *ahead, struct links_rows *lr);

#endif
