/* Tests of net/sndbuf.c, [cluster] send_buffer_kib: the sizing as pure
 * functions (whether a window saw enough, its peak rate, the size
 * wanted, the next state), each a table; then on 127.0.0.1, the socket options a connection gets (N KiB,
 * 0, auto; a Unix socket left alone) read back with getsockopt, and an
 * auto connection that sends tensors measuring its way to a size. */
#include <criterion/criterion.h>

#include "leak.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "../net/conn.h"
#include "../net/sndbuf.h"
#include "../net/sock.h"

static void setup(void)
{
	cr_assert(sodium_init() >= 0, "sodium_init failed");
}

TestSuite(sndbuf, .init = setup, .fini = leak_check, .timeout = 30);

#define KIB 1024ull
#define MIB (1024ull * 1024)

/* ---- pure functions ------------------------------------------------------ */

Test(sndbuf, want_is_rate_x_lowest_round_trip)
{
	static const struct {
		uint64_t rate; /* bytes/s */
		uint32_t rtt_us, floor;
		uint64_t want;
		const char *what;
	} rows[] = {
		{ 0, 500, 65536, 0, "no rate measured" },
		{ 125000000, 0, 65536, 0, "no round trip measured" },
		{ 125000000, 100, 65536, 65536, "1 Gbit/s x 0.1 ms (12.5 KB): the floor" },
		{ 1250000000, 50, 65536, 65536, "10 Gbit/s x 0.05 ms (62.5 KB): the floor" },
		{ 1250000000, 60, 65536, 75000, "10 Gbit/s x 0.06 ms" },
		{ 125000000, 680, 65536, 85000, "1 Gbit/s x 0.68 ms (netlab's 0.25 ms profile)" },
		{ 125000000, 2200, 65536, 275000, "1 Gbit/s x 2.2 ms (1 ms each way)" },
		{ 125000000, 10200, 65536, 1275000, "1 Gbit/s x 10.2 ms (5 ms each way)" },
		{ 1250000000, 10200, 65536, 12750000, "10 Gbit/s x 10.2 ms" },
		{ 6250000, 10000, 65536, 65536, "50 Mbit/s x 10 ms (a VPN): the floor" },
		{ 125000000, 100, 0, 12500, "no floor" },
		{ 125000000, 99, 0, 12375, "bytes a ms x us" },
		{ 1ull << 50, 4000000000u, 0, 16000000000000000ull, "absurd: 32 Tbit/s x 4000 s, no overflow" },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		uint64_t got = sndbuf_want(rows[i].rate, rows[i].rtt_us, rows[i].floor);
		cr_expect_eq(got, rows[i].want, "row %zu (%s): %llu, want %llu", i, rows[i].what,
			     (unsigned long long)got, (unsigned long long)rows[i].want);
	}
}

/* Counters: acked bytes, busy us, lowest round trip us. */
#define CNT(a, b, r) { .acked = (a), .busy_us = (b), .min_rtt_us = (r) }

Test(sndbuf, decides_only_on_a_window_with_enough_traffic)
{
	static const struct {
		struct sndbuf_counters a, b;
		int enough;
		const char *what;
	} rows[] = {
		{ CNT(0, 0, 0), CNT(10 * MIB, 100000, 100), 1, "10 MiB in 100 ms busy" },
		{ CNT(1 * MIB, 50000, 90), CNT(11 * MIB, 100000, 100), 1, "50 ms busy from a base" },
		{ CNT(0, 0, 0), CNT(10 * MIB, 49999, 100), 0, "under 50 ms busy" },
		{ CNT(0, 0, 0), CNT(10 * MIB, 100000, 10000), 0, "under 16 round trips busy" },
		{ CNT(0, 0, 0), CNT(10 * MIB, 160000, 10000), 1, "16 round trips of 10 ms" },
		{ CNT(0, 0, 0), CNT(256 * KIB, 100000, 100), 1, "256 KiB acknowledged" },
		{ CNT(0, 0, 0), CNT(255 * KIB, 100000, 100), 0, "under 256 KiB acknowledged" },
		{ CNT(0, 0, 0), CNT(10 * MIB, 100000, 0), 0, "no round trip known" },
		{ CNT(20 * MIB, 0, 100), CNT(10 * MIB, 100000, 100), 0, "acked went back (another socket)" },
		{ CNT(0, 200000, 100), CNT(10 * MIB, 100000, 100), 0, "busy went back" },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		cr_expect_eq(sndbuf_enough(&rows[i].a, &rows[i].b), rows[i].enough, "row %zu (%s)", i,
			     rows[i].what);
}

/* The window's rate: the highest sample the application did not limit (a
 * pause between steps, a push trickling out of backward). */
Test(sndbuf, peak_skips_samples_the_application_limited)
{
	static const struct {
		uint64_t peak, rate;
		int app_limited;
		uint64_t next;
	} rows[] = {
		{ 0, 100, 0, 100 }, { 100, 90, 0, 100 }, { 100, 120, 0, 120 },
		{ 100, 500, 1, 100 }, { 0, 500, 1, 0 }, { 100, 0, 0, 100 },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct sndbuf_counters c = { .delivery_rate = rows[i].rate, .app_limited = rows[i].app_limited };
		cr_expect_eq(sndbuf_peak(rows[i].peak, &c), rows[i].next, "row %zu", i);
	}
}

Test(sndbuf, next_state_and_size)
{
	const uint32_t ceil = 212992; /* Linux's default net.core.wmem_max */
	static const struct {
		enum sndbuf_state st;
		uint32_t size;
		uint64_t want;
		enum sndbuf_state next;
		uint32_t next_size;
		const char *what;
	} rows[] = {
		{ SNDBUF_PROBING, 0, 0, SNDBUF_PROBING, 0, "nothing measured yet" },
		{ SNDBUF_PROBING, 0, 65536, SNDBUF_SIZED, 65536, "a short path: sized" },
		{ SNDBUF_PROBING, 0, 212992, SNDBUF_SIZED, 212992, "just fits" },
		{ SNDBUF_PROBING, 0, 425984, SNDBUF_SIZED, 212992, "twice: the ceiling, doubled, fills it" },
		{ SNDBUF_PROBING, 0, 425985, SNDBUF_LONG, 0, "a long fat path: the kernel's" },
		{ SNDBUF_SIZED, 65536, 120000, SNDBUF_SIZED, 120000, "grows" },
		{ SNDBUF_SIZED, 65536, 81920, SNDBUF_SIZED, 65536, "a quarter more: kept" },
		{ SNDBUF_SIZED, 65536, 81921, SNDBUF_SIZED, 81921, "more than a quarter more: grows" },
		{ SNDBUF_SIZED, 100000, 50000, SNDBUF_SIZED, 100000, "half: kept" },
		{ SNDBUF_SIZED, 100000, 49999, SNDBUF_SIZED, 75000, "below half: a quarter less" },
		{ SNDBUF_SIZED, 400000, 65536, SNDBUF_SIZED, 300000, "never more than a quarter at once" },
		{ SNDBUF_SIZED, 400000, 0, SNDBUF_SIZED, 400000, "no sample: kept" },
		{ SNDBUF_SIZED, 100000, 5000000, SNDBUF_SIZED, 212992, "grows to the ceiling, no more" },
		{ SNDBUF_SIZED, 212992, 5000000, SNDBUF_SIZED, 212992, "stays at the ceiling" },
		{ SNDBUF_SIZED, 100000, 0, SNDBUF_SIZED, 100000, "no sample" },
		{ SNDBUF_LONG, 0, 65536, SNDBUF_LONG, 0, "long stays long (SO_SNDBUF cannot be undone)" },
		{ SNDBUF_FIXED, 65536, 500000, SNDBUF_FIXED, 65536, "send_buffer_kib = N: as set" },
		{ SNDBUF_KERNEL, 0, 500000, SNDBUF_KERNEL, 0, "0 or a Unix socket: untouched" },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		uint32_t sz = 12345;
		enum sndbuf_state st = sndbuf_next(rows[i].st, rows[i].size, rows[i].want, ceil, &sz);
		cr_expect_eq(st, rows[i].next, "row %zu (%s): state %d, want %d", i, rows[i].what, st,
			     rows[i].next);
		cr_expect_eq(sz, rows[i].next_size, "row %zu (%s): size %u, want %u", i, rows[i].what, sz,
			     rows[i].next_size);
	}
}

/* Held back by the buffer: everything sent, the buffer full, for at least
 * SNDBUF_HELD_PCT% of the window's busy time, and nothing retransmitted. */
Test(sndbuf, held_back_is_the_buffers_share_of_busy_time_without_a_loss)
{
	static const struct {
		uint64_t busy0, held0, busy1, held1;
		uint32_t re0, re1;
		int held;
		const char *what;
	} rows[] = {
		{ 0, 0, 100000, 5000, 0, 0, 1, "5% of the busy time" },
		{ 0, 0, 100000, 4999, 0, 0, 0, "under 5%" },
		{ 50000, 10000, 150000, 15000, 3, 3, 1, "5% of this window, not of all time" },
		{ 50000, 90000, 150000, 94999, 0, 0, 0, "4.999% of this window though 63% of all time" },
		{ 0, 0, 100000, 60000, 0, 1, 0, "a retransmission: not the buffer's doing" },
		{ 0, 0, 100000, 0, 0, 0, 0, "never held" },
		{ 0, 0, 0, 0, 0, 0, 0, "no busy time at all" },
		{ 200000, 0, 100000, 50000, 0, 0, 0, "busy went back (another socket)" },
		{ 0, 50000, 100000, 10000, 0, 0, 0, "held went back" },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct sndbuf_counters a = { .busy_us = rows[i].busy0, .held_us = rows[i].held0, .retrans = rows[i].re0 };
		struct sndbuf_counters b = { .busy_us = rows[i].busy1, .held_us = rows[i].held1, .retrans = rows[i].re1 };
		b.min_rtt_us = 2000;
		cr_expect_eq(sndbuf_held(&a, &b, 2100), rows[i].held, "row %zu (%s)", i, rows[i].what);
	}
	/* The link, not the buffer: a full buffer in a standing queue. */
	struct sndbuf_counters a = { 0 }, b = { .busy_us = 100000, .held_us = 50000, .min_rtt_us = 2000 };
	cr_expect_eq(sndbuf_held(&a, &b, 3000), 1, "1.5 x the lowest round trip: no standing queue yet");
	cr_expect_eq(sndbuf_held(&a, &b, 3001), 0, "over 1.5 x: a queue");
	cr_expect_eq(sndbuf_held(&a, &b, 0), 0, "no round trip sampled");
	b.min_rtt_us = 10;
	cr_expect_eq(sndbuf_held(&a, &b, 500), 0, "1 Gbit/s on a LAN: 64 KiB queued is 0.5 ms");
	cr_expect_eq(sndbuf_held_want(65536, 0), 131072, "doubles");
	cr_expect_eq(sndbuf_held_want(0, 0), 0, "the kernel's buffer is not ours to double");
	cr_expect_eq(sndbuf_held_want(65536, 131072), 98304, "a quarter under the pin");
	cr_expect_eq(sndbuf_held_want(65536, 65536), 49152, "a pin at the size: nothing more (sndbuf_next keeps it)");
}

/* A window's counters: busy us, held us, retransmissions; 1 MiB acked a
 * window, a 2 ms lowest round trip, no rate sample the application did not
 * limit (as when the buffer holds a connection back). */
static struct sndbuf_counters window(int k, uint64_t held_per, uint32_t retrans)
{
	return (struct sndbuf_counters){ .acked = (uint64_t)k * MIB, .busy_us = (uint64_t)k * 100000,
					 .held_us = (uint64_t)k * held_per, .min_rtt_us = 2000,
					 .retrans = retrans };
}

/* The sequence a long link behind a shallow port takes: doubled while held
 * back, the doubling that brought a retransmission taken back and kept as
 * the pin, then only growth a quarter under it; a long link without loss
 * doubles up to net.core.wmem_max and stays there. */
Test(sndbuf, decisions_double_a_held_buffer_and_take_back_a_doubling_that_lost)
{
	struct sndbuf t = { .state = SNDBUF_SIZED, .size = 65536, .ceiling = 4 * MIB };
	static const struct {
		uint64_t held_per;  /* us of 100,000 busy */
		uint32_t retrans;   /* ever, at the window's end */
		uint32_t size, before, pin;
		const char *what;
	} steps[] = {
		{ 50000, 0, 131072, 65536, 0, "held half the time: doubled" },
		{ 50000, 0, 262144, 131072, 0, "still held: doubled again" },
		{ 50000, 4, 131072, 0, 262144, "a loss after the doubling: taken back, pinned" },
		{ 50000, 4, 196608, 131072, 262144, "held: a quarter under the pin" },
		{ 50000, 9, 131072, 0, 196608, "a loss again: back, pinned lower" },
		{ 50000, 9, 131072, 0, 196608, "held: 147456 is not a quarter more, kept" },
		{ 1000, 9, 131072, 0, 196608, "not held: kept" },
		{ 0, 12, 131072, 0, 196608, "a loss without a doubling before it: kept" },
	};
	t.base = window(0, 0, 0);
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		struct sndbuf_counters c = window((int)i + 1, steps[i].held_per, steps[i].retrans);
		c.held_us = t.base.held_us + steps[i].held_per;
		uint32_t size = 0;
		t.srtt_sum = 2100, t.srtt_n = 1;
		enum sndbuf_state st = sndbuf_decide(&t, &c, &size);
		cr_assert_eq(st, SNDBUF_SIZED, "step %zu (%s)", i, steps[i].what);
		cr_assert_eq(size, steps[i].size, "step %zu (%s): size %u", i, steps[i].what, size);
		cr_assert_eq(t.before, steps[i].before, "step %zu (%s): before %u", i, steps[i].what, t.before);
		cr_assert_eq(t.pin, steps[i].pin, "step %zu (%s): pin %u", i, steps[i].what, t.pin);
		t.size = size; /* as size_set would */
	}
	struct sndbuf u = { .state = SNDBUF_SIZED, .size = 65536, .ceiling = 4 * MIB };
	u.base = window(0, 0, 0);
	for (int i = 1; i <= 10; i++) {
		struct sndbuf_counters c = window(i, 50000, 0);
		uint32_t size = 0;
		u.srtt_sum = 2 * 2900, u.srtt_n = 2;
		cr_assert_eq(sndbuf_decide(&u, &c, &size), SNDBUF_SIZED);
		u.size = size;
	}
	cr_expect_eq(u.size, 4 * MIB, "a long link without loss ends at the ceiling: %u", u.size);
	char d[200];
	sndbuf_describe(&t, d, sizeof d);
	cr_expect_str_eq(d, "auto, 128 KiB: 0 Mbit/s x 2.00 ms; doubled 3 times for holding the link back, "
			    "a retransmission took one back");
	/* Probing (the kernel's buffer) is never doubled: it grows itself. */
	struct sndbuf p = { .state = SNDBUF_PROBING, .ceiling = 4 * MIB };
	p.base = window(0, 0, 0);
	struct sndbuf_counters c = window(1, 50000, 0);
	uint32_t size = 1;
	p.srtt_sum = 2000, p.srtt_n = 1;
	cr_expect_eq(sndbuf_decide(&p, &c, &size), SNDBUF_PROBING);
	cr_expect_eq(size, 0);
	/* The same held windows with a standing queue: the link is the limit. */
	struct sndbuf q = { .state = SNDBUF_SIZED, .size = 65536, .ceiling = 4 * MIB };
	q.base = window(0, 0, 0);
	for (int i = 1; i <= 4; i++) {
		c = window(i, 50000, 0);
		q.srtt_sum = 2 * 3500, q.srtt_n = 2;
		cr_assert_eq(sndbuf_decide(&q, &c, &size), SNDBUF_SIZED);
		q.size = size;
	}
	cr_expect_eq(q.size, 65536, "a queue behind it: kept (%u)", q.size);
	cr_expect_eq(q.srtt_n, 0, "each decision starts a new window");
}

/* ---- sockets ------------------------------------------------------------- */

/* A connected TCP pair on 127.0.0.1. */
static void tcp_pair(int *c, int *s)
{
	char err[256] = "";
	int lfd = -1;
	cr_assert_eq(sock_listen("127.0.0.1", 0, 8, &lfd, err, sizeof err), 0, "%s", err);
	cr_assert_eq(sock_connect_retry("127.0.0.1", (uint16_t)sock_local_port(lfd), 2000, c, err,
					sizeof err), 0, "%s", err);
	cr_assert_eq(sock_accept(lfd, 2000, s, NULL, 0, err, sizeof err), 0, "%s", err);
	close(lfd);
}

static int opt_get(int fd, int level, int name)
{
	int v = -1;
	socklen_t sl = sizeof v;
	cr_assert_eq(getsockopt(fd, level, name, &v, &sl), 0, "getsockopt: %s", strerror(errno));
	return v;
}

/* net.core.wmem_max as the kernel applies it: SO_SNDBUF asked far above
 * it is clamped to it (and reported doubled). */
static uint32_t wmem_max_applied(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0), v = INT32_MAX / 2;
	cr_assert_geq(fd, 0);
	cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v), 0);
	v = opt_get(fd, SOL_SOCKET, SO_SNDBUF);
	close(fd);
	return (uint32_t)v / 2;
}

Test(sndbuf, options_a_socket_gets)
{
	int c = -1, s = -1;
	struct sndbuf t;
	tcp_pair(&c, &s);
	int buf0 = opt_get(c, SOL_SOCKET, SO_SNDBUF), lowat0 = opt_get(c, IPPROTO_TCP, TCP_NOTSENT_LOWAT);

	/* 0: the kernel's, nothing set. */
	cr_assert_eq(sndbuf_init(&t, c, 0), 0);
	cr_expect_eq(t.state, SNDBUF_KERNEL);
	cr_expect_eq(opt_get(c, SOL_SOCKET, SO_SNDBUF), buf0);
	cr_expect_eq(opt_get(c, IPPROTO_TCP, TCP_NOTSENT_LOWAT), lowat0);

	/* auto: the unsent queue kept short, the buffer still the kernel's
	 * (the first size comes from measurements). */
	cr_assert_eq(sndbuf_init(&t, c, SNDBUF_AUTO), 0);
	cr_expect_eq(t.state, SNDBUF_PROBING);
	cr_expect_eq(opt_get(c, IPPROTO_TCP, TCP_NOTSENT_LOWAT), (int)SNDBUF_LOWAT);
	cr_expect_eq(opt_get(c, SOL_SOCKET, SO_SNDBUF), buf0, "auto set SO_SNDBUF before measuring");
	cr_expect_eq(t.ceiling, wmem_max_applied());

	/* N KiB: the cap, which the kernel doubles for its bookkeeping. */
	cr_assert_eq(sndbuf_init(&t, s, 64), 0);
	cr_expect_eq(t.state, SNDBUF_FIXED);
	cr_expect_eq(opt_get(s, SOL_SOCKET, SO_SNDBUF), 2 * 64 * 1024);
	cr_expect_eq(t.size, 64 * 1024);
	char d[200];
	sndbuf_describe(&t, d, sizeof d);
	cr_expect_str_eq(d, "64 KiB (send_buffer_kib)");
	close(c);
	close(s);
}

/* A Unix socket keeps its buffer whatever the key says: no switch port
 * behind it, and a cap stalls a worker's push to the ps beside it. */
Test(sndbuf, unix_sockets_left_alone)
{
	int sv[2];
	struct sndbuf t;
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	int before = opt_get(sv[0], SOL_SOCKET, SO_SNDBUF);
	cr_assert_eq(sndbuf_init(&t, sv[0], 64), 0);
	cr_expect_eq(t.state, SNDBUF_KERNEL);
	cr_assert_eq(sndbuf_init(&t, sv[0], SNDBUF_AUTO), 0);
	cr_expect_eq(t.state, SNDBUF_KERNEL);
	cr_expect_eq(opt_get(sv[0], SOL_SOCKET, SO_SNDBUF), before);
	sndbuf_tune(&t, sv[0], 1e9); /* nothing to measure: no effect */
	cr_expect_eq(opt_get(sv[0], SOL_SOCKET, SO_SNDBUF), before);
	close(sv[0]);
	close(sv[1]);
}

/* ---- a connection ----------------------------------------------------------- */

struct end {
	struct conn cn;
};

static void end_init(struct end *e, int fd)
{
	memset(e, 0, sizeof(*e));
	struct conn_shape shape = { .pipes = CONN_PIPE_ONE };
	cr_assert_eq(conn_init(&e->cn, -1, &shape, 5000, 5000), 0);
	/* Both ends with the same all-zero ChaCha20 keys: what is under test
	 * is the socket, not the handshake. */
	struct hs_result hr;
	memset(&hr, 0, sizeof(hr));
	hr.send.cipher = hr.recv.cipher = FRAME_CHACHA20POLY1305;
	conn_attach(&e->cn, fd, &hr);
}

static void end_free(struct end *e)
{
	conn_destroy(&e->cn);
}

#define TENSOR_N (256u * 1024) /* floats: 1 MiB a tensor */

struct reader {
	struct end *e;
	float *dst;
	_Atomic int stop;
	int tensors, r;
	char err[256];
};

/* Receives tensors, pausing between chunks so that the sender's socket
 * stays full (busy: what auto measures), until the sender, done (stop),
 * shuts its side: the end of the stream between two tensors. */
static void *reader_main(void *arg)
{
	struct reader *rd = arg;
	for (;;) {
		struct msg_assembly a;
		size_t len;
		if ((rd->r = msg_assembly_init(&a, WIRE_PUSH, 0, TENSOR_N, WIRE_F32, rd->err, sizeof rd->err)))
			return NULL;
		struct conn_chunk_rx x = { .type = WIRE_PUSH, .a = &a, .dst = rd->dst };
		while (!msg_assembly_done(&a)) {
			rd->r = conn_recv(&rd->e->cn, &len, rd->err, sizeof rd->err);
			if (rd->r && rd->stop && a.received == 0) {
				rd->r = 0;
				return NULL;
			}
			if (rd->r || (rd->r = conn_take_chunk(&rd->e->cn, &x, len, rd->err, sizeof rd->err)))
				return NULL;
			nanosleep(&(struct timespec){ .tv_nsec = 100000 }, NULL);
		}
		rd->tensors++;
	}
}

/* auto on a TCP connection: the low-water mark at once, then, once the
 * tensors it sends have kept it busy long enough, a send buffer sized
 * from what it measured (on 127.0.0.1 the round trip is microseconds, so
 * the floor), which the socket holds. */
Test(sndbuf, connection_measures_its_way_to_a_size)
{
	int c = -1, s = -1;
	tcp_pair(&c, &s);
	struct end tx, rx;
	end_init(&tx, c);
	end_init(&rx, s);
	conn_send_buffer(&tx.cn, SNDBUF_AUTO);
	cr_expect_eq(opt_get(c, IPPROTO_TCP, TCP_NOTSENT_LOWAT), (int)SNDBUF_LOWAT);
	cr_expect_eq(tx.cn.sb.state, SNDBUF_PROBING);

	float *src = calloc(TENSOR_N, sizeof(float));
	struct reader rd = { .e = &rx, .dst = calloc(TENSOR_N, sizeof(float)) };
	cr_assert(src && rd.dst);
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, reader_main, &rd), 0);
	struct conn_chunk_tx t = { .type = WIRE_PUSH, .src = src, .n = TENSOR_N };
	char err[256] = "";
	int r = 0, sent = 0;
	struct timespec t0, now;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		r = conn_send_tensor(&tx.cn, CONN_MAIN, &t, err, sizeof err);
		sent++;
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (!r && tx.cn.sb.state == SNDBUF_PROBING && now.tv_sec - t0.tv_sec < 10);
	rd.stop = 1;
	shutdown(c, SHUT_WR);
	pthread_join(th, NULL);
	cr_assert_eq(r, 0, "%s", err);
	cr_assert_eq(rd.r, 0, "%s", rd.err);

	char d[200];
	sndbuf_describe(&tx.cn.sb, d, sizeof d);
	cr_assert_eq(tx.cn.sb.state, SNDBUF_SIZED, "after %d tensors: %s", sent, d);
	cr_log_info("after %d tensors: %s", sent, d);
	cr_expect_gt(tx.cn.sb.rate, 0);
	cr_expect_gt(tx.cn.sb.min_rtt_us, 0);
	cr_expect_geq(tx.cn.sb.size, SNDBUF_FLOOR, "%s", d);
	cr_expect_eq(opt_get(c, SOL_SOCKET, SO_SNDBUF), 2 * (int)tx.cn.sb.size, "%s", d);
	cr_expect(strncmp(d, "auto, ", 6) == 0 && strstr(d, " KiB: "), "%s", d);

	/* Closed, the record goes with the socket. */
	conn_close(&tx.cn);
	cr_expect_eq(tx.cn.sb.state, SNDBUF_KERNEL);
	free(src);
	free(rd.dst);
	end_free(&tx);
	end_free(&rx);
}
