/* What checkpoint.c (writing) and ckpt_read.c (reading) share about step
 * directories and layouts; not an API for anyone else (checkpoint.h is). */
#ifndef PSTRAIN_CORE_CKPT_DIR_H
#define PSTRAIN_CORE_CKPT_DIR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "checkpoint.h"

#define CKPT_MAX_STEP 99999999L   /* step-NNNNNNNN: 8 digits */

/* Steps of the step-* directories in dir, newest first, into *out
 * (malloc'd). Returns the count, or a negative errno (-ENOENT: no dir). */
int ckpt_list_steps(const char *dir, long **out);

/* The layout hash l's model has with nshards shards of the even plan,
 * optimizer kind optim and mode async (what a manifest records). */
void ckpt_hash_layout(const struct ckpt_layout *l, int nshards, enum optim_kind optim, int async,
		      uint8_t out[CKPT_HASH_BYTES]);

/* The part [lo, hi) of tensor t inside global range [b, e); 0 if none. */
int ckpt_tensor_part(const struct tensor_info *t, size_t b, size_t e, size_t *lo, size_t *hi);

/* pstrain.part.NAME's value: "LO:HI/D0xD1...". */
void ckpt_part_text(char *out, size_t len, size_t lo, size_t hi, int ndim, const int *shape);

/* A cluster step directory some ps has not finished (or never will). */
int ckpt_step_partial(const char *stepdir);

/* Its manifest reads and every file it lists has the listed size. */
int ckpt_step_complete(const char *stepdir);

/* Keeps the newest `keep` complete checkpoints (checkpoint.c says which go). */
void ckpt_rotate(const char *dir, int keep, FILE *log);

#endif
