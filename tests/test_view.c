/* cluster/view.c (who computes which slice of a step) and
 * core/nn/gradfold.c (how the slices' gradients become the step's). */
#include <criterion/criterion.h>

#include "../cluster/view.h"
#include "../core/nn/gradfold.h"

#include <string.h>

/* Every live count L of every S up to 9 (and a large one), the live
 * workers anywhere among W: each slice has exactly one live owner, the
 * owners run in worker-index order over contiguous ranges whose sizes
 * differ by at most one, and no worker outside the view has a slice. */
Test(view, owners_for_every_live_count)
{
	static const int Ss[] = { 1, 2, 3, 4, 5, 7, 8, 9, 256 };
	for (size_t i = 0; i < sizeof(Ss) / sizeof(Ss[0]); i++) {
		int S = Ss[i], W = 12;
		for (unsigned mask = 1; mask < (1u << W); mask += 37) {
			struct view v;
			view_init(&v, S, W);
			for (int w = 0; w < W; w++)
				view_set(&v, w, mask >> w & 1);
			int L = view_count(&v), total = 0, prev = -1, lo = S, hi = 0;
			for (int w = 0; w < W; w++) {
				int out[VIEW_MAX], n = view_slices(&v, NULL, w, out);
				if (!view_has(&v, w)) {
					cr_assert_eq(n, 0, "S %d mask %#x: worker %d is not live but has %d slices", S, mask, w, n);
					continue;
				}
				for (int k = 0; k < n; k++) {
					cr_assert_eq(view_owner(&v, NULL, out[k]), w);
					cr_assert_gt(out[k], prev, "S %d mask %#x: slices out of worker order", S, mask);
					cr_assert(k == 0 || out[k] == out[k - 1] + 1, "S %d mask %#x: worker %d's range has a gap", S, mask, w);
					prev = out[k];
				}
				total += n;
				lo = n < lo ? n : lo;
				hi = n > hi ? n : hi;
			}
			cr_assert_eq(total, S, "S %d mask %#x: %d slices owned", S, mask, total);
			if (L <= S)
				cr_assert_leq(hi - lo, 1, "S %d L %d: shares %d..%d", S, L, lo, hi);
			else
				cr_assert_leq(hi, 1, "S %d L %d: a worker with %d slices", S, L, hi);
		}
	}
}

/* With every worker live and S = W (the default), worker w has slice w
 * alone: the numbers of a config without [train] slices. */
Test(view, one_slice_per_worker_by_default)
{
	struct view v;
	view_all(&v, 5, 5);
	for (int w = 0; w < 5; w++) {
		int out[VIEW_MAX];
		cr_assert_eq(view_slices(&v, NULL, w, out), 1);
		cr_assert_eq(out[0], w);
	}
	view_init(&v, 4, 3);
	cr_assert_eq(view_count(&v), 0);
	cr_assert_eq(view_owner(&v, NULL, 0), -1, "no live worker, no owner");
	cr_assert_eq(view_owner(&v, NULL, 4), -1, "a slice out of range");
}

/* A revision (workers lost from the base) keeps every slice whose base
 * owner survived where it was, and spreads the orphans, in slice order,
 * over the survivors in contiguous runs. */
Test(view, revision_keeps_surviving_owners)
{
	struct view base, now;
	view_all(&base, 8, 4); /* 0: 0-1, 1: 2-3, 2: 4-5, 3: 6-7 */
	now = base;
	view_set(&now, 1, 0);
	view_set(&now, 3, 0);
	/* the orphans 2, 3, 6, 7 (k = 0..3) to survivor k * 2 / 4: 0, 0, 2, 2 */
	static const int want[8] = { 0, 0, 0, 0, 2, 2, 2, 2 };
	for (int s = 0; s < 8; s++) {
		int b = view_owner(&base, NULL, s), o = view_owner(&now, &base, s);
		if (b != 1 && b != 3)
			cr_assert_eq(o, b, "slice %d moved from %d to %d", s, b, o);
		cr_assert(view_has(&now, o), "slice %d given to worker %d, which is gone", s, o);
		cr_assert_eq(o, want[s], "slice %d: owner %d, want %d", s, o, want[s]);
	}
	/* Every worker lost: nobody owns anything. */
	view_init(&now, 8, 4);
	cr_assert_eq(view_owner(&now, &base, 3), -1);
}

/* The fold: a left fold in the order given, then a division; the same
 * bits as the loop written out, and not those of another order. */
Test(view, fold_is_a_left_fold_then_a_division)
{
	float g[3][4] = { { 1e8f, 1.0f, 0.1f, 3.0f }, { -1e8f, 2.0f, 0.2f, 5.0f }, { 1.0f, 3.0f, 0.3f, 7.0f } };
	float acc[4], want[4];
	memcpy(acc, g[0], sizeof(acc));
	grad_fold_add(acc, g[1], 4);
	grad_fold_add(acc, g[2], 4);
	grad_fold_finish(acc, 3, 4);
	for (int i = 0; i < 4; i++) {
		volatile float x = g[0][i];
		x = x + g[1][i];
		x = x + g[2][i];
		want[i] = x / 3.0f;
	}
	cr_assert_eq(memcmp(acc, want, sizeof(acc)), 0);
	cr_assert_eq(acc[0], 1.0f / 3.0f, "(1e8 - 1e8) + 1, not 1e8 + (-1e8 + 1)");
}
