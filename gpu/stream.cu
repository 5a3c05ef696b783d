/* What crosses a backend's stream: copies between backends (events, not
 * host waits), staged batches through pinned buffers on the copy stream, a
 * training step as a CUDA graph, the optimizer and sums that devices.c
 * queues, and timing. See gpu.h for each function's contract. */
extern "C" {
#include "../core/nn/backend.h"
#include "../core/nn/optim.h"
#include "gpu.h"
}

#include "ctx.h"

#include <string.h>

extern "C" int gpu_stage_reserve(const struct backend *b, int max_batch, size_t D)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r || (max_batch <= g->stage_rows && D == g->stage_D))
		return r;
	if (g->stage_rows) {
		snprintf(g->err, sizeof(g->err), "gpu:%d: staged batches were sized already", g->device);
		return -EINVAL;
	}
	size_t xb = (size_t)max_batch * D * sizeof(float), yb = (size_t)max_batch * sizeof(int32_t);
	for (int i = 0; i < 2; i++) {
		r = arena_alloc(&g->arena, (void **)&g->stage_dx[i], xb, g->err, sizeof(g->err));
		if (!r)
			r = arena_alloc(&g->arena, (void **)&g->stage_dy[i], yb, g->err, sizeof(g->err));
		if (r)
			return r;
		CK(g, cudaMallocHost((void **)&g->stage_hx[i], xb));
		CK(g, cudaMallocHost((void **)&g->stage_hy[i], yb));
	}
	g->stage_rows = max_batch;
	g->stage_D = D;
	return 0;
}

extern "C" int gpu_stage_batch(const struct backend *b, const float *data_x, const int32_t *data_y,
			       size_t D, const uint32_t *idx, int B, const float **x,
			       const int32_t **y)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r)
		return r;
	if (B < 1 || B > g->stage_rows || D != g->stage_D) {
		snprintf(g->err, sizeof(g->err), "gpu:%d: a staged batch of %d rows of %zu, buffers for %d of %zu",
			 g->device, B, D, g->stage_rows, g->stage_D);
		return -EINVAL;
	}
	int s = g->stage_next;
	/* The step two back read this buffer; wait until it has. An event
	 * never recorded counts as done. */
	CK(g, cudaEventSynchronize(g->stage_free[s]));
	for (int i = 0; i < B; i++) {
		memcpy(g->stage_hx[s] + (size_t)i * D, data_x + (size_t)idx[i] * D, D * sizeof(float));
		g->stage_hy[s][i] = data_y[idx[i]];
	}
	CK(g, cudaMemcpyAsync(g->stage_dx[s], g->stage_hx[s], (size_t)B * D * sizeof(float),
			      cudaMemcpyHostToDevice, g->copy));
	CK(g, cudaMemcpyAsync(g->stage_dy[s], g->stage_hy[s], (size_t)B * sizeof(int32_t),
			      cudaMemcpyHostToDevice, g->copy));
	CK(g, cudaEventRecord(g->stage_loaded[s], g->copy));
	CK(g, cudaStreamWaitEvent(g->stream, g->stage_loaded[s], 0));
	*x = g->stage_dx[s];
	*y = g->stage_dy[s];
	return 0;
}

extern "C" int gpu_stage_release(const struct backend *b)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r)
		return r;
	CK(g, cudaEventRecord(g->stage_free[g->stage_next], g->stream));
	g->stage_next ^= 1;
	return 0;
}

extern "C" int gpu_optim_step(const struct backend *b, const struct gk_optim *o, float *params,
			      float *grads, float *m, float *v, size_t n, int zero)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	/* Refused, not launched: the kernel would step state that was never
	 * allocated through NULL (the first GPU run's illegal memory access,
	 * which poisons the context for every later call). */
	char why[200];
	int r = optim_state_check(o->kind, n, m, v, why, sizeof(why));
	if (r) {
		snprintf(g->err, sizeof(g->err), "gpu:%d: optimizer kernel not launched: %s", g->device,
			 why);
		return r;
	}
	r = use(g);
	if (r)
		return r;
	CKL(g, "optimizer kernel",
	    gk_optim_step(g->stream, o, g->capturing ? g->step : NULL, params, grads, m, v, n, zero));
	return 0;
}

extern "C" int gpu_sync(const struct backend *b)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r)
		return r;
	CK(g, cudaStreamSynchronize(g->stream));
	return 0;
}

extern "C" int gpu_add(const struct backend *b, float *y, const float *x, size_t n)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "gradient sum kernel", gk_add(g->stream, y, x, n));
	return 0;
}

/* Peer access from d's device to s's, tried once per pair: where the
 * hardware has none, cudaMemcpyPeerAsync stages through the host itself. */
static int peer_enable(struct gpu_ctx *d, const struct gpu_ctx *s)
{
	unsigned long long bit = s->device < 64 ? 1ull << s->device : 0;
	if (d->device == s->device || (d->peers & bit))
		return 0;
	int can = 0;
	CK(d, cudaDeviceCanAccessPeer(&can, d->device, s->device));
	if (can) {
		cudaError_t e = cudaDeviceEnablePeerAccess(s->device, 0);
		if (e == cudaErrorPeerAccessAlreadyEnabled)
			cudaGetLastError();
		else if (e != cudaSuccess)
			return cuda_fail(d, e, "cudaDeviceEnablePeerAccess");
	}
	d->peers |= bit;
	return 0;
}

extern "C" int gpu_copy(const struct backend *dst_b, void *dst, const struct backend *src_b,
			const void *src, size_t bytes)
{
	struct gpu_ctx *d = (struct gpu_ctx *)dst_b->ctx, *s = (struct gpu_ctx *)src_b->ctx;
	int r = use(s);
	if (r)
		return r;
	/* The copy waits on the device for the source's queued work (which
	 * wrote src), not on the host. */
	CK(s, cudaEventRecord(s->ready, s->stream));
	r = use(d);
	if (!r)
		r = peer_enable(d, s);
	if (r)
		return r;
	CK(d, cudaStreamWaitEvent(d->stream, s->ready, 0));
	CK(d, cudaMemcpyPeerAsync(dst, d->device, src, s->device, bytes, d->stream));
	if (d != s) {
		/* The source's later work (zeroing a gradient that was just
		 * read, the next optimizer step on parameters being
		 * broadcast) must wait for the copy, which runs on the
		 * destination's stream. */
		CK(d, cudaEventRecord(d->copied, d->stream));
		r = use(s);
		if (r)
			return r;
		CK(s, cudaStreamWaitEvent(s->stream, d->copied, 0));
	}
	return 0;
}

/* ---- a training step as a CUDA graph ----------------------------------- */

extern "C" int gpu_graph_begin(const struct backend *b)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (!r && !g->step)
		r = arena_alloc(&g->arena, (void **)&g->step, sizeof(struct gk_step), g->err,
				sizeof(g->err));
	if (r)
		return r;
	/* Thread-local: a call that may not be captured (a host wait, an
	 * allocation) fails here instead of in another thread's work. */
	CK(g, cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
	g->capturing = 1;
	return 0;
}

extern "C" int gpu_graph_end(const struct backend *b, int failed)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	cudaGraph_t graph = NULL;
	g->capturing = 0;
	/* Always ended, so the stream leaves capture mode even after a
	 * failure inside it. */
	cudaError_t e = cudaStreamEndCapture(g->stream, &graph);
	if (failed || e != cudaSuccess) {
		if (graph)
			cudaGraphDestroy(graph);
		cudaGetLastError();
		return failed ? failed : cuda_fail(g, e, "cudaStreamEndCapture");
	}
	e = cudaGraphInstantiate(&g->graph, graph, 0);
	cudaGraphDestroy(graph);   /* the executable graph keeps what it needs */
	if (e != cudaSuccess) {
		g->graph = NULL;
		return cuda_fail(g, e, "cudaGraphInstantiate");
	}
	return 0;
}

extern "C" int gpu_graph_launch(const struct backend *b, const struct gk_step *step)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r)
		return r;
	CKL(g, "step values kernel", gk_step_set(g->stream, g->step, step));
	CK(g, cudaGraphLaunch(g->graph, g->stream));
	return 0;
}

extern "C" int gpu_mark(const struct backend *b, int end)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	int r = use(g);
	if (r)
		return r;
	CK(g, cudaEventRecord(g->mark[end ? 1 : 0], g->stream));
	return 0;
}

extern "C" int gpu_marked_ms(const struct backend *b, double *ms)
{
	struct gpu_ctx *g = (struct gpu_ctx *)b->ctx;
	float f = 0;
	int r = use(g);
	if (r)
		return r;
	CK(g, cudaEventSynchronize(g->mark[1]));
	CK(g, cudaEventElapsedTime(&f, g->mark[0], g->mark[1]));
	*ms = f;
	return 0;
}
