/* What a worker takes from the host it runs on (cluster/worker.c): whether
 * [cluster] lists its own address and how many CPU threads it trains
 * with. (--dump-params is worker_embed.c's worker_dump: the parameters,
 * then the tables.) */
#ifndef PSTRAIN_CLUSTER_WORKER_HOST_H
#define PSTRAIN_CLUSTER_WORKER_HOST_H

#include <stddef.h>
#include <stdio.h>

#include "../core/config/config.h"

/* The CPU threads worker `index` trains with ([train] threads), after one
 * line to out if [cluster] workers lists it at an address that is not
 * this host's (only a note: behind NAT, or in a pod named by a service,
 * it legitimately is not). */
int worker_host_threads(const struct config *c, int index, FILE *out);

#endif
