/* The networks the compute benchmarks time, under the names
 * bench/torch_mlp.py builds them by, so both sides run the same model. */
#ifndef PSTRAIN_BENCH_MODELS_H
#define PSTRAIN_BENCH_MODELS_H

#include <stddef.h>
#include <string.h>

struct bench_model {
	const char *name, *input, *layers;   /* [model] input and layer lines */
};

static const struct bench_model bench_models[] = {
	{ "mlp", "784", "layer = dense 512\nlayer = relu\nlayer = dense 512\nlayer = relu\nlayer = dense 10\n" },
	{ "wide", "4096", "layer = dense 4096\nlayer = relu\nlayer = dense 4096\nlayer = relu\nlayer = dense 10\n" },
	{ "cnn", "28x28x1",
	  "layer = conv 5x5 32 pad=same\nlayer = relu\nlayer = maxpool 2\n"
	  "layer = conv 5x5 64 pad=same\nlayer = relu\nlayer = maxpool 2\n"
	  "layer = dense 1024\nlayer = relu\nlayer = dropout 0.5\nlayer = dense 10\n" },
	/* examples/fashion-cnn.ini's network, layer for layer: "cnn" with a
	 * batchnorm after each conv. */
	{ "fashion-cnn", "28x28x1",
	  "layer = conv 5x5 32 pad=same\nlayer = batchnorm\nlayer = relu\nlayer = maxpool 2\n"
	  "layer = conv 5x5 64 pad=same\nlayer = batchnorm\nlayer = relu\nlayer = maxpool 2\n"
	  "layer = dense 1024\nlayer = relu\nlayer = dropout 0.5\nlayer = dense 10\n" },
};

/* The model called name, or NULL. */
static inline const struct bench_model *bench_model_find(const char *name)
{
	for (size_t i = 0; i < sizeof(bench_models) / sizeof(bench_models[0]); i++)
		if (strcmp(bench_models[i].name, name) == 0)
			return &bench_models[i];
	return NULL;
}

#endif
