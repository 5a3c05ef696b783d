/* Criteo lines into samples, and a whole file into a dataset; see
 * criteo.h. Every column is checked in full: a click log that is cut,
 * shifted by a column or has a stray character gets the line named
 * rather than silently wrong features. */
#include "criteo.h"
#include "../../base/err.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A field as quoted in a message: at most 40 bytes, printable ASCII. */
static int criteo_bad(char *err, size_t errlen, size_t col, const char *f, size_t n, const char *what)
{
	char shown[48], name[8];

	if (col == 0)
		snprintf(name, sizeof(name), "label");
	else if (col <= CRITEO_INTS)
		snprintf(name, sizeof(name), "I%zu", col);
	else
		snprintf(name, sizeof(name), "C%zu", col - CRITEO_INTS);
	err_shown(shown, sizeof(shown), f, n > 40 ? 40 : n);
	return err_set(err, errlen, -EINVAL, "column %zu (%s): \"%s%s\" %s", col + 1, name, shown,
		       n > 40 ? "..." : "", what);
}

/* A decimal integer of the int64 range, optionally negative, as the
 * feature CTR trainers use: log(1 + v) for v > 0, else 0. */
static int criteo_int(const char *f, size_t n, float *x)
{
	size_t i = f[0] == '-';
	uint64_t v = 0;

	if (i == n)
		return -1;
	for (; i < n; i++) {
		unsigned d = (unsigned)(f[i] - '0');
		if (d > 9 || v > (INT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	*x = f[0] == '-' || v == 0 ? 0.0f : (float)log1p((double)v);
	return 0;
}

static int criteo_hex(const char *f, size_t n, uint32_t *id)
{
	uint32_t v = 0;

	if (n != 8)
		return -1;
	for (size_t i = 0; i < 8; i++) {
		unsigned c = (unsigned char)f[i], d;
		if (c >= '0' && c <= '9')
			d = c - '0';
		else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
			d = (c | 0x20) - 'a' + 10;
		else
			return -1;
		v = v << 4 | d;
	}
	*id = v == DATA_ID_NONE ? DATA_ID_NONE - 1 : v;
	return 0;
}

int criteo_parse(const char *line, size_t len, float *x, uint32_t *ids, int32_t *y, char *err,
		 size_t errlen)
{
	const char *f = line, *end = line + len;
	size_t tabs = 0;

	for (const char *p = line; (p = memchr(p, '\t', (size_t)(end - p))); p++)
		tabs++;
	if (tabs != CRITEO_COLS - 1)
		return err_set(err, errlen, -EINVAL,
			       "%zu columns, expected %d (label, I1..I13, C1..C26, tab-separated)", tabs + 1,
			       CRITEO_COLS);
	for (size_t col = 0; col < CRITEO_COLS; col++) {
		const char *tab = memchr(f, '\t', (size_t)(end - f));
		size_t n = tab ? (size_t)(tab - f) : (size_t)(end - f);

		if (col == 0) {
			if (n != 1 || (f[0] != '0' && f[0] != '1'))
				return criteo_bad(err, errlen, col, f, n, "is not a label 0 or 1");
			*y = f[0] - '0';
		} else if (col <= CRITEO_INTS) {
			float *v = &x[col - 1];
			*v = 0;
			if (n && criteo_int(f, n, v) < 0)
				return criteo_bad(err, errlen, col, f, n, "is not an integer (64-bit)");
		} else {
			uint32_t *id = &ids[col - 1 - CRITEO_INTS];
			*id = DATA_ID_NONE;
			if (n && criteo_hex(f, n, id) < 0)
				return criteo_bad(err, errlen, col, f, n, "is not 8 hex digits");
		}
		f += n + 1;
	}
	return 0;
}

int criteo_next(struct lines *l, float *x, uint32_t *ids, int32_t *y, char *err, size_t errlen)
{
	char *line, why[200];
	size_t len;
	int r = lines_next(l, &line, &len, err, errlen);

	if (r <= 0)
		return r;
	if (criteo_parse(line, len, x, ids, y, why, sizeof(why)) < 0)
		return err_set(err, errlen, -EINVAL, "%s:%zu: %s", l->path, l->lineno, why);
	return 1;
}

/* Room for n samples in d, keeping what it holds. */
static int criteo_grow(struct dataset *d, size_t n)
{
	float *x = realloc(d->x, n * CRITEO_INTS * sizeof(*x));
	if (x)
		d->x = x;
	uint32_t *ids = realloc(d->ids, n * CRITEO_CATS * sizeof(*ids));
	if (ids)
		d->ids = ids;
	int32_t *y = realloc(d->y, n * sizeof(*y));
	if (y)
		d->y = y;
	return x && ids && y ? 0 : -ENOMEM;
}

int criteo_load(struct dataset *ds, const char *path, size_t max_rows, size_t *nrows, char *err,
		size_t errlen)
{
	struct dataset d = { .d = CRITEO_INTS, .f = CRITEO_CATS, .classes = 2 };
	struct lines l;
	size_t cap = 0, n = 0;
	/* Rows past max_rows are parsed here, to be checked, and dropped. */
	float x[CRITEO_INTS];
	uint32_t ids[CRITEO_CATS];
	int32_t y;
	int r;

	memset(ds, 0, sizeof(*ds));
	*nrows = 0;
	r = lines_open(&l, path, err, errlen);
	if (r < 0)
		return r;
	for (;;) {
		if (d.n == cap && cap < max_rows) {
			size_t want = cap ? cap * 2 : 4096;
			want = want < max_rows ? want : max_rows;
			if (criteo_grow(&d, want) < 0) {
				r = err_set(err, errlen, -ENOMEM, "%s: out of memory for %zu samples", path, want);
				goto out;
			}
			cap = want;
		}
		int keep = d.n < cap;
		r = criteo_next(&l, keep ? d.x + d.n * CRITEO_INTS : x, keep ? d.ids + d.n * CRITEO_CATS : ids,
				keep ? d.y + d.n : &y, err, errlen);
		if (r <= 0)
			break;
		d.n += keep;
		n++;
	}
	if (r == 0 && n == 0)
		r = err_set(err, errlen, -EINVAL, "%s: no samples (an empty file)", path);
	if (r == 0) {
		*ds = d;
		*nrows = n;
		d = (struct dataset){ 0 };
	}
out:
	lines_close(&l);
	dataset_free(&d);
	return r;
}
