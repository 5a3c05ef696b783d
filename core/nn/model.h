/* The model: layer specs as the config states them, the built model with
 * shapes and its slices of the flat parameter vector, and initialization.
 *
 * Activations are NCHW, (B, C, H, W) like PyTorch; a flat activation (after
 * dense or flatten, or a plain "N" input) is (B, C, 1, 1) with C features.
 * Parameters live in ONE float32 vector (P), in layer order: dense weight
 * (OC, C) then bias (OC); conv weight (OC, C, K, K) then bias (OC);
 * batchnorm weight, bias, running_mean, running_var, each (C). A ps shard is
 * a contiguous range of this vector, so initialization is a function of
 * (seed, global parameter index) only: any sharding starts from the same
 * weights. Running the model lives in replica.c. */
#ifndef PSTRAIN_MODEL_H
#define PSTRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "embed.h"
#include "layers.h"

#define MODEL_MAX_LAYERS 64

enum layer_kind {
	LAYER_DENSE,
	LAYER_RELU,
	LAYER_TANH,
	LAYER_SIGMOID,
	LAYER_CONV,
	LAYER_MAXPOOL,
	LAYER_AVGPOOL,
	LAYER_DROPOUT,
	LAYER_FLATTEN,
	LAYER_BATCHNORM,
	LAYER_EMBEDDING,   /* first layer only; its tables are not in P (embed.h) */
};

#define PAD_SAME (-1)   /* layer_spec.pad: (K - 1) / 2, the size kept at stride 1 */

enum loss_kind {
	LOSS_SOFTMAX_XENT,
	LOSS_SIGMOID_XENT,   /* one output: a binary label's logit (click-through) */
};

struct layer_spec {
	enum layer_kind kind;
	int units;     /* dense: output features; conv: filters */
	int k;         /* conv, pools: kernel size K (K x K) */
	int stride;    /* conv (default 1), pools (default K) */
	int pad;       /* conv: zero padding on each side, or PAD_SAME */
	float p;       /* dropout: probability of dropping a unit, [0, 1) */
	struct embed_spec embed;   /* embedding */
	int line;      /* config line it came from, 0 if none (for messages) */
};

struct model_spec {
	int in_h, in_w, in_c;      /* input shape; a flat input is N x 1 x 1 */
	struct layer_spec layers[MODEL_MAX_LAYERS];
	int nlayers;
	enum loss_kind loss;
};

struct layer {
	enum layer_kind kind;
	char name[24];      /* "dense1", "relu2", ...: tensor names in checkpoints */
	int in, out;        /* features per sample (C*H*W in, OC*OH*OW out) */
	int C, H, W;        /* input shape per sample */
	int OC, OH, OW;     /* output shape per sample */
	int spatial;        /* output is an image (conv, pools, ...), not flat */
	struct window win;  /* conv, pools: the sliding window over the input */
	float p;            /* dropout probability */
	size_t woff, boff;  /* dense, conv: weight and bias; batchnorm: gamma, beta */
	size_t moff, voff;  /* batchnorm: running mean and variance (not trained) */
	size_t nparams;
	int line;
};

struct model {
	struct layer layers[MODEL_MAX_LAYERS];
	int nlayers;
	int inputs;         /* features per input sample */
	int in_c, in_h, in_w;   /* the input as (C, H, W) */
	int outputs;        /* logits per sample = number of classes */
	int max_width;      /* widest activation, for buffer sizing */
	size_t nparams;     /* P */
	enum loss_kind loss;
	/* The first layer's embedding (fields 0: none). Its output is the F
	 * pooled DIM-vectors, then the D = inputs numeric features. */
	struct embed_spec embed;
};

/* One named tensor of the flat parameter vector: what a checkpoint stores
 * and `check` prints. Names are "<layer>.<part>", e.g. "dense1.weight";
 * shapes follow PyTorch's (dense weight (OC, C)), so saved tensors load
 * into PyTorch unchanged. trainable = 0 marks state that the optimizer does
 * not update with a learning rate (e.g. running statistics). */
#define TENSOR_NAME_MAX 48
#define TENSOR_MAX_DIMS 4
struct tensor_info {
	char name[TENSOR_NAME_MAX];
	size_t off, n;              /* range [off, off + n) in P */
	int ndim;
	int shape[TENSOR_MAX_DIMS];
	int trainable;
};
/* Room for up to four tensors per layer (e.g. batchnorm: weight, bias,
 * running mean, running variance). */
#define MODEL_MAX_TENSORS (MODEL_MAX_LAYERS * 4)

/* Fills out[0..max) with the model's tensors in parameter order (they tile
 * [0, P) without gaps) and returns how many, or -ENOBUFS if max is short. */
int model_tensors(const struct model *m, struct tensor_info *out, int max);

/* Parses "dense 512", "relu", "tanh", "sigmoid", "conv 5x5 32 [stride=S]
 * [pad=P|same]" (or "conv 5 32"), "maxpool K [stride=S]", "avgpool K
 * [stride=S]", "dropout P", "flatten", "batchnorm", "embedding FIELDS ROWS
 * DIM [shared] [pool=sum|mean]". */
int layer_spec_parse(struct layer_spec *s, const char *text, char *err, size_t errlen);
/* The spec back as config text. */
void layer_spec_format(const struct layer_spec *s, char *buf, size_t len);
const char *layer_kind_name(enum layer_kind k);

/* Checks shapes and lays out parameters. The last layer must be dense (its
 * outputs are the logits): at least 2 of them for softmax_cross_entropy,
 * exactly 1 for sigmoid_cross_entropy. A dense layer after a spatial one
 * flattens its input implicitly (as an explicit flatten would). An
 * embedding layer must be the first, over a flat input (the D numeric
 * features; its output is (F*DIM + D)). A layer that does not fit its input
 * is an error naming the layer and both shapes. */
int model_build(struct model *m, const struct model_spec *s, char *err, size_t errlen);

/* Writes initial values of global parameters [begin, end) to out[0..end-begin).
 * Dense and conv weights: He normal (std sqrt(2/fan_in)) when a relu follows
 * (directly or after a batchnorm), otherwise Glorot uniform (limit
 * sqrt(6/(fan_in+fan_out))); fan_in = C*K*K and fan_out = OC*K*K for conv,
 * C and OC for dense. Biases 0; batchnorm gamma 1, beta 0, running mean 0,
 * running variance 1. */
void model_init_params(const struct model *m, float *out, size_t begin, size_t end,
		       uint64_t seed);

/* The shape of a layer's output, "(32, 14, 14)" or "(10)". */
void layer_shape_format(const struct layer *l, char *buf, size_t len);

/* Prints each layer's output shape and parameter count, one per line, each
 * line starting with "; " (config comments). */
void model_print(FILE *f, const struct model *m);

#endif
