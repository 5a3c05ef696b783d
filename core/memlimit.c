/* See memlimit.h. */
#include "memlimit.h"

#include "../base/err.h"
#include "nn/optim.h"
#include "nn/sparse_optim.h"
#include "progress.h"

#include <errno.h>

uint64_t memlimit_dense(uint64_t n, int kind)
{
	uint64_t vectors = 1 + (kind == OPTIM_MOMENTUM) + 2 * (kind == OPTIM_ADAM);
	return n * sizeof(float) * vectors;
}

uint64_t memlimit_rows(uint64_t rows, int dim, int kind)
{
	uint64_t vectors = kind == SPARSE_LAZY_ADAM ? 3 : 2;
	return rows * (uint64_t)dim * sizeof(float) * vectors;
}

int memlimit_check(const char *who, uint64_t bytes, int limit_mib, char *err, size_t errlen)
{
	if (limit_mib <= 0 || bytes <= (uint64_t)limit_mib << 20)
		return 0;
	char size[32];
	progress_bytes(size, sizeof(size), (double)bytes);
	return err_set(err, errlen, -EINVAL,
		       "%s needs %s for its parameters, embedding rows and their optimizer state, more than [ps] memory_limit = %d MiB: spread the tables over more ps ([cluster] ps)",
		       who, size, limit_mib);
}
