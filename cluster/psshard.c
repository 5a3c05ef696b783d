/* Parameter-server shard state and its sync/async update rules; see
 * psshard.h for the semantics. Locking and chunk assembly are the ps
 * role's (ps.c, ps_push.c), framing net/'s; this file only decides what a
 * whole-range gradient does. */
#include "psshard.h"

#include "../core/nn/gradfold.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int pushed_get(const struct psshard *s, int w)
{
	return (int)((s->pushed[w / 64] >> (w % 64)) & 1u);
}

static void pushed_set(struct psshard *s, int w)
{
	s->pushed[w / 64] |= (uint64_t)1 << (w % 64);
}

int psshard_init(struct psshard *s, const struct model *m, const struct shard *sh,
		 const struct config *c, long total, char *err, size_t errlen)
{
	memset(s, 0, sizeof(*s));
	s->range = *sh;
	s->mode = c->train.mode;
	s->workers = config_slices(c, 1);
	s->replicas = c->train.replicas_to_aggregate;
	s->max_staleness = c->train.max_staleness;
	s->staleness_lr = c->train.staleness_lr;
	s->total = total;
	if (sh->begin >= sh->end || sh->end > m->nparams) {
		snprintf(err, errlen, "ps shard [%zu, %zu) is not a nonempty range of the model's %zu parameters",
			 sh->begin, sh->end, m->nparams);
		return -EINVAL;
	}
	if (s->workers < 1 || s->workers > PSSHARD_MAX_WORKERS) {
		snprintf(err, errlen, "ps shard: %d workers (expected 1..%d)", s->workers, PSSHARD_MAX_WORKERS);
		return -EINVAL;
	}
	if (s->replicas < 1 || s->replicas > s->workers) {
		snprintf(err, errlen, "ps shard: replicas_to_aggregate %d (expected 1..%d workers)",
			 s->replicas, s->workers);
		return -EINVAL;
	}
	s->n = sh->end - sh->begin;
	s->params = malloc(s->n * sizeof(float));
	if (!s->params)
		goto nomem;
	/* Sync keeps R whole-range gradients: R = W = 64 workers over a
	 * 1.3 MiB shard is 85 MiB, fixed for the run. Fewer is not possible
	 * without giving up the worker-index summation order, since the R
	 * gradients may arrive in any order. */
	if (s->mode == MODE_SYNC) {
		if ((size_t)s->replicas > SIZE_MAX / sizeof(float) / s->n)
			goto nomem;
		s->slots = malloc((size_t)s->replicas * s->n * sizeof(float));
		if (!s->slots)
			goto nomem;
	}
	/* An elastic cluster aggregates whole gradients: ps 0 fixes a step's
	 * view when its shard is there, before any of it goes out. */
	if (s->mode == MODE_SYNC && s->replicas == s->workers && !config_elastic(c)) {
		size_t np = (s->n + PSSHARD_PIECE - 1) / PSSHARD_PIECE;
		s->npieces = np;
		s->behind = np;
		s->pver = calloc(np, sizeof(*s->pver));
		s->pwaiting = calloc(np, sizeof(*s->pwaiting));
		s->ppushed = calloc(np * PSSHARD_PUSHED_WORDS, sizeof(*s->ppushed));
		s->pslot = calloc(np * (size_t)s->workers, sizeof(*s->pslot));
		if (!s->pver || !s->pwaiting || !s->ppushed || !s->pslot)
			goto nomem;
	}
	int e = optim_init(&s->opt, &c->train.optim, s->n);
	if (!e)
		e = optim_plain_tensors(&s->opt, m, sh->begin);
	if (e == -EINVAL) {
		snprintf(err, errlen, "ps shard: unknown optimizer %d", (int)c->train.optim.kind);
		psshard_free(s);
		return e;
	}
	if (e)
		goto nomem;
	model_init_params(m, s->params, sh->begin, sh->end, c->train.seed);
	return 0;
nomem:
	snprintf(err, errlen, "ps shard [%zu, %zu): out of memory for %zu parameters%s",
		 sh->begin, sh->end, s->n, s->mode == MODE_SYNC ? " and their gradient slots" : "");
	psshard_free(s);
	return -ENOMEM;
}

void psshard_free(struct psshard *s)
{
	if (!s)
		return;
	optim_free(&s->opt);
	free(s->params);
	free(s->slots);
	free(s->pver);
	free(s->pwaiting);
	free(s->ppushed);
	free(s->pslot);
	free(s->prev);
	free(s->pprev);
	s->prev = NULL;
	s->pprev = NULL;
	s->params = NULL;
	s->slots = NULL;
	s->pver = NULL;
	s->pwaiting = NULL;
	s->ppushed = NULL;
	s->pslot = NULL;
}

/* The R gradients for v are all in: sum them in worker-index order into the
 * slot of the lowest-index worker, divide by R, step, and move to v+1. */
static void sync_apply(struct psshard *s)
{
	size_t n = s->n;
	float *acc = NULL;   // (n)
	for (int w = 0; w < s->workers; w++) {
		if (!pushed_get(s, w))
			continue;
		float *g = s->slots + (size_t)s->slot_of[w] * n;
		if (!acc)
			acc = g;
		else
			grad_fold_add(acc, g, n);
	}
	grad_fold_finish(acc, s->replicas, n);
	optim_step(&s->opt, s->params, acc, optim_lr(&s->opt.cfg, (long)s->version, s->total));
	s->version++;
	s->applied++;
	s->nwaiting = 0;
	memset(s->pushed, 0, sizeof(s->pushed));
}

/* async: how much a gradient of age v - t counts, 1 / tau with
 * tau = v - t + 1, the updates the shard has made from the gradient's
 * parameters up to and including this one. Not max(1, v - t): with W
 * workers taking turns a gradient is usually W - 1 versions old, so that
 * leaves W = 2 almost unscaled (docs/CONFIG.md has the figures), while
 * v - t + 1 is about W and makes W async steps move as far per sample as
 * sync's one step on the average of W gradients. */
static float staleness_scale(const struct psshard *s, uint64_t age)
{
	if (!s->staleness_lr)
		return 1.0f;
	return 1.0f / (float)(age + 1);
}

/* ---- pieces ---------------------------------------------------------------- */

int psshard_pieces(const struct psshard *s)
{
	return s->npieces > 0;
}

void psshard_piece_range(const struct psshard *s, size_t j, size_t *lo, size_t *hi)
{
	*lo = j * PSSHARD_PIECE;
	*hi = *lo + PSSHARD_PIECE < s->n ? *lo + PSSHARD_PIECE : s->n;
}

uint64_t psshard_piece_version(const struct psshard *s, size_t j)
{
	return s->npieces ? s->pver[j] : s->version;
}

static uint64_t *piece_pushed(const struct psshard *s, size_t j)
{
	return s->ppushed + j * PSSHARD_PUSHED_WORDS;
}

static int piece_pushed_get(const struct psshard *s, size_t j, int w)
{
	return (int)((piece_pushed(s, j)[w / 64] >> (w % 64)) & 1u);
}

/* Values summed at a time by piece_apply: 4 KiB, so a block's sum stays
 * in L1 from the add to the optimizer's read of it. */
#define APPLY_BLOCK 1024

/* Piece j's R gradients are in, the last one from worker last_w, still in
 * its sender's buffer g (the piece's hi - lo values; the others in their
 * slots): sync_apply over the piece's range, a block at a time, in the
 * same operations and order (sum in worker-index order, divide by R,
 * step), so the same bits. One pass over the piece rather than a copy of
 * the last gradient into its slot, a sum into a slot, a division and the
 * step: a ps spent about 0.8 ms of CPU a step in those at 10 Gbit/s.
 * Then the piece is at its next version; the last piece at v moves the
 * shard. */
static void piece_math(struct psshard *s, size_t j, int last_w, const float *g, float *prev)
{
	size_t n = s->n, lo, hi;
	psshard_piece_range(s, j, &lo, &hi);
	const int16_t *slot_of = s->pslot + j * (size_t)s->workers;
	float lr = optim_lr(&s->opt.cfg, (long)s->version, s->total);
	float acc[APPLY_BLOCK];
	/* One worker's gradient is stepped from where it lies: nothing to
	 * sum, and a division by one changes no bit. A ps beside one GPU
	 * worker spent a fifth of its CPU copying and dividing it. */
	if (s->replicas == 1) {
		if (prev)
			memcpy(prev + lo, s->params + lo, (hi - lo) * sizeof(float));
		optim_step_part(&s->opt, s->params, g, lo, hi, lr);
		return;
	}
	for (size_t b = lo; b < hi; b += APPLY_BLOCK) {
		size_t m = hi - b < APPLY_BLOCK ? hi - b : APPLY_BLOCK;
		int first = 1;
		for (int w = 0; w < s->workers; w++) {
			if (!piece_pushed_get(s, j, w))
				continue;
			const float *src = w == last_w ? g + (b - lo) : s->slots + (size_t)slot_of[w] * n + b;
			if (first)
				memcpy(acc, src, m * sizeof(float));
			else
				grad_fold_add(acc, src, m);
			first = 0;
		}
		grad_fold_finish(acc, s->replicas, m);
		if (prev) /* the block is in cache: the copy costs one pass of stores */
			memcpy(prev + b, s->params + b, m * sizeof(float));
		optim_step_part(&s->opt, s->params, acc, b, b + m, lr);
	}
}

/* After piece_math (which kept the piece before its step in prev, if
 * not NULL): piece j is at its next version, and the last piece at
 * v moves the shard. */
static void piece_done(struct psshard *s, size_t j, const float *prev)
{
	s->pver[j]++;
	if (j == s->lead) {
		while (s->lead < s->npieces && s->pver[s->lead] != s->version)
			s->lead++;
		s->lead_moves++;
	}
	if (prev)
		s->pprev[j] = s->pver[j];
	s->pwaiting[j] = 0;
	memset(piece_pushed(s, j), 0, PSSHARD_PUSHED_WORDS * sizeof(uint64_t));
	if (--s->behind == 0) {
		optim_step_done(&s->opt);
		s->version++;
		s->applied++;
		s->behind = s->npieces;
		s->lead = 0;
	}
}

static void piece_apply(struct psshard *s, size_t j, int last_w, const float *g)
{
	piece_math(s, j, last_w, g, s->prev);
	piece_done(s, j, s->prev);
}

void psshard_owed_math(struct psshard *s, const struct psshard_owed *o)
{
	piece_math(s, o->j, o->last_w, o->g, o->prev);
}

void psshard_owed_done(struct psshard *s, const struct psshard_owed *o)
{
	piece_done(s, o->j, o->prev);
}

int psshard_push_piece(struct psshard *s, int worker, uint64_t version, size_t j, const float *g,
		       int last, enum psshard_outcome *outcome)
{
	return psshard_push_piece_owed(s, worker, version, j, g, last, outcome, NULL);
}

int psshard_push_piece_owed(struct psshard *s, int worker, uint64_t version, size_t j, const float *g,
			    int last, enum psshard_outcome *outcome, struct psshard_owed *owe)
{
	if (owe)
		owe->g = NULL;
	if (!s->npieces || j >= s->npieces || worker < 0 || worker >= s->workers)
		return -EINVAL;
	if (version > s->pver[j])
		return -ERANGE;
	if (version < s->pver[j] || (s->total > 0 && version >= (uint64_t)s->total)) {
		s->received += last != 0;
		s->dropped_stale += last != 0;
		*outcome = PSSHARD_STALE;
		return 0;
	}
	/* A piece ahead of v takes nothing until v catches up: no honest
	 * worker has its parameters yet (it would need every piece). */
	if (s->pver[j] != s->version)
		return -ERANGE;
	if (piece_pushed_get(s, j, worker))
		return -EALREADY;
	size_t lo, hi;
	psshard_piece_range(s, j, &lo, &hi);
	int slot = s->pwaiting[j];
	/* The R-th gradient is summed from g itself: checked whole first, so
	 * that a refused one leaves the piece as it was. */
	int completes = slot + 1 == s->replicas;
	if (completes ? optim_any_nonfinite(g, hi - lo) : optim_copy_nonfinite(s->slots + (size_t)slot * s->n + lo, g, hi - lo))
		return -EDOM;
	s->received += last != 0;
	s->pwaiting[j]++;
	s->pslot[j * (size_t)s->workers + (size_t)worker] = (int16_t)slot;
	piece_pushed(s, j)[worker / 64] |= (uint64_t)1 << (worker % 64);
	if (!completes) {
		*outcome = PSSHARD_WAITING;
		return 0;
	}
	*outcome = PSSHARD_APPLIED;
	if (owe)
		*owe = (struct psshard_owed){ .j = j, .last_w = worker, .g = g, .prev = s->prev };
	else
		piece_apply(s, j, worker, g);
	return 0;
}

/* psshard_push in piece mode: the whole gradient is checked first, so a
 * refused one leaves every piece as it was. */
static int push_pieces(struct psshard *s, int worker, uint64_t version, const float *grads,
		       enum psshard_outcome *outcome)
{
	if (version < s->version || (s->total > 0 && version >= (uint64_t)s->total)) {
		s->received++;
		s->dropped_stale++;
		*outcome = PSSHARD_STALE;
		return 0;
	}
	/* A piece past v has every worker's gradient for v (R = W). */
	for (size_t j = 0; j < s->npieces; j++)
		if (s->pver[j] != s->version || piece_pushed_get(s, j, worker))
			return -EALREADY;
	if (optim_nonfinite(grads, s->n) < s->n)
		return -EDOM;
	uint64_t v = s->version;
	for (size_t j = 0; j < s->npieces; j++) {
		size_t lo, hi;
		psshard_piece_range(s, j, &lo, &hi);
		(void)psshard_push_piece(s, worker, version, j, grads + lo, j + 1 == s->npieces, outcome);
	}
	*outcome = s->version != v ? PSSHARD_APPLIED : PSSHARD_WAITING;
	return 0;
}

int psshard_push(struct psshard *s, int worker, uint64_t version, const float *grads,
		 enum psshard_outcome *outcome)
{
	if (worker < 0 || worker >= s->workers)
		return -EINVAL;
	if (version > s->version)
		return -ERANGE;

	if (s->mode == MODE_ASYNC) {
		uint64_t age = s->version - version;
		if (s->max_staleness > 0 && age > (uint64_t)s->max_staleness) {
			s->received++;
			s->dropped_stale++;
			*outcome = PSSHARD_STALE;
			return 0;
		}
		if (optim_nonfinite(grads, s->n) < s->n)
			return -EDOM;
		s->received++;
		s->age_sum += age;
		if (age > s->age_max)
			s->age_max = age;
		optim_step_scaled(&s->opt, s->params, grads, optim_lr(&s->opt.cfg, (long)s->version, s->total),
				  staleness_scale(s, age));
		s->version++;
		s->applied++;
		*outcome = PSSHARD_APPLIED;
		return 0;
	}

	/* Past the run's last step nothing is applied: with backup workers
	 * the shards advance apart (each takes the first R pushes of a
	 * version), and a worker tags each shard's push with the version it
	 * got from it. */
	if (s->npieces)
		return push_pieces(s, worker, version, grads, outcome);
	if (version < s->version || (s->total > 0 && version >= (uint64_t)s->total)) {
		s->received++;
		s->dropped_stale++;
		*outcome = PSSHARD_STALE;
		return 0;
	}
	if (pushed_get(s, worker))
		return -EALREADY;
	/* Slot nwaiting is free until counted: a refused gradient left in
	 * it is overwritten by the next one. */
	int slot = s->nwaiting;
	if (optim_copy_nonfinite(s->slots + (size_t)slot * s->n, grads, s->n))
		return -EDOM;
	s->received++;
	s->nwaiting++;
	s->slot_of[worker] = (int16_t)slot;
	pushed_set(s, worker);
	if (s->nwaiting < s->replicas) {
		*outcome = PSSHARD_WAITING;
		return 0;
	}
	sync_apply(s);
	*outcome = PSSHARD_APPLIED;
	return 0;
}

const float *psshard_params(const struct psshard *s)
{
	return s->params;
}

uint64_t psshard_version(const struct psshard *s)
{
	return s->version;
}

/* In piece mode: w has pushed every piece still at v (a piece past v has
 * every worker's gradient). */
int psshard_has_pushed(const struct psshard *s, int w)
{
	if (w < 0 || w >= s->workers)
		return 0;
	for (size_t j = 0; j < s->npieces; j++)
		if (s->pver[j] == s->version && !piece_pushed_get(s, j, w))
			return 0;
	return s->npieces ? 1 : pushed_get(s, w);
}

int psshard_waiting(const struct psshard *s)
{
	if (!s->npieces)
		return s->nwaiting;
	int k = 0;
	for (int w = 0; w < s->workers; w++)
		k += psshard_has_pushed(s, w);
	return k;
}

int psshard_keep_prev(struct psshard *s)
{
	if (!s->npieces)
		return -EINVAL;
	if (s->prev)
		return 0;
	s->prev = malloc(s->n * sizeof(float));
	s->pprev = calloc(s->npieces, sizeof(*s->pprev));
	if (s->prev && s->pprev)
		return 0;
	free(s->prev);
	free(s->pprev);
	s->prev = NULL;
	s->pprev = NULL;
	return -ENOMEM;
}

const float *psshard_prev(const struct psshard *s, size_t j, size_t k, uint64_t v)
{
	if (!s->prev || v == 0 || k > s->npieces)
		return NULL;
	for (size_t i = j; i < k; i++)
		if (s->pprev[i] != v || s->pver[i] != v)
			return NULL;
	return s->prev;
}

void psshard_rewind(struct psshard *s, uint64_t version)
{
	/* whatever the pieces held before, their versions now say nothing of it */
	if (s->pprev)
		memset(s->pprev, 0, s->npieces * sizeof(*s->pprev));
	s->version = version;
	s->applied = version;
	s->nwaiting = 0;
	memset(s->pushed, 0, sizeof(s->pushed));
	for (size_t j = 0; j < s->npieces; j++) {
		s->pver[j] = version;
		s->pwaiting[j] = 0;
	}
	if (s->npieces)
		memset(s->ppushed, 0, s->npieces * PSSHARD_PUSHED_WORDS * sizeof(uint64_t));
	s->behind = s->npieces;
	s->lead = 0;
	s->lead_moves++;
}

uint64_t psshard_lead_moves(const struct psshard *s)
{
	return s->lead_moves;
}

size_t psshard_lead(const struct psshard *s)
{
	return s->lead;
}

const char *psshard_outcome_name(enum psshard_outcome o)
{
	switch (o) {
	case PSSHARD_APPLIED:
		return "applied";
	case PSSHARD_WAITING:
		return "waiting";
	case PSSHARD_STALE:
		return "stale";
	}
	return "?";
}
