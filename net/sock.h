/* TCP plumbing with deadlines: listen, accept, connect with retry, and
 * reads and writes that either transfer every byte or fail within one
 * overall deadline; and the Unix socket through which a worker reaches a
 * ps on its own host (the end of this file). No crypto (net/frame.c seals what goes through here; the
 * sock_*_frame and sock_read_placed helpers, in net/sockframe.c, only call
 * frame.h's API), no printing, no exit, no global state.
 *
 * Conventions of every function here:
 *   - Returns 0 (or a non-negative value where said) or a negative errno,
 *     with a one-line reason in err (errlen bytes; err may be NULL when errlen
 *     is 0).
 *   - Every socket this module creates (listening, accepted, connected) is
 *     close-on-exec, non-blocking, and TCP sockets have TCP_NODELAY (small
 *     messages such as ACK must not wait for Nagle). Waiting is done with
 *     poll() against a deadline on CLOCK_MONOTONIC, never by blocking in
 *     read/write, so a stalled or vanished peer costs a bounded time and an
 *     event loop can use the same fds.
 *   - timeout_ms < 0 means no deadline; 0 means "only what is possible now".
 *   - Writes never raise SIGPIPE: send() is called with MSG_NOSIGNAL (Linux),
 *     so writing to a closed peer is the error -EPIPE, never a signal.
 *   - A host is an IPv4 literal, an IPv6 literal (with or without [ ]), or a
 *     host name (letters, digits, '-', '.', '_'). Anything else is refused
 *     with -EINVAL before any resolver is asked. Names are resolved with
 *     getaddrinfo(), which blocks and is not bounded by our deadlines.
 *
 * The read/write helpers work on any stream socket, including a socketpair
 * and a blocking socket (they pass MSG_DONTWAIT per call), but not on pipes
 * or files (send/recv need a socket). */
#ifndef PSTRAIN_NET_SOCK_H
#define PSTRAIN_NET_SOCK_H

#include <stddef.h>
#include <signal.h>
#include <stdint.h>
#include <sys/types.h>

#include "frame.h"

#define SOCK_MUST_CHECK __attribute__((warn_unused_result))

/* The deadline timeout_ms from now on CLOCK_MONOTONIC (INT64_MAX: none,
 * for timeout_ms < 0), and the timeout left until it (-1: none, 0: it
 * has passed): one deadline over several calls. */
int64_t sock_deadline(int timeout_ms);
int sock_ms_left(int64_t deadline);

/* Longest "host:port" / "[v6]:port" text sock_accept writes (with the NUL). */
#define SOCK_ADDR_STRLEN 64

/* Backoff of sock_connect_retry: the pause after a failed attempt starts at
 * SOCK_BACKOFF_MIN_MS and doubles up to SOCK_BACKOFF_MAX_MS; each pause is
 * drawn uniformly from [pause/2, pause] so that many workers started at once
 * do not knock in lockstep. */
#define SOCK_BACKOFF_MIN_MS 50
#define SOCK_BACKOFF_MAX_MS 2000

/* Binds and listens on host:port. host NULL, "" or "*" means the wildcard
 * address (the first one getaddrinfo's AI_PASSIVE offers). port 0 lets the kernel choose (read
 * it back with sock_local_port). backlog <= 0 means SOMAXCONN. SO_REUSEADDR
 * is set so a restarted ps can rebind while old connections sit in
 * TIME_WAIT. Tries each resolved address in turn; the first that binds wins.
 * Errors: -EINVAL (bad host), -ENOENT (unknown host name), -EAGAIN (name
 * resolution failed temporarily), or bind/listen's errno (-EADDRINUSE,
 * -EADDRNOTAVAIL, -EACCES...), with "cannot listen on HOST:PORT: reason". */
SOCK_MUST_CHECK int sock_listen(const char *host, uint16_t port, int backlog, int *fd,
				char *err, size_t errlen);

/* The local port a socket is bound to (1..65535), or a negative errno. */
int sock_local_port(int fd);

/* Accepts one connection on a listening socket from sock_listen, waiting up
 * to timeout_ms. Sets *fd to the new (non-blocking, close-on-exec,
 * TCP_NODELAY) socket and, when peer is not NULL, writes the peer's
 * "addr:port" into peer (peerlen bytes, SOCK_ADDR_STRLEN is enough) for
 * logs. -EAGAIN when timeout_ms is 0 and nobody is waiting, -ETIMEDOUT when
 * the deadline passed, or accept's errno. A connection the peer aborted
 * before we accepted it (ECONNABORTED) is skipped, not reported. */
SOCK_MUST_CHECK int sock_accept(int lfd, int timeout_ms, int *fd, char *peer, size_t peerlen,
				char *err, size_t errlen);

/* sock_accept, and the peer's source in source (SOCK_SOURCE_BYTES; may be
 * NULL): its IPv4 address, or its IPv6 /64, as bytes to compare, for
 * limits per source address. */
#define SOCK_SOURCE_BYTES 16
SOCK_MUST_CHECK int sock_accept_from(int lfd, int timeout_ms, int *fd, char *peer,
				     size_t peerlen, uint8_t source[SOCK_SOURCE_BYTES], char *err,
				     size_t errlen);

/* How long, in ms, the kernel has received no data on the TCP connection
 * fd (TCP_INFO's last_data_recv), whoever is reading it; -ENOTCONN once the
 * connection is no longer established (the peer closed or reset it), or
 * another negative errno. Tells a live peer, which sends at least every
 * heartbeat, from a dead one without reading its socket. A Unix socket
 * has no such clock: 0 while its peer keeps it open, -ENOTCONN once the
 * peer closed it (its process ended). */
int sock_quiet_ms(int fd);

/* Connects to host:port, retrying with backoff (see SOCK_BACKOFF_*) until
 * timeout_ms has passed, so processes may start in any order. One attempt
 * tries every resolved address; an attempt waits at most the time left. A
 * host that is not a valid name or literal (-EINVAL), a name the resolver
 * says does not exist (-ENOENT) and port 0 (-EINVAL) fail at once; refused,
 * unreachable or timed-out connections and temporary resolver failures are
 * retried. On timeout returns the last attempt's error (-ECONNREFUSED,
 * -ETIMEDOUT, -EHOSTUNREACH, ...) with the message
 *     cannot reach 127.0.0.1:2222 after 60 s: Connection refused
 * which the caller may prefix with the peer's role ("ps 1: "). */
SOCK_MUST_CHECK int sock_connect_retry(const char *host, uint16_t port, int timeout_ms, int *fd,
				       char *err, size_t errlen);
/* sock_connect_retry that also ends, with -EINTR ("interrupted while
 * connecting to HOST:PORT"), as soon as *stop is set (a signal handler's
 * flag; its signal cuts any wait short): a worker told to stop while a ps
 * is down must not keep trying for the rest of peer_timeout. stop may be
 * NULL. */
SOCK_MUST_CHECK int sock_connect_until(const char *host, uint16_t port, int timeout_ms,
				       const volatile sig_atomic_t *stop, int *fd, char *err,
				       size_t errlen);

/* sock_connect_until that first tries the Unix socket at unix_path (NULL:
 * none) at every attempt, and takes the first of the two that connects:
 * for a ps that may be on this host (sock_unix_path). Tell which one it
 * got with sock_is_unix. */
/* *fd is a TCP connection just made to a ps whose Unix socket, at
 * unix_path (NULL: none), did not answer a moment before. A ps listens
 * there before it listens on TCP, so a worker whose Unix try came just
 * before the ps's listen and whose TCP try just after has the wrong one:
 * if the Unix socket answers now, *fd becomes it and the TCP connection
 * is closed (1), which that ps tallies as one "closed before a whole
 * greeting"; else *fd is left as it is (0). */
int sock_prefer_unix(const char *unix_path, int *fd);

SOCK_MUST_CHECK int sock_connect_local_until(const char *unix_path, const char *host,
					     uint16_t port, int timeout_ms,
					     const volatile sig_atomic_t *stop, int *fd, char *err,
					     size_t errlen);

/* Unix sockets, for a worker and a ps on one host ([cluster] local_socket,
 * docs/NETWORK.md): their frames are not encrypted (net/frame.h,
 * FRAME_LOCAL), which is sound only because nobody but this user (and
 * root) can reach the directory they are in. */

/* 1 if fd is a Unix socket, 0 if not (TCP, or not a socket). */
int sock_is_unix(int fd);

/* 1 if fd is a Unix socket whose peer (the process that connected, or
 * the one that listened) runs as this process's effective user
 * (SO_PEERCRED), else 0. What lets a connection go unencrypted: it holds
 * whatever happens to the directory, so a socket that another user got
 * into the path (a parent they may write, a link swapped between check
 * and use) only ever carries sealed frames. */
int sock_is_unix_same_user(int fd);

/* The path of the Unix socket of the ps at host:port in dir:
 * "DIR/ps-HOST:PORT.sock". -ENAMETOOLONG past the 107 bytes a Unix socket
 * path may have. */
int sock_unix_path(char *out, size_t outlen, const char *dir, const char *host, uint16_t port,
		   char *err, size_t errlen);

/* Which file a Unix socket path named at some moment (when
 * sock_listen_unix bound it, when a greeting on it failed). */
struct sock_unix_file {
	dev_t dev;
	ino_t ino;
};

/* The file at path now (lstat: the path itself, not what a link points
 * to) in *f; 0, or lstat's negative errno. */
int sock_unix_file_of(const char *path, struct sock_unix_file *f);

/* 1 if path names f now, else 0 (also when nothing is there). */
int sock_unix_file_is(const char *path, const struct sock_unix_file *f);

/* Binds and listens on the Unix socket path (non-blocking, close-on-exec),
 * and puts the socket file it made in *file (may be NULL) for
 * sock_unlink_unix. A socket file left there is replaced if nobody
 * listens on it (-EADDRINUSE if somebody does); any other file there is
 * -EEXIST. */
SOCK_MUST_CHECK int sock_listen_unix(const char *path, int *fd, struct sock_unix_file *file,
				     char *err, size_t errlen);

/* Removes path if it is still *file, the socket file sock_listen_unix
 * made; best called while that socket still listens, since until it
 * closes nobody else binds the path. 0 removed; -ESTALE: another file is
 * there now (a socket a second process bound after ours was removed, or
 * anything else), left alone; -ENOENT: nothing is there; or lstat's or
 * unlink's errno. */
int sock_unlink_unix(const char *path, const struct sock_unix_file *file);

/* Reads exactly len bytes into buf. recv() may return fewer bytes than
 * asked (whatever has arrived) or fail with EINTR/EAGAIN; this loops, waiting
 * in poll() for what is left of ONE deadline of timeout_ms for the whole
 * call (not per chunk). Returns 0, or:
 *   -EPIPE       the peer closed the connection (EOF) before len bytes
 *                ("peer closed the connection after 10 of 100 bytes")
 *   -ETIMEDOUT   the deadline passed; how many bytes arrived is in err
 *   -ECONNRESET  the peer reset the connection; or recv's other errno
 * On failure the contents of buf are unspecified and the stream position is
 * lost: the caller must close the connection. */
SOCK_MUST_CHECK int sock_read_full(int fd, void *buf, size_t len, int timeout_ms, char *err,
				   size_t errlen);

/* Writes exactly len bytes from buf, the mirror of sock_read_full: send()
 * may accept fewer bytes than offered (the socket buffer is full), so this
 * loops with poll() against one deadline. Returns 0, or -EPIPE (the peer has
 * closed; no SIGPIPE is raised), -ECONNRESET, -ETIMEDOUT (the peer stopped
 * reading), or send's other errno. On failure an unknown prefix of buf has
 * been sent: the caller must close the connection. */
/* sock_read_full into the n parts of iov (1..SOCK_IOV_MAX) in order,
 * within one deadline: its errors, and -EINVAL for n out of range. */
SOCK_MUST_CHECK int sock_read_iov(int fd, const struct iovec *iov, int n, int timeout_ms,
				  char *err, size_t errlen);

SOCK_MUST_CHECK int sock_write_full(int fd, const void *buf, size_t len, int timeout_ms,
				    char *err, size_t errlen);

/* Where a connection's bytes go: its socket, or, once a local connection
 * set one up, the ring in memory it shares with its peer (net/ring.h),
 * the socket beside it. The frame functions below take one; SOCK_FD(fd)
 * is a socket's. */
struct ring;
struct sock_stream {
	int fd;
	struct ring *ring; /* NULL: the socket */
};
#define SOCK_FD(f) (&(const struct sock_stream){ .fd = (f), .ring = NULL })

/* sock_read_iov and sock_write_iov on a stream. */
SOCK_MUST_CHECK int sock_stream_read_iov(const struct sock_stream *st, const struct iovec *iov,
					 int n, int timeout_ms, char *err, size_t errlen);
SOCK_MUST_CHECK int sock_stream_write_iov(const struct sock_stream *st, const struct iovec *iov,
					  int n, int timeout_ms, char *err, size_t errlen);

/* Seals msg (len <= FRAME_MAX bytes) with tx (frame_seal) into buf (cap
 * bytes, at least FRAME_SEALED_BYTES(len); FRAME_BYTES_MAX always fits) and
 * writes the frame. msg may be buf + FRAME_HDR_BYTES. frame_seal's or
 * sock_write_full's error. */
SOCK_MUST_CHECK int sock_write_frame(const struct sock_stream *st, struct frame_key *tx, uint8_t *buf, size_t cap,
				     const uint8_t *msg, size_t len, int timeout_ms, char *err,
				     size_t errlen);

/* Writes the n parts of iov (1..SOCK_IOV_MAX) in order, as one stream of
 * bytes, within one deadline: sock_write_full is its one-part case, and
 * its errors are these, plus -EINVAL for n out of range. */
#define SOCK_IOV_MAX 4
SOCK_MUST_CHECK int sock_write_iov(int fd, const struct iovec *iov, int n, int timeout_ms,
				   char *err, size_t errlen);

/* sock_write_frame of the message head || body (frame_seal_parts): head
 * may be buf + FRAME_HDR_BYTES, body is read where it is. */
SOCK_MUST_CHECK int sock_write_frame_parts(const struct sock_stream *st, struct frame_key *tx, uint8_t *buf, size_t cap,
					   const uint8_t *head, size_t hlen, const uint8_t *body,
					   size_t blen, int timeout_ms, char *err, size_t errlen);

/* Reads one frame within timeout_ms: its 4-byte header, which is bounded
 * with frame_check_len before anything more is read, then the ciphertext
 * into buf (cap bytes; FRAME_CT_MAX always fits, a larger frame than cap is
 * -ENOBUFS), then opens it in place with rx. On success the message is the
 * first *msglen bytes of buf. Errors are sock_read_full's, frame_check_len's
 * or frame_open's: every one of them ends the connection. */
SOCK_MUST_CHECK int sock_read_frame(const struct sock_stream *st, struct frame_key *rx, uint8_t *buf, size_t cap,
				    size_t *msglen, int timeout_ms, char *err, size_t errlen);

/* The first half of sock_read_frame, for a caller that opens the frame
 * later (net/pipe.c opens on another thread): reads the header into hdr,
 * bounds it, and reads the *ctlen ciphertext bytes into buf (cap bytes),
 * all within timeout_ms. Nothing is authenticated yet. Errors as for
 * sock_read_frame, less frame_open's. */
SOCK_MUST_CHECK int sock_read_sealed(const struct sock_stream *st, uint8_t hdr[FRAME_HDR_BYTES], uint8_t *buf,
				     size_t cap, size_t *ctlen, int timeout_ms, char *err,
				     size_t errlen);

/* Where a frame's message goes, for a receiver that knows what comes
 * next: its first `head` bytes into the buffer, and the rest, when
 * where(ctx, head bytes, mlen) names a place for the mlen - head bytes
 * of a message of mlen (> head) bytes, having seen its head, there; NULL
 * keeps it all in the buffer. The head where sees is not authenticated
 * yet (a local frame's never is; a sealed one's is checked after its
 * values are in place): where must be safe for any bytes, and the caller
 * checks the head again once the read returns. */
struct sock_place {
	size_t head;
	uint8_t *(*where)(void *ctx, const uint8_t *head, size_t mlen);
	void *ctx;
};

/* The most bytes a sealed frame's head may have for a place. */
#define SOCK_PLACE_HEAD_MAX 64u

/* sock_read_frame with the message's bytes past pl->head put straight
 * where pl says: read there (FRAME_LOCAL) or opened there (AEGIS-256, the
 * head opened ahead for where to see; pl->head <= SOCK_PLACE_HEAD_MAX).
 * *placed is then that place (and the message's head is in buf), else
 * NULL and the whole message is in buf (always, for the other ciphers).
 * *msglen: the message's length either way. On failure what was read is
 * zeroed, buf's head and the place's bytes. Errors as sock_read_frame's,
 * frame_open_tag's or frame_open_split's for a placed message. */
SOCK_MUST_CHECK int sock_read_placed(const struct sock_stream *st, struct frame_key *rx, uint8_t *buf, size_t cap,
				     const struct sock_place *pl, uint8_t **placed, size_t *msglen,
				     int timeout_ms, char *err, size_t errlen);

/* 1 if host (a name or an address) resolves to an address of one of this
 * host's interfaces, 0 if not, or -ENOENT (it does not resolve) or another
 * negative errno with one line in err. For the warning a worker gives when
 * its own entry in [cluster] workers is not this host. */
int sock_is_own_address(const char *host, char *err, size_t errlen);

#endif
