/* A `pstrain ps` under test and a peer that speaks to it from the test's
 * process with the net modules: the suite's setup and teardown, which
 * kill what a failed assertion left running, the config and key it trains
 * with, a handshake as any worker (with the key or another, at any time),
 * the first frame that confirms it, sealed messages, and what the ps
 * logged about a peer. Every call asserts; every wait is bounded (5 s).
 * What a test checks about the processes it starts stays in the test. */
#ifndef PSTRAIN_TEST_TARGET_H
#define PSTRAIN_TEST_TARGET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../core/config/config.h"
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

/* The running test's directory, made by target_setup. */
extern char target_dir[256];

/* A suite's .init: libsodium, SIGPIPE ignored (a peer that closes is an
 * error return, not the test's death), a new target_dir tagged with the
 * suite's name. */
void target_setup(void);
/* A suite's .fini: kills every process target_spawn started that is still
 * running (a failed assertion left it), removes target_dir, checks for
 * leaks. */
void target_teardown(void);
/* spawn_pstrain, remembering the process for target_teardown; a test
 * that starts more than 8 fails. */
pid_t target_spawn(const char *const *args, const char *outpath);
/* The same with one more environment variable ("NAME=VALUE"; NULL: none). */
pid_t target_spawn_env(const char *const *args, const char *outpath, const char *env);
/* Seconds on the monotonic clock. */
double target_now_s(void);
void target_nap_ms(long ms);

/* blobs.csv, cluster.key and cluster.ini (1 ps on a free port, W workers
 * never listened on) in target_dir, training `steps` steps of batch
 * `batch`; extra goes into [train], and a key it sets (learning_rate,
 * optimizer, ...) replaces the line target_write would have written.
 * Loads the key and the config hash into t; the ps's log is
 * target_dir/ps0.log. */
void target_write(struct target *t, int W, int steps, int batch, const char *extra);
/* Starts `pstrain ps --index 0` on t's config with target_spawn, its
 * output to t->log; set: one "--set KEY=VALUE" argument, or NULL. */
void target_start(struct target *t, const char *set);
/* A real `pstrain worker --index 0` (its output in target_dir/worker0.log)
 * trains to the end: it and the ps exit 0 within timeout_s. Returns the
 * worker's log. */
char *target_worker_finishes(struct target *t, int timeout_s);

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
/* The next message from the ps but HEARTBEATs, opened into buf
 * (FRAME_CT_MAX bytes); its type. what: the request, for the message. */
int target_recv_msg(int fd, struct hs_result *hr, uint8_t *buf, size_t *len, const char *what);
/* The next message is an ACK (after a PUSH or an SPUSH): its status. */
uint32_t target_ack_status(int fd, struct hs_result *hr, const char *what);
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
