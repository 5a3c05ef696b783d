/* AEGIS-256 (net/aegis.c) against the test vectors of its specification
 * (draft-irtf-cfrg-aegis-aead, "AEGIS-256 Test Vectors": the 128-bit tags),
 * then what a frame cipher must also do: every length around the block
 * size round-trips in place and out of place, and a change to any byte of
 * the ciphertext, tag, associated data, nonce or key is refused with the
 * output zeroed. Then the evidence from outside (issue 38 item 5): Project
 * Wycheproof's 472 vectors, and 3,000 random cases against libaegis, an
 * implementation written apart from ours (tests/aegis_ref.py). The
 * Wycheproof vectors run through both encodings net/aegis.c picks from
 * (SSE's and, where the CPU has it, AVX's). */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/json.h"
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

/* A message opened into two parts (a frame's header into its buffer, its
 * values into the tensor, net/frame.c) is the one opened whole, for every
 * cut, in both encodings; a wrong tag zeroes both parts and writes
 * nothing past them. The head's peek is the plaintext's first bytes. */
Test(aegis, two_parts_open_as_one)
{
	need_aegis();
	typedef int (*open2_fn)(uint8_t *, size_t, uint8_t *, const uint8_t *, size_t,
				const uint8_t *, const uint8_t *, size_t, const uint8_t *,
				const uint8_t *);
	const open2_fn in[2] = { aegis256_decrypt2_sse, aegis256_decrypt2_avx };
	int encs = __builtin_cpu_supports("avx") ? 2 : 1;
	uint8_t key[32], nonce[32], ad[4];
	fill(key, 32, 7);
	fill(nonce, 32, 8);
	fill(ad, sizeof ad, 9);
	const size_t lens[] = { 0, 5, 16, 20, 32, 47, 100, 4096 + 32, 4096 + 45 };
	for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
		size_t n = lens[i];
		uint8_t *msg = malloc(n + 1), *ct = malloc(n + 1), *a = malloc(n + 1),
			*b = malloc(n + 1), *head = malloc(n + 1);
		cr_assert(msg && ct && a && b && head);
		fill(msg, n, (unsigned)n + 3);
		uint8_t tag[16];
		aegis256_encrypt(ct, tag, msg, n, ad, sizeof ad, nonce, key);
		for (size_t cut = 0; cut <= n; cut += cut < 40 ? 1 : 509) {
			aegis256_peek(head, cut, ct, ad, sizeof ad, nonce, key);
			cr_assert_eq(memcmp(head, msg, cut), 0, "%zu bytes: peek of %zu", n, cut);
			for (int e = 0; e < encs; e++) {
				memset(a, 0xa5, n + 1);
				memset(b, 0xa5, n + 1);
				cr_assert_eq(in[e](a, cut, b, ct, n, tag, ad, sizeof ad, nonce, key), 0,
					     "%zu bytes cut at %zu, encoding %d", n, cut, e);
				cr_assert_eq(memcmp(a, msg, cut), 0, "%zu at %zu: first part", n, cut);
				cr_assert_eq(memcmp(b, msg + cut, n - cut), 0, "%zu at %zu: second", n, cut);
				cr_assert(a[cut] == 0xa5 && b[n - cut] == 0xa5, "%zu at %zu: past a part",
					  n, cut);
				tag[cut % 16] ^= 4;
				cr_assert_eq(in[e](a, cut, b, ct, n, tag, ad, sizeof ad, nonce, key), -1);
				tag[cut % 16] ^= 4;
				for (size_t k = 0; k < n; k++)
					cr_assert_eq(k < cut ? a[k] : b[k - cut], 0,
						     "%zu at %zu: byte %zu left after a wrong tag", n, cut, k);
				cr_assert(a[cut] == 0xa5 && b[n - cut] == 0xa5);
			}
		}
		/* the first part may be the ciphertext itself (opened in place) */
		if (n) {
			memcpy(a, ct, n);
			cr_assert_eq(aegis256_decrypt2(a, n / 2, b, a, n, tag, ad, sizeof ad, nonce, key), 0);
			cr_assert(memcmp(a, msg, n / 2) == 0 && memcmp(b, msg + n / 2, n - n / 2) == 0);
		}
		free(msg), free(ct), free(a), free(b), free(head);
	}
}

/* ---- Wycheproof (issue 38 item 5) ------------------------------------ */

/* s's hex into a new buffer (*n bytes; at least 1 allocated). */
static uint8_t *unhex_new(const char *s, size_t *n)
{
	uint8_t *b = malloc(strlen(s) / 2 + 1);
	cr_assert_not_null(b);
	*n = unhex(b, strlen(s) / 2 + 1, s);
	return b;
}

static const char *field(const struct json *t, const char *name)
{
	const struct json *f = json_get(t, name);
	cr_assert(f && f->type == JSON_STRING, "test %s has no string \"%s\"", json_get(t, "tcId")->text, name);
	return f->text;
}

/* The encodings net/aegis.c picks from: SSE's, and AVX's where this CPU
 * has it; each must give the same bytes. */
typedef void (*seal2_fn)(uint8_t *, uint8_t *, const uint8_t *, size_t, const uint8_t *, size_t,
			 const uint8_t *, size_t, const uint8_t *, const uint8_t *);
typedef int (*open_fn)(uint8_t *, const uint8_t *, size_t, const uint8_t *, const uint8_t *, size_t,
		       const uint8_t *, const uint8_t *);
static const seal2_fn seal2_in[2] = { aegis256_encrypt2_sse, aegis256_encrypt2_avx };
static const open_fn open_in[2] = { aegis256_decrypt_sse, aegis256_decrypt_avx };

static int encodings(void)
{
	return __builtin_cpu_supports("avx") ? 2 : 1;
}

/* Opens ct into out in encoding e: valid, to msg; invalid, refused with
 * out zeroed; never past the end. */
static void wycheproof_open(const char *id, int e, int valid, const uint8_t *ct, size_t cl,
			    const uint8_t *tag, const uint8_t *ad, size_t al, const uint8_t *nonce,
			    const uint8_t *key, const uint8_t *msg, size_t ml, uint8_t *out)
{
	memset(out, 0xa5, cl + 1);
	int rc = e < 0 ? aegis256_decrypt(out, ct, cl, tag, ad, al, nonce, key)
		       : open_in[e](out, ct, cl, tag, ad, al, nonce, key);
	if (valid) {
		cr_assert_eq(rc, 0, "test %s (encoding %d): refused", id, e);
		cr_assert_eq(memcmp(out, msg, ml), 0, "test %s (encoding %d): opened to another message", id, e);
	} else {
		cr_assert_eq(rc, -1, "test %s (encoding %d): opened", id, e);
		for (size_t j = 0; j < cl; j++)
			cr_assert_eq(out[j], 0, "test %s: output not zeroed at %zu", id, j);
	}
	cr_assert_eq(out[cl], 0xa5, "test %s: wrote past the end", id);
}

/* One Wycheproof test: a valid one seals to its ciphertext and tag (whole,
 * in place, and from two parts, in each encoding) and opens to its
 * message; an invalid one is refused with the output zeroed. Returns 1
 * for valid. */
static int wycheproof_one(const struct json *t)
{
	const char *id = json_get(t, "tcId")->text;
	size_t kl, nl, al, ml, cl, tl;
	uint8_t *key = unhex_new(field(t, "key"), &kl), *nonce = unhex_new(field(t, "iv"), &nl);
	uint8_t *ad = unhex_new(field(t, "aad"), &al), *msg = unhex_new(field(t, "msg"), &ml);
	uint8_t *ct = unhex_new(field(t, "ct"), &cl), *tag = unhex_new(field(t, "tag"), &tl);
	cr_assert(kl == 32 && nl == 32 && tl == 16, "test %s: key %zu, iv %zu, tag %zu bytes", id, kl, nl, tl);
	const char *result = field(t, "result");
	int valid = strcmp(result, "valid") == 0;
	cr_assert(valid || strcmp(result, "invalid") == 0, "test %s: result %s", id, result);
	uint8_t *out = malloc(cl + 1), gtag[16];
	cr_assert_not_null(out);
	if (valid) {
		cr_assert_eq(ml, cl, "test %s", id);
		aegis256_encrypt(out, gtag, msg, ml, ad, al, nonce, key);
		cr_assert(memcmp(out, ct, cl) == 0 && memcmp(gtag, tag, 16) == 0, "test %s: sealed differently", id);
		memcpy(out, msg, ml);
		aegis256_encrypt(out, gtag, out, ml, ad, al, nonce, key);
		cr_assert(memcmp(out, ct, cl) == 0 && memcmp(gtag, tag, 16) == 0, "test %s: in place", id);
		aegis256_encrypt2(out, gtag, msg, ml / 2, msg + ml / 2, ml - ml / 2, ad, al, nonce, key);
		cr_assert(memcmp(out, ct, cl) == 0 && memcmp(gtag, tag, 16) == 0, "test %s: two parts", id);
		for (int e = 0; e < encodings(); e++) {
			memset(out, 0, cl);
			seal2_in[e](out, gtag, msg, ml / 3, msg + ml / 3, ml - ml / 3, ad, al, nonce, key);
			cr_assert(memcmp(out, ct, cl) == 0 && memcmp(gtag, tag, 16) == 0,
				  "test %s: encoding %d sealed differently", id, e);
		}
	}
	for (int e = -1; e < encodings(); e++)
		wycheproof_open(id, e, valid, ct, cl, tag, ad, al, nonce, key, msg, ml, out);
	free(key), free(nonce), free(ad), free(msg), free(ct), free(tag), free(out);
	return valid;
}

/* Project Wycheproof's aegis256_test.json, as published (tests/vectors/
 * wycheproof/README.md): 472 tests, 360 valid, 112 invalid (108 modified
 * tags, 4 tags of the 2013 paper's six-round finalization). */
Test(aegis, wycheproof_vectors)
{
	need_aegis();
	char path[PATH_MAX], e[200];
	test_repo_path(path, sizeof(path), "tests/vectors/wycheproof/aegis256_test.json");
	unsigned char *text;
	size_t len;
	read_all(path, &text, &len);
	struct json *doc;
	cr_assert_eq(json_parse((const char *)text, len, &doc, e, sizeof(e)), 0, "%s: %s", path, e);
	free(text);
	cr_assert_str_eq(json_get(doc, "algorithm")->text, "AEGIS256");
	const struct json *groups = json_get(doc, "testGroups");
	cr_assert(groups && groups->type == JSON_ARRAY);
	int total = 0, valid = 0;
	for (size_t g = 0; g < groups->n; g++) {
		const struct json *tests = json_get(&groups->kids[g], "tests");
		cr_assert(tests && tests->type == JSON_ARRAY);
		for (size_t i = 0; i < tests->n; i++, total++)
			valid += wycheproof_one(&tests->kids[i]);
	}
	cr_assert_eq(total, atoi(json_get(doc, "numberOfTests")->text));
	cr_assert(total == 472 && valid == 360, "%d tests, %d valid: not the file the README names", total, valid);
	json_free(doc);
}

/* ---- against an independent implementation (issue 38 item 5) --------- */

/* splitmix64: the cases are the same on every run (a failure names its
 * case), and the two passes over them draw the same ones. */
static uint64_t next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

/* A length in 0..max, half of them within one byte of a 16- or 32-byte
 * edge (where the partial-block and two-part code paths turn). */
static size_t pick_len(uint64_t *r, size_t max)
{
	uint64_t how = next(r) % 8, k = next(r);
	long len;
	if (how < 4) {
		size_t edge = how < 2 ? 16 : 32;
		k = how % 2 ? k % 9 : k % (max / edge + 1);   /* small, or anywhere */
		len = (long)(k * edge) + (long)(next(r) % 3) - 1;
	} else if (how == 4) {
		len = (long)(k % 65);
	} else {
		len = (long)(k % (max + 1));
	}
	return len < 0 ? 0 : (size_t)len > max ? max : (size_t)len;
}

struct aegis_case {
	uint8_t key[32], nonce[32];
	uint8_t *ad, *msg;   /* (adlen), (mlen) */
	size_t adlen, mlen;
};

#define REF_CASES 3000
#define REF_MSG_MAX 70000
#define REF_AD_MAX 300

/* The next case from r, into buffers of the maxima's size. */
static void case_draw(struct aegis_case *c, uint64_t *r)
{
	for (int i = 0; i < 32; i++) {
		c->key[i] = (uint8_t)next(r);
		c->nonce[i] = (uint8_t)next(r);
	}
	c->adlen = pick_len(r, REF_AD_MAX);
	c->mlen = pick_len(r, REF_MSG_MAX);
	for (size_t i = 0; i < c->adlen; i++)
		c->ad[i] = (uint8_t)next(r);
	for (size_t i = 0; i < c->mlen; i += 8) {
		uint64_t x = next(r);
		memcpy(c->msg + i, &x, c->mlen - i < 8 ? c->mlen - i : 8);
	}
}

/* One case against the reference's ct and tag: sealed whole out of place
 * and in place, from two parts cut anywhere (often at a block's edge),
 * opened out of place and in place, and with one bit changed in the
 * ciphertext, tag, ad, nonce or key, refused with the output zeroed. */
static void case_check(int n, struct aegis_case *c, const uint8_t *rct, const uint8_t *rtag, uint64_t *r,
		       uint8_t *buf)
{
	uint8_t tag[16];
	size_t m = c->mlen;
	aegis256_encrypt(buf, tag, c->msg, m, c->ad, c->adlen, c->nonce, c->key);
	cr_assert(memcmp(buf, rct, m) == 0 && memcmp(tag, rtag, 16) == 0,
		  "case %d (%zu bytes, ad %zu): sealed otherwise than the reference", n, m, c->adlen);
	size_t cut = next(r) % 2 ? (size_t)(next(r) % (m + 1)) : (m / 32) * 16 + (size_t)(next(r) % 3);
	cut = cut > m ? m : cut;
	memcpy(buf, c->msg, cut);   /* the first part in place, as a frame's header */
	aegis256_encrypt2(buf, tag, buf, cut, c->msg + cut, m - cut, c->ad, c->adlen, c->nonce, c->key);
	cr_assert(memcmp(buf, rct, m) == 0 && memcmp(tag, rtag, 16) == 0, "case %d (%zu bytes) cut at %zu", n, m,
		  cut);
	memset(buf, 0xa5, m);
	cr_assert_eq(aegis256_decrypt(buf, rct, m, rtag, c->ad, c->adlen, c->nonce, c->key), 0,
		     "case %d: the reference's ciphertext refused", n);
	cr_assert_eq(memcmp(buf, c->msg, m), 0, "case %d: opened to another message", n);
	memcpy(buf, rct, m);
	cr_assert_eq(aegis256_decrypt(buf, buf, m, rtag, c->ad, c->adlen, c->nonce, c->key), 0, "case %d", n);
	cr_assert_eq(memcmp(buf, c->msg, m), 0, "case %d: opened in place to another message", n);
	/* Tampered: which field, which byte, which bit. */
	uint8_t ftag[16], *fields[] = { buf, ftag, c->ad, c->nonce, c->key };
	size_t sizes[] = { m, 16, c->adlen, 32, 32 }, f;
	do
		f = next(r) % 5;
	while (!sizes[f]);
	memcpy(buf, rct, m);
	memcpy(ftag, rtag, 16);
	size_t at = next(r) % sizes[f];
	uint8_t bit = (uint8_t)(1u << (next(r) % 8));
	fields[f][at] ^= bit;
	int rc = aegis256_decrypt(buf, buf, m, ftag, c->ad, c->adlen, c->nonce, c->key);
	if (f > 1)
		fields[f][at] ^= bit;   /* the case's own ad, nonce or key, restored */
	cr_assert_eq(rc, -1, "case %d: field %zu byte %zu changed, yet it opened", n, f, at);
	for (size_t j = 0; j < m; j++)
		cr_assert_eq(buf[j], 0, "case %d: field %zu changed: output not zeroed at %zu", n, f, j);
}

/* 3,000 cases (messages of 0..70,000 bytes, ad of 0..300, half the lengths
 * at block edges) sealed by tests/aegis_ref.py with libaegis (PyPI's aeg,
 * installed by make deps-test), then checked here byte for byte. */
Test(aegis, matches_an_independent_implementation, .timeout = 300)
{
	need_aegis();
	char py[PATH_MAX], script[PATH_MAX], dir[200], cases[300], out[300], log[300], cmd[3 * PATH_MAX];
	test_repo_path(py, sizeof(py), "build/pyvenv/bin/python");
	test_repo_path(script, sizeof(script), "tests/aegis_ref.py");
	snprintf(cmd, sizeof(cmd), "'%s' -c 'import aeg' 2>/dev/null", py);
	if (access(py, X_OK) != 0 || system(cmd) != 0)
		cr_skip_test("aeg is not installed in build/pyvenv (make deps-test installs it): no independent AEGIS-256 to compare with");
	test_dir_make(dir, sizeof(dir), "aegisref");
	snprintf(cases, sizeof(cases), "%s/cases", dir);
	snprintf(out, sizeof(out), "%s/out", dir);
	snprintf(log, sizeof(log), "%s/log", dir);
	struct aegis_case c = { .ad = malloc(REF_AD_MAX), .msg = malloc(REF_MSG_MAX) };
	uint8_t *buf = malloc(REF_MSG_MAX + 16), *rct = malloc(REF_MSG_MAX + 16);
	cr_assert(c.ad && c.msg && buf && rct);
	uint64_t r = 38;
	FILE *f = fopen(cases, "wb");
	cr_assert_not_null(f);
	size_t edges = 0;
	for (int n = 0; n < REF_CASES; n++) {
		case_draw(&c, &r);
		uint32_t lens[2] = { (uint32_t)c.adlen, (uint32_t)c.mlen };
		cr_assert(fwrite(c.key, 32, 1, f) == 1 && fwrite(c.nonce, 32, 1, f) == 1 &&
			  fwrite(lens, 8, 1, f) == 1 && fwrite(c.ad, 1, c.adlen, f) == c.adlen &&
			  fwrite(c.msg, 1, c.mlen, f) == c.mlen);
		edges += (c.mlen + 1) % 16 <= 2;
	}
	cr_assert_eq(fclose(f), 0);
	cr_assert_geq(edges, REF_CASES / 3, "only %zu of %d messages at a block's edge", edges, REF_CASES);
	snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s' '%s' > '%s' 2>&1", py, script, cases, out, log);
	cr_assert_eq(system(cmd), 0, "aegis_ref.py failed:\n%s", slurp(log));
	f = fopen(out, "rb");
	cr_assert_not_null(f);
	uint64_t again = 38, pick = 380;
	for (int n = 0; n < REF_CASES; n++) {
		case_draw(&c, &again);
		uint8_t rtag[16];
		cr_assert(fread(rct, 1, c.mlen, f) == c.mlen && fread(rtag, 16, 1, f) == 1, "case %d: short output", n);
		case_check(n, &c, rct, rtag, &pick, buf);
	}
	cr_assert_eq(fgetc(f), EOF, "the reference wrote more than %d cases", REF_CASES);
	fclose(f);
	free(c.ad), free(c.msg), free(buf), free(rct);
	test_dir_remove(dir);
}
