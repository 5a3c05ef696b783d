/* Ordered frames, parallel crypto (see pipe.h for the contract and
 * docs/PROTOCOL.md for why the bytes do not change).
 *
 * A call keeps a window of nslots frames: frame i lives in slot i % nslots.
 * Sending, the window is filled with seal jobs; the calling thread waits for
 * the oldest, writes it, and refills its slot with the next frame, so
 * writing frame i overlaps sealing frames i+1.. on the pool. Receiving, the
 * calling thread reads frames into free slots and queues their opening, and
 * hands finished ones to the caller in order, as soon as the oldest is open.
 *
 * Each job gets its own copy of the direction's frame_key with the counter
 * set to base + i: frame_key is single-threaded, and a copy per job is what
 * lets frame i be sealed before frame i-1 without changing its nonce. The
 * copies live in the pipe's key pages (one per slot, sodium_malloc'd once
 * by pipe_init, not per call: a ps moves many tensors a second), and each
 * job wipes its own as soon as it has sealed or opened its frame. Every
 * failure path first waits for the jobs still running (they use the slots'
 * buffers), then reports the failure of the earliest frame: what went
 * wrong first on the wire is what the log says.
 *
 * The window is one frame per pool thread plus the one on the wire:
 * enough to keep every thread busy with one connection, and what the
 * memory figure in pipe.h promises.
 *
 * Frames received one at a time may have their bodies put straight into
 * the destination (pipe_place): the receiver knows where the next chunk's
 * values go once it has seen the chunk's header, and checks that header
 * again before the values count as received. Local frames (FRAME_LOCAL,
 * always one at a time) are read there; AEGIS-256 frames are read whole
 * and opened there, their header opened ahead (sock_read_placed). The
 * values sit unauthenticated in the tensor's unreceived part only until
 * the tag is checked, and are zeroed when it fails, as a failed local
 * read zeroes them: nothing counts them as received before.
 *
 * Frames opened on the pool are placed too where the receiver can say
 * where message i goes before the messages ahead of it are delivered
 * (pipe_place.ahead: the chunk expected at position i, every one before
 * it having been the chunk expected at its own): a pool thread opens its
 * header ahead, asks, and opens the values there; delivery, in order,
 * checks the header against the assembly as for any placed frame.
 *
 * Rejected: placing frames opened on the pool from where (its place
 * depends on the chunks delivered before, in order, and a pool thread
 * opens frame i before frame i-1 is delivered); placing for AES-256-GCM and
 * ChaCha20-Poly1305, whose libsodium calls open into one buffer; a
 * window larger than threads + 1 (more memory per connection, no more
 * cores). */
#include "pipe.h"
#include "../base/err.h"
#include "sock.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

struct pipe_slot {
	struct cryptopool_job job;
	uint8_t *buf; /* FRAME_BYTES_MAX */
	struct frame_key *k; /* in p->keys */
	uint64_t i;
	pipe_encode_fn enc; /* sealing */
	void *ctx;
	uint8_t hdr[FRAME_HDR_BYTES]; /* opening: the frame's header */
	const struct pipe_place *pl;  /* opening: NULL, or where values may go */
	uint8_t *body;                /* opened: NULL, or where its values went */
	struct frame_iov fo; /* sealed: the frame's parts */
	size_t len; /* read: ciphertext bytes; opened: message bytes */
	int rc;
	char err[320];
};

int pipe_init(struct pipe *p, struct cryptopool *pool, uint8_t *buf, size_t bufcap, char *err,
	      size_t errlen)
{
	memset(p, 0, sizeof *p);
	if (bufcap < FRAME_BYTES_MAX)
		return err_set(err, errlen, -EINVAL, "pipe buffer of %zu bytes, need %zu", bufcap,
			       (size_t)FRAME_BYTES_MAX);
	if (pool && cryptopool_size(pool) > 1) {
		size_t n = (size_t)cryptopool_size(pool) + 1; /* the most slots a call uses */
		p->keys = sodium_allocarray(n, sizeof *p->keys);
		if (!p->keys)
			return err_set(err, errlen, -ENOMEM, "out of memory for %zu session key copies",
				       n);
		sodium_memzero(p->keys, n * sizeof *p->keys); /* sodium_malloc fills 0xdb */
	}
	p->pool = pool;
	p->buf = buf;
	pthread_cond_init(&p->wake, NULL);
	return 0;
}

void pipe_free(struct pipe *p)
{
	if (!p || !p->buf)
		return;
	for (int s = 1; s < p->nslots; s++)
		free(p->slots[s].buf);
	free(p->slots);
	sodium_free(p->keys); /* wipes */
	pthread_cond_destroy(&p->wake);
	memset(p, 0, sizeof *p);
}

static int parallel(const struct pipe *p, const struct frame_key *k, uint64_t nframes)
{
	/* A local frame (a Unix socket on one host) is not sealed: its body
	 * goes out from where it is and is read in place, so a pool thread
	 * would only check its counter, at the cost of two wake-ups a frame
	 * (a GPU worker's 16-CPU host spent them on every local frame). */
	return p->pool && cryptopool_size(p->pool) > 1 && nframes > 1 && k->cipher != FRAME_LOCAL;
}

/* The window: one slot per pool thread plus the frame on the wire, but no
 * more than the tensor has frames (a ps shard of 3 chunks never pays for 9
 * buffers). Grows, keeping the buffers it has, when a later tensor is
 * longer; only between calls, when no job uses a slot. */
static int slots_ready(struct pipe *p, uint64_t nframes, char *err, size_t errlen)
{
	uint64_t w = (uint64_t)cryptopool_size(p->pool) + 1;
	int want = (int)(nframes < w ? nframes : w);
	if (p->nslots >= want)
		return 0;
	struct pipe_slot *s = calloc((size_t)want, sizeof *s);
	if (!s)
		return err_set(err, errlen, -ENOMEM, "out of memory for %d frame buffers", want);
	s[0].buf = p->buf;
	for (int i = 1; i < p->nslots; i++)
		s[i].buf = p->slots[i].buf;
	for (int i = 0; i < want; i++)
		s[i].k = &p->keys[i];
	for (int i = p->nslots > 1 ? p->nslots : 1; i < want; i++) {
		s[i].buf = malloc(FRAME_BYTES_MAX);
		if (!s[i].buf) {
			while (--i >= (p->nslots > 1 ? p->nslots : 1))
				free(s[i].buf);
			free(s);
			return err_set(err, errlen, -ENOMEM, "out of memory for %d frame buffers",
				       want);
		}
	}
	free(p->slots);
	p->slots = s;
	p->nslots = want;
	return 0;
}

static void seal_run(void *arg)
{
	struct pipe_slot *s = arg;
	struct pipe_msg m = { 0 };
	uint8_t *msg = s->buf + FRAME_HDR_BYTES;
	s->rc = s->enc(s->ctx, s->i, msg, FRAME_MAX, &m, s->err, sizeof s->err);
	if (s->rc == 0)
		s->rc = frame_seal_parts(s->k, s->buf, FRAME_BYTES_MAX, msg, m.len, m.body, m.blen,
					 &s->fo, s->err, sizeof s->err);
	frame_key_wipe(s->k);
}

/* Where the values of the frame in s go, from its head opened ahead
 * (not authenticated yet) and pl->ahead; NULL: into the slot. */
static uint8_t *slot_place(struct pipe_slot *s)
{
	uint8_t head[SOCK_PLACE_HEAD_MAX];
	size_t hl = s->pl->at.head, mlen = s->len - FRAME_TAG_BYTES;
	if (hl > sizeof head || mlen <= hl || /* len >= FRAME_CT_MIN: sock_read_sealed */
	    frame_peek(s->k, s->hdr, s->buf, s->len, head, hl))
		return NULL;
	uint8_t *b = s->pl->ahead(s->ctx, s->i, head, mlen);
	sodium_memzero(head, sizeof head);
	return b;
}

static void open_run(void *arg)
{
	struct pipe_slot *s = arg;
	s->body = s->pl ? slot_place(s) : NULL;
	if (s->body)
		s->rc = frame_open_split(s->k, s->hdr, s->buf, s->len, s->buf, s->pl->at.head,
					 s->body, &s->len, s->err, sizeof s->err);
	else
		s->rc = frame_open(s->k, s->hdr, s->buf, s->len, s->buf, FRAME_BYTES_MAX, &s->len,
				   s->err, sizeof s->err);
	frame_key_wipe(s->k);
}

static void slot_submit(struct pipe *p, struct pipe_slot *s, const struct frame_key *k,
			uint64_t i, void (*run)(void *))
{
	*s->k = *k;
	s->k->counter = k->counter + i;
	s->i = i;
	s->rc = 0;
	s->err[0] = '\0';
	s->job.run = run;
	s->job.arg = s;
	cryptopool_submit(p->pool, &s->job, &p->wake);
}

/* Waits for the jobs of frames [from, to) (each wiped its key copy). */
static void slots_drain(struct pipe *p, uint64_t from, uint64_t to)
{
	for (uint64_t i = from; i < to; i++)
		cryptopool_wait(p->pool, &p->slots[i % (uint64_t)p->nslots].job);
}

/* ---- sending ------------------------------------------------------------- */

static int send_serial(struct pipe *p, const struct sock_stream *st, struct frame_key *tx, uint64_t nframes,
		       pipe_encode_fn enc, void *ctx, int timeout_ms, char *err, size_t errlen)
{
	uint8_t *msg = p->buf + FRAME_HDR_BYTES;
	for (uint64_t i = 0; i < nframes; i++) {
		struct pipe_msg m = { 0 };
		int r = enc(ctx, i, msg, FRAME_MAX, &m, err, errlen);
		if (r < 0)
			return r;
		r = sock_write_frame_parts(st, tx, p->buf, FRAME_BYTES_MAX, msg, m.len, m.body, m.blen,
					   timeout_ms, err, errlen);
		if (r < 0)
			return r;
	}
	return 0;
}

int pipe_send(struct pipe *p, const struct sock_stream *st, struct frame_key *tx, uint64_t nframes,
	      pipe_encode_fn enc, void *ctx, int timeout_ms, char *err, size_t errlen)
{
	if (!parallel(p, tx, nframes))
		return send_serial(p, st, tx, nframes, enc, ctx, timeout_ms, err, errlen);
	int r = slots_ready(p, nframes, err, errlen);
	if (r < 0)
		return r;
	if (nframes > UINT64_MAX - tx->counter)
		return err_set(err, errlen, -EOVERFLOW,
			       "send counter exhausted: the session must be rekeyed");
	uint64_t K = (uint64_t)p->nslots, queued = 0, sent = 0;
	for (; sent < nframes; sent++) {
		for (; queued < nframes && queued - sent < K; queued++) {
			struct pipe_slot *s = &p->slots[queued % K];
			s->enc = enc;
			s->ctx = ctx;
			slot_submit(p, s, tx, queued, seal_run);
		}
		struct pipe_slot *s = &p->slots[sent % K];
		cryptopool_wait(p->pool, &s->job);
		if (s->rc < 0) {
			r = err_set(err, errlen, s->rc, "%s", s->err);
			break;
		}
		r = sock_stream_write_iov(st, s->fo.v, s->fo.n, timeout_ms, err, errlen);
		if (r < 0)
			break;
	}
	/* On failure, frame `sent` was waited for already (or never queued). */
	slots_drain(p, sent < nframes ? sent + 1 : sent, queued);
	/* Past every nonce a job was given, not only past the frames written
	 * whole: a write that failed part way has put some of frame `sent`
	 * on the wire, and sealing anything else under its nonce (an ERROR
	 * from another thread, say) would give away the key's authenticity
	 * (AES-GCM) or a keystream (all three). The serial path moves past a
	 * frame as it seals it, so both paths agree. */
	tx->counter += queued;
	return r < 0 ? r : 0;
}

/* ---- receiving ----------------------------------------------------------- */

/* Message i, its body placed where pl says if it can be. */
static int recv_placed(struct pipe *p, const struct sock_stream *st, struct frame_key *rx, uint64_t i,
		       const struct pipe_place *pl, pipe_deliver_fn fn, void *ctx, int timeout_ms,
		       char *err, size_t errlen)
{
	size_t len = 0;
	uint8_t *body = NULL;
	int r = sock_read_placed(st, rx, p->buf, FRAME_BYTES_MAX, &pl->at, &body, &len, timeout_ms,
				 err, errlen);
	if (r < 0)
		return r;
	if (body) {
		r = pl->took(ctx, i, p->buf, body, len, err, errlen);
		if (r != 1)
			return r;
		memcpy(p->buf + pl->at.head, body, len - pl->at.head);
	}
	return fn(ctx, i, p->buf, len, err, errlen);
}

static int recv_serial(struct pipe *p, const struct sock_stream *st, struct frame_key *rx, uint64_t nframes,
		       const struct pipe_place *pl, pipe_deliver_fn fn, void *ctx, int timeout_ms,
		       char *err, size_t errlen)
{
	if (rx->cipher != FRAME_LOCAL && rx->cipher != FRAME_AEGIS256)
		pl = NULL;
	for (uint64_t i = 0; i < nframes; i++) {
		size_t len = 0;
		int r;
		if (pl) {
			r = recv_placed(p, st, rx, i, pl, fn, ctx, timeout_ms, err, errlen);
		} else {
			r = sock_read_frame(st, rx, p->buf, FRAME_BYTES_MAX, &len, timeout_ms, err,
					    errlen);
			if (r == 0)
				r = fn(ctx, i, p->buf, len, err, errlen);
		}
		if (r < 0)
			return r;
	}
	return 0;
}

/* Hands frame s (its job finished) to fn: its open's failure, or fn's. */
static int slot_deliver(struct pipe_slot *s, pipe_deliver_fn fn, void *ctx, char *err,
			size_t errlen)
{
	if (s->rc < 0)
		return err_set(err, errlen, s->rc, "%s", s->err);
	if (s->body) {
		int r = s->pl->took(ctx, s->i, s->buf, s->body, s->len, err, errlen);
		if (r != 1)
			return r;
		memcpy(s->buf + s->pl->at.head, s->body, s->len - s->pl->at.head);
	}
	return fn(ctx, s->i, s->buf, s->len, err, errlen);
}

int pipe_recv(struct pipe *p, const struct sock_stream *st, struct frame_key *rx, uint64_t nframes,
	      pipe_deliver_fn fn, void *ctx, int timeout_ms, char *err, size_t errlen)
{
	return pipe_recv_placed(p, st, rx, nframes, NULL, fn, ctx, timeout_ms, err, errlen);
}

int pipe_recv_placed(struct pipe *p, const struct sock_stream *st, struct frame_key *rx, uint64_t nframes,
		     const struct pipe_place *pl, pipe_deliver_fn fn, void *ctx, int timeout_ms,
		     char *err, size_t errlen)
{
	if (!parallel(p, rx, nframes))
		return recv_serial(p, st, rx, nframes, pl, fn, ctx, timeout_ms, err, errlen);
	int r = slots_ready(p, nframes, err, errlen);
	if (r < 0)
		return r;
	if (nframes > UINT64_MAX - rx->counter)
		return err_set(err, errlen, -EOVERFLOW,
			       "receive counter exhausted: the session must be rekeyed");
	uint64_t K = (uint64_t)p->nslots, nread = 0, given = 0;
	int rerr = 0;
	char rmsg[320] = "";
	const struct pipe_place *ahead = pl && pl->ahead && rx->cipher == FRAME_AEGIS256 ? pl : NULL;
	while (given < nframes) {
		if (!rerr && nread < nframes && nread - given < K) {
			struct pipe_slot *s = &p->slots[nread % K];
			rerr = sock_read_sealed(st, s->hdr, s->buf, FRAME_BYTES_MAX, &s->len,
						timeout_ms, rmsg, sizeof rmsg);
			s->pl = ahead;
			s->ctx = ctx;
			if (rerr == 0)
				slot_submit(p, s, rx, nread++, open_run);
			/* Hand over what is already open before reading on. */
			while (r == 0 && given < nread &&
			       cryptopool_done(p->pool, &p->slots[given % K].job)) {
				r = slot_deliver(&p->slots[given % K], fn, ctx, err, errlen);
				given++;
			}
			if (r < 0)
				break;
			continue;
		}
		if (given == nread) { /* every frame read so far was handed over */
			r = err_set(err, errlen, rerr, "%s", rmsg);
			break;
		}
		struct pipe_slot *s = &p->slots[given % K];
		cryptopool_wait(p->pool, &s->job);
		r = slot_deliver(s, fn, ctx, err, errlen);
		given++;
		if (r < 0)
			break;
	}
	slots_drain(p, given, nread);
	if (r < 0)
		return r;
	rx->counter += nframes;
	return 0;
}
