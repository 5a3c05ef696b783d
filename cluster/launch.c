/* See launch.h. */
#include "launch.h"

#include "../core/json.h"
#include "../base/err.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void launch_env_read(struct launch_env *e, char *host, size_t hostlen)
{
	*e = (struct launch_env){
		.tf_config = getenv("TF_CONFIG"),
		.slurm_procid = getenv("SLURM_PROCID"),
		.slurm_ntasks = getenv("SLURM_STEP_NUM_TASKS") ? getenv("SLURM_STEP_NUM_TASKS")
							       : getenv("SLURM_NTASKS"),
		.slurm_nodelist = getenv("SLURM_STEP_NODELIST") ? getenv("SLURM_STEP_NODELIST")
								: getenv("SLURM_JOB_NODELIST"),
		.slurm_tasks_per_node = getenv("SLURM_STEP_TASKS_PER_NODE")
						? getenv("SLURM_STEP_TASKS_PER_NODE")
						: getenv("SLURM_TASKS_PER_NODE"),
		.k8s = getenv("KUBERNETES_SERVICE_HOST"),
	};
	host[0] = 0;
	if (hostlen && gethostname(host, hostlen - 1) == 0) {
		host[hostlen - 1] = 0;
		e->hostname = host;
	}
}

const char *launch_role_name(int role)
{
	return role == LAUNCH_PS ? "ps" : role == LAUNCH_WORKER ? "worker" : "any";
}

void launch_free(struct launch *l)
{
	free(l->ps);
	free(l->workers);
	l->ps = l->workers = NULL;
}

/* Every message that quotes the environment goes through err_shown(): its
 * text may hold anything, a message is one printable line. */
#define SHOWN_MAX 101

/* What a host:port (or a Slurm host list, with its [ranges]) may hold:
 * letters, digits, '.', '-', ':', '[' and ']'. [cluster]'s own parser
 * checks the rest; this keeps everything else (an escape sequence, a
 * space, a comma that would split the list) from reaching it and its
 * messages, which quote the entry. Returns the first other byte's index,
 * or -1. */
static long host_chars_bad(const char *s, const char *also)
{
	for (const char *c = s; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
		      strchr(".-:[]", *c) || strchr(also, *c)))
			return c - s;
	return -1;
}

/* A non-negative decimal int, all of s. */
static int parse_count(const char *s, int *v)
{
	char *end;
	errno = 0;
	long x = strtol(s, &end, 10);
	if (errno || end == s || *end || x < 0 || x > 1000000)
		return -1;
	*v = (int)x;
	return 0;
}

/* "a, b" += item. */
static int list_add(char **list, const char *item)
{
	size_t have = *list ? strlen(*list) : 0, add = strlen(item);
	char *s = realloc(*list, have + add + 3);
	if (!s)
		return -ENOMEM;
	snprintf(s + have, add + 3, "%s%s", have ? ", " : "", item);
	*list = s;
	return 0;
}

/* ---- TF_CONFIG ---------------------------------------------------- */

/* The string array TF_CONFIG's cluster has for job (0 entries when absent)
 * appended to *list. */
static int tf_job(const struct json *cluster, const char *job, char **list, int *n, char *err,
		  size_t errlen)
{
	const struct json *a = json_get(cluster, job);
	char sh[SHOWN_MAX];
	*n = 0;
	if (!a)
		return 0;
	if (a->type != JSON_ARRAY)
		return err_set(err, errlen, -EINVAL, "TF_CONFIG: cluster.%s is %s, not an array of \"host:port\"",
			       job, json_type_name(a->type));
	for (size_t i = 0; i < a->n; i++) {
		const struct json *h = &a->kids[i];
		if (h->type != JSON_STRING || !h->text[0])
			return err_set(err, errlen, -EINVAL, "TF_CONFIG: cluster.%s[%zu] is not a \"host:port\"", job, i);
		long bad = host_chars_bad(h->text, "");
		if (bad >= 0)
			return err_set(err, errlen, -EINVAL,
				       "TF_CONFIG: cluster.%s[%zu] \"%s\" is not a \"host:port\": byte %ld is 0x%02x, where only letters, digits and . - : [ ] may be",
				       job, i, err_shown(sh, sizeof(sh), h->text, SIZE_MAX), bad,
				       (unsigned char)h->text[bad]);
		if (list_add(list, h->text))
			return err_set(err, errlen, -ENOMEM, "out of memory");
	}
	*n = (int)a->n;
	return 0;
}

static int from_tf_config(struct launch *l, const char *text, char *err, size_t errlen)
{
	struct json *j;
	char e[200];
	int r = json_parse(text, strlen(text), &j, e, sizeof(e));
	if (r)
		return err_set(err, errlen, r, "TF_CONFIG is not valid JSON: %s", e);
	const struct json *cluster = json_get(j, "cluster"), *task = json_get(j, "task");
	const struct json *type = json_get(task, "type");
	const struct json *ix = json_get(task, "index");
	int nps = 0, nchief = 0, nworker = 0, index = 0;
	char sh[SHOWN_MAX];
	char *chief = NULL;
	if (!cluster || cluster->type != JSON_OBJECT)
		r = err_set(err, errlen, -EINVAL, "TF_CONFIG has no \"cluster\" object");
	else if (!type || type->type != JSON_STRING)
		r = err_set(err, errlen, -EINVAL, "TF_CONFIG has no \"task\": {\"type\": ...}");
	else if (!ix || ix->type != JSON_NUMBER || parse_count(ix->text, &index))
		r = err_set(err, errlen, -EINVAL, "TF_CONFIG's task has no \"index\" that is a whole number >= 0");
	if (!r)
		r = tf_job(cluster, "ps", &l->ps, &nps, err, errlen);
	if (!r)
		r = tf_job(cluster, "chief", &chief, &nchief, err, errlen);
	if (!r && nchief > 1)
		r = err_set(err, errlen, -EINVAL, "TF_CONFIG lists %d chiefs; there is at most one", nchief);
	/* The chief first: it is pstrain's worker 0. */
	if (!r && chief && (l->workers = strdup(chief)) == NULL)
		r = err_set(err, errlen, -ENOMEM, "out of memory");
	if (!r)
		r = tf_job(cluster, "worker", &l->workers, &nworker, err, errlen);
	if (!r && (nps == 0 || nchief + nworker == 0))
		r = err_set(err, errlen, -EINVAL, "TF_CONFIG's cluster needs \"ps\" and \"worker\" (or \"chief\") tasks");
	if (!r) {
		const char *t = type->text;
		if (strcmp(t, "ps") == 0) {
			l->role = LAUNCH_PS;
			l->index = index;
		} else if (strcmp(t, "chief") == 0 || strcmp(t, "master") == 0) {
			l->role = LAUNCH_WORKER;
			l->index = index;
			if (index != 0)
				r = err_set(err, errlen, -EINVAL, "TF_CONFIG: task %s %d: there is only chief 0", t, index);
		} else if (strcmp(t, "worker") == 0) {
			l->role = LAUNCH_WORKER;
			l->index = index + nchief;
		} else {
			r = err_set(err, errlen, -EINVAL, "TF_CONFIG: task type \"%s\": pstrain runs ps, chief and worker tasks only",
				    err_shown(sh, 41, t, SIZE_MAX));
		}
		if (!r)
			snprintf(l->from, sizeof(l->from), "TF_CONFIG (task %s %d%s)", err_shown(sh, 41, t, SIZE_MAX), index,
				 strcmp(t, "worker") == 0 && nchief ? ", after the chief" : "");
	}
	free(chief);
	json_free(j);
	return r;
}

/* ---- Slurm -------------------------------------------------------- */

void launch_names_free(char **names, int n)
{
	for (int i = 0; names && i < n; i++)
		free(names[i]);
	free(names);
}

/* One name of a host list, with at most one [ranges] group. */
static int hostlist_one(const char *item, size_t len, char **names, int *n, int max, char *err,
			size_t errlen)
{
	char sh[SHOWN_MAX];
	const char *lb = memchr(item, '[', len);
	if (!lb) {
		if (*n >= max)
			return err_set(err, errlen, -EINVAL, "more than %d hosts", max);
		if (!(names[(*n)++] = strndup(item, len)))
			return -ENOMEM;
		return 0;
	}
	const char *rb = memchr(lb, ']', len - (size_t)(lb - item));
	if (!rb || memchr(rb + 1, '[', len - (size_t)(rb + 1 - item)))
		return err_set(err, errlen, -EINVAL, "\"%s\": one [ranges] group per name is supported",
			       err_shown(sh, sizeof(sh), item, len));
	const char *suffix = rb + 1;
	int plen = (int)(lb - item), slen = (int)(len - (size_t)(suffix - item));
	for (const char *at = lb + 1; at < rb;) {
		char *end;
		long lo = strtol(at, &end, 10), hi = lo;
		int width = (int)(end - at);
		if (end == at || lo < 0 || lo > 999999999)
			return err_set(err, errlen, -EINVAL, "\"%s\": bad range", err_shown(sh, sizeof(sh), item, len));
		if (*end == '-') {
			const char *h = end + 1;
			hi = strtol(h, &end, 10);
			if (end == h || hi < lo)
				return err_set(err, errlen, -EINVAL, "\"%s\": bad range", err_shown(sh, sizeof(sh), item, len));
		}
		if ((end != rb && *end != ',') || hi > 999999999)
			return err_set(err, errlen, -EINVAL, "\"%s\": bad range", err_shown(sh, sizeof(sh), item, len));
		for (long v = lo; v <= hi; v++) {
			if (*n >= max)
				return err_set(err, errlen, -EINVAL, "more than %d hosts", max);
			char buf[512];
			/* Leading zeros are kept: n[01-03] is n01, n02, n03. */
			if (snprintf(buf, sizeof(buf), "%.*s%0*ld%.*s", plen, item, width, v, slen, suffix) >=
			    (int)sizeof(buf))
				return err_set(err, errlen, -EINVAL, "host name too long");
			if (!(names[(*n)++] = strdup(buf)))
				return -ENOMEM;
		}
		at = *end == ',' ? end + 1 : end;
	}
	return 0;
}

int launch_hostlist(const char *list, char ***out, int *n, int max, char *err, size_t errlen)
{
	char **names = calloc((size_t)max, sizeof(char *));
	*out = NULL;
	*n = 0;
	if (!names)
		return -ENOMEM;
	int r = 0, depth = 0;
	const char *start = list;
	char sh[SHOWN_MAX];
	long bad = host_chars_bad(list, ",");
	if (bad >= 0) {
		free(names);
		return err_set(err, errlen, -EINVAL, "host list \"%s\": byte %ld is 0x%02x, where only letters, digits and . - : [ ] , may be",
			       err_shown(sh, sizeof(sh), list, SIZE_MAX), bad, (unsigned char)list[bad]);
	}
	for (const char *p = list;; p++) {
		if (*p == '[')
			depth++;
		else if (*p == ']')
			depth--;
		if ((*p == ',' && depth == 0) || !*p) {
			if (p == start)
				r = err_set(err, errlen, -EINVAL, "empty name in host list \"%s\"",
					    err_shown(sh, sizeof(sh), list, SIZE_MAX));
			if (!r)
				r = hostlist_one(start, (size_t)(p - start), names, n, max, err, errlen);
			if (r || !*p)
				break;
			start = p + 1;
		}
	}
	if (r == -ENOMEM)
		err_set(err, errlen, r, "out of memory");
	if (r) {
		launch_names_free(names, *n);
		*n = 0;
		return r;
	}
	*out = names;
	return 0;
}

int launch_tasks_per_node(const char *s, int *counts, int max, int *n, char *err, size_t errlen)
{
	char sh[SHOWN_MAX];
	*n = 0;
	for (const char *at = s; *at;) {
		char *end;
		long c = strtol(at, &end, 10), rep = 1;
		if (end == at || c < 0 || c > 1000000)
			return err_set(err, errlen, -EINVAL, "tasks per node \"%s\" is malformed",
					       err_shown(sh, sizeof(sh), s, SIZE_MAX));
		if (strncmp(end, "(x", 2) == 0) {
			const char *x = end + 2;
			rep = strtol(x, &end, 10);
			if (end == x || rep < 1 || *end != ')')
				return err_set(err, errlen, -EINVAL, "tasks per node \"%s\" is malformed",
					       err_shown(sh, sizeof(sh), s, SIZE_MAX));
			end++;
		}
		if (*end && *end != ',')
			return err_set(err, errlen, -EINVAL, "tasks per node \"%s\" is malformed",
					       err_shown(sh, sizeof(sh), s, SIZE_MAX));
		for (long i = 0; i < rep; i++) {
			if (*n >= max)
				return err_set(err, errlen, -EINVAL, "tasks per node \"%s\": more than %d nodes",
					       err_shown(sh, sizeof(sh), s, SIZE_MAX), max);
			counts[(*n)++] = (int)c;
		}
		at = *end ? end + 1 : end;
	}
	return 0;
}

static int from_slurm(struct launch *l, const struct launch_env *env, const struct config *c,
		      char *err, size_t errlen)
{
	int rank, ntasks, nn, nc, counts[CONFIG_MAX_HOSTS * 2];
	char sh[24], sh2[24];
	char **nodes;
	if (parse_count(env->slurm_procid, &rank) || !env->slurm_ntasks ||
	    parse_count(env->slurm_ntasks, &ntasks) || rank >= ntasks)
		return err_set(err, errlen, -EINVAL, "Slurm: SLURM_PROCID %s of SLURM_NTASKS %s is not a task",
			       err_shown(sh, sizeof(sh), env->slurm_procid, 20),
			       env->slurm_ntasks ? err_shown(sh2, sizeof(sh2), env->slurm_ntasks, 20) : "(unset)");
	int nps = c->cluster.nps;
	if (ntasks <= nps)
		return err_set(err, errlen, -EINVAL, "Slurm: %d tasks, but [cluster] ps has %d: the first %d tasks are ps, and at least one more must be a worker",
			       ntasks, nps, nps);
	if (ntasks - nps > CONFIG_MAX_HOSTS)
		return err_set(err, errlen, -EINVAL, "Slurm: %d workers (at most %d)", ntasks - nps, CONFIG_MAX_HOSTS);
	if (!env->slurm_nodelist || !env->slurm_tasks_per_node)
		return err_set(err, errlen, -EINVAL, "Slurm: SLURM_PROCID is set but the node list or tasks per node is not (start the tasks with srun)");
	char e[300];
	int r = launch_hostlist(env->slurm_nodelist, &nodes, &nn, CONFIG_MAX_HOSTS * 2, e, sizeof(e));
	if (r)
		return err_set(err, errlen, r, "Slurm node list: %s", e);
	r = launch_tasks_per_node(env->slurm_tasks_per_node, counts, CONFIG_MAX_HOSTS * 2, &nc, e, sizeof(e));
	if (!r && nc != nn)
		r = err_set(e, sizeof(e), -EINVAL, "%d nodes but tasks per node for %d", nn, nc);
	int sum = 0;
	for (int i = 0; !r && i < nc; i++)
		sum += counts[i];
	if (!r && sum != ntasks)
		r = err_set(e, sizeof(e), -EINVAL, "tasks per node add up to %d, not SLURM_NTASKS %d", sum, ntasks);
	if (r) {
		launch_names_free(nodes, nn);
		return err_set(err, errlen, r, "Slurm: %s", e);
	}
	unsigned base = c->cluster.ps[0].port;
	if (base + (unsigned)ntasks > 65536) {
		launch_names_free(nodes, nn);
		return err_set(err, errlen, -EINVAL, "Slurm: ports %u..%u from [cluster] ps 0's port go past 65535",
			       base, base + (unsigned)ntasks - 1);
	}
	/* Block distribution: node i runs the next counts[i] tasks. */
	for (int t = 0, node = 0, left = counts[0]; !r && t < ntasks; t++, left--) {
		while (left == 0)
			left = counts[++node];
		char hp[600];
		snprintf(hp, sizeof(hp), "%s:%u", nodes[node], base + (unsigned)t);
		if (list_add(t < nps ? &l->ps : &l->workers, hp))
			r = err_set(err, errlen, -ENOMEM, "out of memory");
	}
	launch_names_free(nodes, nn);
	if (r)
		return r;
	l->role = rank < nps ? LAUNCH_PS : LAUNCH_WORKER;
	l->index = rank < nps ? rank : rank - nps;
	snprintf(l->from, sizeof(l->from), "Slurm (task %d of %d; the first %d are ps)", rank, ntasks, nps);
	return 0;
}

/* ---- Kubernetes ---------------------------------------------------- */

static int from_pod_name(struct launch *l, int want, const char *name, char *err, size_t errlen)
{
	char sh[SHOWN_MAX];
	const char *dash = strrchr(name, '-');
	int bad = !dash || parse_count(dash + 1, &l->index) || dash[1] == '+' || dash[1] == '-';
	if (bad && want == LAUNCH_STATUS)
		return 0;   /* as no source: launch.h */
	if (bad)
		return err_set(err, errlen, -EINVAL, "pod name \"%s\" is not a StatefulSet's NAME-K",
			       err_shown(sh, sizeof(sh), name, SIZE_MAX));
	l->role = want;
	if (want == LAUNCH_ANY) {
		size_t n = (size_t)(dash - name);
		if (n >= 3 && memcmp(dash - 3, "-ps", 3) == 0)
			l->role = LAUNCH_PS;
		else if (n >= 7 && memcmp(dash - 7, "-worker", 7) == 0)
			l->role = LAUNCH_WORKER;
		else
			return err_set(err, errlen, -EINVAL, "pod name \"%s\": pstrain run needs a StatefulSet named ...-ps or ...-worker (or use pstrain ps|worker)",
				       err_shown(sh, sizeof(sh), name, SIZE_MAX));
	}
	snprintf(l->from, sizeof(l->from), "the StatefulSet pod name %s", err_shown(sh, sizeof(sh), name, SIZE_MAX));
	return 0;
}

/* ---- all of them ----------------------------------------------------- */

int launch_resolve(struct launch *l, int want, const char *index, const struct launch_env *env,
		   const struct config *c, char *err, size_t errlen)
{
	*l = (struct launch){ .role = -1, .index = -1 };
	const char *cmd = want == LAUNCH_ANY ? "run" : want == LAUNCH_STATUS ? "status" : launch_role_name(want);
	int flag = -1, r;
	char sh[SHOWN_MAX];
	if (index && parse_count(index, &flag))
		return err_set(err, errlen, -EINVAL, "--index %s is not a whole number >= 0",
			       err_shown(sh, sizeof(sh), index, SIZE_MAX));
	if (env->tf_config && env->tf_config[0])
		r = from_tf_config(l, env->tf_config, err, errlen);
	else if (index)
		r = 0;
	else if (env->slurm_procid)
		r = from_slurm(l, env, c, err, errlen);
	else if (env->k8s && env->hostname)
		r = from_pod_name(l, want, env->hostname, err, errlen);
	else if (want == LAUNCH_STATUS)
		r = 0;   /* the config's lists */
	else
		return err_set(err, errlen, -EINVAL, "pstrain %s: which task is this? Give --index N, or start it with TF_CONFIG set, under srun, or as a StatefulSet pod",
			       cmd);
	if (r) {
		launch_free(l);
		return r;
	}
	if (!l->from[0]) {   /* --index alone */
		l->role = want;
		l->index = flag;
		return 0;
	}
	if (want >= 0 && l->role != want)
		r = err_set(err, errlen, -EINVAL, "pstrain %s, but %s makes this task %s %d", cmd, l->from,
			    launch_role_name(l->role), l->index);
	else if (flag >= 0 && flag != l->index)
		r = err_set(err, errlen, -EINVAL, "--index %d, but %s makes this task %s %d", flag, l->from,
			    launch_role_name(l->role), l->index);
	if (r)
		launch_free(l);
	return r;
}
