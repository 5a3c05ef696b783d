/* One authenticated connection: its socket, session keys, the buffers and
 * pipe its frames go through, a send lock, and a state (pending before the
 * handshake, authenticated after it, closing once shut down). The client
 * and server handshakes, sending and receiving one message, and sending
 * and receiving a chunked tensor are here, so the ps and worker roles never
 * compute a frame offset or capacity.
 *
 * Buffers and pipe are the caller's, so that connections one thread uses
 * in turn (a worker's links to every ps) can share them: rbuf holds the
 * last message received, wbuf (the pipe's first frame buffer) the frame
 * being sent. Sends take the connection's lock, so another thread (a
 * heartbeat sender) may send on it too; receives are one thread's.
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

#include "frame.h"
#include "handshake.h"
#include "msg.h"
#include "pipe.h"
#include "sndbuf.h"

/* A buffer for any one frame to send (CONN_WBUF_BYTES) and for any one
 * frame received (CONN_RBUF_BYTES: the ciphertext, opened in place). */
#define CONN_WBUF_BYTES FRAME_BYTES_MAX
#define CONN_RBUF_BYTES FRAME_CT_MAX
/* A frame buffer for a message of at most len bytes. */
#define CONN_FRAME_BYTES(len) FRAME_SEALED_BYTES(len)

/* Where the message goes in a frame buffer, and how long it may be in one
 * of cap bytes: the frame's header comes first and the tag after it. */
static inline uint8_t *conn_msg(uint8_t *buf)
{
	return buf + FRAME_HDR_BYTES;
}

static inline size_t conn_msg_cap(size_t cap)
{
	return cap - FRAME_HDR_BYTES - FRAME_TAG_BYTES;
}

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

struct conn {
	int fd;                  /* -1: none; changes only under mu, by the owner */
	_Atomic(enum conn_state) state; /* conn_shutdown sets it from any thread */
	struct conn_keys *keys;  /* the session keys: conn_init's, never NULL after
				  * it succeeded; all zero but while authenticated */
	struct {
		struct hs_identity peer;
	} hr;                    /* the handshake's result but its keys: the peer,
				  * once authenticated */
	uint8_t *rbuf;           /* (rcap) the caller's */
	uint8_t *wbuf;           /* (wcap) the caller's; pp's first frame */
	size_t rcap, wcap;       /* CONN_RBUF_BYTES, CONN_WBUF_BYTES unless the caller
				  * sets smaller ones (no pipe, small messages only:
				  * a longer frame is refused unread, -ENOBUFS) */
	struct pipe *pp;         /* the caller's: tensors sent, and received unless rpp */
	struct pipe *rpp;        /* NULL, or the caller's pipe for tensors received, so
				  * that one thread can receive while another sends */
	pthread_mutex_t mu;      /* sends: fd, keys->send, last_send, state */
	double last_send;        /* CLOCK_MONOTONIC seconds of the last frame sent */
	int said_error;          /* the last message sent was an ERROR (under mu) */
	struct sndbuf sb;        /* the socket's send buffer ([cluster] send_buffer_kib),
				  * under mu; zeroed by conn_close */
	int read_ms, write_ms;   /* deadline of one read; of one frame's write */
};

/* A pending connection over fd (-1: none yet; a server passes the accepted
 * socket, which the connection owns from now on) and the caller's buffers
 * and pipe (rbuf and wbuf may be set later, before the first frame).
 * Allocates the key pages: -ENOMEM if they cannot be had (the connection
 * is still valid, owns fd, and must be conn_destroyed; its handshakes then
 * fail with -ENOMEM), else 0. */
int conn_init(struct conn *cn, int fd, uint8_t *rbuf, uint8_t *wbuf, struct pipe *pp,
	      int read_ms, int write_ms);
/* Closes, wipes and frees the keys; the mutex goes. Accepts a connection
 * conn_init never saw only if it is zeroed. */
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

/* Sends the len-byte message at conn_msg(cn->wbuf). */
int conn_send(struct conn *cn, size_t len, char *err, size_t errlen);

/* Sends the len-byte message at conn_msg(buf) (buf: cap bytes, the
 * caller's) if nothing was sent for idle_s seconds: a keep-alive from
 * another thread. 1 if sent, 0 if not due (or not authenticated). */
int conn_send_idle(struct conn *cn, uint8_t *buf, size_t cap, size_t len, double idle_s,
		   char *err, size_t errlen);

/* Sends the len-byte message at conn_msg(buf) (buf: cap bytes, the
 * caller's): for a thread that sends beside the one that owns wbuf. */
int conn_send_from(struct conn *cn, uint8_t *buf, size_t cap, size_t len, char *err,
		   size_t errlen);

/* ERROR(code, text) as the last message on a connection, best effort;
 * conn_send_error_from encodes it in buf (cap bytes) instead of wbuf.
 * Nothing is sealed on the connection after it (CONN_CLOSING); its owner
 * conn_lingers before it closes. */
void conn_send_error(struct conn *cn, uint32_t code, const char *text);
void conn_send_error_from(struct conn *cn, uint8_t *buf, size_t cap, uint32_t code,
			  const char *text);

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

/* Reads one message into cn->rbuf within read_ms: its length in *len. */
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
};

/* Sends the whole tensor t on the pipe (its frames sealed on the pool). */
int conn_send_tensor(struct conn *cn, const struct conn_chunk_tx *t, char *err, size_t errlen);

/* Takes the message in cn->rbuf (len bytes) as the next chunk of x. */
int conn_take_chunk(struct conn *cn, struct conn_chunk_rx *x, size_t len, char *err,
		    size_t errlen);

/* Receives the rest of x's tensor on the pipe (rpp if set; opened on the
 * pool): as many frames as full chunks can complete it. */
int conn_recv_rest(struct conn *cn, struct conn_chunk_rx *x, char *err, size_t errlen);

#endif
