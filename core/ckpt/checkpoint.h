/* Checkpoints on disk: the directory layout, the manifest, durable
 * publishing, rotation, and finding and loading the newest usable one.
 * docs/CHECKPOINTS.md is the user's description of the same.
 *
 *   checkpoint_dir/step-NNNNNNNN/manifest
 *   checkpoint_dir/step-NNNNNNNN/shard-K-of-N.safetensors   (K = 0..N-1)
 *
 * Shard file K holds the parameters of global range [begin, end) of the
 * flat vector P and the optimizer state over the same range; `local` writes
 * one shard covering all of P. A tensor wholly inside the range is stored
 * under its name with its full (PyTorch) shape; a tensor that straddles a
 * shard boundary is stored under its name as a flat 1-D part, with
 * __metadata__ "pstrain.part.NAME" = "LO:HI/D0xD1..." giving the part's
 * element range in the row-major tensor and the full shape. Optimizer
 * moments are the tensors "optim.m.NAME" and "optim.v.NAME" stored the same
 * way; the optimizer's step count t and the training step are metadata.
 *
 * A model's embedding tables (embed.h: R rows of DIM, outside P) are stored
 * beside the shards, by row: writer K's global rows [r0, r1) and the sparse
 * optimizer's state over them in rows-K-of-N.safetensors, each table it
 * holds whole as "embedding1.J.weight" (ROWS, DIM) ("embedding1.weight"
 * when shared), and a table it holds part of as the rows it holds, with
 * the same "pstrain.part.NAME" metadata (element offsets in the whole
 * table); the manifest lists the files and their row ranges, which tile
 * [0, R). Any range of rows loads from any number of writers
 * (checkpoint_load_rows), reading only the files that hold some of it and
 * holding only the rows asked for (ckpt_rows.c).
 *
 * A checkpoint is written into checkpoint_dir/.tmp-step-NNNNNNNN-PID/, each
 * file to a ".part" name, fsync'd and renamed; the manifest last; then the
 * directory is fsync'd and renamed to step-NNNNNNNN and checkpoint_dir is
 * fsync'd. A crash at any point leaves either no step directory or a
 * complete one, and never touches an existing one. */
#ifndef PSTRAIN_CHECKPOINT_H
#define PSTRAIN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../config/config.h"
#include "manifest.h"
#include "../nn/model.h"
#include "../nn/optim.h"
#include "../nn/sparse_optim.h"
#include "safetensors.h"
#include "../shard.h"
#include "../../base/hooks.h"


/* What a run's checkpoints must agree on to be resumed: the model's tensors
 * (names, offsets, shapes), the shard plan and the optimizer kind; and the
 * writer's test hooks. */
struct ckpt_layout {
	struct tensor_info t[MODEL_MAX_TENSORS];
	int nt;
	size_t nparams;
	struct shard shards[CONFIG_MAX_HOSTS];
	int nshards;
	enum optim_kind optim;
	uint8_t model_hash[CKPT_HASH_BYTES];    /* tensors only */
	uint8_t layout_hash[CKPT_HASH_BYTES];   /* tensors + shard plan + optimizer kind */
	uint8_t config_hash[CKPT_HASH_BYTES];   /* config_hash(), recorded for information */
	int async;                              /* an async cluster's: "mode async" in layout_hash */
	int cluster;                            /* a cluster's (ckpt_layout_init_cluster), not local's */
	struct test_hooks hooks;                /* the writer's (base/hooks.h) */
	/* The model's embedding tables (fields 0: none), their layer's name
	 * ("embedding1", the tensors' prefix) and their optimizer (the
	 * config's [train] embedding_optimizer). */
	struct ckpt_tables tables;
	char table_layer[TENSOR_NAME_MAX];
	/* The run's global batch, recorded in the manifest: slices of a step
	 * (config_slices: local's, or a cluster's) and batch_size. A resume
	 * may change it (checkpoint_batch_note says so). */
	int slices, batch;
};

/* nshards = 1 for `local`, [cluster] ps count for a cluster. */
int ckpt_layout_init(struct ckpt_layout *l, const struct model *m, int nshards, const struct config *c,
		     char *err, size_t errlen);

/* A ps's layout: as ckpt_layout_init, and in async mode the layout hash
 * also covers the line "mode async", so an async cluster never resumes a
 * sync checkpoint or the reverse (their steps count different things:
 * sync steps, async pushes per shard). */
int ckpt_layout_init_cluster(struct ckpt_layout *l, const struct model *m, int nshards,
			     const struct config *c, char *err, size_t errlen);


/* A writer's rows of the embedding tables: global rows [r0, r1) of the R
 * rows of all tables end to end (embed.h's order: table J's row i is
 * global row J * ROWS + i), and the sparse optimizer's state over the
 * same rows. Written straight from these arrays, never copied whole. */
struct ckpt_rows {
	uint64_t r0, r1;
	const float *table;   /* (r1 - r0, DIM) */
	const float *m, *v;   /* (r1 - r0, DIM) each: adagrad's accumulator in m (v NULL), lazy_adam's moments */
	long t;               /* the sparse optimizer's steps (struct sparse_optim's t) */
};

/* One shard's state as saved: arrays over the shard's range; m and v may
 * be NULL when the optimizer has no such state (sgd has neither). */
struct ckpt_state {
	const float *params;
	const float *m, *v;
	long t;
	const double *test_acc;   /* the run's final test accuracy in [0,1]; NULL: none (not final) */
	const struct ckpt_rows *rows;   /* the model has tables: this writer's rows of them (every
					 * writer has an entry, their ranges tile [0, R) in order of
					 * K; a range may be empty); NULL without tables */
};

/* Saves st[0..l->nshards) as checkpoint `step` under dir (created if
 * missing), then deletes all but the newest `keep` complete checkpoints.
 * If step-NNNNNNNN already exists and is complete, nothing is written
 * (a resumed run reaching a step it already saved). A line per action goes
 * to log (may be NULL). Returns 0 or a negative errno with one line in err.
 *
 * Test hook (test builds only, base/hooks.h): PSTRAIN_CKPT_CRASH names a
 * point ("shard" after the first shard file, "manifest" before the
 * manifest, "publish" before the rename into place), optionally as
 * "POINT:STEP" to hit only the save of STEP, where the process kills
 * itself with SIGKILL, as a power cut would stop it. */
int checkpoint_save(const char *dir, const struct ckpt_layout *l, long step, const struct ckpt_state *st,
		    int keep, FILE *log, char *err, size_t errlen);

/* A ps's part of cluster checkpoint `step`: shard k's file, with tables
 * its rows file (st->rows: rows [r0, r1), the writer entry point for a
 * ps's shard of the tables), and its own
 * manifest "manifest-K-of-N" (written last, after the files are synced) in
 * dir/step-NNNNNNNN/, which all ps tasks share. The checkpoint is complete
 * when all N manifests are present and agree; until then readers ignore
 * it. Nothing is written if this shard's manifest already exists, unless
 * redo is set and the step is not complete: then this shard's part is
 * written again (async: a part left from before a rollback belongs to
 * another history than the other shards' parts will). Then rotates as
 * checkpoint_save does. Same crash points ("shard" is not one: there is a
 * single file before the manifest). Test hook (test builds only):
 * PSTRAIN_CKPT_DELAY_MS=N makes it sleep N ms before writing, as a slow
 * disk would. */
int checkpoint_save_shard(const char *dir, const struct ckpt_layout *l, long step, int k,
			  const struct ckpt_state *st, int redo, int keep, FILE *log, char *err,
			  size_t errlen);


/* What a load fills: the global range [begin, end) of the parameters and,
 * where m and v are not NULL, the optimizer's moments over it (each
 * end - begin floats), from a checkpoint of any shard layout (local, or
 * any number of ps tasks): each tensor's elements are found, by name,
 * in whichever shard files hold them. The model must be the same (tensor
 * names and shapes; a refusal names the first tensor that differs).
 * resume: the optimizer kind must be the same too (eval and predict read
 * parameters only). The load sets step (the checkpoint's, a step of the
 * run in every mode: docs/CHECKPOINTS.md), t (the optimizer's update
 * count; -1 where the files hold none or disagree, as the shards of an
 * async checkpoint read into another layout do), async (the checkpoint
 * was an async cluster's; -1 unknown) and test_acc (the run's final test
 * accuracy when this is a final checkpoint that recorded it, else -1). */
struct ckpt_rows_load;
struct ckpt_load {
	const struct ckpt_layout *l;
	int resume;
	size_t begin, end;
	float *params, *m, *v;
	long t, step;   /* out */
	int async;      /* out */
	double test_acc;/* out */
	int slices, batch;   /* out: the checkpoint's global batch (manifest); 0: not recorded */
	struct ckpt_rows_load *rows;   /* rows of the tables to load as well (checkpoint_load_rows);
					* NULL: none (the tables' shape is checked all the same) */
};

/* Global rows [a, b) of a checkpoint's tables (a <= b <= R) into table,
 * and where m and v are not NULL the sparse optimizer's state over them;
 * t: out, its steps (-1 where the files read disagree). */
struct ckpt_rows_load {
	uint64_t a, b;
	float *table;   /* (b - a, DIM) */
	float *m, *v;   /* (b - a, DIM) each, or NULL: not read */
	long t;
};

/* What a checkpoint was written by, from its manifest and the model it is
 * compared with. */
struct ckpt_info {
	long step;
	size_t nparams;
	int nshards;            /* shard files */
	int cluster;            /* one manifest per ps (a cluster's), or local's one */
	int model_same;         /* its tensors are those of the layout's model */
	int known;              /* model_same and its layout hash is one this model can have: optim, async set */
	enum optim_kind optim;
	int async;
	struct ckpt_shard shards[CONFIG_MAX_HOSTS];
};

/* Reads stepdir's manifest into *out, comparing it with layout l. Returns
 * 0, or a negative errno with the reason in err (as manifest_read). */
int checkpoint_describe(const char *stepdir, const struct ckpt_layout *l, struct ckpt_info *out,
			char *err, size_t errlen);

/* Whether the checkpoint in stepdir (described by in) restores into a run
 * of layout l: 0, or -EINVAL with one line in err that says which tensor
 * or setting differs and what to do. Reads the shard files only when the
 * model differs, to name the tensor. */
int checkpoint_fits(const char *stepdir, const struct ckpt_info *in, const struct ckpt_layout *l,
		    char *err, size_t errlen);

/* Loads ld from the checkpoint in stepdir, reassembling tensors across
 * shard files; each file read is checked against its manifest checksum.
 * Returns 0 or -EINVAL with the file and reason in err. */
int checkpoint_load(const char *stepdir, struct ckpt_load *ld, char *err, size_t errlen);

/* Rows rl->a..rl->b of the tables of the checkpoint in stepdir, from a
 * checkpoint written by any number of writers, each holding any rows:
 * only the rows files that hold some of [a, b) are read, each streamed
 * once (its checksum checked as it goes, the rows asked for read straight
 * into rl's arrays), so memory holds the rows asked for and a buffer, never
 * a file. The tables' shape (fields, rows, dim, shared) must be l's;
 * resume: their optimizer too. On failure rl's arrays may hold part of the
 * rows: load into scratch where the old values must survive a refusal.
 * Returns 0 or -EINVAL (-ENOMEM, -EIO) with the file and reason in err. */
int checkpoint_load_rows(const char *stepdir, const struct ckpt_layout *l, int resume, struct ckpt_rows_load *rl,
			 char *err, size_t errlen);

/* Whether the checkpoint in stepdir, trained with `slices` slices of
 * `batch` samples a step (a load's slices and batch), had another global
 * batch than l's run: 1 with one line in line (no newline) that says both
 * and what it means, else 0 (the same, or slices 0: a manifest that does
 * not record it). Not a refusal: a resume may change the batch
 * (docs/CHECKPOINTS.md), but its data order and result then differ from
 * an uninterrupted run's. */
int checkpoint_batch_note(const struct ckpt_layout *l, int slices, int batch, const char *stepdir, char *line,
			  size_t len);

/* The newest checkpoint under dir that loads (as checkpoint_load), trying
 * older ones after a refusal; each refusal is one line on log (may be
 * NULL). Returns 0; -ENOENT when dir holds no checkpoint at all (err says
 * so); -EINVAL when every checkpoint was refused (err names the newest and
 * why). */
int checkpoint_restore(const char *dir, struct ckpt_load *ld, FILE *log, char *err, size_t errlen);

/* As checkpoint_restore, considering only steps <= upto. */
int checkpoint_restore_upto(const char *dir, long upto, struct ckpt_load *ld, FILE *log, char *err,
			    size_t errlen);

/* dir/step-NNNNNNNN, the directory of checkpoint `step` under dir: the one
 * place that spells a step directory's name. */
void checkpoint_step_dir(char *out, size_t len, const char *dir, long step);

/* DIR may be a step directory (it has a manifest) or a checkpoint_dir, in
 * which case the newest complete step directory in it is chosen. Writes
 * the step directory's path to out. Returns 0, -ENOENT or -ENAMETOOLONG. */
int checkpoint_resolve(const char *dir, char *out, size_t outlen, char *err, size_t errlen);

/* Reads shard file k of stepdir (as the manifest mf lists it) and checks
 * it against the manifest: size, checksum, range. */
int checkpoint_shard_open(struct safetensors *st, const char *stepdir, const struct ckpt_manifest *mf,
			  int k, char *err, size_t errlen);

/* A pstrain.part.NAME value "LO:HI/D0xD1..." (the part [lo, hi) of a
 * tensor of that shape, stored flat): shape (room for ST_MAX_DIMS), ndim
 * and element count n.
 * Returns 0, or -EINVAL unless lo < hi <= n. */
int checkpoint_part_parse(const char *v, uint64_t *lo, uint64_t *hi, int *ndim,
			  uint64_t *shape, uint64_t *n);

/* Where a tensor stored in a shard file lies in the model tensor it is
 * (part of): elements [lo, hi) of a row-major tensor of shape
 * shape[0..ndim) and n elements. */
struct ckpt_part {
	uint64_t lo, hi, n;
	int ndim;
	uint64_t shape[ST_MAX_DIMS];
};

/* The part that stored tensor s of st (read from path) is: the whole
 * tensor, or what its pstrain.part.NAME metadata says. Returns 0, or
 * -EINVAL (the metadata does not parse, or does not match s's length)
 * with the path and key in err. */
int checkpoint_part_of(const struct safetensors *st, const struct st_tensor *s, const char *path,
		       struct ckpt_part *out, char *err, size_t errlen);

/* The name of table j of layout l ("embedding1.3.weight", or
 * "embedding1.weight" for a shared table) after prefix ("", "optim.m."). */
void checkpoint_table_name(char *out, size_t len, const struct ckpt_layout *l, const char *prefix, int j);

/* "512x784", "scalar": a shape as messages and `check --checkpoint` show
 * it. */
void checkpoint_shape_text(char *out, size_t len, int ndim, const uint64_t *shape);

#endif
