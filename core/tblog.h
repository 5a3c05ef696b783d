/* TensorBoard event files: `[train] log_dir`, written by `local` and a
 * cluster's chief. One file per run (events.out.tfevents.TIME.HOST.PID),
 * TFRecord framing (length, masked CRC32C of it, the record, masked
 * CRC32C of that) around tensorflow.Event protobufs written by hand: a
 * first event with file_version "brain.Event:2", then one event per
 * scalar with wall_time, step and a Summary of one simple_value. Records
 * are appended and the file flushed at each evaluation, so a killed run
 * leaves a readable file (TensorBoard skips a torn last record).
 *
 * log_dir is shared ground (TensorBoard's --logdir, a colleague's view):
 * the file is made 0600 with O_EXCL|O_NOFOLLOW inside a log_dir that is
 * this user's and writable by no one else (base/owndir.h), and a run,
 * resumed or not, writes a new file through its descriptor: nothing is
 * ever opened by a name someone else could have planted. */
#ifndef PSTRAIN_CORE_TBLOG_H
#define PSTRAIN_CORE_TBLOG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct tblog {
	FILE *f;          /* NULL: logging off (no log_dir) */
	char path[4096];
};

/* Makes dir (mkdir -p) and a new event file in it. dir "" leaves it off
 * and returns 0. -errno with one line in err: dir cannot be made, is a
 * link (-ELOOP), is another user's or may be written by group or others
 * (-EPERM), or no file can be made in it. */
int tblog_open(struct tblog *t, const char *dir, char *err, size_t errlen);
/* One scalar at step (buffered until tblog_flush). No-op when off. */
int tblog_scalar(struct tblog *t, long step, const char *tag, double value);
/* An evaluation's figures as the progress line prints them (p after
 * progress_eval): train/loss and train/accuracy (the recent batches),
 * test/loss, test/accuracy (fractions, not percent), samples_per_second,
 * learning_rate (lr), and in a cluster dropped_stale; then flushed. A
 * binary model's (progress_set_binary) has no accuracies, and test/loss
 * (its log loss) and test/auc instead. */
struct progress;
int tblog_eval(struct tblog *t, long step, const struct progress *p, double lr);
/* Writes what is buffered to the file (fflush, then fsync is left to the
 * OS: a killed process loses nothing already flushed). */
int tblog_flush(struct tblog *t);
void tblog_close(struct tblog *t);   /* accepts a zeroed struct */

/* The pieces, for tests: CRC32C (Castagnoli) of n bytes, and TFRecord's
 * mask of it. */
uint32_t tblog_crc32c(const void *data, size_t n);
uint32_t tblog_masked_crc(uint32_t crc);
/* The event file's name for a run started at when on host with pid,
 * "events.out.tfevents.WHEN.HOST.PID.pstrain" (".ATTEMPT" after it when
 * attempt > 0), every byte of host outside [A-Za-z0-9._-] written as %XX
 * (so no '/'). Returns snprintf's length. */
size_t tblog_file_name(char *out, size_t outlen, long when, const char *host, long pid, int attempt);

#endif
