/* Parsing one value of each key type of cluster.ini into its field of
 * struct config (config_keys.h's table says which type and range): the
 * strict per-type parsers config.c calls for every key, default and
 * --set. A value is read whole or refused with a one-line reason; nothing
 * here knows about files, lines or sections. */
#include "config.h"
#include "config_keys.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *config_skip_blank(const char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	return s;
}

static int parse_long(const char *s, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (end == s || *config_skip_blank(end) || errno)
		return -EINVAL;
	*out = v;
	return 0;
}

static const char *range_text(const struct key_def *k, char *buf, size_t len)
{
	if (k->type == K_FLOAT || k->type == K_DOUBLE)
		snprintf(buf, len, "%s%g, %g%s", k->flags & LO_OPEN ? "(" : "[", k->lo, k->hi,
			 k->flags & HI_OPEN ? ")" : "]");
	else
		snprintf(buf, len, "%.0f..%.0f%s", k->lo, k->hi, k->flags & AUTO ? " or auto" : "");
	return buf;
}

static int in_range(const struct key_def *k, double v)
{
	if (v < k->lo || (v == k->lo && (k->flags & LO_OPEN)))
		return 0;
	if (v > k->hi || (v == k->hi && (k->flags & HI_OPEN)))
		return 0;
	return 1;
}

/* "host:port" or "[v6]:port" into h. */
static int parse_host(struct host *h, const char *s, size_t n, char *err, size_t errlen)
{
	char buf[CONFIG_HOST_MAX + 16];
	if (n >= sizeof(buf)) {
		snprintf(err, errlen, "a host:port entry is longer than %d characters", CONFIG_HOST_MAX);
		return -EINVAL;
	}
	memcpy(buf, s, n);
	buf[n] = '\0';

	char *colon = strrchr(buf, ':');
	const char *host = buf;
	size_t hlen;
	if (buf[0] == '[') {
		char *close = strchr(buf, ']');
		if (!close || close[1] != ':') {
			snprintf(err, errlen, "\"%s\" is not [ipv6]:port", buf);
			return -EINVAL;
		}
		host = buf + 1;
		hlen = (size_t)(close - host);
		colon = close + 1;
		struct in6_addr a6;
		*close = '\0';
		int v6 = inet_pton(AF_INET6, host, &a6) == 1;
		*close = ']';
		if (!v6) {
			snprintf(err, errlen, "\"%s\": \"%.*s\" is not an IPv6 address", buf, (int)hlen, host);
			return -EINVAL;
		}
	} else {
		if (!colon || colon == buf) {
			snprintf(err, errlen, "\"%s\" is not host:port", buf);
			return -EINVAL;
		}
		hlen = (size_t)(colon - buf);
	}
	if (hlen >= CONFIG_HOST_MAX) {
		snprintf(err, errlen, "\"%s\": the host is longer than %d characters", buf, CONFIG_HOST_MAX - 1);
		return -EINVAL;
	}
	for (size_t i = 0; i < hlen; i++) {
		char ch = host[i];
		int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
			 (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' ||
			 (buf[0] == '[' && ch == ':');
		if (!ok || hlen == 0) {
			snprintf(err, errlen, "\"%s\": \"%.*s\" is not a host name or address",
				 buf, (int)hlen, host);
			return -EINVAL;
		}
	}
	long port;
	/* Digits only: strtol would also take "+80", " 80" and "080". */
	if (colon[1] < '1' || colon[1] > '9' || strspn(colon + 1, "0123456789") != strlen(colon + 1) ||
	    parse_long(colon + 1, &port) || port < 1 || port > 65535) {
		snprintf(err, errlen, "\"%s\": \"%s\" is not a port (1..65535)", buf, colon + 1);
		return -EINVAL;
	}
	memcpy(h->name, host, hlen);
	h->name[hlen] = '\0';
	h->port = (uint16_t)port;
	return 0;
}

/* Splits a comma list and calls fn on each trimmed, non-empty item. A
 * trailing comma is allowed: an indented line may continue the list. */
static int parse_list(const char *val, int (*fn)(void *ctx, const char *s, size_t n, char *err, size_t errlen),
		      void *ctx, char *err, size_t errlen)
{
	const char *p = val;
	for (;;) {
		p = config_skip_blank(p);
		const char *e = strchr(p, ',');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
			n--;
		if (n == 0 && p > val && !*p)
			return 0;   /* "a:1," ends a line that an indented one continues */
		if (n == 0) {
			snprintf(err, errlen, "empty entry in list \"%s\"", val);
			return -EINVAL;
		}
		int r = fn(ctx, p, n, err, errlen);
		if (r)
			return r;
		if (!e)
			return 0;
		p = e + 1;
	}
}

struct host_list {
	struct host *hosts;
	int *n;
};

static int host_item(void *ctx, const char *s, size_t n, char *err, size_t errlen)
{
	struct host_list *l = ctx;
	if (*l->n >= CONFIG_MAX_HOSTS) {
		snprintf(err, errlen, "more than %d hosts", CONFIG_MAX_HOSTS);
		return -EINVAL;
	}
	int r = parse_host(&l->hosts[*l->n], s, n, err, errlen);
	if (!r)
		(*l->n)++;
	return r;
}

struct device_list {
	int *devs;
	int *n;
	const struct key_def *k;
};

static int device_item(void *ctx, const char *s, size_t n, char *err, size_t errlen)
{
	struct device_list *l = ctx;
	char buf[32];
	long v;
	if (n >= sizeof(buf) || (memcpy(buf, s, n), buf[n] = '\0', parse_long(buf, &v)) ||
	    v < 0 || v > l->k->hi) {
		snprintf(err, errlen, "\"%.*s\" is not a GPU index (0..%.0f) or \"all\"", (int)n, s, l->k->hi);
		return -EINVAL;
	}
	if (*l->n >= CONFIG_MAX_DEVICES) {
		snprintf(err, errlen, "more than %d devices", CONFIG_MAX_DEVICES);
		return -EINVAL;
	}
	l->devs[(*l->n)++] = (int)v;
	return 0;
}

static int parse_input(struct config *c, const struct key_def *k, const char *val,
		       char *err, size_t errlen)
{
	int dims[3] = { 1, 1, 1 }, nd = 0;
	const char *p = val;
	for (;;) {
		char *end;
		errno = 0;
		long v = strtol(p, &end, 10);
		if (end == p || errno || v < k->lo || v > k->hi || nd == 3)
			goto bad;
		dims[nd++] = (int)v;
		if (*end == 'x') {
			p = end + 1;
			continue;
		}
		if (*config_skip_blank(end))
			goto bad;
		break;
	}
	/* "784" is 784x1x1; "28x28" is 28x28x1. */
	c->model.in_h = dims[0];
	c->model.in_w = dims[1];
	c->model.in_c = dims[2];
	return 0;
bad:
	snprintf(err, errlen, "\"%s\" is not a shape (expected N, HxW or HxWxC, each 1..%.0f)", val, k->hi);
	return -EINVAL;
}

/* One parser per key type: each reads val into f, the field of k, or
 * makes the one-line error. */
static int parse_integer(const struct key_def *k, void *f, const char *val, char *err, size_t errlen)
{
	char rbuf[64];
	long v;
	if (parse_long(val, &v)) {
		snprintf(err, errlen, "\"%s\" is not an integer%s", val, k->flags & AUTO ? " or auto" : "");
		return -EINVAL;
	}
	if (!in_range(k, (double)v)) {
		snprintf(err, errlen, "%s is out of range (expected %s)", val, range_text(k, rbuf, sizeof(rbuf)));
		return -EINVAL;
	}
	if (k->type == K_INT)
		*(int *)f = (int)v;
	else
		*(long *)f = v;
	return 0;
}

static int parse_u64(void *f, const char *val, char *err, size_t errlen)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(val, &end, 10);
	if (end == val || *config_skip_blank(end) || errno || *config_skip_blank(val) == '-') {
		snprintf(err, errlen, "\"%s\" is not an unsigned integer", val);
		return -EINVAL;
	}
	*(uint64_t *)f = (uint64_t)v;
	return 0;
}

static int parse_number(const struct key_def *k, void *f, const char *val, char *err, size_t errlen)
{
	char rbuf[64], *end;
	errno = 0;
	double v = strtod(val, &end);
	if (end == val || *config_skip_blank(end) || errno == ERANGE || !isfinite(v)) {
		snprintf(err, errlen, "\"%s\" is not a number", val);
		return -EINVAL;
	}
	if (k->type == K_FLOAT)
		v = (float)v;   /* check what is stored: 1e-50 is 0 as a float */
	if (!in_range(k, v)) {
		snprintf(err, errlen, "%s is out of range (expected %s)", val, range_text(k, rbuf, sizeof(rbuf)));
		return -EINVAL;
	}
	if (k->type == K_FLOAT)
		*(float *)f = (float)v;
	else
		*(double *)f = v;
	return 0;
}

static int parse_bool(const struct key_def *k, void *f, const char *val, char *err, size_t errlen)
{
	static const char *const yes[] = { "true", "yes", "on", "1" };
	static const char *const no[] = { "false", "no", "off", "0" };
	for (int i = 0; i < 4; i++) {
		if (strcmp(val, yes[i]) == 0) {
			*(int *)f = 1;
			return 0;
		}
		if (strcmp(val, no[i]) == 0) {
			*(int *)f = 0;
			return 0;
		}
	}
	snprintf(err, errlen, "\"%s\" is not a boolean (expected true%s false)", val,
		 k->flags & AUTO ? ", auto or" : " or");
	return -EINVAL;
}

static int parse_enum(const struct key_def *k, void *f, const char *val, char *err, size_t errlen)
{
	char list[256] = "";
	for (int i = 0; k->names[i]; i++) {
		if (strcmp(val, k->names[i]) == 0) {
			*(int *)f = i;
			return 0;
		}
		snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s",
			 i ? (k->names[i + 1] ? ", " : " or ") : "", k->names[i]);
	}
	snprintf(err, errlen, "\"%s\" is not one of %s", val, list);
	return -EINVAL;
}

/* A relative path is relative to the config file's directory. */
static int parse_path(void *f, const char *val, const char *dir, char *err, size_t errlen)
{
	int n;
	if (val[0] == '\0' || val[0] == '/' || dir[0] == '\0')
		n = snprintf(f, DATA_PATH_MAX, "%s", val);
	else
		n = snprintf(f, DATA_PATH_MAX, "%s/%s", dir, val);
	if (n < 0 || n >= DATA_PATH_MAX) {
		snprintf(err, errlen, "path is longer than %d characters", DATA_PATH_MAX - 1);
		return -EINVAL;
	}
	return 0;
}

static int parse_hosts(struct config *c, const struct key_def *k, void *f, const char *val, int append,
		       char *err, size_t errlen)
{
	struct host_list l = { f, config_count_field(c, k) };
	if (!append)
		*l.n = 0;
	/* An empty listen is "none": each ps binds its entry. */
	if (val[0] == '\0' && strcmp(k->key, "listen") == 0)
		return 0;
	return parse_list(val, host_item, &l, err, errlen);
}

static int parse_devices(struct config *c, const struct key_def *k, void *f, const char *val, int append,
			 char *err, size_t errlen)
{
	struct device_list l = { f, config_count_field(c, k), k };
	if (!append) {
		*l.n = 0;
		c->gpu.all = 0;
	}
	if (strcmp(val, "all") == 0 && !append) {
		c->gpu.all = 1;
		return 0;
	}
	if (c->gpu.all) {
		snprintf(err, errlen, "\"all\" cannot be combined with indices");
		return -EINVAL;
	}
	return parse_list(val, device_item, &l, err, errlen);
}

static int parse_label_column(const struct key_def *k, void *f, const char *val, char *err, size_t errlen)
{
	long v;
	if (strcmp(val, "first") == 0)
		v = 0;
	else if (strcmp(val, "last") == 0)
		v = -1;
	else if (parse_long(val, &v) || v < 0 || v > k->hi) {
		snprintf(err, errlen, "\"%s\" is not first, last or a 0-based column index", val);
		return -EINVAL;
	}
	*(int *)f = (int)v;
	return 0;
}

static int parse_layer(struct config *c, const struct key_def *k, void *f, const char *val,
		       char *err, size_t errlen)
{
	int *n = config_count_field(c, k);
	if (*n >= MODEL_MAX_LAYERS) {
		snprintf(err, errlen, "more than %d layers", MODEL_MAX_LAYERS);
		return -EINVAL;
	}
	struct layer_spec *s = (struct layer_spec *)f + *n;
	int r = layer_spec_parse(s, val, err, errlen);
	if (!r)
		(*n)++;
	return r;
}

/* Parses val into the field of k. append: val came from an indented line
 * that continues the key. */
int config_key_parse(struct config *c, const struct key_def *k, const char *val, int append,
		     const char *dir, char *err, size_t errlen)
{
	void *f = config_field(c, k);

	if ((k->flags & AUTO) && strcmp(val, "auto") == 0) {
		*(int *)f = k->type == K_BOOL ? CONFIG_OVERLAP_AUTO : CONFIG_INT_AUTO;
		return 0;
	}
	switch (k->type) {
	case K_INT:
	case K_LONG:
		return parse_integer(k, f, val, err, errlen);
	case K_U64:
		return parse_u64(f, val, err, errlen);
	case K_FLOAT:
	case K_DOUBLE:
		return parse_number(k, f, val, err, errlen);
	case K_BOOL:
		return parse_bool(k, f, val, err, errlen);
	case K_ENUM:
		return parse_enum(k, f, val, err, errlen);
	case K_PATH:
		return parse_path(f, val, dir, err, errlen);
	case K_HOSTS:
		return parse_hosts(c, k, f, val, append, err, errlen);
	case K_DEVICES:
		return parse_devices(c, k, f, val, append, err, errlen);
	case K_LABEL_COLUMN:
		return parse_label_column(k, f, val, err, errlen);
	case K_INPUT:
		return parse_input(c, k, val, err, errlen);
	case K_LAYER:
		return parse_layer(c, k, f, val, err, errlen);
	}
	snprintf(err, errlen, "internal: key type %d has no parser", (int)k->type);
	return -EINVAL;
}
