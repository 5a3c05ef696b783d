/* See launch_config.h. Kept apart from launch.c, which reads only the
 * environment (and is fuzzed without the config reader). */
#include "launch_config.h"

#include "../base/err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* config_load with the lists l found appended to sets: appended, so that
 * the environment wins over a --set of the same key, as it did when
 * main.c added them to its own --set array. */
static int load_with_lists(struct config *c, const struct launch *l, const char *path,
			   const char *const *sets, int nsets, char *err, size_t errlen)
{
	const char **all = malloc(((size_t)nsets + 2) * sizeof(*all));
	char *ps = NULL, *workers = NULL;
	int n = nsets, r = 0;
	if (!all)
		return err_set(err, errlen, -ENOMEM, "out of memory");
	if (nsets)
		memcpy(all, sets, (size_t)nsets * sizeof(*all));
	if (l->ps && asprintf(&ps, "cluster.ps=%s", l->ps) < 0) {
		ps = NULL;
		r = -ENOMEM;
	}
	if (l->workers && asprintf(&workers, "cluster.workers=%s", l->workers) < 0) {
		workers = NULL;
		r = -ENOMEM;
	}
	if (ps)
		all[n++] = ps;
	if (workers)
		all[n++] = workers;
	if (r)
		err_set(err, errlen, r, "out of memory");
	else
		r = config_load(c, path, all, n, err, errlen);
	free(ps);
	free(workers);
	free(all);
	return r;
}

int launch_config_load(struct config *c, struct launch *l, int want, const char *index,
		       const struct launch_env *env, const char *path, const char *const *sets,
		       int nsets, char *err, size_t errlen)
{
	*l = (struct launch){ .role = -1, .index = -1 };
	int r = config_load(c, path, sets, nsets, err, errlen);
	if (r)
		return r;
	/* Slurm's lists need the file's ps count and ps 0's port: the file
	 * first, then the lists, then the file again with them. */
	r = launch_resolve(l, want, index, env, c, err, errlen);
	if (r || (!l->ps && !l->workers))
		return r;
	r = load_with_lists(c, l, path, sets, nsets, err, errlen);
	if (r) {
		size_t used = strlen(err);
		if (used + 1 < errlen)
			snprintf(err + used, errlen - used, " (the [cluster] lists came from %s)", l->from);
		launch_free(l);
	}
	return r;
}

void launch_config_from(const struct launch *l, const struct config *c, char *out, size_t outlen)
{
	if (l->ps || l->workers)
		snprintf(out, outlen, "%s", l->from);
	else if (l->from[0])
		snprintf(out, outlen, "[cluster] of %s (%s: the StatefulSets' pods are named there)", c->path,
			 l->from);
	else
		snprintf(out, outlen, "[cluster] of %s", c->path);
}
