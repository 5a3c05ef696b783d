/* Whole files in and out of memory; see fileio.h. */
#include "fileio.h"

#include "../base/err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int file_read(const char *path, unsigned char **buf, size_t *len, char *err, size_t errlen)
{
	*buf = NULL;
	*len = 0;
	FILE *f = fopen(path, "rb");
	if (!f)
		return err_set(err, errlen, -errno == -ENOENT ? -EINVAL : -errno, "%s: %s", path, strerror(errno));
	struct stat sb;
	if (fstat(fileno(f), &sb) || !S_ISREG(sb.st_mode)) {
		fclose(f);
		return err_set(err, errlen, -EINVAL, "%s: not a regular file", path);
	}
	unsigned char *b = malloc(sb.st_size ? (size_t)sb.st_size : 1);
	if (!b) {
		fclose(f);
		return err_set(err, errlen, -ENOMEM, "%s: out of memory for %lld bytes", path, (long long)sb.st_size);
	}
	size_t n = fread(b, 1, (size_t)sb.st_size, f);
	int bad = ferror(f);
	fclose(f);
	if (bad || n != (size_t)sb.st_size) {
		free(b);
		return err_set(err, errlen, -EIO, "%s: read error", path);
	}
	*buf = b;
	*len = n;
	return 0;
}
