/* Tests of net/msg.c: a round trip of every message type, the exact bytes
 * docs/PROTOCOL.md gives for PULL and PUSH, every length rejection
 * (each truncation and one byte too many), wrong type bytes, reserved bytes,
 * counts that disagree with the body, encoder refusals, chunk assembly
 * (in order, gap, overlap, out of range, wrong shard/version/worker,
 * duplicate last chunk), a 669706-float tensor split and reassembled
 * bitwise, the bf16 dtype (bytes, element counts per chunk, a dtype the
 * receiver does not expect refused, a tensor reassembled as rounded), and
 * seeded random and mutated bytes through every decoder. */
#include <criterion/criterion.h>

#include "leak.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../net/bf16.h"
#include "../net/fpack.h"
#include "../net/xdelta.h"
#include "../net/msg.h"
#include "../net/wire.h"

TestSuite(msg, .fini = leak_check);

/* ---- helpers ------------------------------------------------------------ */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
	/* xorshift64*: deterministic across runs and platforms */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1DULL;
}

static const float SAMPLE_FLOATS[5] = { 1.5f, -0.0f, 3.25e-7f, -1e30f, 42.0f };

static const struct msg_report SAMPLE_REPORT = {
	.complete = 0, .has_rate = 1, .has_checkpoint = 1, .shard = 1, .version = 57,
	.total = 150, .applied = 114, .stale = 3, .checkpoint = 50, .rate = 23.5f,
	.uptime_ms = 12345, .workers = 4,
	.state = { MSG_WORKER_LIVE, MSG_WORKER_DONE, MSG_WORKER_LOST, MSG_WORKER_ABSENT },
};

static const struct msg_view SAMPLE_VIEW = {
	.version = 41, .rev = 1, .slices = 4, .live = { 0x05 }, .base = { 0x07 },
};

/* A valid message of each framed type, written to buf; returns its length. */
static size_t sample(uint8_t type, uint8_t *buf, size_t cap)
{
	size_t len = 0;
	char err[256] = "";
	int rc = -1;

	switch (type) {
	case WIRE_PULL:
		rc = msg_encode_pull(buf, cap, &(struct msg_pull){ .shard = 3, .version = 77 },
				     &len, err, sizeof err);
		break;
	case WIRE_PARAMS:
	case WIRE_PUSH:
		rc = msg_encode_chunk(buf, cap,
				      &(struct msg_chunk){ .type = type, .shard = 1, .version = 9,
							   .worker = type == WIRE_PUSH ? 2 : 0,
							   .offset = 100, .count = 5 },
				      SAMPLE_FLOATS, &len, err, sizeof err);
		break;
	case WIRE_ACK:
		rc = msg_encode_ack(buf, cap,
				    &(struct msg_ack){ .shard = 1, .version = 10,
						       .status = MSG_ACK_STALE },
				    &len, err, sizeof err);
		break;
	case WIRE_CHECKPOINT:
		rc = msg_encode_checkpoint(buf, cap, &(struct msg_checkpoint){ .step = 1234 }, &len,
					   err, sizeof err);
		break;
	case WIRE_STATUS:
		rc = msg_encode_status(buf, cap,
				       &(struct msg_status){ .reply = 1, .shard = 2, .version = 5,
							     .applied = 40, .stale = 3 },
				       &len, err, sizeof err);
		break;
	case WIRE_DONE:
		rc = msg_encode_done(buf, cap, &(struct msg_done){ .worker = 7 }, &len, err,
				     sizeof err);
		break;
	case WIRE_ERROR:
		rc = msg_encode_error(buf, cap, 22, "worker 3: bad shard 9", &len, err, sizeof err);
		break;
	case WIRE_HEARTBEAT:
		rc = msg_encode_heartbeat(buf, cap,
					  &(struct msg_heartbeat){ .version = 77, .missing = { 0x02 } },
					  &len, err, sizeof err);
		break;
	case WIRE_ROLLBACK:
		rc = msg_encode_rollback(buf, cap, &(struct msg_rollback){ .step = 500 }, &len, err,
					 sizeof err);
		break;
	case WIRE_REPORT:
		rc = msg_encode_report(buf, cap, &SAMPLE_REPORT, &len, err, sizeof err);
		break;
	case WIRE_VIEW:
		rc = msg_encode_view(buf, cap, &SAMPLE_VIEW, &len, err, sizeof err);
		break;
	case WIRE_LEAVE:
		rc = msg_encode_leave(buf, cap, &(struct msg_leave){ .worker = 3 }, &len, err, sizeof err);
		break;
	case WIRE_COMPUTE:
		rc = msg_encode_compute(buf, cap, &(struct msg_compute){ .text = "cpu: OpenBLAS 0.3.21 SkylakeX" }, &len,
					err, sizeof err);
		break;
	default:
		cr_assert_fail("no sample for type %u", type);
	}
	cr_assert_eq(rc, 0, "encode %s: %d %s", wire_msg_name(type), rc, err);
	return len;
}

/* Decodes buf as type with the matching decoder. */
static int decode_as(uint8_t type, const uint8_t *buf, size_t len, char *err, size_t errlen)
{
	struct msg_pull pull;
	struct msg_chunk chunk;
	struct msg_ack ack;
	struct msg_checkpoint ckpt;
	struct msg_status status;
	struct msg_done done;
	struct msg_error error;
	struct msg_heartbeat hb;
	struct msg_rollback rb;
	struct msg_report rp;
	struct msg_view view;
	struct msg_leave leave;
	struct msg_compute compute;

	switch (type) {
	case WIRE_PULL:
		return msg_decode_pull(buf, len, &pull, err, errlen);
	case WIRE_PARAMS:
	case WIRE_PUSH:
		return msg_decode_chunk(buf, len, &chunk, err, errlen);
	case WIRE_ACK:
		return msg_decode_ack(buf, len, &ack, err, errlen);
	case WIRE_CHECKPOINT:
		return msg_decode_checkpoint(buf, len, &ckpt, err, errlen);
	case WIRE_STATUS:
		return msg_decode_status(buf, len, &status, err, errlen);
	case WIRE_DONE:
		return msg_decode_done(buf, len, &done, err, errlen);
	case WIRE_ERROR:
		return msg_decode_error(buf, len, &error, err, errlen);
	case WIRE_HEARTBEAT:
		return msg_decode_heartbeat(buf, len, &hb, err, errlen);
	case WIRE_ROLLBACK:
		return msg_decode_rollback(buf, len, &rb, err, errlen);
	case WIRE_REPORT:
		return msg_decode_report(buf, len, &rp, err, errlen);
	case WIRE_VIEW:
		return msg_decode_view(buf, len, &view, err, errlen);
	case WIRE_LEAVE:
		return msg_decode_leave(buf, len, &leave, err, errlen);
	case WIRE_COMPUTE:
		return msg_decode_compute(buf, len, &compute, err, errlen);
	}
	cr_assert_fail("no decoder for type %u", type);
	return 0;
}

static const uint8_t TYPES[] = { WIRE_PULL,	  WIRE_PARAMS, WIRE_PUSH,     WIRE_ACK,
				 WIRE_CHECKPOINT, WIRE_STATUS, WIRE_DONE,     WIRE_ERROR,
				 WIRE_HEARTBEAT,  WIRE_ROLLBACK, WIRE_REPORT, WIRE_VIEW,
				 WIRE_LEAVE,	  WIRE_COMPUTE };
#define NTYPES (sizeof TYPES / sizeof TYPES[0])

/* A failure is negative, one non-empty line, and names the message. */
static void assert_refused(int rc, int want, const char *err, const char *name,
			   const char *what)
{
	cr_assert_eq(rc, want, "%s: got %d, want %d (%s)", what, rc, want, err);
	cr_assert(err[0] != '\0', "%s: no message", what);
	cr_assert_null(strchr(err, '\n'), "%s: message has a newline: %s", what, err);
	if (name)
		cr_assert_not_null(strstr(err, name), "%s: message does not name %s: %s", what,
				   name, err);
}

/* ---- round trips ---------------------------------------------------------- */

Test(msg, round_trip_pull)
{
	uint8_t buf[64];
	size_t len = 0;
	struct msg_pull out;
	char err[256] = "";
	const uint64_t versions[] = { 0, 1, 0x0102030405060708ULL, MSG_VERSION_LATEST };

	for (size_t i = 0; i < 4; i++) {
		struct msg_pull in = { .shard = 0xfffffffeu - (uint32_t)i, .version = versions[i] };
		cr_assert_eq(msg_encode_pull(buf, sizeof buf, &in, &len, err, sizeof err), 0, "%s",
			     err);
		cr_assert_eq(len, MSG_PULL_BYTES);
		cr_assert_eq(msg_type(buf, len, err, sizeof err), WIRE_PULL, "%s", err);
		memset(&out, 0xa5, sizeof out);
		cr_assert_eq(msg_decode_pull(buf, len, &out, err, sizeof err), 0, "%s", err);
		cr_assert_eq(out.shard, in.shard);
		cr_assert_eq(out.version, in.version);
	}
}

/* REPORT: every field and every worker's state survive, for 1 and for
 * the most workers; the bytes are where docs/PROTOCOL.md puts them; an
 * unknown rate and no checkpoint travel as clear flags and zeros. */
Test(msg, round_trip_report)
{
	uint8_t buf[MSG_REPORT_BYTES_MAX];
	size_t len = 0;
	char err[256] = "";
	struct msg_report in = SAMPLE_REPORT, out;

	cr_assert_eq(msg_encode_report(buf, sizeof buf, &in, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(len, MSG_REPORT_HDR_BYTES + 4);
	cr_assert_eq(buf[0], 12);
	cr_assert_eq(buf[1], 0x0c, "flags: has_rate | has_checkpoint");
	cr_assert_eq(wire_get_u32(buf + 4), 1);
	cr_assert_eq(wire_get_u64(buf + 8), 57);
	cr_assert_eq(wire_get_u64(buf + 16), 150);
	cr_assert_eq(wire_get_u64(buf + 24), 114);
	cr_assert_eq(wire_get_u64(buf + 32), 3);
	cr_assert_eq(wire_get_u64(buf + 40), 50);
	cr_assert_eq(wire_get_f32(buf + 48), 23.5f);
	cr_assert_eq(wire_get_u32(buf + 52), 4);
	cr_assert_eq(wire_get_u64(buf + 56), 12345);
	cr_assert_eq(buf[64], MSG_WORKER_LIVE);
	cr_assert_eq(buf[66], MSG_WORKER_LOST);
	cr_assert_eq(msg_type(buf, len, err, sizeof err), WIRE_REPORT, "%s", err);
	memset(&out, 0xa5, sizeof out);
	cr_assert_eq(msg_decode_report(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_eq(out.version, 57);
	cr_assert_eq(out.total, 150);
	cr_assert_eq(out.applied, 114);
	cr_assert_eq(out.stale, 3);
	cr_assert_eq(out.checkpoint, 50);
	cr_assert(out.has_rate && out.has_checkpoint && !out.complete && !out.final);
	cr_assert_eq(out.rate, 23.5f);
	cr_assert_eq(out.uptime_ms, 12345);
	cr_assert_eq(out.workers, 4);
	cr_assert_arr_eq(out.state, in.state, 4);

	/* the most workers, every state, complete and final; no rate, no
	 * checkpoint: the fields go as zeros whatever the struct held */
	in = (struct msg_report){ .complete = 1, .final = 1, .shard = 0xfffffffeu,
				  .version = UINT64_MAX, .checkpoint = 99, .rate = 7.0f,
				  .workers = MSG_REPORT_WORKERS };
	for (unsigned w = 0; w < MSG_REPORT_WORKERS; w++)
		in.state[w] = (uint8_t)(w % (MSG_WORKER_STATE_LAST + 1));
	cr_assert_eq(msg_encode_report(buf, sizeof buf, &in, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(len, MSG_REPORT_BYTES_MAX);
	cr_assert_eq(buf[1], 0x03);
	cr_assert_eq(wire_get_u64(buf + 40), 0);
	cr_assert_eq(wire_get_u32(buf + 48), 0);
	cr_assert_eq(msg_decode_report(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert(out.complete && out.final && !out.has_rate && !out.has_checkpoint);
	cr_assert_eq(out.checkpoint, 0);
	cr_assert_eq(out.version, UINT64_MAX);
	cr_assert_arr_eq(out.state, in.state, MSG_REPORT_WORKERS);
	cr_assert_str_eq(msg_worker_state_name(MSG_WORKER_AWAY), "away");
	cr_assert_str_eq(msg_worker_state_name(6), "?");
}

/* A REPORT whose length is right but a field is not, one row each; and
 * what its encoder refuses to send. */
Test(msg, report_bad_fields)
{
	static const struct {
		const char *name;
		size_t at;      /* byte offset written */
		int width;      /* 1, 4 (u32) or 8 (u64) */
		uint64_t value;
		int want;
		const char *text;
	} rows[] = {
		{ "unknown flag", 1, 1, 0x1c, -EPROTO, "unknown flags 0x1c" },
		{ "flag bit 7", 1, 1, 0x8c, -EPROTO, "unknown flags" },
		{ "workers 0", 52, 4, 0, -EPROTO, "0 workers, not 1..256" },
		{ "workers 257", 52, 4, 257, -EPROTO, "257 workers" },
		{ "workers 5 in 4's bytes", 52, 4, 5, -EMSGSIZE, "5 workers need exactly 69" },
		{ "workers 3 in 4's bytes", 52, 4, 3, -EMSGSIZE, "3 workers need exactly 67" },
		{ "state 6", 67, 1, 6, -EPROTO, "worker 3 has unknown state 6" },
		{ "state 255", 64, 1, 255, -EPROTO, "worker 0 has unknown state 255" },
		{ "NaN rate", 48, 4, 0x7fc00000u, -EPROTO, "not finite" },
		{ "inf rate", 48, 4, 0x7f800000u, -EPROTO, "not finite" },
		{ "negative rate", 48, 4, 0xbf800000u, -EPROTO, "rate -1" },
		{ "checkpoint without flag", 1, 1, 0x04, -EPROTO, "checkpoint step without its flag" },
		{ "rate without flag", 1, 1, 0x08, -EPROTO, "rate without its flag" },
	};
	uint8_t buf[256];
	for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
		size_t len = sample(WIRE_REPORT, buf, sizeof buf);
		struct msg_report out;
		char err[256] = "";
		if (rows[r].width == 1)
			buf[rows[r].at] = (uint8_t)rows[r].value;
		else if (rows[r].width == 4)
			wire_put_u32(buf + rows[r].at, (uint32_t)rows[r].value);
		else
			wire_put_u64(buf + rows[r].at, rows[r].value);
		int rc = msg_decode_report(buf, len, &out, err, sizeof err);
		assert_refused(rc, rows[r].want, err, "REPORT", rows[r].name);
		cr_assert_not_null(strstr(err, rows[r].text), "%s: want \"%s\" in \"%s\"",
				   rows[r].name, rows[r].text, err);
	}

	/* the encoder sends none of these */
	struct msg_report m = SAMPLE_REPORT;
	size_t len = 0;
	char err[256] = "";
	m.workers = 0;
	assert_refused(msg_encode_report(buf, sizeof buf, &m, &len, err, sizeof err), -EINVAL,
		       err, "REPORT", "encode 0 workers");
	m = SAMPLE_REPORT;
	m.rate = NAN;
	assert_refused(msg_encode_report(buf, sizeof buf, &m, &len, err, sizeof err), -EINVAL,
		       err, "REPORT", "encode NaN rate");
	m.rate = -2;
	assert_refused(msg_encode_report(buf, sizeof buf, &m, &len, err, sizeof err), -EINVAL,
		       err, "REPORT", "encode negative rate");
	m = SAMPLE_REPORT;
	m.state[2] = 9;
	assert_refused(msg_encode_report(buf, sizeof buf, &m, &len, err, sizeof err), -EINVAL,
		       err, "REPORT", "encode unknown state");
	m = SAMPLE_REPORT;
	m.final = 2;
	assert_refused(msg_encode_report(buf, sizeof buf, &m, &len, err, sizeof err), -EINVAL,
		       err, "REPORT", "encode flag 2");
	m = SAMPLE_REPORT;
	assert_refused(msg_encode_report(buf, MSG_REPORT_HDR_BYTES + 3, &m, &len, err, sizeof err),
		       -ENOBUFS, err, "REPORT", "encode into too small a buffer");
	/* NaN with has_rate clear is never looked at: it goes as 0 */
	m.has_rate = 0;
	m.rate = NAN;
	cr_assert_eq(msg_encode_report(buf, sizeof buf, &m, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(wire_get_u32(buf + 48), 0);
}

Test(msg, round_trip_chunks)
{
	static uint8_t buf[MSG_CHUNK_BYTES_MAX];
	static float in[MSG_CHUNK_FLOATS], back[MSG_CHUNK_FLOATS];
	const uint32_t counts[] = { 1, 2, 5, 1000, MSG_CHUNK_FLOATS - 1, MSG_CHUNK_FLOATS };
	const uint8_t types[] = { WIRE_PARAMS, WIRE_PUSH };
	char err[256] = "";

	rng_state = 12345;
	for (size_t i = 0; i < MSG_CHUNK_FLOATS; i++) {
		uint32_t u = (uint32_t)rng_next();
		memcpy(&in[i], &u, sizeof u); /* every bit pattern, NaNs included */
	}
	for (size_t t = 0; t < 2; t++)
		for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
			struct msg_chunk c = { .type = types[t], .shard = 4,
					       .version = 0x1122334455667788ULL,
					       .worker = types[t] == WIRE_PUSH ? 63 : 0,
					       .offset = 0x0000000100000003ULL, .count = counts[k] };
			struct msg_chunk out;
			size_t len = 0;

			cr_assert_eq(msg_encode_chunk(buf, sizeof buf, &c, in, &len, err,
						      sizeof err),
				     0, "%s", err);
			cr_assert_eq(len, MSG_CHUNK_BYTES(counts[k], WIRE_F32));
			cr_assert(len <= FRAME_MAX);
			cr_assert_eq(msg_type(buf, len, err, sizeof err), types[t]);
			memset(&out, 0, sizeof out);
			cr_assert_eq(msg_decode_chunk(buf, len, &out, err, sizeof err), 0, "%s", err);
			cr_assert_eq(out.type, c.type);
			cr_assert_eq(out.shard, c.shard);
			cr_assert_eq(out.version, c.version);
			cr_assert_eq(out.worker, c.worker);
			cr_assert_eq(out.offset, c.offset);
			cr_assert_eq(out.count, c.count);
			cr_assert_eq(out.data, buf + MSG_CHUNK_HDR_BYTES);
			memset(back, 0, sizeof back);
			msg_chunk_floats(back, &out);
			cr_assert_eq(memcmp(back, in, 4u * counts[k]), 0, "%s count %u: floats differ",
				     wire_msg_name(types[t]), counts[k]);
		}
}

/* A float32 chunk decoded from its header alone (its values read
 * elsewhere) has the fields of the whole one, no data, and the same
 * length checks; a bf16 one is refused, its values need widening. */
Test(msg, chunk_head_alone)
{
	static uint8_t buf[MSG_CHUNK_BYTES_MAX];
	static float in[100];
	char err[256] = "";
	struct msg_chunk c = { .type = WIRE_PUSH, .shard = 2, .version = 9, .worker = 5,
			       .offset = 300, .count = 100 }, whole, head;
	size_t len = 0;
	memset(&whole, 0, sizeof whole); /* the padding too: compared whole below */
	memset(&head, 0, sizeof head);
	cr_assert_eq(msg_encode_chunk(buf, sizeof buf, &c, in, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(msg_decode_chunk(buf, len, &whole, err, sizeof err), 0, "%s", err);
	cr_assert_eq(msg_decode_chunk_head(buf, len, &head, err, sizeof err), 0, "%s", err);
	cr_assert_null(head.data);
	head.data = whole.data;
	head.bytes = whole.bytes;
	cr_assert_eq(memcmp(&head, &whole, sizeof head), 0);
	cr_assert_eq(msg_decode_chunk_head(buf, len + 4, &head, err, sizeof err), -EMSGSIZE);
	c.dtype = WIRE_BF16;
	cr_assert_eq(msg_encode_chunk(buf, sizeof buf, &c, in, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(msg_decode_chunk_head(buf, len, &head, err, sizeof err), -EPROTO);
	cr_assert_not_null(strstr(err, "values were not read"), "%s", err);
}

/* The payload may start at any address: decoding from an odd offset in a
 * byte buffer still yields the same floats (read byte-wise, never cast). */
Test(msg, chunk_unaligned_payload)
{
	uint8_t raw[MSG_CHUNK_BYTES(5, WIRE_F32) + 1];
	uint8_t *buf = raw + 1;
	struct msg_chunk out;
	float back[5];
	char err[256] = "";
	size_t len = sample(WIRE_PUSH, buf, sizeof raw - 1);

	cr_assert_eq(msg_decode_chunk(buf, len, &out, err, sizeof err), 0, "%s", err);
	msg_chunk_floats(back, &out);
	cr_assert_eq(memcmp(back, SAMPLE_FLOATS, sizeof back), 0);
	cr_assert(signbit(back[1]), "-0.0f lost its sign");
}

Test(msg, round_trip_ack)
{
	uint8_t buf[64];
	size_t len = 0;
	char err[256] = "";

	for (uint32_t s = MSG_ACK_FIRST; s <= MSG_ACK_LAST; s++) {
		struct msg_ack in = { .shard = s * 3, .version = 1000 + s, .status = s }, out;
		cr_assert_eq(msg_encode_ack(buf, sizeof buf, &in, &len, err, sizeof err), 0, "%s",
			     err);
		cr_assert_eq(len, MSG_ACK_BYTES);
		memset(&out, 0, sizeof out);
		cr_assert_eq(msg_decode_ack(buf, len, &out, err, sizeof err), 0, "%s", err);
		cr_assert_eq(out.shard, in.shard);
		cr_assert_eq(out.version, in.version);
		cr_assert_eq(out.status, s);
	}
}

Test(msg, round_trip_checkpoint_done)
{
	uint8_t buf[64];
	size_t len = 0;
	char err[256] = "";
	struct msg_checkpoint ck = { .step = 0xfedcba9876543210ULL }, ckout = { 0 };
	struct msg_done dn = { .worker = 0xdeadbeefu }, dnout = { 0 };

	cr_assert_eq(msg_encode_checkpoint(buf, sizeof buf, &ck, &len, err, sizeof err), 0);
	cr_assert_eq(len, MSG_CHECKPOINT_BYTES);
	cr_assert_eq(msg_decode_checkpoint(buf, len, &ckout, err, sizeof err), 0, "%s", err);
	cr_assert_eq(ckout.step, ck.step);
	cr_assert_eq(ckout.has_acc, 0);

	/* the final checkpoint's accuracy, in millionths; byte 1 says it is there */
	ck.has_acc = 1;
	ck.acc = 0.873421;
	cr_assert_eq(msg_encode_checkpoint(buf, sizeof buf, &ck, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(buf[1], 1);
	cr_assert_eq(msg_decode_checkpoint(buf, len, &ckout, err, sizeof err), 0, "%s", err);
	cr_assert(ckout.has_acc && fabs(ckout.acc - 0.873421) < 1e-9, "%d %g", ckout.has_acc, ckout.acc);
	buf[1] = 2;
	cr_assert_eq(msg_decode_checkpoint(buf, len, &ckout, err, sizeof err), -EPROTO);
	buf[1] = 1;
	wire_put_u32(buf + 4, 1000001);
	cr_assert_eq(msg_decode_checkpoint(buf, len, &ckout, err, sizeof err), -EPROTO);
	cr_assert(strstr(err, "above 1"), "%s", err);
	ck.acc = 1.5;
	cr_assert_eq(msg_encode_checkpoint(buf, sizeof buf, &ck, &len, err, sizeof err), -EINVAL);

	cr_assert_eq(msg_encode_done(buf, sizeof buf, &dn, &len, err, sizeof err), 0);
	cr_assert_eq(len, MSG_DONE_BYTES);
	cr_assert_eq(msg_decode_done(buf, len, &dnout, err, sizeof err), 0, "%s", err);
	cr_assert_eq(dnout.worker, dn.worker);
	cr_assert_eq(dnout.leaving, 0);

	/* leaving: byte 1, 0 or 1 */
	dn.leaving = 1;
	cr_assert_eq(msg_encode_done(buf, sizeof buf, &dn, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(buf[1], 1);
	cr_assert_eq(buf[2] | buf[3], 0);
	memset(&dnout, 0, sizeof dnout);
	cr_assert_eq(msg_decode_done(buf, len, &dnout, err, sizeof err), 0, "%s", err);
	cr_assert_eq(dnout.leaving, 1);
	cr_assert_eq(dnout.worker, dn.worker);
	buf[1] = 2;
	assert_refused(msg_decode_done(buf, len, &dnout, err, sizeof err), -EPROTO, err, "leaving",
		       "leaving flag 2");
	dn.leaving = 2;
	assert_refused(msg_encode_done(buf, sizeof buf, &dn, &len, err, sizeof err), -EINVAL, err,
		       "leaving", "encoding leaving flag 2");
}

/* HEARTBEAT's bytes as docs/PROTOCOL.md draws them, and ROLLBACK's. */
Test(msg, heartbeat_and_rollback_bytes)
{
	uint8_t buf[64];
	size_t len = 0;
	char err[256] = "";
	struct msg_heartbeat hb = { .version = 0x0102030405060708ULL }, hbout;
	hb.missing[0] = 0x05;   /* workers 0 and 2 */
	hb.missing[31] = 0x80;  /* worker 255 */
	cr_assert_eq(msg_encode_heartbeat(buf, sizeof buf, &hb, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(len, MSG_HEARTBEAT_BYTES);
	const uint8_t head[16] = { 10, 0, 0, 0, 0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1 };
	cr_assert_eq(memcmp(buf, head, 16), 0);
	cr_assert_eq(buf[16], 0x05);
	cr_assert_eq(buf[47], 0x80);
	memset(&hbout, 0xff, sizeof hbout);
	cr_assert_eq(msg_decode_heartbeat(buf, len, &hbout, err, sizeof err), 0, "%s", err);
	cr_assert_eq(hbout.version, hb.version);
	cr_assert_eq(memcmp(hbout.missing, hb.missing, sizeof hb.missing), 0);

	struct msg_rollback rb = { .step = 0xfedcba9876543210ULL }, rbout = { 0 };
	cr_assert_eq(msg_encode_rollback(buf, sizeof buf, &rb, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(len, MSG_ROLLBACK_BYTES);
	cr_assert_eq(buf[0], 11);
	cr_assert_eq(buf[8], 0x10);
	cr_assert_eq(msg_decode_rollback(buf, len, &rbout, err, sizeof err), 0, "%s", err);
	cr_assert_eq(rbout.step, rb.step);
	assert_refused(msg_encode_rollback(buf, 15, &rb, &len, err, sizeof err), -ENOBUFS, err,
		       "ROLLBACK", "small buffer");
}

Test(msg, round_trip_status)
{
	uint8_t buf[64];
	size_t len = 0;
	char err[256] = "";
	struct msg_status req = { .reply = 0, .shard = 5 };
	struct msg_status rep = { .reply = 1, .shard = 5, .version = 99,
				  .applied = 0x100000000ULL, .stale = 17 };
	struct msg_status out;

	cr_assert_eq(msg_encode_status(buf, sizeof buf, &req, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(len, MSG_STATUS_BYTES);
	memset(&out, 0xff, sizeof out);
	cr_assert_eq(msg_decode_status(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_eq(out.reply, 0);
	cr_assert_eq(out.shard, 5);
	cr_assert_eq(out.version + out.applied + out.stale, 0);

	cr_assert_eq(msg_encode_status(buf, sizeof buf, &rep, &len, err, sizeof err), 0, "%s", err);
	memset(&out, 0, sizeof out);
	cr_assert_eq(msg_decode_status(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_eq(out.reply, 1);
	cr_assert_eq(out.shard, 5);
	cr_assert_eq(out.version, 99);
	cr_assert_eq(out.applied, 0x100000000ULL);
	cr_assert_eq(out.stale, 17);
	cr_assert_eq(out.complete, 0);

	/* complete: byte 2 of a reply, 0 or 1; never in a request */
	rep.complete = 1;
	cr_assert_eq(msg_encode_status(buf, sizeof buf, &rep, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(buf[2], 1);
	cr_assert_eq(buf[3], 0);
	memset(&out, 0, sizeof out);
	cr_assert_eq(msg_decode_status(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_eq(out.complete, 1);
	cr_assert_eq(out.version, 99);
	buf[2] = 2;
	assert_refused(msg_decode_status(buf, len, &out, err, sizeof err), -EPROTO, err, "complete",
		       "complete flag 2");
	cr_assert_eq(msg_encode_status(buf, sizeof buf, &req, &len, err, sizeof err), 0, "%s", err);
	buf[2] = 1;
	assert_refused(msg_decode_status(buf, len, &out, err, sizeof err), -EPROTO, err, "request",
		       "a request marked complete");
	req.complete = 1;
	assert_refused(msg_encode_status(buf, sizeof buf, &req, &len, err, sizeof err), -EINVAL, err,
		       "request", "encoding a request marked complete");
	rep.complete = 2;
	assert_refused(msg_encode_status(buf, sizeof buf, &rep, &len, err, sizeof err), -EINVAL, err,
		       "complete", "encoding complete flag 2");
}

Test(msg, round_trip_error)
{
	uint8_t buf[MSG_ERROR_BYTES_MAX];
	char longest[WIRE_ERROR_TEXT_MAX + 1];
	const char *texts[] = { "", "x", "ps 0: shard 3 is not mine (I own 0)", longest };
	char err[256] = "";

	memset(longest, 'e', WIRE_ERROR_TEXT_MAX);
	longest[WIRE_ERROR_TEXT_MAX] = '\0';
	for (size_t i = 0; i < 4; i++) {
		struct msg_error out;
		size_t len = 0;
		cr_assert_eq(msg_encode_error(buf, sizeof buf, 100 + (uint32_t)i, texts[i], &len, err,
					      sizeof err),
			     0, "%s", err);
		cr_assert_eq(len, MSG_ERROR_HDR_BYTES + strlen(texts[i]));
		memset(&out, 'z', sizeof out);
		cr_assert_eq(msg_decode_error(buf, len, &out, err, sizeof err), 0, "%s", err);
		cr_assert_eq(out.code, 100 + i);
		cr_assert_str_eq(out.text, texts[i]);
	}
}

/* The bytes docs/PROTOCOL.md gives, field by field. */
Test(msg, bytes_match_protocol)
{
	uint8_t buf[64];
	size_t len = 0;
	char err[256] = "";
	const uint8_t pull[16] = { 2, 0, 0, 0, 3, 0, 0, 0, 77, 0, 0, 0, 0, 0, 0, 0 };
	const uint8_t push[32 + 20] = {
		4,   0, 0, 0,    1, 0, 0, 0,               /* type, shard 1 */
		9,   0, 0, 0,    0, 0, 0, 0,               /* version 9 */
		100, 0, 0, 0,    0, 0, 0, 0,               /* offset 100 */
		5,   0, 0, 0,    2, 0, 0, 0,               /* count 5, worker 2 */
		0x00, 0x00, 0xc0, 0x3f,                    /* 1.5f */
		0x00, 0x00, 0x00, 0x80,                    /* -0.0f */
		0xa9, 0x7b, 0xae, 0x34,                    /* 3.25e-7f */
		0xca, 0xf2, 0x49, 0xf1,                    /* -1e30f */
		0x00, 0x00, 0x28, 0x42,                    /* 42.0f */
	};
	const uint8_t ack[24] = { 5, 0, 0, 0, 1, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0,
				  3, 0, 0, 0, 0, 0, 0, 0 };
	const uint8_t err_hdr[12] = { 9, 0, 0, 0, 22, 0, 0, 0, 21, 0, 0, 0 };

	len = sample(WIRE_PULL, buf, sizeof buf);
	cr_assert_eq(len, sizeof pull);
	cr_assert_eq(memcmp(buf, pull, len), 0);
	len = sample(WIRE_PUSH, buf, sizeof buf);
	cr_assert_eq(len, sizeof push);
	for (size_t i = 0; i < len; i++)
		cr_assert_eq(buf[i], push[i], "PUSH byte %zu: %02x, want %02x", i, buf[i], push[i]);
	len = sample(WIRE_ACK, buf, sizeof buf);
	cr_assert_eq(len, sizeof ack);
	cr_assert_eq(memcmp(buf, ack, len), 0);
	len = sample(WIRE_ERROR, buf, sizeof buf);
	cr_assert_eq(len, 12 + 21);
	cr_assert_eq(memcmp(buf, err_hdr, 12), 0);
	cr_assert_eq(memcmp(buf + 12, "worker 3: bad shard 9", 21), 0);
	(void)err;
}

/* ---- rejections ----------------------------------------------------------- */

/* Every length short of the message, and one byte more, is refused with
 * -EMSGSIZE, and the message names the type. */
Test(msg, every_truncation_and_one_extra_byte)
{
	uint8_t buf[256], copy[257];

	for (size_t t = 0; t < NTYPES; t++) {
		uint8_t type = TYPES[t];
		size_t len = sample(type, buf, sizeof buf);
		char err[256];
		char what[64];

		for (size_t n = 0; n < len; n++) {
			/* a copy of exactly n bytes, so ASan catches any read past it */
			uint8_t *p = malloc(n ? n : 1);
			cr_assert_not_null(p);
			memcpy(p, buf, n);
			err[0] = '\0';
			snprintf(what, sizeof what, "%s truncated to %zu", wire_msg_name(type), n);
			assert_refused(decode_as(type, p, n, err, sizeof err), -EMSGSIZE, err,
				       n ? wire_msg_name(type) : NULL, what);
			free(p);
		}
		memcpy(copy, buf, len);
		copy[len] = 0;
		err[0] = '\0';
		snprintf(what, sizeof what, "%s plus one byte", wire_msg_name(type));
		assert_refused(decode_as(type, copy, len + 1, err, sizeof err), -EMSGSIZE, err,
			       wire_msg_name(type), what);
		err[0] = '\0';
		cr_assert_eq(decode_as(type, buf, len, err, sizeof err), 0, "%s intact: %s",
			     wire_msg_name(type), err);
	}
}

/* Every other type byte is refused by each decoder with -EPROTO. */
Test(msg, wrong_type_byte)
{
	uint8_t buf[256];

	for (size_t t = 0; t < NTYPES; t++) {
		uint8_t type = TYPES[t];
		size_t len = sample(type, buf, sizeof buf);
		for (unsigned b = 0; b < 256; b++) {
			int own = b == type ||
				  (type != WIRE_PUSH && type != WIRE_PARAMS ? 0 :
				   b == WIRE_PUSH || b == WIRE_PARAMS);
			char err[256] = "", what[64];
			int rc;

			if (own)
				continue;
			buf[0] = (uint8_t)b;
			rc = decode_as(type, buf, len, err, sizeof err);
			snprintf(what, sizeof what, "%s with type byte %u", wire_msg_name(type), b);
			assert_refused(rc, -EPROTO, err, NULL, what);
		}
		buf[0] = type;
	}
}

Test(msg, msg_type_classifies)
{
	uint8_t b[1];
	char err[256];

	for (unsigned v = 0; v < 256; v++) {
		int rc;
		b[0] = (uint8_t)v;
		err[0] = '\0';
		rc = msg_type(b, 1, err, sizeof err);
		if (v >= WIRE_PULL && v <= WIRE_MSG_LAST)
			cr_assert_eq(rc, (int)v);
		else
			assert_refused(rc, -EPROTO, err, v == WIRE_HELLO ? "HELLO" : NULL, "type");
	}
	err[0] = '\0';
	assert_refused(msg_type(b, 0, err, sizeof err), -EMSGSIZE, err, NULL, "empty");
}

/* Each reserved byte set to nonzero is refused. */
Test(msg, reserved_bytes_must_be_zero)
{
	static const struct {
		uint8_t type;
		size_t from, to;
	} rows[] = {
		{ WIRE_PULL, 2, 4 },  { WIRE_PARAMS, 2, 4 }, { WIRE_PUSH, 2, 4 }, /* 1: flags, dtype */
		{ WIRE_ACK, 1, 4 },   { WIRE_ACK, 20, 24 },  { WIRE_CHECKPOINT, 2, 8 },
		{ WIRE_STATUS, 3, 4 }, { WIRE_DONE, 2, 4 },  { WIRE_ERROR, 1, 4 },
		{ WIRE_HEARTBEAT, 1, 8 }, { WIRE_ROLLBACK, 1, 8 }, { WIRE_REPORT, 2, 4 },
		{ WIRE_VIEW, 1, 2 },      { WIRE_LEAVE, 1, 4 },
	};
	uint8_t buf[256];

	for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
		for (size_t i = rows[r].from; i < rows[r].to; i++) {
			size_t len = sample(rows[r].type, buf, sizeof buf);
			char err[256] = "", what[64];
			buf[i] = 0x01;
			snprintf(what, sizeof what, "%s byte %zu", wire_msg_name(rows[r].type), i);
			assert_refused(decode_as(rows[r].type, buf, len, err, sizeof err), -EPROTO,
				       err, "reserved", what);
		}
}

/* A PUSH or PARAMS whose count disagrees with its body length. */
Test(msg, chunk_count_disagrees_with_body)
{
	static const struct {
		uint32_t count; /* written over the sample's count of 5 */
		int want;
		const char *text;
	} rows[] = {
		{ 4, -EMSGSIZE, "count 4 needs exactly 48" },
		{ 6, -EMSGSIZE, "count 6 needs exactly 56" },
		{ 1, -EMSGSIZE, "count 1 needs exactly 36" },
		{ 0, -EPROTO, "count 0 is not in 1..16384" },
		{ MSG_CHUNK_FLOATS + 1, -EPROTO, "count 16385 is not in" },
		{ 0xffffffffu, -EPROTO, "count 4294967295 is not in" },
	};
	const uint8_t types[] = { WIRE_PARAMS, WIRE_PUSH };
	uint8_t buf[256];

	for (size_t t = 0; t < 2; t++)
		for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
			size_t len = sample(types[t], buf, sizeof buf);
			struct msg_chunk out;
			char err[256] = "";
			int rc;

			wire_put_u32(buf + 24, rows[r].count);
			rc = msg_decode_chunk(buf, len, &out, err, sizeof err);
			assert_refused(rc, rows[r].want, err, wire_msg_name(types[t]), rows[r].text);
			cr_assert_not_null(strstr(err, rows[r].text), "want \"%s\" in \"%s\"",
					   rows[r].text, err);
		}
}

/* Field values a decoder refuses although the length is right. */
Test(msg, bad_field_values)
{
	uint8_t buf[256];
	struct msg_chunk c;
	struct msg_ack a;
	struct msg_status s;
	struct msg_error e;
	char err[256];
	size_t len;

	len = sample(WIRE_PARAMS, buf, sizeof buf);
	wire_put_u32(buf + 28, 1); /* PARAMS with a worker */
	err[0] = '\0';
	assert_refused(msg_decode_chunk(buf, len, &c, err, sizeof err), -EPROTO, err, "PARAMS",
		       "PARAMS worker");

	len = sample(WIRE_PUSH, buf, sizeof buf);
	wire_put_u64(buf + 16, UINT64_MAX - 2); /* offset + count overflows */
	err[0] = '\0';
	assert_refused(msg_decode_chunk(buf, len, &c, err, sizeof err), -ERANGE, err, "PUSH",
		       "offset overflow");

	const uint32_t statuses[] = { 0, MSG_ACK_LAST + 1, 0xffffffffu };
	for (size_t i = 0; i < 3; i++) {
		len = sample(WIRE_ACK, buf, sizeof buf);
		wire_put_u32(buf + 16, statuses[i]);
		err[0] = '\0';
		assert_refused(msg_decode_ack(buf, len, &a, err, sizeof err), -EPROTO, err, "ACK",
			       "ack status");
	}

	len = sample(WIRE_STATUS, buf, sizeof buf);
	buf[1] = 2;
	err[0] = '\0';
	assert_refused(msg_decode_status(buf, len, &s, err, sizeof err), -EPROTO, err, "STATUS",
		       "status flag");
	buf[1] = 0; /* a request with the sample's counters */
	err[0] = '\0';
	assert_refused(msg_decode_status(buf, len, &s, err, sizeof err), -EPROTO, err, "STATUS",
		       "status request counters");

	len = sample(WIRE_ERROR, buf, sizeof buf);
	wire_put_u32(buf + 4, 0);
	err[0] = '\0';
	assert_refused(msg_decode_error(buf, len, &e, err, sizeof err), -EPROTO, err, "ERROR",
		       "error code 0");
	/* Outside printable ASCII (hygiene/error_text_* tests every byte). */
	const uint8_t bad[] = { '\0', '\n', '\r', 0x1b, 0x7f, 0x80, 0xff };
	for (size_t i = 0; i < sizeof bad; i++) {
		len = sample(WIRE_ERROR, buf, sizeof buf);
		buf[MSG_ERROR_HDR_BYTES + 5] = bad[i];
		err[0] = '\0';
		assert_refused(msg_decode_error(buf, len, &e, err, sizeof err), -EPROTO, err,
			       "ERROR", "error text byte");
	}
	/* text length over the limit, body sized to match */
	{
		uint8_t big[MSG_ERROR_BYTES_MAX + 1];
		memset(big, 'a', sizeof big);
		(void)sample(WIRE_ERROR, big, sizeof big);
		wire_put_u32(big + 8, WIRE_ERROR_TEXT_MAX + 1);
		err[0] = '\0';
		assert_refused(msg_decode_error(big, sizeof big, &e, err, sizeof err), -EMSGSIZE,
			       err, "ERROR", "error too long");
		err[0] = '\0';
		assert_refused(msg_decode_error(big, sizeof big - 1, &e, err, sizeof err), -EPROTO,
			       err, "ERROR", "error text length");
	}
	/* text length claims more than the body holds */
	len = sample(WIRE_ERROR, buf, sizeof buf);
	wire_put_u32(buf + 8, 22);
	err[0] = '\0';
	assert_refused(msg_decode_error(buf, len, &e, err, sizeof err), -EMSGSIZE, err, "ERROR",
		       "error text length mismatch");
}

Test(msg, encoders_refuse)
{
	static uint8_t buf[MSG_CHUNK_BYTES_MAX + 4];
	static float src[MSG_CHUNK_FLOATS + 1];
	char err[256];
	size_t len = 12345;
	struct msg_chunk c = { .type = WIRE_PUSH, .shard = 0, .version = 1, .offset = 0, .count = 0 };
	char longtext[WIRE_ERROR_TEXT_MAX + 2];

	err[0] = '\0';
	assert_refused(msg_encode_chunk(buf, sizeof buf, &c, src, &len, err, sizeof err), -EINVAL,
		       err, "PUSH", "count 0");
	c.count = MSG_CHUNK_FLOATS + 1;
	err[0] = '\0';
	assert_refused(msg_encode_chunk(buf, sizeof buf, &c, src, &len, err, sizeof err), -EINVAL,
		       err, "PUSH", "count too big");
	c.count = 3;
	c.type = WIRE_ACK;
	err[0] = '\0';
	assert_refused(msg_encode_chunk(buf, sizeof buf, &c, src, &len, err, sizeof err), -EINVAL,
		       err, NULL, "chunk type");
	c.type = WIRE_PARAMS;
	c.worker = 1;
	err[0] = '\0';
	assert_refused(msg_encode_chunk(buf, sizeof buf, &c, src, &len, err, sizeof err), -EINVAL,
		       err, "PARAMS", "params worker");
	c.worker = 0;
	err[0] = '\0';
	assert_refused(msg_encode_chunk(buf, MSG_CHUNK_BYTES(3, WIRE_F32) - 1, &c, src, &len, err,
					sizeof err),
		       -ENOBUFS, err, "PARAMS", "small buffer");
	cr_assert_eq(len, 12345, "len written on failure");

	err[0] = '\0';
	assert_refused(msg_encode_ack(buf, sizeof buf, &(struct msg_ack){ .status = 0 }, &len, err,
				      sizeof err),
		       -EINVAL, err, "ACK", "ack status 0");
	err[0] = '\0';
	assert_refused(msg_encode_pull(buf, MSG_PULL_BYTES - 1, &(struct msg_pull){ 0 }, &len, err,
				       sizeof err),
		       -ENOBUFS, err, "PULL", "pull buffer");
	err[0] = '\0';
	assert_refused(msg_encode_status(buf, sizeof buf,
					 &(struct msg_status){ .reply = 0, .applied = 1 }, &len,
					 err, sizeof err),
		       -EINVAL, err, "STATUS", "status request counters");
	err[0] = '\0';
	assert_refused(msg_encode_error(buf, sizeof buf, 0, "x", &len, err, sizeof err), -EINVAL,
		       err, "ERROR", "error code 0");
	memset(longtext, 'x', sizeof longtext - 1);
	longtext[sizeof longtext - 1] = '\0';
	err[0] = '\0';
	assert_refused(msg_encode_error(buf, sizeof buf, 5, longtext, &len, err, sizeof err),
		       -EINVAL, err, "ERROR", "error too long");
	err[0] = '\0';
	assert_refused(msg_encode_error(buf, MSG_ERROR_HDR_BYTES + 2, 5, "abc", &len, err,
					sizeof err),
		       -ENOBUFS, err, "ERROR", "error buffer");
	cr_assert_eq(len, 12345, "len written on failure");
}

/* ---- chunking and assembly ------------------------------------------------ */

Test(msg, chunk_counts)
{
	uint64_t off;
	uint32_t cnt;

	cr_assert_eq(msg_chunks(0, WIRE_F32), 0);
	cr_assert_eq(msg_chunks(1, WIRE_F32), 1);
	cr_assert_eq(msg_chunks(MSG_CHUNK_FLOATS, WIRE_F32), 1);
	cr_assert_eq(msg_chunks(MSG_CHUNK_FLOATS + 1, WIRE_F32), 2);
	cr_assert_eq(msg_chunks(669706, WIRE_F32), 41);
	msg_chunk_range(669706, WIRE_F32, 0, &off, &cnt);
	cr_assert(off == 0 && cnt == MSG_CHUNK_FLOATS);
	msg_chunk_range(669706, WIRE_F32, 40, &off, &cnt);
	cr_assert_eq(off, 40 * MSG_CHUNK_FLOATS);
	cr_assert_eq(cnt, 669706 - 40 * MSG_CHUNK_FLOATS);
	msg_chunk_range(MSG_CHUNK_FLOATS, WIRE_F32, 0, &off, &cnt);
	cr_assert(off == 0 && cnt == MSG_CHUNK_FLOATS);
}

/* A decoded-looking chunk for assembly tests (data points at zeros). */
static struct msg_chunk mk(uint8_t type, uint32_t shard, uint64_t version, uint32_t worker,
			   uint64_t offset, uint32_t count)
{
	static const uint8_t zeros[4 * 64];
	return (struct msg_chunk){ .type = type, .shard = shard, .version = version,
				   .worker = worker, .offset = offset, .count = count,
				   .data = zeros };
}

Test(msg, assembly_in_order_completes_exactly)
{
	struct msg_assembly a;
	char err[256] = "";
	float dst[10];

	cr_assert_eq(msg_assembly_init(&a, WIRE_PUSH, 2, 10, WIRE_F32, err, sizeof err), 0, "%s", err);
	cr_assert_not(msg_assembly_done(&a));
	cr_assert_eq(msg_assembly_add(&a, &(struct msg_chunk){ 0 }, NULL, err, sizeof err),
		     -EPROTO, "a zeroed chunk");
	struct msg_chunk c = mk(WIRE_PUSH, 2, 7, 1, 0, 4);
	cr_assert_eq(msg_assembly_add(&a, &c, dst, err, sizeof err), 0, "%s", err);
	c = mk(WIRE_PUSH, 2, 7, 1, 4, 3);
	cr_assert_eq(msg_assembly_add(&a, &c, dst, err, sizeof err), 0, "%s", err);
	cr_assert_not(msg_assembly_done(&a));
	c = mk(WIRE_PUSH, 2, 7, 1, 7, 3);
	cr_assert_eq(msg_assembly_add(&a, &c, dst, err, sizeof err), 1, "%s", err);
	cr_assert(msg_assembly_done(&a));
	cr_assert_eq(a.version, 7);
	cr_assert_eq(a.worker, 1);
	cr_assert_eq(a.received, 10);
}

Test(msg, assembly_rejections)
{
	static const struct {
		const char *what;
		uint8_t type;
		uint32_t shard, worker;
		uint64_t version, offset;
		uint32_t count;
		int want;
		const char *text;
	} rows[] = {
		/* the tensor is 10 floats of shard 2; [0, 4) from worker 1 at v7 arrived */
		{ "gap", WIRE_PUSH, 2, 1, 7, 5, 2, -EPROTO, "gap" },
		{ "overlap", WIRE_PUSH, 2, 1, 7, 3, 2, -EPROTO, "overlaps" },
		{ "repeat first", WIRE_PUSH, 2, 1, 7, 0, 4, -EPROTO, "overlaps" },
		{ "past the end", WIRE_PUSH, 2, 1, 7, 4, 7, -ERANGE, "outside" },
		{ "offset beyond", WIRE_PUSH, 2, 1, 7, 11, 1, -ERANGE, "outside" },
		{ "huge offset", WIRE_PUSH, 2, 1, 7, UINT64_MAX - 1, 1, -ERANGE, "outside" },
		{ "wrong shard", WIRE_PUSH, 3, 1, 7, 4, 2, -EPROTO, "shard 3" },
		{ "wrong version", WIRE_PUSH, 2, 1, 8, 4, 2, -EPROTO, "version 8" },
		{ "wrong worker", WIRE_PUSH, 2, 0, 7, 4, 2, -EPROTO, "worker 0" },
		{ "wrong type", WIRE_PARAMS, 2, 0, 7, 4, 2, -EPROTO, "PARAMS chunk" },
	};

	for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
		struct msg_assembly a, before;
		char err[256] = "";
		float dst[10];
		struct msg_chunk c = mk(WIRE_PUSH, 2, 7, 1, 0, 4);

		cr_assert_eq(msg_assembly_init(&a, WIRE_PUSH, 2, 10, WIRE_F32, err, sizeof err), 0);
		cr_assert_eq(msg_assembly_add(&a, &c, dst, err, sizeof err), 0, "%s", err);
		before = a;
		for (int i = 0; i < 10; i++)
			dst[i] = -1.0f;
		c = mk(rows[r].type, rows[r].shard, rows[r].version, rows[r].worker,
		       rows[r].offset, rows[r].count);
		err[0] = '\0';
		assert_refused(msg_assembly_add(&a, &c, dst, err, sizeof err), rows[r].want, err,
			       "PUSH", rows[r].what);
		cr_assert_not_null(strstr(err, rows[r].text), "%s: want \"%s\" in \"%s\"",
				   rows[r].what, rows[r].text, err);
		cr_assert_eq(memcmp(&a, &before, sizeof a), 0, "%s: state changed", rows[r].what);
		for (int i = 0; i < 10; i++)
			cr_assert_eq(dst[i], -1.0f, "%s: dst written", rows[r].what);
		/* the right chunk still completes it */
		c = mk(WIRE_PUSH, 2, 7, 1, 4, 6);
		cr_assert_eq(msg_assembly_add(&a, &c, NULL, err, sizeof err), 1, "%s", err);
	}
}

Test(msg, assembly_duplicate_last_chunk)
{
	struct msg_assembly a;
	char err[256] = "";
	struct msg_chunk c = mk(WIRE_PARAMS, 0, 3, 0, 0, 5);

	cr_assert_eq(msg_assembly_init(&a, WIRE_PARAMS, 0, 8, WIRE_F32, err, sizeof err), 0);
	cr_assert_eq(msg_assembly_add(&a, &c, NULL, err, sizeof err), 0, "%s", err);
	c = mk(WIRE_PARAMS, 0, 3, 0, 5, 3);
	cr_assert_eq(msg_assembly_add(&a, &c, NULL, err, sizeof err), 1, "%s", err);
	err[0] = '\0';
	assert_refused(msg_assembly_add(&a, &c, NULL, err, sizeof err), -EPROTO, err, "PARAMS",
		       "duplicate last");
	cr_assert_not_null(strstr(err, "after all 8 floats"), "%s", err);
	cr_assert(msg_assembly_done(&a));
	cr_assert_eq(a.received, 8);
}

Test(msg, assembly_init_refuses)
{
	struct msg_assembly a;
	char err[256] = "";

	assert_refused(msg_assembly_init(&a, WIRE_ACK, 0, 10, WIRE_F32, err, sizeof err), -EINVAL, err, NULL,
		       "ack assembly");
	err[0] = '\0';
	assert_refused(msg_assembly_init(&a, WIRE_PUSH, 0, 0, WIRE_F32, err, sizeof err), -EINVAL, err,
		       "PUSH", "empty assembly");
}

/* Sends src's N values as PUSH chunks of dtype through encode, decode and
 * an assembly that expects float32, into dst: every chunk goes as dtype
 * and fits a frame, and a packed one is shorter than float32. Returns the
 * bytes of the chunks' values on the wire. */
static size_t push_through_chunks(const float *src, float *dst, uint64_t N, unsigned dtype)
{
	uint8_t *buf = malloc(MSG_CHUNK_BYTES_MAX);
	struct msg_assembly a;
	char err[256] = "";
	size_t total = 0;

	cr_assert(buf);
	memset(dst, 0, N * sizeof *dst);
	cr_assert_eq(msg_assembly_init(&a, WIRE_PUSH, 1, N, WIRE_F32, err, sizeof err), 0);
	uint64_t nchunks = msg_chunks(N, dtype);
	for (uint64_t i = 0; i < nchunks; i++) {
		struct msg_chunk c = { .type = WIRE_PUSH, .dtype = (uint8_t)dtype, .shard = 1,
				       .version = 41, .worker = 3 };
		struct msg_chunk in;
		size_t len = 0;

		msg_chunk_range(N, dtype, i, &c.offset, &c.count);
		cr_assert_eq(msg_encode_chunk(buf, MSG_CHUNK_BYTES_MAX, &c, src + c.offset, &len, err,
					      sizeof err),
			     0, "%s", err);
		cr_assert_eq(buf[1], dtype, "chunk %llu went as dtype %u", (unsigned long long)i, buf[1]);
		cr_assert(len <= FRAME_MAX);
		if (dtype == WIRE_F32P)
			cr_assert_lt(len, MSG_CHUNK_BYTES(c.count, WIRE_F32));
		total += len - MSG_CHUNK_HDR_BYTES;
		cr_assert_eq(msg_decode_chunk(buf, len, &in, err, sizeof err), 0, "%s", err);
		int rc = msg_assembly_add(&a, &in, dst, err, sizeof err);
		cr_assert_eq(rc, i + 1 == nchunks, "chunk %llu: %d %s", (unsigned long long)i, rc, err);
	}
	free(buf);
	return total;
}

/* A tensor the size of the Fashion-MNIST MLP (669706 floats), sent as PUSH
 * chunks through encode -> decode -> assembly, comes back bit for bit. */
Test(msg, full_tensor_bitwise)
{
	const uint64_t N = 669706;
	float *src = malloc(N * sizeof *src), *dst = malloc(N * sizeof *dst);

	cr_assert(src && dst);
	rng_state = 669706;
	for (uint64_t i = 0; i < N; i++) {
		uint32_t u = (uint32_t)rng_next();
		memcpy(&src[i], &u, sizeof u);
	}
	cr_assert_eq(msg_chunks(N, WIRE_F32), 41);
	push_through_chunks(src, dst, N, WIRE_F32);
	cr_assert_eq(memcmp(src, dst, N * sizeof *src), 0, "tensor differs after reassembly");
	free(src);
	free(dst);
}

/* ---- the bf16 dtype -------------------------------------------------------- */

/* The sample PUSH in bf16: byte 1 is the dtype, each value its upper 16
 * bits rounded to nearest even, little-endian (docs/PROTOCOL.md). */
Test(msg, bf16_bytes_match_protocol)
{
	uint8_t buf[64];
	size_t len = 0;
	char err[256] = "";
	const uint8_t push[32 + 10] = {
		4,   1, 0, 0,    1, 0, 0, 0,               /* type, dtype bf16, shard 1 */
		9,   0, 0, 0,    0, 0, 0, 0,               /* version 9 */
		100, 0, 0, 0,    0, 0, 0, 0,               /* offset 100 */
		5,   0, 0, 0,    2, 0, 0, 0,               /* count 5, worker 2 */
		0xc0, 0x3f,                                /* 1.5f: 0x3fc00000, exact */
		0x00, 0x80,                                /* -0.0f */
		0xae, 0x34,                                /* 3.25e-7f: 0x34ae7ba9, down */
		0x4a, 0xf1,                                /* -1e30f: 0xf149f2ca, up */
		0x28, 0x42,                                /* 42.0f */
	};
	struct msg_chunk c = { .type = WIRE_PUSH, .dtype = WIRE_BF16, .shard = 1, .version = 9,
			       .offset = 100, .count = 5, .worker = 2 };
	cr_assert_eq(msg_encode_chunk(buf, sizeof buf, &c, SAMPLE_FLOATS, &len, err, sizeof err), 0,
		     "%s", err);
	cr_assert_eq(len, sizeof push);
	cr_assert_eq(len, MSG_CHUNK_BYTES(5, WIRE_BF16));
	for (size_t i = 0; i < len; i++)
		cr_assert_eq(buf[i], push[i], "PUSH byte %zu: %02x, want %02x", i, buf[i], push[i]);

	struct msg_chunk out;
	float back[5];
	cr_assert_eq(msg_decode_chunk(push, sizeof push, &out, err, sizeof err), 0, "%s", err);
	cr_assert_eq(out.dtype, WIRE_BF16);
	cr_assert_eq(out.count, 5);
	msg_chunk_floats(back, &out);
	const float want[5] = { 1.5f, -0.0f, 0x1.5cp-22f, -0x1.94p+99f, 42.0f };
	cr_assert_eq(memcmp(back, want, sizeof want), 0, "%a %a %a %a %a", (double)back[0],
		     (double)back[1], (double)back[2], (double)back[3], (double)back[4]);
}

/* A bf16 chunk carries up to twice the elements of a float32 one in the
 * same WIRE_CHUNK_MAX bytes; counts and lengths are checked per dtype. */
Test(msg, bf16_counts_per_chunk)
{
	static uint8_t buf[MSG_CHUNK_BYTES_MAX + 8];
	static float src[2 * MSG_CHUNK_FLOATS + 1];
	char err[256] = "";
	size_t len = 0;

	/* The same values per chunk in either dtype (a chunk is a piece of the
	 * shard), a bf16 one in half the bytes. */
	cr_assert_eq(msg_chunk_max(WIRE_F32), 16384);
	cr_assert_eq(msg_chunk_max(WIRE_BF16), 16384);
	cr_assert_eq(MSG_CHUNK_BYTES(msg_chunk_max(WIRE_F32), WIRE_F32), MSG_CHUNK_BYTES_MAX);
	cr_assert_eq(MSG_CHUNK_BYTES(msg_chunk_max(WIRE_BF16), WIRE_BF16), 32 + 2 * 16384);

	struct msg_chunk c = { .type = WIRE_PARAMS, .dtype = WIRE_BF16, .count = 16384 };
	cr_assert_eq(msg_encode_chunk(buf, sizeof buf, &c, src, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(len, 32 + 2 * 16384);
	struct msg_chunk out;
	cr_assert_eq(msg_decode_chunk(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_eq(out.count, 16384);

	c.count = 16385;
	err[0] = '\0';
	assert_refused(msg_encode_chunk(buf, sizeof buf, &c, src, &len, err, sizeof err), -EINVAL,
		       err, "PARAMS", "bf16 count over the max");
	/* One more element declared: refused as a count, before the length. */
	wire_put_u32(buf + 24, 16385);
	err[0] = '\0';
	assert_refused(msg_decode_chunk(buf, 32 + 2 * 16385, &out, err, sizeof err), -EPROTO,
		       err, "count 16385 is not in 1..16384 (bf16)", "bf16 count");
	/* A float32 chunk whose length would fit 16385 bf16 values. */
	buf[1] = WIRE_F32;
	wire_put_u32(buf + 24, 16385);
	err[0] = '\0';
	assert_refused(msg_decode_chunk(buf, MSG_CHUNK_BYTES_MAX, &out, err, sizeof err), -EPROTO,
		       err, "count 16385 is not in 1..16384 (fp32)", "fp32 count");
	/* A bf16 chunk whose length is that of float32 values, and the reverse. */
	len = sample(WIRE_PUSH, buf, sizeof buf); /* 5 float32 values: 52 bytes */
	buf[1] = WIRE_BF16;
	err[0] = '\0';
	assert_refused(msg_decode_chunk(buf, len, &out, err, sizeof err), -EMSGSIZE, err,
		       "count 5 needs exactly 42 (bf16)", "bf16 length");
	/* The smallest chunk: one bf16 value, 34 bytes. */
	c = (struct msg_chunk){ .type = WIRE_PUSH, .dtype = WIRE_BF16, .count = 1 };
	cr_assert_eq(msg_encode_chunk(buf, sizeof buf, &c, src, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(len, 34);
	cr_assert_eq(msg_decode_chunk(buf, len, &out, err, sizeof err), 0, "%s", err);
	err[0] = '\0';
	assert_refused(msg_decode_chunk(buf, 33, &out, err, sizeof err), -EMSGSIZE, err, "PUSH",
		       "33 bytes");

	/* Chunking counts elements, the same in both dtypes. */
	const uint64_t N = 669706;
	cr_assert_eq(msg_chunks(N, WIRE_F32), 41);
	cr_assert_eq(msg_chunks(N, WIRE_BF16), 41);
	cr_assert_eq(msg_chunks(16384, WIRE_BF16), 1);
	cr_assert_eq(msg_chunks(16385, WIRE_BF16), 2);
	uint64_t off;
	uint32_t cnt;
	msg_chunk_range(N, WIRE_BF16, 0, &off, &cnt);
	cr_assert(off == 0 && cnt == 16384);
	msg_chunk_range(N, WIRE_BF16, 40, &off, &cnt);
	cr_assert(off == 655360 && cnt == N - 655360);
}

/* Unknown dtypes are refused by the decoder, the encoder and the
 * assembly; a chunk of a known dtype the receiver does not expect is
 * refused by the assembly, naming both, and changes nothing. */
Test(msg, dtype_refusals)
{
	uint8_t buf[256];
	char err[256] = "";
	struct msg_chunk c;
	struct msg_assembly a;
	float dst[5] = { 0 };

	size_t len = sample(WIRE_PUSH, buf, sizeof buf);
	for (unsigned dt = 5; dt < 256; dt += 50) {
		buf[1] = (uint8_t)dt;
		err[0] = '\0';
		assert_refused(msg_decode_chunk(buf, len, &c, err, sizeof err), -EPROTO, err,
			       "unknown dtype", "dtype byte");
	}
	struct msg_chunk bad = { .type = WIRE_PUSH, .dtype = 5, .count = 1 };
	err[0] = '\0';
	assert_refused(msg_encode_chunk(buf, sizeof buf, &bad, SAMPLE_FLOATS, &len, err, sizeof err),
		       -EINVAL, err, "unknown dtype 5", "encode dtype");
	err[0] = '\0';
	assert_refused(msg_assembly_init(&a, WIRE_PUSH, 0, 5, 5, err, sizeof err), -EINVAL, err,
		       "dtype", "assembly dtype");

	/* bf16 sent, float32 expected, and the reverse. */
	for (int k = 0; k < 2; k++) {
		unsigned sent = k ? WIRE_F32 : WIRE_BF16, want = k ? WIRE_BF16 : WIRE_F32;
		struct msg_chunk m = { .type = WIRE_PUSH, .dtype = (uint8_t)sent, .shard = 0,
				       .version = 3, .worker = 1, .count = 5 };
		cr_assert_eq(msg_encode_chunk(buf, sizeof buf, &m, SAMPLE_FLOATS, &len, err, sizeof err),
			     0, "%s", err);
		cr_assert_eq(msg_decode_chunk(buf, len, &c, err, sizeof err), 0, "%s", err);
		cr_assert_eq(msg_assembly_init(&a, WIRE_PUSH, 0, 5, want, err, sizeof err), 0);
		struct msg_assembly before = a;
		err[0] = '\0';
		assert_refused(msg_assembly_add(&a, &c, dst, err, sizeof err), -EPROTO, err, "PUSH",
			       "dtype mismatch");
		char text[128];
		snprintf(text, sizeof text, "chunk in %s, but this side expects %s",
			 wire_dtype_name(sent), wire_dtype_name(want));
		cr_assert_not_null(strstr(err, text), "want \"%s\" in \"%s\"", text, err);
		cr_assert_eq(memcmp(&a, &before, sizeof a), 0, "the assembly changed");
		for (int i = 0; i < 5; i++)
			cr_assert(dst[i] == 0.0f, "a refused chunk was copied");
	}
}

/* PULL's flags: the one there is round-trips, any other is refused. */
Test(msg, pull_flags)
{
	uint8_t buf[64];
	char err[256] = "";
	size_t len;
	struct msg_pull in = { .flags = MSG_PULL_PACKED, .shard = 1, .version = 9 }, out;
	cr_assert_eq(msg_encode_pull(buf, sizeof buf, &in, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(buf[1], MSG_PULL_PACKED);
	cr_assert_eq(msg_decode_pull(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_eq(out.flags, MSG_PULL_PACKED);
	cr_assert_eq(out.version, 9);
	in.flags = MSG_PULL_PACKED | MSG_PULL_DELTA;
	cr_assert_eq(msg_encode_pull(buf, sizeof buf, &in, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(msg_decode_pull(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_eq(out.flags, MSG_PULL_PACKED | MSG_PULL_DELTA);
	for (unsigned b = 2; b < 8; b++) {
		buf[1] = (uint8_t)(MSG_PULL_PACKED | 1u << b);
		err[0] = '\0';
		assert_refused(msg_decode_pull(buf, len, &out, err, sizeof err), -EPROTO, err, "PULL",
			       "unknown PULL flag");
		in.flags = (uint8_t)(1u << b);
		err[0] = '\0';
		assert_refused(msg_encode_pull(buf, sizeof buf, &in, &len, err, sizeof err), -EINVAL, err,
			       "PULL", "encoding an unknown flag");
	}
}

/* The MLP-sized tensor as packed float32 PUSH chunks: every value bit for
 * bit, every chunk shorter than float32 (weights-like values shrink by
 * about 1/8), and taken by an assembly that expects float32. */
Test(msg, full_tensor_packed)
{
	const uint64_t N = 669706;
	float *src = malloc(N * sizeof *src), *dst = malloc(N * sizeof *dst);

	cr_assert(src && dst);
	rng_state = 777;
	for (uint64_t i = 0; i < N; i++) /* uniform in (-0.05, 0.05), zero every 1000th */
		src[i] = i % 1000 ? (float)((int64_t)(rng_next() >> 11) - (1ll << 52)) * 0x1p-52f * 0.05f : 0.0f;
	size_t total = push_through_chunks(src, dst, N, WIRE_F32P);
	cr_assert_eq(memcmp(src, dst, N * sizeof *src), 0, "the values changed");
	double ratio = (double)total / (4.0 * (double)N);
	cr_assert(ratio > 0.87 && ratio < 0.885, "packed to %.4f of float32", ratio);
	free(src);
	free(dst);
}

/* A packed chunk that would not shrink goes as float32; a packed chunk is
 * refused where bf16 is expected, and one whose body is not a packing
 * (fpack_check) is refused with the count it claims. */
Test(msg, packed_chunks_fall_back_and_are_checked)
{
	uint8_t buf[512];
	char err[256] = "";
	size_t len;
	struct msg_chunk in, c = { .type = WIRE_PARAMS, .dtype = WIRE_F32P, .shard = 0, .version = 2, .count = 1 };
	cr_assert_eq(msg_encode_chunk(buf, sizeof buf, &c, SAMPLE_FLOATS, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(buf[1], WIRE_F32, "one value packs to 5 bytes: float32 instead");
	cr_assert_eq(len, MSG_CHUNK_BYTES(1, WIRE_F32));
	/* The sample's 5 values span 70 binades: all but the largest escape. */
	c.count = 5;
	cr_assert_eq(msg_encode_chunk(buf, sizeof buf, &c, SAMPLE_FLOATS, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(buf[1], WIRE_F32);
	const uint8_t *body;
	size_t blen;
	cr_assert_eq(msg_encode_chunk_parts(buf, sizeof buf, &c, SAMPLE_FLOATS, &len, &body, &blen, err,
					    sizeof err), 0, "%s", err);
	cr_assert_eq(body, (const uint8_t *)SAMPLE_FLOATS, "float32 after all: sent from where it is");

	float v[64], back[64];
	for (int i = 0; i < 64; i++)
		v[i] = 0.25f + (float)i / 128.0f;
	c.count = 64;
	cr_assert_eq(msg_encode_chunk(buf, sizeof buf, &c, v, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(buf[1], WIRE_F32P);
	cr_assert_eq(len, MSG_CHUNK_HDR_BYTES + fpack_min_bytes(64));
	cr_assert_eq(msg_decode_chunk(buf, len, &in, err, sizeof err), 0, "%s", err);
	struct msg_assembly a;
	cr_assert_eq(msg_assembly_init(&a, WIRE_PARAMS, 0, 64, WIRE_BF16, err, sizeof err), 0);
	err[0] = '\0';
	assert_refused(msg_assembly_add(&a, &in, back, err, sizeof err), -EPROTO, err,
		       "chunk in fp32 packed, but this side expects bf16", "packed where bf16 is expected");

	buf[MSG_CHUNK_HDR_BYTES + 1] = 0x11; /* values 0 and 1 a binade lower: emax no value has */
	for (int i = 1; i < 32; i++)
		buf[MSG_CHUNK_HDR_BYTES + 1 + i] = 0x11;
	err[0] = '\0';
	assert_refused(msg_decode_chunk(buf, len, &in, err, sizeof err), -EPROTO, err,
		       "are not a packing of 64 float32 values", "emax no value has");
	err[0] = '\0';
	assert_refused(msg_decode_chunk(buf, len - 1, &in, err, sizeof err), -EPROTO, err,
		       "not a packing", "a byte short");
}

/* PARAMS as XORs with a base: assembled into a buffer holding that base
 * they are the values sent; into one holding anything else, refused by
 * their check; without a base, or where they would not shrink, they go
 * packed; a PUSH may neither send nor take them. */
Test(msg, xor_chunks_need_their_base_and_are_params_only)
{
	static uint8_t buf[64 * 4 + MSG_CHUNK_HDR_BYTES];
	char err[256] = "";
	size_t len;
	float base[64], v[64], back[64];
	for (int i = 0; i < 64; i++) {
		base[i] = 0.25f + (float)i / 128.0f;
		v[i] = base[i] * (1.0f + 1e-3f * (float)(i % 7));
	}
	struct msg_chunk in, c = { .type = WIRE_PARAMS, .dtype = WIRE_F32X, .shard = 1, .version = 9, .count = 64,
				   .base = base };
	cr_assert_eq(msg_encode_chunk(buf, sizeof buf, &c, v, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(buf[1], WIRE_F32X);
	cr_assert_lt(len, MSG_CHUNK_HDR_BYTES + fpack_min_bytes(64), "XORs shorter than packing");
	cr_assert_eq(msg_decode_chunk(buf, len, &in, err, sizeof err), 0, "%s", err);
	struct msg_assembly a;
	cr_assert_eq(msg_assembly_init(&a, WIRE_PARAMS, 1, 64, WIRE_F32, err, sizeof err), 0);
	memcpy(back, base, sizeof back);
	cr_assert_eq(msg_assembly_add(&a, &in, back, err, sizeof err), 1, "%s", err);
	cr_assert_eq(memcmp(back, v, sizeof v), 0, "the values sent");

	cr_assert_eq(msg_assembly_init(&a, WIRE_PARAMS, 1, 64, WIRE_F32, err, sizeof err), 0);
	memcpy(back, base, sizeof back);
	back[17] = nextafterf(back[17], 1.0f);
	err[0] = '\0';
	assert_refused(msg_assembly_add(&a, &in, back, err, sizeof err), -EPROTO, err,
		       "do not check", "a base one value off");

	c.base = NULL;
	cr_assert_eq(msg_encode_chunk(buf, sizeof buf, &c, v, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(buf[1], WIRE_F32P, "no base: packed");
	c.base = base;
	float far[64];
	for (int i = 0; i < 64; i++)
		far[i] = -base[i] * 1e30f;
	cr_assert_eq(msg_encode_chunk(buf, sizeof buf, &c, far, &len, err, sizeof err), 0, "%s", err);
	cr_assert_neq(buf[1], WIRE_F32X, "XORs that do not shrink are not sent");

	c.type = WIRE_PUSH;
	err[0] = '\0';
	assert_refused(msg_encode_chunk(buf, sizeof buf, &c, v, &len, err, sizeof err), -EINVAL, err,
		       "PARAMS only", "a PUSH of XORs");
	c.type = WIRE_PARAMS;
	cr_assert_eq(msg_encode_chunk(buf, sizeof buf, &c, v, &len, err, sizeof err), 0, "%s", err);
	buf[0] = WIRE_PUSH;
	err[0] = '\0';
	assert_refused(msg_decode_chunk(buf, len, &in, err, sizeof err), -EPROTO, err, "PARAMS only",
		       "XORs received as a PUSH");
	buf[0] = WIRE_PARAMS;
	err[0] = '\0';
	assert_refused(msg_decode_chunk(buf, len - 1, &in, err, sizeof err), -EPROTO, err,
		       "are not the XORs", "a byte short");
}

/* The MLP-sized tensor again, as bf16 PUSH chunks (2 of them): every
 * element arrives as its bf16 rounding (bf16_round), exactly. */
Test(msg, full_tensor_bf16)
{
	const uint64_t N = 669706;
	float *src = malloc(N * sizeof *src), *dst = malloc(N * sizeof *dst);
	uint8_t *buf = malloc(MSG_CHUNK_BYTES_MAX);
	struct msg_assembly a;
	char err[256] = "";

	cr_assert(src && dst && buf);
	rng_state = 4242;
	for (uint64_t i = 0; i < N; i++)
		src[i] = (float)((int64_t)(rng_next() >> 11) - (1ll << 52)) * 0x1p-60f;
	cr_assert_eq(msg_assembly_init(&a, WIRE_PUSH, 1, N, WIRE_BF16, err, sizeof err), 0);
	uint64_t nchunks = msg_chunks(N, WIRE_BF16);
	cr_assert_eq(nchunks, 41);
	for (uint64_t i = 0; i < nchunks; i++) {
		struct msg_chunk c = { .type = WIRE_PUSH, .dtype = WIRE_BF16, .shard = 1,
				       .version = 41, .worker = 3 };
		struct msg_chunk in;
		size_t len = 0;

		msg_chunk_range(N, WIRE_BF16, i, &c.offset, &c.count);
		cr_assert_eq(msg_encode_chunk(buf, MSG_CHUNK_BYTES_MAX, &c, src + c.offset, &len,
					      err, sizeof err),
			     0, "%s", err);
		cr_assert_eq(len, MSG_CHUNK_BYTES(c.count, WIRE_BF16));
		cr_assert_eq(msg_decode_chunk(buf, len, &in, err, sizeof err), 0, "%s", err);
		int rc = msg_assembly_add(&a, &in, dst, err, sizeof err);
		cr_assert_eq(rc, i + 1 == nchunks, "chunk %llu: %d %s", (unsigned long long)i, rc, err);
	}
	double maxrel = 0;
	for (uint64_t i = 0; i < N; i++) {
		uint32_t u, v;
		memcpy(&u, &src[i], 4);
		memcpy(&v, &dst[i], 4);
		cr_assert_eq(v, (uint32_t)bf16_round(u) << 16, "element %llu", (unsigned long long)i);
		if (src[i] != 0) {
			double rel = fabs((double)dst[i] - src[i]) / fabs((double)src[i]);
			maxrel = rel > maxrel ? rel : maxrel;
		}
	}
	cr_assert(maxrel <= 0x1p-8, "relative error %g above 2^-8 (half a bf16 ulp at 1)", maxrel);
	free(src);
	free(dst);
	free(buf);
}

/* ---- random input --------------------------------------------------------- */

static void check_any(const uint8_t *p, size_t n)
{
	for (size_t t = 0; t < NTYPES; t++) {
		char err[256] = "";
		int rc = decode_as(TYPES[t], p, n, err, sizeof err);
		cr_assert(rc == 0 || (rc < 0 && err[0] && !strchr(err, '\n')),
			  "%s: rc %d err \"%s\"", wire_msg_name(TYPES[t]), rc, err);
	}
	char err[256] = "";
	int rc = msg_type(p, n, err, sizeof err);
	cr_assert(rc > 0 || (err[0] && !strchr(err, '\n')));
}

/* Seeded random bytes and mutated valid messages through every decoder,
 * each input in a buffer of exactly its length (so ASan sees over-reads).
 * Mostly refused; what is accepted re-encodes to the same bytes. */
Test(msg, random_bytes_never_crash)
{
	uint8_t base[256];
	int accepted = 0;

	rng_state = 0x9e3779b97f4a7c15ULL;
	for (int iter = 0; iter < 20000; iter++) {
		size_t n;
		uint8_t *p;

		if (iter % 2) {
			n = rng_next() % 80;
			p = malloc(n ? n : 1);
			cr_assert_not_null(p);
			for (size_t i = 0; i < n; i++)
				p[i] = (uint8_t)rng_next();
			if (n && iter % 4 == 1)
				p[0] = (uint8_t)(rng_next() % 13); /* plausible type */
		} else {
			size_t len = sample(TYPES[rng_next() % NTYPES], base, sizeof base);
			n = len;
			if (rng_next() % 4 == 0)
				n = rng_next() % (len + 2);
			p = malloc(n ? n : 1);
			cr_assert_not_null(p);
			memcpy(p, base, n < len ? n : len);
			if (n > len)
				p[len] = (uint8_t)rng_next();
			for (int k = (int)(rng_next() % 3); k > 0 && n; k--)
				p[rng_next() % n] ^= (uint8_t)(1u << (rng_next() % 8));
		}
		check_any(p, n);
		if (n && n <= 256) {
			char err[256];
			struct msg_pull pl;
			uint8_t re[256];
			size_t relen = 0;
			if (msg_decode_pull(p, n, &pl, err, sizeof err) == 0) {
				accepted++;
				cr_assert_eq(msg_encode_pull(re, sizeof re, &pl, &relen, err,
							     sizeof err),
					     0);
				cr_assert(relen == n && memcmp(re, p, n) == 0,
					  "PULL does not re-encode to its bytes");
			}
		}
		free(p);
	}
	cr_assert_gt(accepted, 0, "no mutated PULL was ever accepted: the mix is wrong");
}

/* VIEW (issue 40): every field survives where docs/PROTOCOL.md puts it;
 * 256 slices fit its u16; a view with nobody live, a live worker outside
 * the base, or slices out of 1..256 are refused both ways. LEAVE: its
 * worker. */
Test(msg, view_and_leave_round_trip)
{
	uint8_t buf[MSG_VIEW_BYTES];
	size_t len = 0;
	char err[256] = "";
	struct msg_view in = SAMPLE_VIEW, out;
	in.live[31] = 0x80;
	in.base[31] = 0x80;
	cr_assert_eq(msg_encode_view(buf, sizeof buf, &in, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(len, 80);
	cr_assert_eq(buf[0], 16);
	cr_assert_eq(wire_get_u16(buf + 2), 4);
	cr_assert_eq(wire_get_u32(buf + 4), 1);
	cr_assert_eq(wire_get_u64(buf + 8), 41);
	cr_assert_eq(buf[16], 0x05);
	cr_assert_eq(buf[47], 0x80, "worker 255 is bit 7 of the live bitmap's last byte");
	cr_assert_eq(buf[48], 0x07);
	cr_assert_eq(msg_type(buf, len, err, sizeof err), WIRE_VIEW, "%s", err);
	cr_assert_eq(msg_decode_view(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_eq(out.version, 41);
	cr_assert_eq(out.rev, 1);
	cr_assert_eq(out.slices, 4);
	cr_assert_arr_eq(out.live, in.live, sizeof(in.live));
	cr_assert_arr_eq(out.base, in.base, sizeof(in.base));
	in.slices = 256;
	cr_assert_eq(msg_encode_view(buf, sizeof buf, &in, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(msg_decode_view(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_eq(out.slices, 256);

	static const struct {
		const char *name;
		size_t at;
		int width;
		unsigned value;
		const char *text;
	} rows[] = {
		{ "0 slices", 2, 2, 0, "0 slices, not 1..256" },
		{ "257 slices", 2, 2, 257, "257 slices" },
		{ "nobody live", 16, 1, 0, "no live worker" },
		{ "live outside base", 17, 1, 0x01, "a live worker outside the base" },
	};
	for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
		len = sample(WIRE_VIEW, buf, sizeof buf);
		if (rows[r].width == 2)
			wire_put_u16(buf + rows[r].at, (uint16_t)rows[r].value);
		else
			buf[rows[r].at] = (uint8_t)rows[r].value;
		assert_refused(msg_decode_view(buf, len, &out, err, sizeof err), -EPROTO, err, "VIEW", rows[r].name);
		cr_assert_not_null(strstr(err, rows[r].text), "%s: \"%s\"", rows[r].name, err);
	}
	in = SAMPLE_VIEW;
	in.live[1] = 0x01;
	assert_refused(msg_encode_view(buf, sizeof buf, &in, &len, err, sizeof err), -EINVAL, err, "VIEW",
		       "encode a live worker outside the base");
	in = SAMPLE_VIEW;
	in.slices = 0;
	assert_refused(msg_encode_view(buf, sizeof buf, &in, &len, err, sizeof err), -EINVAL, err, "VIEW",
		       "encode 0 slices");

	struct msg_leave lv = { .worker = 0x01020304u }, lvout;
	cr_assert_eq(msg_encode_leave(buf, sizeof buf, &lv, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(len, 8);
	cr_assert_eq(buf[0], 17);
	cr_assert_eq(wire_get_u32(buf + 4), 0x01020304u);
	cr_assert_eq(msg_decode_leave(buf, len, &lvout, err, sizeof err), 0, "%s", err);
	cr_assert_eq(lvout.worker, 0x01020304u);
}

/* COMPUTE: the text at byte 8, NUL-padded to 64 bytes; 64 bytes of text
 * fill it; an empty text, a control or non-ASCII byte, a byte after the
 * padding began, or a reserved byte is refused, and so is encoding text
 * that is empty, too long or not printable. */
Test(msg, compute_round_trip_and_refusals)
{
	uint8_t buf[MSG_COMPUTE_BYTES];
	size_t len = 0;
	char err[256] = "";
	struct msg_compute in = { .text = "gpu: NVIDIA H200 sm_90, tf32 off x2" }, out;
	cr_assert_eq(msg_encode_compute(buf, sizeof buf, &in, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(len, 72);
	cr_assert_eq(buf[0], 18);
	cr_assert_eq(memcmp(buf + 8, in.text, strlen(in.text)), 0);
	for (size_t i = 8 + strlen(in.text); i < 72; i++)
		cr_assert_eq(buf[i], 0, "padding byte %zu", i);
	cr_assert_eq(msg_decode_compute(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_str_eq(out.text, in.text);
	memset(in.text, 'x', MSG_COMPUTE_TEXT);
	in.text[MSG_COMPUTE_TEXT] = 0;
	cr_assert_eq(msg_encode_compute(buf, sizeof buf, &in, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(msg_decode_compute(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_eq(strlen(out.text), MSG_COMPUTE_TEXT);

	static const struct {
		const char *name;
		size_t at;
		uint8_t value;
	} rows[] = {
		{ "empty", 8, 0 },
		{ "a line break", 10, '\n' },
		{ "a UTF-8 byte", 9, 0xc3 },
		{ "a byte after the padding", 70, 'x' },
		{ "reserved byte 3", 3, 1 },
	};
	for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
		len = sample(WIRE_COMPUTE, buf, sizeof buf);
		buf[rows[r].at] = rows[r].value;
		assert_refused(msg_decode_compute(buf, len, &out, err, sizeof err), -EPROTO, err, "COMPUTE", rows[r].name);
	}
	struct msg_compute bad = { .text = "" };
	assert_refused(msg_encode_compute(buf, sizeof buf, &bad, &len, err, sizeof err), -EINVAL, err, "COMPUTE",
		       "encode an empty text");
	snprintf(bad.text, sizeof(bad.text), "cpu:\tx");
	assert_refused(msg_encode_compute(buf, sizeof buf, &bad, &len, err, sizeof err), -EINVAL, err, "COMPUTE",
		       "encode a tab");
}

/* A REPORT's events (issue 40): after the workers' states, as many as
 * the length says; each survives; an unknown kind, a reserved byte, or a
 * length that is no whole number of events (or more than 8) is refused. */
Test(msg, report_events)
{
	uint8_t buf[MSG_REPORT_BYTES_ALL];
	size_t len = 0;
	char err[256] = "";
	struct msg_report in = SAMPLE_REPORT, out;
	in.nevents = 3;
	in.events[0] = (struct msg_event){ .step = 0, .worker = 0, .kind = MSG_EVENT_JOINED };
	in.events[1] = (struct msg_event){ .step = 41, .worker = 3, .kind = MSG_EVENT_LEFT };
	in.events[2] = (struct msg_event){ .step = 0xfedcba9876543210ULL, .worker = 255, .kind = MSG_EVENT_LOST };
	cr_assert_eq(msg_encode_report(buf, sizeof buf, &in, &len, err, sizeof err), 0, "%s", err);
	cr_assert_eq(len, MSG_REPORT_HDR_BYTES + 4 + 3 * 12);
	cr_assert_eq(wire_get_u64(buf + 68 + 12), 41);
	cr_assert_eq(wire_get_u16(buf + 68 + 12 + 8), 3);
	cr_assert_eq(buf[68 + 12 + 10], MSG_EVENT_LEFT);
	cr_assert_eq(msg_decode_report(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_eq(out.nevents, 3);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(out.events[i].step, in.events[i].step);
		cr_assert_eq(out.events[i].worker, in.events[i].worker);
		cr_assert_eq(out.events[i].kind, in.events[i].kind);
	}
	cr_assert_str_eq(msg_event_name(MSG_EVENT_LOST), "lost");
	cr_assert_str_eq(msg_event_name(4), "?");

	buf[68 + 10] = 4;
	assert_refused(msg_decode_report(buf, len, &out, err, sizeof err), -EPROTO, err, "REPORT", "event kind 4");
	buf[68 + 10] = MSG_EVENT_JOINED;
	buf[68 + 11] = 1;
	assert_refused(msg_decode_report(buf, len, &out, err, sizeof err), -EPROTO, err, "REPORT",
		       "event reserved byte");
	buf[68 + 11] = 0;
	assert_refused(msg_decode_report(buf, len - 1, &out, err, sizeof err), -EMSGSIZE, err, "REPORT",
		       "a part of an event");
	in.nevents = 8;
	for (int i = 3; i < 8; i++)
		in.events[i] = in.events[0];
	cr_assert_eq(msg_encode_report(buf, sizeof buf, &in, &len, err, sizeof err), 0, "%s", err);
	memset(buf + len, 0, 12);
	assert_refused(msg_decode_report(buf, len + 12, &out, err, sizeof err), -EMSGSIZE, err, "REPORT",
		       "a ninth event");
	in.nevents = 9;
	assert_refused(msg_encode_report(buf, sizeof buf, &in, &len, err, sizeof err), -EINVAL, err, "REPORT",
		       "encode 9 events");
}

/* Factors (dtype 4, core/nn/factors.h): a PUSH chunk carries its run, the
 * batch and a share of the factor stream, whose zeros cost a bit each,
 * and which comes back as written; a share longer than the piece's
 * values, a length that does not match its bitmap, a bitmap with unused
 * bits set, a run shorter than the chunk, a batch of 0, factors in a
 * PARAMS, and factors given to an assembly that takes values are
 * refused. */
Test(msg, factors_chunks_carry_a_share_and_nothing_else)
{
	static uint8_t buf[MSG_CHUNK_BYTES_MAX];
	char err[256] = "";
	struct msg_chunk c = { .type = WIRE_PUSH, .dtype = WIRE_F32F, .shard = 1, .version = 7,
			       .worker = WIRE_PUSH_TAG(1, 1), .offset = 16384, .count = 100 }, d;
	size_t len = 0;
	float v[61], back[61];
	for (int i = 0; i < 61; i++)
		v[i] = i % 3 ? (float)i - 0.25f : i % 2 ? -0.0f : 0.0f;
	cr_assert_eq(msg_encode_chunk_factors(buf, sizeof buf, &c, 250, 64, 61, &len, err, sizeof err), 0, "%s",
		     err);
	wire_put_f32s(buf + len - 4 * 61, v, 61);
	msg_chunk_factors_seal(buf, &len);
	/* 11 of the 61 are +0.0 (i % 6 == 0), 10 are -0.0, which is kept */
	cr_assert_eq(len, MSG_CHUNK_HDR_BYTES + MSG_FACTORS_HEAD + 8 + 4 * 50, "%zu bytes", len);
	cr_assert_eq(msg_decode_chunk(buf, len, &d, err, sizeof err), 0, "%s", err);
	uint32_t run, B;
	size_t k;
	msg_chunk_factors(&d, &run, &B, &k);
	cr_assert(d.dtype == WIRE_F32F && d.offset == 16384 && d.count == 100 && run == 250 && B == 64 && k == 61);
	msg_chunk_factor_values(back, &d);
	cr_assert_eq(memcmp(back, v, sizeof(v)), 0, "the values came back otherwise");
	/* the encoder's refusals */
	cr_assert_eq(msg_encode_chunk_factors(buf, sizeof buf, &c, 250, 64, 101, &len, err, sizeof err), -EINVAL);
	cr_assert_eq(msg_encode_chunk_factors(buf, sizeof buf, &c, 99, 64, 10, &len, err, sizeof err), -EINVAL);
	cr_assert_eq(msg_encode_chunk_factors(buf, sizeof buf, &c, 250, 0, 10, &len, err, sizeof err), -EINVAL);
	c.type = WIRE_PARAMS;
	cr_assert_eq(msg_encode_chunk_factors(buf, sizeof buf, &c, 250, 64, 10, &len, err, sizeof err), -EINVAL);
	c.type = WIRE_PUSH;
	float f[100] = { 0 };
	cr_assert_eq(msg_encode_chunk(buf, sizeof buf, &c, f, &len, err, sizeof err), -EINVAL);
	/* the decoder's: a length off the bitmap, an unused bit, more
	 * values than the piece, a short run, a batch of 0, a PARAMS */
	cr_assert_eq(msg_encode_chunk_factors(buf, sizeof buf, &c, 250, 64, 61, &len, err, sizeof err), 0);
	wire_put_f32s(buf + len - 4 * 61, v, 61);
	msg_chunk_factors_seal(buf, &len);
	cr_assert_eq(msg_decode_chunk(buf, len, &d, err, sizeof err), 0, "%s", err);
	err[0] = '\0';
	assert_refused(msg_decode_chunk(buf, len + 4, &d, err, sizeof err), -EPROTO, err, "PUSH", "a value more");
	assert_refused(msg_decode_chunk(buf, len - 2, &d, err, sizeof err), -EPROTO, err, "PUSH", "torn float");
	uint8_t *bits = buf + MSG_CHUNK_HDR_BYTES + MSG_FACTORS_HEAD;
	bits[7] |= 0x80; /* value 63 of 61 */
	assert_refused(msg_decode_chunk(buf, len + 4, &d, err, sizeof err), -EPROTO, err, "factors", "unused bit");
	bits[7] &= 0x7f;
	memset(buf + len - 4, 0, 4); /* the last value stored, but +0.0 */
	assert_refused(msg_decode_chunk(buf, len, &d, err, sizeof err), -EPROTO, err, "factors", "a stored zero");
	wire_put_f32s(buf + len - 4, &v[59], 1);
	cr_assert_eq(msg_decode_chunk(buf, len, &d, err, sizeof err), 0, "%s", err);
	wire_put_u32(buf + MSG_CHUNK_HDR_BYTES + 8, 101);
	assert_refused(msg_decode_chunk(buf, len, &d, err, sizeof err), -EPROTO, err, "at most 100", "k above count");
	wire_put_u32(buf + MSG_CHUNK_HDR_BYTES + 8, 61);
	wire_put_u32(buf + MSG_CHUNK_HDR_BYTES, 99);
	assert_refused(msg_decode_chunk(buf, len, &d, err, sizeof err), -EPROTO, err, "factors", "short run");
	wire_put_u32(buf + MSG_CHUNK_HDR_BYTES, 250);
	wire_put_u32(buf + MSG_CHUNK_HDR_BYTES + 4, 0);
	assert_refused(msg_decode_chunk(buf, len, &d, err, sizeof err), -EPROTO, err, "factors", "batch 0");
	wire_put_u32(buf + MSG_CHUNK_HDR_BYTES + 4, 64);
	buf[0] = WIRE_PARAMS;
	wire_put_u32(buf + 28, 0);
	assert_refused(msg_decode_chunk(buf, len, &d, err, sizeof err), -EPROTO, err, "PUSH only", "PARAMS");
	buf[0] = WIRE_PUSH;
	wire_put_u32(buf + 28, WIRE_PUSH_TAG(1, 1));
	cr_assert_eq(msg_decode_chunk(buf, len, &d, err, sizeof err), 0, "%s", err);
	/* an assembly that takes values (a ps without pieces) */
	struct msg_assembly a;
	static float dst[20000];
	cr_assert_eq(msg_assembly_init(&a, WIRE_PUSH, 1, 20000, WIRE_F32, err, sizeof err), 0);
	a.received = 16384;
	a.version = 7;
	a.worker = d.worker;
	assert_refused(msg_assembly_add(&a, &d, dst, err, sizeof err), -EPROTO, err, "factors", "values taken");
	cr_assert_eq(msg_assembly_add(&a, &d, NULL, err, sizeof err), 0, "%s", err);
}
