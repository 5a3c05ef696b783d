/* `pstrain check --checkpoint`: every tensor of a checkpoint, reassembled
 * from its shard files alone (no config needed: the parts describe
 * themselves), printed with its shape and a hash, so that two checkpoints
 * or a checkpoint and tests/checkpoint_load.py can be compared. Reading and
 * checking the files is checkpoint.c's. */
#include "inspect.h"
#include "checkpoint.h"
#include "ckpt_dir.h"
#include "../job.h"
#include "manifest.h"
#include "safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/err.h"

struct whole {
	char name[ST_NAME_MAX];
	int ndim;
	uint64_t shape[ST_MAX_DIMS];
	uint64_t n, filled;
	float *data;
};

static int by_name(const void *a, const void *b)
{
	return strcmp(((const struct ckpt_summary *)a)->name, ((const struct ckpt_summary *)b)->name);
}

/* The dense tensors w[0..nw), each reassembled whole, as summaries into
 * *out (malloc'd). */
static int summarize(const char *stepdir, struct whole *w, int nw, struct ckpt_summary **out, char *err,
		     size_t errlen)
{
	*out = malloc((size_t)(nw ? nw : 1) * sizeof(**out));
	if (!*out)
		return err_set(err, errlen, -ENOMEM, "out of memory");
	for (int j = 0; j < nw; j++) {
		if (w[j].filled != w[j].n)
			return err_set(err, errlen, -EINVAL, "%s: tensor %s: shard files hold %" PRIu64 " of its %" PRIu64 " elements",
				       stepdir, w[j].name, w[j].filled, w[j].n);
		struct ckpt_summary *s = &(*out)[j];
		snprintf(s->name, sizeof(s->name), "%s", w[j].name);
		s->ndim = w[j].ndim;
		s->n = w[j].n;
		memcpy(s->shape, w[j].shape, sizeof(s->shape));
		crypto_generichash(s->sum, sizeof(s->sum), (const unsigned char *)w[j].data, w[j].n * sizeof(float), NULL, 0);
	}
	return 0;
}

/* The tables' lines ("tables: ...", then a line per rows file) into
 * *text (malloc'd), their tensors' summaries appended to *sum. */
static int tables_lines(const char *stepdir, const struct ckpt_manifest *mf, char **text, struct ckpt_summary **sum,
			int *n, char *err, size_t errlen)
{
	size_t len = 0;
	FILE *f = open_memstream(text, &len);
	if (!f)
		return err_set(err, errlen, -ENOMEM, "out of memory");
	const struct ckpt_tables *t = &mf->tables;
	char what[96];
	ckpt_tables_text(what, sizeof(what), t);
	fprintf(f, "tables: %s: %" PRIu64 " rows of %d in %d table%s, embedding optimizer %s\n", what,
		ckpt_tables_rows(t), t->dim, ckpt_table_count(t), ckpt_table_count(t) == 1 ? "" : "s",
		sparse_kind_name((enum sparse_kind)t->optim));
	int e = ckpt_rows_inspect(f, stepdir, mf, sum, n, err, errlen);
	if (fclose(f) && !e)
		e = err_set(err, errlen, -ENOMEM, "out of memory");
	return e;
}

int inspect_checkpoint(FILE *f, const char *stepdir, char *err, size_t errlen)
{
	struct ckpt_manifest *mf = malloc(sizeof(*mf));
	struct whole *w = NULL;
	int nw = 0, e;
	char mode[16] = "", optim[16] = "", acc[32] = "";
	if (!mf)
		return err_set(err, errlen, -ENOMEM, "out of memory");
	e = manifest_read(mf, stepdir, err, errlen);
	for (int k = 0; k < mf->nshards && !e; k++) {
		struct safetensors st;
		char path[CKPT_PATH_MAX];
		snprintf(path, sizeof(path), "%s/%s", stepdir, mf->shards[k].file);
		e = checkpoint_shard_open(&st, stepdir, mf, k, err, errlen);
		if (!e && k == 0) {
			const char *v;
			if ((v = safetensors_meta(&st, "pstrain.mode")))
				snprintf(mode, sizeof(mode), "%s", v);
			if ((v = safetensors_meta(&st, "pstrain.optimizer")))
				snprintf(optim, sizeof(optim), "%s", v);
			if ((v = safetensors_meta(&st, "pstrain.test_accuracy")))
				snprintf(acc, sizeof(acc), "%.2f%%", 100 * strtod(v, NULL));
		}
		for (int i = 0; i < st.nt && !e; i++) {
			const struct st_tensor *s = &st.t[i];
			struct ckpt_part pt;
			e = checkpoint_part_of(&st, s, path, &pt, err, errlen);
			if (e)
				break;
			int j;
			for (j = 0; j < nw && strcmp(w[j].name, s->name); j++)
				;
			if (j == nw) {
				struct whole *g = realloc(w, (size_t)(nw + 1) * sizeof(*w));
				if (!g) {
					e = err_set(err, errlen, -ENOMEM, "out of memory");
					break;
				}
				w = g;
				w[nw] = (struct whole){ .ndim = pt.ndim, .n = pt.n };
				memcpy(w[nw].shape, pt.shape, sizeof(pt.shape));
				snprintf(w[nw].name, sizeof(w[nw].name), "%s", s->name);
				w[nw].data = malloc(pt.n ? pt.n * sizeof(float) : 1);
				nw++;
				if (!w[j].data) {
					e = err_set(err, errlen, -ENOMEM, "out of memory");
					break;
				}
			} else if (w[j].ndim != pt.ndim || memcmp(w[j].shape, pt.shape, sizeof(pt.shape))) {
				e = err_set(err, errlen, -EINVAL, "%s: tensor %s: shape differs from another shard's", path, s->name);
				break;
			}
			safetensors_copy(&st, s, 0, s->n, w[j].data + pt.lo);
			w[j].filled += s->n;
		}
		safetensors_free(&st);
	}
	struct ckpt_summary *sum = NULL;
	int ns = nw;
	char *tables = NULL;
	if (!e)
		e = summarize(stepdir, w, nw, &sum, err, errlen);
	if (!e && mf->tables.fields)
		e = tables_lines(stepdir, mf, &tables, &sum, &ns, err, errlen);
	if (!e) {
		fprintf(f, "checkpoint %s: step %ld, %zu parameters, %d shard file%s\n", stepdir, mf->step,
			mf->nparams, mf->nshards, mf->nshards == 1 ? "" : "s");
		/* pstrain.mode is there since checkpoints restore into any
		 * layout; before, the manifests' form told local from a
		 * cluster, and nothing told sync from async. */
		char who[32], end[64] = "saved during its run";
		if (!strcmp(mode, "sync") || !strcmp(mode, "async"))
			snprintf(who, sizeof(who), "%s cluster", mode);
		else
			snprintf(who, sizeof(who), "%s", mode[0] || manifest_nshards(stepdir) == 0 ? "local" : "a cluster");
		if (acc[0])
			snprintf(end, sizeof(end), "saved at its end, final test accuracy %s", acc);
		char batch[80] = "";
		if (mf->slices > 0)
			snprintf(batch, sizeof(batch), "a global batch of %d slice%s of %d, ", mf->slices,
				 mf->slices == 1 ? "" : "s", mf->batch);
		fprintf(f, "written by %s, optimizer %s, %s%s\n", who, optim[0] ? optim : "not recorded", batch, end);
		for (int k = 0; k < mf->nshards; k++)
			fprintf(f, "shard %d of %d: parameters [%zu, %zu) in %s\n", k, mf->nshards,
				mf->shards[k].begin, mf->shards[k].end, mf->shards[k].file);
		if (tables)
			fputs(tables, f);
		if (ns > 1)
			qsort(sum, (size_t)ns, sizeof(*sum), by_name);
	}
	for (int j = 0; j < ns && !e; j++) {
		char shape[96], h[2 * CKPT_HASH_BYTES + 1];
		checkpoint_shape_text(shape, sizeof(shape), sum[j].ndim, sum[j].shape);
		sodium_bin2hex(h, sizeof(h), sum[j].sum, sizeof(sum[j].sum));
		fprintf(f, "tensor %-32s %-14s %10" PRIu64 " blake2b-256:%s\n", sum[j].name, shape, sum[j].n, h);
	}
	free(sum);
	free(tables);
	for (int j = 0; j < nw; j++)
		free(w[j].data);
	free(w);
	free(mf);
	return e;
}

/* "step 60 of its 300 steps", "step 400, past its 300 steps: a finished
 * run ...", for a run of total steps. */
static void where_text(char *out, size_t len, long step, long total)
{
	snprintf(out, len, "step %ld%s its %ld steps%s", step, step > total ? ", past" : " of", total,
		 step >= total ? ": a finished run (raise [train] steps or epochs to train on)" : "");
}

int inspect_fit(FILE *f, const char *stepdir, const struct config *c, char *err, size_t errlen)
{
	struct job j = { 0 };
	struct ckpt_layout *lay = malloc(sizeof(*lay));
	struct ckpt_info *in = malloc(sizeof(*in));
	char why[CONFIG_ERR_MAX], at[400], at_c[160], at_l[160];
	int e = lay && in ? 0 : err_set(err, errlen, -ENOMEM, "out of memory");
	long local_total = 0;
	/* The run's steps: local's (one worker) and the cluster's, which
	 * differ where [train] epochs sets them. */
	if (!e)
		e = job_load(&j, c, config_slices(c, 0), 0, err, errlen);
	if (!e) {
		local_total = j.total;
		job_free(&j);
		e = job_load(&j, c, config_slices(c, 1), 0, err, errlen);
	}
	if (!e)
		e = ckpt_layout_init(lay, &j.m, 1, c, err, errlen);
	if (!e)
		e = checkpoint_describe(stepdir, lay, in, err, errlen);
	if (e)
		goto out;
	e = checkpoint_fits(stepdir, in, lay, why, sizeof(why));
	if (e == -EINVAL) {
		fprintf(f, "restores into %s: no: %s\n", c->path, why);
		e = 1;
	}
	if (e) {
		if (e < 0)
			snprintf(err, errlen, "%s", why);
		goto out;
	}
	/* One figure where local and the cluster run the same steps. */
	where_text(at_c, sizeof(at_c), in->step, j.total);
	where_text(at_l, sizeof(at_l), in->step, local_total);
	if (local_total == j.total)
		snprintf(at, sizeof(at), "%s", at_c);
	else
		snprintf(at, sizeof(at), "as its cluster, %s; as `local`, %s", at_c, at_l);
	const char *was = !in->known || in->async == (c->train.mode == MODE_ASYNC) ? ""
			  : in->async ? " (it was written in async mode)" : " (it was written in sync mode)";
	fprintf(f, "restores into %s: yes (the model and optimizer %s match), as `local` or as its %d ps in %s mode%s; %s\n",
		c->path, optim_kind_name(c->train.optim.kind), c->cluster.nps,
		c->train.mode == MODE_ASYNC ? "async" : "sync", was, at);
out:
	job_free(&j);
	free(lay);
	free(in);
	return e;
}
