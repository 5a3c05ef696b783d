/* The ps's embedding rows (issue 39): its range of the tables' rows
 * (cluster/psrows.h has the rules and which range), SPULL answered with
 * ROWS, SPUSH applied and ACKed; the messages are net/msg_rows.h's. The
 * handlers run on the connection's own thread, like PUSH's, and read the
 * rest of a request or a push themselves: its messages are consecutive
 * frames, so anything else among them ends the connection. What a
 * request or a push holds is checked as each message arrives, before any
 * of it is used: ids inside this ps's range, strictly ascending across
 * the whole set (the decoder checks one message), no more than one batch
 * can touch, and finite gradient values.
 *
 * Memory: the rows and their optimizer state (the shard), the sync slots
 * of R pushes of one batch's rows each (psrows.h), and per connection two
 * buffers of the most rows one request may ask for, made at its first
 * SPULL or SPUSH; nothing grows with the tables beyond the shard.
 *
 * The lock: ps->mu around the rows' state, as for the dense shard; a
 * waiting SPULL sleeps on ps->pull_cv, which a sparse step, a rollback,
 * DONE and the ps's end all broadcast, and lets the lock go around each
 * send. */
#include "ps_conn.h"
#include "psrows.h"

#include "../base/err.h"
#include "../core/memlimit.h"
#include "../core/progress.h"
#include "../net/msg_rows.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Where the chief's evaluation is chunked (worker.c), so a SPULL of an
 * evaluation's chunk asks for at most this many samples' rows. */
#define PS_SPARSE_EVAL_BATCH ROLE_EVAL_BATCH

struct ps_sparse {
	struct psrows rows;
	size_t pull_cap;   /* the most rows one SPULL may ask for */
	uint64_t packed;   /* SPUSHes that came packed, some of them at least */
	uint64_t R;        /* the tables' rows in all */
};

/* A connection's buffers for one request or push. */
struct ps_sparse_conn {
	uint64_t *ids;     /* (pull_cap) */
	float *vals;       /* (pull_cap, DIM) */
};

/* The most rows one SPUSH holds: a batch's, batch_size x FIELDS. */
static size_t sparse_push_cap(const struct config *c, const struct model *m)
{
	return (size_t)c->train.batch_size * (size_t)m->embed.fields;
}

/* ps k's rows: shard_plan over the tables' R rows (psrows.h). */
static void rows_range(const struct config *c, uint64_t R, int k, uint64_t *r0, uint64_t *r1)
{
	struct shard plan[CONFIG_MAX_HOSTS];
	shard_plan(plan, c->cluster.nps, (size_t)R);
	*r0 = plan[k].begin;
	*r1 = plan[k].end;
}

int ps_sparse_fits(const struct config *c, const struct model *m, const struct shard *dense, int index,
		   int *prev_fits, char *err, size_t errlen)
{
	uint64_t bytes = memlimit_dense(dense->end - dense->begin, (int)c->train.optim.kind), r0 = 0, r1 = 0;
	if (m->embed.fields) {
		rows_range(c, embed_total_rows(&m->embed), index, &r0, &r1);
		uint64_t buf = psrows_buffer_bytes(c, r1 - r0, sparse_push_cap(c, m), m->embed.dim);
		bytes += memlimit_rows(r1 - r0, m->embed.dim, c->train.embed_optimizer);
		bytes = buf > UINT64_MAX - bytes ? UINT64_MAX : bytes + buf;
	}
	char who[160];
	snprintf(who, sizeof(who), "ps %d's shard (parameters [%zu, %zu), embedding rows [%llu, %llu))", index,
		 dense->begin, dense->end, (unsigned long long)r0, (unsigned long long)r1);
	/* Sync pulls as XORs keep one more copy of the dense shard
	 * (psshard_keep_prev): only where that fits the limit too. */
	uint64_t more = (uint64_t)(dense->end - dense->begin) * sizeof(float);
	*prev_fits = c->ps.memory_limit <= 0 ||
		     (bytes <= UINT64_MAX - more && bytes + more <= (uint64_t)c->ps.memory_limit << 20);
	return memlimit_check(who, bytes, c->ps.memory_limit, err, errlen);
}

int ps_sparse_open(struct ps *ps, char *err, size_t errlen)
{
	const struct model *m = &ps->s->job.m;
	const struct config *c = ps->c;
	const struct embed_spec *e = &m->embed;
	if (!e->fields)
		return 0;
	struct ps_sparse *sp = calloc(1, sizeof(*sp));
	if (!sp)
		return err_set(err, errlen, -ENOMEM, "out of memory");
	ps->sp = sp;
	sp->R = embed_total_rows(e);
	uint64_t r0, r1;
	rows_range(c, sp->R, ps->index, &r0, &r1);
	size_t F = (size_t)e->fields, B = (size_t)c->train.batch_size;
	size_t eval = B > PS_SPARSE_EVAL_BATCH ? B : PS_SPARSE_EVAL_BATCH;
	sp->pull_cap = eval * F < r1 - r0 ? eval * F : (size_t)(r1 - r0);
	long total = c->train.mode == MODE_ASYNC ? ps->s->job.total * ps->s->job.S : ps->s->job.total;
	int r = psrows_init(&sp->rows, e, r0, r1, c, total, sparse_push_cap(c, m), err, errlen);
	if (r)
		return r;
	char size[32];
	progress_bytes(size, sizeof(size), (double)memlimit_rows(r1 - r0, e->dim, c->train.embed_optimizer));
	role_log(ps->out, "ps %d: embedding rows [%llu, %llu) of %llu, %s with %s's state",
		 ps->index, (unsigned long long)r0, (unsigned long long)r1, (unsigned long long)sp->R, size,
		 sparse_kind_name((enum sparse_kind)c->train.embed_optimizer));
	return 0;
}

void ps_sparse_close(struct ps *ps)
{
	if (!ps->sp)
		return;
	psrows_free(&ps->sp->rows);
	free(ps->sp);
	ps->sp = NULL;
}

void ps_sparse_say(struct ps *ps)
{
	if (!ps->sp)
		return;
	const struct psrows *r = &ps->sp->rows;
	role_log(ps->out, "ps %d: embedding rows [%llu, %llu): version %llu, %llu pushes applied, %llu dropped as stale, %llu came packed",
		 ps->index, (unsigned long long)r->r0, (unsigned long long)r->r1, (unsigned long long)r->version,
		 (unsigned long long)(r->received - r->dropped_stale), (unsigned long long)r->dropped_stale,
		 (unsigned long long)ps->sp->packed);
}

struct psrows *ps_sparse_rows(struct ps *ps)
{
	return ps->sp ? &ps->sp->rows : NULL;
}

void ps_sparse_rewind(struct ps *ps)
{
	if (ps->sp)
		psrows_rewind(&ps->sp->rows, psshard_version(&ps->sh));
}

void ps_sparse_conn_free(struct ps_conn *cn)
{
	if (!cn->spc)
		return;
	free(cn->spc->ids);
	free(cn->spc->vals);
	free(cn->spc);
	cn->spc = NULL;
}

int ps_sparse_check(struct ps *ps, char *err, size_t errlen)
{
	if (!ps->sp)
		return 0;
	const struct psrows *r = &ps->sp->rows;
	size_t n = r->n * (size_t)r->dim, bad = optim_nonfinite(r->table, n);
	if (bad == n)
		return 0;
	return err_set(err, errlen, -EDOM, "embedding row %llu, element %zu, is %g",
		       (unsigned long long)(r->r0 + bad / (size_t)r->dim), bad % (size_t)r->dim, (double)r->table[bad]);
}

/* The connection's buffers, at its first request or push. */
static int sparse_conn(struct ps_conn *cn, char *err, size_t errlen)
{
	struct ps_sparse *sp = cn->ps->sp;
	if (cn->spc)
		return 0;
	size_t cap = sp->pull_cap ? sp->pull_cap : 1, D = (size_t)sp->rows.dim;
	cn->spc = calloc(1, sizeof(*cn->spc));
	if (cn->spc) {
		cn->spc->ids = malloc(cap * sizeof(uint64_t));
		cn->spc->vals = malloc(cap * D * sizeof(float));
	}
	if (!cn->spc || !cn->spc->ids || !cn->spc->vals) {
		ps_sparse_conn_free(cn);
		return err_set(err, errlen, -ENOMEM, "out of memory for %zu embedding rows", cap);
	}
	return 0;
}

/* One message of a set (the first in cn->conn.rbuf already, len bytes),
 * checked against a and this ps's rows and taken into the buffers. */
static int sparse_take(struct ps_conn *cn, struct msg_rows_asm *a, size_t len, char *err, size_t errlen)
{
	struct ps_sparse *sp = cn->ps->sp;
	const char *name = wire_msg_name(a->type);
	struct msg_rows m;
	int r = msg_decode_rows(cn->conn.rbuf, len, a->dim, &m, err, errlen);
	if (r)
		return r;
	if (m.type == WIRE_SPUSH && WIRE_PUSH_WORKER(m.worker) != (uint32_t)cn->w)
		return err_set(err, errlen, -EPROTO, "SPUSH names worker %u on worker %d's connection",
			       WIRE_PUSH_WORKER(m.worker), cn->w);
	/* Any worker may push any slice, as for PUSH. */
	if (m.type == WIRE_SPUSH && WIRE_PUSH_SLICE(m.worker) >= (uint32_t)sp->rows.workers)
		return err_set(err, errlen, -EPROTO, "SPUSH of slice %u; a step has %d", WIRE_PUSH_SLICE(m.worker),
			       sp->rows.workers);
	/* The ids ascend: the first and the last bound them all. */
	uint64_t id = m.count && m.id_first < sp->rows.r0 ? m.id_first : m.id_last;
	if (m.count && (id < sp->rows.r0 || id >= sp->rows.r1))
		return err_set(err, errlen, -ERANGE, "%s: row %llu is not one of this ps's rows [%llu, %llu) of %llu",
			       name, (unsigned long long)id, (unsigned long long)sp->rows.r0,
			       (unsigned long long)sp->rows.r1, (unsigned long long)sp->R);
	r = msg_rows_asm_add(a, &m, cn->spc->ids, cn->spc->vals, err, errlen);
	if (r < 0 || m.type != WIRE_SPUSH)
		return r;
	/* Refused before any of it is used, naming the value. */
	size_t D = (size_t)a->dim, at = (size_t)m.first * D, nv = (size_t)m.count * D;
	size_t bad = optim_nonfinite(cn->spc->vals + at, nv);
	if (bad < nv) {
		float x = cn->spc->vals[at + bad];
		return err_set(err, errlen, -EDOM, "SPUSH for version %llu refused: the gradient of row %llu, element %zu, is %s",
			       (unsigned long long)m.version, (unsigned long long)cn->spc->ids[m.first + bad / D],
			       bad % D, isnan(x) ? "NaN" : x > 0 ? "+inf" : "-inf");
	}
	return r;
}

/* A whole set of rows messages of a's type, the first in cn->conn.rbuf:
 * the rest read here, nothing else among them. */
static int sparse_recv(struct ps_conn *cn, struct msg_rows_asm *a, size_t len, char *err, size_t errlen)
{
	int r = sparse_take(cn, a, len, err, errlen);
	while (r == 0) {
		r = ps_io(cn, conn_recv(&cn->conn, &len, err, errlen));
		if (r)
			return r;
		r = msg_type(cn->conn.rbuf, len, err, errlen);
		if (r >= 0 && r != a->type)
			return err_set(err, errlen, -EPROTO, "%s among the messages of a %s", wire_msg_name((uint8_t)r),
				       wire_msg_name(a->type));
		if (r >= 0)
			r = sparse_take(cn, a, len, err, errlen);
	}
	return r < 0 ? r : 0;
}

static int rows_pushed(const void *ctx, int s)
{
	return psrows_has_pushed(ctx, s);
}

/* Under ps->mu: a HEARTBEAT's missing set for the rows' version: the
 * owners of the slices not pushed, as for the dense shard. */
static void sparse_heartbeat(struct ps *ps, struct msg_heartbeat *hb)
{
	const struct psrows *r = &ps->sp->rows;
	memset(hb, 0, sizeof(*hb));
	hb->version = r->version;
	members_missing_of(&ps->mb, r->workers, rows_pushed, r, hb->missing, (int)MSG_HEARTBEAT_WORKERS);
}

/* Under ps->mu: a sync SPULL waits for the rows' version want, with a
 * HEARTBEAT every heartbeat period, until the ps stops, a rollback, or no
 * other worker will push (pull_wait's rules). */
static int sparse_wait(struct ps_conn *cn, uint64_t want, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	uint64_t gen = ps->gen;
	while (want != MSG_VERSION_LATEST && ps->sp->rows.version < want && !ps->aborted &&
	       !members_others_done(&ps->mb) && ps->gen == gen) {
		struct timespec dl;
		role_deadline(&dl, role_heartbeat_ms(ps->c));
		if (pthread_cond_timedwait(&ps->pull_cv, &ps->mu, &dl) != ETIMEDOUT)
			continue;
		if (ps->sp->rows.version >= want || ps->aborted || ps->gen != gen)
			continue;
		struct msg_heartbeat hb;
		sparse_heartbeat(ps, &hb);
		int r = ps_heartbeat_send(cn, CONN_MAIN, &hb, err, errlen);
		if (r)
			return r;
	}
	return 0;
}

/* ROWS: the n rows of the request at the version asked for where the
 * rows can give it (psrows_read_at), copied under the lock and sent
 * without it (float32 packed where the worker asked: packed); an ERROR if
 * the ps stops. */
static int sparse_answer(struct ps_conn *cn, uint32_t n, uint64_t want, int packed, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	pthread_mutex_lock(&ps->mu);
	int r = sparse_wait(cn, want, err, errlen), ab = ps->aborted;
	uint64_t v = ps->sp->rows.version;
	if (!r && !ab)
		v = psrows_read_at(&ps->sp->rows, want, cn->spc->ids, n, cn->spc->vals);
	char why[WIRE_ERROR_TEXT_MAX + 1];
	snprintf(why, sizeof(why), "ps %d stops: %.200s", ps->index, ps->why);
	pthread_mutex_unlock(&ps->mu);
	if (r)
		return ps_io(cn, r);
	if (ab) {
		conn_send_error(&cn->conn, CONN_MAIN, ECONNABORTED, why);
		snprintf(err, errlen, "training aborted");
		return PS_END;
	}
	int D = ps->sp->rows.dim;
	uint8_t dt = (uint8_t)role_param_dtype(ps->c);
	dt = dt == WIRE_F32 && packed ? WIRE_F32P : dt;
	uint32_t per = msg_rows_max(WIRE_ROWS, D, dt), first = 0;
	do {
		uint32_t k = n - first < per ? n - first : per;
		struct msg_rows m = { .type = WIRE_ROWS, .dtype = dt, .shard = (uint32_t)ps->index, .version = v,
				      .total = n, .first = first, .count = k };
		size_t len;
		r = msg_encode_rows(conn_payload(&cn->conn, CONN_MAIN), conn_payload_cap(&cn->conn), &m, NULL,
				    cn->spc->vals + (size_t)first * (size_t)D, D, &len, err, errlen);
		if (!r)
			r = ps_io(cn, conn_send_payload(&cn->conn, CONN_MAIN, len, err, errlen));
		first += k;
	} while (!r && first < n);
	return r;
}

/* The sparse messages need rows here, and a type a ps takes. */
static int sparse_usable(struct ps_conn *cn, size_t len, char *err, size_t errlen)
{
	uint8_t t = cn->conn.rbuf[0];
	if (!cn->ps->sp)
		return err_set(err, errlen, -EPROTO, "%s: this model has no embedding rows", wire_msg_name(t));
	if (t == WIRE_ROWS)
		return err_set(err, errlen, -EPROTO, "unexpected ROWS message");
	(void)len;
	return sparse_conn(cn, err, errlen);
}

int ps_on_spull(struct ps_conn *cn, size_t len, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	int r = sparse_usable(cn, len, err, errlen);
	if (r)
		return r;
	struct msg_rows_asm a;
	msg_rows_asm_init(&a, WIRE_SPULL, WIRE_F32, (uint32_t)ps->index, ps->sp->rows.dim, ps->sp->pull_cap,
			  MSG_ROWS_ANY);
	r = sparse_recv(cn, &a, len, err, errlen);
	if (!r)
		hooks_crash_point(&ps->hooks, "spull", (long)a.version);
	if (!r && ps->hooks.rows_delay_ms)
		role_nap_ms(ps->hooks.rows_delay_ms);
	return r ? r : sparse_answer(cn, a.total, a.version, a.want_packed != 0, err, errlen);
}

int ps_on_spush(struct ps_conn *cn, size_t len, char *err, size_t errlen)
{
	struct ps *ps = cn->ps;
	int r = sparse_usable(cn, len, err, errlen);
	if (r)
		return r;
	struct psrows *rows = &ps->sp->rows;
	struct msg_rows_asm a;
	msg_rows_asm_init(&a, WIRE_SPUSH, (uint8_t)role_grad_dtype(ps->c), (uint32_t)ps->index, rows->dim,
			  rows->cap, MSG_ROWS_ANY);
	r = sparse_recv(cn, &a, len, err, errlen);
	if (r)
		return r;
	enum psshard_outcome oc = PSSHARD_STALE;
	pthread_mutex_lock(&ps->mu);
	r = psrows_push(rows, (int)WIRE_PUSH_SLICE(a.worker), a.version, cn->spc->ids, cn->spc->vals, a.total, &oc);
	uint64_t v = rows->version;
	ps->sp->packed += a.packed > 0;
	/* A step applied, or (every other worker done) this worker's push in:
	 * news for a waiting SPULL. */
	if ((r == 0 && oc == PSSHARD_APPLIED) || (!r && members_others_done(&ps->mb)))
		pthread_cond_broadcast(&ps->pull_cv);
	pthread_mutex_unlock(&ps->mu);
	if (r == -ERANGE)
		return err_set(err, errlen, -EPROTO, "SPUSH for version %llu refused: the rows are at version %llu",
			       (unsigned long long)a.version, (unsigned long long)v);
	if (r && r != -EALREADY)
		return err_set(err, errlen, -EPROTO, "SPUSH for version %llu refused: %s",
			       (unsigned long long)a.version, strerror(-r));
	return ps_ack(cn, r, oc, v, err, errlen);
}
