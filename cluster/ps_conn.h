/* What the ps's files share (cluster/ps.c, ps_pull.c, ps_push.c; not for
 * anyone else): the ps, one worker's connection, and the handlers' shape.
 * ps.c admits and serves connections; ps_pull.c answers PULL (streaming
 * the next version piece by piece in sync piece mode); ps_push.c takes
 * PUSH (each piece aggregated as it arrives). Everything below that the
 * handlers share with other threads is under ps->mu. */
#ifndef PSTRAIN_CLUSTER_PS_CONN_H
#define PSTRAIN_CLUSTER_PS_CONN_H

#include "members.h"
#include "observers.h"
#include "ps_observers.h"
#include "ps_store.h"
#include "rate.h"
#include "role.h"

#include "../base/hooks.h"
#include "psshard.h"
#include "../core/shard.h"
#include "../net/conn.h"
#include "../net/cryptopool.h"
#include "../net/gate.h"
#include "../net/handshake.h"
#include "../net/msg.h"
#include "../net/pipe.h"
#include "../net/sock.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

/* Threads: each worker has at most one confirmed connection, one answered
 * but unconfirmed, and one being replaced or refused. */
#define PS_MAX_CONN (3 * MEMBERS_MAX)

/* ps 0: what the workers' arithmetic runs on (COMPUTE), kept to say once
 * per worker when it is not what the first one heard runs on: a sync
 * step's sum then depends on which worker trained which slice. */
struct ps_apply_job;

struct ps_compute {
	char first[MSG_COMPUTE_TEXT + 1]; /* "": none heard yet */
	int first_w;
	uint8_t said[(MEMBERS_MAX + 7) / 8];
};

struct ps {
	pthread_mutex_t mu;
	pthread_cond_t cv;       /* (CLOCK_MONOTONIC) a connection or an observer ended,
				  * or the last stream from the shard itself did */
	pthread_cond_t pull_cv;  /* (CLOCK_MONOTONIC) what a waiting PULL waits for
				  * (ps_pull.c): a piece or version applied, this
				  * worker's gradient in while the others are done, a
				  * worker said DONE, a rollback, the ps stops, a
				  * streamer told to end */
	struct cryptopool *pool; /* NULL: crypto_threads 1 */
	struct cryptopool *applier; /* the apply pool (ps_apply.h); NULL: pieces stepped inline */
	int applying;            /* its jobs queued or running; a rollback and a whole
				  * copy of the shard wait for 0 (ps->cv) */
	struct psshard sh;
	struct ps_store store;
	struct members mb;
	const struct role_setup *s;
	const struct config *c;
	struct test_hooks hooks;     /* base/hooks.h */
	struct hs_identity me;
	FILE *out;
	int index, W;
	int aborted;
	char why[512];
	uint64_t gen;            /* rollbacks so far: wakes PULLs waiting across one */
	uint64_t went_back_from; /* the highest version the shard had before a rollback (0: none) */
	int streaming;           /* pieces going out from the shard itself, unlocked
				  * (ps_pull.c's pull_stream): a rollback waits */
	struct gate gate;        /* connections not authenticated yet (main thread's) */
	int64_t tally_ms;        /* when refusals were last logged; 0: never */
	int nconn;
	struct ps_conn *conns[PS_MAX_CONN];
	struct ps_conn *worker[MEMBERS_MAX]; /* each worker's confirmed connection */
	struct ps_conn *fresh[MEMBERS_MAX];  /* each worker's answered, unconfirmed one */
	struct observers seen;   /* observer greetings answered */
	struct rate rate;        /* versions/s, sampled by the accept loop */
	int64_t started_ms;
	struct ps_observers po;  /* the observers' connections (ps_observers.h) */
	struct ps_sparse *sp;    /* its embedding rows (ps_sparse.c); NULL: none */
	struct ps_compute compute; /* under mu */
	int prev_fits;           /* [ps] memory_limit leaves room for the shard's version
				  * before, which XOR pulls keep (ps_pull.c) */
};

/* Where a worker's connection is in its life. Only its own thread moves
 * it, under ps->mu (so it reads it freely; others under ps->mu):
 * UNCONFIRMED until its first frame opens (ps_confirm), then MEMBER
 * (worker w's connection), DONE while its last word is DONE (a closed
 * connection is then no failure; a PULL makes it a MEMBER again), and
 * ENDING once ps_serve returned. */
enum ps_conn_state {
	PS_CONN_UNCONFIRMED,
	PS_CONN_MEMBER,
	PS_CONN_DONE,
	PS_CONN_ENDING,
};

/* Why it ended, set once under ps->mu by whoever ends it first: its own
 * thread when ps_serve returns, or the worker's next connection replacing
 * it (ps_confirm). Until then PS_CONN_OPEN. */
enum ps_conn_end {
	PS_CONN_OPEN,
	PS_CONN_LEFT,     /* without failing: after DONE, the ps stops, or refused as a second */
	PS_CONN_FAILED,   /* on its own failure: a timeout, a bad frame */
	PS_CONN_LOST,     /* the transport failed, or the peer sent ERROR: nothing was answered */
	PS_CONN_REFUSED,  /* with an ERROR from this ps (ps_refuse) */
	PS_CONN_REPLACED, /* worker w connected again and this one was dead */
};

/* Piece mode: a run of a PUSH's pieces sent as the factors of a dense
 * layer's weight gradient (core/nn/factors.h), while its chunks come in
 * (ps_factors.c). */
struct ps_factors {
	float *fac;          /* (cap) the run's factor stream so far */
	float *rows;         /* (n + 2 x the widest input) the weight rows made of it */
	size_t cap, have, need; /* need: 0 while no run is open */
	uint64_t hi, runlen; /* the run: [hi - runlen, hi) of the shard */
	uint64_t next;       /* the offset of its next piece */
	uint32_t B;
	int layer, row0, nrows;
};

/* One worker's connection, served on its own thread. */
struct ps_conn {
	struct ps *ps;
	struct conn conn;
	int slot;
	int w;           /* the worker its greeting named */
	enum ps_conn_state state;
	enum ps_conn_end end;
	/* The failure the handler returns, before ps_serve does: LOST (no
	 * ERROR to send, ps_io) or REFUSED (one was sent); OPEN otherwise. */
	enum ps_conn_end failing;
	int pushed;      /* a whole gradient arrived on this connection */
	int slice;       /* the slice of the PUSH being assembled (WIRE_PUSH_SLICE) */
	uint64_t view_sent; /* ps 0, elastic: the members' view_serial last sent here */
	int first_pull;
	int pull_packed; /* the PULL being answered asked for packed float32 (MSG_PULL_PACKED) */
	int pull_delta;  /* ... and XORs with the version before it (MSG_PULL_DELTA), which the shard keeps */
	uint64_t *sent;  /* (npieces) piece mode: the version of each piece this connection last sent,
			  * UINT64_MAX for none; NULL until a PULL asks for XORs. A whole shard's copy may hold pieces
			  * a version ahead of the one it is labelled with (ps_pull.c) */
	char peer[SOCK_ADDR_STRLEN];
	float *grad, *snap;      /* (n) a PUSH being assembled; the shard copied for PARAMS */
	struct msg_assembly a;
	int assembling;
	struct ps_factors fx;
	int last_r;              /* piece mode: the push's last piece: psshard_push_piece's */
	enum psshard_outcome last_oc; /* ... and its outcome */
	/* Piece mode: PULLs are answered by a thread of their own, the
	 * streamer, so that this connection's PUSH still comes in while the
	 * parameters it completes go out (a worker sends its PULL first). It
	 * sends as CONN_SIDE, the connection's own thread as CONN_MAIN. */
	pthread_t st;
	int st_on;
	pthread_cond_t st_cv;    /* the idle streamer's: st_job or st_stop set */
	int st_job, st_stop;     /* under ps->mu: a PULL of st_want to answer; end */
	uint64_t st_want;
	int st_r;                /* how the streamer ended: 0, PS_END, or a failure */
	char st_err[320];
	struct ps_sparse_conn *spc; /* buffers for SPULL and SPUSH (ps_sparse.c), from the first */
	/* The apply pool's jobs for this connection's pieces (ps_apply.h):
	 * one slot a piece, the pieces queued since the last wait. */
	struct ps_apply_job *ajobs;
	size_t *aqueued, naqueued;
	pthread_cond_t awake;
};

_Static_assert(PSSHARD_PIECE == WIRE_CHUNK_VALUES, "a shard's piece is one chunk on the wire");

/* What a handler returns besides 0 (the next message) and a negative
 * errno (the connection fails, err says why): the connection ends without
 * failing (the ps stops and the worker was told). A failure is a request
 * this ps does not honour, answered with an ERROR (ps_refuse), unless the
 * handler marked it as the transport's (ps_io). */
#define PS_END 1

typedef int (*ps_handler)(struct ps_conn *cn, size_t len, char *err, size_t errlen);

/* cn ends for reason e unless it has ended already (under ps->mu). */
static inline void ps_conn_end_set(struct ps_conn *cn, enum ps_conn_end e)
{
	if (cn->end == PS_CONN_OPEN)
		cn->end = e;
}

/* ps_serve returned r on cn (under ps->mu): it is ENDING, for the reason
 * its failure gave, unless it was replaced first. Returns whether it had
 * been a MEMBER (or DONE). cn->end is set now, and never again, so its
 * own thread reads it without the lock from here on. */
static inline int ps_conn_ending(struct ps_conn *cn, int r)
{
	int member = cn->state != PS_CONN_UNCONFIRMED;
	cn->state = PS_CONN_ENDING;
	ps_conn_end_set(cn, !r ? PS_CONN_LEFT : cn->failing ? cn->failing : PS_CONN_FAILED);
	return member;
}

/* It ended on its own failure, before it was replaced (after ps_conn_ending). */
static inline int ps_conn_failed(const struct ps_conn *cn)
{
	return cn->end != PS_CONN_LEFT && cn->end != PS_CONN_REPLACED;
}

/* The result r of a send or receive on cn: a failure there is the
 * transport's (a frame that does not open, a reset, a timeout), which gets
 * no ERROR: the peer is gone, or stalled, and an answer would only wait
 * write_timeout for nothing. */
static inline int ps_io(struct ps_conn *cn, int r)
{
	if (r)
		cn->failing = PS_CONN_LOST;
	return r;
}

/* ps.c, for its harness (ps_harness.c) too: the ps of shard sh (from the
 * newest checkpoint unless fresh) and its end; worker w's answered
 * connection on fd with hr's keys (NULL if there is no slot: fd closed)
 * and serving it on the calling thread until it ends (then all but cn
 * itself is freed); and a whole greeting out of the gate, answered (a
 * worker's connection or an observer's on a thread of its own) or
 * refused into the gate's tally. */
int ps_open(struct ps *ps, const struct config *c, const struct role_setup *s,
	    const struct shard *sh, int index, int fresh, FILE *out, char *err, size_t errlen);
void ps_close(struct ps *ps);
struct ps_conn *ps_conn_add(struct ps *ps, int fd, const char *peer, int w,
			    const struct hs_result *hr);
int ps_conn_run(struct ps_conn *cn);
void ps_admit(struct ps *ps, struct gate_greeting *gr);
/* The accept loop's round (every 200 ms or sooner): a worker lost past
 * peer_timeout is dropped (elastic, enough others: ps_view_expired) or
 * stops the ps; returns whether the ps is over (stopped, or every worker
 * done and gone). */
int ps_over(struct ps *ps);

/* ps.c, for ps_admit.c: cn taken off ps->conns and closed (not freed),
 * as for a connection whose thread could not start. ps_admit.c, for ps.c: the REPORT an observer's STATUS
 * is answered with (ps_observers' callback), and the summary line of the
 * refusals since the last one (force: now, else once per PS_TALLY_MS). */
void ps_conn_drop(struct ps_conn *cn);
void ps_report(void *ctx, struct msg_report *rp, int final);
void ps_tally_log(struct ps *ps, int force);

/* ps_pull.c: a PULL (the handler), and the streamer thread of a
 * connection in piece mode (arg: the struct ps_conn), which answers the
 * PULLs the handler hands it until told to stop. */
int ps_on_pull(struct ps_conn *cn, size_t len, char *err, size_t errlen);
void *ps_streamer(void *arg);
/* ps_pull.c: hb out as sender `from`, called and returning under ps->mu,
 * which it lets go around the send (a waiting PULL's or SPULL's). */
int ps_heartbeat_send(struct ps_conn *cn, enum conn_sender from, const struct msg_heartbeat *hb, char *err,
		      size_t errlen);

/* ps_push.c: a PUSH chunk (the handler; also a PARAMS chunk, refused),
 * and the ACK of a whole push (PUSH or SPUSH): r and oc from the update
 * (-EALREADY a duplicate), v the version now. */
int ps_on_push(struct ps_conn *cn, size_t len, char *err, size_t errlen);
int ps_ack(struct ps_conn *cn, int r, enum psshard_outcome oc, uint64_t v, char *err, size_t errlen);
/* Piece mode: piece j of the push tagged tag, its values g, aggregated. */
int ps_push_piece(struct ps_conn *cn, uint64_t tag, size_t j, const float *g, char *err, size_t errlen);

/* The leading pieces as a piece's step found them (under ps->mu), and
 * whether what it did since is news to a streamer (ps_push.c). */
struct ps_lead {
	uint64_t moves, v;
	size_t lead;
};
void ps_lead_seen(const struct ps *ps, struct ps_lead *l);
int ps_lead_news(const struct ps_conn *cn, const struct ps_lead *l);
/* Piece mode: a chunk of a run sent as factors (WIRE_F32F), or any chunk
 * while such a run is open; at the run's last piece, its pieces made and
 * aggregated. */
int ps_factors_take(struct ps_conn *cn, const struct msg_chunk *c, char *err, size_t errlen);
void ps_factors_free(struct ps_factors *fx);

/* ps_sparse.c: the embedding rows this ps holds (cluster/psrows.h), for a
 * model with an embedding layer (else ps->sp stays NULL): whether the
 * shard fits [ps] memory_limit (checked before anything is allocated),
 * and *prev_fits whether one more copy of its dense part does (the XOR
 * pulls' version before);
 * opened before ps_store_open, which loads them with the dense shard from
 * the same checkpoint and writes them into its checkpoints; closed; the
 * rows' version moved with the dense shard's after a resume or a rollback
 * (a rollback keeps the rows' values: under ps->mu); a connection's buffers freed; and the handlers of SPULL and
 * SPUSH (also of ROWS, refused). */
int ps_sparse_fits(const struct config *c, const struct model *m, const struct shard *dense, int index,
		   int *prev_fits, char *err, size_t errlen);
int ps_sparse_open(struct ps *ps, char *err, size_t errlen);
void ps_sparse_close(struct ps *ps);
void ps_sparse_rewind(struct ps *ps);
/* The rows this ps holds, for its checkpoints; NULL: none. */
struct psrows *ps_sparse_rows(struct ps *ps);
/* The rows' line at the end: their version, pushes applied and stale. */
void ps_sparse_say(struct ps *ps);
void ps_sparse_conn_free(struct ps_conn *cn);
/* Under ps->mu: 0 if every value of the rows is finite, else -EDOM and
 * the first that is not in err (the harness's invariant). */
int ps_sparse_check(struct ps *ps, char *err, size_t errlen);
int ps_on_spull(struct ps_conn *cn, size_t len, char *err, size_t errlen);
int ps_on_spush(struct ps_conn *cn, size_t len, char *err, size_t errlen);

/* ps_view.c, ps 0 of an elastic cluster (nothing elsewhere): whether a
 * PULL's answer must wait for min_workers to be ready; the view of the
 * shard's version fixed (sync: once; async: again whenever the ready set
 * changed); the VIEW this connection has not had yet into *out (1, or 0:
 * none to send); and worker w gone (dropped) from the step under way, its
 * unpushed slices given to the others (a revision, waking every PULL). */
int ps_view_wait(const struct ps *ps);
void ps_view_fix(struct ps *ps);
int ps_view_message(struct ps_conn *cn, struct msg_view *out);
void ps_view_drop(struct ps *ps, int w);
/* Whether the step under way waits on worker w (ps 0 of an elastic sync
 * cluster; 0 elsewhere, where slices are only counted): it owns a slice
 * of the step's view not pushed yet, or no view is fixed for the step
 * and w would be in it (no PULL has been answered at the step, so no
 * slice of it can come before one is). */
int ps_view_owes(const struct ps *ps, int w);
/* Whether worker w owns a slice of the step's fixed view that it has not
 * pushed (ps 0 of an elastic sync cluster; 0 elsewhere): the step waits
 * on it, so it may not say DONE (on_done refuses it, and the worker is
 * then lost: its slices go to the others). */
int ps_view_unpushed(const struct ps *ps, int w);
/* Any ps: worker w lost past its deadline (members_expired). Elastic, with
 * min_workers others or the run complete, it is dropped (and ps 0 gives
 * its slices out again): -1; else w, for which the ps stops. */
int ps_view_expired(struct ps *ps, int w, int64_t now);

#endif
