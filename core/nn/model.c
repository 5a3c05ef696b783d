/* Layer specs, shape checking, the parameter layout and initialization. */
#include "model.h"
#include "rng.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum layer_args {
	ARGS_NONE,      /* relu, flatten, ... */
	ARGS_UNITS,     /* dense N */
	ARGS_CONV,      /* conv KxK F [stride=S] [pad=P|same] */
	ARGS_POOL,      /* maxpool K [stride=S] */
	ARGS_PROB,      /* dropout P */
	ARGS_EMBED,     /* embedding FIELDS ROWS DIM [shared] [pool=sum|mean] */
};

struct layer_type {
	const char *name;
	enum layer_kind kind;
	enum layer_args args;
	const char *usage;
};

static const struct layer_type layer_types[] = {
	{ "dense", LAYER_DENSE, ARGS_UNITS, "dense N" },
	{ "relu", LAYER_RELU, ARGS_NONE, "relu" },
	{ "tanh", LAYER_TANH, ARGS_NONE, "tanh" },
	{ "sigmoid", LAYER_SIGMOID, ARGS_NONE, "sigmoid" },
	{ "conv", LAYER_CONV, ARGS_CONV, "conv KxK F [stride=S] [pad=P|same]" },
	{ "maxpool", LAYER_MAXPOOL, ARGS_POOL, "maxpool K [stride=S]" },
	{ "avgpool", LAYER_AVGPOOL, ARGS_POOL, "avgpool K [stride=S]" },
	{ "dropout", LAYER_DROPOUT, ARGS_PROB, "dropout P" },
	{ "flatten", LAYER_FLATTEN, ARGS_NONE, "flatten" },
	{ "batchnorm", LAYER_BATCHNORM, ARGS_NONE, "batchnorm" },
	{ "embedding", LAYER_EMBEDDING, ARGS_EMBED, "embedding FIELDS ROWS DIM [shared] [pool=sum|mean]" },
};

#define NTYPES (sizeof(layer_types) / sizeof(layer_types[0]))
#define MAX_UNITS (1 << 20)
#define MAX_WINDOW 255   /* kernel, stride and padding */
#define MAX_TOKENS 6
#define TOKEN_MAX 32
#define LAYER_USAGE "dense N, relu, tanh, sigmoid, conv KxK F, maxpool K, avgpool K, dropout P, flatten, batchnorm or embedding FIELDS ROWS DIM"

const char *layer_kind_name(enum layer_kind k)
{
	for (size_t i = 0; i < NTYPES; i++)
		if (layer_types[i].kind == k)
			return layer_types[i].name;
	return "?";
}

/* Splits text at blanks into tok[0..*n). */
static int tokenize(char tok[][TOKEN_MAX], int *n, const char *text)
{
	const char *p = text;
	*n = 0;
	for (;;) {
		while (*p == ' ' || *p == '\t')
			p++;
		if (!*p)
			return 0;
		size_t len = 0;
		while (p[len] && p[len] != ' ' && p[len] != '\t')
			len++;
		if (*n == MAX_TOKENS || len >= TOKEN_MAX)
			return -EINVAL;
		memcpy(tok[*n], p, len);
		tok[*n][len] = '\0';
		(*n)++;
		p += len;
	}
}

/* A whole decimal integer in [lo, hi]. */
static int parse_int(const char *s, int lo, int hi, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (end == s || *end || errno || v < lo || v > hi || !(*s >= '0' && *s <= '9'))
		return -EINVAL;
	*out = (int)v;
	return 0;
}

/* "stride=S" or "pad=P" / "pad=same" (same only when allow_same). */
static int parse_option(struct layer_spec *s, const char *tok, int allow_pad, const char *word,
			char *err, size_t errlen)
{
	if (strncmp(tok, "stride=", 7) == 0) {
		if (parse_int(tok + 7, 1, MAX_WINDOW, &s->stride) == 0)
			return 0;
		snprintf(err, errlen, "layer %s: \"%s\" is not a stride (stride=1..%d)", word, tok, MAX_WINDOW);
		return -EINVAL;
	}
	if (allow_pad && strncmp(tok, "pad=", 4) == 0) {
		if (strcmp(tok + 4, "same") == 0) {
			s->pad = PAD_SAME;
			return 0;
		}
		if (parse_int(tok + 4, 0, MAX_WINDOW, &s->pad) == 0)
			return 0;
		snprintf(err, errlen, "layer %s: \"%s\" is not a padding (pad=0..%d or pad=same)", word, tok, MAX_WINDOW);
		return -EINVAL;
	}
	snprintf(err, errlen, "layer %s: unknown option \"%s\" (expected %s)", word, tok,
		 allow_pad ? "stride=S or pad=P|same" : "stride=S");
	return -EINVAL;
}

/* "5x5" or "5": a square kernel. */
static int parse_kernel(const char *tok, int *k)
{
	const char *x = strchr(tok, 'x');
	if (!x)
		return parse_int(tok, 1, MAX_WINDOW, k);
	char a[TOKEN_MAX];
	int k2;
	memcpy(a, tok, (size_t)(x - tok));
	a[x - tok] = '\0';
	if (parse_int(a, 1, MAX_WINDOW, k) || parse_int(x + 1, 1, MAX_WINDOW, &k2) || k2 != *k)
		return -EINVAL;
	return 0;
}

/* "embedding FIELDS ROWS DIM [options]" in tok[0 .. n). */
static int parse_embed(struct embed_spec *e, char tok[][TOKEN_MAX], int n, const char *usage, char *err,
		       size_t errlen)
{
	static const char *const what[3] = { "field count (FIELDS", "row count (ROWS", "width (DIM" };
	const int hi[3] = { EMBED_MAX_FIELDS, EMBED_MAX_ROWS, EMBED_MAX_DIM };
	int *field[3] = { &e->fields, &e->rows, &e->dim };
	if (n < 4) {
		snprintf(err, errlen, "layer embedding needs FIELDS ROWS DIM (%s)", usage);
		return -EINVAL;
	}
	for (int i = 0; i < 3; i++)
		if (parse_int(tok[i + 1], 1, hi[i], field[i])) {
			snprintf(err, errlen, "layer embedding: \"%s\" is not a %s, 1..%d)", tok[i + 1], what[i], hi[i]);
			return -EINVAL;
		}
	int seen_pool = 0;
	for (int i = 4; i < n; i++)
		if (embed_spec_option(e, tok[i], &seen_pool, err, errlen))
			return -EINVAL;
	return 0;
}

int layer_spec_parse(struct layer_spec *s, const char *text, char *err, size_t errlen)
{
	char tok[MAX_TOKENS][TOKEN_MAX];
	int n;

	if (tokenize(tok, &n, text) || n == 0) {
		snprintf(err, errlen, "\"%s\" is not a layer (expected %s)", text, LAYER_USAGE);
		return -EINVAL;
	}
	const struct layer_type *t = NULL;
	for (size_t i = 0; i < NTYPES; i++)
		if (strcmp(layer_types[i].name, tok[0]) == 0)
			t = &layer_types[i];
	if (!t) {
		snprintf(err, errlen, "unknown layer type \"%s\" (expected %s)", tok[0], LAYER_USAGE);
		return -EINVAL;
	}

	memset(s, 0, sizeof(*s));
	s->kind = t->kind;
	const char *word = t->name;
	switch (t->args) {
	case ARGS_NONE:
		if (n > 1) {
			snprintf(err, errlen, "layer %s takes no arguments, got \"%s\"", word, tok[1]);
			return -EINVAL;
		}
		return 0;
	case ARGS_UNITS:
		if (n != 2 || parse_int(tok[1], 1, MAX_UNITS, &s->units)) {
			snprintf(err, errlen, "layer %s: \"%s\" is not a unit count (1..%d)", word,
				 n > 1 ? tok[1] : "", MAX_UNITS);
			return -EINVAL;
		}
		return 0;
	case ARGS_PROB: {
		char *end;
		errno = 0;
		double p = n == 2 ? strtod(tok[1], &end) : -1.0;
		if (n != 2 || *end || errno || !(p >= 0.0 && p < 1.0)) {
			snprintf(err, errlen, "layer %s: \"%s\" is not a probability (0 <= P < 1)", word,
				 n > 1 ? tok[1] : "");
			return -EINVAL;
		}
		s->p = (float)p;
		/* A p just below 1 that rounds to 1.0f would keep nothing. */
		if (!(s->p < 1.0f)) {
			snprintf(err, errlen, "layer %s: \"%s\" is not a probability (0 <= P < 1)", word, tok[1]);
			return -EINVAL;
		}
		return 0;
	}
	case ARGS_CONV:
		if (n < 3) {
			snprintf(err, errlen, "layer %s needs a kernel and a filter count (%s)", word, t->usage);
			return -EINVAL;
		}
		if (parse_kernel(tok[1], &s->k)) {
			snprintf(err, errlen, "layer %s: \"%s\" is not a square kernel (K or KxK, 1..%d)", word,
				 tok[1], MAX_WINDOW);
			return -EINVAL;
		}
		if (parse_int(tok[2], 1, MAX_UNITS, &s->units)) {
			snprintf(err, errlen, "layer %s: \"%s\" is not a filter count (1..%d)", word, tok[2], MAX_UNITS);
			return -EINVAL;
		}
		s->stride = 1;
		for (int i = 3; i < n; i++)
			if (parse_option(s, tok[i], 1, word, err, errlen))
				return -EINVAL;
		return 0;
	case ARGS_EMBED:
		return parse_embed(&s->embed, tok, n, t->usage, err, errlen);
	case ARGS_POOL:
		if (n < 2 || parse_int(tok[1], 1, MAX_WINDOW, &s->k)) {
			snprintf(err, errlen, "layer %s: \"%s\" is not a window size (1..%d)", word,
				 n > 1 ? tok[1] : "", MAX_WINDOW);
			return -EINVAL;
		}
		s->stride = s->k;
		for (int i = 2; i < n; i++)
			if (parse_option(s, tok[i], 0, word, err, errlen))
				return -EINVAL;
		return 0;
	}
	return -EINVAL;
}

void layer_spec_format(const struct layer_spec *s, char *buf, size_t len)
{
	switch (s->kind) {
	case LAYER_DENSE:
		snprintf(buf, len, "dense %d", s->units);
		return;
	case LAYER_DROPOUT:
		snprintf(buf, len, "dropout %.9g", (double)s->p);
		return;
	case LAYER_EMBEDDING:
		embed_spec_format(&s->embed, buf, len);
		return;
	case LAYER_CONV: {
		char pad[24] = "";
		if (s->pad == PAD_SAME)
			snprintf(pad, sizeof(pad), " pad=same");
		else if (s->pad)
			snprintf(pad, sizeof(pad), " pad=%d", s->pad);
		char stride[24] = "";
		if (s->stride != 1)
			snprintf(stride, sizeof(stride), " stride=%d", s->stride);
		snprintf(buf, len, "conv %dx%d %d%s%s", s->k, s->k, s->units, stride, pad);
		return;
	}
	case LAYER_MAXPOOL:
	case LAYER_AVGPOOL:
		if (s->stride != s->k)
			snprintf(buf, len, "%s %d stride=%d", layer_kind_name(s->kind), s->k, s->stride);
		else
			snprintf(buf, len, "%s %d", layer_kind_name(s->kind), s->k);
		return;
	default:
		snprintf(buf, len, "%s", layer_kind_name(s->kind));
	}
}

/* Parameter vectors are indexed with size_t, but the wire and checkpoints
 * bound a model at 2^31 parameters, far more than a CPU step can touch. */
#define MAX_PARAMS ((size_t)1 << 31)
/* Floats per sample of one activation: activations are indexed with int
 * per sample and size_t per batch. */
#define MAX_ACTIVATION (1 << 26)

static void shape_format(char *buf, size_t len, int C, int H, int W, int spatial)
{
	if (spatial)
		snprintf(buf, len, "(%d, %d, %d)", C, H, W);
	else
		snprintf(buf, len, "(%ld)", (long)C * H * W);
}

void layer_shape_format(const struct layer *l, char *buf, size_t len)
{
	shape_format(buf, len, l->OC, l->OH, l->OW, l->spatial);
}

/* Sets l's window, output shape and parameter count for input (C, H, W). */
static int layer_shape(struct layer *l, const struct layer_spec *ls, int spatial,
		       char *err, size_t errlen)
{
	char spec[64], in[48];
	layer_spec_format(ls, spec, sizeof(spec));
	shape_format(in, sizeof(in), l->C, l->H, l->W, spatial);
	l->OC = l->C;
	l->OH = l->H;
	l->OW = l->W;
	l->spatial = spatial;
	switch (ls->kind) {
	case LAYER_DENSE:
		l->OC = ls->units;
		l->OH = l->OW = 1;
		l->spatial = 0;
		l->nparams = (size_t)l->OC * (size_t)l->in + (size_t)l->OC;
		return 0;
	case LAYER_FLATTEN:
		l->OC = l->in;
		l->OH = l->OW = 1;
		l->spatial = 0;
		return 0;
	case LAYER_BATCHNORM:
		l->nparams = 4 * (size_t)l->C;
		return 0;
	case LAYER_DROPOUT:
		l->p = ls->p;
		return 0;
	case LAYER_EMBEDDING:
		/* Its tables are not parameters of P: nparams stays 0. */
		if (spatial) {
			snprintf(err, errlen, "[model] layer %s (%s) needs a flat input (the numeric features, [model] input = D), but its input is %s",
				 l->name, spec, in);
			return -EINVAL;
		}
		l->OC = ls->embed.fields * ls->embed.dim + l->in;
		return 0;
	case LAYER_CONV:
	case LAYER_MAXPOOL:
	case LAYER_AVGPOOL:
		break;
	default:
		return 0;
	}
	if (!spatial) {
		snprintf(err, errlen, "[model] layer %s (%s) needs an image input (C, H, W), but its input is flat %s",
			 l->name, spec, in);
		return -EINVAL;
	}
	struct window *w = &l->win;
	w->C = l->C;
	w->H = l->H;
	w->W = l->W;
	w->K = ls->k;
	w->S = ls->stride;
	w->P = ls->kind == LAYER_CONV ? ls->pad : 0;
	if (w->P == PAD_SAME) {
		if (ls->k % 2 == 0) {
			snprintf(err, errlen, "[model] layer %s (%s): pad=same needs an odd kernel (got %d)",
				 l->name, spec, ls->k);
			return -EINVAL;
		}
		w->P = (ls->k - 1) / 2;
	}
	if (window_init(w)) {
		snprintf(err, errlen, "[model] layer %s (%s): its %dx%d window%s does not fit its input %s",
			 l->name, spec, w->K, w->K, w->P ? " with its padding" : "", in);
		return -EINVAL;
	}
	l->OC = ls->kind == LAYER_CONV ? ls->units : l->C;
	l->OH = w->OH;
	l->OW = w->OW;
	if (ls->kind == LAYER_CONV)
		l->nparams = (size_t)l->OC * (size_t)l->C * (size_t)w->K * (size_t)w->K + (size_t)l->OC;
	return 0;
}

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
	/* "784" (N x 1 x 1) is a flat vector of features; anything wider is an
	 * image of in_c channels of in_h x in_w, stored channel by channel. */
	int spatial = !(s->in_w == 1 && s->in_c == 1);
	int C = spatial ? s->in_c : (int)inputs, H = spatial ? s->in_h : 1, W = spatial ? s->in_w : 1;
	int counts[NTYPES] = { 0 };
	m->inputs = (int)inputs;
	m->in_c = C;
	m->in_h = H;
	m->in_w = W;
	m->max_width = (int)inputs;
	m->loss = s->loss;
	for (int i = 0; i < s->nlayers; i++) {
		const struct layer_spec *ls = &s->layers[i];
		struct layer *l = &m->layers[i];
		l->kind = ls->kind;
		l->line = ls->line;
		l->C = C;
		l->H = H;
		l->W = W;
		l->in = C * H * W;
		counts[ls->kind]++;
		snprintf(l->name, sizeof(l->name), "%s%d", layer_kind_name(ls->kind), counts[ls->kind]);
		if (ls->kind == LAYER_EMBEDDING && i > 0) {
			snprintf(err, errlen, "[model] layer %s: an embedding layer must be the first layer (it reads the samples' categorical IDs)",
				 l->name);
			return -EINVAL;
		}
		int e = layer_shape(l, ls, spatial, err, errlen);
		if (e)
			return e;
		if (ls->kind == LAYER_EMBEDDING)
			m->embed = ls->embed;
		long out = (long)l->OC * l->OH * l->OW;
		if (out > MAX_ACTIVATION) {
			char spec[64];
			layer_spec_format(ls, spec, sizeof(spec));
			snprintf(err, errlen, "[model] layer %s (%s): its output has %ld values per sample (at most %d)",
				 l->name, spec, out, MAX_ACTIVATION);
			return -EINVAL;
		}
		l->out = (int)out;
		if (l->nparams > MAX_PARAMS - m->nparams) {
			snprintf(err, errlen, "[model] layer %s: the model exceeds %zu parameters",
				 l->name, MAX_PARAMS);
			return -EINVAL;
		}
		/* weight, then bias; batchnorm adds its running statistics. */
		if (l->nparams) {
			size_t nb = ls->kind == LAYER_BATCHNORM ? (size_t)l->C : (size_t)l->OC;
			l->woff = m->nparams;
			l->boff = l->woff + (ls->kind == LAYER_BATCHNORM ? nb : l->nparams - nb);
			l->moff = l->boff + nb;
			l->voff = l->moff + nb;
		}
		m->nparams += l->nparams;
		C = l->OC;
		H = l->OH;
		W = l->OW;
		spatial = l->spatial;
		if (l->out > m->max_width)
			m->max_width = l->out;
	}
	m->nlayers = s->nlayers;
	const struct layer *last = &m->layers[m->nlayers - 1];
	int sigmoid = s->loss == LOSS_SIGMOID_XENT;
	const char *loss = sigmoid ? "sigmoid_cross_entropy" : "softmax_cross_entropy";
	if (last->kind != LAYER_DENSE) {
		snprintf(err, errlen, "[model] the last layer is %s, but %s needs a dense layer producing the logits",
			 last->name, loss);
		return -EINVAL;
	}
	if (sigmoid && last->out != 1) {
		snprintf(err, errlen, "[model] the last layer %s has %d outputs; loss = sigmoid_cross_entropy needs 1 (the logit of a 0/1 label): make it dense 1",
			 last->name, last->out);
		return -EINVAL;
	}
	if (!sigmoid && last->out < 2) {
		snprintf(err, errlen, "[model] the last layer %s has %d output; classification needs at least 2",
			 last->name, last->out);
		return -EINVAL;
	}
	m->outputs = last->out;
	return 0;
}

/* Does a relu follow layer i, directly or after a batchnorm? */
static int relu_follows(const struct model *m, int i)
{
	int j = i + 1;
	if (j < m->nlayers && m->layers[j].kind == LAYER_BATCHNORM)
		j++;
	return j < m->nlayers && m->layers[j].kind == LAYER_RELU;
}

/* out[p - begin] = v for p in [off, off + n) within [begin, end). */
static void fill(float *out, size_t begin, size_t end, size_t off, size_t n, float v)
{
	size_t lo = off > begin ? off : begin;
	size_t hi = off + n < end ? off + n : end;
	for (size_t p = lo; p < hi; p++)
		out[p - begin] = v;
}

void model_init_params(const struct model *m, float *out, size_t begin, size_t end,
		       uint64_t seed)
{
	for (int i = 0; i < m->nlayers; i++) {
		const struct layer *l = &m->layers[i];
		if (l->kind == LAYER_BATCHNORM) {
			fill(out, begin, end, l->woff, (size_t)l->C, 1.0f);
			fill(out, begin, end, l->boff, (size_t)l->C, 0.0f);
			fill(out, begin, end, l->moff, (size_t)l->C, 0.0f);
			fill(out, begin, end, l->voff, (size_t)l->C, 1.0f);
			continue;
		}
		if (l->kind != LAYER_DENSE && l->kind != LAYER_CONV)
			continue;
		double kk = l->kind == LAYER_CONV ? (double)l->win.K * l->win.K : 1.0;
		double fan_in = l->kind == LAYER_CONV ? l->C * kk : l->in;
		double fan_out = l->OC * kk;
		int he = relu_follows(m, i);
		double std = sqrt(2.0 / fan_in);
		double limit = sqrt(6.0 / (fan_in + fan_out));
		size_t lo = l->woff > begin ? l->woff : begin;
		size_t hi = l->boff < end ? l->boff : end;
		for (size_t p = lo; p < hi; p++) {
			double v = he ? std * rng_normal(seed, RNG_INIT, p)
				      : limit * (2.0 * rng_uniform(seed, RNG_INIT, p) - 1.0);
			out[p - begin] = (float)v;
		}
		fill(out, begin, end, l->boff, (size_t)l->OC, 0.0f);
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
		if (l->kind == LAYER_DENSE || l->kind == LAYER_CONV) {
			if (n + 2 > max)
				return -ENOBUFS;
			int w[4] = { l->OC, l->C, l->win.K, l->win.K };
			if (l->kind == LAYER_DENSE)
				w[1] = l->in;
			tensor_set(&out[n++], l->name, "weight", l->woff, l->kind == LAYER_CONV ? 4 : 2, w, 1);
			tensor_set(&out[n++], l->name, "bias", l->boff, 1, w, 1);
		} else if (l->kind == LAYER_BATCHNORM) {
			if (n + 4 > max)
				return -ENOBUFS;
			int c[1] = { l->C };
			tensor_set(&out[n++], l->name, "weight", l->woff, 1, c, 1);
			tensor_set(&out[n++], l->name, "bias", l->boff, 1, c, 1);
			tensor_set(&out[n++], l->name, "running_mean", l->moff, 1, c, 0);
			tensor_set(&out[n++], l->name, "running_var", l->voff, 1, c, 0);
		}
	}
	return n;
}

void model_print(FILE *f, const struct model *m)
{
	char shape[48];
	shape_format(shape, sizeof(shape), m->in_c, m->in_h, m->in_w, !(m->in_h == 1 && m->in_w == 1));
	fprintf(f, ";   %-12s %-10s %-16s %12s  %s\n", "layer", "type", "output (C,H,W)", "parameters", "line");
	fprintf(f, ";   %-12s %-10s %-16s %12s\n", "input", "", shape, "");
	for (int i = 0; i < m->nlayers; i++) {
		const struct layer *l = &m->layers[i];
		char line[16] = "default";
		if (l->line)
			snprintf(line, sizeof(line), "%d", l->line);
		layer_shape_format(l, shape, sizeof(shape));
		fprintf(f, ";   %-12s %-10s %-16s %12zu  %s\n", l->name, layer_kind_name(l->kind), shape,
			l->nparams, line);
	}
}
