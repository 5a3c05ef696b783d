/* `pstrain check --checkpoint` for the embedding tables: each rows file
 * streamed once (its checksum checked), each table tensor's parts hashed
 * in row order as they pass, so a table is summarized whole without ever
 * being held; inspect.c prints the summaries beside the dense tensors'. */
#include "checkpoint.h"
#include "ckpt_dir.h"
#include "manifest.h"
#include "safetensors.h"

#include "../../base/err.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A table tensor being reassembled: its parts so far. */
struct whole_rows {
	struct ckpt_summary s;
	uint64_t filled;
	crypto_generichash_state h;
};

/* Appends to out[0..len) (holding *n characters) ", " unless first, then
 * the text. */
static void put(char *out, size_t len, size_t *n, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void put(char *out, size_t len, size_t *n, const char *fmt, ...)
{
	va_list ap;
	if (*n && *n < len)
		*n += (size_t)snprintf(out + *n, len - *n, ", ");
	va_start(ap, fmt);
	if (*n < len)
		*n += (size_t)vsnprintf(out + *n, len - *n, fmt, ap);
	va_end(ap);
}

/* "tables 0..12 whole, rows [0, 15) of table 13": what global rows
 * [r0, r1) are of the tables t. */
static void parts_text(char *out, size_t len, const struct ckpt_tables *t, uint64_t r0, uint64_t r1)
{
	size_t n = 0;
	int T = ckpt_table_count(t), run0 = -1;
	out[0] = '\0';
	for (int j = 0; j <= T; j++) {
		uint64_t lo = 0, hi = 0;
		int have = j < T && ckpt_table_part(t, j, r0, r1, &lo, &hi);
		int whole = have && lo == 0 && hi == (uint64_t)t->rows;
		if (whole) {
			run0 = run0 < 0 ? j : run0;
			continue;
		}
		if (run0 >= 0 && t->shared)
			put(out, len, &n, "the shared table whole");
		else if (run0 >= 0 && run0 == j - 1)
			put(out, len, &n, "table %d whole", run0);
		else if (run0 >= 0)
			put(out, len, &n, "tables %d..%d whole", run0, j - 1);
		run0 = -1;
		if (have && t->shared)
			put(out, len, &n, "rows [%" PRIu64 ", %" PRIu64 ") of the shared table", lo, hi);
		else if (have)
			put(out, len, &n, "rows [%" PRIu64 ", %" PRIu64 ") of table %d", lo, hi, j);
	}
	if (!n)
		snprintf(out, len, "no rows");
}

/* The entry of tensor name with part pt in w (added when new); the
 * parts must come in order, each starting where the last one ended. */
static int whole_of(struct whole_rows **w, int *nw, const char *name, const struct ckpt_part *pt, const char *path,
		    struct whole_rows **out, char *err, size_t errlen)
{
	int j;
	for (j = 0; j < *nw && strcmp((*w)[j].s.name, name); j++)
		;
	if (j == *nw) {
		struct whole_rows *g = realloc(*w, (size_t)(*nw + 1) * sizeof(**w));
		if (!g)
			return err_set(err, errlen, -ENOMEM, "out of memory");
		*w = g;
		memset(&g[j], 0, sizeof(g[j]));
		snprintf(g[j].s.name, sizeof(g[j].s.name), "%s", name);
		g[j].s.ndim = pt->ndim;
		g[j].s.n = pt->n;
		memcpy(g[j].s.shape, pt->shape, sizeof(pt->shape));
		crypto_generichash_init(&g[j].h, NULL, 0, CKPT_HASH_BYTES);
		(*nw)++;
	}
	struct whole_rows *e = &(*w)[j];
	if (e->s.ndim != pt->ndim || memcmp(e->s.shape, pt->shape, sizeof(pt->shape)))
		return err_set(err, errlen, -EINVAL, "%s: tensor %s: shape differs from another rows file's", path, name);
	if (pt->lo != e->filled)
		return err_set(err, errlen, -EINVAL, "%s: tensor %s: part starts at element %" PRIu64 ", the parts before it end at %" PRIu64,
			       path, name, pt->lo, e->filled);
	*out = e;
	return 0;
}

static int by_begin(const void *a, const void *b)
{
	const struct st_tensor *x = *(const struct st_tensor *const *)a, *y = *(const struct st_tensor *const *)b;
	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Rows file k: its line to f, its tensors' bytes into their entries. */
static int inspect_file(FILE *f, const char *stepdir, const struct ckpt_manifest *mf, int k, struct whole_rows **w,
			int *nw, char *err, size_t errlen)
{
	const struct ckpt_shard *m = &mf->rows[k];
	char path[CKPT_PATH_MAX + CKPT_FILE_MAX], parts[512];
	struct ckpt_stream s;
	struct safetensors st;
	const struct st_tensor **order = NULL;
	long t;
	snprintf(path, sizeof(path), "%s/%s", stepdir, m->file);
	int e = ckpt_stream_open(&s, path, m, &st, err, errlen);
	if (!e)
		e = ckpt_rows_meta(&st, path, m, &t, err, errlen);
	if (!e && !(order = malloc((size_t)(st.nt ? st.nt : 1) * sizeof(*order))))
		e = err_set(err, errlen, -ENOMEM, "out of memory");
	for (int i = 0; !e && i < st.nt; i++)
		order[i] = &st.t[i];
	if (!e)
		qsort(order, (size_t)st.nt, sizeof(*order), by_begin);
	for (int i = 0; !e && i < st.nt; i++) {
		struct ckpt_part pt;
		struct whole_rows *one = NULL;
		e = checkpoint_part_of(&st, order[i], path, &pt, err, errlen);
		if (!e)
			e = whole_of(w, nw, order[i]->name, &pt, path, &one, err, errlen);
		/* The tensors tile the data area, so in begin order each starts
		 * where the stream is. */
		if (!e)
			e = ckpt_stream_take(&s, order[i]->n * sizeof(float), NULL, &one->h, err, errlen);
		if (!e)
			one->filled += order[i]->n;
	}
	free(order);
	safetensors_free(&st);
	e = ckpt_stream_close(&s, m, e, err, errlen);
	if (!e) {
		parts_text(parts, sizeof(parts), &mf->tables, m->begin, m->end);
		fprintf(f, "rows %d of %d: table rows [%zu, %zu) in %s (%s), embedding optimizer step %ld\n", k,
			mf->nshards, m->begin, m->end, m->file, parts, t);
	}
	return e;
}

int ckpt_rows_inspect(FILE *f, const char *stepdir, const struct ckpt_manifest *mf, struct ckpt_summary **out,
		      int *n, char *err, size_t errlen)
{
	struct whole_rows *w = NULL;
	int nw = 0, e = 0;
	for (int k = 0; k < mf->nshards && !e; k++)
		e = inspect_file(f, stepdir, mf, k, &w, &nw, err, errlen);
	struct ckpt_summary *g = e ? NULL : realloc(*out, (size_t)(*n + nw) * sizeof(**out));
	if (!e && !g && *n + nw > 0)
		e = err_set(err, errlen, -ENOMEM, "out of memory");
	for (int j = 0; j < nw && !e; j++) {
		if (w[j].filled != w[j].s.n) {
			e = err_set(err, errlen, -EINVAL, "%s: tensor %s: rows files hold %" PRIu64 " of its %" PRIu64 " elements",
				    stepdir, w[j].s.name, w[j].filled, w[j].s.n);
			break;
		}
		crypto_generichash_final(&w[j].h, w[j].s.sum, CKPT_HASH_BYTES);
		g[(*n)++] = w[j].s;
	}
	if (g)
		*out = g;
	free(w);
	return e;
}
