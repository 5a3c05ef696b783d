/* Checkpoint directories: manifest, durable publishing, rotation, restore
 * and inspection; see checkpoint.h. The file format is safetensors.c's. */
#include "checkpoint.h"
#include "fileio.h"
#include "manifest.h"

#include "../base/err.h"
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

#define CKPT_MAX_STEP 99999999L   /* step-NNNNNNNN: 8 digits */


/* ---- small helpers ---- */

/* The test hooks, read once when a run's layout is made (checkpoint.h). */
static void hooks_read(struct ckpt_hooks *h)
{
	const char *crash = getenv("PSTRAIN_CKPT_CRASH"), *ms = getenv("PSTRAIN_CKPT_DELAY_MS");
	char *end;
	memset(h, 0, sizeof(*h));
	if (crash)
		snprintf(h->crash, sizeof(h->crash), "%s", crash);
	h->delay_ms = ms ? strtol(ms, &end, 10) : 0;
}

/* crash "POINT" or "POINT:STEP" (only when saving STEP): SIGKILL here. */
static void crash_point(const struct ckpt_layout *l, const char *name, long step)
{
	const char *want = l->hooks.crash;
	size_t n = strlen(name);
	if (strncmp(want, name, n) != 0)
		return;
	if (want[n] == '\0' || (want[n] == ':' && strtol(want + n + 1, NULL, 10) == step))
		raise(SIGKILL);
}

/* A save takes delay_ms longer, as on a slow or network disk (tests check
 * that nothing waits for a ps's save). */
static void slow_disk(const struct ckpt_layout *l)
{
	long n = l->hooks.delay_ms;
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
static int list_steps(const char *dir, long **out)
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
static void hash_layout(const struct ckpt_layout *l, int nshards, enum optim_kind optim, int async,
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
		       int async, char *err, size_t errlen)
{
	memset(l, 0, sizeof(*l));
	l->async = async;
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
	if (config_hash(c, l->config_hash))
		return err_set(err, errlen, -ENOMEM, "out of memory hashing the config");
	crypto_generichash_state h;
	hash_tensors(l, &h);
	crypto_generichash_final(&h, l->model_hash, CKPT_HASH_BYTES);
	hash_layout(l, nshards, l->optim, async, l->layout_hash);
	return 0;
}

int ckpt_layout_init(struct ckpt_layout *l, const struct model *m, int nshards, const struct config *c,
		     char *err, size_t errlen)
{
	return layout_init(l, m, nshards, c, 0, err, errlen);
}

int ckpt_layout_init_cluster(struct ckpt_layout *l, const struct model *m, int nshards,
			     const struct config *c, char *err, size_t errlen)
{
	int e = layout_init(l, m, nshards, c, c->train.mode == MODE_ASYNC, err, errlen);
	l->cluster = 1;
	return e;
}

/* ---- writing ---- */

static void meta_set(struct st_meta *m, int *n, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void meta_set(struct st_meta *m, int *n, const char *key, const char *fmt, ...)
{
	va_list ap;
	snprintf(m[*n].key, sizeof(m[*n].key), "%s", key);
	va_start(ap, fmt);
	vsnprintf(m[*n].value, sizeof(m[*n].value), fmt, ap);
	va_end(ap);
	(*n)++;
}

/* The part [lo, hi) of tensor t inside global range [b, e); 0 if none. */
static int tensor_part(const struct tensor_info *t, size_t b, size_t e, size_t *lo, size_t *hi)
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
static void part_text(char *out, size_t len, size_t lo, size_t hi, int ndim, const int *shape)
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
	if (!data || !tensor_part(t, b, e, &lo, &hi))
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
		part_text(part, sizeof(part), lo, hi, t->ndim, t->shape);
		snprintf(key, sizeof(key), "pstrain.part.%s", s->name);
		meta_set(meta, nmeta, key, "%s", part);
	}
}

static int hash_file(const char *path, uint8_t sum[CKPT_HASH_BYTES], uint64_t *bytes, char *err, size_t errlen)
{
	unsigned char *buf;
	size_t len;
	int e = file_read(path, &buf, &len, err, errlen);
	if (e)
		return e;
	crypto_generichash(sum, CKPT_HASH_BYTES, buf, len, NULL, 0);
	*bytes = len;
	free(buf);
	return 0;
}

/* Writes path.part, syncs it and renames it to path. */
static int write_durable(const char *path, int (*fill)(FILE *, const void *, char *, size_t), const void *arg,
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

struct shard_file {
	const struct st_tensor *t;
	int nt;
	const struct st_meta *meta;
	int nmeta;
};

static int fill_shard(FILE *f, const void *arg, char *err, size_t errlen)
{
	const struct shard_file *s = arg;
	return safetensors_write(f, s->t, s->nt, s->meta, s->nmeta, err, errlen);
}

static int write_shard(const char *tmpdir, const struct ckpt_layout *l, int k, long step,
		       const struct ckpt_state *st, struct ckpt_shard *out, char *err, size_t errlen)
{
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
	meta_set(meta, &nmeta, "format", "pt");
	meta_set(meta, &nmeta, "pstrain.format", "1");
	meta_set(meta, &nmeta, "pstrain.step", "%ld", step);
	meta_set(meta, &nmeta, "pstrain.shard", "%d/%d", k, l->nshards);
	meta_set(meta, &nmeta, "pstrain.range", "%zu:%zu", b, e);
	meta_set(meta, &nmeta, "pstrain.optimizer", "%s", optim_kind_name(l->optim));
	meta_set(meta, &nmeta, "pstrain.mode", "%s", !l->cluster ? "local" : l->async ? "async" : "sync");
	meta_set(meta, &nmeta, "pstrain.optim_t", "%ld", st->t);
	if (st->test_acc)
		meta_set(meta, &nmeta, "pstrain.test_accuracy", "%.6f", *st->test_acc);
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
	struct shard_file sf = { t, nt, meta, nmeta };
	int r = write_durable(path, fill_shard, &sf, err, errlen);
	free(t);
	free(meta);
	/* Hashing what is on disk, not what was meant to be written, so the
	 * checksum also vouches for the write. */
	if (!r)
		r = hash_file(path, out->sum, &out->bytes, err, errlen);
	return r;
}

/* A cluster step directory that some ps has not finished writing yet (or
 * never will: it was killed): no `manifest`, and not every
 * manifest-K-of-N present (none at all: a ps created the directory and
 * stopped before its manifest). Not a damaged checkpoint, so resuming
 * passes over it silently instead of refusing it. */
static int step_partial(const char *stepdir)
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
static int step_complete(const char *stepdir)
{
	struct ckpt_manifest *mf = malloc(sizeof(*mf));
	char err[256], p[CKPT_PATH_MAX];
	int ok = mf && manifest_read(mf, stepdir, err, sizeof(err)) == 0;
	for (int k = 0; ok && k < mf->nshards; k++) {
		struct stat sb;
		snprintf(p, sizeof(p), "%s/%s", stepdir, mf->shards[k].file);
		ok = stat(p, &sb) == 0 && (uint64_t)sb.st_size == mf->shards[k].bytes;
	}
	free(mf);
	return ok;
}

/* Keeps the newest `keep` complete checkpoints; deletes older complete
 * ones and any incomplete leftovers older than the oldest kept one. */
static void rotate(const char *dir, int keep, FILE *log)
{
	long *steps;
	int n = list_steps(dir, &steps), kept = 0;
	char p[CKPT_PATH_MAX];
	for (int i = 0; i < n; i++) {
		checkpoint_step_dir(p, sizeof(p), dir, steps[i]);
		int complete = step_complete(p);
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
	if (access(final, F_OK) == 0 && step_complete(final))
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
		e = write_shard(tmp, l, k, step, &st[k], &mf->shards[k], err, errlen);
		if (e)
			goto fail;
		crash_point(l, "shard", step);
	}
	crash_point(l, "manifest", step);
	snprintf(p, sizeof(p), "%s/%s", tmp, CKPT_MANIFEST);
	struct manifest_arg ma = { mf, -1 };
	e = write_durable(p, manifest_fill, &ma, err, errlen);
	if (e)
		goto fail;
	if ((e = fsync_dir(tmp))) {
		err_set(err, errlen, e, "%s: fsync: %s", tmp, strerror(-e));
		goto fail;
	}
	crash_point(l, "publish", step);
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
	rotate(dir, keep, log);
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
		    sscanf(de->d_name, "shard-%d-of-%d", &k, &m) == 2)
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
		if (step_complete(sd)) {
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
	if (access(p, F_OK) == 0 && (!redo || step_complete(sd)))
		return 0;   /* saved before (a resumed ps reaching a step it has) */
	struct ckpt_manifest *mf = calloc(1, sizeof(*mf));
	if (!mf)
		return err_set(err, errlen, -ENOMEM, "out of memory for a manifest");
	manifest_init(mf, l, step);
	slow_disk(l);
	e = write_shard(sd, l, k, step, st, &mf->shards[k], err, errlen);
	if (!e)
		crash_point(l, "manifest", step);
	struct manifest_arg ma = { mf, k };
	if (!e)
		e = write_durable(p, manifest_fill, &ma, err, errlen);
	if (!e && (e = fsync_dir(sd)))
		err_set(err, errlen, e, "%s: fsync: %s", sd, strerror(-e));
	if (!e && (e = fsync_dir(dir)))
		err_set(err, errlen, e, "%s: fsync: %s", dir, strerror(-e));
	free(mf);
	if (e)
		return e;
	if (log)
		fprintf(log, "checkpoint: saved shard %d of %d in %s\n", k, l->nshards, sd);
	rotate(dir, keep, log);
	return 0;
}

int checkpoint_shard_open(struct safetensors *st, const char *stepdir, const struct ckpt_manifest *mf,
			  int k, char *err, size_t errlen)
{
	char path[CKPT_PATH_MAX];
	unsigned char *buf;
	size_t len;
	uint8_t sum[CKPT_HASH_BYTES];
	memset(st, 0, sizeof(*st));
	snprintf(path, sizeof(path), "%s/%s", stepdir, mf->shards[k].file);
	int e = file_read(path, &buf, &len, err, errlen);
	if (e)
		return e;
	if (len != mf->shards[k].bytes) {
		free(buf);
		return err_set(err, errlen, -EINVAL, "%s: truncated or extended: %zu bytes, the manifest says %" PRIu64,
			       path, len, mf->shards[k].bytes);
	}
	crypto_generichash(sum, sizeof(sum), buf, len, NULL, 0);
	if (sodium_memcmp(sum, mf->shards[k].sum, sizeof(sum)) != 0) {
		free(buf);
		return err_set(err, errlen, -EINVAL, "%s: checksum mismatch (file damaged)", path);
	}
	e = safetensors_parse(st, buf, len, path, err, errlen);
	if (e)
		return e;
	char want[64];
	const char *r = safetensors_meta(st, "pstrain.range");
	snprintf(want, sizeof(want), "%zu:%zu", mf->shards[k].begin, mf->shards[k].end);
	if (!r || strcmp(r, want))
		return err_set(err, errlen, -EINVAL, "%s: pstrain.range is %s, the manifest says %s", path,
			       r ? r : "missing", want);
	return 0;
}

/* Copies the stored part of model tensor t (named prefix+name) that falls
 * in [b, e) into out (indexed from b). */
static int copy_part(const struct safetensors *st, const char *path, const char *prefix,
		     const struct tensor_info *t, size_t sb, size_t se, size_t b, size_t e, float *out,
		     char *err, size_t errlen)
{
	size_t lo, hi, want_lo, want_hi;
	char name[ST_NAME_MAX], key[ST_META_MAX], want[ST_META_MAX];
	if (!tensor_part(t, sb, se, &lo, &hi) || !tensor_part(t, b > sb ? b : sb, e < se ? e : se, &want_lo, &want_hi))
		return 0;
	snprintf(name, sizeof(name), "%s%s", prefix, t->name);
	const struct st_tensor *s = safetensors_find(st, name);
	if (!s)
		return err_set(err, errlen, -EINVAL, "%s: tensor %s is missing", path, name);
	if (lo == 0 && hi == t->n) {
		int ok = s->ndim == t->ndim;
		for (int d = 0; ok && d < t->ndim; d++)
			ok = s->shape[d] == (uint64_t)t->shape[d];
		if (!ok)
			return err_set(err, errlen, -EINVAL, "%s: tensor %s has a different shape than the model's", path, name);
	} else {
		part_text(want, sizeof(want), lo, hi, t->ndim, t->shape);
		snprintf(key, sizeof(key), "pstrain.part.%s", name);
		const char *v = safetensors_meta(st, key);
		if (s->ndim != 1 || s->n != hi - lo || !v || strcmp(v, want))
			return err_set(err, errlen, -EINVAL, "%s: tensor %s is not the part %s the model expects", path,
				       name, want);
	}
	safetensors_copy(st, s, want_lo - lo, want_hi - want_lo, out + (t->off + want_lo - b));
	return 0;
}

void checkpoint_shape_text(char *out, size_t len, int ndim, const uint64_t *shape)
{
	size_t n = 0;
	snprintf(out, len, "%s", ndim ? "" : "scalar");
	for (int d = 0; d < ndim && n < len; d++)
		n += (size_t)snprintf(out + n, len - n, "%s%" PRIu64, d ? "x" : "", shape[d]);
}

int checkpoint_part_of(const struct safetensors *st, const struct st_tensor *s, const char *path,
		       struct ckpt_part *out, char *err, size_t errlen)
{
	char key[ST_META_MAX];
	snprintf(key, sizeof(key), "pstrain.part.%s", s->name);
	const char *v = safetensors_meta(st, key);
	memset(out, 0, sizeof(*out));
	if (!v) {
		out->hi = out->n = s->n;
		out->ndim = s->ndim;
		memcpy(out->shape, s->shape, sizeof(out->shape));
		return 0;
	}
	if (checkpoint_part_parse(v, &out->lo, &out->hi, &out->ndim, out->shape, &out->n) ||
	    out->hi - out->lo != s->n)
		return err_set(err, errlen, -EINVAL, "%s: bad %s \"%s\"", path, key, v);
	return 0;
}

/* A checkpoint tensor's name and where its stored parts lie. */
struct ck_tensor {
	char name[ST_NAME_MAX];
	struct ckpt_part p;
};

/* The parameter tensors (not optim.*) of every shard file, each once,
 * into *out (malloc'd); returns the count or a negative errno with err. */
static int ck_tensors(const char *stepdir, const struct ckpt_manifest *mf, struct ck_tensor **out,
		      char *err, size_t errlen)
{
	struct ck_tensor *ct = NULL;
	int n = 0, cap = 0, e = 0;
	for (int k = 0; k < mf->nshards && !e; k++) {
		struct safetensors st;
		e = checkpoint_shard_open(&st, stepdir, mf, k, err, errlen);
		for (int i = 0; !e && i < st.nt; i++) {
			const struct st_tensor *s = &st.t[i];
			int seen = strncmp(s->name, "optim.", 6) == 0;
			for (int j = 0; j < n && !seen; j++)
				seen = strcmp(ct[j].name, s->name) == 0;
			if (seen)
				continue;
			if (n == cap) {
				cap = cap ? 2 * cap : 32;
				struct ck_tensor *w = realloc(ct, (size_t)cap * sizeof(*ct));
				if (!w) {
					e = err_set(err, errlen, -ENOMEM, "out of memory");
					break;
				}
				ct = w;
			}
			struct ck_tensor *c = &ct[n++];
			char path[CKPT_PATH_MAX];
			snprintf(c->name, sizeof(c->name), "%s", s->name);
			snprintf(path, sizeof(path), "%s/%s", stepdir, mf->shards[k].file);
			e = checkpoint_part_of(&st, s, path, &c->p, err, errlen);
		}
		safetensors_free(&st);
	}
	if (e) {
		free(ct);
		return e;
	}
	*out = ct;
	return n;
}

/* The checkpoint in stepdir is another model's: err names the first
 * tensor that differs (checkpoint.h). */
static int model_diff(const char *stepdir, const struct ckpt_manifest *mf, const struct ckpt_layout *l,
		      char *err, size_t errlen)
{
	struct ck_tensor *ct = NULL;
	int n = ck_tensors(stepdir, mf, &ct, err, errlen);
	if (n < 0)
		return n;
	char what[ST_NAME_MAX + 160] = "", a[64], b[64];
	for (int i = 0; i < l->nt && !what[0]; i++) {
		const struct tensor_info *t = &l->t[i];
		uint64_t shape[ST_MAX_DIMS];
		int j = 0;
		while (j < n && strcmp(ct[j].name, t->name))
			j++;
		for (int d = 0; d < t->ndim; d++)
			shape[d] = (uint64_t)t->shape[d];
		if (j == n) {
			snprintf(what, sizeof(what), "tensor %s of this config's model is not in the checkpoint",
				 t->name);
			break;
		}
		checkpoint_shape_text(a, sizeof(a), ct[j].p.ndim, ct[j].p.shape);
		checkpoint_shape_text(b, sizeof(b), t->ndim, shape);
		if (strcmp(a, b))
			snprintf(what, sizeof(what), "tensor %s is %s in the checkpoint but %s in this config's model",
				 t->name, a, b);
	}
	for (int j = 0; j < n && !what[0]; j++) {
		int i = 0;
		while (i < l->nt && strcmp(ct[j].name, l->t[i].name))
			i++;
		if (i == l->nt)
			snprintf(what, sizeof(what), "the checkpoint has tensor %s, which this config's model lacks",
				 ct[j].name);
	}
	if (!what[0])
		snprintf(what, sizeof(what), "its tensors are laid out otherwise than this config's model's");
	free(ct);
	return err_set(err, errlen, -EINVAL, "%s holds another model (%zu parameters, this config's has %zu): %s; give this config its own checkpoint_dir, or start over with --fresh",
		       stepdir, mf->nparams, l->nparams, what);
}

/* *out from the manifest mf of stepdir, compared with layout l. */
static void describe(const struct ckpt_manifest *mf, const char *stepdir, const struct ckpt_layout *l,
		     struct ckpt_info *out)
{
	memset(out, 0, sizeof(*out));
	out->step = mf->step;
	out->nparams = mf->nparams;
	out->nshards = mf->nshards;
	out->cluster = manifest_nshards(stepdir) > 0;
	memcpy(out->shards, mf->shards, sizeof(out->shards));
	out->model_same = mf->nparams == l->nparams &&
			  sodium_memcmp(mf->model_hash, l->model_hash, CKPT_HASH_BYTES) == 0;
	for (int o = 0; out->model_same && o < 3 && !out->known; o++)
		for (int a = 0; a < 2 && !out->known; a++) {
			uint8_t h[CKPT_HASH_BYTES];
			hash_layout(l, mf->nshards, (enum optim_kind)o, a, h);
			if (sodium_memcmp(h, mf->layout_hash, CKPT_HASH_BYTES) == 0) {
				out->known = 1;
				out->optim = (enum optim_kind)o;
				out->async = a;
			}
		}
}

int checkpoint_describe(const char *stepdir, const struct ckpt_layout *l, struct ckpt_info *out,
			char *err, size_t errlen)
{
	struct ckpt_manifest *mf = malloc(sizeof(*mf));
	if (!mf)
		return err_set(err, errlen, -ENOMEM, "out of memory for a manifest");
	int e = manifest_read(mf, stepdir, err, errlen);
	if (!e)
		describe(mf, stepdir, l, out);
	free(mf);
	return e;
}

static int optim_refusal(const char *stepdir, const char *had, const struct ckpt_layout *l, char *err,
			 size_t errlen)
{
	return err_set(err, errlen, -EINVAL, "%s was written with optimizer %s, this config has %s: set [train] optimizer = %s to continue it, or start over with --fresh or another checkpoint_dir",
		       stepdir, had, optim_kind_name(l->optim), had);
}

/* The model (always) and, for a resume, the optimizer kind, of the
 * checkpoint in stepdir with manifest mf, described by in. */
static int fits(const char *stepdir, const struct ckpt_manifest *mf, const struct ckpt_info *in,
		const struct ckpt_layout *l, int resume, char *err, size_t errlen)
{
	if (!in->model_same)
		return model_diff(stepdir, mf, l, err, errlen);
	if (resume && in->known && in->optim != l->optim)
		return optim_refusal(stepdir, optim_kind_name(in->optim), l, err, errlen);
	return 0;
}

int checkpoint_fits(const char *stepdir, const struct ckpt_info *in, const struct ckpt_layout *l,
		    char *err, size_t errlen)
{
	struct ckpt_manifest *mf = malloc(sizeof(*mf));
	if (!mf)
		return err_set(err, errlen, -ENOMEM, "out of memory for a manifest");
	int e = manifest_read(mf, stepdir, err, errlen);
	if (!e)
		e = fits(stepdir, mf, in, l, 1, err, errlen);
	free(mf);
	return e;
}

/* One shard file's optimizer step count t and, where recorded, the run's
 * final test accuracy; the optimizer must be l's for a resume. */
static int shard_meta(const struct safetensors *st, const char *path, const char *stepdir,
		      const struct ckpt_layout *l, int resume, long *t, double *acc, char *err,
		      size_t errlen)
{
	const char *ts = safetensors_meta(st, "pstrain.optim_t");
	const char *os = safetensors_meta(st, "pstrain.optimizer");
	const char *as = safetensors_meta(st, "pstrain.test_accuracy");
	char *end;
	*t = ts ? strtol(ts, &end, 10) : -1;
	if (!ts || *end || *t < 0)
		return err_set(err, errlen, -EINVAL, "%s: pstrain.optim_t missing or malformed", path);
	if (resume && (!os || strcmp(os, optim_kind_name(l->optim))))
		return optim_refusal(stepdir, os ? os : "(none recorded)", l, err, errlen);
	if (as) {
		double a = strtod(as, &end);
		if (*end || !(a >= 0 && a <= 1))
			return err_set(err, errlen, -EINVAL, "%s: pstrain.test_accuracy \"%s\" is not in [0, 1]",
				       path, as);
		*acc = a;
	}
	return 0;
}

int checkpoint_load(const char *stepdir, struct ckpt_load *ld, char *err, size_t errlen)
{
	const struct ckpt_layout *l = ld->l;
	size_t begin = ld->begin, end = ld->end;
	float *m = ld->m, *v = ld->v;
	struct ckpt_manifest *mf = malloc(sizeof(*mf));
	struct ckpt_info *in = malloc(sizeof(*in));
	int e = mf && in ? 0 : err_set(err, errlen, -ENOMEM, "out of memory for a manifest");
	if (!e)
		e = manifest_read(mf, stepdir, err, errlen);
	if (!e) {
		describe(mf, stepdir, l, in);
		e = fits(stepdir, mf, in, l, ld->resume, err, errlen);
	}
	long opt_t = -2;   /* none read yet */
	double acc = -1;
	for (int k = 0; !e && k < mf->nshards; k++) {
		size_t sb = mf->shards[k].begin, se = mf->shards[k].end;
		if (se <= begin || sb >= end)
			continue;
		struct safetensors st;
		char path[CKPT_PATH_MAX];
		long tv;
		snprintf(path, sizeof(path), "%s/%s", stepdir, mf->shards[k].file);
		e = checkpoint_shard_open(&st, stepdir, mf, k, err, errlen);
		if (!e)
			e = shard_meta(&st, path, stepdir, l, ld->resume, &tv, &acc, err, errlen);
		/* Async shards count their own updates; read into another
		 * layout, one range may come from shards that disagree. */
		if (!e)
			opt_t = opt_t == -2 || opt_t == tv ? tv : -1;
		for (int i = 0; i < l->nt && !e; i++) {
			e = copy_part(&st, path, "", &l->t[i], sb, se, begin, end, ld->params, err, errlen);
			if (!e && m)
				e = copy_part(&st, path, "optim.m.", &l->t[i], sb, se, begin, end, m, err, errlen);
			if (!e && v)
				e = copy_part(&st, path, "optim.v.", &l->t[i], sb, se, begin, end, v, err, errlen);
		}
		safetensors_free(&st);
	}
	if (!e) {
		ld->t = opt_t < 0 ? -1 : opt_t;
		ld->step = mf->step;
		ld->async = in->known ? in->async : -1;
		ld->test_acc = acc;
	}
	free(mf);
	free(in);
	return e;
}

int checkpoint_restore(const char *dir, struct ckpt_load *ld, FILE *log, char *err, size_t errlen)
{
	return checkpoint_restore_upto(dir, CKPT_MAX_STEP, ld, log, err, errlen);
}

int checkpoint_restore_upto(const char *dir, long upto, struct ckpt_load *ld, FILE *log, char *err,
			    size_t errlen)
{
	long *steps;
	int n = list_steps(dir, &steps);
	if (n > 0) {
		int j = 0;
		for (int i = 0; i < n; i++)
			if (steps[i] <= upto)
				steps[j++] = steps[i];
		n = j;
	}
	if (n == -ENOENT || n == 0) {
		free(steps);
		return err_set(err, errlen, -ENOENT, "%s: no checkpoint", dir);
	}
	if (n < 0)
		return err_set(err, errlen, n, "%s: %s", dir, strerror(-n));
	char p[CKPT_PATH_MAX], first[CONFIG_ERR_MAX] = "";
	int e = -ENOENT;
	for (int i = 0; i < n; i++) {
		checkpoint_step_dir(p, sizeof(p), dir, steps[i]);
		if (step_partial(p)) {
			if (log)
				fprintf(log, "checkpoint: skipping %s: incomplete (not every ps has written its shard)\n", p);
			continue;
		}
		e = checkpoint_load(p, ld, err, errlen);
		if (e == 0)
			break;
		if (e == -ENOMEM)
			break;
		if (log)
			fprintf(log, "checkpoint: refusing %s\n", err);
		if (!first[0])
			snprintf(first, sizeof(first), "%s", err);
	}
	free(steps);
	if (e == -EINVAL || (e == -ENOENT && first[0]))
		e = err_set(err, errlen, -EINVAL, "no usable checkpoint in %s (newest refused: %s); fix it, use another checkpoint_dir or start over with --fresh",
			    dir, first);
	else if (e == -ENOENT)
		err_set(err, errlen, -ENOENT, "%s: no complete checkpoint", dir);
	return e;
}

int checkpoint_resolve(const char *dir, char *out, size_t outlen, char *err, size_t errlen)
{
	char p[CKPT_PATH_MAX];
	snprintf(p, sizeof(p), "%s/%s", dir, CKPT_MANIFEST);
	if (access(p, F_OK) == 0 || manifest_nshards(dir) > 0) {
		if (snprintf(out, outlen, "%s", dir) >= (int)outlen)
			return err_set(err, errlen, -ENAMETOOLONG, "%s: path too long", dir);
		return 0;
	}
	long *steps;
	int n = list_steps(dir, &steps);
	if (n < 0)
		return err_set(err, errlen, n == -ENOENT ? -ENOENT : n, "%s: %s", dir, strerror(-n));
	int e = err_set(err, errlen, -ENOENT, "%s: neither a checkpoint (no manifest) nor a directory holding complete step-NNNNNNNN checkpoints", dir);
	for (int i = 0; i < n; i++) {
		checkpoint_step_dir(p, sizeof(p), dir, steps[i]);
		if (step_complete(p)) {
			e = snprintf(out, outlen, "%s", p) >= (int)outlen ? -ENAMETOOLONG : 0;
			break;
		}
	}
	free(steps);
	return e;
}
