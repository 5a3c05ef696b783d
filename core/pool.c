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

void maxpool_backward(float *dinp, const float *dout, const float *inp, int B,
		      const struct window *w)
{
	// dinp (B, C, H, W), dout (B, C, OH, OW), inp (B, C, H, W)
	int K = w->K, S = w->S, H = w->H, W = w->W, OH = w->OH, OW = w->OW;
	size_t planes = (size_t)B * w->C;
	memset(dinp, 0, planes * H * W * sizeof(float));
	for (size_t p = 0; p < planes; p++) {
		const float *x = inp + p * H * W;    // (H, W)
		const float *dy = dout + p * OH * OW;
		float *dx = dinp + p * H * W;
		for (int oh = 0; oh < OH; oh++) {
			for (int ow = 0; ow < OW; ow++) {
				/* The same scan as forward, so the first maximum gets
				 * the gradient even when the window holds ties. */
				size_t at = (size_t)oh * S * W + (size_t)ow * S, best = at;
				for (int kh = 0; kh < K; kh++)
					for (int kw = 0; kw < K; kw++)
						if (x[at + (size_t)kh * W + kw] > x[best])
							best = at + (size_t)kh * W + kw;
				dx[best] += dy[(size_t)oh * OW + ow];
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
