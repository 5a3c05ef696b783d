/* The resolved configuration as `pstrain check` prints it, and the hash of
 * what must agree across a cluster (the handshake compares it). */
#include "config.h"
#include "config_keys.h"

#include <inttypes.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

static void number_print(FILE *f, double v, int is_float)
{
	char buf[32];
	for (int prec = 6; prec <= 17; prec++) {
		snprintf(buf, sizeof(buf), "%.*g", prec, v);
		double back = strtod(buf, NULL);
		if (is_float ? (float)back == (float)v : back == v)
			break;
	}
	fputs(buf, f);
}

/* Long lists go on indented continuation lines, as a user would write them:
 * Debian's inih reads lines of at most INI_MAX_LINE (200) bytes, and one
 * line of 30 hosts is longer, so the output would not load back. col is the
 * column the list starts at. */
#define PRINT_WIDTH 78

static void list_print(FILE *f, int *col, int first, const char *item)
{
	int n = (int)strlen(item);

	if (first) {
		fputs(item, f);
	} else if (*col + 2 + n > PRINT_WIDTH) {
		fprintf(f, ",\n  %s", item);
		*col = 2;
	} else {
		fprintf(f, ", %s", item);
		*col += 2;
	}
	*col += n;
}

static void hosts_print(FILE *f, const struct host *h, int n, int col)
{
	char item[CONFIG_HOST_MAX + 16];
	for (int i = 0; i < n; i++) {
		snprintf(item, sizeof(item), strchr(h[i].name, ':') ? "[%s]:%u" : "%s:%u", h[i].name, h[i].port);
		list_print(f, &col, i == 0, item);
	}
}

/* One "key = value" line (several for layer). */
static void key_print(FILE *f, const struct config *c, const struct key_def *k)
{
	const void *v = (const char *)c + k->off;
	if (k->type == K_LAYER) {
		char buf[64];
		for (int j = 0; j < c->model.nlayers; j++) {
			layer_spec_format(&c->model.layers[j], buf, sizeof(buf));
			fprintf(f, "layer = %s\n", buf);
		}
		return;
	}
	int col = fprintf(f, "%s = ", k->key);
	switch (k->type) {
	case K_INT:
		if ((k->flags & AUTO) && *(const int *)v == CONFIG_INT_AUTO)
			fprintf(f, "auto");
		else
			fprintf(f, "%d", *(const int *)v);
		break;
	case K_LONG: fprintf(f, "%ld", *(const long *)v); break;
	case K_U64: fprintf(f, "%llu", (unsigned long long)*(const uint64_t *)v); break;
	case K_FLOAT: number_print(f, *(const float *)v, 1); break;
	case K_DOUBLE: number_print(f, *(const double *)v, 0); break;
	case K_BOOL: fprintf(f, "%s", *(const int *)v == 2 ? "auto" : *(const int *)v ? "true" : "false"); break;
	case K_ENUM: fprintf(f, "%s", k->names[*(const int *)v]); break;
	case K_PATH: fprintf(f, "%s", (const char *)v); break;
	case K_HOSTS:
		hosts_print(f, v, *(const int *)((const char *)c + k->count_off), col);
		break;
	case K_DEVICES:
		if (c->gpu.all)
			fprintf(f, "all");
		for (int j = 0; !c->gpu.all && j < c->gpu.ndevices; j++) {
			char item[16];
			snprintf(item, sizeof(item), "%d", c->gpu.devices[j]);
			list_print(f, &col, j == 0, item);
		}
		break;
	case K_LABEL_COLUMN:
		if (c->data.label_column < 0)
			fprintf(f, "last");
		else if (c->data.label_column == 0)
			fprintf(f, "first");
		else
			fprintf(f, "%d", c->data.label_column);
		break;
	case K_INPUT:
		fprintf(f, "%dx%dx%d", c->model.in_h, c->model.in_w, c->model.in_c);
		break;
	case K_LAYER:
		break;
	}
	fprintf(f, "\n");
}

void config_print(const struct config *c, FILE *f)
{
	const char *section = "";
	for (size_t i = 0; i < config_nkeys; i++) {
		const struct key_def *k = &config_keys[i];
		if (strcmp(section, k->section)) {
			fprintf(f, "%s[%s]\n", i ? "\n" : "", k->section);
			section = k->section;
		}
		key_print(f, c, k);
	}
}

/* Keys that may differ between the nodes of one cluster: where files are on
 * this node, how it uses its own GPUs and CPUs, how often it reports, how
 * long it waits for its peers, whether it pushes while backward runs and
 * packs float32 (a ps packs only what a PULL asks for), which
 * ciphers it offers (each connection agrees on one in its handshake). */
static int key_is_node_local(const struct key_def *k)
{
	return k->type == K_PATH || strcmp(k->section, "gpu") == 0 || strcmp(k->section, "ps") == 0 ||
	       strcmp(k->key, "eval_every") == 0 || strcmp(k->key, "threads") == 0 ||
	       strcmp(k->key, "connect_timeout") == 0 || strcmp(k->key, "peer_timeout") == 0 ||
	       strcmp(k->key, "handshake_timeout") == 0 ||
	       strcmp(k->key, "crypto_threads") == 0 || strcmp(k->key, "listen") == 0 ||
	       strcmp(k->key, "send_buffer_kib") == 0 || strcmp(k->key, "overlap") == 0 ||
	       strcmp(k->key, "wire_pack") == 0 ||
	       strcmp(k->key, "local_socket") == 0 || strcmp(k->key, "local_ring") == 0 ||
	       strcmp(k->key, "cipher") == 0;
}

int config_hash(const struct config *c, uint8_t out[CONFIG_HASH_BYTES])
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return -ENOMEM;
	/* The canonical text of every training-relevant key, defaults
	 * included, so two files that say the same thing differently agree. */
	fprintf(f, "pstrain config v1\n");
	for (size_t i = 0; i < config_nkeys; i++) {
		/* The workers' entries only say where each is: their number
		 * counts through max_workers, so that the pods a scaled TFJob
		 * adds, whose TF_CONFIG lists more workers, agree with the
		 * others (docs/ELASTIC.md). */
		if (key_is_node_local(&config_keys[i]) || strcmp(config_keys[i].key, "workers") == 0)
			continue;
		fprintf(f, "[%s] ", config_keys[i].section);
		key_print(f, c, &config_keys[i]);
	}
	if (fclose(f) != 0 || !text) {
		free(text);
		return -ENOMEM;
	}
	crypto_generichash(out, CONFIG_HASH_BYTES, (const unsigned char *)text, len, NULL, 0);
	free(text);
	return 0;
}
