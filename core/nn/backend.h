/* The device boundary: a table of the kernels a model replica needs.
 *
 * core/ never calls CUDA; it runs a replica through a struct backend. The
 * CPU backend (backend_cpu.c) wraps the reference kernels of layers.c; the
 * GPU backend (gpu/) fills the same table with CUDA kernels and cuBLAS, so a
 * binary built with CUDA still trains on a machine without it. Pointers a
 * backend hands out live in its own memory (host or device); only upload and
 * download cross the boundary. Every entry returns 0 or a negative errno. */
#ifndef PSTRAIN_BACKEND_H
#define PSTRAIN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

struct backend_ops {
	const char *name;   /* "cpu", "cuda" */
	int (*alloc)(void *ctx, void **p, size_t bytes);
	void (*release)(void *ctx, void *p);
	int (*upload)(void *ctx, void *dst, const void *src, size_t bytes);
	int (*download)(void *ctx, void *dst, const void *src, size_t bytes);
	int (*zero)(void *ctx, void *p, size_t bytes);

	/* Same arguments and contract as the functions in layers.h. */
	int (*dense_forward)(void *ctx, float *out, const float *inp, const float *weight,
			     const float *bias, int B, int C, int OC);
	int (*dense_backward)(void *ctx, float *dinp, float *dweight, float *dbias,
			      const float *dout, const float *inp, const float *weight,
			      int B, int C, int OC);
	int (*act_forward)(void *ctx, enum layer_kind k, float *out, const float *inp, size_t N);
	int (*act_backward)(void *ctx, enum layer_kind k, float *dinp, const float *dout,
			    const float *out, size_t N);
	/* Spatial layers, dropout and batchnorm: the functions of layers.h.
	 * conv's col is scratch of conv_col_floats() floats in backend memory;
	 * pool_* take LAYER_MAXPOOL or LAYER_AVGPOOL (avgpool ignores inp in
	 * backward). batchnorm_forward with mean and var NULL is evaluation.
	 * conv's keep is the layer's own buffer of conv_keep_floats() floats
	 * (NULL where that is 0 or absent): forward leaves the batch's im2col
	 * columns there and backward reads them instead of rebuilding them
	 * from inp. */
	int (*conv_forward)(void *ctx, float *out, float *col, float *keep, const float *inp,
			    const float *weight, const float *bias, int B, int OC,
			    const struct window *w);
	int (*conv_backward)(void *ctx, float *dinp, float *dweight, float *dbias, float *col,
			     const float *keep, const float *dout, const float *inp,
			     const float *weight, int B, int OC, const struct window *w);
	int (*pool_forward)(void *ctx, enum layer_kind k, float *out, const float *inp, int B,
			    const struct window *w);
	int (*pool_backward)(void *ctx, enum layer_kind k, float *dinp, const float *dout,
			     const float *inp, int B, const struct window *w);
	/* Dropout of layer `layer` in the step whose key is `key`: the
	 * functions of layers.h with dropout_layer_key(key, layer), which
	 * the backend derives (a GPU step captured as a graph reads the
	 * step's key from device memory, not from this argument). */
	int (*dropout_forward)(void *ctx, float *out, const float *inp, float p, uint64_t key,
			       int layer, size_t N);
	int (*dropout_backward)(void *ctx, float *dinp, const float *dout, float p, uint64_t key,
				int layer, size_t N);
	int (*batchnorm_forward)(void *ctx, float *out, float *mean, float *var, const float *inp,
				 const float *gamma, const float *beta, const float *run_mean,
				 const float *run_var, int B, int C, int HW);
	int (*batchnorm_backward)(void *ctx, float *dinp, float *dgamma, float *dbeta,
				  float *drun_mean, float *drun_var, const float *dout,
				  const float *inp, const float *gamma, const float *mean,
				  const float *var, const float *run_mean, const float *run_var,
				  float stat_scale, int B, int C, int HW);
	/* meter (2 doubles, backend memory): the summed loss and the number
	 * of right answers are ADDED to meter[0] and meter[1], so a GPU never
	 * waits to report them (replica.c reads it when they are shown). */
	int (*xent_forward)(void *ctx, float *probs, double *meter, const float *logits,
			    const int32_t *labels, int B, int C);
	int (*xent_backward)(void *ctx, float *dlogits, const float *probs,
			     const int32_t *labels, int B, int C, float scale);
	/* Training's loss in one pass: xent_forward's meter update, and
	 * dlogits (B, C) = xent_backward's result, without keeping probs. */
	int (*xent_train)(void *ctx, float *dlogits, double *meter, const float *logits,
			  const int32_t *labels, int B, int C, float scale);

	/* loss = sigmoid_cross_entropy (one logit per sample): as the three
	 * above with C = 1, over layers.h's sigmoid_xent_* (meter[1]: rows
	 * whose logit's sign is the label). NULL: the backend has none. */
	int (*sigmoid_xent_forward)(void *ctx, float *probs, double *meter, const float *logits,
				    const int32_t *labels, int B);
	int (*sigmoid_xent_backward)(void *ctx, float *dlogits, const float *probs,
				     const int32_t *labels, int B, float scale);
	int (*sigmoid_xent_train)(void *ctx, float *dlogits, double *meter, const float *logits,
				  const int32_t *labels, int B, float scale);

	/* The embedding layer: embed.h's kernels with the same arguments,
	 * over buffers in backend memory. The tables live in host memory:
	 * embed_gather (table a host pointer) only where the backend's memory
	 * is the host's; NULL, and the replica gathers the rows on the host
	 * and uploads them (replica_embed.c). forward/backward NULL: the
	 * backend has no embedding layer. */
	int (*embed_gather)(void *ctx, float *U, const float *table, const uint64_t *rows, size_t u,
			    int DIM);
	int (*embed_forward)(void *ctx, float *out, const float *x, const float *U,
			     const uint32_t *off, const uint32_t *idx, int B, int F, int D, int DIM,
			     enum embed_pool pool);
	int (*embed_backward)(void *ctx, float *dU, const float *dout, const uint32_t *roff,
			      const uint32_t *rseg, const uint32_t *off, size_t u, int F, int D,
			      int DIM, enum embed_pool pool);

	/* x (B, D) and y (B) = the rows order[at .. at + B) of a training set
	 * data_x (n, D), data_y (n) held in backend memory. */
	int (*gather)(void *ctx, float *x, int32_t *y, const float *data_x, const int32_t *data_y,
		      const uint32_t *order, size_t at, int B, size_t D);

	/* Optional (NULL: the replica calls the parts one by one). */
	/* out (B, OC) = act(inp W^T + bias): a dense layer and the activation
	 * that follows it in place (act is LAYER_RELU, _TANH or _SIGMOID). */
	int (*dense_act_forward)(void *ctx, float *out, const float *inp, const float *weight,
				 const float *bias, int B, int C, int OC, enum layer_kind act);
	/* dout (B, OC) = act_backward in place, and dbias (OC) += its column
	 * sums: an activation's backward and the bias gradient of the dense
	 * layer before it in one pass. k = LAYER_DENSE: no activation, only
	 * the bias gradient (dout is read). */
	int (*act_bias_backward)(void *ctx, enum layer_kind k, float *dout, float *dbias,
				 const float *out, int B, int OC);
	/* Rows [o0, o1) of a dense weight gradient (layers.h's
	 * dense_wgrad_rows), and with it dense_backward taking dweight NULL
	 * to skip the weight gradient. NULL: the backend cannot split a
	 * backward pass (replica_train_flow is then refused). */
	int (*dense_wgrad)(void *ctx, float *dweight, const float *dout, const float *inp, int B,
			   int C, int OC, int o0, int o1);
	/* Columns [o0, o1) of dense_forward's out from rows [o0, o1) of the
	 * weight and bias (layers.h's dense_forward_rows), to float rounding.
	 * NULL: the backend cannot start a forward pass on part of a weight
	 * (replica_forward_flow is then refused). */
	int (*dense_forward_rows)(void *ctx, float *out, const float *inp, const float *weight,
				  const float *bias, int B, int C, int OC, int o0, int o1);
	/* A batchnorm, the relu after it and, with w non-NULL, the pooling
	 * after that (pool LAYER_MAXPOOL or LAYER_AVGPOOL, over windows that
	 * tile the batchnorm's planes: w->S == w->K, w->P == 0), one pass
	 * each way (NULL: the parts one by one). Forward: act (B, C, HW) =
	 * relu(batchnorm_forward(inp)) (mean, var as there; NULL: evaluation)
	 * and out (B, C, OH, OW) = the pooling of act (w NULL: out unused).
	 * Backward, after a training forward: g (B, C, HW) =
	 * relu_backward(pool_backward(dout)) with dout (B, C, OH, OW) (w
	 * NULL: relu_backward(dout), dout (B, C, HW), g may alias it), then
	 * batchnorm_backward from g: dinp set (NULL: skipped; may alias g),
	 * dgamma, dbeta and the running statistics' slots accumulated. */
	int (*bn_relu_forward)(void *ctx, float *act, float *out, float *mean, float *var,
			       const float *inp, const float *gamma, const float *beta,
			       const float *run_mean, const float *run_var, int B, int C, int HW,
			       enum layer_kind pool, const struct window *w);
	int (*bn_relu_backward)(void *ctx, float *dinp, float *g, float *dgamma, float *dbeta,
				float *drun_mean, float *drun_var, const float *dout,
				const float *act, const float *inp, const float *gamma,
				const float *mean, const float *var, const float *run_mean,
				const float *run_var, float stat_scale, int B, int C, int HW,
				enum layer_kind pool, const struct window *w);
	/* conv's scratch in floats for batches up to B on this backend
	 * (NULL: conv_col_size, the CPU's cache-sized chunks). */
	size_t (*conv_col_floats)(void *ctx, const struct window *w, int OC, int B);
	/* Floats of a conv layer's own buffer for its im2col columns kept
	 * from forward for backward, batches up to B, or 0: they are
	 * rebuilt in backward (NULL: never kept). Asked once per conv layer
	 * when a replica is made, in layer order, and the buffer taken then:
	 * the memory decision is made there, never in a step. */
	size_t (*conv_keep_floats)(void *ctx, const struct window *w, int OC, int B);
	/* Scratch for batches up to max_batch rows of up to width floats,
	 * taken once before the first step so that none is taken in it. */
	int (*reserve)(void *ctx, int max_batch, int width);

	/* Optional, all or none: copies between the backend's memory and
	 * the host's on a queue of their own, beside the backend's work
	 * (its kernels), so that a worker's gradient goes down and its
	 * parameters come up while the layers compute (devices_flow.c).
	 * NULL: the backend's memory is the host's, or every copy waits
	 * (upload, download). No call waits but copy_wait.
	 *   copy_reserve: slots 0 .. slots-1 for copy_down, taken once.
	 *   copy_after: the copies queued from now on run after the
	 *     backend's work queued so far (which wrote what they read, or
	 *     still reads what they overwrite).
	 *   copy_down: src (backend memory) into host, on the queue; slot
	 *     then marks that it has landed.
	 *   copy_wait: the host waits until slot's copy has landed.
	 *   copy_up: host into dst (backend memory), on the queue. host
	 *     must keep its values until the copy has run (a copy_wait of
	 *     a later slot, or the work after copy_join).
	 *   copy_join: the backend's work queued from now on waits for
	 *     every copy queued so far.
	 * host_alloc, host_free: host memory the queue copies fastest
	 * (pinned), taken once; host_free waits for the queue first.
	 * Optional with them: copy_check queues, behind the work copy_after
	 *   ordered it after, a check of src's n floats (backend memory)
	 *   for a NaN or an infinity, whose answer lands with the next
	 *   copy_down of the same slot; after that slot's copy_wait,
	 *   copy_found says 1 (one was found) or 0. The backend reads the
	 *   values where they are made (on a GPU a pass over device memory
	 *   beside the next layers' kernels) instead of the host reading
	 *   them again from the pinned buffer. NULL: the host checks. */
	int (*copy_reserve)(void *ctx, int slots);
	int (*copy_after)(void *ctx);
	int (*copy_down)(void *ctx, int slot, void *host, const void *src, size_t bytes);
	int (*copy_wait)(void *ctx, int slot);
	int (*copy_check)(void *ctx, int slot, const float *src, size_t n);
	int (*copy_found)(void *ctx, int slot);
	int (*copy_up)(void *ctx, void *dst, const void *host, size_t bytes);
	int (*copy_join)(void *ctx);
	int (*host_alloc)(void *ctx, void **p, size_t bytes);
	void (*host_free)(void *ctx, void *p);
};

struct backend {
	const struct backend_ops *ops;
	void *ctx;
	char where[64];     /* placement name, e.g. "cpu:0" or "gpu:1" */
};

/* The CPU backend; threads as for layers_set_threads: OpenBLAS's threads for
 * the dense layers and as many of the backend's own for convolutions,
 * pooling, batchnorm and activations (results do not depend on the count). */
void backend_cpu(struct backend *b, int threads);

#endif
