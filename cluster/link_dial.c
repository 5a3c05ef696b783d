/* A link's connection (link.h): dial ps k (its Unix socket first where
 * [cluster] local_socket allows, else TCP), greet it, and shun a Unix
 * socket that answers as something else. Runs on the caller's thread
 * while the link is DOWN: its sender and receiver are idle then. */
#include "link.h"

#include "../base/err.h"
#include "../net/sock.h"

#include <errno.h>
#include <string.h>

/* The Unix socket to try before TCP for ps k ([cluster] local_socket), or
 * NULL: only for a ps whose address is one of this host's, so that hosts
 * sharing a file system (or network namespaces sharing one kernel) never
 * reach each other's ps that way. Where the directory is not ours alone
 * the ps says so and listens on TCP only; here it is just TCP. So it is
 * while the socket file there is one that failed a greeting (link_shun). */
static const char *link_local_path(const struct link *l, char *path, size_t len)
{
	const struct config *c = l->sh->c;
	char e[400];
	if (!c->cluster.local_socket || sock_is_own_address(c->cluster.ps[l->k].name, e, sizeof(e)) != 1 ||
	    role_local_path(c, l->k, path, len, e, sizeof(e)))
		return NULL;
	if (l->shun && sock_unix_file_is(path, &l->shunned))
		return NULL;
	return path;
}

/* The Unix socket at path failed a greeting (why: the error): whatever
 * listens there is not ps k for us (another cluster's ps under the same
 * path, which left ours on TCP only; any other program of this user), so
 * the link goes over TCP for as long as that file is there. Keyed on the
 * file, not for good: a ps that restarts binds a new one, which is tried
 * (our own ps may have dropped the greeting as it died), while a
 * reconnect past the same stranger pays no failed greeting again. */
static void link_shun(struct link *l, const char *path, const char *why)
{
	l->shun = sock_unix_file_of(path, &l->shunned) == 0;
	role_log(l->sh->out, "worker %d: ps %d: the Unix socket %s did not answer as ps %d, so TCP for it: %s",
		 l->sh->index, l->k, path, l->k, why);
}

/* A connection to ps k within timeout_ms: its Unix socket first if local
 * is not NULL, else (or if nobody listens there) TCP. */
static int link_dial(struct link *l, const char *local, int timeout_ms, int *fd, char *err, size_t errlen)
{
	const struct host *ps = &l->sh->c->cluster.ps[l->k];
	char e[512];
	const volatile sig_atomic_t *stop = l->sh->dial_on ? NULL : l->sh->stop;
	int r = sock_connect_local_until(local, ps->name, ps->port, timeout_ms, stop, fd, e, sizeof(e));
	if (r)
		return err_set(err, errlen, r == -EINVAL || r == -ENOENT ? -EINVAL : r == -EINTR ? -EINTR : -ECONNABORTED,
			       "ps %d: %s", l->k, e);
	return 0;
}

/* The handshake with ps k on fd (which it takes); then, at once, a
 * HEARTBEAT: the first frame the ps opens confirms that we hold the key
 * (until then a ps does not count the connection as this worker); to ps
 * 0, then a COMPUTE. -ENOLINK: the ps did not answer our greeting. */
static int link_greet(struct link *l, int fd, int timeout_ms, char *err, size_t errlen)
{
	const struct link_shared *sh = l->sh;
	struct hs_identity me = { .role = HS_WORKER, .index = (uint32_t)sh->index, .to = (uint32_t)l->k,
				  .ciphers = sh->s->ciphers };
	memcpy(me.config_hash, sh->s->hash, HS_HASH_BYTES);
	struct conn *cn = &l->conn;
	char e[512], nm[300];
	int hs_ms = timeout_ms < ROLE_HANDSHAKE_MS ? timeout_ms : ROLE_HANDSHAKE_MS;
	link_ps_name(sh->c, l->k, nm, sizeof(nm));
	me.local = sock_is_unix_same_user(fd);
	if (me.local && sh->c->cluster.local_ring)
		me.local = HS_LOCAL_RING;
	l->unx = sock_is_unix(fd);
	int r = conn_client(cn, fd, sh->s->key, &me, hs_ms, nm, err, errlen);
	if (r)
		return r;
	if (cn->ring_why[0])
		role_log(sh->out, "worker %d: %s: its bytes go through the Unix socket: %s", sh->index, nm,
			 cn->ring_why);
	conn_send_buffer(cn, sh->c->cluster.send_buffer_kib);
	if (cn->hr.peer.role != HS_PS || cn->hr.peer.index != (uint32_t)l->k) {
		r = err_set(err, errlen, -ECONNABORTED, "%s answered as %s %u", nm,
			    hs_role_name(cn->hr.peer.role), cn->hr.peer.index);
		conn_close(cn);
		return r;
	}
	struct msg_heartbeat hb;
	size_t len;
	memset(&hb, 0, sizeof(hb));
	r = msg_encode_heartbeat(conn_payload(cn, CONN_MAIN), conn_payload_cap(cn), &hb, &len, e,
				 sizeof(e));
	if (!r)
		r = conn_send_payload(cn, CONN_MAIN, len, e, sizeof(e));
	if (!r && l->k == 0 && sh->compute[0]) {
		struct msg_compute mc;
		snprintf(mc.text, sizeof(mc.text), "%s", sh->compute);
		for (char *p = mc.text; *p; p++)   /* a GPU's name is the driver's */
			if (*p < 0x20 || *p > 0x7e)
				*p = '?';
		r = msg_encode_compute(conn_payload(cn, CONN_MAIN), conn_payload_cap(cn), &mc, &len, e, sizeof(e));
		if (!r)
			r = conn_send_payload(cn, CONN_MAIN, len, e, sizeof(e));
	}
	if (r) {
		conn_close(cn);
		return err_set(err, errlen, -ECONNABORTED, "%s: %s", nm, e);
	}
	return 0;
}

/* One connection and handshake with ps k. A greeting that fails on the
 * Unix socket is not the end of this try: the ps may well listen on TCP
 * (another listener held the path when it started), so TCP is tried at
 * once, with what is left of the time. */
static int link_open(struct link *l, int timeout_ms, char *err, size_t errlen)
{
	int64_t end = role_now_ms() + timeout_ms;
	char upath[256];
	const char *local = link_local_path(l, upath, sizeof(upath));
	int fd = -1;
	int r = link_dial(l, local, timeout_ms, &fd, err, errlen);
	if (r)
		return r;
	r = link_greet(l, fd, timeout_ms, err, errlen);
	if (!l->unx || (r != -ENOLINK && r != -ECONNABORTED))
		return r;
	link_shun(l, upath, err);
	int left = (int)(end - role_now_ms());
	left = left < 100 ? 100 : left;
	r = link_dial(l, NULL, left, &fd, err, errlen);
	return r ? r : link_greet(l, fd, left, err, errlen);
}

/* A ps drops greetings it cannot tell from a flood's (evicted while
 * connections pile up on it), so an unanswered one is tried twice more.
 * Not more: a different cluster key looks the same from here, and that
 * should fail in a second, not after connect_timeout. */
#define LINK_GREETINGS 3

int link_connect(struct link *l, int timeout_ms, char *err, size_t errlen)
{
	int64_t end = role_now_ms() + timeout_ms;
	int r = -ENOLINK;
	for (int i = 0; i < LINK_GREETINGS && r == -ENOLINK; i++) {
		int left = (int)(end - role_now_ms());
		if (i > 0)
			role_nap_ms(20L << i);
		r = link_open(l, left < 100 ? 100 : left, err, errlen);
	}
	if (r)
		return r == -ENOLINK ? -ECONNABORTED : r;
	pthread_mutex_lock(&l->mu);
	l->state = LINK_READY;
	l->end = LINK_OK;
	l->rc = 0;
	pthread_mutex_unlock(&l->mu);
	return 0;
}

void link_disconnect(struct link *l)
{
	conn_close(&l->conn);
	pthread_mutex_lock(&l->mu);
	l->state = LINK_DOWN;
	l->end = LINK_OK;
	l->rc = 0;
	pthread_mutex_unlock(&l->mu);
}
