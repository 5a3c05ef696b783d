/* TCP plumbing with deadlines (the API and its conventions are in
 * net/sock.h). What each connection means, the handshake and the messages
 * are other modules' business; this one only moves bytes and bounds the
 * time that takes.
 *
 * Why non-blocking sockets plus poll() rather than SO_RCVTIMEO/SO_SNDTIMEO:
 * those timeouts are per call, so a peer that trickles one byte per period
 * could hold a reader forever; one deadline per sock_read_full call bounds
 * the whole transfer. Non-blocking fds are also what a ps event loop needs.
 * Rejected too: alarm()/signals (process-global state) and a thread per
 * connection doing blocking I/O (issue 3 item 7). */
#include "sock.h"
#include "../base/err.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ---- time --------------------------------------------------------------- */

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The deadline for a timeout (INT64_MAX: none), and the poll() timeout left
 * until it (-1: wait forever, 0: expired). */
int64_t sock_deadline(int timeout_ms)
{
	return timeout_ms < 0 ? INT64_MAX : now_ms() + timeout_ms;
}

int sock_ms_left(int64_t deadline)
{
	if (deadline == INT64_MAX)
		return -1;
	int64_t left = deadline - now_ms();
	if (left <= 0)
		return 0;
	return left > 1000000000 ? 1000000000 : (int)left;
}

/* "60 s", "0.5 s": the timeout as a person would say it. */
static void fmt_secs(char *out, size_t outlen, int ms)
{
	snprintf(out, outlen, "%g s", ms / 1000.0);
}

/* ---- addresses ---------------------------------------------------------- */

/* host:port, or [host]:port for an IPv6 literal (bracketed once, whether
 * or not the caller wrote the brackets), for messages. */
static void fmt_hostport(char *out, size_t outlen, const char *host, unsigned port)
{
	if (strchr(host, ':') && host[0] != '[')
		snprintf(out, outlen, "[%s]:%u", host, port);
	else
		snprintf(out, outlen, "%s:%u", host, port);
}

static void fmt_sockaddr(char *out, size_t outlen, const struct sockaddr *sa)
{
	char ip[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
		inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip);
		port = ntohs(in->sin_port);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
		inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof ip);
		port = ntohs(in6->sin6_port);
	} else if (sa->sa_family == AF_UNIX) {
		snprintf(out, outlen, "this host (Unix socket)");
		return;
	}
	fmt_hostport(out, outlen, ip, port);
}

/* Copies host into out without IPv6 brackets and checks its syntax, so a
 * typo fails here with a clear message instead of as a resolver error (or a
 * resolver timeout). Anything with ':' must be an IPv6 literal (checked by
 * getaddrinfo with AI_NUMERICHOST); otherwise letters, digits, '-', '.',
 * '_'. Sets *numeric for IPv6 literals. */
static int host_parse(const char *host, char *out, size_t outlen, int *numeric, char *err,
		      size_t errlen)
{
	size_t n = host ? strlen(host) : 0;
	*numeric = 0;
	if (n == 0) {
		snprintf(err, errlen, "empty host name");
		return -EINVAL;
	}
	if (host[0] == '[') {
		if (n < 3 || host[n - 1] != ']') {
			snprintf(err, errlen, "\"%s\": unbalanced [ ] around an IPv6 address", host);
			return -EINVAL;
		}
		host++;
		n -= 2;
	}
	if (n >= outlen || n > 253) {
		snprintf(err, errlen, "\"%.40s...\": host name too long", host);
		return -EINVAL;
	}
	memcpy(out, host, n);
	out[n] = '\0';
	if (strchr(out, ':')) {
		*numeric = 1;
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)out[i];
		int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			 (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_';
		if (!ok) {
			snprintf(err, errlen, "\"%s\" is not a host name or IP address", out);
			return -EINVAL;
		}
	}
	return 0;
}

/* getaddrinfo's EAI_* codes as errnos: -ENOENT for a name that does not
 * exist (permanent), -EAGAIN for a temporary failure (retryable). */
static int gai_errno(int rc)
{
	switch (rc) {
	case EAI_AGAIN:
		return -EAGAIN;
	case EAI_MEMORY:
		return -ENOMEM;
	case EAI_SYSTEM:
		return errno ? -errno : -EIO;
	case EAI_NONAME:
#ifdef EAI_NODATA
	case EAI_NODATA:
#endif
	case EAI_FAIL:
		return -ENOENT;
	default:
		return -EINVAL;
	}
}

static int resolve(const char *host, uint16_t port, int passive, struct addrinfo **res,
		   char *err, size_t errlen)
{
	char name[256], service[8];
	int numeric = 0;
	const char *node = NULL;
	if (!(passive && (!host || !host[0] || strcmp(host, "*") == 0))) {
		int r = host_parse(host, name, sizeof name, &numeric, err, errlen);
		if (r < 0)
			return r;
		node = name;
	}
	snprintf(service, sizeof service, "%u", (unsigned)port);
	struct addrinfo hints = {
		.ai_family = AF_UNSPEC,
		.ai_socktype = SOCK_STREAM,
		.ai_protocol = IPPROTO_TCP,
		.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0) |
			    (numeric ? AI_NUMERICHOST : 0),
	};
	errno = 0;
	int rc = getaddrinfo(node, service, &hints, res);
	if (rc != 0) {
		int r = gai_errno(rc);
		snprintf(err, errlen, "cannot resolve \"%s\": %s", node ? node : "*",
			 rc == EAI_SYSTEM ? strerror(-r) : gai_strerror(rc));
		return r;
	}
	return 0;
}

/* ---- socket options ----------------------------------------------------- */

static int set_nodelay(int fd)
{
	int one = 1;
	return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0 ? -errno : 0;
}

/* ---- listen / accept ---------------------------------------------------- */

int sock_listen(const char *host, uint16_t port, int backlog, int *fd, char *err,
		size_t errlen)
{
	struct addrinfo *res = NULL;
	char where[300];
	int r = resolve(host, port, 1, &res, err, errlen);
	if (r < 0)
		return r;
	fmt_hostport(where, sizeof where, (host && host[0]) ? host : "*", port);
	if (backlog <= 0)
		backlog = SOMAXCONN;

	r = -EADDRNOTAVAIL;
	const char *step = "no address";
	for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		int s = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
			       ai->ai_protocol);
		if (s < 0) {
			r = -errno;
			step = "socket";
			continue;
		}
		int one = 1;
		if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0) {
			r = -errno;
			step = "SO_REUSEADDR";
		} else if (bind(s, ai->ai_addr, ai->ai_addrlen) < 0) {
			r = -errno;
			step = "bind";
		} else if (listen(s, backlog) < 0) {
			r = -errno;
			step = "listen";
		} else {
			freeaddrinfo(res);
			*fd = s;
			return 0;
		}
		close(s);
	}
	freeaddrinfo(res);
	snprintf(err, errlen, "cannot listen on %s: %s: %s", where, step, strerror(-r));
	return r;
}

int sock_local_port(int fd)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
		return -errno;
	if (ss.ss_family == AF_INET)
		return ntohs(((struct sockaddr_in *)&ss)->sin_port);
	if (ss.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	return -EAFNOSUPPORT;
}

/* The part of a peer's address that a limit per source counts: an IPv4
 * address, or an IPv6 /64 (one host's share of most networks; an
 * IPv4-mapped address counts as its IPv4 address). */
static void addr_source(uint8_t src[SOCK_SOURCE_BYTES], const struct sockaddr *sa)
{
	memset(src, 0, SOCK_SOURCE_BYTES);
	if (sa->sa_family == AF_INET) {
		memcpy(src, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		const uint8_t *a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
		static const uint8_t mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
		if (memcmp(a, mapped, 12) == 0)
			memcpy(src, a + 12, 4);
		else
			memcpy(src + 4, a, 8);
		src[15] = 6;
	}
}

int sock_accept(int lfd, int timeout_ms, int *fd, char *peer, size_t peerlen, char *err,
		size_t errlen)
{
	return sock_accept_from(lfd, timeout_ms, fd, peer, peerlen, NULL, err, errlen);
}

int sock_accept_from(int lfd, int timeout_ms, int *fd, char *peer, size_t peerlen,
		     uint8_t source[SOCK_SOURCE_BYTES], char *err, size_t errlen)
{
	int64_t deadline = sock_deadline(timeout_ms);
	for (;;) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		int s = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (s >= 0) {
			int r = set_nodelay(s);
			if (r < 0 && r != -EOPNOTSUPP && r != -ENOPROTOOPT) {
				close(s);
				snprintf(err, errlen, "accept: TCP_NODELAY: %s", strerror(-r));
				return r;
			}
			if (peer && peerlen)
				fmt_sockaddr(peer, peerlen, (struct sockaddr *)&ss);
			if (source)
				addr_source(source, (struct sockaddr *)&ss);
			*fd = s;
			return 0;
		}
		int e = errno;
		/* Linux reports a connection's pending network errors on accept;
		 * they are that connection's, not the listener's: try again. */
		if (e == EINTR || e == ECONNABORTED || e == EPROTO || e == ENETDOWN ||
		    e == EHOSTUNREACH || e == ENETUNREACH)
			continue;
		if (e != EAGAIN && e != EWOULDBLOCK) {
			snprintf(err, errlen, "accept: %s", strerror(e));
			return -e;
		}
		int left = sock_ms_left(deadline);
		if (left == 0) {
			if (timeout_ms == 0) {
				snprintf(err, errlen, "accept: no connection pending");
				return -EAGAIN;
			}
			snprintf(err, errlen, "accept: no connection within %d ms", timeout_ms);
			return -ETIMEDOUT;
		}
		struct pollfd p = { .fd = lfd, .events = POLLIN };
		if (poll(&p, 1, left) < 0 && errno != EINTR) {
			e = errno;
			snprintf(err, errlen, "accept: poll: %s", strerror(e));
			return -e;
		}
	}
}

int sock_quiet_ms(int fd)
{
	if (sock_is_unix(fd)) {
		/* No TCP_INFO: whether the peer hung up is all there is. */
		struct pollfd p = { .fd = fd, .events = POLLRDHUP };
		if (poll(&p, 1, 0) < 0)
			return -errno;
		return p.revents & (POLLRDHUP | POLLHUP | POLLERR) ? -ENOTCONN : 0;
	}
	struct tcp_info ti;
	socklen_t len = sizeof ti;
	memset(&ti, 0, sizeof ti);
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0)
		return -errno;
	if (ti.tcpi_state != TCP_ESTABLISHED)
		return -ENOTCONN;
	return ti.tcpi_last_data_recv > INT32_MAX ? INT32_MAX : (int)ti.tcpi_last_data_recv;
}

/* ---- connect ------------------------------------------------------------ */

/* One non-blocking connect to one address, waiting until deadline. 0 with
 * *fd set, or a negative errno. */
static int connect_one(const struct addrinfo *ai, int64_t deadline, const volatile sig_atomic_t *stop,
		       int *fd)
{
	int s = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
		       ai->ai_protocol);
	if (s < 0)
		return -errno;
	int r = 0;
	if (connect(s, ai->ai_addr, ai->ai_addrlen) < 0) {
		if (errno != EINPROGRESS && errno != EINTR) {
			r = -errno;
			goto fail;
		}
		/* In progress: writable once established or failed; SO_ERROR
		 * says which. */
		for (;;) {
			int left = sock_ms_left(deadline);
			if (left == 0) {
				r = -ETIMEDOUT;
				goto fail;
			}
			struct pollfd p = { .fd = s, .events = POLLOUT };
			int n = poll(&p, 1, left);
			if (n < 0 && errno == EINTR && stop && *stop) {
				r = -EINTR;
				goto fail;
			}
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0) {
				r = -errno;
				goto fail;
			}
			if (n > 0)
				break;
		}
		int soerr = 0;
		socklen_t sl = sizeof soerr;
		if (getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0) {
			r = -errno;
			goto fail;
		}
		if (soerr) {
			r = -soerr;
			goto fail;
		}
	}
	r = ai->ai_family == AF_UNIX ? 0 : set_nodelay(s);
	if (r < 0)
		goto fail;
	*fd = s;
	return 0;
fail:
	close(s);
	return r;
}

/* splitmix64: jitter only, so a local state seeded from the clock and the
 * pid is enough (and keeps this module free of global state). */
static uint64_t jitter_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static int retryable(int r)
{
	return r == -ECONNREFUSED || r == -ETIMEDOUT || r == -EHOSTUNREACH ||
	       r == -ENETUNREACH || r == -EHOSTDOWN || r == -ENETDOWN || r == -ECONNRESET ||
	       r == -ECONNABORTED || r == -EAGAIN || r == -EINTR || r == -EADDRNOTAVAIL;
}

int sock_connect_retry(const char *host, uint16_t port, int timeout_ms, int *fd, char *err,
		       size_t errlen)
{
	return sock_connect_local_until(NULL, host, port, timeout_ms, NULL, fd, err, errlen);
}

int sock_connect_until(const char *host, uint16_t port, int timeout_ms,
		       const volatile sig_atomic_t *stop, int *fd, char *err, size_t errlen)
{
	return sock_connect_local_until(NULL, host, port, timeout_ms, stop, fd, err, errlen);
}

/* One try at the Unix socket path: 0 with *fd, or a negative errno (no
 * such file, nobody listening, a path too long...). */
static int connect_unix(const char *path, int64_t deadline, const volatile sig_atomic_t *stop,
			int *fd)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof sun.sun_path)
		return -ENAMETOOLONG;
	memcpy(sun.sun_path, path, strlen(path) + 1);
	struct addrinfo ai = { .ai_family = AF_UNIX, .ai_socktype = SOCK_STREAM,
			       .ai_addr = (struct sockaddr *)&sun, .ai_addrlen = sizeof sun };
	return connect_one(&ai, deadline, stop, fd);
}

int sock_prefer_unix(const char *unix_path, int *fd)
{
	int u = -1;
	if (!unix_path || connect_unix(unix_path, now_ms() + SOCK_BACKOFF_MIN_MS, NULL, &u))
		return 0;
	close(*fd);
	*fd = u;
	return 1;
}

int sock_connect_local_until(const char *unix_path, const char *host, uint16_t port,
			     int timeout_ms, const volatile sig_atomic_t *stop, int *fd, char *err,
			     size_t errlen)
{
	char where[300], secs[32];
	fmt_hostport(where, sizeof where, host ? host : "", port);
	if (port == 0) {
		snprintf(err, errlen, "%s: port 0 cannot be connected to (1..65535)", where);
		return -EINVAL;
	}
	if (timeout_ms < 0)
		timeout_ms = 0;
	fmt_secs(secs, sizeof secs, timeout_ms);

	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)fd;
	int64_t deadline = now_ms() + timeout_ms;
	int pause = SOCK_BACKOFF_MIN_MS;
	char last[400] = "no attempt made";
	int r = -ETIMEDOUT;

	for (;;) {
		if (stop && *stop) {
			snprintf(err, errlen, "interrupted while connecting to %s", where);
			return -EINTR;
		}
		/* The Unix socket first, at every attempt: a ps that starts
		 * after us listens there before it listens on TCP. */
		if (unix_path && connect_unix(unix_path, deadline, stop, fd) == 0)
			return 0;
		struct addrinfo *res = NULL;
		r = resolve(host, port, 0, &res, last, sizeof last);
		if (r == -EINVAL || r == -ENOENT || r == -ENOMEM) {
			snprintf(err, errlen, "cannot reach %s: %s", where, last);
			return r;
		}
		if (r == 0) {
			for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
				r = connect_one(ai, deadline, stop, fd);
				if (r == 0)
					break;
				snprintf(last, sizeof last, "%s", strerror(-r));
				if (!retryable(r))
					break;
			}
			freeaddrinfo(res);
			if (r == 0) {
				(void)sock_prefer_unix(unix_path, fd);
				return 0;
			}
			if (!retryable(r)) {
				snprintf(err, errlen, "cannot connect to %s: %s", where, last);
				return r;
			}
		}
		int left = sock_ms_left(deadline);
		if (stop && *stop)
			continue; /* the top of the loop says so */
		if (left == 0)
			break;
		int wait = pause / 2 + (int)(jitter_next(&seed) % (uint64_t)(pause / 2 + 1));
		if (wait > left)
			wait = left;
		/* Sleep to a point in time: EINTR just shortens one poll. */
		int64_t wake = now_ms() + wait;
		for (int w; (w = (int)(wake - now_ms())) > 0 && !(stop && *stop);)
			poll(NULL, 0, w);
		pause = pause * 2 > SOCK_BACKOFF_MAX_MS ? SOCK_BACKOFF_MAX_MS : pause * 2;
		if (sock_ms_left(deadline) == 0)
			break;
	}
	snprintf(err, errlen, "cannot reach %s after %s: %s", where, secs, last);
	return r;
}

/* ---- full reads and writes ---------------------------------------------- */

/* Waits until fd is ready for events or the deadline passes: 0 ready (or
 * interrupted: the caller just tries again), -ETIMEDOUT, or poll's errno. */
static int wait_ready(int fd, short events, int64_t deadline)
{
	int left = sock_ms_left(deadline);
	if (left == 0)
		return -ETIMEDOUT;
	struct pollfd p = { .fd = fd, .events = events };
	int n = poll(&p, 1, left);
	if (n < 0)
		return errno == EINTR ? 0 : -errno;
	if (n == 0)
		return -ETIMEDOUT;
	return 0; /* POLLERR/POLLHUP: the next recv/send reports it */
}

/* The n parts of iov copied into v (n checked by the caller), and their
 * total length. */
static size_t iov_copy(struct iovec *v, const struct iovec *iov, int n)
{
	size_t len = 0;
	memcpy(v, iov, (size_t)n * sizeof(*v));
	for (int i = 0; i < n; i++)
		len += v[i].iov_len;
	return len;
}

/* Moves past k bytes that went (or came), part by part: *at becomes the
 * first part with bytes left. */
static void iov_skip(struct iovec *v, int n, int *at, size_t k)
{
	while (*at < n && k >= v[*at].iov_len)
		k -= v[(*at)++].iov_len;
	if (*at < n) {
		v[*at].iov_base = (uint8_t *)v[*at].iov_base + k;
		v[*at].iov_len -= k;
	}
}

int sock_read_iov(int fd, const struct iovec *iov, int n, int timeout_ms, char *err, size_t errlen)
{
	struct iovec v[SOCK_IOV_MAX];
	if (n < 1 || n > SOCK_IOV_MAX)
		return err_set(err, errlen, -EINVAL, "read of %d parts (1..%d)", n, SOCK_IOV_MAX);
	size_t len = iov_copy(v, iov, n), done = 0;
	int64_t deadline = sock_deadline(timeout_ms);
	int at = 0;
	while (done < len) {
		struct msghdr mh = { .msg_iov = v + at, .msg_iovlen = (size_t)(n - at) };
		ssize_t got = recvmsg(fd, &mh, MSG_DONTWAIT);
		if (got > 0) {
			done += (size_t)got;
			iov_skip(v, n, &at, (size_t)got);
			continue;
		}
		if (got == 0)
			return err_set(err, errlen, -EPIPE, "peer closed the connection after %zu of %zu bytes",
				       done, len);
		int e = errno;
		if (e == EINTR)
			continue;
		if (e != EAGAIN && e != EWOULDBLOCK)
			return err_set(err, errlen, -e, "read failed after %zu of %zu bytes: %s", done, len,
				       strerror(e));
		int r = wait_ready(fd, POLLIN, deadline);
		if (r == -ETIMEDOUT)
			return err_set(err, errlen, r, "read timed out after %d ms with %zu of %zu bytes",
				       timeout_ms, done, len);
		if (r < 0)
			return err_set(err, errlen, r, "read: poll: %s", strerror(-r));
	}
	return 0;
}

int sock_read_full(int fd, void *buf, size_t len, int timeout_ms, char *err, size_t errlen)
{
	struct iovec v = { .iov_base = buf, .iov_len = len };
	return sock_read_iov(fd, &v, 1, timeout_ms, err, errlen);
}

int sock_write_full(int fd, const void *buf, size_t len, int timeout_ms, char *err,
		    size_t errlen)
{
	struct iovec v = { .iov_base = (void *)buf, .iov_len = len };
	return sock_write_iov(fd, &v, 1, timeout_ms, err, errlen);
}

/* ---- writes of several parts -------------------------------------------- */

int sock_write_iov(int fd, const struct iovec *iov, int n, int timeout_ms, char *err, size_t errlen)
{
	struct iovec v[SOCK_IOV_MAX];
	if (n < 1 || n > SOCK_IOV_MAX)
		return err_set(err, errlen, -EINVAL, "write of %d parts (1..%d)", n, SOCK_IOV_MAX);
	size_t len = iov_copy(v, iov, n), done = 0;
	int64_t deadline = sock_deadline(timeout_ms);
	int at = 0;
	while (done < len) {
		struct msghdr mh = { .msg_iov = v + at, .msg_iovlen = (size_t)(n - at) };
		/* MSG_NOSIGNAL: a closed peer is -EPIPE here, not a SIGPIPE that
		 * would kill the process (a library must not touch signal
		 * dispositions). */
		ssize_t sent = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (sent > 0) {
			done += (size_t)sent;
			iov_skip(v, n, &at, (size_t)sent);
			continue;
		}
		int e = sent == 0 ? EIO : errno;
		if (e == EINTR)
			continue;
		if (e == EPIPE)
			return err_set(err, errlen, -EPIPE, "peer closed the connection after %zu of %zu bytes",
				       done, len);
		if (e != EAGAIN && e != EWOULDBLOCK)
			return err_set(err, errlen, -e, "write failed after %zu of %zu bytes: %s", done, len,
				       strerror(e));
		int r = wait_ready(fd, POLLOUT, deadline);
		if (r == -ETIMEDOUT)
			return err_set(err, errlen, r, "write timed out after %d ms with %zu of %zu bytes",
				       timeout_ms, done, len);
		if (r < 0)
			return err_set(err, errlen, r, "write: poll: %s", strerror(-r));
	}
	return 0;
}

/* Whether two socket addresses (IPv4 or IPv6) name the same host address,
 * 127.0.0.0/8 counting as one (lo answers all of it). */
static int sock_same_host(const struct sockaddr *a, const struct sockaddr *b)
{
	if (a->sa_family != b->sa_family)
		return 0;
	if (a->sa_family == AF_INET) {
		uint32_t x = ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr);
		uint32_t y = ntohl(((const struct sockaddr_in *)b)->sin_addr.s_addr);
		return x == y || (x >> 24 == 127 && y >> 24 == 127);
	}
	if (a->sa_family == AF_INET6)
		return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
			      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
	return 0;
}

int sock_is_own_address(const char *host, char *err, size_t errlen)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
	int g = getaddrinfo(host, NULL, &hints, &res);
	if (g) {
		snprintf(err, errlen, "cannot resolve \"%s\": %s", host, gai_strerror(g));
		return -ENOENT;
	}
	struct ifaddrs *ifs = NULL;
	if (getifaddrs(&ifs)) {
		int e = errno;
		freeaddrinfo(res);
		snprintf(err, errlen, "cannot list this host's addresses: %s", strerror(e));
		return -e;
	}
	int own = 0;
	for (struct addrinfo *a = res; a && !own; a = a->ai_next)
		for (struct ifaddrs *i = ifs; i && !own; i = i->ifa_next)
			own = i->ifa_addr && sock_same_host(a->ai_addr, i->ifa_addr);
	freeifaddrs(ifs);
	freeaddrinfo(res);
	return own;
}

/* ---- Unix sockets for a ps on the worker's own host --------------------- */

int sock_is_unix(int fd)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
		return 0;
	return ss.ss_family == AF_UNIX;
}

int sock_is_unix_same_user(int fd)
{
	struct ucred cr;
	socklen_t len = sizeof cr;
	if (!sock_is_unix(fd) || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
		return 0;
	return len == sizeof cr && cr.uid == geteuid();
}

int sock_unix_path(char *out, size_t outlen, const char *dir, const char *host, uint16_t port,
		   char *err, size_t errlen)
{
	struct sockaddr_un sun;
	char hp[300];
	fmt_hostport(hp, sizeof hp, host, port);
	int n = snprintf(out, outlen, "%s/ps-%s.sock", dir, hp);
	if (n < 0 || (size_t)n >= outlen || (size_t)n >= sizeof sun.sun_path) {
		snprintf(err, errlen, "the socket path for %s in %s is longer than %zu bytes", hp, dir,
			 sizeof sun.sun_path - 1);
		return -ENAMETOOLONG;
	}
	return 0;
}

int sock_listen_unix(const char *path, int *fd, struct sock_unix_file *file, char *err,
		     size_t errlen)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	struct stat st;
	if (strlen(path) >= sizeof sun.sun_path) {
		snprintf(err, errlen, "cannot listen on %s: path too long", path);
		return -ENAMETOOLONG;
	}
	memcpy(sun.sun_path, path, strlen(path) + 1);
	if (lstat(path, &st) == 0) {
		int probe = -1;
		if (!S_ISSOCK(st.st_mode)) {
			snprintf(err, errlen, "cannot listen on %s: it exists and is not a socket", path);
			return -EEXIST;
		}
		/* Left by a process that is gone, or in use by a live one. A
		 * live one whose backlog is full answers EAGAIN, not a refusal:
		 * taking its path would leave it unreachable for good. */
		int pr = connect_unix(path, sock_deadline(1000), NULL, &probe);
		if (pr == 0 || pr == -EAGAIN) {
			if (pr == 0)
				close(probe);
			snprintf(err, errlen, "cannot listen on %s: another process listens there", path);
			return -EADDRINUSE;
		}
		if (unlink(path) < 0 && errno != ENOENT) {
			int e = errno;
			snprintf(err, errlen, "cannot remove the stale socket %s: %s", path, strerror(e));
			return -e;
		}
	}
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s < 0) {
		int e = errno;
		snprintf(err, errlen, "cannot listen on %s: socket: %s", path, strerror(e));
		return -e;
	}
	if (bind(s, (struct sockaddr *)&sun, sizeof sun) < 0 || listen(s, SOMAXCONN) < 0) {
		int e = errno;
		close(s);
		snprintf(err, errlen, "cannot listen on %s: %s", path, strerror(e));
		return -e;
	}
	/* The file bind made, for sock_unlink_unix: a socket's fstat names
	 * its inode in sockfs, not this one. Only this user can be in the
	 * directory between bind and here. */
	int r = file ? sock_unix_file_of(path, file) : 0;
	if (r < 0) {
		close(s);
		snprintf(err, errlen, "cannot listen on %s: lstat after bind: %s", path, strerror(-r));
		return r;
	}
	*fd = s;
	return 0;
}

int sock_unix_file_of(const char *path, struct sock_unix_file *f)
{
	struct stat st;
	if (lstat(path, &st) < 0)
		return -errno;
	*f = (struct sock_unix_file){ .dev = st.st_dev, .ino = st.st_ino };
	return 0;
}

int sock_unix_file_is(const char *path, const struct sock_unix_file *f)
{
	struct sock_unix_file now;
	return sock_unix_file_of(path, &now) == 0 && now.dev == f->dev && now.ino == f->ino;
}

int sock_unlink_unix(const char *path, const struct sock_unix_file *file)
{
	struct stat st;
	/* Between this lstat and the unlink another process could still swap
	 * the file; in a directory of this user's alone that is only this
	 * user's, and no call unlinks by inode. */
	if (lstat(path, &st) < 0)
		return -errno;
	if (st.st_dev != file->dev || st.st_ino != file->ino || !S_ISSOCK(st.st_mode))
		return -ESTALE;
	return unlink(path) < 0 ? -errno : 0;
}
