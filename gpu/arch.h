/* Which GPUs this binary's kernels can run on.
 *
 * The targets the binary carries come from one place: the Makefile's
 * CUDA_ARCHS (and CUDA_PTX), from which it makes both nvcc's -gencode flags
 * and the string PSTRAIN_CUDA_TARGETS ("sm_80 sm_90 compute_90") that
 * gpu/arch.c and gpu_build_info() use, so adding an architecture cannot
 * leave this check stale. Plain C, compiled into every build so the tests
 * check the rules without a GPU; gpu_arch_check() (gpu.h) applies them to a
 * real device before a backend opens on it. */
#ifndef PSTRAIN_GPU_ARCH_H
#define PSTRAIN_GPU_ARCH_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPU_ARCH_MAX_TARGETS 16

/* This build's targets, "sm_80 sm_90 compute_90". A CPU-only build has the
 * same string: what a CUDA build from the same Makefile would carry. */
const char *gpu_arch_targets(void);

/* Whether code built for `targets` (space-separated words sm_XY or
 * compute_XY, XY two or three digits, e.g. sm_86, compute_120, each
 * optionally ending in a or f) runs on a device of compute capability
 * major.minor:
 *   sm_XY, sm_XYf            SASS: same major X and minor >= Y
 *   sm_XYa, compute_XYa      exactly X.Y (architecture-specific code)
 *   compute_XY               PTX, JIT-compiled by the driver: any X.Y or above
 *   compute_XYf              same major X and minor >= Y
 * Returns 0 when some target runs; -ENODEV with the reason in why,
 *   "compute capability 7.5; this pstrain carries sm_80, sm_90 and compute_90
 *   PTX: rebuild with make CUDA_ARCHS=\"75 80 90\" or use a newer GPU";
 * -EINVAL with the bad word quoted when targets is malformed. */
int gpu_arch_runs(const char *targets, int major, int minor, char *why, size_t whylen);

/* gpu_arch_runs() over this build's targets. */
int gpu_arch_supported(int major, int minor, char *why, size_t whylen);

#ifdef __cplusplus
}
#endif

#endif
