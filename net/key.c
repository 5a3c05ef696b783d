/* The cluster key file: create it (key_generate) and read it back with the
 * checks ssh applies to a private key (key_load). The format and the rules are
 * in net/key.h. What the key is used for is the handshake's business.
 *
 * Where a key lives in memory. key_generate and key_load_guarded keep it in
 * sodium_malloc'd pages; key_load's and the handshake's stack copies live
 * for one call and are wiped. sodium_malloc mlocks its pages, and mlocked
 * pages count against RLIMIT_MEMLOCK (8 MiB by default on current kernels,
 * 64 KiB on older ones; unlimited for root, which has CAP_IPC_LOCK). When
 * the limit is reached, libsodium 1.0.18 (_sodium_malloc in
 * sodium/utils.c) ignores mlock's failure and still returns the memory,
 * already marked MADV_DONTDUMP and guarded: the key then works and stays
 * out of core dumps, but may reach swap. So a low limit is never fatal
 * here, nor for the per-connection session keys of net/conn.c and
 * net/pipe.c (one page each): with a 64 KiB limit a ps with a few dozen
 * connections runs on, its later keys merely swappable.
 *
 * Both functions work on a file descriptor once the file is open: the type,
 * owner, mode and size that key_load checks are those of the file it then
 * reads (fstat, not stat then open), and key_generate's fchmod and fsync act
 * on the file it created. */
#include "key.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Writes all n bytes: write(2) may transfer fewer (a signal, a full disk
 * reached half way), so loop; EINTR before anything was written is retried.
 * 0 or a negative errno. A write that returns 0 for a non-zero count would
 * loop forever, so it counts as -EIO. */
static int write_full(int fd, const void *buf, size_t n)
{
	const uint8_t *p = buf;
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		if (w == 0)
			return -EIO;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static const char *file_kind(mode_t m)
{
	if (S_ISDIR(m))
		return "a directory";
	if (S_ISFIFO(m))
		return "a FIFO";
	if (S_ISSOCK(m))
		return "a socket";
	if (S_ISCHR(m))
		return "a character device";
	if (S_ISBLK(m))
		return "a block device";
	return "not a plain file";
}

int key_generate(const char *path, char *err, size_t errlen)
{
	const char *what = NULL;
	int r = 0;

	/* Before the file exists, so that running out of memory leaves
	 * nothing behind. */
	uint8_t *key = sodium_malloc(KEY_BYTES);
	if (!key) {
		snprintf(err, errlen, "%s: out of memory for the key", path);
		return -ENOMEM;
	}
	/* O_EXCL: never overwrite an existing key (whose loss would lock every
	 * node out) and never follow a symlink planted at path. */
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0600);
	if (fd < 0) {
		r = -errno;
		if (r == -EEXIST)
			snprintf(err, errlen, "%s: already exists; pstrain keygen never overwrites a key "
				 "(remove it first to replace the key on every node)", path);
		else
			snprintf(err, errlen, "%s: cannot create: %s", path, strerror(-r));
		sodium_free(key);
		return r;
	}
	/* The mode given to open is filtered by the umask; 0600 is wanted
	 * exactly (a umask of 0777 would otherwise leave an unreadable key). */
	if (fchmod(fd, 0600) < 0) {
		r = -errno;
		what = "cannot set mode 0600";
		goto fail;
	}
	randombytes_buf(key, KEY_BYTES);
	r = write_full(fd, key, KEY_BYTES);
	if (r < 0) {
		what = "cannot write";
		goto fail;
	}
	if (fsync(fd) < 0) {
		r = -errno;
		what = "cannot fsync";
		goto fail;
	}
	/* Linux releases the descriptor even when close fails, so it is not
	 * retried; the error still means the data may not have been written. */
	if (close(fd) < 0) {
		fd = -1;
		r = -errno;
		what = "cannot close";
		goto fail;
	}
	sodium_free(key); /* wipes */
	return 0;

fail:
	sodium_free(key);
	if (fd >= 0)
		close(fd);
	unlink(path);
	snprintf(err, errlen, "%s: %s: %s (nothing was left behind)", path, what, strerror(-r));
	return r;
}

int key_load(uint8_t key[KEY_BYTES], const char *path, char *err, size_t errlen)
{
	/* One byte more than a key, so one read tells a file that grew after
	 * fstat from a good one. */
	uint8_t buf[KEY_BYTES + 1];
	struct stat st;
	ssize_t n;
	int r = 0;

	/* O_NONBLOCK: opening a FIFO must not wait for a writer; fstat below
	 * refuses it. It changes nothing for a regular file. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0) {
		r = -errno;
		if (r == -ENOENT)
			snprintf(err, errlen, "%s: no such file (create the cluster key with `pstrain keygen %s` "
				 "and copy it to every node)", path, path);
		else
			snprintf(err, errlen, "%s: cannot open: %s", path, strerror(-r));
		return r;
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		snprintf(err, errlen, "%s: cannot stat: %s", path, strerror(-r));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		r = -EINVAL;
		snprintf(err, errlen, "%s: is %s, not a key file", path, file_kind(st.st_mode));
		goto out;
	}
	/* Root too: see net/key.h. */
	if (st.st_uid != geteuid()) {
		r = -EPERM;
		snprintf(err, errlen, "%s: owned by uid %u, not by this user (uid %u); run chown %u %s",
			 path, (unsigned)st.st_uid, (unsigned)geteuid(), (unsigned)geteuid(), path);
		goto out;
	}
	if (st.st_mode & 077) {
		r = -EPERM;
		snprintf(err, errlen, "%s: permissions %04o are too open; run chmod 600 %s",
			 path, (unsigned)(st.st_mode & 07777), path);
		goto out;
	}
	if (st.st_size != KEY_BYTES) {
		r = -EINVAL;
		snprintf(err, errlen, "%s: %lld bytes, expected exactly %d (a raw key as written by pstrain keygen)",
			 path, (long long)st.st_size, KEY_BYTES);
		goto out;
	}
	do
		n = read(fd, buf, sizeof(buf));
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		r = -errno;
		snprintf(err, errlen, "%s: cannot read: %s", path, strerror(-r));
		goto out;
	}
	if (n != KEY_BYTES) {
		r = -EINVAL;
		snprintf(err, errlen, "%s: read %zd bytes, expected exactly %d (did the file change while being read?)",
			 path, n, KEY_BYTES);
		goto out;
	}
	memcpy(key, buf, KEY_BYTES);

out:
	sodium_memzero(buf, sizeof(buf));
	close(fd);
	return r;
}

int key_load_guarded(uint8_t **key, const char *path, char *err, size_t errlen)
{
	uint8_t *k = sodium_malloc(KEY_BYTES);
	if (!k) {
		snprintf(err, errlen, "%s: out of memory for the key", path);
		return -ENOMEM;
	}
	int r = key_load(k, path, err, errlen);
	if (r == 0 && sodium_mprotect_readonly(k) != 0) {
		r = -errno;
		snprintf(err, errlen, "%s: cannot make the key's memory read-only: %s", path,
			 strerror(-r));
	}
	if (r) {
		sodium_free(k);
		return r;
	}
	*key = k;
	return 0;
}

void key_free(uint8_t *key)
{
	sodium_free(key); /* makes it writable, wipes (sodium_munlock), unmaps */
}
