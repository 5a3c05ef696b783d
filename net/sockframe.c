/* Frames on a socket: sealing and writing one, reading and opening one
 * within one deadline (net/sock.h has the API, net/frame.h the bytes).
 * Apart from net/sock.c, which only moves bytes and bounds the time that
 * takes. */
#include "sock.h"
#include "../base/err.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "ring.h"

int sock_stream_read_iov(const struct sock_stream *st, const struct iovec *iov, int n,
			 int timeout_ms, char *err, size_t errlen)
{
	if (st->ring)
		return ring_read_iov(st->ring, iov, n, timeout_ms, err, errlen);
	return sock_read_iov(st->fd, iov, n, timeout_ms, err, errlen);
}

int sock_stream_write_iov(const struct sock_stream *st, const struct iovec *iov, int n,
			  int timeout_ms, char *err, size_t errlen)
{
	if (st->ring)
		return ring_write_iov(st->ring, iov, n, timeout_ms, err, errlen);
	return sock_write_iov(st->fd, iov, n, timeout_ms, err, errlen);
}

static int stream_read_full(const struct sock_stream *st, void *buf, size_t len, int timeout_ms,
			    char *err, size_t errlen)
{
	struct iovec v = { .iov_base = buf, .iov_len = len };
	return sock_stream_read_iov(st, &v, 1, timeout_ms, err, errlen);
}

int sock_write_frame(const struct sock_stream *st, struct frame_key *tx, uint8_t *buf, size_t cap,
		     const uint8_t *msg, size_t len, int timeout_ms, char *err, size_t errlen)
{
	return sock_write_frame_parts(st, tx, buf, cap, msg, len, NULL, 0, timeout_ms, err, errlen);
}

int sock_write_frame_parts(const struct sock_stream *st, struct frame_key *tx, uint8_t *buf, size_t cap,
			   const uint8_t *head, size_t hlen, const uint8_t *body, size_t blen,
			   int timeout_ms, char *err, size_t errlen)
{
	struct frame_iov fo;
	int r = frame_seal_parts(tx, buf, cap, head, hlen, body, blen, &fo, err, errlen);
	if (r < 0)
		return r;
	return sock_stream_write_iov(st, fo.v, fo.n, timeout_ms, err, errlen);
}

int sock_read_sealed(const struct sock_stream *st, uint8_t hdr[FRAME_HDR_BYTES], uint8_t *buf, size_t cap,
		     size_t *ctlen, int timeout_ms, char *err, size_t errlen)
{
	int64_t deadline = sock_deadline(timeout_ms);
	int r = stream_read_full(st, hdr, FRAME_HDR_BYTES, timeout_ms, err, errlen);
	if (r < 0)
		return r;
	r = frame_check_len(hdr, ctlen, err, errlen);
	if (r < 0)
		return r;
	if (*ctlen > cap) {
		snprintf(err, errlen, "frame of %zu bytes does not fit the %zu-byte buffer", *ctlen,
			 cap);
		return -ENOBUFS;
	}
	/* The rest of the same deadline, not a fresh one: a whole frame is
	 * bounded by timeout_ms. */
	int left = sock_ms_left(deadline);
	return stream_read_full(st, buf, *ctlen, left, err, errlen);
}

/* A local frame: its head read first, then the rest where pl says. */
static int read_local(const struct sock_stream *st, struct frame_key *rx, uint8_t *buf, size_t cap,
		      const struct sock_place *pl, uint8_t **placed, size_t *msglen, int timeout_ms,
		      char *err, size_t errlen)
{
	uint8_t hdr[FRAME_HDR_BYTES], tag[FRAME_TAG_BYTES];
	size_t ctlen = 0;
	*placed = NULL;
	int64_t deadline = sock_deadline(timeout_ms);
	int r = stream_read_full(st, hdr, FRAME_HDR_BYTES, timeout_ms, err, errlen);
	if (r < 0)
		return r;
	r = frame_check_len(hdr, &ctlen, err, errlen);
	if (r < 0)
		return r;
	if (ctlen > cap || pl->head > cap)
		return err_set(err, errlen, -ENOBUFS, "frame of %zu bytes does not fit the %zu-byte buffer",
			       ctlen, cap);
	size_t mlen = ctlen - FRAME_TAG_BYTES, got = 0;
	uint8_t *body = NULL;
	/* The head first: nothing goes to the place before the receiver has
	 * seen what the message is. */
	if (mlen > pl->head) {
		r = stream_read_full(st, buf, pl->head, sock_ms_left(deadline), err, errlen);
		if (r < 0)
			return r;
		got = pl->head;
		body = pl->where(pl->ctx, buf, mlen);
	}
	if (!body) {
		r = stream_read_full(st, buf + got, ctlen - got, sock_ms_left(deadline), err, errlen);
		return r < 0 ? r : frame_open(rx, hdr, buf, ctlen, buf, cap, msglen, err, errlen);
	}
	struct iovec v[2] = { { body, mlen - pl->head }, { tag, sizeof tag } };
	r = sock_stream_read_iov(st, v, 2, sock_ms_left(deadline), err, errlen);
	if (r == 0)
		r = frame_open_tag(rx, tag, err, errlen);
	if (r < 0) {
		/* As frame_open: what did not open is not left to be taken
		 * for a message. */
		memset(buf, 0, pl->head);
		memset(body, 0, mlen - pl->head);
		return r;
	}
	*placed = body;
	*msglen = mlen;
	return 0;
}

int sock_read_frame(const struct sock_stream *st, struct frame_key *rx, uint8_t *buf, size_t cap, size_t *msglen,
		    int timeout_ms, char *err, size_t errlen)
{
	uint8_t hdr[FRAME_HDR_BYTES];
	size_t ctlen = 0;
	int r = sock_read_sealed(st, hdr, buf, cap, &ctlen, timeout_ms, err, errlen);
	if (r < 0)
		return r;
	return frame_open(rx, hdr, buf, ctlen, buf, cap, msglen, err, errlen);
}

/* A sealed frame read whole into buf, its head opened ahead for pl->where
 * and the rest opened straight into the place it names: the copy out of
 * buf that a worker's parameters and a ps's pushes would take otherwise.
 * The place holds unauthenticated bytes only until the tag is checked,
 * and zeros after a failure. */
static int read_sealed(const struct sock_stream *st, struct frame_key *rx, uint8_t *buf, size_t cap,
		       const struct sock_place *pl, uint8_t **placed, size_t *msglen, int timeout_ms,
		       char *err, size_t errlen)
{
	uint8_t hdr[FRAME_HDR_BYTES], head[SOCK_PLACE_HEAD_MAX];
	size_t ctlen = 0;
	int r = sock_read_sealed(st, hdr, buf, cap, &ctlen, timeout_ms, err, errlen);
	if (r < 0)
		return r;
	size_t mlen = ctlen - FRAME_TAG_BYTES;
	uint8_t *body = NULL;
	if (pl->head <= sizeof head && mlen > pl->head &&
	    frame_peek(rx, hdr, buf, ctlen, head, pl->head) == 0) {
		body = pl->where(pl->ctx, head, mlen);
		sodium_memzero(head, sizeof head);
	}
	if (!body)
		return frame_open(rx, hdr, buf, ctlen, buf, cap, msglen, err, errlen);
	r = frame_open_split(rx, hdr, buf, ctlen, buf, pl->head, body, msglen, err, errlen);
	if (r == 0)
		*placed = body;
	return r;
}

int sock_read_placed(const struct sock_stream *st, struct frame_key *rx, uint8_t *buf, size_t cap,
		     const struct sock_place *pl, uint8_t **placed, size_t *msglen, int timeout_ms,
		     char *err, size_t errlen)
{
	*placed = NULL;
	if (rx->cipher == FRAME_LOCAL)
		return read_local(st, rx, buf, cap, pl, placed, msglen, timeout_ms, err, errlen);
	if (rx->cipher == FRAME_AEGIS256)
		return read_sealed(st, rx, buf, cap, pl, placed, msglen, timeout_ms, err, errlen);
	return sock_read_frame(st, rx, buf, cap, msglen, timeout_ms, err, errlen);
}
