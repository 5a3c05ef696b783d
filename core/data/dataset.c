/* Freeing a dataset and copying a batch of its rows; see dataset.h. */
#include "dataset.h"

#include <stdlib.h>
#include <string.h>

void dataset_free(struct dataset *ds)
{
	if (!ds)
		return;
	free(ds->x);
	free(ds->ids);
	free(ds->y);
	memset(ds, 0, sizeof(*ds));
}

void dataset_gather(const struct dataset *ds, const uint32_t *idx, size_t B,
		    float *x, int32_t *y)
{
	size_t b;

	for (b = 0; b < B; b++) {
		memcpy(x + b * ds->d, ds->x + (size_t)idx[b] * ds->d,
		       ds->d * sizeof(*x));
		y[b] = ds->y[idx[b]];
	}
}

void dataset_gather_ids(const struct dataset *ds, const uint32_t *idx, size_t B, uint32_t *ids)
{
	for (size_t b = 0; b < B; b++)
		memcpy(ids + b * ds->f, ds->ids + (size_t)idx[b] * ds->f, ds->f * sizeof(*ids));
}
