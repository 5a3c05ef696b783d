/* Whole files in and out of memory; see fileio.h. */
#include "fileio.h"

#include "../base/err.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* Creates, writes one byte to, fsyncs and removes a new file in dir. Two
 * processes with one PID (ps tasks on two hosts sharing a folder) get two
 * names: O_EXCL makes the second try the next one. */
static int probe_file(const char *dir)
{
	char p[PATH_MAX + 64];
	int fd = -1;
	for (int i = 0; i < 16 && fd < 0; i++) {
		if (i == 0)
			snprintf(p, sizeof(p), "%s/.probe-%d", dir, (int)getpid());
		else
			snprintf(p, sizeof(p), "%s/.probe-%d-%d", dir, (int)getpid(), i);
		fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0 && errno != EEXIST)
			return -errno;
	}
	if (fd < 0)
		return -EEXIST;
	int e = 0;
	errno = 0;
	if (write(fd, "\n", 1) != 1)
		e = errno ? -errno : -EIO;
	if (!e && fsync(fd))
		e = -errno;
	if (close(fd) && !e)
		e = -errno;
	if (unlink(p) && !e)
		e = -errno;   /* a folder we cannot delete from cannot rotate checkpoints */
	return e;
}

int file_make_dirs(const char *path, size_t *made)
{
	char p[PATH_MAX];
	size_t n = strlen(path), first = 0;
	if (n == 0 || n >= sizeof(p))
		return -ENAMETOOLONG;
	memcpy(p, path, n + 1);
	int e = 0;
	for (size_t i = 1; !e; i++) {
		if (p[i] != '/' && p[i] != '\0')
			continue;
		char ch = p[i];
		p[i] = '\0';
		if (mkdir(p, 0755) == 0) {
			if (!first)
				first = i;
		} else if (errno != EEXIST) {
			e = -errno;
		}
		p[i] = ch;
		if (ch == '\0')
			break;
	}
	struct stat sb;
	if (!e && (stat(p, &sb) || !S_ISDIR(sb.st_mode)))
		e = -ENOTDIR;
	if (made)
		*made = first;
	return e;
}

int file_dir_writable(const char *path, char *err, size_t errlen)
{
	char p[PATH_MAX];
	size_t n = strlen(path), made = 0;
	if (n == 0 || n >= sizeof(p))
		return err_set(err, errlen, -ENAMETOOLONG, "%s cannot be written (%s)", path,
			       n ? strerror(ENAMETOOLONG) : "empty path");
	memcpy(p, path, n + 1);
	int e = file_make_dirs(p, &made);
	if (!e)
		e = probe_file(p);
	if (!e)
		return 0;
	/* Undo the levels made, deepest first ("a//b" tries "a/" twice: the
	 * second rmdir fails harmlessly). */
	for (size_t i = n + 1; made && i-- > made;)
		if (p[i] == '/' || p[i] == '\0') {
			p[i] = '\0';
			(void)rmdir(p);
		}
	return err_set(err, errlen, e, "%s cannot be written (%s)", path, strerror(-e));
}
