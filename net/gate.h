/* The gate: connections that have not authenticated yet, read from one
 * poll loop on the listening thread, so that a peer without the cluster
 * key costs no thread and no buffer, only a fixed record (its socket, its
 * address and the greeting bytes so far, about 250 bytes).
 *
 * A connection stays in the gate until its whole greeting (HS_HELLO_BYTES,
 * net/handshake.h) has arrived, and then leaves it for the caller, who
 * checks it (hs_server_peek), answers or refuses. The gate bounds what
 * everyone else costs:
 *   - a deadline per connection from its accept (handshake_timeout): an
 *     idle or trickling peer is closed when it passes;
 *   - at most `per_source` pending connections per source address (an IPv4
 *     address, an IPv6 /64) and `max` in all: a new connection evicts the
 *     oldest pending one of its source, or the oldest of all, so a flood
 *     never keeps a newcomer out, it only shortens every pending peer's
 *     time to `per_source` accepts from its source;
 *   - a greeting already waiting when a connection is accepted (a real
 *     peer sends it with its connect) is read at once, before any
 *     eviction can reach it.
 * Nothing is ever written to a pending connection. A refused connection
 * (gate_refuse) is not closed at once but held, unread, until its
 * deadline (or evicted like any other): closing it would invite the
 * instant reconnect of a flood, each one an accept and a close for both
 * sides, while holding it costs a record. Refusals are counted in a tally
 * (with the first one's address and reason) for a summary line, never
 * logged one by one.
 *
 * No threads, no printing; the clock is CLOCK_MONOTONIC. */
#ifndef PSTRAIN_NET_GATE_H
#define PSTRAIN_NET_GATE_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "handshake.h"
#include "sock.h"

/* Why a connection was refused, by the gate or, after gate_next, by its
 * caller (gate_refuse). */
enum gate_why {
	GATE_IDLE,      /* no whole greeting within the deadline */
	GATE_EVICTED,   /* its source, or the gate, had too many pending */
	GATE_HUNG_UP,   /* closed (or failed) before its greeting was whole */
	GATE_UNAUTH,    /* the greeting failed authentication (junk, another key) */
	GATE_REPLAYED,  /* an authentic greeting not newer than one already answered */
	GATE_UNWANTED,  /* authentic, but a role or index this server does not serve */
	GATE_MISMATCH,  /* authentic, another protocol version or training config
			 * (answered, so the peer can say so too, then closed) */
	GATE_ELSEWHERE, /* authentic, but for another ps: recorded on its way
			 * there, or a peer whose list of ps differs */
	GATE_NWHY,
};

/* Counts since the last gate_tally_take. */
struct gate_tally {
	uint64_t n[GATE_NWHY];
	uint64_t total;
	char first[320]; /* the first refusal counted: "ADDR: reason" */
};

enum gate_state {
	GATE_READING,   /* its greeting is not whole yet */
	GATE_WHOLE,     /* whole: the next gate_next hands it out */
	GATE_HELD,      /* refused: closed at its deadline, never read again */
};

struct gate_pending {
	int fd;
	enum gate_state state;
	uint16_t got;                       /* greeting bytes read */
	int64_t since_ms;                   /* accepted */
	uint8_t source[SOCK_SOURCE_BYTES];
	char peer[SOCK_ADDR_STRLEN];
	uint8_t hello[HS_HELLO_BYTES];
};

/* A whole greeting, out of the gate: fd and its bytes are the caller's. */
struct gate_greeting {
	int fd;
	int64_t since_ms;
	uint8_t source[SOCK_SOURCE_BYTES];
	char peer[SOCK_ADDR_STRLEN];
	uint8_t hello[HS_HELLO_BYTES];
};

/* Listening sockets one gate serves: a ps's TCP one and its Unix one. */
#define GATE_LISTENERS 2

struct gate {
	int lfd[GATE_LISTENERS]; /* the listening sockets: the caller's */
	int nl;                  /* how many */
	int max, per_source;
	int timeout_ms;
	struct gate_pending *p;  /* (max) the first n are in use */
	int n, nwhole;
	struct pollfd *pfd;      /* (GATE_LISTENERS + max) */
	struct gate_tally tally;
};

/* A gate in front of the listening socket lfd (non-blocking), for at most
 * max pending connections, per_source from one source, each closed
 * timeout_ms after its accept. -ENOMEM. */
int gate_init(struct gate *g, int lfd, int max, int per_source, int timeout_ms, char *err,
	      size_t errlen);
/* One more listening socket (non-blocking, the caller's) whose connections
 * go through the same gate, by the same rules. -ENOSPC past
 * GATE_LISTENERS. */
int gate_listen_also(struct gate *g, int lfd);

/* Closes every pending connection (not the listeners). Accepts a zeroed
 * struct. */
void gate_free(struct gate *g);

/* Waits up to wait_ms for a whole greeting, meanwhile accepting, reading,
 * expiring and evicting. 1: a greeting in *out, its socket the caller's
 * now; 0: none yet (wait_ms passed, or something else happened that the
 * caller may want to look at); a negative errno: accept or poll failed on
 * the listening socket in a way waiting will not cure (err says how). */
int gate_next(struct gate *g, int wait_ms, struct gate_greeting *out, char *err, size_t errlen);

/* The caller refuses a greeting gate_next gave it: counts it (reason: one
 * line, for the tally's first refusal) and takes its socket back, to hold
 * until the deadline of its accept (closed at once if the gate is full of
 * connections that are not). */
void gate_refuse(struct gate *g, struct gate_greeting *gr, enum gate_why why, const char *reason);

/* The tally since the last call, then zeroed. */
void gate_tally_take(struct gate *g, struct gate_tally *t);

/* "12 idle, 3 evicted, ..." for the non-zero counts of t. */
void gate_tally_text(const struct gate_tally *t, char *buf, size_t len);

#endif
