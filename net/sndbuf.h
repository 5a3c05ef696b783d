/* How much one TCP connection may keep in flight: [cluster]
 * send_buffer_kib, `auto` by default (docs/NETWORK.md, "Switch buffers
 * and long links"; docs/CONFIG.md).
 *
 * auto sizes SO_SNDBUF from what the connection measures, so that it
 * fills a long or fast link and still does not flood a switch port with
 * a shallow buffer: it starts with the kernel's autotuning (and
 * TCP_NOTSENT_LOWAT, so what waits unsent stays short), and once TCP_INFO
 * has seen enough traffic, caps the buffer at
 *
 *     SNDBUF_HEADROOM_PCT% x delivery rate x lowest round trip,
 *     at least SNDBUF_FLOOR, at most what SO_SNDBUF may be given
 *
 * and keeps re-measuring, after a tensor has been sent (never per frame):
 * one TCP_INFO read every SNDBUF_SAMPLE_EVERY_S at most, a decision every
 * SNDBUF_EVERY_S. The rate is the highest of the kernel's delivery-rate
 * samples over that time that the application did not limit
 * (tcpi_delivery_rate, not app_limited): a pause between two steps, or a
 * push that trickles out as backward makes it, says nothing of the link,
 * and the kernel tells those apart. The round trip is the lowest seen
 * (min_rtt): the path without its queues, so queues that build up never
 * make the cap grow. No decision before the window saw enough traffic
 * (sndbuf_enough): a first size taken in slow start would be too small.
 *
 * The rate cannot grow a buffer that is itself the limit: then everything
 * is sent, the congestion window has room, and the application waits for
 * the buffer, and the kernel marks those samples application-limited. So
 * a window that spent SNDBUF_HELD_PCT% of its busy time so (TCP_INFO's
 * sndbuf_limited), without a retransmission and without a standing queue
 * (its smoothed round trip within SNDBUF_QUEUE_PCT% of the lowest: where
 * the link itself is the limit, the full buffer sits in its queue, and a
 * larger one would only lengthen it) doubles the buffer
 * (sndbuf_held_want); a retransmission in the window after such a doubling
 * takes it back and keeps later doublings under that size (the pin): a
 * port that drops a burst says that much in flight is too much. A path that needs more than
 * SO_SNDBUF may be given without privileges (net.core.wmem_max), more
 * than SNDBUF_LONG_X times, is left to the kernel's autotuning for good:
 * setting SO_SNDBUF ends the kernel's tuning of that socket, and it cannot
 * be handed back.
 *
 * The decisions are pure functions (sndbuf_rate, sndbuf_want,
 * sndbuf_next), so a table tests them; sndbuf_init and sndbuf_tune apply
 * them to a socket. A Unix socket is never touched: no switch port is
 * behind it, and a capped one stalled a worker's push to the ps beside it
 * every 128 KiB. */
#ifndef PSTRAIN_NET_SNDBUF_H
#define PSTRAIN_NET_SNDBUF_H

#include <stddef.h>
#include <stdint.h>

#define SNDBUF_AUTO (-1)                 /* send_buffer_kib = auto */
#define SNDBUF_FLOOR (64u * 1024)        /* the lab's shallow-port setting (docs/NETWORK.md) */
#define SNDBUF_HEADROOM_PCT 100u         /* of rate x round trip: the kernel doubles SO_SNDBUF,
					  * so up to about twice the path's product is out */
#define SNDBUF_LOWAT (512u * 1024)       /* TCP_NOTSENT_LOWAT under auto */
#define SNDBUF_EVERY_S 0.5               /* between two decisions */
#define SNDBUF_SAMPLE_EVERY_S 0.01       /* between two TCP_INFO reads */
#define SNDBUF_MIN_BUSY_US 50000u        /* a decision's window needs this much busy time... */
#define SNDBUF_MIN_BUSY_RTTS 16u         /* ...and this many lowest round trips of it */
#define SNDBUF_MIN_ACKED (256u * 1024)   /* ...and this many bytes acknowledged */
#define SNDBUF_WMEM_MAX_DEFAULT 212992u  /* Linux's net.core.wmem_max, if unreadable */
#define SNDBUF_HELD_PCT 5u              /* of a window's busy time held back by the buffer */
#define SNDBUF_QUEUE_PCT 150u            /* smoothed round trip over the lowest: a standing queue */
#define SNDBUF_LONG_X 2u                 /* a path wanting up to this many times the most
					  * SO_SNDBUF may be is still sized, at that most:
					  * the kernel doubles it, which fills the path */

enum sndbuf_state {
	SNDBUF_KERNEL,  /* the kernel's, never touched: send_buffer_kib = 0, a Unix socket,
			 * a closed connection, or no TCP_INFO */
	SNDBUF_FIXED,   /* send_buffer_kib = N: SO_SNDBUF N KiB, as set */
	SNDBUF_PROBING, /* auto, not sized yet: the kernel's autotuning while it measures */
	SNDBUF_SIZED,   /* auto: SO_SNDBUF set from what it measured, re-measured */
	SNDBUF_LONG,    /* auto: the path wants more than SO_SNDBUF may be given
			 * (wmem_max): the kernel's autotuning, for good */
};

/* What TCP_INFO says at one moment. */
struct sndbuf_counters {
	uint64_t acked;      /* bytes acknowledged by the peer, ever */
	uint64_t busy_us;    /* time the connection had data out or queued, ever */
	uint32_t min_rtt_us; /* lowest round trip seen; 0: unknown */
	uint64_t delivery_rate; /* bytes/s of the latest rate sample */
	int app_limited;     /* that sample was limited by the application */
	uint64_t held_us;    /* time everything was sent and the send buffer was full, ever */
	uint32_t retrans;    /* segments retransmitted, ever */
	uint32_t srtt_us;    /* the smoothed round trip now */
};

/* One connection's sizing (the connection's owner holds it; sndbuf_tune
 * under the connection's send lock). Zeroed: SNDBUF_KERNEL. */
struct sndbuf {
	enum sndbuf_state state;
	uint32_t size;       /* SO_SNDBUF as set (bytes; the kernel doubles it), 0: never set */
	uint32_t ceiling;    /* the most SO_SNDBUF may be: net.core.wmem_max */
	uint64_t want;       /* the last size wanted (bytes), 0: none yet */
	uint64_t rate;       /* the last rate a decision measured (bytes/s) */
	uint32_t min_rtt_us; /* the last decision's lowest round trip */
	struct sndbuf_counters base; /* where the window of the next decision starts */
	uint64_t peak;       /* the window's highest rate not limited by the application */
	uint64_t srtt_sum;   /* the window's smoothed round trips (us), summed over its samples */
	uint32_t srtt_n;     /* and their number */
	uint32_t before;     /* the size before the last doubling for being held back, 0: the
			      * last change was not one */
	uint32_t doubled;    /* doublings for being held back, ever (for the log line) */
	uint32_t pin;        /* a doubling from before to this size was followed by a
			      * retransmission: later ones stay under it (0: none) */
	double sample_s;     /* CLOCK_MONOTONIC seconds of the next TCP_INFO read */
	double next_s;       /* and of the next decision */
};

/* Whether the window from a to b saw enough traffic to decide on: at
 * least SNDBUF_MIN_BUSY_US of busy time and SNDBUF_MIN_BUSY_RTTS of b's
 * lowest round trip, and SNDBUF_MIN_ACKED bytes acknowledged; 0 without a
 * round trip, or for counters that went back. */
int sndbuf_enough(const struct sndbuf_counters *a, const struct sndbuf_counters *b);

/* The window's peak rate after sample c: c's delivery rate if higher and
 * not limited by the application, else peak. */
uint64_t sndbuf_peak(uint64_t peak, const struct sndbuf_counters *c);

/* Whether the window from a to b, whose smoothed round trip averaged
 * srtt_us, was held back by its send buffer: at least SNDBUF_HELD_PCT% of
 * its busy time everything sent and the buffer full, no retransmission,
 * and srtt_us within SNDBUF_QUEUE_PCT% of b's lowest round trip. */
int sndbuf_held(const struct sndbuf_counters *a, const struct sndbuf_counters *b, uint32_t srtt_us);

/* The size wanted by a connection held back at SO_SNDBUF size: twice it,
 * kept a quarter under pin (0: none); 0 for size 0 (the kernel's). At
 * net.core.wmem_max it stays there (sndbuf_next): once SO_SNDBUF is set
 * the kernel's autotuning cannot be handed back. */
uint64_t sndbuf_held_want(uint32_t size, uint32_t pin);

/* The SO_SNDBUF value wanted for a connection delivering rate bytes/s over
 * a path whose lowest round trip is min_rtt_us: SNDBUF_HEADROOM_PCT% of
 * their product, at least floor. 0 if rate or min_rtt_us is 0 (nothing
 * measured). */
uint64_t sndbuf_want(uint64_t rate, uint32_t min_rtt_us, uint32_t floor);

/* The next state of an auto connection in state st with SO_SNDBUF size
 * (bytes, 0: never set) after a sample that wants `want` bytes (0:
 * none), SO_SNDBUF being at most ceiling; *next_size gets the size to set
 * (== size: leave it):
 *   PROBING: want above SNDBUF_LONG_X x ceiling -> LONG; else SIZED at
 *     min(want, ceiling).
 *   SIZED: min(want, ceiling) when that is more than a quarter above
 *     size; size less a quarter when it is below half of size; else size
 *     kept.
 *   Others, or want 0: unchanged. */
enum sndbuf_state sndbuf_next(enum sndbuf_state st, uint32_t size, uint64_t want, uint32_t ceiling,
			      uint32_t *next_size);

/* One decision, at the end of a window (base to c) that saw enough: the
 * rate's size (sndbuf_want) or, for a buffer that held the connection
 * back, the doubled one (sndbuf_held_want), whichever is more, through
 * sndbuf_next; or, where a retransmission followed a doubling, the size
 * before it, with the doubled size kept as the pin. Updates t's window,
 * rate, want, before and pin; returns the next state, *size the size to
 * set (== t->size: leave it). */
enum sndbuf_state sndbuf_decide(struct sndbuf *t, const struct sndbuf_counters *c, uint32_t *size);

/* Applies send_buffer_kib (SNDBUF_AUTO, 0 or KiB) to fd, a new connection:
 * N sets SO_SNDBUF; auto sets TCP_NOTSENT_LOWAT and starts measuring; a
 * Unix socket, 0, or a kernel without what auto reads are left as they are.
 * 0 or a negative errno (t is then SNDBUF_KERNEL and fd as it was, but for
 * a failed SO_SNDBUF). */
int sndbuf_init(struct sndbuf *t, int fd, int kib);

/* After a send on fd at now_s (CLOCK_MONOTONIC seconds): measures and
 * resizes an auto connection when it is due, else nothing (one compare).
 * Errors leave the socket as it is. */
void sndbuf_tune(struct sndbuf *t, int fd, double now_s);

/* "auto, 192 KiB: 118 MB/s x 0.68 ms", "64 KiB (send_buffer_kib)", ...:
 * what t holds, for a log line. */
void sndbuf_describe(const struct sndbuf *t, char *out, size_t outlen);

#endif
