/* [cluster] overlap = auto (see autoflow.h). */
#include "autoflow.h"

#include "../core/config.h"

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

int autoflow_record(struct autoflow *a, double compute, double exchange)
{
	if (a->mode != CONFIG_OVERLAP_AUTO || a->switches >= AUTOFLOW_SWITCHES)
		return 0;
	if (a->skip > 0) {
		a->skip--;
		return 0;
	}
	a->compute[a->n] = compute;
	a->exchange[a->n] = exchange;
	if (++a->n < AUTOFLOW_WINDOW)
		return 0;
	a->n = 0;
	double c = median(a->compute, AUTOFLOW_WINDOW), x = median(a->exchange, AUTOFLOW_WINDOW);
	if (c <= 0)
		return 0;
	a->ratio = x / c;
	int want = a->on ? a->ratio >= AUTOFLOW_OFF : a->ratio > AUTOFLOW_ON;
	if (want == a->on)
		return 0;
	a->on = want;
	a->skip = AUTOFLOW_SKIP;
	return ++a->switches >= AUTOFLOW_SWITCHES ? 2 : 1;
}
