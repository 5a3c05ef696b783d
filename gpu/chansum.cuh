/* Per-channel sums split over several blocks a channel (C++, .cu only).
 *
 * A grid of C x split blocks: blockIdx.x is the channel, blockIdx.y its
 * part, so a channel's values are shared by up to CHAN_MAX_SPLIT blocks of
 * about CHAN_PER_BLOCK values each instead of one block a channel (32-64
 * blocks on 132 SMs for the example CNN). Each block makes its two sums in
 * double by warp shuffles in a fixed order (block_sum2); the blocks' sums
 * meet in scratch (struct gk_bn_scratch) and the last block of the channel
 * to finish (a ticket, as the dense bias gradient's) adds them in block
 * order (chan_last): one pass over the data, the same bits every run.
 * Batchnorm's sums (gpu/kernels_bn.cu) and the conv bias gradient
 * (gpu/kernels_cnn.cu) use it; kernels on one stream run one at a time,
 * so they share one scratch, whose tickets each launch leaves at zero. */
#ifndef PSTRAIN_GPU_CHANSUM_CUH
#define PSTRAIN_GPU_CHANSUM_CUH

#include "kernels.h"
#include "launch.h"

#include <cuda_runtime.h>

#define CHAN_PER_BLOCK 2048
#define CHAN_MAX_SPLIT 256

/* The block's sums of a and b, in thread 0's. */
__device__ static void block_sum2(double &a, double &b)
{
	__shared__ double sa[THREADS / 32], sb[THREADS / 32];
	for (int o = 16; o > 0; o >>= 1) {
		a += __shfl_down_sync(0xffffffffu, a, o);
		b += __shfl_down_sync(0xffffffffu, b, o);
	}
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	if (lane == 0) {
		sa[warp] = a;
		sb[warp] = b;
	}
	__syncthreads();
	if (warp == 0) {
		int nw = (int)(blockDim.x >> 5);
		a = lane < nw ? sa[lane] : 0.0;
		b = lane < nw ? sb[lane] : 0.0;
		for (int o = 16; o > 0; o >>= 1) {
			a += __shfl_down_sync(0xffffffffu, a, o);
			b += __shfl_down_sync(0xffffffffu, b, o);
		}
	}
}

/* After block_sum2: whether this block holds its channel's whole sums in
 * thread 0's a and b (it is the channel's only block, or the last of them
 * to finish, which then adds every block's sums in block order and leaves
 * the ticket at zero). */
__device__ static bool chan_last(double &a, double &b, double *partial, unsigned *tickets)
{
	__shared__ bool last;
	unsigned split = gridDim.y, c = blockIdx.x;
	if (split == 1)
		return true;
	if (threadIdx.x == 0) {
		size_t slot = (size_t)c * split + blockIdx.y;
		partial[2 * slot] = a;
		partial[2 * slot + 1] = b;
		__threadfence();
		last = atomicAdd(&tickets[c], 1u) == split - 1;
	}
	__syncthreads();
	if (!last)
		return false;
	/* The reading side's fence: the memory model asks for one between
	 * seeing the last ticket and reading the others' sums (CUDA's sample
	 * leaves it out, and current GPUs do without; it costs one fence in
	 * the last block). */
	__threadfence();
	if (threadIdx.x == 0) {
		const double *p = partial + 2 * (size_t)c * split;
		a = b = 0.0;
		for (unsigned j = 0; j < split; j++) {
			a += __ldcg(&p[2 * j]);   // past L1: written by other SMs
			b += __ldcg(&p[2 * j + 1]);
		}
		tickets[c] = 0;
	}
	return true;
}

/* Block blockIdx.y's share of a channel's n values j (channel c's j-th
 * over (B, HW): plane b = j / HW, offset j % HW), strided over the
 * channel's blocks so that a warp reads consecutive values. */
#define CHAN_LOOP(I, j, n) \
	for (I j = blockIdx.y * (I)blockDim.x + threadIdx.x; j < (n); j += (I)gridDim.y * blockDim.x)


/* Blocks per channel: about CHAN_PER_BLOCK values each, at most
 * CHAN_MAX_SPLIT, and no more than the scratch's slots hold for C channels
 * (one, without scratch or past GK_BN_SLOTS / 2 channels). */
static inline unsigned chan_split(int C, size_t n, const struct gk_bn_scratch *s)
{
	if (!s || !s->partial || !s->tickets)
		return 1;
	size_t k = (n + CHAN_PER_BLOCK - 1) / CHAN_PER_BLOCK, cap = GK_BN_SLOTS / (size_t)C;
	k = k < cap ? k : cap;
	k = k < CHAN_MAX_SPLIT ? k : CHAN_MAX_SPLIT;
	return (unsigned)(k < 1 ? 1 : k);
}

#endif
