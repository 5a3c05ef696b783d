/* The loss of a binary label on one logit (layers.h's sigmoid_xent_*): the
 * click-through models' loss. */
#include "layers.h"

#include <math.h>

double sigmoid_xent_forward(float *probs, int *correct, const float *logits,
			    const int32_t *labels, int B)
{
	// probs (B), logits (B), labels (B)
	double loss = 0.0;
	int right = 0;
	for (int b = 0; b < B; b++) {
		float z = logits[b];   /* read before probs is written: they may alias */
		int y = labels[b] != 0;
		double zd = (double)z;
		loss += (zd > 0.0 ? zd : 0.0) - zd * y + log1p(exp(-fabs(zd)));
		right += (z > 0.0f) == y;
		/* As sigmoid_forward: exp only of -|z|, never overflowing. */
		if (z >= 0.0f) {
			probs[b] = 1.0f / (1.0f + expf(-z));
		} else {
			float e = expf(z);
			probs[b] = e / (1.0f + e);
		}
	}
	if (correct)
		*correct = right;
	return loss;
}

void sigmoid_xent_backward(float *dlogits, const float *probs, const int32_t *labels, int B,
			   float scale)
{
	// dlogits (B), probs (B), labels (B)
	for (int b = 0; b < B; b++)
		dlogits[b] = (probs[b] - (labels[b] != 0 ? 1.0f : 0.0f)) * scale;
}
