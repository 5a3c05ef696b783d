/* A checkpoint's manifest: the text file naming what a step directory
 * holds. checkpoint.c writes it last (its presence makes a step complete)
 * and reads it before anything else. */
#ifndef PSTRAIN_MANIFEST_H
#define PSTRAIN_MANIFEST_H

#include <stdio.h>

#include "checkpoint.h"

#define CKPT_MAGIC "pstrain checkpoint 1"
#define CKPT_MANIFEST "manifest"   /* a cluster's: manifest-K-of-N, one per ps */

/* What manifest_fill writes: mf, all of its shards (k < 0) or shard k
 * only (a ps's own manifest-K-of-N). */
struct manifest_arg {
	const struct ckpt_manifest *mf;
	int k;
};

/* Writes the manifest's text and its closing checksum line to f (a
 * write_durable callback: arg is a struct manifest_arg). */
int manifest_fill(FILE *f, const void *arg, char *err, size_t errlen);

/* Reads and checks stepdir/manifest, or for a cluster checkpoint every
 * stepdir/manifest-K-of-N (all must be present and agree): syntax, each
 * file's own checksum, that the shards tile [0, P). Does not read the
 * shard files. */
int manifest_read(struct ckpt_manifest *mf, const char *stepdir, char *err, size_t errlen);

/* N from the "manifest-0-of-N" in stepdir (a cluster checkpoint), or 0. */
int manifest_nshards(const char *stepdir);

#endif
