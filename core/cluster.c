/* The ps and worker roles: see cluster.h. One thread per accepted
 * connection on the ps (at most PS_MAX_CONN), sequential request/response on
 * the worker (every PULL is sent before any reply is read, and every PUSH
 * before any ACK, so the shards work in parallel). */
#include "cluster.h"
#include "../net/err.h"

#include "../net/cryptopool.h"
#include "../net/handshake.h"
#include "../net/key.h"
#include "../net/msg.h"
#include "../net/pipe.h"
#include "../net/sock.h"
#include "backend.h"
#include "checkpoint.h"
#include "data.h"
#include "devices.h"
#include "model.h"
#include "progress.h"
#include "psshard.h"
#include "replica.h"
#include "shard.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define EVAL_BATCH 1024
#define PS_MAX_CONN 128
#define HS_TIMEOUT_MS 5000
#define RBUF_BYTES FRAME_CT_MAX
#define CKPT_QUEUE_MAX 8   /* copies of its shard a ps holds for its writer at most */
#define WBUF_BYTES FRAME_BYTES_MAX


/* Key, model, data and the step count, the same on every node. */
struct setup {
	uint8_t key[KEY_BYTES];
	uint8_t hash[CONFIG_HASH_BYTES];
	struct model m;
	struct dataset train, test;
	long spe, total;
};

static int setup_load(struct setup *s, const struct config *c, int want_data, char *err,
		      size_t errlen)
{
	int e = key_load(s->key, c->cluster.key_file, err, errlen);
	if (e)
		return e == -ENOMEM || e == -EIO ? e : -EINVAL;
	if (config_hash(c, s->hash))
		return snprintf(err, errlen, "out of memory"), -ENOMEM;
	e = model_build(&s->m, &c->model, err, errlen);
	if (e)
		return e;
	if (!want_data && c->train.steps > 0) {
		s->total = c->train.steps;
		return 0;
	}
	e = data_load(&s->train, &s->test, &c->data, c->train.seed, err, errlen);
	if (e)
		return e != -ENOMEM && e != -EIO ? -EINVAL : e;
	const char *src = c->data.format == DATA_IDX ? c->data.train_images : c->data.train_csv;
	if (s->train.d != (size_t)s->m.inputs || s->test.d != (size_t)s->m.inputs) {
		snprintf(err, errlen, "%s: samples have %zu features but the model's input has %d",
			 src, s->train.d, s->m.inputs);
		return -EINVAL;
	}
	int classes = s->train.classes > s->test.classes ? s->train.classes : s->test.classes;
	if (classes > s->m.outputs) {
		snprintf(err, errlen, "%s: labels go up to %d but the last layer has %d outputs",
			 src, classes - 1, s->m.outputs);
		return -EINVAL;
	}
	size_t per_step = (size_t)c->cluster.nworkers * (size_t)c->train.batch_size;
	s->spe = (long)(s->train.n / per_step);
	if (s->spe == 0) {
		snprintf(err, errlen, "%s: %zu training samples are fewer than %d workers x batch_size %d",
			 c->path, s->train.n, c->cluster.nworkers, c->train.batch_size);
		return -EINVAL;
	}
	s->total = c->train.steps > 0 ? c->train.steps : c->train.epochs * s->spe;
	return 0;
}

static void setup_free(struct setup *s)
{
	dataset_free(&s->train);
	dataset_free(&s->test);
	explicit_bzero(s->key, sizeof(s->key));
}

static void logf_(FILE *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(FILE *out, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	flockfile(out);
	vfprintf(out, fmt, ap);
	fputc('\n', out);
	fflush(out);
	funlockfile(out);
	va_end(ap);
}

static void nap_ms(long ms)
{
	struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&t, NULL);
}

/* ---- ps ------------------------------------------------------------------ */

struct ps {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct cryptopool *pool; /* NULL: crypto_threads 1 */
	struct psshard sh;
	const struct setup *s;
	struct hs_identity me;
	FILE *out;
	int index, W;
	int ndone;
	unsigned char done[CONFIG_MAX_HOSTS];
	unsigned char leaving[CONFIG_MAX_HOSTS]; /* DONE(leaving): saw the run complete */
	int aborted;
	char why[512];
	int nconn;
	int fds[PS_MAX_CONN];
	int live[CONFIG_MAX_HOSTS];          /* authenticated connections per worker */
	struct timespec lost[CONFIG_MAX_HOSTS]; /* grace deadline; tv_sec 0: none */
	char lost_why[512];
	const struct config *c;
	struct ckpt_layout *lay;             /* NULL: checkpoints off */
	uint64_t pending;                    /* CHECKPOINT step not reached yet; 0: none */
	uint64_t gen;                        /* rollbacks so far: wakes PULLs waiting across one */
	long first_pull_delay_ms;            /* test hook PSTRAIN_FIRST_PULL_DELAY_MS */
	/* Saving: the shard is copied into the queue under mu, and the
	 * writer thread writes the copies, oldest first, without mu, so
	 * pushes, pulls and heartbeats never wait for a disk. */
	struct ps_snap {
		uint64_t step;
		float *p, *m, *v;            /* (n) each; m, v NULL as in the optimizer */
		long t;
	} q[CKPT_QUEUE_MAX];                 /* copies waiting for the writer, oldest first */
	int qlen, qcap;                      /* qcap: min(keep_checkpoints, CKPT_QUEUE_MAX) */
	pthread_t writer;
	pthread_cond_t wcv;                  /* a copy queued, or wstop */
	int writer_on, wstop;
};

/* How often an idle connection carries a HEARTBEAT: four per peer_timeout,
 * so that one late heartbeat never looks like a dead peer. */
static int heartbeat_ms(const struct config *c)
{
	int ms = (int)(c->cluster.peer_timeout * 1000 / 4);
	return ms < 50 ? 50 : ms;
}

static int peer_timeout_ms(const struct config *c)
{
	return (int)(c->cluster.peer_timeout * 1000);
}

/* The deadline for writing one frame (a message, or one chunk of a
 * tensor): a peer that stops reading (a stopped process, a hung host) is
 * then found in peer_timeout whether this side was reading or writing.
 * The floor keeps a 1 MiB frame possible on a slow link whatever
 * peer_timeout is set to (config allows 1 s and up). */
static int write_timeout_ms(const struct config *c)
{
	int ms = peer_timeout_ms(c);
	return ms < 1000 ? 1000 : ms;
}

static void snap_free(struct ps_snap *sn)
{
	free(sn->p);
	free(sn->m);
	free(sn->v);
	memset(sn, 0, sizeof(*sn));
}

/* Saves the shard as checkpoint `step`; called with ps->mu held, so the
 * state is exactly version `step` (sync: no push can apply meanwhile;
 * async: `step` is the chief's label and the state is the shard's as it is
 * now). Only the copy happens here; the writer thread writes it. Copies
 * wait in a queue of keep_checkpoints (at most CKPT_QUEUE_MAX): every ps
 * then writes every step the chief asks for, so the steps are complete,
 * unless the disk falls that far behind, when the oldest waiting copy is
 * dropped (logged; that step stays incomplete, and the newest ones are
 * still written everywhere). A failure is reported and training goes on:
 * the checkpoint stays incomplete and the previous one remains the
 * newest. */
static void ps_save(struct ps *ps, uint64_t step)
{
	size_t bytes = ps->sh.n * sizeof(float);
	struct ps_snap sn = { 0 };
	if (ps->qlen == ps->qcap) {
		sn = ps->q[0];
		logf_(ps->out, "ps %d: checkpoint at step %llu not written: %d newer ones wait (the disk is slower than checkpoint_every)",
		      ps->index, (unsigned long long)sn.step, ps->qlen);
		memmove(ps->q, ps->q + 1, (size_t)(ps->qlen - 1) * sizeof(ps->q[0]));
		ps->qlen--;
	} else {
		sn.p = malloc(bytes);
		sn.m = ps->sh.opt.m ? malloc(bytes) : NULL;
		sn.v = ps->sh.opt.v ? malloc(bytes) : NULL;
		if (!sn.p || (ps->sh.opt.m && !sn.m) || (ps->sh.opt.v && !sn.v)) {
			snap_free(&sn);
			logf_(ps->out, "ps %d: checkpoint at step %llu failed, training goes on: out of memory for a copy of the shard",
			      ps->index, (unsigned long long)step);
			return;
		}
	}
	sn.step = step;
	sn.t = ps->sh.opt.t;
	memcpy(sn.p, ps->sh.params, bytes);
	if (sn.m)
		memcpy(sn.m, ps->sh.opt.m, bytes);
	if (sn.v)
		memcpy(sn.v, ps->sh.opt.v, bytes);
	ps->q[ps->qlen++] = sn;
	pthread_cond_signal(&ps->wcv);
}

/* Drops every copy still waiting (under mu). */
static void ps_queue_clear(struct ps *ps)
{
	for (int i = 0; i < ps->qlen; i++)
		snap_free(&ps->q[i]);
	ps->qlen = 0;
}

/* The writer thread: writes each queued copy, until wstop and nothing is
 * queued. Its log lines are collected and printed after the write, so
 * that the output lock is not held across a slow disk either. */
static void *ps_writer(void *arg)
{
	struct ps *ps = arg;
	pthread_mutex_lock(&ps->mu);
	for (;;) {
		while (!ps->qlen && !ps->wstop)
			pthread_cond_wait(&ps->wcv, &ps->mu);
		if (!ps->qlen)
			break;
		struct ps_snap sn = ps->q[0];
		memmove(ps->q, ps->q + 1, (size_t)(ps->qlen - 1) * sizeof(ps->q[0]));
		ps->qlen--;
		pthread_mutex_unlock(&ps->mu);

		struct ckpt_state st = { sn.p, sn.m, sn.v, sn.t };
		char e[CONFIG_ERR_MAX], *text = NULL;
		size_t tlen = 0;
		FILE *log = open_memstream(&text, &tlen);
		int r = checkpoint_save_shard(ps->c->train.checkpoint_dir, ps->lay, (long)sn.step, ps->index, &st,
					      ps->sh.mode == MODE_ASYNC, ps->c->train.keep_checkpoints, log, e,
					      sizeof(e));
		if (log && fclose(log) == 0 && text && tlen) {
			flockfile(ps->out);
			fputs(text, ps->out);
			fflush(ps->out);
			funlockfile(ps->out);
		}
		free(text);
		if (r)
			logf_(ps->out, "ps %d: checkpoint at step %llu failed, training goes on: %s", ps->index,
			      (unsigned long long)sn.step, e);
		snap_free(&sn);
		pthread_mutex_lock(&ps->mu);
	}
	pthread_mutex_unlock(&ps->mu);
	return NULL;
}

/* CHECKPOINT from the chief. Sync: it sends it after pulling version
 * `step` and before pushing for it; with replicas_to_aggregate < workers
 * the shard may have moved on already, and that step is skipped here.
 * Async: shards have no common version; `step` is a label the chief chose
 * (ps 0's version as it pulled it) and every ps saves what it has now
 * under it, so the shards of one checkpoint are as far apart as the
 * shards of a running async cluster always are. */
static void ps_checkpoint(struct ps *ps, uint64_t step)
{
	pthread_mutex_lock(&ps->mu);
	uint64_t v = psshard_version(&ps->sh);
	if (!ps->lay)
		;
	else if (v == step || ps->sh.mode == MODE_ASYNC)
		ps_save(ps, step);
	else if (v < step)
		ps->pending = step;
	else
		logf_(ps->out, "ps %d: checkpoint at step %llu skipped: shard already at version %llu", ps->index,
		      (unsigned long long)step, (unsigned long long)v);
	pthread_mutex_unlock(&ps->mu);
}

/* ROLLBACK from a worker: a restarted ps resumed from checkpoint `step`
 * while this one went on, so this one goes back to the same step (step 0:
 * the initial parameters). Already at `step`, it keeps what it has: the
 * gradients waiting for it were computed from that version. Under ps->mu, so no push or pull sees a half
 * restored shard; waiting PULLs are woken (ps->gen) and answered with the
 * restored version. A checkpoint this ps cannot load stops it (the chief
 * then fails naming it): shards at different steps must not train on. */
static void ps_rollback(struct ps *ps, uint64_t step)
{
	char e[CONFIG_ERR_MAX] = "";
	int r = 0;
	pthread_mutex_lock(&ps->mu);
	uint64_t v = psshard_version(&ps->sh);
	struct psshard *sh = &ps->sh;
	if (v == step) {
		pthread_mutex_unlock(&ps->mu);
		logf_(ps->out, "ps %d: ROLLBACK to step %llu: already there", ps->index,
		      (unsigned long long)step);
		return;
	}
	long t = 0, got = 0;
	int init = step == 0;
	if (!init && sh->mode == MODE_ASYNC) {
		/* Async shards are never all at one version, so a worker may
		 * have seen the restarted shard a few pushes past its
		 * checkpoint: the newest complete checkpoint at or below
		 * `step` is the one it resumed from (none: it started over). */
		if (ps->lay)
			r = checkpoint_restore_upto(ps->c->train.checkpoint_dir, (long)step, ps->lay, 1,
						    sh->range.begin, sh->range.end, sh->params, sh->opt.m,
						    sh->opt.v, &t, &got, NULL, e, sizeof(e));
		if (!ps->lay || r == -ENOENT)
			init = 1, r = 0;
		step = init ? 0 : (uint64_t)got;
	} else if (!init && !ps->lay) {
		r = err_set(e, sizeof(e), -ENOENT, "checkpoints are off (checkpoint_dir is empty)");
	} else if (!init) {
		char dir[DATA_PATH_MAX + 32];
		snprintf(dir, sizeof(dir), "%s/step-%08llu", ps->c->train.checkpoint_dir,
			 (unsigned long long)step);
		r = checkpoint_load(dir, ps->lay, 1, sh->range.begin, sh->range.end, sh->params, sh->opt.m,
				    sh->opt.v, &t, &got, e, sizeof(e));
		if (!r && (uint64_t)got != step)
			r = err_set(e, sizeof(e), -EINVAL, "%s holds step %ld", dir, got);
	}
	if (init) {
		model_init_params(&ps->s->m, sh->params, sh->range.begin, sh->range.end, ps->c->train.seed);
		if (sh->opt.m)
			memset(sh->opt.m, 0, sh->n * sizeof(float));
		if (sh->opt.v)
			memset(sh->opt.v, 0, sh->n * sizeof(float));
	}
	if (r) {
		ps->aborted = 1;
		snprintf(ps->why, sizeof(ps->why), "cannot roll back to step %llu: %.300s",
			 (unsigned long long)step, e);
	} else {
		sh->opt.t = t;
		psshard_rewind(sh, step);
		ps->pending = 0;
		ps->gen++;
		/* Copies not written yet are of the history just abandoned. */
		for (int i = 0; i < ps->qlen; i++)
			logf_(ps->out, "ps %d: checkpoint at step %llu not written: rolled back", ps->index,
			      (unsigned long long)ps->q[i].step);
		ps_queue_clear(ps);
	}
	pthread_cond_broadcast(&ps->cv);
	pthread_mutex_unlock(&ps->mu);
	if (r)
		logf_(ps->out, "ps %d: %s", ps->index, ps->why);
	else
		logf_(ps->out, "ps %d: rolled back from version %llu to step %llu, where a restarted ps resumed",
		      ps->index, (unsigned long long)v, (unsigned long long)step);
}

/* A HEARTBEAT for a worker waiting on a sync PULL: which workers' gradients
 * for the shard's version have not arrived (under ps->mu). */
static void ps_heartbeat(struct ps *ps, struct msg_heartbeat *hb)
{
	memset(hb, 0, sizeof(*hb));
	hb->version = psshard_version(&ps->sh);
	for (int w = 0; w < ps->W && w < (int)MSG_HEARTBEAT_WORKERS; w++)
		if (!psshard_has_pushed(&ps->sh, w) && !ps->done[w])
			hb->missing[w / 8] |= (uint8_t)(1u << (w % 8));
}

struct conn {
	struct ps *ps;
	int slot;
	int fd;
	int pushed; /* a whole gradient arrived on this connection */
	char peer[SOCK_ADDR_STRLEN];
	struct pipe pp; /* the chunks of a tensor, sealed/opened on ps->pool */
};

static int send_msg(int fd, struct frame_key *tx, uint8_t *wbuf, size_t len, int timeout_ms, char *err,
		    size_t errlen)
{
	return sock_write_frame(fd, tx, wbuf, WBUF_BYTES, wbuf + FRAME_HDR_BYTES, len, timeout_ms, err,
				errlen);
}

static void send_error(int fd, struct frame_key *tx, uint8_t *wbuf, uint32_t code,
		       const char *text, int timeout_ms)
{
	char e[128];
	size_t len;
	if (msg_encode_error(wbuf + FRAME_HDR_BYTES, WBUF_BYTES - FRAME_HDR_BYTES - FRAME_TAG_BYTES,
			     code, text, &len, e, sizeof(e)) == 0)
		(void)!send_msg(fd, tx, wbuf, len, timeout_ms, e, sizeof(e));
}

/* A tensor's chunk messages for pipe_send (PARAMS from a ps, PUSH from a
 * worker): message i is chunk i of src. */
struct chunk_tx {
	uint8_t type;
	uint32_t shard, worker;
	uint64_t version;
	const float *src; /* (n) */
	uint64_t n;
};

static int chunk_encode(void *ctx, uint64_t i, uint8_t *msg, size_t cap, size_t *len,
			char *err, size_t errlen)
{
	const struct chunk_tx *t = ctx;
	struct msg_chunk ch = { .type = t->type, .shard = t->shard, .version = t->version,
				.worker = t->worker };
	msg_chunk_range(t->n, i, &ch.offset, &ch.count);
	return msg_encode_chunk(msg, cap, &ch, t->src + ch.offset, len, err, errlen);
}

/* The chunks of a tensor being received, for pipe_recv: each message must
 * be a chunk of type `type` (from worker `worker` for PUSH) that fits a.
 * An ERROR from a ps is reported with its text. bad: the failure was in a
 * message, not in the frames carrying it. */
struct chunk_rx {
	uint8_t type;
	uint32_t worker;
	struct msg_assembly *a;
	float *dst; /* (a->n) */
	int bad;
};

static int chunk_deliver(void *ctx, uint64_t i, const uint8_t *msg, size_t len, char *err,
			 size_t errlen)
{
	struct chunk_rx *x = ctx;
	struct msg_chunk ch;
	struct msg_error me;
	(void)i;
	x->bad = 1;
	int r = msg_type(msg, len, err, errlen);
	if (r == WIRE_ERROR && x->type == WIRE_PARAMS)
		return msg_decode_error(msg, len, &me, err, errlen) ? -EPROTO
			: err_set(err, errlen, -ECONNABORTED, "%s", me.text);
	if (r < 0)
		return r;
	if (r != x->type)
		return err_set(err, errlen, -EPROTO, "unexpected %s message in a %s tensor",
			       wire_msg_name((uint8_t)r), wire_msg_name(x->type));
	r = msg_decode_chunk(msg, len, &ch, err, errlen);
	if (r < 0)
		return r;
	if (x->type == WIRE_PUSH && ch.worker != x->worker)
		return err_set(err, errlen, -EPROTO, "PUSH names worker %u on worker %u's connection",
			       ch.worker, x->worker);
	r = msg_assembly_add(x->a, &ch, x->dst, err, errlen);
	if (r < 0)
		return r;
	x->bad = 0;
	return 0;
}

/* Serves one authenticated worker until it leaves. Returns 0 when it said
 * DONE (or left after DONE), else -1 with the reason in err. */
static int ps_serve(struct conn *cn, struct hs_result *hr, uint8_t *rbuf, uint8_t *wbuf,
		    float *grad, float *snap, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	size_t n = ps->sh.n;
	size_t cap = WBUF_BYTES - FRAME_HDR_BYTES - FRAME_TAG_BYTES;
	uint8_t *mb = wbuf + FRAME_HDR_BYTES;
	int w = (int)hr->peer.index;
	struct msg_assembly a;
	int assembling = 0;
	int said_done = 0, first_pull = 1;
	char e[320];

	for (;;) {
		size_t len;
		/* After DONE too: a finished worker polls STATUS every 100 ms
		 * until it leaves, so silence means it is stuck. */
		int r = sock_read_frame(cn->fd, &hr->recv, rbuf, RBUF_BYTES, &len, peer_timeout_ms(ps->c), e,
					sizeof(e));
		if (r) {
			if (said_done)
				return 0;
			if (r == -ETIMEDOUT)
				snprintf(err, errlen, "no traffic for %g s (peer_timeout)",
					 ps->c->cluster.peer_timeout);
			else
				snprintf(err, errlen, "%s", e);
			return -1;
		}
		r = msg_type(rbuf, len, e, sizeof(e));
		if (r < 0) {
			snprintf(err, errlen, "%s", e);
			return -1;
		}
		if (r == WIRE_PULL) {
			struct msg_pull p;
			if (msg_decode_pull(rbuf, len, &p, e, sizeof(e)))
				return snprintf(err, errlen, "%s", e), -1;
			if (p.shard != (uint32_t)ps->index)
				return snprintf(err, errlen, "PULL for shard %u, this is shard %d",
						p.shard, ps->index), -1;
			/* A worker that said DONE pulls again (on this connection
			 * or, after reconnecting, on a new one) only to train again
			 * after a rollback while it waited for the run to complete,
			 * or to see where the shards are: it is not done until it
			 * says DONE again. */
			said_done = 0;
			if (first_pull && ps->first_pull_delay_ms)
				nap_ms(ps->first_pull_delay_ms);
			first_pull = 0;
			pthread_mutex_lock(&ps->mu);
			if (ps->done[w]) {
				ps->done[w] = 0;
				ps->ndone--;
			}
			ps->leaving[w] = 0;
			pthread_mutex_unlock(&ps->mu);
			/* A sync PULL waits for the version to exist; meanwhile a
			 * HEARTBEAT every heartbeat_ms tells the worker that the
			 * shard is alive and which workers it waits for. */
			pthread_mutex_lock(&ps->mu);
			uint64_t gen = ps->gen;
			while (p.version != MSG_VERSION_LATEST && psshard_version(&ps->sh) < p.version &&
			       !ps->aborted && ps->ndone < ps->W - 1 && ps->gen == gen) {
				struct timespec dl;
				clock_gettime(CLOCK_REALTIME, &dl);
				long ms = heartbeat_ms(ps->c);
				dl.tv_sec += ms / 1000;
				dl.tv_nsec += (ms % 1000) * 1000000L;
				if (dl.tv_nsec >= 1000000000L) {
					dl.tv_sec++;
					dl.tv_nsec -= 1000000000L;
				}
				if (pthread_cond_timedwait(&ps->cv, &ps->mu, &dl) != ETIMEDOUT)
					continue;
				if (psshard_version(&ps->sh) >= p.version || ps->aborted || ps->gen != gen)
					continue;
				struct msg_heartbeat hb;
				ps_heartbeat(ps, &hb);
				pthread_mutex_unlock(&ps->mu);
				r = msg_encode_heartbeat(mb, cap, &hb, &len, e, sizeof(e));
				if (!r)
					r = send_msg(cn->fd, &hr->send, wbuf, len, write_timeout_ms(ps->c), e,
						     sizeof(e));
				if (r)
					return snprintf(err, errlen, "%s", e), -1;
				pthread_mutex_lock(&ps->mu);
			}
			int ab = ps->aborted;
			uint64_t v = psshard_version(&ps->sh);
			if (!ab)
				memcpy(snap, psshard_params(&ps->sh), n * sizeof(float));
			char why[WIRE_ERROR_TEXT_MAX + 1];
			snprintf(why, sizeof(why), "ps %d stops: %.200s", ps->index, ps->why);
			pthread_mutex_unlock(&ps->mu);
			if (ab) {
				send_error(cn->fd, &hr->send, wbuf, ECONNABORTED, why, write_timeout_ms(ps->c));
				snprintf(err, errlen, "training aborted");
				return 0;
			}
			struct chunk_tx t = { .type = WIRE_PARAMS, .shard = (uint32_t)ps->index,
					      .version = v, .src = snap, .n = n };
			if (pipe_send(&cn->pp, cn->fd, &hr->send, msg_chunks(n), chunk_encode, &t,
				      write_timeout_ms(ps->c), e, sizeof(e)))
				return snprintf(err, errlen, "%s", e), -1;
		} else if (r == WIRE_PUSH || r == WIRE_PARAMS) {
			struct msg_chunk ch;
			if (msg_decode_chunk(rbuf, len, &ch, e, sizeof(e)))
				return snprintf(err, errlen, "%s", e), -1;
			if (ch.worker != (uint32_t)w)
				return snprintf(err, errlen, "PUSH names worker %u on worker %d's connection",
						ch.worker, w), -1;
			if (!assembling) {
				if (msg_assembly_init(&a, WIRE_PUSH, (uint32_t)ps->index, n, e, sizeof(e)))
					return snprintf(err, errlen, "%s", e), -1;
				assembling = 1;
			}
			r = msg_assembly_add(&a, &ch, grad, e, sizeof(e));
			if (r < 0)
				return snprintf(err, errlen, "%s", e), -1;
			if (r == 0) {
				/* The rest of the tensor: as many frames as full
				 * chunks can complete it, opened on the pool. */
				struct chunk_rx x = { .type = WIRE_PUSH, .worker = (uint32_t)w, .a = &a,
						      .dst = grad };
				uint64_t more = msg_chunks(n - a.received);
				if (pipe_recv(&cn->pp, cn->fd, &hr->recv, more, chunk_deliver, &x,
					      peer_timeout_ms(ps->c), e, sizeof(e)))
					return snprintf(err, errlen, "%s", e), -1;
				if (!msg_assembly_done(&a))
					continue;
			}
			assembling = 0;
			cn->pushed = 1;
			enum psshard_outcome oc = PSSHARD_STALE;
			pthread_mutex_lock(&ps->mu);
			r = psshard_push(&ps->sh, w, a.version, grad, &oc);
			uint64_t v = psshard_version(&ps->sh);
			if (ps->pending && v == ps->pending) {
				ps_save(ps, v);
				ps->pending = 0;
			}
			pthread_cond_broadcast(&ps->cv);
			pthread_mutex_unlock(&ps->mu);
			struct msg_ack ack = { .shard = (uint32_t)ps->index, .version = v };
			if (r == -EALREADY)
				ack.status = MSG_ACK_DUPLICATE;
			else if (r)
				return snprintf(err, errlen, "PUSH for version %llu refused: %s",
						(unsigned long long)a.version, strerror(-r)), -1;
			else
				ack.status = oc == PSSHARD_APPLIED	? MSG_ACK_APPLIED
					     : oc == PSSHARD_WAITING ? MSG_ACK_ACCEPTED
								     : MSG_ACK_STALE;
			if (msg_encode_ack(mb, cap, &ack, &len, e, sizeof(e)) ||
			    send_msg(cn->fd, &hr->send, wbuf, len, write_timeout_ms(ps->c), e, sizeof(e)))
				return snprintf(err, errlen, "%s", e), -1;
		} else if (r == WIRE_CHECKPOINT) {
			struct msg_checkpoint ck;
			if (msg_decode_checkpoint(rbuf, len, &ck, e, sizeof(e)))
				return snprintf(err, errlen, "%s", e), -1;
			if (w != 0)
				return snprintf(err, errlen, "CHECKPOINT from worker %d; only the chief (0) sends it", w), -1;
			ps_checkpoint(ps, ck.step);
		} else if (r == WIRE_ROLLBACK) {
			struct msg_rollback rb;
			if (msg_decode_rollback(rbuf, len, &rb, e, sizeof(e)))
				return snprintf(err, errlen, "%s", e), -1;
			ps_rollback(ps, rb.step);
		} else if (r == WIRE_HEARTBEAT) {
			struct msg_heartbeat hb;
			if (msg_decode_heartbeat(rbuf, len, &hb, e, sizeof(e)))
				return snprintf(err, errlen, "%s", e), -1;
		} else if (r == WIRE_STATUS) {
			/* A finished worker asking whether the run is complete:
			 * the chief has said DONE, after its final checkpoint
			 * and evaluation. */
			struct msg_status q;
			if (msg_decode_status(rbuf, len, &q, e, sizeof(e)))
				return snprintf(err, errlen, "%s", e), -1;
			if (q.reply || q.shard != (uint32_t)ps->index)
				return snprintf(err, errlen, "STATUS %s for shard %u, this is shard %d",
						q.reply ? "reply" : "request", q.shard, ps->index), -1;
			pthread_mutex_lock(&ps->mu);
			struct msg_status ans = { .reply = 1, .shard = (uint32_t)ps->index,
						  .version = psshard_version(&ps->sh),
						  .applied = ps->sh.received - ps->sh.dropped_stale,
						  .stale = ps->sh.dropped_stale,
						  .complete = ps->done[0] };
			pthread_mutex_unlock(&ps->mu);
			if (msg_encode_status(mb, cap, &ans, &len, e, sizeof(e)) ||
			    send_msg(cn->fd, &hr->send, wbuf, len, write_timeout_ms(ps->c), e, sizeof(e)))
				return snprintf(err, errlen, "%s", e), -1;
		} else if (r == WIRE_DONE) {
			struct msg_done d;
			if (msg_decode_done(rbuf, len, &d, e, sizeof(e)))
				return snprintf(err, errlen, "%s", e), -1;
			if (d.worker != (uint32_t)w)
				return snprintf(err, errlen, "DONE names worker %u on worker %d's connection",
						d.worker, w), -1;
			pthread_mutex_lock(&ps->mu);
			if (!ps->done[w]) {
				ps->done[w] = 1;
				ps->ndone++;
			}
			ps->leaving[w] |= d.leaving;
			pthread_cond_broadcast(&ps->cv);
			pthread_mutex_unlock(&ps->mu);
			said_done = 1;
		} else if (r == WIRE_ERROR) {
			struct msg_error me;
			if (msg_decode_error(rbuf, len, &me, e, sizeof(e)))
				return snprintf(err, errlen, "%s", e), -1;
			return snprintf(err, errlen, "it reported: %s", me.text), -1;
		} else {
			return snprintf(err, errlen, "unexpected %s message", wire_msg_name((uint8_t)r)), -1;
		}
	}
}

static void *ps_conn(void *arg)
{
	struct conn *cn = arg;
	struct ps *ps = cn->ps;
	uint8_t hello1[HS_HELLO_BYTES], hello2[HS_HELLO_BYTES];
	struct hs_result hr;
	size_t outlen = 0;
	char e[320];
	uint8_t *rbuf = malloc(RBUF_BYTES), *wbuf = malloc(WBUF_BYTES);
	float *grad = malloc(ps->sh.n * sizeof(float)), *snap = malloc(ps->sh.n * sizeof(float));

	if (!rbuf || !wbuf || !grad || !snap ||
	    pipe_init(&cn->pp, ps->pool, wbuf, WBUF_BYTES, NULL, 0)) {
		logf_(ps->out, "ps %d: %s: out of memory for a connection", ps->index, cn->peer);
		goto out;
	}
	int r = sock_read_full(cn->fd, hello1, sizeof(hello1), HS_TIMEOUT_MS, e, sizeof(e));
	if (r) {
		logf_(ps->out, "ps %d: %s: no handshake: %s", ps->index, cn->peer, e);
		goto out;
	}
	r = hs_server_respond(&hr, hello2, &outlen, ps->s->key, &ps->me, hello1, sizeof(hello1), e,
			      sizeof(e));
	if (outlen)
		(void)!sock_write_full(cn->fd, hello2, outlen, HS_TIMEOUT_MS, NULL, 0);
	if (r) {
		logf_(ps->out, "ps %d: %s: handshake refused: %s", ps->index, cn->peer, e);
		goto out;
	}
	if (hr.peer.role != HS_WORKER || hr.peer.index >= (uint32_t)ps->W) {
		logf_(ps->out, "ps %d: %s: refused %s %u (this cluster has %d workers)", ps->index,
		      cn->peer, hs_role_name(hr.peer.role), hr.peer.index, ps->W);
		goto out;
	}
	char why[512];
	uint32_t w = hr.peer.index;
	pthread_mutex_lock(&ps->mu);
	ps->live[w]++;
	ps->lost[w].tv_sec = 0;
	pthread_mutex_unlock(&ps->mu);
	r = ps_serve(cn, &hr, rbuf, wbuf, grad, snap, e, sizeof(e));
	pthread_mutex_lock(&ps->mu);
	ps->live[w]--;
	int done = ps->done[w], ab = ps->aborted, others = ps->live[w];
	/* Finished but gone before seeing the run complete: reconnecting
	 * (another ps was lost), or dead. The run is not over for this ps
	 * until it comes back and leaves, or peer_timeout passes. */
	int away = done && !ps->leaving[w] && !others && !ab;
	if (away) {
		clock_gettime(CLOCK_MONOTONIC, &ps->lost[w]);
		ps->lost[w].tv_sec += (time_t)ps->c->cluster.peer_timeout;
	}
	pthread_mutex_unlock(&ps->mu);
	if (away)
		logf_(ps->out, "ps %d: %s: worker %u, which had finished, closed its connection before the run was complete; waiting up to %g s for it to connect again",
		      ps->index, cn->peer, w, ps->c->cluster.peer_timeout);
	if (r && !done && !ab) {
		/* A lost worker (killed, crashed, or a peer holding the key that
		 * sent a bad frame) does not end training: async workers carry on,
		 * sync steps go on while replicas_to_aggregate workers remain and
		 * otherwise wait. Restarted with the same command, the worker
		 * rejoins at the current version (a gradient it had pushed for
		 * that version stays counted; pushing it again is a duplicate).
		 * Only if it does not come back within peer_timeout does the ps
		 * give up. */
		snprintf(why, sizeof(why), "lost worker %u (%s): %s", w, cn->peer, e);
		pthread_mutex_lock(&ps->mu);
		if (!others) {
			clock_gettime(CLOCK_MONOTONIC, &ps->lost[w]);
			ps->lost[w].tv_sec += (time_t)ps->c->cluster.peer_timeout;
			snprintf(ps->lost_why, sizeof(ps->lost_why), "%s", why);
		}
		pthread_mutex_unlock(&ps->mu);
		logf_(ps->out, "ps %d: %s: closed worker %u's connection: %s; %s, waiting up to %g s for it to connect again",
		      ps->index, cn->peer, w, e, cn->pushed ? "it had trained" : "it had not pushed yet",
		      ps->c->cluster.peer_timeout);
	}
	frame_key_wipe(&hr.send);
	frame_key_wipe(&hr.recv);
out:
	pipe_free(&cn->pp);
	free(rbuf);
	free(wbuf);
	free(grad);
	free(snap);
	pthread_mutex_lock(&ps->mu);
	close(cn->fd);
	ps->fds[cn->slot] = -1;
	ps->nconn--;
	pthread_cond_broadcast(&ps->cv);
	pthread_mutex_unlock(&ps->mu);
	free(cn);
	return NULL;
}

/* The ps's checkpoint layout, and its shard from the newest complete
 * checkpoint unless fresh; the shard's version becomes the checkpoint's
 * step (async: its label, the same on every shard). */
static int ps_resume(struct ps *ps, const struct setup *s, int fresh, char *err, size_t errlen)
{
	const struct config *c = ps->c;
	if (!c->train.checkpoint_dir[0])
		return 0;
	ps->lay = malloc(sizeof(*ps->lay));
	if (!ps->lay)
		return err_set(err, errlen, -ENOMEM, "out of memory");
	int e = ckpt_layout_init_cluster(ps->lay, &s->m, c->cluster.nps, c, err, errlen);
	if (e || fresh)
		return e;
	long t = 0, step = 0;
	flockfile(ps->out);
	e = checkpoint_restore(c->train.checkpoint_dir, ps->lay, 1, ps->sh.range.begin, ps->sh.range.end,
			       ps->sh.params, ps->sh.opt.m, ps->sh.opt.v, &t, &step, ps->out, err, errlen);
	funlockfile(ps->out);
	if (e == -ENOENT)
		return 0;
	if (e)
		return e;
	ps->sh.version = (uint64_t)step;
	ps->sh.applied = (uint64_t)step;
	ps->sh.opt.t = t;
	logf_(ps->out, "ps %d: resuming from %s/step-%08ld", ps->index, c->train.checkpoint_dir, step);
	return 0;
}

int cluster_ps(const struct config *c, int index, int fresh, FILE *out,
	       const volatile sig_atomic_t *stop, char *err, size_t errlen)
{
	struct setup s;
	struct ps *ps = calloc(1, sizeof(*ps));
	struct shard plan[CONFIG_MAX_HOSTS];
	int lfd = -1, e;

	memset(&s, 0, sizeof(s));
	if (!ps)
		return snprintf(err, errlen, "out of memory"), -ENOMEM;
	e = setup_load(&s, c, 0, err, errlen);
	if (e)
		goto out0;
	e = shard_check(c->cluster.nps, s.m.nparams, err, errlen);
	if (e)
		goto out0;
	shard_plan(plan, c->cluster.nps, s.m.nparams);
	long total = c->train.mode == MODE_ASYNC ? s.total * c->cluster.nworkers : s.total;
	e = psshard_init(&ps->sh, &s.m, &plan[index], c, total, err, errlen);
	if (e)
		goto out1;
	pthread_mutex_init(&ps->mu, NULL);
	pthread_cond_init(&ps->cv, NULL);
	pthread_cond_init(&ps->wcv, NULL);
	ps->s = &s;
	ps->out = out;
	ps->index = index;
	ps->c = c;
	/* Test hook: answer each connection's first PULL this much later, as a
	 * starved thread would. */
	const char *fpd = getenv("PSTRAIN_FIRST_PULL_DELAY_MS");
	ps->first_pull_delay_ms = fpd ? atol(fpd) : 0;
	e = ps_resume(ps, &s, fresh, err, errlen);
	if (e)
		goto out2;
	if (ps->lay) {
		int keep = c->train.keep_checkpoints;
		ps->qcap = keep < 1 ? 1 : keep > CKPT_QUEUE_MAX ? CKPT_QUEUE_MAX : keep;
		ps->writer_on = pthread_create(&ps->writer, NULL, ps_writer, ps) == 0;
		if (!ps->writer_on) {
			e = err_set(err, errlen, -ENOMEM, "cannot start the checkpoint writer thread");
			goto out2;
		}
	}
	ps->W = c->cluster.nworkers;
	ps->me = (struct hs_identity){ .role = HS_PS, .index = (uint32_t)index,
				       .aes = frame_aes_available() };
	memcpy(ps->me.config_hash, s.hash, HS_HASH_BYTES);
	for (int i = 0; i < PS_MAX_CONN; i++)
		ps->fds[i] = -1;
	int ct = cryptopool_threads_for(c->cluster.crypto_threads);
	if (ct > 1 && (e = cryptopool_new(&ps->pool, ct, err, errlen)))
		goto out2;

	const struct host *h = &c->cluster.ps[index];
	e = sock_listen(h->name, h->port, 0, &lfd, err, errlen);
	if (e) {
		e = e == -ENOMEM ? e : -EINVAL;
		goto out2;
	}
	logf_(out, "ps %d: listening on %s:%u, shard [%zu, %zu) of %zu parameters, %s mode, %ld steps, waiting for %d worker%s",
	      index, h->name, h->port, plan[index].begin, plan[index].end, s.m.nparams,
	      c->train.mode == MODE_SYNC ? "sync" : "async", s.total, ps->W, ps->W == 1 ? "" : "s");

	for (;;) {
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		pthread_mutex_lock(&ps->mu);
		for (int w = 0; w < ps->W && !ps->aborted; w++)
			if (ps->lost[w].tv_sec && !ps->live[w] && !ps->done[w] &&
			    now.tv_sec >= ps->lost[w].tv_sec) {
				ps->aborted = 1;
				snprintf(ps->why, sizeof(ps->why), "%s", ps->lost_why);
				logf_(out, "ps %d: worker %d did not come back within peer_timeout (%g s)", index, w,
				      c->cluster.peer_timeout);
				pthread_cond_broadcast(&ps->cv);
			}
		/* Finished: every worker has said DONE and, having seen the
		 * run complete, left (or stayed away for peer_timeout). */
		int finished = ps->ndone == ps->W, ab = ps->aborted;
		for (int w = 0; w < ps->W && finished; w++)
			if (!ps->leaving[w] && (ps->live[w] || !ps->lost[w].tv_sec || now.tv_sec < ps->lost[w].tv_sec))
				finished = 0;
		pthread_mutex_unlock(&ps->mu);
		if (finished || ab || *stop)
			break;
		int fd;
		char peer[SOCK_ADDR_STRLEN] = "?", ae[256];
		int r = sock_accept(lfd, 200, &fd, peer, sizeof(peer), ae, sizeof(ae));
		if (r == -ETIMEDOUT || r == -EAGAIN || r == -EINTR)
			continue;
		if (r) {
			logf_(out, "ps %d: accept: %s", index, ae);
			continue;
		}
		pthread_mutex_lock(&ps->mu);
		int slot = -1;
		for (int i = 0; i < PS_MAX_CONN && slot < 0; i++)
			if (ps->fds[i] < 0)
				slot = i;
		struct conn *cn = slot < 0 ? NULL : malloc(sizeof(*cn));
		pthread_t t;
		pthread_attr_t at;
		int ok = 0;
		if (cn) {
			*cn = (struct conn){ .ps = ps, .slot = slot, .fd = fd };
			snprintf(cn->peer, sizeof(cn->peer), "%s", peer);
			pthread_attr_init(&at);
			pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
			ok = pthread_create(&t, &at, ps_conn, cn) == 0;
			pthread_attr_destroy(&at);
			if (ok) {
				ps->fds[slot] = fd;
				ps->nconn++;
			}
		}
		pthread_mutex_unlock(&ps->mu);
		if (!ok) {
			logf_(out, "ps %d: %s: refused: too many connections", index, peer);
			close(fd);
			free(cn);
		}
	}
	close(lfd);

	/* End every connection still open (workers close theirs once a STATUS
	 * says the run is complete: they poll every 100 ms, so this normally
	 * takes a moment; a stuck one gets peer_timeout), then wait for their
	 * threads before freeing what they use. */
	pthread_mutex_lock(&ps->mu);
	ps->aborted |= *stop ? 1 : 0;
	if (*stop && !ps->why[0])
		snprintf(ps->why, sizeof(ps->why), "interrupted");
	pthread_cond_broadcast(&ps->cv);
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += ps->ndone == ps->W && !*stop ? (time_t)c->cluster.peer_timeout + 1 : 2;
	while (ps->nconn > 0 && pthread_cond_timedwait(&ps->cv, &ps->mu, &dl) == 0)
		;
	for (int i = 0; i < PS_MAX_CONN; i++)
		if (ps->fds[i] >= 0)
			shutdown(ps->fds[i], SHUT_RDWR);
	while (ps->nconn > 0)
		pthread_cond_wait(&ps->cv, &ps->mu);
	pthread_mutex_unlock(&ps->mu);

	if (*stop) {
		snprintf(err, errlen, "ps %d: interrupted at version %llu", index,
			 (unsigned long long)psshard_version(&ps->sh));
		e = -EINTR;
	} else if (ps->ndone < ps->W) {
		snprintf(err, errlen, "ps %d: %s", index, ps->why);
		e = -ECONNABORTED;
	} else {
		logf_(out, "ps %d: all %d workers done: version %llu, %llu gradients applied, %llu dropped as stale",
		      index, ps->W, (unsigned long long)psshard_version(&ps->sh),
		      (unsigned long long)ps->sh.received - ps->sh.dropped_stale,
		      (unsigned long long)ps->sh.dropped_stale);
		e = 0;
	}
out2:
	if (ps->writer_on) {
		/* The last checkpoint asked for is written before the ps exits. */
		pthread_mutex_lock(&ps->mu);
		ps->wstop = 1;
		pthread_cond_signal(&ps->wcv);
		pthread_mutex_unlock(&ps->mu);
		pthread_join(ps->writer, NULL);
	}
	ps_queue_clear(ps);
	cryptopool_destroy(ps->pool); /* every connection thread has ended */
	free(ps->lay);
	pthread_mutex_destroy(&ps->mu);
	pthread_cond_destroy(&ps->cv);
	pthread_cond_destroy(&ps->wcv);
out1:
	psshard_free(&ps->sh);
out0:
	setup_free(&s);
	free(ps);
	return e;
}

/* ---- worker -------------------------------------------------------------- */

struct link {
	int fd;
	struct hs_result hr;
	struct shard range;
	uint64_t got;        /* version of the parameters last pulled */
	pthread_mutex_t mu;  /* fd and hr.send: the heartbeat thread sends too */
	double last_send;    /* progress_now() when the last frame went out */
};

struct worker {
	const struct config *c;
	const struct setup *s;
	const volatile sig_atomic_t *stop;
	FILE *out;
	struct progress *pg;     /* the chief's: "waiting for worker N" lines */
	int index, nps;
	struct link *ln;
	uint8_t *rbuf, *wbuf;
	struct cryptopool *pool; /* NULL: crypto_threads 1 */
	struct pipe pp;          /* tensors, one ps at a time; frame 0 is wbuf */
	uint64_t stale;   /* pushes the shards dropped */
	int lost;         /* the ps whose connection failed or went back; -1: none */
	uint64_t heard_v; /* the last "waiting for" line printed: version, workers */
	uint8_t heard[MSG_HEARTBEAT_WORKERS / 8];
	pthread_t hb;     /* sends HEARTBEATs on idle links */
	int hb_on, hb_stop;
	pthread_mutex_t hb_mu;
	pthread_cond_t hb_cv;
};

static const char *ps_name(const struct config *c, int k, char *buf, size_t len)
{
	snprintf(buf, len, "ps %d (%s:%u)", k, c->cluster.ps[k].name, c->cluster.ps[k].port);
	return buf;
}

/* The heartbeat thread: every half heartbeat period, a HEARTBEAT on each
 * link that has sent nothing for a period, so that a ps does not take a
 * worker that is computing, evaluating or waiting on another shard for a
 * dead one. A failed send is left for the main thread to find. */
static void *worker_heartbeats(void *arg)
{
	struct worker *wk = arg;
	uint8_t buf[FRAME_SEALED_BYTES(MSG_HEARTBEAT_BYTES)];
	int ms = heartbeat_ms(wk->c);
	struct msg_heartbeat hb;
	memset(&hb, 0, sizeof(hb));
	pthread_mutex_lock(&wk->hb_mu);
	while (!wk->hb_stop) {
		struct timespec dl;
		clock_gettime(CLOCK_REALTIME, &dl);
		long ns = dl.tv_nsec + (long)(ms / 2) * 1000000L;
		dl.tv_sec += ns / 1000000000L;
		dl.tv_nsec = ns % 1000000000L;
		pthread_cond_timedwait(&wk->hb_cv, &wk->hb_mu, &dl);
		if (wk->hb_stop)
			break;
		pthread_mutex_unlock(&wk->hb_mu);
		for (int k = 0; k < wk->nps; k++) {
			struct link *l = &wk->ln[k];
			size_t len;
			pthread_mutex_lock(&l->mu);
			double now = progress_now();
			if (l->fd >= 0 && now - l->last_send >= ms / 1000.0 &&
			    msg_encode_heartbeat(buf + FRAME_HDR_BYTES, MSG_HEARTBEAT_BYTES, &hb, &len, NULL, 0) == 0) {
				(void)!sock_write_frame(l->fd, &l->hr.send, buf, sizeof(buf), buf + FRAME_HDR_BYTES,
							len, ms, NULL, 0);
				l->last_send = now;
			}
			pthread_mutex_unlock(&l->mu);
		}
		pthread_mutex_lock(&wk->hb_mu);
	}
	pthread_mutex_unlock(&wk->hb_mu);
	return NULL;
}

static void worker_disconnect(struct worker *wk)
{
	for (int k = 0; wk->ln && k < wk->nps; k++) {
		struct link *l = &wk->ln[k];
		pthread_mutex_lock(&l->mu);
		if (l->fd >= 0)
			close(l->fd);
		l->fd = -1;
		frame_key_wipe(&l->hr.send);
		frame_key_wipe(&l->hr.recv);
		pthread_mutex_unlock(&l->mu);
	}
}

/* Connects and authenticates to ps k, retrying with backoff for up to
 * timeout_ms. -EINVAL for an address that cannot work, else -ECONNABORTED. */
static int worker_connect_one(struct worker *wk, int k, int timeout_ms, char *err, size_t errlen)
{
	const struct config *c = wk->c;
	struct hs_identity me = { .role = HS_WORKER, .index = (uint32_t)wk->index,
				  .aes = frame_aes_available() };
	memcpy(me.config_hash, wk->s->hash, HS_HASH_BYTES);
	struct link *l = &wk->ln[k];
	char e[512], nm[300];
	uint8_t hello1[HS_HELLO_BYTES], hello2[HS_HELLO_BYTES];
	struct hs h;
	struct hs_result hr;
	int fd = -1;
	int hs_ms = timeout_ms < HS_TIMEOUT_MS ? timeout_ms : HS_TIMEOUT_MS;
	ps_name(c, k, nm, sizeof(nm));
	int r = sock_connect_retry(c->cluster.ps[k].name, c->cluster.ps[k].port, timeout_ms, &fd, e,
				   sizeof(e));
	if (r)
		return r == -EINVAL || r == -ENOENT ? (snprintf(err, errlen, "ps %d: %s", k, e), -EINVAL)
						    : err_set(err, errlen, -ECONNABORTED, "ps %d: %s", k, e);
	r = hs_client_start(&h, hello1, wk->s->key, &me, e, sizeof(e));
	if (r) {
		close(fd);
		return snprintf(err, errlen, "handshake: %s", e), r;
	}
	r = sock_write_full(fd, hello1, sizeof(hello1), hs_ms, e, sizeof(e));
	if (!r)
		r = sock_read_full(fd, hello2, sizeof(hello2), hs_ms, e, sizeof(e));
	if (r) {
		hs_wipe(&h);
		close(fd);
		return err_set(err, errlen, -ECONNABORTED, "%s: handshake: %s%s", nm, e,
			       r == -EPIPE ? " (wrong cluster key?)" : "");
	}
	r = hs_client_finish(&h, &hr, hello2, sizeof(hello2), e, sizeof(e));
	if (r) {
		hs_wipe(&h);
		close(fd);
		return err_set(err, errlen, -ECONNABORTED, "%s: %s", nm, e);
	}
	if (hr.peer.role != HS_PS || hr.peer.index != (uint32_t)k) {
		close(fd);
		return err_set(err, errlen, -ECONNABORTED, "%s answered as %s %u", nm,
			       hs_role_name(hr.peer.role), hr.peer.index);
	}
	pthread_mutex_lock(&l->mu);
	l->fd = fd;
	l->hr = hr;
	l->last_send = progress_now();
	pthread_mutex_unlock(&l->mu);
	return 0;
}

static int worker_connect(struct worker *wk, char *err, size_t errlen)
{
	for (int k = 0; k < wk->nps; k++) {
		int r = worker_connect_one(wk, k, (int)(wk->c->cluster.connect_timeout * 1000), err, errlen);
		if (r)
			return r;
	}
	return 0;
}

/* A HEARTBEAT from ps k while a sync PULL waits: the chief prints which
 * workers the shard is waiting for, once per version and set. */
static void worker_heard(struct worker *wk, int k, const struct msg_heartbeat *hb)
{
	int any = 0;
	for (size_t i = 0; i < sizeof(hb->missing); i++)
		any |= hb->missing[i];
	if (!wk->pg || !any ||
	    (hb->version == wk->heard_v && memcmp(hb->missing, wk->heard, sizeof(wk->heard)) == 0))
		return;
	wk->heard_v = hb->version;
	memcpy(wk->heard, hb->missing, sizeof(wk->heard));
	char list[200] = "";
	size_t at = 0;
	int n = 0;
	for (int w = 0; w < (int)MSG_HEARTBEAT_WORKERS; w++) {
		if (!(hb->missing[w / 8] >> (w % 8) & 1))
			continue;
		if (at < sizeof(list) - 16)
			at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%d", n ? ", " : "", w);
		else if (at < sizeof(list) - 4)
			at += (size_t)snprintf(list + at, sizeof(list) - at, ", ...");
		n++;
	}
	progress_clear(wk->pg);
	logf_(wk->out, "worker %d: step %llu is waiting for worker%s %s (ps %d has no gradient from %s yet)",
	      wk->index, (unsigned long long)hb->version, n == 1 ? "" : "s", list, k,
	      n == 1 ? "it" : "them");
}

/* A link failed at the transport level (not an ERROR the ps sent): the
 * caller may reconnect (worker_resync). */
static int worker_link_failed(struct worker *wk, int k, int r, const char *e, char *err, size_t errlen)
{
	char nm[300];
	wk->lost = k;
	if (r == -ETIMEDOUT)
		return err_set(err, errlen, -ECONNABORTED, "lost %s: no traffic for %g s (peer_timeout)",
			       ps_name(wk->c, k, nm, sizeof(nm)), wk->c->cluster.peer_timeout);
	return err_set(err, errlen, -ECONNABORTED, "lost %s: %s", ps_name(wk->c, k, nm, sizeof(nm)), e);
}

/* Reads one message from ps k into wk->rbuf, passing over HEARTBEATs; an
 * ERROR is reported. */
static int worker_recv(struct worker *wk, int k, size_t *len, char *err, size_t errlen)
{
	char e[512], nm[300];
	struct link *l = &wk->ln[k];
	for (;;) {
		int r = sock_read_frame(l->fd, &l->hr.recv, wk->rbuf, RBUF_BYTES, len,
					peer_timeout_ms(wk->c), e, sizeof(e));
		if (r)
			return worker_link_failed(wk, k, r, e, err, errlen);
		r = msg_type(wk->rbuf, *len, e, sizeof(e));
		if (r == WIRE_HEARTBEAT) {
			struct msg_heartbeat hb;
			if (msg_decode_heartbeat(wk->rbuf, *len, &hb, e, sizeof(e)) == 0) {
				worker_heard(wk, k, &hb);
				continue;
			}
			r = -EPROTO;
		}
		if (r == WIRE_ERROR) {
			struct msg_error me;
			if (msg_decode_error(wk->rbuf, *len, &me, e, sizeof(e)) == 0)
				snprintf(e, sizeof(e), "%s", me.text);
			return err_set(err, errlen, -ECONNABORTED, "%s: %s", ps_name(wk->c, k, nm, sizeof(nm)), e);
		}
		if (r < 0)
			return err_set(err, errlen, -ECONNABORTED, "%s: %s", ps_name(wk->c, k, nm, sizeof(nm)), e);
		return r;
	}
}

static int worker_send(struct worker *wk, int k, size_t len, char *err, size_t errlen)
{
	char e[512];
	struct link *l = &wk->ln[k];
	pthread_mutex_lock(&l->mu);
	int r = send_msg(l->fd, &l->hr.send, wk->wbuf, len, write_timeout_ms(wk->c), e, sizeof(e));
	l->last_send = progress_now();
	pthread_mutex_unlock(&l->mu);
	if (r)
		return worker_link_failed(wk, k, r, e, err, errlen);
	return 0;
}

/* Pulls every shard into params: sync asks each for the version after the
 * one it last had (first: 0, i.e. whatever it has), async for the newest.
 * A sync shard that answers with an older version than asked has been
 * rolled back: that is a lost link too (wk->lost), for worker_resync. */
static int worker_pull(struct worker *wk, float *params, int first, char *err, size_t errlen)
{
	uint8_t *mb = wk->wbuf + FRAME_HDR_BYTES;
	size_t cap = WBUF_BYTES - FRAME_HDR_BYTES - FRAME_TAG_BYTES, len;
	char e[256];
	uint64_t want[CONFIG_MAX_HOSTS];
	for (int k = 0; k < wk->nps; k++) {
		struct msg_pull p = { .shard = (uint32_t)k };
		if (wk->c->train.mode == MODE_ASYNC)
			p.version = MSG_VERSION_LATEST;
		else
			p.version = first ? 0 : wk->ln[k].got + 1;
		want[k] = p.version;
		if (msg_encode_pull(mb, cap, &p, &len, e, sizeof(e)))
			return snprintf(err, errlen, "%s", e), -EPROTO;
		int r = worker_send(wk, k, len, err, errlen);
		if (r)
			return r;
	}
	for (int k = 0; k < wk->nps; k++) {
		struct link *l = &wk->ln[k];
		struct msg_assembly a;
		if (msg_assembly_init(&a, WIRE_PARAMS, (uint32_t)k, l->range.end - l->range.begin, e,
				      sizeof(e)))
			return snprintf(err, errlen, "%s", e), -EINVAL;
		struct chunk_rx x = { .type = WIRE_PARAMS, .a = &a, .dst = params + l->range.begin };
		char pe[512], nm[300];
		/* The first chunk by hand, past any HEARTBEATs; the rest of
		 * the tensor on the pipe. */
		int r = worker_recv(wk, k, &len, err, errlen);
		if (r < 0)
			return r;
		if (chunk_deliver(&x, 0, wk->rbuf, len, pe, sizeof(pe)))
			return err_set(err, errlen, -ECONNABORTED, "%s: %s", ps_name(wk->c, k, nm, sizeof(nm)), pe);
		if (!msg_assembly_done(&a)) {
			r = pipe_recv(&wk->pp, l->fd, &l->hr.recv, msg_chunks(a.n - a.received), chunk_deliver,
				      &x, peer_timeout_ms(wk->c), pe, sizeof(pe));
			if (r && x.bad)
				return err_set(err, errlen, -ECONNABORTED, "%s: %s", ps_name(wk->c, k, nm, sizeof(nm)), pe);
			if (r)
				return worker_link_failed(wk, k, r, pe, err, errlen);
		}
		uint64_t had = l->got;
		l->got = a.version;
		/* Async: versions only grow, so a lower one means the shard was
		 * restarted or rolled back (worker_resync sees which). */
		if (wk->c->train.mode == MODE_ASYNC && !first && a.version < had) {
			wk->lost = k;
			return err_set(err, errlen, -ECONNABORTED, "%s went back to step %llu",
				       ps_name(wk->c, k, nm, sizeof(nm)), (unsigned long long)a.version);
		}
		if (wk->c->train.mode == MODE_SYNC && !first && a.version < want[k]) {
			wk->lost = k;
			return err_set(err, errlen, -ECONNABORTED, "%s went back to step %llu",
				       ps_name(wk->c, k, nm, sizeof(nm)), (unsigned long long)a.version);
		}
	}
	return 0;
}

static int worker_push(struct worker *wk, const float *grads, char *err, size_t errlen)
{
	size_t len;
	char e[256];
	for (int k = 0; k < wk->nps; k++) {
		struct link *l = &wk->ln[k];
		size_t n = l->range.end - l->range.begin;
		struct chunk_tx t = { .type = WIRE_PUSH, .shard = (uint32_t)k, .version = l->got,
				      .worker = (uint32_t)wk->index, .src = grads + l->range.begin,
				      .n = n };
		char pe[512];
		pthread_mutex_lock(&l->mu);
		int r = pipe_send(&wk->pp, l->fd, &l->hr.send, msg_chunks(n), chunk_encode, &t,
				  write_timeout_ms(wk->c), pe, sizeof(pe));
		l->last_send = progress_now();
		pthread_mutex_unlock(&l->mu);
		if (r)
			return worker_link_failed(wk, k, r, pe, err, errlen);
	}
	for (int k = 0; k < wk->nps; k++) {
		struct msg_ack ack;
		int r = worker_recv(wk, k, &len, err, errlen);
		if (r < 0)
			return r;
		if (r != WIRE_ACK || msg_decode_ack(wk->rbuf, len, &ack, e, sizeof(e)))
			return err_set(err, errlen, -ECONNABORTED, "ps %d: %s", k,
					 r != WIRE_ACK ? "unexpected message instead of ACK" : e);
		if (ack.status == MSG_ACK_STALE || ack.status == MSG_ACK_DUPLICATE)
			wk->stale++;
	}
	return 0;
}

/* Asks every ps to save its shard as of version `step`. */
static int worker_checkpoint(struct worker *wk, long step, char *err, size_t errlen)
{
	size_t cap = WBUF_BYTES - FRAME_HDR_BYTES - FRAME_TAG_BYTES, len;
	char e[256];
	struct msg_checkpoint ck = { .step = (uint64_t)step };
	for (int k = 0; k < wk->nps; k++) {
		if (msg_encode_checkpoint(wk->wbuf + FRAME_HDR_BYTES, cap, &ck, &len, e, sizeof(e)))
			return snprintf(err, errlen, "%s", e), -EPROTO;
		int r = worker_send(wk, k, len, err, errlen);
		if (r)
			return r;
	}
	return 0;
}

/* The step a checkpoint is saved as, just after pulling for `step`: sync,
 * that step (every shard is at it); async, ps 0's version as pulled, a
 * label all ps save under while each records its shard as it is. */
static long ckpt_label(const struct worker *wk, long step)
{
	return wk->c->train.mode == MODE_SYNC ? step : (long)wk->ln[0].got;
}

/* Tells every ps to restore checkpoint `step`. */
static int worker_rollback(struct worker *wk, uint64_t step, char *err, size_t errlen)
{
	size_t cap = WBUF_BYTES - FRAME_HDR_BYTES - FRAME_TAG_BYTES, len;
	char e[256];
	struct msg_rollback rb = { .step = step };
	for (int k = 0; k < wk->nps; k++) {
		if (msg_encode_rollback(wk->wbuf + FRAME_HDR_BYTES, cap, &rb, &len, e, sizeof(e)))
			return snprintf(err, errlen, "%s", e), -EPROTO;
		int r = worker_send(wk, k, len, err, errlen);
		if (r)
			return r;
	}
	return 0;
}

/* DONE to every ps: trained the last step (leaving 0), or, once every ps
 * has said the run is complete, closing (leaving 1). */
static int worker_done(struct worker *wk, int leaving, char *err, size_t errlen)
{
	size_t cap = WBUF_BYTES - FRAME_HDR_BYTES - FRAME_TAG_BYTES, len;
	char e[256];
	struct msg_done d = { .worker = (uint32_t)wk->index, .leaving = (uint8_t)leaving };
	for (int k = 0; k < wk->nps; k++) {
		/* Sealing encrypts the message in place: encode it for each ps. */
		if (msg_encode_done(wk->wbuf + FRAME_HDR_BYTES, cap, &d, &len, e, sizeof(e)))
			return snprintf(err, errlen, "%s", e), -EPROTO;
		int r = worker_send(wk, k, len, err, errlen);
		if (r)
			return r;
	}
	return 0;
}

/* After DONE: asks every ps whether the run is complete (the chief has
 * said DONE). *complete is 1 when all say so. A shard below the version
 * this worker last pulled from it went back while it waited (a ps
 * restarted from a checkpoint, or rolled back): that is a lost link
 * (wk->lost), for worker_resync. */
static int worker_status(struct worker *wk, int *complete, char *err, size_t errlen)
{
	size_t cap = WBUF_BYTES - FRAME_HDR_BYTES - FRAME_TAG_BYTES, len;
	char e[256], nm[300];
	*complete = 1;
	for (int k = 0; k < wk->nps; k++) {
		struct msg_status q = { .reply = 0, .shard = (uint32_t)k };
		if (msg_encode_status(wk->wbuf + FRAME_HDR_BYTES, cap, &q, &len, e, sizeof(e)))
			return snprintf(err, errlen, "%s", e), -EPROTO;
		int r = worker_send(wk, k, len, err, errlen);
		if (r)
			return r;
	}
	for (int k = 0; k < wk->nps; k++) {
		struct msg_status a;
		int r = worker_recv(wk, k, &len, err, errlen);
		if (r < 0)
			return r;
		if (r != WIRE_STATUS || msg_decode_status(wk->rbuf, len, &a, e, sizeof(e)) || !a.reply ||
		    a.shard != (uint32_t)k)
			return err_set(err, errlen, -ECONNABORTED, "%s: %s", ps_name(wk->c, k, nm, sizeof(nm)),
				       r != WIRE_STATUS ? "unexpected message instead of STATUS" : "bad STATUS reply");
		if (a.version < wk->ln[k].got) {
			wk->lost = k;
			return err_set(err, errlen, -ECONNABORTED, "%s went back to step %llu",
				       ps_name(wk->c, k, nm, sizeof(nm)), (unsigned long long)a.version);
		}
		*complete &= a.complete;
	}
	return 0;
}

/* The shards' versions after a pull: lowest, highest, and whether any is
 * below what this worker had pulled from it before (prev): a ps that went
 * back, i.e. was restarted from a checkpoint (or rolled back). */
static void worker_spread(const struct worker *wk, const uint64_t *prev, uint64_t *lo, uint64_t *hi,
			  int *back)
{
	*lo = *hi = wk->ln[0].got;
	*back = 0;
	for (int k = 0; k < wk->nps; k++) {
		uint64_t g = wk->ln[k].got;
		*lo = g < *lo ? g : *lo;
		*hi = g > *hi ? g : *hi;
		*back |= prev && g < prev[k];
	}
}

/* Sync, the shards at versions lo..hi and none went back: some had the
 * gradients of step lo from every worker and moved on while the lost link
 * cost another its copy. Every worker does step lo again, with the
 * parameters of version lo: pulled where a shard is at lo, and where it
 * has moved on, the ones this worker held (keep) if they are of version lo.
 * Otherwise this worker had pushed for lo there already, and what it
 * pushes again is dropped as a duplicate whatever it computes. */
static void worker_keep(struct worker *wk, float *params, const float *keep, const uint64_t *prev,
			uint64_t lo)
{
	for (int k = 0; k < wk->nps; k++) {
		struct link *l = &wk->ln[k];
		if (l->got > lo && prev[k] == lo)
			memcpy(params + l->range.begin, keep + l->range.begin,
			       (l->range.end - l->range.begin) * sizeof(float));
		l->got = lo;
	}
}

/* After a lost ps (wk->lost; why says how): reconnects to every ps with
 * backoff for up to peer_timeout, then pulls where the shards are. In sync
 * mode a ps that came back at an older step was restarted from the newest
 * complete checkpoint: ROLLBACK makes every shard go back to that step.
 * Sets *start to the step to continue at and params to its parameters. */
static int worker_resync_loop(struct worker *wk, float *params, const float *keep, uint64_t *prev,
			      long *start, const char *why, char *err, size_t errlen);

/* Async, connected to every ps and just pulled: a shard below the version
 * this worker had pulled from it (prev) went back, restarted from its
 * newest complete checkpoint or rolled back by another worker. If some
 * went back and others did not, the others are told to go back too:
 * ROLLBACK of the lowest version among those that went back, which each ps
 * resolves to the newest complete checkpoint at or below it (the one the
 * restarted ps resumed from, although others may have pushed to it since).
 * If all went back, someone did that already. Then the worker continues
 * at the global step, lowest version / W (async versions count pushes, W
 * per step), so the steps since that checkpoint are trained again; if
 * none went back (a ps that was only unreachable), at its own step. */
static int worker_resync_async(struct worker *wk, float *params, const uint64_t *prev, long *start,
			       char *err, size_t errlen)
{
	int nback = 0;
	uint64_t target = UINT64_MAX, lo = UINT64_MAX;
	for (int k = 0; k < wk->nps; k++) {
		uint64_t g = wk->ln[k].got;
		if (g < prev[k]) {
			nback++;
			target = g < target ? g : target;
		}
	}
	if (nback && nback < wk->nps) {
		logf_(wk->out, "worker %d: a ps went back to step %llu (restarted from its newest checkpoint): rolling every shard back to it",
		      wk->index, (unsigned long long)target);
		int r = worker_rollback(wk, target, err, errlen);
		if (!r)
			r = worker_pull(wk, params, 1, err, errlen);
		if (r)
			return r;
	}
	if (!nback) {
		logf_(wk->out, "worker %d: reconnected to every ps; carrying on", wk->index);
		return 0;
	}
	for (int k = 0; k < wk->nps; k++)
		lo = wk->ln[k].got < lo ? wk->ln[k].got : lo;
	*start = (long)(lo / (uint64_t)wk->c->cluster.nworkers);
	logf_(wk->out, "worker %d: reconnected to every ps; the shards are at version %llu: continuing at step %ld",
	      wk->index, (unsigned long long)lo, *start);
	return 0;
}

static int worker_resync(struct worker *wk, float *params, long *start, const char *why, char *err,
			 size_t errlen)
{
	int sync = wk->c->train.mode == MODE_SYNC;
	uint64_t prev[CONFIG_MAX_HOSTS];
	for (int k = 0; k < wk->nps; k++)
		prev[k] = wk->ln[k].got;
	/* What params hold now, for worker_keep; without it (no memory)
	 * recovery still works, but may apply one step's gradient computed
	 * from parameters a step apart. */
	size_t P = wk->ln[wk->nps - 1].range.end;
	float *keep = sync ? malloc(P * sizeof(float)) : NULL;
	if (keep)
		memcpy(keep, params, P * sizeof(float));
	int r = worker_resync_loop(wk, params, keep, prev, start, why, err, errlen);
	free(keep);
	return r;
}

static int worker_resync_loop(struct worker *wk, float *params, const float *keep, uint64_t *prev,
			      long *start, const char *why, char *err, size_t errlen)
{
	const struct config *c = wk->c;
	int sync = c->train.mode == MODE_SYNC, W = c->cluster.nworkers;
	int k0 = wk->lost;
	char nm[300], last[512];
	if (wk->pg)
		progress_clear(wk->pg);
	logf_(wk->out, "worker %d: %s; reconnecting for up to %g s (peer_timeout)", wk->index, why,
	      c->cluster.peer_timeout);
	snprintf(last, sizeof(last), "%s", why);
	double end = progress_now() + c->cluster.peer_timeout;
	long pause = 100;
	int said_wait = 0;
	for (int tries = 0;; tries++) {
		if (*wk->stop)
			return err_set(err, errlen, -EINTR, "worker %d: interrupted while reconnecting", wk->index);
		double left = end - progress_now();
		if (left <= 0)
			return err_set(err, errlen, -ECONNABORTED, "worker %d: gave up on %s after %g s (peer_timeout): %s",
				       wk->index, ps_name(c, k0, nm, sizeof(nm)), c->cluster.peer_timeout, last);
		if (tries) {
			nap_ms(pause < left * 1000 ? pause : (long)(left * 1000));
			pause = pause * 2 > 1000 ? 1000 : pause * 2;
		}
		worker_disconnect(wk);
		wk->lost = -1;
		int r = 0;
		for (int k = 0; k < wk->nps && !r; k++) {
			double ms = (end - progress_now()) * 1000;
			char why_k[512];
			r = worker_connect_one(wk, k, ms < 1 ? 1 : (int)ms, why_k, sizeof(why_k));
			if (r == -EINVAL)
				return snprintf(err, errlen, "%s", why_k), r;
			/* A healthy ps reached with the last milliseconds of the
			 * deadline times out too; the ps that used the time up is
			 * the one to name. */
			if (r && (k == k0 || end - progress_now() > 0.05)) {
				k0 = k;
				snprintf(last, sizeof(last), "%s", why_k);
			}
		}
		if (r)
			continue;
		/* Connected to all: pull until the shards agree. */
		for (;;) {
			uint64_t lo, hi;
			int back;
			r = worker_pull(wk, params, 1, last, sizeof(last));
			if (r)
				break;
			if (!sync) {
				r = worker_resync_async(wk, params, prev, start, last, sizeof(last));
				if (r)
					break;
				return 0;
			}
			worker_spread(wk, prev, &lo, &hi, &back);
			/* Any worker that sees it sends ROLLBACK, not only the
			 * chief: the chief may be waiting on another shard for
			 * this worker's gradient, and would not notice the
			 * restart. A second ROLLBACK to the same step is a no-op. */
			if (back && lo != hi) {
				logf_(wk->out, "worker %d: the shards are at steps %llu to %llu (a ps restarted from its newest checkpoint): rolling every shard back to step %llu",
				      wk->index, (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)lo);
				r = worker_rollback(wk, lo, last, sizeof(last));
				if (!r)
					r = worker_pull(wk, params, 1, last, sizeof(last));
				if (r)
					break;
				for (int k = 0; k < wk->nps; k++)
					prev[k] = wk->ln[k].got;
				worker_spread(wk, NULL, &lo, &hi, &back);
			}
			/* With backup workers the shards may differ by a step or
			 * two; a restarted shard the chief has not rolled the
			 * others back to yet differs by more, or went back. */
			if (!sync || ((!back || lo == hi) && hi - lo <= 2 * (uint64_t)W)) {
				if (sync && lo != hi && keep)
					worker_keep(wk, params, keep, prev, lo);
				*start = (long)lo;
				if (sync)
					logf_(wk->out, "worker %d: reconnected to every ps; continuing at step %llu",
					      wk->index, (unsigned long long)lo);
				else
					logf_(wk->out, "worker %d: reconnected to every ps; carrying on", wk->index);
				return 0;
			}
			if (progress_now() >= end || *wk->stop)
				return err_set(err, errlen, -ECONNABORTED,
					       "worker %d: the ps tasks stay at steps %llu to %llu: restart every ps so they load the same checkpoint",
					       wk->index, (unsigned long long)lo, (unsigned long long)hi);
			if (!said_wait++)
				logf_(wk->out, "worker %d: the shards are at steps %llu to %llu: waiting for them to agree",
				      wk->index, (unsigned long long)lo, (unsigned long long)hi);
			nap_ms(100);
		}
		if (wk->lost >= 0)
			k0 = wk->lost;
		else
			return snprintf(err, errlen, "%s", last), -ECONNABORTED;
	}
}


/* A worker that has trained its last step says DONE and stays until every
 * ps reports the run complete (the chief has said DONE, after its final
 * checkpoint and evaluation), polling with STATUS every 100 ms, so that a
 * ps killed and restarted meanwhile can still roll it back. The chief
 * itself, or a worker finishing after it, leaves at once. A lost ps is
 * handled as during training (worker_resync); if the shards went back,
 * *at is set to the step to train again from and 0 is returned, else DONE
 * is said again on the new connections. */
static int worker_finish(struct worker *wk, float *params, long *at, char *err, size_t errlen)
{
	long step = *at;
	for (;;) {
		int r = worker_done(wk, 0, err, errlen), complete = 0;
		while (!r) {
			r = worker_status(wk, &complete, err, errlen);
			if (r || complete)
				break;
			if (*wk->stop)
				return err_set(err, errlen, -EINTR, "worker %d: interrupted while waiting for the others to finish",
					       wk->index);
			nap_ms(100);
		}
		if (!r) {
			/* Unsent, a ps waits peer_timeout for this worker
			 * to come back, then finishes all the same. */
			char e2[CONFIG_ERR_MAX];
			(void)worker_done(wk, 1, e2, sizeof(e2));
			return 0;
		}
		if (wk->lost < 0)
			return r;
		char why[CONFIG_ERR_MAX];
		long a = step;
		snprintf(why, sizeof(why), "%s", err);
		r = worker_resync(wk, params, &a, why, err, errlen);
		if (r)
			return r;
		if (a != step) {
			*at = a;
			return 0;
		}
	}
}

static int dump_params(const char *path, const float *p, size_t n, char *err, size_t errlen)
{
	FILE *f = fopen(path, "wb");
	int ok = f && fwrite(p, sizeof(float), n, f) == n;
	if (f && fclose(f))
		ok = 0;
	if (!ok)
		return snprintf(err, errlen, "%s: cannot write parameters: %s", path, strerror(errno)), -EIO;
	return 0;
}

int cluster_worker(const struct config *c, int index, FILE *out, int tty,
		   const volatile sig_atomic_t *stop, const char *dump, struct train_result *res,
		   char *err, size_t errlen)
{
	struct setup s;
	struct worker wk = { .c = c, .s = &s, .stop = stop, .out = out, .index = index,
			     .nps = c->cluster.nps, .lost = -1 };
	struct devices dev = { 0 };
	struct shard plan[CONFIG_MAX_HOSTS];
	float *params = NULL, *grads = NULL;
	int own_host = 0;   /* params and grads are separate host copies */
	int links = 0;      /* wk.ln's fds and mutexes are set up */
	uint32_t *perm = NULL;
	int chief = index == 0, e;
	int W = c->cluster.nworkers, B = c->train.batch_size;

	memset(&s, 0, sizeof(s));
	memset(res, 0, sizeof(*res));
	double t0 = progress_now();
	e = setup_load(&s, c, 1, err, errlen);
	if (e)
		goto out;
	e = shard_check(wk.nps, s.m.nparams, err, errlen);
	if (e)
		goto out;
	shard_plan(plan, wk.nps, s.m.nparams);
	char job[64];
	snprintf(job, sizeof(job), "/job:worker/task:%d", index);
	e = devices_open(&dev, c, &s.m, &c->train.optim, chief && B < EVAL_BATCH ? EVAL_BATCH : B, job,
			 out, err, errlen);
	if (!e)
		e = devices_set_data(&dev, &s.train, NULL, err, errlen);
	if (e)
		goto out;
	wk.ln = calloc((size_t)wk.nps, sizeof(*wk.ln));
	wk.rbuf = malloc(RBUF_BYTES);
	wk.wbuf = malloc(WBUF_BYTES);
	/* On one CPU replica, pull into and push from the replica's own
	 * vectors: the copies in and out of the devices are then no-ops. */
	own_host = dev.gpu || dev.n > 1;
	params = own_host ? malloc(s.m.nparams * sizeof(float)) : dev.params[0];
	grads = own_host ? malloc(s.m.nparams * sizeof(float)) : dev.grads[0];
	perm = malloc(s.train.n * sizeof(uint32_t));
	if (!wk.ln || !wk.rbuf || !wk.wbuf || !params || !grads || !perm) {
		snprintf(err, errlen, "out of memory for %zu parameters", s.m.nparams);
		e = -ENOMEM;
		goto out;
	}
	int ct = cryptopool_threads_for(c->cluster.crypto_threads);
	if (ct > 1 && (e = cryptopool_new(&wk.pool, ct, err, errlen)))
		goto out;
	e = pipe_init(&wk.pp, wk.pool, wk.wbuf, WBUF_BYTES, err, errlen);
	if (e)
		goto out;
	for (int k = 0; k < wk.nps; k++) {
		wk.ln[k].fd = -1;
		wk.ln[k].range = plan[k];
		pthread_mutex_init(&wk.ln[k].mu, NULL);
	}
	links = 1;
	pthread_mutex_init(&wk.hb_mu, NULL);
	pthread_cond_init(&wk.hb_cv, NULL);
	wk.hb_on = pthread_create(&wk.hb, NULL, worker_heartbeats, &wk) == 0;
	if (!wk.hb_on) {
		e = err_set(err, errlen, -ENOMEM, "cannot start the heartbeat thread");
		goto out;
	}
	e = worker_connect(&wk, err, errlen);
	if (e)
		goto out;
	long total = s.total, spe = s.spe;
	logf_(out, "worker %d%s: connected to %d ps; %zu train / %zu test samples, %zu parameters, batch %d x %d workers, %ld steps (%ld per epoch), %s mode",
	      index, chief ? " (chief)" : "", wk.nps, s.train.n, s.test.n, s.m.nparams, B, W, total,
	      spe, c->train.mode == MODE_SYNC ? "sync" : "async");

	struct progress pg;
	progress_init(&pg, out, chief && tty, total, spe);
	wk.pg = chief ? &pg : NULL;
	long step, epoch_loaded = -1, start = 0;
	/* The first pull says where the shards are: 0, or in sync mode the
	 * step of the checkpoint they resumed from, the same on every shard. */
	e = worker_pull(&wk, params, 1, err, errlen);
	if (!e)
		e = devices_set_params(&dev, params, err, errlen);
	if (e)
		goto fail;
	if (c->train.mode == MODE_ASYNC) {
		/* The global step, as after a lost ps: 0 in a fresh run (a
		 * worker that joins late skips the steps the cluster has done),
		 * else where a resumed or running cluster is, so a resumed run
		 * does not train the whole run again. */
		uint64_t lo = wk.ln[0].got;
		for (int k = 1; k < wk.nps; k++)
			lo = wk.ln[k].got < lo ? wk.ln[k].got : lo;
		start = (long)(lo / (uint64_t)W);
		start = start > total ? total : start;
		if (start > 0)
			logf_(out, "worker %d: continuing at step %ld of %ld, where the shards are (version %llu)", index,
			      start, total, (unsigned long long)lo);
	} else {
		/* With backup workers (replicas_to_aggregate < workers) the
		 * shards run ahead of a late worker and may differ by a step or
		 * two; shards restored from different checkpoints differ by far
		 * more, and would wait for each other forever. */
		uint64_t lo, hi;
		int back;
		double until = progress_now() + c->cluster.peer_timeout;
		for (int again = 0;; again++) {
			worker_spread(&wk, NULL, &lo, &hi, &back);
			if (hi - lo <= 2 * (uint64_t)W)
				break;
			/* Or one shard answered before and another after the
			 * backup workers' next steps (a busy machine): pulled
			 * again, they agree. */
			if (progress_now() >= until || *stop) {
				e = err_set(err, errlen, -ECONNABORTED,
					    "the ps tasks are at steps %llu to %llu: restart every ps so they load the same checkpoint",
					    (unsigned long long)lo, (unsigned long long)hi);
				goto fail;
			}
			if (!again)
				logf_(out, "worker %d: the shards are at steps %llu to %llu: pulling again until they agree (up to %g s, peer_timeout)",
				      index, (unsigned long long)lo, (unsigned long long)hi, c->cluster.peer_timeout);
			nap_ms(50);
			e = worker_pull(&wk, params, 1, err, errlen);
			if (!e)
				e = devices_set_params(&dev, params, err, errlen);
			if (e)
				goto fail;
		}
		start = (long)lo;
		if (start > total) {
			e = err_set(err, errlen, -EINVAL, "the shards are at step %ld, beyond this run's %ld steps",
				    start, total);
			goto fail;
		}
		if (start > 0)
			logf_(out, "worker %d: continuing at step %ld of %ld, where the shards are", index, start, total);
	}
	int ckpts = chief && c->train.checkpoint_dir[0];
	const char *slow_eval = getenv("PSTRAIN_EVAL_DELAY_MS");   /* test hook: a slow evaluation */
	int pulled = 1;   /* params hold the version for `step` already */
	step = start;
train:
	while (step < total && !*stop) {
		double ts = progress_now();
		if (!pulled) {
			e = worker_pull(&wk, params, 0, err, errlen);
			if (!e)
				e = devices_set_params(&dev, params, err, errlen);
			if (e)
				goto lost;
		}
		pulled = 0;
		if (ckpts && c->train.checkpoint_every > 0 && step > start && step % c->train.checkpoint_every == 0) {
			e = worker_checkpoint(&wk, ckpt_label(&wk, step), err, errlen);
			if (e)
				goto lost;
		}
		int eval_now = step > start && (c->train.eval_every > 0 ? step % c->train.eval_every == 0
									: step % spe == 0);
		if (eval_now && chief) {
			double tl, ta;
			if (slow_eval)
				nap_ms(atol(slow_eval));
			e = devices_report(&dev, &pg, step - 1, err, errlen);
			if (!e)
				e = devices_evaluate(&dev, &s.test, &tl, &ta, err, errlen);
			if (e)
				goto fail;
			progress_eval(&pg, step, tl, ta);
			ts = progress_now();
		} else if (eval_now) {
			double loss;
			long right, n;
			e = devices_meter(&dev, &loss, &right, &n, err, errlen);
			if (e)
				goto fail;
			logf_(out, "worker %d: step %ld/%ld, train loss %.4f accuracy %.2f%%, %llu stale", index,
			      step, total, n ? loss / (double)n : 0, n ? 100.0 * (double)right / (double)n : 0,
			      (unsigned long long)wk.stale);
		}
		long epoch = step / spe;
		char why[CONFIG_ERR_MAX];
		if (epoch != epoch_loaded) {
			data_permute(perm, s.train.n, c->train.seed, (uint64_t)epoch);
			epoch_loaded = epoch;
			e = devices_set_order(&dev, perm, s.train.n, why, sizeof(why));
			if (e) {
				progress_clear(&pg);
				snprintf(err, errlen, "step %ld: %s", step, why);
				goto out;
			}
		}
		size_t first = (size_t)(step % spe) * (size_t)W * (size_t)B + (size_t)index * (size_t)B;
		e = devices_zero_grads(&dev, why, sizeof(why));
		if (!e)
			e = devices_step(&dev, first, B, replica_key(c->train.seed, step, index), why,
					 sizeof(why));
		if (!e)
			e = devices_get_grads(&dev, grads, why, sizeof(why));
		if (e) {
			progress_clear(&pg);
			snprintf(err, errlen, "step %ld: %s", step, why);
			goto out;
		}
		e = worker_push(&wk, grads, err, errlen);
		if (e)
			goto lost;
		if (chief) {
			pg.stale = wk.stale;
			progress_tick(&pg, step, progress_now() - ts);
			/* The gradient's download has waited for the GPU: the
			 * loss is there to be read without a further stall. */
			if ((progress_due(&pg, step) || step + 1 == total) &&
			    (e = devices_report(&dev, &pg, step, why, sizeof(why)))) {
				progress_clear(&pg);
				snprintf(err, errlen, "step %ld: %s", step, why);
				goto out;
			}
		}
		step++;
		continue;
	lost:
		/* A ps went away (or back): reconnect, roll back if needed, and
		 * go on from where the shards are. Async mode keeps its own
		 * step count. */
		if (wk.lost < 0)
			goto fail;
		{
			char lostwhy[CONFIG_ERR_MAX];
			long at = step;
			snprintf(lostwhy, sizeof(lostwhy), "%s", err);
			e = worker_resync(&wk, params, &at, lostwhy, err, errlen);
			if (!e)
				e = devices_set_params(&dev, params, err, errlen);
			if (e)
				goto fail;
			if (c->train.mode == MODE_SYNC || at != step)
				step = start = at;
			pulled = 1;
		}
	}
	res->steps = step;
	res->total_steps = total;
	if (*stop) {
		progress_clear(&pg);
		snprintf(err, errlen, "worker %d: interrupted at step %ld/%ld", index, step, total);
		e = -EINTR;
		goto out;
	}
	if (chief) {
		if (step > start && !pulled) {
			e = worker_pull(&wk, params, 0, err, errlen);
			if (!e)
				e = devices_set_params(&dev, params, err, errlen);
			if (e && wk.lost >= 0) {
				/* The last step's shards were lost: the same recovery
				 * as in the loop, which may roll back and train again. */
				char why[CONFIG_ERR_MAX];
				long at = step;
				snprintf(why, sizeof(why), "%s", err);
				e = worker_resync(&wk, params, &at, why, err, errlen);
				if (!e)
					e = devices_set_params(&dev, params, err, errlen);
				if (e)
					goto fail;
				pulled = 1;
				if ((c->train.mode == MODE_SYNC || at != step) && at < total) {
					step = start = at;
					goto train;
				}
			}
			if (e)
				goto fail;
		}
		if (ckpts && step > start) {
			e = worker_checkpoint(&wk, ckpt_label(&wk, step), err, errlen);
			if (e)
				goto fail;
		}
		e = devices_report(&dev, &pg, step - 1, err, errlen);
		if (!e)
			e = devices_evaluate(&dev, &s.test, &res->test_loss, &res->test_acc, err, errlen);
		if (e)
			goto fail;
		progress_eval(&pg, step, res->test_loss, res->test_acc);
		if (dump) {
			e = dump_params(dump, params, s.m.nparams, err, errlen);
			if (e)
				goto out;
		}
	} else {
		double loss;
		long right, n;
		e = devices_meter(&dev, &loss, &right, &n, err, errlen);
		if (e)
			goto fail;
		logf_(out, "worker %d: step %ld/%ld, train loss %.4f accuracy %.2f%%, %llu stale", index,
		      step, total, n ? loss / (double)n : 0, n ? 100.0 * (double)right / (double)n : 0,
		      (unsigned long long)wk.stale);
	}
	progress_clear(&pg);
	{
		long at = step;
		e = worker_finish(&wk, params, &at, err, errlen);
		if (!e && at != step)
			e = devices_set_params(&dev, params, err, errlen);
		if (e)
			goto fail;
		if (at != step) {
			step = start = at;
			pulled = 1;
			goto train;
		}
	}
	res->wall = progress_now() - t0;
	res->samples_per_s = pg.train_time > 0 ? (double)pg.samples / pg.train_time : 0;
	e = 0;
	goto out;
fail:
	progress_clear(&pg);
out:
	if (wk.hb_on) {
		pthread_mutex_lock(&wk.hb_mu);
		wk.hb_stop = 1;
		pthread_cond_signal(&wk.hb_cv);
		pthread_mutex_unlock(&wk.hb_mu);
		pthread_join(wk.hb, NULL);
	}
	if (links) {
		worker_disconnect(&wk);
		for (int k = 0; k < wk.nps; k++)
			pthread_mutex_destroy(&wk.ln[k].mu);
		pthread_mutex_destroy(&wk.hb_mu);
		pthread_cond_destroy(&wk.hb_cv);
	}
	pipe_free(&wk.pp);
	cryptopool_destroy(wk.pool);
	free(wk.ln);
	free(wk.rbuf);
	free(wk.wbuf);
	if (own_host) {
		free(params);
		free(grads);
	}
	devices_close(&dev);

	free(perm);
	setup_free(&s);
	return e;
}
