/* The ps's admission (ps.c's accept loop hands it each whole greeting out
 * of the gate): a worker's greeting answered and its connection given a
 * detached thread of its own; an observer's (`pstrain status`) admitted
 * into its slots with the REPORT it may ask for; everything else refused
 * into the gate's tally, logged at most once per PS_TALLY_MS.
 * docs/SECURITY.md says what each check is for. */
#include "ps_conn.h"

#include "../base/err.h"
#include "../net/conn.h"
#include "../net/gate.h"
#include "../net/handshake.h"
#include "../net/msg.h"
#include "../net/sock.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* At most one line of refusals per this many ms (a summary with counts). */
#define PS_TALLY_MS 10000

static void *ps_conn_main(void *arg)
{
	struct ps_conn *cn = arg;
	(void)ps_conn_run(cn);
	free(cn);
	return NULL;
}

/* A detached thread for worker w's answered connection (ps_conn_add). -1
 * if there is no slot, memory or thread (fd closed). */
static int ps_spawn(struct ps *ps, int fd, const char *peer, int w, const struct hs_result *hr)
{
	struct ps_conn *cn = ps_conn_add(ps, fd, peer, w, hr);
	if (!cn)
		return -1;
	pthread_t t;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	int ok = pthread_create(&t, &at, ps_conn_main, cn) == 0;
	pthread_attr_destroy(&at);
	if (ok)
		return 0;
	ps_conn_drop(cn);
	free(cn);
	return -1;
}

/* Answers an admitted greeting (hs_server_respond and our HELLO2): 0 with
 * the session keys in *hr (the caller wipes them), else refused into the
 * gate's tally (a version or config mismatch is answered first, so the
 * peer can say what differs too). */
static int ps_answer(struct ps *ps, struct gate_greeting *gr, struct hs_result *hr)
{
	uint8_t hello2[HS_HELLO_BYTES];
	size_t outlen = 0;
	char e[400], why[480];
	/* A worker of our user on this host came through the Unix socket:
	 * say so, and if it says so too, the frames go unencrypted
	 * (handshake.h). A peer of another user there (the directory was
	 * not what it was checked to be) gets sealed frames. */
	struct hs_identity me = ps->me;
	me.local = sock_is_unix_same_user(gr->fd);
	int r = hs_server_respond(hr, hello2, &outlen, ps->s->key, &me, gr->hello, HS_HELLO_BYTES,
				  e, sizeof(e));
	/* A fresh socket's buffer takes 144 bytes at once; one that does
	 * not is not worth waiting for. */
	int wr = outlen ? sock_write_full(gr->fd, hello2, outlen, 0, NULL, 0) : 0;
	if (r || wr) {
		if (!r) {
			frame_key_wipe(&hr->send);
			frame_key_wipe(&hr->recv);
		}
		snprintf(why, sizeof(why), "handshake refused: %s", r ? e : "could not send our answer");
		gate_refuse(&ps->gate, gr, GATE_MISMATCH, why);
		return -1;
	}
	return 0;
}

/* ---- observers -----------------------------------------------------------
 * `pstrain status` greets as an observer (index 0) and asks STATUS; each
 * is answered with a REPORT built under ps->mu from what the ps already
 * keeps (the shard's counters, members, ps_store, the rate). An observer
 * is never a member: it is in no list of workers, no "waiting for", and
 * the ps ends without waiting for it (ps_drain sends each a last REPORT
 * and closes it). Admission is here; serving them is ps_observers.c's. */

static uint64_t ps_wall_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

_Static_assert((int)MEMBERS_EV_JOINED == MSG_EVENT_JOINED && (int)MEMBERS_EV_LEFT == MSG_EVENT_LEFT &&
		       (int)MEMBERS_EV_LOST == MSG_EVENT_LOST && MEMBERS_EVENTS == MSG_REPORT_EVENTS,
	       "a member's event is a REPORT's");

static uint8_t ps_worker_state(const struct members *mb, int w)
{
	static const uint8_t wire[] = {
		[MEMBERS_IS_ABSENT] = MSG_WORKER_ABSENT, [MEMBERS_IS_LIVE] = MSG_WORKER_LIVE,
		[MEMBERS_IS_DONE] = MSG_WORKER_DONE,	 [MEMBERS_IS_LEFT] = MSG_WORKER_LEFT,
		[MEMBERS_IS_LOST] = MSG_WORKER_LOST,	 [MEMBERS_IS_AWAY] = MSG_WORKER_AWAY,
		/* elastic: still training its last step; gone, nothing awaited */
		[MEMBERS_IS_GOING] = MSG_WORKER_LIVE,	 [MEMBERS_IS_DROPPED] = MSG_WORKER_ABSENT,
	};
	return wire[members_state(mb, w)];
}

/* What the ps says to an observer now (takes ps->mu): ps_observers'
 * report function. */
void ps_report(void *ctx, struct msg_report *rp, int final)
{
	struct ps *ps = ctx;
	double per_s = 0;
	memset(rp, 0, sizeof(*rp));
	pthread_mutex_lock(&ps->mu);
	rp->shard = (uint32_t)ps->index;
	rp->version = psshard_version(&ps->sh);
	rp->total = ps->sh.total > 0 ? (uint64_t)ps->sh.total : 0;
	rp->applied = ps->sh.received - ps->sh.dropped_stale;
	rp->stale = ps->sh.dropped_stale;
	rp->complete = (uint8_t)members_complete(&ps->mb);
	rp->final = (uint8_t)final;
	rp->has_checkpoint = (uint8_t)ps_store_last(&ps->store, &rp->checkpoint);
	rp->has_rate = (uint8_t)rate_get(&ps->rate, &per_s);
	rp->rate = (float)per_s;
	rp->uptime_ms = (uint64_t)(role_now_ms() - ps->started_ms);
	rp->workers = (uint32_t)ps->W;
	for (int w = 0; w < ps->W; w++)
		rp->state[w] = ps_worker_state(&ps->mb, w);
	struct members_event ev[MSG_REPORT_EVENTS];
	rp->nevents = (uint32_t)members_events(&ps->mb, ev, MSG_REPORT_EVENTS);
	for (uint32_t i = 0; i < rp->nevents; i++)
		rp->events[i] = (struct msg_event){ .step = ev[i].step, .worker = (uint16_t)ev[i].w,
						    .kind = (uint8_t)ev[i].kind };
	pthread_mutex_unlock(&ps->mu);
}

/* An observer's greeting (r, t: hs_server_peek's result and the time it
 * carries): answered if it says index 0, a slot is free, and its time is
 * within OBSERVERS_WINDOW_NS of this host's clock and not answered before
 * (observers.h: observers run on any host, and several at once, so a
 * worker's "newer than the last" cannot hold). A slot is looked at before
 * the greeting is recorded, so a refused greeting stays answerable. */
static void ps_admit_observer(struct ps *ps, struct gate_greeting *gr, const struct hs_identity *peer,
			      int r, uint64_t t)
{
	struct hs_result hr;
	char why[200];
	if (peer->index != 0) {
		snprintf(why, sizeof(why), "refused observer %u (an observer greets as 0)", peer->index);
		gate_refuse(&ps->gate, gr, GATE_UNWANTED, why);
		return;
	}
	int fresh = 0, full = 0;
	uint64_t now = ps_wall_ns();
	if (r != -EPROTONOSUPPORT) {
		pthread_mutex_lock(&ps->mu);
		full = ps_observers_full(&ps->po);
		if (!full)
			fresh = observers_greeted(&ps->seen, t, now);
		pthread_mutex_unlock(&ps->mu);
	}
	if (full) {
		snprintf(why, sizeof(why), "refused an observer: %d are connected already", PS_OBSERVERS_MAX);
		gate_refuse(&ps->gate, gr, GATE_UNWANTED, why);
		return;
	}
	if (fresh) {
		double off = ((double)t - (double)now) / 1e9;
		if (fresh == -ESTALE)
			snprintf(why, sizeof(why), "refused an observer's greeting %.0f s %s this host's clock (more than %llu s: replayed, or a clock that is off)",
				 off < 0 ? -off : off, off < 0 ? "behind" : "ahead of",
				 (unsigned long long)(OBSERVERS_WINDOW_NS / 1000000000u));
		else if (fresh == -EALREADY)
			snprintf(why, sizeof(why), "refused an observer's greeting already answered (replayed)");
		else
			snprintf(why, sizeof(why), "refused an observer: %d observer greetings in %llu s", OBSERVERS_SEEN,
				 (unsigned long long)(OBSERVERS_WINDOW_NS / 1000000000u));
		gate_refuse(&ps->gate, gr, GATE_REPLAYED, why);
		return;
	}
	if (ps_answer(ps, gr, &hr))
		return;
	if (ps_observers_spawn(&ps->po, gr->fd, gr->peer, &hr))
		role_log(ps->out, "ps %d: %s: refused an observer: no slot, memory or thread for it", ps->index,
			 gr->peer);
	frame_key_wipe(&hr.send);
	frame_key_wipe(&hr.recv);
}

/* A whole greeting out of the gate: answered if it is authentic, from a
 * worker of this cluster, and newer than any of that worker's answered
 * before (a version or config mismatch is answered too, so the worker can
 * say what differs, and then closed), or from an observer
 * (ps_admit_observer). Everything refused goes to the gate's tally, never
 * to a line of its own. */
void ps_admit(struct ps *ps, struct gate_greeting *gr)
{
	struct hs_identity peer;
	struct hs_result hr;
	uint64_t t = 0;
	char e[400], why[480];
	int r = hs_server_peek(ps->s->key, &ps->me, gr->hello, HS_HELLO_BYTES, &peer, &t, e, sizeof(e));
	if (r && r != -EBADE && r != -EPROTONOSUPPORT) { /* -EADDRNOTAVAIL: for another ps */
		snprintf(why, sizeof(why), "%s: %s", r == -EADDRNOTAVAIL ? "refused" : "handshake refused", e);
		gate_refuse(&ps->gate, gr, r == -EADDRNOTAVAIL ? GATE_ELSEWHERE : GATE_UNAUTH, why);
		return;
	}
	if (peer.role == HS_OBSERVER) {
		ps_admit_observer(ps, gr, &peer, r, t);
		return;
	}
	if (peer.role != HS_WORKER || peer.index >= (uint32_t)ps->W) {
		snprintf(why, sizeof(why), "refused %s %u (this cluster has %d workers)",
			 hs_role_name(peer.role), peer.index, ps->W);
		gate_refuse(&ps->gate, gr, GATE_UNWANTED, why);
		return;
	}
	int w = (int)peer.index, fresh = 1;
	if (r != -EPROTONOSUPPORT) {
		pthread_mutex_lock(&ps->mu);
		fresh = members_greeted(&ps->mb, w, t);
		pthread_mutex_unlock(&ps->mu);
	}
	if (!fresh) {
		snprintf(why, sizeof(why), "refused a greeting as worker %d not newer than one already answered (replayed, or that host's clock went back)",
			 w);
		gate_refuse(&ps->gate, gr, GATE_REPLAYED, why);
		return;
	}
	if (ps_answer(ps, gr, &hr))
		return;
	if (ps_spawn(ps, gr->fd, gr->peer, w, &hr))
		role_log(ps->out, "ps %d: %s: refused worker %d: no thread for its connection", ps->index,
			 gr->peer, w);
	frame_key_wipe(&hr.send);
	frame_key_wipe(&hr.recv);
}

/* The refusals since the last line, as one line: at once if none was
 * logged for PS_TALLY_MS (a single misconfigured worker is named right
 * away), else when that much time has passed; force: now (the ps ends). */
void ps_tally_log(struct ps *ps, int force)
{
	int64_t now = role_now_ms();
	if (ps->gate.tally.total == 0 || (!force && ps->tally_ms && now - ps->tally_ms < PS_TALLY_MS))
		return;
	struct gate_tally t;
	char counts[400];
	gate_tally_take(&ps->gate, &t);
	gate_tally_text(&t, counts, sizeof(counts));
	if (t.total == 1)
		role_log(ps->out, "ps %d: %s", ps->index, t.first);
	else
		role_log(ps->out, "ps %d: refused %llu connections in %.0f s (%s); the first: %s",
			 ps->index, (unsigned long long)t.total,
			 ps->tally_ms ? (now - ps->tally_ms) / 1000.0 : PS_TALLY_MS / 1000.0, counts,
			 t.first);
	ps->tally_ms = now;
}
