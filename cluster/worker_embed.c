/* See worker_embed.h. */
#include "worker_embed.h"

#include "../base/err.h"
#include "../core/progress.h"
#include "../core/nn/optim.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct worker_embed {
	struct links_rows lr;
	struct links_rows ahead;   /* the next step's rows (links_rows_ahead) */
	long ahead_step;           /* the step they are of; -1: none */
	size_t ahead_first;
	long pulls, took;          /* steps' rows pulled, and of them taken ahead */
	struct links *lk;
	struct devices *dev;
	struct embed_fetch fetch;
	const struct model *m;
	int index;
	size_t window;   /* rows one pull may ask for (the ps's bound) */
};

/* An evaluation's chunk of rows (struct embed_fetch). */
static int embed_fetch_rows(void *ctx, const uint64_t *rows, size_t u, float *U, char *err, size_t errlen)
{
	struct worker_embed *we = ctx;
	return links_rows_pull(we->lk, &we->lr, rows, u, U, err, errlen);
}

int worker_embed_open(struct worker_embed **out, int index, struct devices *dev, struct links *lk,
		      const struct config *c, const struct model *m, char *err, size_t errlen)
{
	*out = NULL;
	if (!m->embed.fields)
		return 0;
	struct worker_embed *we = calloc(1, sizeof(*we));
	if (!we)
		return err_set(err, errlen, -ENOMEM, "out of memory");
	*we = (struct worker_embed){ .lk = lk, .dev = dev, .m = m, .index = index, .ahead_step = -1,
				     .fetch = { .fetch = embed_fetch_rows, .ctx = we } };
	int B = c->train.batch_size > ROLE_EVAL_BATCH ? c->train.batch_size : ROLE_EVAL_BATCH;
	we->window = (size_t)B * (size_t)m->embed.fields;
	*out = we;
	int e = links_rows_open(&we->lr, c, m, err, errlen);
	if (!e)
		e = links_rows_open(&we->ahead, c, m, err, errlen);
	return e ? e : devices_embed_open_remote(dev, &we->fetch, err, errlen);
}

void worker_embed_close(struct worker_embed *we)
{
	if (!we)
		return;
	links_rows_close(&we->lr);
	links_rows_close(&we->ahead);
	free(we);
}

int worker_embed_pull(struct worker_embed *we, long step, size_t first, int B, double *waited, char *err,
		      size_t errlen)
{
	const struct embed_plan *p;
	float *U;
	/* Pulled in the last exchange, at the version it pulled: the
	 * devices hold the batch's plan and rows already. */
	int ahead = we->ahead_step == step && we->ahead_first == first;
	we->ahead_step = -1;
	we->pulls++;
	if (ahead && links_rows_ahead_took(we->lk, &we->ahead, &we->lr)) {
		we->took++;
		return 0;
	}
	int e = devices_embed_plan(we->dev, first, B, &p, &U, err, errlen);
	if (e)
		return e;
	double t0 = progress_now();
	e = links_rows_pull(we->lk, &we->lr, p->rows, p->u, U, err, errlen);
	*waited += progress_now() - t0;
	return e;
}

int worker_embed_push(struct worker_embed *we, long step, int slice, int now, double *waited, char *err,
		      size_t errlen)
{
	const uint64_t *rows;
	const float *dU;
	size_t u, D = (size_t)we->m->embed.dim;
	int e = devices_embed_grads(we->dev, &rows, &u, &dU, err, errlen);
	if (e)
		return e;
	size_t bad = optim_nonfinite(dU, u * D);
	if (bad < u * D)
		return err_set(err, errlen, -EDOM, "worker %d: step %ld: the embedding gradient is not finite (row %llu, element %zu, is %s), so it was not pushed: training diverged (lower embedding_learning_rate, or look for huge or broken values in the data)",
			       we->index, step, (unsigned long long)rows[bad / D], bad % D,
			       isnan(dU[bad]) ? "NaN" : dU[bad] > 0 ? "+inf" : "-inf");
	if (!now) {
		links_rows_stage(we->lk, &we->lr, slice, rows, u, dU);
		return 0;
	}
	double t0 = progress_now();
	e = links_rows_push(we->lk, &we->lr, slice, rows, u, dU, err, errlen);
	*waited += progress_now() - t0;
	return e;
}

int worker_embed_ahead(struct worker_embed *we, long step, size_t first, int B, char *err, size_t errlen)
{
	const struct embed_plan *p;
	float *U;
	we->ahead_step = -1;
	int e = devices_embed_plan(we->dev, first, B, &p, &U, err, errlen);
	if (e)
		return e;
	links_rows_ahead(we->lk, &we->ahead, p->rows, p->u, U);
	we->ahead_step = step;
	we->ahead_first = first;
	return 0;
}

void worker_embed_say(const struct worker_embed *we, FILE *out)
{
	if (we && we->pulls)
		role_log(out, "worker %d: the rows of %ld of %ld steps came with the exchange before theirs", we->index,
			 we->took, we->pulls);
}

void worker_embed_forget(struct worker_embed *we)
{
	if (we)
		we->ahead_step = -1;
}

/* Every row of the tables into f, a window of rows at a time. */
static int dump_rows(FILE *f, struct worker_embed *we, char *err, size_t errlen)
{
	uint64_t R = embed_total_rows(&we->m->embed);
	size_t D = (size_t)we->m->embed.dim, win = we->window;
	uint64_t *ids = malloc(win * sizeof(uint64_t));
	float *vals = malloc(win * D * sizeof(float));
	int e = ids && vals ? 0 : err_set(err, errlen, -ENOMEM, "out of memory for %zu rows", win);
	for (uint64_t r0 = 0; !e && r0 < R; r0 += win) {
		size_t n = R - r0 < win ? (size_t)(R - r0) : win;
		for (size_t i = 0; i < n; i++)
			ids[i] = r0 + i;
		e = links_rows_pull(we->lk, &we->lr, ids, n, vals, err, errlen);
		if (!e && fwrite(vals, sizeof(float), n * D, f) != n * D)
			e = err_set(err, errlen, -EIO, "cannot write the tables: %s", strerror(errno));
	}
	free(ids);
	free(vals);
	return e;
}

int worker_dump(const char *path, const float *params, size_t n, struct worker_embed *we, char *err,
		size_t errlen)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return err_set(err, errlen, -EIO, "%s: cannot write parameters: %s", path, strerror(errno));
	int e = fwrite(params, sizeof(float), n, f) == n ? 0 : -EIO;
	if (!e && we)
		e = dump_rows(f, we, err, errlen);
	if (fclose(f) && !e)
		e = -EIO;
	if (e == -EIO)
		return err_set(err, errlen, e, "%s: cannot write parameters: %s", path, strerror(errno));
	return e;
}
