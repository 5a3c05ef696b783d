/* IDX loader: an images file (u8, N x rows x cols) and a labels file (u8, N),
 * each raw or gzip-compressed, into a struct dataset with pixels in [0,1].
 *
 * zlib's gzread reads raw files transparently, so compression is detected
 * from the content. Every header field is checked before anything is
 * allocated from it; the train/test pairing and class counts are left to
 * data.c. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L   /* open flags and fstat under -std=c11 */
#endif
#include "idx.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define IDX_MAGIC_IMAGES 0x00000803u   /* type u8, 3 dimensions */
#define IDX_MAGIC_LABELS 0x00000801u   /* type u8, 1 dimension */

/* A corrupt header must not make us allocate terabytes: 2^30 pixels is
 * 4 GiB of floats, twenty times ImageNet-1k at 64x64 grey. */
#define IDX_MAX_VALUES (1ull << 30)

#define IDX_CHUNK (1u << 16)

struct idx_reader {
	const char *path;
	gzFile gz;
	long long size;      /* bytes on disk; -1 when not a regular file */
	char *err;
	size_t errlen;
};

__attribute__((format(printf, 2, 3)))
static void idx_fail(struct idx_reader *r, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!r->err || !r->errlen)
		return;
	n = snprintf(r->err, r->errlen, "%s: ", r->path);
	if (n < 0 || (size_t)n >= r->errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(r->err + n, r->errlen - n, fmt, ap);
	va_end(ap);
}

static int idx_open(struct idx_reader *r, const char *path, char *err,
		    size_t errlen)
{
	struct stat st;
	int fd, e;

	r->path = path;
	r->gz = NULL;
	r->err = err;
	r->errlen = errlen;

	/* open + gzdopen rather than gzopen: zlib does not promise a
	 * meaningful errno, and fstat tells a directory from a file. */
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		e = errno;
		idx_fail(r, "cannot open: %s", strerror(e));
		return -e;
	}
	if (fstat(fd, &st) < 0) {
		e = errno;
		idx_fail(r, "cannot stat: %s", strerror(e));
		close(fd);
		return -e;
	}
	if (S_ISDIR(st.st_mode)) {
		idx_fail(r, "is a directory");
		close(fd);
		return -EISDIR;
	}
	r->size = S_ISREG(st.st_mode) ? (long long)st.st_size : -1;
	r->gz = gzdopen(fd, "rb");
	if (!r->gz) {
		idx_fail(r, "out of memory opening the file");
		close(fd);
		return -ENOMEM;
	}
	/* Larger than zlib's 8 KiB default: the training images are 47 MB. */
	gzbuffer(r->gz, 1u << 17);
	return 0;
}

static void idx_close(struct idx_reader *r)
{
	if (r->gz)
		gzclose_r(r->gz);
	r->gz = NULL;
}

/* Reads up to len bytes into buf, looping over short reads. Stopping short
 * at a clean end of file is not an error here (the caller knows how much it
 * wanted); a cut-off or corrupt gzip stream and I/O errors are. *got is set
 * either way. what, already and want describe the section being read (its
 * name, bytes of it read before this call, its full size) for messages. */
static int idx_read(struct idx_reader *r, void *buf, size_t len, size_t *got,
		    const char *what, size_t already, size_t want)
{
	unsigned char *p = buf;
	size_t done = 0;
	const char *msg;
	int errnum, n;

	while (done < len) {
		size_t ask = len - done;

		if (ask > IDX_CHUNK)
			ask = IDX_CHUNK;
		n = gzread(r->gz, p + done, (unsigned)ask);
		if (n <= 0)
			break;
		done += (size_t)n;
	}
	*got = done;
	if (done == len)
		return 0;

	/* gzread returns what it could decode from a truncated stream and
	 * flags Z_BUF_ERROR, so a short read alone cannot tell a cut-off .gz
	 * from a short raw file: ask gzerror. */
	msg = gzerror(r->gz, &errnum);
	switch (errnum) {
	case Z_OK:
	case Z_STREAM_END:
		return 0;
	case Z_BUF_ERROR:
		if (already + done >= want)
			idx_fail(r, "truncated gzip stream: its end is missing after the %zu bytes of %s",
				 want, what);
		else
			idx_fail(r, "truncated gzip stream: expected %zu bytes of %s, got %zu",
				 want, what, already + done);
		return -EINVAL;
	case Z_ERRNO:
		errnum = errno ? errno : EIO;
		idx_fail(r, "read error: %s", strerror(errnum));
		return -errnum;
	case Z_MEM_ERROR:
		idx_fail(r, "out of memory decompressing");
		return -ENOMEM;
	default:
		/* zlib prefixes its message with the "<fd:N>" it was given
		 * instead of a path; we name the file ourselves. Where in
		 * the data zlib noticed depends on its buffering, so the
		 * section is not named. */
		if (msg[0] == '<' && strstr(msg, ">: "))
			msg = strstr(msg, ">: ") + 3;
		idx_fail(r, "corrupt gzip data: %s", msg);
		return -EINVAL;
	}
}

/* Reads exactly len bytes of a section that should be want bytes long in
 * all, of which already have been read; a short read is "truncated". */
static int idx_read_full(struct idx_reader *r, void *buf, size_t len,
			 const char *what, size_t already, size_t want)
{
	size_t got;
	int ret;

	ret = idx_read(r, buf, len, &got, what, already, want);
	if (ret < 0)
		return ret;
	if (got < len) {
		idx_fail(r, "truncated: expected %zu bytes of %s, got %zu",
			 want, what, already + got);
		return -EINVAL;
	}
	return 0;
}

static uint32_t idx_be32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Reads the magic and ndim dimensions, all big-endian u32, and checks them.
 * *count is the product of the dimensions, bounded by IDX_MAX_VALUES. */
static int idx_read_header(struct idx_reader *r, uint32_t magic, uint32_t *dims,
			   int ndim, const char *kind, const char *what,
			   size_t *count)
{
	unsigned char b[4 * 4];
	size_t hlen = 4 + 4 * (size_t)ndim;
	uint64_t prod = 1;
	uint32_t m;
	int ret, i;

	ret = idx_read_full(r, b, 4, "header", 0, hlen);
	if (ret < 0)
		return ret;
	m = idx_be32(b);
	if (m != magic) {
		idx_fail(r, "wrong magic 0x%08x, expected 0x%08x (IDX %s, u8)",
			 m, magic, kind);
		return -EINVAL;
	}
	ret = idx_read_full(r, b + 4, hlen - 4, "header", 4, hlen);
	if (ret < 0)
		return ret;
	for (i = 0; i < ndim; i++) {
		dims[i] = idx_be32(b + 4 + 4 * i);
		if (dims[i] == 0) {
			idx_fail(r, "dimension %d of the header is zero", i);
			return -EINVAL;
		}
		/* Each factor is < 2^32 and the running product stays
		 * <= 2^30, so this cannot overflow 64 bits. */
		prod *= dims[i];
		if (prod > IDX_MAX_VALUES) {
			idx_fail(r, "header claims more than %llu values, refusing (corrupt header?)",
				 IDX_MAX_VALUES);
			return -EFBIG;
		}
	}
	*count = (size_t)prod;

	/* A raw file's size is known up front: catch truncation before
	 * allocating for it. Compressed sizes are checked while reading. */
	if (gzdirect(r->gz) && r->size >= 0 &&
	    (unsigned long long)r->size != hlen + prod) {
		if ((unsigned long long)r->size < hlen + prod)
			idx_fail(r, "truncated: expected %zu bytes of %s, got %lld",
				 *count, what, r->size - (long long)hlen);
		else
			idx_fail(r, "%lld trailing bytes after the %zu bytes of %s",
				 r->size - (long long)(hlen + prod), *count, what);
		return -EINVAL;
	}
	return 0;
}

/* The payload must end exactly where the header says. */
static int idx_expect_end(struct idx_reader *r, const char *what, size_t want)
{
	unsigned char b;
	size_t got;
	int ret;

	ret = idx_read(r, &b, 1, &got, what, want, want);
	if (ret < 0)
		return ret;
	if (got) {
		idx_fail(r, "trailing bytes after the %zu bytes of %s", want, what);
		return -EINVAL;
	}
	return 0;
}

/* Makes room for need of the count elements (of size el) a section has.
 * A raw file's size was checked against its header, so it gets all count
 * at once. A gzip stream's size is known only by decoding it: its array
 * doubles as data arrives, so a 60-byte file whose header claims 2^30
 * pixels fails as truncated without first allocating 4 GiB (libFuzzer
 * found that). Returns the array, or NULL with *p untouched. */
static void *idx_grow(struct idx_reader *r, void *p, size_t *cap, size_t need,
		      size_t count, size_t el)
{
	size_t n;

	if (need <= *cap)
		return p;
	if (gzdirect(r->gz) && r->size >= 0)
		n = count;
	else
		n = *cap * 2 > need ? *cap * 2 : need;
	if (n > count)
		n = count;
	p = realloc(p, n * el);
	if (!p) {
		idx_fail(r, "out of memory for %zu values", count);
		return NULL;
	}
	*cap = n;
	return p;
}

/* Pixels go through a small staging buffer so the bytes never need a
 * second full-size allocation next to the floats. */
static int idx_read_pixels(struct idx_reader *r, float **x, size_t count)
{
	unsigned char buf[IDX_CHUNK];
	float scale[256], *p;
	size_t done = 0, cap = 0, i;
	int ret;

	for (i = 0; i < 256; i++)
		scale[i] = (float)i / 255.0f;
	while (done < count) {
		size_t len = count - done < sizeof(buf) ? count - done : sizeof(buf);

		ret = idx_read_full(r, buf, len, "pixels", done, count);
		if (ret < 0)
			return ret;
		p = idx_grow(r, *x, &cap, done + len, count, sizeof(**x));
		if (!p)
			return -ENOMEM;
		*x = p;
		for (i = 0; i < len; i++)
			p[done + i] = scale[buf[i]];
		done += len;
	}
	return idx_expect_end(r, "pixels", count);
}

static int idx_read_labels(struct idx_reader *r, int32_t **y, size_t n,
			   int *classes)
{
	unsigned char buf[IDX_CHUNK];
	size_t done = 0, cap = 0, i;
	int32_t *p;
	int max = 0, ret;

	while (done < n) {
		size_t len = n - done < sizeof(buf) ? n - done : sizeof(buf);

		ret = idx_read_full(r, buf, len, "labels", done, n);
		if (ret < 0)
			return ret;
		p = idx_grow(r, *y, &cap, done + len, n, sizeof(**y));
		if (!p)
			return -ENOMEM;
		*y = p;
		for (i = 0; i < len; i++) {
			p[done + i] = buf[i];
			if (buf[i] > max)
				max = buf[i];
		}
		done += len;
	}
	*classes = max + 1;
	return idx_expect_end(r, "labels", n);
}

int idx_load(struct dataset *ds, const char *images, const char *labels,
	     char *err, size_t errlen)
{
	struct idx_reader ri = { .gz = NULL }, rl = { .gz = NULL };
	struct dataset d = { 0 };
	uint32_t idims[3], ldims[1];
	size_t icount, lcount;
	int ret;

	memset(ds, 0, sizeof(*ds));

	/* Both headers first, so a count mismatch is reported before tens
	 * of megabytes are decompressed. */
	ret = idx_open(&ri, images, err, errlen);
	if (ret < 0)
		goto out;
	ret = idx_read_header(&ri, IDX_MAGIC_IMAGES, idims, 3, "images", "pixels",
			      &icount);
	if (ret < 0)
		goto out;
	ret = idx_open(&rl, labels, err, errlen);
	if (ret < 0)
		goto out;
	ret = idx_read_header(&rl, IDX_MAGIC_LABELS, ldims, 1, "labels", "labels",
			      &lcount);
	if (ret < 0)
		goto out;
	if (ldims[0] != idims[0]) {
		snprintf(err, errlen, "count mismatch: %s has %u images but %s has %u labels",
			 images, idims[0], labels, ldims[0]);
		ret = -EINVAL;
		goto out;
	}

	d.n = idims[0];
	d.d = (size_t)idims[1] * idims[2];
	ret = idx_read_pixels(&ri, &d.x, icount);
	if (ret < 0)
		goto out;
	ret = idx_read_labels(&rl, &d.y, d.n, &d.classes);
	if (ret < 0)
		goto out;
	*ds = d;
	d = (struct dataset){ 0 };
out:
	idx_close(&ri);
	idx_close(&rl);
	dataset_free(&d);
	return ret;
}

int idx_load_images(struct dataset *ds, const char *images, char *err, size_t errlen)
{
	struct idx_reader ri = { .gz = NULL };
	struct dataset d = { 0 };
	uint32_t idims[3];
	size_t icount;
	int ret;

	memset(ds, 0, sizeof(*ds));
	ret = idx_open(&ri, images, err, errlen);
	if (ret < 0)
		goto out;
	ret = idx_read_header(&ri, IDX_MAGIC_IMAGES, idims, 3, "images", "pixels", &icount);
	if (ret < 0)
		goto out;
	d.n = idims[0];
	d.d = (size_t)idims[1] * idims[2];
	ret = idx_read_pixels(&ri, &d.x, icount);
	if (ret < 0)
		goto out;
	d.y = calloc(d.n ? d.n : 1, sizeof(*d.y));
	if (!d.y) {
		snprintf(err, errlen, "%s: out of memory for %zu labels", images, d.n);
		ret = -ENOMEM;
		goto out;
	}
	*ds = d;
	d = (struct dataset){ 0 };
out:
	idx_close(&ri);
	dataset_free(&d);
	return ret;
}
