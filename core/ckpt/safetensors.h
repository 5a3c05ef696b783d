/* The safetensors file format (https://github.com/huggingface/safetensors),
 * float32 only: an 8-byte little-endian header length N, N bytes of JSON
 *   {"__metadata__": {"key": "value", ...},
 *    "name": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [b, e]}, ...}
 * padded with spaces to a multiple of 8, then the tensor bytes, each tensor
 * at [b, e) of that data area, back to back in header order.
 *
 * This module knows the format and nothing about checkpoints: checkpoint.c
 * decides what goes in, where the file lives and how it is made durable.
 * The reader is strict (it parses untrusted files): every offset is checked
 * against the file size, tensors must tile the data area without gaps or
 * overlap, shapes must match byte counts, and anything unexpected in the
 * JSON is an error rather than skipped. */
#ifndef PSTRAIN_SAFETENSORS_H
#define PSTRAIN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define ST_NAME_MAX 96
#define ST_META_MAX 256     /* key or value length, including the NUL */
#define ST_MAX_DIMS 4
/* A header longer than this is refused before it is read (a corrupt length
 * field must not make the reader allocate gigabytes). */
#define ST_HEADER_MAX (16u << 20)

struct st_tensor {
	char name[ST_NAME_MAX];
	int ndim;
	uint64_t shape[ST_MAX_DIMS];
	uint64_t n;              /* elements: product of shape (1 for ndim 0) */
	const float *data;       /* writer: n floats to write; reader: see safetensors_copy */
	uint64_t begin;          /* reader: byte offset in the data area */
};

struct st_meta {
	char key[ST_META_MAX];
	char value[ST_META_MAX];
};

/* Writes the file to f: header then tensors in array order. Names and
 * metadata must be printable ASCII without '"' or '\\' (what pstrain
 * produces); anything else is -EINVAL. Returns 0, -EINVAL or -EIO with one
 * line in err. The caller flushes and syncs f. */
int safetensors_write(FILE *f, const struct st_tensor *t, int nt, const struct st_meta *meta,
		      int nmeta, char *err, size_t errlen);

/* A parsed file held in memory, or only its header (safetensors_read_head). */
struct safetensors {
	unsigned char *buf;      /* the whole file, or its first held bytes */
	size_t len;              /* the file's size */
	size_t held;             /* bytes of it in buf: len, or data0 after safetensors_read_head */
	size_t data0;            /* where the data area starts in buf */
	struct st_tensor *t;     /* in header order */
	int nt;
	struct st_meta *meta;
	int nmeta;
};

/* Parses buf[0..len) (taking ownership of buf, which must come from
 * malloc; it is freed by safetensors_free even on failure). name is used in
 * messages. Returns 0, -EINVAL (not a valid float32 safetensors file, with
 * the reason) or -ENOMEM. On failure *s is left freeable. */
int safetensors_parse(struct safetensors *s, unsigned char *buf, size_t len, const char *name,
		      char *err, size_t errlen);
void safetensors_free(struct safetensors *s);   /* accepts NULL and zeroed structs */

/* The header alone of a file of size bytes open as f, read from its
 * current position (its start): the length and the JSON, parsed and
 * checked against size as safetensors_parse checks them against the whole
 * file (offsets, tiling, shapes), without reading the tensors. f is left
 * at the data area (s->data0); buf then holds the s->data0 bytes read, for
 * a caller that hashes the file, and the caller reads the tensors it wants
 * itself (tensor t's bytes start at file offset data0 + t->begin): a file
 * larger than memory is never held. safetensors_copy does not apply.
 * Returns as safetensors_parse (-EIO: f could not be read). */
int safetensors_read_head(struct safetensors *s, FILE *f, uint64_t size, const char *name, char *err,
			  size_t errlen);

const struct st_tensor *safetensors_find(const struct safetensors *s, const char *name);
const char *safetensors_meta(const struct safetensors *s, const char *key);   /* NULL if absent */

/* Copies elements [from, from + count) of tensor t (row-major) to out. The
 * caller checks the range against t->n; s holds the whole file
 * (safetensors_parse). */
void safetensors_copy(const struct safetensors *s, const struct st_tensor *t, uint64_t from,
		      uint64_t count, float *out);

#endif
