/* gpu.h with the CUDA runtime (linked statically). The runtime loads the
 * driver (libcuda.so.1) itself when first called, so on a machine without
 * one these calls fail cleanly and the binary still runs on the CPU. */
extern "C" {
#include "gpu.h"
}
#include "arch.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STR2(x) #x
#define STR(x) STR2(x)

/* The Makefile passes the targets it gave nvcc (see gpu/arch.h). */
#ifndef PSTRAIN_CUDA_TARGETS
#error "PSTRAIN_CUDA_TARGETS comes from the Makefile (CUDA_ARCHS), the list nvcc builds for"
#endif

extern "C" const char *gpu_build_info(void)
{
	return "CUDA " STR(__CUDACC_VER_MAJOR__) "." STR(__CUDACC_VER_MINOR__) " (" PSTRAIN_CUDA_TARGETS ")";
}

extern "C" int gpu_count(int *n, char *err, size_t errlen)
{
	int count = 0;
	cudaError_t e = cudaGetDeviceCount(&count);
	*n = 0;
	if (e != cudaSuccess) {
		cudaGetLastError();   /* not sticky, but later checks must not see it */
		/* The runtime says "insufficient driver" both for an old driver and
		 * for none at all; tell the two apart for the user. */
		void *h = e == cudaErrorInsufficientDriver ? dlopen("libcuda.so.1", RTLD_LAZY) : (void *)1;
		if (!h)
			snprintf(err, errlen, "no NVIDIA driver (libcuda.so.1 cannot be loaded)");
		else
			snprintf(err, errlen, "no usable GPU: %s", cudaGetErrorString(e));
		if (h && h != (void *)1)
			dlclose(h);
		return -ENODEV;
	}
	if (count == 0) {
		snprintf(err, errlen, "no GPU visible (CUDA_VISIBLE_DEVICES=%s)",
			 getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
		return -ENODEV;
	}
	*n = count;
	return 0;
}

/* Whether index names a visible GPU, asked of cudaGetDeviceCount before
 * any call takes the ordinal: the runtime refuses one past the last with
 * cudaErrorInvalidDevice, which compute-sanitizer reports as an API error
 * even where the caller expects the refusal (test gpu/query_every_device
 * asks for one on purpose). 0, or -ENODEV with the reason in err. */
static int device_check(int index, char *err, size_t errlen)
{
	char why[200];
	int n = 0;
	if (gpu_count(&n, why, sizeof(why)) < 0) {
		snprintf(err, errlen, "gpu:%d: %s", index, why);
		return -ENODEV;
	}
	if (index < 0 || index >= n) {
		snprintf(err, errlen, "gpu:%d: no such GPU (%d visible, gpu:0 to gpu:%d)", index, n, n - 1);
		return -ENODEV;
	}
	return 0;
}

extern "C" int gpu_query(int index, struct gpu_info *info, char *err, size_t errlen)
{
	int r = device_check(index, err, errlen);
	if (r)
		return r;
	cudaDeviceProp p;
	cudaError_t e = cudaGetDeviceProperties(&p, index);
	if (e != cudaSuccess) {
		cudaGetLastError();
		snprintf(err, errlen, "gpu:%d: cudaGetDeviceProperties: %s", index, cudaGetErrorString(e));
		return -ENODEV;
	}
	memset(info, 0, sizeof(*info));
	info->index = index;
	snprintf(info->name, sizeof(info->name), "%s", p.name);
	info->total_bytes = p.totalGlobalMem;
	info->cc_major = p.major;
	info->cc_minor = p.minor;
	return 0;
}

/* A GPU older (or, without PTX, newer) than every target would pass
 * placement and fail at the first launch with "no kernel image is
 * available"; refusing it here lets soft placement use the CPU instead. */
extern "C" int gpu_arch_check(int device, char *err, size_t errlen)
{
	struct gpu_info info;
	char why[320];
	int r = gpu_query(device, &info, err, errlen);
	if (r)
		return r;
	r = gpu_arch_supported(info.cc_major, info.cc_minor, why, sizeof(why));
	if (r) {
		snprintf(err, errlen, "gpu:%d (%s) has %s", device, info.name, why);
		return -ENODEV;
	}
	return 0;
}
