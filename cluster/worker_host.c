/* See worker_host.h. */
#include "worker_host.h"
#include "role.h"

#include "../base/err.h"
#include "../core/nn/layers.h"
#include "../net/sock.h"

#include <errno.h>
#include <string.h>
#include <strings.h>

/* A worker listens on nothing, so a wrong entry of its own in [cluster]
 * workers would go unnoticed (it only names the worker in the handshake):
 * one line if it is not an address of this host. Returns
 * sock_is_own_address's answer. */
static int check_address(const struct config *c, int index, FILE *out)
{
	const struct host *h = &c->cluster.workers[index];
	char e[300];
	int r = sock_is_own_address(h->name, e, sizeof(e));
	if (r == 0)
		role_log(out, "worker %d: note: [cluster] workers lists this worker as %s:%u, which is not an address of this host (a typo, or NAT)",
			 index, h->name, h->port);
	else if (r < 0)
		role_log(out, "worker %d: note: [cluster] workers lists this worker as %s:%u: %s", index, h->name,
			 h->port, e);
	return r;
}

/* [train] threads = 0 is every CPU this process may use; on a host that
 * [cluster] lists for several workers under this worker's own name (the
 * one-host smoke test, `make demo`), each takes its share instead, so
 * that their OpenBLAS threads do not spin on each other's CPUs between
 * GEMMs (docs/NETWORK.md: the demo's steps 8 to 12% slower with every
 * worker on every CPU). Workers listed under other names are not
 * resolved: a name that does not resolve yet (a pod not up) could stall
 * the start. */
int worker_host_threads(const struct config *c, int index, FILE *out)
{
	int own = check_address(c, index, out);
	const char *me = c->cluster.workers[index].name;
	int here = 0;
	if (c->train.threads > 0 || own != 1)
		return c->train.threads;
	for (int i = 0; i < c->cluster.nworkers; i++)
		here += strcasecmp(c->cluster.workers[i].name, me) == 0;
	if (here <= 1)
		return 0;
	int cpus = layers_cpus(), n = cpus / here > 0 ? cpus / here : 1;
	role_log(out, "worker %d: [train] threads = 0: %d thread%s (this host's %d CPU%s shared by the %d workers [cluster] lists at %s)",
		 index, n, n == 1 ? "" : "s", cpus, cpus == 1 ? "" : "s", here, me);
	return n;
}
