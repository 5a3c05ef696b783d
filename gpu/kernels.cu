/* CUDA twins of the CPU kernels in core/layers.c and core/optim.c.
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

__global__ void act_forward_kernel(int k, float *out, const float *inp, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float x = inp[i];
		float y;
		if (k == GK_RELU) {
			y = x < 0.0f ? 0.0f : x;   // NaN stays NaN, as on the CPU
		} else if (k == GK_TANH) {
			y = tanhf(x);
		} else if (x >= 0.0f) {
			y = 1.0f / (1.0f + expf(-x));
		} else {
			float e = expf(x);
			y = e / (1.0f + e);
		}
		out[i] = y;
	}
}

__global__ void act_backward_kernel(int k, float *dinp, const float *dout, const float *out,
				    size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float d = dout[i], y = out[i];
		if (k == GK_RELU)
			dinp[i] = y > 0.0f ? d : 0.0f;
		else if (k == GK_TANH)
			dinp[i] = d * (1.0f - y * y);
		else
			dinp[i] = d * y * (1.0f - y);
	}
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

/* ---- bias ---------------------------------------------------------------- */

__global__ void bias_fill_kernel(float *out, const float *bias, int B, int OC)
{
	size_t n = (size_t)B * OC;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		out[i] = bias[i % (size_t)OC];
}

extern "C" int gk_bias_fill(void *stream, float *out, const float *bias, int B, int OC)
{
	size_t n = (size_t)B * OC;
	if (n == 0)
		return 0;
	bias_fill_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(out, bias, B, OC);
	return launched();
}

/* A block of 32 x 8 threads owns 32 adjacent columns: threadIdx.x picks the
 * column (reads of a row are coalesced), threadIdx.y strides over rows, and
 * the 8 partial sums meet in shared memory. */
#define BG_COLS 32
#define BG_ROWS 8

__global__ void bias_grad_kernel(float *dbias, const float *dout, int B, int OC)
{
	__shared__ float part[BG_ROWS][BG_COLS];
	int o = blockIdx.x * BG_COLS + threadIdx.x;
	float s = 0.0f;
	if (o < OC)
		for (int b = threadIdx.y; b < B; b += BG_ROWS)
			s += dout[(size_t)b * OC + o];
	part[threadIdx.y][threadIdx.x] = s;
	__syncthreads();
	if (threadIdx.y == 0 && o < OC) {
		for (int r = 1; r < BG_ROWS; r++)
			s += part[r][threadIdx.x];
		dbias[o] += s;
	}
}

extern "C" int gk_bias_grad(void *stream, float *dbias, const float *dout, int B, int OC)
{
	if (OC <= 0 || B <= 0)
		return 0;
	dim3 threads(BG_COLS, BG_ROWS);
	unsigned grid = (unsigned)((OC + BG_COLS - 1) / BG_COLS);
	bias_grad_kernel<<<grid, threads, 0, (cudaStream_t)stream>>>(dbias, dout, B, OC);
	return launched();
}

/* ---- softmax cross-entropy ---------------------------------------------- */

/* One block per row. The maximum and its first index are reduced together
 * (ties go to the lower index, like torch.argmax and the CPU twin); the sum
 * of exponentials is reduced in double as on the CPU. */
#define XENT_THREADS 256

__global__ void xent_forward_kernel(float *probs, double *row_loss, int *row_right,
				    const float *logits, const int32_t *labels, int C)
{
	__shared__ float smax[XENT_THREADS];
	__shared__ int sidx[XENT_THREADS];
	__shared__ double ssum[XENT_THREADS];
	int b = blockIdx.x, t = threadIdx.x;
	const float *x = logits + (size_t)b * C;
	float *p = probs + (size_t)b * C;

	float mv = -FLT_MAX;
	int mi = C;   // "none yet": loses every tie
	for (int i = t; i < C; i += blockDim.x)
		if (mi == C || x[i] > mv) {   // strict: a thread keeps its first maximum
			mv = x[i];
			mi = i;
		}
	smax[t] = mv;
	sidx[t] = mi;
	__syncthreads();
	for (int s = blockDim.x / 2; s > 0; s >>= 1) {
		if (t < s) {
			float ov = smax[t + s];
			int oi = sidx[t + s];
			if (oi < C && (sidx[t] == C || ov > smax[t] || (ov == smax[t] && oi < sidx[t]))) {
				smax[t] = ov;
				sidx[t] = oi;
			}
		}
		__syncthreads();
	}
	float maxv = smax[0];
	int argmax = sidx[0];
	int32_t label = labels[b];
	/* Read before probs is written, so probs may alias logits. */
	double zlabel = (double)x[label] - (double)maxv;
	__syncthreads();

	double sum = 0.0;
	for (int i = t; i < C; i += blockDim.x)
		sum += (double)expf(x[i] - maxv);
	ssum[t] = sum;
	__syncthreads();
	for (int s = blockDim.x / 2; s > 0; s >>= 1) {
		if (t < s)
			ssum[t] += ssum[t + s];
		__syncthreads();
	}
	sum = ssum[0];
	float inv = (float)(1.0 / sum);
	for (int i = t; i < C; i += blockDim.x)
		p[i] = expf(x[i] - maxv) * inv;
	if (t == 0) {
		row_loss[b] = log(sum) - zlabel;
		row_right[b] = argmax == label;
	}
}

extern "C" int gk_xent_forward(void *stream, float *probs, double *row_loss, int *row_right,
			       const float *logits, const int32_t *labels, int B, int C)
{
	if (B <= 0)
		return 0;
	xent_forward_kernel<<<(unsigned)B, XENT_THREADS, 0, (cudaStream_t)stream>>>(
		probs, row_loss, row_right, logits, labels, C);
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

/* ---- optimizer and reductions ------------------------------------------- */

/* enum optim_kind's values (core/optim.h), repeated because this file is
 * C++ and optim.h's enum lives in C; gpu tests check they agree. */
#define K_SGD 0
#define K_MOMENTUM 1
#define K_ADAM 2

__global__ void optim_kernel(struct gk_optim o, float *params, float *grads, float *m, float *v,
			     size_t n, int zero)
{
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

extern "C" int gk_optim_step(void *stream, const struct gk_optim *o, float *params, float *grads,
			     float *m, float *v, size_t n, int zero)
{
	if (n == 0)
		return 0;
	optim_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(*o, params, grads, m, v, n,
									 zero);
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
