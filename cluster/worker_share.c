/* See worker_share.h. */
#include "worker_share.h"
#include "view.h"

#include "../base/err.h"

#include <errno.h>

/* A VIEW's bitmap into v's live set. */
static void view_from_bits(struct view *v, int S, const uint8_t *bits)
{
	view_init(v, S, VIEW_MAX);
	for (int w = 0; w < VIEW_MAX; w++)
		view_set(v, w, bits[w / 8] >> (w % 8) & 1);
}

int worker_share(struct links *lk, const float *params, int sync, long step, int index, int S, int *mine,
		 int *n, int *live, char *err, size_t errlen)
{
	struct msg_view m;
	pthread_mutex_lock(&lk->sh.say_mu);
	m = lk->sh.view;
	uint64_t views = lk->sh.views;
	pthread_mutex_unlock(&lk->sh.say_mu);
	if (!views)
		return err_set(err, errlen, -EPROTO, "worker %d: ps 0 sent no VIEW with the parameters of step %ld",
			       index, step);
	if (sync && m.version != (uint64_t)step)
		return err_set(err, errlen, -EPROTO, "worker %d: ps 0's VIEW is of step %llu, the parameters of step %ld",
			       index, (unsigned long long)m.version, step);
	if ((int)m.slices != S)
		return err_set(err, errlen, -EPROTO, "worker %d: ps 0's VIEW gives out %u slices; a step here has %d",
			       index, m.slices, S);
	struct view now, base;
	view_from_bits(&now, S, m.live);
	view_from_bits(&base, S, m.base);
	*n = view_slices(&now, &base, index, mine);
	*live = view_count(&now);
	if (sync)
		links_keep(lk, params, (uint64_t)step);
	return 0;
}

int worker_share_idle(struct links *lk, float *params, char *err, size_t errlen)
{
	if (lk->sh.c->train.mode == MODE_ASYNC)
		role_nap_ms(20);
	return links_pull(lk, params, 0, err, errlen);
}

int worker_share_leave(struct links *lk, long step, long total, char *err, size_t errlen)
{
	int e = links_done(lk, 1, err, errlen);
	if (!e)
		role_log(lk->sh.out, "worker %d left at step %ld/%ld (SIGTERM): its slices go to the others",
			 lk->sh.index, step, total);
	return e;
}
