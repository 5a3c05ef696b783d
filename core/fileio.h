/* Whole files in memory, for the checkpoint readers. */
#ifndef PSTRAIN_FILEIO_H
#define PSTRAIN_FILEIO_H

#include <stddef.h>

/* The regular file at path into a new buffer (*len bytes) the caller
 * frees. Returns 0, or -EINVAL (missing, not a regular file), -ENOMEM or
 * -EIO with the path and reason in err. */
int file_read(const char *path, unsigned char **buf, size_t *len, char *err, size_t errlen);

#endif
