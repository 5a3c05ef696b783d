/* What devices.c shares with devices_flow.c, which holds the flow half
 * of devices.h (the gradient made final piece by piece, the forward pass
 * on arriving parameters): not part of the API. */
#ifndef PSTRAIN_DEVICES_PRIV_H
#define PSTRAIN_DEVICES_PRIV_H

#include "devices.h"

/* err = "what[ in layer] on gpu:0: why" for replica r's failure e; returns e. */
int devices_fail(const struct devices *d, int r, int e, const char *what, char *err, size_t errlen);

/* Replica r's batch: order[at .. at+B) gathered where its backend keeps the
 * set, or staged from the host; *x, *y are in the backend's memory. A
 * staged batch is released with gpu_stage_release once its work is queued. */
int devices_batch(struct devices *d, int r, size_t at, int B, const float **x, const int32_t **y);

/* QUEUED (devices_flow.c): the backend's work queued from now on waits for
 * every copy on its queue, so that none lands after it (a parameter
 * upload after a forward pass that was given up); 0 and nothing
 * otherwise. */
int devices_flow_settle(struct devices *d);

/* devices_forward_flow's pass, if one is pending, given up: no backward
 * follows it (the exchange failed, an evaluation or another step came
 * first). Its loss is in the training meter already, so its samples are
 * counted with it (else the next progress line's loss and accuracy are
 * those of more samples than it says, the accuracy above 100% at worst),
 * and a staged batch's buffer is freed for the next. */
void devices_forget_pass(struct devices *d);

#endif
