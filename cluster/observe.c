/* `pstrain status` (cluster.h, cluster_status): connects to every ps as an
 * observer (net/handshake.h's third role, with the cluster key), asks
 * STATUS, reads the REPORT, and prints one row per shard, or one JSON
 * object; with a watch interval it asks again each interval on the same
 * connections until every ps reports the run complete (or its final
 * checkpoint), unless no ps answered the first round. What the ps does
 * with an observer is cluster/ps.c's; the bytes are docs/PROTOCOL.md's
 * ("Observers").
 *
 * One round asks every ps at once, a thread each, so a cluster with a dead
 * ps answers in STATUS_CONNECT_MS + STATUS_ANSWER_MS at most, not that
 * times the number of ps. An observer needs no model, no data and no
 * training state: it loads only the key (as the roles do: non-dumpable
 * first, then guarded pages) and the config hash its greeting carries. */
#include "cluster.h"
#include "role.h"

#include "../base/err.h"
#include "../net/conn.h"
#include "../net/handshake.h"
#include "../net/key.h"
#include "../net/msg.h"
#include "../net/sock.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long a ps has to accept our connection (refused connections are
 * retried until then, so a ps restarting is still caught), and then to
 * finish the handshake and answer. Fixed, not connect_timeout: that one is
 * how long a worker waits for a ps to start (a minute or more), while a
 * status that says nothing for a minute is no status. */
#define STATUS_CONNECT_MS 2000
#define STATUS_ANSWER_MS 5000
/* A greeting that got no answer is tried once more: a ps drops greetings
 * it cannot tell from a flood's (links.c tries three times; a status
 * should fail fast when the key is wrong). */
#define STATUS_GREETINGS 2
/* The longest message either way: a REPORT (in), with every worker and
 * event, is longer than a STATUS or HEARTBEAT (out) or any ERROR. */
#define STATUS_MSG_MAX MSG_REPORT_BYTES_ALL
_Static_assert(MSG_ERROR_BYTES_MAX <= MSG_REPORT_BYTES_MAX, "an ERROR fits");

/* One ps, across rounds. */
struct status_link {
	const struct config *c;
	const uint8_t *key;
	struct hs_identity me;   /* the status's, greeting ps k (to = k) */
	int k;
	char addr[CONFIG_HOST_MAX + 16]; /* host:port */
	struct conn conn;
	int connected;
	/* this round */
	int answered;
	char why[560];            /* why it did not answer */
	/* the newest answer of any round */
	int have;
	struct msg_report rep;
	int ended;                /* that answer was its last (final): the ps ended */
};

static void link_addr(char *buf, size_t len, const struct host *h)
{
	if (strchr(h->name, ':'))
		snprintf(buf, len, "[%s]:%u", h->name, h->port);
	else
		snprintf(buf, len, "%s:%u", h->name, h->port);
}

/* Connects and handshakes as the observer; 0, or why in l->why. */
static int link_dial(struct status_link *l)
{
	const struct host *h = &l->c->cluster.ps[l->k];
	char e[512], nm[300];
	snprintf(nm, sizeof(nm), "ps %d (%s)", l->k, l->addr);
	int r = -ENOLINK;
	for (int i = 0; i < STATUS_GREETINGS && r == -ENOLINK; i++) {
		int fd = -1;
		r = sock_connect_retry(h->name, h->port, STATUS_CONNECT_MS, &fd, e, sizeof(e));
		if (r) {
			snprintf(l->why, sizeof(l->why), "%s", e);
			return r;
		}
		r = conn_client(&l->conn, fd, l->key, &l->me, STATUS_ANSWER_MS, nm, e, sizeof(e));
	}
	if (r) {
		snprintf(l->why, sizeof(l->why), "%s", e);
		return r;
	}
	if (l->conn.hr.peer.role != HS_PS || l->conn.hr.peer.index != (uint32_t)l->k) {
		snprintf(l->why, sizeof(l->why), "answered as %s %u", hs_role_name(l->conn.hr.peer.role),
			 l->conn.hr.peer.index);
		conn_close(&l->conn);
		return -EPROTO;
	}
	l->connected = 1;
	return 0;
}

static void link_drop(struct status_link *l)
{
	conn_close(&l->conn);
	l->connected = 0;
}

/* Messages until a REPORT (a HEARTBEAT may come first): 0 with it in
 * l->rep, or why in l->why (sent: the error of a STATUS that could not be
 * sent, which says more than the read that follows). A final REPORT ends
 * the connection: the ps is ending. */
static int link_read(struct status_link *l, const char *sent)
{
	char e[400];
	size_t len;
	for (;;) {
		int r = conn_recv(&l->conn, &len, e, sizeof(e));
		if (r) {
			snprintf(l->why, sizeof(l->why), "%s", sent && sent[0] ? sent : e);
			return r;
		}
		int type = msg_type(l->conn.rbuf, len, e, sizeof(e));
		if (type == WIRE_HEARTBEAT)
			continue;
		if (type == WIRE_ERROR) {
			struct msg_error me;
			if (msg_decode_error(l->conn.rbuf, len, &me, e, sizeof(e)) == 0)
				snprintf(l->why, sizeof(l->why), "it said: %s", me.text);
			else
				snprintf(l->why, sizeof(l->why), "%s", e);
			return -ECONNABORTED;
		}
		if (type != WIRE_REPORT) {
			snprintf(l->why, sizeof(l->why), "%s",
				 type < 0 ? e : "it sent a message that is not a REPORT");
			return -EPROTO;
		}
		struct msg_report rp;
		r = msg_decode_report(l->conn.rbuf, len, &rp, e, sizeof(e));
		if (!r && rp.shard != (uint32_t)l->k)
			r = err_set(e, sizeof(e), -EPROTO, "REPORT for shard %u", rp.shard);
		if (r) {
			snprintf(l->why, sizeof(l->why), "%s", e);
			return r;
		}
		l->rep = rp;
		l->have = 1;
		l->answered = 1;
		l->ended = rp.final;
		if (rp.final)
			link_drop(l);
		return 0;
	}
}

/* STATUS, then its REPORT. A send that fails is not yet a failure: a ps
 * that has just ended closed after its last (final) REPORT, which is
 * still there to read. */
static int link_ask(struct status_link *l)
{
	char e[400], se[400] = "";
	size_t len;
	struct msg_status q = { .shard = (uint32_t)l->k };
	int r = msg_encode_status(conn_payload(&l->conn, CONN_MAIN), conn_payload_cap(&l->conn), &q,
				  &len, e, sizeof(e));
	if (r) {
		snprintf(l->why, sizeof(l->why), "%s", e);
		return r;
	}
	if (conn_send_payload(&l->conn, CONN_MAIN, len, se, sizeof(se)) == 0)
		se[0] = 0;
	return link_read(l, se);
}

/* A ps whose last answer said the run was complete and that it ended:
 * nothing more to ask it. */
static int link_finished(const struct status_link *l)
{
	return l->have && l->ended && l->rep.complete;
}

static void *link_round(void *arg)
{
	struct status_link *l = arg;
	l->answered = 0;
	l->why[0] = 0;
	if (link_finished(l))
		return NULL;
	if (!l->connected && link_dial(l))
		return NULL;
	if (link_ask(l) && l->connected)
		link_drop(l);
	return NULL;
}

/* ---- printing ------------------------------------------------------------ */

static void fmt_uptime(char *buf, size_t len, uint64_t ms)
{
	uint64_t s = ms / 1000;
	if (s < 60)
		snprintf(buf, len, "%llus", (unsigned long long)s);
	else if (s < 3600)
		snprintf(buf, len, "%llum%02llus", (unsigned long long)(s / 60), (unsigned long long)(s % 60));
	else
		snprintf(buf, len, "%lluh%02llum", (unsigned long long)(s / 3600),
			 (unsigned long long)(s / 60 % 60));
}

/* "0-1 live, 2 done": runs of workers in the same state. */
static void fmt_workers(char *buf, size_t len, const struct msg_report *rp)
{
	size_t at = 0;
	buf[0] = 0;
	for (uint32_t w = 0; w < rp->workers && at + 1 < len;) {
		uint32_t e = w;
		while (e + 1 < rp->workers && rp->state[e + 1] == rp->state[w])
			e++;
		char range[32];
		if (e == w)
			snprintf(range, sizeof(range), "%u", w);
		else
			snprintf(range, sizeof(range), "%u-%u", w, e);
		int n = snprintf(buf + at, len - at, "%s%s %s", at ? ", " : "", range,
				 msg_worker_state_name(rp->state[w]));
		at += n > 0 ? (size_t)n : 0;
		w = e + 1;
	}
}

/* The joins and leaves ps 0 saw last (elastic: docs/ELASTIC.md), a line
 * each: "step 41: worker 2 joined". */
static void print_events(FILE *out, const struct status_link *ls, int nps)
{
	for (int k = 0; k < nps; k++) {
		const struct msg_report *rp = &ls[k].rep;
		if (!ls[k].answered && !link_finished(&ls[k]))
			continue;
		for (uint32_t i = 0; i < rp->nevents; i++)
			fprintf(out, "step %llu: worker %u %s%s\n", (unsigned long long)rp->events[i].step,
				rp->events[i].worker, msg_event_name(rp->events[i].kind),
				rp->events[i].kind == MSG_EVENT_LOST ? " (gone past peer_timeout; its slices went to the others)" : "");
	}
}

static void print_table(FILE *out, struct status_link *ls, int nps, int complete)
{
	fprintf(out, "%-3s %-22s %-17s %9s %7s %8s %10s %7s  %s\n", "ps", "address", "version",
		"applied", "stale", "steps/s", "checkpoint", "up", "workers");
	for (int k = 0; k < nps; k++) {
		const struct status_link *l = &ls[k];
		if (!l->answered && !link_finished(l))
			continue;
		const struct msg_report *rp = &l->rep;
		char ver[48], rate[24], ck[24], up[24], wk[1024];
		snprintf(ver, sizeof(ver), "%llu/%llu", (unsigned long long)rp->version,
			 (unsigned long long)rp->total);
		if (rp->has_rate)
			snprintf(rate, sizeof(rate), "%.1f", (double)rp->rate);
		else
			snprintf(rate, sizeof(rate), "?");
		if (rp->has_checkpoint)
			snprintf(ck, sizeof(ck), "%llu", (unsigned long long)rp->checkpoint);
		else
			snprintf(ck, sizeof(ck), "none");
		fmt_uptime(up, sizeof(up), rp->uptime_ms);
		fmt_workers(wk, sizeof(wk), rp);
		fprintf(out, "%-3d %-22s %-17s %9llu %7llu %8s %10s %7s  %s%s\n", k, l->addr, ver,
			(unsigned long long)rp->applied, (unsigned long long)rp->stale, rate, ck, up, wk,
			l->ended ? " (ended)" : "");
	}
	print_events(out, ls, nps);
	fprintf(out, "run: %s\n", complete ? "complete" : "in progress");
}

/* s as a JSON string: our texts are printable ASCII, but a quote, a
 * backslash or a control byte must not break the object. */
static void json_str(FILE *out, const char *s)
{
	fputc('"', out);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			fprintf(out, "\\%c", ch);
		else if (ch < 0x20 || ch >= 0x7f)
			fprintf(out, "\\u%04x", ch);
		else
			fputc(ch, out);
	}
	fputc('"', out);
}

static void print_json(FILE *out, struct status_link *ls, int nps, int complete)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	fprintf(out, "{\"time\": %lld, \"complete\": %s, \"shards\": [", (long long)ts.tv_sec,
		complete ? "true" : "false");
	int n = 0;
	for (int k = 0; k < nps; k++) {
		const struct status_link *l = &ls[k];
		if (!l->answered && !link_finished(l))
			continue;
		const struct msg_report *rp = &l->rep;
		fprintf(out, "%s{\"ps\": %d, \"address\": ", n++ ? ", " : "", k);
		json_str(out, l->addr);
		fprintf(out, ", \"version\": %llu, \"total\": %llu, \"applied\": %llu, \"stale\": %llu, ",
			(unsigned long long)rp->version, (unsigned long long)rp->total,
			(unsigned long long)rp->applied, (unsigned long long)rp->stale);
		if (rp->has_rate)
			fprintf(out, "\"steps_per_s\": %.3f, ", (double)rp->rate);
		else
			fprintf(out, "\"steps_per_s\": null, ");
		if (rp->has_checkpoint)
			fprintf(out, "\"checkpoint\": %llu, ", (unsigned long long)rp->checkpoint);
		else
			fprintf(out, "\"checkpoint\": null, ");
		fprintf(out, "\"uptime_s\": %.3f, \"complete\": %s, \"ended\": %s, \"workers\": [",
			(double)rp->uptime_ms / 1000.0, rp->complete ? "true" : "false",
			l->ended ? "true" : "false");
		for (uint32_t w = 0; w < rp->workers; w++)
			fprintf(out, "%s\"%s\"", w ? ", " : "", msg_worker_state_name(rp->state[w]));
		fprintf(out, "], \"events\": [");
		for (uint32_t i = 0; i < rp->nevents; i++)
			fprintf(out, "%s{\"step\": %llu, \"worker\": %u, \"kind\": \"%s\"}", i ? ", " : "",
				(unsigned long long)rp->events[i].step, rp->events[i].worker,
				msg_event_name(rp->events[i].kind));
		fprintf(out, "]}");
	}
	fprintf(out, "], \"unanswered\": [");
	n = 0;
	for (int k = 0; k < nps; k++) {
		const struct status_link *l = &ls[k];
		if (l->answered || link_finished(l))
			continue;
		fprintf(out, "%s{\"ps\": %d, \"address\": ", n++ ? ", " : "", k);
		json_str(out, l->addr);
		fprintf(out, ", \"reason\": ");
		json_str(out, l->why);
		fputc('}', out);
	}
	fprintf(out, "]}\n");
}

/* ---- rounds --------------------------------------------------------------- */

/* Asks every ps at once; the number that did not answer. */
static int status_round(struct status_link *ls, int nps)
{
	pthread_t *t = calloc((size_t)nps, sizeof(*t));
	int *on = calloc((size_t)nps, sizeof(*on));
	for (int k = 0; k < nps && t && on; k++)
		on[k] = pthread_create(&t[k], NULL, link_round, &ls[k]) == 0;
	for (int k = 0; k < nps; k++) {
		if (on && on[k])
			pthread_join(t[k], NULL);
		else
			link_round(&ls[k]); /* no thread: in turn */
	}
	free(t);
	free(on);
	int missing = 0;
	for (int k = 0; k < nps; k++)
		missing += !ls[k].answered && !link_finished(&ls[k]);
	return missing;
}

/* The shard holds the run's final checkpoint: what a ps started again on
 * a finished run serves (ps_store.c's "run finished", the same test: the
 * checkpoint's step, W versions each in async mode, at or past the last).
 * Such a ps waits for workers that may never come, and never says the
 * run complete until they do; its checkpoint says so already. */
static int link_final_checkpoint(const struct status_link *l)
{
	const struct msg_report *rp = &l->rep;
	uint64_t per_step = l->c->train.mode == MODE_ASYNC ? (uint64_t)config_slices(l->c, 1) : 1;
	return rp->has_checkpoint && rp->total > 0 && rp->checkpoint >= rp->total / per_step;
}

/* Every ps answered (or ended) saying the run is complete, or holding its
 * final checkpoint. */
static int status_complete(const struct status_link *ls, int nps)
{
	for (int k = 0; k < nps; k++) {
		const struct status_link *l = &ls[k];
		if (!l->have || (!l->rep.complete && !link_final_checkpoint(l)) || (!l->answered && !l->ended))
			return 0;
	}
	return 1;
}

/* Names every ps that did not answer, on errout; with a hint when none
 * answered and some dropped our greeting (another cluster key). */
static void status_unanswered(FILE *errout, const struct status_link *ls, int nps)
{
	int dropped = 0, answered = 0;
	for (int k = 0; k < nps; k++) {
		const struct status_link *l = &ls[k];
		answered += l->answered;
		if (l->answered || link_finished(l))
			continue;
		dropped += strstr(l->why, "no answer to our greeting") != NULL;
		fprintf(errout, "pstrain: ps %d (%s) did not answer: %s\n", k, l->addr, l->why);
	}
	if (dropped && !answered)
		fprintf(errout, "pstrain: no ps answered our greeting: is [cluster] key_file this cluster's key? (each ps's log says why it refused)\n");
	fflush(errout);
}

/* Until the next round: watch_s seconds in steps of 100 ms, so that
 * Ctrl-C is quick; an idle connection gets a HEARTBEAT, so that a ps does
 * not take a watch interval longer than peer_timeout for a dead observer;
 * a REPORT that arrives unasked (a ps's last, as it ends) is read at once,
 * and once every ps has said the run is complete the pause ends. */
static void status_pause(struct status_link *ls, int nps, double watch_s,
			 const volatile sig_atomic_t *stop)
{
	double idle_s = role_heartbeat_ms(ls[0].c) / 1000.0;
	uint8_t hb[CONN_IDLE_MAX];
	struct msg_heartbeat m;
	size_t len = 0;
	char e[200];
	memset(&m, 0, sizeof(m));
	int ok = msg_encode_heartbeat(hb, sizeof(hb), &m, &len, e, sizeof(e)) == 0;
	for (int64_t end = role_now_ms() + (int64_t)(watch_s * 1000); role_now_ms() < end && !*stop;) {
		role_nap_ms(100);
		int news = 0;
		for (int k = 0; k < nps; k++) {
			struct status_link *l = &ls[k];
			struct pollfd p = { .fd = l->conn.fd, .events = POLLIN };
			if (l->connected && poll(&p, 1, 0) == 1) {
				news = 1;
				if (link_read(l, NULL))
					link_drop(l);
			}
			if (ok && l->connected &&
			    conn_send_idle(&l->conn, hb, len, idle_s, e, sizeof(e)) < 0)
				link_drop(l);
		}
		if (news && status_complete(ls, nps))
			return;
	}
}

int cluster_status(const struct config *c, int json, double watch_s, FILE *out, FILE *errout,
		   const volatile sig_atomic_t *stop, char *err, size_t errlen)
{
	int nps = c->cluster.nps, e = 0;
	uint8_t *key = NULL;
	struct hs_identity me = { .role = HS_OBSERVER, .index = 0 };
	struct status_link *ls = calloc((size_t)nps, sizeof(*ls));
	if (!ls)
		return err_set(err, errlen, -ENOMEM, "out of memory");
	e = role_harden(err, errlen);
	if (!e) {
		e = key_load_guarded(&key, c->cluster.key_file, err, errlen);
		e = e == 0 || e == -ENOMEM || e == -EIO ? e : -EINVAL;
	}
	if (!e && config_hash(c, me.config_hash))
		e = err_set(err, errlen, -ENOMEM, "out of memory");
	if (!e)
		e = role_ciphers(c, &me.ciphers, err, errlen);
	int inited = 0;
	for (int k = 0; k < nps && !e; k++, inited++) {
		struct status_link *l = &ls[k];
		l->c = c;
		l->key = key;
		l->me = me;
		l->me.to = (uint32_t)k;
		l->k = k;
		link_addr(l->addr, sizeof(l->addr), &c->cluster.ps[k]);
		struct conn_shape shape = { .msg_max = STATUS_MSG_MAX };
		if (conn_init(&l->conn, -1, &shape, STATUS_ANSWER_MS, STATUS_ANSWER_MS))
			e = err_set(err, errlen, -ENOMEM, "out of memory for the session keys");
	}
	int64_t heard_ms = role_now_ms(); /* when some ps last answered */
	for (int round = 0; !e; round++) {
		int missing = status_round(ls, nps);
		int complete = status_complete(ls, nps);
		if (missing < nps)
			heard_ms = role_now_ms();
		if (json)
			print_json(out, ls, nps, complete);
		else
			print_table(out, ls, nps, complete);
		fflush(out);
		status_unanswered(errout, ls, nps);
		/* A watch that reaches no ps at all when it starts ends as one
		 * round does: the ps of a finished run have exited, and
		 * waiting for ps that may never come back is what Ctrl-C was
		 * needed for. Once some ps answered, one that fails is
		 * reconnected to (it may be restarting), until none has
		 * answered for peer_timeout: by then every worker has given up
		 * on them too (exit 3), and a restarted ps is a new run to
		 * watch. */
		int gone = missing == nps && role_now_ms() - heard_ms >= role_peer_timeout_ms(c);
		if (watch_s <= 0 || complete || *stop || (round == 0 && missing == nps) || gone) {
			if (*stop)
				e = err_set(err, errlen, -EINTR, "status: interrupted");
			else if (gone && round > 0)
				e = err_set(err, errlen, -ECONNABORTED,
					    "status: none of the %d ps answered for %g s (peer_timeout)", nps,
					    c->cluster.peer_timeout);
			else if (missing == nps)
				e = err_set(err, errlen, -ECONNABORTED, "status: none of the %d ps answered", nps);
			else if (missing)
				e = err_set(err, errlen, -ECONNABORTED, "status: %d of %d ps did not answer",
					    missing, nps);
			break;
		}
		status_pause(ls, nps, watch_s, stop);
		if (*stop) {
			e = err_set(err, errlen, -EINTR, "status: interrupted");
			break;
		}
		if (!json)
			fputc('\n', out);
	}
	for (int k = 0; k < inited; k++)
		conn_destroy(&ls[k].conn);
	free(ls);
	key_free(key);
	return e;
}
