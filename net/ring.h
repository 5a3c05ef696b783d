/* A connection's byte stream through memory shared by its two processes
 * on one host, beside the Unix socket that joined them ([cluster]
 * local_ring, docs/NETWORK.md "Rings"). Over the socket each frame took a
 * system call at each end and two copies through the kernel's buffers,
 * which in the netlab with a ps beside each worker cost about 2 ms of CPU
 * a step (perf, 10 Gbit/s); through a ring the bytes are copied once in
 * and once out, in user space, and a system call is made only to wake an
 * end that sleeps.
 *
 * The worker (client) makes the ring: a memfd holding one ring a
 * direction (a power of two of bytes each, behind two pages of counters),
 * sealed against shrinking so that the peer cannot turn our reads into
 * SIGBUS, and four eventfds (data and space, each direction). It sends
 * them over the socket (SCM_RIGHTS) in the 16-byte offer right after the
 * handshake, which said it would (hs_identity.local == HS_LOCAL_RING); the
 * ps checks and maps them and answers one byte, 1 for the ring, 0 to stay
 * on the socket. From then on every byte of the connection goes through
 * the ring; the socket carries none, and stays as the connection's
 * liveness: the peer's end closing (or either end shut down) ends reads
 * and writes as it would a socket's, once what was written before is read.
 *
 * Each direction has one writer and one reader at a time (a connection's
 * send lock, its one receiving thread). head and tail count bytes put in
 * and taken out; a side that finds nothing to do names the
 * peer's count it waits for (the rest of its call, at most a quarter of
 * the ring), sets its sleeps flag, looks once more, and sleeps in poll()
 * on its eventfd and the socket; the other side shows its counter a
 * quarter ring at a time and at the end of each call, and wakes it
 * through that eventfd only when the flag was set and the count reached.
 * The peer is of our own user (sock_is_unix_same_user) and could ptrace
 * us anyway, but a buggy or hostile one still cannot make us read or
 * write out of bounds: counters that disagree (more in flight than the
 * ring holds) end the connection with -EPROTO, and every copy is masked
 * into the ring.
 *
 * A call shows its counter a quarter ring at a time and at its end, so
 * one that fails midway leaves what it moved since unshown: the
 * connection must end (every caller's does on any failure), never call
 * again in that direction.
 *
 * Errors: 0 or a negative errno with one line in err (errlen bytes), in
 * the words of net/sock.c's reads and writes ("peer closed the connection
 * after 10 of 100 bytes", "read timed out after ..."). Every failure ends
 * the connection. */
#ifndef PSTRAIN_NET_RING_H
#define PSTRAIN_NET_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define RING_MUST_CHECK __attribute__((warn_unused_result))

/* Each direction's bytes: larger than a worker's share of the MLP's
 * tensors per ps, so a push rarely waits for the reader, and small enough
 * to stay in the last-level cache. */
#define RING_BYTES_DEFAULT (2u << 20)
#define RING_BYTES_MIN (64u << 10)
#define RING_BYTES_MAX (64u << 20)
/* The offer: "PSRING1" and a NUL, the ring's bytes (u32 LE), 0 (u32). */
#define RING_OFFER_BYTES 16u

struct ring_side;

/* One end of a ring, the caller's (zeroed: none). */
struct ring {
	uint8_t *map;            /* the shared pages (NULL: no ring) */
	size_t map_len;
	size_t cap;              /* each direction's data bytes (a power of two) */
	struct ring_side *tx, *rx; /* the counters of what we write, of what we read */
	uint8_t *txd, *rxd;      /* their data */
	int tx_data, tx_space;   /* eventfds: we wake the peer's reader; the peer wakes our writer */
	int rx_data, rx_space;   /* the peer wakes our reader; we wake the peer's writer */
	int fd;                  /* the connection's socket (not ours to close) */
	atomic_int shut_rd, shut_wr; /* ring_shutdown's, from any thread */
};

/* Client: makes a ring of cap bytes a direction (0: RING_BYTES_DEFAULT)
 * for the Unix socket fd, sends the offer and waits up to timeout_ms for
 * the answer. 0: the ring carries the connection from now on; 1: it does
 * not, why in err (the ps said no, or the ring could not be made, and
 * was offered as none): r stays empty, stay on the socket; negative: the
 * offer could not be sent or answered (the connection is lost), or cap
 * is out of range (-EINVAL, nothing sent). */
RING_MUST_CHECK int ring_offer(struct ring *r, int fd, size_t cap, int timeout_ms, char *err,
			       size_t errlen);

/* Server: reads the offer from fd within timeout_ms, checks what came with
 * it and maps it, and answers. 0: the ring carries the connection; 1: it
 * was not usable (why in err, for the log), answered no, stay on the
 * socket; negative: the offer was not there or malformed (the connection
 * is lost). */
RING_MUST_CHECK int ring_accept(struct ring *r, int fd, int timeout_ms, char *err, size_t errlen);

/* sock_read_iov and sock_write_iov through the ring: the same contract
 * (1..SOCK_IOV_MAX parts, one deadline of timeout_ms for all of it). */
RING_MUST_CHECK int ring_read_iov(struct ring *r, const struct iovec *iov, int n, int timeout_ms,
				  char *err, size_t errlen);
RING_MUST_CHECK int ring_write_iov(struct ring *r, const struct iovec *iov, int n, int timeout_ms,
				   char *err, size_t errlen);

/* From any thread: as shutdown(2) on the socket (SHUT_RD, SHUT_WR,
 * SHUT_RDWR) for what waits in the ring: the shut halves fail at once,
 * and a reader or writer asleep wakes. The caller shuts the socket too. */
void ring_shutdown(struct ring *r, int how);

/* Unmaps and closes the eventfds (not the socket); r is empty again. */
void ring_free(struct ring *r);

#endif
