/* The handshake (see handshake.h for the contract, docs/PROTOCOL.md for the
 * bytes).
 *
 * Pattern: PSK + ephemeral X25519, in the spirit of Noise NNpsk0, cut down
 * to what a cluster with one shared key needs:
 *
 *   -> HELLO1: magic, version, step 1, role, ciphers, index, config tag, e, time,
 *              nonce, to (the ps it is for)
 *              mac1 = BLAKE2b(key = mac_key, HELLO1 fields)
 *   <- HELLO2: the same fields for the server, step 2
 *              mac2 = BLAKE2b(key = mac_key, HELLO1 || HELLO2 fields)
 *   mac_key    = BLAKE2b-256(key = psk, "pstrain hs mac v1")
 *   th         = BLAKE2b-256(HELLO1 || HELLO2)
 *   k          = BLAKE2b-512(key = psk, "pstrain session v1" || th || DH(e, e'))
 *   client->server key = k[0..32), server->client key = k[32..64)
 *   config tag = BLAKE2b-256(key = psk, "pstrain config v1" || config hash)
 *
 * Why it is enough: a MAC under the cluster key proves membership before
 * the receiver reads a field or spends an X25519 operation; mac2 covers
 * HELLO1, which holds the client's fresh ephemeral key and nonce, so an old
 * HELLO2 cannot be replayed to a new client; HELLO1 carries the client's
 * clock, so a server that keeps the newest time per peer (WireGuard's
 * TAI64N timestamp) answers no replayed HELLO1, and a replay it answers
 * after a restart still cannot open a frame; HELLO1 names the ps it is
 * for, so what a server remembers of the greetings it answered covers
 * every greeting that could ever reach it (one recorded on its way to
 * another ps is refused, not fresh); the config hash travels keyed,
 * so an observer cannot test guesses about the training config against
 * it; the session keys need both the
 * ephemeral DH result (forward secrecy against a later leak of the cluster
 * key) and the key itself, and hash the whole transcript (so both sides
 * agree on every field, the cipher flags included, or nothing opens).
 * Rejected: a full Noise implementation (a second dependency or a
 * hand-rolled state machine for patterns we never use), and static
 * per-node keys (one cluster key is the whole trust model, DESIGN §7).
 *
 * Style of noise.c: every step is a tagged block, everything is computed in
 * locals, the caller's state is written only in the final commit step, and
 * the secrets are wiped on the single exit path. */
#include "handshake.h"
#include "../base/err.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "wire.h"

_Static_assert(HS_PSK_BYTES == 32, "cluster key size");
_Static_assert(crypto_scalarmult_BYTES == 32 && crypto_scalarmult_SCALARBYTES == 32,
	       "X25519 sizes");
_Static_assert(crypto_generichash_BYTES_MAX >= 2 * FRAME_KEY_BYTES, "BLAKE2b output");
_Static_assert(crypto_generichash_KEYBYTES_MAX >= HS_PSK_BYTES, "BLAKE2b key");

/* HELLO layout (both steps). Magic, version, step, role and index keep
 * these offsets in every protocol version, so a peer of another version is
 * still told which version it met. */
enum {
	OFF_MAGIC = 0,     /* u32 WIRE_MAGIC */
	OFF_VERSION = 4,   /* u32 WIRE_VERSION */
	OFF_STEP = 8,      /* u8 1 = HELLO1 (client), 2 = HELLO2 (server) */
	OFF_ROLE = 9,      /* u8 enum hs_role */
	OFF_CIPHERS = 10,  /* u8 FRAME_OFFER_* bits */
	OFF_LOCAL = 11,    /* u8 0, or 1: over a Unix socket on one host */
	OFF_INDEX = 12,    /* u32 */
	OFF_CONFIG = 16,   /* 32 bytes: config hash */
	OFF_EPK = 48,      /* 32 bytes: ephemeral X25519 public key */
	OFF_TIME = 80,     /* u64 nanoseconds since the epoch (HELLO1; 0 in HELLO2) */
	OFF_NONCE = 88,    /* 20 bytes: random */
	OFF_TO = 108,      /* u32 the index of the ps the greeting is for (HELLO1; 0 in HELLO2) */
	OFF_MAC = 112,     /* 32 bytes */
	HS_FIELDS_BYTES = OFF_MAC,
	HS_MAC_BYTES = 32,
	HS_NONCE_BYTES = 20,
};
_Static_assert(OFF_MAC + HS_MAC_BYTES == HS_HELLO_BYTES, "hello layout");
_Static_assert(OFF_NONCE + HS_NONCE_BYTES == OFF_TO && OFF_TO + 4 == OFF_MAC, "hello layout");

#define STEP_CLIENT 1
#define STEP_SERVER 2

static const char MAC_LABEL[] = "pstrain hs mac v1";
static const char SESSION_LABEL[] = "pstrain session v1";
static const char CONFIG_LABEL[] = "pstrain config v1";


const char *hs_role_name(enum hs_role role)
{
	switch (role) {
	case HS_PS:
		return "ps";
	case HS_WORKER:
		return "worker";
	case HS_OBSERVER:
		return "observer";
	}
	return "?";
}

static int role_valid(uint32_t role)
{
	return role == HS_PS || role == HS_WORKER || role == HS_OBSERVER;
}

/* "worker 3", or "a peer" when its role is unknown. */
static void node_name(char *buf, size_t len, const struct hs_identity *id)
{
	if (role_valid(id->role))
		snprintf(buf, len, "%s %u", hs_role_name(id->role), id->index);
	else
		snprintf(buf, len, "a peer");
}

static int identity_check(const struct hs_identity *me, char *err, size_t errlen)
{
	if (!role_valid(me->role)) {
		(void)err_set(err, errlen, 0, "handshake: unknown local role %d", (int)me->role);
		return -EINVAL;
	}
	if (me->ciphers & ~FRAME_OFFER_ALL) {
		(void)err_set(err, errlen, 0, "handshake: unknown cipher bits 0x%x offered",
			me->ciphers);
		return -EINVAL;
	}
	if (me->local < 0 || me->local > HS_LOCAL_RING) {
		(void)err_set(err, errlen, 0, "handshake: local flag must be 0, 1 or 2, not %d", me->local);
		return -EINVAL;
	}
	if (me->ciphers & ~frame_offers()) {
		(void)err_set(err, errlen, 0, "handshake: %s offered but this CPU lacks it",
			me->ciphers & ~frame_offers() & FRAME_OFFER_AEGIS256 ? "AEGIS-256"
									     : "AES-256-GCM");
		return -ENOTSUP;
	}
	return 0;
}

/* The cipher for both directions: a symmetric function of the flags, so
 * both sides pick the same one. No cipher only when both sides say their
 * socket is a Unix one: the flags are under the MAC and in the session
 * keys' transcript, so a relay that offers a worker a Unix socket and
 * carries its greeting to the ps over TCP gets a cipher, never
 * plaintext. Otherwise the best cipher both offer (frame_cipher_choose). */
static enum frame_cipher cipher_for(const struct hs_identity *a, const struct hs_identity *b)
{
	if (a->local && b->local)
		return FRAME_LOCAL;
	return frame_cipher_choose(a->ciphers, b->ciphers);
}

HS_MUST_CHECK static int mac_key_derive(uint8_t mac_key[32], const uint8_t psk[HS_PSK_BYTES])
{
	return crypto_generichash(mac_key, 32, (const uint8_t *)MAC_LABEL,
				  sizeof MAC_LABEL - 1, psk, HS_PSK_BYTES);
}

/* mac = BLAKE2b-256(key = mac_key, prefix || fields); prefix may be empty. */
HS_MUST_CHECK static int mac_compute(uint8_t mac[HS_MAC_BYTES], const uint8_t mac_key[32],
				     const uint8_t *prefix, size_t prefixlen,
				     const uint8_t fields[HS_FIELDS_BYTES])
{
	crypto_generichash_state st;
	int rc = crypto_generichash_init(&st, mac_key, 32, HS_MAC_BYTES);
	if (rc == 0 && prefixlen)
		rc = crypto_generichash_update(&st, prefix, prefixlen);
	if (rc == 0)
		rc = crypto_generichash_update(&st, fields, HS_FIELDS_BYTES);
	if (rc == 0)
		rc = crypto_generichash_final(&st, mac, HS_MAC_BYTES);
	sodium_memzero(&st, sizeof st);
	return rc;
}

/* Checks the size and the MAC of a received hello; nothing else is read. */
HS_MUST_CHECK static int hello_verify(const uint8_t mac_key[32], const uint8_t *prefix,
				      size_t prefixlen, const uint8_t *in, size_t inlen,
				      const char *what, char *err, size_t errlen)
{
	if (inlen != HS_HELLO_BYTES) {
		(void)err_set(err, errlen, 0, "%s of %zu bytes, expected %u", what, inlen,
			HS_HELLO_BYTES);
		return -EMSGSIZE;
	}
	uint8_t mac[HS_MAC_BYTES];
	if (mac_compute(mac, mac_key, prefix, prefixlen, in) != 0) {
		(void)err_set(err, errlen, 0, "%s: BLAKE2b failed", what);
		return -EIO;
	}
	int bad = sodium_memcmp(mac, in + OFF_MAC, HS_MAC_BYTES);
	sodium_memzero(mac, sizeof mac);
	if (bad) {
		(void)err_set(err, errlen, 0,
			"%s failed authentication (the peer has another cluster key, or the "
			"bytes were modified or replayed)",
			what);
		return -EACCES;
	}
	return 0;
}

/* Writes the fields of a hello (everything before the MAC). */
static void hello_fields(uint8_t out[HS_FIELDS_BYTES], uint8_t step,
			 const struct hs_identity *me, const uint8_t tag[HS_HASH_BYTES],
			 uint64_t time_ns, const uint8_t epk[32], const uint8_t nonce[HS_NONCE_BYTES])
{
	memset(out, 0, HS_FIELDS_BYTES);
	wire_put_u32(out + OFF_MAGIC, WIRE_MAGIC);
	wire_put_u32(out + OFF_VERSION, WIRE_VERSION);
	out[OFF_STEP] = step;
	out[OFF_ROLE] = (uint8_t)me->role;
	out[OFF_CIPHERS] = (uint8_t)me->ciphers;
	out[OFF_LOCAL] = (uint8_t)me->local;
	wire_put_u32(out + OFF_INDEX, me->index);
	memcpy(out + OFF_CONFIG, tag, HS_HASH_BYTES);
	memcpy(out + OFF_EPK, epk, 32);
	wire_put_u64(out + OFF_TIME, time_ns);
	memcpy(out + OFF_NONCE, nonce, HS_NONCE_BYTES);
	wire_put_u32(out + OFF_TO, step == STEP_CLIENT ? me->to : 0);
}

/* The config hash as it travels: keyed with the cluster key, so that only
 * a key holder can tell which config a greeting's sender trains. */
HS_MUST_CHECK static int config_tag(uint8_t tag[HS_HASH_BYTES], const uint8_t psk[HS_PSK_BYTES],
				    const uint8_t hash[HS_HASH_BYTES])
{
	crypto_generichash_state st;
	int rc = crypto_generichash_init(&st, psk, HS_PSK_BYTES, HS_HASH_BYTES);
	if (rc == 0)
		rc = crypto_generichash_update(&st, (const uint8_t *)CONFIG_LABEL,
					       sizeof CONFIG_LABEL - 1);
	if (rc == 0)
		rc = crypto_generichash_update(&st, hash, HS_HASH_BYTES);
	if (rc == 0)
		rc = crypto_generichash_final(&st, tag, HS_HASH_BYTES);
	sodium_memzero(&st, sizeof st);
	return rc;
}

/* Reads an authenticated hello's fields into peer, time_ns and epk, and
 * checks the protocol version against ours and the config tag against
 * my_tag (peer->config_hash is the peer's tag). -EPROTO for a malformed
 * hello; -EPROTONOSUPPORT / -EBADE for a mismatch, with the message naming
 * the peer and us. A hello of another version is read only as far as the
 * fields every version shares. */
HS_MUST_CHECK static int hello_parse(struct hs_identity *peer, uint64_t *time_ns, uint8_t epk[32],
				     const uint8_t in[HS_HELLO_BYTES], uint8_t step,
				     const struct hs_identity *me, const uint8_t my_tag[HS_HASH_BYTES],
				     char *err, size_t errlen)
{
	char pname[48], mname[48];
	uint32_t magic = wire_get_u32(in + OFF_MAGIC);
	if (magic != WIRE_MAGIC) {
		(void)err_set(err, errlen, 0, "handshake: bad magic 0x%08x (not a pstrain peer)", magic);
		return -EPROTO;
	}
	memset(peer, 0, sizeof *peer);
	peer->role = (enum hs_role)in[OFF_ROLE];
	peer->index = wire_get_u32(in + OFF_INDEX);
	node_name(pname, sizeof pname, peer);
	node_name(mname, sizeof mname, me);

	uint32_t version = wire_get_u32(in + OFF_VERSION);
	if (version != WIRE_VERSION) {
		(void)err_set(err, errlen, 0,
			"%s speaks protocol version %u, %s speaks version %u: run the same "
			"pstrain release on every node",
			pname, version, mname, WIRE_VERSION);
		return -EPROTONOSUPPORT;
	}
	if (in[OFF_STEP] != step) {
		(void)err_set(err, errlen, 0, "handshake: expected step %u, got %u", step,
			in[OFF_STEP]);
		return -EPROTO;
	}
	if (!role_valid(in[OFF_ROLE])) {
		(void)err_set(err, errlen, 0, "handshake: unknown peer role %u", in[OFF_ROLE]);
		return -EPROTO;
	}
	if ((in[OFF_CIPHERS] & ~FRAME_OFFER_ALL) || in[OFF_LOCAL] > HS_LOCAL_RING) {
		(void)err_set(err, errlen, 0, "handshake: bad flags from %s (ciphers 0x%x, local %u)",
			pname, in[OFF_CIPHERS], in[OFF_LOCAL]);
		return -EPROTO;
	}
	peer->ciphers = in[OFF_CIPHERS];
	peer->local = in[OFF_LOCAL];
	peer->to = wire_get_u32(in + OFF_TO);
	memcpy(peer->config_hash, in + OFF_CONFIG, HS_HASH_BYTES);
	memcpy(epk, in + OFF_EPK, 32);
	*time_ns = wire_get_u64(in + OFF_TIME);

	/* A greeting for another ps: one recorded on its way there, or a
	 * peer whose list of ps differs. Refused before the config is
	 * compared, so it is never answered (handshake.h). */
	if (step == STEP_CLIENT && peer->to != me->index) {
		(void)err_set(err, errlen, 0, "greeting from %s for ps %u, and this is %s (recorded on its "
			"way there and replayed, or that peer's [cluster] ps list differs)", pname, peer->to, mname);
		return -EADDRNOTAVAIL;
	}

	if (memcmp(peer->config_hash, my_tag, HS_HASH_BYTES) != 0) {
		const uint8_t *a = peer->config_hash, *b = my_tag;
		(void)err_set(err, errlen, 0,
			"%s has a different training config than %s (config hash "
			"%02x%02x%02x%02x vs %02x%02x%02x%02x): use the same config on every "
			"node",
			pname, mname, a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]);
		return -EBADE;
	}
	return 0;
}

/* A fresh ephemeral key pair and nonce. */
HS_MUST_CHECK static int ephemeral_new(uint8_t esk[32], uint8_t epk[32],
				       uint8_t nonce[HS_NONCE_BYTES])
{
	randombytes_buf(esk, 32);
	randombytes_buf(nonce, HS_NONCE_BYTES);
	return crypto_scalarmult_base(epk, esk);
}

/* Session keys from the DH result, the cluster key and the transcript;
 * send/recv are set for the client or the server side. */
HS_MUST_CHECK static int session_keys(struct frame_key *send, struct frame_key *recv,
				      int is_client, const uint8_t psk[HS_PSK_BYTES],
				      const uint8_t esk[32], const uint8_t peer_epk[32],
				      const uint8_t hello1[HS_HELLO_BYTES],
				      const uint8_t hello2[HS_HELLO_BYTES],
				      enum frame_cipher cipher)
{
	uint8_t shared[32], th[32], k[2 * FRAME_KEY_BYTES];
	crypto_generichash_state st;
	int rc;

	/* dh: an all-zero result (a low-order peer key) is refused */
	rc = crypto_scalarmult(shared, esk, peer_epk) == 0 ? 0 : -EPROTO;
	if (rc < 0)
		goto out;

	/* th = BLAKE2b-256(HELLO1 || HELLO2) */
	rc = crypto_generichash_init(&st, NULL, 0, sizeof th);
	if (rc == 0)
		rc = crypto_generichash_update(&st, hello1, HS_HELLO_BYTES);
	if (rc == 0)
		rc = crypto_generichash_update(&st, hello2, HS_HELLO_BYTES);
	if (rc == 0)
		rc = crypto_generichash_final(&st, th, sizeof th);

	/* k = BLAKE2b-512(key = psk, label || th || shared) */
	if (rc == 0)
		rc = crypto_generichash_init(&st, psk, HS_PSK_BYTES, sizeof k);
	if (rc == 0)
		rc = crypto_generichash_update(&st, (const uint8_t *)SESSION_LABEL,
					       sizeof SESSION_LABEL - 1);
	if (rc == 0)
		rc = crypto_generichash_update(&st, th, sizeof th);
	if (rc == 0)
		rc = crypto_generichash_update(&st, shared, sizeof shared);
	if (rc == 0)
		rc = crypto_generichash_final(&st, k, sizeof k);
	if (rc != 0) {
		rc = -EIO;
		goto out;
	}

	/* split: k[0..32) client->server, k[32..64) server->client */
	const uint8_t *c2s = k, *s2c = k + FRAME_KEY_BYTES;
	rc = frame_key_init(send, is_client ? c2s : s2c, cipher);
	if (rc == 0)
		rc = frame_key_init(recv, is_client ? s2c : c2s, cipher);

out:
	sodium_memzero(shared, sizeof shared);
	sodium_memzero(th, sizeof th);
	sodium_memzero(k, sizeof k);
	sodium_memzero(&st, sizeof st);
	return rc;
}

int hs_client_start(struct hs *h, uint8_t out[HS_HELLO_BYTES], const uint8_t psk[HS_PSK_BYTES],
		    const struct hs_identity *me, char *err, size_t errlen)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	return hs_client_start_at(h, out, psk, me, now, err, errlen);
}

int hs_client_start_at(struct hs *h, uint8_t out[HS_HELLO_BYTES], const uint8_t psk[HS_PSK_BYTES],
		       const struct hs_identity *me, uint64_t time_ns, char *err, size_t errlen)
{
	uint8_t mac_key[32], esk[32], epk[32], nonce[HS_NONCE_BYTES], hello1[HS_HELLO_BYTES];
	uint8_t tag[HS_HASH_BYTES];
	int rc;

	/* me */
	rc = identity_check(me, err, errlen);
	if (rc < 0)
		goto out;

	/* e: ephemeral key pair and nonce */
	if (ephemeral_new(esk, epk, nonce) != 0 || mac_key_derive(mac_key, psk) != 0 ||
	    config_tag(tag, psk, me->config_hash) != 0) {
		(void)err_set(err, errlen, 0, "handshake: key generation failed");
		rc = -EIO;
		goto out;
	}

	/* HELLO1 = fields || mac1 */
	hello_fields(hello1, STEP_CLIENT, me, tag, time_ns, epk, nonce);
	if (mac_compute(hello1 + OFF_MAC, mac_key, NULL, 0, hello1) != 0) {
		(void)err_set(err, errlen, 0, "handshake: BLAKE2b failed");
		rc = -EIO;
		goto out;
	}

	/* commit */
	memcpy(h->psk, psk, HS_PSK_BYTES);
	memcpy(h->esk, esk, sizeof esk);
	memcpy(h->hello1, hello1, HS_HELLO_BYTES);
	h->me = *me;
	memcpy(out, hello1, HS_HELLO_BYTES);
	rc = 0;

out:
	sodium_memzero(mac_key, sizeof mac_key);
	sodium_memzero(esk, sizeof esk);
	return rc;
}

/* The server's reading of HELLO1: size and MAC before any field (a
 * failure: drop without a reply), then the fields (hello_parse's errors).
 * mac_key and tag (ours) are left for the answer; the caller wipes
 * mac_key. */
HS_MUST_CHECK static int hello1_read(const uint8_t psk[HS_PSK_BYTES], const struct hs_identity *me,
				     const uint8_t *in, size_t inlen, uint8_t mac_key[32],
				     uint8_t tag[HS_HASH_BYTES], struct hs_identity *peer,
				     uint64_t *time_ns, uint8_t peer_epk[32], char *err, size_t errlen)
{
	if (mac_key_derive(mac_key, psk) != 0 || config_tag(tag, psk, me->config_hash) != 0) {
		(void)err_set(err, errlen, 0, "handshake: BLAKE2b failed");
		return -EIO;
	}
	int rc = hello_verify(mac_key, NULL, 0, in, inlen, "client hello", err, errlen);
	if (rc < 0)
		return rc;
	return hello_parse(peer, time_ns, peer_epk, in, STEP_CLIENT, me, tag, err, errlen);
}

int hs_server_respond(struct hs_result *res, uint8_t out[HS_HELLO_BYTES], size_t *outlen,
		      const uint8_t psk[HS_PSK_BYTES], const struct hs_identity *me,
		      const uint8_t *in, size_t inlen, char *err, size_t errlen)
{
	uint8_t mac_key[32], esk[32], epk[32], nonce[HS_NONCE_BYTES], peer_epk[32];
	uint8_t hello2[HS_HELLO_BYTES], tag[HS_HASH_BYTES];
	uint64_t peer_time = 0;
	struct hs_identity peer;
	struct frame_key send, recv;
	int rc, mismatch;

	*outlen = 0;
	memset(&send, 0, sizeof send);
	memset(&recv, 0, sizeof recv);

	/* me */
	rc = identity_check(me, err, errlen);
	if (rc < 0)
		goto out;

	/* size, mac1, then fields, version, config: a mismatch still gets
	 * our HELLO2, so the client can say what differs too */
	rc = hello1_read(psk, me, in, inlen, mac_key, tag, &peer, &peer_time, peer_epk, err, errlen);
	mismatch = rc == -EPROTONOSUPPORT || rc == -EBADE;
	if (rc < 0 && !mismatch)
		goto out;

	/* e: only now, for an authenticated peer of our version and config.
	 * A mismatch is answered so that the peer can name it too, but no
	 * session follows, so the answer carries no ephemeral key (zeros,
	 * never read: both versions' readers stop at the mismatch) and costs
	 * no X25519: a recorded greeting of another version, which no replay
	 * check can date, is answered as often as it is replayed. */
	memset(epk, 0, sizeof epk);
	memset(esk, 0, sizeof esk);
	randombytes_buf(nonce, sizeof nonce);
	if (!mismatch && ephemeral_new(esk, epk, nonce) != 0) {
		(void)err_set(err, errlen, 0, "handshake: key generation failed");
		rc = -EIO;
		goto out;
	}

	/* HELLO2 = fields || mac2, mac2 over HELLO1 || fields */
	hello_fields(hello2, STEP_SERVER, me, tag, 0, epk, nonce);
	if (mac_compute(hello2 + OFF_MAC, mac_key, in, HS_HELLO_BYTES, hello2) != 0) {
		(void)err_set(err, errlen, 0, "handshake: BLAKE2b failed");
		rc = -EIO;
		goto out;
	}
	if (mismatch) {
		memcpy(out, hello2, HS_HELLO_BYTES);
		*outlen = HS_HELLO_BYTES;
		goto out; /* rc and err from hello_parse */
	}

	/* dh, keys */
	rc = session_keys(&send, &recv, 0, psk, esk, peer_epk, in, hello2,
			  cipher_for(me, &peer));
	if (rc < 0) {
		char pname[48];
		node_name(pname, sizeof pname, &peer);
		(void)err_set(err, errlen, 0, "handshake: key agreement with %s failed (%s)", pname,
			rc == -EPROTO ? "invalid ephemeral key" : "internal error");
		goto out;
	}

	/* commit */
	memcpy(out, hello2, HS_HELLO_BYTES);
	*outlen = HS_HELLO_BYTES;
	res->send = send;
	res->recv = recv;
	res->peer = peer;
	res->peer_time_ns = peer_time;
	rc = 0;

out:
	sodium_memzero(mac_key, sizeof mac_key);
	sodium_memzero(esk, sizeof esk);
	frame_key_wipe(&send);
	frame_key_wipe(&recv);
	return rc;
}

int hs_server_peek(const uint8_t psk[HS_PSK_BYTES], const struct hs_identity *me,
		   const uint8_t *in, size_t inlen, struct hs_identity *peer, uint64_t *time_ns,
		   char *err, size_t errlen)
{
	uint8_t mac_key[32], tag[HS_HASH_BYTES], epk[32];
	struct hs_identity p;
	uint64_t t = 0;
	memset(&p, 0, sizeof p);
	int rc = hello1_read(psk, me, in, inlen, mac_key, tag, &p, &t, epk, err, errlen);
	if (rc == 0 || rc == -EBADE || rc == -EPROTONOSUPPORT || rc == -EADDRNOTAVAIL) {
		*peer = p;
		*time_ns = rc == -EPROTONOSUPPORT ? 0 : t;
	}
	sodium_memzero(mac_key, sizeof mac_key);
	return rc;
}

int hs_client_finish(struct hs *h, struct hs_result *res, const uint8_t *in, size_t inlen,
		     char *err, size_t errlen)
{
	uint8_t mac_key[32], peer_epk[32], tag[HS_HASH_BYTES];
	uint64_t peer_time = 0;
	struct hs_identity peer;
	struct frame_key send, recv;
	int rc;

	memset(&send, 0, sizeof send);
	memset(&recv, 0, sizeof recv);

	/* size, mac2: bound to our HELLO1, so an old reply does not verify */
	if (mac_key_derive(mac_key, h->psk) != 0 || config_tag(tag, h->psk, h->me.config_hash) != 0) {
		(void)err_set(err, errlen, 0, "handshake: BLAKE2b failed");
		rc = -EIO;
		goto out;
	}
	rc = hello_verify(mac_key, h->hello1, HS_HELLO_BYTES, in, inlen, "server hello", err,
			  errlen);
	if (rc < 0)
		goto out;

	/* fields, version, config */
	rc = hello_parse(&peer, &peer_time, peer_epk, in, STEP_SERVER, &h->me, tag, err, errlen);
	if (rc < 0)
		goto out;

	/* dh, keys */
	rc = session_keys(&send, &recv, 1, h->psk, h->esk, peer_epk, h->hello1, in,
			  cipher_for(&h->me, &peer));
	if (rc < 0) {
		char pname[48];
		node_name(pname, sizeof pname, &peer);
		(void)err_set(err, errlen, 0, "handshake: key agreement with %s failed (%s)", pname,
			rc == -EPROTO ? "invalid ephemeral key" : "internal error");
		goto out;
	}

	/* commit */
	res->send = send;
	res->recv = recv;
	res->peer = peer;
	res->peer_time_ns = peer_time;
	hs_wipe(h);
	rc = 0;

out:
	sodium_memzero(mac_key, sizeof mac_key);
	frame_key_wipe(&send);
	frame_key_wipe(&recv);
	return rc;
}

void hs_wipe(struct hs *h)
{
	if (h)
		sodium_memzero(h, sizeof *h);
}
