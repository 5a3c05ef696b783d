/* See view.h. */
#include "view.h"

#include <string.h>

void view_init(struct view *v, int S, int W)
{
	memset(v, 0, sizeof(*v));
	v->S = S;
	v->W = W;
}

void view_all(struct view *v, int S, int W)
{
	view_init(v, S, W);
	for (int w = 0; w < W; w++)
		view_set(v, w, 1);
}

void view_set(struct view *v, int w, int live)
{
	if (w < 0 || w >= VIEW_MAX)
		return;
	uint64_t bit = (uint64_t)1 << (w % 64);
	if (live)
		v->live[w / 64] |= bit;
	else
		v->live[w / 64] &= ~bit;
}

int view_has(const struct view *v, int w)
{
	return w >= 0 && w < VIEW_MAX && (v->live[w / 64] >> (w % 64) & 1);
}

int view_count(const struct view *v)
{
	int n = 0;
	for (int i = 0; i < VIEW_WORDS; i++)
		n += __builtin_popcountll(v->live[i]);
	return n;
}

/* v's live workers in index order into ids; returns how many. */
static int live_ids(const struct view *v, int *ids)
{
	int L = 0;
	for (int w = 0; w < VIEW_MAX; w++)
		if (view_has(v, w))
			ids[L++] = w;
	return L;
}

void view_owners(const struct view *now, const struct view *base, int *owner)
{
	int ids[VIEW_MAX], L = live_ids(now, ids), S = now->S;
	if (!base || base == now) {
		for (int s = 0; s < S; s++)
			owner[s] = L ? ids[(long)s * L / S] : -1;
		return;
	}
	int bids[VIEW_MAX], Lb = live_ids(base, bids), orphans = 0;
	for (int s = 0; s < S; s++) {
		int b = Lb ? bids[(long)s * Lb / S] : -1;
		owner[s] = b >= 0 && view_has(now, b) ? b : -1;
		orphans += owner[s] < 0;
	}
	/* The orphans, numbered in slice order, over the survivors. */
	for (int s = 0, k = 0; s < S; s++)
		if (owner[s] < 0)
			owner[s] = L ? ids[(long)k++ * L / orphans] : -1;
}

int view_owner(const struct view *now, const struct view *base, int s)
{
	int owner[VIEW_MAX];
	if (s < 0 || s >= now->S)
		return -1;
	view_owners(now, base, owner);
	return owner[s];
}

int view_slices(const struct view *now, const struct view *base, int w, int *out)
{
	int owner[VIEW_MAX], n = 0;
	view_owners(now, base, owner);
	for (int s = 0; s < now->S; s++)
		if (owner[s] == w)
			out[n++] = s;
	return n;
}
