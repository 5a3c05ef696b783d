/* Max and average pooling over NCHW activations, without padding. Plain
 * loops: pooling moves each activation once and costs little next to the
 * convolutions around it. */
#include "layers.h"

#include <string.h>

void maxpool_forward(float *out, const float *inp, int B, const struct window *w)
{
	// out (B, C, OH, OW), inp (B, C, H, W)
	int K = w->K, S = w->S, H = w->H, W = w->W, OH = w->OH, OW = w->OW;
	size_t planes = (size_t)B * w->C;
	for (size_t p = 0; p < planes; p++) {
		const float *x = inp + p * H * W;   // (H, W)
		float *y = out + p * OH * OW;       // (OH, OW)
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
	int tiled = K == S;
	if (!tiled)
		memset(dinp, 0, planes * H * W * sizeof(float));
	for (size_t p = 0; p < planes; p++) {
		const float *x = inp + p * H * W;    // (H, W)
		const float *dy = dout + p * OH * OW;
		float *dx = dinp + p * H * W;
		if (tiled)
			zero_uncovered(dx, w);
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
