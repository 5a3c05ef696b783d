/* Whether a directory is this process's user's alone to change: the one
 * rule for the directories pstrain puts things in that others must not
 * plant or swap: `[cluster] socket_dir` (net/privdir.c, the ps's Unix socket)
 * and `[train] log_dir` (core/tblog.c, TensorBoard event files). Each
 * caller gets the stat itself (lstat of the name, or fstat of a descriptor
 * opened with O_NOFOLLOW) and says which mode bits others must not have.
 * Only the directory is checked, not its parents. */
#ifndef PSTRAIN_BASE_OWNDIR_H
#define PSTRAIN_BASE_OWNDIR_H

#include <stddef.h>
#include <sys/stat.h>

/* st: the directory dir's. 0 when it is a directory (a link is not),
 * owned by this process's effective user, and has none of the bits in
 * forbid: 077 keeps everyone else out ("DIR may be entered by others (mode
 * 755, want 700)"), 022 keeps everyone else from adding, removing or
 * replacing names in it ("DIR may be written by others (mode 775, want no
 * write bit for group or others)"). Else -ENOTDIR or -EPERM with one line
 * in err. */
int owndir_check(const struct stat *st, const char *dir, mode_t forbid, char *err, size_t errlen);

#endif
