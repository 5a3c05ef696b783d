/* PUSH chunks of factors (dtype 4, WIRE_F32F; core/nn/factors.h): a
 * chunk's header as any chunk's, then the run (u32: values from the
 * chunk's offset to the run's end), the batch (u32), k (u32: the values
 * of the run's factor stream this chunk carries), a bitmap of which of
 * them are not +0.0 (bit i % 8 of byte i / 8; the unused bits 0) and
 * those values, float32, in order (none of them +0.0: one writing). A relu's output and most data are
 * half zeros, and they cost a bit each. msg.c's chunk_decode checks a
 * chunk (factors_check below); these write and read them. */
#include "msg.h"
#include "msg_priv.h"
#include "wire.h"

#include "../base/err.h"

#include <errno.h>
#include <string.h>

int msg_encode_chunk_factors(uint8_t *buf, size_t cap, const struct msg_chunk *c, uint32_t run,
			     uint32_t B, size_t k, size_t *len, char *err, size_t errlen)
{
	if (c->type != WIRE_PUSH || c->dtype != WIRE_F32F || c->count == 0 || c->count > msg_chunk_max(WIRE_F32)
	    || run < c->count || B == 0 || k > c->count)
		return err_set(err, errlen, -EINVAL, "PUSH: factors of %u values (a run of %u, batch %u, %zu values)",
			       c->count, run, B, k);
	size_t n = MSG_CHUNK_HDR_BYTES + MSG_FACTORS_HEAD + (k + 7) / 8 + 4 * k;
	int rc = check_cap(cap < MSG_CHUNK_BYTES_MAX ? cap : MSG_CHUNK_BYTES_MAX, n, c->type, err, errlen);
	if (rc < 0)
		return rc;
	chunk_put_head(buf, c);
	wire_put_u32(buf + MSG_CHUNK_HDR_BYTES, run);
	wire_put_u32(buf + MSG_CHUNK_HDR_BYTES + 4, B);
	wire_put_u32(buf + MSG_CHUNK_HDR_BYTES + 8, (uint32_t)k);
	*len = n;
	return 0;
}

void msg_chunk_factors_seal(uint8_t *buf, size_t *len)
{
	size_t k = wire_get_u32(buf + MSG_CHUNK_HDR_BYTES + 8), nb = (k + 7) / 8;
	uint8_t *bits = buf + MSG_CHUNK_HDR_BYTES + MSG_FACTORS_HEAD, *v = bits + nb, *to = v;
	memset(bits, 0, nb);
	for (size_t i = 0; i < k; i++) {
		static const uint8_t zero[4];
		if (!memcmp(v + 4 * i, zero, 4))
			continue;
		bits[i / 8] |= (uint8_t)(1u << (i % 8));
		memmove(to, v + 4 * i, 4);
		to += 4;
	}
	*len = (size_t)(to - buf);
}

int msg_factors_check(const uint8_t *body, size_t n, uint32_t count)
{
	if (n < MSG_FACTORS_HEAD)
		return -EPROTO;
	uint32_t run = wire_get_u32(body), B = wire_get_u32(body + 4);
	size_t k = wire_get_u32(body + 8), nb = (k + 7) / 8, nz = 0;
	if (run < count || B == 0 || k > count || nb > n - MSG_FACTORS_HEAD)
		return -EPROTO;
	const uint8_t *bits = body + MSG_FACTORS_HEAD;
	for (size_t i = 0; i < nb; i++)
		nz += (size_t)__builtin_popcount(bits[i]);
	if (k % 8 && bits[nb - 1] >> (k % 8))
		return -EPROTO;
	if (n != MSG_FACTORS_HEAD + nb + 4 * nz)
		return -EPROTO;
	/* a +0.0 goes in the bitmap only: one writing of each share */
	for (const uint8_t *v = bits + nb; v < body + n; v += 4)
		if (!(v[0] | v[1] | v[2] | v[3]))
			return -EPROTO;
	return 0;
}

void msg_chunk_factors(const struct msg_chunk *c, uint32_t *run, uint32_t *B, size_t *k)
{
	*run = wire_get_u32(c->data);
	*B = wire_get_u32(c->data + 4);
	*k = wire_get_u32(c->data + 8);
}

void msg_chunk_factor_values(float *dst, const struct msg_chunk *c)
{
	size_t k = wire_get_u32(c->data + 8), nb = (k + 7) / 8;
	const uint8_t *bits = c->data + MSG_FACTORS_HEAD, *v = bits + nb;
	for (size_t i = 0; i < k; i++) {
		if (bits[i / 8] >> (i % 8) & 1) {
			wire_get_f32s(dst + i, v, 1);
			v += 4;
		} else {
			dst[i] = 0.0f;
		}
	}
}
