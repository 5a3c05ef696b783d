/* A ps's rows of the embedding tables and their update rules; see
 * psrows.h. Locking and message assembly are the ps role's
 * (ps_sparse.c); this file only decides what a push of rows does. */
#include "psrows.h"

#include "../base/bigmem.h"
#include "../core/nn/gradfold.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int pushed_get(const struct psrows *s, int w)
{
	return (int)((s->pushed[w / 64] >> (w % 64)) & 1u);
}

static void pushed_set(struct psrows *s, int w)
{
	s->pushed[w / 64] |= (uint64_t)1 << (w % 64);
}

/* The most rows one push holds: cap, or the range's n if fewer (0: n). */
static size_t push_cap(size_t cap, size_t n)
{
	return cap && cap < n ? cap : n;
}

/* Rows the buffers hold: sync, R slots of cap each and a union of at
 * most R x cap and at most the range's n; async, one push's scratch. 0:
 * too many to count in bytes. */
static int rows_counts(size_t R, size_t cap, size_t n, size_t D, size_t *slots, size_t *uni)
{
	size_t all = R ? R * cap : cap;
	if (cap && (all / cap != (R ? R : 1) || all > SIZE_MAX / sizeof(float) / D / 4))
		return 0;
	*slots = R ? all : 0;
	*uni = R && all > n ? n : all;
	return 1;
}

uint64_t psrows_buffer_bytes(const struct config *c, uint64_t n, size_t cap, int dim)
{
	size_t R = c->train.mode == MODE_SYNC ? (size_t)c->train.replicas_to_aggregate : 0, slots, uni;
	size_t D = (size_t)dim, row = sizeof(uint64_t) + D * sizeof(float);
	cap = push_cap(cap, (size_t)n);
	if (!rows_counts(R, cap, (size_t)n, D, &slots, &uni))
		return UINT64_MAX;
	/* slots' ids and values; the union's ids (async: the scratch) and,
	 * sync, its sums and the kept union's ids and values */
	return (uint64_t)slots * row + (uint64_t)uni * sizeof(uint64_t) + (R ? (uint64_t)uni * (row + D * sizeof(float)) : 0) +
	       (uint64_t)R * 2 * sizeof(size_t);
}

/* The sync slots, the union's buffers and the kept union, or async's
 * scratch (psrows_buffer_bytes in all). */
static int rows_alloc(struct psrows *s)
{
	size_t R = s->mode == MODE_SYNC ? (size_t)s->replicas : 0, D = (size_t)s->dim, slots, un;
	if (!rows_counts(R, s->cap, s->n, D, &slots, &un))
		return -ENOMEM;
	s->uids = malloc((un ? un : 1) * sizeof(uint64_t));
	if (!s->uids)
		return -ENOMEM;
	if (!R)
		return 0;
	s->ids = malloc((slots ? slots : 1) * sizeof(uint64_t));
	s->vals = malloc((slots ? slots : 1) * D * sizeof(float));
	s->usum = malloc((un ? un : 1) * D * sizeof(float));
	s->cnt = calloc(R, sizeof(size_t));
	s->cur = calloc(R, sizeof(size_t));
	s->undo_ids = malloc((un ? un : 1) * sizeof(uint64_t));
	s->undo_vals = malloc((un ? un : 1) * D * sizeof(float));
	return s->ids && s->vals && s->usum && s->cnt && s->cur && s->undo_ids && s->undo_vals ? 0 : -ENOMEM;
}

int psrows_init(struct psrows *s, const struct embed_spec *e, uint64_t r0, uint64_t r1,
		const struct config *c, long total, size_t cap, char *err, size_t errlen)
{
	memset(s, 0, sizeof(*s));
	s->r0 = r0;
	s->r1 = r1;
	s->dim = e->dim;
	s->mode = c->train.mode;
	s->workers = config_slices(c, 1);
	s->replicas = c->train.replicas_to_aggregate;
	s->max_staleness = c->train.max_staleness;
	s->staleness_lr = c->train.staleness_lr;
	s->total = total;
	if (r0 > r1 || r1 > embed_total_rows(e) || e->dim < 1) {
		snprintf(err, errlen, "ps rows [%llu, %llu) are not a range of the tables' %llu rows",
			 (unsigned long long)r0, (unsigned long long)r1, (unsigned long long)embed_total_rows(e));
		return -EINVAL;
	}
	if (s->workers < 1 || s->workers > PSSHARD_MAX_WORKERS || s->replicas < 1 || s->replicas > s->workers) {
		snprintf(err, errlen, "ps rows: %d slices, replicas_to_aggregate %d", s->workers, s->replicas);
		return -EINVAL;
	}
	s->n = (size_t)(r1 - r0);
	s->cap = push_cap(cap, s->n);
	struct sparse_config sc = { .kind = (enum sparse_kind)c->train.embed_optimizer, .lr = c->train.embed_lr,
				    .beta1 = c->train.optim.beta1, .beta2 = c->train.optim.beta2,
				    .eps = c->train.optim.eps };
	size_t vals = s->n * (size_t)s->dim;
	if (vals / (size_t)s->dim != s->n)
		goto nomem;
	s->table = bigmem_alloc(vals * sizeof(float));
	int r = s->table ? sparse_optim_init(&s->opt, &sc, s->n, s->dim) : -ENOMEM;
	if (r == -EINVAL) {
		snprintf(err, errlen, "ps rows: unknown embedding optimizer %d", c->train.embed_optimizer);
		psrows_free(s);
		return r;
	}
	if (r || rows_alloc(s))
		goto nomem;
	embed_init_rows(e, s->table, r0, r1, c->train.seed);
	return 0;
nomem:
	snprintf(err, errlen, "ps rows [%llu, %llu): out of memory for %zu rows of %d and their optimizer state",
		 (unsigned long long)r0, (unsigned long long)r1, s->n, s->dim);
	psrows_free(s);
	return -ENOMEM;
}

void psrows_free(struct psrows *s)
{
	if (!s)
		return;
	sparse_optim_free(&s->opt);
	bigmem_free(s->table, s->n * (size_t)s->dim * sizeof(float));
	free(s->ids);
	free(s->vals);
	free(s->cnt);
	free(s->uids);
	free(s->usum);
	free(s->cur);
	free(s->undo_ids);
	free(s->undo_vals);
	s->table = s->vals = s->usum = s->undo_vals = NULL;
	s->ids = s->uids = s->undo_ids = NULL;
	s->cnt = s->cur = NULL;
}

size_t psrows_bad_id(const struct psrows *s, const uint64_t *ids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] < s->r0 || ids[i] >= s->r1 || (i && ids[i] <= ids[i - 1]))
			return i;
	return n;
}

/* The R pushes for v are all in: their rows merged in ascending order,
 * each row's gradients added in slice order, divided by R (the dense
 * rule, core/nn/gradfold.h: `local` with slices folds the same way), one
 * optimizer step over the union; v moves on. */
static void sync_apply(struct psrows *s)
{
	size_t D = (size_t)s->dim, cap = s->cap, cnt[PSSHARD_MAX_WORKERS];
	const uint64_t *ids[PSSHARD_MAX_WORKERS];
	const float *vals[PSSHARD_MAX_WORKERS];
	int k = 0;
	for (int w = 0; w < s->workers; w++) {
		if (!pushed_get(s, w))
			continue;
		int sl = s->slot_of[w];
		ids[k] = s->ids + (size_t)sl * cap;
		vals[k] = s->vals + (size_t)sl * cap * D;
		cnt[k++] = s->cnt[sl];
	}
	size_t u = grad_fold_rows(k, ids, vals, cnt, s->dim, s->replicas, s->cur, s->uids, s->usum);
	for (size_t i = 0; i < u; i++)
		memcpy(s->undo_vals + i * D, s->table + s->uids[i] * D, D * sizeof(float));
	memcpy(s->undo_ids, s->uids, u * sizeof(uint64_t));
	s->undo_n = u;
	s->undo_ok = 1;
	sparse_optim_step(&s->opt, s->table, s->uids, s->usum, u, s->opt.cfg.lr);
	s->version++;
	s->applied++;
	s->nwaiting = 0;
	memset(s->pushed, 0, sizeof(s->pushed));
}

static void async_apply(struct psrows *s, const uint64_t *ids, const float *vals, size_t n, uint64_t age)
{
	for (size_t i = 0; i < n; i++)
		s->uids[i] = ids[i] - s->r0;
	float scale = s->staleness_lr ? 1.0f / (float)(age + 1) : 1.0f;
	sparse_optim_step(&s->opt, s->table, s->uids, vals, n, s->opt.cfg.lr * scale);
	s->age_sum += age;
	if (age > s->age_max)
		s->age_max = age;
	s->version++;
	s->applied++;
}

int psrows_push(struct psrows *s, int slice, uint64_t version, const uint64_t *ids, const float *vals,
		size_t n, enum psshard_outcome *outcome)
{
	if (slice < 0 || slice >= s->workers || n > s->cap || psrows_bad_id(s, ids, n) < n)
		return -EINVAL;
	/* Async: a version the rows had before a rollback (another worker's
	 * recovery) is stale, as a dense push's is (ps_push.c): its worker
	 * learns of the rollback from its next pull. */
	int before = s->mode == MODE_ASYNC && version > s->version && version <= s->went_back_from;
	if (version > s->version && !before)
		return -ERANGE;
	uint64_t age = before ? 0 : s->version - version;
	int stale = s->mode == MODE_ASYNC ? before || (s->max_staleness > 0 && age > (uint64_t)s->max_staleness)
					  : version < s->version || (s->total > 0 && version >= (uint64_t)s->total);
	if (stale) {
		s->received++;
		s->dropped_stale++;
		*outcome = PSSHARD_STALE;
		return 0;
	}
	size_t nv = n * (size_t)s->dim;
	if (s->mode == MODE_SYNC && pushed_get(s, slice))
		return -EALREADY;
	if (optim_nonfinite(vals, nv) < nv)
		return -EDOM;
	s->received++;
	if (s->mode == MODE_ASYNC) {
		async_apply(s, ids, vals, n, age);
		*outcome = PSSHARD_APPLIED;
		return 0;
	}
	int slot = s->nwaiting;
	uint64_t *sid = s->ids + (size_t)slot * s->cap;
	for (size_t i = 0; i < n; i++)
		sid[i] = ids[i] - s->r0;
	if (nv)   /* a push of none of this ps's rows has no values (vals may be NULL) */
		memcpy(s->vals + (size_t)slot * s->cap * (size_t)s->dim, vals, nv * sizeof(float));
	s->cnt[slot] = n;
	s->slot_of[slice] = (int16_t)slot;
	pushed_set(s, slice);
	if (++s->nwaiting < s->replicas) {
		*outcome = PSSHARD_WAITING;
		return 0;
	}
	sync_apply(s);
	*outcome = PSSHARD_APPLIED;
	return 0;
}

void psrows_read(const struct psrows *s, const uint64_t *ids, size_t n, float *out)
{
	size_t D = (size_t)s->dim;
	for (size_t i = 0; i < n; i++) {
		embed_prefetch(s->table, ids, s->r0, i, n, s->dim, 0);
		memcpy(out + i * D, s->table + (size_t)(ids[i] - s->r0) * D, D * sizeof(float));
	}
}

uint64_t psrows_read_at(const struct psrows *s, uint64_t want, const uint64_t *ids, size_t n, float *out)
{
	if (!s->undo_ok || s->version == 0 || want != s->version - 1) {
		psrows_read(s, ids, n, out);
		return s->version;
	}
	size_t D = (size_t)s->dim, j = 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t r = ids[i] - s->r0;
		while (j < s->undo_n && s->undo_ids[j] < r)
			j++;
		const float *src = j < s->undo_n && s->undo_ids[j] == r ? s->undo_vals + j * D : s->table + r * D;
		memcpy(out + i * D, src, D * sizeof(float));
	}
	return want;
}

int psrows_has_pushed(const struct psrows *s, int slice)
{
	return slice >= 0 && slice < s->workers && s->mode == MODE_SYNC && pushed_get(s, slice);
}

void psrows_rewind(struct psrows *s, uint64_t version)
{
	s->went_back_from = s->version > s->went_back_from ? s->version : s->went_back_from;
	s->undo_ok = 0;
	s->version = version;
	s->nwaiting = 0;
	memset(s->pushed, 0, sizeof(s->pushed));
}
