/* Tests of net/handshake.c: a full in-memory handshake gives both sides
 * matching per-direction frame keys; the bytes and the key derivation match
 * docs/PROTOCOL.md (rebuilt here independently with libsodium); and every
 * rejection (wrong cluster key on either side, a flipped bit anywhere in
 * either hello, a wrong size, a replayed reply, malformed fields, version
 * and config mismatches, a greeting for another ps) returns its code and
 * message with nothing committed. The socket side (timeouts, logging, no reply) is tested with
 * the network layer. */
#include <criterion/criterion.h>

#include "leak.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "../net/frame.h"
#include "../net/handshake.h"
#include "../net/wire.h"

static void setup(void)
{
	cr_assert(sodium_init() >= 0, "sodium_init failed");
}

TestSuite(handshake, .init = setup, .fini = leak_check);

/* ---- helpers ------------------------------------------------------------ */

#define HELLO HS_HELLO_BYTES

static uint8_t PSK_A[HS_PSK_BYTES], PSK_B[HS_PSK_BYTES];

static void keys_init(void)
{
	for (int i = 0; i < HS_PSK_BYTES; i++) {
		PSK_A[i] = (uint8_t)(i + 1);
		PSK_B[i] = (uint8_t)(i + 1);
	}
	PSK_B[31] ^= 0x80; /* one bit away from A */
}

static struct hs_identity ident(enum hs_role role, uint32_t index, uint8_t cfg0)
{
	struct hs_identity id;
	memset(&id, 0, sizeof id);
	id.role = role;
	id.index = index;
	for (int i = 0; i < (int)HS_HASH_BYTES; i++)
		id.config_hash[i] = (uint8_t)(cfg0 + i);
	id.ciphers = frame_offers();
	return id;
}

static int all_zero(const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		if (b[i])
			return 0;
	return 1;
}

static void start_ok(struct hs *h, uint8_t hello1[HELLO], const uint8_t *psk,
		     const struct hs_identity *me)
{
	char err[256] = "";
	int rc = hs_client_start(h, hello1, psk, me, err, sizeof err);
	cr_assert_eq(rc, 0, "client start: %d %s", rc, err);
}

static void respond_ok(struct hs_result *res, uint8_t hello2[HELLO], const uint8_t *psk,
		       const struct hs_identity *me, const uint8_t hello1[HELLO])
{
	char err[256] = "";
	size_t n = 999;
	int rc = hs_server_respond(res, hello2, &n, psk, me, hello1, HELLO, err, sizeof err);
	cr_assert_eq(rc, 0, "server respond: %d %s", rc, err);
	cr_assert_eq(n, HELLO);
}

static void finish_ok(struct hs *h, struct hs_result *res, const uint8_t hello2[HELLO])
{
	char err[256] = "";
	int rc = hs_client_finish(h, res, hello2, HELLO, err, sizeof err);
	cr_assert_eq(rc, 0, "client finish: %d %s", rc, err);
	cr_assert(all_zero(h, sizeof *h), "client state not wiped after success");
}

/* A whole handshake between a client c (greeting s) and a server s, both
 * with psk. */
static void handshake(struct hs_result *cr, struct hs_result *sr, const struct hs_identity *c,
		      const struct hs_identity *s)
{
	struct hs h;
	uint8_t hello1[HELLO], hello2[HELLO];
	struct hs_identity to_s = *c;
	to_s.to = s->index;
	start_ok(&h, hello1, PSK_A, &to_s);
	respond_ok(sr, hello2, PSK_A, s, hello1);
	finish_ok(&h, cr, hello2);
}

/* One message each way through frame_seal / frame_open. */
static void frame_cross(struct frame_key *tx, struct frame_key *rx, const char *msg)
{
	uint8_t buf[256], out[256];
	size_t len = strlen(msg), n = 0, ctlen = 0, outlen = 0;
	char err[160] = "";
	cr_assert_eq(frame_seal(tx, buf, sizeof buf, (const uint8_t *)msg, len, &n, err,
				sizeof err),
		     0, "seal: %s", err);
	cr_assert_eq(frame_check_len(buf, &ctlen, err, sizeof err), 0, "%s", err);
	int rc = frame_open(rx, buf, buf + FRAME_HDR_BYTES, ctlen, out, sizeof out, &outlen, err,
			    sizeof err);
	cr_assert_eq(rc, 0, "open \"%s\": %d %s", msg, rc, err);
	cr_assert_eq(outlen, len);
	cr_assert(memcmp(out, msg, len) == 0);
}

static void check_pair(struct hs_result *cr, struct hs_result *sr, enum frame_cipher want)
{
	cr_assert(memcmp(cr->send.key, sr->recv.key, FRAME_KEY_BYTES) == 0,
		  "client send key != server recv key");
	cr_assert(memcmp(cr->recv.key, sr->send.key, FRAME_KEY_BYTES) == 0,
		  "client recv key != server send key");
	cr_assert(memcmp(cr->send.key, cr->recv.key, FRAME_KEY_BYTES) != 0,
		  "both directions share a key");
	cr_assert(!all_zero(cr->send.key, FRAME_KEY_BYTES));
	cr_assert(!all_zero(cr->recv.key, FRAME_KEY_BYTES));
	cr_assert_eq(cr->send.counter, 0);
	cr_assert_eq(cr->recv.counter, 0);
	cr_assert_eq(sr->send.counter, 0);
	cr_assert_eq(sr->recv.counter, 0);
	cr_assert_eq(cr->send.cipher, want, "client send cipher %s",
		     frame_cipher_name(cr->send.cipher));
	cr_assert_eq(cr->recv.cipher, want);
	cr_assert_eq(sr->send.cipher, want, "server send cipher %s",
		     frame_cipher_name(sr->send.cipher));
	cr_assert_eq(sr->recv.cipher, want);
	frame_cross(&cr->send, &sr->recv, "PUSH from the worker");
	frame_cross(&sr->send, &cr->recv, "PARAMS from the ps");
	frame_cross(&cr->send, &sr->recv, "second frame");
}

/* ---- an independent encoder, from docs/PROTOCOL.md ------------------------ */

struct fields {
	uint32_t magic, version;
	uint8_t step, role, ciphers, local;
	uint32_t index;
	uint8_t config[32], epk[32]; /* config: the hash; forge keys it */
	uint64_t time;
	uint8_t nonce[20];
	uint32_t to; /* HELLO1: the ps it is for */
};

static void le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void doc_mac_key(uint8_t mk[32], const uint8_t *psk)
{
	cr_assert_eq(crypto_generichash(mk, 32, (const uint8_t *)"pstrain hs mac v1", 17, psk,
					32),
		     0);
}

/* The config hash as it travels: BLAKE2b-256(key = K, "pstrain config v1"
 * || hash). */
static void doc_tag(uint8_t tag[32], const uint8_t *psk, const uint8_t hash[32])
{
	uint8_t in[17 + 32];
	memcpy(in, "pstrain config v1", 17);
	memcpy(in + 17, hash, 32);
	cr_assert_eq(crypto_generichash(tag, 32, in, sizeof in, psk, 32), 0);
}

/* MAC = BLAKE2b-256(key = mac_key, prefix || fields[0..112)). */
static void doc_mac(uint8_t mac[32], const uint8_t *psk, const uint8_t *prefix, size_t plen,
		    const uint8_t *fields)
{
	uint8_t mk[32], buf[2 * HELLO];
	doc_mac_key(mk, psk);
	if (plen)
		memcpy(buf, prefix, plen);
	memcpy(buf + plen, fields, 112);
	cr_assert_eq(crypto_generichash(mac, 32, buf, plen + 112, mk, 32), 0);
}

/* A hello with these fields, MAC'd with psk over prefix (HELLO1 for a
 * HELLO2, NULL for a HELLO1). */
static void forge(uint8_t out[HELLO], const struct fields *f, const uint8_t *psk,
		  const uint8_t *prefix)
{
	le32(out + 0, f->magic);
	le32(out + 4, f->version);
	out[8] = f->step;
	out[9] = f->role;
	out[10] = f->ciphers;
	out[11] = f->local;
	le32(out + 12, f->index);
	doc_tag(out + 16, psk, f->config);
	memcpy(out + 48, f->epk, 32);
	for (int i = 0; i < 8; i++)
		out[80 + i] = (uint8_t)(f->time >> (8 * i));
	memcpy(out + 88, f->nonce, 20);
	le32(out + 108, f->to);
	doc_mac(out + 112, psk, prefix, prefix ? HELLO : 0, out);
}

/* Sensible fields for id with a fresh ephemeral key (secret in esk). */
static struct fields fields_for(const struct hs_identity *id, uint8_t step, uint8_t esk[32])
{
	struct fields f;
	memset(&f, 0, sizeof f);
	f.magic = 0x52545350u;
	f.version = WIRE_VERSION;
	f.step = step;
	f.role = (uint8_t)id->role;
	f.ciphers = (uint8_t)id->ciphers;
	f.index = id->index;
	memcpy(f.config, id->config_hash, 32);
	randombytes_buf(esk, 32);
	cr_assert_eq(crypto_scalarmult_base(f.epk, esk), 0);
	f.time = step == 1 ? (uint64_t)time(NULL) * 1000000000u : 0;
	randombytes_buf(f.nonce, 20);
	f.to = step == 1 ? id->to : 0;
	return f;
}

/* The two session keys per the docs: k = BLAKE2b-512(key = psk,
 * "pstrain session v1" || BLAKE2b-256(HELLO1 || HELLO2) || X25519). */
static void doc_keys(uint8_t c2s[32], uint8_t s2c[32], const uint8_t *psk, const uint8_t esk[32],
		     const uint8_t peer_epk[32], const uint8_t hello1[HELLO],
		     const uint8_t hello2[HELLO])
{
	uint8_t tr[2 * HELLO], th[32], shared[32], in[18 + 32 + 32], k[64];
	memcpy(tr, hello1, HELLO);
	memcpy(tr + HELLO, hello2, HELLO);
	cr_assert_eq(crypto_generichash(th, 32, tr, sizeof tr, NULL, 0), 0);
	cr_assert_eq(crypto_scalarmult(shared, esk, peer_epk), 0);
	memcpy(in, "pstrain session v1", 18);
	memcpy(in + 18, th, 32);
	memcpy(in + 50, shared, 32);
	cr_assert_eq(crypto_generichash(k, 64, in, sizeof in, psk, 32), 0);
	memcpy(c2s, k, 32);
	memcpy(s2c, k + 32, 32);
}

/* ---- success ------------------------------------------------------------ */

Test(handshake, keys_match_and_frames_cross)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 1, 7), p = ident(HS_PS, 0, 7);
	struct hs_result cr, sr;
	handshake(&cr, &sr, &w, &p);
	check_pair(&cr, &sr, frame_cipher_choose(w.ciphers, p.ciphers));

	/* each side sees the other's identity */
	cr_assert_eq(cr.peer.role, HS_PS);
	cr_assert_eq(cr.peer.index, 0);
	cr_assert_eq(cr.peer.ciphers, p.ciphers);
	uint8_t tag[32];
	doc_tag(tag, PSK_A, p.config_hash);
	cr_assert(memcmp(cr.peer.config_hash, tag, HS_HASH_BYTES) == 0, "the peer's keyed config tag");
	cr_assert(memcmp(tag, p.config_hash, HS_HASH_BYTES) != 0, "the tag is not the hash");
	cr_assert_eq(sr.peer.role, HS_WORKER);
	cr_assert_eq(sr.peer.index, 1);
	cr_assert_str_eq(hs_role_name(sr.peer.role), "worker");
	cr_assert_str_eq(hs_role_name(cr.peer.role), "ps");
	cr_assert_str_eq(hs_role_name((enum hs_role)0), "?");
}

/* An observer (`pstrain status`) greets like a worker: the handshake
 * takes the role and names it; what it may ask is the ps's business. */
Test(handshake, observer_role_round_trips)
{
	keys_init();
	struct hs_identity o = ident(HS_OBSERVER, 0, 7), p = ident(HS_PS, 2, 7);
	struct hs_result cr, sr;
	handshake(&cr, &sr, &o, &p);
	check_pair(&cr, &sr, frame_cipher_choose(o.ciphers, p.ciphers));
	cr_assert_eq(sr.peer.role, HS_OBSERVER);
	cr_assert_eq(sr.peer.index, 0);
	cr_assert_eq(cr.peer.role, HS_PS);
	cr_assert_str_eq(hs_role_name(sr.peer.role), "observer");
}

Test(handshake, large_index_round_trips)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 0xa1b2c3d4u, 9), p = ident(HS_PS, 65536, 9);
	struct hs_result cr, sr;
	handshake(&cr, &sr, &w, &p);
	cr_assert_eq(sr.peer.index, 0xa1b2c3d4u);
	cr_assert_eq(cr.peer.index, 65536);
}

Test(handshake, two_handshakes_have_different_keys)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 1, 7), p = ident(HS_PS, 0, 7);
	struct hs_result cr1, sr1, cr2, sr2;
	handshake(&cr1, &sr1, &w, &p);
	handshake(&cr2, &sr2, &w, &p);
	cr_assert(memcmp(cr1.send.key, cr2.send.key, FRAME_KEY_BYTES) != 0);
	cr_assert(memcmp(cr1.recv.key, cr2.recv.key, FRAME_KEY_BYTES) != 0);
	cr_assert(memcmp(sr1.send.key, sr2.send.key, FRAME_KEY_BYTES) != 0);

	/* a frame of session 1 does not open in session 2 */
	uint8_t buf[64], out[64];
	size_t n = 0, ctlen = 0, outlen = 0;
	cr_assert_eq(frame_seal(&cr1.send, buf, sizeof buf, (const uint8_t *)"x", 1, &n, NULL, 0),
		     0);
	cr_assert_eq(frame_check_len(buf, &ctlen, NULL, 0), 0);
	cr_assert_eq(frame_open(&sr2.recv, buf, buf + 4, ctlen, out, sizeof out, &outlen, NULL, 0),
		     -EBADMSG);
}

/* Every pair of offers: both ends pick the same cipher, the best they
 * share (AEGIS-256, then AES-256-GCM, then ChaCha20-Poly1305). */
Test(handshake, cipher_offers_agree)
{
	keys_init();
	int pairs = 0;
	for (unsigned ca = 0; ca <= FRAME_OFFER_ALL; ca++) {
		for (unsigned sa = 0; sa <= FRAME_OFFER_ALL; sa++) {
			struct hs_identity w = ident(HS_WORKER, 2, 3), p = ident(HS_PS, 1, 3);
			w.ciphers = ca;
			p.ciphers = sa;
			if ((ca | sa) & ~frame_offers()) {
				/* offering a cipher this CPU lacks is refused up front */
				struct hs h;
				uint8_t hello[HELLO];
				char err[256] = "";
				if (ca & ~frame_offers())
					cr_assert_eq(hs_client_start(&h, hello, PSK_A, &w, err,
								     sizeof err),
						     -ENOTSUP, "client offers 0x%x: %s", ca, err);
				continue;
			}
			struct hs_result cr, sr;
			handshake(&cr, &sr, &w, &p);
			unsigned both = ca & sa;
			enum frame_cipher want = both & FRAME_OFFER_AEGIS256    ? FRAME_AEGIS256
						 : both & FRAME_OFFER_AES256GCM ? FRAME_AES256GCM
										: FRAME_CHACHA20POLY1305;
			check_pair(&cr, &sr, want);
			cr_assert_eq(cr.peer.ciphers, sa);
			cr_assert_eq(sr.peer.ciphers, ca);
			pairs++;
		}
	}
	cr_assert_geq(pairs, 1);
	if (frame_offers() != FRAME_OFFER_ALL)
		cr_log_warn("this CPU offers 0x%x: some cipher pairs were not run",
			    frame_offers());
}

/* The hello bytes and both keys, rebuilt from docs/PROTOCOL.md: the test
 * plays the server against hs_client_*, then the client against
 * hs_server_respond. */
Test(handshake, bytes_match_protocol)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 0x01020304u, 5), p = ident(HS_PS, 2, 5);
	w.ciphers = 0;
	p.ciphers = 0;
	w.to = 2;

	/* HELLO1 from hs_client_start, field by field */
	struct hs h;
	uint8_t hello1[HELLO], hello2[HELLO], mac[32];
	start_ok(&h, hello1, PSK_A, &w);
	const uint8_t head[16] = {'P', 'S', 'T', 'R', 17, 0, 0, 0, 1, 2, 0, 0, 4, 3, 2, 1};
	cr_assert(memcmp(hello1, head, 16) == 0, "HELLO1 header bytes differ");
	uint8_t tag[32];
	doc_tag(tag, PSK_A, w.config_hash);
	cr_assert(memcmp(hello1 + 16, tag, 32) == 0, "HELLO1 config tag");
	uint8_t esk_c[32];
	memcpy(esk_c, h.esk, 32);
	uint8_t epk_c[32];
	cr_assert_eq(crypto_scalarmult_base(epk_c, esk_c), 0);
	cr_assert(memcmp(hello1 + 48, epk_c, 32) == 0, "HELLO1 ephemeral key");
	uint64_t t = 0;
	for (int i = 0; i < 8; i++)
		t |= (uint64_t)hello1[80 + i] << (8 * i);
	uint64_t now = (uint64_t)time(NULL) * 1000000000u;
	cr_assert(t + 5000000000u > now && t < now + 5000000000u, "HELLO1 time %llu, now %llu",
		  (unsigned long long)t, (unsigned long long)now);
	cr_assert(!all_zero(hello1 + 88, 20), "HELLO1 nonce");
	const uint8_t to[4] = {2, 0, 0, 0};
	cr_assert(memcmp(hello1 + 108, to, 4) == 0, "HELLO1 names ps 2 as its destination");
	doc_mac(mac, PSK_A, NULL, 0, hello1);
	cr_assert(memcmp(hello1 + 112, mac, 32) == 0, "HELLO1 MAC");

	/* a HELLO2 built by hand is accepted, with the documented keys */
	uint8_t esk_s[32], c2s[32], s2c[32];
	struct fields f = fields_for(&p, 2, esk_s);
	forge(hello2, &f, PSK_A, hello1);
	struct hs_result cr;
	finish_ok(&h, &cr, hello2);
	doc_keys(c2s, s2c, PSK_A, esk_s, hello1 + 48, hello1, hello2);
	cr_assert(memcmp(cr.send.key, c2s, 32) == 0, "client send key != documented c2s");
	cr_assert(memcmp(cr.recv.key, s2c, 32) == 0, "client recv key != documented s2c");
	cr_assert_eq(cr.send.cipher, FRAME_CHACHA20POLY1305);

	/* a HELLO1 built by hand is accepted; its HELLO2 matches the docs */
	uint8_t esk_w[32];
	struct fields g = fields_for(&w, 1, esk_w);
	forge(hello1, &g, PSK_A, NULL);
	struct hs_result sr;
	respond_ok(&sr, hello2, PSK_A, &p, hello1);
	const uint8_t head2[16] = {'P', 'S', 'T', 'R', 17, 0, 0, 0, 2, 1, 0, 0, 2, 0, 0, 0};
	cr_assert(memcmp(hello2, head2, 16) == 0, "HELLO2 header bytes differ");
	cr_assert(all_zero(hello2 + 80, 8) && all_zero(hello2 + 108, 4), "HELLO2's time and to are 0");
	doc_mac(mac, PSK_A, hello1, HELLO, hello2);
	cr_assert(memcmp(hello2 + 112, mac, 32) == 0, "HELLO2 MAC");
	doc_keys(c2s, s2c, PSK_A, esk_w, hello2 + 48, hello1, hello2);
	cr_assert(memcmp(sr.recv.key, c2s, 32) == 0, "server recv key != documented c2s");
	cr_assert(memcmp(sr.send.key, s2c, 32) == 0, "server send key != documented s2c");
	cr_assert_eq(sr.peer.index, 0x01020304u);
}

/* ---- rejections --------------------------------------------------------- */

/* Server: expects rc, no reply (or a reply when want_reply), res and out
 * untouched unless replying, and err containing what. */
static void respond_fails(const uint8_t *psk, const struct hs_identity *me, const uint8_t *in,
			  size_t inlen, int want_rc, int want_reply, const char *what,
			  const char *ctx)
{
	struct hs_result res, before;
	uint8_t out[HELLO];
	memset(&res, 0x5a, sizeof res);
	memcpy(&before, &res, sizeof res);
	memset(out, 0xa5, sizeof out);
	size_t n = 777;
	char err[256] = "";
	int rc = hs_server_respond(&res, out, &n, psk, me, in, inlen, err, sizeof err);
	cr_assert_eq(rc, want_rc, "%s: rc %d (%s), want %d", ctx, rc, err, want_rc);
	cr_assert(memcmp(&res, &before, sizeof res) == 0, "%s: result written on failure", ctx);
	if (want_reply) {
		cr_assert_eq(n, HELLO, "%s: no reply to a mismatch", ctx);
	} else {
		cr_assert_eq(n, 0, "%s: reply length %zu, want none", ctx, n);
		for (size_t i = 0; i < HELLO; i++)
			cr_assert_eq(out[i], 0xa5, "%s: out written without a reply", ctx);
	}
	cr_assert(strstr(err, what), "%s: reason \"%s\" lacks \"%s\"", ctx, err, what);
}

/* Client: expects rc with res and h unchanged, err containing what. */
static void finish_fails(struct hs *h, const uint8_t *in, size_t inlen, int want_rc,
			 const char *what, const char *ctx)
{
	struct hs_result res, before;
	struct hs hbefore;
	memset(&res, 0x5a, sizeof res);
	memcpy(&before, &res, sizeof res);
	memcpy(&hbefore, h, sizeof hbefore);
	char err[256] = "";
	int rc = hs_client_finish(h, &res, in, inlen, err, sizeof err);
	cr_assert_eq(rc, want_rc, "%s: rc %d (%s), want %d", ctx, rc, err, want_rc);
	cr_assert(memcmp(&res, &before, sizeof res) == 0, "%s: result written on failure", ctx);
	cr_assert(memcmp(h, &hbefore, sizeof hbefore) == 0, "%s: state changed on failure", ctx);
	cr_assert(strstr(err, what), "%s: reason \"%s\" lacks \"%s\"", ctx, err, what);
}

Test(handshake, server_rejects_wrong_cluster_key)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 1, 7), p = ident(HS_PS, 0, 7);
	struct hs h;
	uint8_t hello1[HELLO];
	start_ok(&h, hello1, PSK_A, &w);
	respond_fails(PSK_B, &p, hello1, HELLO, -EACCES, 0, "failed authentication",
		      "server with key B");
	hs_wipe(&h);
	cr_assert(all_zero(&h, sizeof h));
}

Test(handshake, client_rejects_wrong_cluster_key)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 1, 7), p = ident(HS_PS, 0, 7);
	struct hs h;
	uint8_t hello1[HELLO], hello2[HELLO], esk[32];
	start_ok(&h, hello1, PSK_A, &w);
	/* a well-formed reply to this very HELLO1, MAC'd with key B */
	struct fields f = fields_for(&p, 2, esk);
	forge(hello2, &f, PSK_B, hello1);
	finish_fails(&h, hello2, HELLO, -EACCES, "failed authentication", "reply with key B");
	/* the same reply with key A passes: only the key made the difference */
	forge(hello2, &f, PSK_A, hello1);
	struct hs_result cr;
	finish_ok(&h, &cr, hello2);
}

Test(handshake, every_bit_of_hello1_is_authenticated)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 1, 7), p = ident(HS_PS, 0, 7);
	struct hs h;
	uint8_t hello1[HELLO], bad[HELLO], hello2[HELLO];
	start_ok(&h, hello1, PSK_A, &w);
	for (int i = 0; i < (int)HELLO; i++) {
		for (int b = 0; b < 8; b++) {
			char ctx[64];
			snprintf(ctx, sizeof ctx, "HELLO1 byte %d bit %d", i, b);
			memcpy(bad, hello1, HELLO);
			bad[i] ^= (uint8_t)(1u << b);
			respond_fails(PSK_A, &p, bad, HELLO, -EACCES, 0,
				      "failed authentication", ctx);
		}
	}
	/* the genuine one still works */
	struct hs_result cr, sr;
	respond_ok(&sr, hello2, PSK_A, &p, hello1);
	finish_ok(&h, &cr, hello2);
	check_pair(&cr, &sr, frame_cipher_choose(w.ciphers, p.ciphers));
}

Test(handshake, every_bit_of_hello2_is_authenticated)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 1, 7), p = ident(HS_PS, 0, 7);
	struct hs h;
	uint8_t hello1[HELLO], hello2[HELLO], bad[HELLO];
	struct hs_result cr, sr;
	start_ok(&h, hello1, PSK_A, &w);
	respond_ok(&sr, hello2, PSK_A, &p, hello1);
	for (int i = 0; i < (int)HELLO; i++) {
		for (int b = 0; b < 8; b++) {
			char ctx[64];
			snprintf(ctx, sizeof ctx, "HELLO2 byte %d bit %d", i, b);
			memcpy(bad, hello2, HELLO);
			bad[i] ^= (uint8_t)(1u << b);
			finish_fails(&h, bad, HELLO, -EACCES, "failed authentication", ctx);
		}
	}
	/* nothing was committed: the genuine reply still completes */
	finish_ok(&h, &cr, hello2);
	check_pair(&cr, &sr, frame_cipher_choose(w.ciphers, p.ciphers));
}

Test(handshake, wrong_size_rejected_before_parsing)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 1, 7), p = ident(HS_PS, 0, 7);
	struct hs h;
	uint8_t hello1[HELLO + 1], hello2[HELLO + 1];
	struct hs_result sr;
	start_ok(&h, hello1, PSK_A, &w);
	hello1[HELLO] = 0;
	/* a valid hello followed by one more byte, and every short prefix */
	respond_fails(PSK_A, &p, hello1, HELLO + 1, -EMSGSIZE, 0, "145 bytes, expected 144",
		      "HELLO1 + 1");
	for (size_t n = 0; n < HELLO; n += 13)
		respond_fails(PSK_A, &p, hello1, n, -EMSGSIZE, 0, "expected 144", "short HELLO1");
	respond_fails(PSK_A, &p, hello1, HELLO - 1, -EMSGSIZE, 0, "143 bytes", "HELLO1 - 1");

	respond_ok(&sr, hello2, PSK_A, &p, hello1);
	hello2[HELLO] = 0;
	finish_fails(&h, hello2, HELLO + 1, -EMSGSIZE, "145 bytes, expected 144", "HELLO2 + 1");
	finish_fails(&h, hello2, HELLO - 1, -EMSGSIZE, "143 bytes", "HELLO2 - 1");
	finish_fails(&h, hello2, 0, -EMSGSIZE, "0 bytes", "empty HELLO2");
	struct hs_result cr;
	finish_ok(&h, &cr, hello2);
}

Test(handshake, replayed_hello2_rejected)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 1, 7), p = ident(HS_PS, 0, 7);
	struct hs h1, h2;
	uint8_t a1[HELLO], a2[HELLO], b1[HELLO], b2[HELLO];
	struct hs_result cr, sr;
	start_ok(&h1, a1, PSK_A, &w);
	respond_ok(&sr, a2, PSK_A, &p, a1);
	finish_ok(&h1, &cr, a2);

	/* a new handshake is offered the earlier reply */
	start_ok(&h2, b1, PSK_A, &w);
	cr_assert(memcmp(a1, b1, HELLO) != 0, "two HELLO1s are identical");
	finish_fails(&h2, a2, HELLO, -EACCES, "replayed", "old HELLO2");
	respond_ok(&sr, b2, PSK_A, &p, b1);
	finish_ok(&h2, &cr, b2);
}

Test(handshake, reflected_hello1_rejected)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 1, 7);
	struct hs h;
	uint8_t hello1[HELLO];
	start_ok(&h, hello1, PSK_A, &w);
	/* the client's own hello sent back to it */
	finish_fails(&h, hello1, HELLO, -EACCES, "failed authentication", "reflected HELLO1");
	hs_wipe(&h);
}

Test(handshake, config_mismatch_names_both_sides)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 1, 0), p = ident(HS_PS, 0, 0);
	const uint8_t wc[4] = {0x1a, 0x2b, 0x3c, 0x4d}, pc[4] = {0x5e, 0x6f, 0x7a, 0x8b};
	memcpy(w.config_hash, wc, 4);
	memcpy(p.config_hash, pc, 4);
	struct hs h;
	uint8_t hello1[HELLO], hello2[HELLO];
	start_ok(&h, hello1, PSK_A, &w);

	/* the server refuses, but replies so the worker can say it too */
	struct hs_result sr, before;
	memset(&sr, 0x5a, sizeof sr);
	memcpy(&before, &sr, sizeof sr);
	size_t n = 0;
	char err[256] = "";
	int rc = hs_server_respond(&sr, hello2, &n, PSK_A, &p, hello1, HELLO, err, sizeof err);
	cr_assert_eq(rc, -EBADE, "rc %d (%s)", rc, err);
	cr_assert_eq(n, HELLO);
	cr_assert(memcmp(&sr, &before, sizeof sr) == 0, "result written on a mismatch");
	/* the hashes travel keyed: the message shows the tags */
	uint8_t wt[32], pt[32];
	char want[300];
	doc_tag(wt, PSK_A, w.config_hash);
	doc_tag(pt, PSK_A, p.config_hash);
	snprintf(want, sizeof want, "worker 1 has a different training config than ps 0 (config hash "
		 "%02x%02x%02x%02x vs %02x%02x%02x%02x): use the same config on every node",
		 wt[0], wt[1], wt[2], wt[3], pt[0], pt[1], pt[2], pt[3]);
	cr_assert_str_eq(err, want);

	snprintf(want, sizeof want, "ps 0 has a different training config than worker 1 (config hash "
		 "%02x%02x%02x%02x vs %02x%02x%02x%02x)",
		 pt[0], pt[1], pt[2], pt[3], wt[0], wt[1], wt[2], wt[3]);
	finish_fails(&h, hello2, HELLO, -EBADE, want, "client sees the mismatch");
	hs_wipe(&h);
}

Test(handshake, version_mismatch_names_both_sides)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 3, 7), p = ident(HS_PS, 0, 7);
	uint8_t esk[32], hello1[HELLO], hello2[HELLO];

	/* a worker of the next version, with the right key */
	char want[128];
	struct fields f = fields_for(&w, 1, esk);
	f.version = WIRE_VERSION + 1;
	forge(hello1, &f, PSK_A, NULL);
	snprintf(want, sizeof(want), "worker 3 speaks protocol version %u, ps 0 speaks version %u",
		 WIRE_VERSION + 1, WIRE_VERSION);
	respond_fails(PSK_A, &p, hello1, HELLO, -EPROTONOSUPPORT, 1, want, "next-version worker");

	/* a ps of the next version answering this version's worker */
	struct hs h;
	start_ok(&h, hello1, PSK_A, &w);
	struct fields g = fields_for(&p, 2, esk);
	g.version = WIRE_VERSION + 1;
	forge(hello2, &g, PSK_A, hello1);
	snprintf(want, sizeof(want), "ps 0 speaks protocol version %u, worker 3 speaks version %u",
		 WIRE_VERSION + 1, WIRE_VERSION);
	finish_fails(&h, hello2, HELLO, -EPROTONOSUPPORT, want, "next-version ps");
	hs_wipe(&h);
}

/* A greeting of another version or config is answered, so that both
 * sides can name the mismatch, but no session follows: the answer carries
 * no ephemeral key (its 32 bytes are 0), so a replayed greeting of another
 * version, which no replay check can date, costs the ps two BLAKE2b calls
 * and no X25519. The answer still authenticates for the greeting's sender
 * and names the mismatch there. */
Test(handshake, mismatch_answer_costs_no_key_generation)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 3, 7), p = ident(HS_PS, 0, 7), q = ident(HS_PS, 0, 8);
	uint8_t esk[32], hello1[HELLO], hello2[HELLO];
	struct hs_result res;
	size_t n = 0;
	char err[256];
	struct fields f = fields_for(&w, 1, esk);
	f.version = WIRE_VERSION - 1;
	forge(hello1, &f, PSK_A, NULL);
	cr_assert_eq(hs_server_respond(&res, hello2, &n, PSK_A, &p, hello1, HELLO, err, sizeof err),
		     -EPROTONOSUPPORT, "%s", err);
	cr_assert_eq(n, HELLO);
	cr_assert(all_zero(hello2 + 48, 32), "an answer to version %u carries an ephemeral key",
		  WIRE_VERSION - 1);
	uint8_t mac[32];
	doc_mac(mac, PSK_A, hello1, HELLO, hello2);
	cr_assert(memcmp(hello2 + 112, mac, 32) == 0, "the answer's MAC");

	struct hs h;
	start_ok(&h, hello1, PSK_A, &w);
	n = 0;
	cr_assert_eq(hs_server_respond(&res, hello2, &n, PSK_A, &q, hello1, HELLO, err, sizeof err),
		     -EBADE, "%s", err);
	cr_assert_eq(n, HELLO);
	cr_assert(all_zero(hello2 + 48, 32), "an answer to another config carries an ephemeral key");
	finish_fails(&h, hello2, HELLO, -EBADE, "different training config", "config mismatch");
	hs_wipe(&h);
}

/* Authenticated (right key) but malformed hellos: one row per field. */
Test(handshake, malformed_fields_rejected)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 1, 7), p = ident(HS_PS, 0, 7);
	static const struct {
		const char *name;
		int field;
		uint32_t value;
		int rc;
		const char *what;
	} rows[] = {
		{"bad magic", 0, 0x12345678u, -EPROTO, "bad magic 0x12345678"},
		{"server step", 1, 2, -EPROTO, "expected step 1, got 2"},
		{"step 0", 1, 0, -EPROTO, "expected step 1, got 0"},
		{"role 0", 2, 0, -EPROTO, "unknown peer role 0"},
		{"role 4", 2, 4, -EPROTO, "unknown peer role 4"},
		{"ciphers 4", 3, 4, -EPROTO, "bad flags from worker 1 (ciphers 0x4"},
		{"ciphers 0x80", 3, 0x80, -EPROTO, "ciphers 0x80"},
		{"local 3", 4, 3, -EPROTO, "local 3"},
		{"zero ephemeral key", 5, 0, -EPROTO, "invalid ephemeral key"},
	};
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		uint8_t esk[32], hello1[HELLO];
		struct fields f = fields_for(&w, 1, esk);
		switch (rows[i].field) {
		case 0: f.magic = rows[i].value; break;
		case 1: f.step = (uint8_t)rows[i].value; break;
		case 2: f.role = (uint8_t)rows[i].value; break;
		case 3: f.ciphers = (uint8_t)rows[i].value; break;
		case 4: f.local = (uint8_t)rows[i].value; break;
		case 5: memset(f.epk, 0, 32); break;
		}
		forge(hello1, &f, PSK_A, NULL);
		respond_fails(PSK_A, &p, hello1, HELLO, rows[i].rc, 0, rows[i].what, rows[i].name);
	}

	/* the client side: a HELLO1 (step 1) where a HELLO2 belongs */
	struct hs h;
	uint8_t hello1[HELLO], hello2[HELLO], esk[32];
	start_ok(&h, hello1, PSK_A, &w);
	struct fields g = fields_for(&p, 1, esk);
	forge(hello2, &g, PSK_A, hello1);
	finish_fails(&h, hello2, HELLO, -EPROTO, "expected step 2, got 1", "client step");
	hs_wipe(&h);
}

Test(handshake, invalid_local_identity_refused)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 1, 7);
	w.role = (enum hs_role)0;
	struct hs h;
	memset(&h, 0x33, sizeof h);
	uint8_t hello1[HELLO];
	memset(hello1, 0x44, sizeof hello1);
	char err[256] = "";
	cr_assert_eq(hs_client_start(&h, hello1, PSK_A, &w, err, sizeof err), -EINVAL);
	cr_assert(strstr(err, "unknown local role 0"), "%s", err);
	for (size_t i = 0; i < sizeof h; i++)
		cr_assert_eq(((uint8_t *)&h)[i], 0x33, "state written on failure");
	for (size_t i = 0; i < HELLO; i++)
		cr_assert_eq(hello1[i], 0x44, "hello written on failure");

	w.role = HS_WORKER;
	w.ciphers = 4;
	cr_assert_eq(hs_client_start(&h, hello1, PSK_A, &w, err, sizeof err), -EINVAL);
	cr_assert(strstr(err, "unknown cipher bits 0x4"), "%s", err);

	struct hs_identity p = ident(HS_PS, 0, 7);
	p.role = (enum hs_role)9;
	uint8_t in[HELLO] = {0};
	respond_fails(PSK_A, &p, in, HELLO, -EINVAL, 0, "unknown local role 9", "server role");
}

/* The ps's look before it answers: who and when, for its replay check;
 * a greeting that fails the MAC tells nothing. */
Test(handshake, peek_reads_who_and_when)
{
	keys_init();
	struct hs_identity w = ident(HS_WORKER, 7, 3), p = ident(HS_PS, 0, 3), q = ident(HS_PS, 0, 4);
	struct hs h;
	uint8_t hello1[HELLO];
	char err[256];
	cr_assert_eq(hs_client_start_at(&h, hello1, PSK_A, &w, 1234567890123ull, err, sizeof err), 0,
		     "%s", err);
	hs_wipe(&h);
	struct hs_identity peer;
	uint64_t t = 0;
	cr_assert_eq(hs_server_peek(PSK_A, &p, hello1, HELLO, &peer, &t, err, sizeof err), 0, "%s", err);
	cr_assert_eq(peer.role, HS_WORKER);
	cr_assert_eq(peer.index, 7);
	cr_assert_eq(t, 1234567890123ull);
	/* another config: still who and when (the answer will say it differs) */
	t = 0;
	cr_assert_eq(hs_server_peek(PSK_A, &q, hello1, HELLO, &peer, &t, err, sizeof err), -EBADE);
	cr_assert_eq(t, 1234567890123ull);
	/* another key: nothing */
	t = 0;
	cr_assert_eq(hs_server_peek(PSK_B, &p, hello1, HELLO, &peer, &t, err, sizeof err), -EACCES);
	cr_assert_eq(t, 0);
	cr_assert_eq(hs_server_peek(PSK_A, &p, hello1, HELLO - 1, &peer, &t, err, sizeof err), -EMSGSIZE);
}

/* A greeting names the ps it is for, under the MAC: one recorded on its
 * way to ps 0 (a worker's, or `pstrain status`'s) and replayed to ps 1 is
 * refused there without an answer, though it is fresh to ps 1, so each
 * ps's memory of the greetings it answered covers every greeting it can
 * be sent. Changing the field breaks the MAC. */
Test(handshake, greeting_for_another_ps_is_refused)
{
	keys_init();
	struct hs_identity p0 = ident(HS_PS, 0, 7), p1 = ident(HS_PS, 1, 7);
	const struct hs_identity who[] = { ident(HS_WORKER, 3, 7), ident(HS_OBSERVER, 0, 7) };
	const char *const name[] = { "worker 3", "observer 0" };
	for (int i = 0; i < 2; i++) {
		struct hs_identity c = who[i];
		c.to = 0;
		struct hs h;
		uint8_t hello1[HELLO], hello2[HELLO];
		char want[160], err[256];
		start_ok(&h, hello1, PSK_A, &c);
		snprintf(want, sizeof want, "greeting from %s for ps 0, and this is ps 1", name[i]);
		respond_fails(PSK_A, &p1, hello1, HELLO, -EADDRNOTAVAIL, 0, want, name[i]);
		struct hs_identity peer;
		uint64_t t = 0;
		cr_assert_eq(hs_server_peek(PSK_A, &p1, hello1, HELLO, &peer, &t, err, sizeof err),
			     -EADDRNOTAVAIL, "%s", err);
		cr_assert_eq(peer.role, who[i].role);
		cr_assert_eq(peer.to, 0);
		cr_assert_neq(t, 0);
		/* with its destination rewritten it no longer authenticates */
		hello1[108] = 1;
		respond_fails(PSK_A, &p1, hello1, HELLO, -EACCES, 0, "failed authentication", name[i]);
		hello1[108] = 0;
		/* the ps it was for answers it */
		struct hs_result sr, cr;
		respond_ok(&sr, hello2, PSK_A, &p0, hello1);
		finish_ok(&h, &cr, hello2);
		check_pair(&cr, &sr, frame_cipher_choose(c.ciphers, p0.ciphers));
		cr_assert_eq(sr.peer.to, 0);
	}
}

/* No cipher only when both ends say their socket is a Unix one. A relay
 * that offers a worker a Unix socket and carries its greeting to the ps
 * over TCP leaves one flag 0, so the frames stay sealed; and since the
 * flags are under the MAC, it cannot set the ps's flag either. */
Test(handshake, local_flag_needs_both_sides)
{
	keys_init();
	for (int cl = 0; cl <= 1; cl++) {
		for (int sl = 0; sl <= 1; sl++) {
			struct hs_identity w = ident(HS_WORKER, 2, 3), p = ident(HS_PS, 1, 3);
			w.local = cl;
			p.local = sl;
			struct hs_result cr, sr;
			handshake(&cr, &sr, &w, &p);
			enum frame_cipher want = cl && sl ? FRAME_LOCAL
								: frame_cipher_choose(w.ciphers,
										      p.ciphers);
			check_pair(&cr, &sr, want);
			cr_assert_eq(cr.peer.local, sl);
			cr_assert_eq(sr.peer.local, cl);
		}
	}
	/* A relay flipping the worker's flag on its way breaks the MAC. */
	struct hs_identity w = ident(HS_WORKER, 2, 3), p = ident(HS_PS, 1, 3);
	w.local = 1;
	struct hs h;
	uint8_t hello1[HELLO];
	char err[256] = "";
	cr_assert_eq(hs_client_start(&h, hello1, PSK_A, &w, err, sizeof err), 0, "%s", err);
	hello1[11] = 0;
	respond_fails(PSK_A, &p, hello1, HELLO, -EACCES, 0, "", "local flag flipped");
	hs_wipe(&h);
}
