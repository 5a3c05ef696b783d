/* SPULL, ROWS and SPUSH (see msg_rows.h and docs/PROTOCOL.md, "Rows"):
 * the length first, then the type, the reserved bytes, each field's range
 * and the order of the ids, as net/msg.c's decoders do. */
#include "msg_rows.h"
#include "bf16.h"
#include "fpack.h"
#include "idpack.h"
#include "../base/err.h"

#include <errno.h>
#include <string.h>

static int rows_type_ok(uint8_t t)
{
	return t == WIRE_SPULL || t == WIRE_ROWS || t == WIRE_SPUSH;
}

static int rows_dtype_ok(uint8_t type, unsigned dtype)
{
	return dtype == WIRE_F32 || ((dtype == WIRE_BF16 || dtype == WIRE_F32P) && type != WIRE_SPULL);
}

/* The flags a type may carry. */
static unsigned rows_flags_allowed(uint8_t type)
{
	return type == WIRE_SPULL ? MSG_ROWS_IDS_PACKED | MSG_ROWS_WANT_PACKED :
	       type == WIRE_SPUSH ? MSG_ROWS_IDS_PACKED : 0;
}

/* A row's bytes unpacked: packed ones take fewer. */
static size_t row_bytes(uint8_t type, int dim, unsigned dtype)
{
	size_t ids = type == WIRE_ROWS ? 0 : 8;
	size_t vals = type == WIRE_SPULL ? 0 : WIRE_DTYPE_BYTES(dtype) * (size_t)dim;
	return ids + vals;
}

uint32_t msg_rows_max(uint8_t type, int dim, unsigned dtype)
{
	if (!rows_type_ok(type) || dim < 1 || dim > MSG_ROWS_DIM_MAX || !rows_dtype_ok(type, dtype))
		return 0;
	return (uint32_t)(MSG_ROWS_BODY_MAX / row_bytes(type, dim, dtype));
}

size_t msg_rows_bytes(uint8_t type, uint32_t count, int dim, unsigned dtype)
{
	return MSG_ROWS_HDR_BYTES + (size_t)count * row_bytes(type, dim, dtype);
}

/* The fields every message must have right, whoever made it. */
static int rows_fields_ok(const struct msg_rows *m, int dim, int code, char *err, size_t errlen)
{
	const char *name = wire_msg_name(m->type);
	uint32_t max = msg_rows_max(m->type, dim, m->dtype);
	if (m->count > max)
		return err_set(err, errlen, code, "%s: %u rows in one message, at most %u at width %d", name,
			       m->count, max, dim);
	if (m->count == 0 && m->total > 0)
		return err_set(err, errlen, code, "%s: no row in a message of a set of %u", name, m->total);
	if (m->first > m->total || m->count > m->total - m->first)
		return err_set(err, errlen, code, "%s: rows [%u, %llu) of a set of %u", name, m->first,
			       (unsigned long long)m->first + m->count, m->total);
	if (m->type != WIRE_SPUSH && m->worker != 0)
		return err_set(err, errlen, code, "%s: worker field is %u, expected 0", name, m->worker);
	return 0;
}

/* The ids of a message to send ascend strictly. */
static int ids_ascend(const struct msg_rows *m, const uint64_t *ids, char *err, size_t errlen)
{
	for (uint32_t i = 1; i < m->count; i++)
		if (ids[i] <= ids[i - 1])
			return err_set(err, errlen, -EINVAL, "%s: row %llu after row %llu", wire_msg_name(m->type),
				       (unsigned long long)ids[i], (unsigned long long)ids[i - 1]);
	return 0;
}

/* The ids at p: packed where m asks and it is shorter (the flag cleared
 * in buf otherwise), else as u64s. The bytes written. */
static size_t encode_ids(uint8_t *buf, uint8_t *p, const struct msg_rows *m, const uint64_t *ids)
{
	size_t n = m->flags & MSG_ROWS_IDS_PACKED && m->count ? idpack_encode(p, 8 * (size_t)m->count, ids, m->count) : 0;
	if (n)
		return n;
	buf[2] &= (uint8_t)~MSG_ROWS_IDS_PACKED;
	for (uint32_t i = 0; i < m->count; i++)
		wire_put_u64(p + 8 * (size_t)i, ids[i]);
	return 8 * (size_t)m->count;
}

/* The values at p (cap bytes): packed where m asks and it is shorter
 * (buf's dtype set to float32 otherwise). The bytes written. */
static size_t encode_vals(uint8_t *buf, uint8_t *p, size_t cap, const struct msg_rows *m, const float *vals,
			  int dim)
{
	size_t N = (size_t)m->count * (size_t)dim;
	if (m->dtype == WIRE_BF16) {
		bf16_from_f32(p, vals, N);
		return 2 * N;
	}
	size_t n = m->dtype == WIRE_F32P && N ? fpack_encode(p, cap < 4 * N - 1 ? cap : 4 * N - 1, vals, N) : 0;
	if (n)
		return n;
	buf[1] = WIRE_F32;
	wire_put_f32s(p, vals, N);
	return 4 * N;
}

int msg_encode_rows(uint8_t *buf, size_t cap, const struct msg_rows *m, const uint64_t *ids,
		    const float *vals, int dim, size_t *len, char *err, size_t errlen)
{
	if (!rows_type_ok(m->type) || dim < 1 || dim > MSG_ROWS_DIM_MAX || !rows_dtype_ok(m->type, m->dtype) ||
	    (m->flags & ~rows_flags_allowed(m->type)))
		return err_set(err, errlen, -EINVAL, "rows: type %u (%s) at width %d, dtype %u, flags 0x%x", m->type,
			       wire_msg_name(m->type), dim, m->dtype, m->flags);
	int rc = rows_fields_ok(m, dim, -EINVAL, err, errlen);
	if (!rc && m->type != WIRE_ROWS)
		rc = ids_ascend(m, ids, err, errlen);
	if (rc)
		return rc;
	const char *name = wire_msg_name(m->type);
	size_t need = msg_rows_bytes(m->type, m->count, dim, m->dtype);
	if (cap < need)
		return err_set(err, errlen, -ENOBUFS, "%s: needs %zu bytes, buffer has %zu", name, need, cap);
	memset(buf, 0, MSG_ROWS_HDR_BYTES);
	buf[0] = m->type;
	buf[1] = m->dtype;
	buf[2] = m->flags;
	wire_put_u32(buf + 4, m->shard);
	wire_put_u64(buf + 8, m->version);
	wire_put_u32(buf + 16, m->total);
	wire_put_u32(buf + 20, m->first);
	wire_put_u32(buf + 24, m->count);
	wire_put_u32(buf + 28, m->worker);
	uint8_t *p = buf + MSG_ROWS_HDR_BYTES;
	if (m->type != WIRE_ROWS)
		p += encode_ids(buf, p, m, ids);
	if (m->type != WIRE_SPULL)
		p += encode_vals(buf, p, need - (size_t)(p - buf), m, vals, dim);
	*len = (size_t)(p - buf);
	return 0;
}

/* The ids at p (rest bytes left): packed or u64s, strictly ascending;
 * their bytes in out->idlen, the first and last id. */
static int decode_ids(const uint8_t *p, size_t rest, struct msg_rows *out, char *err, size_t errlen)
{
	const char *name = wire_msg_name(out->type);
	out->ids = p;
	if (out->flags & MSG_ROWS_IDS_PACKED) {
		if (idpack_check(p, rest, out->count, &out->idlen, &out->id_first, &out->id_last))
			return err_set(err, errlen, -EPROTO, "%s: the bytes after the header are not %u row ids packed (docs/PROTOCOL.md, \"Rows\")",
				       name, out->count);
		return 0;
	}
	out->idlen = 8 * (size_t)out->count;
	if (rest < out->idlen)
		return err_set(err, errlen, -EMSGSIZE, "%s: %zu bytes after the header, %u row ids are %zu", name, rest,
			       out->count, out->idlen);
	for (uint32_t i = 1; i < out->count; i++) {
		uint64_t a = wire_get_u64(p + 8 * (size_t)(i - 1)), b = wire_get_u64(p + 8 * (size_t)i);
		if (b <= a)
			return err_set(err, errlen, -EPROTO, "%s: row %llu %s row %llu (the ids must be strictly ascending)",
				       name, (unsigned long long)b, b == a ? "again after" : "after",
				       (unsigned long long)a);
	}
	if (out->count) {
		out->id_first = wire_get_u64(p);
		out->id_last = wire_get_u64(p + 8 * (size_t)(out->count - 1));
	}
	return 0;
}

/* The values at p (rest bytes, all that is left): as many as the count
 * says, in the dtype's bytes or packed. */
static int decode_vals(const uint8_t *p, size_t rest, int dim, struct msg_rows *out, char *err, size_t errlen)
{
	const char *name = wire_msg_name(out->type);
	size_t N = (size_t)out->count * (size_t)dim;
	out->vals = p;
	out->vlen = rest;
	if (out->dtype == WIRE_F32P) {
		if (!N || fpack_check(p, rest, N))
			return err_set(err, errlen, -EPROTO, "%s: %zu bytes are not a packing of %zu float32 values", name,
				       rest, N);
		return 0;
	}
	size_t want = N * wire_dtype_bytes(out->dtype);
	if (rest != want)
		return err_set(err, errlen, -EMSGSIZE, "%s: %zu bytes of values, but %u rows of width %d in %s are %zu",
			       name, rest, out->count, dim, wire_dtype_name(out->dtype), want);
	return 0;
}

int msg_decode_rows(const uint8_t *buf, size_t len, int dim, struct msg_rows *out, char *err,
		    size_t errlen)
{
	if (len < 1)
		return err_set(err, errlen, -EMSGSIZE, "SPULL/ROWS/SPUSH: empty message");
	uint8_t t = buf[0];
	if (!rows_type_ok(t))
		return err_set(err, errlen, -EPROTO, "SPULL/ROWS/SPUSH: type byte is %u (%s)", t,
			       wire_msg_name(t));
	const char *name = wire_msg_name(t);
	if (dim < 1 || dim > MSG_ROWS_DIM_MAX)
		return err_set(err, errlen, -EINVAL, "%s: width %d", name, dim);
	if (len < MSG_ROWS_HDR_BYTES)
		return err_set(err, errlen, -EMSGSIZE, "%s: %zu bytes, expected at least %u", name, len,
			       MSG_ROWS_HDR_BYTES);
	*out = (struct msg_rows){ .type = t, .dtype = buf[1], .flags = buf[2], .shard = wire_get_u32(buf + 4),
				  .version = wire_get_u64(buf + 8), .total = wire_get_u32(buf + 16),
				  .first = wire_get_u32(buf + 20), .count = wire_get_u32(buf + 24),
				  .worker = wire_get_u32(buf + 28) };
	if (!rows_dtype_ok(t, out->dtype))
		return err_set(err, errlen, -EPROTO, "%s: dtype %u, expected %s", name, out->dtype,
			       t == WIRE_SPULL ? "0 (a pull has no values)" : "0 (fp32), 1 (bf16) or 2 (fp32 packed)");
	/* The count only bounds the length here: its range comes after. */
	size_t most = msg_rows_bytes(t, out->count, dim, out->dtype);
	if (out->count > msg_rows_max(t, dim, out->dtype) || len > most ||
	    (!(out->flags & MSG_ROWS_IDS_PACKED) && out->dtype != WIRE_F32P && len != most))
		return err_set(err, errlen, -EMSGSIZE, "%s: %zu bytes, but %u rows of width %d in %s are %zu", name,
			       len, out->count, dim, wire_dtype_name(out->dtype), most);
	if (out->flags & ~rows_flags_allowed(t))
		return err_set(err, errlen, -EPROTO, "%s: flags byte is 0x%02x, this type may set 0x%02x", name,
			       out->flags, rows_flags_allowed(t));
	if (buf[3])
		return err_set(err, errlen, -EPROTO, "%s: reserved byte 3 is 0x%02x, expected 0", name, buf[3]);
	int rc = rows_fields_ok(out, dim, -EPROTO, err, errlen);
	if (rc)
		return rc;
	const uint8_t *p = buf + MSG_ROWS_HDR_BYTES;
	size_t rest = len - MSG_ROWS_HDR_BYTES;
	if (t != WIRE_ROWS) {
		rc = decode_ids(p, rest, out, err, errlen);
		if (rc)
			return rc;
		p += out->idlen;
		rest -= out->idlen;
	}
	if (t != WIRE_SPULL)
		return decode_vals(p, rest, dim, out, err, errlen);
	if (rest)
		return err_set(err, errlen, -EMSGSIZE, "%s: %zu bytes after its %u row ids", name, rest, out->count);
	return 0;
}

void msg_rows_ids(uint64_t *dst, const struct msg_rows *m)
{
	if (m->flags & MSG_ROWS_IDS_PACKED) {
		idpack_decode(dst, m->ids, m->count);
		return;
	}
	for (uint32_t i = 0; i < m->count; i++)
		dst[i] = wire_get_u64(m->ids + 8 * (size_t)i);
}

void msg_rows_vals(float *dst, const struct msg_rows *m, int dim)
{
	size_t N = (size_t)m->count * (size_t)dim;
	if (m->dtype == WIRE_BF16)
		bf16_to_f32(dst, m->vals, N);
	else if (m->dtype == WIRE_F32P)
		fpack_decode(dst, m->vals, N);
	else
		wire_get_f32s(dst, m->vals, N);
}

void msg_rows_asm_init(struct msg_rows_asm *a, uint8_t type, uint8_t dtype, uint32_t shard, int dim,
		       uint64_t cap, uint64_t want)
{
	*a = (struct msg_rows_asm){ .type = type, .dtype = dtype, .shard = shard, .dim = dim, .cap = cap,
				    .want = want };
}

/* The message's fields against the set's: its first one fixes them. */
static int asm_fits(const struct msg_rows_asm *a, const struct msg_rows *m, char *err, size_t errlen)
{
	const char *name = wire_msg_name(a->type);
	if (m->type != a->type)
		return err_set(err, errlen, -EPROTO, "%s: got %s among its messages", name, wire_msg_name(m->type));
	if (m->shard != a->shard)
		return err_set(err, errlen, -EPROTO, "%s for shard %u, this is shard %u", name, m->shard, a->shard);
	/* float32 may come packed wherever float32 is due */
	if (wire_dtype_values(m->dtype) != a->dtype)
		return err_set(err, errlen, -EPROTO, "%s in %s where this end's wire_dtype says %s", name,
			       wire_dtype_name(m->dtype), wire_dtype_name(a->dtype));
	if (!a->started) {
		if (a->want != MSG_ROWS_ANY && m->total != a->want)
			return err_set(err, errlen, -EPROTO, "%s: %u rows, %llu were asked for", name, m->total,
				       (unsigned long long)a->want);
		if (m->total > a->cap)
			return err_set(err, errlen, -EPROTO, "%s: %u rows, more than the %llu one batch can touch here",
				       name, m->total, (unsigned long long)a->cap);
		return 0;
	}
	if (a->received == a->total)
		return err_set(err, errlen, -EPROTO, "%s: a message after all %u rows arrived", name, a->total);
	if (m->version != a->version || m->total != a->total || m->worker != a->worker ||
	    (m->flags & MSG_ROWS_WANT_PACKED) != a->want_packed)
		return err_set(err, errlen, -EPROTO, "%s: a message of another set (version %llu, %u rows, worker %u, flags 0x%02x) among one of version %llu, %u rows, worker %u",
			       name, (unsigned long long)m->version, m->total, m->worker, m->flags,
			       (unsigned long long)a->version, a->total, a->worker);
	return 0;
}

int msg_rows_asm_add(struct msg_rows_asm *a, const struct msg_rows *m, uint64_t *ids, float *vals, char *err,
		     size_t errlen)
{
	const char *name = wire_msg_name(a->type);
	int rc = asm_fits(a, m, err, errlen);
	if (rc)
		return rc;
	uint32_t done = a->started ? a->received : 0, max = msg_rows_max(a->type, a->dim, a->dtype);
	uint32_t left = m->total - done, want = left < max ? left : max;
	if (m->first != done || m->count != want)
		return err_set(err, errlen, -EPROTO, "%s: rows [%u, %llu) where rows [%u, %u) were due", name,
			       m->first, (unsigned long long)m->first + m->count, done, done + want);
	if (m->ids && m->count && a->started && done && m->id_first <= a->last)
		return err_set(err, errlen, -EPROTO, "%s: row %llu after row %llu (the ids must be strictly ascending)",
			       name, (unsigned long long)m->id_first, (unsigned long long)a->last);
	if (ids && m->ids)
		msg_rows_ids(ids + m->first, m);
	if (vals && m->vals)
		msg_rows_vals(vals + (size_t)m->first * (size_t)a->dim, m, a->dim);
	if (!a->started) {
		a->version = m->version;
		a->total = m->total;
		a->worker = m->worker;
		a->want_packed = m->flags & MSG_ROWS_WANT_PACKED;
		a->started = 1;
	}
	if (m->ids && m->count)
		a->last = m->id_last;
	a->received = done + m->count;
	a->packed += (m->flags & MSG_ROWS_IDS_PACKED) || m->dtype == WIRE_F32P;
	return a->received == a->total;
}

int msg_rows_asm_done(const struct msg_rows_asm *a)
{
	return a->started && a->received == a->total;
}
