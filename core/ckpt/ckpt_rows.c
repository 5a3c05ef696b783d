/* The embedding tables in a checkpoint, by row: a writer's rows file
 * (rows-K-of-N.safetensors: its global rows [r0, r1) of every table, and
 * the sparse optimizer's state over them), and loading any range of rows
 * from the files of any number of writers; see checkpoint.h. The tables
 * can be larger than memory wants to hold twice, so a file is written
 * straight from the writer's arrays and read as a stream: its header, then
 * the bytes in order, hashed as they pass, those of the rows asked for
 * read into the caller's arrays and the rest through one small buffer.
 *
 * A table's part follows the dense tensors' parts (checkpoint.c): stored
 * under the table's name, described by "pstrain.part.NAME" =
 * "LO:HI/ROWSxDIM" in elements of the whole table; the part is whole rows,
 * so it is kept 2-D, (HI - LO) / DIM x DIM, and parts concatenate into the
 * table in PyTorch (torch.cat) as they do here. */
#include "checkpoint.h"
#include "ckpt_dir.h"
#include "manifest.h"
#include "safetensors.h"

#include "../../base/err.h"

#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ROWS_CHUNK (1u << 20)   /* bytes per read of what is hashed and not kept */

void checkpoint_table_name(char *out, size_t len, const struct ckpt_layout *l, const char *prefix, int j)
{
	if (l->tables.shared)
		snprintf(out, len, "%s%s.weight", prefix, l->table_layer);
	else
		snprintf(out, len, "%s%s.%d.weight", prefix, l->table_layer, j);
}

int ckpt_table_count(const struct ckpt_tables *t)
{
	return t->shared ? 1 : t->fields;
}

int ckpt_table_part(const struct ckpt_tables *t, int j, uint64_t r0, uint64_t r1, uint64_t *lo, uint64_t *hi)
{
	uint64_t base = (uint64_t)j * (uint64_t)t->rows, end = base + (uint64_t)t->rows;
	uint64_t s = r0 > base ? r0 : base, f = r1 < end ? r1 : end;
	if (s >= f)
		return 0;
	*lo = s - base;
	*hi = f - base;
	return 1;
}

void ckpt_tables_text(char *out, size_t len, const struct ckpt_tables *t)
{
	if (!t->fields)
		snprintf(out, len, "no embedding tables");
	else
		snprintf(out, len, "embedding %d %d %d%s", t->fields, t->rows, t->dim, t->shared ? " shared" : "");
}

/* ---- writing ---- */

/* Adds the rows [lo, hi) of table j held in data (table j's row lo
 * first) as prefix+name: the whole table, or a described part. */
static void add_rows(struct st_tensor *out, int *nt, struct st_meta *meta, int *nmeta, const struct ckpt_layout *l,
		     const char *prefix, int j, uint64_t lo, uint64_t hi, const float *data)
{
	const struct ckpt_tables *t = &l->tables;
	struct st_tensor *s = &out[(*nt)++];
	memset(s, 0, sizeof(*s));
	checkpoint_table_name(s->name, sizeof(s->name), l, prefix, j);
	s->ndim = 2;
	s->shape[0] = hi - lo;
	s->shape[1] = (uint64_t)t->dim;
	s->n = (hi - lo) * (uint64_t)t->dim;
	s->data = data;
	if (lo == 0 && hi == (uint64_t)t->rows)
		return;
	char key[ST_META_MAX], part[96];
	int shape[2] = { t->rows, t->dim };
	ckpt_part_text(part, sizeof(part), (size_t)lo * (size_t)t->dim, (size_t)hi * (size_t)t->dim, 2, shape);
	snprintf(key, sizeof(key), "pstrain.part.%s", s->name);
	ckpt_meta_set(meta, nmeta, key, "%s", part);
}

/* The writer's arrays must be there: a checkpoint that cannot resume the
 * sparse optimizer is not one. */
static int rows_check(const struct ckpt_layout *l, int k, const struct ckpt_rows *r, char *err, size_t errlen)
{
	uint64_t R = ckpt_tables_rows(&l->tables);
	if (!r)
		return err_set(err, errlen, -EINVAL, "checkpoint shard %d: the model has embedding tables but no rows of them were given", k);
	if (r->r0 > r->r1 || r->r1 > R)
		return err_set(err, errlen, -EINVAL, "checkpoint shard %d: rows [%" PRIu64 ", %" PRIu64 ") are not inside the tables' %" PRIu64,
			       k, r->r0, r->r1, R);
	if (r->r0 < r->r1 && (!r->table || !r->m || (l->tables.optim == SPARSE_LAZY_ADAM && !r->v)))
		return err_set(err, errlen, -EINVAL, "checkpoint shard %d: the tables' rows or their %s state are missing", k,
			       sparse_kind_name((enum sparse_kind)l->tables.optim));
	return 0;
}

int ckpt_rows_write(const char *dir, const struct ckpt_layout *l, int k, long step, const struct ckpt_rows *rows,
		    struct ckpt_shard *out, char *err, size_t errlen)
{
	const struct ckpt_tables *tb = &l->tables;
	int e = rows_check(l, k, rows, err, errlen);
	if (e)
		return e;
	int T = ckpt_table_count(tb), nt = 0, nmeta = 0;
	const float *arr[3] = { rows->table, rows->m, tb->optim == SPARSE_LAZY_ADAM ? rows->v : NULL };
	const char *prefix[3] = { "", "optim.m.", "optim.v." };
	struct st_tensor *t = malloc(3 * (size_t)T * sizeof(*t));
	struct st_meta *meta = malloc((16 + 6) * sizeof(*meta));   /* only the first and last table can be parts */
	if (!t || !meta) {
		free(t);
		free(meta);
		return err_set(err, errlen, -ENOMEM, "out of memory for a checkpoint header");
	}
	char text[96];
	ckpt_tables_text(text, sizeof(text), tb);
	ckpt_meta_set(meta, &nmeta, "format", "pt");
	ckpt_meta_set(meta, &nmeta, "pstrain.format", "1");
	ckpt_meta_set(meta, &nmeta, "pstrain.step", "%ld", step);
	ckpt_meta_set(meta, &nmeta, "pstrain.shard", "%d/%d", k, l->nshards);
	ckpt_meta_set(meta, &nmeta, "pstrain.mode", "%s", !l->cluster ? "local" : l->async ? "async" : "sync");
	ckpt_meta_set(meta, &nmeta, "pstrain.rows", "%" PRIu64 ":%" PRIu64, rows->r0, rows->r1);
	ckpt_meta_set(meta, &nmeta, "pstrain.tables", "%s", text);
	ckpt_meta_set(meta, &nmeta, "pstrain.embedding_optimizer", "%s", sparse_kind_name((enum sparse_kind)tb->optim));
	ckpt_meta_set(meta, &nmeta, "pstrain.embedding_optim_t", "%ld", rows->t);
	for (int a = 0; a < 3; a++)
		for (int j = 0; arr[a] && j < T; j++) {
			uint64_t lo, hi;
			if (ckpt_table_part(tb, j, rows->r0, rows->r1, &lo, &hi))
				add_rows(t, &nt, meta, &nmeta, l, prefix[a], j, lo, hi,
					 arr[a] + ((uint64_t)j * (uint64_t)tb->rows + lo - rows->r0) * (uint64_t)tb->dim);
		}
	char path[CKPT_PATH_MAX + CKPT_FILE_MAX];
	snprintf(out->file, sizeof(out->file), "rows-%d-of-%d.safetensors", k, l->nshards);
	snprintf(path, sizeof(path), "%s/%s", dir, out->file);
	out->begin = (size_t)rows->r0;
	out->end = (size_t)rows->r1;
	struct ckpt_st_file sf = { t, nt, meta, nmeta };
	e = ckpt_write_durable(path, ckpt_fill_st, &sf, err, errlen);
	free(t);
	free(meta);
	return e ? e : ckpt_hash_file(path, out->sum, &out->bytes, err, errlen);
}

/* ---- reading ---- */

int ckpt_tables_fit(const char *stepdir, const struct ckpt_manifest *mf, const struct ckpt_layout *l, int resume,
		    char *err, size_t errlen)
{
	const struct ckpt_tables *c = &mf->tables, *m = &l->tables;
	char a[96], b[96];
	ckpt_tables_text(a, sizeof(a), c);
	ckpt_tables_text(b, sizeof(b), m);
	if (strcmp(a, b))
		return err_set(err, errlen, -EINVAL, "%s holds another model: it has %s, this config's model has %s; give this config its own checkpoint_dir, or start over with --fresh",
			       stepdir, a, b);
	if (resume && c->fields && c->optim != m->optim) {
		const char *had = sparse_kind_name((enum sparse_kind)c->optim);
		return err_set(err, errlen, -EINVAL, "%s was written with embedding_optimizer %s, this config has %s: set [train] embedding_optimizer = %s to continue it, or start over with --fresh or another checkpoint_dir",
			       stepdir, had, sparse_kind_name((enum sparse_kind)m->optim), had);
	}
	return 0;
}

/* A piece of a rows file to read into the caller's array: bytes [off,
 * off + len) of the file. */
struct rows_job {
	uint64_t off, len;
	void *dst;
};

static int by_off(const void *a, const void *b)
{
	const struct rows_job *x = a, *y = b;
	return x->off < y->off ? -1 : x->off > y->off;
}

int ckpt_stream_open(struct ckpt_stream *s, const char *path, const struct ckpt_shard *m, struct safetensors *st,
		     char *err, size_t errlen)
{
	struct stat sb;
	memset(s, 0, sizeof(*s));
	memset(st, 0, sizeof(*st));
	s->path = path;
	crypto_generichash_init(&s->h, NULL, 0, CKPT_HASH_BYTES);
	s->f = fopen(path, "rb");
	if (!s->f || fstat(fileno(s->f), &sb)) {
		/* A missing file is a damaged checkpoint, refused as one. */
		int e = errno;
		return err_set(err, errlen, e == ENOENT ? -EINVAL : -e, "%s: %s", path, strerror(e));
	}
	s->size = (uint64_t)sb.st_size;
	if (s->size != m->bytes)
		return err_set(err, errlen, -EINVAL, "%s: truncated or extended: %" PRIu64 " bytes, the manifest says %" PRIu64,
			       path, s->size, m->bytes);
	if (!(s->buf = malloc(ROWS_CHUNK)))
		return err_set(err, errlen, -ENOMEM, "out of memory");
	int e = safetensors_read_head(st, s->f, s->size, path, err, errlen);
	if (e)
		return e;
	crypto_generichash_update(&s->h, st->buf, st->data0);
	s->pos = st->data0;
	return 0;
}

int ckpt_stream_take(struct ckpt_stream *s, uint64_t n, void *dst, crypto_generichash_state *also, char *err,
		     size_t errlen)
{
	while (n > 0) {
		size_t want = dst ? (size_t)n : (n < ROWS_CHUNK ? (size_t)n : ROWS_CHUNK);
		unsigned char *to = dst ? dst : s->buf;
		if (fread(to, 1, want, s->f) != want)
			return err_set(err, errlen, -EINVAL, "%s: truncated while being read", s->path);
		crypto_generichash_update(&s->h, to, want);
		if (also)
			crypto_generichash_update(also, to, want);
		s->pos += want;
		n -= want;
	}
	return 0;
}

int ckpt_stream_close(struct ckpt_stream *s, const struct ckpt_shard *m, int e, char *err, size_t errlen)
{
	uint8_t sum[CKPT_HASH_BYTES];
	if (!e && s->pos < s->size)
		e = ckpt_stream_take(s, s->size - s->pos, NULL, NULL, err, errlen);
	crypto_generichash_final(&s->h, sum, sizeof(sum));
	if (!e && sodium_memcmp(sum, m->sum, sizeof(sum)) != 0)
		e = err_set(err, errlen, -EINVAL, "%s: checksum mismatch (file damaged)", s->path);
	free(s->buf);
	if (s->f)
		fclose(s->f);
	memset(s, 0, sizeof(*s));
	return e;
}

/* The jobs that read rows [a, b) of array `prefix` (into dst, indexed
 * from row a) from a rows file of rows [r0, r1) parsed in st; each
 * table's tensor is checked to be the part the writer's range makes it. */
static int rows_jobs(const struct safetensors *st, const char *path, const struct ckpt_layout *l, const char *prefix,
		     uint64_t r0, uint64_t r1, uint64_t a, uint64_t b, float *dst, struct rows_job *jobs, int *nj,
		     char *err, size_t errlen)
{
	const struct ckpt_tables *tb = &l->tables;
	uint64_t D = (uint64_t)tb->dim, ra = a > r0 ? a : r0, rb = b < r1 ? b : r1;
	for (int j = 0; j < ckpt_table_count(tb); j++) {
		uint64_t lo, hi, wlo, whi, base = (uint64_t)j * (uint64_t)tb->rows;
		if (!ckpt_table_part(tb, j, r0, r1, &lo, &hi) || !ckpt_table_part(tb, j, ra, rb, &wlo, &whi))
			continue;
		char name[ST_NAME_MAX], key[ST_META_MAX], want[96] = "";
		checkpoint_table_name(name, sizeof(name), l, prefix, j);
		const struct st_tensor *s = safetensors_find(st, name);
		snprintf(key, sizeof(key), "pstrain.part.%s", name);
		const char *v = safetensors_meta(st, key);
		int shape[2] = { tb->rows, tb->dim };
		if (lo != 0 || hi != (uint64_t)tb->rows)
			ckpt_part_text(want, sizeof(want), (size_t)(lo * D), (size_t)(hi * D), 2, shape);
		if (!s)
			return err_set(err, errlen, -EINVAL, "%s: tensor %s is missing", path, name);
		if (s->ndim != 2 || s->shape[0] != hi - lo || s->shape[1] != D || (want[0] ? !v || strcmp(v, want) : v != NULL))
			return err_set(err, errlen, -EINVAL, "%s: tensor %s is not the rows [%" PRIu64 ", %" PRIu64 ") x %d of table %d the manifest's rows [%" PRIu64 ", %" PRIu64 ") hold",
				       path, name, lo, hi, tb->dim, j, r0, r1);
		jobs[*nj] = (struct rows_job){ .off = st->data0 + s->begin + (wlo - lo) * D * sizeof(float),
					       .len = (whi - wlo) * D * sizeof(float),
					       .dst = dst + (base + wlo - a) * D };
		(*nj)++;
	}
	return 0;
}

int ckpt_rows_meta(const struct safetensors *st, const char *path, const struct ckpt_shard *m, long *t,
		     char *err, size_t errlen)
{
	char want[64], *end;
	const char *r = safetensors_meta(st, "pstrain.rows"), *ts = safetensors_meta(st, "pstrain.embedding_optim_t");
	snprintf(want, sizeof(want), "%zu:%zu", m->begin, m->end);
	if (!r || strcmp(r, want))
		return err_set(err, errlen, -EINVAL, "%s: pstrain.rows is %s, the manifest says %s", path, r ? r : "missing", want);
	*t = ts ? strtol(ts, &end, 10) : -1;
	if (!ts || *end || *t < 0)
		return err_set(err, errlen, -EINVAL, "%s: pstrain.embedding_optim_t missing or malformed", path);
	return 0;
}

/* Rows file k's part of rl: the file streamed once, its header, then
 * the jobs' bytes in file order into rl's arrays, everything hashed and
 * the hash checked at the end. */
static int rows_file_read(const char *stepdir, const struct ckpt_manifest *mf, int k, const struct ckpt_layout *l,
			  struct ckpt_rows_load *rl, long *t, char *err, size_t errlen)
{
	const struct ckpt_shard *m = &mf->rows[k];
	char path[CKPT_PATH_MAX + CKPT_FILE_MAX];
	struct ckpt_stream s;
	struct safetensors st;
	float *arr[3] = { rl->table, rl->m, rl->v };
	const char *prefix[3] = { "", "optim.m.", "optim.v." };
	struct rows_job *jobs = NULL;
	int nj = 0;
	snprintf(path, sizeof(path), "%s/%s", stepdir, m->file);
	int e = ckpt_stream_open(&s, path, m, &st, err, errlen);
	if (!e)
		e = ckpt_rows_meta(&st, path, m, t, err, errlen);
	if (!e && !(jobs = malloc(3 * (size_t)ckpt_table_count(&l->tables) * sizeof(*jobs))))
		e = err_set(err, errlen, -ENOMEM, "out of memory");
	for (int a = 0; a < 3 && !e; a++)
		if (arr[a])
			e = rows_jobs(&st, path, l, prefix[a], m->begin, m->end, rl->a, rl->b, arr[a], jobs, &nj, err,
				      errlen);
	if (!e)
		qsort(jobs, (size_t)nj, sizeof(*jobs), by_off);
	for (int i = 0; i < nj && !e; i++) {
		e = ckpt_stream_take(&s, jobs[i].off - s.pos, NULL, NULL, err, errlen);
		if (!e)
			e = ckpt_stream_take(&s, jobs[i].len, jobs[i].dst, NULL, err, errlen);
	}
	free(jobs);
	safetensors_free(&st);
	return ckpt_stream_close(&s, m, e, err, errlen);
}

int ckpt_rows_load(const char *stepdir, const struct ckpt_manifest *mf, const struct ckpt_layout *l, int resume,
		   struct ckpt_rows_load *rl, char *err, size_t errlen)
{
	int e = ckpt_tables_fit(stepdir, mf, l, resume, err, errlen);
	if (e)
		return e;
	uint64_t R = ckpt_tables_rows(&l->tables);
	if (!l->tables.fields || rl->a > rl->b || rl->b > R)
		return err_set(err, errlen, -EINVAL, "rows [%" PRIu64 ", %" PRIu64 ") of tables of %" PRIu64 " rows", rl->a,
			       rl->b, R);
	long t = -2;   /* none read yet */
	for (int k = 0; k < mf->nshards && !e; k++) {
		long tk;
		if (mf->rows[k].end <= rl->a || mf->rows[k].begin >= rl->b || rl->a == rl->b)
			continue;
		e = rows_file_read(stepdir, mf, k, l, rl, &tk, err, errlen);
		t = t == -2 || t == tk ? tk : -1;
	}
	rl->t = t < 0 ? -1 : t;
	return e;
}

int checkpoint_load_rows(const char *stepdir, const struct ckpt_layout *l, int resume, struct ckpt_rows_load *rl,
			 char *err, size_t errlen)
{
	struct ckpt_manifest *mf = malloc(sizeof(*mf));
	if (!mf)
		return err_set(err, errlen, -ENOMEM, "out of memory for a manifest");
	int e = manifest_read(mf, stepdir, err, errlen);
	if (!e)
		e = ckpt_rows_load(stepdir, mf, l, resume, rl, err, errlen);
	free(mf);
	return e;
}
