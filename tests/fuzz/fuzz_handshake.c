/* libFuzzer harness for the handshake's parsers: hs_server_respond on a
 * HELLO1 and hs_client_finish on a HELLO2. Random bytes never pass the MAC,
 * so the first input byte picks a mode: bit 0 = as the client (else the
 * server), bit 1 = "fix the MAC", where the harness MACs the next 112 bytes
 * with the test key as docs/PROTOCOL.md says, so that every field check
 * after authentication is reached. Checks the error contract (negative
 * errno, one line), that nothing is committed on failure, that a reply is
 * sent only on success or a version/config mismatch (and then carries no
 * ephemeral key: it cost no X25519), and that a success names a valid
 * peer that greeted this ps. */
#include "../../net/handshake.h"
#include "fuzz.h"

#include <errno.h>

#include <sodium.h>

static const uint8_t PSK[HS_PSK_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
					  12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
					  23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	FUZZ_CHECK(sodium_init() >= 0);
	return 0;
}

static struct hs_identity ident(enum hs_role role, uint32_t index)
{
	struct hs_identity id;
	memset(&id, 0, sizeof id);
	id.role = role;
	id.index = index;
	memset(id.config_hash, 0x42, sizeof id.config_hash);
	id.ciphers = 0;
	return id;
}

/* MAC = BLAKE2b-256(key = BLAKE2b-256(key = PSK, label), prefix || fields). */
static void fix_mac(uint8_t hello[HS_HELLO_BYTES], const uint8_t *prefix, size_t plen)
{
	uint8_t mk[32], buf[2 * HS_HELLO_BYTES];
	FUZZ_CHECK(crypto_generichash(mk, 32, (const uint8_t *)"pstrain hs mac v1", 17, PSK,
				      32) == 0);
	if (plen)
		memcpy(buf, prefix, plen);
	memcpy(buf + plen, hello, 112);
	FUZZ_CHECK(crypto_generichash(hello + 112, 32, buf, plen + 112, mk, 32) == 0);
}

static int is_zero(const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		if (b[i])
			return 0;
	return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	int as_client = data[0] & 1, fix = data[0] & 2;
	data++;
	size--;

	uint8_t in[HS_HELLO_BYTES + 64];
	size_t inlen = size < sizeof in ? size : sizeof in;
	memset(in, 0, sizeof in);
	memcpy(in, data, inlen);

	struct hs_identity w = ident(HS_WORKER, 1), p = ident(HS_PS, 0);
	struct hs_result res;
	memset(&res, 0, sizeof res);
	char err[512] = "";
	int ret;

	if (!as_client) {
		if (fix) {
			inlen = HS_HELLO_BYTES;
			fix_mac(in, NULL, 0);
		}
		uint8_t out[HS_HELLO_BYTES];
		size_t outlen = 12345;
		ret = hs_server_respond(&res, out, &outlen, PSK, &p, in, inlen, err, sizeof err);
		if (ret == 0 || ret == -EPROTONOSUPPORT || ret == -EBADE)
			FUZZ_CHECK(outlen == HS_HELLO_BYTES);
		else
			FUZZ_CHECK(outlen == 0);
		/* a mismatch's answer cost no key generation: no ephemeral key */
		if (ret == -EPROTONOSUPPORT || ret == -EBADE)
			FUZZ_CHECK(is_zero(out + 48, 32));
		/* only a greeting for this ps is answered in full */
		if (ret == 0)
			FUZZ_CHECK(res.peer.to == p.index);
	} else {
		struct hs h;
		uint8_t hello1[HS_HELLO_BYTES];
		FUZZ_CHECK(hs_client_start(&h, hello1, PSK, &w, err, sizeof err) == 0);
		if (fix) {
			inlen = HS_HELLO_BYTES;
			fix_mac(in, hello1, HS_HELLO_BYTES);
		}
		ret = hs_client_finish(&h, &res, in, inlen, err, sizeof err);
		if (ret == 0)
			FUZZ_CHECK(is_zero(&h, sizeof h));
		hs_wipe(&h);
	}
	if (ret) {
		fuzz_check_err(ret, err);
		FUZZ_CHECK(is_zero(&res, sizeof res));
		if (!fix)
			FUZZ_CHECK(ret == -EMSGSIZE || ret == -EACCES);
	} else {
		FUZZ_CHECK(res.peer.role == HS_PS || res.peer.role == HS_WORKER ||
			   res.peer.role == HS_OBSERVER);
		FUZZ_CHECK(res.send.counter == 0 && res.recv.counter == 0);
		FUZZ_CHECK(memcmp(res.send.key, res.recv.key, FRAME_KEY_BYTES) != 0);
	}
	sodium_memzero(&res, sizeof res);
	return 0;
}
