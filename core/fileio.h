/* Whole files in memory, for the checkpoint readers, and whether a
 * directory can take files, for a run's start. */
#ifndef PSTRAIN_FILEIO_H
#define PSTRAIN_FILEIO_H

#include <stddef.h>

/* The regular file at path into a new buffer (*len bytes) the caller
 * frees. Returns 0, or -EINVAL (missing, not a regular file), -ENOMEM or
 * -EIO with the path and reason in err. */
int file_read(const char *path, unsigned char **buf, size_t *len, char *err, size_t errlen);

/* mkdir -p path (mode 0755); an existing directory is fine. *made: the
 * length of the first prefix of path this call created (every level
 * below it was created too), 0 if none; may be NULL. Returns 0 or a
 * negative errno (-ENOTDIR: path, or a level of it, is not a directory;
 * -ENAMETOOLONG). */
int file_make_dirs(const char *path, size_t *made);

/* Makes the directory path (mkdir -p, mode 0755) and creates, writes,
 * fsyncs and removes a probe file .probe-PID in it: what a checkpoint
 * needs, tried before a run loads data or trains instead of at its first
 * save. Returns 0, or a negative errno with "PATH cannot be written
 * (REASON)" in err; on failure the directories it made are removed again,
 * so a refused path leaves nothing behind. */
int file_dir_writable(const char *path, char *err, size_t errlen);

#endif
