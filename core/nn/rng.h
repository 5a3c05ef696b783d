/* Counter-based random numbers.
 *
 * Every random value pstrain uses is a pure function of (seed, stream, index):
 * parameter i of the model gets the same initial value whatever process,
 * shard or thread computes it, and a data shuffle is reproducible from
 * (seed, epoch). The sequential generator is for loops that consume many
 * values in order (Fisher-Yates shuffles). */
#ifndef PSTRAIN_RNG_H
#define PSTRAIN_RNG_H

#include <stdint.h>

/* Streams keep unrelated uses of one seed independent. */
enum rng_stream {
	RNG_INIT = 1,      /* parameter initialization, index = global parameter index */
	RNG_SHUFFLE = 2,   /* per-epoch data order, index = epoch */
	RNG_SPLIT = 3,     /* train/test split of a single CSV file */
	RNG_DATA = 4,      /* synthetic data in tests and benchmarks */
	RNG_DROPOUT = 5,   /* dropout masks, index = (step, stream, layer, element) keys */
	RNG_EMBED = 6,     /* embedding tables' initial values, index = row * DIM + d */
};

uint64_t rng_hash(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform in the open interval (0, 1). */
double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Standard normal (Box-Muller on two hashed uniforms). */
double rng_normal(uint64_t seed, uint64_t stream, uint64_t index);

struct rng {
	uint64_t state;
};

void rng_seed(struct rng *r, uint64_t seed, uint64_t stream, uint64_t index);
uint64_t rng_next(struct rng *r);
/* Uniform integer in [0, n), n > 0, without modulo bias. */
uint64_t rng_below(struct rng *r, uint64_t n);
/* Uniform double in (0, 1). */
double rng_next_uniform(struct rng *r);

#endif
