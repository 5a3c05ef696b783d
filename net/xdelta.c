/* See xdelta.h. One pass each way; the whole-word loads and stores past a
 * value's own bytes stay inside the body (the last few values go byte by
 * byte), so nothing is read or written outside it. */
#include "xdelta.h"
#include "wire.h"

#include <string.h>

static inline uint32_t bits_of(const float *p)
{
	uint32_t u;
	memcpy(&u, p, sizeof u);
	return u;
}

static inline uint32_t code_at(const uint8_t *codes, size_t i)
{
	return (codes[i / 4] >> (2 * (i % 4))) & 3u;
}

uint32_t xdelta_sum(const float *v, size_t N)
{
	uint32_t s = 0;
	for (size_t i = 0; i < N; i++)
		s += bits_of(v + i) * (uint32_t)(2 * i + 1);
	return s;
}

/* Bytes an XOR takes, without a branch: 1 for 0. */
static inline unsigned xor_len(uint32_t x)
{
	return ((31u - (unsigned)__builtin_clz(x | 1u)) >> 3) + 1u;
}

/* One value's XOR at out, its code into *cb at slot k: whole-word store
 * where 4 bytes are left, else byte by byte. */
static inline uint8_t *put_xor(uint8_t *out, size_t room, uint32_t x, unsigned k, uint8_t *cb)
{
	unsigned n = xor_len(x);
	if (room >= 4)
		memcpy(out, &x, 4); /* the bytes past n are overwritten by the next value */
	else
		for (unsigned b = 0; b < n; b++)
			out[b] = (uint8_t)(x >> (8 * b));
	*cb |= (uint8_t)((n - 1) << (2 * k));
	return out + n;
}

size_t xdelta_encode(uint8_t *dst, size_t cap, const float *src, const float *base, size_t N)
{
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
	return 0; /* whole-word stores below are little-endian: the caller sends another way */
#endif
	size_t nc = (N + 3) / 4, i = 0;
	if (N == 0 || cap < xdelta_min_bytes(N))
		return 0;
	uint8_t *codes = dst + 4, *out = codes + nc, *end = dst + cap;
	/* Groups of 4 with room for 4 whole words: no check per value. */
	for (; i + 4 <= N && end - out >= 16; i += 4) {
		uint8_t cb = 0;
		for (unsigned k = 0; k < 4; k++)
			out = put_xor(out, 16, bits_of(src + i + k) ^ bits_of(base + i + k), k, &cb);
		codes[i / 4] = cb;
	}
	memset(codes + i / 4, 0, nc - i / 4);
	for (; i < N; i++) {
		uint32_t x = bits_of(src + i) ^ bits_of(base + i);
		if ((size_t)(end - out) < xor_len(x))
			return 0;
		out = put_xor(out, (size_t)(end - out), x, (unsigned)(i % 4), &codes[i / 4]);
	}
	wire_put_u32(dst, xdelta_sum(src, N));
	return (size_t)(out - dst);
}

int xdelta_check(const uint8_t *src, size_t len, size_t N)
{
	if (N == 0 || N > (SIZE_MAX - 8) / 4 || len < xdelta_min_bytes(N) || len >= 4 * N)
		return -1;
	size_t nc = (N + 3) / 4;
	const uint8_t *codes = src + 4, *p = codes + nc;
	if (N % 4 && codes[nc - 1] >> (2 * (N % 4)))
		return -1;
	size_t avail = len - 4 - nc, at = 0, i = 0;
	/* Groups of 4 whose 16 bytes at most are there: no bound per value. */
	uint32_t wide = 0;
	for (; i + 4 <= N && avail - at >= 16; i += 4) {
		uint32_t cb = codes[i / 4];
		for (uint32_t k = 0; k < 4; k++) {
			size_t n = ((cb >> (2 * k)) & 3u) + 1;
			wide |= (n > 1) & (p[at + n - 1] == 0);
			at += n;
		}
	}
	if (wide)
		return -1;
	for (; i < N; i++) {
		size_t n = code_at(codes, i) + 1;
		if (n > avail - at || (n > 1 && p[at + n - 1] == 0))
			return -1;
		at += n;
	}
	return at == avail ? 0 : -1;
}

/* Bytes of the values of a checked body: its codes say (a code after the
 * last value is 0, one byte, so take those out). */
static size_t values_bytes(const uint8_t *codes, size_t N)
{
	size_t nc = (N + 3) / 4, t = 0;
	for (size_t i = 0; i < nc; i++) {
		uint32_t b = codes[i];
		t += (b & 3u) + ((b >> 2) & 3u) + ((b >> 4) & 3u) + (b >> 6);
	}
	return t + N;
}

/* One value: its XOR (c + 1 bytes at p) into *d, the result added to
 * the check with weight w. */
static inline uint32_t take_xor(float *d, const uint8_t *p, const uint8_t *end, uint32_t c, uint32_t w)
{
	static const uint32_t mask[4] = { 0xffu, 0xffffu, 0xffffffu, 0xffffffffu };
	uint32_t x = 0;
	if (end - p >= 4) {
		memcpy(&x, p, 4);
		x &= mask[c];
	} else {
		for (uint32_t b = 0; b <= c; b++)
			x |= (uint32_t)p[b] << (8 * b);
	}
	uint32_t u = bits_of(d) ^ x;
	memcpy(d, &u, sizeof u);
	return u * w;
}

int xdelta_apply(float *dst, const uint8_t *src, size_t N)
{
	size_t nc = (N + 3) / 4, i = 0;
	const uint8_t *codes = src + 4, *p = codes + nc, *end = p + values_bytes(codes, N);
	uint32_t want = wire_get_u32(src), s = 0;
	for (; i + 4 <= N && end - p >= 16; i += 4) {
		uint32_t cb = codes[i / 4];
		for (uint32_t k = 0; k < 4; k++) {
			uint32_t c = (cb >> (2 * k)) & 3u;
			s += take_xor(dst + i + k, p, end, c, (uint32_t)(2 * (i + k) + 1));
			p += c + 1;
		}
	}
	for (; i < N; i++) {
		uint32_t c = code_at(codes, i);
		s += take_xor(dst + i, p, end, c, (uint32_t)(2 * i + 1));
		p += c + 1;
	}
	return s == want ? 0 : -1;
}
