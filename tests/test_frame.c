/* Tests of net/frame.c and the byte-order helpers of net/wire.h: round trips
 * with both ciphers over boundary sizes, the exact frame bytes rebuilt
 * independently with libsodium, and every frame-level rejection (wrong key
 * or cipher, a flipped bit in the header or body, replay, reorder,
 * truncation, bad declared lengths, random bytes), each leaving the receive
 * counter where it was. Socket-level behaviour (closing the connection, the
 * server serving others) is tested with the network layer. */
#include <criterion/criterion.h>

#include "leak.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "../net/aegis.h"
#include "../net/frame.h"
#include "../net/wire.h"

static void setup(void)
{
	cr_assert(sodium_init() >= 0, "sodium_init failed");
}

TestSuite(frame, .init = setup, .fini = leak_check);

/* ---- helpers ------------------------------------------------------------ */

static const uint8_t KEY[FRAME_KEY_BYTES] = {
	0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a,
	0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15,
	0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f,
};

/* The ciphers this CPU can run: ChaCha always, AES-GCM and AEGIS-256
 * where available. */
static int ciphers(enum frame_cipher out[3])
{
	int n = 0;
	out[n++] = FRAME_CHACHA20POLY1305;
	if (frame_aes_available())
		out[n++] = FRAME_AES256GCM;
	if (frame_aegis_available())
		out[n++] = FRAME_AEGIS256;
	return n;
}

static void pair(struct frame_key *tx, struct frame_key *rx, const uint8_t *key,
		 enum frame_cipher c)
{
	cr_assert_eq(frame_key_init(tx, key, c), 0);
	cr_assert_eq(frame_key_init(rx, key, c), 0);
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
	uint8_t s[randombytes_SEEDBYTES] = {0};
	wire_put_u64(s, seed);
	randombytes_buf_deterministic(p, n, s);
}

static size_t seal_ok(struct frame_key *tx, uint8_t *out, size_t outcap, const uint8_t *msg,
		      size_t len)
{
	size_t outlen = 0;
	char err[128] = "";
	int rc = frame_seal(tx, out, outcap, msg, len, &outlen, err, sizeof err);
	cr_assert_eq(rc, 0, "seal %zu bytes: %d %s", len, rc, err);
	cr_assert_eq(outlen, FRAME_SEALED_BYTES(len));
	return outlen;
}

/* Receives one frame the way a connection does: header, bound, body. */
static int recv_frame(struct frame_key *rx, const uint8_t *frame, size_t avail, uint8_t *out,
		      size_t outcap, size_t *outlen, char *err, size_t errlen)
{
	size_t ctlen = 0;
	int rc = frame_check_len(frame, &ctlen, err, errlen);
	if (rc < 0)
		return rc;
	if (ctlen > avail - FRAME_HDR_BYTES)
		ctlen = avail - FRAME_HDR_BYTES; /* the peer closed early */
	return frame_open(rx, frame, frame + FRAME_HDR_BYTES, ctlen, out, outcap, outlen, err,
			  errlen);
}

static void open_ok(struct frame_key *rx, const uint8_t *frame, size_t framelen,
		    const uint8_t *want, size_t len)
{
	uint8_t *out = malloc(len + 1);
	cr_assert_not_null(out);
	size_t outlen = 12345;
	char err[160] = "";
	uint64_t before = rx->counter;
	int rc = recv_frame(rx, frame, framelen, out, len + 1, &outlen, err, sizeof err);
	cr_assert_eq(rc, 0, "open %zu bytes at counter %llu: %d %s", len,
		     (unsigned long long)before, rc, err);
	cr_assert_eq(outlen, len);
	cr_assert(len == 0 || memcmp(out, want, len) == 0, "opened bytes differ (len %zu)", len);
	cr_assert_eq(rx->counter, before + 1);
	free(out);
}

/* Expects the open to fail with rc, the counter unchanged, and the reason
 * to contain what. */
static void open_fails(struct frame_key *rx, const uint8_t *frame, size_t avail, int want_rc,
		       const char *what, const char *ctx)
{
	static uint8_t out[FRAME_MAX];
	memset(out, 0xa5, 512);
	size_t outlen = 777;
	char err[160] = "";
	uint64_t before = rx->counter;
	int rc = recv_frame(rx, frame, avail, out, sizeof out, &outlen, err, sizeof err);
	cr_assert_eq(rc, want_rc, "%s: rc %d (%s), want %d", ctx, rc, err, want_rc);
	cr_assert_eq(rx->counter, before, "%s: counter moved on a failed open", ctx);
	cr_assert_eq(outlen, 777, "%s: outlen written on failure", ctx);
	cr_assert(strstr(err, what), "%s: reason \"%s\" lacks \"%s\"", ctx, err, what);
}

/* ---- wire.h ------------------------------------------------------------- */

Test(frame, wire_integers_little_endian)
{
	uint8_t b[8];
	wire_put_u16(b, 0x1234);
	cr_assert(b[0] == 0x34 && b[1] == 0x12);
	cr_assert_eq(wire_get_u16(b), 0x1234);

	wire_put_u32(b, 0xa1b2c3d4u);
	cr_assert(b[0] == 0xd4 && b[1] == 0xc3 && b[2] == 0xb2 && b[3] == 0xa1);
	cr_assert_eq(wire_get_u32(b), 0xa1b2c3d4u);
	const uint8_t hi[4] = {0xff, 0xff, 0xff, 0xff};
	cr_assert_eq(wire_get_u32(hi), UINT32_MAX);

	wire_put_u64(b, 0x0102030405060708ull);
	for (int i = 0; i < 8; i++)
		cr_assert_eq(b[i], 8 - i, "byte %d = %#x", i, b[i]);
	cr_assert_eq(wire_get_u64(b), 0x0102030405060708ull);
	wire_put_u64(b, UINT64_MAX - 1);
	cr_assert_eq(b[0], 0xfe);
	cr_assert_eq(wire_get_u64(b), UINT64_MAX - 1);
}

Test(frame, wire_floats_little_endian)
{
	uint8_t b[4];
	wire_put_f32(b, 1.0f); /* 0x3f800000 */
	cr_assert(b[0] == 0 && b[1] == 0 && b[2] == 0x80 && b[3] == 0x3f);
	cr_assert_eq(wire_get_f32(b), 1.0f);
	wire_put_f32(b, -2.5f); /* 0xc0200000 */
	cr_assert_eq(wire_get_u32(b), 0xc0200000u);

	const float src[5] = {0.0f, -0.0f, 3.14159f, -1e-30f, 65504.0f};
	uint8_t wire[20];
	wire_put_f32s(wire, src, 5);
	for (int i = 0; i < 5; i++) {
		uint32_t bits;
		memcpy(&bits, &src[i], 4);
		cr_assert_eq(wire_get_u32(wire + 4 * i), bits, "element %d", i);
	}
	float back[5];
	wire_get_f32s(back, wire, 5);
	cr_assert_eq(memcmp(back, src, sizeof src), 0);
}

Test(frame, wire_message_names)
{
	cr_assert_str_eq(wire_msg_name(WIRE_HELLO), "HELLO");
	cr_assert_str_eq(wire_msg_name(WIRE_PUSH), "PUSH");
	cr_assert_str_eq(wire_msg_name(WIRE_ERROR), "ERROR");
	cr_assert_str_eq(wire_msg_name(0), "?");
	cr_assert_str_eq(wire_msg_name(WIRE_MSG_LAST + 1), "?");
	cr_assert_str_eq(wire_msg_name(UINT32_MAX), "?");
	for (uint32_t t = WIRE_MSG_FIRST; t <= WIRE_MSG_LAST; t++)
		cr_assert_str_neq(wire_msg_name(t), "?", "type %u has no name", t);
	cr_assert_eq(FRAME_MAX, WIRE_CHUNK_MAX + WIRE_MSG_HDR_MAX);
}

/* ---- round trips -------------------------------------------------------- */

static void roundtrip(enum frame_cipher c)
{
	static const size_t sizes[] = {0, 1, 15, 16, 17, 1000, FRAME_MAX};
	const size_t n = sizeof sizes / sizeof sizes[0];
	struct frame_key tx, rx;
	pair(&tx, &rx, KEY, c);
	uint8_t *msg = malloc(FRAME_MAX);
	uint8_t *frame = malloc(FRAME_BYTES_MAX);
	cr_assert(msg && frame);
	for (size_t i = 0; i < n; i++) {
		size_t len = sizes[i];
		fill(msg, len, i + 1);
		size_t flen = seal_ok(&tx, frame, FRAME_BYTES_MAX, msg, len);
		cr_assert_eq(tx.counter, i + 1);
		cr_assert_eq(wire_get_u32(frame), len + FRAME_TAG_BYTES,
			     "length field for %zu bytes", len);
		if (len >= 16)
			cr_assert_neq(memcmp(frame + FRAME_HDR_BYTES, msg, 16), 0,
				      "plaintext visible in the frame (%zu bytes)", len);
		open_ok(&rx, frame, flen, msg, len);
	}
	cr_assert_eq(rx.counter, n);
	frame_key_wipe(&tx);
	frame_key_wipe(&rx);
	free(msg);
	free(frame);
}

Test(frame, roundtrip_chacha)
{
	roundtrip(FRAME_CHACHA20POLY1305);
}

Test(frame, roundtrip_aes)
{
	if (!frame_aes_available())
		cr_skip_test("this CPU has no AES-NI/PCLMUL: AES-256-GCM not available");
	roundtrip(FRAME_AES256GCM);
}

Test(frame, roundtrip_aegis)
{
	if (!frame_aegis_available())
		cr_skip_test("this CPU has no AES-NI: AEGIS-256 not available");
	roundtrip(FRAME_AEGIS256);
}

/* FRAME_LOCAL (a Unix socket on one host): the message travels as it is,
 * then the frame's counter as its tag, so frames still go through the same
 * buffers and a frame replayed, dropped or reordered by a bug fails to
 * open, in place too. */
Test(frame, local_carries_the_message_and_counts)
{
	struct frame_key tx, rx;
	pair(&tx, &rx, KEY, FRAME_LOCAL);
	cr_assert_str_eq(frame_cipher_name(FRAME_LOCAL), "local");
	uint8_t m1[1000], m2[7] = "second", f1[FRAME_SEALED_BYTES(1000)], f2[FRAME_SEALED_BYTES(6)];
	fill(m1, sizeof m1, 7);
	memcpy(f1 + FRAME_HDR_BYTES, m1, sizeof m1);
	size_t flen = 0;
	cr_assert_eq(frame_seal(&tx, f1, sizeof f1, f1 + FRAME_HDR_BYTES, sizeof m1, &flen, NULL, 0), 0);
	cr_assert_eq(flen, sizeof f1);
	cr_assert_eq(wire_get_u32(f1), sizeof m1 + FRAME_TAG_BYTES);
	cr_assert_eq(memcmp(f1 + FRAME_HDR_BYTES, m1, sizeof m1), 0, "the message as it is");
	cr_assert_eq(wire_get_u64(f1 + FRAME_HDR_BYTES + sizeof m1), 0, "frame 0's tag");
	seal_ok(&tx, f2, sizeof f2, m2, 6);
	cr_assert_eq(wire_get_u64(f2 + FRAME_HDR_BYTES + 6), 1, "frame 1's tag");
	open_fails(&rx, f2, sizeof f2, -EBADMSG, "frame 0 failed", "frame 1 first");
	cr_assert_eq(rx.counter, 0);
	size_t mlen = 0;
	cr_assert_eq(frame_open(&rx, f1, f1 + FRAME_HDR_BYTES, flen - FRAME_HDR_BYTES,
				f1 + FRAME_HDR_BYTES, flen - FRAME_HDR_BYTES, &mlen, NULL, 0), 0);
	cr_assert_eq(mlen, sizeof m1);
	cr_assert_eq(memcmp(f1 + FRAME_HDR_BYTES, m1, sizeof m1), 0);
	open_ok(&rx, f2, sizeof f2, m2, 6);
	open_fails(&rx, f2, sizeof f2, -EBADMSG, "frame 2 failed", "replay");
	frame_key_wipe(&tx);
	frame_key_wipe(&rx);
}

/* frame_open_tag, for a local frame whose message was read elsewhere:
 * the tag must hold the counter (then it advances), another tag is
 * refused with the counter left; a sealed cipher's frame must be opened
 * whole. */
Test(frame, open_tag_checks_a_local_frames_counter)
{
	struct frame_key tx, rx, sealed;
	pair(&tx, &rx, KEY, FRAME_LOCAL);
	uint8_t m[40], f[FRAME_SEALED_BYTES(40)];
	char e[200] = "";
	fill(m, sizeof m, 3);
	for (int i = 0; i < 3; i++)
		seal_ok(&tx, f, sizeof f, m, sizeof m);
	const uint8_t *tag = f + FRAME_HDR_BYTES + sizeof m; /* frame 2's */
	cr_assert_eq(frame_open_tag(&rx, tag, e, sizeof e), -EBADMSG);
	cr_assert_not_null(strstr(e, "frame 0 failed authentication (local)"), "%s", e);
	cr_assert_eq(rx.counter, 0);
	rx.counter = 2;
	cr_assert_eq(frame_open_tag(&rx, tag, e, sizeof e), 0, "%s", e);
	cr_assert_eq(rx.counter, 3);
	cr_assert_eq(frame_open_tag(&rx, tag, e, sizeof e), -EBADMSG, "a replay");
	rx.counter = UINT64_MAX;
	cr_assert_eq(frame_open_tag(&rx, tag, e, sizeof e), -EOVERFLOW);
	uint8_t k[FRAME_KEY_BYTES] = { 1 };
	cr_assert_eq(frame_key_init(&sealed, k, FRAME_CHACHA20POLY1305), 0);
	cr_assert_eq(frame_open_tag(&sealed, tag, e, sizeof e), -EINVAL);
	cr_assert_eq(sealed.counter, 0);
	frame_key_wipe(&tx);
	frame_key_wipe(&rx);
	frame_key_wipe(&sealed);
}

/* Sealing with msg at out + 4 and opening with out == ct, as a connection
 * that reuses one buffer does. */
Test(frame, in_place)
{
	enum frame_cipher cs[3];
	int nc = ciphers(cs);
	for (int ci = 0; ci < nc; ci++) {
		struct frame_key tx, rx;
		pair(&tx, &rx, KEY, cs[ci]);
		uint8_t want[1000], buf[FRAME_SEALED_BYTES(1000)];
		fill(want, sizeof want, 99);
		memcpy(buf + FRAME_HDR_BYTES, want, sizeof want);
		size_t flen = 0;
		cr_assert_eq(frame_seal(&tx, buf, sizeof buf, buf + FRAME_HDR_BYTES, sizeof want,
					&flen, NULL, 0), 0);
		cr_assert_eq(flen, sizeof buf);
		size_t mlen = 0;
		cr_assert_eq(frame_open(&rx, buf, buf + FRAME_HDR_BYTES, flen - FRAME_HDR_BYTES,
					buf + FRAME_HDR_BYTES, flen - FRAME_HDR_BYTES, &mlen,
					NULL, 0),
			     0, "%s", frame_cipher_name(cs[ci]));
		cr_assert_eq(mlen, sizeof want);
		cr_assert_eq(memcmp(buf + FRAME_HDR_BYTES, want, sizeof want), 0);
	}
}

/* The frame bytes are exactly what docs/PROTOCOL.md says: rebuilt here
 * straight from libsodium (AEGIS-256: net/aegis.c, itself checked against
 * the specification's vectors in test_aegis.c), with the header as AD and
 * the counter as nonce. */
Test(frame, bytes_match_protocol)
{
	enum frame_cipher cs[3];
	int nc = ciphers(cs);
	const uint64_t counters[] = {0, 1, 0x0102030405060708ull, UINT64_MAX - 1};
	for (int ci = 0; ci < nc; ci++)
		for (size_t j = 0; j < 4; j++) {
			struct frame_key tx, rx;
			pair(&tx, &rx, KEY, cs[ci]);
			tx.counter = rx.counter = counters[j];
			uint8_t msg[33], got[FRAME_SEALED_BYTES(33)], want[sizeof got];
			fill(msg, sizeof msg, j);
			seal_ok(&tx, got, sizeof got, msg, sizeof msg);

			uint8_t nonce[32] = {0};
			for (int b = 0; b < 8; b++)
				nonce[b] = (uint8_t)(counters[j] >> (8 * b));
			want[0] = sizeof msg + 16;
			want[1] = want[2] = want[3] = 0;
			unsigned long long ctlen = 0;
			if (cs[ci] == FRAME_AEGIS256) {
				aegis256_encrypt(want + 4, want + 4 + sizeof msg, msg, sizeof msg,
						 want, 4, nonce, KEY);
				ctlen = sizeof msg + 16;
			} else if (cs[ci] == FRAME_AES256GCM)
				crypto_aead_aes256gcm_encrypt(want + 4, &ctlen, msg, sizeof msg,
							      want, 4, NULL, nonce, KEY);
			else
				crypto_aead_chacha20poly1305_ietf_encrypt(want + 4, &ctlen, msg,
									  sizeof msg, want, 4,
									  NULL, nonce, KEY);
			cr_assert_eq(ctlen, sizeof msg + 16);
			cr_assert_eq(memcmp(got, want, sizeof got), 0, "%s counter %#llx",
				     frame_cipher_name(cs[ci]), (unsigned long long)counters[j]);
			open_ok(&rx, want, sizeof want, msg, sizeof msg);
		}
}

/* The header really is associated data: the same ciphertext sealed without
 * it (or with another AD) does not open. */
Test(frame, header_is_associated_data)
{
	enum frame_cipher cs[3];
	int nc = ciphers(cs);
	for (int ci = 0; ci < nc; ci++) {
		struct frame_key rx;
		cr_assert_eq(frame_key_init(&rx, KEY, cs[ci]), 0);
		uint8_t msg[20], f[FRAME_SEALED_BYTES(20)];
		fill(msg, sizeof msg, 5);
		const uint8_t nonce[32] = {0};
		wire_put_u32(f, sizeof msg + 16);
		unsigned long long ctlen = 0;
		const uint8_t other_ad[4] = {36, 0, 0, 1};
		for (int variant = 0; variant < 2; variant++) {
			const uint8_t *ad = variant ? other_ad : NULL;
			size_t adlen = variant ? 4 : 0;
			if (cs[ci] == FRAME_AEGIS256)
				aegis256_encrypt(f + 4, f + 4 + sizeof msg, msg, sizeof msg, ad,
						 adlen, nonce, KEY);
			else if (cs[ci] == FRAME_AES256GCM)
				crypto_aead_aes256gcm_encrypt(f + 4, &ctlen, msg, sizeof msg, ad,
							      adlen, NULL, nonce, KEY);
			else
				crypto_aead_chacha20poly1305_ietf_encrypt(
					f + 4, &ctlen, msg, sizeof msg, ad, adlen, NULL, nonce, KEY);
			open_fails(&rx, f, sizeof f, -EBADMSG, "authentication",
				   variant ? "other AD" : "no AD");
		}
	}
}

/* ---- counters ----------------------------------------------------------- */

Test(frame, counter_is_the_nonce)
{
	enum frame_cipher cs[3];
	int nc = ciphers(cs);
	for (int ci = 0; ci < nc; ci++) {
		struct frame_key tx, rx;
		pair(&tx, &rx, KEY, cs[ci]);
		const uint8_t msg[9] = "same msg";
		uint8_t f1[FRAME_SEALED_BYTES(8)], f2[sizeof f1];
		seal_ok(&tx, f1, sizeof f1, msg, 8);
		seal_ok(&tx, f2, sizeof f2, msg, 8);
		cr_assert_eq(tx.counter, 2);
		cr_assert_eq(memcmp(f1, f2, 4), 0, "headers of equal lengths differ");
		cr_assert_neq(memcmp(f1 + 4, f2 + 4, sizeof f1 - 4), 0,
			      "two seals of one message are identical");
		/* A fresh sender with the same key repeats frame 0 exactly:
		 * the nonce is the counter and nothing else. */
		struct frame_key again;
		cr_assert_eq(frame_key_init(&again, KEY, cs[ci]), 0);
		uint8_t f3[sizeof f1];
		seal_ok(&again, f3, sizeof f3, msg, 8);
		cr_assert_eq(memcmp(f1, f3, sizeof f1), 0);
		open_ok(&rx, f1, sizeof f1, msg, 8);
		open_ok(&rx, f2, sizeof f2, msg, 8);
	}
}

/* All 64 bits are in the nonce: a frame sealed at 2^32 opens at 2^32 and
 * not at 0 (a 32-bit nonce would wrap to 0). */
Test(frame, counter_high_bits)
{
	enum frame_cipher cs[3];
	int nc = ciphers(cs);
	for (int ci = 0; ci < nc; ci++) {
		struct frame_key tx, rx;
		pair(&tx, &rx, KEY, cs[ci]);
		tx.counter = 1ull << 32;
		uint8_t msg[3] = {1, 2, 3}, f[FRAME_SEALED_BYTES(3)];
		seal_ok(&tx, f, sizeof f, msg, 3);
		open_fails(&rx, f, sizeof f, -EBADMSG, "frame 0 failed authentication",
			   "counter 0");
		rx.counter = 1ull << 56;
		open_fails(&rx, f, sizeof f, -EBADMSG, "authentication", "counter 2^56");
		rx.counter = 1ull << 32;
		open_ok(&rx, f, sizeof f, msg, 3);
	}
}

Test(frame, counter_exhaustion)
{
	enum frame_cipher cs[3];
	int nc = ciphers(cs);
	for (int ci = 0; ci < nc; ci++) {
		struct frame_key tx, rx;
		pair(&tx, &rx, KEY, cs[ci]);
		tx.counter = rx.counter = UINT64_MAX - 1;
		uint8_t msg[4] = {9, 9, 9, 9}, f[FRAME_SEALED_BYTES(4)];
		seal_ok(&tx, f, sizeof f, msg, 4);
		cr_assert_eq(tx.counter, UINT64_MAX);

		uint8_t f2[sizeof f];
		size_t outlen = 4242;
		char err[128] = "";
		cr_assert_eq(frame_seal(&tx, f2, sizeof f2, msg, 4, &outlen, err, sizeof err),
			     -EOVERFLOW);
		cr_assert_eq(tx.counter, UINT64_MAX, "counter wrapped");
		cr_assert_eq(outlen, 4242);
		cr_assert(strstr(err, "exhausted"), "%s", err);

		open_ok(&rx, f, sizeof f, msg, 4);
		cr_assert_eq(rx.counter, UINT64_MAX);
		open_fails(&rx, f, sizeof f, -EOVERFLOW, "exhausted", "receive at 2^64-1");
	}
}

/* ---- rejections --------------------------------------------------------- */

Test(frame, wrong_key)
{
	enum frame_cipher cs[3];
	int nc = ciphers(cs);
	for (int ci = 0; ci < nc; ci++) {
		for (int bit = 0; bit < 256; bit += 37) {
			uint8_t other[FRAME_KEY_BYTES];
			memcpy(other, KEY, sizeof other);
			other[bit / 8] ^= (uint8_t)(1u << (bit % 8));
			struct frame_key tx, rx;
			cr_assert_eq(frame_key_init(&tx, KEY, cs[ci]), 0);
			cr_assert_eq(frame_key_init(&rx, other, cs[ci]), 0);
			uint8_t msg[40], f[FRAME_SEALED_BYTES(40)];
			fill(msg, sizeof msg, 3);
			seal_ok(&tx, f, sizeof f, msg, sizeof msg);
			open_fails(&rx, f, sizeof f, -EBADMSG, "authentication", "wrong key");
		}
	}
}

/* A frame sealed with one cipher opens with no other, under the same key
 * and counter: every ordered pair this CPU runs. */
Test(frame, wrong_cipher)
{
	enum frame_cipher cs[3];
	int nc = ciphers(cs);
	if (nc < 2)
		cr_skip_test("this CPU has no AES-NI/PCLMUL: only one cipher to test");
	for (int a = 0; a < nc; a++)
		for (int b = 0; b < nc; b++) {
			struct frame_key tx, rx;
			cr_assert_eq(frame_key_init(&tx, KEY, cs[a]), 0);
			cr_assert_eq(frame_key_init(&rx, KEY, cs[b]), 0);
			uint8_t msg[10] = {0}, f[FRAME_SEALED_BYTES(10)];
			seal_ok(&tx, f, sizeof f, msg, sizeof msg);
			if (a == b)
				open_ok(&rx, f, sizeof f, msg, sizeof msg);
			else
				open_fails(&rx, f, sizeof f, -EBADMSG, frame_cipher_name(cs[b]),
					   frame_cipher_name(cs[a]));
		}
}

/* Every bit of the length header flipped, read as a stream does: the frame
 * is followed by the next one, so a longer declared length reads into it
 * and a shorter one stops early. Each flip fails, at the bound or at the
 * tag; the counter stays, and the untouched frame still opens. */
Test(frame, header_bit_flip)
{
	enum frame_cipher cs[3];
	int nc = ciphers(cs);
	for (int ci = 0; ci < nc; ci++) {
		struct frame_key tx, rx;
		pair(&tx, &rx, KEY, cs[ci]);
		uint8_t msg[100];
		fill(msg, sizeof msg, 11);
		size_t one = FRAME_SEALED_BYTES(sizeof msg);
		uint8_t *stream = calloc(1, FRAME_BYTES_MAX * 2);
		cr_assert_not_null(stream);
		seal_ok(&tx, stream, one, msg, sizeof msg);
		seal_ok(&tx, stream + one, one, msg, sizeof msg);
		int at_bound = 0, at_tag = 0;
		for (int bit = 0; bit < 32; bit++) {
			stream[bit / 8] ^= (uint8_t)(1u << (bit % 8));
			size_t ctlen = 0;
			char err[160] = "";
			int rc = frame_check_len(stream, &ctlen, err, sizeof err);
			if (rc < 0) {
				cr_assert_eq(rc, -EMSGSIZE, "bit %d", bit);
				at_bound++;
			} else {
				char ctx[32];
				snprintf(ctx, sizeof ctx, "header bit %d", bit);
				open_fails(&rx, stream, FRAME_BYTES_MAX * 2, -EBADMSG,
					   "authentication", ctx);
				/* ...and the frame's own bytes under the flipped
				 * header are refused on length. */
				uint8_t out[128];
				size_t outlen = 0;
				cr_assert_eq(frame_open(&rx, stream, stream + 4, one - 4, out,
							sizeof out, &outlen, err, sizeof err),
					     -EMSGSIZE, "%s", ctx);
				cr_assert(strstr(err, "truncated or padded"), "%s", err);
				at_tag++;
			}
			stream[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		}
		/* Low bits give lengths in bounds, high bits exceed them. */
		cr_assert(at_bound > 0 && at_tag > 0, "bound %d tag %d", at_bound, at_tag);
		cr_assert_eq(rx.counter, 0);
		open_ok(&rx, stream, one, msg, sizeof msg);
		open_ok(&rx, stream + one, one, msg, sizeof msg);
		free(stream);
	}
}

Test(frame, body_bit_flip)
{
	enum frame_cipher cs[3];
	int nc = ciphers(cs);
	for (int ci = 0; ci < nc; ci++) {
		struct frame_key tx, rx;
		pair(&tx, &rx, KEY, cs[ci]);
		uint8_t msg[17], f[FRAME_SEALED_BYTES(17)];
		fill(msg, sizeof msg, 17);
		seal_ok(&tx, f, sizeof f, msg, sizeof msg);
		for (size_t pos = FRAME_HDR_BYTES; pos < sizeof f; pos++)
			for (int bit = 0; bit < 8; bit++) {
				char ctx[48];
				snprintf(ctx, sizeof ctx, "%s byte %zu bit %d",
					 frame_cipher_name(cs[ci]), pos, bit);
				f[pos] ^= (uint8_t)(1u << bit);
				open_fails(&rx, f, sizeof f, -EBADMSG, "authentication", ctx);
				f[pos] ^= (uint8_t)(1u << bit);
			}
		open_ok(&rx, f, sizeof f, msg, sizeof msg);
	}
}

Test(frame, failed_open_zeroes_output)
{
	struct frame_key tx, rx;
	pair(&tx, &rx, KEY, FRAME_CHACHA20POLY1305);
	uint8_t msg[64], f[FRAME_SEALED_BYTES(64)], out[64];
	fill(msg, sizeof msg, 64);
	seal_ok(&tx, f, sizeof f, msg, sizeof msg);
	f[10] ^= 1;
	memset(out, 0xa5, sizeof out);
	size_t outlen = 0;
	cr_assert_eq(frame_open(&rx, f, f + 4, sizeof f - 4, out, sizeof out, &outlen, NULL, 0),
		     -EBADMSG);
	for (size_t i = 0; i < sizeof out; i++)
		cr_assert_eq(out[i], 0, "out[%zu] = %#x after a failed open", i, out[i]);
	/* Refused on length before any decryption: stale bytes go too. */
	memset(out, 0xa5, sizeof out);
	cr_assert_eq(frame_open(&rx, f, f + 4, sizeof f - 5, out, sizeof out, &outlen, NULL, 0),
		     -EMSGSIZE);
	for (size_t i = 0; i < sizeof f - 5 - FRAME_TAG_BYTES; i++)
		cr_assert_eq(out[i], 0, "out[%zu] = %#x after a refused length", i, out[i]);
	cr_assert_eq(rx.counter, 0);
}

/* An AEGIS-256 frame opened in two parts, its message header into the
 * buffer (in place) and its values elsewhere, as a receiver that places
 * them does: the same bytes as opened whole, the counter advanced; the
 * header peeked first is the one sent. A flipped bit leaves both parts
 * zeroed and the counter where it was; another cipher, or a head longer
 * than the message, is refused with nothing opened. */
Test(frame, open_split_and_peek)
{
	if (!frame_aegis_available())
		cr_skip_test("this CPU has no AES-NI: AEGIS-256 not available");
	struct frame_key tx, rx;
	pair(&tx, &rx, KEY, FRAME_AEGIS256);
	uint8_t msg[300], f[FRAME_SEALED_BYTES(300)], g[sizeof f], head[32], body[300 - 32 + 1];
	fill(msg, sizeof msg, 77);
	size_t flen = seal_ok(&tx, f, sizeof f, msg, sizeof msg), outlen = 0;
	memcpy(g, f, flen);
	char err[160] = "";
	cr_assert_eq(frame_peek(&rx, f, f + 4, flen - 4, head, 32), 0);
	cr_assert_eq(memcmp(head, msg, 32), 0, "peeked head");
	cr_assert_eq(rx.counter, 0, "a peek moved the counter");
	body[sizeof body - 1] = 0xa5;
	cr_assert_eq(frame_open_split(&rx, f, f + 4, flen - 4, f + 4, 32, body, &outlen, err,
				      sizeof err), 0, "%s", err);
	cr_assert(outlen == sizeof msg && rx.counter == 1);
	cr_assert(memcmp(f + 4, msg, 32) == 0 && memcmp(body, msg + 32, sizeof msg - 32) == 0);
	cr_assert_eq(body[sizeof body - 1], 0xa5, "wrote past the body");
	/* the same frame again: a replay, both parts zeroed */
	memset(body, 0xa5, sizeof body - 1);
	cr_assert_eq(frame_open_split(&rx, g, g + 4, flen - 4, g + 4, 32, body, &outlen, err,
				      sizeof err), -EBADMSG);
	cr_assert(strstr(err, "frame 1 failed authentication (aegis-256)"), "%s", err);
	cr_assert_eq(rx.counter, 1);
	for (size_t i = 0; i < sizeof msg; i++)
		cr_assert_eq(i < 32 ? g[4 + i] : body[i - 32], 0, "byte %zu left after a failure", i);
	cr_assert_eq(body[sizeof body - 1], 0xa5);
	cr_assert_eq(frame_peek(&rx, g, g + 4, flen - 4, head, flen), -EINVAL, "peek past the message");
	struct frame_key ctx, crx;
	pair(&ctx, &crx, KEY, FRAME_CHACHA20POLY1305);
	flen = seal_ok(&ctx, f, sizeof f, msg, sizeof msg);
	cr_assert_eq(frame_peek(&crx, f, f + 4, flen - 4, head, 32), -EINVAL);
	cr_assert_eq(frame_open_split(&crx, f, f + 4, flen - 4, f + 4, 32, body, &outlen, err,
				      sizeof err), -EINVAL);
	cr_assert(strstr(err, "not opened in two parts"), "%s", err);
	cr_assert_eq(crx.counter, 0);
}

Test(frame, replay)
{
	enum frame_cipher cs[3];
	int nc = ciphers(cs);
	for (int ci = 0; ci < nc; ci++) {
		struct frame_key tx, rx;
		pair(&tx, &rx, KEY, cs[ci]);
		uint8_t msg[6] = "hello", f[FRAME_SEALED_BYTES(5)];
		seal_ok(&tx, f, sizeof f, msg, 5);
		open_ok(&rx, f, sizeof f, msg, 5);
		open_fails(&rx, f, sizeof f, -EBADMSG, "frame 1 failed authentication", "replay");
		cr_assert_eq(rx.counter, 1);
	}
}

/* Frame 2 before frame 1 (or frame 1 dropped) fails; nothing moved, so the
 * right order still opens. */
Test(frame, reorder)
{
	enum frame_cipher cs[3];
	int nc = ciphers(cs);
	for (int ci = 0; ci < nc; ci++) {
		struct frame_key tx, rx;
		pair(&tx, &rx, KEY, cs[ci]);
		uint8_t m1[7] = "first!", m2[7] = "second";
		uint8_t f1[FRAME_SEALED_BYTES(6)], f2[sizeof f1];
		seal_ok(&tx, f1, sizeof f1, m1, 6);
		seal_ok(&tx, f2, sizeof f2, m2, 6);
		open_fails(&rx, f2, sizeof f2, -EBADMSG, "frame 0 failed", "frame 2 first");
		cr_assert_eq(rx.counter, 0);
		open_ok(&rx, f1, sizeof f1, m1, 6);
		open_ok(&rx, f2, sizeof f2, m2, 6);
	}
}

Test(frame, truncation)
{
	enum frame_cipher cs[3];
	int nc = ciphers(cs);
	for (int ci = 0; ci < nc; ci++) {
		struct frame_key tx, rx;
		pair(&tx, &rx, KEY, cs[ci]);
		uint8_t msg[50], f[FRAME_SEALED_BYTES(50)];
		fill(msg, sizeof msg, 50);
		seal_ok(&tx, f, sizeof f, msg, sizeof msg);
		/* Fewer bytes than the header declares: refused on length. */
		const size_t cuts[] = {1, 15, 16, 17, 50, 66};
		for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
			open_fails(&rx, f, sizeof f - cuts[i], -EMSGSIZE, "truncated",
				   "short body");
		/* More than declared is refused too. */
		uint8_t out[64];
		size_t outlen = 0;
		cr_assert_eq(frame_open(&rx, f, f + 4, sizeof f - 4 + 1, out, sizeof out, &outlen,
					NULL, 0),
			     -EMSGSIZE);
		/* Cut and re-headed to match (tag dropped, or message shortened):
		 * the tag catches it. */
		for (size_t cut = 1; cut <= 34; cut += 11) {
			uint8_t g[sizeof f];
			memcpy(g, f, sizeof f);
			wire_put_u32(g, (uint32_t)(sizeof f - 4 - cut));
			open_fails(&rx, g, sizeof g - cut, -EBADMSG, "authentication",
				   "cut and re-headed");
		}
		cr_assert_eq(rx.counter, 0);
		open_ok(&rx, f, sizeof f, msg, sizeof msg);
	}
}

/* A row per declared length: what frame_check_len says. */
static const struct {
	uint32_t L;
	int rc;
	const char *reason;
} len_table[] = {
	{0, -EMSGSIZE, "frame length 0 is shorter than the 16-byte tag"},
	{1, -EMSGSIZE, "frame length 1 is shorter"},
	{15, -EMSGSIZE, "frame length 15 is shorter"},
	{16, 0, ""},
	{17, 0, ""},
	{FRAME_CT_MAX, 0, ""},
	{FRAME_CT_MAX + 1, -EMSGSIZE, "exceeds the limit"},
	{0x7fffffffu, -EMSGSIZE, "frame length 2147483647 exceeds"},
	{0xffffffffu, -EMSGSIZE, "frame length 4294967295 exceeds"},
};

Test(frame, check_len_table)
{
	for (size_t i = 0; i < sizeof len_table / sizeof len_table[0]; i++) {
		uint8_t hdr[4];
		wire_put_u32(hdr, len_table[i].L);
		size_t ctlen = 999;
		char err[160] = "";
		int rc = frame_check_len(hdr, &ctlen, err, sizeof err);
		cr_assert_eq(rc, len_table[i].rc, "L=%u: rc %d (%s)", len_table[i].L, rc, err);
		if (rc == 0)
			cr_assert_eq(ctlen, len_table[i].L);
		else
			cr_assert_eq(ctlen, 999, "L=%u: ctlen written on failure", len_table[i].L);
		cr_assert(strstr(err, len_table[i].reason), "L=%u: \"%s\" lacks \"%s\"",
			  len_table[i].L, err, len_table[i].reason);
	}
}

/* frame_open bounds the header itself, even when the caller skipped
 * frame_check_len and passes a matching ctlen. */
Test(frame, open_bounds_length)
{
	struct frame_key rx;
	cr_assert_eq(frame_key_init(&rx, KEY, FRAME_CHACHA20POLY1305), 0);
	uint8_t hdr[4], ct[16] = {0}, out[16];
	size_t outlen = 5;
	wire_put_u32(hdr, 15);
	cr_assert_eq(frame_open(&rx, hdr, ct, 15, out, sizeof out, &outlen, NULL, 0), -EMSGSIZE);
	wire_put_u32(hdr, 0);
	cr_assert_eq(frame_open(&rx, hdr, ct, 0, out, sizeof out, &outlen, NULL, 0), -EMSGSIZE);
	uint8_t *big = calloc(1, FRAME_CT_MAX + 1);
	cr_assert_not_null(big);
	wire_put_u32(hdr, FRAME_CT_MAX + 1);
	cr_assert_eq(frame_open(&rx, hdr, big, FRAME_CT_MAX + 1, big, FRAME_CT_MAX + 1, &outlen,
				NULL, 0),
		     -EMSGSIZE);
	cr_assert_eq(rx.counter, 0);
	cr_assert_eq(outlen, 5);
	free(big);
}

/* Random headers and bodies never open: each is refused on its length or
 * at the tag, and the counter never moves. Half the headers are forced
 * into bounds so that most inputs reach the AEAD. */
Test(frame, random_bytes)
{
	enum frame_cipher cs[3];
	int nc = ciphers(cs);
	for (int ci = 0; ci < nc; ci++) {
		struct frame_key rx;
		cr_assert_eq(frame_key_init(&rx, KEY, cs[ci]), 0);
		uint8_t buf[4 + 300];
		int bound = 0, tag = 0;
		for (uint64_t it = 0; it < 4000; it++) {
			fill(buf, sizeof buf, 1000 + it);
			if (it % 2)
				wire_put_u32(buf, 16 + (uint32_t)(wire_get_u32(buf + 4) % 285));
			size_t ctlen = 0;
			int rc = frame_check_len(buf, &ctlen, NULL, 0);
			if (rc < 0) {
				cr_assert_eq(rc, -EMSGSIZE);
				bound++;
				continue;
			}
			/* Only 300 bytes follow: a longer frame is truncated. */
			size_t got = ctlen < 300 ? ctlen : 300;
			uint8_t out[300];
			size_t outlen = 0;
			rc = frame_open(&rx, buf, buf + 4, got, out, sizeof out, &outlen, NULL, 0);
			cr_assert_eq(rc, got == ctlen ? -EBADMSG : -EMSGSIZE,
				     "iteration %llu: L %zu rc %d", (unsigned long long)it, ctlen,
				     rc);
			if (got == ctlen)
				tag++;
			else
				bound++;
		}
		cr_assert_eq(rx.counter, 0);
		cr_assert(tag >= 2000 && bound >= 1000, "tag %d bound %d", tag, bound);
	}
}

/* ---- sealing limits and key handling ------------------------------------ */

Test(frame, seal_limits)
{
	struct frame_key tx;
	cr_assert_eq(frame_key_init(&tx, KEY, FRAME_CHACHA20POLY1305), 0);
	uint8_t *msg = calloc(1, FRAME_MAX + 1), *out = malloc(FRAME_BYTES_MAX + 1);
	cr_assert(msg && out);
	size_t outlen = 31;
	char err[160] = "";
	cr_assert_eq(frame_seal(&tx, out, FRAME_BYTES_MAX + 1, msg, FRAME_MAX + 1, &outlen, err,
				sizeof err),
		     -EMSGSIZE);
	cr_assert(strstr(err, "exceeds the frame limit"), "%s", err);
	cr_assert_eq(frame_seal(&tx, out, FRAME_SEALED_BYTES(10) - 1, msg, 10, &outlen, err,
				sizeof err),
		     -ENOBUFS);
	cr_assert(strstr(err, "output buffer"), "%s", err);
	cr_assert_eq(tx.counter, 0);
	cr_assert_eq(outlen, 31);
	cr_assert_eq(frame_seal(&tx, out, FRAME_SEALED_BYTES(10), msg, 10, &outlen, NULL, 0), 0);
	cr_assert_eq(outlen, FRAME_SEALED_BYTES(10));

	/* A receiver's buffer too small for the message: refused, counter kept. */
	struct frame_key rx;
	cr_assert_eq(frame_key_init(&rx, KEY, FRAME_CHACHA20POLY1305), 0);
	uint8_t small[9];
	size_t mlen = 0;
	cr_assert_eq(frame_open(&rx, out, out + 4, outlen - 4, small, sizeof small, &mlen, NULL, 0),
		     -ENOBUFS);
	cr_assert_eq(rx.counter, 0);
	uint8_t right[10];
	cr_assert_eq(frame_open(&rx, out, out + 4, outlen - 4, right, sizeof right, &mlen, NULL, 0),
		     0);
	cr_assert_eq(mlen, 10);
	free(msg);
	free(out);
}

Test(frame, key_init_and_wipe)
{
	struct frame_key k;
	cr_assert_eq(frame_key_init(&k, KEY, (enum frame_cipher)7), -EINVAL);
	cr_assert_eq(frame_key_init(&k, KEY, FRAME_AES256GCM),
		     frame_aes_available() ? 0 : -ENOTSUP);
	cr_assert_eq(frame_key_init(&k, KEY, FRAME_AEGIS256),
		     frame_aegis_available() ? 0 : -ENOTSUP);
	/* the best cipher both ends offer, whichever end asks */
	const unsigned A = FRAME_OFFER_AES256GCM, G = FRAME_OFFER_AEGIS256;
	cr_assert_eq(frame_cipher_choose(0, 0), FRAME_CHACHA20POLY1305);
	cr_assert_eq(frame_cipher_choose(A | G, 0), FRAME_CHACHA20POLY1305);
	cr_assert_eq(frame_cipher_choose(A, G), FRAME_CHACHA20POLY1305);
	cr_assert_eq(frame_cipher_choose(A, A | G), FRAME_AES256GCM);
	cr_assert_eq(frame_cipher_choose(A | G, A), FRAME_AES256GCM);
	cr_assert_eq(frame_cipher_choose(G, A | G), FRAME_AEGIS256);
	cr_assert_eq(frame_cipher_choose(A | G, A | G), FRAME_AEGIS256);
	cr_assert_eq(frame_offers() & FRAME_OFFER_AES256GCM ? 1 : 0, frame_aes_available());
	cr_assert_eq(frame_offers() & FRAME_OFFER_AEGIS256 ? 1 : 0, frame_aegis_available());
	cr_assert_str_eq(frame_cipher_name(FRAME_AES256GCM), "aes-256-gcm");
	cr_assert_str_eq(frame_cipher_name(FRAME_AEGIS256), "aegis-256");
	cr_assert_str_eq(frame_cipher_name(FRAME_CHACHA20POLY1305), "chacha20-poly1305");

	cr_assert_eq(frame_key_init(&k, KEY, FRAME_CHACHA20POLY1305), 0);
	cr_assert_eq(memcmp(k.key, KEY, sizeof KEY), 0);
	cr_assert_eq(k.counter, 0);
	k.counter = 77;
	frame_key_wipe(&k);
	static const struct frame_key zero;
	cr_assert_eq(memcmp(&k, &zero, sizeof k), 0, "key not wiped");
	frame_key_wipe(NULL);
}
