/* See role.h. */
#include "role.h"

#include "../base/err.h"
#include "../net/frame.h"
#include "../net/privdir.h"
#include "../net/sndbuf.h"
#include "../net/sock.h"
#include "../net/wire.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

/* send_buffer_kib goes from the config to conn_send_buffer as it is. */
_Static_assert(SNDBUF_AUTO == CONFIG_INT_AUTO, "send_buffer_kib = auto");

/* A failure is fatal, not a warning: prctl(PR_SET_DUMPABLE) cannot fail on
 * Linux for these arguments, so a failure means a sandbox filters it, and
 * a role that went on would hold the key in a process whose memory its
 * user can read, which docs/SECURITY.md says does not happen. The
 * operator fixes the sandbox; a warning would scroll by unread. */
int role_harden(char *err, size_t errlen)
{
	if (prctl(PR_SET_DUMPABLE, 0L, 0L, 0L, 0L) != 0)
		return err_set(err, errlen, -EPERM,
			       "cannot make this process non-dumpable (prctl PR_SET_DUMPABLE: %s), so it will not load the cluster key",
			       strerror(errno));
	return 0;
}

int role_setup_load(struct role_setup *s, const struct config *c, int want_data, char *err,
		    size_t errlen)
{
	int e = role_harden(err, errlen);
	if (e)
		return e;
	e = key_load_guarded(&s->key, c->cluster.key_file, err, errlen);
	if (e)
		return e == -ENOMEM || e == -EIO ? e : -EINVAL;
	if (config_hash(c, s->hash))
		return snprintf(err, errlen, "out of memory"), -ENOMEM;
	e = role_ciphers(c, &s->ciphers, err, errlen);
	if (e)
		return e;
	int S = config_slices(c, 1);
	if (c->cluster.max_workers > S && !config_elastic(c))
		return err_set(err, errlen, -EINVAL, "%s: [cluster] has %d workers but [train] slices is %d: each needs a slice of the step (or set [cluster] min_workers, and the extra ones wait for one)",
			       c->path, c->cluster.max_workers, S);
	return job_load(&s->job, c, S, want_data, err, errlen);
}

int role_ciphers(const struct config *c, unsigned *offers, char *err, size_t errlen)
{
	static const unsigned named[] = {
		[CIPHER_AEGIS256] = FRAME_OFFER_AEGIS256,
		[CIPHER_AES256GCM] = FRAME_OFFER_AES256GCM,
		[CIPHER_CHACHA20] = 0,
	};
	static const char *const names[] = {
		[CIPHER_AEGIS256] = "aegis-256",
		[CIPHER_AES256GCM] = "aes-256-gcm",
	};
	int k = c->cluster.cipher;
	if (k == CIPHER_AUTO) {
		*offers = frame_offers();
		return 0;
	}
	if (named[k] & ~frame_offers())
		return err_set(err, errlen, -EINVAL,
			       "%s: [cluster] cipher = %s, but this CPU cannot run it (no AES-NI%s): "
			       "use auto", c->path, names[k], k == CIPHER_AES256GCM ? " or PCLMUL" : "");
	*offers = named[k];
	return 0;
}

void role_setup_free(struct role_setup *s)
{
	job_free(&s->job);
	key_free(s->key);
	s->key = NULL;
}

void role_log(FILE *out, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	flockfile(out);
	vfprintf(out, fmt, ap);
	fputc('\n', out);
	fflush(out);
	funlockfile(out);
	va_end(ap);
}

void role_nap_ms(long ms)
{
	struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&t, NULL);
}

int64_t role_now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int role_cond_init(pthread_cond_t *cv)
{
	pthread_condattr_t at;
	int r = pthread_condattr_init(&at);
	if (r)
		return -r;
	r = pthread_condattr_setclock(&at, CLOCK_MONOTONIC);
	if (!r)
		r = pthread_cond_init(cv, &at);
	pthread_condattr_destroy(&at);
	return -r;
}

void role_deadline(struct timespec *dl, long ms)
{
	clock_gettime(CLOCK_MONOTONIC, dl);
	long ns = dl->tv_nsec + (ms % 1000) * 1000000L;
	dl->tv_sec += ms / 1000 + ns / 1000000000L;
	dl->tv_nsec = ns % 1000000000L;
}

int role_heartbeat_ms(const struct config *c)
{
	int ms = (int)(c->cluster.peer_timeout * 1000 / 4);
	return ms < 50 ? 50 : ms;
}

int role_peer_timeout_ms(const struct config *c)
{
	return (int)(c->cluster.peer_timeout * 1000);
}

int role_write_timeout_ms(const struct config *c)
{
	int ms = role_peer_timeout_ms(c);
	return ms < 1000 ? 1000 : ms;
}

unsigned role_grad_dtype(const struct config *c)
{
	int w = c->cluster.wire_dtype;
	return w == PRECISION_BF16 || w == PRECISION_BF16_GRADS ? WIRE_BF16 : WIRE_F32;
}

unsigned role_param_dtype(const struct config *c)
{
	int w = c->cluster.wire_dtype;
	return w == PRECISION_BF16 || w == PRECISION_BF16_PARAMS ? WIRE_BF16 : WIRE_F32;
}

int role_pieces(const struct config *c)
{
	return c->train.mode == MODE_SYNC && c->train.replicas_to_aggregate == config_slices(c, 1) &&
	       !config_elastic(c);
}

int role_views(const struct config *c)
{
	int backup = c->train.mode == MODE_SYNC && c->train.replicas_to_aggregate < config_slices(c, 1);
	return config_elastic(c) && !backup;
}

int role_local_path(const struct config *c, int k, char *out, size_t outlen, char *err,
		    size_t errlen)
{
	char dflt[64];
	const char *dir = c->cluster.socket_dir;
	if (!dir[0]) {
		snprintf(dflt, sizeof(dflt), "/tmp/pstrain-%u", (unsigned)geteuid());
		dir = dflt;
	}
	int r = privdir_make(dir, err, errlen);
	if (!r)
		r = sock_unix_path(out, outlen, dir, c->cluster.ps[k].name, c->cluster.ps[k].port, err,
				   errlen);
	return r;
}
