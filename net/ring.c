/* A connection's bytes through shared memory (net/ring.h has the why and
 * the protocol). */
#include "ring.h"
#include "sock.h"
#include "../base/err.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define RING_HEAD_PAGE 4096u
#define RING_FDS 5
static const char RING_MAGIC[8] = "PSRING1";

/* One direction's counters: the writer's and the reader's on lines of
 * their own, so that neither end's stores bounce the other's line. A
 * sleeper's flag and its wake_at, the peer's count at which to wake it,
 * sit in the line of the counter it waits on. wake_at came after the
 * first layout, in the lines' spare bytes: a peer without it never sets
 * it (0: wake at any progress, as before) and never reads ours (it wakes
 * us at any progress, and we look and sleep again). */
struct ring_side {
	_Alignas(64) _Atomic uint64_t head; /* bytes written */
	atomic_uint reader_sleeps;
	_Atomic uint64_t reader_wake_at;
	_Alignas(64) _Atomic uint64_t tail; /* bytes read */
	atomic_uint writer_sleeps;
	_Atomic uint64_t writer_wake_at;
};
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
	       "counters shared between processes must be lock-free");
_Static_assert(2 * sizeof(struct ring_side) <= RING_HEAD_PAGE, "both sides' counters fit a page");

static int cap_ok(uint64_t cap)
{
	return cap >= RING_BYTES_MIN && cap <= RING_BYTES_MAX && (cap & (cap - 1)) == 0;
}

static void ring_clear(struct ring *r, int fd)
{
	memset(r, 0, sizeof(*r));
	r->tx_data = r->tx_space = r->rx_data = r->rx_space = -1;
	r->fd = fd;
}

void ring_free(struct ring *r)
{
	if (!r->map)
		return; /* none, or a zeroed struct whose fds are not ours */
	munmap(r->map, r->map_len);
	int fds[] = { r->tx_data, r->tx_space, r->rx_data, r->rx_space };
	for (int i = 0; i < 4; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	ring_clear(r, -1);
}

/* Direction 0 goes from the client to the server; efd[] are each
 * direction's data and space eventfds in that order (the offer's). */
static void ring_wire(struct ring *r, uint8_t *map, size_t cap, int client, const int efd[4])
{
	struct ring_side *side = (struct ring_side *)map;
	int t = client ? 0 : 1;
	r->map = map;
	r->map_len = RING_HEAD_PAGE + 2 * cap;
	r->cap = cap;
	r->tx = &side[t];
	r->rx = &side[1 - t];
	r->txd = map + RING_HEAD_PAGE + (size_t)t * cap;
	r->rxd = map + RING_HEAD_PAGE + (size_t)(1 - t) * cap;
	r->tx_data = efd[2 * t];
	r->tx_space = efd[2 * t + 1];
	r->rx_data = efd[2 * (1 - t)];
	r->rx_space = efd[2 * (1 - t) + 1];
}

static void kick(int efd)
{
	uint64_t one = 1;
	(void)!write(efd, &one, sizeof one); /* full counter: already awake */
}

/* ---- the offer ------------------------------------------------------------ */

/* The memfd of a ring of cap bytes a direction, every page reserved now
 * (a full tmpfs then fails here, not as SIGBUS in a step) and sealed
 * against resizing; -errno. */
static int ring_memfd(size_t len)
{
	int m = memfd_create("pstrain-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (m < 0)
		return -errno;
	int r = ftruncate(m, (off_t)len) == 0 ? fallocate(m, 0, 0, (off_t)len) : -1;
	if (r == 0)
		r = fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	if (r != 0) {
		int e = errno;
		close(m);
		return -e;
	}
	return m;
}

/* The offer of a ring of cap bytes with its descriptors, or of none (cap
 * 0, fds NULL). */
static int send_offer(int fd, size_t cap, const int fds[RING_FDS], int timeout_ms)
{
	uint8_t offer[RING_OFFER_BYTES] = { 0 };
	memcpy(offer, RING_MAGIC, sizeof RING_MAGIC);
	for (int i = 0; i < 4; i++)
		offer[8 + i] = (uint8_t)((uint64_t)cap >> (8 * i));
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * RING_FDS)];
	} u;
	memset(&u, 0, sizeof u);
	struct iovec v = { offer, sizeof offer };
	struct msghdr mh = { .msg_iov = &v, .msg_iovlen = 1 };
	if (fds) {
		mh.msg_control = u.b;
		mh.msg_controllen = sizeof u.b;
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * RING_FDS);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * RING_FDS);
	}
	struct pollfd p = { .fd = fd, .events = POLLOUT };
	for (;;) {
		ssize_t n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n == (ssize_t)sizeof offer)
			return 0;
		if (n >= 0)
			return -EIO; /* a fresh Unix socket takes 16 bytes whole */
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN || poll(&p, 1, timeout_ms) <= 0)
			return -errno;
	}
}

static void close_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/* The ring's memory and eventfds in fds (fds[0] the memfd), mapped at
 * *map: 0, or -errno with nothing left open. */
static int ring_make(size_t len, int fds[RING_FDS], void **map)
{
	int e = 0;
	fds[0] = ring_memfd(len);
	if (fds[0] < 0)
		e = fds[0];
	for (int i = 1; i < RING_FDS && !e; i++)
		if ((fds[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
			e = -errno;
	*map = e ? MAP_FAILED : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (!e && *map == MAP_FAILED)
		e = -errno;
	if (e) {
		close_fds(fds, RING_FDS);
		for (int i = 0; i < RING_FDS; i++)
			fds[i] = -1;
	}
	return e;
}

int ring_offer(struct ring *r, int fd, size_t cap, int timeout_ms, char *err, size_t errlen)
{
	ring_clear(r, fd);
	cap = cap ? cap : RING_BYTES_DEFAULT;
	if (!cap_ok(cap))
		return err_set(err, errlen, -EINVAL, "ring of %zu bytes (a power of two, %u..%u)", cap,
			       RING_BYTES_MIN, RING_BYTES_MAX);
	int fds[RING_FDS] = { -1, -1, -1, -1, -1 };
	void *map = NULL;
	/* A ring we cannot make is still offered, as none (0 bytes, no
	 * descriptors): the ps waits for an offer since our greeting. */
	int made = ring_make(RING_HEAD_PAGE + 2 * cap, fds, &map);
	if (!made)
		ring_wire(r, map, cap, 1, fds + 1);
	int e = send_offer(fd, made ? 0 : cap, made ? NULL : fds, timeout_ms);
	if (!made)
		close(fds[0]); /* the mapping keeps the memory */
	uint8_t yes = 0;
	if (e)
		(void)err_set(err, errlen, e, "cannot offer a ring: %s", strerror(-e));
	else
		e = sock_read_full(fd, &yes, 1, timeout_ms, err, errlen);
	if (!e && !made && yes == 1)
		return 0;
	ring_free(r);
	if (e)
		return e;
	if (yes > 1)
		return err_set(err, errlen, -EPROTO, "ring: answer %u (0 or 1)", yes);
	if (made)
		return err_set(err, errlen, 1, "cannot make a ring: %s", strerror(-made));
	return err_set(err, errlen, 1, "the ps did not take the ring offered (its log says why)");
}

/* Reads the offer's 16 bytes and the fds that came with it (at most
 * RING_FDS: more are closed; fewer leave -1s). */
static int recv_offer(int fd, uint8_t offer[RING_OFFER_BYTES], int fds[RING_FDS], int timeout_ms,
		      char *err, size_t errlen)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * (RING_FDS + 3))];
	} u;
	struct iovec v = { offer, RING_OFFER_BYTES };
	struct msghdr mh = { .msg_iov = &v, .msg_iovlen = 1, .msg_control = u.b,
			     .msg_controllen = sizeof u.b };
	int64_t deadline = sock_deadline(timeout_ms);
	ssize_t n;
	for (;;) {
		n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n >= 0 || (errno != EAGAIN && errno != EINTR))
			break;
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int left = sock_ms_left(deadline);
		if (left == 0 || (poll(&p, 1, left) < 0 && errno != EINTR))
			return err_set(err, errlen, -ETIMEDOUT, "no ring offer within %d ms", timeout_ms);
	}
	if (n < 0)
		return err_set(err, errlen, -errno, "reading the ring offer: %s", strerror(errno));
	int k = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t m = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < m; i++) {
			int f;
			memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
			if (k < RING_FDS)
				fds[k++] = f;
			else
				close(f);
		}
	}
	if (n == 0)
		return err_set(err, errlen, -EPIPE, "peer closed the connection before its ring offer");
	if ((size_t)n < RING_OFFER_BYTES)
		return sock_read_full(fd, offer + n, RING_OFFER_BYTES - (size_t)n,
				      sock_ms_left(deadline), err, errlen);
	return 0;
}

/* 1 if f is an eventfd: the kernel names it so in /proc. */
static int is_eventfd(int f)
{
	char path[64], what[64];
	snprintf(path, sizeof path, "/proc/self/fd/%d", f);
	ssize_t n = readlink(path, what, sizeof what - 1);
	if (n < 0)
		return 0;
	what[n] = 0;
	return strcmp(what, "anon_inode:[eventfd]") == 0;
}

/* What came with an offer of cap bytes, mapped: 0, else why not in err. */
static int ring_take(struct ring *r, uint64_t cap, const int fds[RING_FDS], char *err,
		     size_t errlen)
{
	struct stat st;
	size_t len = RING_HEAD_PAGE + 2 * (size_t)cap;
	int seals = fds[0] >= 0 ? fcntl(fds[0], F_GET_SEALS) : -1;
	if (cap == 0)
		return err_set(err, errlen, -EINVAL, "the worker could not make one (its log says why)");
	if (!cap_ok(cap))
		return err_set(err, errlen, -EINVAL, "a ring of %" PRIu64 " bytes", cap);
	if (fds[0] < 0 || fstat(fds[0], &st) != 0 || !S_ISREG(st.st_mode) ||
	    (uint64_t)st.st_size != len || seals < 0 || !(seals & F_SEAL_SHRINK))
		return err_set(err, errlen, -EINVAL, "its memory is not a sealed memfd of %zu bytes", len);
	for (int i = 1; i < RING_FDS; i++)
		if (fds[i] < 0 || !is_eventfd(fds[i]))
			return err_set(err, errlen, -EINVAL, "its fd %d is not an eventfd", i);
	void *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (map == MAP_FAILED)
		return err_set(err, errlen, -errno, "cannot map it: %s", strerror(errno));
	ring_wire(r, map, (size_t)cap, 0, fds + 1);
	return 0;
}

int ring_accept(struct ring *r, int fd, int timeout_ms, char *err, size_t errlen)
{
	ring_clear(r, fd);
	uint8_t offer[RING_OFFER_BYTES];
	int fds[RING_FDS] = { -1, -1, -1, -1, -1 };
	int e = recv_offer(fd, offer, fds, timeout_ms, err, errlen);
	uint32_t cap = 0, zero = 0;
	for (int i = 0; i < 4; i++) {
		cap |= (uint32_t)offer[8 + i] << (8 * i);
		zero |= (uint32_t)offer[12 + i] << (8 * i);
	}
	if (!e && (memcmp(offer, RING_MAGIC, sizeof RING_MAGIC) != 0 || zero != 0))
		e = err_set(err, errlen, -EPROTO, "not a ring offer");
	if (e) {
		close_fds(fds, RING_FDS);
		return e;
	}
	char why[200];
	int took = ring_take(r, cap, fds, why, sizeof why);
	close(fds[0]);
	if (took)
		close_fds(fds + 1, RING_FDS - 1);
	uint8_t yes = took ? 0 : 1;
	e = sock_write_full(fd, &yes, 1, timeout_ms, err, errlen);
	if (e || took) {
		ring_free(r);
		if (!e)
			(void)err_set(err, errlen, 1, "the ring offered is not usable: %s", why);
		return e ? e : 1;
	}
	return 0;
}

/* ---- reads and writes ----------------------------------------------------- */

/* Sleeps until the peer kicks efd, the socket reports one of events (or
 * hangs up), or the deadline: wake_at and the flag first, then one more
 * look at the peer's counter (it may have moved since the caller's look;
 * the peer stores it, then reads the flag: one of the two sees the
 * other), then poll. The peer kicks only once its counter reaches
 * wake_at (ring_wake). 0: look again; 1: the socket has news;
 * -ETIMEDOUT; or poll's errno. */
static int ring_wait(struct ring *r, int efd, atomic_uint *sleeps, _Atomic uint64_t *wake_at,
		     _Atomic uint64_t *ctr, uint64_t until, short events, int64_t deadline)
{
	atomic_store(wake_at, until);
	atomic_store(sleeps, 1);
	if ((int64_t)(atomic_load(ctr) - until) >= 0) {
		atomic_store(sleeps, 0);
		return 0;
	}
	int left = sock_ms_left(deadline);
	struct pollfd p[2] = { { .fd = efd, .events = POLLIN }, { .fd = r->fd, .events = events } };
	int k = left == 0 ? 0 : poll(p, 2, left);
	atomic_store(sleeps, 0);
	if (k < 0)
		return errno == EINTR ? 0 : -errno;
	if (k == 0)
		return -ETIMEDOUT;
	if (p[0].revents & POLLIN) {
		uint64_t v;
		(void)!read(efd, &v, sizeof v);
	}
	return p[1].revents ? 1 : 0;
}

/* Wakes the peer if it sleeps on the counter we just stored, pos, and
 * pos is as far as it asked (ring_wait's until): a peer short of a whole
 * frame, or of a quarter of the ring's room, is woken once for it, not
 * at every copy. A writer that outran its reader by a ring was woken for
 * each 64 KiB piece the reader freed, and a ps spent about 2 ms of its 6
 * a step of the CNN waking and being woken (perf, 276 switches a step).
 * The peer set until before its flag, so with the flag seen it is seen. */
static void ring_wake(atomic_uint *sleeps, _Atomic uint64_t *wake_at, uint64_t pos, int efd)
{
	atomic_thread_fence(memory_order_seq_cst);
	if (!atomic_load_explicit(sleeps, memory_order_acquire))
		return;
	if ((int64_t)(pos - atomic_load_explicit(wake_at, memory_order_relaxed)) < 0)
		return;
	if (atomic_exchange(sleeps, 0))
		kick(efd);
}

/* Stores our counter, which the peer may act on at once, and wakes it. */
static void ring_show(_Atomic uint64_t *mine, uint64_t pos, atomic_uint *sleeps, _Atomic uint64_t *wake_at,
		      int efd)
{
	atomic_store_explicit(mine, pos, memory_order_release);
	ring_wake(sleeps, wake_at, pos, efd);
}

static size_t iov_len(const struct iovec *iov, int n)
{
	size_t len = 0;
	for (int i = 0; i < n; i++)
		len += iov[i].iov_len;
	return len;
}

/* The socket was readable while the ring was empty: the peer closed (or
 * we shut the reading half), or it wrote bytes there, which a ring's
 * socket never carries. */
static int ring_sock_news(int fd, size_t done, size_t len, char *err, size_t errlen)
{
	uint8_t b;
	ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	if (n == 0)
		return err_set(err, errlen, -EPIPE, "peer closed the connection after %zu of %zu bytes",
			       done, len);
	if (n > 0)
		return err_set(err, errlen, -EPROTO, "bytes on the socket of a ring");
	if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
		return 0;
	return err_set(err, errlen, -errno, "read failed after %zu of %zu bytes: %s", done, len,
		       strerror(errno));
}

/* ring_read_iov and ring_write_iov: one loop, the counters' roles
 * swapped. Ours (the reader's tail, the writer's head) only we move; the
 * peer's we read each turn, and whatever it says, a copy stays inside the
 * ring: more in flight than the ring holds is -EPROTO. */
static int ring_move(struct ring *r, const struct iovec *iov, int n, int timeout_ms, int writing,
		     char *err, size_t errlen)
{
	const char *verb = writing ? "write" : "read";
	if (n < 1 || n > SOCK_IOV_MAX)
		return err_set(err, errlen, -EINVAL, "%s of %d parts (1..%d)", verb, n, SOCK_IOV_MAX);
	struct ring_side *s = writing ? r->tx : r->rx;
	_Atomic uint64_t *mine = writing ? &s->head : &s->tail, *theirs = writing ? &s->tail : &s->head;
	atomic_uint *sleeps = writing ? &s->writer_sleeps : &s->reader_sleeps;
	atomic_uint *wakes = writing ? &s->reader_sleeps : &s->writer_sleeps;
	_Atomic uint64_t *my_wake = writing ? &s->writer_wake_at : &s->reader_wake_at;
	_Atomic uint64_t *their_wake = writing ? &s->reader_wake_at : &s->writer_wake_at;
	atomic_int *shut = writing ? &r->shut_wr : &r->shut_rd;
	uint8_t *data = writing ? r->txd : r->rxd;
	size_t len = iov_len(iov, n), done = 0, off = 0;
	int64_t deadline = sock_deadline(timeout_ms);
	uint64_t pos = atomic_load_explicit(mine, memory_order_relaxed), shown = pos;
	for (int at = 0; at < n;) {
		size_t want = iov[at].iov_len - off;
		if (want == 0) {
			at++;
			off = 0;
			continue;
		}
		if (atomic_load_explicit(shut, memory_order_relaxed))
			return err_set(err, errlen, -EPIPE, "connection shut down after %zu of %zu bytes",
				       done, len);
		uint64_t other = atomic_load_explicit(theirs, memory_order_acquire);
		uint64_t held = writing ? pos - other : other - pos;
		if (held > r->cap)
			return err_set(err, errlen, -EPROTO, "ring out of order: %" PRIu64
				       " bytes in flight, %zu fit", held, r->cap);
		uint64_t ready = writing ? r->cap - held : held;
		if (ready == 0 && shown != pos) {
			ring_show(mine, pos, wakes, their_wake, writing ? r->tx_data : r->rx_space);
			shown = pos;
			continue;
		}
		if (ready == 0) {
			/* A reader wakes for the socket's end (after what is in
			 * the ring); a writer (events 0) only for a hang-up: both
			 * halves shut, the peer gone or we shut it all. */
			/* Wake for what is left of this call, or a quarter of
			 * the ring if more: either comes, since a reader that
			 * blocks has emptied the ring and a writer finishes
			 * what its reader waits for. */
			size_t need = len - done < r->cap / 4 ? len - done : r->cap / 4;
			int w = ring_wait(r, writing ? r->tx_space : r->rx_data, sleeps, my_wake, theirs,
					  other + need, writing ? 0 : POLLIN, deadline);
			if (w == -ETIMEDOUT)
				return err_set(err, errlen, w, "%s timed out after %d ms with %zu of %zu bytes",
					       verb, timeout_ms, done, len);
			if (w < 0)
				return err_set(err, errlen, w, "%s: poll: %s", verb, strerror(-w));
			if (w == 1 && writing)
				return err_set(err, errlen, -EPIPE,
					       "peer closed the connection after %zu of %zu bytes", done, len);
			if (w == 1 && atomic_load(theirs) == other &&
			    (w = ring_sock_news(r->fd, done, len, err, errlen)) < 0)
				return w;
			continue;
		}
		size_t k = want < ready ? want : (size_t)ready;
		size_t at0 = (size_t)(pos & (r->cap - 1)), first = r->cap - at0 < k ? r->cap - at0 : k;
		uint8_t *p = (uint8_t *)iov[at].iov_base + off;
		if (writing) {
			memcpy(data + at0, p, first);
			memcpy(data, p + first, k - first);
		} else {
			memcpy(p, data + at0, first);
			memcpy(p + first, data, k - first);
		}
		pos += k;
		off += k;
		done += k;
		/* Shown a quarter of the ring at a time and at the end, not
		 * at each part (a frame's header, then its body): the peer
		 * wakes once for a frame, and while a long write goes on its
		 * reader still has three quarters of the ring to take. */
		if (pos - shown >= r->cap / 4) {
			ring_show(mine, pos, wakes, their_wake, writing ? r->tx_data : r->rx_space);
			shown = pos;
		}
	}
	if (shown != pos)
		ring_show(mine, pos, wakes, their_wake, writing ? r->tx_data : r->rx_space);
	return 0;
}

int ring_read_iov(struct ring *r, const struct iovec *iov, int n, int timeout_ms, char *err,
		  size_t errlen)
{
	return ring_move(r, iov, n, timeout_ms, 0, err, errlen);
}

int ring_write_iov(struct ring *r, const struct iovec *iov, int n, int timeout_ms, char *err,
		   size_t errlen)
{
	return ring_move(r, iov, n, timeout_ms, 1, err, errlen);
}

void ring_shutdown(struct ring *r, int how)
{
	if (!r->map)
		return;
	if (how == SHUT_RD || how == SHUT_RDWR) {
		atomic_store(&r->shut_rd, 1);
		kick(r->rx_data);
	}
	if (how == SHUT_WR || how == SHUT_RDWR) {
		atomic_store(&r->shut_wr, 1);
		kick(r->tx_space);
	}
}
