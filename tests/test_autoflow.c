/* [cluster] overlap = auto (cluster/autoflow.h): a worker pushes while
 * computing where its exchange takes several times its compute (the link
 * limits the step), not where the two are alike (the CPUs do); medians,
 * so a few slow steps decide nothing; a band between the two thresholds,
 * so it does not flip; and a last switch after which it stays. */
#include <criterion/criterion.h>

#include "leak.h"

#include "../cluster/autoflow.h"
#include "../core/config/config.h"

TestSuite(autoflow, .fini = leak_check);

/* Feeds n steps of compute c and exchange x (ms); returns how many
 * switches autoflow_record reported, the last switch counting 2 (a first
 * decision that keeps the way counts 100). */
static int feed(struct autoflow *a, int n, double c, double x)
{
	int said = 0;
	for (int i = 0; i < n; i++)
		switch (autoflow_record(a, c * 1e-3, x * 1e-3)) {
		case AUTOFLOW_QUIET: break;
		case AUTOFLOW_KEPT: said += 100; break;
		case AUTOFLOW_SWITCHED: said += 1; break;
		case AUTOFLOW_LAST: said += 2; break;
		case AUTOFLOW_SETTLED: said += 1000; break;
		case AUTOFLOW_TRYING: break;
		case AUTOFLOW_COMPARED: break;
		}
	return said;
}

Test(autoflow, on_and_off_are_fixed)
{
	struct autoflow a;
	autoflow_init(&a, CONFIG_OVERLAP_ON);
	cr_assert(autoflow_wants(&a));
	cr_assert_eq(feed(&a, 200, 5, 0.5), 0);
	cr_assert(autoflow_wants(&a), "overlap = true switched itself off");
	autoflow_init(&a, CONFIG_OVERLAP_OFF);
	cr_assert_eq(feed(&a, 200, 5, 25), 0);
	cr_assert(!autoflow_wants(&a), "overlap = false switched itself on");
}

/* netlab's medians: 1 Gbit/s 4.9 ms compute, 24.3 exchange; 10 Gbit/s
 * 4.3 and 4.8 (and with pushing while computing 6.0 and 4.1). */
Test(autoflow, the_link_switches_it_on_the_cpu_off)
{
	struct autoflow a;
	autoflow_init(&a, CONFIG_OVERLAP_AUTO);
	cr_assert(!autoflow_wants(&a), "auto starts pushing after computing");
	cr_assert_eq(feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW - 1, 4.9, 24.3), 0, "decided early");
	cr_assert_eq(feed(&a, 1, 4.9, 24.3), 1);
	cr_assert(autoflow_wants(&a), "a link-bound step did not switch it on");
	cr_assert_float_eq(a.ratio, 24.3 / 4.9, 1e-9);
	/* on, the exchange shrinks and the compute grows: still on */
	cr_assert_eq(feed(&a, 300, 5.4, 22.6), 0);
	cr_assert(autoflow_wants(&a));
	/* the link got fast: the CPUs limit the step, and it goes off */
	cr_assert_eq(feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 6.0, 4.1), 1);
	cr_assert(!autoflow_wants(&a));
	cr_assert_eq(feed(&a, 300, 4.3, 4.8), 0);
	cr_assert(!autoflow_wants(&a), "a CPU-bound step switched it on");
	/* CPU-bound from the start: the first decision keeps it off, and says so */
	autoflow_init(&a, CONFIG_OVERLAP_AUTO);
	cr_assert_eq(feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 4.3, 4.8), 100);
	cr_assert_float_eq(a.ratio, 4.8 / 4.3, 1e-9);
	cr_assert_eq(feed(&a, 300, 4.3, 4.8), 0, "only the first decision is told");
	cr_assert(!autoflow_wants(&a));
}

/* netlab, a ps beside each worker at 1 Gbit/s: off, the exchange took
 * 4.6x the compute; on (pushing while computing, the parameters as
 * XORs) a window's medians were 6.6 ms compute and 9.2 ms exchange, 1.4x,
 * still link-bound (the step 16 ms against 39 off): it stays on. */
Test(autoflow, a_shrunk_exchange_keeps_it_on)
{
	struct autoflow a;
	autoflow_init(&a, CONFIG_OVERLAP_AUTO);
	cr_assert_eq(feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 6.6, 6.6 * 4.6), 1);
	cr_assert(autoflow_wants(&a));
	cr_assert_eq(feed(&a, 300, 6.6, 9.2), 0, "switched off by the exchange it shrank");
	cr_assert(autoflow_wants(&a));
}

/* Between the thresholds nothing changes, either way. */
Test(autoflow, the_band_between_keeps_the_way)
{
	struct autoflow a;
	autoflow_init(&a, CONFIG_OVERLAP_AUTO);
	double mid = 0.5 * (AUTOFLOW_ON + AUTOFLOW_OFF);
	cr_assert_eq(feed(&a, 500, 4, 4 * mid), 100);
	cr_assert(!autoflow_wants(&a));
	/* the window under way when it changed is half of each: two */
	cr_assert_eq(feed(&a, 2 * AUTOFLOW_WINDOW, 4, 4 * (AUTOFLOW_ON + 1)), 1);
	cr_assert(autoflow_wants(&a));
	cr_assert_eq(feed(&a, 500, 4, 4 * mid), 0);
	cr_assert(autoflow_wants(&a));
}

/* A third of a window's steps stalled (a long exchange each) moves no
 * median: a CPU-bound run stays off. */
Test(autoflow, a_few_slow_steps_decide_nothing)
{
	struct autoflow a;
	autoflow_init(&a, CONFIG_OVERLAP_AUTO);
	for (int r = 0; r < 20; r++)
		for (int i = 0; i < AUTOFLOW_WINDOW; i++) {
			enum autoflow_said s = autoflow_record(&a, 4e-3, i % 3 == 0 ? 120e-3 : 4.5e-3);
			cr_assert(s == AUTOFLOW_QUIET || s == AUTOFLOW_KEPT, "window %d step %d switched", r, i);
		}
	cr_assert(!autoflow_wants(&a));
}

/* A run whose steps keep changing stops switching after the last switch,
 * and says that one is the last; where both ways were measured, the last
 * one due goes to the faster (here on: 7 ms against 44), and says so. */
Test(autoflow, it_stops_switching)
{
	struct autoflow a;
	autoflow_init(&a, CONFIG_OVERLAP_AUTO);
	int said = 0;
	for (int k = 0; k < 10; k++)
		said += feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 4, k % 2 ? 3 : 40);
	cr_assert_eq(a.switches, AUTOFLOW_SWITCHES);
	cr_assert_eq(said, AUTOFLOW_SWITCHES - 1 + 1000, "the last switch due says the way settled");
	cr_assert(autoflow_wants(&a), "settled on the slower way");
	cr_assert_eq(feed(&a, 300, 4, 3), 0);
	cr_assert(autoflow_wants(&a));
	/* the faster way is the one the ratio asks for: an ordinary last switch */
	autoflow_init(&a, CONFIG_OVERLAP_AUTO);
	said = feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 4, 40);	/* on: 44 ms off */
	said += feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 40, 3);	/* off: 43 ms on */
	said += feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 4, 13);	/* on: 17 ms off */
	said += feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 30, 3);	/* 33 ms on: off, the last */
	cr_assert_eq(said, 3 + 2);
	cr_assert_not(autoflow_wants(&a));
}

/* netlab, a ps beside each worker, 1 Gbit/s, 2 ms round trips: on at 5.0x,
 * off at 0.9x, on at 3.2x, and the last switch due at 0.94x, though on
 * stepped in 17.5 ms against off's 21: it stays on. */
Test(autoflow, the_last_switch_goes_to_the_faster_way)
{
	struct autoflow a;
	autoflow_init(&a, CONFIG_OVERLAP_AUTO);
	int said = feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 6, 30);
	said += feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 9, 8);
	said += feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 5, 16);
	cr_assert_eq(said, 3);
	cr_assert(autoflow_wants(&a));
	cr_assert_eq(feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 9, 8.5), 1000);
	cr_assert(autoflow_wants(&a));
	cr_assert_float_eq(a.step[1], 17.5e-3, 1e-9);
	cr_assert_float_eq(a.step[0], 21e-3, 1e-9);
	cr_assert_eq(feed(&a, 300, 9, 1), 0, "settled is the last word");
	cr_assert(autoflow_wants(&a));
}

/* wire_pack's probe (autoflow.h): the click-through model at 1 Gbit/s,
 * compute 1.4 ms and an exchange 2.3x it, in the band where the ratio
 * cannot tell. It tries packing for a window, finds 4.2 ms steps against
 * 4.6 and keeps packing, though that shrinks the exchange to 1.6x. */
Test(autoflow, in_the_band_a_probe_tries_the_other_way_and_keeps_the_faster)
{
	struct autoflow a;
	autoflow_init(&a, CONFIG_OVERLAP_AUTO);
	a.probe = 1;
	cr_assert_eq(feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW - 1, 1.4, 3.2), 0);
	cr_assert_eq(autoflow_record(&a, 1.4e-3, 3.2e-3), AUTOFLOW_TRYING);
	cr_assert(autoflow_wants(&a), "the probe did not try packing");
	cr_assert_eq(feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW - 1, 1.6, 2.6), 0);
	cr_assert_eq(autoflow_record(&a, 1.6e-3, 2.6e-3), AUTOFLOW_COMPARED);
	cr_assert(autoflow_wants(&a), "went back to the slower way");
	cr_assert(a.by_time);
	cr_assert_eq(feed(&a, 300, 1.6, 2.6), 0, "a decided band says nothing more");
	cr_assert(autoflow_wants(&a));
	/* a slower window later (an evaluation in it) against the other way's
	 * older one is noise: the band keeps the way */
	cr_assert_eq(feed(&a, AUTOFLOW_WINDOW, 1.6, 3.4), 0);
	cr_assert(autoflow_wants(&a), "a later window in the band undid the trial");
	/* the other way round: packing costs the CPUs more than it saves */
	autoflow_init(&a, CONFIG_OVERLAP_AUTO);
	a.probe = 1;
	cr_assert_eq(feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 4.3, 6.0), 0);   /* TRYING counts 0 in feed */
	cr_assert(autoflow_wants(&a));
	cr_assert_eq(feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 5.6, 6.0), 1, "did not go back");
	cr_assert_not(autoflow_wants(&a));
	cr_assert_eq(feed(&a, 300, 4.3, 6.0), 0, "probed again once both were measured");
	cr_assert_not(autoflow_wants(&a));
	/* outside the band the ratio still decides, without a trial */
	autoflow_init(&a, CONFIG_OVERLAP_AUTO);
	a.probe = 1;
	cr_assert_eq(feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 4.3, 3.0), 100);
	cr_assert_not(autoflow_wants(&a));
	cr_assert_eq(feed(&a, AUTOFLOW_SKIP + AUTOFLOW_WINDOW, 4.0, 20.0), 1);
	cr_assert(autoflow_wants(&a));
	cr_assert_not(a.trying);
}

/* Without the probe (overlap's), the band keeps the way as it was. */
Test(autoflow, without_a_probe_the_band_keeps_the_way)
{
	struct autoflow a;
	autoflow_init(&a, CONFIG_OVERLAP_AUTO);
	cr_assert_eq(feed(&a, 300, 1.4, 3.2), 100);
	cr_assert_not(autoflow_wants(&a));
}
