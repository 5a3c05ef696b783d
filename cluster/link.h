/* One worker's link to one ps, as an object: its connection (dialled,
 * greeted, and shunned off a Unix socket that answers wrongly), a state,
 * one end reason, and two threads that live as long as the link does: a
 * sender and a receiver. links.c fans a call out over every ps; this file
 * is what one link does with it.
 *
 * An exchange is link_begin(what to send, what to take) ... link_wait:
 * the sender sends a control message, PULL and the PUSH, in the order the
 * ps needs (piece mode: PULL first, so the ps streams the parameters while
 * the gradient goes up; otherwise the PUSH, then PULL); the PUSH is one
 * loop over the gradient's flow, run by run of whole pieces as the flow
 * says they are final (without overlap, the whole gradient is final at
 * once: one message). The receiver reads only once something that has a
 * reply went out (so that a long compute is never taken for a silent ps),
 * and takes each message through a table by its type (like the ps's
 * ps_handlers): the ACK, the parameters as they stream, a STATUS reply,
 * HEARTBEATs (the chief's "waiting for worker N" lines) and ERRORs.
 *
 * The first failure of an exchange is its end reason, set once under the
 * link's mutex; it shuts the connection down so that the other half ends
 * at once, and its message is the link's. LOST: the transport failed
 * ("lost ps 1 (host:port): ..."), the caller may reconnect (recovery.c).
 * WENT_BACK: the shard answered with an older version than this worker had
 * from it (restarted from a checkpoint, or rolled back): also one to
 * reconnect for. REFUSED: an ERROR from the ps, or a message that is not
 * what was asked for. CANCELLED: the step failed its gradient's flow, or
 * another link was lost first (links.c shuts the others then). A failed
 * link stays FAILED until link_disconnect. */
#ifndef PSTRAIN_CLUSTER_LINK_H
#define PSTRAIN_CLUSTER_LINK_H

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
#include "role.h"

/* A link's error message: a ps's name and a line from net/. */
#define LINK_WHY_BYTES 1024

enum link_state {
	LINK_DOWN,       /* not connected */
	LINK_READY,      /* connected, no exchange running */
	LINK_EXCHANGING, /* between link_begin and the end of both halves */
	LINK_FAILED,     /* an exchange ended with a reason other than OK */
};

enum link_end {
	LINK_OK,
	LINK_LOST,
	LINK_REFUSED,
	LINK_WENT_BACK,
	LINK_CANCELLED,
};

/* Whose push is next, shared by the links of one worker: the pushes of a
 * staggered exchange go one shard at a time, worker w starting at shard
 * w mod nps, so that the workers' uploads reach different ps at once. */
struct link_turn {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int turn;
};

/* What every link of a worker reads, and what they count together. */
struct link_shared {
	const struct config *c;
	const struct role_setup *s;
	const volatile sig_atomic_t *stop;
	int dial_on;             /* a dial goes on through a stop (the caller's
				  * thread sets it: recovery.c, an elastic leave) */
	FILE *out;
	int index;               /* this worker */
	char compute[MSG_COMPUTE_TEXT + 1]; /* what its arithmetic runs on
				  * (devices_compute), said to ps 0 on each
				  * connection; "": nothing to say */
	int pieces;              /* the shards stream each piece (role_pieces) */
	int pack;                /* float32 packed on TCP links (the worker sets it
				  * between exchanges) */
	int slice;               /* the slice a PUSH is of (the worker sets it
				  * between exchanges) */
	struct msg_view view;    /* under say_mu: the newest VIEW from ps 0 */
	uint64_t views;          /* under say_mu: VIEWs taken so far */
	struct progress *pg;     /* the chief's: "waiting for worker N" lines */
	pthread_mutex_t say_mu;  /* those lines, from any link's receiver */
	uint64_t heard_v;        /* the last one printed: version, workers */
	uint8_t heard[MSG_HEARTBEAT_WORKERS / 8];
	_Atomic uint64_t stale;  /* pushes the shards dropped */
	_Atomic uint64_t pvalues, pbytes; /* parameters received: values, their bytes on the wire */
	_Atomic uint64_t gvalues;         /* gradient values pushed, and of them */
	_Atomic uint64_t fvalues, fbytes; /* those sent as factors, and the factors' bytes */
	struct link_turn turn;
	/* Called once a link's exchange ends LOST or WENT_BACK, on that
	 * link's thread, holding no link's lock (links.c shuts the others). */
	void (*lost)(void *ctx, int k);
	void *ctx;
};

/* A control message (sealing encrypts in place: encoded for each link). */
struct link_ctl {
	uint8_t type;            /* 0: none; WIRE_CHECKPOINT, _ROLLBACK, _DONE, _STATUS, _LEAVE */
	union {
		struct msg_checkpoint ck;
		struct msg_rollback rb;
		struct msg_done done;
		struct msg_status status; /* its reply is taken */
		struct msg_leave leave;
	} u;
};

struct link_rows; /* link_sparse.h */

/* One exchange: what goes up and what comes down. */
struct link_ex {
	struct link_ctl ctl;     /* sent first, if its type is set */
	const float *grads;      /* (P) NULL: no PUSH */
	struct gradflow *gflow;  /* grads as they become final; stream k: this link's range */
	struct link_turn *turn;  /* NULL, or wait for turn pos before the PUSH and
				  * pass it on at the ACK (or at a failure) */
	int pos;
	float *params;           /* (P) NULL: no PULL */
	int first;               /* PULL version 0 (whatever the shard has), no check */
	struct gradflow *pflow;  /* NULL, or each chunk of params marked final as it lands */
	struct link_rows *rows;  /* NULL, or embedding rows pulled or pushed (link_sparse.h) */
	struct link_rows *ahead; /* NULL, or the next step's rows, pulled after the PUSH */
};

struct link {
	int k;                   /* the ps */
	struct link_shared *sh;
	struct conn conn;
	struct shard range;
	uint64_t got;            /* version of the parameters last pulled */
	int torn;                /* since then a PULL's PARAMS failed part way:
				  * the range holds some of a newer version, and
				  * zeros where a frame failed to open */
	uint64_t held;           /* with holds: the version the range holds exactly
				  * as the ps sent it, from the last whole PULL of
				  * float32 (recovery may set got apart from it) */
	int holds;
	int unx;                 /* the connection is over the ps's Unix socket */
	int shun;                /* the ps's Unix socket file failed a greeting: */
	struct sock_unix_file shunned; /* this one; TCP while it is there */

	pthread_mutex_t mu;      /* all below */
	pthread_cond_t cv;       /* the two halves': begun, asked, acked, ended, quit */
	pthread_cond_t done_cv;  /* link_wait's: the exchange settled (apart, so
				  * that the halves' wake-ups do not wake the caller) */
	enum link_state state;
	enum link_end end;
	int rc;                  /* with end: the error, -ECONNABORTED mostly */
	char why[LINK_WHY_BYTES]; /* and its message */
	struct link_ex ex;       /* the exchange running */
	uint64_t tag;            /* the version its PUSH is tagged with: got at link_begin */
	uint64_t want;           /* the version its PULL asked for */
	int tx_busy, rx_busy;    /* its halves still at it */
	int asked;               /* a message with a reply went out: the receiver reads */
	int acked;               /* the ACK of its PUSH came */
	int complete;            /* a STATUS reply said the run is complete */
	int quit;
	pthread_t tx, rx;
	int tx_on, rx_on, sync_on;
};

/* Link to ps k over range, with its connection (buffers, pipes: the
 * sender's and the receiver's, session key pages) and both threads; DOWN. On failure l is left for link_free. */
int link_init(struct link *l, int k, struct link_shared *sh, struct shard range,
	      struct cryptopool *pool, char *err, size_t errlen);
void link_free(struct link *l); /* accepts a zeroed struct; not while exchanging */

/* Connects and greets ps k within timeout_ms (its Unix socket first where
 * [cluster] local_socket says, retrying an unanswered greeting twice):
 * READY. -EINVAL for an address that cannot work, -EINTR, else
 * -ECONNABORTED. */
int link_connect(struct link *l, int timeout_ms, char *err, size_t errlen);
/* Whether float32 goes packed on this link (net/fpack.h), and with it the
 * XOR pulls and factors: where the worker says so (worker.c: where the
 * link limits its steps) and the link is not a Unix socket, over which
 * only the CPU would pay. */
int link_packs(const struct link *l);
/* Whether a row message's ids go packed (net/idpack.h) on this link: on
 * every TCP link unless [cluster] wire_pack = false. A batch's sorted ids
 * take about 2 bytes for 8 at a cost of nanoseconds, so unlike float32
 * they need no sign that the link limits the step. */
int link_packs_ids(const struct link *l);
/* Sync: the version the next PULL asks for, the one after the version
 * last pulled, never past the run's end (a SPULL of the next step's rows
 * asks for the same: link_sparse.h). */
uint64_t link_next_version(const struct link *l);
void link_disconnect(struct link *l); /* DOWN */

/* Starts ex on the link's threads. A link that is not READY ends the
 * exchange at once: its earlier end again if it FAILED, LOST if DOWN. */
void link_begin(struct link *l, const struct link_ex *ex);
/* Waits for the exchange to end: 0, or its error with the message in err
 * (if not NULL). Again after the end, the same. */
int link_wait(struct link *l, char *err, size_t errlen);
/* Ends a running exchange CANCELLED (another link was lost), shutting the
 * connection down; nothing if it is not running or ended already. */
void link_cancel(struct link *l, const char *why);

/* "ps 1 (host:port)" in buf. */
const char *link_ps_name(const struct config *c, int k, char *buf, size_t len);

#endif
