/* pstrain: the command line. Parses flags, loads the config, dispatches to a
 * role and turns its result into an exit status:
 *   0 done, 1 runtime failure, 2 usage/config/data error, 3 peer/auth failure,
 *   130 stopped by Ctrl-C (SIGINT) or SIGTERM.
 * This is the only file with mutable global state: the stop flag that the
 * signal handler sets, and the BLAS kernels chosen once at start
 * (blas_in_use, for the roles' start-up line). */
#include "core/progress.h"
#include "cluster/cluster.h"
#include "base/hooks.h"
#include "core/nn/backend.h"
#include "core/nn/blas.h"
#include "core/ckpt/checkpoint.h"
#include "core/ckpt/inspect.h"
#include "cluster/launch_config.h"
#include "core/infer.h"
#include "core/config/config.h"
#include "core/data/synth.h"
#include "core/fileio.h"
#include "core/memlimit.h"
#include "core/nn/model.h"
#include "core/nn/sparse_optim.h"
#include "core/shard.h"
#include "core/train.h"
#include "gpu/gpu.h"
#include "net/key.h"

#include <errno.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef PSTRAIN_VERSION
#define PSTRAIN_VERSION "0.1.0-dev"
#endif

#define MAX_SETS 128

enum exit_code {
	EXIT_DONE = 0,
	EXIT_RUNTIME = 1,
	EXIT_USAGE = 2,
	EXIT_PEER = 3,
	EXIT_STOPPED = 130,
};

static volatile sig_atomic_t stop_requested;
/* The BLAS kernels chosen for this CPU at start (core/nn/blas.h), for the
 * lines that name them. */
static struct blas_choice blas_in_use;

static void on_signal(int sig)
{
	(void)sig;
	stop_requested = 1;
}

struct opts {
	const char *config;
	int config_given;      /* --config was on the command line */
	const char *file;      /* the positional FILE of commands that take one */
	const char *sets[MAX_SETS];
	int nsets;
	const char *index;     /* --index / --task_index of ps and worker */
	const char *dump;      /* --dump-params FILE of worker: test builds only */
	const char *checkpoint;   /* --checkpoint DIR of check, eval, predict */
	const char *input;     /* --input FILE of predict */
	int probs;             /* --probs of predict */
	int fresh;             /* --fresh of local */
	int json;              /* --json of status */
	double watch;          /* --watch SECONDS of status; 0: once */
	int argc;              /* the command's own arguments, for TAKES_OWN */
	char **argv;
};

/* What a command accepts besides --help: --config and --set, and/or one
 * optional positional FILE. Anything else is a usage error. */
enum { TAKES_CONFIG = 1, TAKES_FILE = 2, TAKES_INDEX = 4, TAKES_CKPT = 8, TAKES_INPUT = 16, TAKES_FRESH = 32,
       TAKES_WATCH = 64, TAKES_OWN = 128 /* parses its own options */,
       TAKES_DUMP = 256 /* --dump-params, test builds only */ };

struct command {
	const char *name;
	int (*run)(const struct opts *o);
	int takes;
	const char *args;
	const char *help;
};

static int cmd_local(const struct opts *o);
static int cmd_check(const struct opts *o);
static int cmd_keygen(const struct opts *o);
static int cmd_ps(const struct opts *o);
static int cmd_worker(const struct opts *o);
static int cmd_run(const struct opts *o);
static int cmd_eval(const struct opts *o);
static int cmd_predict(const struct opts *o);
static int cmd_status(const struct opts *o);
static int cmd_synth(const struct opts *o);

static const struct command commands[] = {
	{ "local", cmd_local, TAKES_CONFIG | TAKES_FRESH | TAKES_DUMP, "[--config FILE] [--set S.K=V]... [--fresh]",
	  "train in this process, no network (resumes from checkpoint_dir)" },
	{ "check", cmd_check, TAKES_CONFIG | TAKES_CKPT, "[--config FILE] [--set S.K=V]... [--checkpoint DIR]",
	  "validate the config (print it resolved, and the model), or show a checkpoint (and with --config, whether it restores into it)" },
	{ "eval", cmd_eval, TAKES_CONFIG | TAKES_CKPT, "--checkpoint DIR [--config FILE] [--set S.K=V]...",
	  "test loss and accuracy of a checkpoint" },
	{ "predict", cmd_predict, TAKES_CONFIG | TAKES_CKPT | TAKES_INPUT,
	  "--checkpoint DIR --input FILE [--probs] [--config FILE]...",
	  "a label (and probabilities) per sample of FILE" },
	{ "ps", cmd_ps, TAKES_CONFIG | TAKES_INDEX | TAKES_FRESH | TAKES_DUMP, "[--index N] [--config FILE] [--set S.K=V]... [--fresh]",
	  "serve shard N of the parameters to the workers of [cluster]" },
	{ "worker", cmd_worker, TAKES_CONFIG | TAKES_INDEX | TAKES_DUMP, "[--index N] [--config FILE] [--set S.K=V]...",
	  "train as worker N of [cluster] (worker 0 is the chief)" },
	{ "run", cmd_run, TAKES_CONFIG | TAKES_FRESH, "[--config FILE] [--set S.K=V]... [--fresh]",
	  "ps or worker, as TF_CONFIG, Slurm (srun) or a StatefulSet pod name says" },
	{ "status", cmd_status, TAKES_CONFIG | TAKES_WATCH, "[--config FILE] [--set S.K=V]... [--json] [--watch S]",
	  "each ps's version, gradients, steps/s, checkpoint and workers (read-only; exit 3: some did not answer)" },
	{ "synth", cmd_synth, TAKES_OWN, "[--out DIR] [--train-rows N] [--test-rows N] [--seed S] [--vocab N] [--gzip]",
	  "write a synthetic click-through data set (Criteo layout) from a planted model; print its AUC" },
	{ "keygen", cmd_keygen, TAKES_FILE, "[FILE]",
	  "new random 32-byte cluster key in FILE (default ./cluster.key), mode 0600" },
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *f)
{
	fprintf(f, "usage: pstrain COMMAND [options]\n\ncommands:\n");
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(f, "  pstrain %-6s %-44s  %s\n", commands[i].name, commands[i].args, commands[i].help);
	fprintf(f, "\noptions:\n"
		"  --config FILE      cluster config (default ./cluster.ini)\n"
		"  --set S.K=V        override key K of section [S], e.g. --set train.epochs=3 (repeatable)\n"
		"  --index N          ps/worker: which task of [cluster] this is (alias --task_index;\n"
		"                     `pstrain --job_name ps|worker` names the command); without it, from\n"
		"                     TF_CONFIG, Slurm's SLURM_PROCID or a StatefulSet pod's name\n"
		"  --fresh            local, ps: ignore checkpoints in checkpoint_dir and start over\n"
		"  --checkpoint DIR   a step-NNNNNNNN checkpoint, or a checkpoint_dir (its newest complete one)\n"
		"  --input FILE       predict: IDX images, or text in the training file's layout (CSV, Criteo)\n"
		"  --probs            predict: also print the class probabilities\n"
		"  --json             status: one JSON object (per round) instead of the table\n"
		"  --watch S          status: ask again every S seconds until the run is complete\n"
		"  --out DIR          synth: where train.txt and test.txt go (default ./ctr-synth); with\n"
		"                     --train-rows, --test-rows, --seed, --vocab, --gzip (docs/CTR.md)\n"
		"  --help, -h         this help\n"
		"  --version          print the version, the build's GPU support and the BLAS kernels\n"
		"\nexit status: 0 done, 1 runtime failure, 2 usage/config/data error, 3 peer or authentication\n"
		"failure, 130 interrupted\n"
		"keys and defaults: docs/CONFIG.md\n");
}

static int bad_usage(const char *fmt, const char *arg);

/* Once, before any thread of ours: libsodium (randombytes and the key and
 * frame code need it), then the BLAS kernels, before anything calls BLAS:
 * OpenBLAS picked them by CPU model before main; replace a generic pick
 * with what the CPU's features allow, and never train on kernels that
 * compute wrong. */
static int process_start(void)
{
	if (sodium_init() < 0) {
		fprintf(stderr, "pstrain: cannot initialize libsodium (no usable random source?)\n");
		return -1;
	}
	int r = blas_choose(&blas_in_use);
	char blas[256];
	blas_describe(&blas_in_use, blas, sizeof(blas));
	if (r < 0)
		fprintf(stderr, "pstrain: BLAS self-check failed, refusing to compute: %s\n", blas);
	else if (blas_in_use.how == BLAS_FELL_BACK)
		fprintf(stderr, "pstrain: warning: %s\n", blas);
	return r;
}

/* What this build runs on: its GPU support and the BLAS kernels picked
 * for this CPU (--version, check). */
static void print_build(const char *prefix)
{
	char blas[256];
	blas_describe(&blas_in_use, blas, sizeof(blas));
	printf("%s%s; %s\n", prefix, gpu_build_info(), blas);
}

/* The training roles' start-up line: which kernels their GEMMs run on
 * and why, since a generic pick costs 4x and shows nowhere else. */
static void blas_line(char *out, size_t outlen)
{
	char blas[256];
	blas_describe(&blas_in_use, blas, sizeof(blas));
	snprintf(out, outlen, "pstrain: BLAS: %s", blas);
}

static void print_blas(void)
{
	char line[300];
	blas_line(line, sizeof(line));
	printf("%s\n", line);
}

static int load(const struct opts *o, struct config *c)
{
	char err[CONFIG_ERR_MAX];
	if (config_load(c, o->config, o->sets, o->nsets, err, sizeof(err)) < 0) {
		fprintf(stderr, "pstrain: %s\n", err);
		return EXIT_USAGE;
	}
	return 0;
}

/* local and ps: a checkpoint_dir that cannot take files is refused now,
 * before any data is loaded, rather than at the first save, which could be
 * an hour in (and only a warning there, for a periodic one). Workers write
 * nothing and are not asked. */
static int checkpoint_dir_usable(const struct config *c)
{
	char err[CONFIG_ERR_MAX];
	if (!c->train.checkpoint_dir[0])
		return 0;
	int r = file_dir_writable(c->train.checkpoint_dir, err, sizeof(err));
	if (r == 0)
		return 0;
	fprintf(stderr, "pstrain: checkpoint_dir %s; set [train] checkpoint_dir to a writable folder, "
		"or \"\" for no checkpoints\n", err);
	/* As keygen: a full or failing disk is a runtime failure, a path or a
	 * permission is the user's to fix. */
	return r == -ENOSPC || r == -EDQUOT || r == -EIO ? EXIT_RUNTIME : EXIT_USAGE;
}

/* The checkpoint's layout and tensors; with --config, whether it restores
 * into that config (exit 2 when it does not, as the resume would). */
static int check_checkpoint(const struct opts *o)
{
	char err[CONFIG_ERR_MAX], dir[CKPT_PATH_MAX];
	struct config c;
	int r = checkpoint_resolve(o->checkpoint, dir, sizeof(dir), err, sizeof(err));
	if (!r)
		r = inspect_checkpoint(stdout, dir, err, sizeof(err));
	if (!r && !o->config_given) {
		printf("(with --config FILE: whether it restores into that config)\n");
	} else if (!r) {
		r = load(o, &c);
		if (r)
			return r;
		r = inspect_fit(stdout, dir, &c, err, sizeof(err));
		if (r == 1)
			return EXIT_USAGE;
	}
	if (r) {
		fflush(stdout);
		fprintf(stderr, "pstrain: %s\n", err);
		return r == -ENOMEM || r == -EIO ? EXIT_RUNTIME : EXIT_USAGE;
	}
	return EXIT_DONE;
}

/* `check` of a click-through model: which rows of the tables each ps
 * holds (cluster/psrows.h: shard_plan over the rows), and what it takes
 * with the sparse optimizer's state. */
static void print_rows(const struct config *c, const struct model *m)
{
	struct shard rows[CONFIG_MAX_HOSTS];
	char size[32];
	shard_plan(rows, c->cluster.nps, (size_t)embed_total_rows(&m->embed));
	printf("; embedding rows by ps (with %s's state):\n", sparse_kind_name((enum sparse_kind)c->train.embed_optimizer));
	for (int k = 0; k < c->cluster.nps; k++) {
		progress_bytes(size, sizeof(size),
			       (double)memlimit_rows(rows[k].end - rows[k].begin, m->embed.dim, c->train.embed_optimizer));
		printf(";   ps %d %s:%u rows [%zu, %zu) %s\n", k, c->cluster.ps[k].name, c->cluster.ps[k].port,
		       rows[k].begin, rows[k].end, size);
	}
}

static int cmd_check(const struct opts *o)
{
	struct config c;
	struct model m;
	char err[CONFIG_ERR_MAX], size[32];
	if (o->checkpoint)
		return check_checkpoint(o);
	int r = load(o, &c);
	if (r)
		return r;
	if (model_build(&m, &c.model, err, sizeof(err)) < 0) {
		fprintf(stderr, "pstrain: %s: %s\n", o->config, err);
		return EXIT_USAGE;
	}
	printf("; %s is valid. Resolved configuration, defaults included:\n\n", o->config);
	config_print(&c, stdout);
	progress_bytes(size, sizeof(size), (double)m.nparams * sizeof(float));
	printf("\n; model: %d inputs -> %d outputs, %zu parameters (%s as float32)\n",
	       m.inputs, m.outputs, m.nparams, size);
	model_print(stdout, &m);
	if (m.embed.fields) {
		uint64_t R = embed_total_rows(&m.embed);
		progress_bytes(size, sizeof(size), (double)R * m.embed.dim * sizeof(float));
		printf("; embedding tables: %llu rows x %d (%s as float32), outside the parameters above\n",
		       (unsigned long long)R, m.embed.dim, size);
	}
	printf("; loss: %s\n", m.loss == LOSS_SIGMOID_XENT ? "sigmoid_cross_entropy" : "softmax_cross_entropy");
	if (shard_check(c.cluster.nps, m.nparams, err, sizeof(err)) < 0) {
		fprintf(stderr, "pstrain: %s: %s\n", o->config, err);
		return EXIT_USAGE;
	}
	struct shard shards[CONFIG_MAX_HOSTS];
	shard_plan(shards, c.cluster.nps, m.nparams);
	shard_print(stdout, &m, shards, c.cluster.nps, c.cluster.ps);
	if (m.embed.fields)
		print_rows(&c, &m);
	print_build("; build: ");
	int n;
	if (gpu_count(&n, err, sizeof(err)) == 0) {
		for (int i = 0; i < n; i++) {
			struct gpu_info g;
			if (gpu_query(i, &g, err, sizeof(err)) == 0) {
				progress_bytes(size, sizeof(size), (double)g.total_bytes);
				printf("; gpu:%d %s, %s, sm_%d%d\n", i, g.name, size, g.cc_major, g.cc_minor);
			}
		}
	} else {
		printf("; gpus: %s\n", err);
	}
	return EXIT_DONE;
}

/* "test loss 0.3210 accuracy 88.10%", or a binary model's "test logloss
 * 0.4512 AUC 0.7712". */
static void test_figures(char *buf, size_t len, const struct train_result *res)
{
	if (res->binary)
		snprintf(buf, len, "test logloss %.4f AUC %.4f", res->test_loss, res->test_auc);
	else
		snprintf(buf, len, "test loss %.4f accuracy %.2f%%", res->test_loss, 100 * res->test_acc);
}

static int cmd_local(const struct opts *o)
{
	struct config c;
	struct train_result res;
	char err[CONFIG_ERR_MAX];
	int r = load(o, &c);
	if (!r)
		r = checkpoint_dir_usable(&c);
	if (r)
		return r;

	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	/* SA_RESTART: a Ctrl-C during a read must not turn into a read error.
	 * SA_RESETHAND: the first Ctrl-C stops after the current step (and a
	 * final evaluation); a second one kills at once, e.g. during a long
	 * data load. */
	sa.sa_flags = SA_RESTART | SA_RESETHAND;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	char intro[300];
	blas_line(intro, sizeof(intro));
	int tty = isatty(STDOUT_FILENO);
	struct train_ckpt ck = { c.train.checkpoint_dir, o->fresh, intro, o->dump };
	r = train_run(&c, &ck, stdout, tty, &stop_requested, &res, err, sizeof(err));
	char figures[96];
	test_figures(figures, sizeof(figures), &res);
	if (r == 0 && res.stopped) {
		printf("stopped at step %ld/%ld: %s, wall %.1f s, %.0f samples/s\n",
		       res.steps, res.total_steps, figures, res.wall, res.samples_per_s);
		return EXIT_STOPPED;
	}
	if (r < 0) {
		fflush(stdout);
		fprintf(stderr, "pstrain: %s\n", err);
		return r == -EINVAL || r == -ENOENT ? EXIT_USAGE : EXIT_RUNTIME;
	}
	if (res.finished)   /* train_run said so, in one line */
		return EXIT_DONE;
	printf("done: %ld steps, %s, wall %.1f s, %.0f samples/s\n", res.steps, figures, res.wall,
	       res.samples_per_s);
	return EXIT_DONE;
}

static void install_stop_handler(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sa.sa_flags = SA_RESTART | SA_RESETHAND;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

/* The config, its [cluster] lists from where the roles and status both
 * take them (cluster/launch_config.h): a scheduler's environment over the
 * file's. want: LAUNCH_PS, LAUNCH_WORKER, LAUNCH_ANY (run) or
 * LAUNCH_STATUS. */
static int config_of(const struct opts *o, int want, struct config *c, struct launch *l)
{
	char err[CONFIG_ERR_MAX], host[256];
	struct launch_env env;
	launch_env_read(&env, host, sizeof(host));
	if (launch_config_load(c, l, want, o->index, &env, o->config, o->sets, o->nsets, err, sizeof(err)) == 0)
		return 0;
	fprintf(stderr, "pstrain: %s\n", err);
	return EXIT_USAGE;
}

/* The config and which task this is (config_of: --index or the
 * environment); then 0 <= index < that role's count. */
static int task_of(const struct opts *o, int want, struct config *c, int *role, int *index)
{
	struct launch l;
	int r = config_of(o, want, c, &l);
	if (r)
		return r;
	int count = l.role == LAUNCH_PS ? c->cluster.nps : c->cluster.nworkers;
	const char *name = launch_role_name(l.role);
	if (l.index >= count) {
		if (l.from[0])
			fprintf(stderr, "pstrain: %s makes this %s %d, but the cluster has %d %s task%s\n", l.from,
				name, l.index, count, name, count == 1 ? "" : "s");
		else
			fprintf(stderr, "pstrain: --index %s: %s has %d %s task%s in [cluster], so 0..%d\n",
				o->index, c->path, count, name, count == 1 ? "" : "s", count - 1);
		launch_free(&l);
		return EXIT_USAGE;
	}
	if (l.from[0])
		printf("pstrain: %s %d, from %s\n", name, l.index, l.from);
	*role = l.role;
	*index = l.index;
	launch_free(&l);
	return 0;
}

static int role_exit(int r, const char *err)
{
	if (r == 0)
		return EXIT_DONE;
	fflush(stdout);
	fprintf(stderr, "pstrain: %s\n", err);
	if (r == -EINTR)
		return EXIT_STOPPED;
	if (r == -ECONNABORTED)
		return EXIT_PEER;
	return r == -EINVAL || r == -ENOENT ? EXIT_USAGE : EXIT_RUNTIME;
}

static int run_ps(const struct opts *o, const struct config *c, int index)
{
	char err[CONFIG_ERR_MAX];
	if (o->dump)
		return bad_usage("%s does not apply to this command", "--dump-params");
	int r = checkpoint_dir_usable(c);
	if (r)
		return r;
	install_stop_handler();
	print_blas();
	r = cluster_ps(c, index, o->fresh, stdout, &stop_requested, err, sizeof(err));
	return role_exit(r, err);
}

static int run_worker(const struct opts *o, const struct config *c, int index)
{
	struct train_result res;
	char err[CONFIG_ERR_MAX], figures[96];
	install_stop_handler();
	print_blas();
	int r = cluster_worker(c, index, stdout, isatty(STDOUT_FILENO), &stop_requested, o->dump, &res,
			       err, sizeof(err));
	if (r == 0 && res.finished)
		;   /* cluster_worker said so, in one line */
	else if (r == 0 && index == 0)
		printf("done: %ld steps, %s, wall %.1f s, %.0f samples/s\n", res.steps,
		       (test_figures(figures, sizeof(figures), &res), figures), res.wall, res.samples_per_s);
	else if (r == 0)
		printf("worker %d done: %ld steps\n", index, res.steps);
	return role_exit(r, err);
}

static int cmd_ps(const struct opts *o)
{
	struct config c;
	int role, index, r = task_of(o, LAUNCH_PS, &c, &role, &index);
	return r ? r : run_ps(o, &c, index);
}

static int cmd_worker(const struct opts *o)
{
	struct config c;
	int role, index, r = task_of(o, LAUNCH_WORKER, &c, &role, &index);
	return r ? r : run_worker(o, &c, index);
}

/* A task whose role, too, comes from the environment: one command line
 * for every task of a scheduler's job. --fresh applies to a ps only. */
static int cmd_run(const struct opts *o)
{
	struct config c;
	int role, index, r = task_of(o, LAUNCH_ANY, &c, &role, &index);
	if (r)
		return r;
	if (role == LAUNCH_PS)
		return run_ps(o, &c, index);
	struct opts ow = *o;
	ow.fresh = 0;
	return run_worker(&ow, &c, index);
}

/* The key goes to FILE as given, relative to the current directory, not to
 * the config's key_file: keygen reads no config, so what it writes does not
 * depend on which cluster.ini happens to be around. The default matches
 * key_file's default when run in the directory of cluster.ini. */
static int cmd_keygen(const struct opts *o)
{
	const char *path = o->file ? o->file : "cluster.key";
	char err[KEY_ERR_MAX];
	int r = key_generate(path, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "pstrain: %s\n", err);
		/* A full or failing disk is a runtime failure; an existing file,
		 * a bad path or missing permission is the user's to fix. */
		return r == -ENOSPC || r == -EDQUOT || r == -EIO ? EXIT_RUNTIME : EXIT_USAGE;
	}
	printf("wrote new cluster key to %s (mode 0600); copy it to every node with pstrain and cluster.ini\n", path);
	return EXIT_DONE;
}

static int infer_exit(int r, const char *err)
{
	if (r == 0)
		return EXIT_DONE;
	fflush(stdout);
	fprintf(stderr, "pstrain: %s\n", err);
	return r == -ENOMEM || r == -EIO ? EXIT_RUNTIME : EXIT_USAGE;
}

static int cmd_eval(const struct opts *o)
{
	struct config c;
	struct infer_result res;
	char err[CONFIG_ERR_MAX];
	if (!o->checkpoint)
		return bad_usage("%s needs --checkpoint DIR", "eval");
	int r = load(o, &c);
	if (r)
		return r;
	r = infer_eval(&c, o->checkpoint, &res, err, sizeof(err));
	if (r == 0 && res.binary)
		printf("%s (step %ld): test logloss %.4f AUC %.4f on %zu samples\n", res.stepdir, res.step, res.loss,
		       res.auc, res.samples);
	else if (r == 0)
		printf("%s (step %ld): test loss %.4f accuracy %.2f%% on %zu samples\n", res.stepdir, res.step,
		       res.loss, 100 * res.acc, res.samples);
	return infer_exit(r, err);
}

static int cmd_predict(const struct opts *o)
{
	struct config c;
	struct infer_result res;
	char err[CONFIG_ERR_MAX];
	if (!o->checkpoint || !o->input)
		return bad_usage("%s needs --checkpoint DIR and --input FILE", "predict");
	int r = load(o, &c);
	if (r)
		return r;
	r = infer_predict(&c, o->checkpoint, o->input, o->probs, stdout, &res, err, sizeof(err));
	return infer_exit(r, err);
}

/* synth's options are its own (core/data/synth.h parses them), and it
 * reads no config. */
static int cmd_synth(const struct opts *o)
{
	struct synth_opts so;
	struct synth_result res;
	char err[CONFIG_ERR_MAX];
	synth_defaults(&so);
	for (int i = 0; i < o->argc; i++) {
		int used = synth_arg(&so, o->argv + i, o->argc - i, err, sizeof(err));
		if (used <= 0 && (strcmp(o->argv[i], "--help") == 0 || strcmp(o->argv[i], "-h") == 0))
			return usage(stdout), EXIT_DONE;
		if (used <= 0)
			return used < 0 ? bad_usage("%s", err) : bad_usage("unknown option \"%s\"", o->argv[i]);
		i += used - 1;
	}
	int r = synth_write(&so, &res, err, sizeof(err));
	if (r == 0)
		synth_report(&so, &res, stdout);
	return infer_exit(r == -EINVAL || r == 0 ? r : -EIO, err);
}

/* The ps to ask are where the roles would find them (config_of), said on
 * one line: on stderr with --json, whose stdout is JSON only. */
static int cmd_status(const struct opts *o)
{
	struct config c;
	struct launch l;
	char err[CONFIG_ERR_MAX], from[600];
	int r = config_of(o, LAUNCH_STATUS, &c, &l);
	if (r)
		return r;
	launch_config_from(&l, &c, from, sizeof(from));
	launch_free(&l);
	fprintf(o->json ? stderr : stdout, "pstrain: ps and workers from %s\n", from);
	install_stop_handler();
	r = cluster_status(&c, o->json, o->watch, stdout, stderr, &stop_requested, err, sizeof(err));
	return role_exit(r, err);
}

/* --watch's SECONDS: a number from 0.1 to a day, all of it ("2s" is not 2). */
static int parse_watch(const char *val, double *out)
{
	char *end = NULL;
	errno = 0;
	double v = strtod(val, &end);
	if (errno || end == val || *end || !(v >= 0.1 && v <= 86400))
		return bad_usage("--watch \"%s\": not a number of seconds from 0.1 to 86400", val);
	*out = v;
	return 0;
}

static int bad_usage(const char *fmt, const char *arg)
{
	fprintf(stderr, "pstrain: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n\n");
	usage(stderr);
	return EXIT_USAGE;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return bad_usage("%s", "no command given");
	if (process_start() < 0)
		return EXIT_RUNTIME;
	const char *cmd = argv[1];
	/* TensorFlow's spelling: pstrain --job_name ps|worker --task_index N. */
	int first = 2;
	if (strcmp(cmd, "--job_name") == 0 && argc > 2) {
		cmd = argv[2];
		first = 3;
	} else if (strncmp(cmd, "--job_name=", 11) == 0) {
		cmd = cmd + 11;
	}
	if (first == 3 || strncmp(argv[1], "--job_name=", 11) == 0) {
		if (strcmp(cmd, "ps") != 0 && strcmp(cmd, "worker") != 0)
			return bad_usage("--job_name must be ps or worker, not \"%s\"", cmd);
	}
	if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
		usage(stdout);
		return EXIT_DONE;
	}
	if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
		print_build("pstrain " PSTRAIN_VERSION ", ");
		return EXIT_DONE;
	}
	const struct command *command = NULL;
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (strcmp(commands[i].name, cmd) == 0)
			command = &commands[i];
	if (!command)
		return bad_usage("unknown command \"%s\"", cmd);

	struct opts o = { .config = "cluster.ini", .argc = argc - first, .argv = argv + first };
	for (int i = first; i < argc && !(command->takes & TAKES_OWN); i++) {
		const char *a = argv[i];
		const char *val = NULL;
		size_t n = strcspn(a, "=");
		int is_config = strncmp(a, "--config", n) == 0 && n == 8;
		int is_set = strncmp(a, "--set", n) == 0 && n == 5;
		int is_index = (strncmp(a, "--index", n) == 0 && n == 7) ||
			       (strncmp(a, "--task_index", n) == 0 && n == 12);
		int is_dump = hooks_built_in() && strncmp(a, "--dump-params", n) == 0 && n == 13;
		int is_ckpt = strncmp(a, "--checkpoint", n) == 0 && n == 12;
		int is_input = strncmp(a, "--input", n) == 0 && n == 7;
		if (strcmp(a, "--fresh") == 0 || strcmp(a, "--probs") == 0) {
			int fresh = a[2] == 'f';
			if (!(command->takes & (fresh ? TAKES_FRESH : TAKES_INPUT)))
				return bad_usage("%s does not apply to this command", a);
			if (fresh)
				o.fresh = 1;
			else
				o.probs = 1;
			continue;
		}
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			usage(stdout);
			return EXIT_DONE;
		}
		if (strcmp(a, "--json") == 0) {
			if (!(command->takes & TAKES_WATCH))
				return bad_usage("%s does not apply to this command", a);
			o.json = 1;
			continue;
		}
		int is_watch = strncmp(a, "--watch", n) == 0 && n == 7;
		if (is_watch && !(command->takes & TAKES_WATCH))
			return bad_usage("%s does not apply to this command", a);
		if (is_watch) {
			const char *v = a[n] == '=' ? a + n + 1 : i + 1 < argc ? argv[++i] : NULL;
			if (!v)
				return bad_usage("%s needs a value", a);
			int r = parse_watch(v, &o.watch);
			if (r)
				return r;
			continue;
		}
		if ((command->takes & TAKES_FILE) && a[0] != '-') {
			if (o.file)
				return bad_usage("unexpected argument \"%s\" (only one FILE)", a);
			o.file = a;
			continue;
		}
		if (!(command->takes & TAKES_CONFIG) && (is_config || is_set))
			return bad_usage("%s does not apply to this command", a);
		if ((!(command->takes & TAKES_INDEX) && is_index) || (!(command->takes & TAKES_DUMP) && is_dump))
			return bad_usage("%s does not apply to this command", a);
		if ((is_ckpt && !(command->takes & TAKES_CKPT)) || (is_input && !(command->takes & TAKES_INPUT)))
			return bad_usage("%s does not apply to this command", a);
		if (!is_config && !is_set && !is_index && !is_dump && !is_ckpt && !is_input)
			return bad_usage("unknown option \"%s\"", a);
		if (a[n] == '=')
			val = a + n + 1;
		else if (i + 1 < argc)
			val = argv[++i];
		else
			return bad_usage("%s needs a value", a);
		if (is_ckpt) {
			o.checkpoint = val;
		} else if (is_input) {
			o.input = val;
		} else if (is_index) {
			o.index = val;
		} else if (is_dump) {
			o.dump = val;
		} else if (is_config) {
			o.config = val;
			o.config_given = 1;
		} else {
			if (o.nsets == MAX_SETS)
				return bad_usage("more than 128 --set options (at %s)", val);
			o.sets[o.nsets++] = val;
		}
	}
	return command->run(&o);
}
