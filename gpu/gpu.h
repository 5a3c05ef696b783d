/* GPU discovery. This header always exists: a binary built without CUDA
 * links gpu/stub.c, whose functions return -ENODEV, so callers never #ifdef.
 * Only device discovery lives here so far; the CUDA backend (kernels, cuBLAS
 * through dlopen, the memory arena) comes with the GPU issue. */
#ifndef PSTRAIN_GPU_H
#define PSTRAIN_GPU_H

#include <stddef.h>

struct gpu_info {
	int index;               /* after CUDA_VISIBLE_DEVICES */
	char name[256];
	size_t total_bytes;
	int cc_major, cc_minor;  /* compute capability */
};

/* "CUDA 13.0 (sm_80, sm_90, PTX)" or "no CUDA (built with CUDA=0)". */
const char *gpu_build_info(void);

/* Number of visible GPUs in *n. Returns 0, or -ENODEV with the reason in err
 * (built without CUDA, no driver, no device). */
int gpu_count(int *n, char *err, size_t errlen);

int gpu_query(int index, struct gpu_info *info, char *err, size_t errlen);

#endif
