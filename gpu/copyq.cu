/* The copy queue of a worker's exchange (backend.h's copy_* entries, used
 * by core/nn/devices_flow.c): copies between the backend's memory and
 * pinned host memory on the backend's copy stream, ordered against its
 * compute stream by events only, so that a gradient goes down layer by
 * layer while backward computes and parameters go up piece by piece while
 * forward computes. The host waits only in gq_wait, for one slot.
 *
 * Events: q_after is recorded on the compute stream and waited for by the
 * copy stream (the copies after it see the kernels before it); q_join the
 * other way round. Both are recorded and waited for at once, so one event
 * each serves every call (a wait takes the record made before it). A
 * slot's event is recorded after its copy down and waited for by the host
 * later, so each slot has its own; they are made with
 * cudaEventBlockingSync, so a waiting host sleeps instead of spinning on
 * a CPU the link threads need for the pieces already final. */
extern "C" {
#include "../core/nn/backend.h"
#include "gpu.h"
}

#include "ctx.h"

#include <stdlib.h>

/* The device set for g, and slot one that copy_reserve took. */
static int slot_use(struct gpu_ctx *g, int slot)
{
	int r = use(g);
	if (r || (slot >= 0 && slot < g->q_slots))
		return r;
	snprintf(g->err, sizeof(g->err), "gpu:%d: copy slot %d of %d reserved", g->device, slot, g->q_slots);
	return -EINVAL;
}

/* Slots [from, to) of a (to) array: made, or on failure none of them. */
static int slots_make(struct gpu_ctx *g, cudaEvent_t *ev, int from, int to)
{
	for (int i = from; i < to; i++) {
		cudaError_t e = cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming | cudaEventBlockingSync);
		if (e != cudaSuccess) {
			while (i-- > from)
				cudaEventDestroy(ev[i]);
			return cuda_fail(g, e, "cudaEventCreateWithFlags (copy slot)");
		}
	}
	return 0;
}

/* copy_check's answers for slots 0 .. slots-1, taken with the slots, so
 * that no step allocates. */
static int found_reserve(struct gpu_ctx *g, int slots)
{
	if (slots <= g->q_found_cap)
		return 0;
	int *dev = NULL, *host = NULL;
	CK(g, cudaMalloc((void **)&dev, (size_t)slots * sizeof(int)));
	cudaError_t e = cudaHostAlloc((void **)&host, (size_t)slots * sizeof(int), cudaHostAllocPortable);
	if (e != cudaSuccess) {
		cudaFree(dev);
		return cuda_fail(g, e, "cudaHostAlloc (copy checks)");
	}
	if (g->q_found_dev)
		cudaFree(g->q_found_dev);
	if (g->q_found_host)
		cudaFreeHost(g->q_found_host);
	g->q_found_dev = dev;
	g->q_found_host = host;
	g->q_found_cap = slots;
	return 0;
}

/* The events of slots 0 .. slots-1 (more than q_slots). */
static int events_reserve(struct gpu_ctx *g, int slots)
{
	/* Each on its own: a failure between them leaves the other for the
	 * next try, not a queue that gq_join calls unreserved. */
	if (!g->q_after)
		CK(g, cudaEventCreateWithFlags(&g->q_after, cudaEventDisableTiming));
	if (!g->q_join)
		CK(g, cudaEventCreateWithFlags(&g->q_join, cudaEventDisableTiming));
	cudaEvent_t *ev = (cudaEvent_t *)realloc(g->q_slot, (size_t)slots * sizeof(*ev));
	if (!ev) {
		snprintf(g->err, sizeof(g->err), "gpu:%d: out of host memory for %d copy slots", g->device, slots);
		return -ENOMEM;
	}
	g->q_slot = ev;
	int r = slots_make(g, ev, g->q_slots, slots);
	if (!r)
		g->q_slots = slots;
	return r;
}

int gq_reserve(void *ctx, int slots)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (!r && slots > g->q_slots)
		r = events_reserve(g, slots);
	return r ? r : found_reserve(g, slots);
}

int gq_after(void *ctx)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CK(g, cudaEventRecord(g->q_after, g->stream));
	CK(g, cudaStreamWaitEvent(g->copy, g->q_after, 0));
	return 0;
}

int gq_down(void *ctx, int slot, void *host, const void *src, size_t bytes)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = slot_use(g, slot);
	if (r)
		return r;
	CK(g, cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, g->copy));
	CK(g, cudaEventRecord(g->q_slot[slot], g->copy));
	return 0;
}

int gq_wait(void *ctx, int slot)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = slot_use(g, slot);
	if (r)
		return r;
	CK(g, cudaEventSynchronize(g->q_slot[slot]));
	return 0;
}

/* The device set for g, and slot one whose check's answer was reserved. */
static int found_use(struct gpu_ctx *g, int slot)
{
	int r = slot_use(g, slot);
	if (r || slot < g->q_found_cap)
		return r;
	snprintf(g->err, sizeof(g->err), "gpu:%d: copy slot %d has no check reserved", g->device, slot);
	return -EINVAL;
}

/* On the copy stream, which gq_after made wait for the kernels that
 * wrote src: the answer zeroed, the check, and the answer copied down,
 * all before gq_down records the slot's event, so that gq_wait covers
 * it. The check runs beside the next layers' kernels on the compute
 * stream, where the host would have read the range again. */
int gq_check(void *ctx, int slot, const float *src, size_t n)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = found_use(g, slot);
	if (r)
		return r;
	int *f = g->q_found_dev + slot;
	CK(g, cudaMemsetAsync(f, 0, sizeof(int), g->copy));
	CKL(g, "finiteness check kernel", gk_nonfinite(g->copy, src, n, f));
	CK(g, cudaMemcpyAsync(g->q_found_host + slot, f, sizeof(int), cudaMemcpyDeviceToHost, g->copy));
	return 0;
}

/* After gq_wait(slot): what gq_check found. */
int gq_found(void *ctx, int slot)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = found_use(g, slot);
	return r ? r : g->q_found_host[slot] != 0;
}

int gq_up(void *ctx, void *dst, const void *host, size_t bytes)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CK(g, cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, g->copy));
	return 0;
}

int gq_join(void *ctx)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	if (!g->q_join) {
		snprintf(g->err, sizeof(g->err), "gpu:%d: the copy queue was not reserved", g->device);
		return -EINVAL;
	}
	CK(g, cudaEventRecord(g->q_join, g->copy));
	CK(g, cudaStreamWaitEvent(g->stream, g->q_join, 0));
	return 0;
}

/* Portable: pinned for every device, so that any backend's copies may
 * use it (a worker's replica 0 allocates it; one GPU uses it). */
int gq_host_alloc(void *ctx, void **p, size_t bytes)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	int r = use(g);
	if (r)
		return r;
	CK(g, cudaHostAlloc(p, bytes, cudaHostAllocPortable));
	return 0;
}

void gq_host_free(void *ctx, void *p)
{
	struct gpu_ctx *g = (struct gpu_ctx *)ctx;
	if (!p)
		return;
	/* No copy of the queue may still read or write it. */
	if (!use(g))
		cudaStreamSynchronize(g->copy);
	cudaFreeHost(p);
	cudaGetLastError();
}

void gq_free(struct gpu_ctx *g)
{
	for (int i = 0; i < g->q_slots; i++)
		cudaEventDestroy(g->q_slot[i]);
	free(g->q_slot);
	if (g->q_found_dev)
		cudaFree(g->q_found_dev);
	if (g->q_found_host)
		cudaFreeHost(g->q_found_host);
	g->q_found_host = NULL;
	g->q_found_dev = NULL;
	g->q_found_cap = 0;
	if (g->q_after)
		cudaEventDestroy(g->q_after);
	if (g->q_join)
		cudaEventDestroy(g->q_join);
	g->q_slot = NULL;
	g->q_slots = 0;
	g->q_after = g->q_join = NULL;
}
