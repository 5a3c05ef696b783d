/* 2-D convolution on the CPU: im2col per sample, then one OpenBLAS sgemm.
 *
 * For each sample the input patches are unrolled into col (C*K*K, OH*OW),
 * so that the convolution is weight (OC, C*K*K) @ col, written straight into
 * the sample's (OC, OH*OW) block of the NCHW output: no transpose is needed.
 * Backward reuses the same scratch: im2col again for dweight (recomputing is
 * cheaper in memory than keeping B columns matrices alive between forward
 * and backward), then weight^T @ dout into col and col2im into dinp. */
#include "layers.h"

#include <cblas.h>
#include <errno.h>
#include <string.h>

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

size_t conv_col_size(const struct window *w)
{
	return (size_t)w->C * (size_t)w->K * (size_t)w->K * (size_t)w->OH * (size_t)w->OW;
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

/* col (C*K*K, OH*OW) = the patches of one sample's inp (C, H, W). */
static void im2col(float *col, const float *inp, const struct window *w)
{
	int K = w->K, S = w->S, P = w->P, H = w->H, W = w->W, OH = w->OH, OW = w->OW;
	size_t ohw = (size_t)OH * OW;
	for (int c = 0; c < w->C; c++) {
		const float *src = inp + (size_t)c * H * W;   // (H, W)
		for (int kh = 0; kh < K; kh++) {
			for (int kw = 0; kw < K; kw++) {
				float *row = col + ((size_t)(c * K + kh) * K + kw) * ohw;   // (OH, OW)
				int lo, hi;
				valid_range(&lo, &hi, kw, W, S, P, OW);
				for (int oh = 0; oh < OH; oh++) {
					float *r = row + (size_t)oh * OW;
					int ih = oh * S - P + kh;
					if (ih < 0 || ih >= H || lo == hi) {
						memset(r, 0, (size_t)OW * sizeof(float));
						continue;
					}
					const float *s = src + (size_t)ih * W + kw - P;
					memset(r, 0, (size_t)lo * sizeof(float));
					if (S == 1) {
						memcpy(r + lo, s + lo, (size_t)(hi - lo) * sizeof(float));
					} else {
						for (int ow = lo; ow < hi; ow++)
							r[ow] = s[(size_t)ow * S];
					}
					memset(r + hi, 0, (size_t)(OW - hi) * sizeof(float));
				}
			}
		}
	}
}

/* inp (C, H, W) = the sum of col's patches back at their places (set). */
static void col2im(float *inp, const float *col, const struct window *w)
{
	int K = w->K, S = w->S, P = w->P, H = w->H, W = w->W, OH = w->OH, OW = w->OW;
	size_t ohw = (size_t)OH * OW;
	memset(inp, 0, (size_t)w->C * H * W * sizeof(float));
	for (int c = 0; c < w->C; c++) {
		float *dst = inp + (size_t)c * H * W;   // (H, W)
		for (int kh = 0; kh < K; kh++) {
			for (int kw = 0; kw < K; kw++) {
				const float *row = col + ((size_t)(c * K + kh) * K + kw) * ohw;
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

/* A 1x1 stride-1 unpadded conv reads its input as the column matrix. */
static int is_pointwise(const struct window *w)
{
	return w->K == 1 && w->S == 1 && w->P == 0;
}

void conv_forward(float *out, float *col, const float *inp, const float *weight,
		  const float *bias, int B, int OC, const struct window *w)
{
	// out (B, OC, OH, OW), inp (B, C, H, W), weight (OC, C, K, K), bias (OC)
	int ckk = w->C * w->K * w->K;
	int ohw = w->OH * w->OW;
	size_t in_n = (size_t)w->C * w->H * w->W;
	for (int b = 0; b < B; b++) {
		const float *inp_b = inp + (size_t)b * in_n;     // (C, H, W)
		float *out_b = out + (size_t)b * OC * ohw;       // (OC, OH*OW)
		const float *cols = inp_b;
		if (!is_pointwise(w)) {
			im2col(col, inp_b, w);
			cols = col;
		}
		float beta = 0.0f;
		if (bias) {
			for (int o = 0; o < OC; o++)
				for (int i = 0; i < ohw; i++)
					out_b[(size_t)o * ohw + i] = bias[o];
			beta = 1.0f;
		}
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OC, ohw, ckk,
			    1.0f, weight, ckk, cols, ohw, beta, out_b, ohw);
	}
}

void conv_backward(float *dinp, float *dweight, float *dbias, float *col,
		   const float *dout, const float *inp, const float *weight,
		   int B, int OC, const struct window *w)
{
	// dinp (B, C, H, W), dweight (OC, C, K, K), dbias (OC), dout (B, OC, OH, OW)
	int ckk = w->C * w->K * w->K;
	int ohw = w->OH * w->OW;
	size_t in_n = (size_t)w->C * w->H * w->W;
	for (int b = 0; b < B; b++) {
		const float *inp_b = inp + (size_t)b * in_n;          // (C, H, W)
		const float *dout_b = dout + (size_t)b * OC * ohw;    // (OC, OH*OW)
		const float *cols = inp_b;
		if (!is_pointwise(w)) {
			im2col(col, inp_b, w);
			cols = col;
		}
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, OC, ckk, ohw,
			    1.0f, dout_b, ohw, cols, ohw, 1.0f, dweight, ckk);
		if (dbias) {
			for (int o = 0; o < OC; o++) {
				const float *d = dout_b + (size_t)o * ohw;
				float s = 0.0f;
				for (int i = 0; i < ohw; i++)
					s += d[i];
				dbias[o] += s;
			}
		}
		if (!dinp)
			continue;
		float *dinp_b = dinp + (size_t)b * in_n;   // (C, H, W)
		/* beta = 0: the result is written without reading what was there. */
		if (is_pointwise(w)) {
			cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, ohw, OC,
				    1.0f, weight, ckk, dout_b, ohw, 0.0f, dinp_b, ohw);
		} else {
			cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, ohw, OC,
				    1.0f, weight, ckk, dout_b, ohw, 0.0f, col, ohw);
			col2im(dinp_b, col, w);
		}
	}
}
