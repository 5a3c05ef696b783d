/* A ps's apply pool ([ps] apply_threads): in sync piece mode the
 * optimizer's step over each piece a PUSH completes runs on a pool of
 * long-lived threads, so that a connection's thread goes on reading the
 * next pieces while earlier ones are stepped, and several pieces are
 * stepped at once. One thread (the default on 2 CPUs) steps each piece on
 * the connection's thread as before. A GPU worker beside its ps waited
 * 7.6 ms a step for its CNN's 13 MB to be stepped on one CPU thread
 * (docs/BENCHMARKS.md, "GPU workers beside their ps").
 *
 * Each piece's job is the connection's (one slot a piece, reused every
 * push); the connection waits for its jobs before it ACKs a PUSH or ends,
 * and everything that reads or rewinds the whole shard waits for every
 * job (ps_apply_settle). The math runs without ps->mu (psshard.h,
 * psshard_push_piece_owed), the bookkeeping and the wake-ups under it.
 * Only for ps.c, ps_push.c and ps_pull.c. */
#ifndef PSTRAIN_CLUSTER_PS_APPLY_H
#define PSTRAIN_CLUSTER_PS_APPLY_H

#include "psshard.h"

#include <stddef.h>

struct ps;
struct ps_conn;
struct config;

/* The thread count for [ps] apply_threads (0: automatic): half the CPUs
 * this process may use, shared by the ps [cluster] lists under this ps's
 * host name, at most 8, and 1 (inline) where that is under 4. */
int ps_apply_threads_for(const struct config *c, int index);

/* Starts the pool where the shard is in piece mode and the count is
 * above 1 (ps->applier stays NULL otherwise). 0, or a negative errno
 * with one line in err. */
int ps_apply_open(struct ps *ps, char *err, size_t errlen);
void ps_apply_close(struct ps *ps); /* after every connection ended */

/* A connection's job slots, one a piece: 0 or -ENOMEM. Freeing waits for
 * its jobs first. */
int ps_apply_conn_init(struct ps_conn *cn);
void ps_apply_conn_free(struct ps_conn *cn);

/* Queues the step psshard_push_piece_owed left owed (o->g must stay valid
 * until the job has run), on the connection's thread without ps->mu; the
 * caller counted it in ps->applying under ps->mu when it was owed. */
void ps_apply_submit(struct ps_conn *cn, const struct psshard_owed *o);

/* Waits (without ps->mu) until every job this connection queued has run. */
void ps_apply_wait_conn(struct ps_conn *cn);

/* Waits (under ps->mu, which it releases while waiting) until no job of
 * any connection is queued or running. */
void ps_apply_settle(struct ps *ps);

#endif
