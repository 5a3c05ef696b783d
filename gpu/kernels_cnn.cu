/* CUDA twins of the convolutional-network layers of the CPU backend:
 * im2col/col2im and the layout moves around conv's GEMMs (core/conv.c),
 * pooling (core/pool.c), dropout (core/layers.c) and batch normalization
 * (core/batchnorm.c). Semantics follow the CPU code exactly (first maximum
 * in max pooling, sums in double in batchnorm, the same dropout hash);
 * only summation order differs.
 *
 * Backward kernels that SET their input gradient are written as gathers
 * (one thread per input element sums what reaches it), so they need no
 * clearing pass and no atomics, and overlapping windows add up. */
extern "C" {
#include "../core/layers.h"
}
#include "kernels.h"
#include "launch.h"

#include <cuda_runtime.h>


/* ---- convolution's data movement ---------------------------------------- */

__global__ void im2col_kernel(float *col, size_t ld, const float *inp, int nb, struct window w)
{
	size_t ohw = (size_t)w.OH * w.OW, cols = (size_t)nb * ohw;
	size_t n = (size_t)w.C * w.K * w.K * cols;
	GRID_STRIDE(idx, n) {
		size_t r = idx / cols, j = idx % cols;
		int kw = (int)(r % w.K), kh = (int)(r / w.K % w.K), c = (int)(r / w.K / w.K);
		int b = (int)(j / ohw), q = (int)(j % ohw);
		int h = q / w.OW * w.S - w.P + kh, x = q % w.OW * w.S - w.P + kw;
		float v = 0.0f;
		if (h >= 0 && h < w.H && x >= 0 && x < w.W)
			v = inp[(((size_t)b * w.C + c) * w.H + h) * w.W + x];
		col[r * ld + j] = v;
	}
}

__global__ void col2im_kernel(float *dinp, const float *col, size_t ld, int nb, struct window w)
{
	size_t ohw = (size_t)w.OH * w.OW;
	size_t n = (size_t)nb * w.C * w.H * w.W;
	GRID_STRIDE(idx, n) {
		int x = (int)(idx % w.W), h = (int)(idx / w.W % w.H);
		int c = (int)(idx / w.W / w.H % w.C), b = (int)(idx / w.W / w.H / w.C);
		float s = 0.0f;
		for (int kh = 0; kh < w.K; kh++) {
			int hh = h + w.P - kh;
			if (hh < 0 || hh % w.S || hh / w.S >= w.OH)
				continue;
			for (int kw = 0; kw < w.K; kw++) {
				int xx = x + w.P - kw;
				if (xx < 0 || xx % w.S || xx / w.S >= w.OW)
					continue;
				size_t r = ((size_t)c * w.K + kh) * w.K + kw;
				s += col[r * ld + (size_t)b * ohw + (size_t)(hh / w.S) * w.OW + xx / w.S];
			}
		}
		dinp[idx] = s;
	}
}

extern "C" int gk_im2col(void *stream, float *col, size_t ld, const float *inp, int nb,
			 const struct window *w)
{
	size_t n = (size_t)w->C * w->K * w->K * nb * w->OH * w->OW;
	im2col_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(col, ld, inp, nb, *w);
	return launched();
}

extern "C" int gk_col2im(void *stream, float *dinp, const float *col, size_t ld, int nb,
			 const struct window *w)
{
	size_t n = (size_t)nb * w->C * w->H * w->W;
	col2im_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(dinp, col, ld, nb, *w);
	return launched();
}

__global__ void conv_scatter_kernel(float *out, const float *tmp, size_t ld, const float *bias,
				    int nb, int OC, size_t ohw)
{
	size_t n = (size_t)nb * OC * ohw;
	GRID_STRIDE(idx, n) {
		size_t i = idx % ohw;
		int o = (int)(idx / ohw % OC), b = (int)(idx / ohw / OC);
		out[idx] = tmp[(size_t)o * ld + (size_t)b * ohw + i] + (bias ? bias[o] : 0.0f);
	}
}

__global__ void conv_gather_kernel(float *tmp, size_t ld, const float *dout, int nb, int OC,
				   size_t ohw)
{
	size_t n = (size_t)nb * OC * ohw;
	GRID_STRIDE(idx, n) {
		size_t i = idx % ohw;
		int o = (int)(idx / ohw % OC), b = (int)(idx / ohw / OC);
		tmp[(size_t)o * ld + (size_t)b * ohw + i] = dout[idx];
	}
}

extern "C" int gk_conv_scatter(void *stream, float *out, const float *tmp, size_t ld,
			       const float *bias, int nb, int OC, size_t ohw)
{
	size_t n = (size_t)nb * OC * ohw;
	conv_scatter_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(out, tmp, ld, bias,
										nb, OC, ohw);
	return launched();
}

extern "C" int gk_conv_gather(void *stream, float *tmp, size_t ld, const float *dout, int nb,
			      int OC, size_t ohw)
{
	size_t n = (size_t)nb * OC * ohw;
	conv_gather_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(tmp, ld, dout, nb,
									       OC, ohw);
	return launched();
}

/* One block per row; partial sums in double, then a tree in shared memory. */
__global__ void row_sums_add_kernel(float *dst, const float *src, size_t ld)
{
	__shared__ double part[THREADS];
	const float *row = src + (size_t)blockIdx.x * ld;
	double s = 0.0;
	for (size_t i = threadIdx.x; i < ld; i += blockDim.x)
		s += row[i];
	part[threadIdx.x] = s;
	__syncthreads();
	for (int k = blockDim.x / 2; k > 0; k >>= 1) {
		if ((int)threadIdx.x < k)
			part[threadIdx.x] += part[threadIdx.x + k];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		dst[blockIdx.x] += (float)part[0];
}

extern "C" int gk_row_sums_add(void *stream, float *dbias, const float *tmp, size_t ld, int OC)
{
	if (OC <= 0)
		return 0;
	row_sums_add_kernel<<<(unsigned)OC, THREADS, 0, (cudaStream_t)stream>>>(dbias, tmp, ld);
	return launched();
}

/* ---- pooling -------------------------------------------------------------- */

__global__ void pool_forward_kernel(int max, float *out, const float *inp, size_t planes,
				    struct window w)
{
	size_t n = planes * w.OH * w.OW;
	float inv = 1.0f / (float)(w.K * w.K);
	GRID_STRIDE(idx, n) {
		int ow = (int)(idx % w.OW), oh = (int)(idx / w.OW % w.OH);
		size_t p = idx / w.OW / w.OH;
		const float *x0 = inp + p * w.H * w.W + (size_t)oh * w.S * w.W + (size_t)ow * w.S;
		float m = x0[0], s = 0.0f;
		for (int kh = 0; kh < w.K; kh++)
			for (int kw = 0; kw < w.K; kw++) {
				float v = x0[(size_t)kh * w.W + kw];
				if (v > m)
					m = v;
				s += v;
			}
		out[idx] = max ? m : s * inv;
	}
}

__global__ void pool_backward_kernel(int max, float *dinp, const float *dout, const float *inp,
				     size_t planes, struct window w)
{
	size_t n = planes * w.H * w.W;
	float inv = 1.0f / (float)(w.K * w.K);
	GRID_STRIDE(idx, n) {
		int x = (int)(idx % w.W), h = (int)(idx / w.W % w.H);
		size_t p = idx / w.W / w.H;
		const float *xp = inp ? inp + p * w.H * w.W : NULL;
		const float *dy = dout + p * w.OH * w.OW;
		/* The windows that contain (h, x): oh*S <= h < oh*S + K. */
		int oh0 = h - w.K + 1 <= 0 ? 0 : (h - w.K + w.S) / w.S;
		int ow0 = x - w.K + 1 <= 0 ? 0 : (x - w.K + w.S) / w.S;
		int oh1 = h / w.S < w.OH - 1 ? h / w.S : w.OH - 1;
		int ow1 = x / w.S < w.OW - 1 ? x / w.S : w.OW - 1;
		float s = 0.0f;
		for (int oh = oh0; oh <= oh1; oh++)
			for (int ow = ow0; ow <= ow1; ow++) {
				float g = dy[(size_t)oh * w.OW + ow];
				if (!max) {
					s += g * inv;
					continue;
				}
				/* The same scan as forward: the first maximum wins. */
				size_t at = (size_t)oh * w.S * w.W + (size_t)ow * w.S, best = at;
				for (int kh = 0; kh < w.K; kh++)
					for (int kw = 0; kw < w.K; kw++)
						if (xp[at + (size_t)kh * w.W + kw] > xp[best])
							best = at + (size_t)kh * w.W + kw;
				if (best == (size_t)h * w.W + x)
					s += g;
			}
		dinp[idx] = s;
	}
}

extern "C" int gk_pool_forward(void *stream, int max, float *out, const float *inp, int B,
			       const struct window *w)
{
	size_t planes = (size_t)B * w->C, n = planes * w->OH * w->OW;
	pool_forward_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(max, out, inp,
										planes, *w);
	return launched();
}

extern "C" int gk_pool_backward(void *stream, int max, float *dinp, const float *dout,
				const float *inp, int B, const struct window *w)
{
	size_t planes = (size_t)B * w->C, n = planes * w->H * w->W;
	pool_backward_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(
		max, dinp, dout, max ? inp : NULL, planes, *w);
	return launched();
}

/* ---- dropout ---------------------------------------------------------------- */

/* core/rng.c's rng_hash, bit for bit: the masks must be the CPU's. */
__device__ static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

__device__ static uint64_t rng_hash_dev(uint64_t seed, uint64_t stream, uint64_t index)
{
	uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ULL);
	h = mix64(h ^ (stream * 0xd1b54a32d192ed03ULL));
	return mix64(h ^ (index + 0x632be59bd9b4e019ULL));
}

#define RNG_DROPOUT_STREAM 5   /* enum rng_stream's RNG_DROPOUT; a test checks the masks */

__global__ void dropout_kernel(float *out, const float *inp, uint32_t thr, float scale,
			       uint64_t key, size_t n)
{
	GRID_STRIDE(i, n) {
		uint32_t u = (uint32_t)(rng_hash_dev(key, RNG_DROPOUT_STREAM, i) >> 32);
		out[i] = u >= thr ? inp[i] * scale : 0.0f;
	}
}

__global__ void copy_kernel(float *out, const float *inp, size_t n)
{
	GRID_STRIDE(i, n)
		out[i] = inp[i];
}

extern "C" int gk_dropout(void *stream, float *out, const float *inp, float p, uint64_t key,
			  size_t n)
{
	if (n == 0)
		return 0;
	if (p == 0.0f) {   // evaluation: identity, as on the CPU
		if (out != inp)
			copy_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(out, inp, n);
		return launched();
	}
	/* dropout_threshold() of core/layers.c */
	double t = (double)p * 4294967296.0;
	uint32_t thr = t >= 4294967295.0 ? 0xffffffffu : (uint32_t)t;
	dropout_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(out, inp, thr,
									   1.0f / (1.0f - p), key, n);
	return launched();
}

/* ---- batch normalization ---------------------------------------------------- */

__device__ static double block_sum(double v, double *part)
{
	part[threadIdx.x] = v;
	__syncthreads();
	for (int k = blockDim.x / 2; k > 0; k >>= 1) {
		if ((int)threadIdx.x < k)
			part[threadIdx.x] += part[threadIdx.x + k];
		__syncthreads();
	}
	double s = part[0];
	__syncthreads();   // part is reused by the next sum
	return s;
}

/* One block per channel c; element j of the channel is (b = j / HW, i = j % HW). */
#define CH(p, j) ((p)[((size_t)((j) / HW) * C + c) * HW + (j) % HW])

__global__ void batchnorm_forward_kernel(float *out, float *mean, float *var, const float *inp,
					 const float *gamma, const float *beta,
					 const float *run_mean, const float *run_var, int C, int HW,
					 size_t n)
{
	__shared__ double part[THREADS];
	int c = blockIdx.x;
	float mu, v;
	if (mean) {
		double s = 0.0;
		for (size_t j = threadIdx.x; j < n; j += blockDim.x)
			s += CH(inp, j);
		double m = block_sum(s, part) / (double)n, q = 0.0;
		for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
			double d = (double)CH(inp, j) - m;
			q += d * d;
		}
		q = block_sum(q, part);
		mu = (float)m;
		v = (float)(q / (double)n);
		if (threadIdx.x == 0) {
			mean[c] = mu;
			var[c] = v;
		}
	} else {
		mu = run_mean[c];
		v = run_var[c];
	}
	float a = gamma[c] / sqrtf(v + BATCHNORM_EPS);
	float d = beta[c] - a * mu;
	for (size_t j = threadIdx.x; j < n; j += blockDim.x)
		CH(out, j) = a * CH(inp, j) + d;
}

__global__ void batchnorm_backward_kernel(float *dinp, float *dgamma, float *dbeta,
					  float *drun_mean, float *drun_var, const float *dout,
					  const float *inp, const float *gamma, const float *mean,
					  const float *var, const float *run_mean,
					  const float *run_var, float stat_scale, int C, int HW,
					  size_t n)
{
	__shared__ double part[THREADS];
	int c = blockIdx.x;
	float mu = mean[c];
	float invstd = 1.0f / sqrtf(var[c] + BATCHNORM_EPS);
	double a = 0.0, b = 0.0;
	for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
		float dy = CH(dout, j);
		a += dy;
		b += (double)dy * (double)((CH(inp, j) - mu) * invstd);
	}
	double sdy = block_sum(a, part), sdyx = block_sum(b, part);
	if (threadIdx.x == 0) {
		dbeta[c] += (float)sdy;
		dgamma[c] += (float)sdyx;
		double unbiased = n > 1 ? (double)var[c] * (double)n / (double)(n - 1) : (double)var[c];
		drun_mean[c] += stat_scale * BATCHNORM_MOMENTUM * (mu - run_mean[c]);
		drun_var[c] += (float)(stat_scale * BATCHNORM_MOMENTUM * (unbiased - run_var[c]));
	}
	if (!dinp)
		return;
	float k = gamma[c] * invstd / (float)n;
	float mdy = (float)sdy, mdyx = (float)sdyx;
	/* dinp may alias dout: each element is read and then written by the
	 * same thread, after every thread finished the sums above. */
	for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
		float xhat = (CH(inp, j) - mu) * invstd;
		CH(dinp, j) = k * ((float)n * CH(dout, j) - mdy - xhat * mdyx);
	}
}

extern "C" int gk_batchnorm_forward(void *stream, float *out, float *mean, float *var,
				    const float *inp, const float *gamma, const float *beta,
				    const float *run_mean, const float *run_var, int B, int C,
				    int HW)
{
	if (C <= 0 || B <= 0)
		return 0;
	batchnorm_forward_kernel<<<(unsigned)C, THREADS, 0, (cudaStream_t)stream>>>(
		out, mean, var, inp, gamma, beta, run_mean, run_var, C, HW, (size_t)B * HW);
	return launched();
}

extern "C" int gk_batchnorm_backward(void *stream, float *dinp, float *dgamma, float *dbeta,
				     float *drun_mean, float *drun_var, const float *dout,
				     const float *inp, const float *gamma, const float *mean,
				     const float *var, const float *run_mean, const float *run_var,
				     float stat_scale, int B, int C, int HW)
{
	if (C <= 0 || B <= 0)
		return 0;
	batchnorm_backward_kernel<<<(unsigned)C, THREADS, 0, (cudaStream_t)stream>>>(
		dinp, dgamma, dbeta, drun_mean, drun_var, dout, inp, gamma, mean, var, run_mean,
		run_var, stat_scale, C, HW, (size_t)B * HW);
	return launched();
}
