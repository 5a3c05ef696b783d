/* safetensors writer and strict reader (float32 only); see safetensors.h. */
#include "safetensors.h"

#include "../../base/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Tensor bytes are written and read as the host's floats: the format is
 * little-endian, and so is every machine pstrain builds for. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors.c assumes a little-endian host");

static int st_plain(const char *s)
{
	for (; *s; s++)
		if (*s < 0x20 || *s > 0x7e || *s == '"' || *s == '\\')
			return 0;
	return 1;
}

int safetensors_write(FILE *f, const struct st_tensor *t, int nt, const struct st_meta *meta,
		      int nmeta, char *err, size_t errlen)
{
	char *hdr = NULL;
	size_t hlen = 0;
	FILE *h = open_memstream(&hdr, &hlen);
	if (!h)
		return err_set(err, errlen, -ENOMEM, "out of memory for a safetensors header");
	uint64_t off = 0;
	fputc('{', h);
	if (nmeta > 0) {
		fputs("\"__metadata__\":{", h);
		for (int i = 0; i < nmeta; i++) {
			if (!st_plain(meta[i].key) || !st_plain(meta[i].value)) {
				fclose(h);
				free(hdr);
				return err_set(err, errlen, -EINVAL, "safetensors metadata \"%s\" has characters pstrain does not write",
					       meta[i].key);
			}
			fprintf(h, "%s\"%s\":\"%s\"", i ? "," : "", meta[i].key, meta[i].value);
		}
		fputc('}', h);
	}
	for (int i = 0; i < nt; i++) {
		if (!st_plain(t[i].name) || !strcmp(t[i].name, "__metadata__")) {
			fclose(h);
			free(hdr);
			return err_set(err, errlen, -EINVAL, "tensor name \"%s\" cannot be written", t[i].name);
		}
		fprintf(h, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[", nmeta > 0 || i ? "," : "", t[i].name);
		for (int d = 0; d < t[i].ndim; d++)
			fprintf(h, "%s%llu", d ? "," : "", (unsigned long long)t[i].shape[d]);
		fprintf(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
			(unsigned long long)(off + t[i].n * sizeof(float)));
		off += t[i].n * sizeof(float);
	}
	fputc('}', h);
	/* Pad so the data area starts 8-byte aligned, as the reference writer does. */
	while ((ftell(h) % 8) != 0)
		fputc(' ', h);
	if (fclose(h) != 0 || !hdr) {
		free(hdr);
		return err_set(err, errlen, -ENOMEM, "out of memory for a safetensors header");
	}
	unsigned char lenb[8];
	for (int i = 0; i < 8; i++)
		lenb[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
	int ok = fwrite(lenb, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen;
	free(hdr);
	for (int i = 0; ok && i < nt; i++)
		ok = t[i].n == 0 || fwrite(t[i].data, sizeof(float), t[i].n, f) == t[i].n;
	if (!ok)
		return err_set(err, errlen, -EIO, "write failed: %s", strerror(errno));
	return 0;
}

/* ---- reader: a JSON subset exactly as wide as the format needs ---- */

struct st_json {
	const char *p, *end;
	const char *name;    /* file, for messages */
	char *err;
	size_t errlen;
};

static int jfail(struct st_json *j, const char *what)
{
	return err_set(j->err, j->errlen, -EINVAL, "%s: bad safetensors header: %s", j->name, what);
}

static void jws(struct st_json *j)
{
	while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
		j->p++;
}

static int jchar(struct st_json *j, char c)
{
	jws(j);
	if (j->p >= j->end || *j->p != c)
		return 0;
	j->p++;
	return 1;
}

/* A JSON string into out (at most max bytes with the NUL). Anything but
 * printable ASCII is refused: pstrain's names and values are. */
static int jstring(struct st_json *j, char *out, size_t max)
{
	size_t n = 0;
	if (!jchar(j, '"'))
		return jfail(j, "expected a string");
	while (j->p < j->end && *j->p != '"') {
		unsigned char c = (unsigned char)*j->p++;
		if (c < 0x20)
			return jfail(j, "control character in a string");
		if (c == '\\') {
			if (j->p >= j->end)
				return jfail(j, "unterminated string");
			c = (unsigned char)*j->p++;
			switch (c) {
			case '"': case '\\': case '/': break;
			case 'b': c = '\b'; break;
			case 'f': c = '\f'; break;
			case 'n': c = '\n'; break;
			case 'r': c = '\r'; break;
			case 't': c = '\t'; break;
			case 'u': {
				unsigned v = 0;
				for (int i = 0; i < 4; i++) {
					if (j->p >= j->end)
						return jfail(j, "unterminated \\u escape");
					char h = *j->p++;
					v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0' :
							       h >= 'a' && h <= 'f' ? h - 'a' + 10 :
							       h >= 'A' && h <= 'F' ? h - 'A' + 10 : 99);
					if (v > 0xffff)
						return jfail(j, "bad \\u escape");
				}
				if (v == 0 || v > 0x7f)
					return jfail(j, "\\u escape outside ASCII");
				c = (unsigned char)v;
				break;
			}
			default:
				return jfail(j, "bad escape in a string");
			}
		}
		/* Names and values end up in error messages: a byte that is
		 * not printable ASCII (a raw one, or \n from an escape) would
		 * break the one-line contract or reach a terminal. */
		if (c < 0x20 || c > 0x7e)
			return jfail(j, "a string holds a byte that is not printable ASCII");
		if (n + 1 >= max)
			return jfail(j, "string too long");
		out[n++] = (char)c;
	}
	if (j->p >= j->end)
		return jfail(j, "unterminated string");
	j->p++;
	out[n] = '\0';
	return 0;
}

static int juint(struct st_json *j, uint64_t *v)
{
	jws(j);
	if (j->p >= j->end || *j->p < '0' || *j->p > '9')
		return jfail(j, "expected a non-negative integer");
	uint64_t x = 0;
	while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
		unsigned d = (unsigned)(*j->p++ - '0');
		if (x > (UINT64_MAX - d) / 10)
			return jfail(j, "integer out of range");
		x = x * 10 + d;
	}
	*v = x;
	return 0;
}

/* [u, u, ...] into v[0..max); *n = count. */
static int juints(struct st_json *j, uint64_t *v, int max, int *n)
{
	*n = 0;
	if (!jchar(j, '['))
		return jfail(j, "expected an array");
	if (jchar(j, ']'))
		return 0;
	do {
		if (*n == max)
			return jfail(j, "array too long");
		int e = juint(j, &v[(*n)++]);
		if (e)
			return e;
	} while (jchar(j, ','));
	return jchar(j, ']') ? 0 : jfail(j, "expected ',' or ']' in an array");
}

static int jmeta(struct st_json *j, struct safetensors *s)
{
	if (!jchar(j, '{'))
		return jfail(j, "__metadata__ is not an object");
	if (jchar(j, '}'))
		return 0;
	do {
		struct st_meta *m = realloc(s->meta, (size_t)(s->nmeta + 1) * sizeof(*m));
		if (!m)
			return -ENOMEM;
		s->meta = m;
		m = &s->meta[s->nmeta];
		int e = jstring(j, m->key, sizeof(m->key));
		if (!e && !jchar(j, ':'))
			e = jfail(j, "expected ':'");
		if (!e)
			e = jstring(j, m->value, sizeof(m->value));
		if (e)
			return e;
		s->nmeta++;
	} while (jchar(j, ','));
	return jchar(j, '}') ? 0 : jfail(j, "expected ',' or '}' in __metadata__");
}

static int jtensor(struct st_json *j, struct st_tensor *t)
{
	char key[32], dtype[16] = "";
	uint64_t offs[2];
	int have = 0, n;
	if (!jchar(j, '{'))
		return jfail(j, "a tensor entry is not an object");
	do {
		int e = jstring(j, key, sizeof(key));
		if (!e && !jchar(j, ':'))
			e = jfail(j, "expected ':'");
		if (e)
			return e;
		if (!strcmp(key, "dtype")) {
			e = jstring(j, dtype, sizeof(dtype));
			have |= 1;
		} else if (!strcmp(key, "shape")) {
			e = juints(j, t->shape, ST_MAX_DIMS, &t->ndim);
			have |= 2;
		} else if (!strcmp(key, "data_offsets")) {
			e = juints(j, offs, 2, &n);
			if (!e && n != 2)
				e = jfail(j, "data_offsets needs two numbers");
			have |= 4;
		} else {
			e = jfail(j, "unknown key in a tensor entry");
		}
		if (e)
			return e;
	} while (jchar(j, ','));
	if (!jchar(j, '}'))
		return jfail(j, "expected ',' or '}' in a tensor entry");
	if (have != 7)
		return jfail(j, "a tensor entry lacks dtype, shape or data_offsets");
	if (strcmp(dtype, "F32") != 0)
		return err_set(j->err, j->errlen, -EINVAL, "%s: tensor %s has dtype %s; pstrain reads F32 only",
			       j->name, t->name, dtype);
	t->n = 1;
	for (int d = 0; d < t->ndim; d++) {
		if (t->shape[d] && t->n > UINT64_MAX / 4 / t->shape[d])
			return jfail(j, "shape too large");
		t->n *= t->shape[d];
	}
	if (offs[1] < offs[0] || offs[1] - offs[0] != t->n * sizeof(float))
		return err_set(j->err, j->errlen, -EINVAL, "%s: tensor %s: data_offsets do not match its shape",
			       j->name, t->name);
	t->begin = offs[0];
	return 0;
}

static int by_begin(const void *a, const void *b)
{
	const struct st_tensor *x = *(const struct st_tensor *const *)a, *y = *(const struct st_tensor *const *)b;
	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Tensors must cover the data area exactly, in some order, without
 * overlap: a file with holes or trailing bytes is damaged or not ours. */
static int st_tiling(struct safetensors *s, const char *name, char *err, size_t errlen)
{
	const struct st_tensor **order = malloc((size_t)(s->nt ? s->nt : 1) * sizeof(*order));
	if (!order)
		return -ENOMEM;
	for (int i = 0; i < s->nt; i++)
		order[i] = &s->t[i];
	qsort(order, (size_t)s->nt, sizeof(*order), by_begin);
	uint64_t at = 0, size = s->len - s->data0;
	int e = 0;
	for (int i = 0; i < s->nt && !e; i++) {
		if (order[i]->begin != at)
			e = err_set(err, errlen, -EINVAL, "%s: tensor %s starts at byte %llu of the data, expected %llu (truncated or damaged)",
				    name, order[i]->name, (unsigned long long)order[i]->begin, (unsigned long long)at);
		at += order[i]->n * sizeof(float);
		if (!e && at > size)
			e = err_set(err, errlen, -EINVAL, "%s: truncated: tensor %s ends at data byte %llu but the file has %llu",
				    name, order[i]->name, (unsigned long long)at, (unsigned long long)size);
	}
	if (!e && at != size)
		e = err_set(err, errlen, -EINVAL, "%s: %llu bytes of data after the last tensor", name,
			    (unsigned long long)(size - at));
	free(order);
	return e;
}

int safetensors_parse(struct safetensors *s, unsigned char *buf, size_t len, const char *name,
		      char *err, size_t errlen)
{
	memset(s, 0, sizeof(*s));
	s->buf = buf;
	s->len = len;
	if (len < 8)
		return err_set(err, errlen, -EINVAL, "%s: truncated: %zu bytes, shorter than the 8-byte header length", name, len);
	uint64_t hlen = 0;
	for (int i = 0; i < 8; i++)
		hlen |= (uint64_t)buf[i] << (8 * i);
	if (hlen < 2 || hlen > ST_HEADER_MAX)
		return err_set(err, errlen, -EINVAL, "%s: header length %llu is not plausible (not a safetensors file?)",
			       name, (unsigned long long)hlen);
	if (hlen > len - 8)
		return err_set(err, errlen, -EINVAL, "%s: truncated: header of %llu bytes but only %zu follow",
			       name, (unsigned long long)hlen, len - 8);
	s->data0 = 8 + (size_t)hlen;
	struct st_json j = { (const char *)buf + 8, (const char *)buf + 8 + hlen, name, err, errlen };
	int e = 0, have_meta = 0;
	if (!jchar(&j, '{'))
		return jfail(&j, "not a JSON object");
	if (!jchar(&j, '}')) {
		do {
			char key[ST_NAME_MAX];
			e = jstring(&j, key, sizeof(key));
			if (!e && !jchar(&j, ':'))
				e = jfail(&j, "expected ':'");
			if (e)
				return e;
			if (!strcmp(key, "__metadata__")) {
				if (have_meta++)
					return jfail(&j, "two __metadata__ entries");
				e = jmeta(&j, s);
			} else {
				if (safetensors_find(s, key))
					return err_set(err, errlen, -EINVAL, "%s: tensor %s appears twice", name, key);
				struct st_tensor *t = realloc(s->t, (size_t)(s->nt + 1) * sizeof(*t));
				if (!t)
					return -ENOMEM;
				s->t = t;
				t = &s->t[s->nt];
				memset(t, 0, sizeof(*t));
				snprintf(t->name, sizeof(t->name), "%s", key);
				e = jtensor(&j, t);
				if (!e)
					s->nt++;
			}
			if (e)
				return e;
		} while (jchar(&j, ','));
		if (!jchar(&j, '}'))
			return jfail(&j, "expected ',' or '}'");
	}
	jws(&j);
	if (j.p != j.end)
		return jfail(&j, "bytes after the JSON object");
	return st_tiling(s, name, err, errlen);
}

void safetensors_free(struct safetensors *s)
{
	if (!s)
		return;
	free(s->buf);
	free(s->t);
	free(s->meta);
	memset(s, 0, sizeof(*s));
}

const struct st_tensor *safetensors_find(const struct safetensors *s, const char *name)
{
	for (int i = 0; i < s->nt; i++)
		if (!strcmp(s->t[i].name, name))
			return &s->t[i];
	return NULL;
}

const char *safetensors_meta(const struct safetensors *s, const char *key)
{
	for (int i = 0; i < s->nmeta; i++)
		if (!strcmp(s->meta[i].key, key))
			return s->meta[i].value;
	return NULL;
}

void safetensors_copy(const struct safetensors *s, const struct st_tensor *t, uint64_t from,
		      uint64_t count, float *out)
{
	memcpy(out, s->buf + s->data0 + t->begin + from * sizeof(float), count * sizeof(float));
}
