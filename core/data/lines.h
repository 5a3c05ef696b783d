/* Lines of a text file, plain or gzip-compressed (zlib's gzopen reads
 * both), in order and counted from 1, for the loaders that parse a file
 * line by line without holding it whole (criteo.c, stream.c). A failure
 * is one line in the caller's buffer naming the file (and the line). */
#ifndef PSTRAIN_LINES_H
#define PSTRAIN_LINES_H

#include <stddef.h>
#include <zlib.h>

/* The longest line accepted: a Criteo line is about 250 bytes; a longer
 * one is a damaged or foreign file, not a reason to grow without bound. */
#define LINES_MAX (64 * 1024)

struct lines {
	gzFile gz;
	const char *path;   /* borrowed: the caller keeps it alive */
	char *buf;          /* (cap) read ahead; [at, end) not yet returned */
	size_t cap, at, end;
	size_t lineno;      /* lines returned so far */
	int eof;            /* gzread has reported the end */
};

/* Opens path for reading. l is overwritten. Returns 0 or a negative errno
 * with "PATH: cannot open: ..." in err. */
int lines_open(struct lines *l, const char *path, char *err, size_t errlen);

/* The next line, without its "\n" or "\r\n", NUL-terminated at *line
 * ((*len) bytes), valid until the next call; l->lineno is its number.
 * Returns 1 for a line, 0 at the end of the file (a last line without a
 * newline is still a line), or a negative errno with one line in err: a
 * read or gzip error, a line longer than LINES_MAX, a NUL byte. */
int lines_next(struct lines *l, char **line, size_t *len, char *err, size_t errlen);

/* Back to the first line. Returns 0 or a negative errno with err. */
int lines_rewind(struct lines *l, char *err, size_t errlen);

void lines_close(struct lines *l);   /* accepts a zeroed or closed struct */

#endif
