/* The wire format's constants and byte order, in one place (docs/PROTOCOL.md
 * describes the same bytes in prose).
 *
 * Everything multi-byte on the wire is little-endian and is written and read
 * with the wire_put_* / wire_get_* helpers below, byte by byte: never by
 * casting a buffer to a struct (padding, alignment and host byte order would
 * all leak into the protocol). This header defines no I/O and no crypto:
 * net/frame.c seals and opens frames, the handshake and the message codecs
 * live elsewhere and use these names. */
#ifndef PSTRAIN_NET_WIRE_H
#define PSTRAIN_NET_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Protocol identity, sent in the handshake. WIRE_MAGIC is the bytes "PSTR"
 * read as a little-endian u32. A peer with another version is refused.
 * Version 4: a chunk's byte 1 is its dtype (fp32 or bf16). Version 5:
 * chunks of WIRE_CHUNK_VALUES values in either dtype (were 1 MiB of
 * them), each a piece a ps aggregates on its own; and the observer role
 * (net/handshake.h) and REPORT, so that a ps of version 4 greeted by an
 * observer says "protocol version" rather than "unknown peer role 3".
 * Version 6: the handshake's byte 10 is a mask of the ciphers offered
 * (AES-256-GCM, AEGIS-256; was 0 or 1 for AES-256-GCM alone), and both
 * ends that offer AEGIS-256 seal with it. Version 7: dtype 2, float32
 * packed without loss (net/fpack.h), and PULL's byte 1, whether the
 * worker wants its PARAMS packed. Version 8: HELLO1 names the ps it is for
 * (bytes 108..112, taken from the nonce), so that a greeting recorded on
 * its way to one ps is refused by the others. Version 9: SPULL, ROWS and
 * SPUSH, the rows of the embedding tables a ps holds (net/msg_rows.h); and
 * a PUSH's worker field is the worker (bytes 28..30) and the slice of the
 * step's batch the gradient is of (30..32; docs/ELASTIC.md). Version 10:
 * VIEW and LEAVE, the elastic worker set's messages, and a REPORT may end
 * with recent events (docs/ELASTIC.md). Version 11: COMPUTE. Version 12:
 * ROWS and SPUSH values in bf16 where [cluster] wire_dtype says so.
 * Version 13: an SPUSH's worker field is a PUSH's (WIRE_PUSH_TAG): the
 * worker and the slice its rows' gradient is of. Version 14: dtype 3,
 * PARAMS as XORs with the version the worker holds (net/xdelta.h), and
 * PULL's flag DELTA that asks for them. Version 15: dtype 4, a run of
 * PUSH pieces inside a dense weight as the two factors the ps makes them
 * from (core/nn/factors.h). Version 16: a handshake's local flag 2, a
 * worker that will offer a ring on its local connection (net/ring.h): its
 * 16-byte offer and the ps's one-byte answer follow the handshake, and
 * the connection's bytes go through the ring if the answer is 1.
 * Version 17: a rows message's byte 2 is its flags: SPULL's and SPUSH's
 * ids packed (net/idpack.h), SPULL's wish for a packed answer; and ROWS
 * and SPUSH values in dtype 2, float32 packed (net/msg_rows.h). */
#define WIRE_MAGIC 0x52545350u
#define WIRE_VERSION 17u

/* Message types (DESIGN §7): the first field of every decrypted frame.
 * Zero is not a type, so a zeroed buffer never parses as a message. */
enum wire_msg {
	WIRE_HELLO = 1,      /* handshake */
	WIRE_PULL = 2,       /* worker -> ps: (shard, version) */
	WIRE_PARAMS = 3,     /* ps -> worker: a chunk of the shard's parameters */
	WIRE_PUSH = 4,       /* worker -> ps: (shard, version, a chunk of grads) */
	WIRE_ACK = 5,        /* ps -> worker: push accepted or dropped */
	WIRE_CHECKPOINT = 6, /* chief -> ps: save at (step) */
	WIRE_STATUS = 7,     /* progress and counters */
	WIRE_DONE = 8,       /* goodbye: the sender has finished */
	WIRE_ERROR = 9,      /* (code, text), then the sender closes */
	WIRE_HEARTBEAT = 10, /* both: "still here" on an idle connection */
	WIRE_ROLLBACK = 11,  /* chief -> ps: restore checkpoint (step) */
	WIRE_REPORT = 12,    /* ps -> observer: the answer to its STATUS */
	WIRE_SPULL = 13,     /* worker -> ps: (shard, version, embedding row ids) */
	WIRE_ROWS = 14,      /* ps -> worker: those rows' values */
	WIRE_SPUSH = 15,     /* worker -> ps: (shard, version, row ids and their gradients) */
	WIRE_VIEW = 16,      /* ps 0 -> worker: who trains which slices of a step */
	WIRE_LEAVE = 17,     /* worker -> ps: it leaves after the pushes that follow */
	WIRE_COMPUTE = 18,   /* worker -> ps 0: what its arithmetic runs on */
};
#define WIRE_MSG_FIRST WIRE_HELLO
#define WIRE_MSG_LAST WIRE_COMPUTE

/* Size limits. A tensor travels as a sequence of messages each carrying
 * at most WIRE_CHUNK_VALUES values of it (WIRE_CHUNK_MAX bytes in
 * float32), and each message's fixed fields fit in WIRE_MSG_HDR_MAX bytes,
 * so no frame's plaintext exceeds FRAME_MAX. The bound keeps a receiver's
 * allocation per connection small and fixed: it is checked before
 * anything is allocated. A chunk is also the piece a sync ps aggregates
 * and sends back on its own (cluster/psshard.h): the parameters start back
 * down once every worker's first piece is in, so pieces are small (64 KiB
 * is 0.5 ms at 1 Gbit/s; bench/netlab measured 16384 values 9% faster
 * than 65536 at 1 Gbit/s, and the same at 10 Gbit/s) while the per-frame
 * cost (a 16-byte tag, a syscall or two) stays a few percent. */
#define WIRE_CHUNK_VALUES 16384u
#define WIRE_CHUNK_MAX (4u * WIRE_CHUNK_VALUES)
#define WIRE_MSG_HDR_MAX 64u
#define FRAME_MAX (WIRE_CHUNK_MAX + WIRE_MSG_HDR_MAX)

/* How the values of a PARAMS or PUSH chunk are encoded (its byte 1;
 * docs/PROTOCOL.md): float32, bfloat16 (net/bf16.h), half the bytes,
 * float32 packed without loss (net/fpack.h), about 7/8 of them, or
 * (PARAMS only) float32 as its XOR with the version the worker holds
 * (net/xdelta.h), about 0.6 of them, or (PUSH only, a run of pieces
 * inside a dense layer's weight) as the two factors the ps makes them
 * from (core/nn/factors.h). Zero is float32, what that byte (then
 * reserved, 0) meant in version 3. */
enum wire_dtype {
	WIRE_F32 = 0,
	WIRE_BF16 = 1,
	WIRE_F32P = 2,
	WIRE_F32X = 3,
	WIRE_F32F = 4,
};
#define WIRE_DTYPE_LAST WIRE_F32F

/* Most bytes per value of a known dtype (a macro too, for array sizes):
 * a packed chunk is always shorter than float32. */
#define WIRE_DTYPE_BYTES(dt) ((dt) == WIRE_BF16 ? 2u : 4u)
static inline unsigned wire_dtype_bytes(unsigned dt)
{
	return WIRE_DTYPE_BYTES(dt);
}

/* The values a dtype carries: float32 packed or as XORs is float32 (a
 * receiver that expects float32 takes any of them, and a sender sends a
 * chunk that would not shrink as plain float32). */
static inline unsigned wire_dtype_values(unsigned dt)
{
	return dt == WIRE_F32P || dt == WIRE_F32X || dt == WIRE_F32F ? WIRE_F32 : dt;
}

/* Name of a dtype for logs (as [cluster] wire_dtype spells it); "?" else. */
static inline const char *wire_dtype_name(unsigned dt)
{
	return dt == WIRE_F32 ? "fp32" : dt == WIRE_BF16 ? "bf16" : dt == WIRE_F32P ? "fp32 packed" :
		dt == WIRE_F32X ? "fp32 as XORs" : dt == WIRE_F32F ? "fp32 as factors" : "?";
}

/* A PUSH chunk's u32 worker field (struct msg_chunk's worker): the
 * sender's worker index in its low 16 bits, the slice its gradient is of
 * in the high 16, i.e. worker u16 then slice u16 on the wire. */
#define WIRE_PUSH_TAG(worker, slice) ((uint32_t)(worker) | (uint32_t)(slice) << 16)
#define WIRE_PUSH_WORKER(tag) ((tag) & 0xffffu)
#define WIRE_PUSH_SLICE(tag) ((tag) >> 16)

/* Longest ERROR text, so an ERROR message is bounded like the rest. */
#define WIRE_ERROR_TEXT_MAX 256u

/* Name of a message type for logs; "?" for anything else. */
static inline const char *wire_msg_name(uint32_t type)
{
	static const char *const names[] = {
		[WIRE_HELLO] = "HELLO",	    [WIRE_PULL] = "PULL",
		[WIRE_PARAMS] = "PARAMS",   [WIRE_PUSH] = "PUSH",
		[WIRE_ACK] = "ACK",	    [WIRE_CHECKPOINT] = "CHECKPOINT",
		[WIRE_STATUS] = "STATUS",   [WIRE_DONE] = "DONE",
		[WIRE_ERROR] = "ERROR",	    [WIRE_HEARTBEAT] = "HEARTBEAT",
		[WIRE_ROLLBACK] = "ROLLBACK", [WIRE_REPORT] = "REPORT",
		[WIRE_SPULL] = "SPULL",	    [WIRE_ROWS] = "ROWS",
		[WIRE_SPUSH] = "SPUSH",	    [WIRE_VIEW] = "VIEW",
		[WIRE_LEAVE] = "LEAVE",	    [WIRE_COMPUTE] = "COMPUTE",
	};
	if (type < WIRE_MSG_FIRST || type > WIRE_MSG_LAST)
		return "?";
	return names[type];
}

/* ---- little-endian encode / decode ------------------------------------
 * put: writes exactly sizeof(type) bytes at p. get: reads them. The caller
 * has checked that the bytes are there (each message type's length is
 * checked before any of its fields is read). */

static inline void wire_put_u16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static inline uint16_t wire_get_u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static inline void wire_put_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static inline uint32_t wire_get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static inline void wire_put_u64(uint8_t *p, uint64_t v)
{
	wire_put_u32(p, (uint32_t)v);
	wire_put_u32(p + 4, (uint32_t)(v >> 32));
}

static inline uint64_t wire_get_u64(const uint8_t *p)
{
	return (uint64_t)wire_get_u32(p) | (uint64_t)wire_get_u32(p + 4) << 32;
}

/* A float is sent as its IEEE-754 binary32 bit pattern, little-endian. */
static inline void wire_put_f32(uint8_t *p, float v)
{
	uint32_t u;
	memcpy(&u, &v, sizeof u);
	wire_put_u32(p, u);
}

static inline float wire_get_f32(const uint8_t *p)
{
	uint32_t u = wire_get_u32(p);
	float v;
	memcpy(&v, &u, sizeof v);
	return v;
}

/* N floats to / from 4*N bytes. On a little-endian host the wire layout is
 * the memory layout, so this is a memcpy (tensors are the bulk of the
 * traffic); elsewhere it is the per-element loop. src and dst must not
 * overlap. */
static inline void wire_put_f32s(uint8_t *p, const float *src /* (N) */, size_t N)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	memcpy(p, src, N * sizeof(float));
#else
	for (size_t i = 0; i < N; i++)
		wire_put_f32(p + 4 * i, src[i]);
#endif
}

static inline void wire_get_f32s(float *dst /* (N) */, const uint8_t *p, size_t N)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	memcpy(dst, p, N * sizeof(float));
#else
	for (size_t i = 0; i < N; i++)
		dst[i] = wire_get_f32(p + 4 * i);
#endif
}

#endif
