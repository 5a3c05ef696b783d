/* CSV files of numbers (optionally gzip-compressed) into a dataset.
 * Every field is validated; a failure is one line in the caller's buffer
 * naming the file, line and column. */
#ifndef PSTRAIN_CSV_H
#define PSTRAIN_CSV_H

#include "dataset.h"

enum csv_header {
	CSV_HEADER_AUTO,   /* a first row with any non-numeric field is a header */
	CSV_HEADER_YES,
	CSV_HEADER_NO,
};

/* One CSV file (optionally gzip-compressed), numbers only, all rows the
 * same number of fields, comma-separated without quoting. label_column is
 * 0-based or -1 for the last; labels are integers 0..DATA_MAX_CLASSES-1.
 * Features are returned as read. Messages count lines and columns from 1.
 * *ds is overwritten; on failure it is zeroed. */
int csv_load(struct dataset *ds, const char *path, int label_column,
	     enum csv_header header, char *err, size_t errlen);

#endif
