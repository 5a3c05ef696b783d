/* Frames: sealing and opening the AEAD records that carry every message
 * after the handshake. Pure functions over buffers: no sockets, no
 * allocation, no printing.
 *
 * A frame on the wire is
 *
 *     u32 L (little-endian)  ||  ciphertext (L bytes: message, then 16-byte tag)
 *
 * sealed with AEGIS-256, AES-256-GCM or ChaCha20-Poly1305-IETF under one
 * direction's session key, with the 4 length bytes as associated data and
 * the direction's 64-bit frame counter, little-endian and zero-padded to
 * the cipher's nonce size (32 bytes for AEGIS-256, else 12), as the nonce;
 * or, on a Unix socket between a worker and a ps of
 * one host, not sealed at all (FRAME_LOCAL: the message, then the counter
 * as the tag). docs/PROTOCOL.md is the reference for these bytes.
 *
 * Each direction of a connection has its own struct frame_key; the sender's
 * counter and the receiver's advance in step, one per frame, so a frame that
 * is replayed, dropped, reordered or modified fails to open. Any failure
 * from frame_check_len or frame_open means the stream can no longer be
 * trusted or resynchronized: the caller must close that connection (and
 * only that one) and log the reason. A failed open leaves the receive
 * counter where it was, but nothing should be opened after it.
 *
 * Receiving is two steps so that nothing is allocated before the length is
 * bounded: read FRAME_HDR_BYTES, frame_check_len() them, read exactly the
 * returned length, frame_open(). Key derivation and cipher negotiation are
 * the handshake's job; this module only uses the result.
 *
 * libsodium must be initialized (sodium_init) before any of these run. A
 * frame_key is used by one thread at a time. */
#ifndef PSTRAIN_NET_FRAME_H
#define PSTRAIN_NET_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "wire.h"

#define FRAME_MUST_CHECK __attribute__((warn_unused_result))

#define FRAME_KEY_BYTES 32u
#define FRAME_HDR_BYTES 4u
#define FRAME_TAG_BYTES 16u  /* every cipher's tag */
#define FRAME_NONCE_BYTES 12u /* AES-GCM's and ChaCha's nonce (AEGIS: 32, the same counter) */
/* Bounds on the length field: an empty message is just a tag. */
#define FRAME_CT_MIN FRAME_TAG_BYTES
#define FRAME_CT_MAX (FRAME_MAX + FRAME_TAG_BYTES)
/* Bytes on the wire for a message of len bytes, and the largest frame. */
#define FRAME_SEALED_BYTES(len) (FRAME_HDR_BYTES + (size_t)(len) + FRAME_TAG_BYTES)
#define FRAME_BYTES_MAX FRAME_SEALED_BYTES(FRAME_MAX)

enum frame_cipher {
	FRAME_CHACHA20POLY1305 = 0, /* ChaCha20-Poly1305-IETF: always available */
	FRAME_AES256GCM = 1,        /* AES-256-GCM: needs AES-NI and PCLMUL */
	FRAME_LOCAL = 2,            /* no cipher: a Unix socket between two processes of
				     * one user on one host, which nobody else can read
				     * or write (docs/SECURITY.md); the tag carries the
				     * counter, so a frame lost or repeated by a bug
				     * still fails to open */
	FRAME_AEGIS256 = 3,         /* AEGIS-256 (net/aegis.h): needs AES-NI; the
				     * fastest of the three where both ends have it */
};

/* The ciphers one end offers in the handshake, besides ChaCha20-Poly1305
 * which every end runs: a bit mask. */
#define FRAME_OFFER_AES256GCM 1u
#define FRAME_OFFER_AEGIS256 2u
#define FRAME_OFFER_ALL (FRAME_OFFER_AES256GCM | FRAME_OFFER_AEGIS256)

/* One direction's state: the session key, the counter of the next frame
 * (= its nonce), and the cipher. The struct is public so a session can embed
 * it; change it only through these functions (tests set counter directly). */
struct frame_key {
	uint8_t key[FRAME_KEY_BYTES];
	uint64_t counter;
	enum frame_cipher cipher;
};

/* Whether this CPU can run AES-256-GCM, and AEGIS-256. */
int frame_aes_available(void);
int frame_aegis_available(void);

/* What this CPU can run, as FRAME_OFFER_* bits (what the handshake
 * advertises). */
unsigned frame_offers(void);

/* The cipher for a connection from both ends' offers: AEGIS-256 when both
 * offer it, else AES-256-GCM when both offer it, else ChaCha20-Poly1305.
 * Symmetric, so both sides compute the same answer. */
enum frame_cipher frame_cipher_choose(unsigned mine, unsigned peers);

/* Name for logs: "aegis-256", "aes-256-gcm", "chacha20-poly1305" or
 * "local". */
const char *frame_cipher_name(enum frame_cipher cipher);

/* Sets k to key, counter 0, cipher. -EINVAL for an unknown cipher,
 * -ENOTSUP for AES-256-GCM on a CPU without it. */
FRAME_MUST_CHECK int frame_key_init(struct frame_key *k,
				    const uint8_t key[FRAME_KEY_BYTES],
				    enum frame_cipher cipher);

/* Zeroes all of k (key, counter, cipher). Accepts NULL. */
void frame_key_wipe(struct frame_key *k);

/* Seals msg (len bytes, at most FRAME_MAX) into out as one frame of
 * FRAME_SEALED_BYTES(len) bytes, sets *outlen to that, and advances
 * k->counter. msg may be out + FRAME_HDR_BYTES (sealing in place); any other
 * overlap is not allowed. Returns 0, or with nothing written to *outlen and
 * the counter unchanged:
 *   -EMSGSIZE   len > FRAME_MAX
 *   -ENOBUFS    outcap < FRAME_SEALED_BYTES(len)
 *   -EOVERFLOW  the counter is exhausted (2^64 - 1 frames sent): the
 *               session must end, a nonce is never reused
 * err (errlen bytes, may be NULL) gets a one-line reason on failure. */
FRAME_MUST_CHECK int frame_seal(struct frame_key *k, uint8_t *out, size_t outcap,
				const uint8_t *msg, size_t len, size_t *outlen,
				char *err, size_t errlen);

/* A sealed frame as the parts to write in order: one (out itself) but for
 * a FRAME_LOCAL frame with a body, which is written from where it is. */
struct frame_iov {
	struct iovec v[3];
	int n;
	size_t len; /* FRAME_SEALED_BYTES(hlen + blen): the parts' total */
};

/* frame_seal of the message head || body (hlen + blen bytes, at most
 * FRAME_MAX), so that a tensor's values need not be copied next to their
 * header first: head may be out + FRAME_HDR_BYTES; body (blen bytes, may
 * be NULL when blen is 0) must not overlap out. AEGIS-256 seals from the
 * two parts, FRAME_LOCAL leaves the body where it is (fo's middle part:
 * the caller must not change it before the frame is written), the other
 * ciphers copy it after head in out and seal in place. fo describes the
 * frame; its parts point into out and body. Errors as frame_seal. */
FRAME_MUST_CHECK int frame_seal_parts(struct frame_key *k, uint8_t *out, size_t outcap,
				      const uint8_t *head, size_t hlen, const uint8_t *body,
				      size_t blen, struct frame_iov *fo, char *err, size_t errlen);

/* Reads the length field of a frame header and bounds it before the caller
 * allocates or reads anything more. Sets *ctlen to the number of ciphertext
 * bytes that follow (FRAME_CT_MIN..FRAME_CT_MAX); the message will be
 * *ctlen - FRAME_TAG_BYTES bytes. -EMSGSIZE (reason in err) otherwise. */
FRAME_MUST_CHECK int frame_check_len(const uint8_t hdr[FRAME_HDR_BYTES], size_t *ctlen,
				     char *err, size_t errlen);

/* Authenticates and decrypts one frame: hdr is the 4-byte header, ct the
 * ctlen bytes read after it. Writes the message (ctlen - FRAME_TAG_BYTES
 * bytes) to out, sets *outlen, and advances k->counter. out may equal ct
 * (opening in place). On failure the counter is unchanged, out's first
 * min(outcap, ctlen - tag) bytes are zeroed, and the return is:
 *   -EMSGSIZE   ctlen differs from the header's length, or that length is
 *               out of bounds (a truncated or oversized frame)
 *   -ENOBUFS    outcap is smaller than the message
 *   -EBADMSG    authentication failed: wrong key or cipher, a modified
 *               header or body, or a replayed, dropped or reordered frame
 *   -EOVERFLOW  the receive counter is exhausted
 * Every failure ends the connection (see the top of this file). */
FRAME_MUST_CHECK int frame_open(struct frame_key *k, const uint8_t hdr[FRAME_HDR_BYTES],
				const uint8_t *ct, size_t ctlen, uint8_t *out,
				size_t outcap, size_t *outlen, char *err, size_t errlen);

/* frame_open of an AEGIS-256 frame whose message's first head bytes go
 * to out (which may be ct: opening in place) and whose other
 * ctlen - FRAME_TAG_BYTES - head bytes go to body, which must not overlap
 * ct: a chunk's values opened straight into the tensor they belong to
 * (net/sock.h, sock_read_placed). On failure both are zeroed; -EINVAL for
 * another cipher or a message shorter than head; else as frame_open. */
FRAME_MUST_CHECK int frame_open_split(struct frame_key *k, const uint8_t hdr[FRAME_HDR_BYTES],
				      const uint8_t *ct, size_t ctlen, uint8_t *out, size_t head,
				      uint8_t *body, size_t *outlen, char *err, size_t errlen);

/* The first n bytes of the message of an AEGIS-256 frame (hdr, then ct
 * of ctlen bytes) as they would open under k, its tag NOT checked and
 * the counter unchanged: for choosing where frame_open_split puts the
 * rest. Whoever chooses must be safe with any n bytes here (an attacker
 * flips plaintext bits by flipping ciphertext bits); frame_open_split
 * then fails unless these are the bytes sent. 0, or -EINVAL for another
 * cipher or a message shorter than n. */
FRAME_MUST_CHECK int frame_peek(const struct frame_key *k, const uint8_t hdr[FRAME_HDR_BYTES],
				const uint8_t *ct, size_t ctlen, uint8_t *out, size_t n);

/* frame_open of a FRAME_LOCAL frame whose message was read elsewhere (its
 * body straight into the tensor it belongs to, net/pipe.h): checks that
 * tag, the frame's last FRAME_TAG_BYTES, holds the expected counter, and
 * advances it. The caller must treat the message as frame_open's output:
 * on failure (-EBADMSG, -EOVERFLOW; -EINVAL for another cipher, whose
 * frames must be opened whole) it is not a message and the connection
 * ends. */
FRAME_MUST_CHECK int frame_open_tag(struct frame_key *k, const uint8_t tag[FRAME_TAG_BYTES],
				    char *err, size_t errlen);

#endif
