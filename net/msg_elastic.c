/* The elastic worker set's messages (msg.h, docs/PROTOCOL.md and
 * docs/ELASTIC.md): VIEW, LEAVE, and the events a REPORT may end with.
 * The decoders follow msg.c's order: length, type, reserved bytes, then
 * each field's range. */
#include "msg.h"
#include "msg_priv.h"
#include "../base/err.h"

#include <errno.h>
#include <string.h>

const char *msg_event_name(unsigned kind)
{
	static const char *const names[] = {
		[MSG_EVENT_JOINED] = "joined", [MSG_EVENT_LEFT] = "left", [MSG_EVENT_LOST] = "lost",
	};
	return kind >= MSG_EVENT_JOINED && kind <= MSG_EVENT_LOST ? names[kind] : "?";
}

/* ---- VIEW: 80 bytes --------------------------------------------------------
 * 0 type, 1 reserved, 2 slices u16 (1..256), 4 rev u32, 8 version u64,
 * 16 live bitmap (32 bytes), 48 base bitmap (32 bytes) */

/* Why live and base cannot be a view's, or NULL. */
static const char *view_bad(const uint8_t *live, const uint8_t *base)
{
	int any = 0;
	for (size_t i = 0; i < MSG_HEARTBEAT_WORKERS / 8; i++) {
		if (live[i] & ~base[i])
			return "a live worker outside the base";
		any |= live[i];
	}
	return any ? NULL : "no live worker";
}

int msg_encode_view(uint8_t *buf, size_t cap, const struct msg_view *m, size_t *len, char *err,
		    size_t errlen)
{
	if (m->slices < 1 || m->slices > MSG_VIEW_SLICES)
		return err_set(err, errlen, -EINVAL, "VIEW: %u slices, not 1..%u", m->slices, MSG_VIEW_SLICES);
	const char *bad = view_bad(m->live, m->base);
	if (bad)
		return err_set(err, errlen, -EINVAL, "VIEW: %s", bad);
	int rc = check_cap(cap, MSG_VIEW_BYTES, WIRE_VIEW, err, errlen);
	if (rc < 0)
		return rc;
	put_head(buf, WIRE_VIEW, MSG_VIEW_BYTES);
	wire_put_u16(buf + 2, (uint16_t)m->slices);
	wire_put_u32(buf + 4, m->rev);
	wire_put_u64(buf + 8, m->version);
	memcpy(buf + 16, m->live, sizeof(m->live));
	memcpy(buf + 48, m->base, sizeof(m->base));
	*len = MSG_VIEW_BYTES;
	return 0;
}

int msg_decode_view(const uint8_t *buf, size_t len, struct msg_view *out, char *err, size_t errlen)
{
	int rc = check_fixed(buf, len, WIRE_VIEW, MSG_VIEW_BYTES, err, errlen);
	if (rc == 0)
		rc = check_zero(buf, 1, 2, "VIEW", err, errlen);
	if (rc < 0)
		return rc;
	out->slices = wire_get_u16(buf + 2);
	if (out->slices < 1 || out->slices > MSG_VIEW_SLICES)
		return err_set(err, errlen, -EPROTO, "VIEW: %u slices, not 1..%u", out->slices, MSG_VIEW_SLICES);
	out->rev = wire_get_u32(buf + 4);
	out->version = wire_get_u64(buf + 8);
	memcpy(out->live, buf + 16, sizeof(out->live));
	memcpy(out->base, buf + 48, sizeof(out->base));
	const char *bad = view_bad(out->live, out->base);
	if (bad)
		return err_set(err, errlen, -EPROTO, "VIEW: %s", bad);
	return 0;
}

/* ---- LEAVE: 8 bytes --------------------------------------------------------
 * 0 type, 1..4 reserved, 4 worker u32 */

int msg_encode_leave(uint8_t *buf, size_t cap, const struct msg_leave *m, size_t *len, char *err,
		     size_t errlen)
{
	int rc = check_cap(cap, MSG_LEAVE_BYTES, WIRE_LEAVE, err, errlen);
	if (rc < 0)
		return rc;
	put_head(buf, WIRE_LEAVE, MSG_LEAVE_BYTES);
	wire_put_u32(buf + 4, m->worker);
	*len = MSG_LEAVE_BYTES;
	return 0;
}

int msg_decode_leave(const uint8_t *buf, size_t len, struct msg_leave *out, char *err, size_t errlen)
{
	int rc = check_fixed(buf, len, WIRE_LEAVE, MSG_LEAVE_BYTES, err, errlen);
	if (rc == 0)
		rc = check_zero(buf, 1, 4, "LEAVE", err, errlen);
	if (rc < 0)
		return rc;
	out->worker = wire_get_u32(buf + 4);
	return 0;
}

/* ---- COMPUTE: 72 bytes -----------------------------------------------------
 * 0 type, 1..8 reserved, 8 text (64 bytes: printable ASCII, then NULs) */

/* Bytes of text before its NUL padding, or -1 when text is no COMPUTE's:
 * empty, a byte outside 0x20..0x7e, or one after the padding began. */
static int compute_len(const uint8_t *text)
{
	int n = 0;
	while (n < (int)MSG_COMPUTE_TEXT && text[n])
		if (text[n] < 0x20 || text[n] > 0x7e)
			return -1;
		else
			n++;
	for (int i = n; i < (int)MSG_COMPUTE_TEXT; i++)
		if (text[i])
			return -1;
	return n ? n : -1;
}

int msg_encode_compute(uint8_t *buf, size_t cap, const struct msg_compute *m, size_t *len, char *err,
		       size_t errlen)
{
	size_t n = strnlen(m->text, sizeof(m->text));
	uint8_t text[MSG_COMPUTE_TEXT] = { 0 };
	if (n > MSG_COMPUTE_TEXT)
		return err_set(err, errlen, -EINVAL, "COMPUTE: a text over %u bytes", MSG_COMPUTE_TEXT);
	memcpy(text, m->text, n);
	if (compute_len(text) < 0)
		return err_set(err, errlen, -EINVAL, "COMPUTE: an empty text, or one not printable ASCII");
	int rc = check_cap(cap, MSG_COMPUTE_BYTES, WIRE_COMPUTE, err, errlen);
	if (rc < 0)
		return rc;
	put_head(buf, WIRE_COMPUTE, MSG_COMPUTE_BYTES);
	memcpy(buf + 8, text, sizeof(text));
	*len = MSG_COMPUTE_BYTES;
	return 0;
}

int msg_decode_compute(const uint8_t *buf, size_t len, struct msg_compute *out, char *err, size_t errlen)
{
	int rc = check_fixed(buf, len, WIRE_COMPUTE, MSG_COMPUTE_BYTES, err, errlen);
	if (rc == 0)
		rc = check_zero(buf, 1, 8, "COMPUTE", err, errlen);
	if (rc < 0)
		return rc;
	int n = compute_len(buf + 8);
	if (n < 0)
		return err_set(err, errlen, -EPROTO, "COMPUTE: the text is empty, not printable ASCII, or not NUL-padded");
	memcpy(out->text, buf + 8, (size_t)n);
	out->text[n] = 0;
	return 0;
}

/* ---- a REPORT's events: 12 bytes each ----------------------------------------
 * 0 step u64, 8 worker u16, 10 kind u8 (enum msg_event_kind), 11 reserved */

int report_events_put(uint8_t *buf, const struct msg_event *ev, uint32_t n, char *err, size_t errlen)
{
	for (uint32_t i = 0; i < n; i++) {
		uint8_t *b = buf + (size_t)i * MSG_REPORT_EVENT_BYTES;
		if (ev[i].kind < MSG_EVENT_JOINED || ev[i].kind > MSG_EVENT_LOST)
			return err_set(err, errlen, -EINVAL, "REPORT: event %u has unknown kind %u", i, ev[i].kind);
		wire_put_u64(b, ev[i].step);
		wire_put_u16(b + 8, ev[i].worker);
		b[10] = ev[i].kind;
		b[11] = 0;
	}
	return 0;
}

int report_events_get(const uint8_t *buf, struct msg_event *ev, uint32_t n, char *err, size_t errlen)
{
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *b = buf + (size_t)i * MSG_REPORT_EVENT_BYTES;
		if (b[10] < MSG_EVENT_JOINED || b[10] > MSG_EVENT_LOST)
			return err_set(err, errlen, -EPROTO, "REPORT: event %u has unknown kind %u", i, b[10]);
		if (b[11])
			return err_set(err, errlen, -EPROTO, "REPORT: event %u: reserved byte 11 is 0x%02x, expected 0",
				       i, b[11]);
		ev[i] = (struct msg_event){ .step = wire_get_u64(b), .worker = wire_get_u16(b + 8), .kind = b[10] };
	}
	return 0;
}
