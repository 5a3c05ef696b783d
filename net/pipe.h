/* The frames of one multi-chunk tensor on one connection, sealed or opened
 * on several threads (a net/cryptopool.h pool) while they are written or
 * read in order on the connection's own thread.
 *
 * The bytes on the wire are exactly those of sealing and opening one frame
 * at a time (sock_write_frame / sock_read_frame): frame i of a call uses the
 * direction's counter + i as its nonce, the sender writes frame i only after
 * frames 0..i-1, and the receiver opens frame i with the counter it expects
 * for position i. A frame that was modified, truncated, replayed or
 * reordered therefore fails to open exactly as it does one at a time, and
 * the receiver hands no chunk at or after that frame to the caller.
 *
 * Sender: pipe_send asks the caller's encode function for message i (on a
 * pool thread: messages are built in parallel too), seals it with counter
 * base + i, and keeps up to one frame per pool thread plus the one being
 * written in flight. Receiver: pipe_recv reads frames in order, opens them
 * on the pool with their expected counters, and calls the caller's deliver
 * function in order on the calling thread.
 *
 * Without a pool, with a one-thread pool, for a single frame, or for
 * local frames (FRAME_LOCAL: nothing to seal or open), both run today's
 * path: one frame at a time on the calling thread, in the caller's
 * buffer. With a pool of T threads a pipe allocates up to T more frame
 * buffers (FRAME_BYTES_MAX each, 64 KiB; no more than the longest tensor
 * it moved has frames, less one) when it first runs in parallel, and keeps
 * them until pipe_free; and, at pipe_init, one guarded page for the
 * jobs' key copies.
 *
 * A pipe is used by one thread at a time; its connection's frame_keys must
 * not be used by anyone else during a call. Errors: 0 or a negative errno
 * with one line in err (errlen bytes): the encode or deliver function's own
 * return and message, or those of sock_write_full, sock_read_sealed,
 * frame_seal and frame_open ("frame 17 failed authentication ..."). Every
 * failure ends the connection: the caller must close it. */
#ifndef PSTRAIN_NET_PIPE_H
#define PSTRAIN_NET_PIPE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cryptopool.h"
#include "frame.h"
#include "sock.h"

#define PIPE_MUST_CHECK __attribute__((warn_unused_result))

struct pipe_slot;

struct pipe {
	struct cryptopool *pool; /* NULL or 1 thread: one frame at a time */
	uint8_t *buf;            /* the caller's (FRAME_BYTES_MAX bytes) */
	struct pipe_slot *slots; /* parallel only, from the first use */
	int nslots;
	struct frame_key *keys;  /* (pool threads + 1) parallel only: each job's
				  * copy of the direction's key, sodium_malloc'd
				  * by pipe_init (guarded, mlocked as far as
				  * RLIMIT_MEMLOCK allows, see net/key.c); all
				  * zero but while a job runs */
	pthread_cond_t wake;     /* this pipe's jobs are done */
};

/* What an encode function made: message i is the len bytes it wrote at
 * msg, then blen bytes at body (NULL and 0 unless it sets them: a
 * tensor's values sealed or written from where they are, not copied after
 * their header first; they must not change before pipe_send returns). */
struct pipe_msg {
	size_t len;
	const uint8_t *body;
	size_t blen;
};

/* Writes message i (0 <= i < nframes) of the tensor at msg (at most cap
 * bytes, cap >= FRAME_MAX) and sets m. Called on pool threads, several at
 * once and in any order: it may only read shared data and write msg. */
typedef int (*pipe_encode_fn)(void *ctx, uint64_t i, uint8_t *msg, size_t cap, struct pipe_msg *m,
			      char *err, size_t errlen);

/* Takes message i (len bytes at msg, valid only during the call), in order
 * i = 0, 1, ... on the thread that called pipe_recv. A negative return
 * ends pipe_recv with that return and err. */
typedef int (*pipe_deliver_fn)(void *ctx, uint64_t i, const uint8_t *msg, size_t len,
			       char *err, size_t errlen);

/* pool may be NULL. buf (bufcap >= FRAME_BYTES_MAX bytes) stays the
 * caller's; the pipe uses it as its first frame buffer. -EINVAL if bufcap
 * is too small, -ENOMEM if a pool's key pages cannot be had. */
PIPE_MUST_CHECK int pipe_init(struct pipe *p, struct cryptopool *pool, uint8_t *buf,
			      size_t bufcap, char *err, size_t errlen);

/* Frees what the pipe allocated (not buf, not the pool), the key pages
 * wiped. Accepts NULL, and a pipe whose pipe_init failed. */
void pipe_free(struct pipe *p);

/* Sends nframes messages (from enc) as nframes frames sealed with tx, in
 * order; each write has timeout_ms. On success tx->counter has advanced by
 * nframes; on a failure, past every frame that was sealed (at least past
 * the one whose write failed, some of which may be on the wire), so that
 * no nonce is ever used twice, even by a caller that seals again on tx.
 * -ENOMEM if the frame buffers cannot be allocated. */
PIPE_MUST_CHECK int pipe_send(struct pipe *p, const struct sock_stream *st, struct frame_key *tx, uint64_t nframes,
			      pipe_encode_fn enc, void *ctx, int timeout_ms, char *err,
			      size_t errlen);

/* Receives exactly nframes frames opened with rx and hands their messages
 * to fn in order; each frame's read has timeout_ms. No frame beyond the
 * nframes-th is read. On success rx->counter has advanced by nframes. */
PIPE_MUST_CHECK int pipe_recv(struct pipe *p, const struct sock_stream *st, struct frame_key *rx, uint64_t nframes,
			      pipe_deliver_fn fn, void *ctx, int timeout_ms, char *err,
			      size_t errlen);

/* A receiver that knows where the values of a tensor's next chunk go
 * (right after the last one's): on frames received one at a time each
 * message's bytes past at.head go straight there (sock_read_placed), not
 * into the pipe's buffer and then copied: local frames (FRAME_LOCAL) are
 * read there, AEGIS-256 frames opened there (on a pool of more than one
 * thread only where `ahead` says where, else copied). For a GPU worker
 * beside its ps, the parameters land in the pinned buffer they are
 * uploaded from; for a CPU worker, in its parameters, and for a ps, in
 * the push's slot. at.where sees the message's head before it names a
 * place, so only the chunk it expects goes there (bytes of another
 * message left in a tensor whose receive then ends would be taken for
 * its values: an elastic run hung so); that head is not authenticated
 * yet. A message read so is handed to took (with pipe_recv's ctx), its
 * authenticated head at msg, its other mlen - at.head bytes at body.
 * took returns 0 (taken), a negative error (as fn's), or 1: not the
 * message at.where expected; the pipe then copies body back after the
 * head and hands the whole message to fn. */
struct pipe_place {
	struct sock_place at;
	int (*took)(void *ctx, uint64_t i, const uint8_t *msg, const uint8_t *body, size_t mlen,
		    char *err, size_t errlen);
	/* Optional: for AEGIS-256 frames opened on a pool, where the values
	 * of message i of this call go, from its head (at.head bytes, not
	 * authenticated yet), if it is the message expected at position i
	 * when every one before it was the one expected at its own; NULL
	 * keeps them in the frame's buffer. Called on pool threads, several
	 * at once and before the messages ahead of i are delivered: it may
	 * read only what does not change during the call, and must name
	 * places that no message delivered before i can write (past the
	 * most the messages before i can fill), each position a range of
	 * its own. Without it, such frames are
	 * copied. A frame after one that fails may have been opened into
	 * its place already: authenticated values, not received. */
	uint8_t *(*ahead)(void *ctx, uint64_t i, const uint8_t *head, size_t mlen);
};

/* pipe_recv, with pl (NULL: none) placing the messages it can. */
PIPE_MUST_CHECK int pipe_recv_placed(struct pipe *p, const struct sock_stream *st, struct frame_key *rx,
				     uint64_t nframes, const struct pipe_place *pl,
				     pipe_deliver_fn fn, void *ctx, int timeout_ms, char *err,
				     size_t errlen);

#endif
