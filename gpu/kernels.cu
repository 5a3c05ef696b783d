/* CUDA twins of the CPU kernels in core/nn/layers.c and core/nn/optim.c.
 *
 * Elementwise kernels use a grid-stride loop over size_t indices so any N
 * works with a bounded grid; the formulas are the CPU ones, written the same
 * way, so that fp32 results agree to rounding. */
#include "kernels.h"
#include "launch.h"

#include <cuda_runtime.h>
#include <float.h>
#include <math.h>


extern "C" const char *gk_error_name(int e)
{
	return cudaGetErrorString((cudaError_t)e);
}

/* ---- activations -------------------------------------------------------- */

/* The activation's derivative from its output y; GK_NONE passes d on. */
__device__ static inline float act_grad(int k, float d, float y)
{
	if (k == GK_RELU)
		return y > 0.0f ? d : 0.0f;
	if (k == GK_TANH)
		return d * (1.0f - y * y);
	if (k == GK_SIGMOID)
		return d * y * (1.0f - y);
	return d;
}

/* GK_NONE is the identity. */
__device__ static inline float act_value(int k, float x)
{
	if (k == GK_RELU)
		return x < 0.0f ? 0.0f : x;
	if (k == GK_TANH)
		return tanhf(x);
	if (k == GK_SIGMOID) {
		if (x >= 0.0f)
			return 1.0f / (1.0f + expf(-x));
		float e = expf(x);
		return e / (1.0f + e);
	}
	return x;
}

__global__ void act_forward_kernel(int k, float *out, const float *inp, size_t n)
{
	GRID_STRIDE(i, n)
		out[i] = act_value(k, inp[i]);   // relu: NaN stays NaN, as on the CPU
}

__global__ void act_backward_kernel(int k, float *dinp, const float *dout, const float *out,
				    size_t n)
{
	GRID_STRIDE(i, n)
		dinp[i] = act_grad(k, dout[i], out[i]);
}

extern "C" int gk_act_forward(void *stream, enum gk_act k, float *out, const float *inp, size_t n)
{
	if (n == 0)
		return 0;
	act_forward_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>((int)k, out, inp, n);
	return launched();
}

extern "C" int gk_act_backward(void *stream, enum gk_act k, float *dinp, const float *dout,
			       const float *out, size_t n)
{
	if (n == 0)
		return 0;
	act_backward_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>((int)k, dinp, dout,
										 out, n);
	return launched();
}

/* ---- finiteness ------------------------------------------------------------ */

/* One store a block at most: a block's threads vote, and only a block
 * that saw one writes (every writer writes the same 1). */
__global__ void nonfinite_kernel(const float *x, size_t n, int *found)
{
	int bad = 0;
	GRID_STRIDE(i, n)
		bad |= (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u;
	if (__syncthreads_or(bad) && threadIdx.x == 0)
		*found = 1;
}

extern "C" int gk_nonfinite(void *stream, const float *x, size_t n, int *found)
{
	if (n == 0)
		return 0;
	nonfinite_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(x, n, found);
	return launched();
}

/* ---- bias and the fused epilogues ---------------------------------------- */

/* Rows of a (B, OC) array: blockIdx.y (and its stride) picks the row, the
 * x threads its columns, so no thread divides an index. */
#define ROW_GRID_MAX 65535

static dim3 rows_grid(int B, int OC)
{
	unsigned gx = (unsigned)((OC + THREADS - 1) / THREADS);
	return dim3(gx, (unsigned)(B < ROW_GRID_MAX ? B : ROW_GRID_MAX));
}

__global__ void bias_act_kernel(int k, float *out, const float *bias, int B, int OC)
{
	int o = blockIdx.x * blockDim.x + threadIdx.x;
	if (o >= OC)
		return;
	float bo = bias ? bias[o] : 0.0f;
	for (int b = blockIdx.y; b < B; b += gridDim.y) {
		size_t i = (size_t)b * OC + o;
		out[i] = act_value(k, out[i] + bo);
	}
}

extern "C" int gk_bias_act(void *stream, enum gk_act k, float *out, const float *bias, int B,
			   int OC)
{
	if (B <= 0 || OC <= 0 || (k == GK_NONE && !bias))
		return 0;
	bias_act_kernel<<<rows_grid(B, OC), THREADS, 0, (cudaStream_t)stream>>>((int)k, out, bias, B,
										 OC);
	return launched();
}

/* A block of 32 x 8 threads owns 32 adjacent columns of GK_BIAS_ROWS rows
 * (every row when gridDim.y is 1): threadIdx.x picks the column (reads of
 * a row are coalesced), threadIdx.y strides over the rows, and the 8
 * partial sums meet in shared memory in a fixed order. */
#define BG_COLS 32
#define BG_ROWS 8

extern "C" size_t gk_bias_partials(int B, int OC)
{
	return (size_t)((B + GK_BIAS_ROWS - 1) / GK_BIAS_ROWS) * (size_t)OC;
}

extern "C" size_t gk_bias_tickets(int OC)
{
	return (size_t)((OC + BG_COLS - 1) / BG_COLS);
}

__global__ void act_bias_backward_kernel(int k, float *dout, float *dbias, const float *out, int B,
					 int OC, float *partial, unsigned *tickets)
{
	__shared__ float part[BG_ROWS][BG_COLS];
	__shared__ int last;
	int tx = threadIdx.x, ty = threadIdx.y;
	int o = blockIdx.x * BG_COLS + tx;
	int r0 = gridDim.y == 1 ? 0 : (int)blockIdx.y * GK_BIAS_ROWS;
	int r1 = gridDim.y == 1 ? B : min(r0 + GK_BIAS_ROWS, B);
	float s = 0.0f;
	if (o < OC)
		for (int b = r0 + ty; b < r1; b += BG_ROWS) {
			size_t i = (size_t)b * OC + o;
			float d = dout[i];
			if (k != GK_NONE) {
				d = act_grad(k, d, out[i]);
				dout[i] = d;
			}
			s += d;
		}
	part[ty][tx] = s;
	__syncthreads();
	if (ty == 0)
		for (int r = 1; r < BG_ROWS; r++)
			s += part[r][tx];
	if (gridDim.y == 1) {
		if (ty == 0 && o < OC)
			dbias[o] += s;
		return;
	}
	/* The last of the row blocks of these columns adds every block's sum,
	 * in row-block order (CUDA's threadFenceReduction pattern). */
	if (ty == 0 && o < OC)
		partial[(size_t)blockIdx.y * OC + o] = s;
	__threadfence();
	__syncthreads();
	if (tx == 0 && ty == 0)
		last = atomicAdd(&tickets[blockIdx.x], 1u) == gridDim.y - 1;
	__syncthreads();
	if (!last)
		return;
	__threadfence();   /* the reading side's (gpu/chansum.cuh) */
	if (ty == 0 && o < OC) {
		float t = 0.0f;
		for (unsigned j = 0; j < gridDim.y; j++)
			t += __ldcg(&partial[(size_t)j * OC + o]);   // past L1: written by other SMs
		dbias[o] += t;
	}
	if (tx == 0 && ty == 0)
		tickets[blockIdx.x] = 0;
}

extern "C" int gk_act_bias_backward(void *stream, enum gk_act k, float *dout, float *dbias,
				    const float *out, int B, int OC, float *partial,
				    unsigned *tickets)
{
	if (OC <= 0 || B <= 0)
		return 0;
	if (!dbias)   /* only the activation */
		return k == GK_NONE ? 0 : gk_act_backward(stream, k, dout, dout, out, (size_t)B * OC);
	dim3 threads(BG_COLS, BG_ROWS);
	unsigned rows = (unsigned)((B + GK_BIAS_ROWS - 1) / GK_BIAS_ROWS);
	/* Past 65535 row blocks (4M rows) the grid cannot hold them: one
	 * block row then covers every row. */
	int split = partial && tickets && rows > 1 && rows <= 65535;
	dim3 grid((unsigned)gk_bias_tickets(OC), split ? rows : 1u);
	act_bias_backward_kernel<<<grid, threads, 0, (cudaStream_t)stream>>>((int)k, dout, dbias, out,
									      B, OC, partial, tickets);
	return launched();
}

/* ---- softmax cross-entropy ---------------------------------------------- */

/* One warp per row, XENT_ROWS rows per block. The maximum and its first
 * index are reduced together (ties go to the lower index, like
 * torch.argmax and the CPU twin); the sum of exponentials is reduced in
 * double as on the CPU. Both butterflies leave every lane with the same
 * result: the max is a selection, and a + b == b + a in IEEE arithmetic. */
#define XENT_ROWS 8
#define FULL_MASK 0xffffffffu

__global__ void xent_rows_kernel(float *out, double *row_loss, double *row_right,
				 const float *logits, const int32_t *labels, int B, int C, int train,
				 float scale)
{
	int lane = threadIdx.x & 31;
	int b = blockIdx.x * XENT_ROWS + (threadIdx.x >> 5);
	if (b >= B)
		return;   /* the whole warp: no block-wide barrier follows */
	const float *x = logits + (size_t)b * C;
	float *p = out + (size_t)b * C;

	float mv = -FLT_MAX;
	int mi = C;   // "none yet": loses every tie
	for (int i = lane; i < C; i += 32)
		if (mi == C || x[i] > mv) {   // strict: a lane keeps its first maximum
			mv = x[i];
			mi = i;
		}
	for (int o = 16; o > 0; o >>= 1) {
		float ov = __shfl_xor_sync(FULL_MASK, mv, o);
		int oi = __shfl_xor_sync(FULL_MASK, mi, o);
		if (oi < C && (mi == C || ov > mv || (ov == mv && oi < mi))) {
			mv = ov;
			mi = oi;
		}
	}
	double sum = 0.0;
	for (int i = lane; i < C; i += 32)
		sum += (double)expf(x[i] - mv);
	for (int o = 16; o > 0; o >>= 1)
		sum += __shfl_xor_sync(FULL_MASK, sum, o);
	int32_t label = labels[b];
	/* Read before out is written, so out may alias logits. */
	double zlabel = (double)x[label] - (double)mv;
	__syncwarp();
	float inv = (float)(1.0 / sum);
	for (int i = lane; i < C; i += 32) {
		float pi = expf(x[i] - mv) * inv;
		p[i] = train ? (i == label ? pi - 1.0f : pi) * scale : pi;
	}
	if (lane == 0) {
		row_loss[b] = log(sum) - zlabel;
		row_right[b] = mi == label ? 1.0 : 0.0;
	}
}

extern "C" int gk_xent_rows(void *stream, float *out, double *row_loss, double *row_right,
			    const float *logits, const int32_t *labels, int B, int C, int train,
			    float scale)
{
	if (B <= 0)
		return 0;
	unsigned blocks = (unsigned)((B + XENT_ROWS - 1) / XENT_ROWS);
	xent_rows_kernel<<<blocks, 32 * XENT_ROWS, 0, (cudaStream_t)stream>>>(
		out, row_loss, row_right, logits, labels, B, C, train, scale);
	return launched();
}

/* One block: each thread sums a fixed stride of rows, then a tree. */
#define METER_THREADS 256

__global__ void meter_add_kernel(double *meter, const double *row_loss, const double *row_right,
				 int B)
{
	__shared__ double sl[METER_THREADS], sr[METER_THREADS];
	int t = threadIdx.x;
	double l = 0.0, r = 0.0;
	for (int i = t; i < B; i += METER_THREADS) {
		l += row_loss[i];
		r += row_right[i];
	}
	sl[t] = l;
	sr[t] = r;
	__syncthreads();
	for (int s = METER_THREADS / 2; s > 0; s >>= 1) {
		if (t < s) {
			sl[t] += sl[t + s];
			sr[t] += sr[t + s];
		}
		__syncthreads();
	}
	if (t == 0) {
		meter[0] += sl[0];
		meter[1] += sr[0];
	}
}

extern "C" int gk_meter_add(void *stream, double *meter, const double *row_loss,
			    const double *row_right, int B)
{
	if (B <= 0)
		return 0;
	meter_add_kernel<<<1, METER_THREADS, 0, (cudaStream_t)stream>>>(meter, row_loss, row_right, B);
	return launched();
}

__global__ void xent_backward_kernel(float *dlogits, const float *probs, const int32_t *labels,
				     int B, int C, float scale)
{
	size_t n = (size_t)B * C;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		int c = (int)(i % (size_t)C);
		int b = (int)(i / (size_t)C);
		float pi = probs[i];
		dlogits[i] = (c == labels[b] ? pi - 1.0f : pi) * scale;
	}
}

extern "C" int gk_xent_backward(void *stream, float *dlogits, const float *probs,
				const int32_t *labels, int B, int C, float scale)
{
	size_t n = (size_t)B * C;
	if (n == 0)
		return 0;
	xent_backward_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(dlogits, probs,
										 labels, B, C, scale);
	return launched();
}

/* ---- batches from a resident training set ------------------------------- */

__global__ void gather_kernel(float *x, int32_t *y, const float *data_x, const int32_t *data_y,
			      const uint32_t *order, size_t at, const struct gk_step *step, int B,
			      size_t D)
{
	order += step ? step->at : at;
	for (int b = blockIdx.y; b < B; b += gridDim.y) {
		size_t row = order[b];
		const float *src = data_x + row * D;
		float *dst = x + (size_t)b * D;
		for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < D;
		     j += (size_t)gridDim.x * blockDim.x)
			dst[j] = src[j];
		if (blockIdx.x == 0 && threadIdx.x == 0)
			y[b] = data_y[row];
	}
}

extern "C" int gk_gather(void *stream, float *x, int32_t *y, const float *data_x,
			 const int32_t *data_y, const uint32_t *order, size_t at,
			 const struct gk_step *step, int B, size_t D)
{
	if (B <= 0)
		return 0;
	size_t gx = (D + THREADS - 1) / THREADS;
	dim3 grid((unsigned)(gx < 1 ? 1 : gx > 64 ? 64 : gx),
		  (unsigned)(B < ROW_GRID_MAX ? B : ROW_GRID_MAX));
	gather_kernel<<<grid, THREADS, 0, (cudaStream_t)stream>>>(x, y, data_x, data_y, order, at, step,
								   B, D);
	return launched();
}

__global__ void step_set_kernel(struct gk_step *dev, struct gk_step host)
{
	*dev = host;
}

extern "C" int gk_step_set(void *stream, struct gk_step *dev, const struct gk_step *host)
{
	step_set_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(dev, *host);
	return launched();
}

/* ---- optimizer and reductions ------------------------------------------- */

/* enum optim_kind's values (core/nn/optim.h), repeated because this file is
 * C++ and optim.h's enum lives in C; gpu tests check they agree. */
#define K_SGD 0
#define K_MOMENTUM 1
#define K_ADAM 2

__global__ void optim_kernel(struct gk_optim o, const struct gk_step *step, float *params,
			     float *grads, float *m, float *v, size_t n, int zero)
{
	if (step) {
		o.lr = step->lr;
		o.step_size = step->step_size;
		o.inv_sqrt_bc2 = step->inv_sqrt_bc2;
	}
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float p = params[i];
		float g = grads[i] + o.wd * p;
		if (o.kind == K_SGD) {
			p -= o.lr * g;
		} else if (o.kind == K_MOMENTUM) {
			float vv = o.mu * m[i] + g;
			m[i] = vv;
			p -= o.lr * (o.nesterov ? g + o.mu * vv : vv);
		} else {
			float mi = o.b1 * m[i] + (1.0f - o.b1) * g;
			float vi = o.b2 * v[i] + (1.0f - o.b2) * g * g;
			m[i] = mi;
			v[i] = vi;
			p -= o.step_size * mi / (sqrtf(vi) * o.inv_sqrt_bc2 + o.eps);
		}
		params[i] = p;
		if (zero)
			grads[i] = 0.0f;
	}
}

extern "C" int gk_optim_step(void *stream, const struct gk_optim *o, const struct gk_step *step,
			     float *params, float *grads, float *m, float *v, size_t n, int zero)
{
	if (n == 0)
		return 0;
	/* The last guard against stepping missing state through NULL;
	 * gpu_optim_step refuses first and says which buffer is missing. */
	if (o->kind < K_SGD || o->kind > K_ADAM || (o->kind != K_SGD && !m) || (o->kind == K_ADAM && !v))
		return cudaErrorInvalidValue;
	optim_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(*o, step, params, grads, m,
									 v, n, zero);
	return launched();
}

__global__ void add_kernel(float *y, const float *x, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		y[i] += x[i];
}

extern "C" int gk_add(void *stream, float *y, const float *x, size_t n)
{
	if (n == 0)
		return 0;
	add_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(y, x, n);
	return launched();
}
