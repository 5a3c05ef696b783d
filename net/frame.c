/* Frame sealing and opening (see frame.h for the contract, docs/PROTOCOL.md
 * for the bytes). This file holds the only calls to libsodium's AEADs; it
 * does no I/O, keeps no state beyond the caller's struct frame_key, and
 * leaves closing the connection after a failure to the caller.
 *
 * Why the header is associated data: the length is sent in clear so the
 * receiver can read exactly one frame, and binding it to the tag means a
 * frame cannot be re-cut at another length without failing to open.
 *
 * Why a counter nonce rather than a random one: it costs nothing, cannot
 * repeat under one key while we refuse to wrap, and makes replay, reordering
 * and dropped frames fail authentication with no window or bookkeeping.
 * Rejected: a per-frame random 24-byte XChaCha nonce (extra bytes per
 * frame, and replay would still need tracking). */
#include "frame.h"
#include "aegis.h"
#include "../base/err.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

_Static_assert(crypto_aead_aes256gcm_KEYBYTES == FRAME_KEY_BYTES, "aes key size");
_Static_assert(crypto_aead_chacha20poly1305_ietf_KEYBYTES == FRAME_KEY_BYTES,
	       "chacha key size");
_Static_assert(crypto_aead_aes256gcm_ABYTES == FRAME_TAG_BYTES, "aes tag size");
_Static_assert(crypto_aead_chacha20poly1305_ietf_ABYTES == FRAME_TAG_BYTES,
	       "chacha tag size");
_Static_assert(crypto_aead_aes256gcm_NPUBBYTES == FRAME_NONCE_BYTES, "aes nonce size");
_Static_assert(crypto_aead_chacha20poly1305_ietf_NPUBBYTES == FRAME_NONCE_BYTES,
	       "chacha nonce size");
_Static_assert(AEGIS256_KEY_BYTES == FRAME_KEY_BYTES, "aegis key size");
_Static_assert(AEGIS256_TAG_BYTES == FRAME_TAG_BYTES, "aegis tag size");
/* The length field is a u32 and every valid length must fit in it. */
_Static_assert(FRAME_CT_MAX <= UINT32_MAX, "FRAME_MAX too large for the length field");


/* Nonce = counter, little-endian, zero-padded to the nonce size (AEGIS's
 * is the longest). */
static void make_nonce(uint8_t nonce[AEGIS256_NONCE_BYTES], uint64_t counter)
{
	memset(nonce, 0, AEGIS256_NONCE_BYTES);
	wire_put_u64(nonce, counter);
}

/* FRAME_LOCAL's "sealing": the message as it is, then a tag that holds
 * the frame's counter (and zeros), which opening checks. Nothing secret:
 * only a stream nobody else can touch carries these frames. */
static int local_seal(uint8_t *ct, unsigned long long *ctlen, const uint8_t *msg, size_t len,
		      uint64_t counter)
{
	if (ct != msg)
		memmove(ct, msg, len);
	memset(ct + len, 0, FRAME_TAG_BYTES);
	wire_put_u64(ct + len, counter);
	*ctlen = len + FRAME_TAG_BYTES;
	return 0;
}

/* Whether a local frame's tag holds counter. */
static int local_tag_ok(const uint8_t *tag, uint64_t counter)
{
	uint8_t want[FRAME_TAG_BYTES] = { 0 };
	wire_put_u64(want, counter);
	return memcmp(tag, want, FRAME_TAG_BYTES) == 0;
}

static int local_open(uint8_t *out, unsigned long long *got, const uint8_t *ct, size_t ctlen,
		      uint64_t counter)
{
	size_t len = ctlen - FRAME_TAG_BYTES;
	if (!local_tag_ok(ct + len, counter))
		return -1;
	if (out != ct)
		memmove(out, ct, len);
	*got = len;
	return 0;
}

int frame_aes_available(void)
{
	return crypto_aead_aes256gcm_is_available();
}

int frame_aegis_available(void)
{
	return aegis256_available();
}

unsigned frame_offers(void)
{
	return (frame_aes_available() ? FRAME_OFFER_AES256GCM : 0u) |
	       (frame_aegis_available() ? FRAME_OFFER_AEGIS256 : 0u);
}

enum frame_cipher frame_cipher_choose(unsigned mine, unsigned peers)
{
	unsigned both = mine & peers;
	if (both & FRAME_OFFER_AEGIS256)
		return FRAME_AEGIS256;
	if (both & FRAME_OFFER_AES256GCM)
		return FRAME_AES256GCM;
	return FRAME_CHACHA20POLY1305;
}

const char *frame_cipher_name(enum frame_cipher cipher)
{
	switch (cipher) {
	case FRAME_CHACHA20POLY1305:
		return "chacha20-poly1305";
	case FRAME_AES256GCM:
		return "aes-256-gcm";
	case FRAME_LOCAL:
		return "local";
	case FRAME_AEGIS256:
		return "aegis-256";
	}
	return "?";
}

int frame_key_init(struct frame_key *k, const uint8_t key[FRAME_KEY_BYTES],
		   enum frame_cipher cipher)
{
	if (cipher != FRAME_CHACHA20POLY1305 && cipher != FRAME_AES256GCM &&
	    cipher != FRAME_LOCAL && cipher != FRAME_AEGIS256)
		return -EINVAL;
	if (cipher == FRAME_AES256GCM && !frame_aes_available())
		return -ENOTSUP;
	if (cipher == FRAME_AEGIS256 && !frame_aegis_available())
		return -ENOTSUP;
	memcpy(k->key, key, FRAME_KEY_BYTES);
	k->counter = 0;
	k->cipher = cipher;
	return 0;
}

void frame_key_wipe(struct frame_key *k)
{
	if (k)
		sodium_memzero(k, sizeof *k);
}

int frame_seal_parts(struct frame_key *k, uint8_t *out, size_t outcap, const uint8_t *head,
		     size_t hlen, const uint8_t *body, size_t blen, struct frame_iov *fo, char *err,
		     size_t errlen)
{
	size_t len = hlen + blen;
	if (hlen > FRAME_MAX || blen > FRAME_MAX - hlen) {
		(void)err_set(err, errlen, 0, "message of %zu bytes exceeds the frame limit of %u",
			len, FRAME_MAX);
		return -EMSGSIZE;
	}
	size_t total = FRAME_SEALED_BYTES(len);
	if (outcap < total) {
		(void)err_set(err, errlen, 0, "output buffer of %zu bytes, frame needs %zu", outcap,
			total);
		return -ENOBUFS;
	}
	if (k->counter == UINT64_MAX) {
		(void)err_set(err, errlen, 0, "send counter exhausted: the session must be rekeyed");
		return -EOVERFLOW;
	}

	uint8_t nonce[AEGIS256_NONCE_BYTES];
	make_nonce(nonce, k->counter);
	uint8_t *msg = out + FRAME_HDR_BYTES;
	/* Header first: it is the associated data, and with in-place sealing
	 * head starts right after it, so it must not be overwritten by the
	 * ciphertext (it isn't: the ciphertext starts at out + 4 too). */
	wire_put_u32(out, (uint32_t)(len + FRAME_TAG_BYTES));
	fo->n = 1;
	fo->len = total;
	fo->v[0] = (struct iovec){ .iov_base = out, .iov_len = total };
	if (k->cipher == FRAME_AEGIS256) {
		aegis256_encrypt2(msg, msg + len, head, hlen, body, blen, out, FRAME_HDR_BYTES, nonce,
				  k->key);
		k->counter++;
		return 0;
	}
	if (head != msg)
		memmove(msg, head, hlen);
	if (k->cipher == FRAME_LOCAL && blen) {
		/* The tag goes where the body would have: out's bytes past the
		 * head are free. */
		unsigned long long tl;
		(void)local_seal(msg + hlen, &tl, msg + hlen, 0, k->counter);
		fo->n = 3;
		fo->v[0].iov_len = FRAME_HDR_BYTES + hlen;
		fo->v[1] = (struct iovec){ .iov_base = (void *)body, .iov_len = blen };
		fo->v[2] = (struct iovec){ .iov_base = msg + hlen, .iov_len = FRAME_TAG_BYTES };
		k->counter++;
		return 0;
	}
	if (blen)
		memcpy(msg + hlen, body, blen);
	unsigned long long ctlen = 0;
	int rc;
	if (k->cipher == FRAME_LOCAL) {
		rc = local_seal(msg, &ctlen, msg, len, k->counter);
	} else if (k->cipher == FRAME_AES256GCM) {
		rc = crypto_aead_aes256gcm_encrypt(msg, &ctlen, msg, len, out, FRAME_HDR_BYTES, NULL,
						   nonce, k->key);
	} else {
		rc = crypto_aead_chacha20poly1305_ietf_encrypt(msg, &ctlen, msg, len, out,
							       FRAME_HDR_BYTES, NULL, nonce, k->key);
	}
	if (rc != 0 || ctlen != len + FRAME_TAG_BYTES) {
		/* Not reachable with the lengths checked above; refuse rather
		 * than send a frame we cannot vouch for. */
		sodium_memzero(out, total);
		(void)err_set(err, errlen, 0, "%s encryption failed", frame_cipher_name(k->cipher));
		return -EIO;
	}
	k->counter++;
	return 0;
}

int frame_seal(struct frame_key *k, uint8_t *out, size_t outcap, const uint8_t *msg,
	       size_t len, size_t *outlen, char *err, size_t errlen)
{
	struct frame_iov fo;
	int r = frame_seal_parts(k, out, outcap, msg, len, NULL, 0, &fo, err, errlen);
	if (r == 0)
		*outlen = fo.len;
	return r;
}

int frame_check_len(const uint8_t hdr[FRAME_HDR_BYTES], size_t *ctlen, char *err,
		    size_t errlen)
{
	uint32_t L = wire_get_u32(hdr);
	if (L < FRAME_CT_MIN) {
		(void)err_set(err, errlen, 0, "frame length %" PRIu32 " is shorter than the %u-byte tag",
			L, FRAME_TAG_BYTES);
		return -EMSGSIZE;
	}
	if (L > FRAME_CT_MAX) {
		(void)err_set(err, errlen, 0, "frame length %" PRIu32 " exceeds the limit of %u", L,
			FRAME_CT_MAX);
		return -EMSGSIZE;
	}
	*ctlen = L;
	return 0;
}

int frame_open_tag(struct frame_key *k, const uint8_t tag[FRAME_TAG_BYTES], char *err,
		   size_t errlen)
{
	if (k->cipher != FRAME_LOCAL)
		return err_set(err, errlen, -EINVAL, "%s frames are opened whole",
			       frame_cipher_name(k->cipher));
	if (k->counter == UINT64_MAX)
		return err_set(err, errlen, -EOVERFLOW,
			       "receive counter exhausted: the session must be rekeyed");
	if (!local_tag_ok(tag, k->counter))
		return err_set(err, errlen, -EBADMSG,
			       "frame %" PRIu64 " failed authentication (local): its tag is not its "
			       "counter (dropped, replayed or reordered)",
			       k->counter);
	k->counter++;
	return 0;
}

/* Why a frame's bytes cannot be opened under k, before any cipher runs
 * (0 if they can); need: the bytes out must hold. */
static int open_check(const struct frame_key *k, const uint8_t hdr[FRAME_HDR_BYTES], size_t ctlen,
		      size_t outcap, size_t need, char *err, size_t errlen)
{
	size_t declared;
	int rc = frame_check_len(hdr, &declared, err, errlen);
	if (rc < 0)
		return rc;
	if (ctlen != declared)
		return err_set(err, errlen, -EMSGSIZE,
			       "frame truncated or padded: header says %zu bytes, got %zu", declared,
			       ctlen);
	if (outcap < need)
		return err_set(err, errlen, -ENOBUFS, "output buffer of %zu bytes, message is %zu",
			       outcap, ctlen - FRAME_TAG_BYTES);
	if (k->counter == UINT64_MAX)
		return err_set(err, errlen, -EOVERFLOW,
			       "receive counter exhausted: the session must be rekeyed");
	return 0;
}

/* Opens with the cipher: 0, or nonzero when the tag does not match. The
 * message's first head bytes go to out, the rest to body; with no body,
 * all of it to out. */
static int open_run(const struct frame_key *k, const uint8_t hdr[FRAME_HDR_BYTES],
		    const uint8_t *ct, size_t ctlen, uint8_t *out, size_t head, uint8_t *body)
{
	size_t mlen = ctlen - FRAME_TAG_BYTES;
	uint8_t nonce[AEGIS256_NONCE_BYTES];
	make_nonce(nonce, k->counter);
	unsigned long long got = 0;
	if (body)
		return aegis256_decrypt2(out, head, body, ct, mlen, ct + mlen, hdr,
					 FRAME_HDR_BYTES, nonce, k->key);
	int rc;
	if (k->cipher == FRAME_LOCAL) {
		rc = local_open(out, &got, ct, ctlen, k->counter);
	} else if (k->cipher == FRAME_AEGIS256) {
		rc = aegis256_decrypt(out, ct, mlen, ct + mlen, hdr, FRAME_HDR_BYTES, nonce, k->key);
		got = mlen;
	} else if (k->cipher == FRAME_AES256GCM) {
		rc = crypto_aead_aes256gcm_decrypt(out, &got, NULL, ct, ctlen, hdr,
						   FRAME_HDR_BYTES, nonce, k->key);
	} else {
		rc = crypto_aead_chacha20poly1305_ietf_decrypt(out, &got, NULL, ct, ctlen, hdr,
							       FRAME_HDR_BYTES, nonce, k->key);
	}
	return rc != 0 || got != mlen;
}

/* frame_open and frame_open_split: with no body, the whole message
 * into out. */
static int open_frame(struct frame_key *k, const uint8_t hdr[FRAME_HDR_BYTES], const uint8_t *ct,
		      size_t ctlen, uint8_t *out, size_t outcap, size_t head, uint8_t *body,
		      size_t *outlen, char *err, size_t errlen)
{
	size_t mlen = ctlen > FRAME_TAG_BYTES ? ctlen - FRAME_TAG_BYTES : 0;
	int rc = open_check(k, hdr, ctlen, outcap, body ? head : mlen, err, errlen);
	if (rc == 0 && body && (k->cipher != FRAME_AEGIS256 || head > mlen))
		rc = err_set(err, errlen, -EINVAL, "a %s frame of %zu bytes is not opened in two parts at %zu",
			     frame_cipher_name(k->cipher), mlen, head);
	if (rc == 0 && open_run(k, hdr, ct, ctlen, out, head, body) != 0)
		rc = err_set(err, errlen, -EBADMSG,
			     "frame %" PRIu64 " failed authentication (%s): wrong key, modified, "
			     "replayed or reordered",
			     k->counter, frame_cipher_name(k->cipher));
	if (rc == 0) {
		k->counter++;
		*outlen = mlen;
		return 0;
	}
	/* Never leave unauthenticated plaintext (or stale data the caller
	 * might mistake for it) in out, or in body. */
	size_t inout = body ? (head < mlen ? head : mlen) : mlen;
	if (out && outcap > 0 && inout > 0)
		sodium_memzero(out, outcap < inout ? outcap : inout);
	if (body && mlen > head)
		sodium_memzero(body, mlen - head);
	return rc;
}

int frame_open(struct frame_key *k, const uint8_t hdr[FRAME_HDR_BYTES], const uint8_t *ct,
	       size_t ctlen, uint8_t *out, size_t outcap, size_t *outlen, char *err,
	       size_t errlen)
{
	return open_frame(k, hdr, ct, ctlen, out, outcap, 0, NULL, outlen, err, errlen);
}

int frame_open_split(struct frame_key *k, const uint8_t hdr[FRAME_HDR_BYTES], const uint8_t *ct,
		     size_t ctlen, uint8_t *out, size_t head, uint8_t *body, size_t *outlen,
		     char *err, size_t errlen)
{
	return open_frame(k, hdr, ct, ctlen, out, head, head, body, outlen, err, errlen);
}

int frame_peek(const struct frame_key *k, const uint8_t hdr[FRAME_HDR_BYTES], const uint8_t *ct,
	       size_t ctlen, uint8_t *out, size_t n)
{
	if (k->cipher != FRAME_AEGIS256 || ctlen < FRAME_TAG_BYTES ||
	    n > ctlen - FRAME_TAG_BYTES)
		return -EINVAL;
	uint8_t nonce[AEGIS256_NONCE_BYTES];
	make_nonce(nonce, k->counter);
	aegis256_peek(out, n, ct, hdr, FRAME_HDR_BYTES, nonce, k->key);
	return 0;
}
