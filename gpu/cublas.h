/* cuBLAS, loaded with dlopen the first time a GPU is used and then kept
 * for the rest of the process (RTLD_NODELETE; cublas.cu says why), so the binary
 * neither links it nor needs it on a machine without a GPU (`ldd pstrain`
 * lists only glibc). Only the handful of entry points the backend calls are
 * resolved. C++ (decltype of the real prototypes keeps the pointer types
 * honest); included only by the .cu files of gpu/. */
#ifndef PSTRAIN_GPU_CUBLAS_H
#define PSTRAIN_GPU_CUBLAS_H

#include <cublas_api.h>
#include <stddef.h>

struct cublas_api {
	void *lib;
	char soname[32];
	decltype(&cublasCreate_v2) create;
	decltype(&cublasDestroy_v2) destroy;
	decltype(&cublasSetStream_v2) set_stream;
	decltype(&cublasSetMathMode) set_math_mode;
	decltype(&cublasSetWorkspace_v2) set_workspace;
	decltype(&cublasSgemm_v2) sgemm;
};

/* Tries the sonames of the CUDA majors we support, newest first. Returns 0,
 * or -ENOENT with every name tried and dlerror()'s last word in err. */
int cublas_load(struct cublas_api *a, char *err, size_t errlen);
void cublas_unload(struct cublas_api *a);   /* accepts a zeroed struct */

/* "CUBLAS_STATUS_NOT_INITIALIZED" and friends; the library's own
 * cublasGetStatusName may be missing from older sonames. */
const char *cublas_status_name(cublasStatus_t s);

#endif
