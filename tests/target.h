/* A `pstrain ps` under test and a peer that speaks to it from the test's
 * process with the net modules: the config and key it trains with, a
 * handshake as any worker (with the key or another, at any time), the
 * first frame that confirms it, sealed messages, and what the ps logged
 * about a peer. Every call asserts; every wait is bounded (5 s). */
#ifndef PSTRAIN_TEST_TARGET_H
#define PSTRAIN_TEST_TARGET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../core/config.h"
#include "../net/frame.h"
#include "../net/handshake.h"
#include "../net/key.h"

struct target {
	char cfg[300], log[300];
	int port;
	pid_t pid;
	uint8_t key[KEY_BYTES];
	uint8_t hash[CONFIG_HASH_BYTES];
};

/* blobs.csv, cluster.key and cluster.ini (1 ps on a free port, W workers
 * never listened on) in dir, training `steps` steps of batch `batch`; extra
 * goes into [train]. Loads the key and the config hash into t; the ps's
 * log is dir/ps0.log. */
void target_write(struct target *t, const char *dir, int W, int steps, int batch,
		  const char *extra);

/* A connected socket to the ps. */
int target_dial(const struct target *t);
/* HELLO1 as worker index with key into out (time_ns 0: now; else the
 * greeting a worker would have sent then), the client state in h. */
void target_greeting(struct hs *h, uint8_t out[HS_HELLO_BYTES], const uint8_t *key,
		     const struct target *t, uint32_t index, uint64_t time_ns);
/* target_greeting now, sent on fd. */
void target_hello(int fd, struct hs *h, const uint8_t *key, const struct target *t,
		  uint32_t index);
/* Reads HELLO2 and finishes the handshake into hr. */
void target_hello_finish(int fd, struct hs *h, struct hs_result *hr);
/* A sealed HEARTBEAT, as a real worker sends right after its handshake. */
void target_confirm(int fd, struct hs_result *hr);
/* Dials and handshakes as worker index with the cluster key, then
 * confirms unless raw. */
int target_peer(const struct target *t, uint32_t index, struct hs_result *hr, int raw);

/* A sealed PULL of shard 0 at version 0 in out; its length. */
size_t target_seal_pull(struct frame_key *tx, uint8_t *out, size_t cap);
void target_send(int fd, const void *b, size_t n);
/* Reads one frame and asserts it is PARAMS. */
void target_read_params(int fd, struct hs_result *hr);
/* The ps closes fd without sending anything more, within limit_ms; how
 * long that took in seconds. */
double target_expect_closed(int fd, int limit_ms);
void target_wipe(struct hs_result *hr);

/* Waits (up to 5 s) for the ps's log to contain needle; returns the log. */
char *target_wait_log(const struct target *t, const char *needle);
/* The log line of fd's peer "127.0.0.1:PORT:" holds needle, and only one
 * line names that peer. */
void target_assert_logged(const struct target *t, int fd, const char *needle);

#endif
