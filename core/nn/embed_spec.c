/* `layer = embedding FIELDS ROWS DIM [shared] [pool=sum|mean]`: the
 * arguments' parser and printer (embed.h). Kept apart from the kernels so
 * that the layer and config fuzzers link it alone. */
#include "embed.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EMBED_USAGE "embedding FIELDS ROWS DIM [shared] [pool=sum|mean]"

/* A whole decimal integer in [lo, hi]. */
static int parse_count(const char *s, long lo, long hi, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (end == s || *end || errno || v < lo || v > hi || !(*s >= '0' && *s <= '9'))
		return -EINVAL;
	*out = (int)v;
	return 0;
}

/* "shared", "pool=sum" or "pool=mean", each once. */
static int parse_option(struct embed_spec *s, const char *opt, int *seen_pool, char *err,
			size_t errlen)
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

int embed_spec_parse(struct embed_spec *s, const char *const *args, int n, char *err,
		     size_t errlen)
{
	memset(s, 0, sizeof(*s));
	if (n < 3) {
		snprintf(err, errlen, "layer embedding needs FIELDS ROWS DIM (%s)", EMBED_USAGE);
		return -EINVAL;
	}
	if (parse_count(args[0], 1, EMBED_MAX_FIELDS, &s->fields)) {
		snprintf(err, errlen, "layer embedding: \"%s\" is not a field count (FIELDS, 1..%d)", args[0],
			 EMBED_MAX_FIELDS);
		return -EINVAL;
	}
	if (parse_count(args[1], 1, EMBED_MAX_ROWS, &s->rows)) {
		snprintf(err, errlen, "layer embedding: \"%s\" is not a row count (ROWS, 1..%d)", args[1],
			 EMBED_MAX_ROWS);
		return -EINVAL;
	}
	if (parse_count(args[2], 1, EMBED_MAX_DIM, &s->dim)) {
		snprintf(err, errlen, "layer embedding: \"%s\" is not a width (DIM, 1..%d)", args[2],
			 EMBED_MAX_DIM);
		return -EINVAL;
	}
	int seen_pool = 0;
	for (int i = 3; i < n; i++)
		if (parse_option(s, args[i], &seen_pool, err, errlen))
			return -EINVAL;
	return 0;
}

void embed_spec_format(const struct embed_spec *s, char *buf, size_t len)
{
	snprintf(buf, len, "embedding %d %d %d%s%s", s->fields, s->rows, s->dim, s->shared ? " shared" : "",
		 s->pool == EMBED_MEAN ? " pool=mean" : "");
}
