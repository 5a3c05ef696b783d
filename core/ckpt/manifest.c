/* A checkpoint's manifest, the text file that says what a step directory
 * holds (step, model, layout and config hashes, the global batch, and
 * each shard file's range, size and BLAKE2b-256), written and read here;
 * checkpoint.c decides when. The format is in docs/CHECKPOINTS.md. */
#include "manifest.h"
#include "../fileio.h"
#include "../nn/sparse_optim.h"

#include "../../base/err.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void hex(char *out, const uint8_t *b, size_t n)
{
	sodium_bin2hex(out, 2 * n + 1, b, n);
}

static int unhex(uint8_t *b, size_t n, const char *s)
{
	size_t got = 0;
	return strlen(s) == 2 * n && sodium_hex2bin(b, n, s, 2 * n, NULL, &got, NULL) == 0 && got == n ? 0 : -1;
}

uint64_t ckpt_tables_rows(const struct ckpt_tables *t)
{
	return t->shared ? (uint64_t)t->rows : (uint64_t)t->fields * (uint64_t)t->rows;
}

static void file_line(FILE *f, const char *what, int k, const struct ckpt_shard *s)
{
	char h[2 * CKPT_HASH_BYTES + 1];
	hex(h, s->sum, CKPT_HASH_BYTES);
	fprintf(f, "%s %d %zu %zu %" PRIu64 " %s %s\n", what, k, s->begin, s->end, s->bytes, s->file, h);
}

/* want_k < 0: every shard; else shard want_k only (a ps's own manifest).
 * The tables' lines come only with tables, so a checkpoint without them
 * reads as it always did. */
static void manifest_text(FILE *f, const struct ckpt_manifest *mf, int want_k)
{
	char h[2 * CKPT_HASH_BYTES + 1];
	fprintf(f, "%s\nstep %ld\nparams %zu\n", CKPT_MAGIC, mf->step, mf->nparams);
	hex(h, mf->model_hash, CKPT_HASH_BYTES);
	fprintf(f, "model %s\n", h);
	hex(h, mf->layout_hash, CKPT_HASH_BYTES);
	fprintf(f, "layout %s\n", h);
	hex(h, mf->config_hash, CKPT_HASH_BYTES);
	fprintf(f, "config %s\n", h);
	if (mf->slices > 0)
		fprintf(f, "batch %d %d\n", mf->slices, mf->batch);
	fprintf(f, "shards %d\n", mf->nshards);
	for (int k = 0; k < mf->nshards; k++)
		if (want_k < 0 || k == want_k)
			file_line(f, "shard", k, &mf->shards[k]);
	const struct ckpt_tables *t = &mf->tables;
	if (!t->fields)
		return;
	fprintf(f, "tables %d %d %d %s %s\n", t->fields, t->rows, t->dim, t->shared ? "shared" : "per-field",
		sparse_kind_name((enum sparse_kind)t->optim));
	for (int k = 0; k < mf->nshards; k++)
		if (want_k < 0 || k == want_k)
			file_line(f, "rows", k, &mf->rows[k]);
}

/* The manifest ends with "end HASH", HASH = BLAKE2b-256 of everything
 * before that line: a truncated or edited manifest is refused. */
int manifest_fill(FILE *f, const void *arg_, char *err, size_t errlen)
{
	const struct manifest_arg *arg = arg_;
	char *text = NULL, h[2 * CKPT_HASH_BYTES + 1];
	size_t len = 0;
	uint8_t sum[CKPT_HASH_BYTES];
	FILE *m = open_memstream(&text, &len);
	if (!m)
		return err_set(err, errlen, -ENOMEM, "out of memory for a manifest");
	manifest_text(m, arg->mf, arg->k);
	if (fclose(m) || !text) {
		free(text);
		return err_set(err, errlen, -ENOMEM, "out of memory for a manifest");
	}
	crypto_generichash(sum, sizeof(sum), (const unsigned char *)text, len, NULL, 0);
	hex(h, sum, sizeof(sum));
	int ok = fwrite(text, 1, len, f) == len && fprintf(f, "end %s\n", h) > 0;
	free(text);
	return ok ? 0 : err_set(err, errlen, -EIO, "write failed");
}

static int manifest_bad(const char *path, int line, const char *what, char *err, size_t errlen)
{
	return err_set(err, errlen, -EINVAL, "%s:%d: %s", path, line, what);
}

/* A "shard" or "rows" line of manifest mf, K BEGIN END BYTES FILE HASH,
 * into out[K]: K must be the next one (want_k < 0) or want_k, once. */
static int file_line_read(const char *l, const char *w, const struct ckpt_manifest *mf, int want_k, int *count,
			  struct ckpt_shard *out)
{
	char fmt[64], h1[80];
	int k;
	struct ckpt_shard s;
	snprintf(fmt, sizeof(fmt), "%s %%d %%zu %%zu %%" SCNu64 " %%63s %%79s", w);
	if (sscanf(l, fmt, &k, &s.begin, &s.end, &s.bytes, s.file, h1) != 6 ||
	    k != (want_k < 0 ? *count : want_k) || *count > (want_k < 0 ? k : 0) || k >= mf->nshards ||
	    unhex(s.sum, CKPT_HASH_BYTES, h1) || strchr(s.file, '/') || s.file[0] == '.')
		return -1;
	out[k] = s;
	(*count)++;
	return 0;
}

/* "tables FIELDS ROWS DIM per-field|shared OPTIMIZER". */
static int tables_read(const char *l, struct ckpt_tables *t)
{
	char kind[16], opt[16], tail;
	if (sscanf(l, "tables %d %d %d %15s %15s %c", &t->fields, &t->rows, &t->dim, kind, opt, &tail) != 5 ||
	    t->fields < 1 || t->rows < 1 || t->dim < 1 || (strcmp(kind, "shared") && strcmp(kind, "per-field")))
		return -1;
	t->shared = kind[0] == 's';
	for (t->optim = 0; t->optim < 2; t->optim++)
		if (!strcmp(opt, sparse_kind_name((enum sparse_kind)t->optim)))
			return 0;
	return -1;
}

/* One manifest file. want_k < 0: the whole-checkpoint "manifest", listing
 * every shard; else "manifest-K-of-N" of one ps, listing shard want_k only. */
static int manifest_file_read(struct ckpt_manifest *mf, const char *path, int want_k, char *err, size_t errlen)
{
	unsigned char *buf;
	size_t len;
	memset(mf, 0, sizeof(*mf));
	int e = file_read(path, &buf, &len, err, errlen);
	if (e)
		return e;
	/* The checksum line first: nothing else is trusted before it holds. */
	char *text = malloc(len + 1);
	if (!text) {
		free(buf);
		return err_set(err, errlen, -ENOMEM, "%s: out of memory", path);
	}
	memcpy(text, buf, len);
	text[len] = '\0';
	free(buf);
	char *endl = len >= 1 && text[len - 1] == '\n' ? NULL : text;   /* must end in a newline */
	char *last = NULL;
	if (!endl) {
		text[len - 1] = '\0';
		last = strrchr(text, '\n');
		last = last ? last + 1 : text;
	}
	uint8_t want[CKPT_HASH_BYTES], got[CKPT_HASH_BYTES];
	if (!last || strncmp(last, "end ", 4) != 0 || unhex(want, sizeof(want), last + 4)) {
		free(text);
		return err_set(err, errlen, -EINVAL, "%s: truncated or damaged (no valid \"end\" line)", path);
	}
	crypto_generichash(got, sizeof(got), (const unsigned char *)text, (size_t)(last - text), NULL, 0);
	if (sodium_memcmp(want, got, sizeof(got)) != 0) {
		free(text);
		return err_set(err, errlen, -EINVAL, "%s: checksum mismatch (file damaged or edited)", path);
	}
	last[0] = '\0';

	int ln = 0, nshard = 0, nrows = 0;
	e = 0;
	char *save = NULL;
	for (char *l = strtok_r(text, "\n", &save); l && !e; l = strtok_r(NULL, "\n", &save)) {
		char w[32], h1[80];
		ln++;
		if (ln == 1) {
			if (strcmp(l, CKPT_MAGIC))
				e = manifest_bad(path, ln, "not a pstrain checkpoint manifest (version 1)", err, errlen);
			continue;
		}
		if (sscanf(l, "%31s", w) != 1)
			e = manifest_bad(path, ln, "empty line", err, errlen);
		else if (!strcmp(w, "step")) {
			if (sscanf(l, "step %ld", &mf->step) != 1 || mf->step < 0)
				e = manifest_bad(path, ln, "bad step", err, errlen);
		} else if (!strcmp(w, "params")) {
			if (sscanf(l, "params %zu", &mf->nparams) != 1)
				e = manifest_bad(path, ln, "bad params", err, errlen);
		} else if (!strcmp(w, "model") || !strcmp(w, "layout") || !strcmp(w, "config")) {
			uint8_t *dst = w[0] == 'm' ? mf->model_hash : w[0] == 'l' ? mf->layout_hash : mf->config_hash;
			if (sscanf(l, "%*s %79s", h1) != 1 || unhex(dst, CKPT_HASH_BYTES, h1))
				e = manifest_bad(path, ln, "bad hash", err, errlen);
		} else if (!strcmp(w, "shards")) {
			if (sscanf(l, "shards %d", &mf->nshards) != 1 || mf->nshards < 1 ||
			    mf->nshards > CONFIG_MAX_HOSTS)
				e = manifest_bad(path, ln, "bad shard count", err, errlen);
		} else if (!strcmp(w, "shard") || !strcmp(w, "rows")) {
			int rows = w[0] == 'r';
			if (file_line_read(l, w, mf, want_k, rows ? &nrows : &nshard, rows ? mf->rows : mf->shards))
				e = manifest_bad(path, ln, rows ? "bad rows line" : "bad shard line", err, errlen);
		} else if (!strcmp(w, "batch")) {
			/* Absent from older manifests: slices stays 0 (unknown). */
			char tail;
			if (sscanf(l, "batch %d %d %c", &mf->slices, &mf->batch, &tail) != 2 || mf->slices < 1 ||
			    mf->slices > CONFIG_MAX_HOSTS || mf->batch < 1)
				e = manifest_bad(path, ln, "bad batch line", err, errlen);
		} else if (!strcmp(w, "tables")) {
			if (tables_read(l, &mf->tables))
				e = manifest_bad(path, ln, "bad tables line", err, errlen);
		} else {
			e = manifest_bad(path, ln, "unknown line", err, errlen);
		}
	}
	free(text);
	if (e)
		return e;
	if (ln < 1 || nshard != (want_k < 0 ? mf->nshards : 1) || nshard == 0)
		return err_set(err, errlen, -EINVAL, "%s: lists %d of %d shards", path, nshard, mf->nshards);
	if (nrows != (mf->tables.fields ? nshard : 0))
		return err_set(err, errlen, -EINVAL, "%s: lists %d rows files for %d shards%s", path, nrows, nshard,
			       mf->tables.fields ? "" : " and no tables");
	return 0;
}

/* The shards of a whole checkpoint must tile [0, P). */
static int manifest_check_tiling(const struct ckpt_manifest *mf, const char *path, char *err, size_t errlen)
{
	int nshard = mf->nshards;
	size_t at = 0;
	for (int k = 0; k < nshard; k++) {
		if (mf->shards[k].begin != at || mf->shards[k].end <= at)
			return err_set(err, errlen, -EINVAL, "%s: shard %d range [%zu, %zu) does not follow %zu", path, k,
				       mf->shards[k].begin, mf->shards[k].end, at);
		at = mf->shards[k].end;
	}
	if (at != mf->nparams)
		return err_set(err, errlen, -EINVAL, "%s: shards cover %zu of %zu parameters", path, at, mf->nparams);
	if (!mf->tables.fields)
		return 0;
	/* Rows tile the tables' rows too; a writer may hold none. */
	uint64_t r = 0, R = ckpt_tables_rows(&mf->tables);
	for (int k = 0; k < nshard; k++) {
		if (mf->rows[k].begin != r || mf->rows[k].end < r)
			return err_set(err, errlen, -EINVAL, "%s: rows %d range [%zu, %zu) does not follow %" PRIu64, path, k,
				       mf->rows[k].begin, mf->rows[k].end, r);
		r = mf->rows[k].end;
	}
	if (r != R)
		return err_set(err, errlen, -EINVAL, "%s: rows files cover %" PRIu64 " of the tables' %" PRIu64 " rows",
			       path, r, R);
	return 0;
}

int manifest_nshards(const char *stepdir)
{
	DIR *d = opendir(stepdir);
	int n = 0;
	if (!d)
		return 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		int k, m;
		char tail;
		if (sscanf(de->d_name, "manifest-%d-of-%d%c", &k, &m, &tail) == 2 && k == 0 && m > 0 &&
		    m <= CONFIG_MAX_HOSTS)
			n = m;
	}
	closedir(d);
	return n;
}

int manifest_read(struct ckpt_manifest *mf, const char *stepdir, char *err, size_t errlen)
{
	char path[CKPT_PATH_MAX + CKPT_FILE_MAX];
	snprintf(path, sizeof(path), "%s/%s", stepdir, CKPT_MANIFEST);
	int n = access(path, F_OK) == 0 ? 0 : manifest_nshards(stepdir);
	if (n == 0) {
		int e = manifest_file_read(mf, path, -1, err, errlen);
		return e ? e : manifest_check_tiling(mf, path, err, errlen);
	}
	/* A cluster checkpoint: one manifest per ps, each written last by
	 * its ps; complete when all N are there and agree. */
	struct ckpt_manifest *one = malloc(sizeof(*one));
	if (!one)
		return err_set(err, errlen, -ENOMEM, "out of memory for a manifest");
	int e = 0;
	for (int k = 0; k < n && !e; k++) {
		snprintf(path, sizeof(path), "%s/manifest-%d-of-%d", stepdir, k, n);
		if (access(path, F_OK) != 0) {
			e = err_set(err, errlen, -EINVAL, "%s: missing: ps %d has not written its shard of this step (incomplete)",
				    path, k);
			break;
		}
		e = manifest_file_read(k ? one : mf, path, k, err, errlen);
		if (e)
			break;
		if (k && (one->step != mf->step || one->nparams != mf->nparams || one->nshards != n ||
			  memcmp(one->model_hash, mf->model_hash, CKPT_HASH_BYTES) ||
			  memcmp(one->layout_hash, mf->layout_hash, CKPT_HASH_BYTES) ||
			  memcmp(&one->tables, &mf->tables, sizeof(mf->tables)) || one->slices != mf->slices ||
			  one->batch != mf->batch))
			e = err_set(err, errlen, -EINVAL, "%s: disagrees with manifest-0-of-%d (step, model, tables, batch or layout)",
				    path, n);
		else if (k)
			mf->shards[k] = one->shards[k], mf->rows[k] = one->rows[k];
		else if (mf->nshards != n)
			e = err_set(err, errlen, -EINVAL, "%s: says %d shards", path, mf->nshards);
	}
	free(one);
	if (!e)
		e = manifest_check_tiling(mf, stepdir, err, errlen);
	return e;
}
