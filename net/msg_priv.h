/* What msg.c shares with msg_elastic.c, which holds the elastic worker
 * set's messages (VIEW, LEAVE, a REPORT's events): the checks and the
 * header every message has. Not part of the API. */
#ifndef PSTRAIN_NET_MSG_PRIV_H
#define PSTRAIN_NET_MSG_PRIV_H

#include "msg.h"

/* msg.c's own short names, exported under the module's prefix. */
#define check_fixed msg_check_fixed
#define check_zero msg_check_zero
#define check_cap msg_check_cap
#define put_head msg_put_head
#define chunk_put_head msg_chunk_put_head
#define report_events_put msg_report_events_put
#define report_events_get msg_report_events_get

/* A fixed-length message: exactly want bytes, and the type byte. */
int check_fixed(const uint8_t *buf, size_t len, uint8_t type, size_t want, char *err, size_t errlen);
/* Bytes [from, to) must be zero. */
int check_zero(const uint8_t *buf, size_t from, size_t to, const char *name, char *err, size_t errlen);
/* cap bytes hold need. */
int check_cap(size_t cap, size_t need, uint8_t type, char *err, size_t errlen);
/* Type byte and zeroed reserved bytes of a header of n bytes. */
void put_head(uint8_t *buf, uint8_t type, size_t n);
/* A PARAMS or PUSH chunk's header (MSG_CHUNK_HDR_BYTES) from c. */
void chunk_put_head(uint8_t *buf, const struct msg_chunk *c);

/* A REPORT's n events at buf (MSG_REPORT_EVENT_BYTES each): put (-EINVAL
 * for an unknown kind), or got (-EPROTO for an unknown kind or a nonzero
 * reserved byte). */
int report_events_put(uint8_t *buf, const struct msg_event *ev, uint32_t n, char *err, size_t errlen);
int report_events_get(const uint8_t *buf, struct msg_event *ev, uint32_t n, char *err, size_t errlen);

#endif
