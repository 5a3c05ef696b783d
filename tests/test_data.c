/* Tests for core/data/data.h: IDX and CSV loaders (good files and a table of bad
 * ones, raw and gzip), the CSV split and standardization, data_permute and
 * dataset_gather. Every test writes its own small files into a fresh
 * temporary directory, removed afterwards. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L   /* mkdtemp, truncate under -std=c11 */
#endif
#include "../core/data/csv.h"
#include "../core/data/data.h"
#include "../core/data/idx.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include "leak.h"

static char tmpdir[512];

static void tmp_setup(void)
{
	const char *base = getenv("TMPDIR");

	if (!base || !base[0])
		base = "/tmp";
	snprintf(tmpdir, sizeof(tmpdir), "%s/pstrain-data-XXXXXX", base);
	cr_assert(mkdtemp(tmpdir), "mkdtemp %s: %s", tmpdir, strerror(errno));
}

static void tmp_teardown(void)
{
	char path[1024];
	struct dirent *e;
	DIR *d;

	d = opendir(tmpdir);
	if (!d)
		return;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(path, sizeof(path), "%s/%s", tmpdir, e->d_name);
		unlink(path);
	}
	closedir(d);
	rmdir(tmpdir);
	leak_check();
}

TestSuite(data, .init = tmp_setup, .fini = tmp_teardown);

/* Returns a path in the temporary directory; one of 8 rotating buffers so a
 * test can hold several at once. */
static const char *tmp_path(const char *name)
{
	static char bufs[8][1024];
	static int next;
	char *p = bufs[next++ % 8];

	snprintf(p, sizeof(bufs[0]), "%s/%s", tmpdir, name);
	return p;
}

/* Writes len bytes to name, gzip-compressed when gz, and returns the path;
 * then chops gz_cut bytes off the end of the file on disk. */
static const char *write_file(const char *name, const void *buf, size_t len,
			      int gz, long gz_cut)
{
	const char *path = tmp_path(name);

	if (gz) {
		gzFile f = gzopen(path, "wb");

		cr_assert(f, "gzopen %s", path);
		cr_assert(len == 0 || gzwrite(f, buf, (unsigned)len) == (int)len);
		cr_assert(gzclose(f) == Z_OK);
	} else {
		FILE *f = fopen(path, "wb");

		cr_assert(f, "fopen %s", path);
		cr_assert(fwrite(buf, 1, len, f) == len);
		cr_assert(fclose(f) == 0);
	}
	if (gz_cut) {
		FILE *f = fopen(path, "rb");
		long size;

		cr_assert(f);
		fseek(f, 0, SEEK_END);
		size = ftell(f);
		fclose(f);
		cr_assert(size > gz_cut);
		cr_assert(truncate(path, size - gz_cut) == 0);
	}
	return path;
}

static const char *write_text(const char *name, const char *text)
{
	return write_file(name, text, strlen(text), 0, 0);
}

/* ---- IDX ---------------------------------------------------------------- */

static unsigned char pixel(size_t i) { return (unsigned char)((i * 37 + 11) % 256); }
static unsigned char label(size_t i) { return (unsigned char)(i % 7); }

/* What to put in one IDX file. Zero fields mean "as a good file has it". */
struct idx_spec {
	uint32_t magic;      /* 0: the right magic */
	uint32_t n;          /* 0: 5 */
	uint32_t rows;       /* 0: 3; ~0u: a zero dimension */
	uint32_t cols;       /* 0: 4 */
	size_t cut;          /* payload bytes left off the end */
	size_t header_len;   /* nonzero: write only this much of the header */
	size_t extra;        /* garbage bytes appended */
	int gz;
	long gz_cut;         /* bytes chopped off the compressed file */
	long gz_flip;        /* nonzero: corrupt the .gz byte at this offset */
	int missing;         /* don't write the file at all */
};

static void put_be32(unsigned char *p, uint32_t v)
{
	p[0] = v >> 24;
	p[1] = v >> 16;
	p[2] = v >> 8;
	p[3] = v;
}

static const char *make_idx(const char *name, const struct idx_spec *s,
			    int labels)
{
	uint32_t n = s->n ? s->n : 5;
	uint32_t rows = s->rows == ~0u ? 0 : s->rows ? s->rows : 3;
	uint32_t cols = s->cols ? s->cols : 4;
	size_t hlen = labels ? 8 : 16;
	size_t count = labels ? n : (size_t)n * rows * cols;
	size_t len, i;
	unsigned char *buf;
	const char *path;

	if (s->missing)
		return tmp_path(name);
	/* Absurd headers come with a token payload. */
	if (count > 1000000)
		count = 16;
	len = hlen + count - s->cut + s->extra;
	buf = calloc(1, hlen + count + s->extra + 1);
	cr_assert(buf);
	put_be32(buf, s->magic ? s->magic : labels ? 0x801 : 0x803);
	put_be32(buf + 4, n);
	if (!labels) {
		put_be32(buf + 8, rows);
		put_be32(buf + 12, cols);
	}
	for (i = 0; i < count; i++)
		buf[hlen + i] = labels ? label(i) : pixel(i);
	for (i = 0; i < s->extra; i++)
		buf[hlen + count - s->cut + i] = 0xee;
	if (s->header_len)
		len = s->header_len;
	path = write_file(name, buf, len, s->gz, s->gz_cut);
	free(buf);
	if (s->gz_flip) {
		FILE *f = fopen(path, "r+b");

		cr_assert(f);
		fseek(f, s->gz_flip, SEEK_SET);
		int c = fgetc(f);
		fseek(f, s->gz_flip, SEEK_SET);
		fputc(c ^ 0x55, f);
		fclose(f);
	}
	return path;
}

Test(data, idx_valid_raw_and_gzip)
{
	/* Every combination of compressed / raw images and labels. */
	for (int gi = 0; gi < 2; gi++)
		for (int gl = 0; gl < 2; gl++) {
			struct idx_spec si = { .gz = gi }, sl = { .gz = gl };
			const char *img = make_idx("img", &si, 0);
			const char *lab = make_idx("lab", &sl, 1);
			struct dataset ds;
			char err[256] = "";
			int ret;

			ret = idx_load(&ds, img, lab, err, sizeof(err));
			cr_assert_eq(ret, 0, "gz %d/%d: %s", gi, gl, err);
			cr_assert_eq(ds.n, 5);
			cr_assert_eq(ds.d, 12);
			/* labels 0..4 of i % 7 */
			cr_assert_eq(ds.classes, 5);
			for (size_t i = 0; i < 5 * 12; i++)
				cr_assert_eq(ds.x[i], (float)pixel(i) / 255.0f,
					     "x[%zu] = %g", i, ds.x[i]);
			for (size_t i = 0; i < 5; i++)
				cr_assert_eq(ds.y[i], label(i));
			dataset_free(&ds);
			cr_assert_null(ds.x);
			cr_assert_eq(ds.n, 0);
		}
}

Test(data, idx_scaling_covers_0_to_1)
{
	/* 256 pixels: i*37+11 mod 256 hits every byte value once. */
	struct idx_spec si = { .n = 1, .rows = 16, .cols = 16 }, sl = { .n = 1 };
	const char *img = make_idx("img", &si, 0);
	const char *lab = make_idx("lab", &sl, 1);
	struct dataset ds;
	char err[256] = "";
	float lo = 2, hi = -1;

	cr_assert_eq(idx_load(&ds, img, lab, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(ds.d, 256);
	for (size_t i = 0; i < ds.d; i++) {
		lo = fminf(lo, ds.x[i]);
		hi = fmaxf(hi, ds.x[i]);
	}
	cr_expect_eq(lo, 0.0f);
	cr_expect_eq(hi, 1.0f);
	cr_expect_eq(ds.classes, 1);
	dataset_free(&ds);
}

struct idx_bad {
	const char *name;
	struct idx_spec img, lab;
	int blame;           /* which file the message must name: 0 img, 1 lab, 2 both */
	const char *want;    /* substring of the message */
	int code;            /* expected return value */
};

static const struct idx_bad idx_bad_cases[] = {
	{ "wrong image magic", { .magic = 0x802 }, { 0 }, 0, "magic", -EINVAL },
	{ "labels magic on images", { .magic = 0x801 }, { 0 }, 0, "magic", -EINVAL },
	{ "images magic on labels", { 0 }, { .magic = 0x803 }, 1, "magic", -EINVAL },
	{ "text file as images", { .magic = 0x68656c6c }, { 0 }, 0, "magic", -EINVAL },
	{ "empty images file", { .header_len = 0, .cut = 76 }, { 0 }, 0, "truncated", -EINVAL },
	{ "half a header", { .header_len = 10 }, { 0 }, 0, "truncated", -EINVAL },
	{ "zero rows", { .rows = ~0u }, { 0 }, 0, "zero", -EINVAL },
	{ "absurd size", { .n = 1000000, .rows = 60000, .cols = 60000 }, { 0 }, 0,
	  "refusing", -EFBIG },
	{ "absurd label count", { 0 }, { .n = 0xffffffff, .header_len = 8 }, 1,
	  "refusing", -EFBIG },
	{ "truncated images raw", { .cut = 7 }, { 0 }, 0,
	  "truncated: expected 60 bytes of pixels, got 53", -EINVAL },
	{ "truncated images gz", { .cut = 7, .gz = 1 }, { 0 }, 0,
	  "truncated: expected 60 bytes of pixels, got 53", -EINVAL },
	{ "truncated labels raw", { 0 }, { .cut = 1 }, 1,
	  "truncated: expected 5 bytes of labels, got 4", -EINVAL },
	{ "truncated labels gz", { 0 }, { .cut = 2, .gz = 1 }, 1,
	  "truncated: expected 5 bytes of labels, got 3", -EINVAL },
	{ "gzip stream cut mid-data", { .gz = 1, .gz_cut = 30 }, { 0 }, 0,
	  "truncated gzip stream: expected 60 bytes of pixels, got", -EINVAL },
	{ "gzip trailer cut", { .gz = 1, .gz_cut = 3 }, { 0 }, 0,
	  "truncated gzip stream: its end is missing", -EINVAL },
	{ "labels gzip cut", { 0 }, { .gz = 1, .gz_cut = 5 }, 1,
	  "truncated gzip stream", -EINVAL },
	{ "corrupt gzip data", { .gz = 1, .gz_flip = 30 }, { 0 }, 0,
	  "corrupt gzip data", -EINVAL },
	{ "trailing image bytes raw", { .extra = 3 }, { 0 }, 0, "3 trailing bytes", -EINVAL },
	{ "trailing image bytes gz", { .extra = 1, .gz = 1 }, { 0 }, 0, "trailing", -EINVAL },
	{ "trailing label bytes raw", { 0 }, { .extra = 2 }, 1, "2 trailing bytes", -EINVAL },
	{ "trailing label bytes gz", { 0 }, { .extra = 2, .gz = 1 }, 1, "trailing", -EINVAL },
	{ "fewer labels than images", { 0 }, { .n = 4 }, 2, "count mismatch", -EINVAL },
	{ "more labels than images", { 0 }, { .n = 6, .gz = 1 }, 2, "count mismatch", -EINVAL },
	{ "missing images", { .missing = 1 }, { 0 }, 0, "No such file", -ENOENT },
	{ "missing labels", { 0 }, { .missing = 1 }, 1, "No such file", -ENOENT },
};

Test(data, idx_bad_files)
{
	for (size_t k = 0; k < sizeof(idx_bad_cases) / sizeof(idx_bad_cases[0]); k++) {
		const struct idx_bad *c = &idx_bad_cases[k];
		const char *img = make_idx("bad-images-idx3", &c->img, 0);
		const char *lab = make_idx("bad-labels-idx1", &c->lab, 1);
		struct dataset ds = { .n = 99 };
		char err[512] = "";
		int ret;

		ret = idx_load(&ds, img, lab, err, sizeof(err));
		cr_expect_eq(ret, c->code, "%s: returned %d (%s)", c->name, ret, err);
		if ((c->blame == 0 || c->blame == 2))
			cr_expect(strstr(err, img), "%s: \"%s\" does not name %s",
				  c->name, err, img);
		if ((c->blame == 1 || c->blame == 2))
			cr_expect(strstr(err, lab), "%s: \"%s\" does not name %s",
				  c->name, err, lab);
		cr_expect(strstr(err, c->want), "%s: \"%s\" lacks \"%s\"",
			  c->name, err, c->want);
		cr_expect(!strchr(err, '\n'), "%s: message has a newline", c->name);
		cr_expect(ds.x == NULL && ds.y == NULL && ds.n == 0,
			  "%s: dataset not left zeroed", c->name);
		unlink(img);
		unlink(lab);
	}
}

Test(data, idx_directory_is_an_error)
{
	struct idx_spec s = { 0 };
	const char *lab = make_idx("lab", &s, 1);
	struct dataset ds;
	char err[256] = "";

	cr_expect_eq(idx_load(&ds, tmpdir, lab, err, sizeof(err)), -EISDIR);
	cr_expect(strstr(err, tmpdir), "%s", err);
}

Test(data, error_buffer_may_be_tiny_or_null)
{
	struct idx_spec s = { .magic = 0x802 };
	const char *img = make_idx("img", &s, 0);
	struct dataset ds;
	char err[8];

	memset(err, 'x', sizeof(err));
	cr_expect_eq(idx_load(&ds, img, img, err, 4), -EINVAL);
	cr_expect_eq(strlen(err), 3);
	cr_expect_eq(err[4], 'x');
	cr_expect_eq(idx_load(&ds, img, img, NULL, 0), -EINVAL);
	cr_expect_eq(csv_load(&ds, tmp_path("none.csv"), -1, CSV_HEADER_AUTO,
			      NULL, 0), -ENOENT);
}

/* ---- CSV ---------------------------------------------------------------- */

struct csv_good {
	const char *name;
	const char *text;
	int label_column;
	enum csv_header header;
	size_t n, d;
	int classes;
	float x[8];
	int32_t y[4];
};

static const struct csv_good csv_good_cases[] = {
	{ "auto, header row", "a,b,label\n1,2,0\n3,4,1\n", -1, CSV_HEADER_AUTO,
	  2, 2, 2, { 1, 2, 3, 4 }, { 0, 1 } },
	{ "auto, no header, no final newline", "1,2,0\n3,4,1", -1, CSV_HEADER_AUTO,
	  2, 2, 2, { 1, 2, 3, 4 }, { 0, 1 } },
	{ "auto, one non-numeric name", "1,x,2\n1,2,0\n", -1, CSV_HEADER_AUTO,
	  1, 2, 1, { 1, 2 }, { 0 } },
	{ "yes skips a numeric first row", "9,9,9\n1,2,0\n", -1, CSV_HEADER_YES,
	  1, 2, 1, { 1, 2 }, { 0 } },
	{ "no, CRLF and blank trailing lines", "1,2,0\r\n3,4,1\r\n\r\n\n  \n",
	  -1, CSV_HEADER_NO, 2, 2, 2, { 1, 2, 3, 4 }, { 0, 1 } },
	{ "label first", "y,a,b\n0,1,2\n3,3,4\n", 0, CSV_HEADER_AUTO,
	  2, 2, 4, { 1, 2, 3, 4 }, { 0, 3 } },
	{ "label by index", "1,0,2\n3,1,4\n", 1, CSV_HEADER_AUTO,
	  2, 2, 2, { 1, 2, 3, 4 }, { 0, 1 } },
	{ "label last by index", "1,2,0\n3,4,1\n", 2, CSV_HEADER_NO,
	  2, 2, 2, { 1, 2, 3, 4 }, { 0, 1 } },
	{ "integral label as float", "1,2,2.0\n3,4,1e0\n", -1, CSV_HEADER_AUTO,
	  2, 2, 3, { 1, 2, 3, 4 }, { 2, 1 } },
	{ "blanks, signs, exponents", " -1.5e2 ,\t+0.25, 3 \n", -1, CSV_HEADER_AUTO,
	  1, 2, 4, { -150, 0.25f }, { 3 } },
	{ "many columns", "1,2,3,4,5,6,7,8,0\n", -1, CSV_HEADER_AUTO,
	  1, 8, 1, { 1, 2, 3, 4, 5, 6, 7, 8 }, { 0 } },
};

static void check_csv(const struct csv_good *c, const struct dataset *ds)
{
	cr_assert_eq(ds->n, c->n, "%s: n = %zu", c->name, ds->n);
	cr_assert_eq(ds->d, c->d, "%s: d = %zu", c->name, ds->d);
	cr_expect_eq(ds->classes, c->classes, "%s: classes = %d", c->name, ds->classes);
	for (size_t i = 0; i < c->n * c->d; i++)
		cr_expect_eq(ds->x[i], c->x[i], "%s: x[%zu] = %g, want %g",
			     c->name, i, ds->x[i], c->x[i]);
	for (size_t i = 0; i < c->n; i++)
		cr_expect_eq(ds->y[i], c->y[i], "%s: y[%zu] = %d", c->name, i, ds->y[i]);
}

Test(data, csv_valid)
{
	for (size_t k = 0; k < sizeof(csv_good_cases) / sizeof(csv_good_cases[0]); k++) {
		const struct csv_good *c = &csv_good_cases[k];
		struct dataset ds;
		char err[256] = "";

		/* Each case raw and gzip-compressed. */
		for (int gz = 0; gz < 2; gz++) {
			const char *path = write_file("good.csv", c->text,
						      strlen(c->text), gz, 0);
			int ret = csv_load(&ds, path, c->label_column, c->header,
					   err, sizeof(err));

			cr_assert_eq(ret, 0, "%s (gz %d): %s", c->name, gz, err);
			check_csv(c, &ds);
			dataset_free(&ds);
		}
	}
}

struct csv_bad {
	const char *name;
	const char *text;    /* NULL: no file */
	int label_column;
	enum csv_header header;
	const char *where;   /* "file:line:" prefix after the directory, or "file:" */
	const char *want;
};

static const struct csv_bad csv_bad_cases[] = {
	/* An empty field is a broken data row, not evidence of a header. */
	{ "empty field in first row", "1,,0\n1,2,1\n", -1, CSV_HEADER_AUTO, "bad.csv:1:",
	  "column 2" },
	{ "word in data", "1,2,0\n1,x,1\n", -1, CSV_HEADER_AUTO, "bad.csv:2:",
	  "column 2: \"x\" is not a number" },
	{ "two dots", "a,b,c\n1,2,0\n1.2.3,2,0\n", -1, CSV_HEADER_AUTO, "bad.csv:3:",
	  "column 1: \"1.2.3\" is not a number" },
	{ "number with junk", "1,2,0\n12x,2,0\n", -1, CSV_HEADER_AUTO, "bad.csv:2:",
	  "\"12x\" is not a number" },
	{ "infinity", "1,2,0\n1,inf,0\n", -1, CSV_HEADER_AUTO, "bad.csv:2:",
	  "\"inf\" is not a number" },
	{ "nan", "1,2,0\nnan,1,0\n", -1, CSV_HEADER_AUTO, "bad.csv:2:",
	  "\"nan\" is not a number" },
	{ "beyond float", "1,2,0\n1e39,1,0\n", -1, CSV_HEADER_AUTO, "bad.csv:2:",
	  "is not a number" },
	{ "empty field", "1,2,0\n1,,0\n", -1, CSV_HEADER_AUTO, "bad.csv:2:",
	  "column 2: empty field" },
	{ "blank field", "1,2,0\n1, \t,0\n", -1, CSV_HEADER_AUTO, "bad.csv:2:",
	  "column 2: empty field" },
	{ "header no but header", "a,b,c\n1,2,0\n", -1, CSV_HEADER_NO, "bad.csv:1:",
	  "\"a\" is not a number" },
	{ "short row", "1,2,0\n3,4,1\n1,2\n", -1, CSV_HEADER_AUTO, "bad.csv:3:",
	  "2 fields, expected 3" },
	{ "long row", "a,b,c\n1,2,0\n1,2,3,0\n", -1, CSV_HEADER_AUTO, "bad.csv:3:",
	  "4 fields, expected 3" },
	{ "fractional label", "1,2,0\n1,2,1.5\n", -1, CSV_HEADER_AUTO, "bad.csv:2:",
	  "column 3: label \"1.5\"" },
	{ "negative label", "1,2,-1\n", -1, CSV_HEADER_AUTO, "bad.csv:1:",
	  "label \"-1\"" },
	{ "huge label", "1,2,70000\n", -1, CSV_HEADER_AUTO, "bad.csv:1:",
	  "label \"70000\"" },
	{ "word label", "0,1,2\nx,1,2\n", 0, CSV_HEADER_AUTO, "bad.csv:2:",
	  "column 1: label \"x\"" },
	{ "empty label", "1,2,0\n1,2,\n", -1, CSV_HEADER_AUTO, "bad.csv:2:",
	  "column 3: empty field" },
	{ "empty file", "", -1, CSV_HEADER_AUTO, "bad.csv:", "empty file" },
	{ "only blank lines", "\n\r\n \n", -1, CSV_HEADER_AUTO, "bad.csv:", "empty file" },
	{ "header only", "a,b,c\n", -1, CSV_HEADER_AUTO, "bad.csv:", "no data rows" },
	{ "blank line inside", "1,2,0\n\n3,4,1\n", -1, CSV_HEADER_AUTO, "bad.csv:2:",
	  "empty line" },
	{ "single column", "1\n2\n", -1, CSV_HEADER_AUTO, "bad.csv:1:",
	  "need a label and at least one feature" },
	{ "label column too big", "1,2,0\n", 3, CSV_HEADER_AUTO, "bad.csv:1:",
	  "label column 3 is out of range" },
	{ "label column negative", "1,2,0\n", -2, CSV_HEADER_AUTO, "bad.csv:1:",
	  "label column -2 is out of range" },
	{ "NUL byte", "1,2,0\n1\0002,0\n", -1, CSV_HEADER_AUTO, "bad.csv:", "NUL" },
	{ "long bad field is cut", "1,2,0\n1,"
	  "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx,0\n",
	  -1, CSV_HEADER_AUTO, "bad.csv:2:",
	  "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...\" is not" },
	{ "missing file", NULL, -1, CSV_HEADER_AUTO, "bad.csv:", "No such file" },
};

Test(data, csv_bad_files)
{
	for (size_t k = 0; k < sizeof(csv_bad_cases) / sizeof(csv_bad_cases[0]); k++) {
		const struct csv_bad *c = &csv_bad_cases[k];
		/* The NUL case needs its real length. */
		size_t len = c->text ? strlen(c->text) : 0;
		char where[1024], err[512] = "";
		struct dataset ds = { .n = 99 };
		const char *path;
		int ret;

		if (c->text && !strcmp(c->name, "NUL byte"))
			len = 12;
		path = c->text ? write_file("bad.csv", c->text, len, 0, 0)
			       : tmp_path("bad.csv");
		ret = csv_load(&ds, path, c->label_column, c->header, err,
			       sizeof(err));
		cr_expect_lt(ret, 0, "%s: returned %d", c->name, ret);
		snprintf(where, sizeof(where), "%s/%s", tmpdir, c->where);
		cr_expect(strstr(err, where) == err, "%s: \"%s\" does not start with \"%s\"",
			  c->name, err, where);
		cr_expect(strstr(err, c->want), "%s: \"%s\" lacks \"%s\"",
			  c->name, err, c->want);
		cr_expect(ds.x == NULL && ds.n == 0, "%s: dataset not left zeroed",
			  c->name);
		unlink(path);
	}
}

Test(data, csv_truncated_gzip)
{
	const char *text = "a,b,c\n1,2,0\n3,4,1\n5,6,2\n";
	const char *path = write_file("cut.csv.gz", text, strlen(text), 1, 4);
	struct dataset ds;
	char err[256] = "";

	cr_expect_eq(csv_load(&ds, path, -1, CSV_HEADER_AUTO, err, sizeof(err)),
		     -EINVAL);
	cr_expect(strstr(err, path) && strstr(err, "truncated"), "%s", err);
}

/* ---- data_load ---------------------------------------------------------- */

static struct data_config csv_config(const char *train, const char *test,
				     double fraction)
{
	struct data_config dc = {
		.format = DATA_CSV,
		.label_column = -1,
		.header = CSV_HEADER_AUTO,
		.test_fraction = fraction,
	};

	snprintf(dc.train_csv, sizeof(dc.train_csv), "%s", train);
	snprintf(dc.test_csv, sizeof(dc.test_csv), "%s", test);
	return dc;
}

static void column_stats(const struct dataset *ds, size_t c, double *mean,
			 double *sd)
{
	double s = 0, ss = 0;

	for (size_t i = 0; i < ds->n; i++)
		s += ds->x[i * ds->d + c];
	*mean = s / ds->n;
	for (size_t i = 0; i < ds->n; i++) {
		double t = ds->x[i * ds->d + c] - *mean;

		ss += t * t;
	}
	*sd = sqrt(ss / ds->n);
}

Test(data, csv_standardized_with_training_stats)
{
	/* Column 1: 1..4 (mean 2.5, sd sqrt(1.25)); column 2: large offset,
	 * small spread; column 3: constant. */
	const char *train = write_text("train.csv",
		"a,b,c,y\n1,1000000.5,7,0\n2,1000001.5,7,2\n3,1000000.5,7,1\n4,1000001.5,7,0\n");
	const char *test = write_text("test.csv", "2.5,1000001,7,4\n5,1000000,8,1\n");
	struct data_config dc = csv_config(train, test, 0);
	struct dataset tr, te;
	char err[256] = "";
	double mean, sd;

	cr_assert_eq(data_load(&tr, &te, &dc, 1, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(tr.n, 4);
	cr_assert_eq(te.n, 2);
	cr_assert_eq(tr.d, 3);
	for (size_t c = 0; c < 2; c++) {
		column_stats(&tr, c, &mean, &sd);
		cr_expect(fabs(mean) < 1e-6, "column %zu mean %g", c, mean);
		cr_expect(fabs(sd - 1) < 1e-5, "column %zu sd %g", c, sd);
	}
	for (size_t i = 0; i < tr.n; i++)
		cr_expect_eq(tr.x[i * 3 + 2], 0.0f, "constant column not zero");
	/* Test rows use the training mean and sd, not their own. */
	cr_expect_float_eq(te.x[0], 0.0f, 1e-6);
	cr_expect_float_eq(te.x[3], (float)(2.5 / sqrt(1.25)), 1e-5);
	cr_expect_float_eq(te.x[1], 0.0f, 1e-5);
	cr_expect_float_eq(te.x[2], 0.0f, 1e-6);
	cr_expect_float_eq(te.x[4], -2.0f, 1e-5);
	cr_expect_float_eq(te.x[5], 1.0f, 1e-6);
	/* Labels untouched; classes agree: 1 + max over both sets. */
	cr_expect_eq(tr.y[1], 2);
	cr_expect_eq(te.y[0], 4);
	cr_expect_eq(tr.classes, 5);
	cr_expect_eq(te.classes, 5);
	dataset_free(&tr);
	dataset_free(&te);
}

static const char *write_rows(const char *name, size_t n)
{
	size_t cap = n * 32 + 16, len = 0;
	char *text = malloc(cap);
	const char *path;

	cr_assert(text);
	len += snprintf(text + len, cap - len, "i,sq,label\n");
	for (size_t i = 0; i < n; i++)
		len += snprintf(text + len, cap - len, "%zu,%zu,%zu\n", i,
				(i * i) % 17, i % 3);
	path = write_text(name, text);
	free(text);
	return path;
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return (x > y) - (x < y);
}

Test(data, csv_split_by_fraction)
{
	const char *path = write_rows("all.csv", 100);
	struct data_config dc = csv_config(path, "", 0.2);
	struct dataset tr, te, tr2, te2, tr3, te3;
	float all[100];
	char err[256] = "";

	cr_assert_eq(data_load(&tr, &te, &dc, 7, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(te.n, 20);
	cr_expect_eq(tr.n + te.n, 100);
	cr_expect_eq(tr.classes, 3);
	cr_expect_eq(te.classes, 3);

	/* Column 0 was the row number, mapped by one increasing affine
	 * function in both parts: together they must be 100 evenly spaced
	 * values, i.e. every row landed in exactly one part. Each part keeps
	 * the file's order. */
	for (size_t i = 0; i < tr.n; i++) {
		all[i] = tr.x[i * 2];
		if (i)
			cr_expect_gt(tr.x[i * 2], tr.x[(i - 1) * 2]);
	}
	for (size_t i = 0; i < te.n; i++) {
		all[tr.n + i] = te.x[i * 2];
		if (i)
			cr_expect_gt(te.x[i * 2], te.x[(i - 1) * 2]);
	}
	qsort(all, 100, sizeof(all[0]), cmp_float);
	float step = all[1] - all[0];
	cr_expect_gt(step, 0);
	for (size_t i = 1; i < 100; i++)
		cr_expect_float_eq(all[i] - all[i - 1], step, 1e-4,
				   "gap at %zu: %g vs %g", i, all[i] - all[i - 1], step);

	/* Same seed, same split; another seed, another split. */
	cr_assert_eq(data_load(&tr2, &te2, &dc, 7, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(te2.n, te.n);
	cr_expect(!memcmp(te.x, te2.x, te.n * te.d * sizeof(float)));
	cr_expect(!memcmp(tr.x, tr2.x, tr.n * tr.d * sizeof(float)));
	cr_expect(!memcmp(te.y, te2.y, te.n * sizeof(int32_t)));
	cr_assert_eq(data_load(&tr3, &te3, &dc, 8, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(te3.n, 20);
	cr_expect(memcmp(te.x, te3.x, te.n * te.d * sizeof(float)),
		  "seeds 7 and 8 chose the same test rows");
	dataset_free(&tr);
	dataset_free(&te);
	dataset_free(&tr2);
	dataset_free(&te2);
	dataset_free(&tr3);
	dataset_free(&te3);
}

struct load_bad {
	const char *name;
	const char *train;      /* CSV text */
	const char *test;       /* CSV text, or NULL to split */
	double fraction;
	const char *want;
};

static const struct load_bad load_bad_cases[] = {
	{ "fraction rounds to no test rows", "1,0\n2,0\n3,1\n", NULL, 0.1, "the test set" },
	{ "fraction leaves no train rows", "1,0\n2,0\n3,1\n", NULL, 0.9, "the training set" },
	{ "one row cannot be split", "1,0\n", NULL, 0.5, "empty" },
	{ "fraction zero", "1,0\n2,0\n", NULL, 0, "test_fraction" },
	{ "fraction one", "1,0\n2,0\n", NULL, 1, "test_fraction" },
	{ "fraction NaN", "1,0\n2,0\n", NULL, NAN, "test_fraction" },
	{ "feature count differs", "1,2,0\n", "1,0\n", 0, "feature columns" },
	{ "bad test file", "1,2,0\n", "1,2,0\n1,x,0\n", 0, "test.csv:2:" },
	{ "bad train file", "1,2,0\n1,x,0\n", "1,2,0\n", 0, "train.csv:2:" },
};

Test(data, data_load_errors_leave_nothing)
{
	for (size_t k = 0; k < sizeof(load_bad_cases) / sizeof(load_bad_cases[0]); k++) {
		const struct load_bad *c = &load_bad_cases[k];
		const char *train = write_text("train.csv", c->train);
		const char *test = c->test ? write_text("test.csv", c->test) : "";
		struct data_config dc = csv_config(train, test, c->fraction);
		struct dataset tr, te;
		char err[512] = "";
		int ret;

		ret = data_load(&tr, &te, &dc, 1, err, sizeof(err));
		cr_expect_lt(ret, 0, "%s: returned %d", c->name, ret);
		cr_expect(strstr(err, c->want), "%s: \"%s\" lacks \"%s\"",
			  c->name, err, c->want);
		cr_expect(!tr.x && !tr.y && !te.x && !te.y && !tr.n && !te.n,
			  "%s: datasets not left empty", c->name);
	}
}

Test(data, data_load_idx)
{
	struct idx_spec tri = { .n = 6, .gz = 1 }, trl = { .n = 6 }, tei = { 0 }, tel = { 0 };
	struct data_config dc = { .format = DATA_IDX };
	struct dataset tr, te;
	char err[512] = "";

	snprintf(dc.train_images, DATA_PATH_MAX, "%s", make_idx("tri.gz", &tri, 0));
	snprintf(dc.train_labels, DATA_PATH_MAX, "%s", make_idx("trl", &trl, 1));
	snprintf(dc.test_images, DATA_PATH_MAX, "%s", make_idx("tei", &tei, 0));
	snprintf(dc.test_labels, DATA_PATH_MAX, "%s", make_idx("tel", &tel, 1));
	cr_assert_eq(data_load(&tr, &te, &dc, 1, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(tr.n, 6);
	cr_expect_eq(te.n, 5);
	/* Train labels reach 5, test labels only 4: both say 6 classes. */
	cr_expect_eq(tr.classes, 6);
	cr_expect_eq(te.classes, 6);
	/* Not standardized: raw pixels over 255. */
	cr_expect_eq(tr.x[1], pixel(1) / 255.0f);
	dataset_free(&tr);
	dataset_free(&te);

	/* Test images of another size. */
	tei.cols = 5;
	make_idx("tei", &tei, 0);
	cr_expect_eq(data_load(&tr, &te, &dc, 1, err, sizeof(err)), -EINVAL);
	cr_expect(strstr(err, "pixels per image"), "%s", err);
	cr_expect(!tr.x && !te.x);

	/* A path left unset. */
	dc.test_labels[0] = '\0';
	cr_expect_eq(data_load(&tr, &te, &dc, 1, err, sizeof(err)), -EINVAL);
	cr_expect(strstr(err, "test_labels"), "%s", err);
}

/* ---- permutations and batches ------------------------------------------- */

static int is_permutation(const uint32_t *p, size_t n)
{
	unsigned char *seen = calloc(n + 1, 1);
	int ok = 1;

	for (size_t i = 0; i < n && ok; i++) {
		if (p[i] >= n || seen[p[i]])
			ok = 0;
		else
			seen[p[i]] = 1;
	}
	free(seen);
	return ok;
}

Test(data, permute_is_a_reproducible_permutation)
{
	enum { N = 1000 };
	static uint32_t a[N], b[N], c[N], d[N];
	size_t fixed = 0;

	data_permute(a, N, 42, 3);
	data_permute(b, N, 42, 3);
	data_permute(c, N, 42, 4);
	data_permute(d, N, 43, 3);
	cr_assert(is_permutation(a, N));
	cr_assert(is_permutation(c, N));
	cr_assert(is_permutation(d, N));
	cr_expect(!memcmp(a, b, sizeof(a)), "same (seed, epoch), other order");
	cr_expect(memcmp(a, c, sizeof(a)), "epochs 3 and 4 gave the same order");
	cr_expect(memcmp(a, d, sizeof(a)), "seeds 42 and 43 gave the same order");
	for (size_t i = 0; i < N; i++)
		fixed += a[i] == i;
	/* About 1 fixed point expected; the identity would give 1000. */
	cr_expect_lt(fixed, 10);

	data_permute(a, 1, 42, 3);
	cr_expect_eq(a[0], 0);
	data_permute(NULL, 0, 42, 3);
}

Test(data, permute_is_uniform)
{
	/* All 6 orders of 3 items over 60000 epochs: each ~10000, sd ~91.
	 * An off-by-one in Fisher-Yates makes some orders impossible. */
	int count[6] = { 0 };
	uint32_t p[3];

	for (uint64_t e = 0; e < 60000; e++) {
		data_permute(p, 3, 5, e);
		count[p[0] * 2 + (p[1] > p[2])]++;
	}
	for (int k = 0; k < 6; k++)
		cr_expect(count[k] > 9500 && count[k] < 10500, "order %d: %d", k,
			  count[k]);
}

Test(data, gather_copies_rows)
{
	float xs[5 * 3];
	int32_t ys[5] = { 10, 11, 12, 13, 14 };
	struct dataset ds = { .x = xs, .y = ys, .n = 5, .d = 3, .classes = 15 };
	uint32_t idx[4] = { 4, 0, 2, 4 };
	float x[4 * 3];
	int32_t y[4];

	for (int i = 0; i < 15; i++)
		xs[i] = (float)i;
	dataset_gather(&ds, idx, 4, x, y);
	for (int b = 0; b < 4; b++) {
		cr_expect_eq(y[b], 10 + (int)idx[b]);
		for (int j = 0; j < 3; j++)
			cr_expect_eq(x[b * 3 + j], (float)(idx[b] * 3 + j),
				     "x[%d][%d]", b, j);
	}
}

Test(data, gather_ids_copies_each_samples_fields)
{
	uint32_t ids[4 * 2] = { 7, 70, 8, DATA_ID_NONE, 9, 90, 10, 100 };
	struct dataset ds = { .ids = ids, .n = 4, .f = 2 };
	uint32_t idx[3] = { 3, 1, 3 }, out[3 * 2];

	dataset_gather_ids(&ds, idx, 3, out);
	for (int b = 0; b < 3; b++)
		for (int j = 0; j < 2; j++)
			cr_expect_eq(out[b * 2 + j], ids[idx[b] * 2 + j], "ids[%d][%d]", b, j);
}

Test(data, free_accepts_null_and_zeroed)
{
	struct dataset ds = { 0 };

	dataset_free(NULL);
	dataset_free(&ds);
	ds.x = malloc(4 * sizeof(float));
	ds.y = malloc(4 * sizeof(int32_t));
	ds.n = 4;
	dataset_free(&ds);
	cr_expect(!ds.x && !ds.y && !ds.n);
	dataset_free(&ds);
}
