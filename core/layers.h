/* CPU reference kernels for every layer and the loss, in llm.c's order:
 * outputs first, then inputs, then weights, then dimensions.
 *
 * Gradient contract (the GPU twins in gpu/ follow it too):
 *   - backward functions SET dinp (=), they never read its old value;
 *   - backward functions ACCUMULATE dweight and dbias (+=), so gradients of
 *     several micro-batches or devices can be summed in place; the caller
 *     zeroes them explicitly before a step.
 *
 * Dimensions: B batch, C input features, OC output features, N elements.
 * Dense weights are stored (OC, C), like PyTorch's nn.Linear, so saved
 * tensors load into PyTorch unchanged. */
#ifndef PSTRAIN_LAYERS_H
#define PSTRAIN_LAYERS_H

#include <stddef.h>
#include <stdint.h>

/* out = inp @ weight^T + bias.
 * out (B, OC), inp (B, C), weight (OC, C), bias (OC) or NULL. */
void dense_forward(float *out, const float *inp, const float *weight,
		   const float *bias, int B, int C, int OC);

/* dinp = dout @ weight         (set; skipped when dinp is NULL)
 * dweight += dout^T @ inp      (accumulate)
 * dbias += sum over B of dout  (accumulate; skipped when dbias is NULL)
 * dinp (B, C), dweight (OC, C), dbias (OC), dout (B, OC), inp (B, C),
 * weight (OC, C). */
void dense_backward(float *dinp, float *dweight, float *dbias,
		    const float *dout, const float *inp, const float *weight,
		    int B, int C, int OC);

/* Elementwise activations over N values. Backward takes the forward
 * output (not the input): all three derivatives are cheap functions of it,
 * so the input need not be kept. out and inp may alias; so may dinp and dout. */
void relu_forward(float *out, const float *inp, size_t N);
void relu_backward(float *dinp, const float *dout, const float *out, size_t N);
void tanh_forward(float *out, const float *inp, size_t N);
void tanh_backward(float *dinp, const float *dout, const float *out, size_t N);
void sigmoid_forward(float *out, const float *inp, size_t N);
void sigmoid_backward(float *dinp, const float *dout, const float *out, size_t N);

/* Fused, numerically stable softmax + cross-entropy.
 * probs (B, C) = softmax(logits (B, C)); returns the SUM over the batch of
 * -log p[label] (the caller divides by whatever batch it averages over);
 * *correct (if not NULL) = how many rows have argmax == label (the first
 * maximum wins ties). probs may alias logits. */
double softmax_xent_forward(float *probs, int *correct, const float *logits,
			    const int32_t *labels, int B, int C);

/* dlogits = (probs - onehot(labels)) * scale, set. scale is 1/(whole batch)
 * so that gradients summed over micro-batches are the batch average.
 * dlogits may alias probs. */
void softmax_xent_backward(float *dlogits, const float *probs,
			   const int32_t *labels, int B, int C, float scale);

/* Threads OpenBLAS may use; n <= 0 means one per online CPU. */
void layers_set_threads(int n);

#endif
