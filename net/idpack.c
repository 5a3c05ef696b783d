/* See idpack.h: ascending row ids as LEB128 varints of their gaps. */
#include "idpack.h"

/* x as a varint at dst (room for 10 bytes); the bytes written. */
static size_t varint_put(uint8_t *dst, uint64_t x)
{
	size_t n = 0;
	while (x >= 0x80) {
		dst[n++] = (uint8_t)(x | 0x80);
		x >>= 7;
	}
	dst[n++] = (uint8_t)x;
	return n;
}

static size_t varint_len(uint64_t x)
{
	size_t n = 1;
	while (x >= 0x80) {
		x >>= 7;
		n++;
	}
	return n;
}

size_t idpack_encode(uint8_t *dst, size_t cap, const uint64_t *ids, size_t n)
{
	size_t at = 0, limit = 8 * n - 1 < cap ? 8 * n - 1 : cap;
	for (size_t i = 0; i < n; i++) {
		if (i && ids[i] <= ids[i - 1])
			return 0;
		uint64_t x = i ? ids[i] - ids[i - 1] - 1 : ids[0];
		if (varint_len(x) > limit - at)
			return 0;
		at += varint_put(dst + at, x);
	}
	return at;
}

/* One varint at src (len bytes left) into *x: its bytes, or 0 if it is
 * unfinished, overlong or past 2^64 - 1. */
static size_t varint_get(const uint8_t *src, size_t len, uint64_t *x)
{
	uint64_t v = 0;
	for (size_t i = 0; i < len && i < 10; i++) {
		uint8_t b = src[i];
		if (i == 9 && b > 1)
			return 0;
		v |= (uint64_t)(b & 0x7f) << (7 * i);
		if (b & 0x80)
			continue;
		if (i && b == 0)
			return 0;
		*x = v;
		return i + 1;
	}
	return 0;
}

int idpack_check(const uint8_t *src, size_t len, size_t n, size_t *used, uint64_t *first, uint64_t *last)
{
	size_t at = 0;
	uint64_t id = 0;
	if (n == 0)
		return -1;
	for (size_t i = 0; i < n; i++) {
		uint64_t x;
		size_t k = varint_get(src + at, len - at, &x);
		if (!k)
			return -1;
		at += k;
		if (i && (x == UINT64_MAX || id > UINT64_MAX - 1 - x))
			return -1;
		id = i ? id + 1 + x : x;
		if (i == 0)
			*first = id;
	}
	if (at >= 8 * n)
		return -1;
	*last = id;
	*used = at;
	return 0;
}

void idpack_decode(uint64_t *dst, const uint8_t *src, size_t n)
{
	size_t at = 0;
	uint64_t id = 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t x = 0;
		at += varint_get(src + at, 10, &x);
		id = i ? id + 1 + x : x;
		dst[i] = id;
	}
}
