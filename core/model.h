/* The model: layer specs as the config states them, the built model with
 * shapes and its slices of the flat parameter vector, and initialization.
 *
 * Parameters live in ONE float32 vector (P). Each dense layer owns a weight
 * slice (OC, C) followed by a bias slice (OC), in layer order. A ps shard is
 * a contiguous range of this vector, so initialization is a function of
 * (seed, global parameter index) only: any sharding starts from the same
 * weights. Running the model lives in replica.c. */
#ifndef PSTRAIN_MODEL_H
#define PSTRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define MODEL_MAX_LAYERS 64

enum layer_kind {
	LAYER_DENSE,
	LAYER_RELU,
	LAYER_TANH,
	LAYER_SIGMOID,
};

enum loss_kind {
	LOSS_SOFTMAX_XENT,
};

struct layer_spec {
	enum layer_kind kind;
	int units;     /* dense: output features */
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
	int in, out;        /* features per sample (C, OC) */
	size_t woff, boff;  /* dense: weight (OC, C) and bias (OC) offsets in P */
	size_t nparams;
	int line;
};

struct model {
	struct layer layers[MODEL_MAX_LAYERS];
	int nlayers;
	int inputs;         /* features per input sample */
	int outputs;        /* logits per sample = number of classes */
	int max_width;      /* widest activation, for buffer sizing */
	size_t nparams;     /* P */
	enum loss_kind loss;
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

/* Parses "dense 512", "relu", "tanh", "sigmoid". */
int layer_spec_parse(struct layer_spec *s, const char *text, char *err, size_t errlen);
/* The spec back as config text. */
void layer_spec_format(const struct layer_spec *s, char *buf, size_t len);
const char *layer_kind_name(enum layer_kind k);

/* Checks shapes and lays out parameters. The last layer must be dense (its
 * outputs are the logits). */
int model_build(struct model *m, const struct model_spec *s, char *err, size_t errlen);

/* Writes initial values of global parameters [begin, end) to out[0..end-begin).
 * Dense weights: He normal (std sqrt(2/C)) when a relu follows, otherwise
 * Glorot uniform (limit sqrt(6/(C+OC))); biases 0. */
void model_init_params(const struct model *m, float *out, size_t begin, size_t end,
		       uint64_t seed);

#endif
