/* Shared bits of the libFuzzer harnesses: a scratch file per process for the
 * loaders that take a path, and the checks every parser's error obeys.
 *
 * Built only by `make fuzz` (clang -fsanitize=fuzzer,...); each harness is
 * one translation unit that includes this header. A failed check aborts, so
 * libFuzzer records the input as a crash like any sanitizer report. */
#ifndef PSTRAIN_FUZZ_H
#define PSTRAIN_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_CHECK(cond)                                                        \
	do {                                                                    \
		if (!(cond)) {                                                  \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,  \
				__LINE__, #cond);                               \
			abort();                                                \
		}                                                               \
	} while (0)

struct fuzz_file {
	char path[64];
	int fd;
};

/* Created once per process and removed at exit; libFuzzer's -fork and
 * -jobs workers are separate processes, each with its own file. */
static void fuzz_file_open(struct fuzz_file *f, const char *tag)
{
	snprintf(f->path, sizeof(f->path), "/tmp/pstrain-fuzz-%s-XXXXXX", tag);
	f->fd = mkstemp(f->path);
	if (f->fd < 0) {
		perror("mkstemp");
		abort();
	}
}

static void fuzz_file_close(struct fuzz_file *f)
{
	if (f->fd >= 0) {
		close(f->fd);
		unlink(f->path);
		f->fd = -1;
	}
}

/* Replaces the file's contents with data[0..n). Overwrite, then cut to
 * size: truncating to 0 first costs ext4 a flush per input (its
 * auto_da_alloc), which took the loaders from thousands of runs a second
 * to dozens. */
static void fuzz_file_write(struct fuzz_file *f, const uint8_t *data, size_t n)
{
	size_t done = 0;

	while (done < n) {
		ssize_t w = pwrite(f->fd, data + done, n - done, (off_t)done);
		if (w <= 0) {
			perror("pwrite");
			abort();
		}
		done += (size_t)w;
	}
	if (ftruncate(f->fd, (off_t)n) < 0) {
		perror("ftruncate");
		abort();
	}
}

/* A failure returns a negative errno and one line of text. */
static void fuzz_check_err(int ret, const char *err)
{
	FUZZ_CHECK(ret < 0);
	FUZZ_CHECK(err[0] != '\0');
	FUZZ_CHECK(strchr(err, '\n') == NULL);
}

/* Little-endian integers from a record of n bytes at b, from byte at on,
 * zero past its end (the stateful harnesses' records). */
static inline uint64_t fuzz_take(const uint8_t *b, size_t n, size_t at, int bytes)
{
	uint64_t v = 0;
	for (int i = 0; i < bytes; i++)
		if (at + (size_t)i < n)
			v |= (uint64_t)b[at + (size_t)i] << (8 * i);
	return v;
}

#endif
