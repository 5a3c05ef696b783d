/* libFuzzer harness for the message decoders of net/msg.c, net/msg_rows.c
 * and net/msg_elastic.c. The input is one message body, given to msg_type
 * and to every decoder (SPULL, ROWS and SPUSH at several embedding widths;
 * VIEW, LEAVE, COMPUTE and a REPORT with events). Checks the error
 * contract (negative errno, one line), that whatever a decoder accepts
 * re-encodes to exactly the input bytes (REPORT too) (the encoding is canonical: there is
 * one byte string per message; but a bf16 signalling NaN, which comes back
 * as the same NaN made quiet), that an accepted PARAMS/PUSH chunk passes a
 * fresh assembly of its dtype for [0, offset + count) exactly when its
 * offset is 0, completing it, and that an assembly of the other dtype
 * refuses it. An accepted SPULL, ROWS or SPUSH re-encodes to the same
 * bytes, its ids ascend, and a fresh assembly of its set takes it exactly
 * when it is the set's first message and full (count = min(per message,
 * total)), completing the set when that is all of it. */
#include "../../net/msg.h"
#include "../../net/msg_rows.h"
#include "../../net/xdelta.h"
#include "fuzz.h"

#include <errno.h>
#include <math.h>

static float floats[2 * MSG_CHUNK_FLOATS]; /* the most values a chunk holds: bf16's */
static const float zeros[MSG_CHUNK_FLOATS]; /* the base XORs are taken against here */
static uint8_t re[MSG_CHUNK_BYTES_MAX];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	return 0;
}

static void same(int rc, size_t relen, const uint8_t *data, size_t size)
{
	FUZZ_CHECK(rc == 0);
	FUZZ_CHECK(relen == size);
	FUZZ_CHECK(memcmp(re, data, size) == 0);
}

/* A re-encoded message whose bf16 values start at byte from: the same
 * bytes, but that each signalling NaN (exponent all ones, mantissa
 * nonzero, quiet bit 6 clear) comes back with the quiet bit set
 * (net/bf16.h). */
static void same_bf16_from(int rc, size_t relen, const uint8_t *data, size_t size, size_t from)
{
	FUZZ_CHECK(rc == 0);
	FUZZ_CHECK(relen == size);
	FUZZ_CHECK(memcmp(re, data, from) == 0);
	for (size_t i = from; i + 1 < size; i += 2) {
		uint16_t h = wire_get_u16(data + i), r = wire_get_u16(re + i);
		int nan = (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
		FUZZ_CHECK(r == (nan ? (h | 0x40u) : h));
	}
}

static void same_bf16(int rc, size_t relen, const uint8_t *data, size_t size)
{
	same_bf16_from(rc, relen, data, size, MSG_CHUNK_HDR_BYTES);
}

/* The rows decoder at width dim. */
static void rows_at(const uint8_t *data, size_t size, int dim)
{
	static uint64_t ids[WIRE_CHUNK_MAX / 8];
	char err[256] = "";
	size_t relen = 0;
	struct msg_rows m;
	int rc = msg_decode_rows(data, size, dim, &m, err, sizeof err);
	if (rc) {
		fuzz_check_err(rc, err);
		return;
	}
	FUZZ_CHECK(m.type == data[0] && m.dtype == data[1] && m.flags == data[2] &&
		   m.count <= msg_rows_max(m.type, dim, m.dtype));
	FUZZ_CHECK(size <= msg_rows_bytes(m.type, m.count, dim, m.dtype));
	FUZZ_CHECK(size == MSG_ROWS_HDR_BYTES + m.idlen + m.vlen);
	FUZZ_CHECK((uint64_t)m.first + m.count <= m.total && (m.count > 0 || m.total == 0));
	if (m.ids) {
		msg_rows_ids(ids, &m);
		for (uint32_t i = 0; i < m.count; i++)
			FUZZ_CHECK(i == 0 || ids[i] > ids[i - 1]);
		FUZZ_CHECK(!m.count || (ids[0] == m.id_first && ids[m.count - 1] == m.id_last));
	}
	if (m.vals)
		msg_rows_vals(floats, &m, dim);
	/* A packed message packs back to the same bytes: each has one packing. */
	rc = msg_encode_rows(re, sizeof re, &m, ids, floats, dim, &relen, err, sizeof err);
	if (m.dtype == WIRE_BF16)
		same_bf16_from(rc, relen, data, size, MSG_ROWS_HDR_BYTES + m.idlen);
	else
		same(rc, relen, data, size);
	struct msg_rows_asm a;
	msg_rows_asm_init(&a, m.type, (uint8_t)wire_dtype_values(m.dtype), m.shard, dim, m.total, MSG_ROWS_ANY);
	uint32_t per = msg_rows_max(m.type, dim, m.dtype), full = m.total < per ? m.total : per;
	err[0] = '\0';
	rc = msg_rows_asm_add(&a, &m, NULL, NULL, err, sizeof err);
	if (m.first == 0 && m.count == full) {
		FUZZ_CHECK(rc == (m.count == m.total));
	} else {
		FUZZ_CHECK(rc == -EPROTO);
		fuzz_check_err(rc, err);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256];
	size_t relen = 0;
	int rc;

	err[0] = '\0';
	rc = msg_type(data, size, err, sizeof err);
	if (rc < 0)
		fuzz_check_err(rc, err);
	else
		FUZZ_CHECK(rc >= WIRE_PULL && rc <= WIRE_MSG_LAST && rc == data[0]);

	static const int dims[] = { 1, 3, 16, 1024 };
	for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
		rows_at(data, size, dims[i]);

	struct msg_pull pull;
	err[0] = '\0';
	if ((rc = msg_decode_pull(data, size, &pull, err, sizeof err)) == 0)
		same(msg_encode_pull(re, sizeof re, &pull, &relen, err, sizeof err), relen, data,
		     size);
	else
		fuzz_check_err(rc, err);

	struct msg_chunk c;
	err[0] = '\0';
	if ((rc = msg_decode_chunk(data, size, &c, err, sizeof err)) == 0) {
		struct msg_assembly a;
		FUZZ_CHECK(c.dtype == WIRE_F32 || c.dtype == WIRE_BF16 || c.dtype == WIRE_F32P ||
			   (c.dtype == WIRE_F32X && c.type == WIRE_PARAMS) ||
			   (c.dtype == WIRE_F32F && c.type == WIRE_PUSH));
		FUZZ_CHECK(c.dtype == data[1]);
		FUZZ_CHECK(c.count >= 1 && c.count <= msg_chunk_max(c.dtype));
		if (c.dtype == WIRE_F32P) /* shorter than float32, and each value in 3 bytes at least */
			FUZZ_CHECK(size < MSG_CHUNK_BYTES(c.count, WIRE_F32) &&
				   size > MSG_CHUNK_HDR_BYTES + 3 * (size_t)c.count);
		else if (c.dtype == WIRE_F32X) /* shorter than float32, each XOR in a byte at least */
			FUZZ_CHECK(size < MSG_CHUNK_BYTES(c.count, WIRE_F32) &&
				   size >= MSG_CHUNK_HDR_BYTES + xdelta_min_bytes(c.count));
		else if (c.dtype == WIRE_F32F) /* the head, a bitmap, whole floats */
			FUZZ_CHECK(size >= MSG_CHUNK_HDR_BYTES + MSG_FACTORS_HEAD);
		else
			FUZZ_CHECK(size == MSG_CHUNK_BYTES(c.count, c.dtype));
		/* XORs go onto a base of zeros: their values are the XORs,
		 * and where those pass the check (the fuzzer rarely finds one)
		 * the chunk re-encodes to its bytes, each XOR having one
		 * writing. */
		int xor_checked = 0;
		if (c.dtype == WIRE_F32F) {
			/* factors re-encode to their bytes: the head, then
			 * the values, their zeros left out again */
			uint32_t run, B;
			size_t k;
			msg_chunk_factors(&c, &run, &B, &k);
			FUZZ_CHECK(run >= c.count && B >= 1 && k <= c.count);
			msg_chunk_factor_values(floats, &c);
			rc = msg_encode_chunk_factors(re, sizeof re, &c, run, B, k, &relen, err, sizeof err);
			if (rc == 0) {
				wire_put_f32s(re + relen - 4 * k, floats, k);
				msg_chunk_factors_seal(re, &relen);
				same(rc, relen, data, size);
			}
		} else if (c.dtype == WIRE_F32X) {
			memset(floats, 0, (size_t)c.count * sizeof(float));
			xor_checked = xdelta_apply(floats, c.data, c.count) == 0;
			c.base = zeros;
		} else {
			msg_chunk_floats(floats, &c);
		}
		rc = c.dtype == WIRE_F32F ? 0 : msg_encode_chunk(re, sizeof re, &c, floats, &relen, err, sizeof err);
		if (c.dtype == WIRE_F32F)
			;
		else if (c.dtype == WIRE_BF16)
			same_bf16(rc, relen, data, size);
		else if (c.dtype != WIRE_F32X || xor_checked)
			same(rc, relen, data, size);
		else
			FUZZ_CHECK(rc == 0);
		/* A packed chunk re-encodes to the same bytes: its values
		 * have one packing (net/fpack.h), and it was shorter. */
		unsigned other = c.dtype == WIRE_BF16 ? WIRE_F32 : WIRE_BF16;
		FUZZ_CHECK(msg_assembly_init(&a, c.type, c.shard, c.offset + c.count, other, err,
					     sizeof err) == 0);
		err[0] = '\0';
		rc = msg_assembly_add(&a, &c, NULL, err, sizeof err);
		FUZZ_CHECK(rc == -EPROTO);
		fuzz_check_err(rc, err);
		FUZZ_CHECK(msg_assembly_init(&a, c.type, c.shard, c.offset + c.count, c.dtype, err,
					     sizeof err) == 0);
		rc = msg_assembly_add(&a, &c, NULL, err, sizeof err);
		if (c.offset == 0) {
			FUZZ_CHECK(rc == 1);
		} else {
			FUZZ_CHECK(rc == -EPROTO);
			fuzz_check_err(rc, err);
		}
	} else {
		fuzz_check_err(rc, err);
	}

	struct msg_ack ack;
	err[0] = '\0';
	if ((rc = msg_decode_ack(data, size, &ack, err, sizeof err)) == 0)
		same(msg_encode_ack(re, sizeof re, &ack, &relen, err, sizeof err), relen, data, size);
	else
		fuzz_check_err(rc, err);

	struct msg_checkpoint ck;
	err[0] = '\0';
	if ((rc = msg_decode_checkpoint(data, size, &ck, err, sizeof err)) == 0)
		same(msg_encode_checkpoint(re, sizeof re, &ck, &relen, err, sizeof err), relen, data,
		     size);
	else
		fuzz_check_err(rc, err);

	struct msg_status st;
	err[0] = '\0';
	if ((rc = msg_decode_status(data, size, &st, err, sizeof err)) == 0)
		same(msg_encode_status(re, sizeof re, &st, &relen, err, sizeof err), relen, data,
		     size);
	else
		fuzz_check_err(rc, err);

	struct msg_done dn;
	err[0] = '\0';
	if ((rc = msg_decode_done(data, size, &dn, err, sizeof err)) == 0)
		same(msg_encode_done(re, sizeof re, &dn, &relen, err, sizeof err), relen, data, size);
	else
		fuzz_check_err(rc, err);

	struct msg_heartbeat hb;
	err[0] = '\0';
	if ((rc = msg_decode_heartbeat(data, size, &hb, err, sizeof err)) == 0)
		same(msg_encode_heartbeat(re, sizeof re, &hb, &relen, err, sizeof err), relen, data,
		     size);
	else
		fuzz_check_err(rc, err);

	struct msg_rollback rb;
	err[0] = '\0';
	if ((rc = msg_decode_rollback(data, size, &rb, err, sizeof err)) == 0)
		same(msg_encode_rollback(re, sizeof re, &rb, &relen, err, sizeof err), relen, data,
		     size);
	else
		fuzz_check_err(rc, err);

	struct msg_report rp;
	err[0] = '\0';
	if ((rc = msg_decode_report(data, size, &rp, err, sizeof err)) == 0) {
		FUZZ_CHECK(rp.workers >= 1 && rp.workers <= MSG_REPORT_WORKERS);
		FUZZ_CHECK(!rp.has_rate || (isfinite(rp.rate) && rp.rate >= 0));
		same(msg_encode_report(re, sizeof re, &rp, &relen, err, sizeof err), relen, data,
		     size);
	} else {
		fuzz_check_err(rc, err);
	}

	struct msg_view vw;
	err[0] = '\0';
	if ((rc = msg_decode_view(data, size, &vw, err, sizeof err)) == 0) {
		FUZZ_CHECK(vw.slices >= 1 && vw.slices <= MSG_VIEW_SLICES);
		same(msg_encode_view(re, sizeof re, &vw, &relen, err, sizeof err), relen, data, size);
	} else {
		fuzz_check_err(rc, err);
	}

	struct msg_leave lv;
	err[0] = '\0';
	if ((rc = msg_decode_leave(data, size, &lv, err, sizeof err)) == 0)
		same(msg_encode_leave(re, sizeof re, &lv, &relen, err, sizeof err), relen, data, size);
	else
		fuzz_check_err(rc, err);

	struct msg_compute mc;
	err[0] = '\0';
	if ((rc = msg_decode_compute(data, size, &mc, err, sizeof err)) == 0) {
		FUZZ_CHECK(mc.text[0] && strlen(mc.text) <= MSG_COMPUTE_TEXT);
		same(msg_encode_compute(re, sizeof re, &mc, &relen, err, sizeof err), relen, data, size);
	} else {
		fuzz_check_err(rc, err);
	}

	static struct msg_error e;
	err[0] = '\0';
	if ((rc = msg_decode_error(data, size, &e, err, sizeof err)) == 0) {
		FUZZ_CHECK(strlen(e.text) <= WIRE_ERROR_TEXT_MAX);
		same(msg_encode_error(re, sizeof re, e.code, e.text, &relen, err, sizeof err), relen,
		     data, size);
	} else {
		fuzz_check_err(rc, err);
	}
	return 0;
}
