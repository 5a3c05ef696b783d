/* [cluster] overlap = auto (see autoflow.h). */
#include "autoflow.h"
#include "role.h"

#include "../core/config/config.h"

#include <stdlib.h>
#include <string.h>

void autoflow_init(struct autoflow *a, int mode)
{
	memset(a, 0, sizeof(*a));
	a->mode = mode;
	a->on = mode == CONFIG_OVERLAP_ON;
	a->skip = AUTOFLOW_SKIP;
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return (a > b) - (a < b);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Whether the next window should go the way on, from the window just
 * measured, tried: a trial's (the probe's); *trial: to measure the way
 * not yet measured. A trial's window decides by the two ways' step
 * times (a->by_time); after it the band keeps the way, since a later
 * window against the other way's older one would compare noise. */
static int autoflow_want(struct autoflow *a, int tried, int *trial)
{
	int band = a->probe && a->ratio >= AUTOFLOW_OFF && a->ratio <= AUTOFLOW_ON;
	a->by_time = tried;
	*trial = band && !a->probed && !tried;
	if (tried)
		return a->step[1] < a->step[0];
	if (*trial) {
		a->probed = 1;
		return !a->on;
	}
	if (band)
		return a->on;
	return a->on ? a->ratio >= AUTOFLOW_OFF : a->ratio > AUTOFLOW_ON;
}

enum autoflow_said autoflow_record(struct autoflow *a, double compute, double exchange)
{
	if (a->mode != CONFIG_OVERLAP_AUTO || a->switches >= AUTOFLOW_SWITCHES)
		return AUTOFLOW_QUIET;
	if (a->skip > 0) {
		a->skip--;
		return AUTOFLOW_QUIET;
	}
	a->compute[a->n] = compute;
	a->exchange[a->n] = exchange;
	if (++a->n < AUTOFLOW_WINDOW)
		return AUTOFLOW_QUIET;
	a->n = 0;
	double c = median(a->compute, AUTOFLOW_WINDOW), x = median(a->exchange, AUTOFLOW_WINDOW);
	if (c <= 0)
		return AUTOFLOW_QUIET;
	a->ratio = x / c;
	a->step[a->on] = c + x;
	int first = a->windows++ == 0, tried = a->trying;
	a->trying = 0;
	int trial, want = autoflow_want(a, tried, &trial);
	if (want == a->on)
		return first ? AUTOFLOW_KEPT : tried ? AUTOFLOW_COMPARED : AUTOFLOW_QUIET;
	/* The last switch: to the way that stepped faster when last tried. */
	if (a->switches + 1 >= AUTOFLOW_SWITCHES && a->step[!a->on] > 0 && a->step[a->on] <= a->step[!a->on]) {
		a->switches = AUTOFLOW_SWITCHES;
		return AUTOFLOW_SETTLED;
	}
	a->on = want;
	a->skip = AUTOFLOW_SKIP;
	a->trying = trial;
	if (++a->switches >= AUTOFLOW_SWITCHES)
		return AUTOFLOW_LAST;
	return a->trying ? AUTOFLOW_TRYING : AUTOFLOW_SWITCHED;
}

void autoflow_say(const struct autoflow *a, FILE *out, int index, const char *key, enum autoflow_said said,
		  long step, const char *on, const char *off)
{
	if (said == AUTOFLOW_TRYING)
		role_log(out, "worker %d: [cluster] %s = auto: at step %ld the exchange took %.1fx the compute (medians of %d steps), between %.0fx (the CPUs limit the step) and %.0fx (the link does): tries %s for a window, to keep the faster way",
			 index, key, step, a->ratio, AUTOFLOW_WINDOW, AUTOFLOW_OFF, AUTOFLOW_ON, a->on ? on : off);
	else if (said == AUTOFLOW_SETTLED || (said != AUTOFLOW_QUIET && a->by_time))
		role_log(out, "worker %d: [cluster] %s = auto: at step %ld the exchange took %.1fx the compute (medians of %d steps)%s its steps took %.2f ms %s against %.2f %s: %s%s%s",
			 index, key, step, a->ratio, AUTOFLOW_WINDOW, said == AUTOFLOW_SETTLED ? ", but" : ";", 1e3 * a->step[a->on], a->on ? on : off,
			 1e3 * a->step[!a->on], a->on ? off : on, said == AUTOFLOW_SWITCHED || said == AUTOFLOW_LAST ? "" : "keeps ",
			 a->on ? on : off, said == AUTOFLOW_SETTLED || said == AUTOFLOW_LAST ? " from here on" : "");
	else if (said != AUTOFLOW_QUIET)
		role_log(out, "worker %d: [cluster] %s = auto: at step %ld the exchange took %.1fx the compute (medians of %d steps): %s%s%s",
			 index, key, step, a->ratio, AUTOFLOW_WINDOW, said == AUTOFLOW_KEPT ? "keeps " : "",
			 a->on ? on : off, said == AUTOFLOW_LAST ? " from here on" : "");
}
