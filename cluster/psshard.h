/* A parameter-server shard as pure state: its range of the flat parameter
 * vector, the optimizer state for that range, the version counter, and the
 * update rules for sync and async training (DESIGN §5).
 *
 * No sockets, threads or locks here: the ps role (cluster/) receives PUSH
 * chunks, assembles one whole-range gradient, and calls psshard_push under
 * its own lock; PULL reads psshard_params and psshard_version under the
 * same lock. Everything a shard allocates is allocated in psshard_init,
 * so a shard does not grow with steps (issue 3 item 7): psshard_push never
 * allocates. (The ps process around it allocates the copies a checkpoint
 * takes; cluster/ps_store.c bounds their number.)
 *
 * What the shard calls a "worker" is a slice of the step's global batch
 * (core/job.h, docs/ELASTIC.md): W here is [train] slices (config_slices),
 * one per worker unless set, and a worker that trains several slices
 * pushes each as its own gradient, tagged with its slice. So the sums
 * below run in slice order whoever computed which slice.
 *
 * sync (SyncReplicasOptimizer): the shard is at version v. A gradient tagged
 * v from a worker that has not pushed for v is copied into one of R slots
 * (R = replicas_to_aggregate). When R distinct workers have pushed, the
 * slots are summed in WORKER-INDEX order (not arrival order, so a run is
 * reproducible whatever the network does), divided by R, and applied with
 * lr = optim_lr(step v, total); v becomes v+1 and the slots are free again.
 * A gradient tagged below v is dropped and counted as stale: with R < W the
 * W - R slowest workers are backup workers, and their gradients for v
 * arrive after v has moved on. Only R slots exist (not W): at most R
 * gradients are ever waiting, since the R-th applies the step.
 *
 * async: each gradient is applied on arrival with lr = optim_lr(step v,
 * total), and v becomes v+1. With max_staleness > 0 a gradient tagged with
 * version t where v - t > max_staleness is dropped and counted instead.
 * With staleness_lr (the default) the step a gradient makes is divided by
 * its staleness tau = v - t + 1 (1 when it is fresh, about W when W
 * workers take turns): optim_step_scaled with scale 1 / tau, which for sgd
 * and momentum scales the gradient before it enters the momentum buffer
 * and for adam scales the step size (optim.h). Sync never scales: every
 * gradient it applies is of version v. age_sum and age_max count v - t
 * over the applied async gradients, for the ps's log.
 *
 * Pieces (sync with R = W): the shard is cut into pieces of
 * PSSHARD_PIECE values (the last one shorter), and the rule above runs
 * for each piece on its own: a piece is summed, divided and stepped as
 * soon as all R gradients for it have arrived (psshard_push_piece, as a
 * ps receives a PUSH chunk by chunk), so the first pieces of version v+1
 * can go out while the last gradients of v still come in. Each piece has
 * its version; the shard's version v is the lowest. Since every worker
 * pushes for v only after it has every piece of v, no piece gets ahead
 * of v by more than one, and when the last piece reaches v all are at v
 * (what a checkpoint copies). The numbers are those of the whole-shard
 * rule, bit for bit: the same sums in the same order, and the optimizer's
 * step split at piece boundaries (optim_step_part). With R < W the first
 * R workers of each piece could differ and pieces could run ahead, so
 * backup workers keep the whole-shard rule; so does async.
 *
 * In both modes a gradient tagged above v is a protocol error (a worker
 * cannot have pulled a version that does not exist yet). In sync mode a
 * second gradient from the same worker for the current v is also an error,
 * not a silent drop: a correct worker pushes once per version it pulled,
 * and counting the same worker twice would break the R-distinct rule. So
 * is a gradient holding a NaN or an infinity that would be used (applied,
 * or kept for the sync sum): one such value makes every parameter it
 * reaches NaN for the rest of the run, whoever sent it. The shard is
 * unchanged by an error; whether the connection survives is the ps role's
 * decision. */
#ifndef PSTRAIN_PSSHARD_H
#define PSTRAIN_PSSHARD_H

#include <stddef.h>
#include <stdint.h>

#include "../core/config/config.h"
#include "../core/nn/model.h"
#include "../core/nn/optim.h"
#include "../core/shard.h"

/* What happened to one push, for the ACK. */
enum psshard_outcome {
	PSSHARD_APPLIED,   /* the optimizer ran: async, or the R-th gradient for v */
	PSSHARD_WAITING,   /* sync: stored, fewer than R gradients for v so far */
	PSSHARD_STALE,     /* dropped: sync version < v, or async beyond max_staleness */
};

#define PSSHARD_MAX_WORKERS CONFIG_MAX_HOSTS
#define PSSHARD_PUSHED_WORDS (PSSHARD_MAX_WORKERS / 64)
/* Values per piece: one PUSH or PARAMS chunk on the wire (net/wire.h's
 * WIRE_CHUNK_VALUES; cluster/ps.c checks that they agree). */
#define PSSHARD_PIECE 16384u

struct psshard {
	struct shard range;         /* global [begin, end) in P */
	size_t n;                   /* end - begin */
	float *params;              /* (n) the shard's parameters */
	struct optim opt;           /* optimizer state over the same n */
	uint64_t version;           /* v: updates applied so far */
	long total;                 /* steps the lr schedule runs over */
	enum train_mode mode;
	int workers;                /* W: the slices of a step (see the top) */
	int replicas;               /* R = replicas_to_aggregate, 1..W */
	int max_staleness;          /* async: 0 = no bound */
	int staleness_lr;           /* async: step scaled by 1 / staleness */

	/* sync accumulation for version v */
	float *slots;               /* (R, n) gradients waiting for v; NULL in async */
	int nwaiting;               /* gradients stored for v, 0..R-1 between pushes */
	uint64_t pushed[PSSHARD_PUSHED_WORDS];   /* bit w: worker w pushed for v */
	int16_t slot_of[PSSHARD_MAX_WORKERS];        /* worker -> slot, valid where pushed */

	/* pieces (sync, R = W); npieces 0: the whole-shard rule */
	size_t npieces;
	uint64_t *pver;             /* (npieces) each piece's version, v or v + 1 */
	int *pwaiting;              /* (npieces) gradients stored for the piece's version */
	uint64_t *ppushed;          /* (npieces, PSSHARD_PUSHED_WORDS) bit w: w pushed for it */
	int16_t *pslot;             /* (npieces, W) worker -> slot within the piece */
	size_t behind;              /* pieces still at v */
	size_t lead;                /* pieces [0, lead) are at v + 1 */
	uint64_t lead_moves;        /* times lead grew, and rewinds (psshard_lead_moves) */
	/* pieces' previous versions, kept once a worker asks for XORs
	 * (psshard_keep_prev; net/xdelta.h): prev holds each piece as it was
	 * before its last update, pprev[j] the version that update made (0:
	 * none since the last rewind) */
	float *prev;                /* (n) or NULL */
	uint64_t *pprev;            /* (npieces) */

	/* counters since init */
	uint64_t received;          /* pushes that were not errors */
	uint64_t applied;           /* optimizer steps (== version) */
	uint64_t dropped_stale;     /* PSSHARD_STALE outcomes */
	uint64_t age_sum;           /* async: sum of v - t over applied gradients */
	uint64_t age_max;           /* async: the largest v - t applied */
};

/* Sets up the shard for range sh of model m with config c: parameters from
 * model_init_params(m, params, sh->begin, sh->end, c->train.seed), exactly
 * what `local` starts from over that range; optimizer c->train.optim at
 * zero; mode, W (config_slices(c, 1)), R (c->train.replicas_to_aggregate,
 * resolved by config) and max_staleness from c. total is the number of
 * versions the lr schedule runs over (local's step count; the ps role
 * computes it, since it depends on the data set size). Returns 0, -EINVAL (empty range or
 * one beyond P, W or R out of range) or -ENOMEM with one line in err. On
 * failure *s is left freeable. */
int psshard_init(struct psshard *s, const struct model *m, const struct shard *sh,
		 const struct config *c, long total, char *err, size_t errlen);
void psshard_free(struct psshard *s);   /* accepts NULL and zeroed structs */

/* One gradient for the whole range, grads (n), computed by worker (0..W-1)
 * on parameters of version `version`. Sets *outcome and returns 0, or
 * returns -EINVAL (worker out of range), -ERANGE (version above v),
 * -EALREADY (sync: worker already pushed for v) or -EDOM (a value of grads
 * is NaN or +-inf; optim_nonfinite says which), leaving the shard as it
 * was. A gradient that is dropped (stale) is not read, so not checked.
 * Never allocates. grads is only read during the call. */
int psshard_push(struct psshard *s, int worker, uint64_t version, const float *grads,
		 enum psshard_outcome *outcome);

/* Pieces: whether this shard takes gradients piece by piece, how many
 * pieces it has, and piece j's range [*lo, *hi) of the shard. */
int psshard_pieces(const struct psshard *s);
void psshard_piece_range(const struct psshard *s, size_t j, size_t *lo, size_t *hi);

/* Piece j (g: its values, hi - lo of them) of worker's gradient computed
 * on version `version`, in piece mode; last: it is the gradient's last
 * piece (received and the stale count move once per gradient). Returns
 * and *outcome as psshard_push, for this piece: PSSHARD_APPLIED when it
 * completed the piece (the shard's version moves when that was the last
 * piece at v), -ERANGE also for a version above the piece's or a piece
 * already ahead of v, -EALREADY when worker already pushed this piece for
 * its version, -EINVAL when not in piece mode or j is out of range. A
 * stale piece is not read. */
int psshard_push_piece(struct psshard *s, int worker, uint64_t version, size_t j, const float *g,
		       int last, enum psshard_outcome *outcome);

/* A piece's step owed by psshard_push_piece_owed: its math, then its
 * bookkeeping. */
struct psshard_owed {
	size_t j;          /* the piece */
	int last_w;        /* the worker whose gradient completed it */
	const float *g;    /* that gradient's values of the piece; NULL: nothing owed */
	float *prev;       /* where the piece before its step goes (psshard_keep_prev), as it
			    * was when owed: a first keep_prev meanwhile starts at the next */
};

/* psshard_push_piece, but a push that completes its piece (outcome
 * PSSHARD_APPLIED) leaves the step to the caller when owe is not NULL:
 * owe->g is set, and the caller runs psshard_owed_math (without the lock
 * that guards the shard: it touches only the piece's parameters,
 * optimizer state, slots and kept values, which nothing else writes until
 * the piece moves on, and reads the shard's version and step count,
 * which cannot move before it does) and then psshard_owed_done (under that lock), with g still
 * valid until the math returns. Until done the piece is at its old
 * version: no worker can push it again, a streamer does not send it, and
 * the shard cannot move. A ps applies several pieces at once this way
 * (cluster/ps_push.c). owe NULL is psshard_push_piece. */
int psshard_push_piece_owed(struct psshard *s, int worker, uint64_t version, size_t j, const float *g,
			    int last, enum psshard_outcome *outcome, struct psshard_owed *owe);
void psshard_owed_math(struct psshard *s, const struct psshard_owed *o);
void psshard_owed_done(struct psshard *s, const struct psshard_owed *o);

/* From the next update of each piece on, keep its values from before the
 * update (one more copy of the shard, in piece mode only): 0, -EINVAL
 * outside piece mode, -ENOMEM. */
int psshard_keep_prev(struct psshard *s);

/* Pieces [j, k)'s values as they were before the update that made them
 * version v, where every one of them is at v by an update from v - 1
 * kept since the last rewind; else NULL. The values of piece i start at
 * the returned pointer plus its range's start. */
const float *psshard_prev(const struct psshard *s, size_t j, size_t k, uint64_t v);

/* The version of piece j's parameters (the shard's version outside piece
 * mode). */
uint64_t psshard_piece_version(const struct psshard *s, size_t j);

/* A counter that moves when the leading pieces at the next version (the
 * pieces a streamed PULL sends in order, waiting on the first one behind)
 * grow (and so when the version moves), and at a rewind; and how many
 * lead. A piece applied past a gap is no news to a streamer: a ps that
 * woke its streamers for each piece of the CNN (200 a step, most of them
 * out of order: backward makes the last layers' first) spent a third of
 * its CPU waking them and contending for its lock. */
uint64_t psshard_lead_moves(const struct psshard *s);
size_t psshard_lead(const struct psshard *s);

/* For PULL: the current parameters (n) and their version. Valid until the
 * next psshard_push. */
const float *psshard_params(const struct psshard *s);
uint64_t psshard_version(const struct psshard *s);

/* Sync: whether worker w's gradient for the current version has arrived
 * (in piece mode: every piece of it still at v), and how many workers'
 * have. */
int psshard_has_pushed(const struct psshard *s, int w);
int psshard_waiting(const struct psshard *s);

/* After the caller has put the parameters and optimizer state of step
 * `version` in place (a rollback to a checkpoint): the shard is at that
 * version with no gradient waiting. */
void psshard_rewind(struct psshard *s, uint64_t version);

/* "applied", "waiting", "stale" */
const char *psshard_outcome_name(enum psshard_outcome o);

#endif
