/* AEGIS-256 (net/aegis.c) against the test vectors of its specification
 * (draft-irtf-cfrg-aegis-aead, "AEGIS-256 Test Vectors": the 128-bit tags),
 * then what a frame cipher must also do: every length around the block
 * size round-trips in place and out of place, and a change to any byte of
 * the ciphertext, tag, associated data, nonce or key is refused with the
 * output zeroed. */
#include <criterion/criterion.h>

#include "leak.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../net/aegis.h"

TestSuite(aegis, .fini = leak_check);

static size_t unhex(uint8_t *out, size_t cap, const char *hex)
{
	size_t n = strlen(hex) / 2;
	cr_assert_leq(n, cap);
	for (size_t i = 0; i < n; i++) {
		unsigned v;
		cr_assert_eq(sscanf(hex + 2 * i, "%2x", &v), 1);
		out[i] = (uint8_t)v;
	}
	return n;
}

struct vector {
	const char *name, *key, *nonce, *ad, *msg, *ct, *tag;
	int valid;
};

#define K1 "1001000000000000000000000000000000000000000000000000000000000000"
#define N1 "1000020000000000000000000000000000000000000000000000000000000000"

static const struct vector VECTORS[] = {
	{ "1: one block", K1, N1, "", "00000000000000000000000000000000",
	  "754fc3d8c973246dcc6d741412a4b236", "3fe91994768b332ed7f570a19ec5896e", 1 },
	{ "2: empty", K1, N1, "", "", "", "e3def978a0f054afd1e761d7553afba3", 1 },
	{ "3: two blocks, ad", K1, N1, "0001020304050607",
	  "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
	  "f373079ed84b2709faee373584585d60accd191db310ef5d8b11833df9dec711",
	  "8d86f91ee606e9ff26a01b64ccbdd91d", 1 },
	{ "4: partial block", K1, N1, "0001020304050607", "000102030405060708090a0b0c0d",
	  "f373079ed84b2709faee37358458", "c60b9c2d33ceb058f96e6dd03c215652", 1 },
	{ "5: long ad, long message", K1, N1,
	  "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20212223242526272829",
	  "101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f3031323334353637",
	  "57754a7d09963e7c787583a2e7b859bb24fa1e04d49fd550b2511a358e3bca252a9b1b8b30cc4a67",
	  "ab8a7d53fd0e98d727accca94925e128", 1 },
	/* the specification's negative vectors: key and nonce swapped, one
	 * ciphertext bit, one ad bit, one tag bit */
	{ "6: wrong key", N1, K1, "0001020304050607", "", "f373079ed84b2709faee37358458",
	  "c60b9c2d33ceb058f96e6dd03c215652", 0 },
	{ "7: ciphertext", K1, N1, "0001020304050607", "", "f373079ed84b2709faee37358459",
	  "c60b9c2d33ceb058f96e6dd03c215652", 0 },
	{ "8: ad", K1, N1, "0001020304050608", "", "f373079ed84b2709faee37358458",
	  "c60b9c2d33ceb058f96e6dd03c215652", 0 },
	{ "9: tag", K1, N1, "0001020304050607", "", "f373079ed84b2709faee37358458",
	  "c60b9c2d33ceb058f96e6dd03c215653", 0 },
};

static void need_aegis(void)
{
	if (!aegis256_available())
		cr_skip_test("this CPU has no AES-NI: AEGIS-256 not available");
}

Test(aegis, specification_vectors)
{
	need_aegis();
	for (size_t i = 0; i < sizeof VECTORS / sizeof VECTORS[0]; i++) {
		const struct vector *v = &VECTORS[i];
		uint8_t key[32], nonce[32], ad[64], msg[64], ct[64], tag[16];
		uint8_t got[64], gtag[16], back[64];
		unhex(key, 32, v->key);
		unhex(nonce, 32, v->nonce);
		size_t adlen = unhex(ad, sizeof ad, v->ad);
		size_t clen = unhex(ct, sizeof ct, v->ct);
		unhex(tag, 16, v->tag);
		if (v->valid) {
			size_t mlen = unhex(msg, sizeof msg, v->msg);
			cr_assert_eq(mlen, clen);
			aegis256_encrypt(got, gtag, msg, mlen, ad, adlen, nonce, key);
			cr_assert_eq(memcmp(got, ct, clen), 0, "vector %s: ciphertext", v->name);
			cr_assert_eq(memcmp(gtag, tag, 16), 0, "vector %s: tag", v->name);
		}
		memset(back, 0xa5, sizeof back);
		int rc = aegis256_decrypt(back, ct, clen, tag, ad, adlen, nonce, key);
		if (v->valid) {
			cr_assert_eq(rc, 0, "vector %s: decrypt", v->name);
			cr_assert_eq(memcmp(back, msg, clen), 0, "vector %s: plaintext", v->name);
		} else {
			cr_assert_eq(rc, -1, "vector %s must fail", v->name);
			for (size_t j = 0; j < clen; j++)
				cr_assert_eq(back[j], 0, "vector %s: output not zeroed", v->name);
		}
	}
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)((i * 131u + seed * 7u + (i >> 8)) ^ (seed >> 3));
}

/* Lengths around the block size and the AD's partial block: in place and
 * out of place give the same bytes, and decryption inverts. */
Test(aegis, lengths_round_trip_in_place)
{
	need_aegis();
	uint8_t key[32], nonce[32], ad[40];
	fill(key, 32, 1);
	fill(nonce, 32, 2);
	fill(ad, sizeof ad, 3);
	const size_t lens[] = { 0, 1, 15, 16, 17, 31, 32, 33, 255, 4096, 65536 + 5 };
	for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
		size_t n = lens[i];
		uint8_t *msg = malloc(n + 1), *ct = malloc(n + 1), *buf = malloc(n + 1);
		cr_assert(msg && ct && buf);
		fill(msg, n, (unsigned)n);
		uint8_t tag[16], tag2[16];
		size_t adlen = n % sizeof ad;
		aegis256_encrypt(ct, tag, msg, n, ad, adlen, nonce, key);
		memcpy(buf, msg, n);
		aegis256_encrypt(buf, tag2, buf, n, ad, adlen, nonce, key);
		cr_assert_eq(memcmp(buf, ct, n), 0, "in-place ciphertext, %zu bytes", n);
		cr_assert_eq(memcmp(tag, tag2, 16), 0, "in-place tag, %zu bytes", n);
		if (n >= 16)
			cr_assert_neq(memcmp(ct, msg, n), 0, "%zu bytes came out unencrypted", n);
		cr_assert_eq(aegis256_decrypt(buf, buf, n, tag, ad, adlen, nonce, key), 0,
			     "%zu bytes", n);
		cr_assert_eq(memcmp(buf, msg, n), 0, "%zu bytes decrypted in place", n);
		free(msg);
		free(ct);
		free(buf);
	}
}

/* One flipped bit anywhere (ciphertext, tag, ad, nonce, key) is refused,
 * and the output holds nothing of the plaintext. */
Test(aegis, any_change_is_refused)
{
	need_aegis();
	uint8_t key[32], nonce[32], ad[4], msg[37], ct[37], tag[16], out[37];
	fill(key, 32, 9);
	fill(nonce, 32, 10);
	fill(ad, 4, 11);
	fill(msg, sizeof msg, 12);
	aegis256_encrypt(ct, tag, msg, sizeof msg, ad, sizeof ad, nonce, key);
	uint8_t *fields[] = { ct, tag, ad, nonce, key };
	const size_t sizes[] = { sizeof ct, sizeof tag, sizeof ad, sizeof nonce, sizeof key };
	const char *names[] = { "ciphertext", "tag", "ad", "nonce", "key" };
	for (int f = 0; f < 5; f++)
		for (size_t byte = 0; byte < sizes[f]; byte++) {
			uint8_t bit = (uint8_t)(1u << (byte % 8));
			fields[f][byte] ^= bit;
			memset(out, 0x5a, sizeof out);
			int rc = aegis256_decrypt(out, ct, sizeof ct, tag, ad, sizeof ad, nonce, key);
			fields[f][byte] ^= bit;
			cr_assert_eq(rc, -1, "%s byte %zu changed, yet it opened", names[f], byte);
			for (size_t j = 0; j < sizeof out; j++)
				cr_assert_eq(out[j], 0, "%s byte %zu: output not zeroed", names[f],
					     byte);
		}
	/* and unchanged, it still opens */
	cr_assert_eq(aegis256_decrypt(out, ct, sizeof ct, tag, ad, sizeof ad, nonce, key), 0);
	cr_assert_eq(memcmp(out, msg, sizeof msg), 0);
}

/* A message sealed from two parts (a frame's header and the tensor it
 * carries, net/frame.c) is the one sealed whole, for every cut: in a
 * block, on a block's edge, a second part shorter than what the first
 * leaves of its block, and either part empty. */
Test(aegis, two_parts_seal_as_one)
{
	need_aegis();
	uint8_t key[32], nonce[32], ad[4];
	fill(key, 32, 4);
	fill(nonce, 32, 5);
	fill(ad, sizeof ad, 6);
	const size_t lens[] = { 0, 5, 16, 20, 32, 47, 100, 4096 + 32 };
	for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
		size_t n = lens[i];
		uint8_t *msg = malloc(n + 1), *want = malloc(n + 1), *ct = malloc(n + 1);
		cr_assert(msg && want && ct);
		fill(msg, n, (unsigned)n + 9);
		uint8_t tag[16], tag2[16];
		aegis256_encrypt(want, tag, msg, n, ad, sizeof ad, nonce, key);
		for (size_t cut = 0; cut <= n; cut += cut < 40 ? 1 : 509) {
			memset(ct, 0xa5, n + 1);
			aegis256_encrypt2(ct, tag2, msg, cut, msg + cut, n - cut, ad, sizeof ad, nonce, key);
			cr_assert_eq(memcmp(ct, want, n), 0, "%zu bytes cut at %zu: ciphertext", n, cut);
			cr_assert_eq(memcmp(tag2, tag, 16), 0, "%zu bytes cut at %zu: tag", n, cut);
			cr_assert_eq(ct[n], 0xa5, "%zu bytes cut at %zu: wrote past the end", n, cut);
		}
		free(msg);
		free(want);
		free(ct);
	}
}
