/* 2-D convolution on the CPU: im2col over a chunk of samples, then one
 * OpenBLAS sgemm per chunk.
 *
 * The patches of Bc samples are unrolled side by side into col
 * (C*K*K, Bc*OH*OW), so the convolution of the whole chunk is one product
 * weight (OC, C*K*K) @ col into tmp (OC, Bc*OH*OW), which is then scattered
 * into the NCHW output with the bias. How many samples a chunk holds is
 * set by the scratch size (below): small layers get many (the first layer
 * of the Fashion CNN, 5), big ones as few as one. Backward
 * gathers dout into the same (OC, Bc*OH*OW) layout, so dweight is one
 * product over the chunk; im2col is recomputed rather than kept from
 * forward (B column matrices would be 160 MB for the Fashion CNN). */
#include "layers.h"

#include <cblas.h>
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

/* Scratch per call is kept near 1 MiB, about one core's L2 here, so col is
 * still in cache when the sgemm or col2im reads it back. Measured on the
 * Fashion CNN (CPU ms per step, 1 thread): 16 MiB was slowest (col2im
 * streamed from memory), 4 MiB in between, 1 MiB best, although it means
 * one sample per chunk for the 5x5x32 -> 64 layer (N = 196 per sgemm). */
#define CONV_SCRATCH_FLOATS ((size_t)1 << 18)

/* Samples per chunk for a batch of B. */
static int conv_chunk(const struct window *w, int OC, int B)
{
	size_t per = ((size_t)w->C * w->K * w->K + (size_t)OC) * (size_t)w->OH * w->OW;
	size_t n = CONV_SCRATCH_FLOATS / per;
	if (n < 1)
		n = 1;
	return n < (size_t)B ? (int)n : B;
}

/* One sample's padded planes, after the chunk's col and tmp. */
static size_t padded_size(const struct window *w)
{
	return (size_t)w->C * (size_t)(w->H + 2 * w->P) * (size_t)(w->W + 2 * w->P);
}

size_t conv_col_size(const struct window *w, int OC, int B)
{
	size_t per = ((size_t)w->C * w->K * w->K + (size_t)OC) * (size_t)w->OH * w->OW;
	return (size_t)conv_chunk(w, OC, B) * per + padded_size(w);
}

/* xp (C, H + 2P, W + 2P) = inp (C, H, W) with P zeros around each plane.
 * im2col and col2im then index without bounds checks: each (c, kh, kw)
 * row of col is OH straight copies of OW values. (Measured with perf on the
 * Fashion CNN: about as fast as the bounds-checked loops it replaced; the
 * 14-wide rows cost in loop overhead either way. A next step would be to
 * skip im2col altogether for stride 1, see docs/BENCHMARKS.md.) */
VECTOR_CLONES
static void pad_planes(float *xp, const float *inp, const struct window *w)
{
	int P = w->P, H = w->H, W = w->W, Hp = H + 2 * P, Wp = W + 2 * P;
	for (int c = 0; c < w->C; c++) {
		float *d = xp + (size_t)c * Hp * Wp;
		const float *x = inp + (size_t)c * H * W;
		for (int i = 0; i < P * Wp; i++)
			d[i] = 0.0f;
		for (int h = 0; h < H; h++) {
			float *r = d + (size_t)(h + P) * Wp;
			for (int i = 0; i < P; i++)
				r[i] = 0.0f;
			for (int i = 0; i < W; i++)
				r[P + i] = x[(size_t)h * W + i];
			for (int i = P + W; i < Wp; i++)
				r[i] = 0.0f;
		}
		for (int i = (P + H) * Wp; i < Hp * Wp; i++)
			d[i] = 0.0f;
	}
}

/* d (n) = s (n); d (n) += s (n). restrict lets the compiler vectorize
 * without the overlap checks that made the inlined loops scalar. */
static inline void row_copy(float *restrict d, const float *restrict s, int n)
{
	for (int i = 0; i < n; i++)
		d[i] = s[i];
}

static inline void row_add(float *restrict d, const float *restrict s, int n)
{
	for (int i = 0; i < n; i++)
		d[i] += s[i];
}

/* col (C*K*K, OH*OW) with row stride ld = the patches of one sample's
 * padded planes xp (C, H + 2P, W + 2P). */
VECTOR_CLONES
static void im2col(float *col, size_t ld, const float *xp, const struct window *w)
{
	int K = w->K, S = w->S, OH = w->OH, OW = w->OW;
	int Hp = w->H + 2 * w->P, Wp = w->W + 2 * w->P;
	for (int c = 0; c < w->C; c++) {
		for (int kh = 0; kh < K; kh++) {
			for (int kw = 0; kw < K; kw++) {
				float *row = col + ((size_t)(c * K + kh) * K + kw) * ld;   // (OH, OW)
				const float *src = xp + (size_t)c * Hp * Wp + (size_t)kh * Wp + kw;
				for (int oh = 0; oh < OH; oh++) {
					float *r = row + (size_t)oh * OW;
					const float *x = src + (size_t)oh * S * Wp;
					if (S == 1) {
						row_copy(r, x, OW);
					} else {
						for (int ow = 0; ow < OW; ow++)
							r[ow] = x[(size_t)ow * S];
					}
				}
			}
		}
	}
}

/* dxp (C, H + 2P, W + 2P) = the sum of col's patches (row stride ld) back
 * at their places (set, padding included). */
VECTOR_CLONES
static void col2im(float *dxp, const float *col, size_t ld, const struct window *w)
{
	int K = w->K, S = w->S, OH = w->OH, OW = w->OW;
	int Hp = w->H + 2 * w->P, Wp = w->W + 2 * w->P;
	memset(dxp, 0, (size_t)w->C * Hp * Wp * sizeof(float));
	for (int c = 0; c < w->C; c++) {
		for (int kh = 0; kh < K; kh++) {
			for (int kw = 0; kw < K; kw++) {
				const float *row = col + ((size_t)(c * K + kh) * K + kw) * ld;
				float *dst = dxp + (size_t)c * Hp * Wp + (size_t)kh * Wp + kw;
				for (int oh = 0; oh < OH; oh++) {
					const float *r = row + (size_t)oh * OW;
					float *d = dst + (size_t)oh * S * Wp;
					if (S == 1) {
						row_add(d, r, OW);
					} else {
						for (int ow = 0; ow < OW; ow++)
							d[(size_t)ow * S] += r[ow];
					}
				}
			}
		}
	}
}

/* dinp (C, H, W) = the interior of dxp (C, H + 2P, W + 2P). */
static void unpad_planes(float *dinp, const float *dxp, const struct window *w)
{
	int P = w->P, H = w->H, W = w->W, Hp = H + 2 * P, Wp = W + 2 * P;
	for (int c = 0; c < w->C; c++)
		for (int h = 0; h < H; h++)
			memcpy(dinp + ((size_t)c * H + h) * W, dxp + ((size_t)c * Hp + h + P) * Wp + P,
			       (size_t)W * sizeof(float));
}

/* The padded planes of one sample: inp itself when there is no padding,
 * else a copy in xp. */
static const float *padded(float *xp, const float *inp, const struct window *w)
{
	if (w->P == 0)
		return inp;
	pad_planes(xp, inp, w);
	return xp;
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
		float *xp = col + (size_t)(ckk + OC) * ld;
		for (int b = 0; b < nb; b++)
			im2col(col + (size_t)b * ohw, ld, padded(xp, inp + (size_t)(b0 + b) * in_n, w), w);
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
		float *xp = col + (size_t)(ckk + OC) * ld;
		for (int b = 0; b < nb; b++) {
			const float *dout_b = dout + (size_t)(b0 + b) * OC * ohw;   // (OC, OH*OW)
			for (int o = 0; o < OC; o++)
				memcpy(tmp + (size_t)o * ld + (size_t)b * ohw, dout_b + (size_t)o * ohw,
				       ohw * sizeof(float));
			im2col(col + (size_t)b * ohw, ld, padded(xp, inp + (size_t)(b0 + b) * in_n, w), w);
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
		for (int b = 0; b < nb; b++) {
			float *dinp_b = dinp + (size_t)(b0 + b) * in_n;   // (C, H, W)
			if (w->P == 0) {
				col2im(dinp_b, col + (size_t)b * ohw, ld, w);
			} else {
				col2im(xp, col + (size_t)b * ohw, ld, w);
				unpad_planes(dinp_b, xp, w);
			}
		}
	}
}
