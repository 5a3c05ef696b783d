/* gpu.h for a binary built without CUDA (make CUDA=0 or no nvcc found). */
#include "gpu.h"

#include "../core/nn/backend.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

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
	memset(info, 0, sizeof(*info));
	snprintf(err, errlen, "this pstrain was built without CUDA");
	return -ENODEV;
}

int gpu_arch_check(int device, char *err, size_t errlen)
{
	snprintf(err, errlen, "gpu:%d: this pstrain was built without CUDA", device);
	return -ENODEV;
}

int gpu_cublas_kept(char *soname, size_t len, char *err, size_t errlen)
{
	snprintf(soname, len, "%s", "");
	snprintf(err, errlen, "this pstrain was built without CUDA");
	return -ENODEV;
}

int gpu_backend_open(struct backend *b, int device, const struct gpu_options *o, char *err,
		     size_t errlen)
{
	memset(b, 0, sizeof(*b));
	(void)o;
	snprintf(err, errlen, "gpu:%d: this pstrain was built without CUDA", device);
	return -ENODEV;
}

void gpu_backend_close(struct backend *b)
{
	(void)b;
}

const char *gpu_backend_error(const struct backend *b)
{
	(void)b;
	return "";
}

size_t gpu_backend_used(const struct backend *b)
{
	(void)b;
	return 0;
}

size_t gpu_backend_room(const struct backend *b)
{
	(void)b;
	return 0;
}

int gpu_stage_reserve(const struct backend *b, int max_batch, size_t D)
{
	(void)b, (void)max_batch, (void)D;
	return -ENODEV;
}

int gpu_stage_batch(const struct backend *b, const float *data_x, const int32_t *data_y, size_t D,
		    const uint32_t *idx, int B, const float **x, const int32_t **y)
{
	(void)b, (void)data_x, (void)data_y, (void)D, (void)idx, (void)B;
	*x = NULL;
	*y = NULL;
	return -ENODEV;
}

int gpu_stage_release(const struct backend *b)
{
	(void)b;
	return -ENODEV;
}

int gpu_optim_step(const struct backend *b, const struct gk_optim *o, float *params, float *grads,
		   float *m, float *v, size_t n, int zero)
{
	(void)b, (void)o, (void)params, (void)grads, (void)m, (void)v, (void)n, (void)zero;
	return -ENODEV;
}

int gpu_sync(const struct backend *b)
{
	(void)b;
	return -ENODEV;
}

int gpu_add(const struct backend *b, float *y, const float *x, size_t n)
{
	(void)b, (void)y, (void)x, (void)n;
	return -ENODEV;
}

int gpu_copy(const struct backend *dst_b, void *dst, const struct backend *src_b, const void *src,
	     size_t bytes)
{
	(void)dst_b, (void)dst, (void)src_b, (void)src, (void)bytes;
	return -ENODEV;
}

int gpu_graph_begin(const struct backend *b)
{
	(void)b;
	return -ENODEV;
}

int gpu_graph_end(const struct backend *b, int failed)
{
	(void)b, (void)failed;
	return -ENODEV;
}

int gpu_graph_launch(const struct backend *b, const struct gk_step *step)
{
	(void)b, (void)step;
	return -ENODEV;
}

int gpu_backend_device(const struct backend *b)
{
	(void)b;
	return -1;
}

int gpu_mark(const struct backend *b, int end)
{
	(void)b, (void)end;
	return -ENODEV;
}

int gpu_marked_ms(const struct backend *b, double *ms)
{
	(void)b;
	*ms = 0;
	return -ENODEV;
}

int gpu_embed_gather(const struct backend *b, float *U, const float *table, const uint64_t *rows,
		     size_t u, int DIM)
{
	(void)b, (void)U, (void)table, (void)rows, (void)u, (void)DIM;
	return -ENODEV;
}
