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
