/* Checkpoint directories, the writing half: layout, manifest, durable
 * publishing and rotation; see checkpoint.h. Restore and inspection are
 * ckpt_read.c's; the file format is safetensors.c's. */
#include "checkpoint.h"
#include "../fileio.h"
#include "manifest.h"
#include "ckpt_dir.h"

#include "../../base/err.h"
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <signal.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- small helpers ---- */

/* A save takes delay_ms longer, as on a slow or network disk (tests check
 * that nothing waits for a ps's save). */
static void slow_disk(const struct ckpt_layout *l)
{
	long n = l->hooks.ckpt_delay_ms;
	if (n > 0) {
		struct timespec t = { n / 1000, (n % 1000) * 1000000L };
		nanosleep(&t, NULL);
	}
}

static int fsync_dir(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return -errno;
	int e = fsync(fd) ? -errno : 0;
	close(fd);
	return e;
}

/* Removes a directory holding only plain files (what pstrain writes). */
static int remove_flat_dir(const char *path)
{
	DIR *d = opendir(path);
	if (!d)
		return -errno;
	struct dirent *de;
	char p[CKPT_PATH_MAX];
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(p, sizeof(p), "%s/%s", path, de->d_name);
		unlink(p);
	}
	closedir(d);
	return rmdir(path) ? -errno : 0;
}

/* "step-NNNNNNNN" exactly; returns the step or -1. */
static long step_of(const char *name)
{
	if (strlen(name) != 13 || strncmp(name, "step-", 5) != 0)
		return -1;
	long s = 0;
	for (int i = 5; i < 13; i++) {
		if (name[i] < '0' || name[i] > '9')
			return -1;
		s = s * 10 + (name[i] - '0');
	}
	return s;
}

static int by_step_desc(const void *a, const void *b)
{
	long x = *(const long *)a, y = *(const long *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

/* Steps of the step-* directories in dir, newest first, into *out
 * (malloc'd). Returns the count, or a negative errno (-ENOENT: no dir). */
int ckpt_list_steps(const char *dir, long **out)
{
	*out = NULL;
	DIR *d = opendir(dir);
	if (!d)
		return -errno;
	long *v = NULL;
	int n = 0, cap = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		long s = step_of(de->d_name);
		if (s < 0)
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			long *w = realloc(v, (size_t)cap * sizeof(*v));
			if (!w) {
				free(v);
				closedir(d);
				return -ENOMEM;
			}
			v = w;
		}
		v[n++] = s;
	}
	closedir(d);
	if (n > 1)
		qsort(v, (size_t)n, sizeof(*v), by_step_desc);
	*out = v;
	return n;
}

void checkpoint_step_dir(char *out, size_t len, const char *dir, long step)
{
	snprintf(out, len, "%s/step-%08ld", dir, step);
}

/* ---- layout ---- */

/* The model hash (tensor names, offsets, sizes, shapes) in *h, left open
 * for the layout's lines. */
static void hash_tensors(const struct ckpt_layout *l, crypto_generichash_state *h)
{
	char line[256];
	crypto_generichash_init(h, NULL, 0, CKPT_HASH_BYTES);
	for (int i = 0; i < l->nt; i++) {
		const struct tensor_info *t = &l->t[i];
		int n = snprintf(line, sizeof(line), "%s %zu %zu", t->name, t->off, t->n);
		for (int d = 0; d < t->ndim; d++)
			n += snprintf(line + n, sizeof(line) - (size_t)n, " %d", t->shape[d]);
		n += snprintf(line + n, sizeof(line) - (size_t)n, "\n");
		crypto_generichash_update(h, (const unsigned char *)line, (size_t)n);
	}
}

/* The layout hash l's model has with nshards shards of the even plan,
 * optimizer kind optim and mode async: what a manifest records, so that
 * a checkpoint's optimizer and mode can be told from its manifest alone
 * (checkpoint_describe tries each). */
void ckpt_hash_layout(const struct ckpt_layout *l, int nshards, enum optim_kind optim, int async,
		      uint8_t out[CKPT_HASH_BYTES])
{
	struct shard plan[CONFIG_MAX_HOSTS];
	crypto_generichash_state h;
	char line[128];
	hash_tensors(l, &h);
	shard_plan(plan, nshards, l->nparams);
	for (int k = 0; k < nshards; k++) {
		int n = snprintf(line, sizeof(line), "shard %zu %zu\n", plan[k].begin, plan[k].end);
		crypto_generichash_update(&h, (const unsigned char *)line, (size_t)n);
	}
	int n = snprintf(line, sizeof(line), "optimizer %s\n", optim_kind_name(optim));
	crypto_generichash_update(&h, (const unsigned char *)line, (size_t)n);
	/* Only async adds a line, so sync and local checkpoints written
	 * before async ones existed keep their hash. */
	if (async)
		crypto_generichash_update(&h, (const unsigned char *)"mode async\n", 11);
	crypto_generichash_final(&h, out, CKPT_HASH_BYTES);
}

static int layout_init(struct ckpt_layout *l, const struct model *m, int nshards, const struct config *c,
		       int cluster, int async, char *err, size_t errlen)
{
	memset(l, 0, sizeof(*l));
	l->async = async;
	l->cluster = cluster;
	l->slices = config_slices(c, cluster);
	l->batch = c->train.batch_size;
	hooks_read(&l->hooks);
	l->nt = model_tensors(m, l->t, MODEL_MAX_TENSORS);
	if (l->nt < 0)
		return err_set(err, errlen, -EINVAL, "model has more than %d tensors", MODEL_MAX_TENSORS);
	l->nparams = m->nparams;
	if (shard_check(nshards, m->nparams, err, errlen) < 0)
		return -EINVAL;
	l->nshards = nshards;
	shard_plan(l->shards, nshards, m->nparams);
	l->optim = c->train.optim.kind;
	if (m->embed.fields) {
		const struct embed_spec *es = &m->embed;
		l->tables = (struct ckpt_tables){ es->fields, es->rows, es->dim, es->shared, c->train.embed_optimizer };
		snprintf(l->table_layer, sizeof(l->table_layer), "%s", m->layers[0].name);
	}
	if (config_hash(c, l->config_hash))
		return err_set(err, errlen, -ENOMEM, "out of memory hashing the config");
	crypto_generichash_state h;
	hash_tensors(l, &h);
	crypto_generichash_final(&h, l->model_hash, CKPT_HASH_BYTES);
	ckpt_hash_layout(l, nshards, l->optim, async, l->layout_hash);
	return 0;
}

int ckpt_layout_init(struct ckpt_layout *l, const struct model *m, int nshards, const struct config *c,
		     char *err, size_t errlen)
{
	return layout_init(l, m, nshards, c, 0, 0, err, errlen);
}

int ckpt_layout_init_cluster(struct ckpt_layout *l, const struct model *m, int nshards,
			     const struct config *c, char *err, size_t errlen)
{
	return layout_init(l, m, nshards, c, 1, c->train.mode == MODE_ASYNC, err, errlen);
}

/* ---- writing ---- */

void ckpt_meta_set(struct st_meta *m, int *n, const char *key, const char *fmt, ...)
{
	va_list ap;
	snprintf(m[*n].key, sizeof(m[*n].key), "%s", key);
	va_start(ap, fmt);
	vsnprintf(m[*n].value, sizeof(m[*n].value), fmt, ap);
	va_end(ap);
	(*n)++;
}

/* The part [lo, hi) of tensor t inside global range [b, e); 0 if none. */
int ckpt_tensor_part(const struct tensor_info *t, size_t b, size_t e, size_t *lo, size_t *hi)
{
	size_t s = t->off > b ? t->off : b, f = t->off + t->n < e ? t->off + t->n : e;
	if (s >= f)
		return 0;
	*lo = s - t->off;
	*hi = f - t->off;
	return 1;
}

/* pstrain.part.NAME's value: "LO:HI/D0xD1...", the part [lo, hi) of a
 * tensor of that shape stored flat. */
void ckpt_part_text(char *out, size_t len, size_t lo, size_t hi, int ndim, const int *shape)
{
	size_t n = (size_t)snprintf(out, len, "%zu:%zu/", lo, hi);
	for (int d = 0; d < ndim && n < len; d++)
		n += (size_t)snprintf(out + n, len - n, "%s%d", d ? "x" : "", shape[d]);
}

int checkpoint_part_parse(const char *v, uint64_t *lo, uint64_t *hi, int *ndim,
			  uint64_t *shape, uint64_t *n)
{
	int used = 0;
	unsigned long long a, b;
	if (sscanf(v, "%llu:%llu/%n", &a, &b, &used) != 2 || used == 0)
		return -EINVAL;
	*lo = a;
	*hi = b;
	const char *p = v + used;
	*ndim = 0;
	*n = 1;
	while (*p) {
		char *e;
		if (*ndim == ST_MAX_DIMS || *p < '0' || *p > '9')
			return -EINVAL;
		unsigned long long d = strtoull(p, &e, 10);
		if (d && *n > UINT64_MAX / 4 / d)
			return -EINVAL;
		shape[(*ndim)++] = d;
		*n *= d;
		p = e;
		if (*p == 'x')
			p++;
		else if (*p)
			return -EINVAL;
	}
	return *lo < *hi && *hi <= *n ? 0 : -EINVAL;
}

/* Adds the part of t in [b, e) from data (indexed from b) as `name`. */
static void add_part(struct st_tensor *out, int *nt, struct st_meta *meta, int *nmeta, const char *prefix,
		     const struct tensor_info *t, size_t b, size_t e, const float *data)
{
	size_t lo, hi;
	if (!data || !ckpt_tensor_part(t, b, e, &lo, &hi))
		return;
	struct st_tensor *s = &out[(*nt)++];
	memset(s, 0, sizeof(*s));
	snprintf(s->name, sizeof(s->name), "%s%s", prefix, t->name);
	s->n = hi - lo;
	s->data = data + (t->off + lo - b);
	if (lo == 0 && hi == t->n) {
		s->ndim = t->ndim;
		for (int d = 0; d < t->ndim; d++)
			s->shape[d] = (uint64_t)t->shape[d];
	} else {
		char key[ST_META_MAX], part[96];
		s->ndim = 1;
		s->shape[0] = s->n;
		ckpt_part_text(part, sizeof(part), lo, hi, t->ndim, t->shape);
		snprintf(key, sizeof(key), "pstrain.part.%s", s->name);
		ckpt_meta_set(meta, nmeta, key, "%s", part);
	}
}

int ckpt_hash_file(const char *path, uint8_t sum[CKPT_HASH_BYTES], uint64_t *bytes, char *err, size_t errlen)
{
	/* In pieces: a table's rows file may be larger than memory. */
	enum { CHUNK = 1 << 20 };
	crypto_generichash_state h;
	unsigned char *buf = malloc(CHUNK);
	FILE *f = buf ? fopen(path, "rb") : NULL;
	if (!f) {
		int e = buf ? -errno : -ENOMEM;
		free(buf);
		return err_set(err, errlen, e, "%s: %s", path, strerror(-e));
	}
	crypto_generichash_init(&h, NULL, 0, CKPT_HASH_BYTES);
	size_t got;
	*bytes = 0;
	while ((got = fread(buf, 1, CHUNK, f)) > 0) {
		crypto_generichash_update(&h, buf, got);
		*bytes += got;
	}
	int e = ferror(f) ? err_set(err, errlen, -EIO, "%s: read failed", path) : 0;
	fclose(f);
	free(buf);
	crypto_generichash_final(&h, sum, CKPT_HASH_BYTES);
	return e;
}

/* Writes path.part, syncs it and renames it to path. */
int ckpt_write_durable(const char *path, int (*fill)(FILE *, const void *, char *, size_t), const void *arg,
		       char *err, size_t errlen)
{
	char tmp[CKPT_PATH_MAX + CKPT_FILE_MAX + 8];
	snprintf(tmp, sizeof(tmp), "%s.part", path);
	FILE *f = fopen(tmp, "wb");
	if (!f)
		return err_set(err, errlen, -errno, "%s: %s", tmp, strerror(errno));
	int e = fill(f, arg, err, errlen);
	if (!e && (fflush(f) || fsync(fileno(f))))
		e = err_set(err, errlen, -EIO, "%s: %s", tmp, strerror(errno));
	if (fclose(f) && !e)
		e = err_set(err, errlen, -EIO, "%s: %s", tmp, strerror(errno));
	if (!e && rename(tmp, path))
		e = err_set(err, errlen, -errno, "rename %s: %s", tmp, strerror(errno));
	if (e) {
		unlink(tmp);
		if (e == -EIO && strstr(err, "write failed"))
			snprintf(err, errlen, "%s: %s", tmp, "write failed (disk full?)");
	}
	return e;
}

int ckpt_fill_st(FILE *f, const void *arg, char *err, size_t errlen)
{
	const struct ckpt_st_file *s = arg;
	return safetensors_write(f, s->t, s->nt, s->meta, s->nmeta, err, errlen);
}

/* Shard k's file, and with tables its rows file, into dir; their
 * manifest lines into mf. */
static int write_shard(const char *tmpdir, const struct ckpt_layout *l, int k, long step,
		       const struct ckpt_state *st, struct ckpt_manifest *mf, char *err, size_t errlen)
{
	struct ckpt_shard *out = &mf->shards[k];
	size_t b = l->shards[k].begin, e = l->shards[k].end;
	struct st_tensor *t = malloc(3 * (size_t)l->nt * sizeof(*t));
	struct st_meta *meta = malloc((10 + 6 * (size_t)l->nt) * sizeof(*meta));
	int nt = 0, nmeta = 0;
	if (!t || !meta) {
		free(t);
		free(meta);
		return err_set(err, errlen, -ENOMEM, "out of memory for a checkpoint header");
	}
	/* "format": "pt" is what safetensors' PyTorch helpers write. */
	ckpt_meta_set(meta, &nmeta, "format", "pt");
	ckpt_meta_set(meta, &nmeta, "pstrain.format", "1");
	ckpt_meta_set(meta, &nmeta, "pstrain.step", "%ld", step);
	ckpt_meta_set(meta, &nmeta, "pstrain.shard", "%d/%d", k, l->nshards);
	ckpt_meta_set(meta, &nmeta, "pstrain.range", "%zu:%zu", b, e);
	ckpt_meta_set(meta, &nmeta, "pstrain.optimizer", "%s", optim_kind_name(l->optim));
	ckpt_meta_set(meta, &nmeta, "pstrain.mode", "%s", !l->cluster ? "local" : l->async ? "async" : "sync");
	ckpt_meta_set(meta, &nmeta, "pstrain.optim_t", "%ld", st->t);
	if (st->test_acc)
		ckpt_meta_set(meta, &nmeta, "pstrain.test_accuracy", "%.6f", *st->test_acc);
	for (int i = 0; i < l->nt; i++)
		add_part(t, &nt, meta, &nmeta, "", &l->t[i], b, e, st->params);
	for (int i = 0; i < l->nt; i++)
		add_part(t, &nt, meta, &nmeta, "optim.m.", &l->t[i], b, e, st->m);
	for (int i = 0; i < l->nt; i++)
		add_part(t, &nt, meta, &nmeta, "optim.v.", &l->t[i], b, e, st->v);

	char path[CKPT_PATH_MAX + CKPT_FILE_MAX];
	snprintf(out->file, sizeof(out->file), "shard-%d-of-%d.safetensors", k, l->nshards);
	snprintf(path, sizeof(path), "%s/%s", tmpdir, out->file);
	out->begin = b;
	out->end = e;
	struct ckpt_st_file sf = { t, nt, meta, nmeta };
	int r = ckpt_write_durable(path, ckpt_fill_st, &sf, err, errlen);
	free(t);
	free(meta);
	/* Hashing what is on disk, not what was meant to be written, so the
	 * checksum also vouches for the write. */
	if (!r)
		r = ckpt_hash_file(path, out->sum, &out->bytes, err, errlen);
	if (!r && l->tables.fields)
		r = ckpt_rows_write(tmpdir, l, k, step, st->rows, &mf->rows[k], err, errlen);
	return r;
}

/* A cluster step directory that some ps has not finished writing yet (or
 * never will: it was killed): no `manifest`, and not every
 * manifest-K-of-N present (none at all: a ps created the directory and
 * stopped before its manifest). Not a damaged checkpoint, so resuming
 * passes over it silently instead of refusing it. */
int ckpt_step_partial(const char *stepdir)
{
	char p[CKPT_PATH_MAX + CKPT_FILE_MAX];
	snprintf(p, sizeof(p), "%s/%s", stepdir, CKPT_MANIFEST);
	if (access(p, F_OK) == 0)
		return 0;
	DIR *d = opendir(stepdir);
	if (!d)
		return 0;
	unsigned char have[CONFIG_MAX_HOSTS] = { 0 };
	int n = 0, count = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		int k, m;
		char tail;
		if (sscanf(de->d_name, "manifest-%d-of-%d%c", &k, &m, &tail) != 2 || m <= 0 ||
		    m > CONFIG_MAX_HOSTS || k < 0 || k >= m)
			continue;
		if (n && m != n)
			return closedir(d), 0;   /* disagreeing manifests: damaged, let loading say so */
		n = m;
		count += !have[k];
		have[k] = 1;
	}
	closedir(d);
	return count == 0 || count < n;
}

/* Complete = its manifest reads and every file it lists has the listed
 * size. Checksums are left to loading: rotation must stay cheap. */
int ckpt_step_complete(const char *stepdir)
{
	struct ckpt_manifest *mf = malloc(sizeof(*mf));
	char err[256], p[CKPT_PATH_MAX];
	int ok = mf && manifest_read(mf, stepdir, err, sizeof(err)) == 0;
	for (int k = 0; ok && k < 2 * mf->nshards; k++) {
		const struct ckpt_shard *f = k < mf->nshards ? &mf->shards[k] : &mf->rows[k - mf->nshards];
		struct stat sb;
		if (k >= mf->nshards && !mf->tables.fields)
			break;
		snprintf(p, sizeof(p), "%s/%s", stepdir, f->file);
		ok = stat(p, &sb) == 0 && (uint64_t)sb.st_size == f->bytes;
	}
	free(mf);
	return ok;
}

/* Keeps the newest `keep` complete checkpoints; deletes older complete
 * ones and any incomplete leftovers older than the oldest kept one. */
void ckpt_rotate(const char *dir, int keep, FILE *log)
{
	long *steps;
	int n = ckpt_list_steps(dir, &steps), kept = 0;
	char p[CKPT_PATH_MAX];
	for (int i = 0; i < n; i++) {
		checkpoint_step_dir(p, sizeof(p), dir, steps[i]);
		int complete = ckpt_step_complete(p);
		if (complete && kept < keep) {
			kept++;
			continue;
		}
		if (kept < keep)   /* an incomplete one newer than the kept ones: leave it to be seen */
			continue;
		if (remove_flat_dir(p) == 0 && log)
			fprintf(log, "checkpoint: removed %s (keep_checkpoints = %d)\n", p, keep);
	}
	free(steps);
}

/* Leftover temporary directories of earlier steps are crashed writes. */
static void remove_stale_tmp(const char *dir, long step)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *de;
	char p[CKPT_PATH_MAX];
	while ((de = readdir(d))) {
		long s;
		int pid;
		if (sscanf(de->d_name, ".tmp-step-%8ld-%d", &s, &pid) == 2 && s < step) {
			snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
			remove_flat_dir(p);
		}
	}
	closedir(d);
}

static void manifest_init(struct ckpt_manifest *mf, const struct ckpt_layout *l, long step)
{
	mf->step = step;
	mf->nparams = l->nparams;
	memcpy(mf->model_hash, l->model_hash, CKPT_HASH_BYTES);
	memcpy(mf->layout_hash, l->layout_hash, CKPT_HASH_BYTES);
	memcpy(mf->config_hash, l->config_hash, CKPT_HASH_BYTES);
	mf->nshards = l->nshards;
	mf->tables = l->tables;
	mf->slices = l->slices;
	mf->batch = l->batch;
}

int checkpoint_save(const char *dir, const struct ckpt_layout *l, long step, const struct ckpt_state *st,
		    int keep, FILE *log, char *err, size_t errlen)
{
	char tmp[CKPT_PATH_MAX], final[CKPT_PATH_MAX], p[CKPT_PATH_MAX + CKPT_FILE_MAX];
	if (step < 0 || step > CKPT_MAX_STEP)
		return err_set(err, errlen, -ERANGE, "checkpoint step %ld does not fit step-NNNNNNNN", step);
	if (strlen(dir) + 40 >= sizeof(tmp))
		return err_set(err, errlen, -ENAMETOOLONG, "%s: checkpoint_dir path too long", dir);
	int e = file_make_dirs(dir, NULL);
	if (e)
		return err_set(err, errlen, e, "%s: cannot create checkpoint_dir: %s", dir, strerror(-e));
	checkpoint_step_dir(final, sizeof(final), dir, step);
	if (access(final, F_OK) == 0 && ckpt_step_complete(final))
		return 0;
	remove_stale_tmp(dir, step);
	snprintf(tmp, sizeof(tmp), "%s/.tmp-step-%08ld-%d", dir, step, (int)getpid());
	if (access(tmp, F_OK) == 0)
		remove_flat_dir(tmp);
	if (mkdir(tmp, 0755))
		return err_set(err, errlen, -errno, "%s: %s", tmp, strerror(errno));

	struct ckpt_manifest *mf = calloc(1, sizeof(*mf));
	if (!mf) {
		e = err_set(err, errlen, -ENOMEM, "out of memory for a manifest");
		goto fail;
	}
	manifest_init(mf, l, step);
	for (int k = 0; k < l->nshards; k++) {
		e = write_shard(tmp, l, k, step, &st[k], mf, err, errlen);
		if (e)
			goto fail;
		hooks_crash_point(&l->hooks, "shard", step);
	}
	hooks_crash_point(&l->hooks, "manifest", step);
	snprintf(p, sizeof(p), "%s/%s", tmp, CKPT_MANIFEST);
	struct manifest_arg ma = { mf, -1 };
	e = ckpt_write_durable(p, manifest_fill, &ma, err, errlen);
	if (e)
		goto fail;
	if ((e = fsync_dir(tmp))) {
		err_set(err, errlen, e, "%s: fsync: %s", tmp, strerror(-e));
		goto fail;
	}
	hooks_crash_point(&l->hooks, "publish", step);
	if (access(final, F_OK) == 0) {
		/* Incomplete (complete ones returned above): set it aside rather
		 * than delete what someone may want to look at. */
		snprintf(p, sizeof(p), "%s/.broken-step-%08ld-%d", dir, step, (int)getpid());
		if (rename(final, p) == 0 && log)
			fprintf(log, "checkpoint: moved incomplete %s aside to %s\n", final, p);
	}
	if (rename(tmp, final)) {
		e = err_set(err, errlen, -errno, "rename %s to %s: %s", tmp, final, strerror(errno));
		goto fail;
	}
	if ((e = fsync_dir(dir))) {
		err_set(err, errlen, e, "%s: fsync: %s", dir, strerror(-e));
		free(mf);
		return e;
	}
	free(mf);
	if (log)
		fprintf(log, "checkpoint: saved %s\n", final);
	ckpt_rotate(dir, keep, log);
	return 0;
fail:
	free(mf);
	remove_flat_dir(tmp);
	return e;
}

/* Whether stepdir holds files of another layout than n shards: `local`'s
 * manifest, or a manifest or shard file "-of-M" with M != n (a run of
 * another layout tried this step and did not finish it, or finished it).
 * With remove, unlinks those files. */
static int step_foreign(const char *stepdir, int n, int remove)
{
	DIR *d = opendir(stepdir);
	int found = 0;
	if (!d)
		return 0;
	struct dirent *de;
	char p[CKPT_PATH_MAX + CKPT_FILE_MAX];
	while ((de = readdir(d))) {
		int k, m, other = strcmp(de->d_name, CKPT_MANIFEST) == 0;
		if (sscanf(de->d_name, "manifest-%d-of-%d", &k, &m) == 2 ||
		    sscanf(de->d_name, "shard-%d-of-%d", &k, &m) == 2 || sscanf(de->d_name, "rows-%d-of-%d", &k, &m) == 2)
			other = other || m != n;
		if (!other)
			continue;
		found = 1;
		snprintf(p, sizeof(p), "%s/%s", stepdir, de->d_name);
		if (remove)
			unlink(p);
	}
	closedir(d);
	return found;
}

int checkpoint_save_shard(const char *dir, const struct ckpt_layout *l, long step, int k,
			  const struct ckpt_state *st, int redo, int keep, FILE *log, char *err, size_t errlen)
{
	char sd[CKPT_PATH_MAX], p[CKPT_PATH_MAX + CKPT_FILE_MAX];
	if (step < 0 || step > CKPT_MAX_STEP)
		return err_set(err, errlen, -ERANGE, "checkpoint step %ld does not fit step-NNNNNNNN", step);
	if (strlen(dir) + 40 >= sizeof(sd))
		return err_set(err, errlen, -ENAMETOOLONG, "%s: checkpoint_dir path too long", dir);
	checkpoint_step_dir(sd, sizeof(sd), dir, step);
	int e = file_make_dirs(sd, NULL);
	if (e)
		return err_set(err, errlen, e, "%s: cannot create: %s", sd, strerror(-e));
	/* A run of another layout had this step: kept if it completed it
	 * (as a complete step of this layout would be), else its unfinished
	 * files go, or the step would hold two layouts and never load. */
	if (step_foreign(sd, l->nshards, 0)) {
		if (ckpt_step_complete(sd)) {
			if (log)
				fprintf(log, "checkpoint: %s holds a complete checkpoint of another layout; shard %d of %d not written\n",
					sd, k, l->nshards);
			return 0;
		}
		step_foreign(sd, l->nshards, 1);
		if (log)
			fprintf(log, "checkpoint: removed the unfinished files of another layout from %s\n", sd);
	}
	snprintf(p, sizeof(p), "%s/manifest-%d-of-%d", sd, k, l->nshards);
	if (access(p, F_OK) == 0 && (!redo || ckpt_step_complete(sd)))
		return 0;   /* saved before (a resumed ps reaching a step it has) */
	struct ckpt_manifest *mf = calloc(1, sizeof(*mf));
	if (!mf)
		return err_set(err, errlen, -ENOMEM, "out of memory for a manifest");
	manifest_init(mf, l, step);
	slow_disk(l);
	e = write_shard(sd, l, k, step, st, mf, err, errlen);
	if (!e)
		hooks_crash_point(&l->hooks, "manifest", step);
	struct manifest_arg ma = { mf, k };
	if (!e)
		e = ckpt_write_durable(p, manifest_fill, &ma, err, errlen);
	if (!e && (e = fsync_dir(sd)))
		err_set(err, errlen, e, "%s: fsync: %s", sd, strerror(-e));
	if (!e && (e = fsync_dir(dir)))
		err_set(err, errlen, e, "%s: fsync: %s", dir, strerror(-e));
	free(mf);
	if (e)
		return e;
	if (log)
		fprintf(log, "checkpoint: saved shard %d of %d in %s\n", k, l->nshards, sd);
	ckpt_rotate(dir, keep, log);
	return 0;
}
