/* Optimizers (sgd, momentum, adam) and learning-rate schedules over one
 * contiguous float32 range of parameters. A ps shard runs the same code over
 * its slice, so the update of element i depends only on element i.
 *
 * Update rules follow PyTorch's SGD and Adam (weight decay coupled, added
 * to the gradient):
 *   g = grad + weight_decay * p
 *   sgd:       p -= lr * g
 *   momentum:  v = momentum * v + g
 *              p -= lr * (nesterov ? g + momentum * v : v)
 *   adam:      t += 1; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
 *              p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
 */
#ifndef PSTRAIN_OPTIM_H
#define PSTRAIN_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

enum optim_kind {
	OPTIM_SGD,
	OPTIM_MOMENTUM,
	OPTIM_ADAM,
};

enum lr_schedule {
	LR_CONSTANT,
	LR_STEP,     /* lr * decay_rate^(floor(s / decay_steps)) */
	LR_COSINE,   /* lr * 0.5 * (1 + cos(pi * min(s, n) / n)) */
};
/* s = step - warmup_steps and n = total - warmup_steps: schedules run over
 * the steps after warmup (as PyTorch's SequentialLR does), so each starts
 * at the full lr the step warmup ends. decay_steps <= 0 never decays;
 * n <= 0 keeps lr. */

struct optim_config {
	enum optim_kind kind;
	float lr;
	float momentum;       /* momentum; also used by nothing else */
	int nesterov;
	float weight_decay;
	float beta1, beta2, eps;   /* adam */
	enum lr_schedule schedule;
	long decay_steps;     /* LR_STEP */
	float decay_rate;     /* LR_STEP */
	long warmup_steps;    /* step s < warmup_steps gets lr * (s+1) / warmup_steps */
};

/* A range [begin, end) of the optimizer's own indices (0..n). */
struct optim_range {
	size_t begin, end;
};

struct optim {
	struct optim_config cfg;
	size_t n;
	struct optim_range *plain;   /* sorted, disjoint ranges updated by p += g */
	int nplain;
	float *m;     /* (n) momentum buffer or adam first moment; NULL for sgd */
	float *v;     /* (n) adam second moment; NULL otherwise */
	long t;       /* updates applied so far */
};

/* "sgd", "momentum" or "adam": the [train] optimizer value, as
 * checkpoints record it. */
const char *optim_kind_name(enum optim_kind k);

/* Returns 0, -ENOMEM, or -EINVAL for an unknown kind. State starts at zero.
 * On failure *o is left freeable. */
int optim_init(struct optim *o, const struct optim_config *c, size_t n);
void optim_free(struct optim *o);   /* accepts NULL and zeroed structs */

/* Marks the model's non-trainable tensors (batchnorm running statistics)
 * that fall in this optimizer's slice [begin, begin + n) of P as plain:
 * there the step is p += g (the gradient slot carries the update itself),
 * with no learning rate, momentum, weight decay or Adam state. Returns 0 or
 * -ENOMEM. */
int optim_plain_tensors(struct optim *o, const struct model *m, size_t begin);

/* Whether the state a rule of `kind` (enum optim_kind) needs over n
 * elements is there: m for momentum and adam, v for adam. 0, or -EINVAL
 * with the missing buffer named in err (an unknown kind too). Whoever
 * steps state it did not size itself asks first (devices_apply on the
 * CPU, the GPU's optimizer launcher): a rule run over a NULL buffer
 * corrupts memory instead of failing, and did on the first GPU run. */
int optim_state_check(int kind, size_t n, const float *m, const float *v, char *err,
		      size_t errlen);

/* Learning rate for 0-based step `step` of `total` steps. */
float optim_lr(const struct optim_config *c, long step, long total);

/* params (n) -= update(grads (n)) with learning rate lr; increments t. */
void optim_step(struct optim *o, float *params, const float *grads, float lr);

/* One part of the next optim_step: the update over [lo, hi) of params
 * (indexed like the whole slice) with grads (hi - lo) the gradient of
 * that range, grads[0] index lo's, as optim_step would make it there, bit
 * for bit; t does not move. A step taken in parts (a ps
 * applies each piece of its shard as its gradients arrive) covers every
 * index exactly once and then calls optim_step_done. */
void optim_step_part(struct optim *o, float *params, const float *grads, size_t lo, size_t hi,
		     float lr);
void optim_step_done(struct optim *o);

/* optim_step for a gradient that counts `scale` times (async's
 * staleness-aware rule passes 1 / staleness): sgd and momentum multiply
 * g = grad + weight_decay * p by scale before it enters the update, so the
 * momentum buffer keeps the scaled gradient and this gradient's every later
 * contribution through it is scaled too; adam multiplies its step size
 * (lr) instead, since its step does not change when every gradient is
 * scaled alike. Plain ranges (optim_plain_tensors) are not scaled: their
 * slot is a running-statistics update, not a gradient. scale = 1 is
 * optim_step, bit for bit. */
void optim_step_scaled(struct optim *o, float *params, const float *grads, float lr, float scale);

/* optim_step, then grads[i] = 0 for every i in the same pass: the training
 * loop's gradient zeroing for the next step, without a second sweep over
 * the vector. params and grads must not overlap. */
void optim_step_zero(struct optim *o, float *params, float *grads, float lr);

/* The index of the first value of g (n) that is NaN or +-inf, or n when
 * every one is finite. One read of g (branch-free, vectorized) unless one
 * is found: the ps runs it on every gradient it is pushed, the worker on
 * its own before pushing. */
size_t optim_nonfinite(const float *g, size_t n);

/* Nonzero if some value of g (n) is not finite. */
uint32_t optim_any_nonfinite(const float *g, size_t n);

/* dst (n) = src (n), and nonzero if some value is not finite: a copy and
 * the check in one pass. */
uint32_t optim_copy_nonfinite(float *dst, const float *src, size_t n);

#endif
