/* A worker's connections to every ps: connect and authenticate (with
 * backoff), a heartbeat thread that keeps idle links alive, pull every
 * shard, push to every shard, and the control messages every ps gets
 * (CHECKPOINT, ROLLBACK, DONE, STATUS). Every PULL is sent before any reply
 * is read, and every PUSH before any ACK, so the shards work in parallel.
 *
 * A transport failure on link k sets lk->lost = k and returns
 * -ECONNABORTED ("lost ps 1 (host:port): ..."): the caller may reconnect
 * (recovery.c). An ERROR a ps sent, or a malformed message, is
 * -ECONNABORTED with lost left at -1. So is a shard that answers with an
 * older version than this worker had from it (it went back: restarted
 * from a checkpoint, or rolled back), with lost = k. */
#ifndef PSTRAIN_CLUSTER_LINKS_H
#define PSTRAIN_CLUSTER_LINKS_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "../core/gradflow.h"
#include "../core/progress.h"
#include "../core/shard.h"
#include "../net/conn.h"
#include "../net/cryptopool.h"
#include "../net/msg.h"
#include "../net/pipe.h"
#include "../net/sock.h"
#include "role.h"

struct link {
	struct conn conn;    /* its send lock: the heartbeat thread sends too */
	struct shard range;
	uint64_t got;        /* version of the parameters last pulled */
	uint8_t *rbuf, *wbuf; /* this link's: links_exchange runs every link at once */
	struct pipe pp;      /* this link's tensors; frame 0 is wbuf */
	int pp_ready;
	uint8_t *rwbuf;      /* (CONN_WBUF_BYTES) frame 0 of rpp */
	struct pipe rpp;     /* the tensors it receives: in piece mode one thread
			      * receives the parameters while another pushes */
	int rpp_ready;
	_Atomic int halted;  /* links_exchange: one half of the link failed and shut
			      * it down; the other half's failure is not a lost link */
	int unx;             /* the connection is over the ps's Unix socket */
	int shun;            /* the ps's Unix socket file failed a greeting: */
	struct sock_unix_file shunned; /* this one; TCP while it is there */
};

struct link_job;

struct links {
	const struct config *c;
	const struct role_setup *s;
	const volatile sig_atomic_t *stop;
	FILE *out;
	struct progress *pg;     /* the chief's: "waiting for worker N" lines */
	int index, nps;
	struct link *ln;         /* (nps) */
	struct link_job *job;    /* (nps) links_exchange's, one per link */
	struct cryptopool *pool; /* NULL: crypto_threads 1; shared by every link */
	_Atomic uint64_t stale;  /* pushes the shards dropped */
	_Atomic int lost;        /* the ps whose connection failed or went back; -1: none */
	pthread_mutex_t say_mu;  /* the "waiting for" lines, from any link's thread */
	uint64_t heard_v;        /* the last "waiting for" line printed: version, workers */
	uint8_t heard[MSG_HEARTBEAT_WORKERS / 8];
	pthread_mutex_t turn_mu; /* links_exchange: whose push is next */
	pthread_cond_t turn_cv;
	int turn;
	int pieces;              /* the shards stream each piece (links_exchange) */
	int pack;                /* float32 packed on TCP links (the worker sets it) */
	_Atomic uint64_t pvalues, pbytes; /* parameters received: values, and their bytes on the wire */
	struct gradflow *pflow;  /* links_exchange_begin's: the parameters as they arrive */
	_Atomic int failed_first; /* links_exchange: the link that failed first; -1: none */
	_Atomic int shutting;    /* links_exchange: the others were shut down after it:
				  * their failures are not lost links */
	pthread_t hb;            /* sends HEARTBEATs on idle links */
	int hb_on, hb_stop, ready;
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
/* How many of the ps links are Unix sockets ([cluster] local_socket). */
int links_local(const struct links *lk);
/* The cipher the ps links that are sealed use ([cluster] cipher and what
 * both ends' CPUs run): its name, "several" when they differ, NULL when no
 * connected link is sealed. */
const char *links_cipher(const struct links *lk);

/* Pulls every shard into params (P): sync asks each for the version after
 * the one it last had (first: 0, i.e. whatever it has), async for the
 * newest; each link's `got` is the version it answered with. */
int links_pull(struct links *lk, float *params, int first, char *err, size_t errlen);
/* Pushes grads (P), each shard's slice tagged with the version pulled from
 * it, then reads every ACK (stale and duplicate ones counted). */
int links_push(struct links *lk, const float *grads, char *err, size_t errlen);
/* links_push, then links_pull of the next version into params, with every
 * link on its own thread: each shard's new parameters come down while the
 * gradient still goes up to the next. When the shards aggregate piece by
 * piece (sync, replicas_to_aggregate = workers), every link asks for the
 * next version first and then pushes, with a second thread taking the ACK
 * and the parameters as the ps streams them: both directions of every
 * link at once. Otherwise the pushes go one shard at a time, worker w
 * starting at shard w mod nps, so that the workers' uploads reach
 * different ps links at once rather than all the same one. */
int links_exchange(struct links *lk, const float *grads, float *params, char *err, size_t errlen);
/* links_exchange in piece mode while this thread still computes grads:
 * every link on a thread of its own asks for the next version and pushes
 * each run of whole pieces of its shard as soon as flow (whose stream k
 * is ps k's range) says it is final, the parameters coming down as the
 * ps streams them. -EAGAIN when a thread cannot start (the flow is then
 * failed and nothing runs). links_exchange_end waits for every link and
 * says how the exchange ended, as links_exchange does; a flow failed by
 * the step ends the pushes half-way (-ECANCELED) with the links shut
 * down. With pflow (else NULL), each chunk of the parameters is marked
 * final there once it is in params, so that the next step's forward pass
 * can start on what has arrived; a link that fails, or a thread that
 * cannot start, fails pflow. */
int links_exchange_begin(struct links *lk, const float *grads, float *params, struct gradflow *flow,
			 struct gradflow *pflow);
int links_exchange_end(struct links *lk, char *err, size_t errlen);
/* CHECKPOINT(step) to every ps; acc: the final test accuracy the final
 * checkpoint records, < 0 for the others. */
int links_checkpoint(struct links *lk, long step, double acc, char *err, size_t errlen);
/* ROLLBACK(step) to every ps. */
int links_rollback(struct links *lk, uint64_t step, char *err, size_t errlen);
/* DONE to every ps: trained the last step (leaving 0), or, once every ps
 * has said the run is complete, closing (leaving 1). */
int links_done(struct links *lk, int leaving, char *err, size_t errlen);
/* STATUS to every ps: *complete is 1 when every ps says the run is
 * complete (the chief has said DONE). */
int links_status(struct links *lk, int *complete, char *err, size_t errlen);

/* "ps 1 (host:port)" in buf. */
const char *links_ps_name(const struct config *c, int k, char *buf, size_t len);

#endif
