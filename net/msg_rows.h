/* The messages of the embedding tables a ps holds by row (docs/PROTOCOL.md,
 * "Rows"): SPULL asks a ps for some of its rows at a version, ROWS answers
 * with their values, SPUSH gives it a gradient for some of its rows. Pure
 * functions over buffers, like net/msg.h (whose conventions hold here:
 * little-endian fields at aligned offsets, reserved bytes zero, the exact
 * length checked before any field after the type byte is read, one line
 * in err naming the message on every failure).
 *
 * All three have one 32-byte header:
 *
 *   0   1  type (WIRE_SPULL, WIRE_ROWS, WIRE_SPUSH)
 *   1   1  dtype of the values: 0 float32, 1 bfloat16 (ROWS and SPUSH,
 *          as [cluster] wire_dtype has parameters and gradients travel),
 *          2 float32 packed (ROWS and SPUSH, net/fpack.h); SPULL, which
 *          has none, 0
 *   2   1  flags: MSG_ROWS_IDS_PACKED (SPULL, SPUSH: the ids packed,
 *          net/idpack.h), MSG_ROWS_WANT_PACKED (SPULL: the answer's
 *          float32 values packed where that is shorter); others 0
 *   3   1  reserved
 *   4   4  shard u32
 *   8   8  version u64
 *   16  4  total u32: rows in the whole request, answer or gradient
 *   20  4  first u32: this message's first row among them
 *   24  4  count u32: rows in this message (0 only when total is 0)
 *   28  4  worker u32: SPUSH, WIRE_PUSH_TAG (the sender's index, the slice);
 *          otherwise 0
 *   32  .. SPULL: count row ids (u64 each, global rows, strictly
 *          ascending, or packed); ROWS: count x DIM values; SPUSH: count
 *          row ids, then count x DIM values (4 bytes each as float32, 2
 *          as bf16, or packed)
 *
 * DIM, the embedding width, is the model's: both ends know it from the
 * config they share (its hash is in the handshake), so it is not on the
 * wire and a decoder is given it. The dtype is on the wire, as in CHUNK,
 * so that a set of another dtype than the receiver's config says is
 * refused by name (msg_rows_asm_add) rather than misread. A set of n rows travels as
 * ceil(n / msg_rows_max(type, DIM)) messages (one when n is 0), each
 * holding msg_rows_max rows but the last, so that no message exceeds
 * FRAME_MAX (a packed message is shorter than its rows unpacked, and
 * carries as many); struct msg_rows_asm checks them in order as they
 * come. Packing is a sender's choice per message, where it is shorter:
 * a set may mix packed and plain messages. */
#ifndef PSTRAIN_NET_MSG_ROWS_H
#define PSTRAIN_NET_MSG_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "msg.h"

#define MSG_ROWS_HDR_BYTES 32u
/* Header byte 2. */
#define MSG_ROWS_IDS_PACKED 0x01u  /* SPULL, SPUSH: the ids as net/idpack.h packs them */
#define MSG_ROWS_WANT_PACKED 0x02u /* SPULL: ROWS's float32 values packed, please */

/* The bytes a message's rows may take (the header comes on top). */
#define MSG_ROWS_BODY_MAX WIRE_CHUNK_MAX
/* The widest row a message must carry (core/nn/embed.h's EMBED_MAX_DIM). */
#define MSG_ROWS_DIM_MAX 1024

/* One message. ids and vals point into the buffer decoded (little-endian,
 * maybe unaligned: read them with msg_rows_ids / msg_rows_vals) or, for
 * the encoder, are ignored (the rows come as arrays). */
struct msg_rows {
	uint8_t type;
	uint8_t dtype;        /* WIRE_F32, WIRE_BF16 or WIRE_F32P (ROWS, SPUSH); SPULL: WIRE_F32.
			       * Encoding: F32P packs where that is shorter */
	uint8_t flags;        /* MSG_ROWS_*; encoding: IDS_PACKED packs where that is shorter */
	uint32_t shard;
	uint64_t version;
	uint32_t total, first, count;
	uint32_t worker;
	/* decoded: */
	const uint8_t *ids;   /* (count) u64s or packed, idlen bytes; NULL for ROWS */
	size_t idlen;
	uint64_t id_first, id_last; /* with count > 0 */
	const uint8_t *vals;  /* (count, DIM) of dtype, vlen bytes; NULL for SPULL */
	size_t vlen;
};

/* Most rows one message of this type carries at width dim (1..
 * MSG_ROWS_DIM_MAX) with values of dtype (B bytes each, 4 for packed
 * float32): 8192 ids, 65536 / (B dim) rows of values, or 65536 / (8 + B
 * dim) rows of both. 0 for anything else (SPULL: any dtype but
 * WIRE_F32). */
uint32_t msg_rows_max(uint8_t type, int dim, unsigned dtype);

/* The message's length for count rows at width dim of dtype, unpacked
 * (the most a packed one takes). */
size_t msg_rows_bytes(uint8_t type, uint32_t count, int dim, unsigned dtype);

/* m's header, then ids[0 .. count) (SPULL, SPUSH) and vals[0 .. count *
 * dim) (ROWS, SPUSH; as m->dtype, bf16 rounded to nearest even) into buf
 * (cap bytes, at least the message's unpacked length). The ids are packed
 * where m->flags asks and that is shorter, the values where m->dtype is
 * WIRE_F32P and that is shorter; the header says what was. -EINVAL for a
 * field that may not be sent (a dtype msg_rows_max refuses, a flag the
 * type may not set, a count above msg_rows_max, 0 with total > 0, first
 * + count > total, a worker on other than SPUSH, ids not ascending),
 * -ENOBUFS if cap is short. */
MSG_MUST_CHECK int msg_encode_rows(uint8_t *buf, size_t cap, const struct msg_rows *m,
				   const uint64_t *ids /* (count) */, const float *vals /* (count, dim) */,
				   int dim, size_t *len, char *err, size_t errlen);

/* One message of exactly len bytes of any of the three types at width
 * dim. Refused: another type, a length other than the count, dtype and
 * packings imply, a dtype msg_rows_max refuses, a flag the type may not
 * set, a reserved byte not zero, a count above msg_rows_max or 0 with
 * total > 0, first + count > total, a worker on other than SPUSH, ids
 * not strictly ascending (a duplicate or an unsorted row), a packing
 * msg_encode_rows would not have written (net/idpack.h, net/fpack.h).
 * Values are not looked at: whether a gradient is finite is the ps's
 * check. */
MSG_MUST_CHECK int msg_decode_rows(const uint8_t *buf, size_t len, int dim, struct msg_rows *out,
				   char *err, size_t errlen);

/* The ids / the values of a decoded message's rows, in host order. */
void msg_rows_ids(uint64_t *dst /* (count) */, const struct msg_rows *m);
void msg_rows_vals(float *dst /* (count, dim) */, const struct msg_rows *m, int dim);

/* Receiving one set of rows of dtype (float32 may come packed too),
 * message by message. The first message fixes the version, the total (at
 * most cap, or exactly want when want is not MSG_ROWS_ANY), the worker
 * and (SPULL) whether the answer is wanted packed; every later one must
 * carry the same, the type and shard given, and be the next in order:
 * first = rows so far and count = min(msg_rows_max, total - first); its
 * first id above the last one taken (the ids of one set are strictly
 * ascending). */
#define MSG_ROWS_ANY UINT64_MAX
struct msg_rows_asm {
	uint8_t type;
	uint8_t dtype;
	uint32_t shard;
	int dim;
	uint64_t cap, want;
	uint32_t total, received;
	uint64_t version;
	uint32_t worker;
	unsigned want_packed; /* SPULL: its MSG_ROWS_WANT_PACKED */
	uint32_t packed;  /* messages taken with ids or values packed */
	uint64_t last;    /* the last id taken, if any was */
	int started;
};

void msg_rows_asm_init(struct msg_rows_asm *a, uint8_t type, uint8_t dtype, uint32_t shard, int dim,
		       uint64_t cap, uint64_t want);
/* Checks m (decoded at a's width) against a and copies its ids to ids +
 * m->first and its values to vals + m->first * dim (either may be NULL).
 * 1 when the set is complete, 0 when more is due; -EPROTO (a unchanged,
 * nothing copied) otherwise. */
MSG_MUST_CHECK int msg_rows_asm_add(struct msg_rows_asm *a, const struct msg_rows *m, uint64_t *ids,
				    float *vals, char *err, size_t errlen);
int msg_rows_asm_done(const struct msg_rows_asm *a);

#endif
