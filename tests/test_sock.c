/* Tests of net/sock.c: listen on a port the kernel picks and connect;
 * full reads and writes of 8 MiB against a peer that moves random-sized
 * pieces; EOF mid-read; one deadline per call against stalled and
 * trickling peers (the elapsed time is measured); connect retry to a
 * listener that appears late and to a closed port; bad hosts and ports; no
 * SIGPIPE; frames over a socket. Everything runs on 127.0.0.1 (and ::1 where
 * the host has it) and is bounded by a few seconds. */
#include <criterion/criterion.h>

#include "leak.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "../net/frame.h"
#include "../net/privdir.h"
#include "../net/sock.h"

TestSuite(sock, .fini = leak_check, .timeout = 20);

/* ---- helpers ------------------------------------------------------------ */

/* Slack allowed past a deadline: generous for a loaded machine and ASan. */
#define SLACK_MS 700

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
	}
}

/* A port that was free a moment ago: bind port 0, read it, close. */
static uint16_t free_port(void)
{
	char err[256] = "";
	int fd = -1;
	cr_assert_eq(sock_listen("127.0.0.1", 0, 1, &fd, err, sizeof err), 0, "%s", err);
	int port = sock_local_port(fd);
	cr_assert_gt(port, 0);
	close(fd);
	return (uint16_t)port;
}

/* A connected loopback TCP pair: *c the client end, *s the server's. */
static void tcp_pair(int *c, int *s)
{
	char err[256] = "";
	int lfd = -1;
	cr_assert_eq(sock_listen("127.0.0.1", 0, 4, &lfd, err, sizeof err), 0, "%s", err);
	int port = sock_local_port(lfd);
	cr_assert_eq(sock_connect_retry("127.0.0.1", (uint16_t)port, 2000, c, err, sizeof err), 0,
		     "%s", err);
	cr_assert_eq(sock_accept(lfd, 2000, s, NULL, 0, err, sizeof err), 0, "%s", err);
	close(lfd);
}

static void unix_pair(int sv[2])
{
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
	uint32_t x = seed | 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = (uint8_t)x;
	}
}

/* ---- listen, accept, connect -------------------------------------------- */

Test(sock, listen_port0_connect_accept)
{
	char err[256] = "", peer[SOCK_ADDR_STRLEN] = "";
	int lfd = -1, c = -1, s = -1;
	cr_assert_eq(sock_listen("127.0.0.1", 0, 8, &lfd, err, sizeof err), 0, "%s", err);
	int port = sock_local_port(lfd);
	cr_assert(port > 0 && port <= 65535, "port %d", port);
	cr_assert(fcntl(lfd, F_GETFD) & FD_CLOEXEC);
	cr_assert(fcntl(lfd, F_GETFL) & O_NONBLOCK);

	cr_assert_eq(sock_connect_retry("127.0.0.1", (uint16_t)port, 2000, &c, err, sizeof err), 0,
		     "%s", err);
	cr_assert_eq(sock_accept(lfd, 2000, &s, peer, sizeof peer, err, sizeof err), 0, "%s", err);
	char want[SOCK_ADDR_STRLEN];
	snprintf(want, sizeof want, "127.0.0.1:%d", sock_local_port(c));
	cr_assert_str_eq(peer, want);

	int fds[2] = { c, s };
	for (int i = 0; i < 2; i++) {
		int v = 0;
		socklen_t sl = sizeof v;
		cr_assert_eq(getsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &v, &sl), 0);
		cr_assert_neq(v, 0, "TCP_NODELAY not set on fd %d", i);
		cr_assert(fcntl(fds[i], F_GETFD) & FD_CLOEXEC);
		cr_assert(fcntl(fds[i], F_GETFL) & O_NONBLOCK);
	}

	uint8_t out[5] = "hello", in[5] = { 0 };
	cr_assert_eq(sock_write_full(c, out, 5, 1000, err, sizeof err), 0, "%s", err);
	cr_assert_eq(sock_read_full(s, in, 5, 1000, err, sizeof err), 0, "%s", err);
	cr_assert_eq(memcmp(in, out, 5), 0);
	cr_assert_eq(sock_write_full(s, "ok", 2, 1000, err, sizeof err), 0, "%s", err);
	cr_assert_eq(sock_read_full(c, in, 2, 1000, err, sizeof err), 0, "%s", err);
	cr_assert_eq(memcmp(in, "ok", 2), 0);
	close(c);
	close(s);
	close(lfd);
}

Test(sock, ipv6_loopback)
{
	char err[256] = "", peer[SOCK_ADDR_STRLEN] = "";
	int lfd = -1, c = -1, s = -1;
	int r = sock_listen("::1", 0, 4, &lfd, err, sizeof err);
	if (r == -EADDRNOTAVAIL || r == -EAFNOSUPPORT)
		cr_skip("no IPv6 loopback here: %s", err);
	cr_assert_eq(r, 0, "%s", err);
	int port = sock_local_port(lfd);
	cr_assert_gt(port, 0);
	/* Bracketed and bare literals both work. */
	cr_assert_eq(sock_connect_retry("[::1]", (uint16_t)port, 2000, &c, err, sizeof err), 0,
		     "%s", err);
	cr_assert_eq(sock_accept(lfd, 2000, &s, peer, sizeof peer, err, sizeof err), 0, "%s", err);
	cr_assert(strncmp(peer, "[::1]:", 6) == 0, "peer %s", peer);
	close(c);
	close(s);
	cr_assert_eq(sock_connect_retry("::1", (uint16_t)port, 2000, &c, err, sizeof err), 0, "%s",
		     err);
	close(c);
	close(lfd);
}

Test(sock, accept_timeout)
{
	char err[256] = "";
	int lfd = -1, s = -1;
	cr_assert_eq(sock_listen("127.0.0.1", 0, 4, &lfd, err, sizeof err), 0, "%s", err);
	cr_assert_eq(sock_accept(lfd, 0, &s, NULL, 0, err, sizeof err), -EAGAIN);
	int64_t t0 = now_ms();
	cr_assert_eq(sock_accept(lfd, 200, &s, NULL, 0, err, sizeof err), -ETIMEDOUT);
	int64_t dt = now_ms() - t0;
	cr_assert(dt >= 190 && dt <= 200 + SLACK_MS, "accept waited %lld ms", (long long)dt);
	cr_assert_eq(s, -1);
	close(lfd);
}

Test(sock, listen_port_in_use)
{
	char err[256] = "", want[64];
	int a = -1, b = -1;
	cr_assert_eq(sock_listen("127.0.0.1", 0, 4, &a, err, sizeof err), 0, "%s", err);
	int port = sock_local_port(a);
	cr_assert_eq(sock_listen("127.0.0.1", (uint16_t)port, 4, &b, err, sizeof err), -EADDRINUSE,
		     "%s", err);
	snprintf(want, sizeof want, "cannot listen on 127.0.0.1:%d: bind: ", port);
	cr_assert(strstr(err, want) && strstr(err, strerror(EADDRINUSE)), "%s", err);
	cr_assert_eq(b, -1);
	close(a);
}

/* A row per bad input: what is called, with what, the code and the text. */
Test(sock, bad_hosts_and_ports)
{
	static const struct {
		int listen; /* sock_listen, else sock_connect_retry */
		const char *host;
		uint16_t port;
		int code;
		const char *text;
	} rows[] = {
		{ 0, "bad host!", 2222, -EINVAL, "\"bad host!\" is not a host name or IP address" },
		{ 0, "", 2222, -EINVAL, "empty host name" },
		{ 0, NULL, 2222, -EINVAL, "empty host name" },
		{ 0, "[::1", 2222, -EINVAL, "unbalanced [ ]" },
		{ 0, "127.0.0.1", 0, -EINVAL, "127.0.0.1:0: port 0 cannot be connected to" },
		{ 0, "::zz", 2222, -ENOENT, "cannot reach [::zz]:2222: cannot resolve \"::zz\"" },
		{ 0, "[::zz]", 2222, -ENOENT, "cannot reach [::zz]:2222: cannot resolve \"::zz\"" },
		{ 1, "bad/host", 2222, -EINVAL, "\"bad/host\" is not a host name or IP address" },
		{ 1, "192.0.2.1", 0, -EADDRNOTAVAIL, "cannot listen on 192.0.2.1:0: bind: " },
	};
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		char err[256] = "";
		int fd = -1, r;
		int64_t t0 = now_ms();
		if (rows[i].listen)
			r = sock_listen(rows[i].host, rows[i].port, 4, &fd, err, sizeof err);
		else
			r = sock_connect_retry(rows[i].host, rows[i].port, 5000, &fd, err,
					       sizeof err);
		int64_t dt = now_ms() - t0;
		cr_expect_eq(r, rows[i].code, "row %zu: got %d (%s)", i, r, err);
		cr_expect(strstr(err, rows[i].text), "row %zu: \"%s\" lacks \"%s\"", i, err,
			  rows[i].text);
		cr_expect_eq(fd, -1, "row %zu", i);
		/* Permanent errors are not retried for the 5 s timeout. */
		cr_expect_lt(dt, 1000, "row %zu took %lld ms", i, (long long)dt);
		cr_expect_null(strchr(err, '\n'), "row %zu: message is not one line", i);
	}
}

/* ---- connect retry ------------------------------------------------------ */

struct late {
	uint16_t port;
	int delay_ms;
	int rc;
	int accepted;
	char err[256];
};

static void *late_listener(void *arg)
{
	struct late *l = arg;
	int lfd = -1, s = -1;
	sleep_ms(l->delay_ms);
	l->rc = sock_listen("127.0.0.1", l->port, 4, &lfd, l->err, sizeof l->err);
	if (l->rc < 0)
		return NULL;
	l->rc = sock_accept(lfd, 5000, &s, NULL, 0, l->err, sizeof l->err);
	if (l->rc == 0) {
		l->rc = sock_write_full(s, "hi", 2, 2000, l->err, sizeof l->err);
		l->accepted = 1;
		close(s);
	}
	close(lfd);
	return NULL;
}

Test(sock, connect_retry_waits_for_late_listener)
{
	struct late l = { .port = free_port(), .delay_ms = 300 };
	pthread_t th;
	char err[256] = "", in[2];
	int fd = -1;
	cr_assert_eq(pthread_create(&th, NULL, late_listener, &l), 0);
	int64_t t0 = now_ms();
	int r = sock_connect_retry("127.0.0.1", l.port, 4000, &fd, err, sizeof err);
	int64_t dt = now_ms() - t0;
	cr_assert_eq(r, 0, "%s", err);
	cr_assert(dt >= 250 && dt < 4000, "connected after %lld ms", (long long)dt);
	cr_assert_eq(sock_read_full(fd, in, 2, 3000, err, sizeof err), 0, "%s", err);
	cr_assert_eq(memcmp(in, "hi", 2), 0);
	pthread_join(th, NULL);
	cr_assert_eq(l.rc, 0, "listener: %s", l.err);
	cr_assert_eq(l.accepted, 1);
	close(fd);
}

Test(sock, connect_retry_closed_port_times_out)
{
	uint16_t port = free_port();
	char err[256] = "", want[128];
	int fd = -1;
	int64_t t0 = now_ms();
	int r = sock_connect_retry("127.0.0.1", port, 600, &fd, err, sizeof err);
	int64_t dt = now_ms() - t0;
	cr_assert_eq(r, -ECONNREFUSED, "%d: %s", r, err);
	cr_assert(dt >= 590 && dt <= 600 + SLACK_MS, "gave up after %lld ms", (long long)dt);
	snprintf(want, sizeof want, "cannot reach 127.0.0.1:%u after 0.6 s: %s", port,
		 strerror(ECONNREFUSED));
	cr_assert_str_eq(err, want);
	cr_assert_eq(fd, -1);
}

/* A stop flag set while sock_connect_until waits out its backoff: it ends
 * with -EINTR within one pause (no signal here to cut the pause short),
 * not at its 30 s deadline; set before the call, it tries nothing. */
static volatile sig_atomic_t stop_flag;

static void *stop_later(void *arg)
{
	(void)arg;
	struct timespec d = { 0, 300 * 1000 * 1000 };
	nanosleep(&d, NULL);
	stop_flag = 1;
	return NULL;
}

Test(sock, connect_until_ends_when_told_to_stop)
{
	uint16_t port = free_port();
	char err[256] = "", want[128];
	int fd = -1;
	pthread_t th;
	stop_flag = 0;
	cr_assert_eq(pthread_create(&th, NULL, stop_later, NULL), 0);
	int64_t t0 = now_ms();
	int r = sock_connect_until("127.0.0.1", port, 30000, &stop_flag, &fd, err, sizeof err);
	int64_t dt = now_ms() - t0;
	pthread_join(th, NULL);
	cr_assert_eq(r, -EINTR, "%d: %s", r, err);
	cr_assert(dt >= 290 && dt <= 300 + SOCK_BACKOFF_MAX_MS + SLACK_MS, "ended after %lld ms", (long long)dt);
	snprintf(want, sizeof want, "interrupted while connecting to 127.0.0.1:%u", port);
	cr_assert_str_eq(err, want);
	cr_assert_eq(fd, -1);
	/* Already stopped: not even one attempt (a listener would be found). */
	int lfd = -1;
	cr_assert_eq(sock_listen("127.0.0.1", 0, 8, &lfd, err, sizeof err), 0, "%s", err);
	r = sock_connect_until("127.0.0.1", (uint16_t)sock_local_port(lfd), 30000, &stop_flag, &fd, err,
			       sizeof err);
	cr_assert_eq(r, -EINTR, "%d: %s", r, err);
	cr_assert_eq(fd, -1);
	close(lfd);
}

/* ---- full reads and writes ---------------------------------------------- */

#define BIG (8u << 20)

struct piecewise {
	int fd;
	uint8_t *buf;
	size_t len;
	uint32_t seed;
	int rc;
	char err[256];
};

/* Writes buf in random pieces of 1..64 KiB, now and then pausing. */
static void *write_pieces(void *arg)
{
	struct piecewise *p = arg;
	uint32_t x = p->seed;
	for (size_t off = 0; off < p->len;) {
		x = x * 1664525u + 1013904223u;
		size_t n = 1 + (x >> 8) % 65536;
		if (n > p->len - off)
			n = p->len - off;
		p->rc = sock_write_full(p->fd, p->buf + off, n, 5000, p->err, sizeof p->err);
		if (p->rc < 0)
			return NULL;
		off += n;
		if ((x & 0xff) == 0)
			sleep_ms(1);
	}
	return NULL;
}

/* Reads into buf in random pieces of 1..64 KiB, now and then pausing. */
static void *read_pieces(void *arg)
{
	struct piecewise *p = arg;
	uint32_t x = p->seed;
	for (size_t off = 0; off < p->len;) {
		x = x * 1664525u + 1013904223u;
		size_t n = 1 + (x >> 8) % 65536;
		if (n > p->len - off)
			n = p->len - off;
		p->rc = sock_read_full(p->fd, p->buf + off, n, 5000, p->err, sizeof p->err);
		if (p->rc < 0)
			return NULL;
		off += n;
		if ((x & 0xff) == 0)
			sleep_ms(1);
	}
	return NULL;
}

Test(sock, read_full_8mib_from_piecewise_writer)
{
	int c = -1, s = -1;
	tcp_pair(&c, &s);
	uint8_t *src = malloc(BIG), *dst = calloc(1, BIG);
	cr_assert(src && dst);
	fill(src, BIG, 42);
	struct piecewise p = { .fd = s, .buf = src, .len = BIG, .seed = 7 };
	pthread_t th;
	char err[256] = "";
	cr_assert_eq(pthread_create(&th, NULL, write_pieces, &p), 0);
	int r = sock_read_full(c, dst, BIG, 10000, err, sizeof err);
	pthread_join(th, NULL);
	cr_assert_eq(p.rc, 0, "writer: %s", p.err);
	cr_assert_eq(r, 0, "%s", err);
	cr_assert_eq(memcmp(src, dst, BIG), 0, "8 MiB arrived altered");
	free(src);
	free(dst);
	close(c);
	close(s);
}

Test(sock, write_full_8mib_to_piecewise_reader)
{
	int c = -1, s = -1;
	tcp_pair(&c, &s);
	uint8_t *src = malloc(BIG), *dst = calloc(1, BIG);
	cr_assert(src && dst);
	fill(src, BIG, 1234);
	struct piecewise p = { .fd = s, .buf = dst, .len = BIG, .seed = 99 };
	pthread_t th;
	char err[256] = "";
	cr_assert_eq(pthread_create(&th, NULL, read_pieces, &p), 0);
	int r = sock_write_full(c, src, BIG, 10000, err, sizeof err);
	pthread_join(th, NULL);
	cr_assert_eq(r, 0, "%s", err);
	cr_assert_eq(p.rc, 0, "reader: %s", p.err);
	cr_assert_eq(memcmp(src, dst, BIG), 0, "8 MiB arrived altered");
	free(src);
	free(dst);
	close(c);
	close(s);
}

/* sock_write_iov: parts of odd sizes, written into a reader that takes
 * pieces of random size with pauses, so that sends stop inside a part and
 * on a part's edge: the bytes arrive whole and in order. */
Test(sock, write_iov_8mib_to_piecewise_reader)
{
	int c = -1, s = -1;
	tcp_pair(&c, &s);
	uint8_t *src = malloc(BIG), *dst = calloc(1, BIG);
	cr_assert(src && dst);
	fill(src, BIG, 555);
	struct piecewise p = { .fd = s, .buf = dst, .len = BIG, .seed = 3 };
	pthread_t th;
	char err[256] = "";
	cr_assert_eq(pthread_create(&th, NULL, read_pieces, &p), 0);
	const size_t cut[] = { 36, 36 + 5 * 1048576 + 3, BIG - 16 };
	struct iovec v[4] = { { src, cut[0] },
			      { src + cut[0], cut[1] - cut[0] },
			      { src + cut[1], cut[2] - cut[1] },
			      { src + cut[2], BIG - cut[2] } };
	int r = sock_write_iov(c, v, 4, 10000, err, sizeof err);
	pthread_join(th, NULL);
	cr_assert_eq(r, 0, "%s", err);
	cr_assert_eq(p.rc, 0, "reader: %s", p.err);
	cr_assert_eq(memcmp(src, dst, BIG), 0, "8 MiB arrived altered");
	cr_assert_eq(sock_write_iov(c, v, SOCK_IOV_MAX + 1, 1000, err, sizeof err), -EINVAL);
	free(src);
	free(dst);
	close(c);
	close(s);
}

Test(sock, eof_mid_read)
{
	int sv[2];
	unix_pair(sv);
	char err[256] = "";
	uint8_t buf[100];
	cr_assert_eq(sock_write_full(sv[1], "0123456789", 10, 1000, err, sizeof err), 0, "%s", err);
	close(sv[1]);
	int r = sock_read_full(sv[0], buf, sizeof buf, 2000, err, sizeof err);
	cr_assert_eq(r, -EPIPE, "%d: %s", r, err);
	cr_assert_str_eq(err, "peer closed the connection after 10 of 100 bytes");
	cr_assert_eq(memcmp(buf, "0123456789", 10), 0);
	close(sv[0]);
}

Test(sock, stalled_reader_times_out)
{
	int sv[2];
	unix_pair(sv);
	char err[256] = "";
	uint8_t buf[100];
	cr_assert_eq(sock_write_full(sv[1], "abcde", 5, 1000, err, sizeof err), 0, "%s", err);
	int64_t t0 = now_ms();
	int r = sock_read_full(sv[0], buf, sizeof buf, 300, err, sizeof err);
	int64_t dt = now_ms() - t0;
	cr_assert_eq(r, -ETIMEDOUT, "%d: %s", r, err);
	cr_assert(dt >= 290 && dt <= 300 + SLACK_MS, "timed out after %lld ms", (long long)dt);
	cr_assert_str_eq(err, "read timed out after 300 ms with 5 of 100 bytes");
	close(sv[0]);
	close(sv[1]);
}

struct trickle {
	int fd;
	int sent;
};

/* One byte every 50 ms for up to 3 s, until the other end goes away. */
static void *trickle_writer(void *arg)
{
	struct trickle *t = arg;
	char err[128];
	for (int i = 0; i < 60; i++) {
		if (sock_write_full(t->fd, "x", 1, 1000, err, sizeof err) < 0)
			break;
		t->sent++;
		sleep_ms(50);
	}
	return NULL;
}

/* A peer that sends a byte well within any per-chunk timeout still cannot
 * hold the reader past the one deadline of the call. */
Test(sock, trickling_peer_bounded_by_one_deadline)
{
	int sv[2];
	unix_pair(sv);
	struct trickle t = { .fd = sv[1] };
	pthread_t th;
	char err[256] = "";
	uint8_t buf[100];
	cr_assert_eq(pthread_create(&th, NULL, trickle_writer, &t), 0);
	int64_t t0 = now_ms();
	int r = sock_read_full(sv[0], buf, sizeof buf, 400, err, sizeof err);
	int64_t dt = now_ms() - t0;
	shutdown(sv[0], SHUT_RDWR);
	pthread_join(th, NULL);
	cr_assert_eq(r, -ETIMEDOUT, "%d: %s", r, err);
	cr_assert(dt >= 390 && dt <= 400 + SLACK_MS, "timed out after %lld ms", (long long)dt);
	cr_assert(strstr(err, "read timed out after 400 ms with "), "%s", err);
	close(sv[0]);
	close(sv[1]);
}

Test(sock, stalled_writer_times_out)
{
	int sv[2];
	unix_pair(sv);
	size_t len = 16u << 20; /* far more than a socket buffer holds */
	uint8_t *buf = calloc(1, len);
	cr_assert(buf);
	char err[256] = "";
	int64_t t0 = now_ms();
	int r = sock_write_full(sv[0], buf, len, 300, err, sizeof err);
	int64_t dt = now_ms() - t0;
	cr_assert_eq(r, -ETIMEDOUT, "%d: %s", r, err);
	cr_assert(dt >= 290 && dt <= 300 + SLACK_MS, "timed out after %lld ms", (long long)dt);
	cr_assert(strstr(err, "write timed out after 300 ms with "), "%s", err);
	free(buf);
	close(sv[0]);
	close(sv[1]);
}

/* The default SIGPIPE disposition kills the process; writing to a closed
 * peer must be an error code instead. */
Test(sock, no_sigpipe_on_closed_peer)
{
	cr_assert_neq(signal(SIGPIPE, SIG_DFL), SIG_ERR);
	char err[256] = "";
	int sv[2];
	unix_pair(sv);
	close(sv[1]);
	int r = sock_write_full(sv[0], "data", 4, 1000, err, sizeof err);
	cr_assert_eq(r, -EPIPE, "%d: %s", r, err);
	cr_assert(strstr(err, "peer closed the connection"), "%s", err);
	close(sv[0]);

	/* TCP: the first write after the peer's close draws a RST, a later
	 * one fails with EPIPE or ECONNRESET. */
	int c = -1, s = -1;
	tcp_pair(&c, &s);
	close(s);
	r = 0;
	for (int i = 0; i < 100 && r == 0; i++) {
		r = sock_write_full(c, "data", 4, 1000, err, sizeof err);
		if (r == 0)
			sleep_ms(10);
	}
	cr_assert(r == -EPIPE || r == -ECONNRESET, "%d: %s", r, err);
	close(c);
}

/* ---- frames over a socket ----------------------------------------------- */

Test(sock, frames_round_trip_and_rejections)
{
	cr_assert(sodium_init() >= 0);
	static const uint8_t key[FRAME_KEY_BYTES] = { 1, 2, 3, 4, 5 };
	struct frame_key tx, rx;
	cr_assert_eq(frame_key_init(&tx, key, FRAME_CHACHA20POLY1305), 0);
	cr_assert_eq(frame_key_init(&rx, key, FRAME_CHACHA20POLY1305), 0);
	int sv[2];
	unix_pair(sv);
	char err[256] = "";
	size_t cap = FRAME_BYTES_MAX, n = 0;
	uint8_t *wbuf = malloc(cap), *rbuf = malloc(cap), msg[1000];
	cr_assert(wbuf && rbuf);
	fill(msg, sizeof msg, 5);

	/* Round trip, twice (the counters advance together). */
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(sock_write_frame(SOCK_FD(sv[0]), &tx, wbuf, cap, msg, sizeof msg, 1000, err,
					      sizeof err), 0, "%s", err);
		cr_assert_eq(sock_read_frame(SOCK_FD(sv[1]), &rx, rbuf, cap, &n, 1000, err, sizeof err), 0,
			     "%s", err);
		cr_assert_eq(n, sizeof msg);
		cr_assert_eq(memcmp(rbuf, msg, n), 0);
	}
	cr_assert_eq(rx.counter, 2);

	/* A flipped bit in the body: -EBADMSG, counter unchanged. */
	size_t flen = 0;
	cr_assert_eq(frame_seal(&tx, wbuf, cap, msg, sizeof msg, &flen, err, sizeof err), 0);
	wbuf[FRAME_HDR_BYTES + 10] ^= 1;
	cr_assert_eq(sock_write_full(sv[0], wbuf, flen, 1000, err, sizeof err), 0, "%s", err);
	cr_assert_eq(sock_read_frame(SOCK_FD(sv[1]), &rx, rbuf, cap, &n, 1000, err, sizeof err), -EBADMSG);
	cr_assert_eq(rx.counter, 2);

	/* A frame larger than the caller's buffer: -ENOBUFS after the header. */
	cr_assert_eq(frame_seal(&tx, wbuf, cap, msg, sizeof msg, &flen, err, sizeof err), 0);
	cr_assert_eq(sock_write_full(sv[0], wbuf, flen, 1000, err, sizeof err), 0, "%s", err);
	cr_assert_eq(sock_read_frame(SOCK_FD(sv[1]), &rx, rbuf, 100, &n, 1000, err, sizeof err), -ENOBUFS);
	close(sv[0]);
	close(sv[1]);

	/* An oversized length is refused from the header alone: nothing more
	 * is waited for (the deadline is 5 s, the answer immediate). */
	unix_pair(sv);
	uint8_t hdr[FRAME_HDR_BYTES];
	wire_put_u32(hdr, 0xffffffffu);
	cr_assert_eq(sock_write_full(sv[0], hdr, sizeof hdr, 1000, err, sizeof err), 0, "%s", err);
	int64_t t0 = now_ms();
	cr_assert_eq(sock_read_frame(SOCK_FD(sv[1]), &rx, rbuf, cap, &n, 5000, err, sizeof err), -EMSGSIZE);
	cr_assert_lt(now_ms() - t0, 1000);

	/* A truncated frame: the peer closes half way, -EPIPE. */
	cr_assert_eq(frame_seal(&tx, wbuf, cap, msg, sizeof msg, &flen, err, sizeof err), 0);
	cr_assert_eq(sock_write_full(sv[0], wbuf, flen / 2, 1000, err, sizeof err), 0, "%s", err);
	close(sv[0]);
	cr_assert_eq(sock_read_frame(SOCK_FD(sv[1]), &rx, rbuf, cap, &n, 1000, err, sizeof err), -EPIPE);
	close(sv[1]);
	frame_key_wipe(&tx);
	frame_key_wipe(&rx);
	free(wbuf);
	free(rbuf);
}

/* ---- Unix sockets for a ps on the worker's host ------------------------- */

/* A fresh directory for a test's sockets: "/tmp/pstrain-sock-XXXXXX". */
static void unix_tmpdir(char *dir, size_t len)
{
	snprintf(dir, len, "/tmp/pstrain-sock-XXXXXX");
	cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
}

/* The directory holds sockets whose frames are not encrypted, so it must
 * be this user's alone: made 700 when missing; a directory others may
 * enter, one of another user, a link or a file are refused. */
Test(sock, unix_dir_must_be_ours_alone)
{
	char base[64], dir[128], err[256] = "";
	struct stat st;
	unix_tmpdir(base, sizeof base);
	snprintf(dir, sizeof dir, "%s/made", base);
	cr_assert_eq(privdir_make(dir, err, sizeof err), 0, "%s", err);
	cr_assert_eq(stat(dir, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0700, "mode %o", st.st_mode & 0777);
	cr_assert_eq(privdir_make(dir, err, sizeof err), 0, "again: %s", err);

	cr_assert_eq(chmod(dir, 0755), 0);
	cr_assert_eq(privdir_make(dir, err, sizeof err), -EPERM);
	cr_assert(strstr(err, "may be entered by others (mode 755, want 700)"), "%s", err);
	cr_assert_eq(chmod(dir, 0700), 0);

	char link[160];
	snprintf(link, sizeof link, "%s/link", base);
	cr_assert_eq(symlink(dir, link), 0);
	cr_assert_eq(privdir_make(link, err, sizeof err), -ENOTDIR, "%s", err);
	cr_assert(strstr(err, "is not a directory"), "%s", err);

	if (geteuid() == 0) {
		cr_assert_eq(chown(dir, 1234, 1234), 0);
		cr_assert_eq(privdir_make(dir, err, sizeof err), -EPERM);
		cr_assert(strstr(err, "belongs to uid 1234"), "%s", err);
	}
	unlink(link);
	rmdir(dir);
	rmdir(base);
}

/* The directory's parents count too: one that others may write (not
 * sticky) lets them move the checked directory away and put theirs in its
 * place between the check and a bind or connect by its name; so does a
 * link on the way that they could repoint, and the parents of what a link
 * leads to. A sticky parent (like /tmp) and links of our own are fine. */
Test(sock, unix_dir_parents_must_be_ours_or_roots_and_closed)
{
	char base[64], open_[128], dir[192], err[400] = "";
	unix_tmpdir(base, sizeof base);
	snprintf(open_, sizeof open_, "%s/open", base);
	cr_assert_eq(mkdir(open_, 0700), 0);
	cr_assert_eq(chmod(open_, 0777), 0);
	snprintf(dir, sizeof dir, "%s/sockets", open_);
	cr_assert_eq(privdir_make(dir, err, sizeof err), -EPERM, "%s", err);
	cr_assert(strstr(err, "/open, a parent of ") && strstr(err, "may be written by others (mode 777, not sticky"),
		  "%s", err);
	cr_assert_neq(access(dir, F_OK), 0, "made in a parent it refused");
	/* the same one, two levels down, and through a relative name */
	char deep[256];
	snprintf(deep, sizeof deep, "%s/a", open_);
	cr_assert_eq(mkdir(deep, 0700), 0);
	snprintf(deep, sizeof deep, "%s/a/sockets", open_);
	cr_assert_eq(privdir_make(deep, err, sizeof err), -EPERM, "%s", err);
	char cwd[512];
	cr_assert_not_null(getcwd(cwd, sizeof cwd));
	cr_assert_eq(chdir(open_), 0);
	cr_assert_eq(privdir_make("a/sockets", err, sizeof err), -EPERM, "relative: %s", err);
	cr_assert_eq(chdir(cwd), 0);

	/* sticky: others may add names but not move ours */
	cr_assert_eq(chmod(open_, 01777), 0);
	cr_assert_eq(privdir_make(dir, err, sizeof err), 0, "sticky parent: %s", err);
	cr_assert_eq(chmod(open_, 0755), 0);
	cr_assert_eq(privdir_make(dir, err, sizeof err), 0, "%s", err);

	/* a link of ours on the way is followed, and what it leads to checked */
	char link[128], via[192];
	snprintf(link, sizeof link, "%s/link", base);
	cr_assert_eq(symlink("open", link), 0);
	snprintf(via, sizeof via, "%s/sockets", link);
	cr_assert_eq(privdir_make(via, err, sizeof err), 0, "through a link: %s", err);
	cr_assert_eq(chmod(open_, 0777), 0);
	cr_assert_eq(privdir_make(via, err, sizeof err), -EPERM, "%s", err);
	cr_assert(strstr(err, "/open, a parent of ") && strstr(err, "mode 777"), "%s", err);
	if (geteuid() == 0) {
		cr_assert_eq(chmod(open_, 0755), 0);
		cr_assert_eq(lchown(link, 1234, 1234), 0);
		cr_assert_eq(privdir_make(via, err, sizeof err), -EPERM, "%s", err);
		cr_assert(strstr(err, "/link, a link on the way to ") && strstr(err, "belongs to uid 1234"), "%s", err);
		cr_assert_eq(chown(open_, 1234, 1234), 0);
		cr_assert_eq(privdir_make(dir, err, sizeof err), -EPERM, "%s", err);
		cr_assert(strstr(err, "/open, a parent of ") && strstr(err, "belongs to uid 1234"), "%s", err);
	}
	/* the default's parents: / and /tmp (root's, /tmp sticky) */
	char dflt[96];
	snprintf(dflt, sizeof dflt, "%s/dflt", base);
	cr_assert_eq(privdir_make(dflt, err, sizeof err), 0, "%s", err);
	rmdir(dflt);
	unlink(link);
	rmdir(dir);
	snprintf(deep, sizeof deep, "%s/a", open_);
	rmdir(deep);
	rmdir(open_);
	rmdir(base);
}

/* "L/" and "L/." name the directory a link L points to, so lstat follows
 * L there: a link of another user's to a 700 directory of ours passed the
 * check, and they could repoint it at their own directory before we bound
 * or connected (a worker then greeted their socket saying local = 1). The
 * name is checked as a socket path in it resolves it. */
Test(sock, unix_dir_is_a_link_whatever_its_trailing_slashes)
{
	char base[64], dir[128], link[160], name[200], err[256] = "";
	unix_tmpdir(base, sizeof base);
	snprintf(dir, sizeof dir, "%s/ours", base);
	cr_assert_eq(mkdir(dir, 0700), 0);
	snprintf(link, sizeof link, "%s/link", base);
	cr_assert_eq(symlink(dir, link), 0);
	const char *slashes[] = { "/", "//" };
	for (size_t i = 0; i < sizeof slashes / sizeof slashes[0]; i++) {
		snprintf(name, sizeof name, "%s%s", link, slashes[i]);
		cr_assert_eq(privdir_make(name, err, sizeof err), -ENOTDIR, "%s: %s", name, err);
		cr_assert(strstr(err, "is not a directory"), "%s", err);
	}
	const char *dots[] = { "/.", "/./", "/.." };
	for (size_t i = 0; i < sizeof dots / sizeof dots[0]; i++) {
		snprintf(name, sizeof name, "%s%s", link, dots[i]);
		cr_assert_eq(privdir_make(name, err, sizeof err), -EINVAL, "%s: %s", name, err);
		cr_assert(strstr(err, "name the directory itself, not . or .."), "%s", err);
	}
	snprintf(name, sizeof name, "%s/", dir);
	cr_assert_eq(privdir_make(name, err, sizeof err), 0, "a real one with a slash: %s", err);
	unlink(link);
	rmdir(dir);
	rmdir(base);
}

/* Frames go unencrypted only to a peer of our own user (SO_PEERCRED),
 * whatever the directory turned out to be: a socket of another user's in
 * the path, or another user's process connecting to ours, gets sealed
 * frames. Another uid needs root to be tried; the rest runs as anyone. */
Test(sock, unix_same_user_is_the_peers_uid)
{
	int sv[2], c = -1, s = -1;
	unix_pair(sv);
	cr_assert_eq(sock_is_unix_same_user(sv[0]), 1);
	close(sv[0]);
	close(sv[1]);
	tcp_pair(&c, &s);
	cr_assert_eq(sock_is_unix_same_user(c), 0, "TCP");
	close(c);
	close(s);
	if (geteuid() != 0)
		cr_skip_test("another uid to connect needs root");

	char dir[64], path[128], err[256] = "";
	int ufd = -1;
	unix_tmpdir(dir, sizeof dir);
	cr_assert_eq(chmod(dir, 0777), 0);
	snprintf(path, sizeof path, "%s/ps.sock", dir);
	cr_assert_eq(sock_listen_unix(path, &ufd, NULL, err, sizeof err), 0, "%s", err);
	cr_assert_eq(chmod(path, 0777), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) { /* nobody: connects, and must not take root's listener for its own */
		if (setgid(65534) || setuid(65534) ||
		    sock_connect_local_until(path, "127.0.0.1", 1, 2000, NULL, &c, err, sizeof err))
			_exit(2);
		char b;
		int same = sock_is_unix(c) ? sock_is_unix_same_user(c) : 3;
		(void)!read(c, &b, 1); /* until the parent has looked */
		_exit(same);
	}
	cr_assert_eq(sock_accept(ufd, 5000, &s, NULL, 0, err, sizeof err), 0, "%s", err);
	cr_assert_eq(sock_is_unix(s), 1);
	cr_assert_eq(sock_is_unix_same_user(s), 0, "a peer of uid 65534 taken for root's own");
	close(s);
	int st = 0;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child saw %d (0: sealed, 1: its own user's, 2: no connection)",
		  WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	close(ufd);
	unlink(path);
	rmdir(dir);
}

Test(sock, unix_path_names_the_ps_and_fits)
{
	char path[256], err[256] = "", dir[200];
	cr_assert_eq(sock_unix_path(path, sizeof path, "/tmp/d", "10.0.0.7", 2222, err, sizeof err), 0);
	cr_assert_str_eq(path, "/tmp/d/ps-10.0.0.7:2222.sock");
	cr_assert_eq(sock_unix_path(path, sizeof path, "/tmp/d", "::1", 2222, err, sizeof err), 0);
	cr_assert_str_eq(path, "/tmp/d/ps-[::1]:2222.sock");
	memset(dir, 'd', sizeof dir - 1);
	dir[0] = '/';
	dir[sizeof dir - 1] = 0;
	cr_assert_eq(sock_unix_path(path, sizeof path, dir, "h", 1, err, sizeof err), -ENAMETOOLONG);
	cr_assert(strstr(err, "longer than 107 bytes"), "%s", err);
}

/* A ps's two ends as a worker finds them: a TCP listener on 127.0.0.1
 * (*lfd; its port returned) and the path of a Unix socket in a fresh
 * private directory (dir, 64 bytes; path, 128), nothing listening there. */
static uint16_t ps_paths(char *dir, char *path, int *lfd)
{
	char err[256] = "";
	unix_tmpdir(dir, 64);
	snprintf(path, 128, "%s/ps.sock", dir);
	cr_assert_eq(sock_listen("127.0.0.1", 0, 8, lfd, err, sizeof err), 0, "%s", err);
	return (uint16_t)sock_local_port(*lfd);
}

/* A worker tries the ps's Unix socket first and takes TCP where nobody
 * listens there; a ps replaces a socket file left by a dead one but not a
 * live one's, nor a file that is not a socket. */
Test(sock, connect_local_prefers_the_unix_socket)
{
	char dir[64], path[128], err[256] = "", peer[SOCK_ADDR_STRLEN];
	int lfd = -1, ufd = -1, c = -1, s = -1;
	uint16_t port = ps_paths(dir, path, &lfd);

	cr_assert_eq(sock_connect_local_until(path, "127.0.0.1", port, 2000, NULL, &c, err, sizeof err),
		     0, "%s", err);
	cr_assert_eq(sock_is_unix(c), 0, "no socket file yet: TCP");
	close(c);
	cr_assert_eq(sock_accept(lfd, 2000, &s, peer, sizeof peer, err, sizeof err), 0, "%s", err);
	close(s);

	cr_assert_eq(sock_listen_unix(path, &ufd, NULL, err, sizeof err), 0, "%s", err);
	cr_assert(fcntl(ufd, F_GETFD) & FD_CLOEXEC);
	cr_assert(fcntl(ufd, F_GETFL) & O_NONBLOCK);
	int again = -1;
	cr_assert_eq(sock_listen_unix(path, &again, NULL, err, sizeof err), -EADDRINUSE, "%s", err);
	cr_assert(strstr(err, "another process listens there"), "%s", err);
	/* the probe that found it live left a connection to accept: drop it */
	if (sock_accept(ufd, 1000, &s, peer, sizeof peer, err, sizeof err) == 0)
		close(s);

	cr_assert_eq(sock_connect_local_until(path, "127.0.0.1", port, 2000, NULL, &c, err, sizeof err),
		     0, "%s", err);
	cr_assert_eq(sock_is_unix(c), 1, "the Unix socket when it listens");
	cr_assert_eq(sock_accept(ufd, 2000, &s, peer, sizeof peer, err, sizeof err), 0, "%s", err);
	cr_assert_str_eq(peer, "this host (Unix socket)");
	cr_assert_eq(sock_is_unix(s), 1);
	uint8_t in[5] = { 0 };
	cr_assert_eq(sock_write_full(c, "hello", 5, 1000, err, sizeof err), 0, "%s", err);
	cr_assert_eq(sock_read_full(s, in, 5, 1000, err, sizeof err), 0, "%s", err);
	cr_assert_eq(memcmp(in, "hello", 5), 0);
	close(c);
	close(s);

	close(ufd); /* the file stays, as after a crash */
	cr_assert_eq(sock_listen_unix(path, &ufd, NULL, err, sizeof err), 0, "stale: %s", err);
	close(ufd);
	unlink(path);
	FILE *f = fopen(path, "w");
	cr_assert(f);
	fclose(f);
	cr_assert_eq(sock_listen_unix(path, &ufd, NULL, err, sizeof err), -EEXIST);
	cr_assert(strstr(err, "exists and is not a socket"), "%s", err);
	unlink(path);
	rmdir(dir);
	close(lfd);
}

/* The race the ps's order (Unix socket, then TCP) leaves: a worker whose
 * Unix try came just before the ps listened there and whose TCP try just
 * after holds TCP; it swaps it for the Unix socket, which now answers, and
 * keeps TCP where nothing listens there. */
Test(sock, prefer_unix_swaps_a_tcp_connection_made_too_early)
{
	char dir[64], path[128], err[256] = "", peer[SOCK_ADDR_STRLEN];
	int lfd = -1, ufd = -1, c = -1, s = -1;
	uint16_t port = ps_paths(dir, path, &lfd);
	cr_assert_eq(sock_connect_retry("127.0.0.1", port, 2000, &c, err, sizeof err), 0, "%s", err);
	cr_assert_eq(sock_prefer_unix(path, &c), 0, "nothing listens at %s", path);
	cr_assert_eq(sock_prefer_unix(NULL, &c), 0);
	cr_assert_eq(sock_is_unix(c), 0);
	cr_assert_eq(sock_listen_unix(path, &ufd, NULL, err, sizeof err), 0, "%s", err);
	int tcp = c;
	cr_assert_eq(sock_prefer_unix(path, &c), 1);
	cr_assert_eq(sock_is_unix(c), 1, "the Unix socket once it listens");
	cr_assert(fcntl(tcp, F_GETFD) < 0, "the TCP connection was left open");
	cr_assert_eq(sock_accept(ufd, 2000, &s, peer, sizeof peer, err, sizeof err), 0, "%s", err);
	cr_assert_str_eq(peer, "this host (Unix socket)");
	close(s);
	close(c);
	close(ufd);
	close(lfd);
	unlink(path);
	rmdir(dir);
}

/* A live listener whose backlog is full refuses a non-blocking connect
 * with EAGAIN, not ECONNREFUSED: it is not a stale socket, and a second ps
 * that took its path over (then removed it on its own exit, its TCP port
 * being taken) left the first one's workers no Unix socket at all. */
Test(sock, listen_unix_keeps_a_live_socket_with_a_full_backlog)
{
	char dir[64], path[100], err[256] = "";
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	struct stat before, after;
	int fill[8], nfill = 0, l = -1, fd = -1;
	unix_tmpdir(dir, sizeof dir);
	snprintf(path, sizeof path, "%s/ps.sock", dir);
	snprintf(sun.sun_path, sizeof sun.sun_path, "%s", path);
	l = socket(AF_UNIX, SOCK_STREAM, 0);
	cr_assert_geq(l, 0);
	cr_assert_eq(bind(l, (struct sockaddr *)&sun, sizeof sun), 0);
	cr_assert_eq(listen(l, 0), 0);
	cr_assert_eq(stat(path, &before), 0);
	for (int r = 0; r == 0 && nfill < 8; nfill++) { /* until the backlog refuses one */
		fill[nfill] = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
		r = connect(fill[nfill], (struct sockaddr *)&sun, sizeof sun);
		cr_assert(r == 0 || errno == EAGAIN, "connect: %s", strerror(errno));
	}
	cr_assert_eq(sock_listen_unix(path, &fd, NULL, err, sizeof err), -EADDRINUSE, "%s", err);
	cr_assert(strstr(err, "another process listens there"), "%s", err);
	cr_assert_eq(stat(path, &after), 0);
	cr_assert_eq(after.st_ino, before.st_ino, "the live socket was replaced");
	while (nfill > 0)
		close(fill[--nfill]);
	close(l);
	unlink(path);
	rmdir(dir);
}

/* sock_unlink_unix removes the socket file sock_listen_unix made, and
 * nothing that took its path since: a second listener bound there after
 * ours was removed (a second ps), a plain file. */
Test(sock, unlink_unix_removes_only_the_file_it_bound)
{
	char dir[64], path[100], err[256] = "";
	struct sock_unix_file mine, theirs;
	struct stat st;
	int fd = -1, other = -1, c = -1;
	unix_tmpdir(dir, sizeof dir);
	snprintf(path, sizeof path, "%s/ps.sock", dir);

	cr_assert_eq(sock_listen_unix(path, &fd, &mine, err, sizeof err), 0, "%s", err);
	cr_assert_eq(lstat(path, &st), 0);
	cr_assert(st.st_dev == mine.dev && st.st_ino == mine.ino);
	cr_assert_eq(sock_unlink_unix(path, &mine), 0);
	cr_assert_eq(lstat(path, &st), -1, "still there");
	cr_assert_eq(sock_unlink_unix(path, &mine), -ENOENT);
	close(fd);

	/* Ours removed by someone, a second listener's in its place. */
	cr_assert_eq(sock_listen_unix(path, &fd, &mine, err, sizeof err), 0, "%s", err);
	cr_assert_eq(unlink(path), 0);
	cr_assert_eq(sock_listen_unix(path, &other, &theirs, err, sizeof err), 0, "%s", err);
	cr_assert_eq(sock_unlink_unix(path, &mine), -ESTALE);
	cr_assert_eq(sock_connect_local_until(path, "127.0.0.1", 1, 1000, NULL, &c, err, sizeof err), 0,
		     "the second listener's socket is gone: %s", err);
	cr_assert_eq(sock_is_unix(c), 1);
	close(c);
	close(fd);

	/* A plain file in its place. */
	cr_assert_eq(unlink(path), 0);
	FILE *f = fopen(path, "w");
	cr_assert(f);
	fclose(f);
	cr_assert_eq(sock_unlink_unix(path, &theirs), -ESTALE);
	cr_assert_eq(lstat(path, &st), 0);
	cr_assert(S_ISREG(st.st_mode));
	close(other);
	unlink(path);
	rmdir(dir);
}

/* A ps tells a live worker's Unix connection from a dead one's by whether
 * the peer still holds it open (a Unix socket keeps no receive clock). */
Test(sock, quiet_on_a_unix_socket_is_whether_the_peer_hung_up)
{
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	cr_assert_eq(sock_is_unix(sv[0]), 1);
	cr_assert_eq(sock_quiet_ms(sv[0]), 0);
	close(sv[1]);
	cr_assert_eq(sock_quiet_ms(sv[0]), -ENOTCONN);
	close(sv[0]);
}
