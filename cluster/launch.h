/* Which task this process is when a scheduler started it: the role and
 * index of `pstrain ps|worker` without --index, and of `pstrain run`, from
 * the environment, in this order:
 *
 *   TF_CONFIG   {"cluster": {"ps": [...], "worker": [...], "chief": [...]},
 *                "task": {"type": T, "index": I}} as Kubeflow's TFJob sets
 *               it: its lists replace [cluster] ps and workers; a "chief"
 *               is pstrain's worker 0 and TF's worker I is then worker I+1.
 *   Slurm       SLURM_PROCID among SLURM_NTASKS tasks (srun): the first
 *               nps tasks (nps = the config's ps count) are ps 0..nps-1,
 *               the rest workers; each task's host is its node (the step's
 *               node list and tasks per node, block distribution), its
 *               port [cluster] ps 0's port + the task's rank, so tasks
 *               sharing a node never share a port.
 *   Kubernetes  inside a pod (KUBERNETES_SERVICE_HOST set), a StatefulSet
 *               pod's name NAME-K gives index K; for `run` NAME must end in
 *               -ps or -worker. [cluster] lists the pods' stable names.
 *
 * --index, where given, wins over Slurm and Kubernetes (which are read only
 * without it) but must agree with TF_CONFIG. Plain C over a struct of the
 * variables, so that tests need no environment. */
#ifndef PSTRAIN_CORE_LAUNCH_H
#define PSTRAIN_CORE_LAUNCH_H

#include <stddef.h>

#include "../core/config/config.h"

struct launch_env {
	const char *tf_config;
	const char *slurm_procid, *slurm_ntasks, *slurm_nodelist, *slurm_tasks_per_node;
	const char *k8s;      /* KUBERNETES_SERVICE_HOST: set in every pod */
	const char *hostname; /* the pod's name there */
};

/* From getenv; the host name into host (hostlen bytes). */
void launch_env_read(struct launch_env *e, char *host, size_t hostlen);

/* LAUNCH_STATUS: `pstrain status`, no task of its own: only the lists
 * are wanted, so no source at all is no error (the config's lists), and a
 * pod name that is not a StatefulSet's NAME-K (a debug pod's) counts as
 * none, since it would name no lists anyway. */
enum launch_role { LAUNCH_STATUS = -2, LAUNCH_ANY = -1, LAUNCH_PS = 0, LAUNCH_WORKER = 1 };

struct launch {
	int role;             /* LAUNCH_PS or LAUNCH_WORKER */
	int index;
	char from[256];       /* "TF_CONFIG (task chief 0)", ...; empty: --index */
	char *ps, *workers;   /* "host:port, ..." to replace [cluster]'s; NULL: keep */
};

/* want: the command's role (LAUNCH_ANY for run, LAUNCH_STATUS for status:
 * l->role is then the task's where a source says, else LAUNCH_STATUS);
 * index: --index's text or
 * NULL; c: the config as read, for the ps count and ports. Returns 0, or
 * -EINVAL with one line in err: no source at all, a malformed variable, a
 * role or index that disagrees with the command or flag. The index is not
 * checked against the lists here: the caller does, once they are final. */
int launch_resolve(struct launch *l, int want, const char *index, const struct launch_env *env,
		   const struct config *c, char *err, size_t errlen);
void launch_free(struct launch *l);

/* Slurm's compressed host lists: "n[01-03,7],gpu5" is n01 n02 n03 n7
 * gpu5. *names (*n of them, at most max) are malloc'd; launch_names_free. */
int launch_hostlist(const char *list, char ***names, int *n, int max, char *err, size_t errlen);
void launch_names_free(char **names, int n);
/* "2(x3),1" is 2 2 2 1: counts[] (at most max), *n of them. */
int launch_tasks_per_node(const char *s, int *counts, int max, int *n, char *err, size_t errlen);

const char *launch_role_name(int role);

#endif
