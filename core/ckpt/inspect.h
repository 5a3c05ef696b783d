/* Checkpoint inspection for `pstrain check --checkpoint`. */
#ifndef PSTRAIN_INSPECT_H
#define PSTRAIN_INSPECT_H

#include <stdio.h>

#include "../config/config.h"

/* Every tensor of the checkpoint in stepdir, reassembled from the shard
 * files alone (no config needed), one line each in name order: name,
 * shape, element count and the BLAKE2b-256 of its float32 little-endian
 * bytes. Returns 0, or a negative errno with the file and reason in err. */
int inspect_checkpoint(FILE *f, const char *stepdir, char *err, size_t errlen);

/* Whether the checkpoint in stepdir restores into config c: one line,
 * "restores into CONFIG: yes ..." (as `local` and as the config's cluster,
 * and where that leaves the run: which step of how many, or finished) or
 * "restores into CONFIG: no: REASON" (checkpoint_fits's). Returns 0 when
 * it restores, 1 when it does not, a negative errno when the question
 * could not be answered (a config whose model or data does not load). */
int inspect_fit(FILE *f, const char *stepdir, const struct config *c, char *err, size_t errlen);

#endif
