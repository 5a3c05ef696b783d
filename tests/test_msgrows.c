/* SPULL, ROWS and SPUSH (net/msg_rows.h): the bytes docs/PROTOCOL.md
 * gives them, round trips, every refusal of the decoder (a row of a table
 * per malformed message) and of the assembly of a set of messages. Part
 * of the msg suite. */
#include <criterion/criterion.h>

#include "../net/bf16.h"
#include "../net/fpack.h"
#include "../net/msg_rows.h"

#include <errno.h>
#include <string.h>

#define DIM 4

/* x as bf16 (rounded to nearest even) and back. */
static float bf16_widen_f32(float x)
{
	uint8_t b[2];
	float y;
	bf16_from_f32(b, &x, 1);
	bf16_to_f32(&y, b, 1);
	return y;
}

static const uint64_t IDS[5] = { 3, 9, 10, 700, 1ULL << 40 };
static const float VALS[5 * DIM] = { 1, 2, 3, 4, -1, -2, -3, -4, 0.5f, 0, 0, 1e-30f, 8, 9, 10, 11,
				     -0.0f, 1, 2, 3 };

/* One message of type with the sample's rows [first, first + count) of a
 * set of total. */
static size_t sample_as(uint8_t type, uint8_t dtype, uint32_t total, uint32_t first, uint32_t count,
			uint8_t *buf, size_t cap)
{
	struct msg_rows m = { .type = type, .dtype = dtype, .shard = 2, .version = 41, .total = total, .first = first,
			      .count = count, .worker = type == WIRE_SPUSH ? 3 : 0 };
	size_t len = 0;
	char err[256] = "";
	cr_assert_eq(msg_encode_rows(buf, cap, &m, IDS + first, VALS + first * DIM, DIM, &len, err, sizeof(err)),
		     0, "%s", err);
	return len;
}

static size_t sample(uint8_t type, uint32_t total, uint32_t first, uint32_t count, uint8_t *buf, size_t cap)
{
	return sample_as(type, WIRE_F32, total, first, count, buf, cap);
}

Test(msg, rows_sizes)
{
	cr_assert_eq(msg_rows_max(WIRE_SPULL, 16, WIRE_F32), 8192);
	cr_assert_eq(msg_rows_max(WIRE_ROWS, 16, WIRE_F32), 1024);
	cr_assert_eq(msg_rows_max(WIRE_SPUSH, 16, WIRE_F32), 65536 / 72);
	cr_assert_eq(msg_rows_max(WIRE_ROWS, 1024, WIRE_F32), 16);
	cr_assert_eq(msg_rows_max(WIRE_SPUSH, 1024, WIRE_F32), 15);
	cr_assert_eq(msg_rows_max(WIRE_PUSH, 16, WIRE_F32), 0);
	cr_assert_eq(msg_rows_max(WIRE_ROWS, 0, WIRE_F32), 0);
	cr_assert_eq(msg_rows_max(WIRE_ROWS, 1025, WIRE_F32), 0);
	/* bf16 values: twice the rows; a pull has no values to carry as bf16 */
	cr_assert_eq(msg_rows_max(WIRE_ROWS, 16, WIRE_BF16), 2048);
	cr_assert_eq(msg_rows_max(WIRE_SPUSH, 16, WIRE_BF16), 65536 / 40);
	cr_assert_eq(msg_rows_max(WIRE_SPULL, 16, WIRE_BF16), 0);
	/* packed float32: as many rows as float32, in fewer bytes */
	cr_assert_eq(msg_rows_max(WIRE_ROWS, 16, WIRE_F32P), 1024);
	cr_assert_eq(msg_rows_max(WIRE_SPUSH, 16, WIRE_F32P), 65536 / 72);
	cr_assert_eq(msg_rows_max(WIRE_SPULL, 16, WIRE_F32P), 0);
	cr_assert_eq(msg_rows_max(WIRE_ROWS, 16, WIRE_F32X), 0);
	/* the largest message of each fits a frame */
	for (int d = 1; d <= MSG_ROWS_DIM_MAX; d++)
		for (uint8_t t = WIRE_SPULL; t <= WIRE_SPUSH; t++)
			for (unsigned dt = WIRE_F32; dt <= WIRE_BF16; dt++)
				if (msg_rows_max(t, d, dt))
					cr_assert_leq(msg_rows_bytes(t, msg_rows_max(t, d, dt), d, dt), FRAME_MAX,
						      "type %u dim %d dtype %u", t, d, dt);
}

/* The header where docs/PROTOCOL.md puts it, then ids and values. */
Test(msg, rows_bytes_match_protocol)
{
	uint8_t buf[512];
	size_t len = sample(WIRE_SPUSH, 5, 1, 3, buf, sizeof(buf));
	cr_assert_eq(len, 32 + 3 * (8 + 4 * DIM));
	cr_assert_eq(buf[0], 15);
	cr_assert(buf[1] == 0 && buf[2] == 0 && buf[3] == 0);
	cr_assert_eq(wire_get_u32(buf + 4), 2);
	cr_assert_eq(wire_get_u64(buf + 8), 41);
	cr_assert_eq(wire_get_u32(buf + 16), 5);
	cr_assert_eq(wire_get_u32(buf + 20), 1);
	cr_assert_eq(wire_get_u32(buf + 24), 3);
	cr_assert_eq(wire_get_u32(buf + 28), 3);
	cr_assert_eq(wire_get_u64(buf + 32), 9);
	cr_assert_eq(wire_get_u64(buf + 48), 700);
	cr_assert_eq(wire_get_f32(buf + 56), -1.0f);
	cr_assert_eq(wire_get_f32(buf + 56 + 3 * 4 * DIM - 4), 11.0f);
	len = sample(WIRE_SPULL, 5, 0, 5, buf, sizeof(buf));
	cr_assert_eq(len, 32 + 5 * 8);
	cr_assert_eq(buf[0], 13);
	cr_assert_eq(wire_get_u64(buf + 32 + 4 * 8), 1ULL << 40);
	len = sample(WIRE_ROWS, 5, 4, 1, buf, sizeof(buf));
	cr_assert_eq(len, 32 + 4 * DIM);
	cr_assert_eq(buf[0], 14);
	cr_assert_eq(wire_get_f32(buf + 36), 1.0f);
	/* an empty set is one message of its header */
	len = sample(WIRE_SPULL, 0, 0, 0, buf, sizeof(buf));
	cr_assert_eq(len, 32);
	/* bf16 values: dtype 1, 2 bytes a value, rounded to nearest even */
	len = sample_as(WIRE_SPUSH, WIRE_BF16, 5, 1, 3, buf, sizeof(buf));
	cr_assert_eq(len, 32 + 3 * (8 + 2 * DIM));
	cr_assert_eq(buf[1], 1);
	cr_assert_eq(wire_get_u64(buf + 32 + 8), 10);
	cr_assert_eq(buf[56] | buf[57] << 8, 0xbf80, "-1.0f as bf16: 0x%04x", buf[56] | buf[57] << 8);
	len = sample_as(WIRE_ROWS, WIRE_BF16, 5, 4, 1, buf, sizeof(buf));
	cr_assert_eq(len, 32 + 2 * DIM);
	cr_assert_eq(buf[32] | buf[33] << 8, 0x8000, "-0.0f");
}

Test(msg, rows_round_trip)
{
	for (int k = 0; k < 5; k++) {
		uint8_t t = (uint8_t)(WIRE_SPULL + k % 3), dt = k < 3 ? WIRE_F32 : WIRE_BF16;
		t = k == 3 ? WIRE_ROWS : k == 4 ? WIRE_SPUSH : t;
		uint8_t buf[512];
		char err[256] = "";
		size_t len = sample_as(t, dt, 5, 0, 5, buf, sizeof(buf));
		cr_assert_eq(msg_type(buf, len, err, sizeof(err)), t, "%s", err);
		struct msg_rows m;
		cr_assert_eq(msg_decode_rows(buf, len, DIM, &m, err, sizeof(err)), 0, "%s", err);
		cr_assert(m.type == t && m.dtype == dt && m.shard == 2 && m.version == 41 && m.total == 5 &&
			  m.first == 0 && m.count == 5);
		cr_assert_eq(m.worker, t == WIRE_SPUSH ? 3u : 0u);
		cr_assert_eq(m.ids == NULL, t == WIRE_ROWS);
		cr_assert_eq(m.vals == NULL, t == WIRE_SPULL);
		uint64_t got[5];
		if (m.ids)
			msg_rows_ids(got, &m);
		for (uint32_t i = 0; m.ids && i < 5; i++)
			cr_assert_eq(got[i], IDS[i]);
		float v[5 * DIM], want[5 * DIM];
		for (int i = 0; i < 5 * DIM; i++) /* bf16: each value rounded to nearest even */
			want[i] = dt == WIRE_BF16 ? bf16_widen_f32(VALS[i]) : VALS[i];
		if (m.vals) {
			msg_rows_vals(v, &m, DIM);
			cr_assert_eq(memcmp(v, want, sizeof(v)), 0, "the values, bit for bit (dtype %u)", dt);
		}
	}
}

/* Bytes written over a good SPUSH of rows 0..2 of 5 (or its length cut). */
struct bad_rows {
	const char *name;
	size_t at;        /* where value goes (u8, or u32 / u64 by size) */
	int size;         /* 1, 4 or 8; 0: the length changes by at */
	uint64_t value;
	int want;
	const char *says;
};

static const struct bad_rows bads[] = {
	{ "one byte short", (size_t)-1, 0, 0, -EMSGSIZE, "bytes, but 3 rows" },
	{ "one byte long", 1, 0, 0, -EMSGSIZE, "bytes, but 3 rows" },
	{ "header cut", (size_t)-100, 0, 0, -EMSGSIZE, "expected at least 32" },
	{ "dtype", 1, 1, 5, -EPROTO, "dtype 5, expected 0 (fp32), 1 (bf16) or 2 (fp32 packed)" },
	{ "bf16 at fp32's length", 1, 1, 1, -EMSGSIZE, "3 rows of width 4 in bf16 are" },
	{ "flags", 2, 1, 7, -EPROTO, "flags byte is 0x07, this type may set 0x01" },
	{ "reserved 3", 3, 1, 7, -EPROTO, "reserved byte 3" },
	{ "count over the set", 16, 4, 2, -EPROTO, "rows [0, 3) of a set of 2" },
	{ "first past the set", 20, 4, 4, -EPROTO, "rows [4, 7) of a set of 5" },
	{ "unsorted", 32 + 8, 8, 2, -EPROTO, "row 2 after row 3" },
	{ "duplicate", 32 + 8, 8, 3, -EPROTO, "row 3 again after row 3" },
	{ "wrong type", 0, 1, WIRE_PUSH, -EPROTO, "type byte is 4" },
};

Test(msg, rows_refusals)
{
	for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
		const struct bad_rows *b = &bads[i];
		uint8_t buf[512];
		char err[256] = "";
		size_t len = sample(WIRE_SPUSH, 5, 0, 3, buf, sizeof(buf));
		if (b->size == 0)
			len += b->at;   /* wraps: a shorter length */
		else if (b->size == 1)
			buf[b->at] = (uint8_t)b->value;
		else if (b->size == 4)
			wire_put_u32(buf + b->at, (uint32_t)b->value);
		else
			wire_put_u64(buf + b->at, b->value);
		struct msg_rows m;
		int r = msg_decode_rows(buf, len, DIM, &m, err, sizeof(err));
		cr_assert_eq(r, b->want, "%s: %d (%s)", b->name, r, err);
		cr_assert_not_null(strstr(err, b->says), "%s: \"%s\" does not say \"%s\"", b->name, err, b->says);
		cr_assert_null(strchr(err, '\n'));
	}
	/* a worker on other than SPUSH; no row in a set of some */
	uint8_t buf[512];
	char err[256];
	struct msg_rows m;
	size_t len = sample(WIRE_ROWS, 5, 0, 2, buf, sizeof(buf));
	wire_put_u32(buf + 28, 1);
	cr_assert_eq(msg_decode_rows(buf, len, DIM, &m, err, sizeof(err)), -EPROTO);
	cr_assert_not_null(strstr(err, "worker field is 1"), "%s", err);
	len = sample(WIRE_SPULL, 0, 0, 0, buf, sizeof(buf));
	wire_put_u32(buf + 16, 4);
	cr_assert_eq(msg_decode_rows(buf, len, DIM, &m, err, sizeof(err)), -EPROTO);
	cr_assert_not_null(strstr(err, "no row in a message of a set of 4"), "%s", err);
	len = sample(WIRE_SPULL, 5, 0, 2, buf, sizeof(buf));
	buf[1] = WIRE_BF16;
	cr_assert_eq(msg_decode_rows(buf, len, DIM, &m, err, sizeof(err)), -EPROTO);
	cr_assert_not_null(strstr(err, "dtype 1, expected 0 (a pull has no values)"), "%s", err);
	/* the encoder refuses what the decoder would */
	uint64_t down[2] = { 5, 5 };
	struct msg_rows e = { .type = WIRE_SPULL, .total = 2, .count = 2 };
	cr_assert_eq(msg_encode_rows(buf, sizeof(buf), &e, down, NULL, DIM, &len, err, sizeof(err)), -EINVAL);
	e = (struct msg_rows){ .type = WIRE_ROWS, .total = 2, .count = 2, .worker = 1 };
	cr_assert_eq(msg_encode_rows(buf, sizeof(buf), &e, NULL, VALS, DIM, &len, err, sizeof(err)), -EINVAL);
	e = (struct msg_rows){ .type = WIRE_ROWS, .total = 2, .count = 2 };
	cr_assert_eq(msg_encode_rows(buf, 40, &e, NULL, VALS, DIM, &len, err, sizeof(err)), -ENOBUFS);
	e = (struct msg_rows){ .type = WIRE_SPULL, .dtype = WIRE_BF16, .total = 0 };
	cr_assert_eq(msg_encode_rows(buf, sizeof(buf), &e, NULL, NULL, DIM, &len, err, sizeof(err)), -EINVAL);
}

/* A set of 5 SPULL ids in messages of at most 2 (by hand: the real
 * per-message count is msg_rows_max), so the assembly's order checks
 * see several messages: here with DIM so large that ROWS carries 16. */
static int add(struct msg_rows_asm *a, uint8_t type, uint64_t version, uint32_t total, uint32_t first,
	       uint32_t count, const uint64_t *ids, float *vals, char *err)
{
	uint8_t buf[FRAME_MAX];
	size_t len;
	struct msg_rows m = { .type = type, .dtype = type == WIRE_SPULL ? WIRE_F32 : a->dtype, .shard = 1,
			      .version = version, .total = total, .first = first, .count = count };
	static float zero[17 * 1024];
	cr_assert_eq(msg_encode_rows(buf, sizeof(buf), &m, ids, zero, a->dim, &len, err, 256), 0, "%s", err);
	cr_assert_eq(msg_decode_rows(buf, len, a->dim, &m, err, 256), 0, "%s", err);
	return msg_rows_asm_add(a, &m, NULL, vals, err, 256);
}

Test(msg, rows_assembly)
{
	char err[256];
	struct msg_rows_asm a;
	static float vals[40 * 1024];
	/* ROWS at width 1024: 16 a message; 40 rows are 16 + 16 + 8 */
	msg_rows_asm_init(&a, WIRE_ROWS, WIRE_F32, 1, 1024, 40, 40);
	cr_assert_eq(add(&a, WIRE_ROWS, 7, 40, 0, 16, NULL, vals, err), 0, "%s", err);
	cr_assert_eq(add(&a, WIRE_ROWS, 7, 40, 16, 16, NULL, vals, err), 0, "%s", err);
	cr_assert(!msg_rows_asm_done(&a));
	cr_assert_eq(add(&a, WIRE_ROWS, 7, 40, 32, 8, NULL, vals, err), 1, "%s", err);
	cr_assert(msg_rows_asm_done(&a) && a.version == 7);
	cr_assert_eq(add(&a, WIRE_ROWS, 7, 40, 32, 8, NULL, vals, err), -EPROTO);
	cr_assert_not_null(strstr(err, "after all 40 rows arrived"), "%s", err);

	static const struct {
		const char *name;
		uint32_t total, first, count;
		uint64_t version;
		const char *says;
	} second[] = {
		{ "gap", 40, 32, 8, 7, "rows [32, 40) where rows [16, 32) were due" },
		{ "short", 40, 16, 8, 7, "rows [16, 24) where rows [16, 32) were due" },
		{ "another version", 40, 16, 16, 8, "another set (version 8" },
		{ "another total", 39, 16, 16, 7, "another set (version 7, 39 rows" },
	};
	for (size_t i = 0; i < sizeof(second) / sizeof(second[0]); i++) {
		msg_rows_asm_init(&a, WIRE_ROWS, WIRE_F32, 1, 1024, 40, 40);
		cr_assert_eq(add(&a, WIRE_ROWS, 7, 40, 0, 16, NULL, vals, err), 0, "%s", err);
		int r = add(&a, WIRE_ROWS, second[i].version, second[i].total, second[i].first, second[i].count, NULL,
			    vals, err);
		cr_assert_eq(r, -EPROTO, "%s: %d", second[i].name, r);
		cr_assert_not_null(strstr(err, second[i].says), "%s: %s", second[i].name, err);
	}
	/* the first message: the total asked for, within the capacity */
	msg_rows_asm_init(&a, WIRE_ROWS, WIRE_F32, 1, 1024, 40, 40);
	cr_assert_eq(add(&a, WIRE_ROWS, 7, 39, 0, 16, NULL, vals, err), -EPROTO);
	cr_assert_not_null(strstr(err, "39 rows, 40 were asked for"), "%s", err);
	msg_rows_asm_init(&a, WIRE_ROWS, WIRE_F32, 1, 1024, 30, MSG_ROWS_ANY);
	cr_assert_eq(add(&a, WIRE_ROWS, 7, 40, 0, 16, NULL, vals, err), -EPROTO);
	cr_assert_not_null(strstr(err, "40 rows, more than the 30 one batch can touch"), "%s", err);
	/* another shard, another type */
	msg_rows_asm_init(&a, WIRE_ROWS, WIRE_F32, 2, 1024, 40, 40);
	cr_assert_eq(add(&a, WIRE_ROWS, 7, 40, 0, 16, NULL, vals, err), -EPROTO);
	cr_assert_not_null(strstr(err, "ROWS for shard 1, this is shard 2"), "%s", err);
	msg_rows_asm_init(&a, WIRE_SPULL, WIRE_F32, 1, 1024, 40, MSG_ROWS_ANY);
	cr_assert_eq(add(&a, WIRE_ROWS, 7, 40, 0, 16, NULL, vals, err), -EPROTO);
	cr_assert_not_null(strstr(err, "SPULL: got ROWS"), "%s", err);
	/* another dtype than this end's wire_dtype says */
	msg_rows_asm_init(&a, WIRE_ROWS, WIRE_BF16, 1, 1024, 40, 40);
	uint8_t buf[512];
	size_t len = sample(WIRE_ROWS, 5, 0, 5, buf, sizeof(buf));
	struct msg_rows m;
	cr_assert_eq(msg_decode_rows(buf, len, DIM, &m, err, sizeof(err)), 0, "%s", err);
	m.shard = 1;
	cr_assert_eq(msg_rows_asm_add(&a, &m, NULL, vals, err, sizeof(err)), -EPROTO);
	cr_assert_not_null(strstr(err, "ROWS in fp32 where this end's wire_dtype says bf16"), "%s", err);
}

/* SPUSH at width 1024 carries 15 rows a message: ids ascending across
 * messages, a repeat of the last id refused. */
Test(msg, rows_assembly_ids_ascend_across_messages)
{
	char err[256];
	struct msg_rows_asm a;
	static float vals[30 * 1024];
	uint64_t ids[30];
	for (int i = 0; i < 30; i++)
		ids[i] = 100 + 2 * (uint64_t)i;
	msg_rows_asm_init(&a, WIRE_SPUSH, WIRE_F32, 1, 1024, 64, MSG_ROWS_ANY);
	cr_assert_eq(add(&a, WIRE_SPUSH, 0, 30, 0, 15, ids, vals, err), 0, "%s", err);
	uint64_t again[15];
	memcpy(again, ids + 15, sizeof(again));
	again[0] = ids[14];
	cr_assert_eq(add(&a, WIRE_SPUSH, 0, 30, 15, 15, again, vals, err), -EPROTO);
	cr_assert_not_null(strstr(err, "row 128 after row 128"), "%s", err);
	cr_assert_eq(add(&a, WIRE_SPUSH, 0, 30, 15, 15, ids + 15, vals, err), 1, "%s", err);
}

/* Ids and values packed (MSG_ROWS_IDS_PACKED, dtype 2): the bytes
 * docs/PROTOCOL.md gives, fewer than unpacked, the same rows bit for bit;
 * a packing that would not be shorter is not used. */
Test(msg, rows_packed)
{
	uint8_t buf[512];
	char err[256] = "";
	struct msg_rows m = { .type = WIRE_SPUSH, .dtype = WIRE_F32P, .flags = MSG_ROWS_IDS_PACKED, .shard = 2,
			      .version = 41, .total = 5, .count = 5, .worker = 3 };
	float vals[5 * DIM];
	for (int i = 0; i < 5 * DIM; i++)
		vals[i] = 0.01f * (float)(i + 1) * (i % 3 ? 1.0f : -1.0f);
	size_t len = 0, plain = msg_rows_bytes(WIRE_SPUSH, 5, DIM, WIRE_F32);
	cr_assert_eq(msg_encode_rows(buf, sizeof(buf), &m, IDS, vals, DIM, &len, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(buf[1], WIRE_F32P);
	cr_assert_eq(buf[2], MSG_ROWS_IDS_PACKED);
	/* 3; 9 - 3 - 1 = 5; 10 - 9 - 1 = 0; 700 - 10 - 1 = 689 = 0x2b1 */
	static const uint8_t ids[] = { 0x03, 0x05, 0x00, 0xb1, 0x05 };
	cr_assert_eq(memcmp(buf + 32, ids, sizeof(ids)), 0);
	size_t idlen = sizeof(ids) + 6; /* 2^40 - 701 in 6 groups of 7 bits */
	cr_assert_eq(len, 32 + idlen + fpack_min_bytes(5 * DIM), "%zu", len);
	cr_assert_lt(len, plain);
	struct msg_rows d;
	cr_assert_eq(msg_decode_rows(buf, len, DIM, &d, err, sizeof(err)), 0, "%s", err);
	cr_assert(d.dtype == WIRE_F32P && d.flags == MSG_ROWS_IDS_PACKED && d.idlen == idlen);
	cr_assert(d.id_first == 3 && d.id_last == 1ULL << 40);
	uint64_t got[5];
	float v[5 * DIM];
	msg_rows_ids(got, &d);
	msg_rows_vals(v, &d, DIM);
	cr_assert_eq(memcmp(got, IDS, sizeof(got)), 0);
	cr_assert_eq(memcmp(v, vals, sizeof(v)), 0);

	/* zeros beside a 1 escape: packing them is not shorter, so they go as
	 * float32; one id past 2^56 takes more than 8 bytes packed, so it goes
	 * as a u64 */
	static const float zeros[DIM] = { 1 };
	uint64_t far = 1ULL << 63;
	m = (struct msg_rows){ .type = WIRE_SPUSH, .dtype = WIRE_F32P, .flags = MSG_ROWS_IDS_PACKED, .total = 1,
			       .count = 1 };
	cr_assert_eq(msg_encode_rows(buf, sizeof(buf), &m, &far, zeros, DIM, &len, err, sizeof(err)), 0, "%s", err);
	cr_assert(buf[1] == WIRE_F32 && buf[2] == 0 && len == msg_rows_bytes(WIRE_SPUSH, 1, DIM, WIRE_F32));
	cr_assert_eq(wire_get_u64(buf + 32), far);

	/* a pull: its ids packed, and its answer asked for packed */
	m = (struct msg_rows){ .type = WIRE_SPULL, .flags = MSG_ROWS_IDS_PACKED | MSG_ROWS_WANT_PACKED, .total = 5,
			       .count = 5 };
	cr_assert_eq(msg_encode_rows(buf, sizeof(buf), &m, IDS, NULL, DIM, &len, err, sizeof(err)), 0, "%s", err);
	cr_assert(len == 32 + idlen && buf[2] == 3);
	cr_assert_eq(msg_decode_rows(buf, len, DIM, &d, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(d.flags, 3);

	/* what a type may not set */
	m = (struct msg_rows){ .type = WIRE_ROWS, .flags = MSG_ROWS_IDS_PACKED, .total = 1, .count = 1 };
	cr_assert_eq(msg_encode_rows(buf, sizeof(buf), &m, NULL, vals, DIM, &len, err, sizeof(err)), -EINVAL);
	m = (struct msg_rows){ .type = WIRE_SPUSH, .flags = MSG_ROWS_WANT_PACKED, .total = 1, .count = 1 };
	cr_assert_eq(msg_encode_rows(buf, sizeof(buf), &m, IDS, vals, DIM, &len, err, sizeof(err)), -EINVAL);
}

/* A packed SPULL of 2 ids (3, then a gap) with bytes written over it. */
static int packed_pull(const uint8_t *body, size_t n, char *err)
{
	uint8_t buf[64] = { WIRE_SPULL, 0, MSG_ROWS_IDS_PACKED };
	wire_put_u32(buf + 16, 2);
	wire_put_u32(buf + 24, 2);
	memcpy(buf + 32, body, n);
	struct msg_rows m;
	return msg_decode_rows(buf, 32 + n, DIM, &m, err, 256);
}

Test(msg, rows_packed_refusals)
{
	char err[256] = "";
	static const struct {
		const char *name;
		uint8_t body[24];
		size_t n;
	} bad[] = {
		{ "overlong zero", { 0x03, 0x80, 0x00 }, 3 },
		{ "unfinished", { 0x03, 0x80 }, 2 },
		{ "past 2^64", { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00 }, 11 },
		{ "tenth byte over 1", { 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02 }, 11 },
		{ "not shorter than u64s", { 0x83, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
					     0x83, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01 }, 16 },
		{ "a byte after the ids", { 0x03, 0x05, 0x00 }, 3 },
	};
	uint8_t good[] = { 0x03, 0x05 };
	cr_assert_eq(packed_pull(good, sizeof(good), err), 0, "%s", err);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int r = packed_pull(bad[i].body, bad[i].n, err);
		cr_assert(r == -EPROTO || r == -EMSGSIZE, "%s: %d", bad[i].name, r);
		cr_assert(strstr(err, "SPULL") && !strchr(err, '\n'), "%s: %s", bad[i].name, err);
	}
	/* packed values that are not a packing; an empty set's values packed */
	uint8_t buf[512];
	size_t len = sample_as(WIRE_ROWS, WIRE_F32, 5, 0, 2, buf, sizeof(buf));
	buf[1] = WIRE_F32P;
	struct msg_rows m;
	cr_assert_eq(msg_decode_rows(buf, len - 1, DIM, &m, err, sizeof(err)), -EPROTO);
	cr_assert_not_null(strstr(err, "not a packing of 8 float32 values"), "%s", err);
	len = sample_as(WIRE_ROWS, WIRE_F32, 0, 0, 0, buf, sizeof(buf));
	buf[1] = WIRE_F32P;
	cr_assert_eq(msg_decode_rows(buf, len, DIM, &m, err, sizeof(err)), -EPROTO);
	/* the flags a type may not set */
	len = sample_as(WIRE_ROWS, WIRE_F32, 5, 0, 2, buf, sizeof(buf));
	buf[2] = MSG_ROWS_IDS_PACKED;
	cr_assert_eq(msg_decode_rows(buf, len, DIM, &m, err, sizeof(err)), -EPROTO);
	cr_assert_not_null(strstr(err, "flags byte is 0x01, this type may set 0x00"), "%s", err);
}

/* A set may mix packed and plain messages, and float32 may come packed
 * where float32 is due; a pull's wish for a packed answer is the set's. */
Test(msg, rows_packed_assembly)
{
	char err[256] = "";
	struct msg_rows_asm a;
	uint8_t buf[FRAME_MAX];
	size_t len;
	static float vals[30 * 1024], got[30 * 1024];
	uint64_t ids[30], back[30];
	for (int i = 0; i < 30 * 1024; i++)
		vals[i] = (float)(i % 97) * 0.125f + 0.5f;
	for (int i = 0; i < 30; i++)
		ids[i] = 100 + 3 * (uint64_t)i;
	msg_rows_asm_init(&a, WIRE_SPUSH, WIRE_F32, 1, 1024, 64, MSG_ROWS_ANY);
	for (uint32_t first = 0; first < 30; first += 15) {
		struct msg_rows m = { .type = WIRE_SPUSH, .dtype = first ? WIRE_F32 : WIRE_F32P,
				      .flags = first ? 0 : MSG_ROWS_IDS_PACKED, .shard = 1, .total = 30,
				      .first = first, .count = 15 };
		cr_assert_eq(msg_encode_rows(buf, sizeof(buf), &m, ids + first, vals + first * 1024, 1024, &len, err,
					     sizeof(err)), 0, "%s", err);
		cr_assert_eq(buf[1], first ? WIRE_F32 : WIRE_F32P);
		cr_assert_eq(msg_decode_rows(buf, len, 1024, &m, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(msg_rows_asm_add(&a, &m, back, got, err, sizeof(err)), first ? 1 : 0, "%s", err);
	}
	cr_assert_eq(memcmp(back, ids, sizeof(ids)), 0);
	cr_assert_eq(memcmp(got, vals, sizeof(got)), 0);
	/* packed float32 where bf16 is due */
	msg_rows_asm_init(&a, WIRE_SPUSH, WIRE_BF16, 1, 1024, 64, MSG_ROWS_ANY);
	struct msg_rows m = { .type = WIRE_SPUSH, .dtype = WIRE_F32P, .shard = 1, .total = 30, .count = 15 };
	cr_assert_eq(msg_encode_rows(buf, sizeof(buf), &m, ids, vals, 1024, &len, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(msg_decode_rows(buf, len, 1024, &m, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(msg_rows_asm_add(&a, &m, NULL, NULL, err, sizeof(err)), -EPROTO);
	cr_assert_not_null(strstr(err, "fp32 packed where this end's wire_dtype says bf16"), "%s", err);
	/* a pull that changes its wish half-way */
	msg_rows_asm_init(&a, WIRE_SPULL, WIRE_F32, 1, 1024, 9000, MSG_ROWS_ANY);
	static uint64_t many[8193];
	for (int i = 0; i < 8193; i++)
		many[i] = (uint64_t)i;
	for (uint32_t first = 0; first < 8193; first += 8192) {
		uint32_t n = first ? 1 : 8192;
		m = (struct msg_rows){ .type = WIRE_SPULL, .flags = first ? 0 : MSG_ROWS_WANT_PACKED, .shard = 1,
				       .total = 8193, .first = first, .count = n };
		cr_assert_eq(msg_encode_rows(buf, sizeof(buf), &m, many + first, NULL, 1024, &len, err, sizeof(err)), 0,
			     "%s", err);
		cr_assert_eq(msg_decode_rows(buf, len, 1024, &m, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(msg_rows_asm_add(&a, &m, NULL, NULL, err, sizeof(err)), first ? -EPROTO : 0, "%s", err);
	}
	cr_assert_not_null(strstr(err, "another set"), "%s", err);
}
