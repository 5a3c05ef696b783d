/* pstrain: the command line. Parses flags, loads the config, dispatches to a
 * role and turns its result into an exit status:
 *   0 done, 1 runtime failure, 2 usage/config/data error, 3 peer/auth failure,
 *   130 stopped by Ctrl-C (SIGINT) or SIGTERM.
 * This is the only file with mutable global state: the stop flag that the
 * signal handler sets. */
#include "core/config.h"
#include "core/model.h"
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

static void on_signal(int sig)
{
	(void)sig;
	stop_requested = 1;
}

struct opts {
	const char *config;
	const char *file;      /* the positional FILE of commands that take one */
	const char *sets[MAX_SETS];
	int nsets;
};

/* What a command accepts besides --help: --config and --set, and/or one
 * optional positional FILE. Anything else is a usage error. */
enum { TAKES_CONFIG = 1, TAKES_FILE = 2 };

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

static const struct command commands[] = {
	{ "local", cmd_local, TAKES_CONFIG, "[--config FILE] [--set S.K=V]...",
	  "train in this process on this machine, no network" },
	{ "check", cmd_check, TAKES_CONFIG, "[--config FILE] [--set S.K=V]...",
	  "validate the config; print it resolved, and the model's layers" },
	{ "keygen", cmd_keygen, TAKES_FILE, "[FILE]",
	  "new random 32-byte cluster key in FILE (default ./cluster.key), mode 0600" },
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *f)
{
	fprintf(f, "usage: pstrain COMMAND [options]\n\ncommands:\n");
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(f, "  pstrain %-6s %-36s %s\n", commands[i].name, commands[i].args, commands[i].help);
	fprintf(f, "\noptions:\n"
		"  --config FILE      cluster config (default ./cluster.ini)\n"
		"  --set S.K=V        override key K of section [S], e.g. --set train.epochs=3 (repeatable)\n"
		"  --help, -h         this help\n"
		"  --version          print the version and the build's GPU support\n"
		"\nexit status: 0 done, 1 runtime failure, 2 usage/config/data error, 130 interrupted\n"
		"keys and defaults: docs/CONFIG.md\n");
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

static void human_bytes(char *buf, size_t len, double b)
{
	const char *unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	int i = 0;
	while (b >= 1024 && i < 4) {
		b /= 1024;
		i++;
	}
	snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", b, unit[i]);
}

static int cmd_check(const struct opts *o)
{
	struct config c;
	struct model m;
	char err[CONFIG_ERR_MAX], size[32];
	int r = load(o, &c);
	if (r)
		return r;
	if (model_build(&m, &c.model, err, sizeof(err)) < 0) {
		fprintf(stderr, "pstrain: %s: %s\n", o->config, err);
		return EXIT_USAGE;
	}
	printf("; %s is valid. Resolved configuration, defaults included:\n\n", o->config);
	config_print(&c, stdout);
	human_bytes(size, sizeof(size), (double)m.nparams * sizeof(float));
	printf("\n; model: %d inputs -> %d outputs, %zu parameters (%s as float32)\n",
	       m.inputs, m.outputs, m.nparams, size);
	printf(";   %-10s %-8s %8s %12s  %s\n", "layer", "type", "output", "parameters", "line");
	printf(";   %-10s %-8s %8d %12s\n", "input", "", m.inputs, "");
	for (int i = 0; i < m.nlayers; i++) {
		const struct layer *l = &m.layers[i];
		char line[16] = "default";
		if (l->line)
			snprintf(line, sizeof(line), "%d", l->line);
		printf(";   %-10s %-8s %8d %12zu  %s\n", l->name, layer_kind_name(l->kind), l->out, l->nparams, line);
	}
	printf("; loss: softmax_cross_entropy\n");
	if (shard_check(c.cluster.nps, m.nparams, err, sizeof(err)) < 0) {
		fprintf(stderr, "pstrain: %s: %s\n", o->config, err);
		return EXIT_USAGE;
	}
	struct shard shards[CONFIG_MAX_HOSTS];
	shard_plan(shards, c.cluster.nps, m.nparams);
	shard_print(stdout, &m, shards, c.cluster.nps, c.cluster.ps);
	printf("; build: %s\n", gpu_build_info());
	int n;
	if (gpu_count(&n, err, sizeof(err)) == 0) {
		for (int i = 0; i < n; i++) {
			struct gpu_info g;
			if (gpu_query(i, &g, err, sizeof(err)) == 0) {
				human_bytes(size, sizeof(size), (double)g.total_bytes);
				printf("; gpu:%d %s, %s, sm_%d%d\n", i, g.name, size, g.cc_major, g.cc_minor);
			}
		}
	} else {
		printf("; gpus: %s\n", err);
	}
	return EXIT_DONE;
}

static int cmd_local(const struct opts *o)
{
	struct config c;
	struct train_result res;
	char err[CONFIG_ERR_MAX];
	int r = load(o, &c);
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

	int tty = isatty(STDOUT_FILENO);
	r = train_local(&c, stdout, tty, &stop_requested, &res, err, sizeof(err));
	if (r == 0 && res.stopped) {
		printf("stopped at step %ld/%ld: test loss %.4f accuracy %.2f%%, wall %.1f s, %.0f samples/s\n",
		       res.steps, res.total_steps, res.test_loss, 100 * res.test_acc, res.wall, res.samples_per_s);
		return EXIT_STOPPED;
	}
	if (r < 0) {
		fflush(stdout);
		fprintf(stderr, "pstrain: %s\n", err);
		return r == -EINVAL || r == -ENOENT ? EXIT_USAGE : EXIT_RUNTIME;
	}
	printf("done: %ld steps, test loss %.4f accuracy %.2f%%, wall %.1f s, %.0f samples/s\n",
	       res.steps, res.test_loss, 100 * res.test_acc, res.wall, res.samples_per_s);
	return EXIT_DONE;
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
	/* Once, before any thread: randombytes and the key and frame code
	 * need it. */
	if (sodium_init() < 0) {
		fprintf(stderr, "pstrain: cannot initialize libsodium (no usable random source?)\n");
		return EXIT_RUNTIME;
	}
	const char *cmd = argv[1];
	if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
		usage(stdout);
		return EXIT_DONE;
	}
	if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
		printf("pstrain %s, %s\n", PSTRAIN_VERSION, gpu_build_info());
		return EXIT_DONE;
	}
	const struct command *command = NULL;
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (strcmp(commands[i].name, cmd) == 0)
			command = &commands[i];
	if (!command)
		return bad_usage("unknown command \"%s\"", cmd);

	struct opts o = { .config = "cluster.ini" };
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];
		const char *val = NULL;
		size_t n = strcspn(a, "=");
		int is_config = strncmp(a, "--config", n) == 0 && n == 8;
		int is_set = strncmp(a, "--set", n) == 0 && n == 5;
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			usage(stdout);
			return EXIT_DONE;
		}
		if ((command->takes & TAKES_FILE) && a[0] != '-') {
			if (o.file)
				return bad_usage("unexpected argument \"%s\" (only one FILE)", a);
			o.file = a;
			continue;
		}
		if (!(command->takes & TAKES_CONFIG) && (is_config || is_set))
			return bad_usage("%s does not apply to this command", a);
		if (!is_config && !is_set)
			return bad_usage("unknown option \"%s\"", a);
		if (a[n] == '=')
			val = a + n + 1;
		else if (i + 1 < argc)
			val = argv[++i];
		else
			return bad_usage("%s needs a value", a);
		if (is_config) {
			o.config = val;
		} else {
			if (o.nsets == MAX_SETS)
				return bad_usage("more than 128 --set options (at %s)", val);
			o.sets[o.nsets++] = val;
		}
	}
	return command->run(&o);
}
