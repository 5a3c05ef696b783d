/* err_set: formatting a failure into a caller's buffer. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>

int err_set(char *err, size_t errlen, int code, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

const char *err_shown(char *buf, size_t cap, const char *s, size_t len)
{
	size_t i = 0;
	if (!cap)
		return buf;
	for (; s && i < len && s[i] && i + 1 < cap; i++)
		buf[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
	buf[i] = 0;
	return buf;
}
