/* CSV loader: one file of numbers, one row per sample, one column of it the
 * integer label, into a struct dataset with the features as read.
 *
 * Deliberately small: fields are separated by commas, there is no quoting
 * (a header's names may contain anything but commas), and every field of
 * a data row must be a finite number in full. Standardization and the
 * train/test split are data.c's job. The file may be gzip-compressed. */
#include "csv.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* Bounds what a corrupt or hostile file can make us allocate. */
#define CSV_MAX_BYTES (1ull << 32)

struct csv_reader {
	const char *path;
	char *err;
	size_t errlen;
	size_t ncols;        /* fields per row, from the first row */
	size_t label;        /* 0-based label column */
	char **fields;       /* (ncols) the current row's fields */
};

__attribute__((format(printf, 3, 4)))
static void csv_fail(struct csv_reader *r, size_t line, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!r->err || !r->errlen)
		return;
	if (line > 0)
		n = snprintf(r->err, r->errlen, "%s:%zu: ", r->path, line);
	else
		n = snprintf(r->err, r->errlen, "%s: ", r->path);
	if (n < 0 || (size_t)n >= r->errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(r->err + n, r->errlen - n, fmt, ap);
	va_end(ap);
}

/* The whole file, NUL-terminated, in one allocation. */
static int csv_slurp(struct csv_reader *r, char **out, size_t *outlen)
{
	size_t cap = 1u << 16, len = 0;
	char *buf = NULL, *p;
	const char *msg;
	gzFile gz;
	int errnum, n, e;

	errno = 0;
	gz = gzopen(r->path, "rb");
	if (!gz) {
		e = errno ? errno : ENOMEM;
		csv_fail(r, 0, "cannot open: %s", strerror(e));
		return -e;
	}
	for (;;) {
		if (len + 1 >= cap || !buf) {
			if (buf)
				cap *= 2;
			if (cap > CSV_MAX_BYTES) {
				csv_fail(r, 0, "larger than %llu bytes, refusing",
					 CSV_MAX_BYTES);
				e = EFBIG;
				goto fail;
			}
			p = realloc(buf, cap);
			if (!p) {
				csv_fail(r, 0, "out of memory reading the file");
				e = ENOMEM;
				goto fail;
			}
			buf = p;
		}
		/* gzread takes an unsigned but fails requests above INT_MAX. */
		size_t want = cap - 1 - len < (1u << 30) ? cap - 1 - len : (1u << 30);
		n = gzread(gz, buf + len, (unsigned)want);
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	msg = gzerror(gz, &errnum);
	if (errnum != Z_OK && errnum != Z_STREAM_END) {
		if (errnum == Z_BUF_ERROR)
			csv_fail(r, 0, "truncated gzip stream");
		else if (errnum == Z_ERRNO)
			csv_fail(r, 0, "read error: %s", strerror(errno));
		else {
			/* zlib starts its message with the path we gave it; we name
			 * the file ourselves. */
			size_t pl = strlen(r->path);
			if (strncmp(msg, r->path, pl) == 0 && strncmp(msg + pl, ": ", 2) == 0)
				msg += pl + 2;
			csv_fail(r, 0, "corrupt gzip data: %s", msg);
		}
		e = EINVAL;
		if (errnum == Z_MEM_ERROR)
			e = ENOMEM;
		else if (errnum == Z_ERRNO && errno)
			e = errno;
		goto fail;
	}
	gzclose_r(gz);
	buf[len] = '\0';
	*out = buf;
	*outlen = len;
	return 0;
fail:
	gzclose_r(gz);
	free(buf);
	return -e;
}

static int csv_is_blank(const char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	return *s == '\0';
}

static size_t csv_count(const char *line)
{
	size_t n = 1;

	while ((line = strchr(line, ',')))
		n++, line++;
	return n;
}

/* Splits a line of csv_count(line) fields in place at the commas. */
static void csv_split(char *line, char **fields)
{
	size_t n = 0;
	char *c;

	fields[n++] = line;
	while ((c = strchr(line, ','))) {
		*c = '\0';
		line = c + 1;
		fields[n++] = line;
	}
}

/* strtod with everything checked: the whole field (blanks around it
 * allowed) must be one finite number. Returns 0, -1 for an empty field,
 * -2 for anything else. */
static int csv_number(const char *s, double *v)
{
	char *end;

	while (*s == ' ' || *s == '\t')
		s++;
	if (!*s)
		return -1;
	errno = 0;
	*v = strtod(s, &end);
	if (end == s)
		return -2;
	while (*end == ' ' || *end == '\t')
		end++;
	/* Overflow gives HUGE_VAL; underflow to a tiny value is fine. */
	if (*end || !isfinite(*v))
		return -2;
	return 0;
}

/* Columns are counted from 1 in messages, like lines. At most 40
 * characters of the bad field are quoted so a binary file cannot produce a
 * megabyte-long message. */
static void csv_bad_field(struct csv_reader *r, size_t line, size_t col,
			  const char *f, int why, int is_label)
{
	const char *more = strlen(f) > 40 ? "..." : "";

	if (why == -1)
		csv_fail(r, line, "column %zu: empty field", col + 1);
	else if (is_label)
		csv_fail(r, line, "column %zu: label \"%.40s%s\" is not an integer in 0..%d",
			 col + 1, f, more, DATA_MAX_CLASSES - 1);
	else
		csv_fail(r, line, "column %zu: \"%.40s%s\" is not a number (finite, in float range)",
			 col + 1, f, more);
}

/* Parses the split row in r->fields into x (D) and *y. */
static int csv_parse_row(struct csv_reader *r, size_t line, float *x,
			 int32_t *y)
{
	char **fields = r->fields;
	size_t c, j = 0;
	double v;
	int ret;

	for (c = 0; c < r->ncols; c++) {
		ret = csv_number(fields[c], &v);
		if (c == r->label) {
			if (ret == 0 && (v < 0 || v != floor(v) ||
					 v >= DATA_MAX_CLASSES))
				ret = -2;
			if (ret < 0) {
				csv_bad_field(r, line, c, fields[c], ret, 1);
				return -EINVAL;
			}
			*y = (int32_t)v;
			continue;
		}
		if (ret == 0 && !isfinite((float)v))
			ret = -2;
		if (ret < 0) {
			csv_bad_field(r, line, c, fields[c], ret, 0);
			return -EINVAL;
		}
		x[j++] = (float)v;
	}
	return 0;
}

/* The first non-blank line fixes the number of columns: check the label
 * column against it and size the arrays. maxrows bounds the data rows. */
static int csv_begin(struct csv_reader *r, struct dataset *d, const char *line,
		     size_t lineno, int label_column, size_t maxrows, size_t len)
{
	r->ncols = csv_count(line);
	if (r->ncols < 2) {
		csv_fail(r, lineno, "%zu column; need a label and at least one feature",
			 r->ncols);
		return -EINVAL;
	}
	if (label_column < -1 ||
	    (label_column >= 0 && (size_t)label_column >= r->ncols)) {
		csv_fail(r, lineno, "label column %d is out of range for %zu columns (0..%zu, or -1 for the last)",
			 label_column, r->ncols, r->ncols - 1);
		return -EINVAL;
	}
	r->label = label_column < 0 ? r->ncols - 1 : (size_t)label_column;

	/* A row of ncols fields takes at least ncols bytes (commas and
	 * newline), so a long first row followed by many short lines cannot
	 * inflate this. */
	if (maxrows > len / r->ncols + 1)
		maxrows = len / r->ncols + 1;
	d->d = r->ncols - 1;
	r->fields = calloc(r->ncols, sizeof(*r->fields));
	d->x = malloc(maxrows * d->d * sizeof(*d->x));
	d->y = malloc(maxrows * sizeof(*d->y));
	if (!r->fields || !d->x || !d->y) {
		csv_fail(r, 0, "out of memory for %zu rows of %zu columns",
			 maxrows, r->ncols);
		return -ENOMEM;
	}
	return 0;
}

static int csv_is_header(struct csv_reader *r, enum csv_header header)
{
	size_t i;
	double v;

	if (header != CSV_HEADER_AUTO)
		return header == CSV_HEADER_YES;
	/* A header has a non-numeric name; an empty field is a malformed data
	 * row, which must be reported rather than skipped as a header. */
	for (i = 0; i < r->ncols; i++)
		if (r->fields[i][strspn(r->fields[i], " \t\r")] && csv_number(r->fields[i], &v) < 0)
			return 1;
	return 0;
}

int csv_load(struct dataset *ds, const char *path, int label_column,
	     enum csv_header header, char *err, size_t errlen)
{
	struct csv_reader r = { .path = path, .err = err, .errlen = errlen };
	struct dataset d = { 0 };
	char *buf = NULL, *p, *end;
	size_t len = 0, maxrows, line = 0, blank = 0, n;
	int max = -1, ret;

	memset(ds, 0, sizeof(*ds));
	ret = csv_slurp(&r, &buf, &len);
	if (ret < 0)
		return ret;
	if (memchr(buf, '\0', len)) {
		csv_fail(&r, 0, "contains a NUL byte (not a text file?)");
		ret = -EINVAL;
		goto out;
	}

	/* One row per line at most: sizes the arrays in one go. */
	maxrows = 1;
	for (p = buf; (p = memchr(p, '\n', buf + len - p)); p++)
		maxrows++;

	for (p = buf; p < buf + len; p = end + 1) {
		end = memchr(p, '\n', buf + len - p);
		if (!end)
			end = buf + len;
		*end = '\0';
		line++;
		if (end > p && end[-1] == '\r')
			end[-1] = '\0';
		/* Blank lines may only trail the data: one in the middle
		 * is more likely a damaged file than a separator. */
		if (csv_is_blank(p)) {
			if (!blank)
				blank = line;
			continue;
		}
		if (blank) {
			csv_fail(&r, blank, "empty line before more data");
			ret = -EINVAL;
			goto out;
		}

		if (!r.fields) {
			ret = csv_begin(&r, &d, p, line, label_column, maxrows, len);
			if (ret < 0)
				goto out;
			csv_split(p, r.fields);
			if (csv_is_header(&r, header))
				continue;
		} else {
			n = csv_count(p);
			if (n != r.ncols) {
				csv_fail(&r, line, "%zu fields, expected %zu like the first row",
					 n, r.ncols);
				ret = -EINVAL;
				goto out;
			}
			csv_split(p, r.fields);
		}
		ret = csv_parse_row(&r, line, d.x + d.n * d.d, d.y + d.n);
		if (ret < 0)
			goto out;
		if (d.y[d.n] > max)
			max = d.y[d.n];
		d.n++;
	}
	if (!r.fields) {
		csv_fail(&r, 0, "empty file");
		ret = -EINVAL;
		goto out;
	}
	if (d.n == 0) {
		csv_fail(&r, 0, "no data rows after the header");
		ret = -EINVAL;
		goto out;
	}
	d.classes = max + 1;
	*ds = d;
	d = (struct dataset){ 0 };
out:
	free(r.fields);
	free(buf);
	dataset_free(&d);
	return ret;
}
