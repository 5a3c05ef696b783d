/* See owndir.h. */
#include "owndir.h"

#include "err.h"

#include <errno.h>
#include <unistd.h>

int owndir_check(const struct stat *st, const char *dir, mode_t forbid, char *err, size_t errlen)
{
	if (!S_ISDIR(st->st_mode))
		return err_set(err, errlen, -ENOTDIR, "%s is not a directory", dir);
	if (st->st_uid != geteuid())
		return err_set(err, errlen, -EPERM, "%s belongs to uid %u, not to this process's %u", dir,
			       (unsigned)st->st_uid, (unsigned)geteuid());
	if (!(st->st_mode & forbid))
		return 0;
	/* Read bits in forbid: the directory's names and what they lead to
	 * are private. Write bits only: others may look, not plant. */
	if (forbid & 044)
		return err_set(err, errlen, -EPERM, "%s may be entered by others (mode %03o, want %03o)", dir,
			       (unsigned)(st->st_mode & 0777), (unsigned)(0777 & ~forbid));
	return err_set(err, errlen, -EPERM,
		       "%s may be written by others (mode %03o, want no write bit for group or others)", dir,
		       (unsigned)(st->st_mode & 0777));
}
