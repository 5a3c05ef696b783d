/* GPUs: discovery and the CUDA backend. This header always exists: a binary
 * built without CUDA links gpu/stub.c, whose functions return -ENODEV, so
 * callers never #ifdef. */
#ifndef PSTRAIN_GPU_H
#define PSTRAIN_GPU_H

#include <stddef.h>
#include <stdint.h>

struct gpu_info {
	int index;               /* after CUDA_VISIBLE_DEVICES */
	char name[256];
	size_t total_bytes;
	int cc_major, cc_minor;  /* compute capability */
};

/* "CUDA 13.0 (sm_80 sm_90 compute_90)": the nvcc targets, from the same
 * list gpu_arch_check() uses; or "no CUDA (built with CUDA=0 ...)". */
const char *gpu_build_info(void);

/* Number of visible GPUs in *n. Returns 0, or -ENODEV with the reason in err
 * (built without CUDA, no driver, no device). */
int gpu_count(int *n, char *err, size_t errlen);

/* gpu:index's name, memory and compute capability in *info. Returns 0, or
 * -ENODEV with the reason in err: gpu_count()'s, or "gpu:4: no such GPU
 * (2 visible, gpu:0 to gpu:1)". The index is checked against
 * gpu_count() before the runtime sees it, so asking past the last GPU is
 * no CUDA error (compute-sanitizer reports those). */
int gpu_query(int index, struct gpu_info *info, char *err, size_t errlen);

/* Whether this binary carries code for GPU `device` (gpu/arch.h has the
 * rules). Returns 0, or -ENODEV with the reason in err: "gpu:0 (Tesla T4)
 * has compute capability 7.5; this pstrain carries sm_80, sm_90 and
 * compute_90 PTX: rebuild with make CUDA_ARCHS=\"75 80 90\" or use a newer
 * GPU", or gpu_query()'s failure. gpu_backend_open() calls it first. */
int gpu_arch_check(int device, char *err, size_t errlen);

/* cuBLAS is loaded once and stays for the whole process (gpu/cublas.cu
 * says why). This loads and unloads it as a backend does, then asks the
 * loader whether it is still mapped; for the tests. Returns 0 with the
 * soname in `soname`; -ENOENT (no loadable cuBLAS) or -ENODEV (built
 * without CUDA) with the reason in err; -EIO when it was unmapped. */
int gpu_cublas_kept(char *soname, size_t len, char *err, size_t errlen);

struct backend;

/* An optimizer step's rule and values as the GPU's kernel takes them
 * (core/nn/devices.c fills it from struct optim). */
struct gk_optim {
	int kind;
	float lr, wd, mu;
	int nesterov;
	float b1, b2, eps;
	float step_size, inv_sqrt_bc2;
};

/* The values that change from one training step to the next, read from
 * device memory by the kernels of a step captured as a CUDA graph (their
 * launch arguments are frozen at capture); gk_step_set writes them before
 * each replay. */
struct gk_step {
	size_t at;                          /* the batch's position in the order */
	float lr, step_size, inv_sqrt_bc2;  /* struct gk_optim's per-step fields */
	uint64_t key;                       /* the step's dropout key (replica_key) */
};

struct gpu_options {
	double memory_fraction;   /* arena cap: this fraction of the GPU's memory */
	int allow_growth;         /* take the arena in chunks, on demand, up to the cap */
	int tf32;                 /* let cuBLAS use TF32 tensor cores for fp32 GEMMs */
};

/* Fills *b with the CUDA backend on GPU `device`: a stream, cuBLAS (dlopen),
 * and the memory arena. Returns 0 or a negative errno with the reason in
 * err (no driver, no cuBLAS, the arena does not fit). */
int gpu_backend_open(struct backend *b, int device, const struct gpu_options *o,
		     char *err, size_t errlen);
void gpu_backend_close(struct backend *b);   /* accepts a zeroed or CPU backend */

/* The text of the last failure of an op of b ("gpu:0: cublasSgemm
 * (forward): CUBLAS_STATUS_EXECUTION_FAILED"); "" for other backends. */
const char *gpu_backend_error(const struct backend *b);

/* Arena bytes handed out so far, and the largest buffer it can still
 * hand out. */
size_t gpu_backend_used(const struct backend *b);
size_t gpu_backend_room(const struct backend *b);

/* Batches of a training set that stays in host memory (one too large for
 * the arena). gpu_stage_reserve takes two pinned host buffers and two
 * device buffers of max_batch rows of D floats (and labels) once.
 * gpu_stage_batch gathers rows idx[0 .. B) of data_x (n, D), data_y (n)
 * into the pinned buffer of this step, copies it to the device on a copy
 * stream (so it overlaps the previous step's work) and makes b's stream
 * wait for it; *x and *y are its device copy. gpu_stage_release, after the
 * step's work is queued, lets the buffer be refilled once b's stream has
 * done that work; with two buffers the host waits only when it is two
 * steps ahead. */
int gpu_stage_reserve(const struct backend *b, int max_batch, size_t D);
int gpu_stage_batch(const struct backend *b, const float *data_x, const int32_t *data_y, size_t D,
		    const uint32_t *idx, int B, const float **x, const int32_t **y);
int gpu_stage_release(const struct backend *b);

/* The optimizer update (gpu/kernels.h) over device vectors of b. */
int gpu_optim_step(const struct backend *b, const struct gk_optim *o, float *params,
		   float *grads, float *m, float *v, size_t n, int zero);

/* y += x over n floats, both on b's device. */
int gpu_add(const struct backend *b, float *y, const float *x, size_t n);

/* Copies bytes from src on src_b's device to dst on dst_b's device, directly
 * where peer access is possible, otherwise staged by CUDA through the host.
 * The copy runs on dst_b's stream after src_b's queued work (an event, not
 * a host wait), and src_b's later work waits for the copy. */
int gpu_copy(const struct backend *dst_b, void *dst, const struct backend *src_b, const void *src,
	     size_t bytes);

/* A training step as a CUDA graph on b's stream. Between gpu_graph_begin
 * and gpu_graph_end the step's work is recorded, not run, with the gather
 * and the optimizer reading their per-step values (struct gk_step) from
 * device memory; gpu_graph_end(b, failed) always leaves capture mode and,
 * when failed is 0, makes the executable graph. gpu_graph_launch writes
 * this step's values and replays the graph. */
int gpu_graph_begin(const struct backend *b);
int gpu_graph_end(const struct backend *b, int failed);
int gpu_graph_launch(const struct backend *b, const struct gk_step *step);

/* The device index of a CUDA backend, -1 for any other. */
int gpu_backend_device(const struct backend *b);

/* Timing on b's stream with CUDA events: gpu_mark(b, 0) and gpu_mark(b, 1)
 * record the start and the end; gpu_marked_ms waits for the end and gives
 * the milliseconds between them. */
int gpu_mark(const struct backend *b, int end);
int gpu_marked_ms(const struct backend *b, double *ms);

/* Waits for all work queued on b. */
int gpu_sync(const struct backend *b);

/* The embedding layer's unique-row gather (core/nn/embed.h's
 * embed_gather_rows) queued on b's stream over device buffers of b; it
 * allocates nothing, waits for nothing and gives the CPU twin's result
 * bit for bit. Not in the CUDA backend's kernel table: the tables live in
 * host memory, where the replica gathers a batch's rows and uploads them
 * (core/nn/replica_embed.c); a table held on the GPU would use it. The
 * pooled forward and the gradient's scatter-add are the table's
 * embed_forward and embed_backward. */
int gpu_embed_gather(const struct backend *b, float *U, const float *table, const uint64_t *rows,
		     size_t u, int DIM);

#endif
