/* See rate.h. Rejected: an exponential moving average of the rate per
 * push (it costs every push a division under the lock, and decays by
 * pushes, not time, so a stalled ps would keep showing its last speed);
 * counting from the start (a run resumed from a checkpoint, or slowed by a
 * lost worker an hour ago, would show an average that says nothing about
 * now). */
#include "rate.h"

#include <string.h>

void rate_init(struct rate *r)
{
	memset(r, 0, sizeof(*r));
}

static int at(const struct rate *r, int i)
{
	return (r->head + i) % RATE_SAMPLES;
}

void rate_add(struct rate *r, int64_t now_ms, uint64_t v)
{
	if (r->n > 0) {
		int last = at(r, r->n - 1);
		if (v < r->v[last]) {
			rate_init(r);
		} else if (r->n > 1 && now_ms - r->t_ms[at(r, r->n - 2)] < RATE_GAP_MS) {
			/* the newest moves forward until it is a gap past the one before */
			r->t_ms[last] = now_ms;
			r->v[last] = v;
			return;
		}
	}
	if (r->n == RATE_SAMPLES) {
		r->head = at(r, 1);
		r->n--;
	}
	int i = at(r, r->n++);
	r->t_ms[i] = now_ms;
	r->v[i] = v;
}

int rate_get(const struct rate *r, double *per_s)
{
	if (r->n < 2)
		return 0;
	int last = at(r, r->n - 1), first = -1;
	for (int k = 0; k < r->n - 1 && first < 0; k++)
		if (r->t_ms[last] - r->t_ms[at(r, k)] <= RATE_WINDOW_MS)
			first = at(r, k);
	if (first < 0 || r->t_ms[last] <= r->t_ms[first])
		return 0;
	*per_s = (double)(r->v[last] - r->v[first]) * 1000.0 /
		 (double)(r->t_ms[last] - r->t_ms[first]);
	return 1;
}
