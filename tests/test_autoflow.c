/* Tests of [cluster] overlap = auto: the spans a worker tries pushing
 * while computing in, and the choice it keeps (cluster/autoflow.c). */
#include <criterion/criterion.h>

#include "leak.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cluster/autoflow.h"
#include "config.h"

TestSuite(autoflow, .fini = leak_check);

Test(autoflow, on_and_off_are_fixed)
{
	struct autoflow a;
	autoflow_init(&a, CONFIG_OVERLAP_ON, 0);
	for (long s = 0; s < 200; s++) {
		cr_assert(autoflow_wants(&a, s));
		cr_assert_eq(autoflow_record(&a, s, 1.0), 0);
	}
	autoflow_init(&a, CONFIG_OVERLAP_OFF, 0);
	for (long s = 0; s < 200; s++)
		cr_assert_not(autoflow_wants(&a, s));
}

/* Runs the trials from step start, each step taking without or with
 * seconds; returns the step that decided. */
static long run_trials(struct autoflow *a, long start, double without, double with)
{
	autoflow_init(a, CONFIG_OVERLAP_AUTO, start);
	for (long s = start; s < start + 1000; s++) {
		int w = autoflow_wants(a, s);
		if (autoflow_record(a, s, w ? with : without))
			return s;
	}
	return -1;
}

Test(autoflow, spans_alternate_from_after_the_first_steps)
{
	struct autoflow a;
	autoflow_init(&a, CONFIG_OVERLAP_AUTO, 40);
	for (long s = 40; s < 40 + AUTOFLOW_SKIP; s++)
		cr_assert_not(autoflow_wants(&a, s), "step %ld is before the trials", s);
	long from = 40 + AUTOFLOW_SKIP;
	for (long s = from; s < from + AUTOFLOW_SPANS * AUTOFLOW_SPAN; s++)
		cr_assert_eq(autoflow_wants(&a, s), (s - from) / AUTOFLOW_SPAN % 2, "step %ld", s);
}

Test(autoflow, keeps_the_faster_and_needs_a_clear_gain)
{
	struct autoflow a;
	long last = 7 + AUTOFLOW_SKIP + AUTOFLOW_SPANS * AUTOFLOW_SPAN - 1;
	cr_assert_eq(run_trials(&a, 7, 0.030, 0.028), last);
	cr_assert_eq(a.decided, 1);
	cr_assert_float_eq(a.ms[0], 30.0, 1e-9);
	cr_assert_float_eq(a.ms[1], 28.0, 1e-9);
	for (long s = last + 1; s < last + 100; s++)
		cr_assert(autoflow_wants(&a, s), "decided: with, at step %ld", s);
	cr_assert_eq(run_trials(&a, 0, 0.013, 0.014), last - 7);
	cr_assert_eq(a.decided, 0);
	cr_assert_not(autoflow_wants(&a, last + 50));
	cr_assert_eq(run_trials(&a, 0, 0.0300, 0.0299), last - 7);
	cr_assert_eq(a.decided, 0, "0.3%% is no clear gain");
}

/* Medians: a few slow steps (an evaluation's page faults, a neighbour's
 * burst) do not turn the choice. */
Test(autoflow, a_few_outliers_do_not_decide)
{
	struct autoflow a;
	autoflow_init(&a, CONFIG_OVERLAP_AUTO, 0);
	long s, k = 0;
	for (s = 0; !autoflow_record(&a, s, autoflow_wants(&a, s) ? 0.028 : (k++ % 5 ? 0.030 : 0.001)); s++)
		;
	cr_assert_eq(a.decided, 1, "without: %.2f ms, with %.2f ms", a.ms[0], a.ms[1]);
}

Test(autoflow, steps_skipped_past_the_trials_still_decide)
{
	struct autoflow a;
	autoflow_init(&a, CONFIG_OVERLAP_AUTO, 0);
	cr_assert_eq(autoflow_record(&a, AUTOFLOW_SKIP + 3, 0.02), 0);
	cr_assert_eq(autoflow_record(&a, 1000, 0.02), 1, "past the last span");
	cr_assert_eq(a.decided, 0, "nothing timed with it: without");
}

Test(autoflow, config_takes_auto_and_prints_it)
{
	struct config c;
	char err[512];
	cr_assert_eq(config_parse_string(&c, "t.ini", "[cluster]\n", err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(c.cluster.overlap, CONFIG_OVERLAP_AUTO, "auto is the default");
	cr_assert_eq(config_parse_string(&c, "t.ini", "[cluster]\noverlap = no\n", err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(c.cluster.overlap, CONFIG_OVERLAP_OFF);
	cr_assert_eq(config_parse_string(&c, "t.ini", "[cluster]\noverlap = auto\n", err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(c.cluster.overlap, CONFIG_OVERLAP_AUTO);
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	cr_assert_not_null(f);
	config_print(&c, f);
	fclose(f);
	cr_assert_not_null(strstr(text, "overlap = auto\n"), "%s", text);
	free(text);
	cr_assert_neq(config_parse_string(&c, "t.ini", "[cluster]\noverlap = maybe\n", err, sizeof(err)), 0);
	cr_assert_not_null(strstr(err, "expected true, auto or false"), "%s", err);
	cr_assert_neq(config_parse_string(&c, "t.ini", "[train]\nnesterov = auto\n", err, sizeof(err)), 0,
		      "auto is overlap's alone");
	cr_assert_not_null(strstr(err, "expected true or false"), "%s", err);
}
