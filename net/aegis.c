/* AEGIS-256 with AES-NI (see aegis.h). The state is six 128-bit words kept
 * in registers; one Update is six independent AES rounds, so a 16-byte
 * block costs about one AES round's latency.
 *
 * Only this file is compiled with the AES target attribute, and only after
 * aegis256_available() said yes do its functions run, so the binary still
 * starts on a CPU without AES-NI (it then never offers this cipher).
 *
 * Every function wipes what it leaves in memory before it returns: the
 * state (from which the keystream and the key's first rounds follow), the
 * tag it computed to compare, and the padded blocks (a message's or the
 * associated data's last bytes). sodium_memzero, so that the compiler
 * cannot drop the stores as dead. Registers are not ours to wipe. */
#include "aegis.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)

#include <immintrin.h>

#define AEGIS_TARGET __attribute__((target("aes,sse4.1")))
/* The same code with AVX's (VEX) encodings: three-operand forms, no
 * copies to keep a round's input, loads folded into the rounds. On a
 * Cascade Lake it seals and opens 64 KiB frames 1.6x as fast
 * (docs/BENCHMARKS.md, "AEGIS-256 in AVX's encodings"). The bytes are the
 * same; CPUs with AES-NI but not AVX (early Atoms) keep the first. */
#define AEGIS_TARGET_AVX __attribute__((target("aes,sse4.1,avx")))
/* A message's loop and its runs of blocks, compiled into each of the
 * two: always inlined, so that neither is left a function of SSE's
 * encodings that the AVX one calls. */
#define AEGIS_BODY AEGIS_TARGET static inline __attribute__((always_inline))

int aegis256_available(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("aes") && __builtin_cpu_supports("sse4.1");
}

/* The specification's constants: C0 is the Fibonacci sequence mod 256. */
static const uint8_t C0_BYTES[16] = { 0x00, 0x01, 0x01, 0x02, 0x03, 0x05, 0x08, 0x0d,
				      0x15, 0x22, 0x37, 0x59, 0x90, 0xe9, 0x79, 0x62 };
static const uint8_t C1_BYTES[16] = { 0xdb, 0x3d, 0x18, 0x55, 0x6d, 0xc2, 0x2f, 0xf1,
				      0x20, 0x11, 0x31, 0x42, 0x73, 0xb5, 0x28, 0xdd };

struct aegis_state {
	__m128i s[6];
};

/* Update(M): S'0 = AESRound(S5, S0 ^ M), S'i = AESRound(S(i-1), Si).
 * AESENC xors its round key after the round, so S'0 is AESRound(S5, S0)
 * ^ M: M joins after the round rather than before it. When decrypting,
 * M comes from this state's keystream, and xoring it in first put the
 * keystream's 3 operations and the round one after the other on the
 * path from one block to the next (8.3 GB/s open against 10.9 seal);
 * this way they run beside the round. */
AEGIS_TARGET static inline void state_update(struct aegis_state *st, __m128i m)
{
	__m128i t = st->s[5];
	st->s[5] = _mm_aesenc_si128(st->s[4], st->s[5]);
	st->s[4] = _mm_aesenc_si128(st->s[3], st->s[4]);
	st->s[3] = _mm_aesenc_si128(st->s[2], st->s[3]);
	st->s[2] = _mm_aesenc_si128(st->s[1], st->s[2]);
	st->s[1] = _mm_aesenc_si128(st->s[0], st->s[1]);
	st->s[0] = _mm_xor_si128(_mm_aesenc_si128(t, st->s[0]), m);
}

/* The keystream word for the next block: S1 ^ S4 ^ S5 ^ (S2 & S3). */
AEGIS_TARGET static inline __m128i state_keystream(const struct aegis_state *st)
{
	return _mm_xor_si128(_mm_xor_si128(st->s[1], st->s[4]),
			     _mm_xor_si128(st->s[5], _mm_and_si128(st->s[2], st->s[3])));
}

AEGIS_TARGET static inline __m128i load(const uint8_t *p)
{
	return _mm_loadu_si128((const __m128i *)(const void *)p);
}

AEGIS_TARGET static inline void store(uint8_t *p, __m128i v)
{
	_mm_storeu_si128((__m128i *)(void *)p, v);
}

AEGIS_TARGET static void state_init(struct aegis_state *st, const uint8_t key[32],
				    const uint8_t nonce[32])
{
	__m128i k0 = load(key), k1 = load(key + 16);
	__m128i n0 = load(nonce), n1 = load(nonce + 16);
	__m128i c0 = load(C0_BYTES), c1 = load(C1_BYTES);
	__m128i kn0 = _mm_xor_si128(k0, n0), kn1 = _mm_xor_si128(k1, n1);
	st->s[0] = kn0;
	st->s[1] = kn1;
	st->s[2] = c1;
	st->s[3] = c0;
	st->s[4] = _mm_xor_si128(k0, c0);
	st->s[5] = _mm_xor_si128(k1, c1);
	for (int i = 0; i < 4; i++) {
		state_update(st, k0);
		state_update(st, k1);
		state_update(st, kn0);
		state_update(st, kn1);
	}
}

/* Associated data, in 16-byte blocks, the last one zero-padded. */
AEGIS_TARGET static void state_absorb(struct aegis_state *st, const uint8_t *ad, size_t adlen)
{
	size_t i = 0;
	for (; i + 16 <= adlen; i += 16)
		state_update(st, load(ad + i));
	if (i < adlen) {
		uint8_t pad[16] = { 0 };
		memcpy(pad, ad + i, adlen - i);
		state_update(st, load(pad));
		sodium_memzero(pad, sizeof(pad));
	}
}

/* Finalize: seven Updates with S3 ^ (LE64(ad bits) || LE64(msg bits)),
 * then the 128-bit tag S0 ^ S1 ^ ... ^ S5. */
AEGIS_TARGET static void state_finalize(struct aegis_state *st, size_t adlen, size_t mlen,
					uint8_t tag[16])
{
	__m128i lens = _mm_set_epi64x((long long)((uint64_t)mlen * 8u),
				      (long long)((uint64_t)adlen * 8u));
	__m128i t = _mm_xor_si128(st->s[3], lens);
	for (int i = 0; i < 7; i++)
		state_update(st, t);
	__m128i x = _mm_xor_si128(_mm_xor_si128(st->s[0], st->s[1]),
				  _mm_xor_si128(st->s[2], st->s[3]));
	store(tag, _mm_xor_si128(x, _mm_xor_si128(st->s[4], st->s[5])));
}

/* One whole block: c = m ^ keystream, and m into the state. */
AEGIS_TARGET static inline void encrypt_block(struct aegis_state *st, uint8_t *c, const uint8_t *m)
{
	__m128i x = load(m);
	__m128i z = state_keystream(st);
	state_update(st, x);
	store(c, _mm_xor_si128(x, z));
}

/* One whole block: m = c ^ keystream, and m into the state. */
AEGIS_TARGET static inline void decrypt_block(struct aegis_state *st, uint8_t *m, const uint8_t *c)
{
	__m128i x = _mm_xor_si128(load(c), state_keystream(st));
	state_update(st, x);
	store(m, x);
}

/* Four blocks a loop turn. One block a turn left the out-of-order core a
 * window too short to keep the AES unit busy across the loop's own
 * instructions: on a Cascade Lake, 64 KiB frames sealed 1.13-1.17x and
 * opened 1.3-1.45x as fast this way (medians of 300 alternations;
 * docs/BENCHMARKS.md, "AEGIS-256, four blocks a turn"). GCC's unroll
 * pragma gained less (1.10x, 1.2x). */
#define AEGIS_RUN 64

AEGIS_BODY void encrypt_run(struct aegis_state *st, uint8_t *c, const uint8_t *m)
{
	encrypt_block(st, c, m);
	encrypt_block(st, c + 16, m + 16);
	encrypt_block(st, c + 32, m + 32);
	encrypt_block(st, c + 48, m + 48);
}

AEGIS_BODY void decrypt_run(struct aegis_state *st, uint8_t *m, const uint8_t *c)
{
	decrypt_block(st, m, c);
	decrypt_block(st, m + 16, c + 16);
	decrypt_block(st, m + 32, c + 32);
	decrypt_block(st, m + 48, c + 48);
}

/* The message's last, partial block (1..15 bytes), zero-padded. */
AEGIS_TARGET static void encrypt_tail(struct aegis_state *st, uint8_t *c, const uint8_t *m, size_t n)
{
	uint8_t pad[16] = { 0 };
	memcpy(pad, m, n);
	__m128i x = load(pad);
	__m128i z = state_keystream(st);
	state_update(st, x);
	store(pad, _mm_xor_si128(x, z));
	memcpy(c, pad, n);
	sodium_memzero(pad, sizeof(pad));
}

AEGIS_BODY void encrypt2_body(uint8_t *c, uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *m1,
				size_t l1, const uint8_t *m2, size_t l2, const uint8_t *ad,
				size_t adlen, const uint8_t nonce[AEGIS256_NONCE_BYTES],
				const uint8_t key[AEGIS256_KEY_BYTES])
{
	struct aegis_state st;
	uint8_t blk[16]; /* the block across the two parts */
	state_init(&st, key, nonce);
	state_absorb(&st, ad, adlen);
	size_t i = 0, j = 0; /* i: bytes of m1 done, and of c; j: of m2 */
	for (; i + AEGIS_RUN <= l1; i += AEGIS_RUN)
		encrypt_run(&st, c + i, m1 + i);
	for (; i + 16 <= l1; i += 16)
		encrypt_block(&st, c + i, m1 + i);
	if (i < l1) {
		size_t r = l1 - i, take = l2 < 16 - r ? l2 : 16 - r;
		memcpy(blk, m1 + i, r);
		if (take)
			memcpy(blk + r, m2, take);
		if (r + take < 16) {
			encrypt_tail(&st, c + i, blk, r + take);
			goto done;
		}
		encrypt_block(&st, c + i, blk);
		i += 16;
		j = take;
	}
	for (; j + AEGIS_RUN <= l2; j += AEGIS_RUN, i += AEGIS_RUN)
		encrypt_run(&st, c + i, m2 + j);
	for (; j + 16 <= l2; j += 16, i += 16)
		encrypt_block(&st, c + i, m2 + j);
	if (j < l2)
		encrypt_tail(&st, c + i, m2 + j, l2 - j);
done:
	state_finalize(&st, adlen, l1 + l2, tag);
	sodium_memzero(&st, sizeof(st));
	sodium_memzero(blk, sizeof(blk));
}

/* The message's last, partial block (1..15 bytes) into out. Its
 * plaintext goes into the state zero-padded, so the keystream bytes past
 * the end must not. */
AEGIS_TARGET static void decrypt_tail(struct aegis_state *st, uint8_t *out, const uint8_t *c,
				      size_t n)
{
	uint8_t pad[16] = { 0 };
	memcpy(pad, c, n);
	store(pad, _mm_xor_si128(load(pad), state_keystream(st)));
	memset(pad + n, 0, 16 - n);
	state_update(st, load(pad));
	memcpy(out, pad, n);
	sodium_memzero(pad, sizeof(pad));
}

/* The message's first l1 bytes into m1, the rest into m2 (see
 * aegis256_decrypt2); decrypt is the case l1 = clen. */
AEGIS_BODY int decrypt2_body(uint8_t *m1, size_t l1, uint8_t *m2, const uint8_t *c, size_t clen,
			     const uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *ad,
			     size_t adlen, const uint8_t nonce[AEGIS256_NONCE_BYTES],
			     const uint8_t key[AEGIS256_KEY_BYTES])
{
	struct aegis_state st;
	uint8_t blk[16]; /* the block across the two parts */
	state_init(&st, key, nonce);
	state_absorb(&st, ad, adlen);
	size_t i = 0, j = 0; /* i: bytes of c done; j: of m2 */
	for (; i + AEGIS_RUN <= l1; i += AEGIS_RUN)
		decrypt_run(&st, m1 + i, c + i);
	for (; i + 16 <= l1; i += 16)
		decrypt_block(&st, m1 + i, c + i);
	if (i < l1) {
		size_t r = l1 - i, n = clen - i < 16 ? clen - i : 16;
		if (n == 16)
			decrypt_block(&st, blk, c + i);
		else
			decrypt_tail(&st, blk, c + i, n);
		memcpy(m1 + i, blk, r);
		if (n > r)
			memcpy(m2, blk + r, n - r);
		i += n;
		j = n - r;
	}
	for (; i + AEGIS_RUN <= clen; i += AEGIS_RUN, j += AEGIS_RUN)
		decrypt_run(&st, m2 + j, c + i);
	for (; i + 16 <= clen; i += 16, j += 16)
		decrypt_block(&st, m2 + j, c + i);
	if (i < clen)
		decrypt_tail(&st, m2 + j, c + i, clen - i);
	uint8_t want[16];
	state_finalize(&st, adlen, clen, want);
	/* Constant time: every byte is compared whatever the first difference. */
	__m128i diff = _mm_xor_si128(load(want), load(tag));
	int bad = !_mm_testz_si128(diff, diff);
	sodium_memzero(&st, sizeof(st));
	sodium_memzero(want, sizeof(want));
	sodium_memzero(blk, sizeof(blk));
	if (bad) {
		sodium_memzero(m1, l1);
		if (clen > l1)
			sodium_memzero(m2, clen - l1);
		return -1;
	}
	return 0;
}

AEGIS_BODY int decrypt_body(uint8_t *m, const uint8_t *c, size_t clen,
			    const uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *ad,
			    size_t adlen, const uint8_t nonce[AEGIS256_NONCE_BYTES],
			    const uint8_t key[AEGIS256_KEY_BYTES])
{
	return decrypt2_body(m, clen, NULL, c, clen, tag, ad, adlen, nonce, key);
}

AEGIS_TARGET void aegis256_encrypt2_sse(uint8_t *c, uint8_t tag[AEGIS256_TAG_BYTES],
					const uint8_t *m1, size_t l1, const uint8_t *m2, size_t l2,
					const uint8_t *ad, size_t adlen,
					const uint8_t nonce[AEGIS256_NONCE_BYTES],
					const uint8_t key[AEGIS256_KEY_BYTES])
{
	encrypt2_body(c, tag, m1, l1, m2, l2, ad, adlen, nonce, key);
}

AEGIS_TARGET_AVX void aegis256_encrypt2_avx(uint8_t *c, uint8_t tag[AEGIS256_TAG_BYTES],
					    const uint8_t *m1, size_t l1, const uint8_t *m2,
					    size_t l2, const uint8_t *ad, size_t adlen,
					    const uint8_t nonce[AEGIS256_NONCE_BYTES],
					    const uint8_t key[AEGIS256_KEY_BYTES])
{
	encrypt2_body(c, tag, m1, l1, m2, l2, ad, adlen, nonce, key);
}

AEGIS_TARGET int aegis256_decrypt_sse(uint8_t *m, const uint8_t *c, size_t clen,
				      const uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *ad,
				      size_t adlen, const uint8_t nonce[AEGIS256_NONCE_BYTES],
				      const uint8_t key[AEGIS256_KEY_BYTES])
{
	return decrypt_body(m, c, clen, tag, ad, adlen, nonce, key);
}

AEGIS_TARGET_AVX int aegis256_decrypt_avx(uint8_t *m, const uint8_t *c, size_t clen,
					  const uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *ad,
					  size_t adlen, const uint8_t nonce[AEGIS256_NONCE_BYTES],
					  const uint8_t key[AEGIS256_KEY_BYTES])
{
	return decrypt_body(m, c, clen, tag, ad, adlen, nonce, key);
}

AEGIS_TARGET int aegis256_decrypt2_sse(uint8_t *m1, size_t l1, uint8_t *m2, const uint8_t *c,
				       size_t clen, const uint8_t tag[AEGIS256_TAG_BYTES],
				       const uint8_t *ad, size_t adlen,
				       const uint8_t nonce[AEGIS256_NONCE_BYTES],
				       const uint8_t key[AEGIS256_KEY_BYTES])
{
	return decrypt2_body(m1, l1, m2, c, clen, tag, ad, adlen, nonce, key);
}

AEGIS_TARGET_AVX int aegis256_decrypt2_avx(uint8_t *m1, size_t l1, uint8_t *m2, const uint8_t *c,
					   size_t clen, const uint8_t tag[AEGIS256_TAG_BYTES],
					   const uint8_t *ad, size_t adlen,
					   const uint8_t nonce[AEGIS256_NONCE_BYTES],
					   const uint8_t key[AEGIS256_KEY_BYTES])
{
	return decrypt2_body(m1, l1, m2, c, clen, tag, ad, adlen, nonce, key);
}

/* Rarely run and a few blocks long: SSE's encodings do. */
AEGIS_TARGET void aegis256_peek(uint8_t *m, size_t n, const uint8_t *c, const uint8_t *ad,
				size_t adlen, const uint8_t nonce[AEGIS256_NONCE_BYTES],
				const uint8_t key[AEGIS256_KEY_BYTES])
{
	struct aegis_state st;
	state_init(&st, key, nonce);
	state_absorb(&st, ad, adlen);
	size_t i = 0;
	for (; i + 16 <= n; i += 16)
		decrypt_block(&st, m + i, c + i);
	if (i < n)
		decrypt_tail(&st, m + i, c + i, n - i);
	sodium_memzero(&st, sizeof(st));
}

/* libgcc has read the CPU's features (and whether the OS saves AVX's
 * registers) before main: a load and a test. */
static int aegis_avx(void)
{
	return __builtin_cpu_supports("avx");
}

void aegis256_encrypt2(uint8_t *c, uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *m1, size_t l1,
		       const uint8_t *m2, size_t l2, const uint8_t *ad, size_t adlen,
		       const uint8_t nonce[AEGIS256_NONCE_BYTES], const uint8_t key[AEGIS256_KEY_BYTES])
{
	(aegis_avx() ? aegis256_encrypt2_avx : aegis256_encrypt2_sse)(c, tag, m1, l1, m2, l2, ad,
									adlen, nonce, key);
}

void aegis256_encrypt(uint8_t *c, uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *m, size_t mlen,
		      const uint8_t *ad, size_t adlen, const uint8_t nonce[AEGIS256_NONCE_BYTES],
		      const uint8_t key[AEGIS256_KEY_BYTES])
{
	aegis256_encrypt2(c, tag, m, mlen, NULL, 0, ad, adlen, nonce, key);
}

int aegis256_decrypt(uint8_t *m, const uint8_t *c, size_t clen,
		     const uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *ad, size_t adlen,
		     const uint8_t nonce[AEGIS256_NONCE_BYTES], const uint8_t key[AEGIS256_KEY_BYTES])
{
	return (aegis_avx() ? aegis256_decrypt_avx : aegis256_decrypt_sse)(m, c, clen, tag, ad, adlen,
									     nonce, key);
}

int aegis256_decrypt2(uint8_t *m1, size_t l1, uint8_t *m2, const uint8_t *c, size_t clen,
		      const uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *ad, size_t adlen,
		      const uint8_t nonce[AEGIS256_NONCE_BYTES],
		      const uint8_t key[AEGIS256_KEY_BYTES])
{
	return (aegis_avx() ? aegis256_decrypt2_avx : aegis256_decrypt2_sse)(m1, l1, m2, c, clen, tag,
									      ad, adlen, nonce, key);
}

#else /* not x86-64: never offered, so never called */

/* A call here is a bug in the caller (it did not ask aegis256_available):
 * stop rather than hand back zeros, which a sealing caller would send as
 * if they were ciphertext and tag. */
static void aegis_unavailable(const char *fn)
{
	fprintf(stderr, "pstrain: %s called in a build without AES-NI code (not x86-64): its caller did not ask aegis256_available()\n", fn);
	abort();
}

int aegis256_available(void)
{
	return 0;
}

void aegis256_encrypt(uint8_t *c, uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *m,
		      size_t mlen, const uint8_t *ad, size_t adlen,
		      const uint8_t nonce[AEGIS256_NONCE_BYTES],
		      const uint8_t key[AEGIS256_KEY_BYTES])
{
	(void)c, (void)tag, (void)m, (void)mlen, (void)ad, (void)adlen, (void)nonce, (void)key;
	aegis_unavailable(__func__);
}

void aegis256_encrypt2(uint8_t *c, uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *m1, size_t l1,
		       const uint8_t *m2, size_t l2, const uint8_t *ad, size_t adlen,
		       const uint8_t nonce[AEGIS256_NONCE_BYTES], const uint8_t key[AEGIS256_KEY_BYTES])
{
	(void)c, (void)tag, (void)m1, (void)l1, (void)m2, (void)l2, (void)ad, (void)adlen, (void)nonce,
		(void)key;
	aegis_unavailable(__func__);
}

int aegis256_decrypt(uint8_t *m, const uint8_t *c, size_t clen,
		     const uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *ad, size_t adlen,
		     const uint8_t nonce[AEGIS256_NONCE_BYTES],
		     const uint8_t key[AEGIS256_KEY_BYTES])
{
	(void)m, (void)c, (void)clen, (void)tag, (void)ad, (void)adlen, (void)nonce, (void)key;
	aegis_unavailable(__func__);
	return -1;
}

int aegis256_decrypt2(uint8_t *m1, size_t l1, uint8_t *m2, const uint8_t *c, size_t clen,
		      const uint8_t tag[AEGIS256_TAG_BYTES], const uint8_t *ad, size_t adlen,
		      const uint8_t nonce[AEGIS256_NONCE_BYTES],
		      const uint8_t key[AEGIS256_KEY_BYTES])
{
	(void)m1, (void)l1, (void)m2, (void)c, (void)clen, (void)tag, (void)ad, (void)adlen,
		(void)nonce, (void)key;
	aegis_unavailable(__func__);
	return -1;
}

void aegis256_peek(uint8_t *m, size_t n, const uint8_t *c, const uint8_t *ad, size_t adlen,
		   const uint8_t nonce[AEGIS256_NONCE_BYTES], const uint8_t key[AEGIS256_KEY_BYTES])
{
	(void)m, (void)n, (void)c, (void)ad, (void)adlen, (void)nonce, (void)key;
	aegis_unavailable(__func__);
}

#endif
