/* Tests of net/fpack.c: every float32 comes back bit for bit (zeros of
 * both signs, subnormals, infinities, NaNs with payloads, values far below
 * the largest, which escape), at every count from 1 to 70 and a whole
 * chunk; the size is what fpack.h says; a packing that would not be
 * shorter than cap is declined; and a body from a peer is taken only if it
 * is the one packing of its values: any change to a packed body is either
 * refused by fpack_check or packs back to exactly the changed bytes. */
#include <criterion/criterion.h>

#include "floatbits.h"
#include "leak.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../net/fpack.h"

TestSuite(fpack, .fini = leak_check);

#define MAXN 16384

/* A deterministic xorshift, so that a failure repeats. */
static uint32_t next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return (uint32_t)(*s >> 16);
}

/* Weights-like values: a normal-ish spread around scale, a few exact
 * zeros, and one in 64 from anywhere in the float32 range. */
static void fill(float *v, size_t n, float scale, uint64_t seed)
{
	uint64_t s = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		uint32_t r = next(&s);
		if (r % 97 == 0)
			v[i] = (r & 1) ? 0.0f : -0.0f;
		else if (r % 64 == 1)
			v[i] = flt(next(&s));
		else
			v[i] = scale * ((float)(next(&s) % 20001) / 10000.0f - 1.0f) *
			       ((float)(next(&s) % 1000) / 250.0f);
	}
}

static void round_trip(const float *v, size_t n, const char *what)
{
	static uint8_t buf[5 * MAXN + 16];
	static float back[MAXN];
	/* Room for every value escaping: then it is longer than float32. */
	size_t len = fpack_encode(buf, fpack_min_bytes(n) + n, v, n);
	cr_assert(len >= fpack_min_bytes(n), "%s, n %zu: %zu bytes", what, n, len);
	cr_assert_eq(fpack_check(buf, len, n) == 0, len < 4 * n,
		     "%s, n %zu: check of the encoder's own %zu bytes", what, n, len);
	memset(back, 0xa5, n * sizeof(float));
	fpack_decode(back, buf, n);
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(bits(back[i]), bits(v[i]), "%s, n %zu: value %zu is %08x, sent %08x", what, n,
			     i, bits(back[i]), bits(v[i]));
}

Test(fpack, every_value_comes_back_bit_for_bit)
{
	static float v[MAXN];
	for (size_t n = 1; n <= 70; n++) {
		fill(v, n, 0.05f, n);
		round_trip(v, n, "mixed");
	}
	fill(v, MAXN, 0.05f, 99);
	round_trip(v, MAXN, "mixed chunk");
	fill(v, MAXN, 3e-9f, 7);
	round_trip(v, MAXN, "small");
	/* The float32 specials, each next to a value that sets emax high. */
	const uint32_t special[] = { 0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u,
				     0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc12345u, 0x7f800001u,
				     0x7f7fffffu, 0x3f800000u };
	size_t ns = sizeof special / sizeof special[0];
	for (size_t i = 0; i < ns; i++) {
		v[2 * i] = flt(special[i]);
		v[2 * i + 1] = 1.0f + (float)i;
	}
	round_trip(v, 2 * ns, "specials");
	for (size_t i = 0; i < ns; i++)
		v[i] = flt(special[i]);
	round_trip(v, ns, "specials alone");
}

/* 3.5 bytes a value when nothing escapes; an escape costs one byte more. */
Test(fpack, size_is_what_the_format_says)
{
	static uint8_t buf[4 * 64];
	float v[64];
	for (int i = 0; i < 64; i++)
		v[i] = 1.0f + (float)i / 64.0f; /* one binade: codes 0 */
	cr_assert_eq(fpack_encode(buf, sizeof buf, v, 64), 1 + 32 + 3 * 64u);
	cr_assert_eq(fpack_encode(buf, sizeof buf, v, 63), 1 + 32 + 3 * 63u);
	v[5] = 0.0f;        /* exponent 0: escapes */
	v[9] = 1e-6f;       /* about 20 binades below: escapes */
	v[11] = 1.0f / 16384.0f; /* 14 below: code 14, no escape */
	size_t len = fpack_encode(buf, sizeof buf, v, 64);
	cr_assert_eq(len, 1 + 32 + 3 * 64u + 2);
	cr_assert_eq(buf[1 + 32 + 3 * 64], 0, "the escapes in value order");
	cr_assert_eq(buf[1 + 32 + 3 * 64 + 1], (bits(1e-6f) >> 23) & 0xff);
	cr_assert_eq(buf[1 + 11 / 2] >> 4, 14, "value 11's code");
}

/* The encoder declines what would not fit cap; a sender then sends
 * float32 (net/msg.c). */
Test(fpack, declines_what_does_not_fit)
{
	static uint8_t buf[4 * 64];
	float v[64];
	for (int i = 0; i < 64; i++)
		v[i] = (i % 2) ? 1.0f : 0.0f; /* every other value escapes: 4 bytes each */
	cr_assert_eq(fpack_encode(buf, 4 * 64 - 1, v, 64), 0, "half escapes: 4 bytes a value");
	cr_assert_eq(fpack_encode(buf, 4 * 1 - 1, v, 1), 0, "one value takes 5 bytes");
	for (int i = 0; i < 64; i++)
		v[i] = 1.0f;
	size_t need = fpack_min_bytes(64);
	cr_assert_eq(fpack_encode(buf, need - 1, v, 64), 0);
	cr_assert_eq(fpack_encode(buf, need, v, 64), need);
	cr_assert_eq(fpack_encode(buf, sizeof buf, v, 0), 0);
}

/* Every one-byte change of a packed body (each byte, 8 patterns), and
 * every shorter and longer length: fpack_check refuses it, or it is the
 * packing of the values it decodes to. */
Test(fpack, a_changed_body_is_refused_or_is_its_values_packing)
{
	static uint8_t buf[4 * 40 + 8], mut[4 * 40 + 8], re[4 * 40 + 8];
	float v[40], back[40];
	const size_t counts[] = { 39, 40 };
	for (size_t t = 0; t < 2; t++) {
		size_t n = counts[t];
		fill(v, n, 0.5f, 3 + t);
		v[7] = 0.0f; /* one escape at least */
		size_t len = fpack_encode(buf, 4 * n - 1, v, n);
		cr_assert(len > 0);
		size_t accepted = 0, refused = 0;
		for (size_t i = 0; i < len; i++) {
			for (int b = 0; b < 8; b++) {
				memcpy(mut, buf, len);
				mut[i] ^= (uint8_t)(1u << b);
				if (fpack_check(mut, len, n)) {
					refused++;
					continue;
				}
				accepted++;
				fpack_decode(back, mut, n);
				cr_assert_eq(fpack_encode(re, sizeof re, back, n), len,
					     "n %zu, byte %zu bit %d: accepted, but packs to another length", n, i, b);
				cr_assert_eq(memcmp(re, mut, len), 0,
					     "n %zu, byte %zu bit %d: accepted, but not its values' packing", n, i, b);
			}
		}
		/* The planes' bits are free; the emax, codes and escapes mostly not. */
		cr_assert(accepted > 0 && refused > 0, "n %zu: %zu accepted, %zu refused", n, accepted, refused);
		for (size_t l = 0; l < len + 8; l++)
			if (l != len)
				cr_assert_neq(fpack_check(buf, l, n), 0, "n %zu: length %zu of %zu taken", n, l, len);
		cr_assert_neq(fpack_check(buf, len, n + 1), 0);
		cr_assert_neq(fpack_check(buf, len, n - 1), 0);
	}
}

/* The refusals one by one, on a body built by hand: 8 values in one
 * binade (emax 127, codes 0), 4 bytes of codes, 24 of planes. */
Test(fpack, each_rule_of_the_format_is_checked)
{
	float v[8] = { 1.0f, 1.5f, -1.25f, 1.75f, 1.0f, 1.5f, -1.25f, 1.75f };
	uint8_t b[40];
	size_t len = fpack_encode(b, sizeof b, v, 8);
	cr_assert_eq(len, 29);
	cr_assert_eq(fpack_check(b, len, 8), 0);

	uint8_t m[40];
	memcpy(m, b, len);
	memset(m + 1, 0x11, 4); /* codes 1: no value has emax */
	cr_assert_neq(fpack_check(m, len, 8), 0, "emax that no value has");

	memcpy(m, b, len);
	m[0] = 5;   /* emax 5 */
	m[1] = 0x60; /* value 1's code 6: exponent -1 */
	cr_assert_neq(fpack_check(m, len, 8), 0, "a code above emax");
	m[1] = 0x50; /* code 5: exponent 0, a subnormal: fine */
	cr_assert_eq(fpack_check(m, len, 8), 0, "a code at emax");

	/* An escape whose exponent a code could have said. */
	memcpy(m, b, len);
	m[1] = 0xf0; /* value 1 escapes */
	m[len] = 127 - 14;
	cr_assert_neq(fpack_check(m, len + 1, 8), 0, "an escape 14 below emax");
	m[len] = 127 - 15;
	cr_assert_eq(fpack_check(m, len + 1, 8), 0, "an escape 15 below emax");
	cr_assert_neq(fpack_check(m, len, 8), 0, "an escape without its byte");
	float back[8];
	fpack_decode(back, m, 8);
	cr_assert_eq(bits(back[1]), (bits(1.5f) & 0x807fffffu) | (127u - 15) << 23, "the escape's exponent");
	cr_assert_eq(bits(back[2]), bits(-1.25f));

	/* 7 values: the last byte of codes has an unused high half. */
	size_t l7 = fpack_encode(b, sizeof b, v, 7);
	cr_assert_eq(fpack_check(b, l7, 7), 0);
	b[4] |= 0x10;
	cr_assert_neq(fpack_check(b, l7, 7), 0, "a nonzero unused half");

	/* Not shorter than float32: 2 values, both escaping, 1+1+6+2 = 10
	 * bytes against 8. */
	uint8_t e[16] = { 200, 0xff, 0, 0, 0, 0, 0, 0, 1, 1 };
	cr_assert_neq(fpack_check(e, 10, 2), 0, "longer than float32");
}
