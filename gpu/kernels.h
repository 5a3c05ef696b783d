/* CUDA kernels of the GPU backend, behind plain C launchers.
 *
 * Each launcher queues its kernel on `stream` (a cudaStream_t passed as void
 * * so this header stays C) and returns 0 or the cudaError_t of the launch;
 * gk_error_name() turns that into text. Arguments and results follow the
 * CPU twins in core/nn/layers.h and core/nn/optim.c exactly (same order, the same
 * SET-dinp / ACCUMULATE-dweight contract), so tests can hold each kernel
 * against its twin. Nothing here allocates. */
#ifndef PSTRAIN_GPU_KERNELS_H
#define PSTRAIN_GPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include "gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

enum gk_act { GK_RELU, GK_TANH, GK_SIGMOID, GK_NONE };

const char *gk_error_name(int e);

int gk_act_forward(void *stream, enum gk_act k, float *out, const float *inp, size_t n);
int gk_act_backward(void *stream, enum gk_act k, float *dinp, const float *dout,
		    const float *out, size_t n);

/* out (B, OC) = act(out + bias) in place (bias NULL: act(out); GK_NONE:
 * the bias alone): a GEMM's output, its bias and activation in one pass. */
int gk_bias_act(void *stream, enum gk_act k, float *out, const float *bias, int B, int OC);

/* The bias gradient split over blocks of GK_BIAS_ROWS rows as well as of
 * columns; the blocks' partial sums meet in scratch of gk_bias_partials()
 * floats and are added in row-block order by the last block of each
 * column range (tickets: gk_bias_tickets() zeroed counters, left zeroed),
 * so the result does not depend on scheduling. */
#define GK_BIAS_ROWS 64
size_t gk_bias_partials(int B, int OC);
size_t gk_bias_tickets(int OC);
/* dout (B, OC) = the activation's backward in place, from its output out
 * (GK_NONE: dout is only read), and dbias (OC) += the column sums of the
 * result. partial or tickets NULL: one block per 32 columns covers every
 * row (no scratch, slower for large B). */
int gk_act_bias_backward(void *stream, enum gk_act k, float *dout, float *dbias, const float *out,
			 int B, int OC, float *partial, unsigned *tickets);

/* *found = 1 when any of x's n floats is a NaN or an infinity (its
 * exponent bits all set, as optim_nonfinite tests them); left as it was
 * otherwise: the caller zeroes it first. */
int gk_nonfinite(void *stream, const float *x, size_t n, int *found);

/* Softmax + cross-entropy, one warp per row: train = 0 writes the
 * probabilities to out, train = 1 the loss gradient (probs - onehot) *
 * scale; row_loss[b] = log(sum exp(x - max)) - (x[label] - max) in
 * double, row_right[b] = 1 when the first maximum is the label, else 0.
 * out may alias logits. */
int gk_xent_rows(void *stream, float *out, double *row_loss, double *row_right,
		 const float *logits, const int32_t *labels, int B, int C, int train, float scale);
/* meter[0] += the sum of row_loss (B), meter[1] += that of row_right, in
 * an order fixed by B alone. */
int gk_meter_add(void *stream, double *meter, const double *row_loss, const double *row_right,
		 int B);
/* dlogits = (probs - onehot(labels)) * scale; may alias probs. */
int gk_xent_backward(void *stream, float *dlogits, const float *probs, const int32_t *labels,
		     int B, int C, float scale);

/* struct gk_step: gpu/gpu.h. */
int gk_step_set(void *stream, struct gk_step *dev, const struct gk_step *host);

/* x (B, D) and y (B) = rows order[at .. at + B) of data_x (n, D) and
 * data_y (n); with step non-NULL, at is step->at instead. */
int gk_gather(void *stream, float *x, int32_t *y, const float *data_x, const int32_t *data_y,
	      const uint32_t *order, size_t at, const struct gk_step *step, int B, size_t D);

/* The update rules of core/nn/optim.c over n elements; kind is enum optim_kind.
 * Adam's bias corrections are folded into step_size and inv_sqrt_bc2 by
 * the caller, as optim.c does. zero: clear grads in the same pass. */
/* struct gk_optim: gpu/gpu.h. */
/* With step non-NULL, lr, step_size and inv_sqrt_bc2 come from it. A kind
 * whose state is NULL (m for momentum and adam, v for adam) is not
 * launched: cudaErrorInvalidValue. */
int gk_optim_step(void *stream, const struct gk_optim *o, const struct gk_step *step,
		  float *params, float *grads, float *m, float *v, size_t n, int zero);

/* ---- convolutional networks (gpu/kernels_cnn.cu) --------------------------
 * The twins of core/nn/conv.c, core/nn/pool.c, core/nn/batchnorm.c and dropout in
 * core/nn/layers.c; struct window is core/nn/layers.h's. Convolution is im2col
 * over a chunk of nb samples into col (C*K*K, nb*OH*OW) plus cuBLAS (in
 * backend_cuda.cu); these are its data-movement kernels. */
struct window;

/* col (C*K*K, ld) columns [0, nb*OH*OW) = patches of samples inp (nb, C, H, W),
 * zero outside the padded input. */
int gk_im2col(void *stream, float *col, size_t ld, const float *inp, int nb,
	      const struct window *w);
/* dinp (nb, C, H, W) = the patches of col (C*K*K, ld) summed back (set). */
int gk_col2im(void *stream, float *dinp, const float *col, size_t ld, int nb,
	      const struct window *w);
/* out (nb, OC, OH*OW) = tmp (OC, ld) columns of each sample + bias (or 0). */
int gk_conv_scatter(void *stream, float *out, const float *tmp, size_t ld, const float *bias,
		    int nb, int OC, size_t ohw);
/* tmp (OC, ld) = dout (nb, OC, OH*OW) gathered per channel and, with
 * dbias non-NULL, dbias (OC) += each channel's sum, in the same pass; the
 * sums are split over blocks that meet in s (struct gk_bn_scratch, below;
 * NULL: one block a channel). */
struct gk_bn_scratch;
int gk_conv_gather(void *stream, float *tmp, size_t ld, float *dbias, const float *dout, int nb,
		   int OC, size_t ohw, const struct gk_bn_scratch *s);

/* max = 1: max pooling (first maximum of each window), else average. */
int gk_pool_forward(void *stream, int max, float *out, const float *inp, int B,
		    const struct window *w);
/* dinp set; overlapping windows add up, uncovered inputs get 0. */
int gk_pool_backward(void *stream, int max, float *dinp, const float *dout, const float *inp,
		     int B, const struct window *w);

/* Inverted dropout with core/nn/rng.c's hash: the same masks as the CPU,
 * dropout_forward's with dropout_layer_key(key, layer), the layer's key
 * derived on the device; with step non-NULL the step's key is step->key
 * (a captured step reads it there) instead of key. */
int gk_dropout(void *stream, float *out, const float *inp, float p, uint64_t key, int layer,
	       const struct gk_step *step, size_t n);

/* The per-channel sums' scratch (batchnorm's and the conv bias
 * gradient's, gpu/chansum.cuh): the sums are split over several blocks a
 * channel whose partial sums meet in partial (gk_bn_partials() doubles)
 * and are added in block order by the last block of each channel
 * (tickets: GK_BN_SLOTS zeroed counters, left zeroed); batchnorm's
 * backward keeps each channel's two sums in sums (2 C floats) for the
 * input gradient. partial or tickets NULL: one block a channel. */
#define GK_BN_SLOTS 65536
struct gk_bn_scratch {
	double *partial;
	unsigned *tickets;
	float *sums;
};
size_t gk_bn_partials(void);
/* mean and var NULL: evaluation, with the running statistics. */
int gk_batchnorm_forward(void *stream, float *out, float *mean, float *var, const float *inp,
			 const float *gamma, const float *beta, const float *run_mean,
			 const float *run_var, int B, int C, int HW, const struct gk_bn_scratch *s);
/* dinp NULL: no input gradient; else s->sums is needed
 * (cudaErrorInvalidValue without). */
int gk_batchnorm_backward(void *stream, float *dinp, float *dgamma, float *dbeta,
			  float *drun_mean, float *drun_var, const float *dout, const float *inp,
			  const float *gamma, const float *mean, const float *var,
			  const float *run_mean, const float *run_var, float stat_scale, int B,
			  int C, int HW, const struct gk_bn_scratch *s);

/* A batchnorm, the relu after it and, with w non-NULL, the pooling after
 * that (max = 1: max pooling, else average) over windows that tile the
 * batchnorm's planes (w->S == w->K, w->P == 0, w->C == C, w->H * w->W ==
 * HW; another window: cudaErrorInvalidValue), fused. Forward: act (B, C,
 * HW) = relu(batchnorm) (mean and var as gk_batchnorm_forward's), out (B,
 * C, OH, OW) = the pooling of act in the same pass (w NULL: out unused).
 * Backward: g (B, C, HW) = relu's backward of pooling's backward of dout
 * (B, C, OH, OW) (w NULL: of dout (B, C, HW); g may alias it), made in
 * batchnorm's sums pass, then gk_batchnorm_backward's input gradient from
 * g into dinp (NULL: none; may alias g). */
int gk_bn_relu_forward(void *stream, float *act, float *out, float *mean, float *var,
		       const float *inp, const float *gamma, const float *beta, const float *run_mean,
		       const float *run_var, int B, int C, int HW, const struct window *w, int max,
		       const struct gk_bn_scratch *s);
int gk_bn_relu_backward(void *stream, float *dinp, float *g, float *dgamma, float *dbeta,
			float *drun_mean, float *drun_var, const float *dout, const float *act,
			const float *inp, const float *gamma, const float *mean, const float *var,
			const float *run_mean, const float *run_var, float stat_scale, int B, int C,
			int HW, const struct window *w, int max, const struct gk_bn_scratch *s);

/* y += x over n elements: summing gradients of several replicas. */
int gk_add(void *stream, float *y, const float *x, size_t n);

/* ---- the embedding layer (gpu/kernels_embed.cu) --------------------------
 * core/nn/embed.h's kernels, same arguments (pool: enum embed_pool, 0 sum,
 * 1 mean), one thread per output value, adding in the CPU twins' order
 * with no fused multiply-add: the results are theirs bit for bit. */
int gk_embed_gather(void *stream, float *U, const float *table, const uint64_t *rows, size_t u,
		    int DIM);
int gk_embed_forward(void *stream, float *out, const float *x, const float *U, const uint32_t *off,
		     const uint32_t *idx, int B, int F, int D, int DIM, int pool);
int gk_embed_backward(void *stream, float *dU, const float *dout, const uint32_t *roff,
		      const uint32_t *rseg, const uint32_t *off, size_t u, int F, int D, int DIM,
		      int pool);

/* loss = sigmoid_cross_entropy: layers.h's sigmoid_xent_forward per row
 * into row_loss and row_right (as gk_xent_rows, for gk_meter_add), out the
 * probabilities, or with train their gradient (p - y) * scale; and
 * sigmoid_xent_backward. out may alias logits. */
int gk_sigmoid_xent_rows(void *stream, float *out, double *row_loss, double *row_right,
			 const float *logits, const int32_t *labels, int B, int train, float scale);
int gk_sigmoid_xent_backward(void *stream, float *dlogits, const float *probs, const int32_t *labels,
			     int B, float scale);

#ifdef __cplusplus
}
#endif

#endif
