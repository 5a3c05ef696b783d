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

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

/* out = inp @ weight^T + bias.
 * out (B, OC), inp (B, C), weight (OC, C), bias (OC) or NULL. */
void dense_forward(float *out, const float *inp, const float *weight,
		   const float *bias, int B, int C, int OC);

/* Columns [o0, o1) of dense_forward's out alone, from rows [o0, o1) of
 * weight and bias: out[:, o0:o1] = inp @ weight[o0:o1]^T + bias[o0:o1],
 * so that a forward pass can start on the weight rows that have arrived
 * (replica_forward_flow). The same sums as dense_forward's, which BLAS
 * may round differently over a block than over the whole. Same shapes. */
void dense_forward_rows(float *out, const float *inp, const float *weight, const float *bias, int B,
			int C, int OC, int o0, int o1);

/* dinp = dout @ weight         (set; skipped when dinp is NULL)
 * dweight += dout^T @ inp      (accumulate; skipped when dweight is NULL)
 * dbias += sum over B of dout  (accumulate; skipped when dbias is NULL)
 * dinp (B, C), dweight (OC, C), dbias (OC), dout (B, OC), inp (B, C),
 * weight (OC, C). */
void dense_backward(float *dinp, float *dweight, float *dbias,
		    const float *dout, const float *inp, const float *weight,
		    int B, int C, int OC);
/* Rows [o0, o1) of dense_backward's dweight alone: dweight[o0:o1] +=
 * dout[:, o0:o1]^T @ inp (accumulate), so a weight gradient can be made
 * final block by block (replica_train_flow). Same shapes. */
void dense_wgrad_rows(float *dweight, const float *dout, const float *inp, int B, int C, int OC,
		      int o0, int o1);

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

/* ---- sigmoid + binary cross-entropy (core/nn/sigmoid_xent.c) -----------------
 * One logit per sample (B, 1) and a 0/1 label: click-through models.
 * probs (B) = sigmoid(logits); returns the SUM over the batch of
 * -[y log p + (1 - y) log(1 - p)], computed from the logit z as
 * max(z, 0) - z y + log1p(exp(-|z|)) in double, so it stays finite and
 * accurate where p rounds to 0 or 1 in float; *correct (if not NULL) = how
 * many rows have (z > 0) == y. probs may alias logits. */
double sigmoid_xent_forward(float *probs, int *correct, const float *logits,
			    const int32_t *labels, int B);
/* dlogits (B) = (probs - y) * scale, set; may alias probs. */
void sigmoid_xent_backward(float *dlogits, const float *probs, const int32_t *labels, int B,
			   float scale);

/* ---- spatial layers (core/nn/conv.c, core/nn/pool.c) ----------------------------
 * Activations are NCHW: (B, C, H, W) with W fastest, like PyTorch, so a
 * flatten is free and dense weights after it line up with torch.flatten.
 * A window slides over (H, W) with kernel K x K, stride S and zero padding
 * P on every side: OH = (H + 2P - K) / S + 1, likewise OW. */
struct window {
	int C, H, W;     /* input channels and size */
	int K, S, P;     /* kernel, stride, padding */
	int OH, OW;      /* output size */
	/* 1: the portable loops even where AVX-512 paths exist. They are
	 * picked at run time, so only this lets the tests check both on a
	 * machine that has AVX-512 (CI's does). */
	int scalar;
};

/* Fills OH and OW from the rest; returns 0, or -EINVAL when the window does
 * not fit (K > H + 2P) or a size is not positive. Inline: model.c's shape
 * checks use it without linking the kernels (the config fuzzer does not). */
static inline int window_init(struct window *w)
{
	if (w->C < 1 || w->H < 1 || w->W < 1 || w->K < 1 || w->S < 1 || w->P < 0)
		return -EINVAL;
	long oh = (long)w->H + 2L * w->P - w->K;
	long ow = (long)w->W + 2L * w->P - w->K;
	if (oh < 0 || ow < 0)
		return -EINVAL;
	w->OH = (int)(oh / w->S + 1);
	w->OW = (int)(ow / w->S + 1);
	return 0;
}

/* Floats of scratch (im2col and a product) that conv_forward and
 * conv_backward need for batches of up to B samples. */
size_t conv_col_size(const struct window *w, int OC, int B);

/* out = conv(inp, weight) + bias, cross-correlation as in PyTorch's Conv2d.
 * out (B, OC, OH, OW), inp (B, C, H, W), weight (OC, C, K, K), bias (OC) or
 * NULL, col scratch of conv_col_size(w, OC, B) floats (undefined after). */
void conv_forward(float *out, float *col, const float *inp, const float *weight,
		  const float *bias, int B, int OC, const struct window *w);

/* dinp (B, C, H, W) set (skipped when NULL), dweight (OC, C, K, K) and dbias
 * (OC, or NULL) accumulated; dout (B, OC, OH, OW); col as for conv_forward. */
void conv_backward(float *dinp, float *dweight, float *dbias, float *col,
		   const float *dout, const float *inp, const float *weight,
		   int B, int OC, const struct window *w);

/* The same over `threads` threads; the results do not depend on it, bit for
 * bit (core/nn/conv.c says how). Each sgemm inside runs on one OpenBLAS
 * thread. conv_forward and conv_backward are these with threads = 1. */
void conv_forward_mt(float *out, float *col, const float *inp, const float *weight,
		     const float *bias, int B, int OC, const struct window *w, int threads);
void conv_backward_mt(float *dinp, float *dweight, float *dbias, float *col,
		      const float *dout, const float *inp, const float *weight,
		      int B, int OC, const struct window *w, int threads);

/* Pooling without padding (w->P must be 0). Max pooling takes the first
 * maximum of each window (as its backward does, so the gradient goes to
 * exactly one input per window); average pooling divides by K * K.
 * out (B, C, OH, OW), inp (B, C, H, W). Backward SETS dinp (B, C, H, W);
 * overlapping windows (S < K) add up. */
void maxpool_forward(float *out, const float *inp, int B, const struct window *w);
void maxpool_backward(float *dinp, const float *dout, const float *inp, int B,
		      const struct window *w);
void avgpool_forward(float *out, const float *inp, int B, const struct window *w);
void avgpool_backward(float *dinp, const float *dout, int B, const struct window *w);

/* ---- dropout (core/nn/layers.c) ----------------------------------------------
 * Inverted dropout: element i is kept when a hash of (key, i) falls at or
 * above p, and kept elements are scaled by 1 / (1 - p), so evaluation (no
 * dropout at all) needs no rescaling. The mask is recomputed from the key in
 * backward instead of stored. out and inp may alias; so may dinp and dout. */
void dropout_forward(float *out, const float *inp, float p, uint64_t key, size_t N);
void dropout_backward(float *dinp, const float *dout, float p, uint64_t key, size_t N);
/* The key of layer `layer`'s mask in the step whose key is step_key
 * (replica_key): each dropout layer draws its own. A backend derives it
 * itself from the step's key (backend.h), so that a GPU step captured as
 * a CUDA graph can read the step's key from device memory. */
uint64_t dropout_layer_key(uint64_t step_key, int layer);

/* ---- batch normalization (core/nn/batchnorm.c) --------------------------------
 * Per channel c over (B, HW): inp and out are (B, C, HW); a dense output is
 * the case HW = 1 (per feature). gamma, beta, run_mean, run_var are (C).
 *
 * Training: mean and var (C) are SET to the batch mean and biased variance,
 * and out = gamma (inp - mean) / sqrt(var + eps) + beta.
 * Evaluation (mean, var NULL): the running statistics take their place. */
#define BATCHNORM_EPS 1e-5f
#define BATCHNORM_MOMENTUM 0.1f
void batchnorm_forward(float *out, float *mean, float *var, const float *inp,
		       const float *gamma, const float *beta, const float *run_mean,
		       const float *run_var, int B, int C, int HW);

/* Backward of a training forward. dinp (B, C, HW) set (skipped when NULL);
 * dgamma, dbeta (C) accumulated. The running statistics' slots are
 * accumulated too, with their update rather than a gradient:
 *   drun_mean += stat_scale * momentum * (mean - run_mean)
 *   drun_var  += stat_scale * momentum * (var * n / (n - 1) - run_var)
 * (n = B * HW, unbiased variance as PyTorch keeps), so that p += g over the
 * average of any number of replicas' slots is PyTorch's running average.
 * stat_scale is this replica's share of the whole batch (B times the loss
 * scale). */
void batchnorm_backward(float *dinp, float *dgamma, float *dbeta, float *drun_mean,
			float *drun_var, const float *dout, const float *inp,
			const float *gamma, const float *mean, const float *var,
			const float *run_mean, const float *run_var, float stat_scale,
			int B, int C, int HW);

/* The same over `threads` threads, split by channels: bit for bit the same
 * results whatever the count. */
void batchnorm_forward_mt(float *out, float *mean, float *var, const float *inp,
			  const float *gamma, const float *beta, const float *run_mean,
			  const float *run_var, int B, int C, int HW, int threads);
void batchnorm_backward_mt(float *dinp, float *dgamma, float *dbeta, float *drun_mean,
			   float *drun_var, const float *dout, const float *inp,
			   const float *gamma, const float *mean, const float *var,
			   const float *run_mean, const float *run_var, float stat_scale,
			   int B, int C, int HW, int threads);

/* Threads OpenBLAS may use; n <= 0 means one per CPU this process may run
 * on (layers_cpus). Returns the count set. */
int layers_set_threads(int n);
/* The CPUs this process may run on (its affinity: taskset, cpusets). */
int layers_cpus(void);

#endif
