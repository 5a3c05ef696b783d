/* Checkpoints: the safetensors reader, save/load round trips across shard
 * layouts, crashes at injected points between file writes, corrupt and
 * truncated files, rotation, resume of `pstrain local` to the same final
 * parameters as an uninterrupted run, eval/predict, and the standard-library
 * Python loader against `pstrain check --checkpoint`. */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include "../core/ckpt/checkpoint.h"
#include "../core/config/config.h"
#include "../core/nn/model.h"
#include "../core/ckpt/safetensors.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RUN_TIMEOUT_S 60

static char dir[256];

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
	test_dir_make(dir, sizeof(dir), "ckpt");
}

static void teardown(void)
{
	test_dir_remove(dir);
	leak_check();
}

TestSuite(checkpoint, .init = setup, .fini = teardown, .timeout = 120);

/* 93 parameters in 6 tensors; with 3 shards of 31 the boundaries fall
 * inside dense1.weight... (31) and dense2.weight (62). */
static const char *model_ini = "[train]\noptimizer = adam\n[model]\ninput = 4\nlayer = dense 7\nlayer = relu\n"
			       "layer = dense 5\nlayer = dense 3\n";

struct fixture {
	struct config c;
	struct model m;
	struct ckpt_layout lay;
	float *p, *mm, *v;   /* (P) */
};

static void fixture_init(struct fixture *f, int nshards, float seed)
{
	char err[512];
	cr_assert_eq(config_parse_string(&f->c, "t.ini", model_ini, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(&f->m, &f->c.model, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(ckpt_layout_init(&f->lay, &f->m, nshards, &f->c, err, sizeof(err)), 0, "%s", err);
	size_t P = f->m.nparams;
	f->p = malloc(P * sizeof(float));
	f->mm = malloc(P * sizeof(float));
	f->v = malloc(P * sizeof(float));
	cr_assert(f->p && f->mm && f->v);
	for (size_t i = 0; i < P; i++) {
		f->p[i] = seed + (float)i * 0.25f;
		f->mm[i] = -(float)i / 7.0f;
		f->v[i] = (float)i * (float)i * 1e-3f + seed;
	}
}

static void fixture_free(struct fixture *f)
{
	free(f->p);
	free(f->mm);
	free(f->v);
}

static int save(const struct fixture *f, long step, long t, int keep, char *err, size_t errlen)
{
	struct ckpt_state st[CONFIG_MAX_HOSTS];
	for (int k = 0; k < f->lay.nshards; k++) {
		size_t b = f->lay.shards[k].begin;
		st[k] = (struct ckpt_state){ .params = f->p + b, .m = f->mm + b, .v = f->v + b, .t = t };
	}
	return checkpoint_save(dir, &f->lay, step, st, keep, NULL, err, errlen);
}

static void step_dir(char *out, size_t len, long step)
{
	snprintf(out, len, "%s/step-%08ld", dir, step);
}

static int exists(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0;
}

Test(checkpoint, round_trip_bit_exact_any_range)
{
	struct ckpt_load ld;
	for (int nshards = 1; nshards <= 3; nshards += 2) {
		struct fixture f;
		char err[1024], sd[400];
		fixture_init(&f, nshards, 1.5f);
		cr_assert_eq(save(&f, 7 + nshards, 42, 3, err, sizeof(err)), 0, "%s", err);
		step_dir(sd, sizeof(sd), 7 + nshards);
		size_t P = f.m.nparams;
		float *p = malloc(P * sizeof(float)), *m = malloc(P * sizeof(float)), *v = malloc(P * sizeof(float));
		/* Whole vector, each shard's own range, and ranges across boundaries. */
		size_t ranges[][2] = { { 0, P }, { 0, 31 }, { 31, 62 }, { 62, P }, { 5, 70 }, { 30, 33 } };
		for (size_t r = 0; r < sizeof(ranges) / sizeof(ranges[0]); r++) {
			size_t b = ranges[r][0], e = ranges[r][1];
			long t = -1, step = -1;
			memset(p, 0xff, P * sizeof(float));
			ld = (struct ckpt_load){ .l = &f.lay, .resume = 1, .begin = b, .end = e, .params = p, .m = m, .v = v };
			cr_assert_eq(checkpoint_load(sd, &ld, err, sizeof(err)), 0, "%s", err);
			t = ld.t, step = ld.step;
			cr_assert_eq(memcmp(p, f.p + b, (e - b) * sizeof(float)), 0, "params differ, range [%zu,%zu)", b, e);
			cr_assert_eq(memcmp(m, f.mm + b, (e - b) * sizeof(float)), 0, "m differs, range [%zu,%zu)", b, e);
			cr_assert_eq(memcmp(v, f.v + b, (e - b) * sizeof(float)), 0, "v differs, range [%zu,%zu)", b, e);
			cr_assert_eq(t, 42);
			cr_assert_eq(step, 7 + nshards);
		}
		free(p);
		free(m);
		free(v);
		fixture_free(&f);
	}
}

Test(checkpoint, straddling_tensor_is_stored_as_a_described_part)
{
	struct fixture f;
	char err[1024], path[600], sd[400];
	fixture_init(&f, 3, 0);
	cr_assert_eq(save(&f, 1, 1, 3, err, sizeof(err)), 0, "%s", err);
	step_dir(sd, sizeof(sd), 1);
	snprintf(path, sizeof(path), "%s/shard-1-of-3.safetensors", sd);
	FILE *fp = fopen(path, "rb");
	cr_assert_not_null(fp);
	unsigned char *buf = malloc(1 << 16);
	size_t n = fread(buf, 1, 1 << 16, fp);
	fclose(fp);
	struct safetensors st;
	cr_assert_eq(safetensors_parse(&st, buf, n, path, err, sizeof(err)), 0, "%s", err);
	/* Shard 1 is [31, 62): dense1.weight is [0, 28), dense1.bias [28, 35),
	 * dense2.weight [35, 70): biases and weights cut at both ends. */
	const struct st_tensor *t = safetensors_find(&st, "dense1.bias");
	cr_assert_not_null(t);
	cr_assert_eq(t->ndim, 1);
	cr_assert_eq(t->n, 4);
	cr_assert_str_eq(safetensors_meta(&st, "pstrain.part.dense1.bias"), "3:7/7");
	cr_assert_str_eq(safetensors_meta(&st, "pstrain.part.dense2.weight"), "0:27/5x7");
	cr_assert_str_eq(safetensors_meta(&st, "pstrain.part.optim.v.dense2.weight"), "0:27/5x7");
	cr_assert_str_eq(safetensors_meta(&st, "pstrain.step"), "1");
	cr_assert_null(safetensors_find(&st, "dense1.weight"));
	float x;
	safetensors_copy(&st, t, 0, 1, &x);
	cr_assert_eq(x, f.p[31]);
	safetensors_free(&st);
	fixture_free(&f);
}

Test(checkpoint, safetensors_reader_refuses_bad_files)
{
	char err[512];
	struct st_tensor t = { .name = "w", .ndim = 2, .shape = { 2, 3 }, .n = 6 };
	float data[6] = { 1, 2, 3, 4, 5, 6 };
	t.data = data;
	struct st_meta meta = { "k", "v" };
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_eq(safetensors_write(f, &t, 1, &meta, 1, err, sizeof(err)), 0, "%s", err);
	fclose(f);
	cr_assert_eq((len - 24) % 8, 0, "data area not 8-byte aligned");
	/* Intact: parses. Every truncation: refused. */
	for (size_t cut = 0; cut <= len; cut++) {
		struct safetensors st;
		unsigned char *copy = malloc(len + 1);
		memcpy(copy, buf, len);
		int e = safetensors_parse(&st, copy, cut, "x.safetensors", err, sizeof(err));
		if (cut == len) {
			cr_assert_eq(e, 0, "%s", err);
			cr_assert_str_eq(safetensors_meta(&st, "k"), "v");
		} else {
			cr_assert_eq(e, -EINVAL, "cut at %zu of %zu accepted", cut, len);
			cr_assert(strstr(err, "x.safetensors"), "%s", err);
		}
		safetensors_free(&st);
	}
	/* A wrong dtype and bad offsets. */
	struct { const char *json, *why; } bad[] = {
		{ "{\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", NULL },
		{ "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", NULL },
		{ "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", NULL },
		{ "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", "twice" },
		{ "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", NULL },
		/* what the JSON reader passes and the format does not */
		{ "{\"w\\u00e9\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", "not printable ASCII" },
		{ "{\"w\\n\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", "not printable ASCII" },
		{ "{\"w\":{\"dtype\":\"F32\",\"shape\":[1e0],\"data_offsets\":[0,4]}}", "non-negative integer" },
		{ "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", "non-negative integer" },
		{ "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,18446744073709551620]}}", "out of range" },
		{ "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", "array too long" },
		{ "{\"w\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}", "expected an array" },
		{ "{\"__metadata__\":{\"k\":1},\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", "expected a string" },
		{ "[{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}]", "not a JSON object" },
	};
	/* and the same entry well formed is read */
	{
		const char *good = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
		size_t h = strlen(good);
		unsigned char *b = calloc(1, 8 + h + 8);
		b[0] = (unsigned char)h;
		memcpy(b + 8, good, h);
		struct safetensors st;
		cr_assert_eq(safetensors_parse(&st, b, 8 + h + 4, "good", err, sizeof(err)), 0, "%s", err);
		safetensors_free(&st);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		size_t h = strlen(bad[i].json);
		unsigned char *b = calloc(1, 8 + h + 8);
		b[0] = (unsigned char)h;
		memcpy(b + 8, bad[i].json, h);
		struct safetensors st;
		cr_assert_eq(safetensors_parse(&st, b, 8 + h + 4, "bad", err, sizeof(err)), -EINVAL, "accepted %s", bad[i].json);
		cr_assert(!bad[i].why || strstr(err, bad[i].why), "%s: %s", bad[i].json, err);
		safetensors_free(&st);
	}
	free(buf);
}

/* Saves in a child that kills itself at `point` while saving step 2. */
static void crash_child(struct fixture *f, const char *point)
{
	pid_t pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		char err[512];
		/* The hooks are read when a layout is made; set this one's. */
		snprintf(f->lay.hooks.ckpt_crash, sizeof(f->lay.hooks.ckpt_crash), "%s", point);
		save(f, 2, 2, 3, err, sizeof(err));
		_exit(0);   /* not reached when the hook fires */
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "%s: child was not killed at the injected point", point);
}

Test(checkpoint, crash_between_file_writes_keeps_previous)
{
	struct ckpt_load ld;
	const char *points[] = { "shard", "manifest", "publish" };
	for (size_t i = 0; i < 3; i++) {
		struct fixture f;
		char err[1024], sd[400];
		fixture_init(&f, 3, 1);
		cr_assert_eq(save(&f, 1, 1, 3, err, sizeof(err)), 0, "%s", err);
		f.p[0] = 99;   /* what step 2 would hold */
		crash_child(&f, points[i]);
		step_dir(sd, sizeof(sd), 2);
		cr_assert(!exists(sd), "%s: step 2 published after a crash", points[i]);
		size_t P = f.m.nparams;
		float *p = malloc(P * sizeof(float));
		long step = -1;
		ld = (struct ckpt_load){ .l = &f.lay, .resume = 1, .begin = 0, .end = P, .params = p, .m = NULL, .v = NULL };
		cr_assert_eq(checkpoint_restore(dir, &ld, NULL, err, sizeof(err)), 0,
			     "%s: %s", points[i], err);
		step = ld.step;
		cr_assert_eq(step, 1);
		cr_assert_eq(p[0], 1.0f);
		/* The next save of step 2 succeeds over the leftovers. */
		cr_assert_eq(save(&f, 2, 2, 3, err, sizeof(err)), 0, "%s", err);
		ld = (struct ckpt_load){ .l = &f.lay, .resume = 1, .begin = 0, .end = P, .params = p, .m = NULL, .v = NULL };
		cr_assert_eq(checkpoint_restore(dir, &ld, NULL, err, sizeof(err)), 0,
			     "%s", err);
		step = ld.step;
		cr_assert_eq(step, 2);
		cr_assert_eq(p[0], 99.0f);
		free(p);
		fixture_free(&f);
		teardown();
		setup();
	}
}

/* Applies damage to the newest checkpoint's file and expects restore to
 * fall back to step 1 naming the file and the reason. */
static void damaged(const char *file, void (*damage)(const char *path), const char *reason)
{
	struct ckpt_load ld;
	struct fixture f;
	char err[1024], path[600], sd[400], *log = NULL;
	size_t loglen = 0;
	fixture_init(&f, 3, 1);
	cr_assert_eq(save(&f, 1, 1, 3, err, sizeof(err)), 0, "%s", err);
	f.p[0] = 5;
	cr_assert_eq(save(&f, 2, 2, 3, err, sizeof(err)), 0, "%s", err);
	step_dir(sd, sizeof(sd), 2);
	snprintf(path, sizeof(path), "%s/%s", sd, file);
	damage(path);
	size_t P = f.m.nparams;
	float *p = malloc(P * sizeof(float));
	long step = -1;
	FILE *lf = open_memstream(&log, &loglen);
	ld = (struct ckpt_load){ .l = &f.lay, .resume = 1, .begin = 0, .end = P, .params = p, .m = NULL, .v = NULL };
	cr_assert_eq(checkpoint_restore(dir, &ld, lf, err, sizeof(err)), 0, "%s", err);
	step = ld.step;
	fclose(lf);
	cr_assert_eq(step, 1, "damaged %s was not refused", file);
	cr_assert_eq(p[0], 1.0f);
	cr_assert(strstr(log, file) && strstr(log, reason), "log lacks file or reason (%s):\n%s", reason, log);
	free(log);
	free(p);
	fixture_free(&f);
}

static void flip_byte(const char *path)
{
	FILE *f = fopen(path, "r+b");
	cr_assert_not_null(f);
	fseek(f, -3, SEEK_END);
	int c = fgetc(f);
	fseek(f, -3, SEEK_END);
	fputc(c ^ 0x10, f);
	fclose(f);
}

static void cut_half(const char *path)
{
	struct stat sb;
	cr_assert_eq(stat(path, &sb), 0);
	cr_assert_eq(truncate(path, sb.st_size / 2), 0);
}

Test(checkpoint, corrupt_file_refused) { damaged("shard-1-of-3.safetensors", flip_byte, "checksum mismatch"); }
Test(checkpoint, truncated_file_refused) { damaged("shard-2-of-3.safetensors", cut_half, "truncated"); }
Test(checkpoint, corrupt_manifest_refused) { damaged("manifest", flip_byte, "manifest"); }
Test(checkpoint, truncated_manifest_refused) { damaged("manifest", cut_half, "manifest"); }

/* Issue 14 item 2: a checkpoint of 3 shards restores into 2 (and any
 * range) bit for bit, moments and t included; another optimizer is
 * refused naming both, another model naming the first tensor that
 * differs, even for eval. */
Test(checkpoint, any_layout_restores_model_or_optimizer_change_refused)
{
	struct ckpt_load ld;
	struct fixture f, g;
	char err[1024];
	fixture_init(&f, 3, 1);
	cr_assert_eq(save(&f, 1, 1, 3, err, sizeof(err)), 0, "%s", err);
	fixture_init(&g, 2, 1);   /* same model, 2 shards */
	size_t P = g.m.nparams;
	memset(g.p, 0, P * sizeof(float));
	memset(g.mm, 0, P * sizeof(float));
	memset(g.v, 0, P * sizeof(float));
	for (int k = 0; k < 2; k++) {
		size_t b = g.lay.shards[k].begin, e = g.lay.shards[k].end;
		ld = (struct ckpt_load){ .l = &g.lay, .resume = 1, .begin = b, .end = e, .params = g.p + b,
					 .m = g.mm + b, .v = g.v + b };
		cr_assert_eq(checkpoint_restore(dir, &ld, NULL, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(ld.t, 1);
		cr_assert_eq(ld.step, 1);
		cr_assert_eq(ld.async, 0, "a local checkpoint is not async");
		cr_assert(ld.test_acc < 0, "no accuracy recorded, read %g", ld.test_acc);
	}
	cr_assert_eq(memcmp(g.p, f.p, P * sizeof(float)), 0);
	cr_assert_eq(memcmp(g.mm, f.mm, P * sizeof(float)), 0);
	cr_assert_eq(memcmp(g.v, f.v, P * sizeof(float)), 0);

	/* another optimizer: refused for a resume, fine for eval */
	struct config oc = g.c;
	struct ckpt_layout ol;
	oc.train.optim.kind = OPTIM_MOMENTUM;
	cr_assert_eq(ckpt_layout_init(&ol, &g.m, 1, &oc, err, sizeof(err)), 0, "%s", err);
	ld = (struct ckpt_load){ .l = &ol, .resume = 1, .begin = 0, .end = P, .params = g.p, .m = g.mm };
	int e = checkpoint_restore(dir, &ld, NULL, err, sizeof(err));
	cr_assert_eq(e, -EINVAL);
	cr_assert(strstr(err, "written with optimizer adam, this config has momentum"), "%s", err);
	ld = (struct ckpt_load){ .l = &ol, .resume = 0, .begin = 0, .end = P, .params = g.p };
	cr_assert_eq(checkpoint_restore(dir, &ld, NULL, err, sizeof(err)), 0, "%s", err);

	/* Another model: refused even for eval, naming the tensor. */
	struct config c;
	struct model m;
	struct ckpt_layout lay;
	cr_assert_eq(config_parse_string(&c, "t.ini", "[model]\ninput = 4\nlayer = dense 8\nlayer = dense 3\n", err, sizeof(err)), 0);
	cr_assert_eq(model_build(&m, &c.model, err, sizeof(err)), 0);
	cr_assert_eq(ckpt_layout_init(&lay, &m, 1, &c, err, sizeof(err)), 0);
	float *p = malloc(m.nparams * sizeof(float));
	ld = (struct ckpt_load){ .l = &lay, .resume = 0, .begin = 0, .end = m.nparams, .params = p };
	e = checkpoint_restore(dir, &ld, NULL, err, sizeof(err));
	cr_assert_eq(e, -EINVAL);
	cr_assert(strstr(err, "another model"), "%s", err);
	cr_assert(strstr(err, "tensor dense1.weight is 7x4 in the checkpoint but 8x4 in this config's model"), "%s", err);
	free(p);
	fixture_free(&f);
	fixture_free(&g);
}

/* checkpoint_describe tells a checkpoint's optimizer and mode from its
 * manifest; a final one's test accuracy comes back from a load. */
Test(checkpoint, describe_and_final_accuracy)
{
	struct fixture f;
	char err[1024], sd[CKPT_PATH_MAX];
	fixture_init(&f, 2, 1);
	struct ckpt_layout al;
	struct config ac = f.c;
	ac.train.mode = MODE_ASYNC;
	cr_assert_eq(ckpt_layout_init_cluster(&al, &f.m, 2, &ac, err, sizeof(err)), 0, "%s", err);
	size_t half = al.shards[1].begin, P = f.m.nparams;
	double acc = 0.8125;
	struct ckpt_state st0 = { .params = f.p, .m = f.mm, .v = f.v, .t = 8, .test_acc = &acc };
	struct ckpt_state st1 = { .params = f.p + half, .m = f.mm + half, .v = f.v + half, .t = 9, .test_acc = &acc };
	cr_assert_eq(checkpoint_save_shard(dir, &al, 4, 0, &st0, 0, 3, NULL, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(checkpoint_save_shard(dir, &al, 4, 1, &st1, 0, 3, NULL, err, sizeof(err)), 0, "%s", err);
	checkpoint_step_dir(sd, sizeof(sd), dir, 4);
	struct ckpt_info in;
	cr_assert_eq(checkpoint_describe(sd, &f.lay, &in, err, sizeof(err)), 0, "%s", err);
	cr_assert(in.cluster && in.nshards == 2 && in.model_same && in.known, "%d %d %d %d", in.cluster,
		  in.nshards, in.model_same, in.known);
	cr_assert(in.async && in.optim == OPTIM_ADAM);
	cr_assert_eq(checkpoint_fits(sd, &in, &f.lay, err, sizeof(err)), 0, "%s", err);
	/* read whole into local's layout: the shards' t disagree (8, 9) */
	float *p = malloc(P * sizeof(float)), *m = malloc(P * sizeof(float));
	struct ckpt_load ld = { .l = &f.lay, .resume = 1, .begin = 0, .end = P, .params = p, .m = m };
	cr_assert_eq(checkpoint_load(sd, &ld, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(ld.async, 1);
	cr_assert_eq(ld.t, -1, "t %ld from shards that disagree", ld.t);
	cr_assert(fabs(ld.test_acc - 0.8125) < 1e-9, "accuracy %g", ld.test_acc);
	cr_assert_eq(memcmp(p, f.p, P * sizeof(float)), 0);
	/* one shard's range alone has one t */
	ld = (struct ckpt_load){ .l = &al, .resume = 1, .begin = half, .end = P, .params = p + half };
	cr_assert_eq(checkpoint_load(sd, &ld, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(ld.t, 9);
	free(p);
	free(m);
	fixture_free(&f);
}

Test(checkpoint, rotation_keeps_newest_n)
{
	struct ckpt_load ld;
	struct fixture f;
	char err[1024], sd[400];
	fixture_init(&f, 1, 1);
	for (long s = 1; s <= 6; s++)
		cr_assert_eq(save(&f, s * 10, s, 2, err, sizeof(err)), 0, "%s", err);
	for (long s = 1; s <= 6; s++) {
		step_dir(sd, sizeof(sd), s * 10);
		cr_assert_eq(exists(sd), s >= 5, "step %ld: exists %d", s * 10, exists(sd));
	}
	/* Saving a step that exists and is complete leaves it alone. */
	step_dir(sd, sizeof(sd), 60);
	f.p[0] = 123;
	cr_assert_eq(save(&f, 60, 6, 2, err, sizeof(err)), 0, "%s", err);
	float p[200];
	ld = (struct ckpt_load){ .l = &f.lay, .resume = 1, .begin = 0, .end = f.m.nparams, .params = p, .m = NULL, .v = NULL };
	cr_assert_eq(checkpoint_load(sd, &ld, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(p[0], 1.0f);
	fixture_free(&f);
}

/* ---- through the binary ---- */

/* Runs pstrain to the end (at most RUN_TIMEOUT_S) with PSTRAIN_CKPT_CRASH
 * set to crash if not NULL; returns its exit status or 128 + signal. */
static int run(const char *const *args, const char *crash, const char *outpath)
{
	char env[128];
	if (crash)
		snprintf(env, sizeof(env), "PSTRAIN_CKPT_CRASH=%s", crash);
	pid_t pid = spawn_pstrain(args, outpath, crash ? env : NULL);
	int st;
	wait_children(&pid, 1, &st, RUN_TIMEOUT_S);
	cr_assert_neq(st, -1, "pstrain %s did not finish in %d s", args[0], RUN_TIMEOUT_S);
	return st;
}

/* blobs.csv and a config with checkpoint_dir `ck` in dir. A cosine
 * schedule makes the lr depend on the total step count, and adam has all
 * the optimizer state there is: a resume that lost any of it would not
 * end on the same parameters. */
static void write_local(const char *cfg, const char *ck)
{
	char path[300];
	snprintf(path, sizeof(path), "%s/blobs.csv", dir);
	write_blobs(path, 500, 3, 6, 9);
	FILE *f = fopen(cfg, "w");
	cr_assert_not_null(f);
	fprintf(f, "[data]\nformat = csv\ntrain_csv = blobs.csv\nlabel_column = first\n"
		   "[train]\nsteps = 60\nbatch_size = 16\noptimizer = adam\nlearning_rate = 0.01\n"
		   "lr_schedule = cosine\ncheckpoint_dir = %s\ncheckpoint_every = 25\nthreads = 1\nseed = 3\n"
		   "[model]\ninput = 6\nlayer = dense 16\nlayer = relu\nlayer = dense 3\n", ck);
	cr_assert_eq(fclose(f), 0);
}

/* The "tensor" lines of `pstrain check --checkpoint`. */
static void tensor_lines(const char *ck, char *out, size_t len)
{
	char o[300];
	snprintf(o, sizeof(o), "%s/check.txt", dir);
	const char *args[] = { "check", "--checkpoint", ck, NULL };
	int st = run(args, NULL, o);
	char *text = slurp(o);
	cr_assert_eq(st, 0, "check exit %d:\n%s", st, text);
	char *t = strstr(text, "tensor ");
	cr_assert_not_null(t, "no tensor lines:\n%s", text);
	snprintf(out, len, "%s", t);
}

Test(checkpoint, resume_after_kill_ends_on_same_parameters)
{
	char cfg[300], out[300], a[8192], b[8192], ck[300];
	snprintf(cfg, sizeof(cfg), "%s/t.ini", dir);
	snprintf(out, sizeof(out), "%s/out.txt", dir);
	write_local(cfg, "ck_a");

	/* Uninterrupted. */
	const char *args[] = { "local", "--config", cfg, NULL };
	int st = run(args, NULL, out);
	cr_assert_eq(st, 0, "exit %d:\n%s", st, slurp(out));
	/* Training says which GEMM kernels it runs and why, first. */
	cr_expect(strstr(slurp(out), "pstrain: BLAS: OpenBLAS 0.") && strstr(slurp(out), " kernels (") &&
		  strstr(slurp(out), "pstrain: BLAS: ") < strstr(slurp(out), "training: "),
		  "no BLAS line before training:\n%s", slurp(out));
	snprintf(ck, sizeof(ck), "%s/ck_a/step-00000060", dir);
	tensor_lines(ck, a, sizeof(a));

	/* Killed while saving step 50: step 25 is the newest checkpoint. */
	const char *args_b[] = { "local", "--config", cfg, "--set", "train.checkpoint_dir=ck_b", NULL };
	char cwd[300];
	cr_assert_not_null(getcwd(cwd, sizeof(cwd)));
	cr_assert_eq(chdir(dir), 0);   /* --set paths are relative to the current directory */
	st = run(args_b, "publish:50", out);
	cr_assert_eq(st, 128 + SIGKILL, "exit %d:\n%s", st, slurp(out));
	cr_assert(exists("ck_b/step-00000025") && !exists("ck_b/step-00000050"));
	st = run(args_b, NULL, out);
	char *text = slurp(out);
	cr_assert_eq(chdir(cwd), 0);
	cr_assert_eq(st, 0, "exit %d:\n%s", st, text);
	cr_assert(strstr(text, "resuming from ck_b/step-00000025"), "no resume line:\n%s", text);
	cr_assert(strstr(text, "done: 60 steps"), "step count did not continue:\n%s", text);
	snprintf(ck, sizeof(ck), "%s/ck_b/step-00000060", dir);
	tensor_lines(ck, b, sizeof(b));
	cr_assert_str_eq(a, b, "resumed run ends elsewhere:\n%s\nvs uninterrupted:\n%s", b, a);

	/* A checkpoint past the end of a shortened run: a finished run,
	 * said in one line with the accuracy the last save recorded. */
	const char *args_s[] = { "local", "--config", cfg, "--set", "train.steps=30", NULL };
	st = run(args_s, NULL, out);
	text = slurp(out);
	cr_assert_eq(st, 0, "exit %d:\n%s", st, text);
	cr_assert(strstr(text, "step-00000060 is step 60, past this run's 30 steps (test accuracy "),
		  "%s", text);
	cr_assert_null(strstr(text, "done:"), "trained or evaluated again:\n%s", text);
	cr_assert_eq(strchr(text, '\n'), text + strlen(text) - 1, "more than the one line:\n%s", text);

	/* --fresh ignores the checkpoints (and finds step 60 complete). */
	const char *args_f[] = { "local", "--config", cfg, "--fresh", NULL };
	st = run(args_f, NULL, out);
	text = slurp(out);
	cr_assert_eq(st, 0, "exit %d:\n%s", st, text);
	cr_assert_null(strstr(text, "resuming"), "--fresh resumed:\n%s", text);
}

Test(checkpoint, all_refused_is_exit_2_naming_the_file)
{
	char cfg[300], out[300], path[400];
	snprintf(cfg, sizeof(cfg), "%s/t.ini", dir);
	snprintf(out, sizeof(out), "%s/out.txt", dir);
	write_local(cfg, "ck");
	const char *args[] = { "local", "--config", cfg, "--set", "train.steps=30", NULL };
	int st = run(args, NULL, out);
	cr_assert_eq(st, 0, "exit %d:\n%s", st, slurp(out));
	snprintf(path, sizeof(path), "%s/ck/step-00000025/shard-0-of-1.safetensors", dir);
	flip_byte(path);
	snprintf(path, sizeof(path), "%s/ck/step-00000030/shard-0-of-1.safetensors", dir);
	cut_half(path);
	const char *args2[] = { "local", "--config", cfg, NULL };
	st = run(args2, NULL, out);
	char *text = slurp(out);
	cr_assert_eq(st, 2, "exit %d:\n%s", st, text);
	cr_assert(strstr(text, "step-00000030/shard-0-of-1.safetensors") && strstr(text, "truncated"), "%s", text);
	cr_assert(strstr(text, "step-00000025/shard-0-of-1.safetensors: checksum mismatch"), "%s", text);
	cr_assert(strstr(text, "--fresh"), "%s", text);
}

Test(checkpoint, eval_and_predict)
{
	char cfg[300], out[300], ck[300], in[300];
	snprintf(cfg, sizeof(cfg), "%s/t.ini", dir);
	snprintf(out, sizeof(out), "%s/out.txt", dir);
	write_local(cfg, "ck");
	const char *args[] = { "local", "--config", cfg, NULL };
	int st = run(args, NULL, out);
	char *text = slurp(out);
	cr_assert_eq(st, 0, "exit %d:\n%s", st, text);
	char *d = strstr(text, "done: ");
	double loss, acc;
	cr_assert(d && sscanf(strstr(d, "loss "), "loss %lf accuracy %lf", &loss, &acc) == 2, "%s", text);

	snprintf(ck, sizeof(ck), "%s/ck", dir);
	const char *ev[] = { "eval", "--config", cfg, "--checkpoint", ck, NULL };
	st = run(ev, NULL, out);
	text = slurp(out);
	cr_assert_eq(st, 0, "exit %d:\n%s", st, text);
	double l2, a2;
	char *s = strstr(text, "test loss ");
	cr_assert(s && sscanf(s, "test loss %lf accuracy %lf", &l2, &a2) == 2, "%s", text);
	cr_assert_eq(l2, loss, "eval loss %.4f, training ended at %.4f", l2, loss);
	cr_assert_eq(a2, acc);
	cr_assert(strstr(text, "(step 60)"), "%s", text);

	/* Predict on the training CSV: one line per row, probabilities sum to 1. */
	snprintf(in, sizeof(in), "%s/blobs.csv", dir);
	const char *pr[] = { "predict", "--config", cfg, "--checkpoint", ck, "--input", in, "--probs", NULL };
	st = run(pr, NULL, out);
	text = slurp(out);
	cr_assert_eq(st, 0, "exit %d:\n%s", st, text);
	int lines = 0, right = 0;
	FILE *csv = fopen(in, "r");
	char row[512];
	cr_assert_not_null(fgets(row, sizeof(row), csv));   /* the header */
	for (char *p = text; *p; lines++) {
		int label;
		double q[3];
		cr_assert_eq(sscanf(p, "%d,%lf,%lf,%lf", &label, &q[0], &q[1], &q[2]), 4, "line %d: %.40s", lines, p);
		cr_assert_float_eq(q[0] + q[1] + q[2], 1.0, 1e-4);
		cr_assert(q[label] >= q[0] && q[label] >= q[1] && q[label] >= q[2]);
		cr_assert_not_null(fgets(row, sizeof(row), csv));
		right += atoi(row) == label;
		p = strchr(p, '\n');
		cr_assert_not_null(p);
		p++;
	}
	fclose(csv);
	cr_assert_eq(lines, 500);
	cr_assert_gt(right, 450, "only %d of 500 rows predicted right", right);

	/* Missing --checkpoint, and a directory without checkpoints. */
	const char *bad[] = { "eval", "--config", cfg, NULL };
	cr_assert_eq(run(bad, NULL, out), 2);
	const char *none[] = { "eval", "--config", cfg, "--checkpoint", dir, NULL };
	st = run(none, NULL, out);
	cr_assert_eq(st, 2, "exit %d:\n%s", st, slurp(out));
}

Test(checkpoint, python_loader_agrees_with_check)
{
	if (system("python3 -c 'import hashlib' >/dev/null 2>&1") != 0) {
		cr_skip_test("python3 is missing: tests/checkpoint_load.py not run");
	}
	struct fixture f;
	char err[1024], cmd[1200], sd[400], out[300], script[400];
	fixture_init(&f, 3, 0.5f);
	cr_assert_eq(save(&f, 9, 9, 3, err, sizeof(err)), 0, "%s", err);
	step_dir(sd, sizeof(sd), 9);
	/* The script sits next to this file; make runs the suite from the root. */
	snprintf(script, sizeof(script), "%s", __FILE__);
	char *slash = strrchr(script, '/');
	snprintf(slash ? slash + 1 : script, sizeof(script) - (size_t)(slash ? slash + 1 - script : 0), "checkpoint_load.py");
	cr_assert(exists(script), "%s not found (run from the repository root)", script);
	snprintf(out, sizeof(out), "%s/py.txt", dir);
	snprintf(cmd, sizeof(cmd), "python3 '%s' '%s' '%s' > '%s' 2>&1", script, getenv("PSTRAIN_BIN"), dir, out);
	int st = system(cmd);
	char *text = slurp(out);
	cr_assert_eq(st, 0, "checkpoint_load.py failed:\n%s", text);
	/* Known values came back through the reassembly: dense2.weight starts
	 * at parameter 35 (in shard 1), its optimizer moments likewise. */
	char want[200];
	snprintf(want, sizeof(want), "ok dense2.weight 5x7 first=%.9g\n", (double)f.p[35]);
	cr_assert(strstr(text, want), "want \"%s\" in:\n%s", want, text);
	snprintf(want, sizeof(want), "ok optim.v.dense2.weight 5x7 first=%.9g\n", (double)f.v[35]);
	cr_assert(strstr(text, want), "want \"%s\" in:\n%s", want, text);
	int n = 0;
	for (char *p = text; (p = strstr(p, "ok ")); p++)
		n++;
	cr_assert_eq(n, 18, "want 18 tensors (6 params + m + v):\n%s", text);

	/* A tampered file makes the script fail. */
	char path[600];
	snprintf(path, sizeof(path), "%s/shard-2-of-3.safetensors", sd);
	flip_byte(path);
	cr_assert_neq(system(cmd), 0, "checkpoint_load.py accepted a damaged file");
	fixture_free(&f);
}

/* A ps's part of a cluster checkpoint (checkpoint_save_shard): a step some
 * ps has not written is passed over on resume, not refused; redo rewrites
 * this ps's part of an incomplete step but never a complete one;
 * checkpoint_restore_upto ignores newer steps; and an async cluster's
 * layout (ckpt_layout_init_cluster) refuses a sync checkpoint. */
Test(checkpoint, cluster_parts_partial_redo_upto_and_mode)
{
	struct ckpt_load ld;
	struct fixture f;
	char err[512], sd[300], path[400];
	fixture_init(&f, 2, 1.0f);
	size_t P = f.m.nparams, half = f.lay.shards[1].begin;
	struct ckpt_state st0 = { .params = f.p, .m = f.mm, .v = f.v, .t = 4 }, st1 = { .params = f.p + half, .m = f.mm + half, .v = f.v + half, .t = 4 };
	float *p = malloc(P * sizeof(float));
	cr_assert_not_null(p);
	long step = -1;

	/* step 10 complete, step 20 only ps 0's part */
	cr_assert_eq(checkpoint_save_shard(dir, &f.lay, 10, 0, &st0, 0, 3, NULL, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(checkpoint_save_shard(dir, &f.lay, 10, 1, &st1, 0, 3, NULL, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(checkpoint_save_shard(dir, &f.lay, 20, 0, &st0, 0, 3, NULL, err, sizeof(err)), 0, "%s", err);
	char *text = NULL;
	size_t tlen = 0;
	FILE *log = open_memstream(&text, &tlen);
	cr_assert_not_null(log);
	ld = (struct ckpt_load){ .l = &f.lay, .resume = 1, .begin = 0, .end = P, .params = p, .m = NULL, .v = NULL };
	cr_assert_eq(checkpoint_restore(dir, &ld, log, err, sizeof(err)), 0,
		     "%s", err);
	step = ld.step;
	fclose(log);
	cr_assert_eq(step, 10);
	cr_assert_not_null(strstr(text, "skipping"), "%s", text);
	cr_assert_null(strstr(text, "refusing"), "%s", text);
	free(text);

	/* only incomplete steps: no checkpoint at all, not "every one refused" */
	ld = (struct ckpt_load){ .l = &f.lay, .resume = 1, .begin = 0, .end = P, .params = p, .m = NULL, .v = NULL };
	cr_assert_eq(checkpoint_restore_upto(dir, 9, &ld, NULL, err, sizeof(err)),
		     -ENOENT, "%s", err);
	step = ld.step;
	ld = (struct ckpt_load){ .l = &f.lay, .resume = 1, .begin = 0, .end = P, .params = p, .m = NULL, .v = NULL };
	cr_assert_eq(checkpoint_restore_upto(dir, 15, &ld, NULL, err, sizeof(err)),
		     0, "%s", err);
	step = ld.step;
	cr_assert_eq(step, 10);

	/* redo: ps 0 rewrites its part of incomplete step 20 with other values */
	step_dir(sd, sizeof(sd), 20);
	snprintf(path, sizeof(path), "%s/shard-0-of-2.safetensors", sd);
	struct stat before, after;
	cr_assert_eq(stat(path, &before), 0);
	for (size_t i = 0; i < P; i++)
		f.p[i] += 1.0f;
	cr_assert_eq(checkpoint_save_shard(dir, &f.lay, 20, 0, &st0, 0, 3, NULL, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(stat(path, &after), 0);
	cr_assert_eq(before.st_ino, after.st_ino, "without redo an existing part is kept");
	cr_assert_eq(checkpoint_save_shard(dir, &f.lay, 20, 0, &st0, 1, 3, NULL, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(stat(path, &after), 0);
	cr_assert_neq(before.st_ino, after.st_ino, "redo did not rewrite the part of an incomplete step");
	cr_assert_eq(checkpoint_save_shard(dir, &f.lay, 20, 1, &st1, 1, 3, NULL, err, sizeof(err)), 0, "%s", err);
	ld = (struct ckpt_load){ .l = &f.lay, .resume = 1, .begin = 0, .end = P, .params = p, .m = NULL, .v = NULL };
	cr_assert_eq(checkpoint_restore(dir, &ld, NULL, err, sizeof(err)), 0,
		     "%s", err);
	step = ld.step;
	cr_assert_eq(step, 20);
	cr_assert_eq(memcmp(p, f.p, P * sizeof(float)), 0, "step 20 does not hold the rewritten part");
	cr_assert_eq(stat(path, &before), 0);
	cr_assert_eq(checkpoint_save_shard(dir, &f.lay, 20, 0, &st0, 1, 3, NULL, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(stat(path, &after), 0);
	cr_assert_eq(before.st_ino, after.st_ino, "redo rewrote a complete step");

	/* upto */
	ld = (struct ckpt_load){ .l = &f.lay, .resume = 1, .begin = 0, .end = P, .params = p, .m = NULL, .v = NULL };
	cr_assert_eq(checkpoint_restore_upto(dir, 19, &ld, NULL, err, sizeof(err)),
		     0, "%s", err);
	step = ld.step;
	cr_assert_eq(step, 10);

	/* an async cluster resumes these sync checkpoints too, and is told
	 * they are sync ones */
	struct ckpt_layout al;
	struct config ac = f.c;
	ac.train.mode = MODE_ASYNC;
	cr_assert_eq(ckpt_layout_init_cluster(&al, &f.m, 2, &ac, err, sizeof(err)), 0, "%s", err);
	cr_assert_neq(memcmp(al.layout_hash, f.lay.layout_hash, CKPT_HASH_BYTES), 0);
	cr_assert_eq(memcmp(al.model_hash, f.lay.model_hash, CKPT_HASH_BYTES), 0);
	ld = (struct ckpt_load){ .l = &al, .resume = 1, .begin = 0, .end = P, .params = p, .m = NULL, .v = NULL };
	int e = checkpoint_restore(dir, &ld, NULL, err, sizeof(err));
	cr_assert_eq(e, 0, "%s", err);
	cr_assert_eq(ld.async, 0);
	/* eval and predict only need the model */
	ld = (struct ckpt_load){ .l = &al, .resume = 0, .begin = 0, .end = P, .params = p, .m = NULL, .v = NULL };
	cr_assert_eq(checkpoint_restore(dir, &ld, NULL, err, sizeof(err)), 0,
		     "%s", err);
	step = ld.step;
	/* the sync layout of a cluster is the plain one */
	struct config sc = f.c;
	sc.train.mode = MODE_SYNC;
	cr_assert_eq(ckpt_layout_init_cluster(&al, &f.m, 2, &sc, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(memcmp(al.layout_hash, f.lay.layout_hash, CKPT_HASH_BYTES), 0);
	free(p);
	fixture_free(&f);
}

/* A step directory that a run of another layout left: unfinished, its
 * files are replaced by this layout's (else the step would mix two and
 * never load); complete (a cluster's or local's), it is kept as it is. */
Test(checkpoint, another_layouts_step_is_replaced_if_unfinished_kept_if_complete)
{
	struct fixture f2, f3;
	char err[1024], sd[CKPT_PATH_MAX];
	fixture_init(&f2, 2, 1);
	fixture_init(&f3, 3, 2);
	struct ckpt_layout l2, l3, l1;
	cr_assert_eq(ckpt_layout_init_cluster(&l2, &f2.m, 2, &f2.c, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(ckpt_layout_init_cluster(&l3, &f3.m, 3, &f3.c, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(ckpt_layout_init_cluster(&l1, &f3.m, 1, &f3.c, err, sizeof(err)), 0, "%s", err);
	size_t P = f2.m.nparams;
	float *p = malloc(P * sizeof(float));
	struct ckpt_state s2[2], s3[3];
	for (int k = 0; k < 2; k++)
		s2[k] = (struct ckpt_state){ .params = f2.p + l2.shards[k].begin, .m = f2.mm + l2.shards[k].begin,
					     .v = f2.v + l2.shards[k].begin, .t = 5 };
	for (int k = 0; k < 3; k++)
		s3[k] = (struct ckpt_state){ .params = f3.p + l3.shards[k].begin, .m = f3.mm + l3.shards[k].begin,
					     .v = f3.v + l3.shards[k].begin, .t = 5 };

	/* step 5: 2 ps, only shard 0 written; then 3 ps write all of it */
	cr_assert_eq(checkpoint_save_shard(dir, &l2, 5, 0, &s2[0], 0, 9, NULL, err, sizeof(err)), 0, "%s", err);
	for (int k = 0; k < 3; k++)
		cr_assert_eq(checkpoint_save_shard(dir, &l3, 5, k, &s3[k], 0, 9, NULL, err, sizeof(err)), 0, "%s", err);
	checkpoint_step_dir(sd, sizeof(sd), dir, 5);
	char m02[CKPT_PATH_MAX + 32];
	snprintf(m02, sizeof(m02), "%s/manifest-0-of-2", sd);
	cr_assert_neq(access(m02, F_OK), 0, "the 2-ps leftover is still there");
	struct ckpt_load ld = { .l = &f2.lay, .resume = 1, .begin = 0, .end = P, .params = p };
	cr_assert_eq(checkpoint_load(sd, &ld, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(memcmp(p, f3.p, P * sizeof(float)), 0, "step 5 is not the 3-ps one");

	/* step 6: complete with 2 ps; 3 ps reaching it write nothing there */
	for (int k = 0; k < 2; k++)
		cr_assert_eq(checkpoint_save_shard(dir, &l2, 6, k, &s2[k], 0, 9, NULL, err, sizeof(err)), 0, "%s", err);
	for (int k = 0; k < 3; k++)
		cr_assert_eq(checkpoint_save_shard(dir, &l3, 6, k, &s3[k], 0, 9, NULL, err, sizeof(err)), 0, "%s", err);
	checkpoint_step_dir(sd, sizeof(sd), dir, 6);
	cr_assert_eq(checkpoint_load(sd, &ld, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(memcmp(p, f2.p, P * sizeof(float)), 0, "the complete 2-ps step 6 was overwritten");

	/* step 7: local's; a 1-ps cluster (same shard file name) keeps it */
	cr_assert_eq(save(&f2, 7, 5, 9, err, sizeof(err)), 0, "%s", err);
	struct ckpt_state s1 = { .params = f3.p, .m = f3.mm, .v = f3.v, .t = 5 };
	cr_assert_eq(checkpoint_save_shard(dir, &l1, 7, 0, &s1, 0, 9, NULL, err, sizeof(err)), 0, "%s", err);
	checkpoint_step_dir(sd, sizeof(sd), dir, 7);
	cr_assert_eq(checkpoint_load(sd, &ld, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(memcmp(p, f2.p, P * sizeof(float)), 0, "local's step 7 was overwritten");
	free(p);
	fixture_free(&f2);
	fixture_free(&f3);
}
