/* devices_slices_step (devices.h): `local`'s step over several slices of
 * a global batch, folded as a ps folds the slices workers push. */
#include "devices_embed.h"
#include "devices_priv.h"
#include "gradfold.h"

#include "../../base/err.h"

#include <errno.h>

/* host (P) into replica 0's gradient. */
static int grads_put(struct devices *d, const float *host, char *err, size_t errlen)
{
	struct backend *b = &d->be[d->be_of[0]];
	int e = b->ops->upload(b->ctx, d->grads[0], host, d->m->nparams * sizeof(float));
	return e ? devices_fail(d, 0, e, "copying the gradient in", err, errlen) : 0;
}

int devices_slices_step(struct devices *d, int S, const size_t *at, int B, const uint64_t *key,
			float *acc, float *g, struct optim *o, float lr, char *err, size_t errlen)
{
	size_t P = d->m->nparams;
	if (d->emb && d->emb->S != S)
		return err_set(err, errlen, -EINVAL, "[train] slices = %d: the embedding has room for %d", S, d->emb->S);
	/* Each slice into a zeroed gradient, copied out before the next: one
	 * step of B rows adding onto another's sum rounds differently from
	 * the two made apart and then added, which is what a ps does. */
	for (int s = 0; s < S; s++) {
		int e = devices_zero_grads(d, err, errlen);
		if (!e)
			e = devices_step(d, at[s], B, key[s], err, errlen);
		if (!e)
			e = devices_get_grads(d, s ? g : acc, err, errlen);
		if (!e && d->emb && (e = devices_embed_keep(d, s)) != 0)
			e = devices_fail(d, 0, e, "the embedding rows' gradient", err, errlen);
		if (e)
			return e;
		if (s)
			grad_fold_add(acc, g, P);
	}
	grad_fold_finish(acc, S, P);
	int e = grads_put(d, acc, err, errlen);
	if (!e)
		e = devices_apply(d, o, lr, err, errlen);
	if (!e && d->emb)
		devices_embed_fold(d, S);
	return e;
}
