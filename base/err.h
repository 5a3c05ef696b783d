/* The one way core/, net/ and the roles above them report a failure: a one-line
 * message in the caller's buffer, and the error code handed back so that a
 * failure path is a single statement:
 *
 *	return err_set(err, errlen, -EMSGSIZE, "length %u exceeds %u", n, max);
 *
 * err may be NULL or errlen 0: the message is then dropped. */
#ifndef PSTRAIN_BASE_ERR_H
#define PSTRAIN_BASE_ERR_H

#include <stddef.h>

int err_set(char *err, size_t errlen, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Text from outside (the environment, a scheduler's variables) for a
 * message: at most len bytes of s, up to a NUL, with every byte outside
 * printable ASCII as '?', so that no escape sequence reaches a terminal
 * or a log and the message stays one line. Returns buf (cap bytes; "" for
 * a NULL s). */
const char *err_shown(char *buf, size_t cap, const char *s, size_t len);

#endif
