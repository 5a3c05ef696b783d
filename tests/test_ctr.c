/* The click-through model end to end: the config's embedding and loss
 * keys and their refusals, a replica's gradient through the embedding
 * layer against finite differences, fitting the data to the model, local
 * training on an in-memory synthetic set from a planted logistic model
 * (AUC well above a constant predictor's 0.5, toward the planted model's
 * own), bit-for-bit reruns, and the cluster roles' refusals (checkpoints of
 * the tables: test_ckpt_rows.c). */
#include <criterion/criterion.h>

#include "gradcheck.h"
#include "leak.h"
#include "util.h"

#include "../core/config/config.h"
#include "../core/data/dataset.h"
#include "../core/metrics.h"
#include "../core/nn/backend.h"
#include "../core/nn/embed_plan.h"
#include "../core/nn/model.h"
#include "../core/nn/replica.h"
#include "../core/nn/rng.h"
#include "../core/progress.h"
#include "../core/tblog.h"
#include "../gpu/gpu.h"
#include "../core/train.h"

#include <errno.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void seed_rng(void)
{
	gradcheck_seed(0xc7c7ULL);
	cr_assert_geq(sodium_init(), 0);   /* the cluster key of binary_model_in_a_cluster */
}

TestSuite(ctr, .init = seed_rng, .fini = leak_check);

/* config_parse_string of "[model]\n<model>" (and [train] batch 8). */
static int parse(struct config *c, const char *model, char *err, size_t errlen)
{
	char text[1024];
	snprintf(text, sizeof(text), "[train]\nbatch_size = 8\n[model]\n%s", model);
	return config_parse_string(c, "ctr.ini", text, err, errlen);
}

Test(ctr, model_with_an_embedding_layer)
{
	struct config c;
	struct model m;
	char err[512];
	cr_assert_eq(parse(&c, "input = 13\nlayer = embedding 26 100000 16 shared pool=mean\nlayer = dense 32\n"
			   "layer = relu\nlayer = dense 1\nloss = sigmoid_cross_entropy\n", err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(&m, &c.model, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(m.embed.fields, 26);
	cr_assert_eq(m.embed.rows, 100000);
	cr_assert_eq(m.embed.dim, 16);
	cr_assert(m.embed.shared && m.embed.pool == EMBED_MEAN);
	cr_assert_eq(m.inputs, 13);
	cr_assert_eq(m.layers[0].out, 26 * 16 + 13, "pooled fields, then the numeric features");
	cr_assert_eq(m.layers[1].in, 26 * 16 + 13);
	cr_assert_eq(m.nparams, (size_t)(429 * 32 + 32 + 32 + 1), "the tables are not in P");
	cr_assert_eq(m.outputs, 1);
	cr_assert_eq(m.loss, LOSS_SIGMOID_XENT);
	cr_assert_str_eq(m.layers[0].name, "embedding1");

	/* The spec prints back as it parses, through the config too. */
	char buf[96];
	layer_spec_format(&c.model.layers[0], buf, sizeof(buf));
	cr_assert_str_eq(buf, "embedding 26 100000 16 shared pool=mean");
	cr_assert_eq(parse(&c, "input = 2\nlayer = embedding 3 10 4 pool=sum\nlayer = dense 2\n", err, sizeof(err)), 0,
		     "%s", err);
	layer_spec_format(&c.model.layers[0], buf, sizeof(buf));
	cr_assert_str_eq(buf, "embedding 3 10 4");
	cr_assert_eq(c.train.embed_optimizer, 0, "adagrad by default");
	cr_assert_float_eq(c.train.embed_lr, 0.05f, 1e-9);
}

struct refusal {
	const char *model;
	const char *text;   /* in the message */
};

static const struct refusal refusals[] = {
	{ "layer = embedding 0 10 4\nlayer = dense 2", "\"0\" is not a field count (FIELDS, 1..1024)" },
	{ "layer = embedding 1025 10 4\nlayer = dense 2", "\"1025\" is not a field count" },
	{ "layer = embedding 3 0 4\nlayer = dense 2", "\"0\" is not a row count (ROWS, 1..2147483647)" },
	{ "layer = embedding 3 2147483648 4\nlayer = dense 2", "\"2147483648\" is not a row count" },
	{ "layer = embedding 3 1e5 4\nlayer = dense 2", "\"1e5\" is not a row count" },
	{ "layer = embedding 3 10 0\nlayer = dense 2", "\"0\" is not a width (DIM, 1..1024)" },
	{ "layer = embedding 3 10 x\nlayer = dense 2", "\"x\" is not a width" },
	{ "layer = embedding 3 10\nlayer = dense 2", "layer embedding needs FIELDS ROWS DIM" },
	{ "layer = embedding 3 10 4 pool=max\nlayer = dense 2", "\"pool=max\" is not a pooling (pool=sum or pool=mean)" },
	{ "layer = embedding 3 10 4 shared shared\nlayer = dense 2", "\"shared\" is given twice" },
	{ "layer = embedding 3 10 4 pool=sum pool=mean\nlayer = dense 2", "pool= is given twice" },
	{ "layer = embedding 3 10 4 tied\nlayer = dense 2", "unknown option \"tied\"" },
	{ "layer = dense 8\nlayer = embedding 3 10 4\nlayer = dense 2",
	  "ctr.ini:6: [model] layer embedding1: an embedding layer must be the first layer" },
	{ "layer = embedding 3 10 4\nlayer = relu\nlayer = embedding 3 10 4\nlayer = dense 2",
	  "ctr.ini:7: [model] layer embedding2: an embedding layer must be the first layer" },
	{ "layer = embedding 3 10 4\nlayer = dense 2\nloss = sigmoid_cross_entropy",
	  "ctr.ini:6: [model] the last layer dense1 has 2 outputs; loss = sigmoid_cross_entropy needs 1" },
	{ "layer = dense 4\nlayer = dense 3\nloss = sigmoid_cross_entropy", "dense2 has 3 outputs; loss = sigmoid_cross_entropy needs 1" },
	{ "layer = embedding 3 10 4\nloss = sigmoid_cross_entropy", "the last layer is embedding1, but sigmoid_cross_entropy needs a dense layer" },
	{ "layer = embedding 3 10 4\nlayer = dense 1", "classification needs at least 2" },
	{ "loss = logistic\nlayer = dense 1", "\"logistic\" is not one of softmax_cross_entropy or sigmoid_cross_entropy" },
};

Test(ctr, config_refusals)
{
	char model[512], err[1024];
	struct config c;
	for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
		snprintf(model, sizeof(model), "input = 2\n%s\n", refusals[i].model);
		cr_assert_eq(parse(&c, model, err, sizeof(err)), -EINVAL, "accepted: %s", refusals[i].model);
		cr_assert_not_null(strstr(err, refusals[i].text), "%s\n  gave: %s\n  want: %s", refusals[i].model, err,
				   refusals[i].text);
	}
	/* An image input: the embedding reads a flat vector of numeric features. */
	cr_assert_eq(parse(&c, "input = 4x4x2\nlayer = embedding 3 10 4\nlayer = dense 2\n", err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "needs a flat input"), "%s", err);
	cr_assert_eq(parse(&c, "input = 3\nlayer = dense 2\n", err, sizeof(err)), 0, "%s", err);
	char set_err[512];
	cr_assert_eq(config_parse_string(&c, "o.ini", "[train]\nembedding_optimizer = ftrl\n", set_err, sizeof(set_err)),
		     -EINVAL);
	cr_assert_not_null(strstr(set_err, "\"ftrl\" is not one of adagrad or lazy_adam"), "%s", set_err);
	cr_assert_eq(config_parse_string(&c, "o.ini", "[train]\nembedding_learning_rate = 0\n", set_err, sizeof(set_err)),
		     -EINVAL);
	cr_assert_not_null(strstr(set_err, "out of range"), "%s", set_err);
	/* Slices: each pulls and pushes its own rows (tests/test_sparse.c). */
	cr_assert_eq(config_parse_string(&c, "o.ini",
					 "[train]\nslices = 2\n[model]\ninput = 2\nlayer = embedding 3 10 4\nlayer = dense 1\n"
					 "loss = sigmoid_cross_entropy\n", set_err, sizeof(set_err)), 0, "%s", set_err);
	/* And an elastic worker set (tests/test_sparse.c). */
	cr_assert_eq(config_parse_string(&c, "o.ini",
					 "[cluster]\nmin_workers = 1\n[model]\ninput = 2\nlayer = embedding 3 10 4\nlayer = dense 1\n"
					 "loss = sigmoid_cross_entropy\n", set_err, sizeof(set_err)), 0, "%s", set_err);
}

/* ---- a replica's gradient through the embedding layer -------------------- */

struct rep_ctx {
	struct replica *r;
	const float *params;
	const struct embed_plan *plan;
	const float *table;
	int B;
};

/* The summed loss over the batch, scaled by 1/B like the gradient. */
static double rep_loss(void *arg)
{
	struct rep_ctx *c = arg;
	double l;
	cr_assert_eq(replica_embed_load(c->r, c->plan, c->table), 0);
	cr_assert_eq(replica_forward(c->r, c->params, c->B, 0, 0, &l, NULL), 0);
	return l / c->B;
}

Test(ctr, replica_gradient_through_the_embedding)
{
	struct config c;
	struct model m;
	char err[512];
	enum { B = 6, F = 3, D = 2 };
	cr_assert_eq(parse(&c, "input = 2\nlayer = embedding 3 5 4 pool=mean\nlayer = dense 5\nlayer = tanh\n"
			   "layer = dense 1\nloss = sigmoid_cross_entropy\n", err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(&m, &c.model, err, sizeof(err)), 0, "%s", err);
	struct backend be;
	backend_cpu(&be, 1);
	struct replica r;
	cr_assert_eq(replica_init(&r, &m, &be, B, err, sizeof(err)), 0, "%s", err);
	/* Ids over few rows, so rows repeat across samples; one missing. */
	uint32_t ids[B * F];
	for (int i = 0; i < B * F; i++)
		ids[i] = (uint32_t)((rand_uniform() + 1) * 3);
	ids[4] = DATA_ID_NONE;
	struct embed_plan plan;
	cr_assert_eq(embed_plan_init(&plan, B * F, B * F), 0);
	cr_assert_eq(embed_plan_build(&plan, &m.embed, NULL, ids, B), 0);
	size_t R = embed_total_rows(&m.embed), P = m.nparams;
	float *table = rand_array(R * 4, 0.5), *params = rand_array(P, 0.5), *grads = zero_array(P);
	float *x = rand_array(B * D, 1.0);
	int32_t y[B] = { 0, 1, 1, 0, 1, 0 };
	cr_assert_eq(replica_load(&r, x, y, B), 0);
	cr_assert_eq(replica_embed_load(&r, &plan, table), 0);
	double l;
	cr_assert_eq(replica_forward(&r, params, B, 1, 0, &l, NULL), 0);
	cr_assert_eq(replica_backward(&r, params, grads, B, 1.0f / B), 0);

	/* dU against the loss as a function of the whole table: the rows
	 * the batch touches get dU's rows, every other row 0. The table is
	 * gathered again before each loss (rep_loss). */
	float *dT = zero_array(R * 4);
	for (size_t k = 0; k < plan.u; k++)
		memcpy(dT + plan.rows[k] * 4, r.dU + k * 4, 4 * sizeof(float));
	struct rep_ctx rc = { &r, params, &plan, table, B };
	check_grad("embedding rows through the model", table, dT, R * 4, 1e-2, rep_loss, &rc);
	/* And the dense layers' gradients, as the rest of the model's. */
	check_grad("dense layers after an embedding", params, grads, P, 1e-2, rep_loss, &rc);
	free(dT);
	free(table);
	free(params);
	free(grads);
	free(x);
	embed_plan_free(&plan);
	replica_free(&r);
}

/* A backend without embed_gather (the CUDA one: its memory is not the
 * host's) gets the batch's rows gathered on the host and uploaded
 * (replica_embed.c): the same forward and gradients, bit for bit, as the
 * backend's own gather. Checked here with the CPU backend's table less
 * that entry, so CI covers the path a GPU takes. */
Test(ctr, rows_gathered_on_the_host_are_the_backends)
{
	struct config c;
	struct model m;
	char err[512];
	enum { B = 7, F = 3, D = 2, DIM = 4 };
	cr_assert_eq(parse(&c, "input = 2\nlayer = embedding 3 50 4\nlayer = dense 5\nlayer = relu\n"
			   "layer = dense 1\nloss = sigmoid_cross_entropy\n", err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(&m, &c.model, err, sizeof(err)), 0, "%s", err);
	struct backend be[2];
	backend_cpu(&be[0], 1);
	struct backend_ops staged = *be[0].ops;
	staged.embed_gather = NULL;
	be[1] = be[0];
	be[1].ops = &staged;
	uint32_t ids[B * F];
	for (int i = 0; i < B * F; i++)
		ids[i] = (uint32_t)((rand_uniform() + 1) * 40);
	ids[5] = DATA_ID_NONE;
	struct embed_plan plan;
	cr_assert_eq(embed_plan_init(&plan, B * F, B * F), 0);
	cr_assert_eq(embed_plan_build(&plan, &m.embed, NULL, ids, B), 0);
	size_t R = embed_total_rows(&m.embed), P = m.nparams;
	float *table = rand_array(R * DIM, 0.5), *params = rand_array(P, 0.5), *x = rand_array(B * D, 1.0);
	int32_t y[B] = { 0, 1, 1, 0, 1, 0, 1 };
	struct replica r[2];
	float *grads[2];
	double l[2];
	for (int k = 0; k < 2; k++) {
		cr_assert_eq(replica_init(&r[k], &m, &be[k], B, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(k ? r[k].e_stage != NULL : r[k].e_stage == NULL, 1, "backend %d's staging", k);
		grads[k] = zero_array(P);
		cr_assert_eq(replica_load(&r[k], x, y, B), 0);
		cr_assert_eq(replica_embed_load(&r[k], &plan, table), 0);
		cr_assert_eq(replica_forward(&r[k], params, B, 1, 0, &l[k], NULL), 0);
		cr_assert_eq(replica_backward(&r[k], params, grads[k], B, 1.0f / B), 0);
	}
	cr_assert(l[0] == l[1], "loss %.17g vs %.17g", l[0], l[1]);
	cr_assert_eq(memcmp(r[0].U, r[1].U, plan.u * DIM * sizeof(float)), 0, "the batch's rows differ");
	cr_assert_eq(memcmp(r[0].dU, r[1].dU, plan.u * DIM * sizeof(float)), 0, "the rows' gradients differ");
	cr_assert_eq(memcmp(grads[0], grads[1], P * sizeof(float)), 0, "the dense gradients differ");
	for (int k = 0; k < 2; k++) {
		replica_free(&r[k]);
		free(grads[k]);
	}
	free(table);
	free(params);
	free(x);
	embed_plan_free(&plan);
}

/* ---- a synthetic click-through set from a planted model ------------------ */

enum { SYN_F = 6, SYN_D = 3, SYN_VOCAB = 200 };

/* n samples: field f's ID is Zipf-like (rank = VOCAB * u^2, so low ranks are
 * frequent) scrambled into a 32-bit value as a file would hold it, 5% of
 * them missing; x ~ N(0, 1); y ~ Bernoulli(sigmoid(-1 + sum_f w_f(id) +
 * 0.5 x0 - 0.5 x1 + 0.25 x2 + 0.5 w_0(id_0) w_1(id_1))), w ~ N(0, 0.8^2).
 * p (n): the planted probabilities, for the ceiling. */
static void synth(struct dataset *ds, float *p, size_t n, uint64_t seed)
{
	memset(ds, 0, sizeof(*ds));
	ds->n = n;
	ds->d = SYN_D;
	ds->f = SYN_F;
	ds->classes = 2;
	ds->x = malloc(n * SYN_D * sizeof(float));
	ds->ids = malloc(n * SYN_F * sizeof(uint32_t));
	ds->y = malloc(n * sizeof(int32_t));
	cr_assert(ds->x && ds->ids && ds->y);
	for (size_t i = 0; i < n; i++) {
		double s = -1.0, w[SYN_F] = { 0 };
		for (int f = 0; f < SYN_F; f++) {
			double u = rng_uniform(seed, RNG_DATA, i * 16 + (size_t)f);
			uint32_t rank = (uint32_t)(SYN_VOCAB * u * u);
			int missing = rng_uniform(seed + 1, RNG_DATA, i * 16 + (size_t)f) < 0.05;
			ds->ids[i * SYN_F + f] = missing ? DATA_ID_NONE : (uint32_t)rng_hash(77, (uint64_t)f, rank);
			w[f] = missing ? 0 : 0.8 * rng_normal(99, (uint64_t)f, rank);
			s += w[f];
		}
		static const double v[SYN_D] = { 0.5, -0.5, 0.25 };
		for (int d = 0; d < SYN_D; d++) {
			float xd = (float)rng_normal(seed + 2, RNG_DATA, i * 4 + (size_t)d);
			ds->x[i * SYN_D + d] = xd;
			s += v[d] * xd;
		}
		s += 0.5 * w[0] * w[1];
		p[i] = (float)(1.0 / (1.0 + exp(-s)));
		ds->y[i] = rng_uniform(seed + 3, RNG_DATA, i) < p[i];
	}
}

static const char *ctr_config =
	"[train]\nepochs = %d\nbatch_size = 64\noptimizer = adam\nlearning_rate = 0.003\nseed = 5\nthreads = 1\nlog_dir =\n"
	"embedding_optimizer = %s\nembedding_learning_rate = %s\n"
	"[model]\ninput = 3\nlayer = embedding 6 500 8\nlayer = dense 16\nlayer = relu\nlayer = dense 1\n"
	"loss = sigmoid_cross_entropy\n";

struct ctr_run {
	struct train_result res;
	double ceiling;        /* the planted model's test AUC */
	double ceiling_loss;
	double constant_loss;  /* a constant predictor's (the training set's rate) */
	char out[4096];
};

/* ctr_config with extra appended (more sections, or ""). */
static void ctr_train_with(struct ctr_run *cr, const char *optimizer, const char *lr, int epochs,
			   const char *extra)
{
	enum { NTRAIN = 40000, NTEST = 4000 };
	struct dataset train, test;
	float *p = malloc((NTRAIN + NTEST) * sizeof(float));
	struct metrics_pair *pairs = malloc(NTEST * sizeof(*pairs));
	synth(&train, p, NTRAIN, 11);
	synth(&test, p + NTRAIN, NTEST, 12);
	cr->ceiling = metrics_auc(p + NTRAIN, test.y, NTEST, pairs);
	cr->ceiling_loss = metrics_logloss(p + NTRAIN, test.y, NTEST);
	double rate = 0;
	for (size_t i = 0; i < NTRAIN; i++)
		rate += train.y[i];
	for (size_t i = 0; i < NTEST; i++)
		p[i] = (float)(rate / NTRAIN);
	cr->constant_loss = metrics_logloss(p, test.y, NTEST);
	char text[1024], err[1024];
	struct config c;
	int at = snprintf(text, sizeof(text), ctr_config, epochs, optimizer, lr);
	snprintf(text + at, sizeof(text) - (size_t)at, "%s", extra);
	cr_assert_eq(config_parse_string(&c, "ctr.ini", text, err, sizeof(err)), 0, "%s", err);
	volatile sig_atomic_t stop = 0;
	FILE *out = fmemopen(cr->out, sizeof(cr->out) - 1, "w");
	memset(cr->out, 0, sizeof(cr->out));
	int e = train_sets(&c, &train, &test, out, &stop, &cr->res, err, sizeof(err));
	fclose(out);
	cr_assert_eq(e, 0, "train_sets: %s", err);
	dataset_free(&train);
	dataset_free(&test);
	free(p);
	free(pairs);
}

static void ctr_train(struct ctr_run *cr, const char *optimizer, const char *lr, int epochs)
{
	ctr_train_with(cr, optimizer, lr, epochs, "");
}

Test(ctr, local_training_learns_the_planted_model, .timeout = 120)
{
	struct ctr_run a;
	ctr_train(&a, "adagrad", "0.05", 3);
	cr_log_info("adagrad: test AUC %.4f logloss %.4f (planted %.4f, %.4f; constant 0.5, %.4f)\n", a.res.test_auc,
		    a.res.test_loss, a.ceiling, a.ceiling_loss, a.constant_loss);
	cr_assert(a.res.binary, "a sigmoid model's evaluation is binary");
	cr_assert_gt(a.ceiling, 0.75, "the planted model itself: AUC %.4f", a.ceiling);
	/* A constant predictor's AUC is 0.5; this one must close most of the
	 * gap to the planted model's. */
	cr_assert_gt(a.res.test_auc, 0.5 + 0.8 * (a.ceiling - 0.5), "test AUC %.4f, planted %.4f", a.res.test_auc,
		     a.ceiling);
	cr_assert_lt(a.res.test_loss, a.constant_loss - 0.6 * (a.constant_loss - a.ceiling_loss),
		     "logloss %.4f, planted %.4f, constant %.4f", a.res.test_loss, a.ceiling_loss, a.constant_loss);
	/* What it said: the tables, and AUC instead of accuracy. */
	cr_assert_not_null(strstr(a.out, "embedding: 3000 rows x 8 (93.8 KiB) in 6 tables, adagrad at learning rate 0.05\n"),
			   "%s", a.out);
	cr_assert_not_null(strstr(a.out, "test logloss "), "%s", a.out);
	cr_assert_not_null(strstr(a.out, " AUC 0."), "%s", a.out);
	cr_assert_null(strstr(a.out, "acc"), "no accuracy for a binary model: %s", a.out);

	/* The same run again is the same bits: every sum has one order. */
	struct ctr_run b;
	ctr_train(&b, "adagrad", "0.05", 3);
	cr_assert(a.res.test_auc == b.res.test_auc && a.res.test_loss == b.res.test_loss, "%.17g/%.17g vs %.17g/%.17g",
		  a.res.test_auc, a.res.test_loss, b.res.test_auc, b.res.test_loss);
}

Test(ctr, lazy_adam_learns_too, .timeout = 120)
{
	struct ctr_run a;
	ctr_train(&a, "lazy_adam", "0.003", 3);
	cr_log_info("lazy_adam: test AUC %.4f logloss %.4f (planted %.4f)\n", a.res.test_auc, a.res.test_loss,
		    a.ceiling);
	cr_assert_gt(a.res.test_auc, 0.5 + 0.8 * (a.ceiling - 0.5), "test AUC %.4f, planted %.4f", a.res.test_auc,
		     a.ceiling);
	cr_assert_not_null(strstr(a.out, "lazy_adam at learning rate 0.003"), "%s", a.out);
}

Test(ctr, data_must_fit_the_model)
{
	struct dataset train, test;
	float p[64];
	synth(&train, p, 64, 1);
	synth(&test, p, 16, 2);
	char text[1024], err[1024];
	struct config c;
	volatile sig_atomic_t stop = 0;
	struct train_result res;
	FILE *out = fopen("/dev/null", "w");
	/* 6 fields in the data, 5 in the layer */
	snprintf(text, sizeof(text), "[train]\nsteps = 2\nbatch_size = 8\n[model]\ninput = 3\nlayer = embedding 5 50 4\n"
		 "layer = dense 1\nloss = sigmoid_cross_entropy\n");
	cr_assert_eq(config_parse_string(&c, "f.ini", text, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(train_sets(&c, &train, &test, out, &stop, &res, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "samples have 6 categorical fields, but layer embedding1 takes 5"), "%s", err);
	/* fields, but no embedding layer to read them */
	cr_assert_eq(config_parse_string(&c, "f.ini", "[train]\nsteps = 2\nbatch_size = 8\n[model]\ninput = 3\n"
					 "layer = dense 2\n", err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(train_sets(&c, &train, &test, out, &stop, &res, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "the model has no embedding layer to read them (add layer = embedding 6 ROWS DIM first)"),
			   "%s", err);
	/* labels past 1 for a sigmoid */
	train.y[3] = 2;
	train.classes = 3;
	snprintf(text, sizeof(text), "[train]\nsteps = 2\nbatch_size = 8\n[model]\ninput = 3\nlayer = embedding 6 50 4\n"
		 "layer = dense 1\nloss = sigmoid_cross_entropy\n");
	cr_assert_eq(config_parse_string(&c, "f.ini", text, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(train_sets(&c, &train, &test, out, &stop, &res, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "labels go up to 2, but loss = sigmoid_cross_entropy takes 0/1 labels"), "%s", err);
	fclose(out);
	dataset_free(&train);
	dataset_free(&test);
}

/* A binary model's lines and TensorBoard scalars: log loss and AUC, no
 * accuracy (which a rare label makes look good for a constant guess). */
Test(ctr, progress_and_tensorboard_say_logloss_and_auc)
{
	for (int tty = 0; tty < 2; tty++) {
		char *buf = NULL;
		size_t len = 0;
		FILE *f = open_memstream(&buf, &len);
		struct progress p;
		progress_init(&p, f, tty, 100, 10);
		progress_set_binary(&p);
		progress_tick(&p, 9, 0.01);
		progress_step(&p, 9, 64, 64 * 0.45, 64 * 0.9);
		progress_eval_auc(&p, 10, 0.4321, 0.7654);
		cr_assert_eq(fclose(f), 0);
		cr_assert_not_null(strstr(buf, tty ? " test AUC 0.765 " : "  test logloss 0.4321 AUC 0.7654  "), "%s", buf);
		cr_assert_null(strstr(buf, "acc"), "%s", buf);
		free(buf);
	}
	char dir[200], err[512];
	test_dir_make(dir, sizeof(dir), "ctrtb");
	struct tblog t;
	cr_assert_eq(tblog_open(&t, dir, err, sizeof(err)), 0, "%s", err);
	struct progress p;
	FILE *null = fopen("/dev/null", "w");
	progress_init(&p, null, 0, 100, 10);
	progress_set_binary(&p);
	progress_eval_auc(&p, 10, 0.4321, 0.7654);
	cr_assert_eq(tblog_eval(&t, 10, &p, 0.01), 0);
	char path[sizeof(t.path)];
	snprintf(path, sizeof(path), "%s", t.path);
	tblog_close(&t);
	fclose(null);
	unsigned char *ev;
	size_t n;
	read_all(path, &ev, &n);
	cr_assert_not_null(memmem(ev, n, "test/auc", 8));
	cr_assert_not_null(memmem(ev, n, "test/loss", 9));
	cr_assert_null(memmem(ev, n, "accuracy", 8));
	free(ev);
	test_dir_remove(dir);
}

/* n rows "y,x0,x1" of a logistic label on two normal features. */
static void write_binary_csv(const char *path, int n)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	for (int i = 0; i < n; i++) {
		double x0 = rng_normal(3, RNG_DATA, 2 * (uint64_t)i), x1 = rng_normal(3, RNG_DATA, 2 * (uint64_t)i + 1);
		int y = rng_uniform(4, RNG_DATA, (uint64_t)i) < 1.0 / (1.0 + exp(-(2 * x0 - x1)));
		fprintf(f, "%d,%.5f,%.5f\n", y, x0, x1);
	}
	cr_assert_eq(fclose(f), 0);
}

/* A binary model without embeddings goes the whole way through the
 * binary: local says log loss and AUC, eval finds the same from the
 * checkpoint, predict gives 0/1 and the probability of 1. */
Test(ctr, binary_model_local_eval_predict, .timeout = 60)
{
	char dir[200], cfg[300], csv[300], out[300], in[300], text[1024];
	test_dir_make(dir, sizeof(dir), "ctrcli");
	snprintf(csv, sizeof(csv), "%s/bin.csv", dir);
	write_binary_csv(csv, 1200);
	snprintf(cfg, sizeof(cfg), "%s/b.ini", dir);
	snprintf(text, sizeof(text), "[train]\nepochs = 3\nbatch_size = 32\noptimizer = adam\nlearning_rate = 0.01\n"
		 "threads = 1\n[data]\nformat = csv\ntrain_csv = bin.csv\n[model]\ninput = 2\nlayer = dense 4\n"
		 "layer = relu\nlayer = dense 1\nloss = sigmoid_cross_entropy\n");
	FILE *f = fopen(cfg, "w");
	fputs(text, f);
	fclose(f);
	int st;
	double ll, auc, ll2, auc2;
	snprintf(out, sizeof(out), "%s/local.log", dir);
	const char *local[] = { "local", "--config", cfg, NULL };
	pid_t p = spawn_pstrain(local, out, NULL);
	wait_children(&p, 1, &st, 40);
	cr_assert_eq(st, 0, "%s", slurp(out));
	const char *done = strstr(slurp(out), "done: 90 steps, test logloss ");
	cr_assert_not_null(done, "%s", slurp(out));
	cr_assert_eq(sscanf(done, "done: 90 steps, test logloss %lf AUC %lf", &ll, &auc), 2, "%s", done);
	cr_assert(auc > 0.75 && ll < 0.6, "logloss %g AUC %g", ll, auc);
	snprintf(out, sizeof(out), "%s/eval.log", dir);
	snprintf(in, sizeof(in), "%s/b.ckpt", dir);
	const char *eval[] = { "eval", "--config", cfg, "--checkpoint", in, NULL };
	p = spawn_pstrain(eval, out, NULL);
	wait_children(&p, 1, &st, 40);
	cr_assert_eq(st, 0, "%s", slurp(out));
	const char *e = strstr(slurp(out), "test logloss ");
	cr_assert(e && sscanf(e, "test logloss %lf AUC %lf", &ll2, &auc2) == 2, "%s", slurp(out));
	cr_assert(fabs(ll - ll2) < 1e-4 && fabs(auc - auc2) < 1e-4, "eval %g/%g, local %g/%g", ll2, auc2, ll, auc);
	snprintf(out, sizeof(out), "%s/predict.log", dir);
	const char *predict[] = { "predict", "--config", cfg, "--checkpoint", in, "--input", csv, "--probs", NULL };
	p = spawn_pstrain(predict, out, NULL);
	wait_children(&p, 1, &st, 40);
	cr_assert_eq(st, 0, "%s", slurp(out));
	const char *line = slurp(out);
	int lines = 0;
	for (; *line; lines++) {
		int label;
		double prob;
		cr_assert_eq(sscanf(line, "%d,%lf", &label, &prob), 2, "%s", line);
		cr_assert(label == (prob > 0.5) && prob > 0 && prob < 1, "%s", line);
		line = strchr(line, '\n');
		cr_assert_not_null(line);
		line++;
	}
	cr_assert_eq(lines, 1200);
	test_dir_remove(dir);
}

/* A binary dense model trains in a cluster as well (embeddings:
 * tests/test_sparse.c); the chief's lines say log loss and AUC. */
Test(ctr, binary_model_in_a_cluster, .timeout = 90)
{
	char dir[200], cfg[300], text[1024], out[2][300];
	test_dir_make(dir, sizeof(dir), "ctrps");
	write_cluster_files(dir);
	snprintf(cfg, sizeof(cfg), "%s/bin.csv", dir);
	write_binary_csv(cfg, 1200);
	snprintf(cfg, sizeof(cfg), "%s/c.ini", dir);
	snprintf(text, sizeof(text), "[cluster]\nps = 127.0.0.1:%d\nworkers = 127.0.0.1:%d\nkey_file = cluster.key\n"
		 "socket_dir = sockets\n[data]\nformat = csv\ntrain_csv = bin.csv\n[train]\nsteps = 60\neval_every = 30\n"
		 "batch_size = 32\noptimizer = adam\nlearning_rate = 0.01\nthreads = 1\n[model]\ninput = 2\n"
		 "layer = dense 4\nlayer = relu\nlayer = dense 1\nloss = sigmoid_cross_entropy\n", free_port(), free_port());
	FILE *f = fopen(cfg, "w");
	fputs(text, f);
	fclose(f);
	const char *ps[] = { "ps", "--index", "0", "--config", cfg, NULL };
	const char *w[] = { "worker", "--index", "0", "--config", cfg, NULL };
	pid_t pids[2];
	int st[2];
	snprintf(out[0], sizeof(out[0]), "%s/ps.log", dir);
	snprintf(out[1], sizeof(out[1]), "%s/w.log", dir);
	pids[0] = spawn_pstrain(ps, out[0], NULL);
	pids[1] = spawn_pstrain(w, out[1], NULL);
	wait_children(pids, 2, st, 80);
	assert_exits_zero(st, out, 2, "binary cluster");
	const char *w0 = slurp(out[1]), *done = strstr(w0, "done: 60 steps, test logloss ");
	double ll, auc;
	cr_assert(done && sscanf(done, "done: 60 steps, test logloss %lf AUC %lf", &ll, &auc) == 2, "%s", w0);
	cr_assert(auc > 0.75, "AUC %g", auc);
	cr_assert_not_null(strstr(w0, "step 30/60"), "%s", w0);
	cr_assert_null(strstr(w0, "acc"), "%s", w0);
	test_dir_remove(dir);
}

/* On a GPU (soft_placement off, so no quiet fall back to the CPU): the
 * embedding layer's and the loss's kernels, rows gathered on the host and
 * the gradient's rows brought back for the sparse optimizer. It must learn
 * as the CPU test above does, say it placed the layers on the GPU, and be
 * the same bits run twice. Skipped, never passed, without a GPU. */
Test(ctr, gpu_trains_the_embedding_model, .timeout = 180)
{
	int n = 0;
	char why[256];
	if (gpu_count(&n, why, sizeof(why)) < 0) {
		fprintf(stderr, "ctr: SKIPPED gpu_trains_the_embedding_model (needs a GPU: %s)\n", why);
		cr_skip_test("needs a GPU: %s", why);
	}
	static const char *gpu = "[gpu]\ndevices = 0\nsoft_placement = false\nlog_placement = true\n";
	struct ctr_run a, b;
	ctr_train_with(&a, "adagrad", "0.05", 3, gpu);
	cr_log_info("gpu adagrad: test AUC %.4f logloss %.4f (planted %.4f)\n", a.res.test_auc, a.res.test_loss,
		    a.ceiling);
	cr_assert_not_null(strstr(a.out, "placement: embedding"), "%s", a.out);
	cr_assert_not_null(strstr(a.out, "/gpu:0"), "%s", a.out);
	cr_assert_null(strstr(a.out, "/cpu:"), "a layer left on the CPU: %s", a.out);
	cr_assert_gt(a.res.test_auc, 0.5 + 0.8 * (a.ceiling - 0.5), "test AUC %.4f, planted %.4f", a.res.test_auc,
		     a.ceiling);
	ctr_train_with(&b, "adagrad", "0.05", 3, gpu);
	cr_assert(a.res.test_auc == b.res.test_auc && a.res.test_loss == b.res.test_loss, "%.17g/%.17g vs %.17g/%.17g",
		  a.res.test_auc, a.res.test_loss, b.res.test_auc, b.res.test_loss);
}
