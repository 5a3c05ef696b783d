/* `pstrain check --checkpoint`: every tensor of a checkpoint, reassembled
 * from its shard files alone (no config needed: the parts describe
 * themselves), printed with its shape and a hash, so that two checkpoints
 * or a checkpoint and tests/checkpoint_load.py can be compared. Reading and
 * checking the files is checkpoint.c's. */
#include "inspect.h"
#include "checkpoint.h"
#include "manifest.h"
#include "safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/err.h"

struct whole {
	char name[ST_NAME_MAX];
	int ndim;
	uint64_t shape[ST_MAX_DIMS];
	uint64_t n, filled;
	float *data;
};

static int by_name(const void *a, const void *b)
{
	return strcmp(((const struct whole *)a)->name, ((const struct whole *)b)->name);
}

int inspect_checkpoint(FILE *f, const char *stepdir, char *err, size_t errlen)
{
	struct ckpt_manifest *mf = malloc(sizeof(*mf));
	struct whole *w = NULL;
	int nw = 0, e;
	if (!mf)
		return err_set(err, errlen, -ENOMEM, "out of memory");
	e = manifest_read(mf, stepdir, err, errlen);
	for (int k = 0; k < mf->nshards && !e; k++) {
		struct safetensors st;
		char path[CKPT_PATH_MAX];
		snprintf(path, sizeof(path), "%s/%s", stepdir, mf->shards[k].file);
		e = checkpoint_shard_open(&st, stepdir, mf, k, err, errlen);
		for (int i = 0; i < st.nt && !e; i++) {
			const struct st_tensor *s = &st.t[i];
			struct whole part = { 0 };
			uint64_t lo = 0, hi = s->n;
			char key[ST_META_MAX];
			snprintf(key, sizeof(key), "pstrain.part.%s", s->name);
			const char *v = safetensors_meta(&st, key);
			if (v) {
				if (checkpoint_part_parse(v, &lo, &hi, &part.ndim, part.shape, &part.n) ||
				    hi - lo != s->n) {
					e = err_set(err, errlen, -EINVAL, "%s: bad %s \"%s\"", path, key, v);
					break;
				}
			} else {
				part.ndim = s->ndim;
				memcpy(part.shape, s->shape, sizeof(part.shape));
				part.n = s->n;
			}
			int j;
			for (j = 0; j < nw && strcmp(w[j].name, s->name); j++)
				;
			if (j == nw) {
				struct whole *g = realloc(w, (size_t)(nw + 1) * sizeof(*w));
				if (!g) {
					e = err_set(err, errlen, -ENOMEM, "out of memory");
					break;
				}
				w = g;
				w[nw] = part;
				snprintf(w[nw].name, sizeof(w[nw].name), "%s", s->name);
				w[nw].data = malloc(part.n ? part.n * sizeof(float) : 1);
				w[nw].filled = 0;
				nw++;
				if (!w[j].data) {
					e = err_set(err, errlen, -ENOMEM, "out of memory");
					break;
				}
			} else if (w[j].ndim != part.ndim || memcmp(w[j].shape, part.shape, sizeof(part.shape))) {
				e = err_set(err, errlen, -EINVAL, "%s: tensor %s: shape differs from another shard's", path, s->name);
				break;
			}
			safetensors_copy(&st, s, 0, s->n, w[j].data + lo);
			w[j].filled += s->n;
		}
		safetensors_free(&st);
	}
	if (!e) {
		if (nw > 1)
			qsort(w, (size_t)nw, sizeof(*w), by_name);
		fprintf(f, "checkpoint %s: step %ld, %zu parameters, %d shard file%s\n", stepdir, mf->step,
			mf->nparams, mf->nshards, mf->nshards == 1 ? "" : "s");
	}
	for (int j = 0; j < nw && !e; j++) {
		if (w[j].filled != w[j].n) {
			e = err_set(err, errlen, -EINVAL, "%s: tensor %s: shard files hold %" PRIu64 " of its %" PRIu64 " elements",
				    stepdir, w[j].name, w[j].filled, w[j].n);
			break;
		}
		char shape[96] = "", h[2 * CKPT_HASH_BYTES + 1];
		uint8_t sum[CKPT_HASH_BYTES];
		size_t n = 0;
		for (int d = 0; d < w[j].ndim; d++)
			n += (size_t)snprintf(shape + n, sizeof(shape) - n, "%s%" PRIu64, d ? "x" : "", w[j].shape[d]);
		if (w[j].ndim == 0)
			snprintf(shape, sizeof(shape), "scalar");
		crypto_generichash(sum, sizeof(sum), (const unsigned char *)w[j].data, w[j].n * sizeof(float), NULL, 0);
		sodium_bin2hex(h, sizeof(h), sum, sizeof(sum));
		fprintf(f, "tensor %-32s %-14s %10" PRIu64 " blake2b-256:%s\n", w[j].name, shape, w[j].n, h);
	}
	for (int j = 0; j < nw; j++)
		free(w[j].data);
	free(w);
	free(mf);
	return e;
}
