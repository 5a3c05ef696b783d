/* Sharding: balanced contiguous ranges of the parameter vector, and the plan
 * table `pstrain check` prints. See shard.h for the rules. */
#include "progress.h"
#include "shard.h"

#include <errno.h>
#include <string.h>

/* Wrap the tensor list of one shard at this many columns. */
#define TENSOR_LINE_MAX 100

int shard_check(int nps, size_t nparams, char *err, size_t errlen)
{
	if (nps < 1) {
		snprintf(err, errlen, "[cluster] ps: needs at least one host:port");
		return -EINVAL;
	}
	if ((size_t)nps > nparams) {
		snprintf(err, errlen, "[cluster] ps: %d ps tasks but the model has only %zu parameters; "
			 "each ps needs at least one (list at most %zu)", nps, nparams, nparams);
		return -EINVAL;
	}
	return 0;
}

void shard_plan(struct shard *out, int nps, size_t nparams)
{
	/* begin(k) = k*q + min(k, r) equals floor(k*P/nps) rounded so the first r
	 * shards get q+1, without forming k*P (which can overflow near SIZE_MAX). */
	size_t n = (size_t)nps, q = nparams / n, r = nparams % n;
	for (size_t k = 0; k < n; k++) {
		out[k].begin = k * q + (k < r ? k : r);
		out[k].end = out[k].begin + q + (k < r);
	}
}


/* Appends "name.part[lo:hi)" for the part of tensor [off, off+n) that s
 * covers, wrapping the line; *col is the current column. */
static void print_tensor(FILE *f, int *col, const struct tensor_info *t, const struct shard *s)
{
	size_t lo = t->off > s->begin ? t->off : s->begin;
	size_t hi = t->off + t->n < s->end ? t->off + t->n : s->end;
	if (lo >= hi)
		return;
	char tok[96];
	int len = snprintf(tok, sizeof(tok), "%s[%zu:%zu)", t->name, lo - t->off, hi - t->off);
	const char *indent = ";       ";
	if (*col == 0) {
		*col = fprintf(f, "%s", indent);
	} else if (*col + 1 + len > TENSOR_LINE_MAX) {
		fputc('\n', f);
		*col = fprintf(f, "%s", indent);
	} else {
		*col += fprintf(f, " ");
	}
	*col += fprintf(f, "%s", tok);
}

void shard_print(FILE *f, const struct model *m, const struct shard *s, int nps,
		 const struct host *ps)
{
	char total[32], human[32], hostport[CONFIG_HOST_MAX + 16];
	progress_bytes(total, sizeof(total), (double)m->nparams * sizeof(float));
	fprintf(f, "; sharding: %zu parameters (%s) over %d ps task%s, contiguous ranges "
		"differing by at most 1 element\n", m->nparams, total, nps, nps == 1 ? "" : "s");
	struct tensor_info t[MODEL_MAX_TENSORS];
	int nt = model_tensors(m, t, MODEL_MAX_TENSORS);
	fprintf(f, ";   %-4s %-22s %-24s %10s  %s\n", "ps", "host:port", "range [begin, end)",
		"elements", "bytes");
	for (int k = 0; k < nps; k++) {
		const struct shard *sh = &s[k];
		size_t n = sh->end - sh->begin;
		char range[48];
		if (!ps)
			snprintf(hostport, sizeof(hostport), "-");
		else if (strchr(ps[k].name, ':'))
			snprintf(hostport, sizeof(hostport), "[%s]:%u", ps[k].name, ps[k].port);
		else
			snprintf(hostport, sizeof(hostport), "%s:%u", ps[k].name, ps[k].port);
		snprintf(range, sizeof(range), "[%zu, %zu)", sh->begin, sh->end);
		progress_bytes(human, sizeof(human), (double)n * sizeof(float));
		fprintf(f, ";   %-4d %-22s %-24s %10zu  %zu (%s)\n", k, hostport, range, n,
			n * sizeof(float), human);
		int col = 0;
		for (int i = 0; i < nt; i++)
			print_tensor(f, &col, &t[i], sh);
		if (col)
			fputc('\n', f);
		else
			fprintf(f, ";       (no parameters)\n");
	}
}
