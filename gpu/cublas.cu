/* dlopen of cuBLAS; see cublas.h.
 *
 * Loaded once per process and kept: every backend dlopens and dlcloses it,
 * but with RTLD_NODELETE the last dlclose leaves it mapped, so later
 * backends (one per GPU, a backend reopened after an error, a test that
 * opens several) get
 * the same library back from the loader at once. Without the flag,
 * closing the last backend unmapped libcublas and libcublasLt and the next
 * open mapped and relocated them again: about 55 ms each time on the build
 * machine (warm page cache, no GPU), 0 ms with the flag. Unmapping a
 * library this large and stateful in the middle of a process also risks
 * exit or thread-exit handlers it registered being left pointing into it;
 * we have not seen that, but nothing needs the unload. The loader's flag
 * rather than a process-wide handle of our own because we keep no mutable
 * globals outside main.c; the loader holds the one copy either way. */
#include "cublas.h"

extern "C" {
#include "gpu.h"
}

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

/* cuBLAS 13 matches the runtime we link; 12 works against the same driver
 * interface (cuBLAS talks to the driver, not to our static cudart). */
static const char *const sonames[] = { "libcublas.so.13", "libcublas.so.12" };

int cublas_load(struct cublas_api *a, char *err, size_t errlen)
{
	memset(a, 0, sizeof(*a));
	const char *why = "";
	for (size_t i = 0; i < sizeof(sonames) / sizeof(sonames[0]) && !a->lib; i++) {
		a->lib = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
		if (a->lib)
			snprintf(a->soname, sizeof(a->soname), "%s", sonames[i]);
		else
			why = dlerror();
	}
	if (!a->lib) {
		snprintf(err, errlen, "no loadable cuBLAS (tried libcublas.so.13, libcublas.so.12: %s)",
			 why ? why : "not found");
		return -ENOENT;
	}
	struct {
		void **slot;
		const char *name;
	} syms[] = {
		{ (void **)&a->create, "cublasCreate_v2" },
		{ (void **)&a->destroy, "cublasDestroy_v2" },
		{ (void **)&a->set_stream, "cublasSetStream_v2" },
		{ (void **)&a->set_math_mode, "cublasSetMathMode" },
		{ (void **)&a->set_workspace, "cublasSetWorkspace_v2" },
		{ (void **)&a->sgemm, "cublasSgemm_v2" },
	};
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		*syms[i].slot = dlsym(a->lib, syms[i].name);
		if (!*syms[i].slot) {
			snprintf(err, errlen, "%s lacks %s", a->soname, syms[i].name);
			cublas_unload(a);
			return -ENOENT;
		}
	}
	return 0;
}

/* Balances cublas_load's dlopen; RTLD_NODELETE keeps the library mapped
 * when this was the last reference. */
void cublas_unload(struct cublas_api *a)
{
	if (a->lib)
		dlclose(a->lib);
	memset(a, 0, sizeof(*a));
}

extern "C" int gpu_cublas_kept(char *soname, size_t len, char *err, size_t errlen)
{
	struct cublas_api a;
	snprintf(soname, len, "%s", "");
	int r = cublas_load(&a, err, errlen);
	if (r)
		return r;
	snprintf(soname, len, "%s", a.soname);
	cublas_unload(&a);
	/* RTLD_NOLOAD finds a library only if it is still mapped. */
	void *h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
	if (!h) {
		snprintf(err, errlen, "%s was unmapped when its last handle closed", soname);
		return -EIO;
	}
	dlclose(h);
	return 0;
}

const char *cublas_status_name(cublasStatus_t s)
{
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
	case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
	case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
	case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
	case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
	case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
	case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
	case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
	default: return "CUBLAS_STATUS_(unknown)";
	}
}
