/* A dataset in memory: N samples of D float features and one int32 label
 * each, and the two things done with one whatever its file format: freeing
 * it and copying a batch of its rows. The loaders (idx.h, csv.h) fill one;
 * data.h puts them together as the config says. */
#ifndef PSTRAIN_DATASET_H
#define PSTRAIN_DATASET_H

#include <stddef.h>
#include <stdint.h>

/* Labels are 0..DATA_MAX_CLASSES-1; a CSV label outside is an error. */
#define DATA_MAX_CLASSES 65536

struct dataset {
	float *x;         /* (N, D) features, row-major */
	int32_t *y;       /* (N) labels, 0 <= y < classes */
	size_t n;         /* N */
	size_t d;         /* D */
	int classes;      /* 1 + largest label seen */
};

void dataset_free(struct dataset *ds);   /* accepts NULL and zeroed structs */

/* Copies samples idx[0..B) into x (B, D) and y (B). */
void dataset_gather(const struct dataset *ds, const uint32_t *idx, size_t B,
		    float *x, int32_t *y);

#endif
