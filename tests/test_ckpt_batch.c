/* Issue 40: a checkpoint records the global batch it was trained with
 * (the manifest's `batch SLICES BATCH_SIZE` line), a resume with another
 * one says so in one line (a warning: docs/CHECKPOINTS.md), and a manifest
 * written before the line existed still loads, as "not recorded". */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include "../core/ckpt/checkpoint.h"
#include "../core/ckpt/inspect.h"
#include "../core/config/config.h"
#include "../core/nn/model.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RUN_TIMEOUT_S 60

static char dir[256];

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
	test_dir_make(dir, sizeof(dir), "ckpt_batch");
}

static void teardown(void)
{
	test_dir_remove(dir);
	leak_check();
}

TestSuite(ckpt_batch, .init = setup, .fini = teardown, .timeout = 120);

struct fx {
	struct config c;
	struct model m;
	struct ckpt_layout lay;
	float *p;   /* (P) */
};

/* A local layout of a small model whose [train] has the lines `train`. */
static void fx_init(struct fx *f, const char *train)
{
	char err[512], ini[512];
	snprintf(ini, sizeof(ini), "[train]\noptimizer = sgd\n%s[model]\ninput = 4\nlayer = dense 3\n", train);
	cr_assert_eq(config_parse_string(&f->c, "t.ini", ini, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(&f->m, &f->c.model, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(ckpt_layout_init(&f->lay, &f->m, 1, &f->c, err, sizeof(err)), 0, "%s", err);
	f->p = calloc(f->m.nparams, sizeof(float));
	cr_assert_not_null(f->p);
}

static void fx_free(struct fx *f)
{
	free(f->p);
}

static void fx_save(const struct fx *f, long step)
{
	char err[512];
	struct ckpt_state st = { .params = f->p };
	cr_assert_eq(checkpoint_save(dir, &f->lay, step, &st, 3, NULL, err, sizeof(err)), 0, "%s", err);
}

/* Loads step of dir into a layout of f's model; the load's figures. */
static struct ckpt_load fx_load(const struct fx *f, long step, int want)
{
	char err[512], sd[400];
	checkpoint_step_dir(sd, sizeof(sd), dir, step);
	float *p = calloc(f->m.nparams, sizeof(float));
	cr_assert_not_null(p);
	struct ckpt_load ld = { .l = &f->lay, .resume = 1, .begin = 0, .end = f->m.nparams, .params = p };
	int e = checkpoint_load(sd, &ld, err, sizeof(err));
	cr_assert_eq(e, want, "load of step %ld: %d %s", step, e, err);
	free(p);
	return ld;
}

/* stepdir/manifest with its `batch` line replaced by line (NULL: removed,
 * as a manifest of an older pstrain is) and its end checksum made again. */
static void manifest_rewrite(const char *sd, const char *line)
{
	char path[500];
	snprintf(path, sizeof(path), "%s/manifest", sd);
	unsigned char *buf;
	size_t len;
	read_all(path, &buf, &len);
	char *text = (char *)buf, *b = strstr(text, "\nbatch "), *end = strstr(text, "\nend ");
	cr_assert(b && end && b < end, "%s", text);
	char *eol = strchr(b + 1, '\n');
	char body[4096];
	int n = snprintf(body, sizeof(body), "%.*s%s%s%.*s", (int)(b + 1 - text), text, line ? line : "",
			 line ? "\n" : "", (int)(end + 1 - (eol + 1)), eol + 1);
	cr_assert_lt(n, (int)sizeof(body));
	uint8_t sum[32];
	char h[65];
	crypto_generichash(sum, sizeof(sum), (const unsigned char *)body, (size_t)n, NULL, 0);
	sodium_bin2hex(h, sizeof(h), sum, sizeof(sum));
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fprintf(f, "%send %s\n", body, h);
	cr_assert_eq(fclose(f), 0);
	free(buf);
}

Test(ckpt_batch, manifest_records_it_and_old_manifests_load)
{
	struct fx f;
	char sd[400], path[500];
	fx_init(&f, "slices = 4\nbatch_size = 16\n");
	fx_save(&f, 10);
	checkpoint_step_dir(sd, sizeof(sd), dir, 10);
	snprintf(path, sizeof(path), "%s/manifest", sd);
	cr_assert_not_null(strstr(slurp(path), "\nbatch 4 16\n"), "%s", slurp(path));
	struct ckpt_load ld = fx_load(&f, 10, 0);
	cr_assert_eq(ld.slices, 4);
	cr_assert_eq(ld.batch, 16);
	/* check --checkpoint says it: with the line, and without. */
	for (int old = 0; old < 2; old++) {
		char *text = NULL, err[512];
		size_t len = 0;
		FILE *out = open_memstream(&text, &len);
		cr_assert_eq(inspect_checkpoint(out, sd, err, sizeof(err)), 0, "%s", err);
		fclose(out);
		const char *w = strstr(text, "\nwritten by local, optimizer sgd, ");
		cr_assert_not_null(w, "%s", text);
		cr_assert(old ? !strncmp(w + 34, "saved during its run\n", 21)
			      : !strncmp(w + 34, "a global batch of 4 slices of 16, saved during its run\n", 55),
			  "%s", text);
		free(text);
		if (!old)
			manifest_rewrite(sd, NULL);
	}

	/* An older pstrain's manifest (rewritten above): no batch line. It
	 * loads, and says nothing about a batch it does not know. */
	cr_assert_null(strstr(slurp(path), "batch"), "%s", slurp(path));
	ld = fx_load(&f, 10, 0);
	cr_assert_eq(ld.slices, 0);
	cr_assert_eq(ld.batch, 0);
	char note[600];
	cr_assert_eq(checkpoint_batch_note(&f.lay, ld.slices, ld.batch, sd, note, sizeof(note)), 0);

	/* A damaged one (checksum made again) is refused naming the line. */
	static const char *const bad[] = { "batch 0 16", "batch 4", "batch 4 0", "batch 4 16 x", "batch x 16" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		fx_save(&f, 20 + (long)i);
		checkpoint_step_dir(sd, sizeof(sd), dir, 20 + (long)i);
		manifest_rewrite(sd, bad[i]);
		char err[512];
		float *p = calloc(f.m.nparams, sizeof(float));
		struct ckpt_load l2 = { .l = &f.lay, .resume = 1, .begin = 0, .end = f.m.nparams, .params = p };
		cr_assert_eq(checkpoint_load(sd, &l2, err, sizeof(err)), -EINVAL, "\"%s\" loaded", bad[i]);
		cr_assert(strstr(err, "bad batch line"), "\"%s\": %s", bad[i], err);
		free(p);
	}
	fx_free(&f);
}

/* The note: none for the same batch, one line naming both otherwise,
 * which tells another global batch from the same one split otherwise. */
Test(ckpt_batch, a_resume_with_another_global_batch_is_noted)
{
	struct fx f;
	char note[600];
	fx_init(&f, "slices = 4\nbatch_size = 16\n");
	cr_assert_eq(checkpoint_batch_note(&f.lay, 4, 16, "ck/step-00000010", note, sizeof(note)), 0);
	cr_assert_eq(checkpoint_batch_note(&f.lay, 2, 16, "ck/step-00000010", note, sizeof(note)), 1);
	cr_assert_str_eq(note, "ck/step-00000010 was trained with a global batch of 2 slices of 16 (32 samples a step), this run's is 4 slices of 16 (64): from here the data order and the result differ from an uninterrupted run's");
	cr_assert_eq(checkpoint_batch_note(&f.lay, 1, 64, "ck/step-00000010", note, sizeof(note)), 1);
	cr_assert_str_eq(note, "ck/step-00000010 was trained with a global batch of 1 slice of 64 (64 samples a step), this run's is 4 slices of 16 (64): the same samples a step, summed in other slices: not bit for bit an uninterrupted run");
	cr_assert_null(strchr(note, '\n'));
	fx_free(&f);
}

/* Through the binary: `local` resumed with another batch_size warns in
 * one line and trains on; resumed with the same, it says nothing. */
Test(ckpt_batch, local_resume_warns_once)
{
	char cfg[300], log[300];
	write_cluster_files(dir);
	snprintf(cfg, sizeof(cfg), "%s/c.ini", dir);
	FILE *f = fopen(cfg, "w");
	cr_assert_not_null(f);
	fputs("[data]\nformat = csv\ntrain_csv = blobs.csv\nlabel_column = first\n"
	      "[train]\nsteps = 20\nbatch_size = 16\nlearning_rate = 0.05\nseed = 3\nthreads = 1\neval_every = 1000\n"
	      "checkpoint_dir = ck\ncheckpoint_every = 0\nlog_dir =\n"
	      "[model]\ninput = 6\nlayer = dense 8\nlayer = relu\nlayer = dense 3\n", f);
	cr_assert_eq(fclose(f), 0);
	snprintf(log, sizeof(log), "%s/run.log", dir);
	static const char *const sets[] = { "train.steps=20", "train.steps=30", "train.batch_size=32" };
	for (int i = 0; i < 3; i++) {
		const char *args[] = { "local", "--config", cfg, "--set", sets[i], i == 2 ? "--set" : NULL,
				       "train.steps=40", NULL };
		pid_t pid = spawn_pstrain(args, log, NULL);
		int st;
		wait_children(&pid, 1, &st, RUN_TIMEOUT_S);
		char *text = slurp(log);
		cr_assert_eq(st, 0, "run %d: exit %d:\n%s", i, st, text);
		cr_assert_not_null(strstr(text, "done: "), "run %d:\n%s", i, text);
		const char *w = strstr(text, "warning: ");
		if (i < 2) {
			cr_assert_null(w, "run %d warns:\n%s", i, text);
			continue;
		}
		char want[700];
		snprintf(want, sizeof(want), "warning: %s/ck/step-00000030 was trained with a global batch of 1 slice of 16 (16 samples a step), this run's is 1 slice of 32 (32): from here the data order and the result differ from an uninterrupted run's\n",
			 dir);
		cr_assert(w && !strncmp(w, want, strlen(want)), "want %sin:\n%s", want, text);
		cr_assert_null(strstr(w + 1, "warning: "), "more than one warning:\n%s", text);
	}
}
