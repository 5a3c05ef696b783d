/* Tests of net/ring.c: a stream of several MiB in parts of odd sizes
 * arrives byte for byte both ways at once, across the rings' wrap; a
 * reader gets what was written before its peer closed, then -EPIPE; a
 * writer blocked on a full ring ends when the peer goes, or when its own
 * connection is shut down from another thread, and so does a reader; a
 * read with nothing to read times out; counters a peer corrupted end the
 * connection with -EPROTO, never a read out of bounds, and a peer that
 * writes at random all over the shared pages meanwhile cannot crash us
 * (ASan's build) or hold a call past its deadline; and a ps answers
 * "no" to an offer whose memory is not a sealed memfd of the right size,
 * whose eventfds are not eventfds or whose size is not a power of two,
 * and refuses one that is not an offer at all. Sockets are AF_UNIX
 * socketpairs; every blocking call has a deadline. */
#include <criterion/criterion.h>

#include "leak.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../net/ring.h"
#include "../net/sock.h"

#define IO_MS 10000

TestSuite(ring, .fini = leak_check, .timeout = 60);

/* ---- helpers ------------------------------------------------------------ */

struct acceptor {
	struct ring r;
	int fd, rc;
	char err[256];
};

static void *accept_main(void *arg)
{
	struct acceptor *a = arg;
	a->rc = ring_accept(&a->r, a->fd, IO_MS, a->err, sizeof a->err);
	return NULL;
}

/* A ring of cap bytes a direction between the two ends of a socketpair:
 * c the client's end (sv[0]), s the server's. */
static void ring_pair(struct ring *c, struct ring *s, int sv[2], size_t cap)
{
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	struct acceptor a = { .fd = sv[1] };
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, accept_main, &a), 0);
	char err[256] = "";
	int rc = ring_offer(c, sv[0], cap, IO_MS, err, sizeof err);
	pthread_join(t, NULL);
	cr_assert_eq(rc, 0, "offer: %d %s", rc, err);
	cr_assert_eq(a.rc, 0, "accept: %d %s", a.rc, a.err);
	*s = a.r;
	s->fd = sv[1];
}

static void pair_free(struct ring *c, struct ring *s, int sv[2])
{
	ring_free(c);
	ring_free(s);
	close(sv[0]);
	close(sv[1]);
}

static uint8_t byte_at(uint64_t i, uint32_t seed)
{
	uint64_t x = (i + seed) * 0x9E3779B97F4A7C15ull;
	return (uint8_t)(x >> 56);
}

/* Writes (or reads and checks) total bytes of the seed's pattern in parts
 * of sizes that change every call: 1 byte to 100 KiB, 1 to 3 iov parts. */
struct streamer {
	struct ring *r;
	size_t total;
	uint32_t seed;
	int write, rc;
	size_t bad_at; /* the first byte that differed, or SIZE_MAX */
	char err[256];
};

static void *stream_main(void *arg)
{
	struct streamer *s = arg;
	uint8_t *buf = malloc(3 * 100000);
	cr_assert_not_null(buf);
	uint32_t rnd = s->seed * 2654435761u + 1;
	s->bad_at = SIZE_MAX;
	for (size_t done = 0; done < s->total && !s->rc;) {
		struct iovec v[3];
		int n = 1 + (int)(rnd % 3);
		size_t len = 0;
		for (int i = 0; i < n; i++) {
			rnd = rnd * 1103515245u + 12345u;
			size_t k = 1 + (rnd >> 8) % 100000;
			if (k > s->total - done - len)
				k = s->total - done - len;
			v[i] = (struct iovec){ buf + len, k };
			len += k;
		}
		if (s->write) {
			for (size_t i = 0; i < len; i++)
				buf[i] = byte_at(done + i, s->seed);
			s->rc = ring_write_iov(s->r, v, n, IO_MS, s->err, sizeof s->err);
		} else {
			memset(buf, 0, len);
			s->rc = ring_read_iov(s->r, v, n, IO_MS, s->err, sizeof s->err);
			for (size_t i = 0; i < len && s->bad_at == SIZE_MAX && !s->rc; i++)
				if (buf[i] != byte_at(done + i, s->seed))
					s->bad_at = done + i;
		}
		done += len;
	}
	free(buf);
	return NULL;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- streams ------------------------------------------------------------ */

/* 24 MiB each way at once through rings of 64 KiB (the smallest: every
 * part wraps, writers and readers wait on each other all the time) and of
 * the default size. */
Test(ring, streams_arrive_byte_for_byte_both_ways)
{
	size_t caps[] = { RING_BYTES_MIN, 0 };
	for (int c = 0; c < 2; c++) {
		struct ring cl, sv;
		int fds[2];
		ring_pair(&cl, &sv, fds, caps[c]);
		struct streamer st[4] = {
			{ .r = &cl, .total = 24u << 20, .seed = 1, .write = 1 },
			{ .r = &sv, .total = 24u << 20, .seed = 1, .write = 0 },
			{ .r = &sv, .total = 24u << 20, .seed = 2, .write = 1 },
			{ .r = &cl, .total = 24u << 20, .seed = 2, .write = 0 },
		};
		pthread_t t[4];
		for (int i = 0; i < 4; i++)
			cr_assert_eq(pthread_create(&t[i], NULL, stream_main, &st[i]), 0);
		for (int i = 0; i < 4; i++)
			pthread_join(t[i], NULL);
		for (int i = 0; i < 4; i++)
			cr_assert_eq(st[i].rc, 0, "ring %zu, streamer %d: %s", caps[c], i, st[i].err);
		cr_assert_eq(st[1].bad_at, SIZE_MAX, "client to server: byte %zu differs", st[1].bad_at);
		cr_assert_eq(st[3].bad_at, SIZE_MAX, "server to client: byte %zu differs", st[3].bad_at);
		pair_free(&cl, &sv, fds);
	}
}

/* What was written before the peer closed is read; then -EPIPE. */
Test(ring, a_reader_gets_what_was_written_then_the_close)
{
	struct ring cl, sv;
	int fds[2];
	ring_pair(&cl, &sv, fds, 0);
	uint8_t out[1000], in[1000];
	for (int i = 0; i < 1000; i++)
		out[i] = (uint8_t)(i * 7);
	char err[256] = "";
	struct iovec v = { out, sizeof out };
	cr_assert_eq(ring_write_iov(&cl, &v, 1, IO_MS, err, sizeof err), 0, "%s", err);
	ring_free(&cl);
	close(fds[0]);
	v = (struct iovec){ in, sizeof in };
	cr_assert_eq(ring_read_iov(&sv, &v, 1, IO_MS, err, sizeof err), 0, "%s", err);
	cr_assert(memcmp(in, out, sizeof in) == 0);
	v.iov_len = 1;
	cr_assert_eq(ring_read_iov(&sv, &v, 1, IO_MS, err, sizeof err), -EPIPE);
	cr_assert_not_null(strstr(err, "peer closed the connection after 0 of 1 bytes"), "%s", err);
	ring_free(&sv);
	close(fds[1]);
}

struct blocked {
	struct ring *r;
	int write, rc;
	double took;
	char err[256];
};

static void *blocked_main(void *arg)
{
	struct blocked *b = arg;
	size_t len = 4 * RING_BYTES_MIN;
	uint8_t *buf = calloc(1, len);
	struct iovec v = { buf, len };
	double t0 = now_s();
	b->rc = b->write ? ring_write_iov(b->r, &v, 1, IO_MS, b->err, sizeof b->err) :
			   ring_read_iov(b->r, &v, 1, IO_MS, b->err, sizeof b->err);
	b->took = now_s() - t0;
	free(buf);
	return NULL;
}

/* A writer with more than its ring holds, and a reader with nothing to
 * read, are blocked: each ends with -EPIPE at once when its connection is
 * shut down from another thread (conn_shutdown's ring_shutdown and
 * shutdown), and a blocked writer also when the peer goes. */
Test(ring, blocked_ends_end_at_a_shutdown_or_when_the_peer_goes)
{
	for (int how = 0; how < 3; how++) {
		struct ring cl, sv;
		int fds[2];
		ring_pair(&cl, &sv, fds, RING_BYTES_MIN);
		struct blocked b = { .r = &cl, .write = how != 1 };
		pthread_t t;
		cr_assert_eq(pthread_create(&t, NULL, blocked_main, &b), 0);
		usleep(200000);
		if (how == 2) { /* the peer goes */
			ring_free(&sv);
			close(fds[1]);
		} else {
			ring_shutdown(&cl, SHUT_RDWR);
			shutdown(fds[0], SHUT_RDWR);
		}
		pthread_join(t, NULL);
		cr_assert_eq(b.rc, -EPIPE, "case %d: %d %s", how, b.rc, b.err);
		cr_assert_lt(b.took, 2.0, "case %d: took %.2f s", how, b.took);
		if (how != 2) {
			ring_free(&sv);
			close(fds[1]);
		}
		ring_free(&cl);
		close(fds[0]);
	}
}

Test(ring, a_read_with_nothing_to_read_times_out)
{
	struct ring cl, sv;
	int fds[2];
	ring_pair(&cl, &sv, fds, 0);
	uint8_t b;
	char err[256] = "";
	struct iovec v = { &b, 1 };
	double t0 = now_s();
	cr_assert_eq(ring_read_iov(&sv, &v, 1, 200, err, sizeof err), -ETIMEDOUT);
	double took = now_s() - t0;
	cr_assert(took >= 0.19 && took < 2.0, "took %.3f s", took);
	cr_assert_not_null(strstr(err, "read timed out after 200 ms with 0 of 1 bytes"), "%s", err);
	pair_free(&cl, &sv, fds);
}

/* The counters sit in memory the peer writes: a head more than a ring
 * ahead of the tail, or a tail past the head, is -EPROTO for the reader
 * and the writer, with nothing copied. */
Test(ring, counters_out_of_order_end_the_connection)
{
	struct ring cl, sv;
	int fds[2];
	ring_pair(&cl, &sv, fds, RING_BYTES_MIN);
	/* The counters are the first 8 bytes of each side's two cache lines:
	 * direction 0 (client to server) first. Tamper as a peer would. */
	_Atomic uint64_t *head0 = (_Atomic uint64_t *)cl.map;
	_Atomic uint64_t *tail0 = (_Atomic uint64_t *)(cl.map + 64);
	uint8_t buf[16];
	char err[256] = "";
	struct iovec v = { buf, sizeof buf };
	atomic_store(head0, (uint64_t)RING_BYTES_MIN + 1);
	cr_assert_eq(ring_read_iov(&sv, &v, 1, IO_MS, err, sizeof err), -EPROTO);
	cr_assert_not_null(strstr(err, "ring out of order"), "%s", err);
	atomic_store(head0, 0);
	atomic_store(tail0, 5); /* the reader took bytes never written */
	cr_assert_eq(ring_write_iov(&cl, &v, 1, IO_MS, err, sizeof err), -EPROTO);
	cr_assert_not_null(strstr(err, "ring out of order"), "%s", err);
	pair_free(&cl, &sv, fds);
}

/* ---- offers ------------------------------------------------------------- */

/* Sends a hand-made offer of cap with fds (n of them) on fd. */
static void offer_by_hand(int fd, const char *magic, uint32_t cap, const int *fds, int n)
{
	uint8_t offer[RING_OFFER_BYTES] = { 0 };
	memcpy(offer, magic, 8);
	memcpy(offer + 8, &cap, 4); /* little-endian hosts only, like the rest */
	char cbuf[CMSG_SPACE(sizeof(int) * 8)];
	memset(cbuf, 0, sizeof cbuf);
	struct iovec v = { offer, sizeof offer };
	struct msghdr mh = { .msg_iov = &v, .msg_iovlen = 1 };
	if (n) {
		mh.msg_control = cbuf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n);
	}
	cr_assert_eq(sendmsg(fd, &mh, MSG_NOSIGNAL), (ssize_t)sizeof offer);
}

/* A memfd of len bytes, sealed against shrinking or not. */
static int memfd_of(size_t len, int sealed)
{
	int m = memfd_create("test-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert_geq(m, 0);
	cr_assert_eq(ftruncate(m, (off_t)len), 0);
	if (sealed)
		cr_assert_eq(fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
	return m;
}

Test(ring, offers_that_cannot_be_used_are_answered_no)
{
	const size_t cap = RING_BYTES_MIN, len = 4096 + 2 * cap;
	struct {
		const char *what;
		uint32_t cap;
		int sealed, mlen_extra, pipe_as_eventfd, nfds;
		const char *why;
	} rows[] = {
		{ "not sealed", cap, 0, 0, 0, 5, "not a sealed memfd" },
		{ "too short", cap, 1, -4096, 0, 5, "not a sealed memfd" },
		{ "a pipe for an eventfd", cap, 1, 0, 1, 5, "is not an eventfd" },
		{ "3 fds", cap, 1, 0, 0, 3, "is not an eventfd" },
		{ "no fds", cap, 1, 0, 0, 0, "not a sealed memfd" },
		{ "not a power of two", cap + 4096, 1, 0, 0, 5, "a ring of" },
		{ "too small", 4096, 1, 0, 0, 5, "a ring of" },
	};
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		int sv[2];
		cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
		int fds[5], p[2];
		cr_assert_eq(pipe(p), 0);
		fds[0] = memfd_of((size_t)((long)len + rows[i].mlen_extra), rows[i].sealed);
		for (int k = 1; k < 5; k++)
			fds[k] = eventfd(0, EFD_CLOEXEC);
		if (rows[i].pipe_as_eventfd) {
			close(fds[3]);
			fds[3] = dup(p[0]);
		}
		offer_by_hand(sv[0], "PSRING1", rows[i].cap, fds, rows[i].nfds);
		for (int k = 0; k < 5; k++)
			close(fds[k]);
		close(p[0]);
		close(p[1]);
		struct ring r;
		char err[256] = "";
		int rc = ring_accept(&r, sv[1], IO_MS, err, sizeof err);
		cr_assert_eq(rc, 1, "%s: rc %d (%s)", rows[i].what, rc, err);
		cr_assert_null(r.map, "%s", rows[i].what);
		cr_assert_not_null(strstr(err, rows[i].why), "%s: %s", rows[i].what, err);
		uint8_t answer = 9;
		cr_assert_eq(read(sv[0], &answer, 1), 1);
		cr_assert_eq(answer, 0, "%s", rows[i].what);
		close(sv[0]);
		close(sv[1]);
	}
}

/* Bytes that are not an offer end the connection; so does a peer gone
 * before its offer, or one that sends none in time. */
Test(ring, what_is_not_an_offer_is_refused)
{
	for (int c = 0; c < 3; c++) {
		int sv[2];
		cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
		if (c == 0)
			offer_by_hand(sv[0], "PSRINGX", RING_BYTES_MIN, NULL, 0);
		if (c == 1)
			close(sv[0]);
		struct ring r;
		char err[256] = "";
		int rc = ring_accept(&r, sv[1], 300, err, sizeof err);
		int want[] = { -EPROTO, -EPIPE, -ETIMEDOUT };
		cr_assert_eq(rc, want[c], "case %d: rc %d (%s)", c, rc, err);
		cr_assert_null(r.map);
		if (c != 1)
			close(sv[0]);
		close(sv[1]);
	}
}

/* A worker that cannot make its ring (no file descriptors left here)
 * still offers, as none, and both ends stay on the socket, each saying
 * why; the connection is not lost. */
Test(ring, a_ring_that_cannot_be_made_is_offered_as_none)
{
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	struct acceptor a = { .fd = sv[1] };
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, accept_main, &a), 0);
	struct rlimit was, now;
	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &was), 0);
	int lowest = dup(0);
	cr_assert_geq(lowest, 0);
	close(lowest);
	now = was;
	now.rlim_cur = (rlim_t)lowest + 1; /* the memfd, then no eventfd */
	cr_assert_eq(setrlimit(RLIMIT_NOFILE, &now), 0);
	struct ring r;
	char err[256] = "";
	int rc = ring_offer(&r, sv[0], 0, IO_MS, err, sizeof err);
	cr_assert_eq(setrlimit(RLIMIT_NOFILE, &was), 0);
	pthread_join(t, NULL);
	cr_assert_eq(rc, 1, "rc %d (%s)", rc, err);
	cr_assert_null(r.map);
	cr_assert_not_null(strstr(err, "cannot make a ring"), "%s", err);
	cr_assert_eq(a.rc, 1, "accept: rc %d (%s)", a.rc, a.err);
	cr_assert_not_null(strstr(a.err, "the worker could not make one"), "%s", a.err);
	/* The socket still carries bytes both ways. */
	uint8_t b = 7;
	cr_assert_eq(write(sv[0], &b, 1), 1);
	cr_assert_eq(read(sv[1], &b, 1), 1);
	cr_assert_eq(b, 7);
	close(sv[0]);
	close(sv[1]);
}

struct scribbler {
	uint8_t *map;
	size_t len;
	atomic_int stop;
};

static void *scribble_main(void *arg)
{
	struct scribbler *s = arg;
	uint64_t x = 88172645463325252ull;
	while (!atomic_load(&s->stop)) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		/* Data anywhere, and now and then a counter or a flag: a
		 * value that may or may not be in range, so that calls copy
		 * garbage as well as fail. */
		size_t at = (size_t)(x % (s->len / 8)) * 8;
		uint64_t v = x;
		if ((x >> 54) == 0) {
			at = (size_t)((x >> 32) % 4) * 64 + (size_t)((x >> 40) % 2) * 128;
			v = (x >> 8) % (4 * RING_BYTES_MIN);
		}
		memcpy(s->map + at, &v, sizeof v);
		if (v != x && (x & 1)) { /* or a state that holds together: a side's tail at its head */
			size_t side = (size_t)((x >> 1) % 2) * 128;
			memcpy(s->map + side + 64, s->map + side, sizeof v);
		}
		if (v != x)
			usleep(1000); /* a state, good or bad, that calls meet */
	}
	return NULL;
}

/* A peer that writes at random all over the shared pages while we read
 * and write: every call returns (data, -EPROTO, a timeout), none reads
 * or writes out of bounds (ASan's build) or hangs past its deadline. */
Test(ring, a_peer_scribbling_on_the_ring_cannot_crash_us)
{
	struct ring cl, sv;
	int fds[2];
	ring_pair(&cl, &sv, fds, RING_BYTES_MIN);
	struct scribbler s = { .map = cl.map, .len = cl.map_len };
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, scribble_main, &s), 0);
	uint8_t *buf = malloc(3 * RING_BYTES_MIN);
	cr_assert_not_null(buf);
	int got[3] = { 0 };
	double end = now_s() + 0.5;
	for (int k = 0; now_s() < end; k++) {
		struct iovec v = { buf, 1 + ((size_t)k * 7919u) % 4096 };
		char err[256] = "";
		double t0 = now_s();
		int rc = k % 2 ? ring_read_iov(&sv, &v, 1, 20, err, sizeof err) :
				 ring_write_iov(&sv, &v, 1, 20, err, sizeof err);
		cr_assert_lt(now_s() - t0, 2.0, "a call took %.2f s", now_s() - t0);
		cr_assert(rc == 0 || rc == -EPROTO || rc == -ETIMEDOUT, "rc %d: %s", rc, err);
		got[rc == 0 ? 0 : rc == -EPROTO ? 1 : 2]++;
	}
	atomic_store(&s.stop, 1);
	pthread_join(t, NULL);
	cr_log_info("ring: scribbled on: %d calls returned, %d out of order, %d timed out", got[0],
		    got[1], got[2]);
	cr_assert_gt(got[1], 0, "no call saw the counters out of order");
	cr_assert_gt(got[0], 0, "no call copied anything");
	free(buf);
	pair_free(&cl, &sv, fds);
}
