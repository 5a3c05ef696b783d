/* Framing for the roles: where a message goes in a frame buffer, sending
 * one message as one frame, and the chunk messages of one tensor for
 * net/pipe.c. The ps and worker roles build every frame through here, so
 * no role code computes frame offsets or capacities.
 *
 * Errors: 0 or a negative errno with one line in err (errlen bytes), those
 * of sock_write_frame, the msg_* codecs and msg_assembly_add. */
#ifndef PSTRAIN_NET_CONN_H
#define PSTRAIN_NET_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "msg.h"

/* A buffer for any one frame to send (CONN_WBUF_BYTES) and for any one
 * frame received (CONN_RBUF_BYTES: the ciphertext, opened in place). */
#define CONN_WBUF_BYTES FRAME_BYTES_MAX
#define CONN_RBUF_BYTES FRAME_CT_MAX

/* Where the message goes in a frame buffer of cap bytes, and how long it
 * may be: the frame's header comes first and the tag after it. */
static inline uint8_t *conn_msg(uint8_t *buf)
{
	return buf + FRAME_HDR_BYTES;
}

static inline size_t conn_msg_cap(size_t cap)
{
	return cap - FRAME_HDR_BYTES - FRAME_TAG_BYTES;
}

/* Seals the len-byte message at conn_msg(buf) (buf: cap bytes) with tx and
 * writes the frame within timeout_ms. */
int conn_send(int fd, struct frame_key *tx, uint8_t *buf, size_t cap, size_t len, int timeout_ms,
	      char *err, size_t errlen);

/* ERROR(code, text) as the last message on a connection, best effort: a
 * failure to send it is not reported (the connection is closed anyway). */
void conn_send_error(int fd, struct frame_key *tx, uint8_t *buf, size_t cap, uint32_t code,
		     const char *text, int timeout_ms);

/* A tensor's chunk messages for pipe_send (PARAMS from a ps, PUSH from a
 * worker): message i is chunk i of src. */
struct conn_chunk_tx {
	uint8_t type;
	uint32_t shard, worker;
	uint64_t version;
	const float *src; /* (n) */
	uint64_t n;
};

int conn_chunk_encode(void *ctx, uint64_t i, uint8_t *msg, size_t cap, size_t *len, char *err,
		      size_t errlen);

/* The chunks of a tensor being received, for pipe_recv: each message must
 * be a chunk of type `type` (from worker `worker` for PUSH) that fits a.
 * An ERROR from a ps is reported with its text (-ECONNABORTED). bad: the
 * failure was in a message, not in the frames carrying it. */
struct conn_chunk_rx {
	uint8_t type;
	uint32_t worker;
	struct msg_assembly *a;
	float *dst; /* (a->n) */
	int bad;
};

int conn_chunk_deliver(void *ctx, uint64_t i, const uint8_t *msg, size_t len, char *err,
		       size_t errlen);

#endif
