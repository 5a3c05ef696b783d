/* Trying whether pushing while computing pays (autoflow.h). */
#include "autoflow.h"

#include "../core/config.h"

#include <stdlib.h>

void autoflow_init(struct autoflow *a, int mode, long step)
{
	*a = (struct autoflow){ .mode = mode, .from = step + AUTOFLOW_SKIP, .decided = -1 };
}

/* The span step falls in (0, 1, ...), or -1 before the first. */
static long span_of(const struct autoflow *a, long step)
{
	return step < a->from ? -1 : (step - a->from) / AUTOFLOW_SPAN;
}

int autoflow_wants(const struct autoflow *a, long step)
{
	if (a->mode != CONFIG_OVERLAP_AUTO)
		return a->mode == CONFIG_OVERLAP_ON;
	if (a->decided >= 0)
		return a->decided;
	long s = span_of(a, step);
	return s >= 0 && s % 2 == 1;
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return (a > b) - (a < b);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int autoflow_record(struct autoflow *a, long step, double seconds)
{
	long s = span_of(a, step), last = a->from + (long)AUTOFLOW_SPANS * AUTOFLOW_SPAN - 1;
	if (a->mode != CONFIG_OVERLAP_AUTO || a->decided >= 0 || s < 0)
		return 0;
	int w = (int)(s % 2);
	if (s < AUTOFLOW_SPANS && a->n[w] < AUTOFLOW_SPANS / 2 * AUTOFLOW_SPAN)
		a->t[w][a->n[w]++] = seconds;
	if (step < last)
		return 0;
	/* The last span is over (or steps were skipped past it): decide on
	 * what there is; with nothing timed on one side, without. */
	if (!a->n[0] || !a->n[1]) {
		a->decided = 0;
		return 1;
	}
	a->ms[0] = 1e3 * median(a->t[0], a->n[0]);
	a->ms[1] = 1e3 * median(a->t[1], a->n[1]);
	/* With it only if clearly better: it costs CPU the host may want. */
	a->decided = a->ms[1] < 0.99 * a->ms[0];
	return 1;
}
