/* A fixed one-way delay for a network namespace's incoming packets,
 * where the kernel has no netem: iptables hands each packet to this
 * process (NFQUEUE), which holds it for the delay and then lets it go,
 * in order. bench/netlab runs one per lab host (tests/net/lab.sh,
 * lab_delay).
 *
 *   netdelay --queue N --delay-us D     (in the namespace, as root)
 *
 * Only verdicts cross to user space (no packet bytes: NFQNL_COPY_META),
 * and GSO packets come whole (NFQA_CFG_F_GSO), so a 64 KiB segment of a
 * TCP stream costs one message, not 45. Packets leave in arrival order:
 * one batch verdict releases every packet up to the newest one due.
 * Where the kernel cannot queue a packet (the queue or this socket's
 * buffer full) it lets it through undelayed (NFQA_CFG_F_FAIL_OPEN)
 * rather than drop it: a loss would be a different experiment.
 * What this does not model: jitter and loss. Each host delays what it
 * receives (each direction gets D, a round trip 2D): held on the way
 * out, a packet would still count against its TCP socket's small-queue
 * budget, which starves a long delay (tests/net/lab.sh, lab_delay). */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <libnetfilter_queue/libnetfilter_queue.h>

#define HELD_MAX (1u << 20) /* packets held at once: 2 s at 1 Gbit/s of 1500-byte packets */

struct held {
	uint32_t id;
	int64_t due_ns;
};

struct delay {
	struct held *q; /* ring of HELD_MAX */
	uint32_t head, tail;
	int64_t delay_ns;
	unsigned long overflow; /* packets let go at once: the ring was full */
	struct nfq_q_handle *qh;
};

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static int64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* A packet to hold: its id and when it is due. */
static int delay_take(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa, void *ctx)
{
	(void)msg;
	struct delay *d = ctx;
	struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
	if (!ph)
		return 0;
	uint32_t id = ntohl(ph->packet_id);
	if (d->tail - d->head == HELD_MAX) {
		d->overflow++;
		return nfq_set_verdict(qh, id, NF_ACCEPT, 0, NULL) < 0 ? -1 : 0;
	}
	d->q[d->tail % HELD_MAX] = (struct held){ .id = id, .due_ns = now_ns() + d->delay_ns };
	d->tail++;
	return 0;
}

/* Lets every packet that is due go, with one verdict for all of them
 * (ids grow in arrival order). Returns the ns until the next is due, or
 * -1 when none is held. */
static int64_t delay_release(struct delay *d)
{
	int64_t t = now_ns();
	uint32_t last = 0;
	int any = 0;
	while (d->head != d->tail && d->q[d->head % HELD_MAX].due_ns <= t) {
		last = d->q[d->head % HELD_MAX].id;
		any = 1;
		d->head++;
	}
	if (any && nfq_set_verdict_batch(d->qh, last, NF_ACCEPT) < 0)
		fprintf(stderr, "netdelay: verdict for packets up to %u: %s\n", last, strerror(errno));
	return d->head == d->tail ? -1 : d->q[d->head % HELD_MAX].due_ns - t;
}

static int usage(void)
{
	fprintf(stderr, "usage: netdelay --queue N --delay-us D\n");
	return 2;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "queue", required_argument, NULL, 'q' },
		{ "delay-us", required_argument, NULL, 'd' },
		{ NULL, 0, NULL, 0 },
	};
	long queue = -1, us = -1;
	int o;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		char *end;
		long v = optarg ? strtol(optarg, &end, 10) : -1;
		if (o == '?' || !optarg || *end || v < 0)
			return usage();
		if (o == 'q')
			queue = v;
		else
			us = v;
	}
	if (queue < 0 || queue > 65535 || us < 0 || us > 10000000)
		return usage();
	struct delay d = { .delay_ns = us * 1000 };
	d.q = malloc(HELD_MAX * sizeof(*d.q));
	struct nfq_handle *h = nfq_open();
	if (!d.q || !h) {
		fprintf(stderr, "netdelay: %s\n", !d.q ? "out of memory" : "cannot open a netfilter queue handle (root?)");
		return 1;
	}
	d.qh = nfq_create_queue(h, (uint16_t)queue, delay_take, &d);
	if (!d.qh) {
		fprintf(stderr, "netdelay: cannot bind queue %ld: %s\n", queue, strerror(errno));
		return 1;
	}
	if (nfq_set_mode(d.qh, NFQNL_COPY_META, 0) < 0 || nfq_set_queue_maxlen(d.qh, HELD_MAX) < 0 ||
	    nfq_set_queue_flags(d.qh, NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN,
				NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN) < 0) {
		fprintf(stderr, "netdelay: cannot configure queue %ld: %s\n", queue, strerror(errno));
		return 1;
	}
	nfnl_rcvbufsiz(nfq_nfnlh(h), 16u << 20);
	/* Wake-ups within 1 us of the due time, not the default 50 us. */
	prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	int fd = nfq_fd(h);
	static char buf[1 << 16] __attribute__((aligned(8)));
	unsigned long lost = 0;
	while (!stop) {
		int64_t wait = delay_release(&d);
		struct timespec ts = { wait / 1000000000, wait % 1000000000 };
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int n = ppoll(&p, 1, wait < 0 ? NULL : &ts, NULL);
		if (n < 0 && errno != EINTR) {
			fprintf(stderr, "netdelay: poll: %s\n", strerror(errno));
			return 1;
		}
		while (n > 0) {
			ssize_t r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
			if (r < 0 && errno == ENOBUFS) { /* the kernel dropped messages: say so at the end */
				lost++;
				continue;
			}
			if (r <= 0)
				break;
			nfq_handle_packet(h, buf, (int)r);
		}
	}
	/* What is still held goes now, rather than being dropped with the queue. */
	for (uint32_t i = d.head; i != d.tail; i++)
		d.q[i % HELD_MAX].due_ns = 0;
	delay_release(&d);
	if (d.overflow || lost)
		fprintf(stderr, "netdelay: %lu packets let go undelayed (ring full), %lu receive overflows\n",
			d.overflow, lost);
	nfq_destroy_queue(d.qh);
	nfq_close(h);
	free(d.q);
	return 0;
}
