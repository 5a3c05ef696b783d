/* AEGIS-256 (RFC 10032, formerly draft-irtf-cfrg-aegis-aead): the AEAD that
 * seals frames when both ends' CPUs have AES instructions. Written here from
 * the specification because Debian 12's libsodium (1.0.18) predates its
 * crypto_aead_aegis256 (1.0.19): the bytes are the standard algorithm's, so
 * libsodium's implementation can replace this file without a protocol change
 * once the distribution ships it. Checked against the specification's test
 * vectors, Project Wycheproof's, and libaegis (random cases and a fuzzer):
 * tests/test_aegis.c, tests/fuzz/fuzz_aegis.c, docs/SECURITY.md.
 *
 * Why: on the machines we measure, libsodium 1.0.18's AES-256-GCM seals and
 * opens at 1.6-1.7 GB/s a core, and at 10 Gbit/s the cipher is a fifth of
 * all the CPU a training step takes; AEGIS-256 needs one AES round per state
 * word per 16 bytes and no GHASH (docs/BENCHMARKS.md, "AEGIS-256").
 *
 * 32-byte key, 32-byte nonce, 16-byte tag (the 128-bit tag of the
 * specification). Pure functions over buffers; in-place use (c == m) is
 * allowed. Only x86-64 with AES-NI runs it: aegis256_available() says
 * whether this process can (elsewhere the functions abort). */
#ifndef PSTRAIN_NET_AEGIS_H
#define PSTRAIN_NET_AEGIS_H

#include <stddef.h>
#include <stdint.h>

#define AEGIS256_KEY_BYTES 32u
#define AEGIS256_NONCE_BYTES 32u
#define AEGIS256_TAG_BYTES 16u

/* 1 when this CPU has the AES instructions this implementation uses. */
int aegis256_available(void);

/* Encrypts mlen bytes of m into c (same length) and writes the tag.
 * Must not be called unless aegis256_available(). */
void aegis256_encrypt(uint8_t *c, uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *m,
		      size_t mlen, const uint8_t *ad, size_t adlen,
		      const uint8_t nonce[AEGIS256_NONCE_BYTES],
		      const uint8_t key[AEGIS256_KEY_BYTES]);

/* aegis256_encrypt of the message m1 (l1 bytes) followed by m2 (l2),
 * into c (l1 + l2 bytes): a frame sealed straight from the tensor it
 * carries, with no copy of it next to its header first. c may be m1; m2
 * must not overlap c. */
void aegis256_encrypt2(uint8_t *c, uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *m1, size_t l1,
		       const uint8_t *m2, size_t l2, const uint8_t *ad, size_t adlen,
		       const uint8_t nonce[AEGIS256_NONCE_BYTES],
		       const uint8_t key[AEGIS256_KEY_BYTES]);

/* Decrypts clen bytes of c into m and checks the tag in constant time:
 * 0 when it matches, -1 (and m zeroed) when it does not. */
int aegis256_decrypt(uint8_t *m, const uint8_t *c, size_t clen,
		     const uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *ad, size_t adlen,
		     const uint8_t nonce[AEGIS256_NONCE_BYTES],
		     const uint8_t key[AEGIS256_KEY_BYTES]);

/* aegis256_decrypt of a message whose first l1 bytes go to m1 and whose
 * other clen - l1 go to m2 (l1 <= clen; m2 may be NULL when l1 == clen):
 * a frame's values opened straight into the tensor they belong to, its
 * header into the frame's buffer. m1 may be c; m2 must not overlap c
 * but at c + l1. When the tag does not match, -1, and both parts are
 * zeroed. */
int aegis256_decrypt2(uint8_t *m1, size_t l1, uint8_t *m2, const uint8_t *c, size_t clen,
		      const uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *ad, size_t adlen,
		      const uint8_t nonce[AEGIS256_NONCE_BYTES],
		      const uint8_t key[AEGIS256_KEY_BYTES]);

/* The first n bytes of c's plaintext, its tag NOT checked: what a
 * receiver looks at to choose where aegis256_decrypt2 puts the rest.
 * Nothing here is authenticated until that decrypt2 returns 0: the
 * choice must be safe for any n bytes (an attacker who flips ciphertext
 * bits flips the same plaintext bits here). */
void aegis256_peek(uint8_t *m, size_t n, const uint8_t *c, const uint8_t *ad, size_t adlen,
		   const uint8_t nonce[AEGIS256_NONCE_BYTES], const uint8_t key[AEGIS256_KEY_BYTES]);

#if defined(__x86_64__)
/* The two encodings of encrypt2 and decrypt that the functions above pick
 * from (AVX's where the CPU and the OS have it, else SSE's: net/aegis.c
 * says why). The same bytes; named so that tests compare them. */
void aegis256_encrypt2_sse(uint8_t *c, uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *m1,
			   size_t l1, const uint8_t *m2, size_t l2, const uint8_t *ad, size_t adlen,
			   const uint8_t nonce[AEGIS256_NONCE_BYTES],
			   const uint8_t key[AEGIS256_KEY_BYTES]);
void aegis256_encrypt2_avx(uint8_t *c, uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *m1,
			   size_t l1, const uint8_t *m2, size_t l2, const uint8_t *ad, size_t adlen,
			   const uint8_t nonce[AEGIS256_NONCE_BYTES],
			   const uint8_t key[AEGIS256_KEY_BYTES]);
int aegis256_decrypt_sse(uint8_t *m, const uint8_t *c, size_t clen,
			 const uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *ad, size_t adlen,
			 const uint8_t nonce[AEGIS256_NONCE_BYTES],
			 const uint8_t key[AEGIS256_KEY_BYTES]);
int aegis256_decrypt_avx(uint8_t *m, const uint8_t *c, size_t clen,
			 const uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *ad, size_t adlen,
			 const uint8_t nonce[AEGIS256_NONCE_BYTES],
			 const uint8_t key[AEGIS256_KEY_BYTES]);
int aegis256_decrypt2_sse(uint8_t *m1, size_t l1, uint8_t *m2, const uint8_t *c, size_t clen,
			  const uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *ad, size_t adlen,
			  const uint8_t nonce[AEGIS256_NONCE_BYTES],
			  const uint8_t key[AEGIS256_KEY_BYTES]);
int aegis256_decrypt2_avx(uint8_t *m1, size_t l1, uint8_t *m2, const uint8_t *c, size_t clen,
			  const uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *ad, size_t adlen,
			  const uint8_t nonce[AEGIS256_NONCE_BYTES],
			  const uint8_t key[AEGIS256_KEY_BYTES]);
#endif

#endif
