/* Sharding: which contiguous range of the flat parameter vector (P, see
 * model.h) each ps task owns, and the plan as `pstrain check` prints it.
 *
 * Shard k of nps owns [begin, end) with sizes floor(P/nps) or one more; the
 * first P % nps shards are the larger ones. Every parameter is in exactly one
 * shard, and shard k+1 begins where shard k ends. Boundaries are not aligned
 * to cache lines or SIMD widths: an unaligned edge costs one partial vector
 * per shard, while alignment would either break the "differ by at most one"
 * balance or need a second, coarser unit to explain. A large tensor may
 * straddle shards (DESIGN §6); each shard initializes its range with
 * model_init_params(m, out, begin, end, seed), which depends only on (seed,
 * global index), so every sharding starts from the weights `local` uses.
 *
 * What a ps does with its range (optimizer state, versions: cluster/psshard.h)
 * and how workers reach it (cluster/, over net/) live elsewhere; this module
 * only computes and describes ranges. */
#ifndef PSTRAIN_SHARD_H
#define PSTRAIN_SHARD_H

#include <stddef.h>
#include <stdio.h>

#include "config/config.h"
#include "nn/model.h"

struct shard {
	size_t begin, end;   /* global parameter range [begin, end) in P */
};

/* Checks that nps ps tasks can share nparams parameters: 1 <= nps <= nparams.
 * A ps with an empty range would hold connections and versions for nothing,
 * so more ps tasks than parameters is a config error rather than a plan
 * with empty shards. Returns 0, or -EINVAL with one line in err naming
 * [cluster] ps. */
int shard_check(int nps, size_t nparams, char *err, size_t errlen);

/* Fills out[0..nps) with the plan. Total for any nps >= 1 and any nparams
 * (no overflow even near SIZE_MAX): when nps > nparams the last
 * nps - nparams shards are empty ([P, P)); call shard_check first where that
 * must not happen. */
void shard_plan(struct shard *out, int nps, size_t nparams);

/* Prints the plan as "; "-prefixed lines for `pstrain check`: a summary, then
 * per ps task its index, host:port (ps[k], or "-" when ps is NULL), range,
 * elements and bytes, followed by the tensors it touches with element
 * ranges inside each tensor, e.g.
 *   dense1.weight[334853:401920) dense1.bias[0:512) dense2.weight[0:262144)
 * so a tensor that straddles two shards shows up in both. */
void shard_print(FILE *f, const struct model *m, const struct shard *s, int nps,
		 const struct host *ps);

#endif
