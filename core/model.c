/* Layer specs, shape checking, the parameter layout and initialization. */
#include "model.h"
#include "rng.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct layer_type {
	const char *name;
	enum layer_kind kind;
	int has_units;
};

static const struct layer_type layer_types[] = {
	{ "dense", LAYER_DENSE, 1 },
	{ "relu", LAYER_RELU, 0 },
	{ "tanh", LAYER_TANH, 0 },
	{ "sigmoid", LAYER_SIGMOID, 0 },
};

#define NTYPES (sizeof(layer_types) / sizeof(layer_types[0]))
#define MAX_UNITS (1 << 20)

const char *layer_kind_name(enum layer_kind k)
{
	for (size_t i = 0; i < NTYPES; i++)
		if (layer_types[i].kind == k)
			return layer_types[i].name;
	return "?";
}

int layer_spec_parse(struct layer_spec *s, const char *text, char *err, size_t errlen)
{
	char word[32];
	const char *p = text;
	size_t n = 0;

	while (*p == ' ' || *p == '\t')
		p++;
	while (p[n] && p[n] != ' ' && p[n] != '\t')
		n++;
	if (n == 0 || n >= sizeof(word)) {
		snprintf(err, errlen, "\"%s\" is not a layer (expected dense N, relu, tanh or sigmoid)", text);
		return -EINVAL;
	}
	memcpy(word, p, n);
	word[n] = '\0';
	p += n;

	const struct layer_type *t = NULL;
	for (size_t i = 0; i < NTYPES; i++)
		if (strcmp(layer_types[i].name, word) == 0)
			t = &layer_types[i];
	if (!t) {
		snprintf(err, errlen, "unknown layer type \"%s\" (expected dense N, relu, tanh or sigmoid)", word);
		return -EINVAL;
	}

	memset(s, 0, sizeof(*s));
	s->kind = t->kind;
	while (*p == ' ' || *p == '\t')
		p++;
	if (!t->has_units) {
		if (*p) {
			snprintf(err, errlen, "layer %s takes no arguments, got \"%s\"", word, p);
			return -EINVAL;
		}
		return 0;
	}
	char *end;
	errno = 0;
	long v = strtol(p, &end, 10);
	while (*end == ' ' || *end == '\t')
		end++;
	if (!*p || *end || errno || v < 1 || v > MAX_UNITS) {
		snprintf(err, errlen, "layer %s: \"%s\" is not a unit count (1..%d)", word, p, MAX_UNITS);
		return -EINVAL;
	}
	s->units = (int)v;
	return 0;
}

void layer_spec_format(const struct layer_spec *s, char *buf, size_t len)
{
	if (s->kind == LAYER_DENSE)
		snprintf(buf, len, "dense %d", s->units);
	else
		snprintf(buf, len, "%s", layer_kind_name(s->kind));
}

/* Parameter vectors are indexed with size_t, but the wire and checkpoints
 * bound a model at 2^31 parameters, far more than a CPU step can touch. */
#define MAX_PARAMS ((size_t)1 << 31)

int model_build(struct model *m, const struct model_spec *s, char *err, size_t errlen)
{
	memset(m, 0, sizeof(*m));
	long inputs = (long)s->in_h * s->in_w * s->in_c;
	if (inputs < 1 || inputs > MAX_UNITS) {
		snprintf(err, errlen, "[model] input: %dx%dx%d has %ld features (expected 1..%d)",
			 s->in_h, s->in_w, s->in_c, inputs, MAX_UNITS);
		return -EINVAL;
	}
	if (s->nlayers < 1) {
		snprintf(err, errlen, "[model] has no layers (add lines like: layer = dense 10)");
		return -EINVAL;
	}
	int width = (int)inputs;
	int counts[NTYPES] = { 0 };
	m->inputs = width;
	m->max_width = width;
	m->loss = s->loss;
	for (int i = 0; i < s->nlayers; i++) {
		const struct layer_spec *ls = &s->layers[i];
		struct layer *l = &m->layers[i];
		l->kind = ls->kind;
		l->line = ls->line;
		l->in = width;
		l->out = ls->kind == LAYER_DENSE ? ls->units : width;
		counts[ls->kind]++;
		snprintf(l->name, sizeof(l->name), "%s%d", layer_kind_name(ls->kind), counts[ls->kind]);
		if (ls->kind == LAYER_DENSE) {
			size_t w = (size_t)l->out * (size_t)l->in;
			l->woff = m->nparams;
			l->boff = m->nparams + w;
			l->nparams = w + (size_t)l->out;
			if (l->nparams > MAX_PARAMS - m->nparams) {
				snprintf(err, errlen, "[model] layer %s: the model exceeds %zu parameters",
					 l->name, MAX_PARAMS);
				return -EINVAL;
			}
			m->nparams += l->nparams;
		}
		width = l->out;
		if (width > m->max_width)
			m->max_width = width;
	}
	m->nlayers = s->nlayers;
	const struct layer *last = &m->layers[m->nlayers - 1];
	if (last->kind != LAYER_DENSE) {
		snprintf(err, errlen, "[model] the last layer is %s, but softmax_cross_entropy needs a dense layer producing the logits",
			 last->name);
		return -EINVAL;
	}
	if (last->out < 2) {
		snprintf(err, errlen, "[model] the last layer %s has %d output; classification needs at least 2",
			 last->name, last->out);
		return -EINVAL;
	}
	m->outputs = last->out;
	return 0;
}

void model_init_params(const struct model *m, float *out, size_t begin, size_t end,
		       uint64_t seed)
{
	for (int i = 0; i < m->nlayers; i++) {
		const struct layer *l = &m->layers[i];
		if (l->kind != LAYER_DENSE)
			continue;
		int he = i + 1 < m->nlayers && m->layers[i + 1].kind == LAYER_RELU;
		double std = sqrt(2.0 / l->in);
		double limit = sqrt(6.0 / (l->in + l->out));
		size_t lo = l->woff > begin ? l->woff : begin;
		size_t hi = l->boff < end ? l->boff : end;
		for (size_t p = lo; p < hi; p++) {
			double v = he ? std * rng_normal(seed, RNG_INIT, p)
				      : limit * (2.0 * rng_uniform(seed, RNG_INIT, p) - 1.0);
			out[p - begin] = (float)v;
		}
		lo = l->boff > begin ? l->boff : begin;
		hi = l->boff + (size_t)l->out < end ? l->boff + (size_t)l->out : end;
		for (size_t p = lo; p < hi; p++)
			out[p - begin] = 0.0f;
	}
}

static void tensor_set(struct tensor_info *t, const char *layer, const char *part,
		       size_t off, int ndim, const int *shape, int trainable)
{
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s.%s", layer, part);
	t->off = off;
	t->ndim = ndim;
	t->n = 1;
	for (int d = 0; d < ndim; d++) {
		t->shape[d] = shape[d];
		t->n *= (size_t)shape[d];
	}
	t->trainable = trainable;
}

int model_tensors(const struct model *m, struct tensor_info *out, int max)
{
	int n = 0;
	for (int i = 0; i < m->nlayers; i++) {
		const struct layer *l = &m->layers[i];
		if (l->kind != LAYER_DENSE)
			continue;
		if (n + 2 > max)
			return -ENOBUFS;
		int w[2] = { l->out, l->in };
		tensor_set(&out[n++], l->name, "weight", l->woff, 2, w, 1);
		tensor_set(&out[n++], l->name, "bias", l->boff, 1, w, 1);
	}
	return n;
}
