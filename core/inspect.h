/* Checkpoint inspection for `pstrain check --checkpoint`. */
#ifndef PSTRAIN_INSPECT_H
#define PSTRAIN_INSPECT_H

#include <stdio.h>

/* Every tensor of the checkpoint in stepdir, reassembled from the shard
 * files alone (no config needed), one line each in name order: name,
 * shape, element count and the BLAKE2b-256 of its float32 little-endian
 * bytes. Returns 0, or a negative errno with the file and reason in err. */
int inspect_checkpoint(FILE *f, const char *stepdir, char *err, size_t errlen);

#endif
