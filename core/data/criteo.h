/* The Criteo display-advertising layout that click-through trainers read:
 * one sample per line, 40 tab-separated columns
 *
 *	label  I1 .. I13  C1 .. C26
 *
 * label 0 or 1 (a click), I* integers (counts; may be negative), C* 8 hex
 * digits (a hashed categorical value); any column but the label may be
 * empty (missing). Plain or gzip. A malformed line is one line in the
 * caller's buffer, "PATH:LINE: column C (NAME): ...", never a partly
 * filled sample. Which of a big file's rows are held at once is stream.h's
 * business; this file parses and holds what it is asked to. */
#ifndef PSTRAIN_CRITEO_H
#define PSTRAIN_CRITEO_H

#include <stddef.h>
#include <stdint.h>

#include "dataset.h"
#include "lines.h"

#define CRITEO_INTS 13                      /* D: numeric features */
#define CRITEO_CATS 26                      /* F: categorical fields */
#define CRITEO_COLS (1 + CRITEO_INTS + CRITEO_CATS)
/* What one sample takes in memory: x (D floats), ids (F) and y. */
#define CRITEO_ROW_BYTES ((CRITEO_INTS + CRITEO_CATS) * 4 + 4)

/* Parses one line (len bytes, NUL at line[len]) into x (D), ids (F) and
 * *y. An integer v becomes log(1 + v) for v > 0 and 0 when it is missing
 * or v <= 0, as CTR trainers feed counts; a missing categorical value is
 * DATA_ID_NONE, and the one hash equal to it, ffffffff, is read as
 * fffffffe (a collision like any other of a 32-bit hash). Returns 0, or
 * -EINVAL with "column C (NAME): ..." in err (no file or line: the caller
 * knows them). */
int criteo_parse(const char *line, size_t len, float *x, uint32_t *ids, int32_t *y, char *err,
		 size_t errlen);

/* The next sample of l into x (D), ids (F), *y. Returns 1, 0 at the end
 * of the file, or a negative errno with "PATH:LINE: ..." in err. */
int criteo_next(struct lines *l, float *x, uint32_t *ids, int32_t *y, char *err, size_t errlen);

/* Reads the file at path whole, checking every line: the first max_rows
 * samples into ds (D = 13, F = 26, classes = 2), the count of all of them
 * into *nrows. A file with more than max_rows samples is therefore read to
 * its end but not held: that is how stream.h counts and checks it. ds is
 * overwritten; on failure it is zeroed. Returns 0, or a negative errno
 * with one line in err (an empty file is an error). */
int criteo_load(struct dataset *ds, const char *path, size_t max_rows, size_t *nrows, char *err,
		size_t errlen);

#endif
