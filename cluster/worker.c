/* The worker role: `pstrain worker --index N` (cluster.h). Its loop reads
 * like `local`'s: pull, checkpoint, evaluate, step, push, with the links to
 * every ps in links.c and, where a ps was lost or went back, a call to
 * recovery.c that says which step to continue at.
 * Which samples a worker's batch is: core/job.h. */
#include "../base/hooks.h"
#include "autoflow.h"
#include "cluster.h"
#include "links.h"
#include "recovery.h"
#include "role.h"
#include "worker_embed.h"
#include "view.h"
#include "worker_host.h"
#include "worker_share.h"
#include "worker_priv.h"
#include "psshard.h"

#include "../core/nn/devices.h"
#include "../core/nn/optim.h"
#include "../core/nn/replica.h"
#include "../core/shard.h"
#include "../core/tblog.h"
#include "../base/err.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EVAL_BATCH ROLE_EVAL_BATCH

/* [cluster] wire_pack: float32 packed (net/fpack.h) on the links to other
 * hosts, where the link rather than the CPU limits the steps: the same
 * measure as overlap's (autoflow.h), from every step. Nothing to decide
 * where every ps is on this host or bf16 goes both ways. */
static void worker_pack_open(struct worker *wr)
{
	const struct config *c = wr->c;
	int fp32 = role_grad_dtype(c) == WIRE_F32 || role_param_dtype(c) == WIRE_F32;
	int mode = fp32 && links_local(&wr->lk, NULL) < wr->lk.nps ? c->cluster.wire_pack : CONFIG_OVERLAP_OFF;
	autoflow_init(&wr->packf, mode);
	wr->packf.probe = 1;   /* packing's two ways differ by far more than the noise: autoflow.h */
	wr->lk.sh.pack = autoflow_wants(&wr->packf);
	if (mode == CONFIG_OVERLAP_AUTO)
		role_log(wr->out, "worker %d: [cluster] wire_pack = auto: sends float32 as it is until its steps show that the link, not the CPU, limits them",
			 wr->index);
	else if (mode == CONFIG_OVERLAP_ON)
		role_log(wr->out, "worker %d: packs float32 on its links to other hosts ([cluster] wire_pack)", wr->index);
}

/* A step took compute seconds, then exchange seconds: pack from the next
 * one on, or not. */
static void worker_pack_record(struct worker *wr, long step, double compute, double exchange)
{
	enum autoflow_said said = autoflow_record(&wr->packf, compute, exchange);
	wr->lk.sh.pack = autoflow_wants(&wr->packf);
	autoflow_say(&wr->packf, wr->out, wr->index, "wire_pack", said, step, "packing float32 on its links to other hosts",
			    "sending float32 as it is");
}

/* Pushing while backward runs: sync piece mode on one replica (a CPU's
 * split backward, or a GPU's layers copied down as they finish:
 * devices_flow_init), unless [cluster] overlap = false; with auto, on the
 * steps autoflow.h says. One stream per shard; the final ranges are at
 * most one per dense weight row plus the gaps between the dense weights. */
static int worker_flow_open(struct worker *wr, const struct shard *plan, char *err, size_t errlen)
{
	const struct model *m = &wr->s.job.m;
	if (!wr->c->cluster.overlap || !wr->lk.sh.pieces || devices_flow_init(&wr->dev))
		return 0;
	size_t begin[CONFIG_MAX_HOSTS], end[CONFIG_MAX_HOSTS];
	int cap = m->nlayers + 2;
	for (int k = 0; k < wr->lk.nps; k++) {
		begin[k] = plan[k].begin;
		end[k] = plan[k].end;
	}
	for (int i = 0; i < m->nlayers; i++)
		cap += m->layers[i].kind == LAYER_DENSE ? m->layers[i].out : 0;
	int e = gradflow_init(&wr->flow, m->nparams, wr->lk.nps, begin, end, cap + FACTORS_MAX_RUNS);
	/* A CPU's split backward may send dense weights as their factors
	 * where packing is on (worker_plan_factors). */
	if (!e && wr->dev.flow == DEVICES_FLOW_HOST && role_grad_dtype(wr->c) == WIRE_F32)
		e = factors_init(&wr->fx, m, wr->B);
	/* Each shard streams its pieces in order: one final range a shard. */
	wr->preforward = !e && devices_flow_forwards(&wr->dev);
	if (wr->preforward)
		e = gradflow_init(&wr->pflow, m->nparams, wr->lk.nps, begin, end, 4 * wr->lk.nps + 8);
	if (e)
		return err_set(err, errlen, e, "worker %d: out of memory for pushing while computing", wr->index);
	/* auto weighs what the CPU's split backward costs the compute; a
	 * GPU's flow runs the step's own kernels, so it costs nothing. */
	int mode = wr->c->cluster.overlap;
	mode = mode == CONFIG_OVERLAP_AUTO && wr->dev.flow == DEVICES_FLOW_QUEUED ? CONFIG_OVERLAP_ON : mode;
	autoflow_init(&wr->af, mode);
	if (mode == CONFIG_OVERLAP_AUTO)
		role_log(wr->out, "worker %d: [cluster] overlap = auto: pushes each gradient after computing it until its steps show that the link, not the CPU, limits them",
			 wr->index);
	else
		role_log(wr->out, "worker %d: pushes the pieces of each gradient as backward makes them ([cluster] overlap)",
			 wr->index);
	return 0;
}

/* A packed gradient's bytes a value (docs/BENCHMARKS.md, "fpack"). */
#define WORKER_PACKED_BYTES 3.5

/* The runs of this step's gradient that go as factors (core/nn/factors.h):
 * on each link to another host that packs, where they save bytes. */
static void worker_plan_factors(struct worker *wr)
{
	wr->flow.fx = NULL;
	if (!wr->fx.max_batch)
		return;
	factors_begin(&wr->fx, wr->B);
	for (int k = 0; k < wr->lk.nps; k++)
		if (link_packs(&wr->lk.ln[k]))
			factors_plan(&wr->fx, &wr->s.job.m, wr->lk.ln[k].range.begin, wr->lk.ln[k].range.end,
				     PSSHARD_PIECE, WORKER_PACKED_BYTES);
	wr->flow.fx = wr->fx.n ? &wr->fx : NULL;
}

/* Setup, devices, links (connected) and the progress line. */
static int worker_open(struct worker *wr, char *err, size_t errlen)
{
	const struct config *c = wr->c;
	struct shard plan[CONFIG_MAX_HOSTS];
	int e = role_setup_load(&wr->s, c, 1, err, errlen);
	if (!e)
		e = shard_check(c->cluster.nps, wr->s.job.m.nparams, err, errlen);
	if (e)
		return e;
	struct view v;
	wr->S = wr->s.job.S;
	view_all(&v, wr->S, wr->W);
	wr->nmine = view_slices(&v, NULL, wr->index, wr->mine);
	wr->elastic = config_elastic(c);
	wr->live = wr->W;
	int threads = worker_host_threads(c, wr->index, wr->out);
	shard_plan(plan, c->cluster.nps, wr->s.job.m.nparams);
	char job[64];
	snprintf(job, sizeof(job), "/job:worker/task:%d", wr->index);
	/* The devices with that thread count: a copy of the config for the
	 * call, which keeps nothing of it. */
	struct config *dc = malloc(sizeof(*dc));
	if (!dc)
		return err_set(err, errlen, -ENOMEM, "out of memory");
	*dc = *c;
	dc->train.threads = threads;
	e = devices_open(&wr->dev, dc, &wr->s.job.m, &c->train.optim,
			 wr->chief && wr->B < EVAL_BATCH ? EVAL_BATCH : wr->B, job, wr->out, err, errlen);
	free(dc);
	wr->dev.stage_only |= wr->s.job.streamed;   /* as in core/train.c */
	if (!e)
		e = devices_set_data(&wr->dev, &wr->s.job.train, NULL, err, errlen);
	if (e)
		return e;
	/* On one CPU replica, pull into and push from the replica's own
	 * vectors: the copies in and out of the devices are then no-ops. On
	 * a GPU, pinned memory: the copies run without a stage, beside the
	 * layers (devices_flow.c). */
	size_t P = wr->s.job.m.nparams;
	wr->own_host = wr->dev.gpu || wr->dev.n > 1;
	wr->params = wr->own_host ? NULL : wr->dev.params[0];
	wr->grads = wr->own_host ? NULL : wr->dev.grads[0];
	if (wr->own_host && ((e = devices_host_alloc(&wr->dev, &wr->params, P, err, errlen)) ||
			     (e = devices_host_alloc(&wr->dev, &wr->grads, P, err, errlen))))
		return e;
	wr->perm = malloc(wr->s.job.train.n * sizeof(uint32_t));
	if (!wr->perm)
		return err_set(err, errlen, -ENOMEM, "out of memory for %zu samples", wr->s.job.train.n);
	e = links_open(&wr->lk, c, &wr->s, plan, wr->index, wr->stop, wr->out, err, errlen);
	if (!e)
		devices_compute(&wr->dev, wr->lk.sh.compute, sizeof(wr->lk.sh.compute));
	if (!e)
		e = worker_embed_open(&wr->emb, wr->index, &wr->dev, &wr->lk, c, &wr->s.job.m, err, errlen);
	if (!e)
		e = worker_flow_open(wr, plan, err, errlen);
	if (!e)
		e = links_connect(&wr->lk, err, errlen);
	if (e)
		return e;
	worker_pack_open(wr);
	wr->total = wr->s.job.total;
	wr->spe = wr->s.job.spe;
	char unx[96] = "", local[160] = "";
	int rings, nlocal = links_local(&wr->lk, &rings);
	const char *cipher = links_cipher(&wr->lk);
	if (nlocal)
		snprintf(unx, sizeof(unx), "%d on this host, over a Unix socket%s", nlocal,
			 rings == nlocal ? ", its bytes through shared memory" :
			 rings ? ", some through shared memory" : "");
	if (nlocal || cipher)
		snprintf(local, sizeof(local), " (%s%s%s)", unx, nlocal && cipher ? "; " : "",
			 cipher ? cipher : "");
	char share[96] = "";
	if (wr->S != wr->W)
		snprintf(share, sizeof(share), " (%d slices, %d of them here)", wr->S, wr->nmine);
	role_log(wr->out, "worker %d%s: connected to %d ps%s; %zu train / %zu test samples, %zu parameters, batch %d x %d workers%s, %ld steps (%ld per epoch), %s mode",
		 wr->index, wr->chief ? " (chief)" : "", wr->lk.nps, local, wr->s.job.n, wr->s.job.test.n, P, wr->B,
		 wr->W, share, wr->total, wr->spe, c->train.mode == MODE_SYNC ? "sync" : "async");
	progress_init(&wr->pg, wr->out, wr->chief && wr->tty, wr->total, wr->spe);
	if (wr->s.job.m.loss == LOSS_SIGMOID_XENT)
		progress_set_binary(&wr->pg);
	char tbe[CONFIG_ERR_MAX];
	if (wr->chief && tblog_open(&wr->tb, c->train.log_dir, tbe, sizeof(tbe)))
		role_log(wr->out, "worker %d: no TensorBoard logs: %s", wr->index, tbe);
	wr->lk.sh.pg = wr->chief ? &wr->pg : NULL;
	return 0;
}

static void worker_close(struct worker *wr)
{
	tblog_close(&wr->tb);
	links_close(&wr->lk);
	worker_embed_close(wr->emb);
	gradflow_free(&wr->flow);
	gradflow_free(&wr->pflow);
	factors_free(&wr->fx);
	if (wr->own_host) {
		devices_host_free(&wr->dev, wr->params);
		devices_host_free(&wr->dev, wr->grads);
	}
	devices_close(&wr->dev);
	free(wr->perm);
	role_setup_free(&wr->s);
}

/* Every shard's parameters for `step`, on the devices. */
int worker_pull(struct worker *wr, char *err, size_t errlen)
{
	int e = links_pull(&wr->lk, wr->params, 0, err, errlen);
	return e ? e : devices_set_params(&wr->dev, wr->params, err, errlen);
}

/* A ps went away (or back), err says how: reconnect, roll back if needed,
 * and set *at to the step the shards agree on, with its parameters on the
 * devices. */
int worker_recover(struct worker *wr, long *at, char *err, size_t errlen)
{
	char why[CONFIG_ERR_MAX];
	snprintf(why, sizeof(why), "%s", err);
	/* Not a forward pass of parameters that may not be the shards' now. */
	wr->phase = STEP_UNPULLED;
	int e = recovery_resync(&wr->lk, wr->params, at, why, err, errlen);
	if (!e)
		e = devices_set_params(&wr->dev, wr->params, err, errlen);
	if (!e)
		wr->phase = STEP_PULLED;
	return e;
}

/* The step a checkpoint is saved as, just after pulling for `step`: sync,
 * that step (every shard is at it); async, the global step of ps 0's
 * version as pulled (S versions a step, one a slice), a label all ps save under while
 * each records its shard as it is. Both count steps of the run, as
 * `local` does, so any checkpoint continues in any mode and layout. */
long ckpt_label(const struct worker *wr, long step)
{
	long every = wr->c->train.checkpoint_every;
	if (wr->c->train.mode != MODE_SYNC)
		return (long)(wr->lk.ln[0].got / (uint64_t)wr->S);
	return every > 0 && step < wr->total ? step - step % every : step;
}

/* The train loss and accuracy since the last reading, as one log line (a
 * worker other than the chief). */
int worker_meter_line(struct worker *wr, char *err, size_t errlen)
{
	double loss;
	long right, n;
	int e = devices_meter(&wr->dev, &loss, &right, &n, err, errlen);
	if (e)
		return e;
	role_log(wr->out, "worker %d: step %ld/%ld, train loss %.4f accuracy %.2f%%, %llu stale", wr->index,
		 wr->step, wr->total, n ? loss / (double)n : 0, n ? 100.0 * (double)right / (double)n : 0,
		 (unsigned long long)wr->lk.sh.stale);
	return 0;
}

/* The chief's evaluation in its TensorBoard events, with the step time
 * since the last one split into compute and communication. */
void worker_log_eval(struct worker *wr, long step)
{
	long n = wr->timed - wr->tb_timed;
	if (!wr->tb.f)
		return;
	if (n > 0) {
		tblog_scalar(&wr->tb, step, "step_time/compute_ms", 1e3 * (wr->t_compute - wr->tb_compute) / (double)n);
		tblog_scalar(&wr->tb, step, "step_time/communication_ms", 1e3 * (wr->t_comm - wr->tb_comm) / (double)n);
	}
	tblog_scalar(&wr->tb, step, "cluster/live_workers", wr->live);
	wr->tb_compute = wr->t_compute;
	wr->tb_comm = wr->t_comm;
	wr->tb_timed = wr->timed;
	tblog_eval(&wr->tb, step, &wr->pg, optim_lr(&wr->c->train.optim, step > 0 ? step - 1 : 0, wr->total));
}

/* Whether worker_evaluate does something before step. */
static int worker_eval_due(const struct worker *wr, long step)
{
	long every = wr->c->train.eval_every > 0 ? wr->c->train.eval_every : wr->spe;
	return step > wr->start && step % every == 0;
}

/* Every eval_every steps (default: each epoch): the chief evaluates the
 * test set on the progress line, the others log their train figures.
 * *ts: the step's start, moved past the evaluation. */
static int worker_evaluate(struct worker *wr, double *ts, char *err, size_t errlen)
{
	long step = wr->step;
	if (!worker_eval_due(wr, step))
		return 0;
	if (!wr->chief)
		return worker_meter_line(wr, err, errlen);
	struct eval_result ev;
	if (wr->hooks.eval_delay_ms)
		role_nap_ms(wr->hooks.eval_delay_ms);
	int e = devices_report(&wr->dev, &wr->pg, step - 1, err, errlen);
	if (!e)
		e = devices_eval(&wr->dev, &wr->s.job.test, &ev, err, errlen);
	if (e)
		return e;
	devices_show_eval(&wr->pg, step, &ev);
	worker_log_eval(wr, step);
	*ts = progress_now();
	return 0;
}

/* Where slice `slice` of step starts in the epoch's order, which goes to
 * the devices when the epoch (a streamed set: the window) changes. */
static int worker_batch(struct worker *wr, long step, int slice, size_t *first, char *err, size_t errlen)
{
	long part = job_part(&wr->s.job, step);
	char why[CONFIG_ERR_MAX];
	if (part != wr->epoch_loaded) {
		int e = job_order(&wr->s.job, step, wr->c->train.seed, wr->perm, why, sizeof(why));
		if (!e)
			e = devices_set_order(&wr->dev, wr->perm, wr->s.job.train.n, why, sizeof(why));
		if (e)
			return err_set(err, errlen, e, "step %ld: %s", step, why);
		wr->epoch_loaded = part;
	}
	*first = job_slice_at(&wr->s.job, step, slice);
	return 0;
}

/* Slice `slice` of the step on the devices: its gradient into wr->grads
 * (with flow, from the forward pass worker_preforward ran if it did). An
 * embedding's rows are pulled before and pushed after, as that slice's
 * (never with flow: the devices refuse it); their links' failure is a
 * lost ps. */
static int worker_compute(struct worker *wr, int flow, int slice, char *err, size_t errlen)
{
	const struct config *c = wr->c;
	long step = wr->step;
	char why[CONFIG_ERR_MAX];
	size_t first = 0, P = wr->s.job.m.nparams, bad = P;
	int forwarded = wr->phase == STEP_FORWARDED;
	wr->phase = STEP_COMPUTING;
	int e = worker_batch(wr, step, slice, &first, err, errlen);
	if (!e && wr->emb)
		e = worker_embed_pull(wr->emb, step, first, wr->B, &wr->t_rows, err, errlen);
	if (e)
		return e;
	uint64_t key = replica_key(c->train.seed, step, slice);
	e = devices_zero_grads(&wr->dev, why, sizeof(why));
	if (!e && flow)
		e = devices_step_flow(&wr->dev, first, wr->B, key, wr->grads, &wr->flow, forwarded, &bad, why,
				      sizeof(why));
	else if (!e)
		e = devices_step(&wr->dev, first, wr->B, key, why, sizeof(why));
	if (!e && !flow)
		e = devices_get_grads(&wr->dev, wr->grads, why, sizeof(why));
	if (e && !(e == -EDOM && bad < P))
		return err_set(err, errlen, e, "step %ld: %s", step, why);
	/* A ps refuses a gradient with a NaN or an infinity (it would make
	 * every parameter it reaches NaN); this worker's training has
	 * diverged, and says so here rather than have the ps end the
	 * connection. One read of the gradient, vectorized: a small part of
	 * the step (the flow checks each range before it is pushed). */
	if (!flow)
		bad = optim_nonfinite(wr->grads, P);
	if (bad < P)
		return err_set(err, errlen, -EDOM, "worker %d: step %ld: the gradient is not finite (parameter %zu is %s), so it was not pushed%s: training diverged (lower learning_rate, or look for huge or broken values in the data)",
			       wr->index, step, bad, isnan(wr->grads[bad]) ? "NaN" : wr->grads[bad] > 0 ? "+inf" : "-inf",
			       flow ? " from there on" : "");
	if (!wr->emb)
		return 0;
	/* The rows go up with the dense gradient, in front of it; a test's
	 * crash between the two (base/hooks.h) pushes them on their own. */
	int now = hooks_crash_due(&wr->hooks, "rows", step);
	e = worker_embed_push(wr->emb, step, slice, now, &wr->t_rows, err, errlen);
	if (!e && now)
		hooks_crash_point(&wr->hooks, "rows", step);
	return e;
}

/* How wr->step's gradient goes up. After its last step a worker other
 * than the chief needs no parameters (the chief pulls them to evaluate):
 * it pushes only, and may finish before the others. Piece by piece where
 * the flow is open ([cluster] overlap) and autoflow says so, or where the
 * step's forward pass ran already (it goes on in the flow, whatever
 * autoflow says since). With the next step's forward pass where that one
 * trains as this one does (it is not the last, and no evaluation comes
 * before it), and nothing reads the training meter in between (report:
 * the chief's progress line after this step), which would count the next
 * step's loss early. */
static enum step_way worker_way(const struct worker *wr, int report)
{
	long step = wr->step, next = step + 1;
	if (step + 1 == wr->total && !wr->chief)
		return WAY_PUSH;
	if (!wr->flow.nstreams || wr->nmine != 1 || !(autoflow_wants(&wr->af) || wr->phase == STEP_FORWARDED))
		return WAY_AFTER;
	if (wr->preforward && next + 1 < wr->total && !worker_eval_due(wr, next) && !report)
		return WAY_FLOW_FORWARD;
	return WAY_FLOW;
}

/* The next step's forward pass, after this step's compute, on the next
 * parameters as the links take them (wr->pflow): the product of the
 * first rows of a layer overlaps the arrival of the last (docs/NETWORK.md,
 * "Pushing while computing"). Its compute time, without its waits, is
 * the next step's (wr->t_pre). A failed exchange leaves it half-way,
 * with nothing to go on from and no error of its own: the exchange's
 * says what failed. */
static int worker_preforward(struct worker *wr, char *err, size_t errlen)
{
	long next = wr->step + 1;
	char why[CONFIG_ERR_MAX];
	double t0 = progress_now(), waited;
	size_t first = 0;
	int e = worker_batch(wr, next, wr->mine[0], &first, err, errlen);
	if (e)
		return e;
	e = devices_forward_flow(&wr->dev, first, wr->B, replica_key(wr->c->train.seed, next, wr->mine[0]),
				 wr->params, &wr->pflow, &waited, why, sizeof(why));
	if (e == -ECANCELED)
		return 0;
	if (e)
		return err_set(err, errlen, e, "step %ld: %s", next, why);
	wr->phase = STEP_FORWARDED;
	wr->t_pre = progress_now() - t0 - waited;
	wr->preforwarded++;
	return 0;
}

/* A worker with several slices of the step: each but the last computed
 * and pushed on its own (the ps sums them in slice order with the others'),
 * the parameters staying on the devices for the next; the last goes
 * with the step's exchange. A failed compute is the step's failure (lk.lost
 * stays -1, as the step began), but for an embedding's rows, whose pull or
 * push is a link's and marks its ps lost; a failed push a lost link's. */
static int worker_earlier_slices(struct worker *wr, char *err, size_t errlen)
{
	for (int i = 0; i + 1 < wr->nmine; i++) {
		int e = worker_compute(wr, 0, wr->mine[i], err, errlen);
		if (e)
			return e;
		wr->lk.sh.slice = wr->mine[i];
		e = links_exchange(&wr->lk, wr->grads, NULL, err, errlen);
		if (e)
			return e;
	}
	return 0;
}

/* Sync, one slice a step, the parameters pulled: the next step's rows
 * come in this step's exchange (worker_embed_ahead), where that step
 * trains as this one does (not the last, no evaluation between, in the
 * epoch's order already on the devices). */
static int worker_rows_ahead(struct worker *wr, enum step_way way, char *err, size_t errlen)
{
	long next = wr->step + 1;
	if (!wr->emb || way == WAY_PUSH || wr->c->train.mode != MODE_SYNC || !wr->lk.sh.pieces || wr->elastic ||
	    wr->nmine != 1 || next >= wr->total || worker_eval_due(wr, next) ||
	    job_part(&wr->s.job, next) != wr->epoch_loaded)
		return 0;
	return worker_embed_ahead(wr->emb, next, job_slice_at(&wr->s.job, next, wr->mine[0]), wr->B, err, errlen);
}

/* The step's compute and its exchange (links_exchange_begin ... end),
 * the way worker_way said: the gradient made, then sent final; or sent
 * piece by piece as backward makes it final (the flow), the next
 * parameters coming down as the shards stream them, and with
 * WAY_FLOW_FORWARD the next step's forward pass run on them as they
 * arrive. *t1: when the compute ended. A failed compute is the step's
 * failure, whatever it did to the links (a flow's pushes are shut down
 * half-way): never a lost ps. */
static int worker_exchange(struct worker *wr, enum step_way way, double *t1, char *err, size_t errlen)
{
	int flow = way == WAY_FLOW || way == WAY_FLOW_FORWARD, pre = way == WAY_FLOW_FORWARD, ce = 0;
	*t1 = progress_now();
	if (!wr->nmine)
		return way == WAY_PUSH ? 0 : worker_share_idle(&wr->lk, wr->params, err, errlen);
	int last = wr->mine[wr->nmine - 1];
	if (!flow) {
		ce = worker_earlier_slices(wr, err, errlen);
		if (ce)
			return ce;
		ce = worker_compute(wr, 0, last, err, errlen);
		/* the next batch's plan is compute, not waiting */
		if (!ce)
			ce = worker_rows_ahead(wr, way, err, errlen);
		*t1 = progress_now();
		if (ce)
			return ce;
	} else {
		gradflow_reset(&wr->flow);
		if (pre)
			gradflow_reset(&wr->pflow);
		/* A GPU's host only queues the step and waits: the CPU that
		 * sends to a ps over its Unix socket early is not the step's. */
		for (int k = 0; k < wr->lk.nps; k++)
			gradflow_later(&wr->flow, k, wr->lk.ln[k].unx && wr->dev.flow != DEVICES_FLOW_QUEUED);
		worker_plan_factors(wr);
	}
	wr->lk.sh.slice = last;
	links_exchange_begin(&wr->lk, wr->grads, flow ? &wr->flow : NULL, way == WAY_PUSH ? NULL : wr->params,
			     pre ? &wr->pflow : NULL);
	if (flow) {
		ce = worker_compute(wr, 1, last, err, errlen);
		*t1 = progress_now();
		if (ce)
			gradflow_fail(&wr->flow);
		else if (pre)
			ce = worker_preforward(wr, err, errlen);
	}
	char le[LINK_WHY_BYTES];
	int e = links_exchange_end(&wr->lk, le, sizeof(le));
	if (ce) {
		wr->lk.lost = -1;
		return ce;
	}
	return e ? err_set(err, errlen, e, "%s", le) : 0;
}

/* Whether the chief asks for a checkpoint at wr->step, now pulled. Sync
 * with backup workers, the shards may go past a multiple of
 * checkpoint_every without this worker's gradient: it then asks for that
 * multiple, which every ps held for it (ps_store_pushed). */
static int worker_ckpt_due(struct worker *wr)
{
	long every = wr->c->train.checkpoint_every, step = wr->step;
	if (every <= 0 || step <= wr->start)
		return 0;
	if (wr->c->train.mode != MODE_SYNC)
		return step % every == 0;
	if (wr->ckpt_start != wr->start)
		wr->ckpt_start = wr->ckpt_at = wr->start;
	if (step / every <= wr->ckpt_at / every)
		return 0;
	wr->ckpt_at = step;
	return 1;
}

/* Before a step's compute: its parameters (unless the last step's
 * exchange or a recovery put them on the devices), the chief's
 * checkpoint, an evaluation. *ts: the step's start, moved past the
 * evaluation. */
static int worker_prepare(struct worker *wr, double *ts, char *err, size_t errlen)
{
	double t0 = *ts;
	int e = 0;
	if (wr->phase == STEP_UNPULLED)
		e = worker_pull(wr, err, errlen);
	if (!e && wr->ckpts && worker_ckpt_due(wr))
		e = links_checkpoint(&wr->lk, ckpt_label(wr, wr->step), -1, err, errlen);
	if (e)
		return e;
	wr->t_comm += progress_now() - t0;
	return worker_evaluate(wr, ts, err, errlen);
}

/* A step trained: compute from t0 to t1, communication to t2; the
 * autoflows decide from them. */
static void worker_account(struct worker *wr, double t0, double t1, double t2)
{
	long step = wr->step;
	wr->t_comm += t2 - t1;
	wr->timed++;
	enum autoflow_said said = wr->flow.nstreams ? autoflow_record(&wr->af, t1 - t0, t2 - t1) : AUTOFLOW_QUIET;
	autoflow_say(&wr->af, wr->out, wr->index, "overlap", said, step,
			    "pushing the pieces of each gradient as backward makes them",
			    "pushing each gradient after computing it");
	worker_pack_record(wr, step, t1 - t0, t2 - t1);
}

/* One training step: prepare (pull, checkpoint, evaluate), then compute
 * and exchange, which pushes this step's gradient and pulls the next
 * step's parameters at once (worker_exchange). A failure with wr->lk.lost
 * set is a lost link, to recover from. */
static int worker_step(struct worker *wr, char *err, size_t errlen)
{
	long step = wr->step;
	double ts = progress_now(), t1;
	/* Only a link call of this step may mark a ps lost: a failure of the
	 * devices must end the run, not be taken for a lost ps. */
	wr->lk.lost = -1;
	if (wr->hooks.step_delay_ms)
		role_nap_ms(wr->hooks.step_delay_ms);
	/* Decided now: worker_way must know it before the meter is read. */
	int report = wr->chief && (progress_due(&wr->pg, step) || step + 1 == wr->total);
	int e = worker_prepare(wr, &ts, err, errlen);
	int leaving = wr->elastic && !wr->chief && *wr->stop;
	if (!e && wr->elastic && role_views(wr->c))
		e = worker_share(&wr->lk, wr->params, wr->c->train.mode == MODE_SYNC, step, wr->index, wr->S,
				 wr->mine, &wr->nmine, &wr->live, err, errlen);
	/* LEAVE before this step's pushes: ps 0 then holds it in no later
	 * view, whenever the step completes. */
	if (!e && leaving)
		e = links_leave(&wr->lk, err, errlen);
	double t0 = progress_now();
	wr->t_rows = 0;
	wr->lk.rows_up = NULL;
	enum step_way way = leaving ? WAY_PUSH : worker_way(wr, report);
	if (!e) {
		e = worker_exchange(wr, way, &t1, err, errlen);
		/* The next step's forward pass, if it ran, is compute, not
		 * waiting, and put its parameters on the devices as they
		 * came; a push only brings none. */
		t1 += wr->phase == STEP_FORWARDED ? wr->t_pre : 0;
		/* The rows' exchange, though inside the compute, is waiting
		 * on the links: the autoflows must see it as such. */
		t1 -= wr->t_rows;
		wr->t_compute += t1 - t0;
	}
	if (!e && way != WAY_PUSH && wr->phase != STEP_FORWARDED)
		e = devices_set_params(&wr->dev, wr->params, err, errlen);
	if (e) {
		wr->phase = STEP_UNPULLED;
		worker_embed_forget(wr->emb);
		return e;
	}
	if (wr->phase != STEP_FORWARDED)
		wr->phase = way == WAY_PUSH ? STEP_UNPULLED : STEP_PULLED;
	wr->left = leaving;
	worker_account(wr, t0, t1, progress_now());
	if (!wr->chief)
		return 0;
	char why[CONFIG_ERR_MAX];
	wr->pg.stale = wr->lk.sh.stale;
	progress_tick(&wr->pg, step, progress_now() - ts);
	/* The gradient's download has waited for the GPU: the loss is there
	 * to be read without a further stall. */
	if (report && (e = devices_report(&wr->dev, &wr->pg, step, why, sizeof(why))))
		return err_set(err, errlen, e, "step %ld: %s", step, why);
	return 0;
}

/* Steps until the last one (or *stop). A lost ps costs a recovery, which
 * says where to go on: sync, the step the shards agree on; async, its own
 * step count unless the shards went back. */
static int worker_train(struct worker *wr, char *err, size_t errlen)
{
	/* Elastic, a SIGTERM is a leave (not the chief's: it stops the run):
	 * one more step, whose slices it pushes after saying LEAVE. */
	while (wr->step < wr->total && !wr->left && (!*wr->stop || (wr->elastic && !wr->chief))) {
		int e = worker_step(wr, err, errlen);
		if (!e && wr->left) {
			wr->step++;
			break;
		}
		if (!e) {
			wr->step++;
			/* Async, elastic: the cluster's step counts every
			 * worker's slices, whoever trained them. */
			if (wr->elastic && wr->c->train.mode == MODE_ASYNC && ckpt_label(wr, wr->step) > wr->step)
				wr->step = ckpt_label(wr, wr->step) < wr->total ? ckpt_label(wr, wr->step) : wr->total;
			/* Sync with backup workers: the shards may have moved
			 * on without this worker's gradient; it goes on from
			 * where they all are. */
			if (wr->c->train.mode == MODE_SYNC && wr->phase != STEP_UNPULLED) {
				uint64_t at = wr->lk.ln[0].got;
				for (int k = 1; k < wr->lk.nps; k++)
					at = wr->lk.ln[k].got < at ? wr->lk.ln[k].got : at;
				if ((long)at > wr->step)
					wr->step = (long)at < wr->total ? (long)at : wr->total;
			}
			continue;
		}
		if (wr->lk.lost < 0)
			return e;
		long at = wr->step;
		e = worker_recover(wr, &at, err, errlen);
		if (e)
			return e;
		if (wr->c->train.mode == MODE_SYNC || at != wr->step)
			wr->step = wr->start = at;
	}
	return 0;
}

int cluster_worker(const struct config *c, int index, FILE *out, int tty,
		   const volatile sig_atomic_t *stop, const char *dump, struct train_result *res,
		   char *err, size_t errlen)
{
	struct worker *wr = calloc(1, sizeof(*wr));
	if (!wr)
		return err_set(err, errlen, -ENOMEM, "out of memory");
	*wr = (struct worker){ .c = c, .stop = stop, .out = out, .index = index, .chief = index == 0,
			       .W = c->cluster.max_workers, .B = c->train.batch_size, .tty = tty,
			       .epoch_loaded = -1, .ckpt_start = -1, .phase = STEP_PULLED };
	memset(res, 0, sizeof(*res));
	double t0 = progress_now();
	hooks_read(&wr->hooks);
	int e = worker_open(wr, err, errlen);
	if (!e)
		e = recovery_start(&wr->lk, wr->params, wr->total, &wr->start, err, errlen);
	if (!e)
		e = devices_set_params(&wr->dev, wr->params, err, errlen);
	wr->ckpts = wr->chief && c->train.checkpoint_dir[0];
	wr->step = wr->start;
	if (!e && wr->start >= wr->total)
		e = worker_found_finished(wr, res, err, errlen);
	for (int again = 1; !e && again;) {
		e = worker_train(wr, err, errlen);
		res->steps = wr->step;
		res->total_steps = wr->total;
		if (wr->step < wr->total)
			wr->finished = res->finished = 0;   /* rolled back, and trained again */
		if (!e && wr->left) {
			e = worker_share_leave(&wr->lk, wr->step, wr->total, err, errlen);
			break;
		}
		if (!e && *stop)
			e = err_set(err, errlen, -EINTR, "worker %d: interrupted at step %ld/%ld", index,
				    wr->step, wr->total);
		if (!e)
			e = worker_final(wr, dump, res, &again, err, errlen);
		if (e || again)
			continue;
		progress_clear(&wr->pg);
		e = worker_finish(wr, &again, err, errlen);
	}
	progress_clear(&wr->pg);
	if (!e && wr->timed && wr->preforwarded)
		role_log(out, "worker %d: per step: compute %.2f ms, communication %.2f ms (%ld steps, %ld of them computing forward while their parameters arrived)",
			 index, 1e3 * wr->t_compute / (double)wr->timed, 1e3 * wr->t_comm / (double)wr->timed,
			 wr->timed, wr->preforwarded);
	else if (!e && wr->timed)
		role_log(out, "worker %d: per step: compute %.2f ms, communication %.2f ms (%ld steps)", index,
			 1e3 * wr->t_compute / (double)wr->timed, 1e3 * wr->t_comm / (double)wr->timed, wr->timed);
	char said[512];
	devices_flow_say(&wr->dev, said, sizeof(said));
	if (!e && said[0])
		role_log(out, "worker %d: overlap: %s", index, said);
	if (!e)
		links_say_sndbuf(&wr->lk, index, out);
	if (!e)
		worker_embed_say(wr->emb, out);
	/* What the links carried: 4 bytes a value as float32, 2 as bf16,
	 * about 3.5 packed (tests/test_cluster.c reads it). */
	if (!e && wr->lk.sh.pvalues)
		role_log(out, "worker %d: the parameters arrived in %.2f bytes a value", index,
			 (double)wr->lk.sh.pbytes / (double)wr->lk.sh.pvalues);
	if (!e && wr->lk.sh.fvalues)
		role_log(out, "worker %d: %.0f%% of the gradient went as the factors of dense weights, in %.2f bytes a value",
			 index, 100.0 * (double)wr->lk.sh.fvalues / (double)wr->lk.sh.gvalues,
			 (double)wr->lk.sh.fbytes / (double)wr->lk.sh.fvalues);
	if (!e) {
		res->wall = progress_now() - t0;
		res->samples_per_s = wr->pg.train_time > 0 ? (double)wr->pg.samples / wr->pg.train_time : 0;
	}
	worker_close(wr);
	free(wr);
	return e;
}
