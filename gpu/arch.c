/* The compute-capability rules of arch.h over a list of nvcc targets. No
 * CUDA here: this file is in every build, so the tests run the rules on a
 * machine without a GPU. */
#include "arch.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The Makefile defines it from CUDA_ARCHS for this file in every build; a
 * default here could drift from what nvcc was given. */
#ifndef PSTRAIN_CUDA_TARGETS
#error "PSTRAIN_CUDA_TARGETS comes from the Makefile (CUDA_ARCHS), the list nvcc builds for"
#endif

struct target {
	int ptx;            /* compute_XY (PTX) rather than sm_XY (SASS) */
	int major, minor;
	char suffix;        /* 0, 'a' (architecture-specific) or 'f' (family) */
	const char *word;   /* in the targets string, for messages */
	int len;
};

const char *gpu_arch_targets(void)
{
	return PSTRAIN_CUDA_TARGETS;
}

/* "sm_86", "compute_90", "sm_100a": the prefix, two or three digits (the
 * last is the minor), an optional suffix, nothing else. */
static int word_parse(struct target *t, const char *w, int len)
{
	const char *p = w, *end = w + len;
	memset(t, 0, sizeof(*t));
	t->word = w;
	t->len = len;
	if (len > 3 && strncmp(w, "sm_", 3) == 0) {
		p += 3;
	} else if (len > 8 && strncmp(w, "compute_", 8) == 0) {
		p += 8;
		t->ptx = 1;
	} else {
		return -EINVAL;
	}
	int cc = 0, digits = 0;
	if (*p == '0')
		return -EINVAL;
	for (; p < end && *p >= '0' && *p <= '9' && digits <= 3; p++, digits++)
		cc = cc * 10 + (*p - '0');
	if (digits < 2 || digits > 3)
		return -EINVAL;
	if (p < end && (*p == 'a' || *p == 'f'))
		t->suffix = *p++;
	if (p != end)
		return -EINVAL;
	t->major = cc / 10;
	t->minor = cc % 10;
	return 0;
}

static int targets_parse(const char *targets, struct target *t, int *n, char *why, size_t whylen)
{
	const char *s = targets;
	*n = 0;
	for (;;) {
		while (*s == ' ')
			s++;
		if (!*s)
			break;
		const char *w = s;
		while (*s && *s != ' ')
			s++;
		int len = (int)(s - w);
		if (*n == GPU_ARCH_MAX_TARGETS) {
			snprintf(why, whylen, "more than %d CUDA targets in \"%s\"", GPU_ARCH_MAX_TARGETS,
				 targets);
			return -EINVAL;
		}
		if (word_parse(&t[*n], w, len) < 0) {
			snprintf(why, whylen, "\"%.*s\" is not a CUDA target (sm_XY or compute_XY, e.g. sm_80)",
				 len, w);
			return -EINVAL;
		}
		(*n)++;
	}
	if (*n == 0) {
		snprintf(why, whylen, "no CUDA targets (the Makefile's CUDA_ARCHS is empty)");
		return -EINVAL;
	}
	return 0;
}

/* a - b over capabilities: negative, zero or positive. */
static int cc_cmp(int amajor, int aminor, int bmajor, int bminor)
{
	return amajor != bmajor ? amajor - bmajor : aminor - bminor;
}

static int target_runs(const struct target *t, int major, int minor)
{
	int d = cc_cmp(major, minor, t->major, t->minor);
	if (t->suffix == 'a')
		return d == 0;
	if (t->ptx && t->suffix != 'f')
		return d >= 0;   /* the driver JIT-compiles PTX for any later GPU */
	return major == t->major && d >= 0;
}

/* Appends to buf, which always stays terminated; *at counts what was asked,
 * so a short buffer truncates instead of overflowing. */
static void append(char *buf, size_t len, size_t *at, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (*at < len) {
		int k = vsnprintf(buf + *at, len - *at, fmt, ap);
		if (k > 0)
			*at += (size_t)k;
	}
	va_end(ap);
}

/* Why a GPU of major.minor is refused: what the binary carries, the
 * CUDA_ARCHS that would carry this GPU too, and, when the GPU is older
 * than every target, the other way out. */
static void refusal(const struct target *t, int n, int major, int minor, char *why, size_t whylen)
{
	char carried[256] = "", archs[128] = "";
	size_t at = 0, aat = 0;
	int older = 1, placed = 0;
	for (int i = 0; i < n; i++) {
		append(carried, sizeof(carried), &at, "%s%.*s%s", i == 0 ? "" : i == n - 1 ? " and " : ", ",
		       t[i].len, t[i].word, t[i].ptx ? " PTX" : "");
		if (cc_cmp(major, minor, t[i].major, t[i].minor) >= 0)
			older = 0;
		if (t[i].ptx)
			continue;
		if (!placed && cc_cmp(major, minor, t[i].major, t[i].minor) < 0) {
			append(archs, sizeof(archs), &aat, "%s%d%d", aat ? " " : "", major, minor);
			placed = 1;
		}
		const char *digits = t[i].word + 3;   /* after "sm_" */
		append(archs, sizeof(archs), &aat, "%s%.*s", aat ? " " : "", t[i].len - 3, digits);
	}
	if (!placed)
		append(archs, sizeof(archs), &aat, "%s%d%d", aat ? " " : "", major, minor);
	snprintf(why, whylen, "compute capability %d.%d; this pstrain carries %s: rebuild with "
		 "make CUDA_ARCHS=\"%s\"%s", major, minor, carried, archs,
		 older ? " or use a newer GPU" : "");
}

int gpu_arch_runs(const char *targets, int major, int minor, char *why, size_t whylen)
{
	struct target t[GPU_ARCH_MAX_TARGETS];
	int n;
	int r = targets_parse(targets, t, &n, why, whylen);
	if (r < 0)
		return r;
	for (int i = 0; i < n; i++)
		if (target_runs(&t[i], major, minor))
			return 0;
	refusal(t, n, major, minor, why, whylen);
	return -ENODEV;
}

int gpu_arch_supported(int major, int minor, char *why, size_t whylen)
{
	return gpu_arch_runs(gpu_arch_targets(), major, minor, why, whylen);
}
