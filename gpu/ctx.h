/* One GPU backend's state, shared by the files that implement it:
 * backend_cuda.cu (the kernels' table, open and close) and stream.cu (what
 * crosses streams and devices: copies, staged batches, graphs, timing).
 * C++, included only by those. Every CUDA and cuBLAS return code is
 * checked with the macros below; the failing call is named in ->err. */
#ifndef PSTRAIN_GPU_CTX_H
#define PSTRAIN_GPU_CTX_H

#include "arena.h"
#include "cublas.h"
#include "kernels.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>

struct gpu_ctx {
	int device;
	cudaStream_t stream;
	struct cublas_api api;
	cublasHandle_t blas;
	void *blas_work;   // cuBLAS's workspace, BLAS_WORK bytes (outside the arena's cap)
	struct gpu_arena arena;
	/* Scratch of the loss and the bias gradients (g_reserve): per-row
	 * loss and right answers, the bias gradient's partial sums and
	 * tickets, for batches up to `rows` rows of up to `width` floats. */
	double *row_loss, *row_right;
	float *partial;
	unsigned *tickets;
	int rows, width;
	/* Batchnorm's (g_reserve too): the split sums' scratch and tickets,
	 * taken once, and its per-channel sums, 2 x width floats. */
	struct gk_bn_scratch bn;
	/* Staged batches (gpu_stage_*): pinned host and device buffers, the
	 * copy stream, an event when each buffer has landed and when the
	 * compute stream is done with it. */
	cudaStream_t copy;
	float *stage_hx[2], *stage_dx[2];
	int32_t *stage_hy[2], *stage_dy[2];
	cudaEvent_t stage_loaded[2], stage_free[2];
	int stage_rows, stage_next;
	size_t stage_D;
	/* A training step captured as a CUDA graph (gpu_graph_*): while
	 * capturing, the gather and optimizer kernels read their per-step
	 * values from *step, which gk_step_set fills before each replay. */
	int capturing;
	struct gk_step *step;
	cudaGraphExec_t graph;
	/* The copy queue of a worker's exchange (copyq.cu, backend.h's
	 * copy_*), on the copy stream: after (recorded on the stream, the
	 * copy stream waits), join (recorded on the copy stream, the stream
	 * waits) and a slot per copy down, all made once (copy_reserve). */
	cudaEvent_t q_after, q_join;
	cudaEvent_t *q_slot;
	int q_slots;
	/* copy_check's answers, one int a slot for q_found_cap slots, taken
	 * with the slots: set on the device (cudaMalloc, a few bytes outside
	 * the arena's cap, as cuBLAS's workspace) and copied down beside the
	 * slot's range into pinned host memory. */
	int *q_found_dev, *q_found_host;
	int q_found_cap;
	cudaEvent_t mark[2];   // gpu_mark's start and end
	cudaEvent_t ready;     // gpu_copy from this backend: its queued work is done
	cudaEvent_t copied;    // after a gpu_copy into this backend: the source's stream waits on it
	unsigned long long peers;   // devices whose peer access was tried (bit per device < 64)
	char err[320];
};

static inline int cuda_fail(struct gpu_ctx *g, cudaError_t e, const char *call)
{
	cudaGetLastError();   // clear a non-sticky error so the next call is not blamed
	snprintf(g->err, sizeof(g->err), "gpu:%d: %s: %s", g->device, call, cudaGetErrorString(e));
	return -EIO;
}

#define CK(g, call)                                                  \
	do {                                                         \
		cudaError_t e_ = (call);                             \
		if (e_ != cudaSuccess)                               \
			return cuda_fail((g), e_, #call);            \
	} while (0)

/* Launchers return a cudaError_t as int. */
#define CKL(g, what, call)                                           \
	do {                                                         \
		int e_ = (call);                                     \
		if (e_)                                              \
			return cuda_fail((g), (cudaError_t)e_, what); \
	} while (0)

#define CKB(g, what, call)                                                                     \
	do {                                                                                   \
		cublasStatus_t s_ = (call);                                                    \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                             \
			snprintf((g)->err, sizeof((g)->err), "gpu:%d: %s: %s", (g)->device, what, \
				 cublas_status_name(s_));                                      \
			return -EIO;                                                           \
		}                                                                              \
	} while (0)

/* copyq.cu: backend.h's copy queue and pinned host memory, for the
 * table in backend_cuda.cu; gq_free at the backend's close. */
int gq_reserve(void *ctx, int slots);
int gq_after(void *ctx);
int gq_down(void *ctx, int slot, void *host, const void *src, size_t bytes);
int gq_wait(void *ctx, int slot);
int gq_check(void *ctx, int slot, const float *src, size_t n);
int gq_found(void *ctx, int slot);
int gq_up(void *ctx, void *dst, const void *host, size_t bytes);
int gq_join(void *ctx);
int gq_host_alloc(void *ctx, void **p, size_t bytes);
void gq_host_free(void *ctx, void *p);
void gq_free(struct gpu_ctx *g);

static inline int use(struct gpu_ctx *g)
{
	CK(g, cudaSetDevice(g->device));
	return 0;
}

#endif
