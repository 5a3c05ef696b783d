/* The connection handshake: a worker (client) and a ps (server) prove to each
 * other that both hold the cluster key, state who they are and what they
 * train, and derive one fresh session key per direction for net/frame.c.
 * Pure functions over byte buffers: no sockets, no allocation, no printing;
 * reading and writing the bytes, the timeout and the logging are the
 * caller's. docs/PROTOCOL.md ("Handshake") is the reference for the bytes.
 *
 * Pattern: a pre-shared key plus ephemeral X25519, in the spirit of Noise
 * NNpsk0. Two messages of HS_HELLO_BYTES each, sent raw (not in frames)
 * before the first frame:
 *
 *     worker -> ps   HELLO1 = fields, time, MAC(key, fields)
 *     ps -> worker   HELLO2 = fields, MAC(key, HELLO1 || fields)
 *
 * then both sides hold send/recv frame keys with counters at 0.
 *
 * A third role, the observer, greets like a worker; what it may do once
 * connected is the ps's to enforce (cluster/ps.c), not the handshake's.
 *
 * Use, client side:
 *     hs_client_start(&h, hello1, psk, &me, ...)      send hello1
 *     read HS_HELLO_BYTES                            hs_client_finish(&h, &res, ...)
 * server side:
 *     read HS_HELLO_BYTES, hs_server_peek: is its time newer than the newest
 *     from that peer?                                hs_server_respond(&res, hello2, &n, ...)
 *     send n bytes of hello2 (n may be 0), then close if it failed.
 *
 * Then check res.peer (role and index) against what the caller expected: the
 * handshake only rejects what it can judge alone (authentication, format,
 * protocol version, config hash).
 *
 * Errors: 0 or a negative errno, with one line in err (errlen bytes, may be
 * NULL) on failure:
 *   -EMSGSIZE         a message that is not exactly HS_HELLO_BYTES
 *   -EACCES           the MAC failed: the peer lacks the cluster key, or the
 *                     message was modified or replayed. The server drops such
 *                     a peer without a reply (log it once, with its address)
 *   -EPROTO           authenticated but malformed (magic, step, role, flags),
 *                     or an invalid ephemeral key
 *   -EPROTONOSUPPORT  the peer speaks another protocol version
 *   -EBADE            the peer's training config hash differs from ours (the
 *                     hash travels keyed with the cluster key)
 *   -EADDRNOTAVAIL    (server) HELLO1 is for another ps: its `to` is not our
 *                     index. Dropped without a reply, like a replay
 *   -EINVAL, -ENOTSUP our own identity is invalid (unknown role, a cipher
 *                     offered that this CPU cannot run)
 *   -EIO              libsodium failed (not expected to happen)
 * libsodium must be initialized (sodium_init) first. */
#ifndef PSTRAIN_NET_HANDSHAKE_H
#define PSTRAIN_NET_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "key.h"

#define HS_MUST_CHECK __attribute__((warn_unused_result))

#define HS_PSK_BYTES KEY_BYTES /* the cluster key */
#define HS_HASH_BYTES 32u      /* the config hash */
#define HS_HELLO_BYTES 144u    /* each handshake message, MAC included */

/* Who greets: a ps answers workers and observers (`pstrain status`, index
 * 0), which may only ask STATUS (docs/PROTOCOL.md, "Observers"). */
enum hs_role {
	HS_PS = 1,
	HS_WORKER = 2,
	HS_OBSERVER = 3,
};

/* Who one side is. ciphers: the FRAME_OFFER_* bits it offers; in
 * production frame_offers(). local: whether its end of this connection is a
 * Unix socket to a process of its own user (sock_is_unix_same_user), and
 * for a client HS_LOCAL_RING: local, and it will offer a ring (net/ring.h)
 * right after the handshake if the connection is local. The connection
 * uses no cipher (FRAME_LOCAL) when both sides say local, else the best
 * cipher both offer (frame_cipher_choose: AEGIS-256, AES-256-GCM,
 * ChaCha20-Poly1305). */
#define HS_LOCAL_RING 2
struct hs_identity {
	enum hs_role role;
	uint32_t index;
	uint32_t to; /* a client's: the index of the ps it greets, under the MAC
		      * (a server refuses a greeting for another); unused by a
		      * server, and 0 in what it reads of a HELLO2 */
	uint8_t config_hash[HS_HASH_BYTES]; /* of the training-relevant config */
	unsigned ciphers;
	int local;
};

/* What a successful handshake gives: this side's frame keys and the peer's
 * identity (check role and index before trusting the connection). */
struct hs_result {
	struct frame_key send, recv;
	struct hs_identity peer;
	uint64_t peer_time_ns; /* the client's clock in its HELLO1 (server side) */
};

/* The client's state between its hello and the server's reply. Holds the
 * ephemeral secret and a copy of the cluster key: hs_wipe it when the
 * handshake is abandoned or has failed. */
struct hs {
	uint8_t psk[HS_PSK_BYTES];
	uint8_t esk[32]; /* ephemeral X25519 secret */
	uint8_t hello1[HS_HELLO_BYTES];
	struct hs_identity me;
};

/* "ps", "worker", "observer", or "?" for anything else. */
const char *hs_role_name(enum hs_role role);

/* Client: a fresh ephemeral key and nonce, HELLO1 in out, the state in h.
 * On failure h and out are unchanged. */
HS_MUST_CHECK int hs_client_start(struct hs *h, uint8_t out[HS_HELLO_BYTES],
				  const uint8_t psk[HS_PSK_BYTES],
				  const struct hs_identity *me, char *err, size_t errlen);

/* Client, with the time the greeting carries given (nanoseconds since the
 * epoch; hs_client_start uses CLOCK_REALTIME): for tests that make a
 * greeting "recorded" in the past. */
HS_MUST_CHECK int hs_client_start_at(struct hs *h, uint8_t out[HS_HELLO_BYTES],
				     const uint8_t psk[HS_PSK_BYTES],
				     const struct hs_identity *me, uint64_t time_ns, char *err,
				     size_t errlen);

/* Server, before deciding to answer: checks HELLO1's size and MAC and reads
 * who sent it (role, index; peer->config_hash is its keyed config tag) and
 * the time it carries, for the caller's replay check; two BLAKE2b calls and
 * no X25519. 0, or -EBADE (a config mismatch hs_server_respond will
 * answer) with *peer and *time_ns set; -EPROTONOSUPPORT (another protocol
 * version, also answered) with *peer set and *time_ns 0; -EADDRNOTAVAIL
 * (for another ps, me->index is not its `to`) with *peer and *time_ns set,
 * for the log line; that and any other error: drop the peer without a
 * reply. */
HS_MUST_CHECK int hs_server_peek(const uint8_t psk[HS_PSK_BYTES], const struct hs_identity *me,
				 const uint8_t *in, size_t inlen, struct hs_identity *peer,
				 uint64_t *time_ns, char *err, size_t errlen);

/* Server: checks HELLO1 (in, inlen bytes) and answers it. *outlen is the
 * number of bytes of out to send before anything else: HS_HELLO_BYTES on
 * success and on a version or config mismatch (so the client can report
 * the mismatch too; then close), 0 otherwise (drop without a reply). Size
 * and MAC are checked before any field is read, and nothing costlier than
 * two hashes is spent on a peer without the key. res is written only on
 * success. */
HS_MUST_CHECK int hs_server_respond(struct hs_result *res, uint8_t out[HS_HELLO_BYTES],
				    size_t *outlen, const uint8_t psk[HS_PSK_BYTES],
				    const struct hs_identity *me, const uint8_t *in,
				    size_t inlen, char *err, size_t errlen);

/* Client: checks HELLO2 (in, inlen bytes) against h's HELLO1 and derives
 * the keys. On success res is written and h wiped; on failure res and h are
 * unchanged (close the connection and hs_wipe(h)). */
HS_MUST_CHECK int hs_client_finish(struct hs *h, struct hs_result *res, const uint8_t *in,
				   size_t inlen, char *err, size_t errlen);

/* Zeroes all of h. Accepts NULL. */
void hs_wipe(struct hs *h);

#endif
