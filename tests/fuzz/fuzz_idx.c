/* libFuzzer harness for idx_load. The input is split in two files: its
 * first byte is the length of the labels file, which follows; the rest is
 * the images file. Either may be raw or gzip (the seeds have both). Checks
 * a success against the header's promises and a failure for one line of
 * text and a zeroed dataset. */
#include "../../core/data/idx.h"
#include "fuzz.h"

#include <math.h>

static struct fuzz_file images = { .fd = -1 }, labels = { .fd = -1 };

static void cleanup(void)
{
	fuzz_file_close(&images);
	fuzz_file_close(&labels);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fuzz_file_open(&images, "images");
	fuzz_file_open(&labels, "labels");
	atexit(cleanup);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dataset ds;
	char err[1024];
	size_t nl;
	int ret;

	if (size < 1)
		return 0;
	nl = data[0];
	if (nl > size - 1)
		nl = size - 1;
	fuzz_file_write(&labels, data + 1, nl);
	fuzz_file_write(&images, data + 1 + nl, size - 1 - nl);

	err[0] = '\0';
	ret = idx_load(&ds, images.path, labels.path, err, sizeof(err));
	if (ret) {
		fuzz_check_err(ret, err);
		FUZZ_CHECK(!ds.x && !ds.y && !ds.n && !ds.d && !ds.classes);
		return 0;
	}
	FUZZ_CHECK(ds.n > 0 && ds.d > 0 && ds.x && ds.y);
	FUZZ_CHECK(ds.classes >= 1 && ds.classes <= 256);
	int max = -1;
	for (size_t i = 0; i < ds.n; i++) {
		FUZZ_CHECK(ds.y[i] >= 0 && ds.y[i] < ds.classes);
		if (ds.y[i] > max)
			max = ds.y[i];
	}
	FUZZ_CHECK(max + 1 == ds.classes);
	for (size_t i = 0; i < ds.n * ds.d; i++)
		FUZZ_CHECK(ds.x[i] >= 0.0f && ds.x[i] <= 1.0f);
	dataset_free(&ds);
	return 0;
}
