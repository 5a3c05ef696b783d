/* A checkpoint's manifest: the text file naming what a step directory
 * holds. checkpoint.c writes it last (its presence makes a step complete)
 * and reads it before anything else. */
#ifndef PSTRAIN_MANIFEST_H
#define PSTRAIN_MANIFEST_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../config/config.h"   /* CONFIG_MAX_HOSTS, DATA_PATH_MAX */

#define CKPT_HASH_BYTES 32
#define CKPT_FILE_MAX 64
#define CKPT_PATH_MAX (DATA_PATH_MAX + 96)

struct ckpt_shard {
	size_t begin, end;               /* global range in P */
	uint64_t bytes;                  /* file size */
	char file[CKPT_FILE_MAX];
	uint8_t sum[CKPT_HASH_BYTES];    /* BLAKE2b-256 of the whole file */
};

/* The embedding tables a checkpoint holds (fields 0: none): per-field
 * tables of rows x dim laid end to end, or one shared table, and the
 * sparse optimizer whose state is stored with them (enum sparse_kind). */
struct ckpt_tables {
	int fields, rows, dim, shared;
	int optim;
};

/* The tables' global rows (all tables end to end, embed.h's R). */
uint64_t ckpt_tables_rows(const struct ckpt_tables *t);

struct ckpt_manifest {
	long step;
	size_t nparams;
	uint8_t model_hash[CKPT_HASH_BYTES];
	uint8_t layout_hash[CKPT_HASH_BYTES];
	uint8_t config_hash[CKPT_HASH_BYTES];
	int nshards;
	struct ckpt_shard shards[CONFIG_MAX_HOSTS];
	/* A model with embedding tables: their shape, and per writer K (one
	 * per shard) the file of its global rows [begin, end), which tile
	 * [0, ckpt_tables_rows) (an empty range has a file too). */
	struct ckpt_tables tables;
	struct ckpt_shard rows[CONFIG_MAX_HOSTS];
	/* The global batch its run trained with: `slices` slices of
	 * `batch_size` samples a step (config_slices); 0 and 0 in a manifest
	 * written before the line existed (not recorded). */
	int slices, batch;
};


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
 * file's own checksum, that the shards tile [0, P) and the rows files the
 * tables' rows. Does not read the shard files. */
int manifest_read(struct ckpt_manifest *mf, const char *stepdir, char *err, size_t errlen);

/* N from the "manifest-0-of-N" in stepdir (a cluster checkpoint), or 0. */
int manifest_nshards(const char *stepdir);

#endif
