/* libFuzzer harness for csv_load. The first input byte picks the options
 * (label column -1..2, header auto/yes/no); the rest is the file, raw or
 * gzip. Checks a success for finite features and labels in [0, classes),
 * and a failure for one line of text and a zeroed dataset. */
#include "../../core/data/csv.h"
#include "fuzz.h"

#include <math.h>

static struct fuzz_file csv = { .fd = -1 };

static void cleanup(void)
{
	fuzz_file_close(&csv);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fuzz_file_open(&csv, "csv");
	atexit(cleanup);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const enum csv_header headers[] = { CSV_HEADER_AUTO, CSV_HEADER_YES, CSV_HEADER_NO };
	struct dataset ds;
	char err[1024];
	int label_column, ret;

	if (size < 1)
		return 0;
	label_column = (int)(data[0] & 3) - 1;
	enum csv_header header = headers[(data[0] >> 2) % 3];
	fuzz_file_write(&csv, data + 1, size - 1);

	err[0] = '\0';
	ret = csv_load(&ds, csv.path, label_column, header, err, sizeof(err));
	if (ret) {
		fuzz_check_err(ret, err);
		FUZZ_CHECK(!ds.x && !ds.y && !ds.n && !ds.d && !ds.classes);
		return 0;
	}
	FUZZ_CHECK(ds.n > 0 && ds.d > 0 && ds.x && ds.y);
	FUZZ_CHECK(ds.classes >= 1 && ds.classes <= DATA_MAX_CLASSES);
	int max = -1;
	for (size_t i = 0; i < ds.n; i++) {
		FUZZ_CHECK(ds.y[i] >= 0 && ds.y[i] < ds.classes);
		if (ds.y[i] > max)
			max = ds.y[i];
	}
	FUZZ_CHECK(max + 1 == ds.classes);
	for (size_t i = 0; i < ds.n * ds.d; i++)
		FUZZ_CHECK(isfinite(ds.x[i]));
	dataset_free(&ds);
	return 0;
}
