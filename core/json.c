/* See json.h. Recursive descent over one buffer; every node is malloc'd
 * and a failure frees what was built. */
#include "json.h"

#include "../base/err.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct jp {
	const char *s;
	size_t len, at;
	int depth;
	char *err;
	size_t errlen;
};

static int jp_fail(struct jp *p, const char *what)
{
	return err_set(p->err, p->errlen, -EINVAL, "at byte %zu: %s", p->at, what);
}

static void jp_space(struct jp *p)
{
	while (p->at < p->len && (p->s[p->at] == ' ' || p->s[p->at] == '\t' || p->s[p->at] == '\n' ||
				  p->s[p->at] == '\r'))
		p->at++;
}

static int jp_word(struct jp *p, const char *w)
{
	size_t n = strlen(w);
	if (p->len - p->at < n || memcmp(p->s + p->at, w, n) != 0)
		return 0;
	p->at += n;
	return 1;
}

static int hex4(const char *s, unsigned *v)
{
	*v = 0;
	for (int i = 0; i < 4; i++) {
		char c = s[i];
		int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
						: c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
		if (d < 0)
			return -1;
		*v = *v * 16 + (unsigned)d;
	}
	return 0;
}

/* Appends code point cp as UTF-8 at out. */
static size_t utf8_put(char *out, unsigned cp)
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | cp >> 6);
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xe0 | cp >> 12);
		out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
		out[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | cp >> 18);
	out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
	out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
	out[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/* The length of the well-formed UTF-8 sequence at s (n bytes left), or 0:
 * RFC 3629's table, so no overlong form (C0 80 for NUL), no surrogate (ED
 * A0..BF), nothing past U+10FFFF, no stray continuation or 0xF5..0xFF.
 * TensorFlow reads TF_CONFIG through Python, which would see such bytes
 * as something else again: refused rather than passed on. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	size_t len;
	unsigned char lo = 0x80, hi = 0xbf; /* the second byte's range */
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
	else
		return 0;
	if (n < len || s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if (s[i] < 0x80 || s[i] > 0xbf)
			return 0;
	return len;
}

/* A string at p->at (the opening quote) into a new buffer. The unescaped
 * text is never longer than the escaped one. */
static int jp_string(struct jp *p, char **out)
{
	p->at++;
	size_t start = p->at, end = start;
	while (end < p->len && p->s[end] != '"')
		end += p->s[end] == '\\' ? 2 : 1;
	if (end >= p->len)
		return jp_fail(p, "unterminated string");
	char *o = malloc(end - start + 1), *w = o;
	if (!o)
		return -ENOMEM;
	while (p->at < end) {
		unsigned char c = (unsigned char)p->s[p->at];
		if (c < 0x20) {
			free(o);
			return jp_fail(p, "control character in a string");
		}
		if (c >= 0x80) {
			size_t n = utf8_len((const unsigned char *)p->s + p->at, end - p->at);
			if (!n) {
				free(o);
				return jp_fail(p, "invalid UTF-8 in a string");
			}
			memcpy(w, p->s + p->at, n);
			w += n;
			p->at += n;
			continue;
		}
		if (c != '\\') {
			*w++ = (char)c;
			p->at++;
			continue;
		}
		char e = p->s[p->at + 1];
		const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t", *m = strchr(from, e);
		if (e && m) {
			*w++ = to[m - from];
			p->at += 2;
			continue;
		}
		unsigned cp, lo;
		if (e != 'u' || end - p->at < 6 || hex4(p->s + p->at + 2, &cp)) {
			free(o);
			return jp_fail(p, "bad escape in a string");
		}
		p->at += 6;
		if (cp >= 0xd800 && cp < 0xdc00) {
			if (end - p->at < 6 || p->s[p->at] != '\\' || p->s[p->at + 1] != 'u' ||
			    hex4(p->s + p->at + 2, &lo) || lo < 0xdc00 || lo >= 0xe000) {
				free(o);
				return jp_fail(p, "unpaired surrogate in a string");
			}
			p->at += 6;
			cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
		} else if (cp >= 0xdc00 && cp < 0xe000) {
			free(o);
			return jp_fail(p, "unpaired surrogate in a string");
		}
		if (cp == 0) {
			free(o);
			return jp_fail(p, "NUL in a string");
		}
		w += utf8_put(w, cp);
	}
	*w = 0;
	p->at = end + 1;
	*out = o;
	return 0;
}

static int jp_number(struct jp *p, char **out)
{
	size_t start = p->at;
	if (p->at < p->len && p->s[p->at] == '-')
		p->at++;
	size_t d0 = p->at;
	while (p->at < p->len && p->s[p->at] >= '0' && p->s[p->at] <= '9')
		p->at++;
	if (p->at == d0 || (p->s[d0] == '0' && p->at - d0 > 1))
		return jp_fail(p, "bad number");
	if (p->at < p->len && p->s[p->at] == '.') {
		size_t f = ++p->at;
		while (p->at < p->len && p->s[p->at] >= '0' && p->s[p->at] <= '9')
			p->at++;
		if (p->at == f)
			return jp_fail(p, "bad number");
	}
	if (p->at < p->len && (p->s[p->at] == 'e' || p->s[p->at] == 'E')) {
		p->at++;
		if (p->at < p->len && (p->s[p->at] == '+' || p->s[p->at] == '-'))
			p->at++;
		size_t x = p->at;
		while (p->at < p->len && p->s[p->at] >= '0' && p->s[p->at] <= '9')
			p->at++;
		if (p->at == x)
			return jp_fail(p, "bad number");
	}
	*out = strndup(p->s + start, p->at - start);
	return *out ? 0 : -ENOMEM;
}

static int jp_value(struct jp *p, struct json *v);

/* A member's name and where it began, to find names given twice. */
struct jp_name {
	const char *key;
	size_t at;
};

static int name_cmp(const void *a, const void *b)
{
	const struct jp_name *x = a, *y = b;
	int c = strcmp(x->key, y->key);
	return c ? c : x->at < y->at ? -1 : x->at > y->at;
}

/* Refuses an object that names a member twice: Python's json (what
 * TensorFlow reads TF_CONFIG with) keeps the last, json_get would find
 * the first, so the two would run different clusters. Sorted, so that a
 * megabyte of names costs n log n, not n squared. */
static int jp_unique(struct jp *p, struct jp_name *names, size_t n)
{
	qsort(names, n, sizeof(*names), name_cmp);
	for (size_t i = 1; i < n; i++)
		if (strcmp(names[i - 1].key, names[i].key) == 0) {
			p->at = names[i].at;
			return jp_fail(p, "a member name given twice in one object");
		}
	return 0;
}

/* The elements of an array or members of an object, at least one; p->at
 * is at the first. Each member's name and place go into *names (*cap of
 * them allocated, as of v->kids). */
static int jp_items(struct jp *p, struct json *v, char close, size_t *cap, struct jp_name **names)
{
	for (;;) {
		if (v->n == *cap) {
			*cap = *cap ? 2 * *cap : 4;
			struct json *k = realloc(v->kids, *cap * sizeof(*k));
			if (!k)
				return -ENOMEM;
			v->kids = k;
			if (close == '}') {
				struct jp_name *nm = realloc(*names, *cap * sizeof(*nm));
				if (!nm)
					return -ENOMEM;
				*names = nm;
			}
		}
		struct json *kid = &v->kids[v->n];
		memset(kid, 0, sizeof(*kid));
		v->n++;
		jp_space(p);
		if (close == '}') {
			if (p->at >= p->len || p->s[p->at] != '"')
				return jp_fail(p, "expected a member name");
			size_t at = p->at;
			int r = jp_string(p, &kid->key);
			if (r)
				return r;
			(*names)[v->n - 1] = (struct jp_name){ kid->key, at };
			jp_space(p);
			if (p->at >= p->len || p->s[p->at] != ':')
				return jp_fail(p, "expected ':'");
			p->at++;
		}
		int r = jp_value(p, kid);
		if (r)
			return r;
		jp_space(p);
		if (p->at < p->len && p->s[p->at] == ',') {
			p->at++;
			continue;
		}
		if (p->at < p->len && p->s[p->at] == close) {
			p->at++;
			return 0;
		}
		return jp_fail(p, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
	}
}

/* The elements of an array or members of an object; p->at is past the
 * opening bracket. */
static int jp_list(struct jp *p, struct json *v, char close)
{
	size_t cap = 0;
	struct jp_name *names = NULL;
	jp_space(p);
	if (p->at < p->len && p->s[p->at] == close) {
		p->at++;
		return 0;
	}
	int r = jp_items(p, v, close, &cap, &names);
	if (!r && close == '}')
		r = jp_unique(p, names, v->n);
	free(names);
	return r;
}

static int jp_value(struct jp *p, struct json *v)
{
	jp_space(p);
	if (p->at >= p->len)
		return jp_fail(p, "unexpected end");
	char c = p->s[p->at];
	if (c == '{' || c == '[') {
		if (++p->depth > JSON_MAX_DEPTH)
			return jp_fail(p, "nested too deeply");
		p->at++;
		v->type = c == '{' ? JSON_OBJECT : JSON_ARRAY;
		int r = jp_list(p, v, c == '{' ? '}' : ']');
		p->depth--;
		return r;
	}
	if (c == '"') {
		v->type = JSON_STRING;
		return jp_string(p, &v->text);
	}
	if (c == '-' || (c >= '0' && c <= '9')) {
		v->type = JSON_NUMBER;
		return jp_number(p, &v->text);
	}
	if (jp_word(p, "true"))
		v->type = JSON_TRUE;
	else if (jp_word(p, "false"))
		v->type = JSON_FALSE;
	else if (jp_word(p, "null"))
		v->type = JSON_NULL;
	else
		return jp_fail(p, "expected a value");
	return 0;
}

static void json_clear(struct json *j)
{
	for (size_t i = 0; i < j->n; i++)
		json_clear(&j->kids[i]);
	free(j->kids);
	free(j->text);
	free(j->key);
}

void json_free(struct json *j)
{
	if (!j)
		return;
	json_clear(j);
	free(j);
}

int json_parse(const char *text, size_t len, struct json **out, char *err, size_t errlen)
{
	return json_parse_max(text, len, JSON_MAX_BYTES, out, err, errlen);
}

int json_parse_max(const char *text, size_t len, size_t max, struct json **out, char *err, size_t errlen)
{
	*out = NULL;
	if (len > max)
		return err_set(err, errlen, -EINVAL, "%zu bytes (at most %zu)", len, max);
	struct jp p = { .s = text, .len = len, .err = err, .errlen = errlen };
	struct json *j = calloc(1, sizeof(*j));
	if (!j)
		return err_set(err, errlen, -ENOMEM, "out of memory");
	int r = jp_value(&p, j);
	if (!r) {
		jp_space(&p);
		if (p.at != p.len)
			r = jp_fail(&p, "text after the value");
	}
	if (r == -ENOMEM)
		err_set(err, errlen, r, "out of memory");
	if (r) {
		json_free(j);
		return r;
	}
	*out = j;
	return 0;
}

const struct json *json_get(const struct json *obj, const char *key)
{
	if (!obj || obj->type != JSON_OBJECT)
		return NULL;
	for (size_t i = 0; i < obj->n; i++)
		if (strcmp(obj->kids[i].key, key) == 0)
			return &obj->kids[i];
	return NULL;
}

const char *json_type_name(enum json_type t)
{
	static const char *names[] = { "null", "false", "true", "number", "string", "array", "object" };
	return (unsigned)t < sizeof(names) / sizeof(names[0]) ? names[t] : "?";
}
