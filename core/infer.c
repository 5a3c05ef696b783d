/* eval and predict from a checkpoint; see infer.h. */
#include "infer.h"

#include "../base/bigmem.h"
#include "../base/err.h"
#include "nn/backend.h"
#include "nn/devices.h"
#include "ckpt/checkpoint.h"
#include "data/data.h"
#include "nn/embed_plan.h"
#include "nn/model.h"
#include "nn/replica.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define INFER_BATCH 1024

/* A built model, a replica and the checkpoint's parameters in its backend. */
struct infer {
	struct model m;
	struct backend be;
	struct replica rep;
	float *params;        /* (P) backend memory */
	float *table;         /* (R, DIM) the embedding tables, host memory (the CPU
			       * backend's); NULL: none */
	struct embed_plan plan;   /* predict's batches' (an embedding model's) */
};

static void infer_free(struct infer *in)
{
	replica_free(&in->rep);
	if (in->be.ops)
		in->be.ops->release(in->be.ctx, in->params);
	bigmem_free(in->table, embed_table_bytes(&in->m.embed));
	embed_plan_free(&in->plan);
}

/* The tables of an embedding model from the checkpoint whose dense part
 * ld loads: all R rows, without the optimizer's state. */
static int infer_tables(struct infer *in, struct ckpt_load *ld, struct ckpt_rows_load *rows, char *err,
			size_t errlen)
{
	const struct embed_spec *s = &in->m.embed;
	uint64_t R = embed_total_rows(s);
	size_t n = (size_t)R * (size_t)s->dim, segs = (size_t)INFER_BATCH * (size_t)s->fields;
	if (n / (size_t)s->dim != R || !(in->table = bigmem_alloc(n * sizeof(float))) ||
	    embed_plan_init(&in->plan, segs, segs))
		return err_set(err, errlen, -ENOMEM, "out of memory for the embedding tables: %llu rows x %d",
			       (unsigned long long)R, s->dim);
	*rows = (struct ckpt_rows_load){ .a = 0, .b = R, .table = in->table };
	ld->rows = rows;
	return 0;
}

static int infer_init(struct infer *in, const struct config *c, const char *ckpt, struct infer_result *res,
		      char *err, size_t errlen)
{
	struct ckpt_layout *lay = NULL;
	float *host = NULL;
	memset(in, 0, sizeof(*in));
	memset(res, 0, sizeof(*res));
	int e = model_build(&in->m, &c->model, err, errlen);
	if (e)
		return e;
	e = checkpoint_resolve(ckpt, res->stepdir, sizeof(res->stepdir), err, errlen);
	if (e)
		return e;
	backend_cpu(&in->be, c->train.threads);
	lay = malloc(sizeof(*lay));
	host = malloc(in->m.nparams * sizeof(float));
	if (!lay || !host || in->be.ops->alloc(in->be.ctx, (void **)&in->params, in->m.nparams * sizeof(float))) {
		e = err_set(err, errlen, -ENOMEM, "out of memory for %zu parameters", in->m.nparams);
		goto out;
	}
	e = ckpt_layout_init(lay, &in->m, 1, c, err, errlen);
	struct ckpt_load ld = { .l = lay, .begin = 0, .end = in->m.nparams, .params = host };
	struct ckpt_rows_load rows;
	if (!e && in->m.embed.fields)
		e = infer_tables(in, &ld, &rows, err, errlen);
	if (!e)
		e = checkpoint_load(res->stepdir, &ld, err, errlen);
	res->step = ld.step;
	if (!e)
		e = in->be.ops->upload(in->be.ctx, in->params, host, in->m.nparams * sizeof(float));
	if (!e)
		e = replica_init(&in->rep, &in->m, &in->be, INFER_BATCH, err, errlen);
out:
	free(lay);
	free(host);
	return e;
}

/* The set's categorical fields are the embedding layer's (none without one). */
static int infer_fields(const struct infer *in, const struct dataset *ds, const char *what, char *err,
			size_t errlen)
{
	size_t F = (size_t)in->m.embed.fields;
	if (ds->f == F && (!F || ds->ids))
		return 0;
	if (!F)
		return err_set(err, errlen, -EINVAL, "%s have %zu categorical fields, but the model has no embedding layer to read them",
			       what, ds->f);
	return err_set(err, errlen, -EINVAL, "%s have %zu categorical fields but the model's %s takes %zu", what, ds->f,
		       in->m.layers[0].name, F);
}

/* Forward of samples [i, i + B) of ds: an embedding model's plan and rows
 * first. */
static int infer_forward(struct infer *in, const struct dataset *ds, const int32_t *zero, size_t i, int B)
{
	double loss;
	int right;
	int e = replica_load(&in->rep, ds->x + i * ds->d, zero, B);
	if (!e && in->table)
		e = embed_plan_build(&in->plan, &in->m.embed, NULL, ds->ids + i * ds->f, B);
	if (!e && in->table)
		e = replica_embed_load(&in->rep, &in->plan, in->table);
	return e ? e : replica_forward(&in->rep, in->params, B, 0, 0, &loss, &right);
}

int infer_eval(const struct config *c, const char *ckpt, struct infer_result *res, char *err,
	       size_t errlen)
{
	struct infer in;
	struct dataset test = { 0 };
	int e = infer_init(&in, c, ckpt, res, err, errlen);
	if (!e)
		e = data_load_test(&test, &c->data, c->train.seed, err, errlen);
	if (!e && test.d != (size_t)in.m.inputs)
		e = err_set(err, errlen, -EINVAL, "test samples have %zu features but the model takes %d", test.d,
			    in.m.inputs);
	int most = in.m.loss == LOSS_SIGMOID_XENT ? 2 : in.m.outputs;   /* a binary model: 0/1 */
	if (!e && test.classes > most)
		e = err_set(err, errlen, -EINVAL, "test labels go up to %d but the model has %d outputs%s",
			    test.classes - 1, in.m.outputs, most == 2 ? " for 0/1 labels" : "");
	if (!e)
		e = infer_fields(&in, &test, "test samples", err, errlen);
	if (!e) {
		struct eval_result ev;
		e = devices_eval_replica(&in.rep, in.params, in.table, &test, &ev);
		res->loss = ev.loss;
		res->acc = ev.acc;
		res->binary = ev.binary;
		res->auc = ev.auc;
		if (e)
			err_set(err, errlen, e, "evaluation on %s: %s", in.be.where, strerror(-e));
		res->samples = test.n;
	}
	dataset_free(&test);
	infer_free(&in);
	return e;
}

int infer_predict(const struct config *c, const char *ckpt, const char *input, int probs, FILE *out,
		  struct infer_result *res, char *err, size_t errlen)
{
	struct infer in;
	struct dataset ds = { 0 };
	float *p = NULL;
	int e = infer_init(&in, c, ckpt, res, err, errlen);
	if (!e)
		e = data_load_input(&ds, &c->data, c->train.seed, input, err, errlen);
	if (!e && ds.d != (size_t)in.m.inputs)
		e = err_set(err, errlen, -EINVAL, "%s: samples have %zu features but the model takes %d", input, ds.d,
			    in.m.inputs);
	char what[DATA_PATH_MAX + 16];
	snprintf(what, sizeof(what), "%s: samples", input);
	if (!e)
		e = infer_fields(&in, &ds, what, err, errlen);
	int K = in.m.outputs;
	if (!e && !(p = malloc((size_t)INFER_BATCH * (size_t)K * sizeof(float))))
		e = err_set(err, errlen, -ENOMEM, "out of memory");
	/* Labels are needed by the loss only; the input has none that count. */
	int32_t *zero = e ? NULL : calloc(INFER_BATCH, sizeof(int32_t));
	if (!e && !zero)
		e = err_set(err, errlen, -ENOMEM, "out of memory");
	for (size_t i = 0; !e && i < ds.n; i += INFER_BATCH) {
		int B = ds.n - i < INFER_BATCH ? (int)(ds.n - i) : INFER_BATCH;
		e = infer_forward(&in, &ds, zero, i, B);
		if (!e)
			e = in.be.ops->download(in.be.ctx, p, in.rep.probs, (size_t)B * (size_t)K * sizeof(float));
		if (e) {
			err_set(err, errlen, e, "forward on %s: %s", in.be.where, strerror(-e));
			break;
		}
		for (int b = 0; b < B; b++) {
			const float *q = p + (size_t)b * (size_t)K;
			if (in.m.loss == LOSS_SIGMOID_XENT) {
				fprintf(out, probs ? "%d,%.6g\n" : "%d\n", q[0] > 0.5f, q[0]);
				continue;
			}
			int best = 0;
			for (int k = 1; k < K; k++)
				if (q[k] > q[best])
					best = k;
			fprintf(out, "%d", best);
			for (int k = 0; probs && k < K; k++)
				fprintf(out, ",%.6g", q[k]);
			fputc('\n', out);
		}
	}
	if (!e && (fflush(out) || ferror(out)))
		e = err_set(err, errlen, -EIO, "writing predictions: %s", strerror(errno));
	res->samples = ds.n;
	free(zero);
	free(p);
	dataset_free(&ds);
	infer_free(&in);
	return e;
}
