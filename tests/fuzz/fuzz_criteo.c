/* libFuzzer harness for the Criteo loader and its streamed windows. The
 * first input byte picks how many rows are held (0, 1, 2 or all); the rest
 * is the file, raw or gzip. A success must hold what the layout allows
 * (labels 0/1, features log(1 + v) >= 0 and finite, D = 13, F = 26), and
 * the file read again in windows of that many rows must give the same
 * rows; a failure is one line of text and a zeroed dataset. */
#include "../../core/data/criteo.h"
#include "../../core/data/stream.h"
#include "fuzz.h"

#include <math.h>

static struct fuzz_file file = { .fd = -1 };

static void cleanup(void)
{
	fuzz_file_close(&file);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fuzz_file_open(&file, "criteo");
	atexit(cleanup);
	return 0;
}

/* The file in windows of `window` rows equals the whole load. */
static void check_windows(const struct dataset *all, size_t window)
{
	struct stream s;
	struct dataset win;
	char err[1024] = "";

	FUZZ_CHECK(stream_open(&s, file.path, window, &win, err, sizeof(err)) == 0);
	FUZZ_CHECK(s.n == all->n);
	/* backwards, so that each fill but the first goes back to the start */
	for (size_t k = stream_windows(&s); k-- > 0;) {
		FUZZ_CHECK(stream_fill(&s, k, &win, err, sizeof(err)) == 0);
		size_t first = k * window;
		FUZZ_CHECK(win.n == (all->n - first < window ? all->n - first : window));
		FUZZ_CHECK(memcmp(win.x, all->x + first * CRITEO_INTS, win.n * CRITEO_INTS * sizeof(float)) == 0);
		FUZZ_CHECK(memcmp(win.ids, all->ids + first * CRITEO_CATS, win.n * CRITEO_CATS * sizeof(uint32_t)) == 0);
		FUZZ_CHECK(memcmp(win.y, all->y + first, win.n * sizeof(int32_t)) == 0);
	}
	stream_close(&s);
	dataset_free(&win);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const size_t holds[] = { 0, 1, 2, SIZE_MAX };
	struct dataset ds;
	size_t n = 12345, max;
	char err[1024];
	int ret;

	if (size < 1)
		return 0;
	max = holds[data[0] & 3];
	fuzz_file_write(&file, data + 1, size - 1);

	err[0] = '\0';
	ret = criteo_load(&ds, file.path, max, &n, err, sizeof(err));
	if (ret) {
		fuzz_check_err(ret, err);
		FUZZ_CHECK(!ds.x && !ds.ids && !ds.y && !ds.n && !ds.d && !ds.f && !ds.classes && n == 0);
		return 0;
	}
	FUZZ_CHECK(n >= 1);
	FUZZ_CHECK(ds.n == (n < max ? n : max));
	FUZZ_CHECK(ds.d == CRITEO_INTS && ds.f == CRITEO_CATS && ds.classes == 2);
	for (size_t i = 0; i < ds.n; i++)
		FUZZ_CHECK(ds.y[i] == 0 || ds.y[i] == 1);
	for (size_t i = 0; i < ds.n * ds.d; i++)
		FUZZ_CHECK(isfinite(ds.x[i]) && ds.x[i] >= 0);
	if (max == SIZE_MAX)
		check_windows(&ds, 1 + data[0] / 4 % 3);
	dataset_free(&ds);
	return 0;
}
