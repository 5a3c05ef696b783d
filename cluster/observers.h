/* Which observer greetings a ps may answer (`pstrain status`, the
 * observer role of net/handshake.h). A worker's greeting must be newer
 * than the newest of that worker's answered before (members_greeted); that
 * rule cannot hold for observers, which run on any host, several at once,
 * with clocks a little apart: the second of two observers whose clock is a
 * second behind would be refused. Instead a greeting's time must be within
 * OBSERVERS_WINDOW_NS of the ps's own clock, either way, and not one
 * already answered: every answered time is kept until it falls out of the
 * window, so a recorded greeting is answered at most once, and a replay
 * older than the window never. OBSERVERS_SEEN bounds that memory; while it
 * is full of times still in the window, new observers are refused (a
 * status tool greets a few times a minute, not hundreds).
 *
 * Pure state: no clock, no lock, no sockets; times in ns since the epoch
 * (CLOCK_REALTIME, the clock greetings carry). docs/SECURITY.md says why
 * this is enough. */
#ifndef PSTRAIN_CLUSTER_OBSERVERS_H
#define PSTRAIN_CLUSTER_OBSERVERS_H

#include <stdint.h>

#define OBSERVERS_WINDOW_NS (120ull * 1000000000ull)
#define OBSERVERS_SEEN 256

struct observers {
	uint64_t seen[OBSERVERS_SEEN]; /* answered greeting times; 0: a free entry */
};

void observers_init(struct observers *o);

/* A greeting carrying time_ns, the ps's clock at now_ns: 0 and it is
 * recorded; -ESTALE if it is further than OBSERVERS_WINDOW_NS from now
 * (either way), -EALREADY if that time was answered already (a replay),
 * -EBUSY if OBSERVERS_SEEN greetings were answered within the window. */
int observers_greeted(struct observers *o, uint64_t time_ns, uint64_t now_ns);

#endif
