/* Tests of net/bf16.c: round-to-nearest-even on the ties (both parities,
 * both signs, subnormals), NaN (quiet, sign kept, never an infinity), the
 * infinities, the finite values at the top that must not overflow, zero
 * and subnormals, the exact round trip of every one of the 65536 bf16
 * patterns, every float32 exponent against a reference that rounds with
 * the FPU rather than with bits, the bulk functions against the scalar one
 * at every alignment and length, and the bytes being little-endian. */
#include <criterion/criterion.h>

#include "floatbits.h"
#include "leak.h"

#include <fenv.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../net/bf16.h"

TestSuite(bf16, .fini = leak_check);

static uint16_t narrow(float f)
{
	return bf16_round(bits(f));
}

/* The reference: the nearest bf16 by value, computed in double with the
 * FPU's round-to-nearest-even (bf16 has float32's exponent range, so a
 * float32 value is narrowed by rounding its significand to 8 bits:
 * x + c - c with c = 2^(e+16) * 1.5 for the right e does exactly that in
 * double, where nothing else rounds). NaN and inf are checked elsewhere;
 * here finite in, and the clamp at the top applied by hand. */
static uint16_t reference(float f)
{
	double x = f, a = fabs(x);
	if (a == 0)
		return (uint16_t)(bits(f) >> 16);
	int e;
	frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
	if (e < -125)
		e = -125; /* subnormal: the bf16 grid's spacing stays 2^-133 */
	double ulp = ldexp(1.0, e - 8); /* 8 significant bits */
	double q = nearbyint(a / ulp) * ulp; /* the default mode: ties to even */
	double maxf = (double)flt(0x7f7f0000u);
	if (q > maxf)
		q = maxf; /* finite stays finite: bf16.h */
	uint32_t u = bits((float)q); /* exact: q has at most 8 significant bits */
	cr_assert_eq(u & 0xffffu, 0, "reference of %a not a bf16: %08x", (double)f, u);
	return (uint16_t)((u >> 16) | (x < 0 ? 0x8000u : 0));
}

Test(bf16, ties_round_to_even)
{
	/* 1 + 2^-8 lies halfway between 1 (even mantissa 0) and 1 + 2^-7
	 * (odd): to 1. 1 + 3*2^-8 lies between 1 + 2^-7 (odd) and 1 + 2^-6
	 * (even): up. */
	cr_assert_eq(narrow(1.0f + 0x1p-8f), 0x3f80);
	cr_assert_eq(narrow(1.0f + 3 * 0x1p-8f), 0x3f82);
	cr_assert_eq(narrow(-(1.0f + 0x1p-8f)), 0xbf80);
	cr_assert_eq(narrow(-(1.0f + 3 * 0x1p-8f)), 0xbf82);
	/* Just either side of a tie goes to the nearer. */
	cr_assert_eq(bf16_round(0x3f808000u - 1), 0x3f80);
	cr_assert_eq(bf16_round(0x3f808000u + 1), 0x3f81);
	cr_assert_eq(bf16_round(0x3f818000u), 0x3f82); /* odd below: up to even */
	cr_assert_eq(bf16_round(0x3f817fffu), 0x3f81);
	/* A tie that carries into the exponent: 2 - 2^-8 rounds to 2. */
	cr_assert_eq(bf16_round(0x3fff8000u), 0x4000);
	/* Ties among subnormals: 0x00008000 is halfway between 0 and the
	 * smallest bf16 subnormal 0x0001: to 0 (even); 0x00018000 between
	 * 0x0001 and 0x0002: to 0x0002. */
	cr_assert_eq(bf16_round(0x00008000u), 0x0000);
	cr_assert_eq(bf16_round(0x00018000u), 0x0002);
	cr_assert_eq(bf16_round(0x80008000u), 0x8000);
	/* The largest subnormal rounds up into the smallest normal. */
	cr_assert_eq(bf16_round(0x007fffffu), 0x0080);
}

Test(bf16, nan_stays_a_quiet_nan)
{
	const uint32_t nans[] = {
		0x7fc00000u, /* the default quiet NaN */
		0xffc00000u, /* negative */
		0x7f800001u, /* signalling, payload only in the dropped bits: not inf */
		0xff800001u,
		0x7fa00000u, /* signalling, payload in the kept bits */
		0x7fffffffu, /* all ones: the rounding would carry out */
		0xffffffffu,
		0x7f80ffffu,
	};
	for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
		uint16_t h = bf16_round(nans[i]);
		cr_assert((h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0, "%08x -> %04x: not a NaN",
			  nans[i], h);
		cr_assert(h & 0x40u, "%08x -> %04x: not quiet", nans[i], h);
		cr_assert_eq(h >> 15, nans[i] >> 31, "%08x -> %04x: sign lost", nans[i], h);
		cr_assert(isnan(flt(bf16_widen(h))));
	}
	cr_assert_eq(bf16_round(0x7fa00000u), 0x7fe0); /* payload kept, quiet bit added */
	cr_assert_eq(narrow(nanf("")) & 0x7fffu, 0x7fc0);
}

Test(bf16, infinities_and_the_top)
{
	cr_assert_eq(narrow(INFINITY), 0x7f80);
	cr_assert_eq(narrow(-INFINITY), 0xff80);
	/* The largest finite bf16 and everything finite above it (up to
	 * FLT_MAX, which IEEE rounding would make inf) stay that value. */
	cr_assert_eq(bf16_round(0x7f7f0000u), 0x7f7f);
	cr_assert_eq(bf16_round(0x7f7f7fffu), 0x7f7f);
	cr_assert_eq(bf16_round(0x7f7f8000u), 0x7f7f); /* the tie with inf */
	cr_assert_eq(narrow(FLT_MAX), 0x7f7f);
	cr_assert_eq(narrow(-FLT_MAX), 0xff7f);
	cr_assert(isfinite(flt(bf16_widen(narrow(FLT_MAX)))));
	/* Below the top, a value rounding up into the next binade is not
	 * touched by that clamp. */
	cr_assert_eq(bf16_round(0x7effffffu), 0x7f00);
}

Test(bf16, zeros_and_subnormals)
{
	cr_assert_eq(narrow(0.0f), 0x0000);
	cr_assert_eq(narrow(-0.0f), 0x8000);
	cr_assert_eq(bf16_round(0x00000001u), 0x0000); /* the smallest float32 subnormal */
	cr_assert_eq(bf16_round(0x80000001u), 0x8000);
	cr_assert_eq(bf16_round(0x00010000u), 0x0001); /* a bf16 subnormal, exact */
	cr_assert_eq(bf16_round(0x0001ffffu), 0x0002);
	cr_assert_eq(flt(bf16_widen(0x0001)), 0x1p-133f);
}

/* Every bf16 pattern widens and narrows back to itself, except NaNs,
 * which come back as the same NaN made quiet. */
Test(bf16, every_pattern_round_trips)
{
	for (uint32_t h = 0; h < 65536; h++) {
		uint32_t u = bf16_widen((uint16_t)h);
		cr_assert_eq(u & 0xffffu, 0);
		uint16_t back = bf16_round(u);
		int nan = (h & 0x7f80u) == 0x7f80u && (h & 0x7fu);
		cr_assert_eq(back, nan ? (h | 0x40u) : h, "%04x -> %08x -> %04x", h, u, back);
	}
}

/* Seeded random float32 patterns of every exponent, and the halfway
 * points and their neighbours, against the FPU's rounding. */
Test(bf16, matches_the_reference)
{
	cr_assert_eq(fegetround(), FE_TONEAREST);
	uint64_t s = 0x9e3779b97f4a7c15ull;
	for (uint32_t e = 0; e < 255; e++)
		for (int k = 0; k < 600; k++) {
			s ^= s << 13, s ^= s >> 7, s ^= s << 17;
			uint32_t m = (uint32_t)s & 0x7fffffu;
			if (k < 6) /* the ties and their neighbours, in this binade */
				m = (m & ~0xffffu) | (uint32_t[]){ 0x8000u, 0x7fffu, 0x8001u, 0, 1,
								   0xffffu }[k];
			uint32_t u = (uint32_t)(s >> 40 & 1) << 31 | e << 23 | m;
			uint16_t got = bf16_round(u), want = reference(flt(u));
			cr_assert_eq(got, want, "%08x (%a): %04x, reference %04x", u, (double)flt(u),
				     got, want);
		}
}

/* The bulk loops (vectorized) agree with the scalar rule at every length
 * and alignment, write exactly 2N bytes little-endian, and widen back. */
Test(bf16, bulk_matches_scalar)
{
	enum { MAXN = 67 };
	float src[MAXN], back[MAXN + 1];
	uint8_t buf[2 * MAXN + 8];
	const uint32_t special[] = { 0x7fc00000u, 0xff800000u, 0x7f7fffffu, 0x00008000u,
				     0x3f808000u, 0x80000001u, 0x7f800001u };
	uint64_t s = 7;
	for (int i = 0; i < MAXN; i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		uint32_t u = i < 7 ? special[i] : (uint32_t)s;
		memcpy(&src[i], &u, 4);
	}
	for (size_t off = 0; off < 4; off++)
		for (size_t n = 0; n <= MAXN; n++) {
			memset(buf, 0xee, sizeof buf);
			bf16_from_f32(buf + off, src, n);
			for (size_t i = 0; i < n; i++) {
				uint16_t h = (uint16_t)(buf[off + 2 * i] | buf[off + 2 * i + 1] << 8);
				cr_assert_eq(h, bf16_round(bits(src[i])), "n %zu, element %zu", n, i);
			}
			for (size_t i = off + 2 * n; i < sizeof buf; i++)
				cr_assert_eq(buf[i], 0xee, "wrote past 2N bytes: n %zu, byte %zu", n, i);
			back[n] = 12345.0f;
			bf16_to_f32(back, buf + off, n);
			cr_assert(back[n] == 12345.0f, "widened past N: n %zu", n);
			for (size_t i = 0; i < n; i++) {
				uint16_t h = (uint16_t)(buf[off + 2 * i] | buf[off + 2 * i + 1] << 8);
				cr_assert_eq(bits(back[i]), (uint32_t)h << 16, "n %zu, element %zu", n, i);
			}
		}
	/* 1.0f is 0x3f80: bytes 80 3f on the wire. */
	float one = 1.0f;
	bf16_from_f32(buf, &one, 1);
	cr_assert(buf[0] == 0x80 && buf[1] == 0x3f);
}

/* The reason for the clamp: a finite gradient, whatever its size, stays
 * finite on the wire, so the ps's check (optim_nonfinite) never refuses
 * what the worker checked and found finite. */
Test(bf16, finite_never_becomes_infinite)
{
	for (uint32_t u = 0x7f000000u; u < 0x7f800000u; u += 0x1f3u) {
		cr_assert(isfinite(flt(bf16_widen(bf16_round(u)))), "%08x overflowed", u);
		cr_assert(isfinite(flt(bf16_widen(bf16_round(u | 0x80000000u)))), "-%08x overflowed",
			  u);
	}
	cr_assert(isfinite(flt(bf16_widen(bf16_round(0x7f7fffffu)))));
}
