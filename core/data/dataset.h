/* A dataset in memory: N samples of D float features, F categorical IDs
 * (click-through data: one per field, F = 0 for images and plain CSV) and
 * one int32 label each, and the two things done with one whatever its file
 * format: freeing it and copying a batch of its rows. The loaders (idx.h,
 * csv.h) fill one; data.h puts them together as the config says. */
#ifndef PSTRAIN_DATASET_H
#define PSTRAIN_DATASET_H

#include <stddef.h>
#include <stdint.h>

/* Labels are 0..DATA_MAX_CLASSES-1; a CSV label outside is an error. */
#define DATA_MAX_CLASSES 65536

/* A categorical field with no value in a sample (Criteo's empty column):
 * it selects no embedding row, so it adds nothing to its field's pooled
 * vector. Every other 32-bit value is an ID as the file gave it (Criteo's
 * 8 hex digits); which table row it lands in is the embedding layer's
 * business (it hashes the ID with the field), not the loader's. */
#define DATA_ID_NONE UINT32_MAX

struct dataset {
	float *x;         /* (N, D) features, row-major */
	uint32_t *ids;    /* (N, F) categorical IDs, row-major; NULL when F = 0 */
	int32_t *y;       /* (N) labels, 0 <= y < classes */
	size_t n;         /* N */
	size_t d;         /* D */
	size_t f;         /* F: categorical fields per sample */
	int classes;      /* 1 + largest label seen */
};

void dataset_free(struct dataset *ds);   /* accepts NULL and zeroed structs */

/* Copies samples idx[0..B) into x (B, D) and y (B). */
void dataset_gather(const struct dataset *ds, const uint32_t *idx, size_t B,
		    float *x, int32_t *y);

/* Copies the categorical IDs of samples idx[0..B) into ids (B, F). */
void dataset_gather_ids(const struct dataset *ds, const uint32_t *idx, size_t B, uint32_t *ids);

#endif
