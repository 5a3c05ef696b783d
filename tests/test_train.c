/* Model building, initialization and end-to-end training on generated data,
 * in process and through the pstrain binary (exit codes, Ctrl-C). */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include "../core/config/config.h"
#include "../core/nn/model.h"
#include "../core/nn/rng.h"
#include "../core/train.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char dir[256];

static void make_dir(void)
{
	test_dir_make(dir, sizeof(dir), "train");
}

static void remove_dir(void)
{
	cr_expect_eq(test_dir_remove(dir), 0);
}

static const char *blob_config =
	"[data]\nformat = csv\ntrain_csv = %s/blobs.csv\nlabel_column = first\ntest_fraction = 0.25\n"
	"[train]\nsteps = %d\nbatch_size = 32\noptimizer = %s\nlearning_rate = %s\nseed = 7\nthreads = 1\n"
	"[model]\ninput = 6\nlayer = dense 16\nlayer = %s\nlayer = dense 3\n";

TestSuite(model, .fini = leak_check);
TestSuite(train, .fini = leak_check);
TestSuite(cli, .fini = leak_check);

Test(model, build_shapes_and_offsets)
{
	struct config c;
	struct model m;
	char err[512];
	cr_assert_eq(config_parse_string(&c, "t.ini", "[model]\ninput = 4x5\nlayer = dense 7\nlayer = tanh\nlayer = dense 3\n",
					 err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(&m, &c.model, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(m.inputs, 20);
	cr_assert_eq(m.outputs, 3);
	cr_assert_eq(m.nlayers, 3);
	cr_assert_eq(m.nparams, (size_t)(20 * 7 + 7 + 7 * 3 + 3));
	cr_assert_eq(m.layers[0].woff, 0);
	cr_assert_eq(m.layers[0].boff, 140);
	cr_assert_eq(m.layers[2].woff, 147);
	cr_assert_eq(m.layers[2].boff, 168);
	cr_assert_str_eq(m.layers[1].name, "tanh1");
	cr_assert_str_eq(m.layers[2].name, "dense2");
}

Test(model, init_depends_on_seed_and_index_only)
{
	struct config c;
	struct model m;
	char err[512];
	cr_assert_eq(config_parse_string(&c, "t.ini", "[model]\ninput = 30\nlayer = dense 20\nlayer = relu\nlayer = dense 5\n",
					 err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(&m, &c.model, err, sizeof(err)), 0, "%s", err);
	size_t P = m.nparams;
	float *a = malloc(P * sizeof(float)), *b = malloc(P * sizeof(float)), *d = malloc(P * sizeof(float));
	model_init_params(&m, a, 0, P, 1);
	model_init_params(&m, b, 0, P, 1);
	model_init_params(&m, d, 0, P, 2);
	cr_assert(memcmp(a, b, P * sizeof(float)) == 0, "same seed must give identical weights");
	size_t same = 0;
	for (size_t i = 0; i < m.layers[0].boff; i++)
		same += a[i] == d[i];
	cr_assert_lt(same, 3, "another seed must give other weights (%zu equal)", same);

	/* Any split into ranges (as ps shards would do) gives the same values. */
	size_t cuts[] = { 0, 1, 77, 600, 620, 621, P };
	for (size_t i = 0; i + 1 < sizeof(cuts) / sizeof(cuts[0]); i++)
		model_init_params(&m, b + cuts[i], cuts[i], cuts[i + 1], 1);
	cr_assert(memcmp(a, b, P * sizeof(float)) == 0, "sharded init differs from whole init");

	/* He for the dense layer before relu: std ~ sqrt(2/30); biases zero. */
	double s2 = 0;
	for (size_t i = 0; i < 600; i++)
		s2 += (double)a[i] * a[i];
	double std = sqrt(s2 / 600);
	cr_assert(fabs(std - sqrt(2.0 / 30)) < 0.03, "He std %f, want %f", std, sqrt(2.0 / 30));
	for (size_t i = 600; i < 620; i++)
		cr_assert_eq(a[i], 0.0f);
	/* Glorot uniform for the last layer: within sqrt(6/(20+5)). */
	double lim = sqrt(6.0 / 25);
	for (size_t i = m.layers[2].woff; i < m.layers[2].boff; i++)
		cr_assert(fabs(a[i]) <= lim, "glorot value %f beyond %f", a[i], lim);
	free(a);
	free(b);
	free(d);
}

static void train_blobs(const char *optimizer, const char *lr, const char *act, double want)
{
	char path[300], text[1024], err[1024];
	struct config c;
	struct train_result res;
	volatile sig_atomic_t stop = 0;
	make_dir();
	snprintf(path, sizeof(path), "%s/blobs.csv", dir);
	write_blobs(path, 800, 3, 6, 11);
	snprintf(text, sizeof(text), blob_config, dir, 150, optimizer, lr, act);
	cr_assert_eq(config_parse_string(&c, "blobs.ini", text, err, sizeof(err)), 0, "%s", err);
	FILE *out = fopen("/dev/null", "w");
	int r = train_local(&c, out, 0, &stop, &res, err, sizeof(err));
	fclose(out);
	cr_assert_eq(r, 0, "train_local: %s", err);
	cr_assert_eq(res.steps, 150);
	cr_assert_gt(res.test_acc, want, "%s/%s: test accuracy %.3f, want > %.3f", optimizer, act, res.test_acc, want);
	cr_assert(isfinite(res.test_loss) && res.test_loss < 0.7, "test loss %f", res.test_loss);
	remove_dir();
}

Test(train, blobs_momentum_relu) { train_blobs("momentum", "0.05", "relu", 0.95); }
Test(train, blobs_sgd_tanh) { train_blobs("sgd", "0.2", "tanh", 0.95); }
Test(train, blobs_adam_sigmoid) { train_blobs("adam", "0.01", "sigmoid", 0.95); }

Test(train, same_seed_same_result)
{
	char path[300], text[1024], err[1024];
	struct config c;
	struct train_result a, b;
	volatile sig_atomic_t stop = 0;
	make_dir();
	snprintf(path, sizeof(path), "%s/blobs.csv", dir);
	write_blobs(path, 400, 3, 6, 5);
	snprintf(text, sizeof(text), blob_config, dir, 40, "momentum", "0.05", "relu");
	cr_assert_eq(config_parse_string(&c, "blobs.ini", text, err, sizeof(err)), 0, "%s", err);
	FILE *out = fopen("/dev/null", "w");
	cr_assert_eq(train_local(&c, out, 0, &stop, &a, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(train_local(&c, out, 0, &stop, &b, err, sizeof(err)), 0, "%s", err);
	fclose(out);
	cr_assert_eq(a.test_loss, b.test_loss, "two runs with one seed differ: %.9g vs %.9g", a.test_loss, b.test_loss);
	remove_dir();
}

Test(train, model_must_fit_data)
{
	char path[300], text[1024], err[1024];
	struct config c;
	struct train_result res;
	volatile sig_atomic_t stop = 0;
	make_dir();
	snprintf(path, sizeof(path), "%s/blobs.csv", dir);
	write_blobs(path, 100, 3, 6, 5);
	/* 5 input features but the data has 6. */
	snprintf(text, sizeof(text), "[data]\nformat = csv\ntrain_csv = %s\n[model]\ninput = 5\nlayer = dense 3\n", path);
	cr_assert_eq(config_parse_string(&c, "fit.ini", text, err, sizeof(err)), 0, "%s", err);
	FILE *out = fopen("/dev/null", "w");
	int r = train_local(&c, out, 0, &stop, &res, err, sizeof(err));
	cr_assert_eq(r, -EINVAL);
	cr_assert(strstr(err, "6 features") && strstr(err, "input"), "message: %s", err);
	/* 2 outputs but labels go up to 2. */
	snprintf(text, sizeof(text), "[data]\nformat = csv\ntrain_csv = %s\n[model]\ninput = 6\nlayer = dense 2\n", path);
	cr_assert_eq(config_parse_string(&c, "fit.ini", text, err, sizeof(err)), 0, "%s", err);
	r = train_local(&c, out, 0, &stop, &res, err, sizeof(err));
	cr_assert_eq(r, -EINVAL);
	cr_assert(strstr(err, "labels go up to 2"), "message: %s", err);
	fclose(out);
	remove_dir();
}

/* Runs the pstrain binary with args; stdout+stderr go to outpath. If
 * sigint_after > 0, sends SIGINT after that many seconds. Returns the exit
 * status (or 128+signal). */
static int run_pstrain(const char *const *args, const char *outpath, double sigint_after)
{
	pid_t pid = spawn_pstrain(args, outpath, NULL);
	if (sigint_after > 0) {
		struct timespec ts = { (time_t)sigint_after, (long)((sigint_after - (time_t)sigint_after) * 1e9) };
		nanosleep(&ts, NULL);
		kill(pid, SIGINT);
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void write_config(const char *path, int steps, int eval_every)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fprintf(f, "[data]\nformat = csv\ntrain_csv = blobs.csv\nlabel_column = first\n"
		   "[train]\nsteps = %d\nbatch_size = 32\nlearning_rate = 0.05\neval_every = %d\nthreads = 1\n"
		   "[model]\ninput = 6\nlayer = dense 16\nlayer = relu\nlayer = dense 3\n", steps, eval_every);
	fclose(f);
}

Test(cli, local_trains_and_reports)
{
	char cfg[300], csv[300], out[300];
	make_dir();
	snprintf(csv, sizeof(csv), "%s/blobs.csv", dir);
	snprintf(cfg, sizeof(cfg), "%s/blobs.ini", dir);
	snprintf(out, sizeof(out), "%s/out.txt", dir);
	write_blobs(csv, 600, 3, 6, 3);
	write_config(cfg, 200, 50);
	const char *args[] = { "local", "--config", cfg, NULL };
	int st = run_pstrain(args, out, 0);
	char *text = slurp(out);
	cr_assert_eq(st, 0, "exit %d, output:\n%s", st, text);
	char *done = strstr(text, "done: 200 steps");
	cr_assert_not_null(done, "no final line in:\n%s", text);
	double acc = 0;
	char *a = strstr(done, "accuracy ");
	cr_assert_not_null(a);
	cr_assert_eq(sscanf(a, "accuracy %lf%%", &acc), 1);
	cr_assert_gt(acc, 95.0, "final accuracy %.2f%%", acc);
	/* Not a terminal: one plain line per evaluation (every 50 steps). */
	int lines = 0;
	for (char *p = text; (p = strstr(p, "step ")); p++)
		lines++;
	cr_assert_eq(lines, 4, "want 4 progress lines, got %d:\n%s", lines, text);
	cr_assert_null(strchr(text, '\r'), "carriage return in non-tty output");
	remove_dir();
}

Test(cli, ctrl_c_stops_cleanly)
{
	char cfg[300], csv[300], out[300];
	make_dir();
	snprintf(csv, sizeof(csv), "%s/blobs.csv", dir);
	snprintf(cfg, sizeof(cfg), "%s/blobs.ini", dir);
	snprintf(out, sizeof(out), "%s/out.txt", dir);
	write_blobs(csv, 600, 3, 6, 3);
	write_config(cfg, 100000000, 10000000);
	const char *args[] = { "local", "--config", cfg, NULL };
	int st = run_pstrain(args, out, 1.0);
	char *text = slurp(out);
	cr_assert_eq(st, 130, "exit %d, output:\n%s", st, text);
	cr_assert_not_null(strstr(text, "stopped at step"), "no summary line in:\n%s", text);
	cr_assert_not_null(strstr(text, "accuracy"), "summary lacks accuracy:\n%s", text);
	remove_dir();
}

Test(cli, set_overrides_file)
{
	char cfg[300], csv[300], out[300];
	make_dir();
	snprintf(csv, sizeof(csv), "%s/blobs.csv", dir);
	snprintf(cfg, sizeof(cfg), "%s/blobs.ini", dir);
	snprintf(out, sizeof(out), "%s/out.txt", dir);
	write_blobs(csv, 300, 3, 6, 3);
	write_config(cfg, 200, 50);
	const char *args[] = { "local", "--config", cfg, "--set", "train.steps=7", NULL };
	int st = run_pstrain(args, out, 0);
	char *text = slurp(out);
	cr_assert_eq(st, 0, "exit %d:\n%s", st, text);
	cr_assert_not_null(strstr(text, "done: 7 steps"), "--set train.steps=7 ignored:\n%s", text);
	remove_dir();
}

Test(cli, bad_data_file_is_exit_2)
{
	char cfg[300], csv[300], out[300];
	make_dir();
	snprintf(csv, sizeof(csv), "%s/blobs.csv", dir);
	snprintf(cfg, sizeof(cfg), "%s/blobs.ini", dir);
	snprintf(out, sizeof(out), "%s/out.txt", dir);
	FILE *f = fopen(csv, "w");
	fprintf(f, "1,2,3,4,5,6,7\n0,1,2,x,4,5,6\n");
	fclose(f);
	write_config(cfg, 10, 50);
	const char *args[] = { "local", "--config", cfg, NULL };
	int st = run_pstrain(args, out, 0);
	char *text = slurp(out);
	cr_assert_eq(st, 2, "exit %d:\n%s", st, text);
	cr_assert_not_null(strstr(text, "blobs.csv"), "message does not name the file:\n%s", text);
	remove_dir();
}

static void write_be32(FILE *f, uint32_t v)
{
	unsigned char b[4] = { (unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8),
			       (unsigned char)v };
	fwrite(b, 1, 4, f);
}

/* Every data-file problem is the user's to fix: exit 2, not 1, whatever
 * errno the loader saw (EFBIG for an absurd header, EISDIR for a directory). */
Test(cli, data_file_problems_are_exit_2)
{
	char cfg[300], img[300], lab[300], out[300];
	make_dir();
	snprintf(img, sizeof(img), "%s/img", dir);
	snprintf(lab, sizeof(lab), "%s/lab", dir);
	snprintf(cfg, sizeof(cfg), "%s/idx.ini", dir);
	snprintf(out, sizeof(out), "%s/out.txt", dir);
	FILE *f = fopen(img, "wb");
	write_be32(f, 0x803);
	write_be32(f, 1000000);
	write_be32(f, 1000);
	write_be32(f, 1000);
	fclose(f);
	f = fopen(lab, "wb");
	write_be32(f, 0x801);
	write_be32(f, 1);
	fputc(0, f);
	fclose(f);
	f = fopen(cfg, "w");
	fprintf(f, "[data]\ntrain_images = img\ntrain_labels = lab\ntest_images = img\ntest_labels = lab\n"
		   "[model]\ninput = 4\nlayer = dense 2\n");
	fclose(f);
	const char *args[] = { "local", "--config", cfg, NULL };
	int st = run_pstrain(args, out, 0);
	char *text = slurp(out);
	cr_expect_eq(st, 2, "absurd IDX header: exit %d:\n%s", st, text);
	cr_expect_not_null(strstr(text, "img"), "message does not name the file:\n%s", text);

	const char *dir_args[] = { "check", "--config", cfg, "--set", "data.test_images=/tmp", NULL };
	st = run_pstrain(dir_args, out, 0);
	text = slurp(out);
	cr_expect_eq(st, 2, "directory as data file: exit %d:\n%s", st, text);
	cr_expect_not_null(strstr(text, "test_images") && strstr(text, "directory") ? text : NULL,
			   "message lacks key or reason:\n%s", text);
	remove_dir();
}
