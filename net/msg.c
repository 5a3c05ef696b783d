/* Message bodies (see msg.h and docs/PROTOCOL.md, "Messages"). Each decoder
 * follows the same steps, in order: the length the type implies (exact for
 * fixed messages; for PARAMS/PUSH and ERROR first the fixed header, then the
 * length field, then the exact total), the type byte, the reserved bytes,
 * then each field's range. Nothing after the type byte is read before the
 * length has been checked against the bytes that field needs. */
#include "msg.h"
#include "msg_priv.h"
#include "../base/err.h"
#include "bf16.h"
#include "fpack.h"
#include "xdelta.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>


/* ---- shared checks ------------------------------------------------------- */

int check_fixed(const uint8_t *buf, size_t len, uint8_t type, size_t want, char *err,
		size_t errlen)
{
	const char *name = wire_msg_name(type);

	if (len != want)
		return err_set(err, errlen, -EMSGSIZE, "%s: %zu bytes, expected %zu", name, len, want);
	if (buf[0] != type)
		return err_set(err, errlen, -EPROTO, "%s: type byte is %u (%s), expected %u", name,
			    buf[0], wire_msg_name(buf[0]), type);
	return 0;
}

int check_zero(const uint8_t *buf, size_t from, size_t to, const char *name, char *err,
	       size_t errlen)
{
	for (size_t i = from; i < to; i++)
		if (buf[i])
			return err_set(err, errlen, -EPROTO,
				    "%s: reserved byte %zu is 0x%02x, expected 0", name, i,
				    buf[i]);
	return 0;
}

int check_cap(size_t cap, size_t need, uint8_t type, char *err, size_t errlen)
{
	if (cap < need)
		return err_set(err, errlen, -ENOBUFS, "%s: needs %zu bytes, buffer has %zu",
			    wire_msg_name(type), need, cap);
	return 0;
}

void put_head(uint8_t *buf, uint8_t type, size_t n)
{
	memset(buf, 0, n);
	buf[0] = type;
}

int msg_type(const uint8_t *buf, size_t len, char *err, size_t errlen)
{
	if (len < 1)
		return err_set(err, errlen, -EMSGSIZE, "empty message");
	if (buf[0] == WIRE_HELLO)
		return err_set(err, errlen, -EPROTO, "HELLO is not sent inside a frame");
	if (buf[0] < WIRE_MSG_FIRST || buf[0] > WIRE_MSG_LAST)
		return err_set(err, errlen, -EPROTO, "unknown message type %u", buf[0]);
	return buf[0];
}

/* ---- PULL: 16 bytes ------------------------------------------------------
 * 0 type, 1 flags u8 (MSG_PULL_*), 2..4 reserved, 4 shard u32,
 * 8 version u64 */

int msg_encode_pull(uint8_t *buf, size_t cap, const struct msg_pull *m, size_t *len, char *err,
		    size_t errlen)
{
	int rc = check_cap(cap, MSG_PULL_BYTES, WIRE_PULL, err, errlen);
	if (rc < 0)
		return rc;
	if (m->flags & ~MSG_PULL_FLAGS)
		return err_set(err, errlen, -EINVAL, "PULL: unknown flags 0x%x", m->flags);
	put_head(buf, WIRE_PULL, MSG_PULL_BYTES);
	buf[1] = m->flags;
	wire_put_u32(buf + 4, m->shard);
	wire_put_u64(buf + 8, m->version);
	*len = MSG_PULL_BYTES;
	return 0;
}

int msg_decode_pull(const uint8_t *buf, size_t len, struct msg_pull *out, char *err,
		    size_t errlen)
{
	int rc = check_fixed(buf, len, WIRE_PULL, MSG_PULL_BYTES, err, errlen);
	if (rc == 0)
		rc = check_zero(buf, 2, 4, "PULL", err, errlen);
	if (rc < 0)
		return rc;
	if (buf[1] & ~MSG_PULL_FLAGS)
		return err_set(err, errlen, -EPROTO, "PULL: unknown flags 0x%x", buf[1]);
	out->flags = buf[1];
	out->shard = wire_get_u32(buf + 4);
	out->version = wire_get_u64(buf + 8);
	return 0;
}

/* ---- PARAMS / PUSH: 32 bytes + 4 or 2 * count --------------------------
 * 0 type, 1 dtype u8 (0 float32, 1 bf16, 2 float32 packed), 2..4
 * reserved, 4 shard u32, 8 version u64, 16 offset u64, 24 count u32
 * (values, 1..msg_chunk_max), 28 worker u32 (PARAMS: 0), 32 count values
 * of dtype (packed: net/fpack.h's body, shorter than count float32s)
 *
 * The dtype is in every chunk, not agreed once per connection: the
 * receiver checks it against what it expects (msg_assembly), so two peers
 * whose configs somehow disagree get a message naming both dtypes rather
 * than a tensor of garbage, and a chunk is self-describing for the fuzzers
 * and for debugging. It costs a byte that was reserved. */

void chunk_put_head(uint8_t *buf, const struct msg_chunk *c)
{
	put_head(buf, c->type, MSG_CHUNK_HDR_BYTES);
	buf[1] = c->dtype;
	wire_put_u32(buf + 4, c->shard);
	wire_put_u64(buf + 8, c->version);
	wire_put_u64(buf + 16, c->offset);
	wire_put_u32(buf + 24, c->count);
	wire_put_u32(buf + 28, c->worker);
}

static int dtype_ok(unsigned dt)
{
	return dt <= WIRE_DTYPE_LAST;
}

int msg_encode_chunk(uint8_t *buf, size_t cap, const struct msg_chunk *c, const float *src,
		     size_t *len, char *err, size_t errlen)
{
	return msg_encode_chunk_parts(buf, cap, c, src, len, NULL, NULL, err, errlen);
}

int msg_encode_chunk_parts(uint8_t *buf, size_t cap, const struct msg_chunk *c, const float *src,
			   size_t *len, const uint8_t **body, size_t *blen, char *err,
			   size_t errlen)
{
	const char *name = wire_msg_name(c->type);
	int rc;

	if (c->type != WIRE_PARAMS && c->type != WIRE_PUSH)
		return err_set(err, errlen, -EINVAL, "chunk: type %u is neither PARAMS nor PUSH",
			    c->type);
	if (!dtype_ok(c->dtype))
		return err_set(err, errlen, -EINVAL, "%s: unknown dtype %u", name, c->dtype);
	if (c->count == 0 || c->count > msg_chunk_max(c->dtype))
		return err_set(err, errlen, -EINVAL, "%s: count %u is not in 1..%u (%s)", name,
			    c->count, msg_chunk_max(c->dtype), wire_dtype_name(c->dtype));
	if (c->type == WIRE_PARAMS && c->worker != 0)
		return err_set(err, errlen, -EINVAL, "PARAMS: worker must be 0, not %u", c->worker);
	if (c->offset > UINT64_MAX - c->count)
		return err_set(err, errlen, -EINVAL, "%s: offset %llu + count %u overflows", name,
			    (unsigned long long)c->offset, c->count);
	rc = check_cap(cap, MSG_CHUNK_BYTES(c->count, c->dtype), c->type, err, errlen);
	if (rc < 0)
		return rc;
	chunk_put_head(buf, c);
	if (body) {
		*body = NULL;
		*blen = 0;
	}
	if (c->dtype == WIRE_F32X && c->type != WIRE_PARAMS)
		return err_set(err, errlen, -EINVAL, "%s: XORs are for PARAMS only", name);
	if (c->dtype == WIRE_F32F)
		return err_set(err, errlen, -EINVAL, "%s: factors go by msg_encode_chunk_factors", name);
	if (c->dtype == WIRE_F32X && c->base) {
		size_t n = xdelta_encode(buf + MSG_CHUNK_HDR_BYTES, 4 * (size_t)c->count - 1, src, c->base,
					 c->count);
		if (n) {
			*len = MSG_CHUNK_HDR_BYTES + n;
			return 0;
		}
	}
	if (c->dtype == WIRE_F32P || c->dtype == WIRE_F32X) {
		/* A chunk that would not shrink goes as float32 (the receiver
		 * takes either where it expects float32); XORs that would not,
		 * or with no base to take them against, packed. */
		buf[1] = WIRE_F32P;
		size_t n = fpack_encode(buf + MSG_CHUNK_HDR_BYTES, 4 * (size_t)c->count - 1, src,
					c->count);
		if (n) {
			*len = MSG_CHUNK_HDR_BYTES + n;
			return 0;
		}
		buf[1] = WIRE_F32;
	}
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	/* float32 on a little-endian host is already the wire's bytes. */
	if (body && buf[1] == WIRE_F32) {
		*body = (const uint8_t *)src;
		*blen = (size_t)c->count * sizeof(float);
		*len = MSG_CHUNK_HDR_BYTES;
		return 0;
	}
#endif
	if (c->dtype == WIRE_BF16)
		bf16_from_f32(buf + MSG_CHUNK_HDR_BYTES, src, c->count);
	else
		wire_put_f32s(buf + MSG_CHUNK_HDR_BYTES, src, c->count);
	*len = MSG_CHUNK_BYTES(c->count, wire_dtype_values(c->dtype));
	return 0;
}

/* A chunk from buf: all len bytes of it, or (values 0) only its header,
 * for a float32 chunk whose values were read elsewhere. */
static int chunk_decode(const uint8_t *buf, size_t len, int values, struct msg_chunk *out,
			char *err, size_t errlen)
{
	const char *name;
	uint32_t count;
	uint8_t dt;
	int rc;

	if (len < 1)
		return err_set(err, errlen, -EMSGSIZE, "PARAMS/PUSH: empty message");
	if (buf[0] != WIRE_PARAMS && buf[0] != WIRE_PUSH)
		return err_set(err, errlen, -EPROTO,
			    "PARAMS/PUSH: type byte is %u (%s), expected %u or %u", buf[0],
			    wire_msg_name(buf[0]), WIRE_PARAMS, WIRE_PUSH);
	name = wire_msg_name(buf[0]);
	/* The header and one value of the smallest dtype, so that a bf16
	 * chunk of one value (34 bytes) passes this first check. */
	if (len < MSG_CHUNK_HDR_BYTES + 2u)
		return err_set(err, errlen, -EMSGSIZE, "%s: %zu bytes, expected at least %u", name,
			    len, MSG_CHUNK_HDR_BYTES + 2u);
	if (len > MSG_CHUNK_BYTES_MAX)
		return err_set(err, errlen, -EMSGSIZE, "%s: %zu bytes, expected at most %zu", name,
			    len, MSG_CHUNK_BYTES_MAX);
	dt = buf[1];
	if (!dtype_ok(dt))
		return err_set(err, errlen, -EPROTO, "%s: unknown dtype %u (0 fp32, 1 bf16, 2 fp32 packed, 3 fp32 as XORs, 4 fp32 as factors)",
			       name, dt);
	if (!values && dt != WIRE_F32)
		return err_set(err, errlen, -EPROTO, "%s: a %s chunk whose values were not read",
			       name, wire_dtype_name(dt));
	rc = check_zero(buf, 2, 4, name, err, errlen);
	if (rc < 0)
		return rc;
	count = wire_get_u32(buf + 24);
	if (count == 0 || count > msg_chunk_max(dt))
		return err_set(err, errlen, -EPROTO, "%s: count %u is not in 1..%u (%s)", name, count,
			    msg_chunk_max(dt), wire_dtype_name(dt));
	if (dt == WIRE_F32X && buf[0] != WIRE_PARAMS)
		return err_set(err, errlen, -EPROTO, "%s: XORs (dtype 3) are for PARAMS only", name);
	if (dt == WIRE_F32P) {
		if (fpack_check(buf + MSG_CHUNK_HDR_BYTES, len - MSG_CHUNK_HDR_BYTES, count))
			return err_set(err, errlen, -EPROTO,
				       "%s: %zu bytes are not a packing of %u float32 values", name,
				       len - MSG_CHUNK_HDR_BYTES, count);
	} else if (dt == WIRE_F32F) {
		if (buf[0] != WIRE_PUSH)
			return err_set(err, errlen, -EPROTO, "%s: factors (dtype 4) are for PUSH only", name);
		if (msg_factors_check(buf + MSG_CHUNK_HDR_BYTES, len - MSG_CHUNK_HDR_BYTES, count))
			return err_set(err, errlen, -EPROTO,
				       "%s: %zu bytes are not a share of factors for %u values (a run, a batch of 1 or more, at most %u values, their zeros' bitmap, the rest)",
				       name, len - MSG_CHUNK_HDR_BYTES, count, count);
	} else if (dt == WIRE_F32X) {
		if (xdelta_check(buf + MSG_CHUNK_HDR_BYTES, len - MSG_CHUNK_HDR_BYTES, count))
			return err_set(err, errlen, -EPROTO,
				       "%s: %zu bytes are not the XORs of %u float32 values", name,
				       len - MSG_CHUNK_HDR_BYTES, count);
	} else if (len != MSG_CHUNK_BYTES(count, dt))
		return err_set(err, errlen, -EMSGSIZE,
			    "%s: %zu bytes, but count %u needs exactly %zu (%s)", name, len, count,
			    MSG_CHUNK_BYTES(count, dt), wire_dtype_name(dt));
	out->type = buf[0];
	out->dtype = dt;
	out->shard = wire_get_u32(buf + 4);
	out->version = wire_get_u64(buf + 8);
	out->offset = wire_get_u64(buf + 16);
	out->count = count;
	out->worker = wire_get_u32(buf + 28);
	out->data = values ? buf + MSG_CHUNK_HDR_BYTES : NULL;
	out->bytes = values ? len - MSG_CHUNK_HDR_BYTES : 0;
	if (out->type == WIRE_PARAMS && out->worker != 0)
		return err_set(err, errlen, -EPROTO, "PARAMS: worker field is %u, expected 0",
			    out->worker);
	if (out->offset > UINT64_MAX - count)
		return err_set(err, errlen, -ERANGE, "%s: offset %llu + count %u overflows", name,
			    (unsigned long long)out->offset, count);
	return 0;
}

int msg_decode_chunk(const uint8_t *buf, size_t len, struct msg_chunk *out, char *err,
		     size_t errlen)
{
	return chunk_decode(buf, len, 1, out, err, errlen);
}

int msg_decode_chunk_head(const uint8_t *buf, size_t len, struct msg_chunk *out, char *err,
			  size_t errlen)
{
	return chunk_decode(buf, len, 0, out, err, errlen);
}

void msg_chunk_floats(float *dst, const struct msg_chunk *c)
{
	if (c->dtype == WIRE_BF16)
		bf16_to_f32(dst, c->data, c->count);
	else if (c->dtype == WIRE_F32P)
		fpack_decode(dst, c->data, c->count);
	else
		wire_get_f32s(dst, c->data, c->count);
}

/* ---- ACK: 24 bytes --------------------------------------------------------
 * 0 type, 1..4 reserved, 4 shard u32, 8 version u64, 16 status u32,
 * 20 reserved u32 */

static int ack_status_ok(uint32_t s)
{
	return s >= MSG_ACK_FIRST && s <= MSG_ACK_LAST;
}

int msg_encode_ack(uint8_t *buf, size_t cap, const struct msg_ack *m, size_t *len, char *err,
		   size_t errlen)
{
	int rc;

	if (!ack_status_ok(m->status))
		return err_set(err, errlen, -EINVAL, "ACK: unknown status %u", m->status);
	rc = check_cap(cap, MSG_ACK_BYTES, WIRE_ACK, err, errlen);
	if (rc < 0)
		return rc;
	put_head(buf, WIRE_ACK, MSG_ACK_BYTES);
	wire_put_u32(buf + 4, m->shard);
	wire_put_u64(buf + 8, m->version);
	wire_put_u32(buf + 16, m->status);
	*len = MSG_ACK_BYTES;
	return 0;
}

int msg_decode_ack(const uint8_t *buf, size_t len, struct msg_ack *out, char *err,
		   size_t errlen)
{
	int rc = check_fixed(buf, len, WIRE_ACK, MSG_ACK_BYTES, err, errlen);
	if (rc == 0)
		rc = check_zero(buf, 1, 4, "ACK", err, errlen);
	if (rc == 0)
		rc = check_zero(buf, 20, 24, "ACK", err, errlen);
	if (rc < 0)
		return rc;
	out->shard = wire_get_u32(buf + 4);
	out->version = wire_get_u64(buf + 8);
	out->status = wire_get_u32(buf + 16);
	if (!ack_status_ok(out->status))
		return err_set(err, errlen, -EPROTO, "ACK: unknown status %u", out->status);
	return 0;
}

/* ---- CHECKPOINT: 16 bytes -------------------------------------------------
 * 0 type, 1 has_acc (0 or 1), 2..4 reserved, 4 acc u32 (millionths, 0 unless
 * has_acc), 8 step u64 */

#define MSG_ACC_ONE 1000000u

int msg_encode_checkpoint(uint8_t *buf, size_t cap, const struct msg_checkpoint *m,
			  size_t *len, char *err, size_t errlen)
{
	int rc = check_cap(cap, MSG_CHECKPOINT_BYTES, WIRE_CHECKPOINT, err, errlen);
	if (rc < 0)
		return rc;
	if (m->has_acc > 1 || (m->has_acc && !(m->acc >= 0 && m->acc <= 1)))
		return err_set(err, errlen, -EINVAL, "CHECKPOINT: accuracy %g not in [0, 1]", m->acc);
	put_head(buf, WIRE_CHECKPOINT, MSG_CHECKPOINT_BYTES);
	if (m->has_acc) {
		buf[1] = 1;
		wire_put_u32(buf + 4, (uint32_t)(m->acc * MSG_ACC_ONE + 0.5));
	}
	wire_put_u64(buf + 8, m->step);
	*len = MSG_CHECKPOINT_BYTES;
	return 0;
}

int msg_decode_checkpoint(const uint8_t *buf, size_t len, struct msg_checkpoint *out,
			  char *err, size_t errlen)
{
	int rc = check_fixed(buf, len, WIRE_CHECKPOINT, MSG_CHECKPOINT_BYTES, err, errlen);
	if (rc == 0 && buf[1] > 1)
		rc = err_set(err, errlen, -EPROTO, "CHECKPOINT: byte 1 is %u, not 0 or 1", buf[1]);
	if (rc == 0)
		rc = check_zero(buf, 2, buf[1] ? 4 : 8, "CHECKPOINT", err, errlen);
	if (rc < 0)
		return rc;
	uint32_t a = wire_get_u32(buf + 4);
	if (a > MSG_ACC_ONE)
		return err_set(err, errlen, -EPROTO, "CHECKPOINT: accuracy %u millionths, above 1", a);
	out->step = wire_get_u64(buf + 8);
	out->has_acc = buf[1];
	out->acc = (double)a / MSG_ACC_ONE;
	return 0;
}

/* ---- HEARTBEAT: 48 bytes -------------------------------------------------
 * 0 type, 1..8 reserved, 8 version u64, 16..48 missing-worker bitmap */

int msg_encode_heartbeat(uint8_t *buf, size_t cap, const struct msg_heartbeat *m, size_t *len,
			 char *err, size_t errlen)
{
	int rc = check_cap(cap, MSG_HEARTBEAT_BYTES, WIRE_HEARTBEAT, err, errlen);
	if (rc < 0)
		return rc;
	put_head(buf, WIRE_HEARTBEAT, MSG_HEARTBEAT_BYTES);
	wire_put_u64(buf + 8, m->version);
	memcpy(buf + 16, m->missing, sizeof(m->missing));
	*len = MSG_HEARTBEAT_BYTES;
	return 0;
}

int msg_decode_heartbeat(const uint8_t *buf, size_t len, struct msg_heartbeat *out, char *err,
			 size_t errlen)
{
	int rc = check_fixed(buf, len, WIRE_HEARTBEAT, MSG_HEARTBEAT_BYTES, err, errlen);
	if (rc == 0)
		rc = check_zero(buf, 1, 8, "HEARTBEAT", err, errlen);
	if (rc < 0)
		return rc;
	out->version = wire_get_u64(buf + 8);
	memcpy(out->missing, buf + 16, sizeof(out->missing));
	return 0;
}

/* ---- ROLLBACK: 16 bytes ---------------------------------------------------
 * 0 type, 1..8 reserved, 8 step u64 */

int msg_encode_rollback(uint8_t *buf, size_t cap, const struct msg_rollback *m, size_t *len,
			char *err, size_t errlen)
{
	int rc = check_cap(cap, MSG_ROLLBACK_BYTES, WIRE_ROLLBACK, err, errlen);
	if (rc < 0)
		return rc;
	put_head(buf, WIRE_ROLLBACK, MSG_ROLLBACK_BYTES);
	wire_put_u64(buf + 8, m->step);
	*len = MSG_ROLLBACK_BYTES;
	return 0;
}

int msg_decode_rollback(const uint8_t *buf, size_t len, struct msg_rollback *out, char *err,
			size_t errlen)
{
	int rc = check_fixed(buf, len, WIRE_ROLLBACK, MSG_ROLLBACK_BYTES, err, errlen);
	if (rc == 0)
		rc = check_zero(buf, 1, 8, "ROLLBACK", err, errlen);
	if (rc < 0)
		return rc;
	out->step = wire_get_u64(buf + 8);
	return 0;
}

/* ---- REPORT: 64 bytes + W ------------------------------------------------
 * 0 type, 1 flags u8 (bit 0 complete, 1 final, 2 has_rate, 3
 * has_checkpoint; the others 0), 2..4 reserved, 4 shard u32, 8 version
 * u64, 16 total u64, 24 applied u64, 32 stale u64, 40 checkpoint u64 (0
 * unless has_checkpoint), 48 rate f32 (versions/s; bits 0 unless
 * has_rate), 52 workers u32 (W, 1..256), 56 uptime_ms u64, 64 W state
 * bytes (enum msg_worker_state)
 *
 * A rate the ps does not know is a clear flag, not a NaN or a negative
 * number: the decoder then refuses every non-finite or negative float, so
 * whatever an observer prints is a number it can format. */

enum {
	REPORT_COMPLETE = 1u << 0,
	REPORT_FINAL = 1u << 1,
	REPORT_HAS_RATE = 1u << 2,
	REPORT_HAS_CKPT = 1u << 3,
	REPORT_FLAGS = REPORT_COMPLETE | REPORT_FINAL | REPORT_HAS_RATE | REPORT_HAS_CKPT,
};

const char *msg_worker_state_name(unsigned s)
{
	static const char *const names[] = {
		[MSG_WORKER_ABSENT] = "absent", [MSG_WORKER_LIVE] = "live",
		[MSG_WORKER_DONE] = "done",	[MSG_WORKER_LEFT] = "left",
		[MSG_WORKER_LOST] = "lost",	[MSG_WORKER_AWAY] = "away",
	};
	return s <= MSG_WORKER_STATE_LAST ? names[s] : "?";
}

static int rate_ok(float r)
{
	return isfinite(r) && r >= 0;
}

int msg_encode_report(uint8_t *buf, size_t cap, const struct msg_report *m, size_t *len,
		      char *err, size_t errlen)
{
	if (m->workers < 1 || m->workers > MSG_REPORT_WORKERS)
		return err_set(err, errlen, -EINVAL, "REPORT: %u workers, not 1..%u", m->workers,
			       MSG_REPORT_WORKERS);
	if (m->complete > 1 || m->final > 1 || m->has_rate > 1 || m->has_checkpoint > 1)
		return err_set(err, errlen, -EINVAL, "REPORT: a flag is not 0 or 1");
	if (m->has_rate && !rate_ok(m->rate))
		return err_set(err, errlen, -EINVAL, "REPORT: rate %g is not finite and >= 0",
			       (double)m->rate);
	for (uint32_t w = 0; w < m->workers; w++)
		if (m->state[w] > MSG_WORKER_STATE_LAST)
			return err_set(err, errlen, -EINVAL, "REPORT: worker %u has unknown state %u",
				       w, m->state[w]);
	if (m->nevents > MSG_REPORT_EVENTS)
		return err_set(err, errlen, -EINVAL, "REPORT: %u events, at most %u", m->nevents, MSG_REPORT_EVENTS);
	size_t n = MSG_REPORT_BYTES(m->workers) + (size_t)m->nevents * MSG_REPORT_EVENT_BYTES;
	int rc = check_cap(cap, n, WIRE_REPORT, err, errlen);
	if (rc == 0)
		rc = report_events_put(buf + MSG_REPORT_BYTES(m->workers), m->events, m->nevents, err, errlen);
	if (rc < 0)
		return rc;
	put_head(buf, WIRE_REPORT, MSG_REPORT_HDR_BYTES);
	buf[1] = (uint8_t)((m->complete ? REPORT_COMPLETE : 0) | (m->final ? REPORT_FINAL : 0) |
			   (m->has_rate ? REPORT_HAS_RATE : 0) |
			   (m->has_checkpoint ? REPORT_HAS_CKPT : 0));
	wire_put_u32(buf + 4, m->shard);
	wire_put_u64(buf + 8, m->version);
	wire_put_u64(buf + 16, m->total);
	wire_put_u64(buf + 24, m->applied);
	wire_put_u64(buf + 32, m->stale);
	wire_put_u64(buf + 40, m->has_checkpoint ? m->checkpoint : 0);
	wire_put_f32(buf + 48, m->has_rate ? m->rate : 0.0f);
	wire_put_u32(buf + 52, m->workers);
	wire_put_u64(buf + 56, m->uptime_ms);
	memcpy(buf + MSG_REPORT_HDR_BYTES, m->state, m->workers);
	*len = n;
	return 0;
}

int msg_decode_report(const uint8_t *buf, size_t len, struct msg_report *out, char *err,
		      size_t errlen)
{
	if (len < 1)
		return err_set(err, errlen, -EMSGSIZE, "REPORT: empty message");
	if (buf[0] != WIRE_REPORT)
		return err_set(err, errlen, -EPROTO, "REPORT: type byte is %u (%s), expected %u",
			       buf[0], wire_msg_name(buf[0]), WIRE_REPORT);
	if (len < MSG_REPORT_BYTES(1) || len > MSG_REPORT_BYTES_ALL)
		return err_set(err, errlen, -EMSGSIZE, "REPORT: %zu bytes, expected %zu..%zu", len,
			       MSG_REPORT_BYTES(1), MSG_REPORT_BYTES_ALL);
	int rc = check_zero(buf, 2, 4, "REPORT", err, errlen);
	if (rc < 0)
		return rc;
	uint8_t flags = buf[1];
	if (flags & ~REPORT_FLAGS)
		return err_set(err, errlen, -EPROTO, "REPORT: unknown flags 0x%02x", flags);
	uint32_t W = wire_get_u32(buf + 52);
	if (W < 1 || W > MSG_REPORT_WORKERS)
		return err_set(err, errlen, -EPROTO, "REPORT: %u workers, not 1..%u", W,
			       MSG_REPORT_WORKERS);
	size_t tail = len - (len < MSG_REPORT_BYTES(W) ? len : MSG_REPORT_BYTES(W));
	if (len < MSG_REPORT_BYTES(W) || tail % MSG_REPORT_EVENT_BYTES ||
	    tail > MSG_REPORT_EVENTS * MSG_REPORT_EVENT_BYTES)
		return err_set(err, errlen, -EMSGSIZE,
			       "REPORT: %zu bytes, but %u workers need exactly %zu (and %u a recent event, up to %u)",
			       len, W, MSG_REPORT_BYTES(W), MSG_REPORT_EVENT_BYTES, MSG_REPORT_EVENTS);
	memset(out, 0, sizeof(*out));
	out->nevents = (uint32_t)(tail / MSG_REPORT_EVENT_BYTES);
	rc = report_events_get(buf + MSG_REPORT_BYTES(W), out->events, out->nevents, err, errlen);
	if (rc < 0)
		return rc;
	out->complete = (flags & REPORT_COMPLETE) != 0;
	out->final = (flags & REPORT_FINAL) != 0;
	out->has_rate = (flags & REPORT_HAS_RATE) != 0;
	out->has_checkpoint = (flags & REPORT_HAS_CKPT) != 0;
	out->shard = wire_get_u32(buf + 4);
	out->version = wire_get_u64(buf + 8);
	out->total = wire_get_u64(buf + 16);
	out->applied = wire_get_u64(buf + 24);
	out->stale = wire_get_u64(buf + 32);
	out->checkpoint = wire_get_u64(buf + 40);
	out->rate = wire_get_f32(buf + 48);
	out->workers = W;
	out->uptime_ms = wire_get_u64(buf + 56);
	if (!out->has_checkpoint && out->checkpoint)
		return err_set(err, errlen, -EPROTO, "REPORT: a checkpoint step without its flag");
	if (!out->has_rate && wire_get_u32(buf + 48))
		return err_set(err, errlen, -EPROTO, "REPORT: a rate without its flag");
	if (out->has_rate && !rate_ok(out->rate))
		return err_set(err, errlen, -EPROTO, "REPORT: rate %g is not finite and >= 0",
			       (double)out->rate);
	for (uint32_t w = 0; w < W; w++) {
		uint8_t s = buf[MSG_REPORT_HDR_BYTES + w];
		if (s > MSG_WORKER_STATE_LAST)
			return err_set(err, errlen, -EPROTO, "REPORT: worker %u has unknown state %u",
				       w, s);
		out->state[w] = s;
	}
	return 0;
}

/* ---- STATUS: 32 bytes -----------------------------------------------------
 * 0 type, 1 reply u8 (0 request, 1 reply), 2 complete u8 (0 or 1; a
 * request: 0), 3 reserved, 4 shard u32, 8 version u64, 16 applied u64,
 * 24 stale u64 (a request: all three 0) */

int msg_encode_status(uint8_t *buf, size_t cap, const struct msg_status *m, size_t *len,
		      char *err, size_t errlen)
{
	int rc;

	if (m->reply > 1)
		return err_set(err, errlen, -EINVAL, "STATUS: reply flag %u is not 0 or 1", m->reply);
	if (m->complete > 1)
		return err_set(err, errlen, -EINVAL, "STATUS: complete flag %u is not 0 or 1", m->complete);
	if (!m->reply && (m->version || m->applied || m->stale || m->complete))
		return err_set(err, errlen, -EINVAL, "STATUS: a request carries no counters");
	rc = check_cap(cap, MSG_STATUS_BYTES, WIRE_STATUS, err, errlen);
	if (rc < 0)
		return rc;
	put_head(buf, WIRE_STATUS, MSG_STATUS_BYTES);
	buf[1] = m->reply;
	buf[2] = m->complete;
	wire_put_u32(buf + 4, m->shard);
	wire_put_u64(buf + 8, m->version);
	wire_put_u64(buf + 16, m->applied);
	wire_put_u64(buf + 24, m->stale);
	*len = MSG_STATUS_BYTES;
	return 0;
}

int msg_decode_status(const uint8_t *buf, size_t len, struct msg_status *out, char *err,
		      size_t errlen)
{
	int rc = check_fixed(buf, len, WIRE_STATUS, MSG_STATUS_BYTES, err, errlen);
	if (rc == 0)
		rc = check_zero(buf, 3, 4, "STATUS", err, errlen);
	if (rc < 0)
		return rc;
	if (buf[1] > 1)
		return err_set(err, errlen, -EPROTO, "STATUS: reply flag %u is not 0 or 1", buf[1]);
	if (buf[2] > 1)
		return err_set(err, errlen, -EPROTO, "STATUS: complete flag %u is not 0 or 1", buf[2]);
	out->reply = buf[1];
	out->complete = buf[2];
	out->shard = wire_get_u32(buf + 4);
	out->version = wire_get_u64(buf + 8);
	out->applied = wire_get_u64(buf + 16);
	out->stale = wire_get_u64(buf + 24);
	if (!out->reply && (out->version || out->applied || out->stale || out->complete))
		return err_set(err, errlen, -EPROTO, "STATUS: a request carries nonzero counters");
	return 0;
}

/* ---- DONE: 8 bytes --------------------------------------------------------
 * 0 type, 1 leaving u8 (0 or 1), 2..4 reserved, 4 worker u32 */

int msg_encode_done(uint8_t *buf, size_t cap, const struct msg_done *m, size_t *len, char *err,
		    size_t errlen)
{
	if (m->leaving > 1)
		return err_set(err, errlen, -EINVAL, "DONE: leaving flag %u is not 0 or 1", m->leaving);
	int rc = check_cap(cap, MSG_DONE_BYTES, WIRE_DONE, err, errlen);
	if (rc < 0)
		return rc;
	put_head(buf, WIRE_DONE, MSG_DONE_BYTES);
	buf[1] = m->leaving;
	wire_put_u32(buf + 4, m->worker);
	*len = MSG_DONE_BYTES;
	return 0;
}

int msg_decode_done(const uint8_t *buf, size_t len, struct msg_done *out, char *err,
		    size_t errlen)
{
	int rc = check_fixed(buf, len, WIRE_DONE, MSG_DONE_BYTES, err, errlen);
	if (rc == 0)
		rc = check_zero(buf, 2, 4, "DONE", err, errlen);
	if (rc < 0)
		return rc;
	if (buf[1] > 1)
		return err_set(err, errlen, -EPROTO, "DONE: leaving flag %u is not 0 or 1", buf[1]);
	out->leaving = buf[1];
	out->worker = wire_get_u32(buf + 4);
	return 0;
}

/* ---- ERROR: 12 bytes + text -----------------------------------------------
 * 0 type, 1..4 reserved, 4 code u32 (nonzero), 8 text length u32 (0..256),
 * 12 text (printable ASCII 0x20..0x7e only; not NUL-terminated on the wire)
 *
 * Both sides print this text (the worker's log shows the ps's reason and the
 * other way round), so it never carries a byte a terminal would act on: an
 * escape sequence from a peer could rewrite the operator's screen or title,
 * a CR hide the line it ends. The encoder replaces every byte outside
 * 0x20..0x7e with '?', so that an error quoting a UTF-8 path or a peer's
 * bytes still gets through, readable; the decoder refuses such a byte
 * (-EPROTO, the byte named in hex), as it refuses any field our encoder
 * never writes: only a broken or hostile peer sends one, and decode then
 * encode gives back the same bytes. Rejected: replacing on decode too (it
 * would hide that the peer is broken, and the text is the peer's last word
 * before it closes anyway). */

static int text_byte_ok(uint8_t c)
{
	return c >= 0x20 && c <= 0x7e;
}

/* Index of the first byte not allowed in an ERROR text, or n. */
static size_t bad_text_byte(const uint8_t *t, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!text_byte_ok(t[i]))
			return i;
	return n;
}

int msg_encode_error(uint8_t *buf, size_t cap, uint32_t code, const char *text, size_t *len,
		     char *err, size_t errlen)
{
	size_t n = strnlen(text, WIRE_ERROR_TEXT_MAX + 1);
	int rc;

	if (code == 0)
		return err_set(err, errlen, -EINVAL, "ERROR: code 0 is not an error");
	if (n > WIRE_ERROR_TEXT_MAX)
		return err_set(err, errlen, -EINVAL, "ERROR: text is longer than %u bytes",
			    WIRE_ERROR_TEXT_MAX);
	rc = check_cap(cap, MSG_ERROR_HDR_BYTES + n, WIRE_ERROR, err, errlen);
	if (rc < 0)
		return rc;
	put_head(buf, WIRE_ERROR, MSG_ERROR_HDR_BYTES);
	wire_put_u32(buf + 4, code);
	wire_put_u32(buf + 8, (uint32_t)n);
	for (size_t i = 0; i < n; i++) {
		uint8_t c = (uint8_t)text[i];
		buf[MSG_ERROR_HDR_BYTES + i] = text_byte_ok(c) ? c : '?';
	}
	*len = MSG_ERROR_HDR_BYTES + n;
	return 0;
}

int msg_decode_error(const uint8_t *buf, size_t len, struct msg_error *out, char *err,
		     size_t errlen)
{
	uint32_t n;
	size_t bad;
	int rc;

	if (len < MSG_ERROR_HDR_BYTES)
		return err_set(err, errlen, -EMSGSIZE, "ERROR: %zu bytes, expected at least %u", len,
			    MSG_ERROR_HDR_BYTES);
	if (len > MSG_ERROR_BYTES_MAX)
		return err_set(err, errlen, -EMSGSIZE, "ERROR: %zu bytes, expected at most %u", len,
			    MSG_ERROR_BYTES_MAX);
	if (buf[0] != WIRE_ERROR)
		return err_set(err, errlen, -EPROTO, "ERROR: type byte is %u (%s), expected %u",
			    buf[0], wire_msg_name(buf[0]), WIRE_ERROR);
	rc = check_zero(buf, 1, 4, "ERROR", err, errlen);
	if (rc < 0)
		return rc;
	n = wire_get_u32(buf + 8);
	if (n > WIRE_ERROR_TEXT_MAX)
		return err_set(err, errlen, -EPROTO, "ERROR: text length %u is over %u", n,
			    WIRE_ERROR_TEXT_MAX);
	if (len != MSG_ERROR_HDR_BYTES + (size_t)n)
		return err_set(err, errlen, -EMSGSIZE,
			    "ERROR: %zu bytes, but text length %u needs exactly %zu", len, n,
			    MSG_ERROR_HDR_BYTES + (size_t)n);
	out->code = wire_get_u32(buf + 4);
	if (out->code == 0)
		return err_set(err, errlen, -EPROTO, "ERROR: code is 0");
	bad = bad_text_byte(buf + MSG_ERROR_HDR_BYTES, n);
	if (bad != n)
		return err_set(err, errlen, -EPROTO, "ERROR: text byte %zu is 0x%02x", bad,
			    buf[MSG_ERROR_HDR_BYTES + bad]);
	memcpy(out->text, buf + MSG_ERROR_HDR_BYTES, n);
	out->text[n] = '\0';
	return 0;
}

/* ---- chunking ------------------------------------------------------------ */

uint64_t msg_chunks(uint64_t n, unsigned dt)
{
	uint64_t m = msg_chunk_max(dt);
	return n / m + (n % m != 0);
}

void msg_chunk_range(uint64_t n, unsigned dt, uint64_t i, uint64_t *offset, uint32_t *count)
{
	uint64_t m = msg_chunk_max(dt);
	uint64_t off = i * m;
	uint64_t left = off < n ? n - off : 0;

	*offset = off;
	*count = (uint32_t)(left < m ? left : m);
}

int msg_assembly_init(struct msg_assembly *a, uint8_t type, uint32_t shard, uint64_t n,
		      unsigned dtype, char *err, size_t errlen)
{
	if (type != WIRE_PARAMS && type != WIRE_PUSH)
		return err_set(err, errlen, -EINVAL, "assembly: type %u is neither PARAMS nor PUSH",
			    type);
	if (n == 0)
		return err_set(err, errlen, -EINVAL, "%s: assembly of an empty tensor",
			    wire_msg_name(type));
	if (!dtype_ok(dtype))
		return err_set(err, errlen, -EINVAL, "%s: assembly of unknown dtype %u",
			    wire_msg_name(type), dtype);
	*a = (struct msg_assembly){ .type = type, .dtype = (uint8_t)dtype, .shard = shard, .n = n };
	return 0;
}

int msg_assembly_add(struct msg_assembly *a, const struct msg_chunk *c, float *dst, char *err,
		     size_t errlen)
{
	const char *name = wire_msg_name(a->type);

	if (c->type != a->type)
		return err_set(err, errlen, -EPROTO, "%s: got a %s chunk", name,
			    wire_msg_name(c->type));
	/* Peers of one cluster agree on wire_dtype (it is in the config
	 * hash their handshake compares), so this is a broken peer, or one
	 * built with another idea of the key: say both sides. */
	if (wire_dtype_values(c->dtype) != wire_dtype_values(a->dtype))
		return err_set(err, errlen, -EPROTO,
			    "%s: chunk in %s, but this side expects %s ([cluster] wire_dtype differs?)",
			    name, wire_dtype_name(c->dtype), wire_dtype_name(a->dtype));
	if (c->shard != a->shard)
		return err_set(err, errlen, -EPROTO, "%s: chunk for shard %u, expected shard %u",
			    name, c->shard, a->shard);
	if (a->received > 0 && c->version != a->version)
		return err_set(err, errlen, -EPROTO,
			    "%s: chunk at version %llu in a tensor at version %llu", name,
			    (unsigned long long)c->version, (unsigned long long)a->version);
	if (a->received > 0 && c->worker != a->worker)
		return err_set(err, errlen, -EPROTO,
			    "%s: chunk from worker %u in a tensor from worker %u", name,
			    c->worker, a->worker);
	if (c->count == 0 || c->offset > a->n || c->count > a->n - c->offset)
		return err_set(err, errlen, -ERANGE,
			    "%s: chunk [%llu, %llu) is outside the shard's range [0, %llu)", name,
			    (unsigned long long)c->offset,
			    (unsigned long long)c->offset + c->count, (unsigned long long)a->n);
	if (a->received == a->n)
		return err_set(err, errlen, -EPROTO,
			    "%s: chunk at offset %llu after all %llu floats arrived", name,
			    (unsigned long long)c->offset, (unsigned long long)a->n);
	if (c->offset > a->received)
		return err_set(err, errlen, -EPROTO,
			    "%s: chunk at offset %llu leaves a gap after %llu floats", name,
			    (unsigned long long)c->offset, (unsigned long long)a->received);
	if (c->offset < a->received)
		return err_set(err, errlen, -EPROTO,
			    "%s: chunk at offset %llu overlaps the %llu floats received", name,
			    (unsigned long long)c->offset, (unsigned long long)a->received);
	if (dst && c->dtype == WIRE_F32F)
		return err_set(err, errlen, -EPROTO, "%s: factors, but this ps takes whole gradients, not pieces",
			       name);
	if (dst && c->dtype == WIRE_F32X) {
		if (xdelta_apply(dst + c->offset, c->data, c->count))
			return err_set(err, errlen, -EPROTO,
				       "%s: the XORs of [%llu, %llu) at version %llu do not check: this side's values are not the version they were made against",
				       name, (unsigned long long)c->offset,
				       (unsigned long long)c->offset + c->count,
				       (unsigned long long)c->version);
	} else if (dst)
		msg_chunk_floats(dst + c->offset, c);
	if (a->received == 0) {
		a->version = c->version;
		a->worker = c->worker;
	}
	a->received += c->count;
	return a->received == a->n;
}

int msg_assembly_done(const struct msg_assembly *a)
{
	return a->received == a->n;
}
