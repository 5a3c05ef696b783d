/* A directory that is this user's alone, all the way from "/": where the
 * ps's Unix sockets live, whose frames are not encrypted (docs/SECURITY.md,
 * "A ps on the same host"). The directory itself must be a real directory
 * (not a link), owned by the effective user, mode 700; and no other user
 * may change what its name resolves to: each directory the path goes
 * through (those of the current directory too, for a relative one) is the
 * user's or root's and writable by no one else unless sticky (like /tmp:
 * others may add names there but not move or remove ours), and each link
 * on the way is the user's or root's, its target checked the same way.
 * A parent others may write lets them swap the checked directory for
 * theirs between the check and the bind or connect; a link of theirs, the
 * same by repointing it.
 *
 * Checked by name, once, before each use: the caller binds or connects by
 * the same name right after. Errors: 0 or a negative errno with one line
 * naming the directory or the parent at fault and why. */
#ifndef PSTRAIN_NET_PRIVDIR_H
#define PSTRAIN_NET_PRIVDIR_H

#include <stddef.h>

/* Makes dir (mode 700) if it is missing, then checks it and its parents as
 * above: "DIR may be entered by others (mode 755, want 700)", "/a/b, a
 * parent of DIR, may be written by others (mode 777, not sticky)".
 * Trailing slashes are ignored (so "L/" is the link L, refused); a dir
 * ending in "." or ".." is -EINVAL; one too long for a Unix socket path
 * in it, -ENAMETOOLONG. */
int privdir_make(const char *dir, char *err, size_t errlen);

#endif
