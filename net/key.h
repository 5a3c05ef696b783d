/* The cluster key: one secret shared by every node of a cluster, from which
 * the handshake (net/handshake.c, later) proves membership and derives the
 * session keys. This module only creates the key file and reads it back,
 * refusing files that are not safe to trust; it never prints or exits.
 *
 * File format: exactly KEY_BYTES (32) raw bytes, nothing else: no header, no
 * newline, no text encoding. Raw bytes make "wrong size" a single check and
 * leave nothing to parse; `xxd -p cluster.key` shows it when needed.
 *
 * Rules key_load enforces (like ssh with a private key):
 *   - the path (after symlinks) is a regular file of exactly 32 bytes;
 *   - no permission bits for group or others (mode & 077 == 0): 0600 and 0400
 *     are fine, 0640 or 0604 are refused with "run chmod 600 FILE";
 *   - it is owned by the effective user. Root is not exempt: a key owned by
 *     another user can be read and replaced by that user, so a root process
 *     would be trusting them with the cluster (in a container with a bind
 *     mount, `chown` the key to root or run as its owner).
 *
 * Errors: 0 on success, else a negative errno and one line in err naming the
 * file:
 *   -ENOENT  missing (key_load), or a missing directory (key_generate)
 *   -EEXIST  key_generate: the file exists (it never overwrites)
 *   -EINVAL  not a regular file, or not exactly 32 bytes
 *   -EPERM   permissions too open, or owned by another user
 *   other    what open/read/write/fsync/close reported (-EACCES, -ENOSPC...) */
#ifndef PSTRAIN_NET_KEY_H
#define PSTRAIN_NET_KEY_H

#include <stddef.h>
#include <stdint.h>

#define KEY_BYTES 32
#define KEY_ERR_MAX 1024

/* Writes KEY_BYTES fresh random bytes (libsodium's randombytes_buf; call
 * sodium_init() first) to a new file at path with mode 0600 whatever the
 * umask, fsync'd. Fails with -EEXIST if anything, even a dangling symlink, is
 * already at path. On a failure after the file was created it is removed. */
__attribute__((warn_unused_result))
int key_generate(const char *path, char *err, size_t errlen);

/* Reads the key at path into key after the checks above. key is written only
 * on success; the local copy is wiped on every path. A process that keeps
 * the key uses key_load_guarded. */
__attribute__((warn_unused_result))
int key_load(uint8_t key[KEY_BYTES], const char *path, char *err, size_t errlen);

/* key_load into memory of the key's own, for as long as a process holds the
 * key: sodium_malloc'd (guard pages on both sides and a canary; excluded
 * from core dumps by MADV_DONTDUMP; mlocked, so never written to swap, as
 * far as RLIMIT_MEMLOCK allows: see key.c) and read-only once loaded, so a
 * stray write faults instead of changing the key. *key is set only on
 * success; key_free it. -ENOMEM if the memory cannot be had, else
 * key_load's errors. */
__attribute__((warn_unused_result))
int key_load_guarded(uint8_t **key, const char *path, char *err, size_t errlen);

/* Wipes and frees a key_load_guarded key. Accepts NULL. */
void key_free(uint8_t *key);

#endif
