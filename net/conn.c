/* See conn.h. */
#include "conn.h"
#include "../base/err.h"
#include "sock.h"

#include <errno.h>

int conn_send(int fd, struct frame_key *tx, uint8_t *buf, size_t cap, size_t len, int timeout_ms,
	      char *err, size_t errlen)
{
	return sock_write_frame(fd, tx, buf, cap, conn_msg(buf), len, timeout_ms, err, errlen);
}

void conn_send_error(int fd, struct frame_key *tx, uint8_t *buf, size_t cap, uint32_t code,
		     const char *text, int timeout_ms)
{
	char e[128];
	size_t len;
	if (msg_encode_error(conn_msg(buf), conn_msg_cap(cap), code, text, &len, e, sizeof(e)) == 0)
		(void)!conn_send(fd, tx, buf, cap, len, timeout_ms, e, sizeof(e));
}

int conn_chunk_encode(void *ctx, uint64_t i, uint8_t *msg, size_t cap, size_t *len, char *err,
		      size_t errlen)
{
	const struct conn_chunk_tx *t = ctx;
	struct msg_chunk ch = { .type = t->type, .shard = t->shard, .version = t->version,
				.worker = t->worker };
	msg_chunk_range(t->n, i, &ch.offset, &ch.count);
	return msg_encode_chunk(msg, cap, &ch, t->src + ch.offset, len, err, errlen);
}

int conn_chunk_deliver(void *ctx, uint64_t i, const uint8_t *msg, size_t len, char *err,
		       size_t errlen)
{
	struct conn_chunk_rx *x = ctx;
	struct msg_chunk ch;
	struct msg_error me;
	(void)i;
	x->bad = 1;
	int r = msg_type(msg, len, err, errlen);
	if (r == WIRE_ERROR && x->type == WIRE_PARAMS)
		return msg_decode_error(msg, len, &me, err, errlen) ? -EPROTO
			: err_set(err, errlen, -ECONNABORTED, "%s", me.text);
	if (r < 0)
		return r;
	if (r != x->type)
		return err_set(err, errlen, -EPROTO, "unexpected %s message in a %s tensor",
			       wire_msg_name((uint8_t)r), wire_msg_name(x->type));
	r = msg_decode_chunk(msg, len, &ch, err, errlen);
	if (r < 0)
		return r;
	if (x->type == WIRE_PUSH && ch.worker != x->worker)
		return err_set(err, errlen, -EPROTO, "PUSH names worker %u on worker %u's connection",
			       ch.worker, x->worker);
	r = msg_assembly_add(x->a, &ch, x->dst, err, errlen);
	if (r < 0)
		return r;
	x->bad = 0;
	return 0;
}
