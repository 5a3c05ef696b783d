/* safetensors writer and strict reader (float32 only); see safetensors.h. */
#include "safetensors.h"

#include "../json.h"

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

/* ---- reader: the header through core/json.c, then checked field by field ---- */

static int st_bad(const char *name, const char *what, char *err, size_t errlen)
{
	return err_set(err, errlen, -EINVAL, "%s: bad safetensors header: %s", name, what);
}

/* A string value into out (max bytes with the NUL). Names and values end
 * up in error messages: a byte that is not printable ASCII would break the
 * one-line contract or reach a terminal, so it is refused. */
static int st_string(const struct json *v, char *out, size_t max, const char *name, char *err, size_t errlen)
{
	if (v->type != JSON_STRING)
		return st_bad(name, "expected a string", err, errlen);
	size_t n = strlen(v->text);
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)v->text[i] < 0x20 || (unsigned char)v->text[i] > 0x7e)
			return st_bad(name, "a string holds a byte that is not printable ASCII", err, errlen);
	if (n + 1 > max)
		return st_bad(name, "string too long", err, errlen);
	memcpy(out, v->text, n + 1);
	return 0;
}

/* A non-negative integer that fits 64 bits, written as plain digits. */
static int st_uint(const struct json *v, uint64_t *out, const char *name, char *err, size_t errlen)
{
	if (v->type != JSON_NUMBER)
		return st_bad(name, "expected a non-negative integer", err, errlen);
	uint64_t x = 0;
	for (const char *c = v->text; *c; c++) {
		if (*c < '0' || *c > '9')
			return st_bad(name, "expected a non-negative integer", err, errlen);
		unsigned d = (unsigned)(*c - '0');
		if (x > (UINT64_MAX - d) / 10)
			return st_bad(name, "integer out of range", err, errlen);
		x = x * 10 + d;
	}
	*out = x;
	return 0;
}

/* [u, u, ...] into out[0..max); *n = count. */
static int st_uints(const struct json *v, uint64_t *out, int max, int *n, const char *name, char *err,
		    size_t errlen)
{
	if (v->type != JSON_ARRAY)
		return st_bad(name, "expected an array", err, errlen);
	if (v->n > (size_t)max)
		return st_bad(name, "array too long", err, errlen);
	*n = (int)v->n;
	for (size_t i = 0; i < v->n; i++) {
		int e = st_uint(&v->kids[i], &out[i], name, err, errlen);
		if (e)
			return e;
	}
	return 0;
}

static int st_meta_read(const struct json *v, struct safetensors *s, const char *name, char *err, size_t errlen)
{
	if (v->type != JSON_OBJECT)
		return st_bad(name, "__metadata__ is not an object", err, errlen);
	s->meta = calloc(v->n ? v->n : 1, sizeof(*s->meta));
	if (!s->meta)
		return -ENOMEM;
	for (size_t i = 0; i < v->n; i++) {
		struct st_meta *m = &s->meta[s->nmeta];
		struct json key = { .type = JSON_STRING, .text = v->kids[i].key };
		int e = st_string(&key, m->key, sizeof(m->key), name, err, errlen);
		if (!e)
			e = st_string(&v->kids[i], m->value, sizeof(m->value), name, err, errlen);
		if (e)
			return e;
		s->nmeta++;
	}
	return 0;
}

static int st_tensor_read(const struct json *v, struct st_tensor *t, const char *name, char *err, size_t errlen)
{
	char dtype[16];
	uint64_t offs[2];
	int n = 0;
	if (v->type != JSON_OBJECT)
		return st_bad(name, "a tensor entry is not an object", err, errlen);
	const struct json *dt = json_get(v, "dtype"), *sh = json_get(v, "shape"), *of = json_get(v, "data_offsets");
	if (!dt || !sh || !of)
		return st_bad(name, "a tensor entry lacks dtype, shape or data_offsets", err, errlen);
	if (v->n != 3)
		return st_bad(name, "unknown key in a tensor entry", err, errlen);
	int e = st_string(dt, dtype, sizeof(dtype), name, err, errlen);
	if (!e)
		e = st_uints(sh, t->shape, ST_MAX_DIMS, &t->ndim, name, err, errlen);
	if (!e)
		e = st_uints(of, offs, 2, &n, name, err, errlen);
	if (!e && n != 2)
		e = st_bad(name, "data_offsets needs two numbers", err, errlen);
	if (e)
		return e;
	if (strcmp(dtype, "F32") != 0)
		return err_set(err, errlen, -EINVAL, "%s: tensor %s has dtype %s; pstrain reads F32 only",
			       name, t->name, dtype);
	t->n = 1;
	for (int d = 0; d < t->ndim; d++) {
		if (t->shape[d] && t->n > UINT64_MAX / 4 / t->shape[d])
			return st_bad(name, "shape too large", err, errlen);
		t->n *= t->shape[d];
	}
	if (offs[1] < offs[0] || offs[1] - offs[0] != t->n * sizeof(float))
		return err_set(err, errlen, -EINVAL, "%s: tensor %s: data_offsets do not match its shape",
			       name, t->name);
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

/* The header's JSON: one object of tensor entries and at most one
 * __metadata__, which json_parse gives with no member named twice. */
static int st_header_read(struct safetensors *s, const char *text, size_t len, const char *name,
			  char *err, size_t errlen)
{
	struct json *root;
	char why[256];
	int e = json_parse_max(text, len, ST_HEADER_MAX, &root, why, sizeof(why));
	if (e == -ENOMEM)
		return err_set(err, errlen, e, "%s: out of memory for its header", name);
	if (e)
		return st_bad(name, why, err, errlen);
	if (root->type != JSON_OBJECT) {
		json_free(root);
		return st_bad(name, "not a JSON object", err, errlen);
	}
	s->t = calloc(root->n ? root->n : 1, sizeof(*s->t));
	if (!s->t)
		e = -ENOMEM;
	for (size_t i = 0; i < root->n && !e; i++) {
		const struct json *v = &root->kids[i];
		if (!strcmp(v->key, "__metadata__")) {
			e = st_meta_read(v, s, name, err, errlen);
			continue;
		}
		struct st_tensor *t = &s->t[s->nt];
		struct json key = { .type = JSON_STRING, .text = v->key };
		e = st_string(&key, t->name, sizeof(t->name), name, err, errlen);
		if (!e)
			e = st_tensor_read(v, t, name, err, errlen);
		if (!e)
			s->nt++;
	}
	json_free(root);
	return e;
}

/* The header's length from buf[0..8) and the header from buf[8..held),
 * checked against a file of size bytes (held <= size). */
static int st_parse(struct safetensors *s, unsigned char *buf, size_t held, uint64_t size, const char *name,
		    char *err, size_t errlen)
{
	memset(s, 0, sizeof(*s));
	s->buf = buf;
	s->held = held;
	s->len = (size_t)size;
	if (size < 8 || held < 8)
		return err_set(err, errlen, -EINVAL, "%s: truncated: %llu bytes, shorter than the 8-byte header length",
			       name, (unsigned long long)size);
	uint64_t hlen = 0;
	for (int i = 0; i < 8; i++)
		hlen |= (uint64_t)buf[i] << (8 * i);
	if (hlen < 2 || hlen > ST_HEADER_MAX)
		return err_set(err, errlen, -EINVAL, "%s: header length %llu is not plausible (not a safetensors file?)",
			       name, (unsigned long long)hlen);
	if (hlen > size - 8 || hlen > held - 8)
		return err_set(err, errlen, -EINVAL, "%s: truncated: header of %llu bytes but only %llu follow",
			       name, (unsigned long long)hlen, (unsigned long long)(size - 8));
	s->data0 = 8 + (size_t)hlen;
	int e = st_header_read(s, (const char *)buf + 8, (size_t)hlen, name, err, errlen);
	if (e)
		return e;
	return st_tiling(s, name, err, errlen);
}

int safetensors_parse(struct safetensors *s, unsigned char *buf, size_t len, const char *name,
		      char *err, size_t errlen)
{
	return st_parse(s, buf, len, len, name, err, errlen);
}

int safetensors_read_head(struct safetensors *s, FILE *f, uint64_t size, const char *name, char *err,
			  size_t errlen)
{
	unsigned char lenb[8];
	memset(s, 0, sizeof(*s));
	if (size < 8 || fread(lenb, 1, 8, f) != 8)
		return err_set(err, errlen, size < 8 ? -EINVAL : -EIO, "%s: truncated: %llu bytes, shorter than the 8-byte header length",
			       name, (unsigned long long)size);
	uint64_t hlen = 0;
	for (int i = 0; i < 8; i++)
		hlen |= (uint64_t)lenb[i] << (8 * i);
	/* Checked before the allocation: a damaged length must not size it
	 * (st_parse then says what is wrong with it). */
	size_t want = hlen >= 2 && hlen <= ST_HEADER_MAX && hlen <= size - 8 ? (size_t)hlen : 0;
	unsigned char *buf = malloc(8 + want);
	if (!buf)
		return err_set(err, errlen, -ENOMEM, "%s: out of memory for its header", name);
	memcpy(buf, lenb, 8);
	if (fread(buf + 8, 1, want, f) != want) {
		free(buf);
		return err_set(err, errlen, -EIO, "%s: read failed (truncated while reading?)", name);
	}
	return st_parse(s, buf, 8 + want, size, name, err, errlen);
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
