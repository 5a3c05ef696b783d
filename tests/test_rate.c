/* Tests of cluster/rate.c (a ps's versions per second for REPORT) and
 * cluster/observers.c (which observer greetings a ps answers): pure
 * state, fed times by hand. */
#include <criterion/criterion.h>

#include "leak.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>

#include "../cluster/observers.h"
#include "../cluster/rate.h"

TestSuite(rate, .fini = leak_check);

static double get(const struct rate *r)
{
	double v = -1;
	cr_assert_eq(rate_get(r, &v), 1, "the rate should be known");
	return v;
}

Test(rate, unknown_until_two_samples)
{
	struct rate r;
	double v = 123;
	rate_init(&r);
	cr_assert_eq(rate_get(&r, &v), 0);
	rate_add(&r, 1000, 5);
	cr_assert_eq(rate_get(&r, &v), 0);
	cr_assert_eq(v, 123, "unknown leaves *per_s alone");
	rate_add(&r, 1500, 15);
	cr_assert_float_eq(get(&r), 20.0, 1e-9);
}

/* A steady 50 versions/s, sampled every 100 ms (more often than the gap)
 * for a minute: the ring keeps the window, and the rate is exact. */
Test(rate, steady_pace_over_the_window)
{
	struct rate r;
	rate_init(&r);
	for (int64_t t = 0; t <= 60000; t += 100)
		rate_add(&r, t, (uint64_t)(t / 20));
	cr_assert_float_eq(get(&r), 50.0, 1e-9);
	cr_assert_leq(r.n, RATE_SAMPLES);
}

/* The rate follows a change within the window: after a stall longer than
 * it, zero; a new pace, that pace. */
Test(rate, follows_stalls_and_changes)
{
	struct rate r;
	rate_init(&r);
	uint64_t v = 0;
	int64_t t = 0;
	for (; t < 20000; t += 200)
		rate_add(&r, t, v += 10);        /* 50/s */
	for (int64_t end = t + RATE_WINDOW_MS + 1000; t < end; t += 200)
		rate_add(&r, t, v);              /* stalled */
	cr_assert_float_eq(get(&r), 0.0, 1e-9);
	for (int64_t end = t + RATE_WINDOW_MS + 1000; t < end; t += 200)
		rate_add(&r, t, v += 2);         /* 10/s */
	cr_assert_float_eq(get(&r), 10.0, 1e-9);
}

/* A version below the newest (a rollback) starts over: unknown until the
 * next sample. */
Test(rate, rollback_resets)
{
	struct rate r;
	rate_init(&r);
	for (int64_t t = 0; t < 5000; t += 300)
		rate_add(&r, t, (uint64_t)t);
	cr_assert_gt(get(&r), 900);
	rate_add(&r, 5100, 100);
	double v;
	cr_assert_eq(rate_get(&r, &v), 0, "a rollback forgets the old samples");
	rate_add(&r, 5600, 105);
	cr_assert_float_eq(get(&r), 10.0, 1e-9);
}

/* ---- observers ------------------------------------------------------------ */

#define S 1000000000ull

Test(rate, observers_window_and_replays)
{
	struct observers o;
	observers_init(&o);
	uint64_t now = 1700000000ull * S;
	cr_assert_eq(observers_greeted(&o, now - 5 * S, now), 0, "a clock 5 s behind");
	cr_assert_eq(observers_greeted(&o, now + 3 * S, now), 0, "a clock 3 s ahead");
	cr_assert_eq(observers_greeted(&o, now - 5 * S, now + S), -EALREADY, "the same greeting again");
	cr_assert_eq(observers_greeted(&o, now - OBSERVERS_WINDOW_NS - 1, now), -ESTALE);
	cr_assert_eq(observers_greeted(&o, now + OBSERVERS_WINDOW_NS + 1, now), -ESTALE);
	cr_assert_eq(observers_greeted(&o, 0, now), -ESTALE);
	/* the replay, once the window has passed, is refused as stale, and
	 * its entry has been given back */
	uint64_t later = now + OBSERVERS_WINDOW_NS + 10 * S;
	cr_assert_eq(observers_greeted(&o, now - 5 * S, later), -ESTALE);
	cr_assert_eq(observers_greeted(&o, later, later), 0);
	int used = 0;
	for (int i = 0; i < OBSERVERS_SEEN; i++)
		used += o.seen[i] != 0;
	cr_assert_eq(used, 1, "expired times are forgotten");
}

/* More greetings in one window than it remembers: refused, not forgotten
 * (forgetting would let a replay of the oldest through). */
Test(rate, observers_full_is_busy)
{
	struct observers o;
	observers_init(&o);
	uint64_t now = 1700000000ull * S;
	for (int i = 0; i < OBSERVERS_SEEN; i++)
		cr_assert_eq(observers_greeted(&o, now + (uint64_t)i, now), 0);
	cr_assert_eq(observers_greeted(&o, now + OBSERVERS_SEEN, now), -EBUSY);
	cr_assert_eq(observers_greeted(&o, now, now), -EALREADY);
	cr_assert_eq(observers_greeted(&o, now + OBSERVERS_WINDOW_NS, now + OBSERVERS_WINDOW_NS + S + 300),
		     0, "room again once the first ones left the window");
}
