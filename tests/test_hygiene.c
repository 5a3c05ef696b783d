/* Secret and text hygiene (issue 13 item 5): what a peer's ERROR text may
 * carry to a terminal. Each test here failed before the change it covers
 * (or, where today's code already held, when that code was broken on
 * purpose). */
#include <criterion/criterion.h>

#include "leak.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "../net/msg.h"

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
}

TestSuite(hygiene, .init = setup, .fini = leak_check);

/* ---- ERROR text: printable ASCII only ------------------------------------ */

/* Every byte value in one text (but NUL, which ends a C string): the
 * encoder sends 0x20..0x7e as they are and every other byte as '?', and
 * what it sent decodes back to exactly that. */
Test(hygiene, error_text_encoded_printable)
{
	char text[256];
	uint8_t buf[MSG_ERROR_BYTES_MAX];
	struct msg_error out;
	char err[256] = "";
	size_t len = 0;
	for (int i = 1; i < 256; i++)
		text[i - 1] = (char)i;
	text[255] = '\0';
	cr_assert_eq(msg_encode_error(buf, sizeof buf, 5, text, &len, err, sizeof err), 0, "%s",
		     err);
	cr_assert_eq(len, MSG_ERROR_HDR_BYTES + 255);
	for (int i = 1; i < 256; i++) {
		uint8_t want = i >= 0x20 && i <= 0x7e ? (uint8_t)i : '?';
		cr_assert_eq(buf[MSG_ERROR_HDR_BYTES + i - 1], want,
			     "byte 0x%02x sent as 0x%02x, expected 0x%02x", i,
			     buf[MSG_ERROR_HDR_BYTES + i - 1], want);
	}
	cr_assert_eq(msg_decode_error(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_eq(out.code, 5);
	cr_assert_eq(memcmp(out.text, buf + MSG_ERROR_HDR_BYTES, 255), 0);

	/* What an attacker would try: a colour, a title, a cleared line. */
	const char *evil = "ps 0: \x1b[2K\r\x1b]0;pwned\x07ok\n";
	cr_assert_eq(msg_encode_error(buf, sizeof buf, 5, evil, &len, err, sizeof err), 0, "%s",
		     err);
	cr_assert_eq(msg_decode_error(buf, len, &out, err, sizeof err), 0, "%s", err);
	cr_assert_str_eq(out.text, "ps 0: ?[2K??]0;pwned?ok?");
}

/* A peer's ERROR holding any byte outside 0x20..0x7e is refused, the byte
 * named in hex (the refusal itself is safe to print). */
Test(hygiene, error_text_decoded_printable_or_refused)
{
	uint8_t buf[MSG_ERROR_BYTES_MAX];
	struct msg_error out;
	char err[256];
	size_t len = 0;
	for (int b = 0; b < 256; b++) {
		cr_assert_eq(msg_encode_error(buf, sizeof buf, 5, "abcdefgh", &len, err, sizeof err),
			     0, "%s", err);
		buf[MSG_ERROR_HDR_BYTES + 3] = (uint8_t)b;
		err[0] = '\0';
		memset(&out, 0, sizeof out);
		int r = msg_decode_error(buf, len, &out, err, sizeof err);
		if (b >= 0x20 && b <= 0x7e) {
			cr_assert_eq(r, 0, "byte 0x%02x: %s", b, err);
			cr_assert_eq((uint8_t)out.text[3], b);
			continue;
		}
		cr_assert_eq(r, -EPROTO, "byte 0x%02x accepted (returned %d)", b, r);
		char want[64];
		snprintf(want, sizeof want, "text byte 3 is 0x%02x", b);
		cr_assert(strstr(err, want), "byte 0x%02x: \"%s\" does not say \"%s\"", b, err, want);
		for (const char *p = err; *p; p++)
			cr_assert(*p >= 0x20 && *p <= 0x7e, "refusal holds byte 0x%02x", (uint8_t)*p);
	}
}
