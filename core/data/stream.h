/* A Criteo training file too large to hold, read in windows: window k is
 * rows [k*M, min((k+1)*M, N)) of the file, in file order, held one at a
 * time in M samples' memory; within a window the rows are taken in an
 * order shuffled per (seed, epoch, window). An epoch goes through the
 * windows in file order, so its order is a permutation of all N rows in
 * which a row can only move within its window: the file's own order
 * (a click log's time order) survives at the window's scale. Rows are
 * checked and counted once, when the stream opens, so a bad line stops a
 * run before its first step rather than hours in.
 *
 * Who needs which window when (the trainer's epochs and steps) is the
 * caller's business; this file fills the one it is asked for, reading on
 * when it is the next one and from the start of the file otherwise. */
#ifndef PSTRAIN_STREAM_H
#define PSTRAIN_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "dataset.h"
#include "lines.h"

struct stream {
	char path[512];
	struct lines l;     /* open once a window other than 0 was asked for */
	size_t n;           /* N: rows in the file */
	size_t window;      /* M: rows per window */
	size_t next;        /* the row l returns next */
	size_t held;        /* the window in the caller's dataset; SIZE_MAX: none */
};

/* The rows of M that fit cap_bytes (CRITEO_ROW_BYTES each), rounded down
 * to a multiple of per_step (workers x batch) so that a step's batches are
 * never split across two windows; at least per_step. */
size_t stream_window_rows(uint64_t cap_bytes, size_t per_step);

/* Opens the file at path, reading it once to check every line and count
 * N, and leaves window 0 in win (which it overwrites; the caller frees
 * it with dataset_free). window is M > 0. Returns 0 or a negative errno
 * with one line in err; s needs stream_close either way. */
int stream_open(struct stream *s, const char *path, size_t window, struct dataset *win, char *err,
		size_t errlen);

/* ceil(N / M). */
size_t stream_windows(const struct stream *s);

/* Window k (< stream_windows) into win, which holds the last window this
 * stream filled: its M rows' arrays are reused, win->n is set to the
 * window's rows. A file that no longer has the rows it had at open is an
 * error (it changed while training). Returns 0 or a negative errno. */
int stream_fill(struct stream *s, size_t k, struct dataset *win, char *err, size_t errlen);

/* order[0..n) = the order of window k's n rows in epoch, a permutation of
 * 0..n-1 that depends only on (seed, epoch, k). */
void stream_order(uint32_t *order, size_t n, uint64_t seed, uint64_t epoch, size_t k);

void stream_close(struct stream *s);   /* accepts a zeroed or closed struct */

#endif
