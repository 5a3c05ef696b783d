/* What checkpoint.c (writing) and ckpt_read.c (reading) share about step
 * directories and layouts; not an API for anyone else (checkpoint.h is). */
#ifndef PSTRAIN_CORE_CKPT_DIR_H
#define PSTRAIN_CORE_CKPT_DIR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <sodium.h>

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

/* Metadata entry m[*n] = key, the value printf'd; *n moves on. */
void ckpt_meta_set(struct st_meta *m, int *n, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Writes path.part with fill(f, arg), syncs it and renames it to path. */
int ckpt_write_durable(const char *path, int (*fill)(FILE *, const void *, char *, size_t), const void *arg,
		       char *err, size_t errlen);

/* A safetensors file's contents, for ckpt_fill_st (a ckpt_write_durable
 * fill: safetensors_write of them). */
struct ckpt_st_file {
	const struct st_tensor *t;
	int nt;
	const struct st_meta *meta;
	int nmeta;
};
int ckpt_fill_st(FILE *f, const void *arg, char *err, size_t errlen);

/* BLAKE2b-256 and size of the file at path, read in pieces. */
int ckpt_hash_file(const char *path, uint8_t sum[CKPT_HASH_BYTES], uint64_t *bytes, char *err, size_t errlen);

/* The tables' count: fields, or 1 when shared. */
int ckpt_table_count(const struct ckpt_tables *t);

/* The rows [*lo, *hi) of table j (its own numbering) that global rows
 * [r0, r1) hold; 0 if none. */
int ckpt_table_part(const struct ckpt_tables *t, int j, uint64_t r0, uint64_t r1, uint64_t *lo, uint64_t *hi);

/* "embedding 26 1000 16 shared": the tables as the config's layer says
 * them; "no embedding tables". */
void ckpt_tables_text(char *out, size_t len, const struct ckpt_tables *t);

/* A rows file's metadata (st, read from path): pstrain.rows must be
 * manifest entry m's range; *t its pstrain.embedding_optim_t. */
int ckpt_rows_meta(const struct safetensors *st, const char *path, const struct ckpt_shard *m, long *t,
		   char *err, size_t errlen);

/* A tensor of a checkpoint as `check --checkpoint` prints it: its whole
 * shape and the BLAKE2b-256 of all its float32 bytes. */
struct ckpt_summary {
	char name[ST_NAME_MAX];
	int ndim;
	uint64_t shape[ST_MAX_DIMS];
	uint64_t n;
	uint8_t sum[CKPT_HASH_BYTES];
};

/* The tables of manifest mf (of stepdir), reassembled as their rows files
 * stream by (none held in memory): a line per rows file to f, saying
 * which tables and rows it holds, and a summary per table tensor appended
 * to *out (realloc'd; *n entries) (inspect_rows.c). */
int ckpt_rows_inspect(FILE *f, const char *stepdir, const struct ckpt_manifest *mf, struct ckpt_summary **out,
		      int *n, char *err, size_t errlen);

/* Writer k's rows file (rows: its rows of l's tables, step `step`) into
 * dir as rows-K-of-N.safetensors, durably; its manifest line into out
 * (ckpt_rows.c). */
int ckpt_rows_write(const char *dir, const struct ckpt_layout *l, int k, long step, const struct ckpt_rows *rows,
		    struct ckpt_shard *out, char *err, size_t errlen);

/* Whether the tables of manifest mf (of stepdir) are l's: 0, or -EINVAL
 * with one line that says how they differ; resume: the optimizer too. */
int ckpt_tables_fit(const char *stepdir, const struct ckpt_manifest *mf, const struct ckpt_layout *l, int resume,
		    char *err, size_t errlen);

/* checkpoint_load_rows with stepdir's manifest mf read already. */
int ckpt_rows_load(const char *stepdir, const struct ckpt_manifest *mf, const struct ckpt_layout *l, int resume,
		   struct ckpt_rows_load *rl, char *err, size_t errlen);

/* A checkpoint file read once from start to end and hashed on the way
 * (ckpt_rows.c), so that a file larger than memory is checked without
 * being held: a rows file. */
struct ckpt_stream {
	FILE *f;
	const char *path;
	uint64_t pos, size;
	crypto_generichash_state h;
	unsigned char *buf;
};

/* Opens path, which manifest entry m lists, checks its size and reads its
 * header into st (safetensors_read_head: the caller frees st). Then
 * ckpt_stream_close, whatever this returned. */
int ckpt_stream_open(struct ckpt_stream *s, const char *path, const struct ckpt_shard *m, struct safetensors *st,
		     char *err, size_t errlen);

/* The next n bytes into dst (NULL: read and dropped, in pieces), hashed
 * into the file's hash and, if not NULL, into also. */
int ckpt_stream_take(struct ckpt_stream *s, uint64_t n, void *dst, crypto_generichash_state *also, char *err,
		     size_t errlen);

/* Unless e: the rest of the file, and its hash against m's (a mismatch is
 * -EINVAL, "checksum mismatch"). Closes s; returns e or that. */
int ckpt_stream_close(struct ckpt_stream *s, const struct ckpt_shard *m, int e, char *err, size_t errlen);

/* A cluster step directory some ps has not finished (or never will). */
int ckpt_step_partial(const char *stepdir);

/* Its manifest reads and every file it lists has the listed size. */
int ckpt_step_complete(const char *stepdir);

/* Keeps the newest `keep` complete checkpoints (checkpoint.c says which go). */
void ckpt_rotate(const char *dir, int keep, FILE *log);

#endif
