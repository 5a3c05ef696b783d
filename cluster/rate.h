/* A ps's recent speed: versions per second over about the last
 * RATE_WINDOW_MS, from (time, version) samples the ps takes on its own
 * clock (its admission loop, every 200 ms or so), for REPORT. Pure state:
 * no clock, no lock (the ps holds its own while it calls these).
 *
 * Samples closer together than RATE_GAP_MS update the newest one instead
 * of adding one, so the ring covers the window whatever the caller's pace
 * and the newest sample is always the latest version. A version lower
 * than the newest sample's (a rollback) starts over. */
#ifndef PSTRAIN_CLUSTER_RATE_H
#define PSTRAIN_CLUSTER_RATE_H

#include <stdint.h>

#define RATE_WINDOW_MS 10000
#define RATE_GAP_MS 250
#define RATE_SAMPLES (RATE_WINDOW_MS / RATE_GAP_MS + 2) /* the window and one more */

struct rate {
	int64_t t_ms[RATE_SAMPLES]; /* ring, oldest at head */
	uint64_t v[RATE_SAMPLES];
	int head, n;
};

void rate_init(struct rate *r);

/* The shard was at version v at now_ms (a monotonic clock, not going back). */
void rate_add(struct rate *r, int64_t now_ms, uint64_t v);

/* Versions per second between the newest sample and the oldest one at
 * most RATE_WINDOW_MS older: 1 and *per_s set, or 0 (unknown) with fewer
 * than two such samples. */
int rate_get(const struct rate *r, double *per_s);

#endif
