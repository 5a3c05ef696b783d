/* Tests for the click-through data (issue 39): the Criteo loader
 * (core/data/criteo.h) on hand-written files, plain and gzip, and a table
 * of malformed lines; [data] format = criteo through data_load and the
 * config; the windows of a streamed file (core/data/stream.h); and
 * `pstrain synth` (core/data/synth.h): same seed same bytes, a planted
 * ceiling well above chance, a sane click rate, power-law IDs. Every test
 * writes into its own temporary directory. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L   /* truncate under -std=c11 */
#endif
#include "../core/config/config.h"
#include "../core/job.h"
#include "../core/data/criteo.h"
#include "../core/data/data.h"
#include "../core/data/stream.h"
#include "../core/data/synth.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "leak.h"
#include "util.h"

static char dir[512];

static void setup(void)
{
	test_dir_make(dir, sizeof(dir), "criteo");
}

static void teardown(void)
{
	test_dir_remove(dir);
	leak_check();
}

TestSuite(criteo, .init = setup, .fini = teardown);
TestSuite(stream, .init = setup, .fini = teardown);
TestSuite(synth, .init = setup, .fini = teardown);

/* A path in the test's directory; one of 8 rotating buffers. */
static const char *at(const char *name)
{
	static char bufs[8][1024];
	static int next;
	char *p = bufs[next++ % 8];

	snprintf(p, sizeof(bufs[0]), "%s/%s", dir, name);
	return p;
}

static const char *write_text(const char *name, const char *text, size_t len, int gz)
{
	const char *path = at(name);

	if (gz) {
		gzFile f = gzopen(path, "wb");
		cr_assert(f, "gzopen %s", path);
		cr_assert(len == 0 || gzwrite(f, text, (unsigned)len) == (int)len);
		cr_assert(gzclose(f) == Z_OK);
	} else {
		FILE *f = fopen(path, "wb");
		cr_assert(f, "fopen %s", path);
		cr_assert(fwrite(text, 1, len, f) == len);
		cr_assert(fclose(f) == 0);
	}
	return path;
}

/* ---- the loader ----------------------------------------------------------- */

/* Three lines: every integer form (missing, 0, negative, large), every
 * categorical form (missing, lower and upper case, 00000000, the one hash
 * that is DATA_ID_NONE), CRLF on one line and no newline after the last. */
static const char good[] =
	"1\t1\t0\t-5\t\t3\t9223372036854775807\t7\t\t\t\t\t\t2"
	"\t68fd1e64\t\t00000000\tFFFFFFFF\tffffffff\tABCDEF01\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t0000000a\n"
	"0\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\r\n"
	"0\t12\t-1\t0\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10"
	"\t11111111\t22222222\t33333333\t44444444\t55555555\t66666666\t77777777\t88888888\t99999999\taaaaaaaa"
	"\tbbbbbbbb\tcccccccc\tdddddddd\teeeeeeee\tffffffff\t00000001\t00000002\t00000003\t00000004\t00000005"
	"\t00000006\t00000007\t00000008\t00000009\t0000000a\t0000000b";

static float lg(double v)
{
	return v > 0 ? (float)log1p(v) : 0.0f;
}

static void check_good(const struct dataset *ds, const char *what)
{
	const double ints[3][CRITEO_INTS] = {
		{ 1, 0, -5, 0, 3, 9223372036854775807.0, 7, 0, 0, 0, 0, 0, 2 },
		{ 0 },
		{ 12, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 },
	};
	const uint32_t N = DATA_ID_NONE;
	const uint32_t ids0[CRITEO_CATS] = { 0x68fd1e64, N, 0, 0xfffffffe, 0xfffffffe, 0xabcdef01, N, N, N, N, N, N, N,
					     N, N, N, N, N, N, N, N, N, N, N, N, 0xa };
	const int32_t y[3] = { 1, 0, 0 };

	cr_assert_eq(ds->n, 3, "%s", what);
	cr_assert_eq(ds->d, CRITEO_INTS);
	cr_assert_eq(ds->f, CRITEO_CATS);
	cr_assert_eq(ds->classes, 2);
	for (size_t i = 0; i < 3; i++) {
		cr_expect_eq(ds->y[i], y[i], "%s: row %zu label", what, i);
		for (size_t c = 0; c < CRITEO_INTS; c++)
			cr_expect_eq(ds->x[i * CRITEO_INTS + c], lg(ints[i][c]), "%s: row %zu I%zu = %g, want %g", what,
				     i, c + 1, ds->x[i * CRITEO_INTS + c], lg(ints[i][c]));
	}
	for (size_t j = 0; j < CRITEO_CATS; j++) {
		cr_expect_eq(ds->ids[j], ids0[j], "%s: row 0 C%zu = %08x", what, j + 1, ds->ids[j]);
		cr_expect_eq(ds->ids[CRITEO_CATS + j], DATA_ID_NONE, "%s: row 1 C%zu", what, j + 1);
		uint32_t want = j < 9 ? 0x11111111u * (uint32_t)(j + 1) : j < 15 ? 0xaaaaaaaau + 0x11111111u * (uint32_t)(j - 9)
											: (uint32_t)(j - 14);
		if (want == DATA_ID_NONE)
			want = DATA_ID_NONE - 1;
		cr_expect_eq(ds->ids[2 * CRITEO_CATS + j], want, "%s: row 2 C%zu = %08x, want %08x", what, j + 1,
			     ds->ids[2 * CRITEO_CATS + j], want);
	}
}

Test(criteo, loads_exact_values_plain_and_gzip)
{
	for (int gz = 0; gz < 2; gz++) {
		struct dataset ds;
		size_t n = 0;
		char err[256] = "";
		const char *path = write_text(gz ? "good.txt.gz" : "good.txt", good, sizeof(good) - 1, gz);

		cr_assert_eq(criteo_load(&ds, path, 100, &n, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(n, 3);
		check_good(&ds, gz ? "gzip" : "plain");
		dataset_free(&ds);

		/* Holding fewer rows than the file has still reads (and
		 * counts) all of them. */
		cr_assert_eq(criteo_load(&ds, path, 2, &n, err, sizeof(err)), 0, "%s", err);
		cr_expect_eq(n, 3);
		cr_expect_eq(ds.n, 2);
		dataset_free(&ds);
	}
}

/* A good line, then this one as line 2. */
struct bad_line {
	const char *line;
	const char *want;   /* in the message, after "PATH:2: " */
};

Test(criteo, malformed_lines_name_file_and_line)
{
	char ints[200] = "", cats[400] = "", buf[1000];
	for (int i = 0; i < CRITEO_INTS; i++)
		strcat(ints, "\t5");
	for (int j = 0; j < CRITEO_CATS; j++)
		strcat(cats, "\t0123abcd");
	/* %s is where the bad field goes: label, I1 or C26 */
	static const struct {
		const char *fmt;
		const char *field;
		const char *want;
	} rows[] = {
		{ "%s%s%s", "1", "" },                                     /* good (checked below) */
		{ "%s%s%s\t", "1", "41 columns, expected 40" },
		{ "%s%s%s", "1", "39 columns, expected 40" },
		{ "L%s%s", "2", "column 1 (label): \"2\" is not a label 0 or 1" },
		{ "L%s%s", "", "column 1 (label): \"\" is not a label 0 or 1" },
		{ "L%s%s", "01", "column 1 (label): \"01\" is not" },
		{ "L%s%s", "-1", "column 1 (label)" },
		{ "I%s%s", "12x", "column 2 (I1): \"12x\" is not an integer" },
		{ "I%s%s", "1.5", "column 2 (I1): \"1.5\" is not an integer" },
		{ "I%s%s", "-", "column 2 (I1): \"-\" is not an integer" },
		{ "I%s%s", "+3", "column 2 (I1)" },
		{ "I%s%s", " 3", "column 2 (I1)" },
		{ "I%s%s", "9223372036854775808", "column 2 (I1): \"9223372036854775808\" is not an integer (64-bit)" },
		{ "C%s%s", "0123abc", "column 40 (C26): \"0123abc\" is not 8 hex digits" },
		{ "C%s%s", "0123abcde", "column 40 (C26)" },
		{ "C%s%s", "0123abcg", "column 40 (C26): \"0123abcg\" is not 8 hex digits" },
		{ "C%s%s", " 123abcd", "column 40 (C26)" },
		{ "C%s%s", "0x23abcd", "column 40 (C26)" },
		{ "C%s%s", "\x1b[2Jabcd", "column 40 (C26): \"?[2Jabcd\"" },
		{ "X", "", "1 columns, expected 40" },
	};
	for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
		char line[1000];
		const char *f = rows[r].field;
		char ints_bad[220], cats_bad[420];
		snprintf(ints_bad, sizeof(ints_bad), "\t%s%s", f, ints + 2);
		snprintf(cats_bad, sizeof(cats_bad), "%.*s\t%s", (int)(strlen(cats) - 9), cats, f);
		switch (rows[r].fmt[0]) {
		case 'L': snprintf(line, sizeof(line), "%s%s%s", f, ints, cats); break;
		case 'I': snprintf(line, sizeof(line), "1%s%s", ints_bad, cats); break;
		case 'C': snprintf(line, sizeof(line), "1%s%s", ints, cats_bad); break;
		case 'X': snprintf(line, sizeof(line), "%s", ""); break;
		default: snprintf(line, sizeof(line), rows[r].fmt, "1", ints, r == 2 ? cats + 9 : cats); break;
		}
		int len = snprintf(buf, sizeof(buf), "0%s%s\n%s\n0%s%s\n", ints, cats, line, ints, cats);
		const char *path = write_text("bad.txt", buf, (size_t)len, r % 2);
		struct dataset ds;
		size_t n = 99;
		char err[300] = "", want[400];
		int ret = criteo_load(&ds, path, 10, &n, err, sizeof(err));
		if (!rows[r].want[0]) {
			cr_assert_eq(ret, 0, "row %zu: %s", r, err);
			cr_expect_eq(n, 3);
			dataset_free(&ds);
			continue;
		}
		snprintf(want, sizeof(want), "%s:2: %s", path, rows[r].want);
		cr_expect_eq(ret, -EINVAL, "row %zu: %d", r, ret);
		cr_expect(strstr(err, want) == err, "row %zu: got \"%s\", want \"%s...\"", r, err, want);
		cr_expect(!strchr(err, '\n'), "row %zu: a message of more than one line", r);
		cr_expect(!ds.x && !ds.ids && !ds.y && !ds.n && !n, "row %zu: not zeroed on failure", r);
	}
}

Test(criteo, file_level_failures)
{
	struct dataset ds;
	size_t n;
	char err[300] = "", big[LINES_MAX + 10];

	/* empty, missing, NUL, long line, truncated gzip, not gzip past a gzip header */
	cr_expect_eq(criteo_load(&ds, write_text("empty.txt", "", 0, 0), 10, &n, err, sizeof(err)), -EINVAL);
	cr_expect(strstr(err, "empty.txt: no samples"), "%s", err);
	cr_expect_eq(criteo_load(&ds, at("missing.txt"), 10, &n, err, sizeof(err)), -ENOENT);
	cr_expect(strstr(err, "missing.txt: cannot open: No such file"), "%s", err);
	char nul[] = "1\t2\0\t3\n";
	cr_expect_eq(criteo_load(&ds, write_text("nul.txt", nul, sizeof(nul) - 1, 0), 10, &n, err, sizeof(err)),
		     -EINVAL);
	cr_expect(strstr(err, "nul.txt:1: contains a NUL byte"), "%s", err);
	memset(big, 'a', sizeof(big));
	big[sizeof(big) - 1] = '\n';
	cr_expect_eq(criteo_load(&ds, write_text("long.txt", big, sizeof(big), 0), 10, &n, err, sizeof(err)), -EINVAL);
	cr_expect(strstr(err, "long.txt:1: line longer than 65536 bytes"), "%s", err);

	const char *path = write_text("cut.txt.gz", good, sizeof(good) - 1, 1);
	FILE *f = fopen(path, "rb");
	cr_assert(f);
	fseek(f, 0, SEEK_END);
	long size = ftell(f);
	fclose(f);
	cr_assert_eq(truncate(path, size - 12), 0);
	cr_expect_eq(criteo_load(&ds, path, 10, &n, err, sizeof(err)), -EINVAL);
	cr_expect(strstr(err, "cut.txt.gz: truncated gzip stream"), "%s", err);
	cr_expect(!ds.x && !ds.n);
}

/* ---- [data] format = criteo ---------------------------------------------------- */

/* n lines of Criteo text, row i with I1 = i, C1 = i as hex, label i % 3 == 0. */
static char *rows_text(size_t first, size_t n, size_t *len)
{
	char *buf = malloc(n * 400 + 1), *p = buf;
	cr_assert(buf);
	for (size_t i = first; i < first + n; i++) {
		p += sprintf(p, "%d\t%zu", i % 3 == 0, i);
		for (int c = 1; c < CRITEO_INTS; c++)
			p += sprintf(p, "\t%d", c);
		p += sprintf(p, "\t%08zx", i);
		for (int c = 1; c < CRITEO_CATS; c++)
			p += sprintf(p, "\t%s", c % 5 ? "cafe0000" : "");
		*p++ = '\n';
	}
	*p = 0;
	*len = (size_t)(p - buf);
	return buf;
}

static const char *write_rows(const char *name, size_t first, size_t n, int gz)
{
	size_t len;
	char *text = rows_text(first, n, &len);
	const char *path = write_text(name, text, len, gz);
	free(text);
	return path;
}

Test(criteo, data_load_train_test_split_and_cap)
{
	struct data_config dc = { .format = DATA_CRITEO, .test_fraction = 0.25, .max_resident_mb = 1 };
	struct dataset train, test;
	char err[400] = "";

	snprintf(dc.train_csv, sizeof(dc.train_csv), "%s", write_rows("train.txt.gz", 0, 100, 1));
	snprintf(dc.test_csv, sizeof(dc.test_csv), "%s", write_rows("test.txt", 100, 10, 0));
	cr_assert_eq(data_load(&train, &test, &dc, 1, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(train.n, 100);
	cr_expect_eq(test.n, 10);
	cr_expect_eq(train.f, CRITEO_CATS);
	cr_expect_eq(train.classes, 2);
	cr_expect_eq(test.ids[0], 100u, "test row 0's C1");
	/* not standardized: I2 is 1 everywhere, log(2) */
	cr_expect_eq(train.x[5 * CRITEO_INTS + 1], (float)log1p(1.0));
	dataset_free(&train);
	dataset_free(&test);

	/* No test file: a quarter of the rows, their IDs moved with them. */
	dc.test_csv[0] = 0;
	cr_assert_eq(data_load(&train, &test, &dc, 1, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(train.n, 75);
	cr_expect_eq(test.n, 25);
	for (size_t i = 0; i < test.n; i++)
		cr_expect_eq(test.y[i], test.ids[i * CRITEO_CATS] % 3 == 0, "row with C1 %u moved without its label",
			     test.ids[i * CRITEO_CATS]);
	for (size_t i = 1; i < train.n; i++)
		cr_expect_gt(train.ids[i * CRITEO_CATS], train.ids[(i - 1) * CRITEO_CATS], "file order kept");
	dataset_free(&train);
	dataset_free(&test);

	/* 1 MiB holds 6553 samples: 7000 are refused with the key named. */
	snprintf(dc.train_csv, sizeof(dc.train_csv), "%s", write_rows("big.txt", 0, 7000, 0));
	cr_expect_eq(data_load(&train, &test, &dc, 1, err, sizeof(err)), -EFBIG);
	cr_expect(strstr(err, "big.txt: 7000 samples take 2 MiB, more than [data] max_resident_mb = 1"), "%s", err);
	cr_expect(!train.n && !test.n);
}

Test(criteo, config_keys)
{
	struct config c;
	char err[400] = "";
	cr_assert_eq(config_parse_string(&c, "t.ini", "[data]\nformat = criteo\ntrain_csv = a.txt\nmax_resident_mb = 64\n",
					 err, sizeof(err)),
		     0, "%s", err);
	cr_expect_eq(c.data.format, DATA_CRITEO);
	cr_expect_eq(c.data.max_resident_mb, 64);
	cr_assert_eq(config_parse_string(&c, "t.ini", "[data]\nformat = criteo\n", err, sizeof(err)), -EINVAL);
	cr_expect(strstr(err, "format = criteo needs train_csv"), "%s", err);
	cr_assert_eq(config_parse_string(&c, "t.ini", "[data]\nformat = criteo\ntrain_csv = a\nmax_resident_mb = 0\n", err,
					 sizeof(err)),
		     -EINVAL);
	cr_expect(strstr(err, "max_resident_mb"), "%s", err);
	cr_assert_eq(config_parse_string(&c, "t.ini", "[data]\n", err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(c.data.max_resident_mb, 4096, "the default");
}

/* ---- streamed windows ------------------------------------------------------------ */

Test(stream, window_rows)
{
	cr_expect_eq(stream_window_rows(1u << 20, 1), 6553);
	cr_expect_eq(stream_window_rows(1u << 20, 100), 6500);
	cr_expect_eq(stream_window_rows(1000, 64), 64, "at least one step");
}

/* Every window of two epochs, in order and then out of order: each row of
 * the file once per epoch, each with its own data, and a shuffle that
 * changes with the epoch. */
Test(stream, epoch_is_a_permutation_of_the_file)
{
	const size_t N = 1000, M = 96;   /* 11 windows, the last of 40 rows */
	const char *path = write_rows("s.txt.gz", 0, N, 1);
	struct stream s;
	struct dataset win;
	char err[400] = "";
	uint32_t order[96], first[2][96];
	unsigned char *seen = calloc(N, 1);

	cr_assert_eq(stream_open(&s, path, M, &win, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(s.n, N);
	cr_assert_eq(stream_windows(&s), 11);
	for (uint64_t epoch = 0; epoch < 2; epoch++) {
		memset(seen, 0, N);
		for (size_t k = 0; k < 11; k++) {
			cr_assert_eq(stream_fill(&s, k, &win, err, sizeof(err)), 0, "%s", err);
			cr_assert_eq(win.n, k < 10 ? M : 40);
			stream_order(order, win.n, 7, epoch, k);
			for (size_t i = 0; i < win.n; i++) {
				size_t row = k * M + order[i];
				cr_assert_lt(order[i], win.n);
				cr_assert_eq(win.ids[order[i] * CRITEO_CATS], (uint32_t)row, "window %zu holds the wrong rows", k);
				cr_assert_eq(win.x[order[i] * CRITEO_INTS], (float)log1p((double)row));
				cr_assert(!seen[row], "epoch %llu: row %zu twice", (unsigned long long)epoch, row);
				seen[row] = 1;
			}
			if (k == 0)
				memcpy(first[epoch], order, sizeof(order));
		}
		for (size_t r = 0; r < N; r++)
			cr_assert(seen[r], "epoch %llu: row %zu never", (unsigned long long)epoch, r);
	}
	cr_expect(memcmp(first[0], first[1], sizeof(order)) != 0, "the same order in two epochs");
	size_t fixed = 0;
	for (size_t i = 0; i < M; i++)
		fixed += first[0][i] == i;
	cr_expect_lt(fixed, 10, "hardly shuffled: %zu of %zu rows in place", fixed, M);

	/* Out of order (a resume): back to the start and skip. */
	size_t ks[] = { 5, 2, 10, 0, 7 };
	for (size_t i = 0; i < 5; i++) {
		cr_assert_eq(stream_fill(&s, ks[i], &win, err, sizeof(err)), 0, "%s", err);
		cr_expect_eq(win.ids[0], (uint32_t)(ks[i] * M));
	}
	cr_expect_eq(stream_fill(&s, 11, &win, err, sizeof(err)), -EINVAL);

	/* A file that shrank under a run says so. */
	stream_close(&s);
	dataset_free(&win);
	path = write_rows("s.txt", 0, N, 0);
	cr_assert_eq(stream_open(&s, path, M, &win, err, sizeof(err)), 0, "%s", err);
	write_rows("s.txt", 0, 500, 0);
	cr_expect_eq(stream_fill(&s, 8, &win, err, sizeof(err)), -EINVAL);
	cr_expect(strstr(err, "has 500 rows now but had 1000"), "%s", err);
	stream_close(&s);
	dataset_free(&win);
	free(seen);
}

/* A job over a streamed file, 2 workers: every step's two batches lie in
 * the window job_order put in place, and an epoch's batches are every
 * row of the file's first spe * W * B... rows once, in another order each
 * epoch. */
Test(stream, job_epochs_cover_each_row_once)
{
	const size_t N = 20000;
	char text[2048], err[400] = "";
	struct config c;
	struct job j;
	const char *train = write_rows("train.txt", 0, N, 0), *test = write_rows("test.txt", N, 100, 0);
	snprintf(text, sizeof(text),
		 "[train]\nbatch_size = 50\nepochs = 2\n[data]\nformat = criteo\ntrain_csv = %s\ntest_csv = %s\n"
		 "max_resident_mb = 1\n[model]\ninput = 13\nlayer = embedding 26 1000 4\nlayer = dense 1\nloss = sigmoid_cross_entropy\n",
		 train, test);
	cr_assert_eq(config_parse_string(&c, "t.ini", text, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(job_load(&j, &c, 2, 1, err, sizeof(err)), 0, "%s", err);
	cr_assert(j.streamed);
	cr_assert_eq(j.n, N);
	cr_assert_eq(j.stream.window, 6500, "1 MiB of 160-byte samples, a multiple of 2 x 50");
	cr_assert_eq(j.spe, 200);
	cr_assert_eq(j.spw, 65);
	cr_assert_eq(j.total, 400);
	cr_assert_eq(j.test.n, 100);

	uint32_t *perm = malloc(j.train.n * sizeof(*perm)), first[2] = { 0 };
	unsigned char *seen = calloc(N, 1);
	long slice = -1;
	for (long step = 0; step < j.total; step++) {
		if (step % j.spe == 0)
			memset(seen, 0, N);
		if (job_part(&j, step) != slice) {
			slice = job_part(&j, step);
			cr_assert_eq(job_order(&j, step, 5, perm, err, sizeof(err)), 0, "%s", err);
		}
		for (int w = 0; w < 2; w++) {
			size_t at = job_slice_at(&j, step, w);
			cr_assert_leq(at + 50, j.train.n, "step %ld: a batch past its window", step);
			for (size_t b = 0; b < 50; b++) {
				uint32_t row = j.train.ids[(size_t)perm[at + b] * CRITEO_CATS];
				cr_assert(!seen[row], "step %ld: row %u twice in an epoch", step, row);
				seen[row] = 1;
			}
		}
		if (step % j.spe == 0)
			first[step / j.spe] = j.train.ids[(size_t)perm[0] * CRITEO_CATS];
		if (step % j.spe == j.spe - 1)
			for (size_t r = 0; r < N; r++)
				cr_assert(seen[r], "epoch %ld: row %zu never", step / j.spe, r);
	}
	cr_expect_neq(first[0], first[1], "both epochs start with row %u", first[0]);
	free(perm);
	free(seen);
	job_free(&j);
}

/* `pstrain local` on a streamed synth set: it trains, over every window. */
Test(stream, local_trains_in_windows)
{
	struct synth_opts o;
	struct synth_result r;
	char err[400] = "", cfg[600], log[600], text[2048];
	synth_defaults(&o);
	snprintf(o.out, sizeof(o.out), "%s", at("ctr"));
	o.train_rows = 20000;
	o.test_rows = 2000;
	o.vocab = 1000;
	cr_assert_eq(synth_write(&o, &r, err, sizeof(err)), 0, "%s", err);
	snprintf(cfg, sizeof(cfg), "%s", at("ctr.ini"));
	snprintf(log, sizeof(log), "%s", at("ctr.log"));
	snprintf(text, sizeof(text),
		 "[train]\nbatch_size = 100\nepochs = 2\nthreads = 1\ncheckpoint_every = 0\n[data]\nformat = criteo\n"
		 "train_csv = %s\ntest_csv = %s\nmax_resident_mb = 1\n[model]\ninput = 13\nlayer = embedding 26 1000 4\nlayer = dense 1\nloss = sigmoid_cross_entropy\n",
		 r.train_path, r.test_path);
	FILE *f = fopen(cfg, "w");
	cr_assert(f);
	fputs(text, f);
	fclose(f);
	const char *args[] = { "local", "--config", cfg, NULL };
	pid_t pid = spawn_pstrain(args, log, NULL);
	int st[1];
	wait_children(&pid, 1, st, 120);
	const char *out = slurp(log);
	cr_assert_eq(st[0], 0, "exit %d: %s", st[0], out);
	cr_expect(strstr(out, "training: 20000 train / 2000 test samples"), "%s", out);
	cr_expect(strstr(out, "400 steps (200 per epoch)"), "%s", out);
	cr_expect(strstr(out, "done: 400 steps"), "%s", out);
	/* and it learned from the windows: the planted model's ceiling is
	 * about 0.81, the click rate alone 0.5 */
	const char *done = strstr(out, "done: 400 steps");
	const char *auc = done ? strstr(done, "AUC ") : NULL;
	cr_assert(auc, "%s", out);
	cr_expect_gt(atof(auc + 4), 0.65, "%s", out);
}

/* ---- pstrain synth ------------------------------------------------------------ */

static void synth_small(struct synth_opts *o, const char *sub, uint64_t seed)
{
	synth_defaults(o);
	snprintf(o->out, sizeof(o->out), "%s", at(sub));
	o->train_rows = 40000;
	o->test_rows = 20000;
	o->vocab = 20000;
	o->seed = seed;
}

static int same_file(const char *a, const char *b)
{
	unsigned char *x, *y;
	size_t nx, ny;
	read_all(a, &x, &nx);
	read_all(b, &y, &ny);
	int same = nx == ny && memcmp(x, y, nx) == 0;
	free(x);
	free(y);
	return same;
}

Test(synth, same_seed_same_bytes)
{
	struct synth_opts o;
	struct synth_result r[3];
	char err[400] = "", paths[3][2][SYNTH_PATH_MAX + 16];

	for (int i = 0; i < 3; i++) {
		char sub[16];
		snprintf(sub, sizeof(sub), "run%d", i);
		synth_small(&o, sub, i == 2 ? 2 : 1);
		o.train_rows = 5000;
		o.test_rows = 2000;
		cr_assert_eq(synth_write(&o, &r[i], err, sizeof(err)), 0, "%s", err);
		memcpy(paths[i][0], r[i].train_path, sizeof(paths[i][0]));
		memcpy(paths[i][1], r[i].test_path, sizeof(paths[i][1]));
	}
	for (int f = 0; f < 2; f++) {
		cr_expect(same_file(paths[0][f], paths[1][f]), "seed 1 twice: %s and %s differ", paths[0][f], paths[1][f]);
		cr_expect(!same_file(paths[0][f], paths[2][f]), "seeds 1 and 2 gave the same %s", paths[0][f]);
	}
	cr_expect_eq(r[0].auc, r[1].auc);
	cr_expect_eq(r[0].logloss, r[1].logloss);

	/* --gzip: the same rows, compressed, and the same bytes again. */
	synth_small(&o, "gz", 1);
	o.train_rows = 5000;
	o.test_rows = 2000;
	o.gzip = 1;
	struct synth_result g, g2;
	cr_assert_eq(synth_write(&o, &g, err, sizeof(err)), 0, "%s", err);
	cr_expect(strstr(g.train_path, "/train.txt.gz"));
	struct dataset a, b;
	size_t na, nb;
	cr_assert_eq(criteo_load(&a, paths[0][0], 1u << 20, &na, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(criteo_load(&b, g.train_path, 1u << 20, &nb, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(na, 5000);
	cr_assert_eq(nb, 5000);
	cr_expect(memcmp(a.ids, b.ids, na * CRITEO_CATS * sizeof(*a.ids)) == 0);
	cr_expect(memcmp(a.x, b.x, na * CRITEO_INTS * sizeof(*a.x)) == 0);
	cr_expect(memcmp(a.y, b.y, na * sizeof(*a.y)) == 0);
	dataset_free(&a);
	dataset_free(&b);
	snprintf(o.out, sizeof(o.out), "%s", at("gz2"));
	cr_assert_eq(synth_write(&o, &g2, err, sizeof(err)), 0, "%s", err);
	cr_expect(same_file(g.train_path, g2.train_path), "gzip output differs between two runs");
}

/* Counts of field j's IDs in ds, most frequent first. */
static int by_count_desc(const void *a, const void *b)
{
	size_t x = *(const size_t *)a, y = *(const size_t *)b;
	return (x < y) - (x > y);
}

static int by_id(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

static size_t field_counts(const struct dataset *ds, int j, size_t *counts, size_t *missing)
{
	uint32_t *v = malloc(ds->n * sizeof(*v));
	size_t n = 0, k = 0;
	for (size_t i = 0; i < ds->n; i++)
		if (ds->ids[i * ds->f + j] != DATA_ID_NONE)
			v[n++] = ds->ids[i * ds->f + j];
	*missing = ds->n - n;
	qsort(v, n, sizeof(*v), by_id);
	for (size_t i = 0; i < n; k++) {
		size_t e = i;
		while (e < n && v[e] == v[i])
			e++;
		counts[k] = e - i;
		i = e;
	}
	free(v);
	qsort(counts, k, sizeof(*counts), by_count_desc);
	return k;
}

Test(synth, planted_ceiling_rate_and_power_law)
{
	struct synth_opts o;
	struct synth_result r;
	char err[400] = "";

	synth_small(&o, "big", 1);
	cr_assert_eq(synth_write(&o, &r, err, sizeof(err)), 0, "%s", err);
	cr_expect(r.auc > 0.75 && r.auc < 0.95, "planted AUC %.4f", r.auc);
	cr_expect(r.train_rate > 0.15 && r.train_rate < 0.35, "click rate %.4f", r.train_rate);
	cr_expect(fabs(r.test_rate - r.train_rate) < 0.02, "train %.4f test %.4f", r.train_rate, r.test_rate);
	cr_expect_lt(r.logloss, r.base_logloss - 0.05, "planted %.4f vs the rate alone %.4f", r.logloss, r.base_logloss);

	/* The file as the loader reads it: labels agree with the rate, and
	 * each field's IDs fall off as a power of their rank. */
	struct dataset ds;
	size_t n, clicks = 0, missing, *counts = malloc(o.train_rows * sizeof(*counts));
	cr_assert_eq(criteo_load(&ds, r.train_path, 1u << 20, &n, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(n, o.train_rows);
	for (size_t i = 0; i < n; i++)
		clicks += (size_t)ds.y[i];
	cr_expect_eq((double)clicks / (double)n, r.train_rate);
	size_t widest = 0, widest_j = 0, empty_fields = 0;
	for (int j = 0; j < CRITEO_CATS; j++) {
		size_t k = field_counts(&ds, j, counts, &missing);
		empty_fields += missing > 0;
		if (k > widest) {
			widest = k;
			widest_j = (size_t)j;
		}
	}
	cr_expect_gt(empty_fields, 3, "some fields have missing values");
	cr_expect_gt(widest, 2000, "the widest field has %zu values", widest);
	field_counts(&ds, (int)widest_j, counts, &missing);
	/* Zipf with exponent s: count(rank r) ~ r^-s; the slope of log count
	 * from rank 1 to 16 is -s, and s is 1.05..1.3. */
	double slope = (log((double)counts[15]) - log((double)counts[0])) / log(16.0);
	cr_expect(slope < -0.9 && slope > -1.5, "log-log slope %.3f over ranks 1..16", slope);
	free(counts);
	dataset_free(&ds);
}

Test(synth, options)
{
	struct synth_opts o;
	char err[300];
	char *ok[] = { "--seed", "7" }, *eq[] = { "--vocab=300" }, *gz[] = { "--gzip" }, *out[] = { "--out", "d" },
	     *other[] = { "--config", "x" };
	synth_defaults(&o);
	cr_expect_eq(synth_arg(&o, ok, 2, err, sizeof(err)), 2);
	cr_expect_eq(o.seed, 7);
	cr_expect_eq(synth_arg(&o, eq, 1, err, sizeof(err)), 1);
	cr_expect_eq(o.vocab, 300);
	cr_expect_eq(synth_arg(&o, gz, 1, err, sizeof(err)), 1);
	cr_expect_eq(o.gzip, 1);
	cr_expect_eq(synth_arg(&o, out, 2, err, sizeof(err)), 2);
	cr_expect_str_eq(o.out, "d");
	cr_expect_eq(synth_arg(&o, other, 2, err, sizeof(err)), 0);
	static const struct {
		const char *arg;
		const char *want;
	} bad[] = {
		{ "--vocab=1", "--vocab \"1\": not a whole number from 2 to" },
		{ "--vocab=12x", "--vocab \"12x\"" },
		{ "--train-rows=0", "--train-rows \"0\"" },
		{ "--test-rows=-5", "--test-rows \"-5\"" },
		{ "--seed= 1", "--seed \" 1\"" },
		{ "--seed=18446744073709551616", "--seed" },
		{ "--out=", "--out: a directory name" },
		{ "--seed", "--seed needs a value" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *argv[] = { (char *)bad[i].arg };
		err[0] = 0;
		cr_expect_eq(synth_arg(&o, argv, 1, err, sizeof(err)), -EINVAL, "%s", bad[i].arg);
		cr_expect(strstr(err, bad[i].want) == err, "%s: got \"%s\"", bad[i].arg, err);
	}
}

/* The command: its two lines and exit 0; a bad option exits 2 with usage. */
Test(synth, command_line)
{
	char out[600], log[600];
	snprintf(out, sizeof(out), "%s", at("cli"));
	snprintf(log, sizeof(log), "%s", at("cli.log"));
	const char *args[] = { "synth", "--out", out, "--train-rows=3000", "--test-rows", "1000", "--vocab", "500", NULL };
	pid_t pid = spawn_pstrain(args, log, NULL);
	int st[1];
	wait_children(&pid, 1, st, 60);
	const char *text = slurp(log);
	cr_assert_eq(st[0], 0, "exit %d: %s", st[0], text);
	cr_expect(strstr(text, "/cli/train.txt (3000 rows"), "%s", text);
	cr_expect(strstr(text, "planted model on the test rows: logloss "), "%s", text);

	const char *bad[] = { "synth", "--vocab", "1", NULL };
	pid = spawn_pstrain(bad, log, NULL);
	wait_children(&pid, 1, st, 60);
	text = slurp(log);
	cr_expect_eq(st[0], 2, "exit %d: %s", st[0], text);
	cr_expect(strstr(text, "pstrain: --vocab \"1\": not a whole number from 2 to"), "%s", text);
	const char *notmine[] = { "synth", "--fresh", NULL };
	pid = spawn_pstrain(notmine, log, NULL);
	wait_children(&pid, 1, st, 60);
	cr_expect_eq(st[0], 2, "--fresh on synth: exit %d: %s", st[0], slurp(log));
}

/* A ps loads the data only to count its steps (want_data 0): the counts
 * stay and the samples go, loaded whole or streamed (they once stayed
 * for the run: 156 MiB beside a 635 MiB shard at 1M rows). */
Test(stream, a_job_without_data_keeps_the_counts_not_the_samples)
{
	char text[2048], err[400] = "";
	const char *train = write_rows("count-train.txt", 0, 3000, 0), *test = write_rows("count-test.txt", 3000, 100, 0);
	for (int streamed = 0; streamed < 2; streamed++) {
		struct config c;
		struct job j;
		snprintf(text, sizeof(text),
			 "[train]\nbatch_size = 50\nepochs = 2\n[data]\nformat = criteo\ntrain_csv = %s\ntest_csv = %s\n%s"
			 "[model]\ninput = 13\nlayer = embedding 26 1000 4\nlayer = dense 1\nloss = sigmoid_cross_entropy\n",
			 train, test, streamed ? "max_resident_mb = 1\n" : "");
		cr_assert_eq(config_parse_string(&c, "t.ini", text, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(job_load(&j, &c, 2, 0, err, sizeof(err)), 0, "%s", err);
		cr_expect_eq(j.n, 3000);
		cr_expect_eq(j.spe, 30);
		cr_expect_eq(j.total, 60);
		cr_expect_eq(j.train.n, 0, "streamed %d: %zu training samples held", streamed, j.train.n);
		cr_expect_null(j.train.x);
		cr_expect_null(j.train.ids);
		cr_expect_eq(j.test.n, 0, "streamed %d: %zu test samples held", streamed, j.test.n);
		cr_expect_null(j.stream.l.buf, "streamed %d: the stream's buffer held", streamed);
		job_free(&j);
	}
}
