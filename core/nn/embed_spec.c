/* `layer = embedding FIELDS ROWS DIM [shared] [pool=sum|mean]`: the
 * options' parser and the printer (embed.h); model.c parses the three
 * counts as it parses every layer's. Kept apart from the kernels so that
 * the layer and config fuzzers link it alone. */
#include "embed.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* "shared", "pool=sum" or "pool=mean", each once. */
int embed_spec_option(struct embed_spec *s, const char *opt, int *seen_pool, char *err, size_t errlen)
{
	if (strcmp(opt, "shared") == 0) {
		if (s->shared) {
			snprintf(err, errlen, "layer embedding: \"shared\" is given twice");
			return -EINVAL;
		}
		s->shared = 1;
		return 0;
	}
	if (strncmp(opt, "pool=", 5) == 0) {
		if (*seen_pool) {
			snprintf(err, errlen, "layer embedding: pool= is given twice");
			return -EINVAL;
		}
		*seen_pool = 1;
		if (strcmp(opt + 5, "sum") == 0 || strcmp(opt + 5, "mean") == 0) {
			s->pool = opt[5] == 's' ? EMBED_SUM : EMBED_MEAN;
			return 0;
		}
		snprintf(err, errlen, "layer embedding: \"%s\" is not a pooling (pool=sum or pool=mean)", opt);
		return -EINVAL;
	}
	snprintf(err, errlen, "layer embedding: unknown option \"%s\" (expected shared or pool=sum|mean)", opt);
	return -EINVAL;
}

void embed_spec_format(const struct embed_spec *s, char *buf, size_t len)
{
	snprintf(buf, len, "embedding %d %d %d%s%s", s->fields, s->rows, s->dim, s->shared ? " shared" : "",
		 s->pool == EMBED_MEAN ? " pool=mean" : "");
}
