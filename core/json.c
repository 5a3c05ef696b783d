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

/* The elements of an array or members of an object; p->at is past the
 * opening bracket. */
static int jp_list(struct jp *p, struct json *v, char close)
{
	size_t cap = 0;
	jp_space(p);
	if (p->at < p->len && p->s[p->at] == close) {
		p->at++;
		return 0;
	}
	for (;;) {
		if (v->n == cap) {
			cap = cap ? 2 * cap : 4;
			struct json *k = realloc(v->kids, cap * sizeof(*k));
			if (!k)
				return -ENOMEM;
			v->kids = k;
		}
		struct json *kid = &v->kids[v->n];
		memset(kid, 0, sizeof(*kid));
		v->n++;
		jp_space(p);
		if (close == '}') {
			if (p->at >= p->len || p->s[p->at] != '"')
				return jp_fail(p, "expected a member name");
			int r = jp_string(p, &kid->key);
			if (r)
				return r;
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
	*out = NULL;
	if (len > JSON_MAX_BYTES)
		return err_set(err, errlen, -EINVAL, "%zu bytes (at most %u)", len, JSON_MAX_BYTES);
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
