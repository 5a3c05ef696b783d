/* libFuzzer harness for AEGIS-256 (net/aegis.c) against libaegis, an
 * implementation written apart from ours: its C source comes from the
 * source release of PyPI's aeg (the binding tests/aegis_ref.py uses),
 * which `make fuzz` downloads with pip into build/ and compiles with its
 * aegis256_encrypt and aegis256_decrypt renamed (ours have those names).
 * No source of it is in this tree.
 *
 * The input is: 32 bytes of key, 32 of nonce, a byte for the ad's share
 * and two for the cut, then the rest split into ad and message. Checks:
 * ours seals as libaegis does (whole, in place, and from two parts cut
 * anywhere), opens what libaegis sealed (out of place, in place, and
 * into two parts cut there, whose first the peek gives), and
 * refuses it, with the output zeroed, after one bit changes in the
 * ciphertext, tag, ad, nonce or key; libaegis opens what ours sealed. */
#include "../../net/aegis.h"
#include "fuzz.h"

/* libaegis's own names for what is compared (src/include/aegis256.h). */
int aegis_init(void);
int aegis256_encrypt_detached(uint8_t *c, uint8_t *mac, size_t maclen, const uint8_t *m, size_t mlen,
			      const uint8_t *ad, size_t adlen, const uint8_t *npub, const uint8_t *k);
int aegis256_decrypt_detached(uint8_t *m, const uint8_t *c, size_t clen, const uint8_t *mac, size_t maclen,
			      const uint8_t *ad, size_t adlen, const uint8_t *npub, const uint8_t *k);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	FUZZ_CHECK(aegis_init() == 0);
	if (!aegis256_available()) {
		fprintf(stderr, "fuzz_aegis: this CPU has no AES-NI, so pstrain never runs AEGIS-256 here\n");
		exit(1);
	}
	return 0;
}

static void all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		FUZZ_CHECK(p[i] == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 67)
		return 0;
	uint8_t key[32], nonce[32];
	memcpy(key, data, 32);
	memcpy(nonce, data + 32, 32);
	size_t rest = size - 67;
	size_t adlen = rest ? data[64] % (rest + 1) : 0;
	size_t mlen = rest - adlen;
	size_t cut = mlen ? (size_t)(data[65] | data[66] << 8) % (mlen + 1) : 0;
	uint8_t *ad = malloc(adlen + 1), *m = malloc(mlen + 1), *ref = malloc(mlen + 1);
	uint8_t *ours = malloc(mlen + 1), *buf = malloc(mlen + 1);
	FUZZ_CHECK(ad && m && ref && ours && buf);
	memcpy(ad, data + 67, adlen);
	memcpy(m, data + 67 + adlen, mlen);
	uint8_t rtag[16], tag[16];
	FUZZ_CHECK(aegis256_encrypt_detached(ref, rtag, 16, m, mlen, ad, adlen, nonce, key) == 0);

	aegis256_encrypt(ours, tag, m, mlen, ad, adlen, nonce, key);
	FUZZ_CHECK(memcmp(ours, ref, mlen) == 0 && memcmp(tag, rtag, 16) == 0);
	memcpy(buf, m, mlen);
	aegis256_encrypt(buf, tag, buf, mlen, ad, adlen, nonce, key);
	FUZZ_CHECK(memcmp(buf, ref, mlen) == 0 && memcmp(tag, rtag, 16) == 0);
	memcpy(buf, m, cut);
	aegis256_encrypt2(buf, tag, buf, cut, m + cut, mlen - cut, ad, adlen, nonce, key);
	FUZZ_CHECK(memcmp(buf, ref, mlen) == 0 && memcmp(tag, rtag, 16) == 0);
	FUZZ_CHECK(aegis256_decrypt_detached(buf, ours, mlen, tag, 16, ad, adlen, nonce, key) == 0);
	FUZZ_CHECK(memcmp(buf, m, mlen) == 0);

	FUZZ_CHECK(aegis256_decrypt(buf, ref, mlen, rtag, ad, adlen, nonce, key) == 0);
	FUZZ_CHECK(memcmp(buf, m, mlen) == 0);
	memcpy(buf, ref, mlen);
	FUZZ_CHECK(aegis256_decrypt(buf, buf, mlen, rtag, ad, adlen, nonce, key) == 0);
	FUZZ_CHECK(memcmp(buf, m, mlen) == 0);
	/* Opened in two parts at the cut (the first in place), as a frame's
	 * values are opened into their tensor; the peek is the first part. */
	memset(ours, 0xa5, mlen + 1);
	aegis256_peek(ours, cut, ref, ad, adlen, nonce, key);
	FUZZ_CHECK(memcmp(ours, m, cut) == 0 && ours[cut] == 0xa5);
	memcpy(buf, ref, mlen);
	memset(ours, 0xa5, mlen + 1);
	FUZZ_CHECK(aegis256_decrypt2(buf, cut, ours, buf, mlen, rtag, ad, adlen, nonce, key) == 0);
	FUZZ_CHECK(memcmp(buf, m, cut) == 0 && memcmp(ours, m + cut, mlen - cut) == 0);
	FUZZ_CHECK(ours[mlen - cut] == 0xa5);

	/* One bit changed in each field the input has, where its cut says. */
	uint8_t *fields[] = { ref, rtag, ad, nonce, key };
	size_t sizes[] = { mlen, 16, adlen, 32, 32 };
	for (int f = 0; f < 5; f++) {
		if (!sizes[f])
			continue;
		size_t at = (cut + (size_t)f * 7) % sizes[f];
		uint8_t bit = (uint8_t)(1u << ((cut + (size_t)f) % 8));
		fields[f][at] ^= bit;
		memset(buf, 0xa5, mlen);
		FUZZ_CHECK(aegis256_decrypt(buf, ref, mlen, rtag, ad, adlen, nonce, key) == -1);
		all_zero(buf, mlen);
		memcpy(buf, ref, mlen);
		FUZZ_CHECK(aegis256_decrypt(buf, buf, mlen, rtag, ad, adlen, nonce, key) == -1);
		all_zero(buf, mlen);
		memcpy(buf, ref, mlen);
		memset(ours, 0xa5, mlen + 1);
		FUZZ_CHECK(aegis256_decrypt2(buf, cut, ours, buf, mlen, rtag, ad, adlen, nonce, key) == -1);
		all_zero(buf, cut);
		all_zero(ours, mlen - cut);
		FUZZ_CHECK(ours[mlen - cut] == 0xa5);
		fields[f][at] ^= bit;
	}
	free(ad), free(m), free(ref), free(ours), free(buf);
	return 0;
}
