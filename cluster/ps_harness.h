/* A ps without a listener or threads, for the stateful fuzzer
 * (tests/fuzz/fuzz_ps.c): the real ps state and message handlers, driven
 * one connection at a time on the caller's thread. Not used by the binary.
 *
 * A connection is handed over already authenticated (the caller made the
 * keys), as the ps's gate would after a handshake, or as the greeting the
 * gate would hand out (ps_harness_greet: the ps's own admission, replay
 * checks and observer slots included); everything after that is the
 * production path: key confirmation, every handler, ERROR replies, the
 * shard's updates and checkpoints. */
#ifndef PSTRAIN_CLUSTER_PS_HARNESS_H
#define PSTRAIN_CLUSTER_PS_HARNESS_H

#include <stdint.h>
#include <stdio.h>

#include "../core/config/config.h"
#include "../net/handshake.h"

struct ps_harness;

/* The ps of config c's shard `index`, fresh (no checkpoint loaded), logging
 * to log. Errors as cluster_ps's start-up. */
int ps_harness_open(struct ps_harness **h, const struct config *c, int index, FILE *log,
		    char *err, size_t errlen);

/* Serves fd (a connected stream socket, now the ps's) as a connection that
 * greeted as worker w with hr's keys, until it ends (the peer closes, an
 * error, a timeout). Returns what serving it returned: 0 or a negative
 * errno; either is fine, the ps must only stay sound (ps_harness_check).
 * Several may run at once, each on a thread of the caller's (an elastic
 * ps's workers). */
int ps_harness_serve(struct ps_harness *h, int fd, const struct hs_result *hr, int w);

/* The accept loop's round, which the harness has no loop for: a worker
 * lost past peer_timeout dropped (elastic, with min_workers others) or,
 * too few left, the ps stopped, as the real ps decides on its own clock
 * (such a stop is no peer's doing: ps_harness_check allows it). Returns
 * whether the ps is over. Call it while connections wait on a worker
 * that is gone. */
int ps_harness_tick(struct ps_harness *h);

/* A whole greeting (hello) that arrived on fd, a connected stream socket
 * now the ps's, handed to the ps's admission as its gate hands one out:
 * answered (HELLO2 written to fd, then the connection served on a thread
 * of its own, a worker's or an observer's) or refused, unanswered (fd held
 * until ps_harness_close, counted in the gate's tally). */
void ps_harness_greet(struct ps_harness *h, int fd, const uint8_t hello[HS_HELLO_BYTES]);

/* Waits until every connection ps_harness_greet started has ended: each
 * ends when its peer closes or shuts its writing half, or at a deadline. */
void ps_harness_settle(struct ps_harness *h);

/* The invariants a key holder cannot break: every parameter and embedding
 * row finite, the ps not stopped by a peer (only by a worker's deadline,
 * ps_harness_tick), no connection left behind. 0, or a negative errno
 * with the broken one in err. */
int ps_harness_check(struct ps_harness *h, char *err, size_t errlen);

void ps_harness_close(struct ps_harness *h);

#endif
