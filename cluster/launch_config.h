/* The config a process runs with once the scheduler's environment has had
 * its say: the one place where the roles (`pstrain ps|worker|run`) and
 * `pstrain status` take [cluster]'s ps and worker lists from, so that they
 * follow the same sources in the same order (launch_resolve's: TF_CONFIG,
 * --index, Slurm, a StatefulSet pod name, else the file's own). */
#ifndef PSTRAIN_CLUSTER_LAUNCH_CONFIG_H
#define PSTRAIN_CLUSTER_LAUNCH_CONFIG_H

#include <stddef.h>

#include "../core/config/config.h"
#include "launch.h"

/* c from path and the nsets "section.key=value" overrides (config_load),
 * then launch_resolve(l, want, index, env, c); where that found lists
 * (TF_CONFIG, Slurm), c again with "cluster.ps=..." and
 * "cluster.workers=..." after the overrides, as if given with --set, so
 * that every check of [cluster] sees them and they win over a --set of
 * the same key. The caller frees l (launch_free) after a 0; on failure l
 * holds nothing. Returns 0, or config_load's or launch_resolve's error
 * with one line in err (a config error over lists from the environment
 * says where they came from). Whether l->index fits the lists is the
 * caller's to check. */
int launch_config_load(struct config *c, struct launch *l, int want, const char *index,
		       const struct launch_env *env, const char *path, const char *const *sets,
		       int nsets, char *err, size_t errlen);

/* Where c's [cluster] lists came from, for `pstrain status`'s first line:
 * l->from where the environment gave them, else "[cluster] of PATH" (with
 * the pod name that names no lists of its own). */
void launch_config_from(const struct launch *l, const struct config *c, char *out, size_t outlen);

#endif
