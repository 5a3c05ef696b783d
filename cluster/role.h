/* What the ps and worker roles share: the setup every node derives from
 * cluster.ini (key, config hash, and core/job.h's model, data and step
 * counts), the timeouts
 * derived from [cluster] peer_timeout, and the log line.
 * No sockets and no threads here. */
#ifndef PSTRAIN_CLUSTER_ROLE_H
#define PSTRAIN_CLUSTER_ROLE_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "../core/config/config.h"
#include "../core/job.h"
#include "../net/key.h"

/* Key, model, data and the step count, the same on every node. */
struct role_setup {
	uint8_t *key;       /* (KEY_BYTES) the cluster key, the process's only
			     * lasting copy: key_load_guarded's guarded, mlocked,
			     * read-only pages; NULL until loaded */
	uint8_t hash[CONFIG_HASH_BYTES];
	unsigned ciphers;   /* what this node offers (role_ciphers) */
	struct job job;     /* S = config_slices(c, 1) */
};

/* Makes the process non-dumpable (role_harden), then loads the key, the
 * config hash, the ciphers to offer and the job. s must be zeroed first. want_data 0 (a ps): the
 * data is loaded only when [train] steps is unset, for the step count the
 * lr schedule runs over (job_load). -EINVAL for anything the user must fix
 * (key, model, data, a data set smaller than one step), -EPERM if the
 * process cannot be made non-dumpable. role_setup_free it on failure too. */
int role_setup_load(struct role_setup *s, const struct config *c, int want_data, char *err,
		    size_t errlen);
/* The FRAME_OFFER_* bits this node offers in its handshakes, from
 * [cluster] cipher: -EINVAL and a line in err when it names a cipher this
 * CPU cannot run. */
int role_ciphers(const struct config *c, unsigned *offers, char *err, size_t errlen);

/* Frees the job and wipes and frees the key. */
void role_setup_free(struct role_setup *s);

/* Makes this process non-dumpable (prctl PR_SET_DUMPABLE 0): no core dump,
 * and no other process of the same user may ptrace it or read its memory
 * through /proc/PID/mem; /proc/PID's files become root's. Called before a
 * role loads the key: what is then in memory (the key's stack copies while
 * it is read, handshake state, session keys on their way to guarded
 * memory, the model) stays there. A debugger can still start pstrain
 * itself (gdb --args pstrain ps ...): a tracer attached before the call
 * keeps tracing. -EPERM and a line in err if the kernel refuses (only a
 * sandbox that filters prctl would). */
int role_harden(char *err, size_t errlen);

/* One line to out, whole even when several threads log. */
void role_log(FILE *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void role_nap_ms(long ms);

/* Milliseconds on CLOCK_MONOTONIC (deadlines that a clock change must not
 * move). */
int64_t role_now_ms(void);

/* A condition variable whose timed waits run on CLOCK_MONOTONIC, and the
 * absolute time ms from now on that clock for pthread_cond_timedwait. */
int role_cond_init(pthread_cond_t *cv);
void role_deadline(struct timespec *dl, long ms);

/* The samples a worker evaluates at once, at least (worker.c, beside its
 * batch_size): a ps sizes what one SPULL may ask for by it. */
#define ROLE_EVAL_BATCH 1024

/* How long either side waits for the other's half of the handshake. */
#define ROLE_HANDSHAKE_MS 5000

/* How often an idle connection carries a HEARTBEAT: four per peer_timeout,
 * so that one late heartbeat never looks like a dead peer (at least 50). */
int role_heartbeat_ms(const struct config *c);
int role_peer_timeout_ms(const struct config *c);
/* The deadline for writing one frame (a message, or one chunk of a
 * tensor): a peer that stops reading (a stopped process, a hung host) is
 * then found in peer_timeout whether this side was reading or writing.
 * The floor keeps a 64 KiB frame possible on a slow link whatever
 * peer_timeout is set to (config allows 1 s and up). */
int role_write_timeout_ms(const struct config *c);

/* The enum wire_dtype (net/wire.h) that gradients (PUSH) and parameters
 * (PARAMS) travel in, from [cluster] wire_dtype: the worker sends and the
 * ps expects gradients in role_grad_dtype, the ps sends and the worker
 * expects parameters in role_param_dtype. */
unsigned role_grad_dtype(const struct config *c);
unsigned role_param_dtype(const struct config *c);

/* Whether the shards aggregate piece by piece (cluster/psshard.h: sync with
 * replicas_to_aggregate = workers), so that a worker may ask for the
 * next version before it pushes and take the ps's answer as it streams. */
int role_pieces(const struct config *c);

/* Whether ps 0 gives out each step's slices in views (docs/ELASTIC.md):
 * an elastic cluster, but not with backup workers, which keep a slice each
 * (S = W) and whose steps complete without the slowest ones anyway. */
int role_views(const struct config *c);

/* The Unix socket of ps k for workers on its host ([cluster] local_socket):
 * its path in socket_dir (default /tmp/pstrain-EUID), after checking that
 * the directory is this user's alone (made if missing). 0, or a negative
 * errno with one line in err: then only TCP reaches ps k. */
int role_local_path(const struct config *c, int k, char *out, size_t outlen, char *err,
		    size_t errlen);


#endif
