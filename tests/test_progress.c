/* The progress line's running loss and accuracy. */
#include <criterion/criterion.h>

#include "../core/progress.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* A run resumed at step 1000 shows the mean of the batches it has trained,
 * not an average still rising from 0 (it showed 37.8% accuracy after five
 * steps of a model at 91%). */
Test(progress, resumed_run_averages_its_own_batches)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_not_null(f);
	struct progress p;
	progress_init(&p, f, 0, 2000, 100);
	static const double loss[] = { 0.30, 0.20, 0.25, 0.15, 0.10 };
	static const double acc[] = { 0.90, 0.92, 0.88, 0.94, 0.91 };
	double sl = 0, sa = 0;
	for (int i = 0; i < 5; i++) {
		progress_tick(&p, 1000 + i, 0.01);
		progress_step(&p, 1000 + i, 64, 64 * loss[i], 64 * acc[i]);
		sl += loss[i];
		sa += acc[i];
	}
	cr_assert_float_eq(p.loss, sl / 5, 1e-12, "loss %g, want %g", p.loss, sl / 5);
	cr_assert_float_eq(p.acc, sa / 5, 1e-12, "acc %g, want %g", p.acc, sa / 5);
	/* Past ten steps it forgets: a long run of one value converges to it. */
	for (int i = 0; i < 200; i++) {
		progress_tick(&p, 1005 + i, 0.01);
		progress_step(&p, 1005 + i, 64, 64 * 0.05, 64 * 0.99);
	}
	cr_assert_float_eq(p.acc, 0.99, 1e-6);
	fclose(f);
	free(buf);
}

/* The ETA of a resumed run comes from the steps this process has trained:
 * five steps of 20 ms with 995 to go is about 20 s, not the 0 s it showed
 * when the time was spread over all 1005 steps of the run. */
Test(progress, resumed_run_eta_from_its_own_steps)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_not_null(f);
	struct progress p;
	progress_init(&p, f, 0, 2000, 100);
	for (int i = 0; i < 5; i++) {
		struct timespec t = { 0, 20 * 1000 * 1000 };
		nanosleep(&t, NULL);
		progress_tick(&p, 1000 + i, 0.02);
		progress_step(&p, 1000 + i, 64, 64 * 0.2, 64 * 0.9);
	}
	progress_eval(&p, 1005, 0.3, 0.9);
	cr_assert_eq(fflush(f), 0);
	const char *eta = strstr(buf, "ETA ");
	cr_assert_not_null(eta, "no ETA in: %s", buf);
	int m = -1, s = -1;
	cr_assert_eq(sscanf(eta, "ETA %d:%d", &m, &s), 2, "%s", buf);
	cr_assert(m * 60 + s >= 15 && m * 60 + s <= 300, "ETA %d:%02d, want about 20 s: %s", m, s, buf);
	fclose(f);
	free(buf);
}

/* A reading covers the steps ticked since the last: in a log, where the
 * loss is read once an evaluation, the line shows about those steps' mean
 * (it showed an average creeping over ten evaluations when each reading
 * counted as one step); the first ten steps are a plain mean by steps. */
Test(progress, a_reading_counts_as_its_steps)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_not_null(f);
	struct progress p;
	progress_init(&p, f, 0, 2000, 100);
	for (int i = 0; i < 5; i++)
		progress_tick(&p, i, 0.01);
	progress_step(&p, 4, 5 * 64, 5 * 64 * 0.4, 5 * 64 * 0.5);
	for (int i = 5; i < 10; i++)
		progress_tick(&p, i, 0.01);
	progress_step(&p, 9, 5 * 64, 5 * 64 * 0.2, 5 * 64 * 0.7);
	cr_expect_float_eq(p.loss, 0.3, 1e-12, "two readings of 5 steps: loss %g, want their mean", p.loss);
	cr_expect_float_eq(p.acc, 0.6, 1e-12, "acc %g", p.acc);
	for (int i = 10; i < 60; i++)
		progress_tick(&p, i, 0.01);
	progress_step(&p, 59, 50 * 64, 50 * 64 * 0.05, 50 * 64 * 0.9);
	cr_expect(fabs(p.loss - 0.05) < 0.002, "after a reading of 50 steps at 0.05 the loss is %g", p.loss);
	fclose(f);
	free(buf);
}
