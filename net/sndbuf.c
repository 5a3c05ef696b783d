/* See sndbuf.h. Why measured, not constant: 64 KiB (the lab's shallow
 * switch ports) also caps a connection at 64 KiB per round trip, 0.5
 * Gbit/s at 1 ms; the kernel's own buffers fill a long link but, at short
 * round trips, let several connections into one port overflow it
 * (docs/NETWORK.md, "Switch buffers and long links"). Why not only the
 * kernel's autotuning with TCP_NOTSENT_LOWAT: that bounds what waits
 * unsent in this host, not what is in flight, and what overflows a port is
 * in flight (the congestion window grows until a loss); SO_SNDBUF bounds
 * both. */
#include "sndbuf.h"
#include "sock.h"

#include <errno.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

int sndbuf_enough(const struct sndbuf_counters *a, const struct sndbuf_counters *b)
{
	if (b->min_rtt_us == 0 || b->acked < a->acked || b->busy_us < a->busy_us)
		return 0;
	uint64_t busy = b->busy_us - a->busy_us;
	return busy >= SNDBUF_MIN_BUSY_US && busy >= (uint64_t)SNDBUF_MIN_BUSY_RTTS * b->min_rtt_us &&
	       b->acked - a->acked >= SNDBUF_MIN_ACKED;
}

uint64_t sndbuf_peak(uint64_t peak, const struct sndbuf_counters *c)
{
	return !c->app_limited && c->delivery_rate > peak ? c->delivery_rate : peak;
}

int sndbuf_held(const struct sndbuf_counters *a, const struct sndbuf_counters *b, uint32_t srtt_us)
{
	if (b->busy_us < a->busy_us || b->held_us < a->held_us || b->retrans != a->retrans ||
	    srtt_us == 0 || (uint64_t)srtt_us * 100 > (uint64_t)b->min_rtt_us * SNDBUF_QUEUE_PCT)
		return 0;
	return (b->held_us - a->held_us) * 100 >= (b->busy_us - a->busy_us) * SNDBUF_HELD_PCT &&
	       b->held_us > a->held_us;
}

uint64_t sndbuf_held_want(uint32_t size, uint32_t pin)
{
	if (size == 0)
		return 0;
	uint64_t want = (uint64_t)size * 2;
	if (pin && want > (uint64_t)pin - pin / 4)
		want = (uint64_t)pin - pin / 4;
	return want;
}

uint64_t sndbuf_want(uint64_t rate, uint32_t min_rtt_us, uint32_t floor)
{
	if (rate == 0 || min_rtt_us == 0)
		return 0;
	/* rate x rtt in bytes, as bytes a ms x us / 1000 so that it cannot
	 * overflow: at most 4e9 x 2^32 / 1000, and SNDBUF_HEADROOM_PCT times that. */
	uint64_t r = rate > 4000000000000ull ? 4000000000000ull : rate; /* 32 Tbit/s */
	uint64_t bdp = r / 1000 * min_rtt_us / 1000;
	uint64_t want = bdp * SNDBUF_HEADROOM_PCT / 100;
	return want < floor ? floor : want;
}

enum sndbuf_state sndbuf_next(enum sndbuf_state st, uint32_t size, uint64_t want, uint32_t ceiling,
			      uint32_t *next_size)
{
	*next_size = size;
	if (want == 0)
		return st;
	uint32_t fit = want > ceiling ? ceiling : (uint32_t)want;
	if (st == SNDBUF_PROBING) {
		if (want > (uint64_t)ceiling * SNDBUF_LONG_X)
			return SNDBUF_LONG;
		*next_size = fit;
		return SNDBUF_SIZED;
	}
	if (st != SNDBUF_SIZED)
		return st;
	/* Growing: past a quarter more. Shrinking, slowly: only below half,
	 * and by a quarter at most at once, since a window whose samples the
	 * application mostly limited reads low, and too small a buffer costs
	 * every step while too large a one costs only where a port is shallow
	 * (and there the floor holds). */
	if ((uint64_t)fit * 4 > (uint64_t)size * 5)
		*next_size = fit;
	else if ((uint64_t)fit * 2 < size)
		*next_size = size - size / 4;
	return st;
}

/* ---- the socket ---------------------------------------------------------- */

/* net.core.wmem_max: what SO_SNDBUF may be set to without CAP_NET_ADMIN. */
static uint32_t wmem_max(void)
{
	unsigned long v = 0;
	FILE *f = fopen("/proc/sys/net/core/wmem_max", "re");
	if (f) {
		if (fscanf(f, "%lu", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v == 0 || v > (1ul << 30) ? SNDBUF_WMEM_MAX_DEFAULT : (uint32_t)v;
}

/* TCP_INFO's counters; -EOPNOTSUPP from a kernel whose tcp_info stops
 * before sndbuf_limited (before 4.10, which added it with busy_time). */
static int counters_read(int fd, struct sndbuf_counters *c)
{
	struct tcp_info ti;
	socklen_t len = sizeof ti;
	memset(&ti, 0, sizeof ti);
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0)
		return -errno;
	if (len < offsetof(struct tcp_info, tcpi_sndbuf_limited) + sizeof ti.tcpi_sndbuf_limited)
		return -EOPNOTSUPP;
	*c = (struct sndbuf_counters){ .acked = ti.tcpi_bytes_acked, .busy_us = ti.tcpi_busy_time,
				       .min_rtt_us = ti.tcpi_min_rtt, .delivery_rate = ti.tcpi_delivery_rate,
				       .app_limited = ti.tcpi_delivery_rate_app_limited,
				       .held_us = ti.tcpi_sndbuf_limited, .retrans = ti.tcpi_total_retrans,
				       .srtt_us = ti.tcpi_rtt };
	return 0;
}

/* SO_SNDBUF = bytes; t->size what the kernel kept (it reports double). */
static int size_set(struct sndbuf *t, int fd, uint32_t bytes)
{
	int v = bytes > INT32_MAX / 2 ? INT32_MAX / 2 : (int)bytes;
	socklen_t sl = sizeof v;
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v) < 0)
		return -errno;
	t->size = bytes;
	if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, &sl) == 0 && v > 0)
		t->size = (uint32_t)v / 2;
	return 0;
}

int sndbuf_init(struct sndbuf *t, int fd, int kib)
{
	memset(t, 0, sizeof(*t));
	if (kib == 0 || sock_is_unix(fd))
		return 0;
	if (kib > 0) {
		int r = size_set(t, fd, (uint32_t)kib * 1024);
		t->state = r ? SNDBUF_KERNEL : SNDBUF_FIXED;
		return r;
	}
	int lowat = SNDBUF_LOWAT;
	if (counters_read(fd, &t->base) < 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof lowat) < 0)
		return 0; /* an old kernel: its own tuning, as with 0 */
	t->ceiling = wmem_max();
	t->state = SNDBUF_PROBING;
	return 0;
}

/* The window's mean smoothed round trip, 0: no sample. */
static uint32_t sndbuf_srtt(const struct sndbuf *t)
{
	return t->srtt_n ? (uint32_t)(t->srtt_sum / t->srtt_n) : 0;
}

enum sndbuf_state sndbuf_decide(struct sndbuf *t, const struct sndbuf_counters *c, uint32_t *size)
{
	int held = t->state == SNDBUF_SIZED && sndbuf_held(&t->base, c, sndbuf_srtt(t));
	int undo = c->retrans != t->base.retrans && t->before; /* the last doubling was too much */
	t->base = *c;
	t->srtt_sum = 0;
	t->srtt_n = 0;
	t->want = sndbuf_want(t->peak, c->min_rtt_us, SNDBUF_FLOOR);
	t->rate = t->peak ? t->peak : t->rate; /* a held window has no rate of its own */
	t->peak = 0;
	t->min_rtt_us = c->min_rtt_us;
	if (undo) {
		*size = t->before;
		t->pin = t->size;
		t->before = 0;
		return t->state;
	}
	uint64_t h = held ? sndbuf_held_want(t->size, t->pin) : 0;
	t->want = h > t->want ? h : t->want;
	enum sndbuf_state st = sndbuf_next(t->state, t->size, t->want, t->ceiling, size);
	t->before = held && *size > t->size ? t->size : 0;
	t->doubled += t->before != 0;
	return st;
}

void sndbuf_tune(struct sndbuf *t, int fd, double now_s)
{
	if ((t->state != SNDBUF_PROBING && t->state != SNDBUF_SIZED) || now_s < t->sample_s)
		return;
	t->sample_s = now_s + SNDBUF_SAMPLE_EVERY_S;
	struct sndbuf_counters c = { 0 };
	if (counters_read(fd, &c) < 0)
		return;
	t->peak = sndbuf_peak(t->peak, &c);
	t->srtt_sum += c.srtt_us;
	t->srtt_n++;
	/* Not yet, or not enough traffic: the window goes on. A buffer that
	 * holds the connection back leaves no rate sample to go by. */
	if (now_s < t->next_s || !sndbuf_enough(&t->base, &c) ||
	    (t->peak == 0 && !(t->state == SNDBUF_SIZED && sndbuf_held(&t->base, &c, sndbuf_srtt(t)))))
		return;
	t->next_s = now_s + SNDBUF_EVERY_S;
	uint32_t size;
	enum sndbuf_state st = sndbuf_decide(t, &c, &size);
	if (size != t->size && size_set(t, fd, size) < 0)
		return; /* PROBING stays so, SIZED keeps its size */
	t->state = st;
}

void sndbuf_describe(const struct sndbuf *t, char *out, size_t outlen)
{
	double mbit = (double)t->rate * 8 / 1e6;
	int n;
	char rtt[32];
	if (t->min_rtt_us < 100)
		snprintf(rtt, sizeof rtt, "%u us", t->min_rtt_us);
	else
		snprintf(rtt, sizeof rtt, "%.2f ms", t->min_rtt_us / 1e3);
	switch (t->state) {
	case SNDBUF_KERNEL:
		snprintf(out, outlen, "the kernel's");
		break;
	case SNDBUF_FIXED:
		snprintf(out, outlen, "%u KiB (send_buffer_kib)", t->size / 1024);
		break;
	case SNDBUF_PROBING:
		snprintf(out, outlen, "auto, the kernel's while measuring");
		break;
	case SNDBUF_SIZED:
		if (t->want > t->size && t->size >= t->ceiling)
			n = snprintf(out, outlen, "auto, %u KiB (net.core.wmem_max; it wanted %llu): %.0f Mbit/s x %s",
				     t->size / 1024, (unsigned long long)(t->want / 1024), mbit, rtt);
		else
			n = snprintf(out, outlen, "auto, %u KiB: %.0f Mbit/s x %s", t->size / 1024, mbit, rtt);
		if (t->doubled && n > 0 && (size_t)n < outlen)
			snprintf(out + n, outlen - (size_t)n, "; doubled %u time%s for holding the link back%s",
				 t->doubled, t->doubled == 1 ? "" : "s",
				 t->pin ? ", a retransmission took one back" : "");
		break;
	case SNDBUF_LONG:
		snprintf(out, outlen,
			 "auto, the kernel's: %.0f Mbit/s x %s wants %llu KiB, more than net.core.wmem_max (%u KiB)",
			 mbit, rtt, (unsigned long long)(t->want / 1024), t->ceiling / 1024);
		break;
	}
}
