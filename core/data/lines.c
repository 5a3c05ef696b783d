/* Lines of a plain or gzip file; see lines.h. One buffer, refilled by
 * gzread in large reads: gzgets would hide a NUL byte inside a line and
 * cannot tell a long line from a short read. */
#include "lines.h"
#include "../../base/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Large enough that a read is many lines (gzread's own cost per call and
 * the memmove of a partial line are then noise), with LINES_MAX room. */
#define LINES_BUF (1u << 20)

int lines_open(struct lines *l, const char *path, char *err, size_t errlen)
{
	memset(l, 0, sizeof(*l));
	l->path = path;
	errno = 0;
	l->gz = gzopen(path, "rb");
	if (!l->gz) {
		int e = errno ? errno : ENOMEM;
		return err_set(err, errlen, -e, "%s: cannot open: %s", path, strerror(e));
	}
	/* zlib's own input buffer: the default 8 KiB costs a read(2) per 8 KiB. */
	gzbuffer(l->gz, 1u << 17);
	l->cap = LINES_BUF;
	l->buf = malloc(l->cap + 1);
	if (!l->buf) {
		lines_close(l);
		return err_set(err, errlen, -ENOMEM, "%s: out of memory for a read buffer", path);
	}
	return 0;
}

/* The stream's error after gzread returned <= 0: 0 at a clean end. */
static int lines_gz_status(struct lines *l, char *err, size_t errlen)
{
	int errnum;
	const char *msg = gzerror(l->gz, &errnum);

	if (errnum == Z_OK || errnum == Z_STREAM_END)
		return 0;
	if (errnum == Z_BUF_ERROR)
		return err_set(err, errlen, -EINVAL, "%s: truncated gzip stream", l->path);
	if (errnum == Z_ERRNO) {
		int e = errno ? errno : EIO;
		return err_set(err, errlen, -e, "%s: read error: %s", l->path, strerror(e));
	}
	if (errnum == Z_MEM_ERROR)
		return err_set(err, errlen, -ENOMEM, "%s: out of memory decompressing", l->path);
	/* zlib starts its message with the path we gave it; we name the file
	 * ourselves. */
	size_t pl = strlen(l->path);
	if (strncmp(msg, l->path, pl) == 0 && strncmp(msg + pl, ": ", 2) == 0)
		msg += pl + 2;
	return err_set(err, errlen, -EINVAL, "%s: corrupt gzip data: %s", l->path, msg);
}

/* Moves the unreturned text to the front and reads more after it. */
static int lines_fill(struct lines *l, char *err, size_t errlen)
{
	size_t have = l->end - l->at;

	memmove(l->buf, l->buf + l->at, have);
	l->at = 0;
	l->end = have;
	while (!l->eof && l->end < l->cap) {
		int n = gzread(l->gz, l->buf + l->end, (unsigned)(l->cap - l->end));
		if (n <= 0) {
			l->eof = 1;
			return lines_gz_status(l, err, errlen);
		}
		l->end += (size_t)n;
	}
	return 0;
}

int lines_next(struct lines *l, char **line, size_t *len, char *err, size_t errlen)
{
	char *p = l->buf + l->at, *nl = memchr(p, '\n', l->end - l->at);

	if (!nl && !l->eof) {
		int e = lines_fill(l, err, errlen);
		if (e < 0)
			return e;
		p = l->buf;
		nl = memchr(p, '\n', l->end);
	}
	if (!nl && l->at == l->end)
		return 0;
	size_t n = nl ? (size_t)(nl - p) : l->end - l->at;
	l->lineno++;
	/* With the buffer full and no newline, the line is over LINES_MAX. */
	if (n > LINES_MAX)
		return err_set(err, errlen, -EINVAL, "%s:%zu: line longer than %d bytes (not a data file?)",
			       l->path, l->lineno, LINES_MAX);
	if (memchr(p, '\0', n))
		return err_set(err, errlen, -EINVAL, "%s:%zu: contains a NUL byte (not a text file?)", l->path,
			       l->lineno);
	l->at += n + (nl != NULL);
	if (n > 0 && p[n - 1] == '\r')
		n--;
	p[n] = '\0';
	*line = p;
	*len = n;
	return 1;
}

int lines_rewind(struct lines *l, char *err, size_t errlen)
{
	if (gzrewind(l->gz) != 0)
		return err_set(err, errlen, -EIO, "%s: cannot go back to its start", l->path);
	l->at = l->end = 0;
	l->lineno = 0;
	l->eof = 0;
	return 0;
}

void lines_close(struct lines *l)
{
	if (l->gz)
		gzclose_r(l->gz);
	free(l->buf);
	l->gz = NULL;
	l->buf = NULL;
}
