/* A worker's links to every ps (one cluster/link.c object each), fanned
 * out: connect and authenticate (with backoff), a heartbeat thread that
 * keeps idle links alive, pull every shard, push to every shard, exchange
 * (push this step's gradient and pull the next step's parameters), and the
 * control messages every ps gets (CHECKPOINT, ROLLBACK, DONE, STATUS).
 * Every call starts an exchange on every link (each link's own sender
 * and receiver threads run it) and then waits for all of them, so the
 * shards work in parallel.
 *
 * A link found LOST or WENT_BACK sets lk->lost = k (the first one since
 * it was last reset to -1) and shuts the others down: the caller may
 * reconnect (recovery.c), and a healthy ps is not left holding its step
 * for a worker that is going away. The call returns -ECONNABORTED with
 * that link's message ("lost ps 1 (host:port): ...", "ps 1 (...) went
 * back to step 7"). An ERROR a ps sent, or a malformed message, is
 * -ECONNABORTED with lost left as it was. */
#ifndef PSTRAIN_CLUSTER_LINKS_H
#define PSTRAIN_CLUSTER_LINKS_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "../core/nn/gradflow.h"
#include "../core/progress.h"
#include "../core/shard.h"
#include "../net/conn.h"
#include "../net/cryptopool.h"
#include "../net/msg.h"
#include "../net/pipe.h"
#include "../net/sock.h"
#include "link.h"
#include "role.h"

struct links_rows; /* link_sparse.h */

struct links {
	struct link_shared sh;   /* what every link reads; the worker sets sh.pack and sh.pg */
	int nps;
	struct link *ln;         /* (nps) */
	struct cryptopool *pool; /* NULL: crypto_threads 1; shared by every link */
	struct gradflow whole;   /* a gradient final at once (no overlap): every stream final */
	struct links_rows *rows_up; /* rows staged to go up with the next exchange
				  * that pushes a gradient (links_rows_stage) */
	struct links_rows *rows_ahead; /* the next step's rows, pulled in that
				  * exchange after its PUSH (links_rows_ahead) */
	pthread_mutex_t mu;      /* lost */
	int lost;                /* the first link found lost or gone back; -1: none.
				  * The caller resets it. */
	pthread_t hb;            /* sends HEARTBEATs on idle links */
	int hb_on, hb_stop, ready;
	/* Elastic sync (role_views): every push goes to ps 0 last, once every
	 * other ps has ACKed it, so that a step ps 0 has completed every ps
	 * has; and the parameters of the step under way, kept by the worker
	 * (kept_v: their version; kept NULL: none) for recovery_resync, since
	 * an exchange's answers overwrite them. */
	int ps0_last;
	float *kept;             /* (P) the links' own, when ps0_last */
	uint64_t kept_v;
	int has_kept;
	pthread_mutex_t hb_mu;
	pthread_cond_t hb_cv;
};

/* Buffers, the crypto pool and the heartbeat thread for worker `index`
 * over the shards of plan (c->cluster.nps of them); nothing connected
 * yet. On failure lk is left for links_close. */
int links_open(struct links *lk, const struct config *c, const struct role_setup *s,
	       const struct shard *plan, int index, const volatile sig_atomic_t *stop, FILE *out,
	       char *err, size_t errlen);
void links_close(struct links *lk); /* accepts a zeroed struct */

/* Every ps, each with connect_timeout. -EINVAL for an address that cannot
 * work, else -ECONNABORTED. */
int links_connect(struct links *lk, char *err, size_t errlen);
/* Ps k, retrying with backoff for up to timeout_ms. */
int links_connect_one(struct links *lk, int k, int timeout_ms, char *err, size_t errlen);
void links_disconnect(struct links *lk);
/* How many of the ps links are Unix sockets ([cluster] local_socket), and
 * in *rings (unless NULL) how many of those move their bytes through a ring
 * (local_ring). */
int links_local(const struct links *lk, int *rings);
/* The cipher the ps links that are sealed use ([cluster] cipher and what
 * both ends' CPUs run): its name, "several" when they differ, NULL when no
 * connected link is sealed. */
const char *links_cipher(const struct links *lk);

/* Pulls every shard into params (P): sync asks each for the version after
 * the one it last had (first: 0, i.e. whatever it has), async for the
 * newest; each link's `got` is the version it answered with. */
int links_pull(struct links *lk, float *params, int first, char *err, size_t errlen);
/* One exchange on every link: grads (P) up, each shard's slice tagged
 * with the version pulled from it (every ACK read, stale and duplicate
 * ones counted), and the next version's parameters down into params (P),
 * or none with params NULL (a worker's last step). gflow: grads as
 * they become final (stream k: ps k's range), or NULL when grads is final
 * already (then the whole of it is marked final at once, and each push is
 * one message). In piece mode (sync, replicas_to_aggregate = workers)
 * every link asks for the next version first and then pushes while its
 * receiver takes the ACK and the parameters as the ps streams them: both
 * directions of every link at once. Otherwise the pushes go one shard at
 * a time, worker w starting at shard w mod nps, so that the workers'
 * uploads reach different ps at once rather than all the same one.
 * links_exchange_end waits for every link and says how it ended; a gflow
 * failed by the step ends the pushes half-way (-ECANCELED) with the links
 * shut down. With pflow (else NULL), each chunk of the parameters is
 * marked final there once it is in params, so that the next step's
 * forward pass can start on what has arrived; a link that fails fails
 * pflow. */
void links_exchange_begin(struct links *lk, const float *grads, struct gradflow *gflow, float *params,
			  struct gradflow *pflow);
int links_exchange_end(struct links *lk, char *err, size_t errlen);
/* links_exchange_begin with grads final, then links_exchange_end. */
int links_exchange(struct links *lk, const float *grads, float *params, char *err, size_t errlen);
/* ex[k] on link k, every link at once, then waited for as every call
 * here is (link_sparse.c's pulls and pushes of rows). */
int links_each(struct links *lk, const struct link_ex *ex /* (nps) */, char *err, size_t errlen);
/* CHECKPOINT(step) to every ps; acc: the final test accuracy the final
 * checkpoint records, < 0 for the others. */
int links_checkpoint(struct links *lk, long step, double acc, char *err, size_t errlen);
/* ROLLBACK(step) to every ps. */
int links_rollback(struct links *lk, uint64_t step, char *err, size_t errlen);
/* DONE to every ps: trained the last step (leaving 0), or, once every ps
 * has said the run is complete, closing (leaving 1). */
int links_done(struct links *lk, int leaving, char *err, size_t errlen);
/* Elastic sync: params (P), the parameters of step v, kept (links.h). */
void links_keep(struct links *lk, const float *params, uint64_t v);
/* LEAVE to every ps (an elastic worker's SIGTERM): it leaves once the
 * pushes that follow are in. */
int links_leave(struct links *lk, char *err, size_t errlen);
/* STATUS to every ps: *complete is 1 when every ps says the run is
 * complete (the chief has said DONE). */
int links_status(struct links *lk, int *complete, char *err, size_t errlen);

/* One line of what each TCP link's send buffer came to ([cluster]
 * send_buffer_kib; under auto, what it measured its way to:
 * docs/NETWORK.md), as worker `index`; none if every link is a Unix
 * socket. */
void links_say_sndbuf(struct links *lk, int index, FILE *out);

#endif
