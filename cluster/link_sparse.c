/* See link_sparse.h: what one link sends and takes of a sparse exchange,
 * and the fan-out of a pull or a push of rows over every ps. */
#include "link_sparse.h"

#include "../base/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int link_rows_send(struct link *l, struct link_rows *x, int *lost, char *err, size_t errlen)
{
	uint8_t type = x->kind == LINK_ROWS_PULL ? WIRE_SPULL : WIRE_SPUSH;
	uint8_t dt = type == WIRE_SPUSH ? x->dtype : WIRE_F32;
	/* Ids go packed on every TCP link (link_packs_ids); float32
	 * values, both ways, where the link limits the step (link_packs).
	 * Each only wherever that is shorter. */
	int pack = link_packs(l);
	uint8_t flags = (link_packs_ids(l) ? MSG_ROWS_IDS_PACKED : 0) |
			(pack && type == WIRE_SPULL ? MSG_ROWS_WANT_PACKED : 0);
	dt = pack && dt == WIRE_F32 && type == WIRE_SPUSH ? WIRE_F32P : dt;
	uint32_t per = msg_rows_max(type, x->dim, dt), n = (uint32_t)x->n, first = 0;
	*lost = 0;
	if (x->n > UINT32_MAX)
		return err_set(err, errlen, -EINVAL, "%s of %zu rows", wire_msg_name(type), x->n);
	do {
		uint32_t k = n - first < per ? n - first : per;
		struct msg_rows m = { .type = type, .dtype = dt, .flags = flags, .shard = (uint32_t)l->k,
				      .version = x->version, .total = n, .first = first, .count = k,
				      .worker = type == WIRE_SPUSH ? WIRE_PUSH_TAG(l->sh->index, x->slice) : 0 };
		size_t len;
		int r = msg_encode_rows(conn_payload(&l->conn, CONN_MAIN), conn_payload_cap(&l->conn), &m,
					x->ids + first, x->vals ? x->vals + (size_t)first * (size_t)x->dim : NULL,
					x->dim, &len, err, errlen);
		if (r)
			return r;
		r = conn_send_payload(&l->conn, CONN_MAIN, len, err, errlen);
		if (r) {
			*lost = 1;
			return r;
		}
		first += k;
	} while (first < n);
	return 0;
}

int link_rows_take(struct link_rows *x, const uint8_t *msg, size_t len, char *err, size_t errlen)
{
	struct msg_rows m;
	if (!link_rows_waiting(x))
		return err_set(err, errlen, -EPROTO, "unexpected ROWS message");
	int r = msg_decode_rows(msg, len, x->dim, &m, err, errlen);
	if (!r)
		r = msg_rows_asm_add(&x->a, &m, NULL, x->vals, err, errlen);
	if (r == 1)
		x->got = x->a.version;
	return r;
}

int link_rows_waiting(const struct link_rows *x)
{
	return x && x->kind == LINK_ROWS_PULL && !msg_rows_asm_done(&x->a);
}

int links_rows_open(struct links_rows *lr, const struct config *c, const struct model *m, char *err,
		    size_t errlen)
{
	int nps = c->cluster.nps;
	memset(lr, 0, sizeof(*lr));
	lr->nps = nps;
	lr->dim = m->embed.dim;
	lr->param_dt = (uint8_t)role_param_dtype(c);
	lr->grad_dt = (uint8_t)role_grad_dtype(c);
	lr->rb = calloc((size_t)nps + 1, sizeof(uint64_t));
	lr->x = calloc((size_t)nps, sizeof(struct link_rows));
	lr->tag = calloc((size_t)nps, sizeof(uint64_t));
	if (!lr->rb || !lr->x || !lr->tag)
		return err_set(err, errlen, -ENOMEM, "out of memory for %d links' rows", nps);
	struct shard plan[CONFIG_MAX_HOSTS];
	shard_plan(plan, nps, (size_t)embed_total_rows(&m->embed));
	for (int k = 0; k < nps; k++)
		lr->rb[k] = plan[k].begin;
	lr->rb[nps] = plan[nps - 1].end;
	return 0;
}

void links_rows_close(struct links_rows *lr)
{
	free(lr->rb);
	free(lr->x);
	free(lr->tag);
	memset(lr, 0, sizeof(*lr));
}

/* Each link's share of rows (u, ascending): the run in its range. */
static void rows_split(struct links_rows *lr, enum link_rows_kind kind, const uint64_t *rows, size_t u,
		       const float *vals)
{
	size_t at = 0;
	for (int k = 0; k < lr->nps; k++) {
		size_t end = at;
		while (end < u && rows[end] < lr->rb[k + 1])
			end++;
		lr->x[k] = (struct link_rows){ .kind = kind, .ids = rows + at, .n = end - at, .dim = lr->dim,
					       .dtype = kind == LINK_ROWS_PULL ? lr->param_dt : lr->grad_dt,
					       .vals = (float *)(vals + at * (size_t)lr->dim) };
		at = end;
	}
}

/* ex with each link's share, on every link, then waited for. */
static int rows_run(struct links *lk, struct links_rows *lr, char *err, size_t errlen)
{
	struct link_ex ex[CONFIG_MAX_HOSTS];
	for (int k = 0; k < lr->nps; k++)
		ex[k] = (struct link_ex){ .rows = &lr->x[k] };
	return links_each(lk, ex, err, errlen);
}

/* Ps k's share of a pull (rows_split's) asks for version: its answer
 * awaited. */
static void rows_ask(struct links_rows *lr, int k, uint64_t version)
{
	struct link_rows *x = &lr->x[k];
	x->version = version;
	msg_rows_asm_init(&x->a, WIRE_ROWS, x->dtype, (uint32_t)k, lr->dim, x->n, x->n);
}

int links_rows_pull(struct links *lk, struct links_rows *lr, const uint64_t *rows, size_t u, float *U,
		    char *err, size_t errlen)
{
	int async = lk->sh.c->train.mode == MODE_ASYNC;
	rows_split(lr, LINK_ROWS_PULL, rows, u, U);
	for (int k = 0; k < lr->nps; k++)
		rows_ask(lr, k, async ? MSG_VERSION_LATEST : lk->ln[k].got);
	int r = rows_run(lk, lr, err, errlen);
	/* Sync: the push is of the step asked for, whatever came (rows past
	 * it, for a backup worker the others left behind, make its push
	 * stale, as its dense one is); async: of the rows that came. */
	for (int k = 0; !r && k < lr->nps; k++)
		lr->tag[k] = async ? lr->x[k].got : lr->x[k].version;
	return r;
}

static void rows_push_split(struct links_rows *lr, int slice, const uint64_t *rows, size_t u, const float *dU)
{
	rows_split(lr, LINK_ROWS_PUSH, rows, u, dU);
	for (int k = 0; k < lr->nps; k++) {
		lr->x[k].version = lr->tag[k];
		lr->x[k].slice = slice;
	}
}

int links_rows_push(struct links *lk, struct links_rows *lr, int slice, const uint64_t *rows, size_t u,
		    const float *dU, char *err, size_t errlen)
{
	rows_push_split(lr, slice, rows, u, dU);
	return rows_run(lk, lr, err, errlen);
}

void links_rows_stage(struct links *lk, struct links_rows *lr, int slice, const uint64_t *rows, size_t u,
		      const float *dU)
{
	rows_push_split(lr, slice, rows, u, dU);
	lk->rows_up = lr;
}

void links_rows_ahead(struct links *lk, struct links_rows *ahead, const uint64_t *rows, size_t u, float *U)
{
	rows_split(ahead, LINK_ROWS_PULL, rows, u, U);
	for (int k = 0; k < ahead->nps; k++)
		rows_ask(ahead, k, link_next_version(&lk->ln[k]));
	lk->rows_ahead = ahead;
}

int links_rows_ahead_took(const struct links *lk, const struct links_rows *ahead, struct links_rows *lr)
{
	for (int k = 0; k < ahead->nps; k++) {
		const struct link_rows *x = &ahead->x[k];
		if (!msg_rows_asm_done(&x->a) || x->version != lk->ln[k].got || x->got < x->version)
			return 0;
	}
	for (int k = 0; k < ahead->nps; k++)
		lr->tag[k] = ahead->x[k].version;
	return 1;
}
