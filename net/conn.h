/* One authenticated connection: its socket, session keys, the frame
 * buffers and pipes its frames go through (its own, sized once by
 * conn_init), a send lock, and a state (pending before the handshake,
 * authenticated after it, closing once shut down). The client and server
 * handshakes, sending and receiving one message, and sending and
 * receiving a chunked tensor are here, so the ps and worker roles never
 * compute a frame offset or capacity: a role encodes a message at
 * conn_payload (conn_payload_cap bytes) and sends it with
 * conn_send_payload, and reads what arrived at cn->rbuf.
 *
 * Each thread that sends on a connection has a frame buffer of its own,
 * the message encoded in place where its frame will be sealed (no copy):
 * CONN_MAIN, the owner's, and on a connection shaped for it CONN_SIDE, a
 * second thread's (the ps's streamer, which sends PARAMS and HEARTBEATs
 * while the connection's own thread reads the PUSH and ACKs it). A
 * keep-alive from any other thread (conn_send_idle) brings its message,
 * copied into a frame on that thread's stack. Sends take the connection's
 * lock; receives are one thread's, which may be CONN_MAIN's or not (the
 * shape says which, for the pipes).
 *
 * Errors: 0 or a negative errno with one line in err (errlen bytes), those
 * of net/sock.c, net/handshake.c, net/pipe.c and the msg_* codecs. Any
 * failure but an encoding one ends the connection: conn_close it. A send
 * that fails (a tensor's encoding included: frames before it are out)
 * also puts the connection in CONN_CLOSING at once, under the send lock,
 * so that no other thread seals another frame on it, whatever the counter
 * says, before its owner closes it; receives go on (a ps that closed may
 * have said why before it did). */
#ifndef PSTRAIN_NET_CONN_H
#define PSTRAIN_NET_CONN_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cryptopool.h"
#include "frame.h"
#include "handshake.h"
#include "msg.h"
#include "pipe.h"
#include "ring.h"
#include "sndbuf.h"

/* The longest message a connection carries: a tensor's chunk. */
#define CONN_MSG_MAX ((size_t)FRAME_MAX)
/* The longest keep-alive conn_send_idle sends: a HEARTBEAT. */
#define CONN_IDLE_MAX ((size_t)MSG_HEARTBEAT_BYTES)

/* The threads that send on a connection, each with its own frame buffer
 * (and pipe, if the connection moves tensors). */
enum conn_sender {
	CONN_MAIN, /* the connection's owner: every connection has it */
	CONN_SIDE, /* a second thread, on a CONN_PIPE_SIDE connection only */
	CONN_SENDERS
};

/* Whether a connection moves tensors, and which threads do: a pipe is
 * used by one thread at a time, and each has up to one frame buffer per
 * crypto thread once it runs in parallel, so threads that take turns
 * share one. */
enum conn_pipes {
	CONN_NO_PIPES,  /* messages only (an observer's STATUS and REPORT) */
	CONN_PIPE_ONE,  /* one thread sends and receives tensors: one pipe both
			 * ways, frame 0 CONN_MAIN's buffer (a ps's connection) */
	CONN_PIPE_RECV, /* CONN_MAIN sends tensors while another thread receives
			 * them: a pipe each, the receiver's frame 0 rbuf (a
			 * worker's link) */
	CONN_PIPE_SIDE, /* as CONN_PIPE_ONE, and CONN_SIDE sends tensors on a
			 * pipe of its own (a ps's connection in piece mode) */
};

/* What conn_init sizes a connection for. */
struct conn_shape {
	size_t msg_max;          /* the longest message it sends or receives (a
				  * longer frame is refused unread, -ENOBUFS; a
				  * longer message does not encode); 0, or any
				  * connection with pipes: CONN_MSG_MAX */
	enum conn_pipes pipes;
	struct cryptopool *pool; /* the pipes' crypto threads; NULL: one frame at a time */
};

/* A connection's session keys, in pages of their own: sodium_malloc'd by
 * conn_init (guard pages on both sides, excluded from core dumps, mlocked
 * so they never reach swap as far as RLIMIT_MEMLOCK allows: net/key.c says
 * what happens past it), wiped by conn_close and on every failed
 * handshake, freed by conn_destroy. */
struct conn_keys {
	struct frame_key send, recv;
};

enum conn_state {
	CONN_PENDING,       /* no socket, or one not authenticated yet */
	CONN_AUTHENTICATED, /* the handshake succeeded: frames may flow */
	CONN_CLOSING,       /* shut down (conn_shutdown: every call fails), or a
			     * send failed (part of a frame may be on the
			     * wire): nothing more is sealed on it, while what
			     * the peer sent before stays readable */
};

/* One sending thread's frame buffer and pipe. */
struct conn_tx {
	uint8_t *buf;            /* a frame; its message is the payload */
	struct pipe pp;          /* tensors (frame 0: buf); a zeroed pipe without */
};

struct conn {
	int fd;                  /* -1: none; changes only under mu, by the owner */
	_Atomic(enum conn_state) state; /* conn_shutdown sets it from any thread */
	struct conn_keys *keys;  /* the session keys: conn_init's, never NULL after
				  * it succeeded; all zero but while authenticated */
	struct {
		struct hs_identity peer;
	} hr;                    /* the handshake's result but its keys: the peer,
				  * once authenticated */
	uint8_t *rbuf;           /* the last message received, from its first byte
				  * (the receiving thread's; with CONN_PIPE_RECV
				  * also frame 0 of rpp) */
	struct conn_shape shape; /* as conn_init set it: msg_max 0 only before */
	struct conn_tx tx[CONN_SENDERS]; /* tx[CONN_SIDE] only on CONN_PIPE_SIDE */
	struct pipe rpp;         /* CONN_PIPE_RECV's: tensors received */
	struct pipe *rp;         /* where tensors are received: &rpp, or CONN_MAIN's
				  * pipe; NULL without pipes */
	pthread_mutex_t mu;      /* sends: fd, keys->send, last_send, state */
	double last_send;        /* CLOCK_MONOTONIC seconds of the last frame sent */
	int said_error;          /* the last message sent was an ERROR (under mu) */
	struct sndbuf sb;        /* the socket's send buffer ([cluster] send_buffer_kib),
				  * under mu; zeroed by conn_close */
	int read_ms, write_ms;   /* deadline of one read; of one frame's write */
	struct ring ring;        /* a local connection's bytes, once conn_client
				  * offered and the peer took it (conn_ring_accept):
				  * ring.map NULL while they go through the socket;
				  * freed by conn_close */
	char ring_why[160];      /* why a ring offered or wanted is not used ("" if none) */
};

/* A pending connection over fd (-1: none yet; a server passes the accepted
 * socket, which the connection owns from now on), with the buffers and
 * pipes of shape (NULL: messages of any length, no pipes), kept across
 * conn_close and reconnections. Allocates them and the key pages: -ENOMEM
 * if any cannot be had (the connection is still valid, owns fd, and must
 * be conn_destroyed; its handshakes then fail with -ENOMEM, its sends
 * with -ENOTCONN), else 0. */
int conn_init(struct conn *cn, int fd, const struct conn_shape *shape, int read_ms,
	      int write_ms);
/* Closes, wipes and frees the keys; the buffers, pipes and mutex go.
 * Accepts a connection conn_init never saw only if it is zeroed. */
void conn_destroy(struct conn *cn);

/* Applies [cluster] send_buffer_kib (SNDBUF_AUTO, 0 or KiB: net/sndbuf.h)
 * to the connection's socket, which keeps it until conn_close; under auto,
 * each conn_send_tensor re-measures when it is due. Best effort: a socket
 * that refuses an option keeps the kernel's buffers. */
void conn_send_buffer(struct conn *cn, int kib);

/* Client: the handshake as `me` over fd, a connected socket the
 * connection now owns (closed on failure), each step within hs_ms. who
 * names the server in messages ("ps 1 (host:2223)"). -ENOLINK for a
 * server that closed or timed out without answering (it may have dropped
 * us as one of a flood: worth another try or two), -ECONNABORTED for one
 * that answered wrong or a failed write, -ENOMEM without key pages, or
 * hs_client_start's error. The caller checks cn->hr.peer, and conn_closes a
 * peer it refuses (which wipes the keys). No copy of a key outlives the
 * call but those in cn->keys. */
int conn_client(struct conn *cn, int fd, const uint8_t psk[HS_PSK_BYTES],
		const struct hs_identity *me, int hs_ms, const char *who, char *err,
		size_t errlen);

/* Client: when me->local is HS_LOCAL_RING and the handshake settled on a
 * local connection (both ends Unix sockets of one user), conn_client
 * offers the peer a ring right after it (net/ring.h): the connection's
 * bytes go through it if the peer takes it, else through the socket, why
 * in cn->ring_why. Server: conn_ring_accept, on such a connection, reads
 * the offer and answers it before the first frame (conn_ring_due says
 * whether one is due). 0, or a negative errno (the connection is lost:
 * close it); a ring that could not be used is not an error (ring_why). */
int conn_ring_due(const struct conn *cn);
int conn_ring_accept(struct conn *cn, int timeout_ms, char *err, size_t errlen);

/* Server, when the handshake was done elsewhere (the ps's gate): the
 * connection owns fd and is authenticated with hr's keys, which the caller
 * then wipes. */
void conn_attach(struct conn *cn, int fd, const struct hs_result *hr);

/* Server: reads HELLO1 from the connection's socket within hs_ms and
 * answers it; a peer failing the MAC gets no reply. err: "no handshake:
 * ..." or "handshake refused: ...", or -ENOMEM without key pages. The
 * caller checks cn->hr.peer and conn_closes a peer it refuses. */
int conn_server(struct conn *cn, const uint8_t psk[HS_PSK_BYTES], const struct hs_identity *me,
		int hs_ms, char *err, size_t errlen);

/* Closes the socket and wipes the keys (the pages stay the connection's):
 * pending again, ready for conn_client. */
void conn_close(struct conn *cn);

/* From another thread, without the send lock (a send may hold it while it
 * waits on a stalled peer): shuts the socket down so that every call on
 * the connection fails at once, and marks it closing. The owner still
 * conn_closes it. */
void conn_shutdown(struct conn *cn);

/* From another thread: shuts the sending half only and marks the
 * connection closing, so that a send blocked on a peer that stopped
 * reading fails at once, while what the peer sent can still be read (and
 * thrown away by conn_linger). */
void conn_shutdown_write(struct conn *cn);

/* From another thread: shuts the reading half only, so that a blocked
 * conn_recv returns (as if the peer had closed) while sends still work:
 * for a last message before the owner closes. */
void conn_shutdown_read(struct conn *cn);

/* Where sender s encodes its next message, and how long it may be
 * (the shape's msg_max): the payload of s's frame buffer, sealed where it
 * is (ciphertext after the send: encode each message anew). NULL for a
 * sender the connection has not. */
uint8_t *conn_payload(struct conn *cn, enum conn_sender s);
size_t conn_payload_cap(const struct conn *cn);

/* Sends the len-byte message sender s encoded at conn_payload(cn, s). */
int conn_send_payload(struct conn *cn, enum conn_sender s, size_t len, char *err, size_t errlen);

/* Sends msg (len bytes, at most CONN_IDLE_MAX) if nothing was sent for
 * idle_s seconds: a keep-alive from any thread, sealed on its own stack.
 * 1 if sent, 0 if not due (or not authenticated). */
int conn_send_idle(struct conn *cn, const uint8_t *msg, size_t len, double idle_s, char *err,
		   size_t errlen);

/* ERROR(code, text) from sender s as the last message on a connection,
 * best effort. Nothing is sealed on the connection after it
 * (CONN_CLOSING); its owner conn_lingers before it closes. */
void conn_send_error(struct conn *cn, enum conn_sender s, uint32_t code, const char *text);

/* How long an owner lingers (conn_linger) at most: a worker that was
 * refused half way through a push finishes writing it before it reads the
 * ERROR; a push of a large shard takes a second or so at 1 Gbit/s. */
#define CONN_LINGER_MS 2000

/* The owner, before conn_close, on a connection whose last message was an
 * ERROR (else nothing): shuts the sending half, so that the peer reads the
 * ERROR and then the end, and reads and throws away what the peer still
 * sends until it closes or ms pass. Closing with bytes unread would reset
 * the connection: the peer's writes fail, and a peer that reports the
 * failed write never reads the ERROR saying why. The caller is the only
 * reader, and holds no lock others wait on: this may take ms. */
void conn_linger(struct conn *cn, int ms);

/* Reads one message into cn->rbuf within read_ms: its length in *len. A
 * frame longer than the shape's msg_max is refused unread (-ENOBUFS). */
int conn_recv(struct conn *cn, size_t *len, char *err, size_t errlen);

/* A tensor's chunk messages (PARAMS from a ps, PUSH from a worker):
 * message i is chunk i of src, sent as dtype (enum wire_dtype: 0, float32,
 * unless set; bf16 is rounded from src as it is encoded into each frame,
 * msg_chunks(n, dtype) frames in all). offset: where src starts in the
 * shard (a multiple of msg_chunk_max when a ps sends part of one), added
 * to every chunk's offset. */
struct conn_chunk_tx {
	uint8_t type;
	uint8_t dtype;
	uint32_t shard, worker;
	uint64_t version;
	const float *src; /* (n) */
	const float *base; /* (n) dtype WIRE_F32X: the version the XORs are with */
	uint64_t n;
	uint64_t offset;
};

/* The chunks of a tensor being received: each message must be a chunk of
 * type `type` (from worker `worker` for PUSH) that fits a, in a's dtype
 * (widened into dst as it is taken). An ERROR instead of PARAMS is
 * reported with its text (-ECONNABORTED). bad: the failure was in a
 * message, not in the frames carrying it. */
struct conn_chunk_rx {
	uint8_t type;
	uint32_t worker;
	struct msg_assembly *a;
	float *dst; /* (a->n) */
	int bad;
	/* If set, called with each chunk once its values are in dst (a ps
	 * aggregates a PUSH piece by piece); a negative return ends the
	 * receive with it and err, as a bad message. */
	int (*took)(void *ctx, const struct msg_chunk *c, char *err, size_t errlen);
	/* If set, called with any other message of a known type but ERROR
	 * (a HEARTBEAT while a ps streams PARAMS, the ACK of a push going up
	 * at the same time): 0 takes it and the tensor goes on, a negative
	 * return fails as took's. A receive that took one ends a chunk short:
	 * call conn_recv_rest again until the assembly is done. */
	int (*other)(void *ctx, int type, const uint8_t *msg, size_t len, char *err, size_t errlen);
	void *ctx;
	uint64_t value_bytes; /* the chunks' payloads taken so far, headers not counted */
	uint64_t placed;      /* values read or opened straight into dst
			       * (net/pipe.h pipe_place), not copied there */
	uint64_t base;        /* conn_recv_rest: a->received when it began */
};

/* Sends the whole tensor t on sender s's pipe (its frames sealed on the
 * pool). -EINVAL on a connection without pipes. */
int conn_send_tensor(struct conn *cn, enum conn_sender s, const struct conn_chunk_tx *t, char *err,
		     size_t errlen);

/* Takes the message in cn->rbuf (len bytes) as the next chunk of x. */
int conn_take_chunk(struct conn *cn, struct conn_chunk_rx *x, size_t len, char *err,
		    size_t errlen);

/* Receives the rest of x's tensor on the receiving pipe (opened on the
 * pool): as many frames as full chunks can complete it. */
int conn_recv_rest(struct conn *cn, struct conn_chunk_rx *x, char *err, size_t errlen);

#endif
