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
	int first = a->windows++ == 0;
	int want = a->on ? a->ratio >= AUTOFLOW_OFF : a->ratio > AUTOFLOW_ON;
	if (want == a->on)
		return first ? AUTOFLOW_KEPT : AUTOFLOW_QUIET;
	/* The last switch: to the way that stepped faster when last tried. */
	if (a->switches + 1 >= AUTOFLOW_SWITCHES && a->step[!a->on] > 0 && a->step[a->on] <= a->step[!a->on]) {
		a->switches = AUTOFLOW_SWITCHES;
		return AUTOFLOW_SETTLED;
	}
	a->on = want;
	a->skip = AUTOFLOW_SKIP;
	return ++a->switches >= AUTOFLOW_SWITCHES ? AUTOFLOW_LAST : AUTOFLOW_SWITCHED;
}

void autoflow_say(const struct autoflow *a, FILE *out, int index, const char *key, enum autoflow_said said,
		  long step, const char *on, const char *off)
{
	if (said == AUTOFLOW_SETTLED)
		role_log(out, "worker %d: [cluster] %s = auto: at step %ld the exchange took %.1fx the compute (medians of %d steps), but its steps took %.2f ms this way against %.2f the other: keeps %s from here on",
			 index, key, step, a->ratio, AUTOFLOW_WINDOW, 1e3 * a->step[a->on], 1e3 * a->step[!a->on],
			 a->on ? on : off);
	else if (said != AUTOFLOW_QUIET)
		role_log(out, "worker %d: [cluster] %s = auto: at step %ld the exchange took %.1fx the compute (medians of %d steps): %s%s%s",
			 index, key, step, a->ratio, AUTOFLOW_WINDOW, said == AUTOFLOW_KEPT ? "keeps " : "",
			 a->on ? on : off, said == AUTOFLOW_LAST ? " from here on" : "");
}
