/* Max and average pooling over NCHW activations, without padding. Plain
 * loops, but for the 2x2 stride-2 max pooling, which has an AVX-512 path
 * (below). */
#include "layers.h"

#include <immintrin.h>
#include <string.h>

/* The 2x2 stride-2 window (every pooling layer of the Fashion CNN) with
 * AVX-512, 16 outputs at a time: the even and odd columns of two input rows
 * are split apart with permutes, so each output is the max of four vectors.
 * The comparisons are the scalar code's, in its order (max_ps(b, m) is
 * "b > m ? b : m", NaN and signed zeros included), so both paths give the
 * same bits. perf on the Fashion CNN had the scalar 2x2 loops at ~5% of a
 * step. Masked lanes are not read: no row is overrun. */
#define AVX512 __attribute__((target("avx512f")))

static int pool2_avx512(const struct window *w)
{
	return w->K == 2 && w->S == 2 && !w->scalar && __builtin_cpu_supports("avx512f");
}

/* Lanes [0, n) of 16, n clamped to [0, 16]. */
static inline __mmask16 lanes(int n)
{
	return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

AVX512
static void maxpool2_forward_avx512(float *y, const float *x, const struct window *w)
{
	// y (OH, OW), x (H, W)
	int W = w->W, OH = w->OH, OW = w->OW;
	const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
	const __m512i od = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
	for (int oh = 0; oh < OH; oh++) {
		const float *r0 = x + (size_t)2 * oh * W, *r1 = r0 + W;
		for (int o = 0; o < OW; o += 16) {
			int n = 2 * (OW - o);   /* input columns left */
			__mmask16 ml = lanes(n), mh = lanes(n - 16), mo = lanes(OW - o);
			__m512 l0 = _mm512_maskz_loadu_ps(ml, r0 + 2 * o), h0 = _mm512_maskz_loadu_ps(mh, r0 + 2 * o + 16);
			__m512 l1 = _mm512_maskz_loadu_ps(ml, r1 + 2 * o), h1 = _mm512_maskz_loadu_ps(mh, r1 + 2 * o + 16);
			__m512 m = _mm512_permutex2var_ps(l0, ev, h0);
			m = _mm512_max_ps(_mm512_permutex2var_ps(l0, od, h0), m);
			m = _mm512_max_ps(_mm512_permutex2var_ps(l1, ev, h1), m);
			m = _mm512_max_ps(_mm512_permutex2var_ps(l1, od, h1), m);
			_mm512_mask_storeu_ps(y + (size_t)oh * OW + o, mo, m);
		}
	}
}

AVX512
static void maxpool2_backward_avx512(float *dx, const float *dy, const float *x,
				     const struct window *w)
{
	// dx (H, W), dy (OH, OW), x (H, W); the covered 2*OH x 2*OW block is set
	int W = w->W, OH = w->OH, OW = w->OW;
	const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
	const __m512i od = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
	/* Interleave two 16-vectors back: lanes 0..7 and 8..15 of each. */
	const __m512i il = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
	const __m512i ih = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
	const __m512 zero = _mm512_setzero_ps();
	for (int oh = 0; oh < OH; oh++) {
		const float *r0 = x + (size_t)2 * oh * W, *r1 = r0 + W;
		float *d0 = dx + (size_t)2 * oh * W, *d1 = d0 + W;
		for (int o = 0; o < OW; o += 16) {
			int n = 2 * (OW - o);
			__mmask16 ml = lanes(n), mh = lanes(n - 16), mo = lanes(OW - o);
			__m512 l0 = _mm512_maskz_loadu_ps(ml, r0 + 2 * o), h0 = _mm512_maskz_loadu_ps(mh, r0 + 2 * o + 16);
			__m512 l1 = _mm512_maskz_loadu_ps(ml, r1 + 2 * o), h1 = _mm512_maskz_loadu_ps(mh, r1 + 2 * o + 16);
			__m512 a = _mm512_permutex2var_ps(l0, ev, h0), b = _mm512_permutex2var_ps(l0, od, h0);
			__m512 c = _mm512_permutex2var_ps(l1, ev, h1), d = _mm512_permutex2var_ps(l1, od, h1);
			/* The last position that beat the running max wins, as in
			 * the scalar code. */
			__mmask16 ib = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ);
			__m512 m = _mm512_mask_blend_ps(ib, a, b);
			__mmask16 ic = _mm512_cmp_ps_mask(c, m, _CMP_GT_OQ);
			m = _mm512_mask_blend_ps(ic, m, c);
			__mmask16 id = _mm512_cmp_ps_mask(d, m, _CMP_GT_OQ);
			__mmask16 k3 = id, k2 = (__mmask16)(ic & ~id), k1 = (__mmask16)(ib & ~ic & ~id);
			__mmask16 k0 = (__mmask16)~(ib | ic | id);
			__m512 g = _mm512_maskz_loadu_ps(mo, dy + (size_t)oh * OW + o);
			__m512 g0 = _mm512_mask_mov_ps(zero, k0, g), g1 = _mm512_mask_mov_ps(zero, k1, g);
			__m512 g2 = _mm512_mask_mov_ps(zero, k2, g), g3 = _mm512_mask_mov_ps(zero, k3, g);
			_mm512_mask_storeu_ps(d0 + 2 * o, ml, _mm512_permutex2var_ps(g0, il, g1));
			_mm512_mask_storeu_ps(d0 + 2 * o + 16, mh, _mm512_permutex2var_ps(g0, ih, g1));
			_mm512_mask_storeu_ps(d1 + 2 * o, ml, _mm512_permutex2var_ps(g2, il, g3));
			_mm512_mask_storeu_ps(d1 + 2 * o + 16, mh, _mm512_permutex2var_ps(g2, ih, g3));
		}
	}
}

void maxpool_forward(float *out, const float *inp, int B, const struct window *w)
{
	// out (B, C, OH, OW), inp (B, C, H, W)
	int K = w->K, S = w->S, H = w->H, W = w->W, OH = w->OH, OW = w->OW;
	size_t planes = (size_t)B * w->C;
	int avx = pool2_avx512(w);
	for (size_t p = 0; p < planes; p++) {
		const float *x = inp + p * H * W;   // (H, W)
		float *y = out + p * OH * OW;       // (OH, OW)
		if (avx) {
			maxpool2_forward_avx512(y, x, w);
			continue;
		}
		if (K == 2 && S == 2) {
			/* The common 2x2 window without the loop overhead; the
			 * maximum's value does not depend on the scan order. */
			for (int oh = 0; oh < OH; oh++) {
				const float *r0 = x + (size_t)2 * oh * W, *r1 = r0 + W;
				for (int ow = 0; ow < OW; ow++) {
					float a = r0[2 * ow], b = r0[2 * ow + 1];
					float c = r1[2 * ow], d = r1[2 * ow + 1];
					float m = a;
					m = b > m ? b : m;
					m = c > m ? c : m;
					m = d > m ? d : m;
					y[(size_t)oh * OW + ow] = m;
				}
			}
			continue;
		}
		for (int oh = 0; oh < OH; oh++) {
			for (int ow = 0; ow < OW; ow++) {
				const float *x0 = x + (size_t)oh * S * W + (size_t)ow * S;
				float m = x0[0];
				for (int kh = 0; kh < K; kh++)
					for (int kw = 0; kw < K; kw++)
						if (x0[(size_t)kh * W + kw] > m)
							m = x0[(size_t)kh * W + kw];
				y[(size_t)oh * OW + ow] = m;
			}
		}
	}
}

/* dx (H, W) = 0 outside the rows and columns the windows cover (pooling
 * floors, so up to S - 1 trailing rows and columns belong to no window). */
static void zero_uncovered(float *dx, const struct window *w)
{
	int H = w->H, W = w->W, hc = w->OH * w->S, wc = w->OW * w->S;
	for (int h = 0; h < H; h++) {
		float *row = dx + (size_t)h * W;
		if (h >= hc)
			memset(row, 0, (size_t)W * sizeof(float));
		else if (wc < W)
			memset(row + wc, 0, (size_t)(W - wc) * sizeof(float));
	}
}

void maxpool_backward(float *dinp, const float *dout, const float *inp, int B,
		      const struct window *w)
{
	// dinp (B, C, H, W), dout (B, C, OH, OW), inp (B, C, H, W)
	int K = w->K, S = w->S, H = w->H, W = w->W, OH = w->OH, OW = w->OW;
	size_t planes = (size_t)B * w->C;
	/* Windows that tile the input (K == S, the usual case) write each
	 * input gradient once, so dinp needs no clearing pass first. */
	int tiled = K == S, avx = pool2_avx512(w);
	if (!tiled)
		memset(dinp, 0, planes * H * W * sizeof(float));
	for (size_t p = 0; p < planes; p++) {
		const float *x = inp + p * H * W;    // (H, W)
		const float *dy = dout + p * OH * OW;
		float *dx = dinp + p * H * W;
		if (tiled)
			zero_uncovered(dx, w);
		if (avx) {
			maxpool2_backward_avx512(dx, dy, x, w);
			continue;
		}
		if (K == 2 && S == 2) {
			/* The common 2x2 window, branch-free: which of the four
			 * is the first maximum is data, and a branch on it
			 * mispredicts often. */
			for (int oh = 0; oh < OH; oh++) {
				const float *r0 = x + (size_t)2 * oh * W, *r1 = r0 + W;
				float *d0 = dx + (size_t)2 * oh * W, *d1 = d0 + W;
				for (int ow = 0; ow < OW; ow++) {
					float a = r0[2 * ow], b = r0[2 * ow + 1];
					float c = r1[2 * ow], d = r1[2 * ow + 1];
					float g = dy[(size_t)oh * OW + ow];
					int ib = b > a;
					float m = ib ? b : a;
					int ic = c > m;
					m = ic ? c : m;
					int id = d > m;
					/* The last position that beat the running max wins. */
					int at = id ? 3 : ic ? 2 : ib ? 1 : 0;
					d0[2 * ow] = at == 0 ? g : 0.0f;
					d0[2 * ow + 1] = at == 1 ? g : 0.0f;
					d1[2 * ow] = at == 2 ? g : 0.0f;
					d1[2 * ow + 1] = at == 3 ? g : 0.0f;
				}
			}
			continue;
		}
		for (int oh = 0; oh < OH; oh++) {
			for (int ow = 0; ow < OW; ow++) {
				/* The same scan as forward, so the first maximum gets
				 * the gradient even when the window holds ties. */
				size_t at = (size_t)oh * S * W + (size_t)ow * S, best = at;
				for (int kh = 0; kh < K; kh++)
					for (int kw = 0; kw < K; kw++)
						if (x[at + (size_t)kh * W + kw] > x[best])
							best = at + (size_t)kh * W + kw;
				float g = dy[(size_t)oh * OW + ow];
				if (tiled) {
					for (int kh = 0; kh < K; kh++)
						for (int kw = 0; kw < K; kw++)
							dx[at + (size_t)kh * W + kw] = 0.0f;
					dx[best] = g;
				} else {
					dx[best] += g;
				}
			}
		}
	}
}

void avgpool_forward(float *out, const float *inp, int B, const struct window *w)
{
	// out (B, C, OH, OW), inp (B, C, H, W)
	int K = w->K, S = w->S, H = w->H, W = w->W, OH = w->OH, OW = w->OW;
	float inv = 1.0f / (float)(K * K);
	size_t planes = (size_t)B * w->C;
	for (size_t p = 0; p < planes; p++) {
		const float *x = inp + p * H * W;
		float *y = out + p * OH * OW;
		for (int oh = 0; oh < OH; oh++) {
			for (int ow = 0; ow < OW; ow++) {
				const float *x0 = x + (size_t)oh * S * W + (size_t)ow * S;
				float s = 0.0f;
				for (int kh = 0; kh < K; kh++)
					for (int kw = 0; kw < K; kw++)
						s += x0[(size_t)kh * W + kw];
				y[(size_t)oh * OW + ow] = s * inv;
			}
		}
	}
}

void avgpool_backward(float *dinp, const float *dout, int B, const struct window *w)
{
	// dinp (B, C, H, W), dout (B, C, OH, OW)
	int K = w->K, S = w->S, H = w->H, W = w->W, OH = w->OH, OW = w->OW;
	float inv = 1.0f / (float)(K * K);
	size_t planes = (size_t)B * w->C;
	memset(dinp, 0, planes * H * W * sizeof(float));
	for (size_t p = 0; p < planes; p++) {
		const float *dy = dout + p * OH * OW;
		float *dx = dinp + p * H * W;
		for (int oh = 0; oh < OH; oh++) {
			for (int ow = 0; ow < OW; ow++) {
				float g = dy[(size_t)oh * OW + ow] * inv;
				float *d0 = dx + (size_t)oh * S * W + (size_t)ow * S;
				for (int kh = 0; kh < K; kh++)
					for (int kw = 0; kw < K; kw++)
						d0[(size_t)kh * W + kw] += g;
			}
		}
	}
}
