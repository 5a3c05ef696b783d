/* ps 0's side of the elastic worker set (docs/ELASTIC.md, ps_conn.h): it
 * alone says which workers train which slices of each step (the view,
 * kept in its members with the step's first one as its base), and sends
 * it to each worker before the parameters of that step. Everything here
 * runs under ps->mu. The other ps need no view: they count slices.
 *
 * Sync: step v's view is fixed when ps 0 first answers a PULL with the
 * shard at version v (elastic runs aggregate whole gradients, so nothing
 * of v goes out before the shard is there), from the workers ready then,
 * once there are min_workers of them; a PULL waits until there are. A
 * member of the fixed view that is lost past peer_timeout before pushing
 * every slice it had is dropped from it (a revision: the same step, rev
 * + 1, its slices spread over the others as cluster/view.h says), and the
 * PULLs waiting on ps 0 are answered at once, so that each worker takes
 * the new view and trains the step again (what it pushed already is a
 * duplicate). Async: the view is who is ready now, a new one whenever
 * that changes. */
#include "ps_conn.h"

#include <string.h>

static int ps_view_on(const struct ps *ps)
{
	return ps->index == 0 && ps->mb.elastic && role_views(ps->c);
}

int ps_view_wait(const struct ps *ps)
{
	if (!ps_view_on(ps))
		return 0;
	const struct members *m = &ps->mb;
	int sync = ps->sh.mode == MODE_SYNC;
	if (m->has_view && (!sync || m->view.version == psshard_version(&ps->sh)))
		return 0;
	struct view v;
	members_candidates(m, &v, ps->sh.workers);
	return view_count(&v) < m->min;
}

int ps_view_unpushed(const struct ps *ps, int w)
{
	const struct members *m = &ps->mb;
	uint64_t v = psshard_version(&ps->sh);
	/* A view of the run's end (the chief's last PULL fixes one) holds no
	 * step to train. */
	return ps_view_on(ps) && ps->sh.mode == MODE_SYNC && m->has_view && m->view.version == v &&
	       (ps->sh.total <= 0 || v < (uint64_t)ps->sh.total) && !members_has_pushed(m, &ps->sh, w);
}

int ps_view_owes(const struct ps *ps, int w)
{
	const struct members *m = &ps->mb;
	if (!ps_view_on(ps) || ps->sh.mode != MODE_SYNC)
		return 0;
	if (m->has_view && m->view.version == psshard_version(&ps->sh))
		return !members_has_pushed(m, &ps->sh, w);
	struct view v;
	members_candidates(m, &v, ps->sh.workers);
	return view_has(&v, w);
}

/* The events of a new view (who is in it and was not in the last), and
 * one line when its workers are not the last one's (revised: the same
 * step's, a worker lost from it). */
static void view_say(struct ps *ps, const struct view *v, int revised)
{
	struct members *m = &ps->mb;
	char list[160] = "";
	size_t at = 0;
	int n = 0, changed = !m->has_view || memcmp(v->live, m->view.live, sizeof(v->live));
	for (int w = 0; w < m->W; w++) {
		if (!view_has(v, w))
			continue;
		if (!m->has_view || !view_has(&m->view, w))
			members_event(m, v->version, w, MEMBERS_EV_JOINED);
		if (at < sizeof(list) - 16)
			at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%d", n ? ", " : "", w);
		else if (at < sizeof(list) - 4)
			at += (size_t)snprintf(list + at, sizeof(list) - at, ", ...");
		n++;
	}
	const char *unit = ps->sh.mode == MODE_SYNC ? "step" : "version";
	if (changed && !n)
		role_log(ps->out, "ps 0: %s %llu again (a worker was lost): no worker left in it; the next one ready takes its %d slices",
			 unit, (unsigned long long)v->version, v->S);
	else if (changed)
		role_log(ps->out, "ps 0: %s%s %llu%s: worker%s %s train%s the %d slices", revised ? "" : "from ", unit,
			 (unsigned long long)v->version, revised ? " again (a worker was lost)" : "", n == 1 ? "" : "s",
			 list, n == 1 ? "s" : "", v->S);
}

void ps_view_fix(struct ps *ps)
{
	if (!ps_view_on(ps))
		return;
	struct members *m = &ps->mb;
	uint64_t v = psshard_version(&ps->sh);
	int sync = ps->sh.mode == MODE_SYNC;
	if (sync && m->has_view && m->view.version == v)
		return;
	struct view now;
	members_candidates(m, &now, ps->sh.workers);
	if (!view_count(&now) || (!sync && m->has_view && !memcmp(now.live, m->view.live, sizeof(now.live))))
		return;
	now.version = v;
	now.rev = m->has_view && !sync ? m->view.rev + 1 : 0;
	view_say(ps, &now, 0);
	m->view = m->base = now;
	m->has_view = 1;
	m->view_serial++;
}

int ps_view_message(struct ps_conn *cn, struct msg_view *out)
{
	const struct members *m = &cn->ps->mb;
	if (!ps_view_on(cn->ps) || !m->has_view || cn->view_sent == m->view_serial)
		return 0;
	cn->view_sent = m->view_serial;
	memset(out, 0, sizeof(*out));
	out->version = m->view.version;
	out->rev = m->view.rev;
	out->slices = (uint32_t)m->view.S;
	for (int w = 0; w < m->W; w++) {
		out->live[w / 8] |= (uint8_t)(view_has(&m->view, w) << (w % 8));
		out->base[w / 8] |= (uint8_t)(view_has(&m->base, w) << (w % 8));
	}
	return 1;
}

void ps_view_drop(struct ps *ps, int w)
{
	struct members *m = &ps->mb;
	if (!ps_view_on(ps) || !m->has_view || ps->sh.mode != MODE_SYNC || !view_has(&m->view, w) ||
	    m->view.version != psshard_version(&ps->sh) || members_has_pushed(m, &ps->sh, w))
		return;
	struct view now = m->view;
	view_set(&now, w, 0);
	now.rev++;
	view_say(ps, &now, 1);
	m->view = now;
	m->view_serial++;
	/* Nobody left in it: the next PULL's answer fixes a view afresh. */
	if (!view_count(&m->view))
		m->has_view = 0;
	ps->gen++;
	pthread_cond_broadcast(&ps->pull_cv);
}

int ps_view_expired(struct ps *ps, int w, int64_t now)
{
	struct members *m = &ps->mb;
	if (!m->elastic || (members_live_count(m, now) < m->min && !members_complete(m)))
		return w;
	/* Enough others: its slices go to them (ps 0 revises the step's
	 * view), and it may come back as a new worker. */
	uint64_t v = psshard_version(&ps->sh);
	role_log(ps->out, "ps %d: worker %d did not come back within peer_timeout (%g s); %s", ps->index, w,
		 ps->c->cluster.peer_timeout, ps->index ? "not waiting for it" : "its slices go to the others");
	members_drop(m, w);
	if (ps->index == 0)
		members_event(m, v, w, MEMBERS_EV_LOST);
	ps_view_drop(ps, w);
	return -1;
}
