/* Checkpoints of embedding tables (issue 39 part 5): tables written by row
 * ranges as ps tasks would write them (2 writers, and 3 with one empty),
 * read back as other ranges and whole, parameters and the sparse
 * optimizer's state bit for bit, per-field and shared tables, adagrad and
 * lazy_adam; the on-disk parts; refusals of another model's tables, of
 * another embedding optimizer on resume, of damaged rows files; `check
 * --checkpoint`'s lines; and through the binary, a `local` embedding run
 * killed and resumed ending on the uninterrupted run's parameters and
 * tables, eval and predict from its checkpoint, and the Python loader. */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include "../core/ckpt/checkpoint.h"
#include "../core/ckpt/inspect.h"
#include "../core/ckpt/safetensors.h"
#include "../core/config/config.h"
#include "../core/nn/model.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
	test_dir_make(dir, sizeof(dir), "ckrows");
}

static void teardown(void)
{
	test_dir_remove(dir);
	leak_check();
}

TestSuite(ckpt_rows, .init = setup, .fini = teardown, .timeout = 120);

/* A model of FIELDS 3 tables of 10 rows of 4 (30 rows; one table of 10
 * when shared) and 15 dense parameters, with its state at distinct
 * values: every float of a checkpoint is told from every other. */
struct fx {
	struct config c;
	struct model m;
	float *p, *pm, *pv;   /* (P) dense parameters, adam's m and v */
	float *t, *tm, *tv;   /* (R, DIM) the tables, the sparse optimizer's m and v */
	uint64_t R;
	int dim;
};

static void fx_init(struct fx *f, const char *optim, const char *layer)
{
	char text[512], err[512];
	snprintf(text, sizeof(text), "[train]\noptimizer = adam\nembedding_optimizer = %s\n[model]\ninput = 2\n"
		 "layer = %s\nlayer = dense 1\nloss = sigmoid_cross_entropy\n", optim, layer);
	cr_assert_eq(config_parse_string(&f->c, "t.ini", text, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(&f->m, &f->c.model, err, sizeof(err)), 0, "%s", err);
	size_t P = f->m.nparams;
	f->R = embed_total_rows(&f->m.embed);
	f->dim = f->m.embed.dim;
	size_t n = (size_t)f->R * (size_t)f->dim;
	f->p = malloc(P * sizeof(float));
	f->pm = malloc(P * sizeof(float));
	f->pv = malloc(P * sizeof(float));
	f->t = malloc(n * sizeof(float));
	f->tm = malloc(n * sizeof(float));
	f->tv = malloc(n * sizeof(float));
	cr_assert(f->p && f->pm && f->pv && f->t && f->tm && f->tv);
	for (size_t i = 0; i < P; i++) {
		f->p[i] = 0.5f + (float)i;
		f->pm[i] = -(float)i / 7.0f;
		f->pv[i] = (float)i * 1e-3f;
	}
	for (size_t i = 0; i < n; i++) {
		f->t[i] = 1000.0f + (float)i * 0.25f;
		f->tm[i] = -(float)i / 3.0f;
		f->tv[i] = (float)i * (float)i * 1e-4f + 0.125f;
	}
}

static void fx_free(struct fx *f)
{
	free(f->p);
	free(f->pm);
	free(f->pv);
	free(f->t);
	free(f->tm);
	free(f->tv);
}

static int lazy(const struct fx *f)
{
	return f->c.train.embed_optimizer == SPARSE_LAZY_ADAM;
}

/* Writes step `step` as nw ps tasks would, writer k holding dense shard k
 * of the even plan and global rows [cut[k], cut[k + 1]) of the tables. */
static void save_as_ps(const struct fx *f, int nw, const uint64_t *cut, long step)
{
	struct ckpt_layout *l = malloc(sizeof(*l));
	char err[1024];
	cr_assert_not_null(l);
	cr_assert_eq(ckpt_layout_init_cluster(l, &f->m, nw, &f->c, err, sizeof(err)), 0, "%s", err);
	for (int k = 0; k < nw; k++) {
		size_t b = l->shards[k].begin, D = (size_t)f->dim;
		struct ckpt_rows rows = { .r0 = cut[k], .r1 = cut[k + 1], .table = f->t + cut[k] * D,
					  .m = f->tm + cut[k] * D, .v = lazy(f) ? f->tv + cut[k] * D : NULL, .t = 9 };
		struct ckpt_state st = { .params = f->p + b, .m = f->pm + b, .v = f->pv + b, .t = 9, .rows = &rows };
		cr_assert_eq(checkpoint_save_shard(dir, l, step, k, &st, 0, 5, NULL, err, sizeof(err)), 0, "%s", err);
	}
	free(l);
}

static struct ckpt_layout *local_layout(const struct fx *f)
{
	struct ckpt_layout *l = malloc(sizeof(*l));
	char err[512];
	cr_assert_not_null(l);
	cr_assert_eq(ckpt_layout_init(l, &f->m, 1, &f->c, err, sizeof(err)), 0, "%s", err);
	return l;
}

/* Rows [a, b) of step's tables into arrays of exactly that size, compared
 * with the fixture's bit for bit (optimizer state too, with resume). */
static void expect_rows(const struct fx *f, const struct ckpt_layout *l, long step, uint64_t a, uint64_t b)
{
	char sd[400], err[1024];
	size_t n = (size_t)(b - a) * (size_t)f->dim, at = (size_t)a * (size_t)f->dim;
	float *t = malloc(n * sizeof(float) + 1), *m = malloc(n * sizeof(float) + 1), *v = malloc(n * sizeof(float) + 1);
	cr_assert(t && m && v);
	checkpoint_step_dir(sd, sizeof(sd), dir, step);
	struct ckpt_rows_load rl = { .a = a, .b = b, .table = t, .m = m, .v = lazy(f) ? v : NULL };
	cr_assert_eq(checkpoint_load_rows(sd, l, 1, &rl, err, sizeof(err)), 0, "rows [%llu, %llu): %s",
		     (unsigned long long)a, (unsigned long long)b, err);
	cr_assert_eq(memcmp(t, f->t + at, n * sizeof(float)), 0, "table rows [%llu, %llu) differ", (unsigned long long)a,
		     (unsigned long long)b);
	cr_assert_eq(memcmp(m, f->tm + at, n * sizeof(float)), 0, "m of rows [%llu, %llu) differs",
		     (unsigned long long)a, (unsigned long long)b);
	if (lazy(f))
		cr_assert_eq(memcmp(v, f->tv + at, n * sizeof(float)), 0, "v of rows [%llu, %llu) differs",
			     (unsigned long long)a, (unsigned long long)b);
	cr_assert_eq(rl.t, a < b ? 9 : -1, "t %ld for rows [%llu, %llu)", rl.t, (unsigned long long)a, (unsigned long long)b);
	free(t);
	free(m);
	free(v);
}

/* The whole checkpoint as `local` loads it: dense part and all rows. */
static void expect_local(const struct fx *f, const struct ckpt_layout *l, long step)
{
	char sd[400], err[1024];
	size_t P = f->m.nparams, n = (size_t)f->R * (size_t)f->dim;
	float *p = malloc(P * sizeof(float)), *pm = malloc(P * sizeof(float)), *pv = malloc(P * sizeof(float));
	float *t = malloc(n * sizeof(float)), *m = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
	checkpoint_step_dir(sd, sizeof(sd), dir, step);
	struct ckpt_rows_load rl = { .a = 0, .b = f->R, .table = t, .m = m, .v = lazy(f) ? v : NULL };
	struct ckpt_load ld = { .l = l, .resume = 1, .begin = 0, .end = P, .params = p, .m = pm, .v = pv, .rows = &rl };
	cr_assert_eq(checkpoint_load(sd, &ld, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(memcmp(p, f->p, P * sizeof(float)), 0);
	cr_assert_eq(memcmp(pm, f->pm, P * sizeof(float)), 0);
	cr_assert_eq(memcmp(pv, f->pv, P * sizeof(float)), 0);
	cr_assert_eq(memcmp(t, f->t, n * sizeof(float)), 0);
	cr_assert_eq(memcmp(m, f->tm, n * sizeof(float)), 0);
	if (lazy(f))
		cr_assert_eq(memcmp(v, f->tv, n * sizeof(float)), 0);
	cr_assert_eq(ld.step, step);
	cr_assert_eq(rl.t, 9);
	free(p);
	free(pm);
	free(pv);
	free(t);
	free(m);
	free(v);
}

Test(ckpt_rows, two_writers_read_as_three_ranges_and_whole)
{
	const char *optims[] = { "adagrad", "lazy_adam" };
	const char *layers[] = { "embedding 3 10 4", "embedding 3 10 4 shared" };
	long step = 1;
	for (int o = 0; o < 2; o++)
		for (int s = 0; s < 2; s++, step++) {
			struct fx f;
			fx_init(&f, optims[o], layers[s]);
			uint64_t R = f.R, cut[3] = { 0, R * 13 / 30, R };   /* 13 of 30: inside table 1 */
			save_as_ps(&f, 2, cut, step);
			struct ckpt_layout *l = local_layout(&f);
			/* as 3 ps, each boundary elsewhere than the writers' */
			expect_rows(&f, l, step, 0, R * 7 / 30);
			expect_rows(&f, l, step, R * 7 / 30, R * 22 / 30);
			expect_rows(&f, l, step, R * 22 / 30, R);
			expect_rows(&f, l, step, 5, 6);
			expect_rows(&f, l, step, 3, 3);
			expect_rows(&f, l, step, 0, R);   /* local */
			expect_local(&f, l, step);
			free(l);
			fx_free(&f);
		}
}

Test(ckpt_rows, three_writers_one_holding_no_rows)
{
	struct fx f;
	fx_init(&f, "lazy_adam", "embedding 3 10 4");
	uint64_t cut[4] = { 0, 13, 13, 30 };
	save_as_ps(&f, 3, cut, 4);
	struct ckpt_layout *l = local_layout(&f);
	expect_local(&f, l, 4);
	expect_rows(&f, l, 4, 10, 20);
	free(l);
	fx_free(&f);
}

/* A writer's file holds its whole tables under their names with their
 * shapes, and the table it holds part of as its rows, described as dense
 * parts are. */
Test(ckpt_rows, a_writers_file_holds_tables_and_described_parts)
{
	struct fx f;
	char path[600], err[512];
	fx_init(&f, "lazy_adam", "embedding 3 10 4");
	uint64_t cut[3] = { 0, 13, 30 };
	save_as_ps(&f, 2, cut, 1);
	snprintf(path, sizeof(path), "%s/step-00000001/rows-0-of-2.safetensors", dir);
	unsigned char *buf;
	size_t len;
	read_all(path, &buf, &len);
	struct safetensors st;
	cr_assert_eq(safetensors_parse(&st, buf, len, path, err, sizeof(err)), 0, "%s", err);
	const struct st_tensor *t0 = safetensors_find(&st, "embedding1.0.weight");
	const struct st_tensor *t1 = safetensors_find(&st, "optim.v.embedding1.1.weight");
	cr_assert(t0 && t1);
	cr_assert(t0->ndim == 2 && t0->shape[0] == 10 && t0->shape[1] == 4);
	cr_assert(t1->ndim == 2 && t1->shape[0] == 3 && t1->shape[1] == 4, "rows 10..12: table 1's first 3");
	cr_assert_null(safetensors_meta(&st, "pstrain.part.embedding1.0.weight"));
	cr_assert_str_eq(safetensors_meta(&st, "pstrain.part.embedding1.1.weight"), "0:12/10x4");
	cr_assert_str_eq(safetensors_meta(&st, "pstrain.part.optim.m.embedding1.1.weight"), "0:12/10x4");
	cr_assert_null(safetensors_find(&st, "embedding1.2.weight"));
	cr_assert_str_eq(safetensors_meta(&st, "pstrain.rows"), "0:13");
	cr_assert_str_eq(safetensors_meta(&st, "pstrain.embedding_optimizer"), "lazy_adam");
	float x;
	safetensors_copy(&st, t1, 0, 1, &x);
	cr_assert_eq(x, f.tv[10 * 4]);
	safetensors_free(&st);
	/* the manifest of writer 1 names its file and rows */
	snprintf(path, sizeof(path), "%s/step-00000001/manifest-1-of-2", dir);
	cr_assert(strstr(slurp(path), "\ntables 3 10 4 per-field lazy_adam\nrows 1 13 30 "), "%s", slurp(path));
	fx_free(&f);
}

/* A step that 2 writers started and did not finish, written again by 3:
 * the 2-writer rows file goes with the other unfinished files, or the
 * step would hold two layouts. */
Test(ckpt_rows, another_layouts_unfinished_rows_file_removed)
{
	struct fx f;
	char p[600];
	fx_init(&f, "adagrad", "embedding 3 10 4");
	uint64_t cut2[3] = { 0, 13, 30 }, cut3[4] = { 0, 10, 20, 30 };
	save_as_ps(&f, 1, cut2, 2);   /* as writer 0 of 1: a complete step... */
	snprintf(p, sizeof(p), "%s/step-00000002/manifest-0-of-1", dir);
	cr_assert_eq(unlink(p), 0);   /* ...made unfinished */
	save_as_ps(&f, 3, cut3, 2);
	snprintf(p, sizeof(p), "%s/step-00000002/rows-0-of-1.safetensors", dir);
	struct stat sb;
	cr_assert_neq(stat(p, &sb), 0, "the other layout's rows file is left");
	struct ckpt_layout *l = local_layout(&f);
	expect_local(&f, l, 2);
	free(l);
	fx_free(&f);
}

/* Loads step 1 into a layout of another model, or with another optimizer:
 * -EINVAL and one line containing want. */
static void refused(const char *optim, const char *layer, int resume, const char *want)
{
	struct fx g;
	char sd[400], err[1024] = "";
	fx_init(&g, optim, layer);
	struct ckpt_layout *l = local_layout(&g);
	size_t P = g.m.nparams, n = (size_t)(g.R ? g.R : 1) * (size_t)(g.dim ? g.dim : 1);
	float *p = malloc(P * sizeof(float)), *t = malloc(n * sizeof(float));
	checkpoint_step_dir(sd, sizeof(sd), dir, 1);
	struct ckpt_rows_load rl = { .a = 0, .b = g.R, .table = t };
	struct ckpt_load ld = { .l = l, .resume = resume, .begin = 0, .end = P, .params = p, .rows = g.R ? &rl : NULL };
	int e = checkpoint_load(sd, &ld, err, sizeof(err));
	if (!want) {
		cr_assert_eq(e, 0, "%s: %s", layer, err);
	} else {
		cr_assert_eq(e, -EINVAL, "%s %s loaded", optim, layer);
		cr_assert(strstr(err, want), "%s %s: %s", optim, layer, err);
		cr_assert_null(strchr(err, '\n'), "%s", err);
	}
	free(p);
	free(t);
	free(l);
	fx_free(&g);
}

Test(ckpt_rows, another_models_tables_or_optimizer_refused)
{
	struct fx f;
	fx_init(&f, "lazy_adam", "embedding 3 10 4");
	uint64_t cut[3] = { 0, 13, 30 };
	save_as_ps(&f, 2, cut, 1);
	const char *has = "holds another model: it has embedding 3 10 4, this config's model has ";
	char want[256];
	const char *other[] = { "embedding 3 12 4", "embedding 3 10 5", "embedding 4 10 4", "embedding 3 10 4 shared" };
	for (int i = 0; i < 4; i++) {
		snprintf(want, sizeof(want), "%s%s; give this config its own checkpoint_dir, or start over with --fresh", has,
			 other[i]);
		refused("lazy_adam", other[i], 0, want);
	}
	snprintf(want, sizeof(want), "%sno embedding tables", has);
	refused("lazy_adam", "dense 3", 0, want);
	refused("adagrad", "embedding 3 10 4", 1,
		"was written with embedding_optimizer lazy_adam, this config has adagrad: set [train] embedding_optimizer = lazy_adam to continue it");
	refused("adagrad", "embedding 3 10 4", 0, NULL);   /* eval reads the tables alone */
	fx_free(&f);
}

static void flip_byte_at(const char *path, long at)
{
	FILE *fp = fopen(path, "r+b");
	cr_assert_not_null(fp);
	cr_assert_eq(fseek(fp, at, SEEK_SET), 0);
	int c = fgetc(fp);
	cr_assert_eq(fseek(fp, at, SEEK_SET), 0);
	fputc(c ^ 0x01, fp);
	fclose(fp);
}

/* rows [a, b) of step 1 refused with text in the message, or loaded. */
static void rows_load_says(const struct fx *f, uint64_t a, uint64_t b, const char *text)
{
	char sd[400], err[1024] = "";
	struct ckpt_layout *l = local_layout(f);
	float *t = malloc((size_t)(b - a) * (size_t)f->dim * sizeof(float) + 1);
	checkpoint_step_dir(sd, sizeof(sd), dir, 1);
	struct ckpt_rows_load rl = { .a = a, .b = b, .table = t };
	int e = checkpoint_load_rows(sd, l, 0, &rl, err, sizeof(err));
	if (text) {
		cr_assert_eq(e, -EINVAL, "damage not seen (want %s)", text);
		cr_assert(strstr(err, text), "%s", err);
		cr_assert_null(strchr(err, '\n'), "%s", err);
	} else {
		cr_assert_eq(e, 0, "%s", err);
	}
	free(t);
	free(l);
}

Test(ckpt_rows, damaged_rows_file_refused)
{
	struct fx f;
	char path[600], body[640];
	fx_init(&f, "adagrad", "embedding 3 10 4");
	uint64_t cut[3] = { 0, 13, 30 };
	save_as_ps(&f, 2, cut, 1);
	snprintf(path, sizeof(path), "%s/step-00000001/rows-1-of-2.safetensors", dir);
	struct stat sb;
	cr_assert_eq(stat(path, &sb), 0);
	/* a flipped bit in the last row: the checksum, read to the end */
	flip_byte_at(path, (long)sb.st_size - 2);
	rows_load_says(&f, 0, 30, "rows-1-of-2.safetensors: checksum mismatch (file damaged)");
	rows_load_says(&f, 20, 21, "rows-1-of-2.safetensors: checksum mismatch (file damaged)");
	rows_load_says(&f, 0, 13, NULL);   /* the other writer's rows: that file is not read */
	flip_byte_at(path, (long)sb.st_size - 2);
	rows_load_says(&f, 0, 30, NULL);
	/* a damaged header: the parser's checks come first */
	unsigned char *buf;
	size_t len;
	read_all(path, &buf, &len);
	char *o = memmem(buf, len, "\"data_offsets\":[0,", 18);
	cr_assert_not_null(o);
	long at = (long)((unsigned char *)o - buf) + 16;
	free(buf);
	flip_byte_at(path, at);   /* '0' -> '1' */
	rows_load_says(&f, 0, 30, "rows-1-of-2.safetensors");
	flip_byte_at(path, at);
	/* cut short, then gone */
	cr_assert_eq(truncate(path, sb.st_size - 8), 0);
	rows_load_says(&f, 0, 30, "rows-1-of-2.safetensors: truncated or extended");
	snprintf(body, sizeof(body), "%s.gone", path);
	cr_assert_eq(rename(path, body), 0);
	rows_load_says(&f, 0, 30, "rows-1-of-2.safetensors: No such file");
	fx_free(&f);
}

/* `check --checkpoint`: the tables, a line per writer's file with what it
 * holds, and each table tensor reassembled whole from its parts. */
Test(ckpt_rows, check_shows_tables_and_parts)
{
	struct fx f;
	char sd[400], err[512], want[200], h[2 * 32 + 1];
	fx_init(&f, "lazy_adam", "embedding 3 10 4");
	uint64_t cut[3] = { 0, 13, 30 };
	save_as_ps(&f, 2, cut, 1);
	checkpoint_step_dir(sd, sizeof(sd), dir, 1);
	char *text = NULL;
	size_t len = 0;
	FILE *out = open_memstream(&text, &len);
	cr_assert_eq(inspect_checkpoint(out, sd, err, sizeof(err)), 0, "%s", err);
	fclose(out);
	cr_assert(strstr(text, "\ntables: embedding 3 10 4: 30 rows of 4 in 3 tables, embedding optimizer lazy_adam\n"),
		  "%s", text);
	cr_assert(strstr(text, "\nrows 0 of 2: table rows [0, 13) in rows-0-of-2.safetensors (table 0 whole, rows [0, 3) of table 1), embedding optimizer step 9\n"),
		  "%s", text);
	cr_assert(strstr(text, "\nrows 1 of 2: table rows [13, 30) in rows-1-of-2.safetensors (rows [3, 10) of table 1, table 2 whole), embedding optimizer step 9\n"),
		  "%s", text);
	uint8_t sum[32];
	crypto_generichash(sum, sizeof(sum), (const unsigned char *)(f.tm + 10 * 4), 40 * sizeof(float), NULL, 0);
	sodium_bin2hex(h, sizeof(h), sum, sizeof(sum));
	snprintf(want, sizeof(want), "tensor %-32s %-14s %10d blake2b-256:%s\n", "optim.m.embedding1.1.weight", "10x4", 40, h);
	cr_assert(strstr(text, want), "want %s in\n%s", want, text);
	cr_assert(strstr(text, "tensor dense1.weight "), "%s", text);
	free(text);
	fx_free(&f);
}

/* ---- through the binary ---- */

#define RUN_TIMEOUT_S 60

static int run(const char *const *args, const char *env, const char *outpath)
{
	pid_t pid = spawn_pstrain(args, outpath, env);
	int st;
	wait_children(&pid, 1, &st, RUN_TIMEOUT_S);
	cr_assert_neq(st, -1, "pstrain %s did not finish in %d s", args[0], RUN_TIMEOUT_S);
	return st;
}

/* A synthetic click log in dir/data and at cfg an embedding model's
 * config over it (layer given) with checkpoints in ck: lazy_adam over
 * the tables and adam with a cosine schedule over the rest, so that a
 * resume that lost any state ends elsewhere. */
static void write_ctr(const char *cfg, const char *layer, const char *ck)
{
	char out[300], data[300];
	snprintf(data, sizeof(data), "%s/data", dir);
	snprintf(out, sizeof(out), "%s/synth.log", dir);
	struct stat sb;
	if (stat(data, &sb) != 0) {
		const char *synth[] = { "synth", "--out", data, "--train-rows", "3000", "--test-rows", "400", "--vocab",
					"300", NULL };
		cr_assert_eq(run(synth, NULL, out), 0, "%s", slurp(out));
	}
	FILE *f = fopen(cfg, "w");
	cr_assert_not_null(f);
	fprintf(f, "[data]\nformat = criteo\ntrain_csv = data/train.txt\ntest_csv = data/test.txt\n"
		   "[train]\nsteps = 60\nbatch_size = 32\noptimizer = adam\nlearning_rate = 0.01\nlr_schedule = cosine\n"
		   "embedding_optimizer = lazy_adam\nembedding_learning_rate = 0.02\ncheckpoint_dir = %s\n"
		   "checkpoint_every = 25\nthreads = 1\nseed = 5\n"
		   "[model]\ninput = 13\nlayer = %s\nlayer = dense 8\nlayer = relu\nlayer = dense 1\n"
		   "loss = sigmoid_cross_entropy\n", ck, layer);
	cr_assert_eq(fclose(f), 0);
}

/* `check --checkpoint`'s lines from the first tensor on. */
static char *tensor_lines(const char *ck)
{
	char o[300];
	snprintf(o, sizeof(o), "%s/check.txt", dir);
	const char *args[] = { "check", "--checkpoint", ck, NULL };
	int st = run(args, NULL, o);
	char *text = slurp(o);
	cr_assert_eq(st, 0, "check exit %d:\n%s", st, text);
	char *t = strstr(text, "tensor ");
	cr_assert_not_null(t, "no tensor lines:\n%s", text);
	cr_assert(strstr(t, "tensor embedding1.25.weight ") && strstr(t, "tensor optim.v.embedding1.0.weight "), "%s", t);
	return strdup(t);
}

Test(ckpt_rows, local_embedding_run_resumes_bit_for_bit)
{
	char cfg[300], out[300], ck[300];
	snprintf(cfg, sizeof(cfg), "%s/c.ini", dir);
	snprintf(out, sizeof(out), "%s/out.txt", dir);
	write_ctr(cfg, "embedding 26 50 4", "ck_a");
	const char *args[] = { "local", "--config", cfg, NULL };
	int st = run(args, NULL, out);
	cr_assert_eq(st, 0, "exit %d:\n%s", st, slurp(out));
	cr_assert_null(strstr(slurp(out), "not checkpointed"), "%s", slurp(out));
	snprintf(ck, sizeof(ck), "%s/ck_a/step-00000060", dir);
	char *a = tensor_lines(ck);

	/* killed while publishing step 50: step 25 is the newest */
	const char *args_b[] = { "local", "--config", cfg, "--set", "train.checkpoint_dir=ck_b", NULL };
	char cwd[300];
	cr_assert_not_null(getcwd(cwd, sizeof(cwd)));
	cr_assert_eq(chdir(dir), 0);   /* --set paths are relative to the current directory */
	st = run(args_b, "PSTRAIN_CKPT_CRASH=publish:50", out);
	cr_assert_eq(st, 128 + SIGKILL, "exit %d:\n%s", st, slurp(out));
	st = run(args_b, NULL, out);
	char *text = slurp(out);
	cr_assert_eq(chdir(cwd), 0);
	cr_assert_eq(st, 0, "exit %d:\n%s", st, text);
	cr_assert(strstr(text, "resuming from ck_b/step-00000025"), "no resume line:\n%s", text);
	snprintf(ck, sizeof(ck), "%s/ck_b/step-00000060", dir);
	char *b = tensor_lines(ck);
	cr_assert_str_eq(a, b, "the resumed run ends elsewhere:\n%s\nthe uninterrupted one:\n%s", b, a);
	free(a);
	free(b);
}

Test(ckpt_rows, eval_predict_and_refusal_from_an_embedding_checkpoint)
{
	char cfg[300], other[300], out[300], ck[300], in[300];
	snprintf(cfg, sizeof(cfg), "%s/c.ini", dir);
	snprintf(out, sizeof(out), "%s/out.txt", dir);
	write_ctr(cfg, "embedding 26 50 4 shared", "ck");
	const char *args[] = { "local", "--config", cfg, NULL };
	int st = run(args, NULL, out);
	char *text = slurp(out);
	cr_assert_eq(st, 0, "exit %d:\n%s", st, text);
	double ll, auc, ll2, auc2;
	char *d = strstr(text, "done: 60 steps, test logloss ");
	cr_assert(d && sscanf(d, "done: 60 steps, test logloss %lf AUC %lf", &ll, &auc) == 2, "%s", text);

	snprintf(ck, sizeof(ck), "%s/ck", dir);
	const char *ev[] = { "eval", "--config", cfg, "--checkpoint", ck, NULL };
	st = run(ev, NULL, out);
	text = slurp(out);
	cr_assert_eq(st, 0, "exit %d:\n%s", st, text);
	char *s = strstr(text, "test logloss ");
	cr_assert(s && sscanf(s, "test logloss %lf AUC %lf", &ll2, &auc2) == 2, "%s", text);
	cr_assert(ll2 == ll && auc2 == auc, "eval %.4f/%.4f, training ended at %.4f/%.4f", ll2, auc2, ll, auc);

	snprintf(in, sizeof(in), "%s/data/test.txt", dir);
	const char *pr[] = { "predict", "--config", cfg, "--checkpoint", ck, "--input", in, "--probs", NULL };
	st = run(pr, NULL, out);
	text = slurp(out);
	cr_assert_eq(st, 0, "exit %d:\n%s", st, text);
	int lines = 0;
	for (char *p = text; *p; lines++) {
		int label;
		double q;
		cr_assert_eq(sscanf(p, "%d,%lf", &label, &q), 2, "line %d: %.40s", lines, p);
		cr_assert(label == (q > 0.5) && q > 0 && q < 1, "%.40s", p);
		p = strchr(p, '\n');
		cr_assert_not_null(p);
		p++;
	}
	cr_assert_eq(lines, 400);

	/* another table size: one line, exit 2 */
	snprintf(other, sizeof(other), "%s/o.ini", dir);
	write_ctr(other, "embedding 26 60 4 shared", "ck");
	const char *ev2[] = { "eval", "--config", other, "--checkpoint", ck, NULL };
	st = run(ev2, NULL, out);
	text = slurp(out);
	cr_assert_eq(st, 2, "exit %d:\n%s", st, text);
	cr_assert(strstr(text, "holds another model: it has embedding 26 50 4 shared, this config's model has embedding 26 60 4 shared;"),
		  "%s", text);
	cr_assert_eq(strchr(text, '\n'), text + strlen(text) - 1, "more than one line:\n%s", text);

	/* the standard-library loader reassembles the tables as check does */
	if (system("python3 -c 'import hashlib' >/dev/null 2>&1") != 0) {
		fprintf(stderr, "python3 missing: checkpoint_load.py not run on an embedding checkpoint\n");
		return;
	}
	char script[400], cmd[1400];
	test_repo_path(script, sizeof(script), "tests/checkpoint_load.py");
	snprintf(cmd, sizeof(cmd), "python3 %s %s %s > %s 2>&1", script, getenv("PSTRAIN_BIN"), ck, out);
	st = system(cmd);
	cr_assert_eq(st, 0, "checkpoint_load.py:\n%s", slurp(out));
	cr_assert(strstr(slurp(out), "ok embedding1.weight 50x4 ") && strstr(slurp(out), "ok optim.v.embedding1.weight "),
		  "%s", slurp(out));
}
