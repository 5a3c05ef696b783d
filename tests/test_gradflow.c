/* Tests of a gradient made final piece by piece (core/nn/gradflow.c) and of
 * the backward pass that makes it so (replica_train_flow): merged final
 * ranges, each stream's frontier, which stream is furthest behind,
 * readers that wait and are released by a failure; the split backward's
 * gradient equal to the whole one's, each range reported only once its
 * values are final; and the forward pass on parameters that arrive in
 * pieces (replica_forward_flow) equal to the whole one. */
#include <criterion/criterion.h>

#include "leak.h"

#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/nn/backend.h"
#include "../core/config/config.h"
#include "../core/nn/gradflow.h"
#include "../core/nn/model.h"
#include "../core/nn/replica.h"
#include "../core/nn/rng.h"

TestSuite(gradflow, .fini = leak_check);

Test(gradflow, marks_merge_and_frontiers_follow)
{
	struct gradflow f;
	size_t b[2] = { 0, 50 }, e[2] = { 50, 100 };
	cr_assert_eq(gradflow_init(&f, 100, 2, b, e, 8), 0);
	cr_assert_eq(gradflow_frontier(&f, 0), 0);
	cr_assert_eq(gradflow_mark(&f, 10, 20), 0);
	cr_assert_eq(gradflow_mark(&f, 30, 40), 0);
	cr_assert_eq(f.ndone, 2);
	cr_assert_eq(gradflow_frontier(&f, 0), 0, "nothing final at the stream's start");
	cr_assert_eq(gradflow_mark(&f, 20, 30), 0);
	cr_assert_eq(f.ndone, 1, "touching ranges merge");
	cr_assert_eq(gradflow_mark(&f, 0, 10), 0);
	cr_assert_eq(gradflow_frontier(&f, 0), 40);
	cr_assert_eq(gradflow_mark(&f, 45, 70), 0);
	cr_assert_eq(gradflow_frontier(&f, 0), 40);
	cr_assert_eq(gradflow_frontier(&f, 1), 70, "the range across the streams' border counts for stream 1");
	cr_assert_eq(gradflow_mark(&f, 40, 45), 0);
	cr_assert_eq(gradflow_frontier(&f, 0), 50, "a frontier stops at its stream's end");
	cr_assert_not(gradflow_complete(&f));
	cr_assert_eq(gradflow_mark(&f, 60, 100), 0, "overlapping marks are fine");
	cr_assert(gradflow_complete(&f));
	cr_assert_eq(gradflow_mark(&f, 90, 101), -EINVAL);
	gradflow_reset(&f);
	cr_assert_eq(gradflow_frontier(&f, 1), 50, "reset: nothing final");
	gradflow_free(&f);
}

Test(gradflow, behind_is_the_stream_with_the_least_of_its_range_final)
{
	struct gradflow f;
	size_t b[3] = { 0, 10, 100 }, e[3] = { 10, 100, 1000 }, at = 0;
	cr_assert_eq(gradflow_init(&f, 1000, 3, b, e, 8), 0);
	cr_assert_eq(gradflow_behind(&f, &at), 0, "a tie goes to the first");
	cr_assert_eq(gradflow_mark(&f, 0, 5), 0);     /* stream 0 half done */
	cr_assert_eq(gradflow_mark(&f, 100, 200), 0); /* stream 2 a ninth */
	cr_assert_eq(gradflow_behind(&f, &at), 1);
	cr_assert_eq(at, 10);
	cr_assert_eq(gradflow_mark(&f, 10, 100), 0);
	cr_assert_eq(gradflow_behind(&f, &at), 2);
	cr_assert_eq(at, 200);
	cr_assert_eq(gradflow_mark(&f, 200, 1000), 0);
	cr_assert_eq(gradflow_behind(&f, &at), 0);
	cr_assert_eq(at, 5);
	cr_assert_eq(gradflow_mark(&f, 5, 10), 0);
	cr_assert_eq(gradflow_behind(&f, &at), -1, "every stream complete");
	gradflow_free(&f);
}

Test(gradflow, too_many_separate_ranges_fail_the_flow)
{
	struct gradflow f;
	size_t b = 0, e = 100, have;
	cr_assert_eq(gradflow_init(&f, 100, 1, &b, &e, 2), 0);
	cr_assert_eq(gradflow_mark(&f, 10, 20), 0);
	cr_assert_eq(gradflow_mark(&f, 30, 40), 0);
	cr_assert_eq(gradflow_mark(&f, 50, 60), -ENOSPC);
	cr_assert_eq(gradflow_wait(&f, 0, 10, &have), -ECANCELED, "a reader is not left waiting");
	gradflow_free(&f);
	cr_assert_eq(gradflow_init(&f, 10, 1, &b, &e, 2), -EINVAL, "a stream past the vector");
}

/* A reader on its own thread: of stream 0's prefix (gradflow_wait), or
 * with at set of the range from lo (gradflow_wait_at). */
struct reader {
	struct gradflow *f;
	int at;
	size_t lo, want, have;
	int r;
};

static void *reader_main(void *arg)
{
	struct reader *rd = arg;
	rd->r = rd->at ? gradflow_wait_at(rd->f, rd->lo, rd->want, &rd->have)
		       : gradflow_wait(rd->f, 0, rd->want, &rd->have);
	return NULL;
}

Test(gradflow, a_reader_waits_for_its_prefix_and_a_failure_releases_it)
{
	struct gradflow f;
	size_t b = 100, e = 200;
	cr_assert_eq(gradflow_init(&f, 300, 1, &b, &e, 4), 0);
	struct reader rd = { .f = &f, .want = 150, .r = 1 };
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, reader_main, &rd), 0);
	cr_assert_eq(gradflow_mark(&f, 120, 300), 0);
	usleep(20000);
	cr_assert_eq(rd.r, 1, "still waiting: [100, 120) is not final");
	cr_assert_eq(gradflow_mark(&f, 100, 120), 0);
	pthread_join(th, NULL);
	cr_assert_eq(rd.r, 0);
	cr_assert_eq(rd.have, 200, "the whole final prefix, clipped to the stream");

	gradflow_reset(&f);
	rd = (struct reader){ .f = &f, .want = 500, .r = 1 };
	cr_assert_eq(pthread_create(&th, NULL, reader_main, &rd), 0);
	cr_assert_eq(gradflow_mark(&f, 100, 150), 0);
	usleep(20000);
	cr_assert_eq(rd.r, 1);
	gradflow_fail(&f);
	pthread_join(th, NULL);
	cr_assert_eq(rd.r, -ECANCELED);
	cr_assert_eq(rd.have, 150);
	gradflow_free(&f);
}

/* The parameters' direction: a range that spans two streams is waited
 * for whatever stream marks it, and the reach is the final range's end,
 * not a stream's. */
Test(gradflow, a_range_reader_waits_across_streams_and_a_failure_releases_it)
{
	struct gradflow f;
	size_t b[2] = { 0, 100 }, e[2] = { 100, 300 };
	cr_assert_eq(gradflow_init(&f, 300, 2, b, e, 4), 0);
	struct reader rd = { .f = &f, .at = 1, .lo = 50, .want = 150, .r = 1 };
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, reader_main, &rd), 0);
	cr_assert_eq(gradflow_mark(&f, 100, 200), 0);
	usleep(20000);
	cr_assert_eq(rd.r, 1, "still waiting: [50, 100) is not final");
	cr_assert_eq(gradflow_mark(&f, 0, 60), 0);
	usleep(20000);
	cr_assert_eq(rd.r, 1, "still waiting: [60, 100) is not final");
	cr_assert_eq(gradflow_mark(&f, 60, 100), 0);
	pthread_join(th, NULL);
	cr_assert_eq(rd.r, 0);
	cr_assert_eq(rd.have, 200, "the whole final range from lo, across the streams");

	size_t have = 0;
	cr_assert_eq(gradflow_wait_at(&f, 150, 120, &have), 0, "nothing to wait for below lo");
	cr_assert_eq(have, 200);
	cr_assert_eq(gradflow_wait_at(&f, 0, 200, &have), 0);

	gradflow_reset(&f);
	rd = (struct reader){ .f = &f, .at = 1, .lo = 0, .want = 1000, .r = 1 };
	cr_assert_eq(pthread_create(&th, NULL, reader_main, &rd), 0);
	cr_assert_eq(gradflow_mark(&f, 0, 300), 0);
	pthread_join(th, NULL);
	cr_assert_eq(rd.r, 0, "want is clipped to n");
	cr_assert_eq(rd.have, 300);

	gradflow_reset(&f);
	rd = (struct reader){ .f = &f, .at = 1, .lo = 0, .want = 10, .r = 1 };
	cr_assert_eq(pthread_create(&th, NULL, reader_main, &rd), 0);
	usleep(20000);
	cr_assert_eq(rd.r, 1);
	gradflow_fail(&f);
	pthread_join(th, NULL);
	cr_assert_eq(rd.r, -ECANCELED);
	gradflow_free(&f);
}

Test(gradflow, later_streams_are_left_to_the_end)
{
	struct gradflow f;
	size_t b[2] = { 0, 100 }, e[2] = { 100, 1000 }, at = 0;
	cr_assert_eq(gradflow_init(&f, 1000, 2, b, e, 8), 0);
	cr_assert_eq(gradflow_behind(&f, &at), 0);
	gradflow_later(&f, 0, 1);
	cr_assert(gradflow_is_later(&f, 0));
	cr_assert_eq(gradflow_behind(&f, &at), 1, "stream 0 is later, however far behind");
	cr_assert_eq(at, 100);
	cr_assert_eq(gradflow_mark(&f, 100, 1000), 0);
	cr_assert_eq(gradflow_behind(&f, &at), -1, "only a later stream is left: nothing is behind");
	gradflow_reset(&f);
	cr_assert(gradflow_is_later(&f, 0), "a reset leaves which streams are later alone");
	gradflow_later(&f, 0, 0);
	cr_assert_eq(gradflow_behind(&f, &at), 0);
	gradflow_free(&f);
}

/* The split backward against the whole one. */
struct check {
	const float *grads;
	float *snap;           /* each range's values when it was reported */
	size_t P;
	unsigned char *seen;
	int calls, early;
	struct gradflow *f;
	const struct model *m;
	size_t first_block;    /* the first dense weight range reported */
	int blocks;            /* dense weight ranges reported */
	int later_early;       /* ranges of a later stream's dense weights reported
				* before every other stream was final */
};

/* Whether [lo, hi) lies in the weight of a dense layer. */
static int in_dense_weight(const struct model *m, size_t lo, size_t hi)
{
	for (int i = 0; i < m->nlayers; i++) {
		const struct layer *l = &m->layers[i];
		if (l->kind == LAYER_DENSE && lo >= l->woff && hi <= l->woff + (size_t)l->out * (size_t)l->in)
			return 1;
	}
	return 0;
}

/* Every range is reported once; what it holds then is kept, to be
 * compared with what it holds at the end. */
static int check_final(void *ctx, size_t lo, size_t hi)
{
	struct check *ck = ctx;
	ck->calls++;
	for (size_t i = lo; i < hi; i++) {
		cr_assert_eq(ck->seen[i], 0, "parameter %zu reported twice", i);
		ck->seen[i] = 1;
	}
	memcpy(ck->snap + lo, ck->grads + lo, (hi - lo) * sizeof(float));
	if (in_dense_weight(ck->m, lo, hi)) {
		if (!ck->blocks++)
			ck->first_block = hi - lo;
		/* A block for a stream not yet final may run into the next
		 * stream's (the rest of the row at the border); one that
		 * meets no such stream must wait until all are final. */
		int pending = 0, meets_pending = 0, meets_later = 0;
		for (int k = 0; k < ck->f->nstreams; k++) {
			int meets = lo < ck->f->end[k] && hi > ck->f->begin[k];
			if (gradflow_is_later(ck->f, k)) {
				meets_later |= meets;
			} else if (gradflow_frontier(ck->f, k) < ck->f->end[k]) {
				pending = 1;
				meets_pending |= meets;
			}
		}
		ck->later_early += meets_later && pending && !meets_pending;
	}
	return gradflow_mark(ck->f, lo, hi);
}

/* later: a mask of the streams gradflow_later marks. Returns the dense
 * weight blocks the split backward made. */
static int split_matches_whole(const char *input, int inputs, const char *layers, int nps, int later)
{
	char text[2048], err[512];
	struct config c;
	struct model m;
	snprintf(text, sizeof(text), "[train]\nbatch_size = 16\n[model]\ninput = %s\n%s", input, layers);
	cr_assert_eq(config_parse_string(&c, "t.ini", text, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(&m, &c.model, err, sizeof(err)), 0, "%s", err);
	int B = 16;
	size_t P = m.nparams;
	float *x = malloc((size_t)B * inputs * sizeof(float)), *p = malloc(P * sizeof(float));
	float *g1 = calloc(P, sizeof(float)), *g2 = calloc(P, sizeof(float));
	int32_t *y = malloc((size_t)B * sizeof(int32_t));
	float *snap = calloc(P, sizeof(float));
	unsigned char *seen = calloc(P, 1);
	cr_assert(x && p && g1 && g2 && y && seen);
	for (size_t i = 0; i < (size_t)B * inputs; i++)
		x[i] = (float)rng_uniform(7, RNG_DATA, i);
	for (int i = 0; i < B; i++)
		y[i] = (int32_t)(rng_hash(7, RNG_DATA + 1, (uint64_t)i) % (uint64_t)m.outputs);
	model_init_params(&m, p, 0, P, 3);
	struct backend be;
	backend_cpu(&be, 1);
	struct replica r1, r2;
	cr_assert_eq(replica_init(&r1, &m, &be, B, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(replica_init(&r2, &m, &be, B, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(replica_flow_init(&r2), 0);
	struct gradflow f;
	size_t b[4], e[4];
	for (int k = 0; k < nps; k++) {
		b[k] = P * (size_t)k / (size_t)nps;
		e[k] = P * (size_t)(k + 1) / (size_t)nps;
	}
	cr_assert_eq(gradflow_init(&f, P, nps, b, e, 1 << 16), 0);
	for (int k = 0; k < nps; k++)
		gradflow_later(&f, k, later >> k & 1);
	struct check ck = { .grads = g2, .snap = snap, .P = P, .seen = seen, .f = &f, .m = &m };
	uint64_t key = replica_key(1, 5, 0);
	cr_assert_eq(replica_load(&r1, x, y, B), 0);
	cr_assert_eq(replica_train(&r1, p, g1, r1.x, r1.y, B, key, 1.0f / B), 0);
	cr_assert_eq(replica_load(&r2, x, y, B), 0);
	cr_assert_eq(replica_train_flow(&r2, p, g2, r2.x, r2.y, B, key, 1.0f / B, &f, check_final, &ck), 0);
	cr_assert(gradflow_complete(&f));
	for (size_t i = 0; i < P; i++)
		cr_assert_eq(seen[i], 1, "parameter %zu never reported final", i);
	for (size_t i = 0; i < P; i++)
		ck.early += memcmp(&snap[i], &g2[i], sizeof(float)) != 0;
	cr_assert_eq(ck.early, 0, "%d values reported before they were final", ck.early);
	cr_assert_gt(ck.calls, 3, "the dense weights come in blocks, not at once");
	cr_assert_leq(ck.first_block, REPLICA_FLOW_BLOCK, "the first block is at most a piece");
	cr_assert_eq(ck.later_early, 0, "%d blocks of a later stream came before the others were final",
		     ck.later_early);
	/* The same sums, but a GEMM over a block of rows need not add in the
	 * order of one over the whole matrix (OpenBLAS's Haswell kernels do
	 * not), so the split backward's gradient equals the whole one's up
	 * to float rounding, not bit for bit. */
	float gmax = 0;
	for (size_t i = 0; i < P; i++)
		gmax = fmaxf(gmax, fabsf(g1[i]));
	cr_assert_gt(gmax, 0);
	for (size_t i = 0; i < P; i++)
		cr_assert_leq(fabsf(g1[i] - g2[i]), 1e-5f * fabsf(g1[i]) + 1e-6f * gmax,
			      "the split backward's gradient differs at %zu: %g against %g", i,
			      (double)g2[i], (double)g1[i]);
	double l1, l2, c1, c2;
	cr_assert_eq(replica_meter(&r1, &l1, &c1), 0);
	cr_assert_eq(replica_meter(&r2, &l2, &c2), 0);
	cr_assert_eq(l1, l2);
	cr_assert_eq(c1, c2);
	gradflow_free(&f);
	replica_free(&r1);
	replica_free(&r2);
	free(x);
	free(p);
	free(g1);
	free(g2);
	free(snap);
	free(y);
	free(seen);
	return ck.blocks;
}

/* The forward pass on arriving parameters: nps streams (shards) bring
 * src into dst a piece at a time, in turn, and only when the pass asks
 * for a range that is not all there; each range handed over is checked
 * final and taken once. */
struct arrive {
	struct gradflow f;
	const float *src;
	float *dst;             /* what the replica computes with */
	size_t P, piece, next[4];
	int nps, turn;
	unsigned char *taken;
	int calls, twice, early;
};

static int flow_mark(void *ctx, size_t lo, size_t hi)
{
	return gradflow_mark(ctx, lo, hi);
}

static void arrive_more(struct arrive *a)
{
	for (int tries = 0; tries < a->nps; tries++, a->turn = (a->turn + 1) % a->nps) {
		int k = a->turn;
		if (a->next[k] >= a->f.end[k])
			continue;
		size_t lo = a->next[k], hi = lo + a->piece < a->f.end[k] ? lo + a->piece : a->f.end[k];
		memcpy(a->dst + lo, a->src + lo, (hi - lo) * sizeof(float));
		cr_assert_eq(gradflow_mark(&a->f, lo, hi), 0);
		a->next[k] = hi;
		a->turn = (a->turn + 1) % a->nps;
		return;
	}
}

static int arrive_ready(void *ctx, size_t lo, size_t want, size_t most, size_t unit, size_t *have)
{
	struct arrive *a = ctx;
	a->calls++;
	cr_assert_leq(want, most);
	cr_assert(want == most || (want - lo) % unit == 0);
	size_t got = 0;
	while (gradflow_wait_at(&a->f, lo, lo, &got), got < want)
		arrive_more(a);
	cr_assert_eq(gradflow_wait_at(&a->f, lo, want, have), 0);
	*have = *have >= most ? most : lo + (*have - lo) / unit * unit;
	for (size_t i = lo; i < *have; i++) {
		a->twice += a->taken[i];
		a->taken[i] = 1;
	}
	return 0;
}

/* replica_forward_flow then replica_backward_flow against replica_train:
 * the same loss, the same right answers and the same gradient, with the
 * parameters arriving in pieces over nps streams while the dense layers
 * compute block by block. */
static void arriving_matches_whole(const char *input, int inputs, const char *layers, int nps, size_t piece)
{
	char text[2048], err[512];
	struct config c;
	struct model m;
	snprintf(text, sizeof(text), "[train]\nbatch_size = 16\n[model]\ninput = %s\n%s", input, layers);
	cr_assert_eq(config_parse_string(&c, "t.ini", text, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(&m, &c.model, err, sizeof(err)), 0, "%s", err);
	int B = 16;
	size_t P = m.nparams;
	float *x = malloc((size_t)B * inputs * sizeof(float)), *p = malloc(P * sizeof(float));
	float *q = malloc(P * sizeof(float)), *g1 = calloc(P, sizeof(float)), *g2 = calloc(P, sizeof(float));
	int32_t *y = malloc((size_t)B * sizeof(int32_t));
	unsigned char *taken = calloc(P, 1);
	cr_assert(x && p && q && g1 && g2 && y && taken);
	for (size_t i = 0; i < (size_t)B * inputs; i++)
		x[i] = (float)rng_uniform(7, RNG_DATA, i);
	for (int i = 0; i < B; i++)
		y[i] = (int32_t)(rng_hash(7, RNG_DATA + 1, (uint64_t)i) % (uint64_t)m.outputs);
	model_init_params(&m, p, 0, P, 3);
	/* What has not arrived is NaN: a layer that used it would show. */
	for (size_t i = 0; i < P; i++)
		q[i] = NAN;
	struct backend be;
	backend_cpu(&be, 1);
	struct replica r1, r2;
	cr_assert_eq(replica_init(&r1, &m, &be, B, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(replica_init(&r2, &m, &be, B, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(replica_flow_init(&r2), 0);
	struct arrive a = { .src = p, .dst = q, .P = P, .piece = piece, .nps = nps, .taken = taken };
	size_t b[4], e[4];
	for (int k = 0; k < nps; k++) {
		b[k] = a.next[k] = P * (size_t)k / (size_t)nps;
		e[k] = P * (size_t)(k + 1) / (size_t)nps;
	}
	cr_assert_eq(gradflow_init(&a.f, P, nps, b, e, 16), 0);
	struct gradflow gf;
	cr_assert_eq(gradflow_init(&gf, P, nps, b, e, 1 << 16), 0);
	uint64_t key = replica_key(1, 5, 0);
	cr_assert_eq(replica_load(&r1, x, y, B), 0);
	cr_assert_eq(replica_train(&r1, p, g1, r1.x, r1.y, B, key, 1.0f / B), 0);
	cr_assert_eq(replica_load(&r2, x, y, B), 0);
	cr_assert_eq(replica_forward_flow(&r2, q, r2.x, r2.y, B, key, 1.0f / B, arrive_ready, &a), 0);
	cr_assert_eq(a.twice, 0, "%d values handed over twice", a.twice);
	for (size_t i = 0; i < P; i++)
		cr_assert(taken[i], "parameter %zu never asked for", i);
	/* at least one call for every layer with parameters, and two for a
	 * dense one (bias, weight); more when a weight goes block by block */
	int whole = 0;
	for (int i = 0; i < m.nlayers; i++)
		whole += m.layers[i].kind == LAYER_DENSE ? 2 : m.layers[i].nparams > 0;
	cr_assert_gt(a.calls, whole, "%d calls: the dense layers do not go row block by row block", a.calls);
	cr_assert_eq(replica_backward_flow(&r2, q, g2, r2.x, B, 1.0f / B, &gf, flow_mark, &gf), 0);
	double l1, l2, c1, c2;
	cr_assert_eq(replica_meter(&r1, &l1, &c1), 0);
	cr_assert_eq(replica_meter(&r2, &l2, &c2), 0);
	/* Float rounding apart (REPLICA_FORWARD_ROWS): a parameter used
	 * before it arrived is NaN, and so would the loss be. */
	cr_assert_leq(fabs(l1 - l2), 1e-6 * fabs(l1), "the loss: %.17g against %.17g", l2, l1);
	cr_assert_leq(fabs(c1 - c2), 1.0, "right answers: %g against %g", c2, c1);
	float gmax = 0;
	for (size_t i = 0; i < P; i++)
		gmax = fmaxf(gmax, fabsf(g1[i]));
	cr_assert_gt(gmax, 0);
	for (size_t i = 0; i < P; i++)
		cr_assert_leq(fabsf(g1[i] - g2[i]), 1e-5f * fabsf(g1[i]) + 1e-6f * gmax,
			      "the gradient differs at %zu: %g against %g", i, (double)g2[i], (double)g1[i]);
	gradflow_free(&a.f);
	gradflow_free(&gf);
	replica_free(&r1);
	replica_free(&r2);
	free(x);
	free(p);
	free(q);
	free(g1);
	free(g2);
	free(y);
	free(taken);
}

#define MLP "layer = dense 512\nlayer = relu\nlayer = dense 512\nlayer = relu\nlayer = dropout 0.2\nlayer = dense 10\n"

/* Blocks after the first grow to the size of all before them: the
 * 784-512-512-10 MLP's 664k dense weights in 16384-value blocks would
 * take about 40 GEMMs; doubling, a dozen at most (layer ends and the
 * other stream's frontier cut some short). */
Test(gradflow, split_backward_of_an_mlp_equals_the_whole_one)
{
	int blocks = split_matches_whole("784", 784, MLP, 2, 0);
	cr_assert_leq(blocks, 16, "%d blocks: they do not grow", blocks);
}

/* A later stream (a ps over a Unix socket) gets its blocks only once
 * every other stream is final, and the gradient is still the whole one. */
Test(gradflow, split_backward_leaves_a_later_stream_to_the_end)
{
	split_matches_whole("784", 784, MLP, 2, 1);
	split_matches_whole("784", 784, MLP, 3, 2);
	split_matches_whole("784", 784, MLP, 2, 3);
}

Test(gradflow, split_backward_of_a_cnn_equals_the_whole_one)
{
	split_matches_whole("8x8x1", 64, "layer = conv 3x3 4 pad=same\nlayer = batchnorm\nlayer = relu\n"
			    "layer = maxpool 2\nlayer = dense 64\nlayer = tanh\nlayer = dense 4\n", 3, 0);
}

/* The forward pass of the next step on parameters that are still
 * arriving (a worker with [cluster] overlap): the loss of the whole one
 * and, after it, the split backward's gradient, to float rounding; every
 * parameter asked for once, and none used before it arrived. */
Test(gradflow, a_forward_pass_on_arriving_parameters_equals_the_whole_one)
{
	arriving_matches_whole("784", 784, MLP, 2, 16384);
	arriving_matches_whole("784", 784, MLP, 3, 1000);
	arriving_matches_whole("8x8x1", 64, "layer = conv 3x3 4 pad=same\nlayer = batchnorm\nlayer = relu\n"
			       "layer = maxpool 2\nlayer = dense 64\nlayer = tanh\nlayer = dense 4\n", 2, 100);
}

Test(gradflow, a_backend_that_cannot_split_is_refused)
{
	char text[256], err[512];
	struct config c;
	struct model m;
	snprintf(text, sizeof(text), "[model]\ninput = 4\nlayer = dense 3\n");
	cr_assert_eq(config_parse_string(&c, "t.ini", text, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(&m, &c.model, err, sizeof(err)), 0, "%s", err);
	struct backend be;
	backend_cpu(&be, 1);
	struct backend_ops ops = *be.ops;
	ops.dense_wgrad = NULL;
	ops.dense_forward_rows = NULL;
	be.ops = &ops;
	struct replica r;
	cr_assert_eq(replica_init(&r, &m, &be, 4, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(replica_flow_init(&r), -EOPNOTSUPP);
	float p[15] = { 0 }, x[4] = { 0 };
	int32_t y = 0;
	cr_assert_eq(replica_forward_flow(&r, p, x, &y, 1, 1, 1.0f, NULL, NULL), -EOPNOTSUPP);
	replica_free(&r);
}
