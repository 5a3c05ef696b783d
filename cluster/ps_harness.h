/* A ps without a listener or threads, for the stateful fuzzer
 * (tests/fuzz/fuzz_ps.c): the real ps state and message handlers, driven
 * one connection at a time on the caller's thread. Not used by the binary.
 *
 * The connection is handed over already authenticated (the caller made
 * the keys), as the ps's gate would after a handshake; everything after
 * that is the production path: key confirmation, every handler, ERROR
 * replies, the shard's updates and checkpoints. */
#ifndef PSTRAIN_CLUSTER_PS_HARNESS_H
#define PSTRAIN_CLUSTER_PS_HARNESS_H

#include <stdio.h>

#include "../core/config.h"
#include "../net/handshake.h"

struct ps_harness;

/* The ps of config c's shard `index`, fresh (no checkpoint loaded), logging
 * to log. Errors as cluster_ps's start-up. */
int ps_harness_open(struct ps_harness **h, const struct config *c, int index, FILE *log,
		    char *err, size_t errlen);

/* Serves fd (a connected stream socket, now the ps's) as a connection that
 * greeted as worker w with hr's keys, until it ends (the peer closes, an
 * error, a timeout). Returns what serving it returned: 0 or a negative
 * errno; either is fine, the ps must only stay sound (ps_harness_check). */
int ps_harness_serve(struct ps_harness *h, int fd, const struct hs_result *hr, int w);

/* Serves fd as an observer's connection (`pstrain status`) with hr's
 * keys, as the gate would after an observer's handshake, until it ends;
 * the observer's own thread serves it, and this waits for that thread. 0,
 * or -ENOMEM when no observer could be started. */
int ps_harness_observe(struct ps_harness *h, int fd, const struct hs_result *hr);

/* The invariants a key holder cannot break: every parameter finite, the ps
 * not stopped by a peer, no connection left behind. 0, or a negative
 * errno with the broken one in err. */
int ps_harness_check(struct ps_harness *h, char *err, size_t errlen);

void ps_harness_close(struct ps_harness *h);

#endif
