/* See observers.h. A linear scan of 256 times per observer greeting: a
 * microsecond, on a path that already spends two BLAKE2b calls and an
 * X25519. */
#include "observers.h"

#include <errno.h>
#include <string.h>

void observers_init(struct observers *o)
{
	memset(o, 0, sizeof(*o));
}

int observers_greeted(struct observers *o, uint64_t time_ns, uint64_t now_ns)
{
	uint64_t d = time_ns > now_ns ? time_ns - now_ns : now_ns - time_ns;
	if (time_ns == 0 || d > OBSERVERS_WINDOW_NS)
		return -ESTALE;
	int free_at = -1;
	for (int i = 0; i < OBSERVERS_SEEN; i++) {
		uint64_t t = o->seen[i];
		/* out of the window: a replay of it would be refused as stale */
		if (t && (t + OBSERVERS_WINDOW_NS < now_ns))
			o->seen[i] = t = 0;
		if (t == time_ns)
			return -EALREADY;
		if (!t && free_at < 0)
			free_at = i;
	}
	if (free_at < 0)
		return -EBUSY;
	o->seen[free_at] = time_ns;
	return 0;
}
