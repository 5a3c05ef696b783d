/* See privdir.h.
 *
 * The parents are walked from "/" one name at a time, as the kernel
 * resolves them (openat with O_NOFOLLOW, links read and followed by
 * hand), so that every directory and link a bind or connect by this name
 * goes through is the one checked; realpath() would check the directories
 * of the resolved path but not the links that lead there, nor the
 * directories those links live in.
 *
 * Rejected: binding through a directory descriptor (/proc/self/fd/N/...):
 * it pins the directory itself but not what a worker's connect resolves,
 * which is by name. And defaulting to $XDG_RUNTIME_DIR: what a ps and its
 * workers both find (a job step's environment need not have it) matters
 * more than where, and /tmp/pstrain-UID passes this check where /tmp is
 * root's and sticky, as it is everywhere. */
#include "privdir.h"
#include "../base/err.h"
#include "../base/owndir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* As the kernel's limit on links followed in one lookup. */
#define PRIVDIR_LINKS_MAX 40

static int owned_by_us_or_root(const struct stat *st)
{
	return st->st_uid == 0 || st->st_uid == geteuid();
}

/* Directory fd, at path `at` on the way to dir: the user's or root's, and
 * writable by no one else unless sticky. */
static int parent_check(int fd, const char *at, const char *dir, char *err, size_t errlen)
{
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		return err_set(err, errlen, -e, "%s, a parent of %s: %s", at, dir, strerror(e));
	}
	if (!owned_by_us_or_root(&st))
		return err_set(err, errlen, -EPERM, "%s, a parent of %s, belongs to uid %u (they could "
			       "put their own directory in its place)", at, dir, (unsigned)st.st_uid);
	if ((st.st_mode & 022) && !(st.st_mode & S_ISVTX))
		return err_set(err, errlen, -EPERM, "%s, a parent of %s, may be written by others (mode "
			       "%03o, not sticky: they could put their own directory in its place)", at,
			       dir, (unsigned)(st.st_mode & 0777));
	return 0;
}

/* at (the real path of the directory walked so far) with name added, or
 * with its last name taken off for "..". */
static void path_step(char *at, size_t cap, const char *name)
{
	size_t n = strlen(at);
	if (strcmp(name, "..") == 0) {
		while (n > 1 && at[n - 1] != '/')
			n--;
		at[n > 1 ? n - 1 : 1] = '\0';
		return;
	}
	snprintf(at + n, cap - n, "%s%s", n > 1 ? "/" : "", name);
}

/* A link on the way (name, in directory fd at `at`): the user's or
 * root's; its target, then what was left of the path, is walked next. */
static int link_follow(int fd, const char *at, const char *name, const struct stat *st,
		       char *todo, size_t cap, size_t *pos, const char *dir, char *err,
		       size_t errlen)
{
	char target[PATH_MAX], rest[PATH_MAX], path[PATH_MAX + NAME_MAX + 2];
	snprintf(path, sizeof path, "%s%s%s", at, strlen(at) > 1 ? "/" : "", name);
	if (!owned_by_us_or_root(st))
		return err_set(err, errlen, -EPERM, "%s, a link on the way to %s, belongs to uid %u (they "
			       "could point it at their own directory)", path, dir, (unsigned)st->st_uid);
	ssize_t k = readlinkat(fd, name, target, sizeof target - 1);
	if (k < 0) {
		int e = errno;
		return err_set(err, errlen, -e, "%s, on the way to %s: %s", path, dir, strerror(e));
	}
	target[k] = '\0';
	snprintf(rest, sizeof rest, "%s", todo + *pos);
	if ((size_t)snprintf(todo, cap, "%s/%s", target, rest) >= cap)
		return err_set(err, errlen, -ENAMETOOLONG, "%s, on the way to %s: too long once its "
			       "link is followed", path, dir);
	*pos = 0;
	return 0;
}

/* Walks parent (absolute) from "/" as a lookup would, checking every
 * directory and link on the way. */
static int parents_check(const char *parent, const char *dir, char *err, size_t errlen)
{
	char todo[2 * PATH_MAX], at[PATH_MAX] = "/", name[NAME_MAX + 1];
	size_t pos = 0;
	int links = 0;
	snprintf(todo, sizeof todo, "%s", parent);
	int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return err_set(err, errlen, -EIO, "cannot open /");
	int r = parent_check(fd, "/", dir, err, errlen);
	while (!r) {
		pos += strspn(todo + pos, "/");
		size_t n = strcspn(todo + pos, "/");
		if (n == 0)
			break;
		if (n > NAME_MAX) {
			r = err_set(err, errlen, -ENAMETOOLONG, "%s: a name longer than %u bytes", dir,
				    (unsigned)NAME_MAX);
			break;
		}
		memcpy(name, todo + pos, n);
		name[n] = '\0';
		pos += n;
		if (strcmp(name, ".") == 0)
			continue;
		struct stat st;
		if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			int e = errno;
			r = err_set(err, errlen, -e, "%s%s%s, a parent of %s: %s", at,
				    strlen(at) > 1 ? "/" : "", name, dir, strerror(e));
			break;
		}
		if (S_ISLNK(st.st_mode)) {
			if (++links > PRIVDIR_LINKS_MAX) {
				r = err_set(err, errlen, -ELOOP, "%s: more than %d links on the way", dir,
					    PRIVDIR_LINKS_MAX);
				break;
			}
			r = link_follow(fd, at, name, &st, todo, sizeof todo, &pos, dir, err, errlen);
			if (!r && todo[0] == '/') { /* an absolute target: from the top again */
				close(fd);
				fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
				snprintf(at, sizeof at, "/");
				if (fd < 0)
					return err_set(err, errlen, -EIO, "cannot open /");
			}
			continue;
		}
		int nfd = openat(fd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (nfd < 0) {
			int e = errno;
			r = err_set(err, errlen, -e, "%s%s%s, a parent of %s: %s", at,
				    strlen(at) > 1 ? "/" : "", name, dir, strerror(e));
			break;
		}
		close(fd);
		fd = nfd;
		path_step(at, sizeof at, name);
		r = parent_check(fd, at, dir, err, errlen);
	}
	close(fd);
	return r;
}

/* The directory dir (already without trailing slashes) is in: absolute,
 * from the current directory for a relative one. */
static int parent_of(char *out, size_t cap, const char *dir, char *err, size_t errlen)
{
	const char *slash = strrchr(dir, '/');
	char cwd[PATH_MAX];
	if (slash && dir[0] == '/') {
		size_t n = slash == dir ? 1 : (size_t)(slash - dir);
		snprintf(out, cap, "%.*s", (int)n, dir);
		return 0;
	}
	if (!getcwd(cwd, sizeof cwd)) {
		int e = errno;
		return err_set(err, errlen, -e, "%s: the current directory: %s", dir, strerror(e));
	}
	snprintf(out, cap, "%s/%.*s", cwd, slash ? (int)(slash - dir) : 0, dir);
	return 0;
}

int privdir_make(const char *dir, char *err, size_t errlen)
{
	struct stat st;
	struct sockaddr_un sun;
	char name[sizeof sun.sun_path]; /* a longer one could hold no socket */
	char parent[2 * PATH_MAX];
	/* lstat("L/") and lstat("L/.") follow a link L, so with the slash
	 * another user's link to some 700 directory of ours would pass, and
	 * they could point it at their own directory before we bind or
	 * connect. Check the name without trailing slashes, as a socket path
	 * in it resolves it, and refuse a last "." or "..". */
	size_t n = strlen(dir);
	while (n > 1 && dir[n - 1] == '/')
		n--;
	if (n >= sizeof name) {
		snprintf(err, errlen, "%s: longer than a Unix socket path may be", dir);
		return -ENAMETOOLONG;
	}
	memcpy(name, dir, n);
	name[n] = '\0';
	const char *last = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
	if (strcmp(last, ".") == 0 || strcmp(last, "..") == 0) {
		snprintf(err, errlen, "%s: name the directory itself, not . or ..", dir);
		return -EINVAL;
	}
	dir = name;
	int r = parent_of(parent, sizeof parent, dir, err, errlen);
	if (!r)
		r = parents_check(parent, dir, err, errlen);
	if (r)
		return r;
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		int e = errno;
		snprintf(err, errlen, "cannot make %s: %s", dir, strerror(e));
		return -e;
	}
	if (lstat(dir, &st) < 0) {
		int e = errno;
		snprintf(err, errlen, "%s: %s", dir, strerror(e));
		return -e;
	}
	/* The directory itself: the one rule it shares with log_dir. */
	return owndir_check(&st, dir, 077, err, errlen);
}
