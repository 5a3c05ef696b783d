/* Counter-based random numbers: splitmix64 finalizers over (seed, stream, index). */
#include "rng.h"

#include <math.h>

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

uint64_t rng_hash(uint64_t seed, uint64_t stream, uint64_t index)
{
	/* Mixing each component separately keeps (s, t, i) and (s, t+1, i-k)
	 * from colliding the way a plain sum would. */
	uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ULL);
	h = mix64(h ^ (stream * 0xd1b54a32d192ed03ULL));
	return mix64(h ^ (index + 0x632be59bd9b4e019ULL));
}

static double to_open01(uint64_t x)
{
	/* 53 random bits, shifted half a step so 0 and 1 never occur. */
	return ((double)(x >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
	return to_open01(rng_hash(seed, stream, index));
}

double rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
	uint64_t h = rng_hash(seed, stream, index);
	double u1 = to_open01(h);
	double u2 = to_open01(mix64(h ^ 0xa0761d6478bd642fULL));
	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void rng_seed(struct rng *r, uint64_t seed, uint64_t stream, uint64_t index)
{
	r->state = rng_hash(seed, stream, index);
}

uint64_t rng_next(struct rng *r)
{
	r->state += 0x9e3779b97f4a7c15ULL;
	return mix64(r->state);
}

uint64_t rng_below(struct rng *r, uint64_t n)
{
	/* Reject the top partial range so every value is equally likely. */
	uint64_t limit = UINT64_MAX - UINT64_MAX % n;
	uint64_t x;
	do
		x = rng_next(r);
	while (x >= limit);
	return x % n;
}

double rng_next_uniform(struct rng *r)
{
	return to_open01(rng_next(r));
}
