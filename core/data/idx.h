/* IDX files (the MNIST format), raw or gzip-compressed, into a dataset.
 * Every field is validated; a failure is one line in the caller's buffer
 * naming the file. */
#ifndef PSTRAIN_IDX_H
#define PSTRAIN_IDX_H

#include "dataset.h"

/* IDX pair: images (magic 0x00000803, u8, N x rows x cols) and labels
 * (magic 0x00000801, u8, N). Either may be gzip-compressed (detected from
 * the content, not the name). Counts must match; D = rows * cols; no bytes
 * may follow the data. *ds is overwritten; on failure it is zeroed. */
int idx_load(struct dataset *ds, const char *images, const char *labels,
	     char *err, size_t errlen);

/* An IDX images file alone (for predict): labels are all 0, classes 0. */
int idx_load_images(struct dataset *ds, const char *images, char *err, size_t errlen);

#endif
