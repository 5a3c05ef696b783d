/* Tests of net/xdelta.c: every float32 comes back bit for bit from its XOR
 * with a base (small steps, sign flips, NaNs, infinities, zeros, equal
 * values), at every count from 1 to 70 and a whole chunk; a step like
 * training's takes well under fpack's 3.5 bytes; an encoding that would
 * not be shorter than cap is declined; a body from a peer is taken only
 * if it is an encoder's (codes, length and each XOR in its fewest bytes);
 * and XORs applied to values other than their base fail the check rather
 * than leave wrong values passing. */
#include <criterion/criterion.h>

#include "floatbits.h"
#include "leak.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../net/xdelta.h"

TestSuite(xdelta, .fini = leak_check);

#define MAXN 16384

static uint32_t next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return (uint32_t)(*s >> 16);
}

/* base: weights around 0.05; v: base after a step of about rel of itself,
 * with one value in 50 anything at all and one in 97 unchanged. */
static void fill(float *base, float *v, size_t n, float rel, uint64_t seed)
{
	uint64_t s = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		base[i] = 0.05f * ((float)(next(&s) % 20001) / 10000.0f - 1.0f);
		uint32_t r = next(&s);
		if (r % 97 == 0)
			v[i] = base[i];
		else if (r % 50 == 1)
			v[i] = flt(next(&s));
		else
			v[i] = base[i] * (1.0f + rel * ((float)(next(&s) % 2001) / 1000.0f - 1.0f));
	}
}

static size_t round_trip(const float *base, const float *v, size_t n, const char *what)
{
	static uint8_t buf[5 * MAXN + 16];
	static float back[MAXN];
	size_t len = xdelta_encode(buf, 5 * n + 8, v, base, n);
	cr_assert(len >= xdelta_min_bytes(n) && len <= 4 + (n + 3) / 4 + 4 * n, "%s, n %zu: %zu bytes", what,
		  n, len);
	cr_assert_eq(xdelta_check(buf, len, n) == 0, len < 4 * n,
		     "%s, n %zu: check of the encoder's own %zu bytes", what, n, len);
	memcpy(back, base, n * sizeof(float));
	cr_assert_eq(xdelta_apply(back, buf, n), 0, "%s, n %zu: the check failed", what, n);
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(bits(back[i]), bits(v[i]), "%s, n %zu: value %zu is %08x, sent %08x", what, n, i,
			     bits(back[i]), bits(v[i]));
	return len;
}

Test(xdelta, every_value_comes_back_bit_for_bit)
{
	static float base[MAXN], v[MAXN];
	for (size_t n = 1; n <= 70; n++) {
		fill(base, v, n, 1e-3f, n);
		round_trip(base, v, n, "step");
	}
	fill(base, v, MAXN, 1e-3f, 99);
	round_trip(base, v, MAXN, "step chunk");
	fill(base, v, MAXN, 1.0f, 5);
	round_trip(base, v, MAXN, "large steps");
	memcpy(v, base, sizeof(v));
	size_t same = round_trip(base, v, MAXN, "unchanged");
	cr_assert_eq(same, xdelta_min_bytes(MAXN), "unchanged values: %zu bytes", same);
	const uint32_t special[] = { 0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f800000u,
				     0xff800000u, 0x7fc00000u, 0xffc12345u, 0x7f800001u, 0x3f800000u };
	size_t ns = sizeof(special) / sizeof(special[0]);
	for (size_t i = 0; i < ns; i++)
		for (size_t j = 0; j < ns; j++) {
			base[i * ns + j] = flt(special[i]);
			v[i * ns + j] = flt(special[j]);
		}
	round_trip(base, v, ns * ns, "specials");
}

/* Training's steps: a thousandth of each weight moves 14 or so low bits,
 * two bytes and a bit a value with the codes and a few that jump. */
Test(xdelta, a_small_step_takes_well_under_packed_float32)
{
	static float base[MAXN], v[MAXN];
	fill(base, v, MAXN, 1e-3f, 3);
	size_t len = round_trip(base, v, MAXN, "step");
	double per = (double)len / MAXN;
	cr_log_info("a step of 1e-3: %.3f bytes a value", per);
	cr_assert_lt(per, 2.9, "%.3f bytes a value", per);
}

Test(xdelta, declines_what_does_not_fit)
{
	static float base[64], v[64];
	static uint8_t buf[5 * 64 + 8];
	for (size_t i = 0; i < 64; i++) {
		base[i] = flt(0x3f800000u);
		v[i] = flt(0xbf912345u); /* every XOR takes 4 bytes */
	}
	cr_assert_eq(xdelta_encode(buf, 4 * 64 - 1, v, base, 64), 0, "a body longer than float32");
	cr_assert_gt(xdelta_encode(buf, sizeof(buf), v, base, 64), 0);
	cr_assert_eq(xdelta_encode(buf, xdelta_min_bytes(64) - 1, base, base, 64), 0, "below the fewest");
	cr_assert_eq(xdelta_encode(buf, sizeof(buf), v, base, 0), 0, "no values");
}

Test(xdelta, each_rule_of_the_format_is_checked)
{
	static float base[40], v[40];
	static uint8_t buf[5 * 40 + 8];
	fill(base, v, 39, 1e-3f, 11);
	size_t n = 39, len = xdelta_encode(buf, 4 * n - 1, v, base, n);
	cr_assert_gt(len, 0);
	cr_assert_eq(xdelta_check(buf, len, n), 0);
	cr_assert_eq(xdelta_check(buf, len - 1, n), -1, "a byte short");
	cr_assert_eq(xdelta_check(buf, len, n + 1), -1, "another count");
	cr_assert_eq(xdelta_check(buf, len, 0), -1, "no values");
	cr_assert_eq(xdelta_check(buf, 4 * n, n), -1, "not shorter than float32");
	/* the unused code after the last value (39 = 9 * 4 + 3) */
	uint8_t *codes = buf + 4;
	codes[9] |= 0xc0;
	cr_assert_eq(xdelta_check(buf, len, n), -1, "an unused code set");
	codes[9] &= 0x3f;
	/* a two-byte XOR written in three bytes: find a code 1, make it 2
	 * and put a zero byte after that value's bytes */
	size_t at = 0, i;
	for (i = 0; i < n && ((codes[i / 4] >> (2 * (i % 4))) & 3u) != 1u; i++)
		at += ((codes[i / 4] >> (2 * (i % 4))) & 3u) + 1;
	cr_assert_lt(i, n, "no two-byte XOR in the sample");
	uint8_t *p = codes + (n + 3) / 4 + at;
	uint8_t wide[5 * 40 + 8];
	size_t head = (size_t)(p - buf) + 2;
	memcpy(wide, buf, head);
	wide[head] = 0;
	memcpy(wide + head + 1, buf + head, len - head);
	wide[4 + i / 4] = (uint8_t)(wide[4 + i / 4] + (1u << (2 * (i % 4))));
	cr_assert_eq(xdelta_check(wide, len + 1, n), -1, "an XOR not in its fewest bytes");
	wide[head] = 1;
	cr_assert_eq(xdelta_check(wide, len + 1, n), 0, "the same widening, its top byte set, is well formed");
}

/* Applied to other values than its base, a body fails its check (and a
 * changed body too): a worker never takes values the ps did not have. */
Test(xdelta, a_wrong_base_fails_the_check)
{
	static float base[MAXN], v[MAXN], other[MAXN];
	static uint8_t buf[5 * MAXN + 8];
	fill(base, v, MAXN, 1e-3f, 21);
	size_t len = xdelta_encode(buf, 4 * MAXN - 1, v, base, MAXN);
	cr_assert_gt(len, 0);
	for (size_t k = 0; k < 200; k++) {
		memcpy(other, base, sizeof(other));
		size_t i = (k * 7919) % MAXN;
		uint32_t u = bits(other[i]) ^ (1u << (k % 32));
		other[i] = flt(u);
		cr_assert_eq(xdelta_apply(other, buf, MAXN), -1, "base bit %zu of value %zu changed", k % 32, i);
	}
	/* two values swapped */
	memcpy(other, base, sizeof(other));
	other[5] = base[6];
	other[6] = base[5];
	if (bits(base[5]) != bits(base[6]))
		cr_assert_eq(xdelta_apply(other, buf, MAXN), -1, "two base values swapped");
	memcpy(other, base, sizeof(other));
	buf[len - 1] ^= 0x01; /* the last XOR's low bit */
	cr_assert_eq(xdelta_apply(other, buf, MAXN), -1, "a changed XOR");
}
