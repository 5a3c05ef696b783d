/* The [section] key table of cluster.ini and what describes each key,
 * shared by config.c (parsing), config_value.c (one value of each type),
 * config_print.c (printing, hashing) and config_keys.c (the table itself).
 * Private to those four files. */
#ifndef PSTRAIN_CONFIG_KEYS_H
#define PSTRAIN_CONFIG_KEYS_H

#include "config.h"

#include <stddef.h>

enum key_type {
	K_INT,
	K_LONG,
	K_U64,
	K_FLOAT,
	K_DOUBLE,
	K_BOOL,
	K_ENUM,
	K_PATH,
	K_HOSTS,
	K_DEVICES,
	K_LABEL_COLUMN,
	K_INPUT,
	K_LAYER,
};

#define LO_OPEN 1u      /* the lower bound itself is not allowed */
#define HI_OPEN 2u
#define LIST 4u         /* may continue on indented lines */
#define REPEAT 8u       /* may appear several times, each appends */
#define AUTO 32u        /* K_BOOL: also "auto", stored as 2; K_INT: stored as
			 * CONFIG_INT_AUTO */
#define NAMED 16u       /* K_PATH: the default is the config's file name without
			 * its .ini or .conf extension, then def: cluster.ini's
			 * ".ckpt" is cluster.ckpt, so two configs in one folder
			 * never share a checkpoint_dir */

struct key_def {
	const char *section;
	const char *key;
	enum key_type type;
	size_t off;               /* field in struct config */
	size_t count_off;         /* K_HOSTS, K_DEVICES: its count field */
	double lo, hi;            /* numeric range */
	unsigned flags;
	const char *const *names; /* K_ENUM: value i is names[i], NULL-terminated */
	const char *def;          /* default, as config text (NAMED: a suffix) */
};

/* The order of the table is the order of `pstrain check` and docs/CONFIG.md;
 * config_keys.c checks that it has at most CONFIG_MAX_KEYS rows. */
#define CONFIG_MAX_KEYS 96
extern const struct key_def config_keys[];
extern const size_t config_nkeys;
extern const char *const config_sections[];
extern const size_t config_nsections;
/* [model]'s layers when a config has no `layer` line. */
extern const char *const config_default_layers[];
extern const size_t config_ndefault_layers;

static inline void *config_field(struct config *c, const struct key_def *k)
{
	return (char *)c + k->off;
}

static inline int *config_count_field(struct config *c, const struct key_def *k)
{
	return (int *)((char *)c + k->count_off);
}

static inline const void *config_field_c(const struct config *c, const struct key_def *k)
{
	return (const char *)c + k->off;
}

/* config_value.c: val parsed into k's field of c, or a negative errno
 * with the reason (without the key's name or line) in err. append: val
 * came from an indented line that continues a list key; dir: the config
 * file's directory, for relative paths. */
int config_key_parse(struct config *c, const struct key_def *k, const char *val, int append,
		     const char *dir, char *err, size_t errlen);

/* s past its leading blanks. */
const char *config_skip_blank(const char *s);

#endif
