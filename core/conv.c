/* 2-D convolution on the CPU: im2col over a chunk of samples, then one
 * OpenBLAS sgemm per chunk.
 *
 * The patches of Bc samples are unrolled side by side into col
 * (C*K*K, Bc*OH*OW), so the convolution of the whole chunk is one product
 * weight (OC, C*K*K) @ col into tmp (OC, Bc*OH*OW), which is then scattered
 * into the NCHW output with the bias. One sgemm per sample was measured
 * first: on 2 cores its 256 small products per layer spent more time in
 * OpenBLAS's thread hand-offs (sched_yield) than in the kernel. Backward
 * gathers dout into the same (OC, Bc*OH*OW) layout, so dweight is one
 * product over the chunk; im2col is recomputed rather than kept from
 * forward (B column matrices would be 160 MB for the Fashion CNN). */
#include "layers.h"

#include <cblas.h>
#include <errno.h>
#include <string.h>

/* Loops get AVX2 and AVX-512 copies picked at load time, as in layers.c. */
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

/* Sum of x (n) in eight interleaved partial sums: the compiler may not
 * reorder a float sum by itself, and one serial chain of adds is bound by
 * the add latency. */
VECTOR_CLONES
static float sum8(const float *x, size_t n)
{
	float acc[8] = { 0 };
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int k = 0; k < 8; k++)
			acc[k] += x[i + k];
	float s = 0.0f;
	for (; i < n; i++)
		s += x[i];
	for (int k = 0; k < 8; k++)
		s += acc[k];
	return s;
}

int window_init(struct window *w)
{
	if (w->C < 1 || w->H < 1 || w->W < 1 || w->K < 1 || w->S < 1 || w->P < 0)
		return -EINVAL;
	long oh = ((long)w->H + 2L * w->P - w->K);
	long ow = ((long)w->W + 2L * w->P - w->K);
	if (oh < 0 || ow < 0)
		return -EINVAL;
	w->OH = (int)(oh / w->S + 1);
	w->OW = (int)(ow / w->S + 1);
	return 0;
}

/* Scratch per call is kept near 4 MiB: big enough for products that keep
 * both cores busy, small enough that col is still in cache when col2im
 * reads it back (16 MiB was measured slower: col2im streamed from DRAM). */
#define CONV_SCRATCH_FLOATS ((size_t)1 << 20)

/* Samples per chunk for a batch of B. */
static int conv_chunk(const struct window *w, int OC, int B)
{
	size_t per = ((size_t)w->C * w->K * w->K + (size_t)OC) * (size_t)w->OH * w->OW;
	size_t n = CONV_SCRATCH_FLOATS / per;
	if (n < 1)
		n = 1;
	return n < (size_t)B ? (int)n : B;
}

size_t conv_col_size(const struct window *w, int OC, int B)
{
	size_t per = ((size_t)w->C * w->K * w->K + (size_t)OC) * (size_t)w->OH * w->OW;
	return (size_t)conv_chunk(w, OC, B) * per;
}

/* The output columns [*lo, *hi) whose input column ow*S - P + k lies
 * inside [0, n); the others read padding. */
static void valid_range(int *lo, int *hi, int k, int n, int S, int P, int On)
{
	int a = P - k > 0 ? (P - k + S - 1) / S : 0;
	int last = n - 1 + P - k;   // ow*S <= last
	int b = last < 0 ? 0 : last / S + 1;
	if (b > On)
		b = On;
	if (a > b)
		a = b;
	*lo = a;
	*hi = b;
}

/* col (C*K*K, OH*OW) with row stride ld = the patches of one sample's inp
 * (C, H, W). Rows are short (OW values), so plain loops beat calls to
 * memcpy and memset. */
VECTOR_CLONES
static void im2col(float *col, size_t ld, const float *inp, const struct window *w)
{
	int K = w->K, S = w->S, P = w->P, H = w->H, W = w->W, OH = w->OH, OW = w->OW;
	for (int c = 0; c < w->C; c++) {
		const float *src = inp + (size_t)c * H * W;   // (H, W)
		for (int kh = 0; kh < K; kh++) {
			for (int kw = 0; kw < K; kw++) {
				float *row = col + ((size_t)(c * K + kh) * K + kw) * ld;   // (OH, OW)
				int lo, hi;
				valid_range(&lo, &hi, kw, W, S, P, OW);
				for (int oh = 0; oh < OH; oh++) {
					float *r = row + (size_t)oh * OW;
					int ih = oh * S - P + kh;
					if (ih < 0 || ih >= H || lo == hi) {
						for (int ow = 0; ow < OW; ow++)
							r[ow] = 0.0f;
						continue;
					}
					const float *s = src + (size_t)ih * W + kw - P;
					for (int ow = 0; ow < lo; ow++)
						r[ow] = 0.0f;
					if (S == 1) {
						for (int ow = lo; ow < hi; ow++)
							r[ow] = s[ow];
					} else {
						for (int ow = lo; ow < hi; ow++)
							r[ow] = s[(size_t)ow * S];
					}
					for (int ow = hi; ow < OW; ow++)
						r[ow] = 0.0f;
				}
			}
		}
	}
}

/* inp (C, H, W) = the sum of col's patches (row stride ld) back at their
 * places (set). */
VECTOR_CLONES
static void col2im(float *inp, const float *col, size_t ld, const struct window *w)
{
	int K = w->K, S = w->S, P = w->P, H = w->H, W = w->W, OH = w->OH, OW = w->OW;
	memset(inp, 0, (size_t)w->C * H * W * sizeof(float));
	for (int c = 0; c < w->C; c++) {
		float *dst = inp + (size_t)c * H * W;   // (H, W)
		for (int kh = 0; kh < K; kh++) {
			for (int kw = 0; kw < K; kw++) {
				const float *row = col + ((size_t)(c * K + kh) * K + kw) * ld;
				int lo, hi;
				valid_range(&lo, &hi, kw, W, S, P, OW);
				for (int oh = 0; oh < OH; oh++) {
					int ih = oh * S - P + kh;
					if (ih < 0 || ih >= H)
						continue;
					const float *r = row + (size_t)oh * OW;
					float *d = dst + (size_t)ih * W + kw - P;
					if (S == 1) {
						for (int ow = lo; ow < hi; ow++)
							d[ow] += r[ow];
					} else {
						for (int ow = lo; ow < hi; ow++)
							d[(size_t)ow * S] += r[ow];
					}
				}
			}
		}
	}
}

void conv_forward(float *out, float *col, const float *inp, const float *weight,
		  const float *bias, int B, int OC, const struct window *w)
{
	// out (B, OC, OH, OW), inp (B, C, H, W), weight (OC, C, K, K), bias (OC)
	int ckk = w->C * w->K * w->K;
	size_t ohw = (size_t)w->OH * w->OW;
	size_t in_n = (size_t)w->C * w->H * w->W;
	int Bc = conv_chunk(w, OC, B);
	for (int b0 = 0; b0 < B; b0 += Bc) {
		int nb = B - b0 < Bc ? B - b0 : Bc;
		size_t ld = (size_t)nb * ohw;
		float *tmp = col + (size_t)ckk * ld;   // (OC, nb*OH*OW)
		for (int b = 0; b < nb; b++)
			im2col(col + (size_t)b * ohw, ld, inp + (size_t)(b0 + b) * in_n, w);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OC, (int)ld, ckk,
			    1.0f, weight, ckk, col, (int)ld, 0.0f, tmp, (int)ld);
		for (int b = 0; b < nb; b++) {
			float *out_b = out + (size_t)(b0 + b) * OC * ohw;   // (OC, OH*OW)
			for (int o = 0; o < OC; o++) {
				const float *t = tmp + (size_t)o * ld + (size_t)b * ohw;
				float *y = out_b + (size_t)o * ohw;
				float bo = bias ? bias[o] : 0.0f;
				for (size_t i = 0; i < ohw; i++)
					y[i] = t[i] + bo;
			}
		}
	}
}

void conv_backward(float *dinp, float *dweight, float *dbias, float *col,
		   const float *dout, const float *inp, const float *weight,
		   int B, int OC, const struct window *w)
{
	// dinp (B, C, H, W), dweight (OC, C, K, K), dbias (OC), dout (B, OC, OH, OW)
	int ckk = w->C * w->K * w->K;
	size_t ohw = (size_t)w->OH * w->OW;
	size_t in_n = (size_t)w->C * w->H * w->W;
	int Bc = conv_chunk(w, OC, B);
	for (int b0 = 0; b0 < B; b0 += Bc) {
		int nb = B - b0 < Bc ? B - b0 : Bc;
		size_t ld = (size_t)nb * ohw;
		float *tmp = col + (size_t)ckk * ld;   // (OC, nb*OH*OW)
		for (int b = 0; b < nb; b++) {
			const float *dout_b = dout + (size_t)(b0 + b) * OC * ohw;   // (OC, OH*OW)
			for (int o = 0; o < OC; o++)
				memcpy(tmp + (size_t)o * ld + (size_t)b * ohw, dout_b + (size_t)o * ohw,
				       ohw * sizeof(float));
			im2col(col + (size_t)b * ohw, ld, inp + (size_t)(b0 + b) * in_n, w);
		}
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, OC, ckk, (int)ld,
			    1.0f, tmp, (int)ld, col, (int)ld, 1.0f, dweight, ckk);
		if (dbias) {
			for (int o = 0; o < OC; o++)
				dbias[o] += sum8(tmp + (size_t)o * ld, ld);
		}
		if (!dinp)
			continue;
		/* beta = 0: col is written without reading what was there. */
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, (int)ld, OC,
			    1.0f, weight, ckk, tmp, (int)ld, 0.0f, col, (int)ld);
		for (int b = 0; b < nb; b++)
			col2im(dinp + (size_t)(b0 + b) * in_n, col + (size_t)b * ohw, ld, w);
	}
}
