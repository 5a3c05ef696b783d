/* Checkpoint directories, the reading half: a shard's file, the parts of
 * tensors in it, describing and fitting a checkpoint to a run, loading
 * and restoring it; see checkpoint.h. */
#include "checkpoint.h"
#include "ckpt_dir.h"
#include "../fileio.h"
#include "manifest.h"

#include "../../base/err.h"
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
	if (!ckpt_tensor_part(t, sb, se, &lo, &hi) || !ckpt_tensor_part(t, b > sb ? b : sb, e < se ? e : se, &want_lo, &want_hi))
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
		ckpt_part_text(want, sizeof(want), lo, hi, t->ndim, t->shape);
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
			ckpt_hash_layout(l, mf->nshards, (enum optim_kind)o, a, h);
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
	/* The tables first: their shape changes the dense layer above them
	 * too, and the line about the tables says what the user changed. */
	int e = ckpt_tables_fit(stepdir, mf, l, resume, err, errlen);
	if (e)
		return e;
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
	if (!e && ld->rows)
		e = ckpt_rows_load(stepdir, mf, l, ld->resume, ld->rows, err, errlen);
	if (!e) {
		ld->t = opt_t < 0 ? -1 : opt_t;
		ld->step = mf->step;
		ld->async = in->known ? in->async : -1;
		ld->test_acc = acc;
		ld->slices = mf->slices;
		ld->batch = mf->batch;
	}
	free(mf);
	free(in);
	return e;
}

int checkpoint_batch_note(const struct ckpt_layout *l, int slices, int batch, const char *stepdir, char *line,
			  size_t len)
{
	if (slices < 1 || (slices == l->slices && batch == l->batch))
		return 0;
	long was = (long)slices * batch, now = (long)l->slices * l->batch;
	/* The same samples a step in other slices: the data order holds, the
	 * sums (and a slice's batchnorm, its dropout keys) do not. */
	snprintf(line, len, "%s was trained with a global batch of %d slice%s of %d (%ld samples a step), this run's is %d slice%s of %d (%ld): %s",
		 stepdir, slices, slices == 1 ? "" : "s", batch, was, l->slices, l->slices == 1 ? "" : "s", l->batch,
		 now,
		 was != now ? "from here the data order and the result differ from an uninterrupted run's"
			    : "the same samples a step, summed in other slices: not bit for bit an uninterrupted run");
	return 1;
}

int checkpoint_restore(const char *dir, struct ckpt_load *ld, FILE *log, char *err, size_t errlen)
{
	return checkpoint_restore_upto(dir, CKPT_MAX_STEP, ld, log, err, errlen);
}

int checkpoint_restore_upto(const char *dir, long upto, struct ckpt_load *ld, FILE *log, char *err,
			    size_t errlen)
{
	long *steps;
	int n = ckpt_list_steps(dir, &steps);
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
		if (ckpt_step_partial(p)) {
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
	int n = ckpt_list_steps(dir, &steps);
	if (n < 0)
		return err_set(err, errlen, n == -ENOENT ? -ENOENT : n, "%s: %s", dir, strerror(-n));
	int e = err_set(err, errlen, -ENOENT, "%s: neither a checkpoint (no manifest) nor a directory holding complete step-NNNNNNNN checkpoints", dir);
	for (int i = 0; i < n; i++) {
		checkpoint_step_dir(p, sizeof(p), dir, steps[i]);
		if (ckpt_step_complete(p)) {
			e = snprintf(out, outlen, "%s", p) >= (int)outlen ? -ENAMETOOLONG : 0;
			break;
		}
	}
	free(steps);
	return e;
}
