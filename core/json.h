/* A strict reader of small JSON documents (TF_CONFIG, safetensors headers): RFC 8259 values
 * into a tree, for lookups by key and index. Strings are unescaped to
 * UTF-8 (\uXXXX included, surrogate pairs joined); numbers are kept as
 * their text and read as doubles on request. Depth and size are capped,
 * since the text comes from the environment (TF_CONFIG) or a file
 * (a safetensors header). Stricter than RFC 8259
 * where readers differ, so that pstrain never reads another document than
 * TensorFlow's reader (Python's json) does: an object that names a member
 * twice is refused (Python keeps the last), and so is a string holding
 * bytes that are not well-formed UTF-8 (0xFF, overlong forms such as C0
 * 80, encoded surrogates, past U+10FFFF). The caller owns the tree
 * (json_free). */
#ifndef PSTRAIN_CORE_JSON_H
#define PSTRAIN_CORE_JSON_H

#include <stddef.h>

enum json_type { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT };

struct json {
	enum json_type type;
	char *text;          /* STRING: the value; NUMBER: its text; else NULL */
	char *key;           /* the member's name inside an OBJECT, else NULL */
	struct json *kids;   /* ARRAY / OBJECT: (n) */
	size_t n;
};

#define JSON_MAX_DEPTH 32
#define JSON_MAX_BYTES (1u << 20)

/* Parses text (len bytes) into *out. 0, or -EINVAL with "at byte N: ..."
 * in err, or -ENOMEM. */
int json_parse(const char *text, size_t len, struct json **out, char *err, size_t errlen);
/* The same with another size cap than JSON_MAX_BYTES: a safetensors
 * header may be up to 16 MiB (ST_HEADER_MAX). */
int json_parse_max(const char *text, size_t len, size_t max, struct json **out, char *err, size_t errlen);
void json_free(struct json *j);  /* accepts NULL */

/* The member named key of an object, or NULL (also for a non-object). */
const struct json *json_get(const struct json *obj, const char *key);
/* "object", "array", "string", ... */
const char *json_type_name(enum json_type t);

#endif
