/* Message bodies: encoding and decoding of every message that travels inside
 * a frame (docs/PROTOCOL.md, "Messages", is the reference for the bytes), and
 * the chunking of tensors into bounded messages. Pure functions over
 * buffers: no sockets, no crypto, no allocation, no printing. net/frame.c
 * seals what these functions produce; the ps and worker loops decide what to
 * do with what they decode.
 *
 * Every message starts with a fixed header: the type byte (enum wire_msg),
 * three bytes that are reserved (zero) except in STATUS, then fields in
 * little-endian at 4- and 8-byte aligned offsets. PARAMS and PUSH (the
 * "chunk" messages) are followed by `count` float32 values; ERROR by its
 * text. Decoders check the length that the type implies before reading any
 * field after the type byte, then every field (reserved bytes zero, enum
 * values known, counts within bounds); the body length must match exactly,
 * so a message one byte short or one byte long is refused.
 *
 * Float payloads are not copied by the decoders: struct msg_chunk points at
 * them inside the caller's buffer (c->data, count values of c->dtype:
 * float32 or bfloat16, 4 or 2 bytes each, little-endian and possibly
 * unaligned). Read them with msg_chunk_floats(), which widens bf16, never
 * through a float pointer cast. The pointer is valid as long as the buffer
 * is. The encoder narrows float32 to bf16 straight into the message
 * (net/bf16.h), so neither side copies a tensor whole to convert it.
 *
 * Offsets and counts in chunk messages count elements (values), whatever
 * their dtype, from the start of the shard's parameter range
 * (shard-relative, not global). A tensor of N values in dtype dt travels as
 * msg_chunks(N, dt) messages with offsets 0, msg_chunk_max(dt), ..., in
 * increasing order: the same values in either dtype, a bf16 chunk in half
 * the bytes. The receiver checks each with struct
 * msg_assembly, which also refuses a chunk of another dtype than it
 * expects.
 *
 * Errors: 0 (or a non-negative value where said) or a negative errno, with
 * one line in err (errlen bytes; err may be NULL when errlen is 0) naming the
 * message type and the problem:
 *   -EMSGSIZE  the body length is wrong for the type (or, encoding, the
 *              output buffer is too small: -ENOBUFS)
 *   -EPROTO    wrong or unknown type byte, a reserved byte not zero, an
 *              unknown enum value or dtype, a count of 0 or above
 *              msg_chunk_max(dtype), a chunk of another dtype than expected,
 *              an ERROR text byte outside 0x20..0x7e; a chunk out of order (gap, overlap, after
 *              the end) or for another shard, version or worker
 *   -ERANGE    a chunk outside the tensor's range
 *   -EINVAL    (encoders) a field the sender may not send
 * A malformed message from a peer ends that connection. */
#ifndef PSTRAIN_NET_MSG_H
#define PSTRAIN_NET_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "wire.h"

#define MSG_MUST_CHECK __attribute__((warn_unused_result))

/* Most values in one PARAMS or PUSH message, in either dtype. */
#define MSG_CHUNK_FLOATS WIRE_CHUNK_VALUES

/* Most values of dtype dt (enum wire_dtype) in one PARAMS or PUSH
 * message: the same for every dtype, so that a chunk is the same piece
 * of the shard whatever travels (a bf16 chunk is half the bytes). */
static inline uint32_t msg_chunk_max(unsigned dt)
{
	(void)dt;
	return WIRE_CHUNK_VALUES;
}

/* Fixed lengths (bytes) of each message's header; see docs/PROTOCOL.md. */
#define MSG_PULL_BYTES 16u
#define MSG_CHUNK_HDR_BYTES 32u /* PARAMS and PUSH, before the floats */
#define MSG_FACTORS_HEAD 12u    /* WIRE_F32F: run u32, B u32, k u32, before the factors */
#define MSG_ACK_BYTES 24u
#define MSG_CHECKPOINT_BYTES 16u
#define MSG_STATUS_BYTES 32u
#define MSG_DONE_BYTES 8u
#define MSG_ERROR_HDR_BYTES 12u /* before the text */
#define MSG_HEARTBEAT_BYTES 48u
#define MSG_ROLLBACK_BYTES 16u
#define MSG_REPORT_HDR_BYTES 64u /* before the workers' states */

/* Workers a HEARTBEAT's bitmap can name (bit w: byte w / 8, bit w % 8). */
#define MSG_HEARTBEAT_WORKERS 256u

/* Largest encoded message of each variable-length kind; both fit FRAME_MAX.
 * A chunk of count values of dtype dt is MSG_CHUNK_BYTES(count, dt) long;
 * the largest is the same for every dtype. */
#define MSG_CHUNK_BYTES(count, dt) (MSG_CHUNK_HDR_BYTES + WIRE_DTYPE_BYTES(dt) * (size_t)(count))
#define MSG_CHUNK_BYTES_MAX MSG_CHUNK_BYTES(MSG_CHUNK_FLOATS, WIRE_F32)
#define MSG_ERROR_BYTES_MAX (MSG_ERROR_HDR_BYTES + WIRE_ERROR_TEXT_MAX)

/* Workers a REPORT can describe (a state byte each), as many as a cluster
 * may have (CONFIG_MAX_HOSTS). A REPORT for W workers is
 * MSG_REPORT_BYTES(W) long. */
#define MSG_REPORT_WORKERS 256u
#define MSG_REPORT_BYTES(W) (MSG_REPORT_HDR_BYTES + (size_t)(W))
#define MSG_REPORT_BYTES_MAX MSG_REPORT_BYTES(MSG_REPORT_WORKERS)
/* A REPORT may end with up to MSG_REPORT_EVENTS events of
 * MSG_REPORT_EVENT_BYTES each (the elastic worker set's joins and leaves);
 * the longest REPORT, with every worker and event, is MSG_REPORT_BYTES_ALL. */
#define MSG_REPORT_EVENTS 8u
#define MSG_REPORT_EVENT_BYTES 12u
#define MSG_REPORT_BYTES_ALL (MSG_REPORT_BYTES_MAX + MSG_REPORT_EVENTS * MSG_REPORT_EVENT_BYTES)
#define MSG_VIEW_BYTES 80u
#define MSG_LEAVE_BYTES 8u
#define MSG_COMPUTE_BYTES 72u
#define MSG_COMPUTE_TEXT 64u   /* its text's bytes, NUL-padded */
#define MSG_VIEW_SLICES 256u   /* slices a VIEW can give out (its bitmaps' bits) */

/* PULL's version meaning "whatever is newest" (async mode). */
#define MSG_VERSION_LATEST UINT64_MAX

/* PULL: worker -> ps, "send me shard's parameters at version" (or
 * MSG_VERSION_LATEST). The ps answers with PARAMS chunks. */
struct msg_pull {
	uint8_t flags;   /* MSG_PULL_* */
	uint32_t shard;
	uint64_t version;
};

/* PULL flags. PACKED: send float32 PARAMS packed (net/fpack.h); the ps
 * may, and may still send a chunk as plain float32. DELTA (sync, with
 * PACKED): the worker holds version `version - 1` of the whole shard as
 * this ps sent it; the ps may send any chunk as XORs with that version
 * (net/xdelta.h), where it kept that version of the chunk. */
#define MSG_PULL_PACKED 0x01u
#define MSG_PULL_DELTA 0x02u
#define MSG_PULL_FLAGS (MSG_PULL_PACKED | MSG_PULL_DELTA)

/* PARAMS (ps -> worker) and PUSH (worker -> ps): one chunk of a shard's
 * parameters, or of a gradient for them, covering the shard-relative range
 * [offset, offset + count). version: PARAMS, the version of these
 * parameters; PUSH, the version the gradient was computed at. worker: PUSH,
 * the sender's worker index; PARAMS, always 0. dtype: how the values
 * travel (0, float32, when a sender leaves it unset). data: count values,
 * see the top of this file. */
struct msg_chunk {
	uint8_t type; /* WIRE_PARAMS or WIRE_PUSH */
	uint8_t dtype; /* enum wire_dtype */
	uint32_t shard;
	uint64_t version;
	uint32_t worker;
	uint64_t offset;
	uint32_t count;       /* 1..msg_chunk_max(dtype) */
	const uint8_t *data;  /* (count) little-endian float32 or bf16, maybe unaligned */
	const float *base;    /* encoding WIRE_F32X: the (count) values the XORs are with */
	size_t bytes;         /* decoded: the bytes at data */
};

/* What a ps did with a whole pushed gradient. Zero is not a status. */
enum msg_ack_status {
	MSG_ACK_APPLIED = 1,   /* applied; version is the new version */
	MSG_ACK_ACCEPTED = 2,  /* sync: held until enough replicas arrive */
	MSG_ACK_STALE = 3,     /* dropped: computed at too old a version */
	MSG_ACK_DUPLICATE = 4, /* dropped: this worker already pushed for it */
};
#define MSG_ACK_FIRST MSG_ACK_APPLIED
#define MSG_ACK_LAST MSG_ACK_DUPLICATE

/* ACK: ps -> worker, after the last chunk of a PUSH. version: the shard's
 * version now. */
struct msg_ack {
	uint32_t shard;
	uint64_t version;
	uint32_t status; /* enum msg_ack_status */
};

/* CHECKPOINT: chief -> ps, "save your shard as of step"; with has_acc,
 * acc is the run's final test accuracy in [0, 1], sent with the final
 * checkpoint so that a finished run started again can say how it ended.
 * It travels in millionths. */
struct msg_checkpoint {
	uint64_t step;
	uint8_t has_acc;
	double acc;
};

/* STATUS: a request (reply = 0, counters and complete all zero) or a ps's
 * reply (reply = 1) with its shard's counters, and complete = 1 once the
 * chief (worker 0) has said DONE (a worker that finishes first waits for
 * that before it exits, so that a ps restarted meanwhile can still roll it
 * back). */
struct msg_status {
	uint8_t reply;
	uint8_t complete;
	uint32_t shard;
	uint64_t version;
	uint64_t applied; /* gradients applied */
	uint64_t stale;   /* gradients dropped as stale */
};

/* DONE: worker -> ps, from worker index `worker`: it has trained its last
 * step (leaving 0), or it has seen every ps report the run complete and
 * closes its connections (leaving 1): until then a ps keeps accepting, so
 * the worker can still reconnect and be rolled back. */
struct msg_done {
	uint32_t worker;
	uint8_t leaving;
};

/* HEARTBEAT: sent on a connection that has carried nothing else for a
 * while, so that the receiver can tell a quiet peer from a dead one. From a
 * ps that holds a sync PULL (waiting for the gradients of `version`):
 * version, and bit w of missing set for each worker whose gradient for it
 * has not arrived. From a worker, or a ps that is not waiting: all zero. */
struct msg_heartbeat {
	uint64_t version;
	uint8_t missing[MSG_HEARTBEAT_WORKERS / 8];
};

/* ROLLBACK: chief -> ps, "restore your shard from checkpoint step" (a ps
 * restarted from that checkpoint while the others went on). */
struct msg_rollback {
	uint64_t step;
};

/* VIEW: ps 0 -> worker, before the PARAMS that answer a PULL whenever the
 * view they come with is new to the connection (docs/ELASTIC.md): the
 * workers that train the slices of step `version` (sync; async: the
 * shard's version) and, for a revision (rev > 0, workers lost from the
 * step's first view), that first view too, so that every worker computes
 * the same owners (cluster/view.h). live is a subset of base, not empty;
 * rev 0: live equals base. */
struct msg_view {
	uint64_t version;
	uint32_t rev;
	uint32_t slices;                          /* S, 1..MSG_VIEW_SLICES */
	uint8_t live[MSG_HEARTBEAT_WORKERS / 8];  /* bit w: byte w / 8, bit w % 8 */
	uint8_t base[MSG_HEARTBEAT_WORKERS / 8];
};

/* LEAVE: worker -> ps, from worker index `worker`: it leaves the job once
 * the pushes that follow on this connection are in (SIGTERM on an elastic
 * worker), so ps 0 gives it no slice of a later step. */
struct msg_leave {
	uint32_t worker;
};

/* COMPUTE: worker -> ps 0, once a connection, before its first PULL: what
 * its arithmetic runs on ("cpu: OpenBLAS SkylakeX kernels", "gpu: NVIDIA
 * H200, sm_90"), so that ps 0 can say when two workers' slices would round
 * differently (docs/ELASTIC.md). Printable ASCII, 1 to MSG_COMPUTE_TEXT
 * bytes. */
struct msg_compute {
	char text[MSG_COMPUTE_TEXT + 1];
};

/* A REPORT's event: what happened to a worker at a step (elastic). */
enum msg_event_kind {
	MSG_EVENT_JOINED = 1, /* first in the view of `step` */
	MSG_EVENT_LEFT = 2,   /* said LEAVE: out of the views after `step` */
	MSG_EVENT_LOST = 3,   /* lost past peer_timeout: its slices went to others at `step` */
};
struct msg_event {
	uint64_t step;
	uint16_t worker;
	uint8_t kind;         /* enum msg_event_kind */
};

/* "joined", "left", "lost", or "?". */
const char *msg_event_name(unsigned kind);

/* What a ps knows of one worker, in a REPORT (cluster/members.h). Zero is
 * the state of a worker the ps has nothing to say about. */
enum msg_worker_state {
	MSG_WORKER_ABSENT = 0, /* never connected, or gone with nothing awaited */
	MSG_WORKER_LIVE = 1,   /* connected, training */
	MSG_WORKER_DONE = 2,   /* said DONE: trained its last step */
	MSG_WORKER_LEFT = 3,   /* saw the run complete and left */
	MSG_WORKER_LOST = 4,   /* no connection before DONE: peer_timeout runs */
	MSG_WORKER_AWAY = 5,   /* done, but closed before the run was complete:
				* peer_timeout runs */
};
#define MSG_WORKER_STATE_LAST MSG_WORKER_AWAY

/* REPORT: ps -> observer (`pstrain status`), the answer to an observer's
 * STATUS request: the shard's progress and what the ps knows of each
 * worker. An unknown rate or no checkpoint travel as a clear flag and a
 * zero field, so every report has one encoding. final: the ps is ending
 * and closes this connection after this report (sent unasked). */
struct msg_report {
	uint8_t complete;       /* the chief has said DONE: the run is complete */
	uint8_t final;          /* the ps's last word on this connection */
	uint8_t has_rate;       /* rate is known (two samples at least) */
	uint8_t has_checkpoint; /* checkpoint is set */
	uint32_t shard;
	uint64_t version, total; /* the shard's version; the run's last */
	uint64_t applied;       /* gradients applied */
	uint64_t stale;         /* gradients dropped as stale */
	uint64_t checkpoint;    /* the newest step this ps wrote whole or resumed from */
	float rate;             /* versions per second lately: finite, >= 0 */
	uint64_t uptime_ms;     /* since the ps started */
	uint32_t workers;       /* W, 1..MSG_REPORT_WORKERS */
	uint8_t state[MSG_REPORT_WORKERS]; /* (workers) enum msg_worker_state */
	uint32_t nevents;       /* 0..MSG_REPORT_EVENTS, oldest first */
	struct msg_event events[MSG_REPORT_EVENTS];
};

/* "absent", "live", "done", "left", "lost", "away", or "?". */
const char *msg_worker_state_name(unsigned s);

/* ERROR: (code, text), after which the sender closes. code is a positive
 * errno-style number; text is at most WIRE_ERROR_TEXT_MAX bytes of
 * printable ASCII (0x20..0x7e: no control byte, no escape sequence, so it
 * is safe to print). Decoded, text is NUL-terminated. */
struct msg_error {
	uint32_t code;
	char text[WIRE_ERROR_TEXT_MAX + 1];
};

/* The type of a received message (WIRE_PULL..WIRE_MSG_LAST): len >= 1 and a
 * known type that travels in frames. HELLO never does (it is the unframed
 * handshake), so it is refused like an unknown type: -EPROTO; an empty
 * message is -EMSGSIZE. */
MSG_MUST_CHECK int msg_type(const uint8_t *buf, size_t len, char *err, size_t errlen);

/* ---- encoders -------------------------------------------------------------
 * Write one message to buf (cap bytes) and set *len to its length. -ENOBUFS
 * if cap is too small, -EINVAL for a field that may not be sent (count 0 or
 * above msg_chunk_max(dtype), PARAMS with a worker, unknown ACK status, a STATUS
 * request with counters, an ERROR text over WIRE_ERROR_TEXT_MAX), with
 * nothing written to *len (also for an unknown chunk dtype). */

MSG_MUST_CHECK int msg_encode_pull(uint8_t *buf, size_t cap, const struct msg_pull *m,
				   size_t *len, char *err, size_t errlen);
/* c->type picks PARAMS or PUSH, c->dtype the encoding; c->data is
 * ignored: the count floats are read from src (a host-order float array)
 * and, for bf16, rounded as net/bf16.h says on their way into buf. */
MSG_MUST_CHECK int msg_encode_chunk(uint8_t *buf, size_t cap, const struct msg_chunk *c,
				    const float *src /* (count) */, size_t *len, char *err,
				    size_t errlen);
/* msg_encode_chunk, but where the values' wire bytes are src's own
 * (float32 on a little-endian host) only the header goes into buf (*len
 * is MSG_CHUNK_HDR_BYTES) and *body, *blen say where the rest of the
 * message is: src, read in place when the frame is sealed or written
 * (net/frame.h, frame_seal_parts). Otherwise as msg_encode_chunk, with
 * *body NULL and *blen 0. buf must still have room for the whole
 * message. */
MSG_MUST_CHECK int msg_encode_chunk_parts(uint8_t *buf, size_t cap, const struct msg_chunk *c,
					  const float *src /* (count) */, size_t *len,
					  const uint8_t **body, size_t *blen, char *err,
					  size_t errlen);
MSG_MUST_CHECK int msg_encode_ack(uint8_t *buf, size_t cap, const struct msg_ack *m,
				  size_t *len, char *err, size_t errlen);
MSG_MUST_CHECK int msg_encode_checkpoint(uint8_t *buf, size_t cap,
					 const struct msg_checkpoint *m, size_t *len,
					 char *err, size_t errlen);
MSG_MUST_CHECK int msg_encode_status(uint8_t *buf, size_t cap, const struct msg_status *m,
				     size_t *len, char *err, size_t errlen);
MSG_MUST_CHECK int msg_encode_done(uint8_t *buf, size_t cap, const struct msg_done *m,
				   size_t *len, char *err, size_t errlen);
MSG_MUST_CHECK int msg_encode_heartbeat(uint8_t *buf, size_t cap, const struct msg_heartbeat *m,
					size_t *len, char *err, size_t errlen);
MSG_MUST_CHECK int msg_encode_rollback(uint8_t *buf, size_t cap, const struct msg_rollback *m,
				       size_t *len, char *err, size_t errlen);
/* -EINVAL for workers outside 1..MSG_REPORT_WORKERS, a flag not 0 or 1,
 * an unknown state, or a known rate that is not finite and >= 0. */
MSG_MUST_CHECK int msg_encode_report(uint8_t *buf, size_t cap, const struct msg_report *m,
				     size_t *len, char *err, size_t errlen);
/* -EINVAL for slices outside 1..MSG_VIEW_SLICES, an empty live set, or
 * live not within base. */
MSG_MUST_CHECK int msg_encode_view(uint8_t *buf, size_t cap, const struct msg_view *m,
				   size_t *len, char *err, size_t errlen);
MSG_MUST_CHECK int msg_encode_leave(uint8_t *buf, size_t cap, const struct msg_leave *m,
				    size_t *len, char *err, size_t errlen);
/* -EINVAL for an empty text, a longer one, or a byte outside 0x20..0x7e. */
MSG_MUST_CHECK int msg_encode_compute(uint8_t *buf, size_t cap, const struct msg_compute *m,
				      size_t *len, char *err, size_t errlen);
/* text is a C string (NUL-terminated); m->text is not used. Every byte
 * outside 0x20..0x7e (a line break, an escape, UTF-8) is sent as '?', so
 * any error text gets through; msg_decode_error refuses such a byte. */
MSG_MUST_CHECK int msg_encode_error(uint8_t *buf, size_t cap, uint32_t code, const char *text,
				    size_t *len, char *err, size_t errlen);

/* ---- decoders -------------------------------------------------------------
 * Decode one message of exactly len bytes into *out. On failure *out is
 * unspecified. msg_decode_chunk accepts PARAMS or PUSH (check out->type);
 * the others accept only their own type. */

MSG_MUST_CHECK int msg_decode_pull(const uint8_t *buf, size_t len, struct msg_pull *out,
				   char *err, size_t errlen);
MSG_MUST_CHECK int msg_decode_chunk(const uint8_t *buf, size_t len, struct msg_chunk *out,
				    char *err, size_t errlen);
/* msg_decode_chunk of a float32 chunk of len bytes from its first
 * MSG_CHUNK_HDR_BYTES at buf, its values already read elsewhere (a local
 * frame's body read into place: net/pipe.h); out->data is NULL. Another
 * dtype is -EPROTO. */
MSG_MUST_CHECK int msg_decode_chunk_head(const uint8_t *buf, size_t len, struct msg_chunk *out,
					 char *err, size_t errlen);
MSG_MUST_CHECK int msg_decode_ack(const uint8_t *buf, size_t len, struct msg_ack *out,
				  char *err, size_t errlen);
MSG_MUST_CHECK int msg_decode_checkpoint(const uint8_t *buf, size_t len,
					 struct msg_checkpoint *out, char *err, size_t errlen);
MSG_MUST_CHECK int msg_decode_status(const uint8_t *buf, size_t len, struct msg_status *out,
				     char *err, size_t errlen);
MSG_MUST_CHECK int msg_decode_done(const uint8_t *buf, size_t len, struct msg_done *out,
				   char *err, size_t errlen);
MSG_MUST_CHECK int msg_decode_heartbeat(const uint8_t *buf, size_t len, struct msg_heartbeat *out,
					char *err, size_t errlen);
MSG_MUST_CHECK int msg_decode_rollback(const uint8_t *buf, size_t len, struct msg_rollback *out,
				       char *err, size_t errlen);
MSG_MUST_CHECK int msg_decode_report(const uint8_t *buf, size_t len, struct msg_report *out,
				     char *err, size_t errlen);
MSG_MUST_CHECK int msg_decode_view(const uint8_t *buf, size_t len, struct msg_view *out,
				   char *err, size_t errlen);
MSG_MUST_CHECK int msg_decode_leave(const uint8_t *buf, size_t len, struct msg_leave *out,
				    char *err, size_t errlen);
MSG_MUST_CHECK int msg_decode_compute(const uint8_t *buf, size_t len, struct msg_compute *out,
				      char *err, size_t errlen);
MSG_MUST_CHECK int msg_decode_error(const uint8_t *buf, size_t len, struct msg_error *out,
				    char *err, size_t errlen);

/* A PUSH chunk of factors (WIRE_F32F, core/nn/factors.h; the layout in
 * net/msg_factors.c): its header from c, the run (values from c->offset
 * in the run of pieces the factors make), the batch B and k, the values
 * of the run's factor stream it carries (k <= count). The caller writes
 * those k values, little-endian float32, at buf + *len - 4k (factors_write)
 * and then calls msg_chunk_factors_seal, which leaves out the zeros and
 * sets *len to the message's length. */
MSG_MUST_CHECK int msg_encode_chunk_factors(uint8_t *buf, size_t cap, const struct msg_chunk *c,
					    uint32_t run, uint32_t B, size_t k, size_t *len, char *err,
					    size_t errlen);
void msg_chunk_factors_seal(uint8_t *buf, size_t *len);
/* Whether n bytes at body are a chunk of count values' factors: 0 or
 * -EPROTO (msg_decode_chunk says so). */
int msg_factors_check(const uint8_t *body, size_t n, uint32_t count);
/* A decoded factors chunk's run, batch and the number of its values,
 * and those values into dst (k). */
void msg_chunk_factors(const struct msg_chunk *c, uint32_t *run, uint32_t *B, size_t *k);
void msg_chunk_factor_values(float *dst, const struct msg_chunk *c);

/* Copies a decoded chunk's count values into dst as floats (host order;
 * bf16 widened, exactly). Not for XORs (WIRE_F32X), which only an
 * assembly takes (msg_assembly_add: they need the values dst holds), nor
 * for factors (WIRE_F32F), which only a ps in piece mode takes. */
void msg_chunk_floats(float *dst /* (count) */, const struct msg_chunk *c);

/* ---- chunking ------------------------------------------------------------ */

/* Number of chunk messages for a tensor of n values sent as dtype dt:
 * ceil(n / msg_chunk_max(dt)) (0 for n = 0). */
uint64_t msg_chunks(uint64_t n, unsigned dt);

/* The i-th chunk (0 <= i < msg_chunks(n, dt)) of a tensor of n values sent
 * as dtype dt: sets *offset and *count (every chunk is msg_chunk_max(dt)
 * long but the last). */
void msg_chunk_range(uint64_t n, unsigned dt, uint64_t i, uint64_t *offset, uint32_t *count);

/* Receiving one tensor: the chunks of one PARAMS reply or one PUSH, checked
 * as they arrive. Init with the message type, the shard, the tensor's
 * length n (the shard's size; n >= 1) and the dtype this receiver expects
 * it in (its `[cluster] wire_dtype` for that direction). The first chunk
 * fixes version (and, for PUSH, worker); every later chunk must carry the
 * same ones, and every chunk the expected dtype. Chunks must arrive in
 * order: offset == values received so far, offset + count <= n. */
struct msg_assembly {
	uint8_t type;
	uint8_t dtype;     /* enum wire_dtype, expected of every chunk */
	uint32_t shard;
	uint64_t n;        /* floats expected */
	uint64_t received; /* floats received = the next expected offset */
	uint64_t version;  /* from the first chunk */
	uint32_t worker;   /* from the first chunk (PUSH) */
};

/* -EINVAL for a type other than PARAMS/PUSH, n = 0 or an unknown dtype. */
MSG_MUST_CHECK int msg_assembly_init(struct msg_assembly *a, uint8_t type, uint32_t shard,
				     uint64_t n, unsigned dtype, char *err, size_t errlen);

/* Checks decoded chunk c against a; if dst is not NULL, copies its floats to
 * dst + c->offset (dst has n floats). Returns 1 when the tensor is now
 * complete, 0 when more chunks are expected, or (a unchanged, nothing
 * copied): -EPROTO (wrong type, dtype, shard, version or worker; a gap; an
 * overlap; a chunk after the tensor was complete), -ERANGE (offset + count
 * > n). */
MSG_MUST_CHECK int msg_assembly_add(struct msg_assembly *a, const struct msg_chunk *c,
				    float *dst /* (n) */, char *err, size_t errlen);

/* Whether every float has arrived. */
int msg_assembly_done(const struct msg_assembly *a);

#endif
