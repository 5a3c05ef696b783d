/* A peer holding the cluster key (a buggy or compromised worker) cannot
 * stop or poison a ps (issue 13 item 4). As in test_robust.c, each process
 * test starts one `pstrain ps` ($PSTRAIN_BIN) on 127.0.0.1, speaks the
 * protocol to it from this process after a correct handshake, and then
 * checks that real workers still train to the end and the ps exits 0:
 *   - a ROLLBACK to a step with no checkpoint, or to one that does not
 *     load, gets an ERROR and the ps serves on (it used to stop);
 *   - two PUSHes with NaN or infinite values each get an ERROR naming the
 *     version and the first bad element, and change nothing (they used to
 *     make every parameter NaN);
 *   - a CHECKPOINT from a non-chief, chunks out of range, malformed and
 *     unexpected messages each get an ERROR with the reason (the
 *     connection used to close without a word);
 *   - a worker told ERROR by a ps prints it on one line and exits 3; a
 *     worker whose training diverges stops before it pushes a NaN;
 *   - on an elastic ps 0, a PULL past the step from a worker that owes
 *     slices of it is answered at once (it would wait for itself).
 * And in-process: the non-finite check, psshard_push refusing such a
 * gradient, and a ROLLBACK whose checkpoint fails half way through loading
 * leaving the shard as it was. Every wait is bounded; teardown kills what
 * a failed assertion left running. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include "target.h"
#include "util.h"

#include "../cluster/ps_store.h"
#include "../core/ckpt/checkpoint.h"
#include "../core/config/config.h"
#include "../core/ckpt/manifest.h"
#include "../core/nn/model.h"
#include "../cluster/psshard.h"
#include "../core/shard.h"
#include "../net/conn.h"
#include "../net/frame.h"
#include "../net/handshake.h"
#include "../net/key.h"
#include "../net/msg.h"
#include "../net/pipe.h"
#include "../net/sock.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RUN_TIMEOUT_S 40
#define IO_MS 5000
#define NPARAMS (6 * 16 + 16 + 16 * 3 + 3) /* the model target_write configures */

TestSuite(keyholder, .init = target_setup, .fini = target_teardown, .timeout = 90);

/* ---- a ps and a key holder speaking to it ---------------------------------- */

/* The cluster of target_write for W workers, batches of 16, with
 * checkpoints in target_dir/ckpt unless extra ([train] lines) sets checkpoint_dir. */
static void write_config(struct target *t, int W, int steps, const char *extra)
{
	char train[256];
	int n = snprintf(train, sizeof(train), "%s%s", extra,
			 strstr(extra, "checkpoint_dir") ? "" : "checkpoint_dir = ckpt\n");
	cr_assert_lt(n, (int)sizeof(train));
	target_write(t, W, steps, 16, train);
}

static void start_ps(struct target *t, int W, int steps, const char *extra)
{
	write_config(t, W, steps, extra);
	target_start(t, NULL);
}

/* The ps logged, once, a line naming the peer of fd, worker w and each of
 * the needles (NULL: none). */
static void assert_logged(const struct target *t, int fd, int w, const char *n1, const char *n2)
{
	char who[64];
	snprintf(who, sizeof(who), "closed worker %d's connection", w);
	target_assert_logged(t, fd, who);
	if (n1)
		target_assert_logged(t, fd, n1);
	if (n2)
		target_assert_logged(t, fd, n2);
}

/* The ps still serves: real workers 0..W-1 train to the end and every
 * process exits 0. dump: the chief's final parameters go there (or NULL). */
static void real_workers_finish(struct target *t, int W, const char *dump)
{
	char out[3][300];
	pid_t pids[3] = { t->pid };
	snprintf(out[0], sizeof(out[0]), "%s", t->log);
	cr_assert_leq(W, 2);
	for (int w = 0; w < W; w++) {
		char idx[16];
		snprintf(idx, sizeof(idx), "%d", w);
		snprintf(out[1 + w], sizeof(out[1 + w]), "%s/worker%d.log", target_dir, w);
		const char *plain[] = { "worker", "--index", idx, "--config", t->cfg, NULL };
		const char *dumping[] = { "worker", "--index", idx, "--config", t->cfg,
					  "--dump-params", dump, NULL };
		pids[1 + w] = target_spawn(w == 0 && dump ? dumping : plain, out[1 + w]);
	}
	int st[3];
	wait_children(pids, 1 + W, st, RUN_TIMEOUT_S);
	assert_exits_zero(st, out, 1 + W, "after the key holder's requests: ");
	cr_assert_not_null(strstr(slurp(out[1]), "done: "), "%s", slurp(out[1]));
}

/* Seals the len-byte message m and sends it. */
static void send_msg(int fd, struct hs_result *hr, const uint8_t *m, size_t len)
{
	static uint8_t f[FRAME_BYTES_MAX];
	size_t flen;
	char err[256];
	cr_assert_eq(frame_seal(&hr->send, f, sizeof(f), m, len, &flen, err, sizeof(err)), 0, "%s", err);
	target_send(fd, f, flen);
}

static void send_pull(int fd, struct hs_result *hr, uint32_t shard, uint64_t version)
{
	uint8_t m[MSG_PULL_BYTES];
	size_t len;
	char err[256];
	struct msg_pull p = { .shard = shard, .version = version };
	cr_assert_eq(msg_encode_pull(m, sizeof(m), &p, &len, err, sizeof(err)), 0, "%s", err);
	send_msg(fd, hr, m, len);
}

/* One PUSH chunk of src[0..count) at offset, as worker w for version v. */
static void send_push(int fd, struct hs_result *hr, uint32_t w, uint64_t v, uint64_t offset,
		      uint32_t count, const float *src)
{
	static uint8_t m[MSG_CHUNK_BYTES(1024, WIRE_F32)];
	size_t len;
	char err[256];
	cr_assert_leq(count, 1024);
	struct msg_chunk ch = { .type = WIRE_PUSH, .shard = 0, .version = v, .worker = w,
				.offset = offset, .count = count };
	cr_assert_eq(msg_encode_chunk(m, sizeof(m), &ch, src, &len, err, sizeof(err)), 0, "%s", err);
	send_msg(fd, hr, m, len);
}

/* The answer to `what` is ERROR(code) whose text holds n1 and n2 (NULL:
 * nothing more), and then the ps closes. */
static void expect_error(int fd, struct hs_result *hr, const char *what, uint32_t code,
			 const char *n1, const char *n2)
{
	static uint8_t buf[FRAME_CT_MAX];
	size_t len;
	char err[256];
	int type = target_recv_msg(fd, hr, buf, &len, what);
	cr_assert_eq(type, WIRE_ERROR, "%s was answered with %s, not ERROR", what,
		     wire_msg_name((uint8_t)type));
	struct msg_error me;
	cr_assert_eq(msg_decode_error(buf, len, &me, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(me.code, code, "%s: ERROR code %u, expected %u (%s)", what, me.code, code, me.text);
	cr_assert(strstr(me.text, n1) && (!n2 || strstr(me.text, n2)),
		  "%s: ERROR \"%s\" does not say \"%s\"%s%s", what, me.text, n1, n2 ? " and " : "",
		  n2 ? n2 : "");
	target_expect_closed(fd, IO_MS);
}

/* PARAMS (one chunk: the model is small) after a PULL: into p (NPARAMS),
 * the version returned. */
static uint64_t recv_params(int fd, struct hs_result *hr, float *p)
{
	static uint8_t buf[FRAME_CT_MAX];
	size_t len;
	char err[256];
	cr_assert_eq(target_recv_msg(fd, hr, buf, &len, "PULL"), WIRE_PARAMS);
	struct msg_chunk ch;
	cr_assert_eq(msg_decode_chunk(buf, len, &ch, err, sizeof(err)), 0, "%s", err);
	cr_assert(ch.offset == 0 && ch.count == NPARAMS, "PARAMS [%llu, +%u)",
		  (unsigned long long)ch.offset, ch.count);
	msg_chunk_floats(p, &ch);
	return ch.version;
}

/* Async: after a ROLLBACK (another worker's recovery), a PUSH tagged with
 * a version the shard had before it is dropped as stale, so that its
 * worker goes on to learn of the rollback from its next pull; one tagged
 * above anything the shard had is still refused. A CI run ended a worker
 * on such a push (a late ROLLBACK to a checkpoint completed after the
 * chief had gone on). */
Test(keyholder, async_push_from_before_a_rollback_is_stale)
{
	struct target t;
	start_ps(&t, 1, 20, "mode = async\n");
	struct hs_result hr;
	int fd = target_peer(&t, 0, &hr, 1);
	static float p[NPARAMS], g[NPARAMS];
	send_pull(fd, &hr, 0, MSG_VERSION_LATEST);
	cr_assert_eq(recv_params(fd, &hr, p), 0);
	for (uint64_t v = 0; v < 3; v++) {
		send_push(fd, &hr, 0, v, 0, NPARAMS, g);
		cr_assert_eq(target_ack_status(fd, &hr, "a push"), MSG_ACK_APPLIED, "push %llu", (unsigned long long)v);
	}
	uint8_t m[64];
	size_t len;
	char err[256];
	struct msg_rollback rb = { .step = 0 };
	cr_assert_eq(msg_encode_rollback(m, sizeof(m), &rb, &len, err, sizeof(err)), 0, "%s", err);
	send_msg(fd, &hr, m, len);
	send_pull(fd, &hr, 0, MSG_VERSION_LATEST);
	cr_assert_eq(recv_params(fd, &hr, p), 0, "rolled back to 0");
	send_push(fd, &hr, 0, 2, 0, NPARAMS, g);
	cr_assert_eq(target_ack_status(fd, &hr, "a push from before the rollback"), MSG_ACK_STALE);
	send_push(fd, &hr, 0, 4, 0, NPARAMS, g);
	expect_error(fd, &hr, "a push above every version the shard had", EPROTO, "the shard is at version 0",
		     NULL);
	close(fd);
	target_wipe(&hr);
	real_workers_finish(&t, 1, NULL);
}

/* A ps of the config for W workers (extra: write_config's) with a
 * 20000-input model, 320067 values in 20 pieces of a chunk each, started. */
static void start_big_ps(struct target *t, int W, const char *extra)
{
	write_config(t, W, 20, extra);
	const char *set[] = { "model.input=20000" };
	static struct config c;
	char cerr[CONFIG_ERR_MAX];
	cr_assert_eq(config_load(&c, t->cfg, set, 1, cerr, sizeof(cerr)), 0, "%s", cerr);
	cr_assert_eq(config_hash(&c, t->hash), 0); /* what the ps now hashes */
	target_start(t, set[0]);
}

/* Big-model helpers for the XOR pulls: N values, 20 pieces of a chunk. */
#define XN 320067u

static void send_pull_flags(int fd, struct hs_result *hr, uint64_t version, uint8_t flags)
{
	uint8_t m[MSG_PULL_BYTES];
	size_t len;
	char err[256];
	struct msg_pull p = { .flags = flags, .shard = 0, .version = version };
	cr_assert_eq(msg_encode_pull(m, sizeof(m), &p, &len, err, sizeof(err)), 0, "%s", err);
	send_msg(fd, hr, m, len);
}

/* Worker w's PUSH of version v, chunks [c0, c1) of g (XN values). */
static void send_push_chunks(int fd, struct hs_result *hr, uint32_t w, uint64_t v, uint64_t c0, uint64_t c1,
			     const float *g)
{
	static uint8_t m[MSG_CHUNK_BYTES_MAX];
	char err[256];
	for (uint64_t i = c0; i < c1; i++) {
		size_t len;
		uint64_t off = i * MSG_CHUNK_FLOATS;
		uint32_t count = (uint32_t)(XN - off < MSG_CHUNK_FLOATS ? XN - off : MSG_CHUNK_FLOATS);
		struct msg_chunk ch = { .type = WIRE_PUSH, .shard = 0, .version = v, .worker = w, .offset = off,
					.count = count };
		cr_assert_eq(msg_encode_chunk(m, sizeof(m), &ch, g + off, &len, err, sizeof(err)), 0, "%s", err);
		send_msg(fd, hr, m, len);
	}
}

/* A gradient for the big model (XN values), the same every time. */
static void big_gradient(float *g)
{
	for (size_t i = 0; i < XN; i++)
		g[i] = 0.01f * (float)(i % 7) - 0.03f;
}

/* Once the first PARAMS chunk of a pull is in: worker 0's PUSH of the
 * rest of version 0 (fd -1: nothing). */
struct then_push {
	int fd;
	struct hs_result *hr;
	const float *g;
};

/* The PARAMS of one PULL, every chunk taken by an assembly into p (which
 * holds what was pulled before: XORs apply to it); ACKs and HEARTBEATs
 * skipped; after the first chunk, then's push. Returns the chunks that
 * came as XORs; *first_dt: chunk 0's. */
static int recv_all_params(int fd, struct hs_result *hr, float *p, unsigned *first_dt, struct then_push then)
{
	static uint8_t buf[FRAME_CT_MAX];
	char err[256];
	struct msg_assembly a;
	cr_assert_eq(msg_assembly_init(&a, WIRE_PARAMS, 0, XN, WIRE_F32, err, sizeof(err)), 0, "%s", err);
	int xors = 0;
	while (!msg_assembly_done(&a)) {
		size_t len;
		int type = target_recv_msg(fd, hr, buf, &len, "a PULL");
		if (type == WIRE_ACK)
			continue;
		cr_assert_eq(type, WIRE_PARAMS, "%s", wire_msg_name((uint8_t)type));
		struct msg_chunk ch;
		cr_assert_eq(msg_decode_chunk(buf, len, &ch, err, sizeof(err)), 0, "%s", err);
		if (ch.offset == 0)
			*first_dt = ch.dtype;
		xors += ch.dtype == WIRE_F32X;
		int r = msg_assembly_add(&a, &ch, p, err, sizeof(err));
		cr_assert_geq(r, 0, "chunk at %llu (dtype %u): %s", (unsigned long long)ch.offset, ch.dtype, err);
		if (then.fd >= 0 && a.received == ch.count)
			send_push_chunks(then.fd, then.hr, 0, 0, 1, 20, then.g);
	}
	return xors;
}

/* XOR pulls against what a connection was last sent: a whole shard's copy
 * may carry a piece that went a version ahead (here piece 0, whose
 * gradients both came while the rest waited on worker 0), labelled with
 * the shard's version; the next PULL's XORs for that piece must not be
 * made against the version before (the worker would refuse them: a
 * test-net run stopped so after a reconnect), the others' may. */
Test(keyholder, xors_follow_what_the_connection_was_sent)
{
	struct target t;
	start_big_ps(&t, 2, "checkpoint_dir = ckpt\n");
	struct hs_result ha, hb;
	int fa = target_peer(&t, 0, &ha, 0), fb = target_peer(&t, 1, &hb, 0);
	static float pb[XN], before[XN], g[XN];
	big_gradient(g);
	const uint8_t dx = MSG_PULL_PACKED | MSG_PULL_DELTA;
	unsigned dt = 0;
	const struct then_push none = { .fd = -1 };
	send_pull_flags(fb, &hb, 0, dx);
	recv_all_params(fb, &hb, pb, &dt, none);
	memcpy(before, pb, sizeof(before));
	send_push_chunks(fb, &hb, WIRE_PUSH_TAG(1, 1), 0, 0, 20, g);
	send_push_chunks(fa, &ha, 0, 0, 0, 1, g); /* piece 0 complete: a version ahead */
	int ahead = 0;
	for (int tries = 0; tries < 50 && !ahead; tries++) {
		send_pull_flags(fb, &hb, 0, dx);
		recv_all_params(fb, &hb, pb, &dt, none);
		ahead = memcmp(pb, before, MSG_CHUNK_FLOATS * sizeof(float)) != 0;
		cr_assert_eq(memcmp(pb + MSG_CHUNK_FLOATS, before + MSG_CHUNK_FLOATS,
				    (XN - MSG_CHUNK_FLOATS) * sizeof(float)), 0, "only piece 0 moved");
		if (!ahead)
			usleep(20000);
	}
	cr_assert(ahead, "piece 0 never went ahead");
	/* piece 0 goes out at once; the rest once worker 0 pushed it, after:
	 * so the PULL is streamed, not answered with the whole shard */
	send_pull_flags(fb, &hb, 1, dx);
	int xors = recv_all_params(fb, &hb, pb, &dt, (struct then_push){ .fd = fa, .hr = &ha, .g = g });
	cr_assert_neq(dt, WIRE_F32X, "piece 0 came as XORs with a version this connection was not sent");
	cr_assert_gt(xors, 0, "no piece came as XORs");
	close(fa);
	close(fb);
	target_wipe(&ha);
	target_wipe(&hb);
}

/* A ps whose [ps] memory_limit holds its shard and optimizer state but
 * not one more copy of the shard (the big model with momentum: 2.44 MiB,
 * 3.66 with the copy, under a limit of 3) keeps no version before and
 * answers a PULL that asks for XORs with packed values; it says so once
 * at start. The same step without the limit comes as XORs
 * (xors_follow_what_the_connection_was_sent). */
Test(keyholder, no_xors_where_the_memory_limit_has_no_room_for_them)
{
	struct target t;
	start_big_ps(&t, 2, "checkpoint_dir = ckpt\n[ps]\nmemory_limit = 3\n");
	struct hs_result ha, hb;
	int fa = target_peer(&t, 0, &ha, 0), fb = target_peer(&t, 1, &hb, 0);
	static float pa[XN], pb[XN], g[XN];
	big_gradient(g);
	const uint8_t dx = MSG_PULL_PACKED | MSG_PULL_DELTA;
	unsigned dt = 0;
	const struct then_push none = { .fd = -1 };
	send_pull_flags(fa, &ha, 0, dx);
	recv_all_params(fa, &ha, pa, &dt, none);
	send_pull_flags(fb, &hb, 0, dx);
	recv_all_params(fb, &hb, pb, &dt, none);
	/* as a worker does: the PULL first, streamed as the pieces complete */
	send_push_chunks(fb, &hb, WIRE_PUSH_TAG(1, 1), 0, 0, 20, g);
	send_pull_flags(fb, &hb, 1, dx);
	send_push_chunks(fa, &ha, 0, 0, 0, 20, g);
	int xors = recv_all_params(fb, &hb, pb, &dt, none);
	cr_assert_eq(xors, 0, "%d chunks came as XORs past [ps] memory_limit", xors);
	cr_assert_eq(dt, WIRE_F32P, "chunk 0 in dtype %u, not packed", dt);
	const char *say = "leaves no room for a copy of the shard's version before";
	cr_assert_not_null(strstr(target_wait_log(&t, say), say), "the ps did not say why:\n%s", slurp(t.log));
	close(fa);
	close(fb);
	target_wipe(&ha);
	target_wipe(&hb);
}

/* ---- factors from a key holder (protocol 15) ---------------------------------- */

/* Worker 0's PUSH chunk of piece j (of the big model) as factors: run
 * values from the piece to the run's end, batch B, k factor values of v. */
static void send_factors(int fd, struct hs_result *hr, uint64_t j, uint32_t run, uint32_t B, size_t k, float v)
{
	static uint8_t m[MSG_CHUNK_BYTES_MAX];
	char err[256];
	size_t len;
	uint64_t off = j * MSG_CHUNK_FLOATS;
	uint32_t count = (uint32_t)(XN - off < MSG_CHUNK_FLOATS ? XN - off : MSG_CHUNK_FLOATS);
	struct msg_chunk ch = { .type = WIRE_PUSH, .dtype = WIRE_F32F, .shard = 0, .version = 0, .worker = 0,
				.offset = off, .count = count };
	cr_assert_eq(msg_encode_chunk_factors(m, sizeof(m), &ch, run, B, k, &len, err, sizeof(err)), 0, "%s", err);
	for (size_t i = 0; i < k; i++)
		wire_put_f32s(m + len - 4 * k + 4 * i, &v, 1);
	msg_chunk_factors_seal(m, &len);
	send_msg(fd, hr, m, len);
}

struct factors_case {
	char name[32];
	int code;
	char says[80];
};

/* The big model's first layer is 20000 x 16 over pieces 0 to 19 (its
 * weight ends inside piece 19); batch_size 16. A run of pieces 0 and 1
 * touches rows 0 and 1: B x 20002 factor values. */
static void factors_sent(const char *name, int fd, struct hs_result *hr)
{
	static float g[XN];
	const uint32_t two = 2 * MSG_CHUNK_FLOATS;
	if (!strcmp(name, "run_off_a_piece")) {
		send_factors(fd, hr, 0, MSG_CHUNK_FLOATS + 5, 1, 10, 1.0f);
	} else if (!strcmp(name, "run_past_a_weight")) {
		send_push_chunks(fd, hr, 0, 0, 0, 19, g);
		send_factors(fd, hr, 19, (uint32_t)(XN - 19 * MSG_CHUNK_FLOATS), 1, 10, 1.0f);
	} else if (!strcmp(name, "batch_too_large")) {
		send_factors(fd, hr, 0, two, 17, 10, 1.0f);
	} else if (!strcmp(name, "too_many")) {
		send_factors(fd, hr, 0, two, 1, MSG_CHUNK_FLOATS - 600, 1.0f);
		send_factors(fd, hr, 1, MSG_CHUNK_FLOATS, 1, MSG_CHUNK_FLOATS - 600, 1.0f);
	} else if (!strcmp(name, "too_few")) {
		send_factors(fd, hr, 0, two, 1, 100, 1.0f);
		send_factors(fd, hr, 1, MSG_CHUNK_FLOATS, 1, 100, 1.0f);
	} else if (!strcmp(name, "broken_off")) {
		send_factors(fd, hr, 0, two, 1, 10001, 1.0f);
		send_push_chunks(fd, hr, 0, 0, 1, 2, g);
	} else if (!strcmp(name, "another_batch")) {
		send_factors(fd, hr, 0, two, 1, 10001, 1.0f);
		send_factors(fd, hr, 1, MSG_CHUNK_FLOATS, 2, 10001, 1.0f);
	} else if (!strcmp(name, "nan_factors")) {
		send_factors(fd, hr, 0, two, 1, 10001, NAN);
		send_factors(fd, hr, 1, MSG_CHUNK_FLOATS, 1, 10001, NAN);
	} else {
		cr_assert_fail("no case %s", name);
	}
}

static struct factors_case factors_cases[] = {
	{ "run_off_a_piece", EPROTO, "does not end at one of the shard's pieces" },
	{ "run_past_a_weight", EPROTO, "not inside one dense layer's weight" },
	{ "batch_too_large", EPROTO, "a batch of 17, above [train] batch_size 16" },
	{ "too_many", EPROTO, "more factors than the run [0, 32768) needs (20002)" },
	{ "too_few", EPROTO, "ended with 200 of its 20002 factors" },
	{ "broken_off", EPROTO, "a run of factors broke off at offset 16384" },
	{ "another_batch", EPROTO, "not the next of the run" },
	{ "nan_factors", EDOM, "PUSH for version 0 refused" },
};

ParameterizedTestParameters(keyholder, factors_that_do_not_fit_are_refused)
{
	return cr_make_param_array(struct factors_case, factors_cases,
				   sizeof(factors_cases) / sizeof(factors_cases[0]));
}

/* Factors a ps cannot take as the gradient of one of its dense weights
 * get an ERROR that says why, before any piece of their run is
 * aggregated: the ps serves on, still at version 0 with every parameter
 * as it was (a pull answered with the whole first version). */
ParameterizedTest(struct factors_case *fc, keyholder, factors_that_do_not_fit_are_refused)
{
	struct target t;
	start_big_ps(&t, 2, "checkpoint_dir = ckpt\n");
	struct hs_result hr;
	static float p0[XN], p1[XN];
	unsigned dt = 0;
	const struct then_push none = { .fd = -1 };
	int fd = target_peer(&t, 1, &hr, 0);
	send_pull_flags(fd, &hr, 0, 0);
	recv_all_params(fd, &hr, p0, &dt, none);
	close(fd);
	target_wipe(&hr);
	fd = target_peer(&t, 0, &hr, 0);
	factors_sent(fc->name, fd, &hr);
	expect_error(fd, &hr, fc->name, (uint32_t)fc->code, fc->says, NULL);
	assert_logged(&t, fd, 0, fc->says, NULL);
	close(fd);
	target_wipe(&hr);
	fd = target_peer(&t, 0, &hr, 0);
	send_pull_flags(fd, &hr, 0, 0);
	recv_all_params(fd, &hr, p1, &dt, none);
	cr_assert_eq(memcmp(p0, p1, sizeof(p0)), 0, "%s moved the shard", fc->name);
	close(fd);
	target_wipe(&hr);
}

/* ---- (a) ROLLBACK that cannot be honoured ------------------------------------ */

/* Rows: what the ps has for step 7 when a key holder asks for it. */
struct rollback_case {
	char name[40];
	char extra[64];  /* [train] lines */
	int junk;        /* a step-00000007 directory whose manifest is junk */
	uint32_t code;
	char says[64];
};

static struct rollback_case rollbacks[] = {
	{ "no_checkpoint_of_that_step", "", 0, ENOENT, "there is no checkpoint of that step" },
	{ "checkpoints_off", "checkpoint_dir =\n", 0, ENOENT, "checkpoints are off" },
	{ "checkpoint_that_does_not_load", "", 1, EINVAL, "manifest" },
};

ParameterizedTestParameters(keyholder, rollback_that_cannot_be_honoured)
{
	return cr_make_param_array(struct rollback_case, rollbacks,
				   sizeof(rollbacks) / sizeof(rollbacks[0]));
}

/* The ps refuses, keeps its shard (a PULL on a new connection answers
 * version 0 with the parameters it had) and serves a real worker to the
 * end. It used to stop: the worker exited 3 and so did the ps. */
ParameterizedTest(struct rollback_case *rc, keyholder, rollback_that_cannot_be_honoured)
{
	struct target t;
	start_ps(&t, 1, 20, rc->extra);
	struct hs_result hr;
	float before[NPARAMS], after[NPARAMS];
	int fd = target_peer(&t, 0, &hr, 1);
	send_pull(fd, &hr, 0, 0);
	cr_assert_eq(recv_params(fd, &hr, before), 0);
	if (rc->junk) {
		char path[400];
		snprintf(path, sizeof(path), "%s/ckpt", target_dir);
		cr_assert(mkdir(path, 0700) == 0 || errno == EEXIST, "%s: %s", path, strerror(errno));
		snprintf(path, sizeof(path), "%s/ckpt/step-00000007", target_dir);
		cr_assert_eq(mkdir(path, 0700), 0, "%s: %s", path, strerror(errno));
		snprintf(path, sizeof(path), "%s/ckpt/step-00000007/manifest", target_dir);
		FILE *f = fopen(path, "w");
		cr_assert_not_null(f);
		fputs("not a manifest\n", f);
		cr_assert_eq(fclose(f), 0);
	}
	uint8_t m[MSG_ROLLBACK_BYTES];
	size_t len;
	char err[256];
	struct msg_rollback rb = { .step = 7 };
	cr_assert_eq(msg_encode_rollback(m, sizeof(m), &rb, &len, err, sizeof(err)), 0, "%s", err);
	send_msg(fd, &hr, m, len);
	expect_error(fd, &hr, "ROLLBACK to step 7", rc->code, "cannot roll back to step 7", rc->says);
	assert_logged(&t, fd, 0, "cannot roll back to step 7", rc->says);
	close(fd);
	target_wipe(&hr);

	fd = target_peer(&t, 0, &hr, 1);
	send_pull(fd, &hr, 0, 0);
	cr_assert_eq(recv_params(fd, &hr, after), 0, "the shard moved");
	cr_assert_eq(memcmp(before, after, sizeof(before)), 0, "%s: the shard changed", rc->name);
	close(fd);
	target_wipe(&hr);
	real_workers_finish(&t, 1, NULL);
}

/* ---- (b) non-finite gradients ------------------------------------------------ */

struct nan_case {
	char name[24];
	char extra[64];
	int W;   /* the key holder is worker W - 1 */
};

static struct nan_case nans[] = {
	/* Sync: the first push would wait in a slot for worker 0's, and
	 * their sum would be NaN. */
	{ "sync", "mode = sync\n", 2 },
	/* Async: each push would be applied on arrival. */
	{ "async", "mode = async\n", 1 },
};

ParameterizedTestParameters(keyholder, nan_gradients_are_refused)
{
	return cr_make_param_array(struct nan_case, nans, sizeof(nans) / sizeof(nans[0]));
}

/* Two pushes with NaN and infinite values: each gets an ERROR naming the
 * version and the first bad element, the shard keeps its version and
 * parameters bit for bit, and real workers then train to the end with
 * finite parameters. They used to be ACKed and make every parameter NaN. */
ParameterizedTest(struct nan_case *nc, keyholder, nan_gradients_are_refused)
{
	struct target t;
	start_ps(&t, nc->W, 20, nc->extra);
	uint32_t w = (uint32_t)nc->W - 1;
	struct hs_result hr;
	float p0[NPARAMS], p1[NPARAMS], g[NPARAMS];

	int fd = target_peer(&t, w, &hr, 1);
	send_pull(fd, &hr, 0, 0);
	uint64_t v0 = recv_params(fd, &hr, p0);
	cr_assert_eq(v0, 0);
	for (int i = 0; i < NPARAMS; i++)
		g[i] = 0.01f;
	g[5] = NAN;
	g[9] = INFINITY;
	send_push(fd, &hr, w, v0, 0, NPARAMS, g);
	expect_error(fd, &hr, "a PUSH with NaN", EDOM, "PUSH for version 0 refused", "element 5 (parameter 5) is NaN");
	assert_logged(&t, fd, (int)w, "PUSH for version 0 refused", "is NaN");
	close(fd);
	target_wipe(&hr);

	/* Again, on a new connection: -inf first, NaN after it. */
	for (int i = 3; i < NPARAMS; i++)
		g[i] = NAN;
	g[2] = -INFINITY;
	fd = target_peer(&t, w, &hr, 1);
	send_push(fd, &hr, w, v0, 0, NPARAMS, g);
	expect_error(fd, &hr, "a PUSH with -inf", EDOM, "PUSH for version 0 refused", "element 2 (parameter 2) is -inf");
	assert_logged(&t, fd, (int)w, "PUSH for version 0 refused", "is -inf");
	close(fd);
	target_wipe(&hr);

	fd = target_peer(&t, w, &hr, 1);
	send_pull(fd, &hr, 0, 0);
	cr_assert_eq(recv_params(fd, &hr, p1), v0, "the shard moved");
	cr_assert_eq(memcmp(p0, p1, sizeof(p0)), 0, "the shard changed");
	close(fd);
	target_wipe(&hr);

	char dump[300];
	snprintf(dump, sizeof(dump), "%s/final.f32", target_dir);
	real_workers_finish(&t, nc->W, dump);
	unsigned char *buf;
	size_t n;
	read_all(dump, &buf, &n);
	cr_assert_eq(n, sizeof(float) * NPARAMS);
	for (int i = 0; i < NPARAMS; i++) {
		float x;
		memcpy(&x, buf + sizeof(float) * (size_t)i, sizeof(x));
		cr_assert(isfinite(x), "final parameter %d is %f", i, x);
	}
	free(buf);
}

/* ---- (c) requests that cannot be honoured -------------------------------------- */

struct refusal {
	char name[40];
	int W;         /* workers; the key holder is worker W - 1 */
	int fn;        /* refusal_fns[fn] sends the request */
	uint32_t code;
	char says[64];
};

static void checkpoint_from_a_non_chief(int fd, struct hs_result *hr, uint32_t w)
{
	(void)w;
	uint8_t m[MSG_CHECKPOINT_BYTES];
	size_t len;
	char err[256];
	struct msg_checkpoint ck = { .step = 5 };
	cr_assert_eq(msg_encode_checkpoint(m, sizeof(m), &ck, &len, err, sizeof(err)), 0, "%s", err);
	send_msg(fd, hr, m, len);
}

/* A chunk running past the end of the shard. */
static void chunk_out_of_range(int fd, struct hs_result *hr, uint32_t w)
{
	static float g[NPARAMS + 37];
	send_push(fd, hr, w, 0, 0, NPARAMS + 37, g);
}

/* The first chunk of a PUSH at offset 100: a gap. */
static void chunk_with_a_gap(int fd, struct hs_result *hr, uint32_t w)
{
	static float g[16];
	send_push(fd, hr, w, 0, 100, 16, g);
}

/* A PUSH for a version the shard has not reached. */
static void push_ahead_of_the_shard(int fd, struct hs_result *hr, uint32_t w)
{
	static float g[NPARAMS];
	send_push(fd, hr, w, 99, 0, NPARAMS, g);
}

/* A PUSH naming worker 0 on worker 1's connection. */
static void push_naming_another_worker(int fd, struct hs_result *hr, uint32_t w)
{
	static float g[NPARAMS];
	send_push(fd, hr, w - 1, 0, 0, NPARAMS, g);
}

/* An ACK, which only a ps sends. */
static void unexpected_ack(int fd, struct hs_result *hr, uint32_t w)
{
	(void)w;
	uint8_t m[MSG_ACK_BYTES];
	size_t len;
	char err[256];
	struct msg_ack a = { .shard = 0, .version = 0, .status = MSG_ACK_APPLIED };
	cr_assert_eq(msg_encode_ack(m, sizeof(m), &a, &len, err, sizeof(err)), 0, "%s", err);
	send_msg(fd, hr, m, len);
}

/* A PULL one byte short. */
static void malformed_pull(int fd, struct hs_result *hr, uint32_t w)
{
	(void)w;
	uint8_t m[MSG_PULL_BYTES];
	size_t len;
	char err[256];
	struct msg_pull p = { .shard = 0, .version = 0 };
	cr_assert_eq(msg_encode_pull(m, sizeof(m), &p, &len, err, sizeof(err)), 0, "%s", err);
	send_msg(fd, hr, m, len - 1);
}

static void pull_for_another_shard(int fd, struct hs_result *hr, uint32_t w)
{
	(void)w;
	send_pull(fd, hr, 3, 0);
}

/* Two PULLs of the next versions at once: the first is being streamed
 * (it waits for every worker's gradient) when the second comes. */
static void second_pull_before_the_answer(int fd, struct hs_result *hr, uint32_t w)
{
	(void)w;
	send_pull(fd, hr, 0, 1);
	send_pull(fd, hr, 0, 2);
}

typedef void refusal_fn(int fd, struct hs_result *hr, uint32_t w);
static refusal_fn *const refusal_fns[] = { checkpoint_from_a_non_chief, chunk_out_of_range,
					    chunk_with_a_gap, push_ahead_of_the_shard,
					    push_naming_another_worker, unexpected_ack,
					    malformed_pull, pull_for_another_shard,
					    second_pull_before_the_answer };

static struct refusal refusals[] = {
	{ "checkpoint_from_a_non_chief", 2, 0, EPROTO, "CHECKPOINT from worker 1; only the chief" },
	{ "chunk_out_of_range", 1, 1, ERANGE, "outside the shard's range" },
	{ "chunk_with_a_gap", 1, 2, EPROTO, "leaves a gap" },
	{ "push_ahead_of_the_shard", 1, 3, EPROTO, "the shard is at version 0" },
	{ "push_naming_another_worker", 2, 4, EPROTO, "names worker 0 on worker 1's connection" },
	{ "unexpected_ack", 1, 5, EPROTO, "unexpected ACK message" },
	{ "malformed_pull", 1, 6, EMSGSIZE, "PULL" },
	{ "pull_for_another_shard", 1, 7, EPROTO, "PULL for shard 3" },
	{ "second_pull_before_the_answer", 2, 8, EPROTO,
	  "PULL for version 2 before the last one was answered" },
};

ParameterizedTestParameters(keyholder, request_that_cannot_be_honoured)
{
	return cr_make_param_array(struct refusal, refusals, sizeof(refusals) / sizeof(refusals[0]));
}

/* Each gets an ERROR with the reason, the ps logs one line naming the
 * worker, the peer and the reason, and real workers then train to the
 * end. They used to end the connection without a word to the peer. */
ParameterizedTest(struct refusal *rf, keyholder, request_that_cannot_be_honoured)
{
	struct target t;
	start_ps(&t, rf->W, 20, "");
	uint32_t w = (uint32_t)rf->W - 1;
	struct hs_result hr;
	cr_assert_lt((size_t)rf->fn, sizeof(refusal_fns) / sizeof(refusal_fns[0]));
	int fd = target_peer(&t, w, &hr, 1);
	refusal_fns[rf->fn](fd, &hr, w);
	expect_error(fd, &hr, rf->name, rf->code, rf->says, NULL);
	assert_logged(&t, fd, (int)w, rf->says, NULL);
	close(fd);
	target_wipe(&hr);
	real_workers_finish(&t, rf->W, NULL);
}

/* A peer refused while it is still sending (a worker half way through a
 * PUSH when its first chunk is refused, here an unexpected ACK followed by
 * 4 MB of HEARTBEATs) still gets the ERROR that says why: the ps used to
 * close right after sending it, with those bytes unread, and the reset
 * that such a close sends made the peer's writes fail and its kernel drop
 * the ERROR before it was read. The ps now shuts its sending half and
 * reads what still comes (bounded) before it closes. */
Test(keyholder, error_reaches_a_peer_still_sending)
{
	struct target t;
	start_ps(&t, 1, 20, "");
	struct hs_result hr;
	int fd = target_peer(&t, 0, &hr, 0);
	unexpected_ack(fd, &hr, 0);
	uint8_t m[MSG_HEARTBEAT_BYTES], *burst = malloc(4 << 20);
	cr_assert_not_null(burst);
	size_t len, flen, at = 0;
	char err[256];
	struct msg_heartbeat hb;
	memset(&hb, 0, sizeof(hb));
	cr_assert_eq(msg_encode_heartbeat(m, sizeof(m), &hb, &len, err, sizeof(err)), 0, "%s", err);
	while (at + FRAME_SEALED_BYTES(len) <= (4u << 20)) {
		cr_assert_eq(frame_seal(&hr.send, burst + at, FRAME_SEALED_BYTES(len), m, len, &flen, err,
					sizeof(err)), 0, "%s", err);
		at += flen;
	}
	char werr[256] = "";
	int wr = sock_write_full(fd, burst, at, IO_MS, werr, sizeof(werr));
	free(burst);
	static uint8_t buf[FRAME_CT_MAX];
	int r = sock_read_frame(SOCK_FD(fd), &hr.recv, buf, FRAME_CT_MAX, &len, IO_MS, err, sizeof(err));
	cr_assert_eq(r, 0, "the ERROR was lost (%s; our writes: %s)", err, wr ? "failed" : "went");
	cr_assert_eq(msg_type(buf, len, err, sizeof(err)), WIRE_ERROR);
	struct msg_error me;
	cr_assert_eq(msg_decode_error(buf, len, &me, err, sizeof(err)), 0, "%s", err);
	cr_assert_not_null(strstr(me.text, "unexpected ACK message"), "%s", me.text);
	cr_assert_eq(wr, 0, "our writes failed (%s): the ps reset the connection, and a worker "
		     "would have reported that, not the ERROR", werr);
	target_expect_closed(fd, IO_MS);
	close(fd);
	target_wipe(&hr);
	real_workers_finish(&t, 1, NULL);
}

/* A worker that goes silent in the middle of a PUSH (its link cut while a
 * frame was half sent: with pushes and parameters streaming for most of a
 * step, the common case) is reported as every silent peer is, "no traffic
 * for T s (peer_timeout)", not as the read that timed out. A shard of
 * 320067 values (20 pieces), so that the rest of the PUSH is read on the
 * pipe after its first chunk. */
Test(keyholder, peer_silent_mid_push_is_no_traffic)
{
	struct target t;
	start_big_ps(&t, 1, "checkpoint_dir = ckpt\n[cluster]\npeer_timeout = 2\n");
	struct hs_result hr;
	int fd = target_peer(&t, 0, &hr, 0);
	static float g[MSG_CHUNK_FLOATS];
	static uint8_t m[MSG_CHUNK_BYTES_MAX], f[FRAME_BYTES_MAX];
	char err[256];
	for (uint64_t i = 0; i < 2; i++) {
		size_t len, flen;
		struct msg_chunk ch = { .type = WIRE_PUSH, .shard = 0, .version = 0, .worker = 0,
					.offset = i * MSG_CHUNK_FLOATS, .count = MSG_CHUNK_FLOATS };
		cr_assert_eq(msg_encode_chunk(m, sizeof(m), &ch, g, &len, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(frame_seal(&hr.send, f, sizeof(f), m, len, &flen, err, sizeof(err)), 0, "%s", err);
		target_send(fd, f, i == 0 ? flen : flen / 2); /* the second frame half sent */
	}
	double took = target_expect_closed(fd, 8000);
	cr_assert(took >= 1.5, "closed after %.1f s, before peer_timeout (2 s)", took);
	assert_logged(&t, fd, 0, "no traffic for 2 s (peer_timeout)", NULL);
	close(fd);
	target_wipe(&hr);
}

/* The version of the PARAMS that answer a PULL on an elastic ps 0, after
 * the VIEW that may come first. */
static uint64_t recv_view_params(int fd, struct hs_result *hr, float *p, const char *what)
{
	static uint8_t buf[FRAME_CT_MAX];
	size_t len;
	char err[256];
	int type;
	while ((type = target_recv_msg(fd, hr, buf, &len, what)) == WIRE_VIEW)
		;
	cr_assert_eq(type, WIRE_PARAMS, "%s was answered with %s", what, wire_msg_name((uint8_t)type));
	struct msg_chunk ch;
	cr_assert_eq(msg_decode_chunk(buf, len, &ch, err, sizeof(err)), 0, "%s", err);
	msg_chunk_floats(p, &ch);
	return ch.version;
}

/* Elastic (2 workers listed, min_workers 1): worker 0 pulls step 0 alone
 * (its view gives it both slices), worker 1 joins after, and worker 0
 * asks for version 1 without pushing its slices of 0. Only it can push
 * them, and an elastic ps reads them on the thread that the PULL holds
 * (whole gradients, no streamer), so waiting would hold the shard and
 * worker 1 for ever (tests/fuzz/fuzz_ps.c's elastic mode found it). The
 * ps answers at once with the shard as it is, as after a revision, and
 * serves on: real workers train to the end. */
Test(keyholder, elastic_pull_ahead_of_its_own_slices_is_answered_at_once)
{
	struct target t;
	start_ps(&t, 2, 20, "checkpoint_dir = ckpt\n[cluster]\nmin_workers = 1\n");
	struct hs_result h0, h1;
	static float p[NPARAMS];
	int w0 = target_peer(&t, 0, &h0, 0);
	send_pull(w0, &h0, 0, 0);
	cr_assert_eq(recv_view_params(w0, &h0, p, "worker 0's PULL of 0"), 0);
	int w1 = target_peer(&t, 1, &h1, 0);
	send_pull(w1, &h1, 0, 0);
	cr_assert_eq(recv_view_params(w1, &h1, p, "worker 1's PULL of 0"), 0);
	send_pull(w0, &h0, 0, 1);   /* its slices of version 0 never pushed */
	cr_assert_eq(recv_view_params(w0, &h0, p, "worker 0's PULL of 1"), 0);
	close(w0);
	close(w1);
	target_wipe(&h0);
	target_wipe(&h1);
	real_workers_finish(&t, 2, NULL);
}

/* Elastic (2 workers listed, min_workers 1): worker 1 pulls step 0 alone
 * (its view gives it both slices) and says DONE without pushing them.
 * Accepted, nobody would ever push them: a finished worker's slices go to
 * no one, and the step, worker 0 and the run would wait for ever
 * (tests/fuzz/fuzz_ps.c's elastic mode found it, after a LEAVE). The ps
 * refuses the DONE; worker 1 is then lost and, past peer_timeout, its
 * slices go to the real worker 0, which trains to the end alone (a real
 * worker 1 beside it could train the whole run before the chief starts). */
Test(keyholder, elastic_done_before_its_slices_is_refused)
{
	struct target t;
	start_ps(&t, 2, 20, "checkpoint_dir = ckpt\n[cluster]\nmin_workers = 1\npeer_timeout = 1\n");
	struct hs_result h1;
	static float p[NPARAMS];
	int w1 = target_peer(&t, 1, &h1, 0);
	send_pull(w1, &h1, 0, 0);
	cr_assert_eq(recv_view_params(w1, &h1, p, "worker 1's PULL of 0"), 0);
	uint8_t m[MSG_DONE_BYTES];
	size_t len;
	char err[256];
	struct msg_done d = { .worker = 1, .leaving = 1 };
	cr_assert_eq(msg_encode_done(m, sizeof(m), &d, &len, err, sizeof(err)), 0, "%s", err);
	send_msg(w1, &h1, m, len);
	expect_error(w1, &h1, "DONE with step 0's slices not pushed", EPROTO, "DONE from worker 1",
		     "slices of step 0 not pushed");
	close(w1);
	target_wipe(&h1);
	real_workers_finish(&t, 1, NULL);
	cr_assert_not_null(strstr(slurp(t.log), "worker 1 did not come back"), "%s", slurp(t.log));
}

/* ---- the worker's side ----------------------------------------------------------- */

/* A ps that answers the worker's first PULL with ERROR: the worker prints
 * the text on one line naming the ps and exits 3 (what it did before this
 * issue too: kept). The ps is this process (net/conn.h's server side). */
Test(keyholder, worker_prints_a_ps_error_and_exits)
{
	struct target t;
	write_config(&t, 1, 20, "");
	int lfd;
	char err[256], wlog[300], peer[SOCK_ADDR_STRLEN];
	cr_assert_eq(sock_listen("127.0.0.1", (uint16_t)t.port, 0, &lfd, err, sizeof(err)), 0, "%s", err);
	snprintf(wlog, sizeof(wlog), "%s/worker0.log", target_dir);
	const char *args[] = { "worker", "--index", "0", "--config", t.cfg, NULL };
	pid_t w = target_spawn(args, wlog);
	int fd;
	cr_assert_eq(sock_accept(lfd, 10000, &fd, peer, sizeof(peer), err, sizeof(err)), 0, "%s", err);

	struct conn c;
	struct conn_shape shape = { .pipes = CONN_PIPE_ONE };
	cr_assert_eq(conn_init(&c, fd, &shape, IO_MS, IO_MS), 0);
	struct hs_identity me = { .role = HS_PS, .index = 0, .ciphers = frame_offers() };
	memcpy(me.config_hash, t.hash, HS_HASH_BYTES);
	cr_assert_eq(conn_server(&c, t.key, &me, IO_MS, err, sizeof(err)), 0, "%s", err);
	int type;
	do {
		size_t len;
		cr_assert_eq(conn_recv(&c, &len, err, sizeof(err)), 0, "%s", err);
		type = msg_type(c.rbuf, len, err, sizeof(err));
	} while (type == WIRE_HEARTBEAT || type == WIRE_COMPUTE);   /* what it opens with */
	cr_assert_eq(type, WIRE_PULL, "the worker sent %s first", wire_msg_name((uint8_t)type));
	conn_send_error(&c, CONN_MAIN, EPROTO, "refused: the test says no");

	int st[1];
	wait_children(&w, 1, st, RUN_TIMEOUT_S);
	conn_destroy(&c);
	close(lfd);
	char *log = slurp(wlog);
	cr_assert_eq(st[0], 3, "worker exit %d:\n%s", st[0], log);
	char line[200];
	snprintf(line, sizeof(line), "pstrain: ps 0 (127.0.0.1:%d): refused: the test says no\n", t.port);
	cr_assert_not_null(strstr(log, line), "no line \"%s\" in:\n%s", line, log);
}

/* An honest worker whose training diverges (learning_rate 1000 makes the
 * loss NaN within a few steps) stops before pushing a non-finite gradient,
 * says so and exits 1; the ps never sees one (it logs the connection
 * closing, no refused PUSH). It used to push NaNs and train on to the end.
 * The same when it pushes pieces while backward runs ([cluster] overlap):
 * those before the first non-finite one may have gone, that one not. */
Test(keyholder, diverging_worker_stops_before_pushing)
{
	struct target t;
	start_ps(&t, 1, 200, "learning_rate = 1000\ncheckpoint_dir =\n");
	/* The second worker is worker 0 connecting again. */
	for (int overlap = 0; overlap < 2; overlap++) {
		char wlog[300];
		snprintf(wlog, sizeof(wlog), "%s/worker0-%d.log", target_dir, overlap);
		const char *args[] = { "worker", "--index", "0", "--config", t.cfg, "--set",
				       overlap ? "cluster.overlap=true" : "cluster.overlap=false", NULL };
		pid_t w = target_spawn(args, wlog);
		int st[1];
		wait_children(&w, 1, st, RUN_TIMEOUT_S);
		char *log = slurp(wlog);
		cr_assert_eq(st[0], 1, "worker exit %d:\n%s", st[0], log);
		cr_assert_not_null(strstr(log, "the gradient is not finite"), "%s", log);
		cr_assert_not_null(strstr(log, "so it was not pushed"), "%s", log);
		cr_assert_eq(strstr(log, "as backward makes them") != NULL, overlap, "%s", log);
		cr_assert_eq(strstr(log, "not pushed from there on") != NULL, overlap, "%s", log);
		char *pslog = target_wait_log(&t, "closed worker 0's connection");
		const char *second = strstr(pslog, "closed worker 0's connection");
		if (overlap) {
			for (int i = 0; i < 100 && !(second && strstr(second + 1, "closed worker 0's connection")); i++) {
				target_nap_ms(50);
				pslog = slurp(t.log);
				second = strstr(pslog, "closed worker 0's connection");
			}
			second = second ? strstr(second + 1, "closed worker 0's connection") : NULL;
		}
		cr_assert_not_null(second, "%s", pslog);
		cr_assert_null(strstr(pslog, "refused"), "%s", pslog);
	}
}

/* ---- in-process: the check and the shard ------------------------------------------ */

static float from_bits(uint32_t b)
{
	float x;
	memcpy(&x, &b, sizeof(x));
	return x;
}

/* optim_nonfinite finds the first NaN or infinity wherever it is (in
 * every lane of a vector and across block boundaries), and passes every
 * finite value: the largest, the smallest subnormal, -0. */
Test(keyholder, nonfinite_check_finds_the_first_bad_value)
{
	enum { N = 10000 };
	float *g = malloc(N * sizeof(float));
	cr_assert_not_null(g);
	const float finite[] = { 0.0f, -0.0f, 1.0f, -1.0f, 3.4028235e38f, -3.4028235e38f,
				 from_bits(0x00000001u), from_bits(0x807fffffu), 1e-30f };
	for (size_t i = 0; i < N; i++)
		g[i] = finite[i % (sizeof(finite) / sizeof(finite[0]))];
	cr_assert_eq(optim_nonfinite(g, N), N);
	cr_assert_eq(optim_nonfinite(g, 0), 0);
	const uint32_t bad[] = { 0x7f800000u /* +inf */, 0xff800000u /* -inf */,
				 0x7fc00000u /* quiet NaN */, 0xffc00000u /* -NaN */,
				 0x7f800001u /* signalling NaN */, 0xffffffffu };
	const size_t at[] = { 0, 1, 3, 7, 15, 16, 4095, 4096, 4097, 8191, N - 1 };
	for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++)
		for (size_t a = 0; a < sizeof(at) / sizeof(at[0]); a++) {
			float keep = g[at[a]];
			g[at[a]] = from_bits(bad[b]);
			cr_assert_eq(optim_nonfinite(g, N), at[a], "0x%08x at %zu", bad[b], at[a]);
			cr_assert_eq(optim_nonfinite(g, at[a]), at[a], "0x%08x past the end", bad[b]);
			if (at[a] + 1 < N) {
				g[N - 1] = from_bits(bad[b]);
				cr_assert_eq(optim_nonfinite(g, N), at[a], "the first of two");
				g[N - 1] = finite[(N - 1) % (sizeof(finite) / sizeof(finite[0]))];
			}
			g[at[a]] = keep;
		}
	free(g);
}

/* A config text for the in-process tests: 1 ps, W workers, extra [train]. */
static void shard_config(struct config *c, struct model *m, int W, const char *extra)
{
	char text[2048], err[CONFIG_ERR_MAX];
	int len = snprintf(text, sizeof(text),
			   "[cluster]\nps = 127.0.0.1:2222\nworkers = 127.0.0.1:61000%s\n[train]\nseed = 5\nsteps = 100\n%s\n"
			   "[model]\ninput = 6\nlayer = dense 16\nlayer = relu\nlayer = dense 3\n",
			   W == 2 ? ", 127.0.0.1:61001" : "", extra);
	cr_assert_lt(len, (int)sizeof(text));
	cr_assert_eq(config_parse_string(c, "t.ini", text, err, sizeof(err)), 0, "%s\n%s", err, text);
	cr_assert_eq(model_build(m, &c->model, err, sizeof(err)), 0, "%s", err);
}

/* psshard_push refuses a gradient with a NaN or an infinity (-EDOM) and
 * leaves everything as it was: sync, the gradient already waiting is still
 * the only one and the next good one completes the step exactly as if the
 * bad one had never come; async, nothing is applied. */
Test(keyholder, psshard_push_refuses_nonfinite_gradients)
{
	static struct config c;
	struct model m;
	char err[256];
	const char *modes[] = { "mode = sync\n", "mode = async\n" };
	for (int k = 0; k < 2; k++) {
		shard_config(&c, &m, 2, modes[k]);
		struct shard r = { 0, m.nparams };
		struct psshard s, ref;
		cr_assert_eq(psshard_init(&s, &m, &r, &c, 100, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(psshard_init(&ref, &m, &r, &c, 100, err, sizeof(err)), 0, "%s", err);
		size_t n = s.n;
		float *good = malloc(n * sizeof(float)), *bad = malloc(n * sizeof(float));
		cr_assert(good && bad);
		for (size_t i = 0; i < n; i++)
			good[i] = bad[i] = 0.001f * (float)(i % 17) - 0.008f;
		bad[n / 2] = NAN;
		enum psshard_outcome oc;
		if (k == 0) {
			cr_assert_eq(psshard_push(&s, 1, 0, good, &oc), 0);
			cr_assert_eq(psshard_push(&ref, 1, 0, good, &oc), 0);
		}
		cr_assert_eq(psshard_push(&s, 0, 0, bad, &oc), -EDOM, "%s", modes[k]);
		bad[n / 2] = -INFINITY;
		cr_assert_eq(psshard_push(&s, 0, 0, bad, &oc), -EDOM, "%s", modes[k]);
		cr_assert_eq(s.received, ref.received, "%s", modes[k]);
		cr_assert_eq(psshard_waiting(&s), psshard_waiting(&ref), "%s", modes[k]);
		cr_assert_eq(psshard_has_pushed(&s, 0), 0, "%s", modes[k]);
		cr_assert_eq(psshard_version(&s), 0, "%s", modes[k]);
		cr_assert_eq(memcmp(s.params, ref.params, n * sizeof(float)), 0, "%s", modes[k]);
		cr_assert_eq(psshard_push(&s, 0, 0, good, &oc), 0);
		cr_assert_eq(psshard_push(&ref, 0, 0, good, &oc), 0);
		cr_assert_eq(oc, PSSHARD_APPLIED);
		cr_assert_eq(psshard_version(&s), 1, "%s", modes[k]);
		cr_assert_eq(memcmp(s.params, ref.params, n * sizeof(float)), 0,
			     "%s: the step differs from one without the refused pushes", modes[k]);
		cr_assert_eq(optim_nonfinite(s.params, n), n);
		free(good);
		free(bad);
		psshard_free(&s);
		psshard_free(&ref);
	}
}

/* Every value of a (n) is x. */
static void assert_all(const float *a, size_t n, float x, const char *what)
{
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(a[i], x, "%s[%zu] = %g, expected %g", what, i, a[i], x);
}

static void fill(float *a, size_t n, float x)
{
	for (size_t i = 0; i < n; i++)
		a[i] = x;
}

/* Rewrites shard file 0 of stepdir so that its last tensor's adam v moment
 * has another name, with checksums that match again: a checkpoint that
 * passes every check before loading and fails after the parameters and
 * most moments have been copied. */
static void damage_last_moment(const char *stepdir, const struct ckpt_layout *l)
{
	char path[600], name[200], err[256];
	snprintf(path, sizeof(path), "%s/shard-0-of-1.safetensors", stepdir);
	unsigned char *buf;
	size_t n;
	read_all(path, &buf, &n);
	snprintf(name, sizeof(name), "\"optim.v.%s\"", l->t[l->nt - 1].name);
	unsigned char *hit = memmem(buf, n, name, strlen(name));
	cr_assert_not_null(hit, "no %s in %s", name, path);
	hit[7] = 'w'; /* "optim.w.NAME": same length, same offsets */
	FILE *f = fopen(path, "wb");
	cr_assert(f && fwrite(buf, 1, n, f) == n && fclose(f) == 0);
	static struct ckpt_manifest mf;
	cr_assert_eq(manifest_read(&mf, stepdir, err, sizeof(err)), 0, "%s", err);
	crypto_generichash(mf.shards[0].sum, CKPT_HASH_BYTES, buf, n, NULL, 0);
	free(buf);
	snprintf(path, sizeof(path), "%s/manifest-0-of-1", stepdir);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	struct manifest_arg a = { &mf, 0 };
	cr_assert_eq(manifest_fill(f, &a, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(fclose(f), 0);
	cr_assert_eq(manifest_read(&mf, stepdir, err, sizeof(err)), 0, "the damaged manifest: %s", err);
}

/* A ROLLBACK whose checkpoint fails to load, before or half way through,
 * or that has no checkpoint, leaves parameters, moments, the optimizer's
 * step and the version exactly as they were; a good checkpoint then
 * restores. (checkpoint_load filled the shard tensor by tensor: the damaged
 * one used to leave every parameter restored and the last moment not.) */
Test(keyholder, failed_rollback_leaves_the_shard_untouched)
{
	static struct config c;
	struct model m;
	char err[CONFIG_ERR_MAX], extra[400], stepdir[400];
	snprintf(extra, sizeof(extra), "optimizer = adam\ncheckpoint_dir = %s/ckpt\n", target_dir);
	shard_config(&c, &m, 1, extra);
	struct shard r = { 0, m.nparams };
	struct psshard sh;
	cr_assert_eq(psshard_init(&sh, &m, &r, &c, 100, err, sizeof(err)), 0, "%s", err);
	size_t n = sh.n;
	cr_assert(sh.opt.m && sh.opt.v);
	pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	FILE *out = fopen("/dev/null", "w");
	cr_assert_not_null(out);
	struct ps_store st;
	cr_assert_eq(ps_store_open(&st, &mu, &sh, NULL, &m, &c, 0, 1, out, err, sizeof(err)), 0, "%s", err);
	cr_assert_not_null(st.lay);

	/* Checkpoints 2 (good) and 3 (damaged) of a state of 1s, 2s and 3s. */
	float *p = malloc(n * sizeof(float)), *mm = malloc(n * sizeof(float)), *vv = malloc(n * sizeof(float));
	cr_assert(p && mm && vv);
	fill(p, n, 1), fill(mm, n, 2), fill(vv, n, 3);
	struct ckpt_state cs = { .params = p, .m = mm, .v = vv, .t = 3 };
	for (long step = 2; step <= 3; step++)
		cr_assert_eq(checkpoint_save_shard(c.train.checkpoint_dir, st.lay, step, 0, &cs, 0, 5, NULL, err,
						   sizeof(err)), 0, "%s", err);
	checkpoint_step_dir(stepdir, sizeof(stepdir), c.train.checkpoint_dir, 3);
	damage_last_moment(stepdir, st.lay);

	/* The shard at version 5, state 7s, 8s, 9s, t 11. */
	fill(sh.params, n, 7), fill(sh.opt.m, n, 8), fill(sh.opt.v, n, 9);
	sh.opt.t = 11;
	psshard_rewind(&sh, 5);
	const uint64_t bad_steps[] = { 3, 4 };
	for (int i = 0; i < 2; i++) {
		uint64_t step = bad_steps[i];
		pthread_mutex_lock(&mu);
		int e = ps_store_rollback(&st, &step, err, sizeof(err));
		pthread_mutex_unlock(&mu);
		cr_assert_lt(e, 0, "rollback to step %llu: %d", (unsigned long long)bad_steps[i], e);
		cr_assert_eq(e, i ? -ENOENT : -EINVAL, "%d: %s", e, err);
		assert_all(sh.params, n, 7, "params");
		assert_all(sh.opt.m, n, 8, "m");
		assert_all(sh.opt.v, n, 9, "v");
		cr_assert_eq(sh.opt.t, 11);
		cr_assert_eq(psshard_version(&sh), 5);
	}
	uint64_t step = 2;
	pthread_mutex_lock(&mu);
	int e = ps_store_rollback(&st, &step, err, sizeof(err));
	pthread_mutex_unlock(&mu);
	cr_assert_eq(e, 0, "%s", err);
	assert_all(sh.params, n, 1, "params");
	assert_all(sh.opt.m, n, 2, "m");
	assert_all(sh.opt.v, n, 3, "v");
	cr_assert_eq(sh.opt.t, 3);
	cr_assert_eq(psshard_version(&sh), 2);

	ps_store_close(&st);
	psshard_free(&sh);
	fclose(out);
	free(p);
	free(mm);
	free(vv);
}
