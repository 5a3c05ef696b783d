/* gpu.h for a binary built without CUDA (make CUDA=0 or no nvcc found). */
#include "gpu.h"

#include <errno.h>
#include <stdio.h>

const char *gpu_build_info(void)
{
	return "no CUDA (built with CUDA=0 or without nvcc)";
}

int gpu_count(int *n, char *err, size_t errlen)
{
	*n = 0;
	snprintf(err, errlen, "this pstrain was built without CUDA");
	return -ENODEV;
}

int gpu_query(int index, struct gpu_info *info, char *err, size_t errlen)
{
	(void)index;
	(void)info;
	snprintf(err, errlen, "this pstrain was built without CUDA");
	return -ENODEV;
}
