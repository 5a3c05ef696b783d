/* PUSH chunks of factors (dtype 4, WIRE_F32F; core/nn/factors.h): a
 * chunk's header as any chunk's, then the run (u32: values from the
 * chunk's offset to the run's end), the batch (u32) and the chunk's share
 * of the run's factor stream in float32. msg.c's chunk_decode checks
 * them; these write and read them. */
#include "msg.h"
#include "msg_priv.h"
#include "wire.h"

#include "../base/err.h"

#include <errno.h>

int msg_encode_chunk_factors(uint8_t *buf, size_t cap, const struct msg_chunk *c, uint32_t run,
			     uint32_t B, size_t k, size_t *len, char *err, size_t errlen)
{
	if (c->type != WIRE_PUSH || c->dtype != WIRE_F32F || c->count == 0 || c->count > msg_chunk_max(WIRE_F32)
	    || run < c->count || B == 0 || k > c->count)
		return err_set(err, errlen, -EINVAL, "PUSH: factors of %u values (a run of %u, batch %u, %zu values)",
			       c->count, run, B, k);
	size_t n = MSG_CHUNK_HDR_BYTES + MSG_FACTORS_HEAD + 4 * k;
	int rc = check_cap(cap < MSG_CHUNK_BYTES_MAX ? cap : MSG_CHUNK_BYTES_MAX, n, c->type, err, errlen);
	if (rc < 0)
		return rc;
	chunk_put_head(buf, c);
	wire_put_u32(buf + MSG_CHUNK_HDR_BYTES, run);
	wire_put_u32(buf + MSG_CHUNK_HDR_BYTES + 4, B);
	*len = n;
	return 0;
}

void msg_chunk_factors(const struct msg_chunk *c, uint32_t *run, uint32_t *B, const uint8_t **vals,
		       size_t *k)
{
	*run = wire_get_u32(c->data);
	*B = wire_get_u32(c->data + 4);
	*vals = c->data + MSG_FACTORS_HEAD;
	*k = (c->bytes - MSG_FACTORS_HEAD) / 4;
}

