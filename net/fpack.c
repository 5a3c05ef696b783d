/* See fpack.h. Each direction is a loop over the planes that gcc
 * vectorizes, and a second pass for the escapes only when there are any
 * (their places depend on the codes before them). */
#include "fpack.h"

#include <string.h>

/* AVX2 and AVX-512 copies picked at load time, as in net/bf16.c. */
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

#define FPACK_ESCAPE 15u

static inline uint32_t bits_of(const float *p)
{
	uint32_t u;
	memcpy(&u, p, sizeof u);
	return u;
}

static inline uint32_t code_of(uint32_t u, uint32_t emax)
{
	uint32_t d = emax - ((u >> 23) & 0xffu);
	return d < FPACK_ESCAPE ? d : FPACK_ESCAPE;
}

/* A value's byte of the high plane: mantissa bits 16-22, then its sign. */
static inline uint8_t high_of(uint32_t u)
{
	return (uint8_t)(((u >> 16) & 0x7fu) | ((u >> 24) & 0x80u));
}

/* The value of low half l, high byte h and code c (an escape's exponent
 * is put in afterwards). */
static inline uint32_t value_of(uint32_t l, uint32_t h, uint32_t c, uint32_t emax)
{
	return l | (h & 0x7fu) << 16 | (h & 0x80u) << 24 | ((emax - c) & 0xffu) << 23;
}

VECTOR_CLONES static uint32_t exponent_max(const float *src, size_t N)
{
	uint32_t m = 0;
	for (size_t i = 0; i < N; i++) {
		uint32_t e = (bits_of(src + i) >> 23) & 0xffu;
		m = e > m ? e : m;
	}
	return m;
}

/* The codes, the low halves and the high bytes of values 2i and 2i+1 (N
 * even here); returns the escapes. */
VECTOR_CLONES static size_t planes_fill(uint8_t *codes, uint8_t *lo, uint8_t *hi, const float *src,
					size_t N, uint32_t emax)
{
	size_t esc = 0;
	for (size_t i = 0; i < N / 2; i++) {
		uint32_t u0 = bits_of(src + 2 * i), u1 = bits_of(src + 2 * i + 1);
		uint32_t c0 = code_of(u0, emax), c1 = code_of(u1, emax);
		uint32_t l = (u0 & 0xffffu) | u1 << 16; /* the wire is little-endian, like the host */
		memcpy(lo + 4 * i, &l, sizeof l);
		hi[2 * i] = high_of(u0);
		hi[2 * i + 1] = high_of(u1);
		codes[i] = (uint8_t)(c0 | c1 << 4);
		esc += (c0 == FPACK_ESCAPE) + (c1 == FPACK_ESCAPE);
	}
	return esc;
}

size_t fpack_encode(uint8_t *dst, size_t cap, const float *src, size_t N)
{
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
	return 0; /* the planes are written in host order: float32 instead */
#endif
	if (N == 0 || cap < fpack_min_bytes(N))
		return 0;
	uint32_t emax = exponent_max(src, N);
	uint8_t *codes = dst + 1, *lo = codes + (N + 1) / 2, *hi = lo + 2 * N, *esc = hi + N;
	size_t nesc = planes_fill(codes, lo, hi, src, N - N % 2, emax);
	if (N % 2) {
		uint32_t u = bits_of(src + N - 1), c = code_of(u, emax);
		uint16_t l = (uint16_t)u;
		memcpy(lo + 2 * (N - 1), &l, sizeof l);
		hi[N - 1] = high_of(u);
		codes[N / 2] = (uint8_t)c;
		nesc += c == FPACK_ESCAPE;
	}
	if (nesc > cap - fpack_min_bytes(N))
		return 0;
	dst[0] = (uint8_t)emax;
	for (size_t i = 0; nesc && i < N; i++)
		if (code_of(bits_of(src + i), emax) == FPACK_ESCAPE)
			*esc++ = (uint8_t)((bits_of(src + i) >> 23) & 0xffu);
	return (size_t)(esc - dst);
}

/* Escapes among the codes; *bad if another code is above emax (an
 * exponent below 0), *zero if some code is 0 (a value has emax). */
VECTOR_CLONES static size_t codes_scan(const uint8_t *codes, size_t nbytes, uint32_t emax, int *bad,
				       int *zero)
{
	size_t esc = 0;
	uint32_t over = 0, low = 0;
	for (size_t i = 0; i < nbytes; i++) {
		uint32_t a = codes[i] & 0xfu, b = codes[i] >> 4;
		esc += (a == FPACK_ESCAPE) + (b == FPACK_ESCAPE);
		over |= (a != FPACK_ESCAPE && a > emax) | (b != FPACK_ESCAPE && b > emax);
		low |= (a == 0) | (b == 0);
	}
	*bad = over != 0;
	*zero = low != 0;
	return esc;
}

int fpack_check(const uint8_t *src, size_t len, size_t N)
{
	if (N == 0 || N > (SIZE_MAX - 2) / 4 || len < fpack_min_bytes(N) || len >= 4 * N)
		return -1;
	uint32_t emax = src[0];
	const uint8_t *codes = src + 1;
	int bad, zero;
	size_t esc = codes_scan(codes, N / 2, emax, &bad, &zero);
	if (N % 2) {
		/* The last value in the low half, the high one unused and 0. */
		uint32_t c = codes[N / 2];
		if (c >> 4)
			return -1;
		esc += c == FPACK_ESCAPE;
		bad |= c != FPACK_ESCAPE && c > emax;
		zero |= c == 0;
	}
	if (bad || !zero || len != fpack_min_bytes(N) + esc)
		return -1;
	for (size_t i = fpack_min_bytes(N); i < len; i++)
		if (src[i] + FPACK_ESCAPE > emax)
			return -1;
	return 0;
}

/* Values 2i and 2i+1 (N even here); returns the escapes, whose
 * exponents come in the next pass. */
VECTOR_CLONES static size_t planes_read(float *dst, const uint8_t *codes, const uint8_t *lo,
					const uint8_t *hi, size_t N, uint32_t emax)
{
	size_t esc = 0;
	for (size_t i = 0; i < N / 2; i++) {
		uint32_t c0 = codes[i] & 0xfu, c1 = codes[i] >> 4, l;
		memcpy(&l, lo + 4 * i, sizeof l);
		uint32_t u0 = value_of(l & 0xffffu, hi[2 * i], c0, emax);
		uint32_t u1 = value_of(l >> 16, hi[2 * i + 1], c1, emax);
		memcpy(dst + 2 * i, &u0, sizeof u0);
		memcpy(dst + 2 * i + 1, &u1, sizeof u1);
		esc += (c0 == FPACK_ESCAPE) + (c1 == FPACK_ESCAPE);
	}
	return esc;
}

void fpack_decode(float *dst, const uint8_t *src, size_t N)
{
	uint32_t emax = src[0];
	const uint8_t *codes = src + 1, *lo = codes + (N + 1) / 2, *hi = lo + 2 * N, *esc = hi + N;
	size_t nesc = planes_read(dst, codes, lo, hi, N - N % 2, emax);
	if (N % 2) {
		uint16_t l;
		memcpy(&l, lo + 2 * (N - 1), sizeof l);
		uint32_t c = codes[N / 2] & 0xfu, u = value_of(l, hi[N - 1], c, emax);
		memcpy(dst + N - 1, &u, sizeof u);
		nesc += c == FPACK_ESCAPE;
	}
	size_t nbytes = nesc ? (N + 1) / 2 : 0;
	for (size_t i = 0; i < nbytes; i++) {
		if ((codes[i] & 0xfu) != FPACK_ESCAPE && (codes[i] >> 4) != FPACK_ESCAPE)
			continue;
		for (size_t j = 2 * i; j < 2 * i + 2 && j < N; j++) {
			if (((codes[i] >> (4 * (j % 2))) & 0xfu) != FPACK_ESCAPE)
				continue;
			uint32_t u = bits_of(dst + j);
			u = (u & 0x807fffffu) | (uint32_t)*esc++ << 23;
			memcpy(dst + j, &u, sizeof u);
		}
	}
}
