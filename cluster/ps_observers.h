/* A ps's observers (`pstrain status`): at most PS_OBSERVERS_MAX answered
 * connections of the observer role, each served on a detached thread that
 * answers STATUS with the REPORT its ps builds (report) and ends the
 * connection with an ERROR and a log line on anything but STATUS,
 * HEARTBEAT or ERROR, so nothing an observer sends reaches the shard. An
 * observer has no gradient buffer and no copy of the shard: two frame
 * buffers of a few hundred bytes, and a frame longer than that is refused
 * before it is read. Whom to admit (the gate, the greeting's freshness)
 * is cluster/ps.c's; this file never touches the ps's members.
 *
 * A slot is only held for sure once the observer's first frame has opened
 * (it holds the key, not just a greeting): when every slot is taken, a new
 * observer evicts the oldest that has not confirmed yet, so greetings that
 * were answered but never followed by a frame (a replay, or a key holder
 * greeting and saying nothing) cannot keep the operator's `pstrain status`
 * out. Confirmed observers are never evicted while they are served; one
 * that is done (refused, lingering up to CONN_LINGER_MS for its ERROR to
 * get out) gives its slot to a newcomer first.
 *
 * Shares the ps's mutex and condition variable: the fields below are
 * under *mu, and every observer that ends broadcasts *cv. */
#ifndef PSTRAIN_CLUSTER_PS_OBSERVERS_H
#define PSTRAIN_CLUSTER_PS_OBSERVERS_H

#include <pthread.h>
#include <stdio.h>

#include "../core/config/config.h"
#include "../net/handshake.h"
#include "../net/msg.h"

/* Observers at once: a few people watching, or a dashboard; more are
 * refused (the gate's tally), so observers never cost a ps more than this
 * many small threads. */
#define PS_OBSERVERS_MAX 4

/* What the ps says now (it takes its own lock): the REPORT for a STATUS,
 * and with final set the last one, as it ends. */
typedef void (*ps_report_fn)(void *ctx, struct msg_report *rp, int final);

struct ps_obs;

struct ps_observers {
	pthread_mutex_t *mu;     /* the ps's */
	pthread_cond_t *cv;      /* the ps's: broadcast when an observer ends */
	const struct config *c;
	FILE *out;
	int index;               /* the ps's, for STATUS and the log */
	ps_report_fn report;
	void *ctx;
	int draining;            /* each observer sends a last REPORT and goes */
	int n;                   /* observer threads running, evicted ones too */
	uint64_t seq;            /* observers admitted so far: their age */
	struct ps_obs *obs[PS_OBSERVERS_MAX]; /* the slots; an evicted one is
					       * in none, on its way out */
};

void ps_observers_init(struct ps_observers *po, pthread_mutex_t *mu, pthread_cond_t *cv,
		       const struct config *c, FILE *out, int index, ps_report_fn report, void *ctx);

/* Every slot is taken by a confirmed observer (under mu): a new one would
 * be refused. */
int ps_observers_full(const struct ps_observers *po);

/* An observer's answered connection fd, authenticated with hr's keys (the
 * caller wipes them), served on a detached thread; its first frame is due
 * within a handshake's step. With every slot taken, one that is done and
 * lingering, else the oldest observer that has not confirmed, is shut
 * down and its slot is this one's. -1 (fd
 * closed) if there is no slot, memory or thread. Takes mu. */
int ps_observers_spawn(struct ps_observers *po, int fd, const char *peer,
		       const struct hs_result *hr);

/* The ps ends (under mu): each observer gets a last REPORT (final) and is
 * closed; wait on cv until n is 0 before anything they use goes. */
void ps_observers_drain(struct ps_observers *po);

#endif
