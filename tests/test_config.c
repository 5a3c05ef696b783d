/* Tests for core/config/config.h and `pstrain check`.
 *
 * The table of bad configs runs the real binary ($PSTRAIN_BIN, set by `make
 * unit`): each row edits a valid base config written into a fresh temporary
 * directory (with empty stand-ins for the data files, which only have to
 * exist), and expects exit status 2, nothing on stdout, and exactly one line
 * on stderr naming the file, the line where there is one, the key and what
 * was expected. The positive tests call config_parse_string in-process, and
 * run `check` for what only config_load does: data files, --set, paths
 * relative to the config file. */
#include "../core/config/config.h"

#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"
#include <criterion/parameterized.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[512];

static void tmp_setup(void)
{
	const char *base = getenv("TMPDIR");

	if (!base || !base[0])
		base = "/tmp";
	snprintf(tmpdir, sizeof(tmpdir), "%s/pstrain-config-XXXXXX", base);
	cr_assert(mkdtemp(tmpdir), "mkdtemp %s: %s", tmpdir, strerror(errno));
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

static void tmp_teardown(void)
{
	if (tmpdir[0])
		nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	leak_check();
}

TestSuite(config, .init = tmp_setup, .fini = tmp_teardown);

/* ---- helpers ---------------------------------------------------------- */

static void write_file(const char *dir, const char *name, const char *text)
{
	char path[1024];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	cr_assert(f, "cannot write %s: %s", path, strerror(errno));
	fputs(text, f);
	cr_assert(fclose(f) == 0);
}

struct run {
	int status;     /* exit status, or -1 if it did not exit normally */
	char *out;
	char *err;
};

static void run_free(struct run *r)
{
	free(r->out);
	free(r->err);
}

/* Runs $PSTRAIN_BIN with args (NULL-terminated) in cwd (NULL = ours),
 * capturing stdout and stderr in files. No shell, so no quoting. */
static void run_pstrain(struct run *r, const char *cwd, const char *const *args)
{
	const char *bin = getenv("PSTRAIN_BIN");
	if (!bin || !bin[0])
		cr_skip_test("PSTRAIN_BIN is not set (run through `make unit`)");

	const char *argv[32];
	int argc = 0;
	argv[argc++] = bin;
	for (int i = 0; args[i]; i++) {
		cr_assert(argc < 31);
		argv[argc++] = args[i];
	}
	argv[argc] = NULL;

	char out_path[1024], err_path[1024];
	snprintf(out_path, sizeof(out_path), "%s/.stdout", tmpdir);
	snprintf(err_path, sizeof(err_path), "%s/.stderr", tmpdir);
	fflush(NULL);
	pid_t pid = fork();
	cr_assert(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (fo < 0 || fe < 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0)
			_exit(126);
		close(fo);
		close(fe);
		if (cwd && chdir(cwd) < 0)
			_exit(126);
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	int st;
	while (waitpid(pid, &st, 0) < 0)
		cr_assert(errno == EINTR, "waitpid: %s", strerror(errno));
	r->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	unsigned char *b;
	size_t n;
	read_all(out_path, &b, &n);
	r->out = (char *)b;
	read_all(err_path, &b, &n);
	r->err = (char *)b;
}

/* The valid base config. The data paths are relative: they resolve against
 * the directory of the config file. */
static const char base_config[] =
	"; pstrain test config\n"                       /* 1 */
	"[cluster]\n"
	"ps = 127.0.0.1:2222, 127.0.0.1:2223\n"
	"workers = 127.0.0.1:2224, 127.0.0.1:2225\n"
	"\n"                                            /* 5 */
	"[train]\n"
	"steps = 10\n"
	"batch_size = 32\n"
	"learning_rate = 0.05\n"
	"\n"                                            /* 10 */
	"[gpu]\n"
	"devices = all\n"
	"memory_fraction = 0.9\n"
	"\n"
	"[data]\n"                                      /* 15 */
	"format = idx\n"
	"train_images = train-images\n"
	"train_labels = train-labels\n"
	"test_images = test-images\n"
	"test_labels = test-labels\n"                   /* 20 */
	"\n"
	"[model]\n"
	"input = 28x28x1\n"
	"layer = dense 16\n"
	"layer = relu\n"                                /* 25 */
	"layer = dense 10\n";

static const char *const data_files[] = {
	"train-images", "train-labels", "test-images", "test-labels", "train.csv", "other-labels",
};

static void make_data_files(const char *dir)
{
	for (size_t i = 0; i < sizeof(data_files) / sizeof(data_files[0]); i++)
		write_file(dir, data_files[i], "");
}

/* base_config with the first occurrence of find replaced; caller frees. */
static char *edit(const char *find, const char *replace)
{
	const char *at = strstr(base_config, find);
	cr_assert(at, "\"%s\" is not in the base config", find);
	size_t pre = (size_t)(at - base_config);
	size_t len = strlen(base_config) - strlen(find) + strlen(replace) + 1;
	char *s = malloc(len);
	cr_assert(s);
	snprintf(s, len, "%.*s%s%s", (int)pre, base_config, replace, at + strlen(find));
	return s;
}

static int line_of(const char *text, const char *needle)
{
	const char *at = strstr(text, needle);
	cr_assert(at, "\"%s\" is not in the edited config", needle);
	int line = 1;
	for (const char *s = text; s < at; s++)
		line += *s == '\n';
	return line;
}

static int count_lines(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* ---- bad configs ------------------------------------------------------ */

#define NO_FILE 1u     /* the message names the --set argument, not the file */
#define NO_CONFIG 2u   /* --config names a file that does not exist */

struct bad_row {
	const char *name;
	const char *find, *replace;   /* edit of base_config; NULL = unchanged */
	const char *at;               /* the error is on the line where this text
				       * is in the edited config; NULL = no line */
	const char *set;              /* a --set argument, or NULL */
	unsigned flags;
	const char *want[4];          /* substrings of the message */
};

#define X10 "xxxxxxxxxx"
#define X50 X10 X10 X10 X10 X10
#define X250 X50 X50 X50 X50 X50

static const struct bad_row bad_rows[] = {
	/* sections, keys, INI syntax */
	{ "unknown section", "[gpu]", "[gpus]", "[gpus]", NULL, 0,
	  { "unknown section", "[gpus]", "expected cluster" } },
	{ "unknown key", "batch_size = 32", "batch_sise = 32", "batch_sise", NULL, 0,
	  { "[train]", "unknown key", "\"batch_sise\"" } },
	{ "key outside any section", "; pstrain test config", "seed = 5", "seed = 5", NULL, 0,
	  { "seed", "outside any section", "[train]" } },
	{ "key set twice", "batch_size = 32", "batch_size = 32\nbatch_size = 64", "batch_size = 64", NULL, 0,
	  { "[train] batch_size", "set twice", "line 8" } },
	{ "indented continuation of a scalar", "batch_size = 32", "batch_size = 32\n  64", "  64", NULL, 0,
	  { "[train] batch_size", "\"64\"", "continuation", "leading blanks" } },
	{ "indented key continues the key above", "learning_rate = 0.05",
	  "learning_rate = 0.05\n  momentum = 0.5", "  momentum", NULL, 0,
	  { "learning_rate", "\"momentum = 0.5\"", "continuation" } },
	{ "indented key after [section]", "steps = 10", "  steps = 10", "  steps", NULL, 0,
	  { "[train] steps", "indented key", "column 1" } },
	{ "indented list key after [section]", "ps = 127.0.0.1:2222, 127.0.0.1:2223",
	  "  ps = 127.0.0.1:2222, 127.0.0.1:2223", "  ps", NULL, 0,
	  { "[cluster] ps", "indented key" } },
	{ "line without =", "batch_size = 32", "batch_size 32", "batch_size 32", NULL, 0,
	  { "syntax error", "key = value" } },
	{ "unclosed [", "[train]", "[train", "[train", NULL, 0,
	  { "syntax error", "[section]" } },
	{ "text after ]", "[train]", "[train] steps = 5", "[train]", NULL, 0,
	  { "syntax error", "after [train]" } },
	{ "unknown section without keys", "[gpu]", "[gpus]\n[gpu]", "[gpus]", NULL, 0,
	  { "unknown section", "[gpus]" } },
	{ "overlong line", "; pstrain test config", "; " X250, X10, NULL, 0,
	  { "line longer than", "characters" } },

	/* numbers and ranges */
	{ "malformed int", "batch_size = 32", "batch_size = 12x", "batch_size", NULL, 0,
	  { "[train] batch_size", "\"12x\"", "not an integer" } },
	{ "int overflow", "batch_size = 32", "batch_size = 99999999999999999999", "batch_size", NULL, 0,
	  { "batch_size", "not an integer" } },
	{ "empty int", "batch_size = 32", "batch_size =", "batch_size", NULL, 0,
	  { "batch_size", "\"\"", "not an integer" } },
	{ "malformed float", "learning_rate = 0.05", "learning_rate = 0.05.1", "learning_rate", NULL, 0,
	  { "[train] learning_rate", "\"0.05.1\"", "not a number" } },
	{ "nan", "learning_rate = 0.05", "learning_rate = nan", "learning_rate", NULL, 0,
	  { "learning_rate", "\"nan\"", "not a number" } },
	{ "memory_fraction 0", "memory_fraction = 0.9", "memory_fraction = 0", "memory_fraction", NULL, 0,
	  { "[gpu] memory_fraction", "out of range", "(0, 1]" } },
	{ "memory_fraction 1.5", "memory_fraction = 0.9", "memory_fraction = 1.5", "memory_fraction", NULL, 0,
	  { "[gpu] memory_fraction", "1.5", "out of range", "(0, 1]" } },
	{ "connect_timeout 0", "workers = 127.0.0.1:2224, 127.0.0.1:2225",
	  "workers = 127.0.0.1:2224, 127.0.0.1:2225\nconnect_timeout = 0", "connect_timeout", NULL, 0,
	  { "[cluster] connect_timeout", "out of range", "[1, 86400]" } },
	{ "connect_timeout a day and a second", "workers = 127.0.0.1:2224, 127.0.0.1:2225",
	  "workers = 127.0.0.1:2224, 127.0.0.1:2225\nconnect_timeout = 86401",
	  "connect_timeout", NULL, 0, { "[cluster] connect_timeout", "86401", "out of range", "[1, 86400]" } },
	{ "batch_size 0", "batch_size = 32", "batch_size = 0", "batch_size", NULL, 0,
	  { "[train] batch_size", "out of range", "1.." } },
	{ "negative learning_rate", "learning_rate = 0.05", "learning_rate = -0.1", "learning_rate", NULL, 0,
	  { "[train] learning_rate", "-0.1", "out of range", "(0, " } },
	{ "zero learning_rate", "learning_rate = 0.05", "learning_rate = 0", "learning_rate", NULL, 0,
	  { "[train] learning_rate", "out of range", "(0, " } },
	{ "learning_rate that is 0 as a float", "learning_rate = 0.05", "learning_rate = 1e-50", "learning_rate", NULL, 0,
	  { "[train] learning_rate", "1e-50", "out of range" } },
	{ "momentum 1", "learning_rate = 0.05", "learning_rate = 0.05\nmomentum = 1", "momentum", NULL, 0,
	  { "[train] momentum", "out of range", "[0, 1)" } },
	{ "test_fraction 1", "format = idx", "format = idx\ntest_fraction = 1", "test_fraction", NULL, 0,
	  { "[data] test_fraction", "out of range", "(0, 1)" } },
	{ "negative seed", "steps = 10", "steps = 10\nseed = -1", "seed", NULL, 0,
	  { "[train] seed", "\"-1\"", "unsigned integer" } },
	{ "bad enum", "learning_rate = 0.05", "optimizer = rmsprop", "optimizer", NULL, 0,
	  { "[train] optimizer", "\"rmsprop\"", "sgd, momentum or adam" } },
	{ "bad bool", "learning_rate = 0.05", "nesterov = maybe", "nesterov", NULL, 0,
	  { "[train] nesterov", "\"maybe\"", "boolean" } },
	{ "bad GPU index", "devices = all", "devices = 64", "devices", NULL, 0,
	  { "[gpu] devices", "\"64\"", "GPU index" } },
	{ "all with indices", "devices = all", "devices = all\n\t1", "\t1", NULL, 0,
	  { "[gpu] devices", "\"all\"", "combined" } },
	{ "bad label_column", "format = idx", "format = idx\nlabel_column = -1", "label_column", NULL, 0,
	  { "[data] label_column", "\"-1\"", "column" } },

	/* hosts */
	{ "port 0", "ps = 127.0.0.1:2222, 127.0.0.1:2223", "ps = 127.0.0.1:0", "ps =", NULL, 0,
	  { "[cluster] ps", "\"127.0.0.1:0\"", "not a port (1..65535)" } },
	{ "port 65536", "ps = 127.0.0.1:2222, 127.0.0.1:2223", "ps = 127.0.0.1:2222, 127.0.0.1:65536", "ps =", NULL, 0,
	  { "[cluster] ps", "\"65536\"", "not a port (1..65535)" } },
	{ "port 80a", "ps = 127.0.0.1:2222, 127.0.0.1:2223", "ps = 127.0.0.1:80a", "ps =", NULL, 0,
	  { "[cluster] ps", "\"80a\"", "not a port (1..65535)" } },
	{ "port +80", "ps = 127.0.0.1:2222, 127.0.0.1:2223", "ps = 127.0.0.1:+80", "ps =", NULL, 0,
	  { "[cluster] ps", "\"+80\"", "not a port (1..65535)" } },
	{ "port 080", "ps = 127.0.0.1:2222, 127.0.0.1:2223", "ps = 127.0.0.1:080", "ps =", NULL, 0,
	  { "[cluster] ps", "\"080\"", "not a port (1..65535)" } },
	{ "missing port", "ps = 127.0.0.1:2222, 127.0.0.1:2223", "ps = 127.0.0.1", "ps =", NULL, 0,
	  { "[cluster] ps", "\"127.0.0.1\"", "host:port" } },
	{ "empty port", "workers = 127.0.0.1:2224, 127.0.0.1:2225", "workers = 127.0.0.1:", "workers =", NULL, 0,
	  { "[cluster] workers", "not a port" } },
	{ "bad host chars", "ps = 127.0.0.1:2222, 127.0.0.1:2223", "ps = ho_st:80", "ps =", NULL, 0,
	  { "[cluster] ps", "\"ho_st\"", "host name" } },
	{ "empty host in []", "ps = 127.0.0.1:2222, 127.0.0.1:2223", "ps = []:80", "ps =", NULL, 0,
	  { "[cluster] ps", "IPv6" } },
	{ "not IPv6 in []", "ps = 127.0.0.1:2222, 127.0.0.1:2223", "ps = [a.b]:80", "ps =", NULL, 0,
	  { "[cluster] ps", "\"a.b\"", "IPv6" } },
	{ "empty list entry", "ps = 127.0.0.1:2222, 127.0.0.1:2223", "ps = 127.0.0.1:1,, 127.0.0.1:2", "ps =", NULL, 0,
	  { "[cluster] ps", "empty entry" } },
	{ "empty host list", "ps = 127.0.0.1:2222, 127.0.0.1:2223", "ps =", "ps =", NULL, 0,
	  { "[cluster] ps", "empty entry" } },
	{ "duplicate within ps", "ps = 127.0.0.1:2222, 127.0.0.1:2223", "ps = h:1, h:1", "ps =", NULL, 0,
	  { "[cluster] ps", "h:1", "listed twice" } },
	{ "duplicate on a continuation line", "ps = 127.0.0.1:2222, 127.0.0.1:2223",
	  "ps = 127.0.0.1:2222,\n  127.0.0.1:2222", "ps =", NULL, 0,
	  { "[cluster] ps", "127.0.0.1:2222", "listed twice" } },
	{ "duplicate across ps and workers", "ps = 127.0.0.1:2222, 127.0.0.1:2223", "ps = 127.0.0.1:2224",
	  "workers =", NULL, 0,
	  { "[cluster] workers", "127.0.0.1:2224", "listed twice" } },
	{ "replicas_to_aggregate > workers", "steps = 10", "steps = 10\nreplicas_to_aggregate = 3",
	  "replicas_to_aggregate", NULL, 0,
	  { "[train] replicas_to_aggregate", "3", "2 workers" } },
	{ "replicas_to_aggregate > slices", "steps = 10", "steps = 10\nslices = 4\nreplicas_to_aggregate = 5",
	  "replicas_to_aggregate", NULL, 0,
	  { "[train] replicas_to_aggregate", "5", "4 [train] slices" } },
	{ "backup workers with slices", "steps = 10", "steps = 10\nslices = 4\nreplicas_to_aggregate = 3",
	  "replicas_to_aggregate", NULL, 0,
	  { "[train] replicas_to_aggregate = 3", "one slice per worker", "the 2 workers" } },
	{ "slices 0", "steps = 10", "steps = 10\nslices = 0", "slices", NULL, 0,
	  { "[train] slices", "0 is out of range (expected 1..256 or auto)" } },
	{ "slices 257", "steps = 10", "steps = 10\nslices = 257", "slices", NULL, 0,
	  { "[train] slices", "257" } },
	{ "min_workers > workers", "ps = 127.0.0.1:2222, 127.0.0.1:2223", "ps = 127.0.0.1:2222, 127.0.0.1:2223\nmin_workers = 3",
	  "min_workers", NULL, 0,
	  { "[cluster] min_workers", "3 is more than the 2 workers" } },
	{ "max_workers < workers", "ps = 127.0.0.1:2222, 127.0.0.1:2223", "ps = 127.0.0.1:2222, 127.0.0.1:2223\nmax_workers = 1",
	  "max_workers", NULL, 0,
	  { "[cluster] max_workers", "1 is fewer than the 2 workers" } },
	{ "min_workers > max_workers", "ps = 127.0.0.1:2222, 127.0.0.1:2223",
	  "ps = 127.0.0.1:2222, 127.0.0.1:2223\nmax_workers = 3\nmin_workers = 4", "min_workers", NULL, 0,
	  { "[cluster] min_workers", "4 is more than the 3 workers of max_workers" } },
	{ "min_workers below backup replicas", "workers = 127.0.0.1:2224, 127.0.0.1:2225",
	  "workers = 127.0.0.1:2224, 127.0.0.1:2225, 127.0.0.1:2226\nmin_workers = 1",
	  "min_workers", "train.replicas_to_aggregate=2", 0,
	  { "[cluster] min_workers", "1 is below replicas_to_aggregate = 2", "backup workers" } },
	{ "steps and epochs", "steps = 10", "steps = 10\nepochs = 2", "epochs", NULL, 0,
	  { "[train]", "steps", "epochs", "only one" } },

	/* data */
	{ "missing idx file", "train_labels = train-labels", "train_labels = nope-labels", "train_labels", NULL, 0,
	  { "[data] train_labels", "nope-labels", "cannot read" } },
	{ "missing idx test file", "test_images = test-images", "test_images = nope-images", "test_images", NULL, 0,
	  { "[data] test_images", "nope-images", "cannot read" } },
	{ "csv without train_csv", "format = idx", "format = csv", "format", NULL, 0,
	  { "[data] format", "csv", "needs train_csv" } },
	{ "missing train_csv", "format = idx", "format = csv\ntrain_csv = nope.csv", "train_csv", NULL, 0,
	  { "[data] train_csv", "nope.csv", "cannot read" } },
	{ "missing test_csv", "format = idx", "format = csv\ntrain_csv = train.csv\ntest_csv = nope.csv",
	  "test_csv", NULL, 0,
	  { "[data] test_csv", "nope.csv", "cannot read" } },

	/* model */
	{ "unknown layer type", "layer = relu", "layer = lstm 3", "lstm", NULL, 0,
	  { "[model] layer", "\"lstm\"", "unknown layer type", "dense N" } },
	{ "conv without filters", "layer = relu", "layer = conv 3", "conv 3", NULL, 0,
	  { "[model] layer", "conv", "kernel and a filter count" } },
	{ "conv 3x4", "layer = relu", "layer = conv 3x4 8", "conv 3x4", NULL, 0,
	  { "[model] layer", "\"3x4\"", "square kernel" } },
	{ "conv bad pad", "layer = relu", "layer = conv 3 8 pad=full", "pad=full", NULL, 0,
	  { "[model] layer", "\"pad=full\"", "padding" } },
	{ "maxpool stride 0", "layer = relu", "layer = maxpool 2 stride=0", "stride=0", NULL, 0,
	  { "[model] layer", "\"stride=0\"", "stride" } },
	{ "dropout 1", "layer = relu", "layer = dropout 1", "dropout 1", NULL, 0,
	  { "[model] layer", "\"1\"", "probability" } },
	{ "dense 0", "layer = dense 16", "layer = dense 0", "dense 0", NULL, 0,
	  { "[model] layer", "\"0\"", "unit count" } },
	{ "dense without units", "layer = dense 16", "layer = dense", "layer = dense\n", NULL, 0,
	  { "[model] layer", "unit count" } },
	{ "relu 5", "layer = relu", "layer = relu 5", "relu 5", NULL, 0,
	  { "[model] layer", "relu", "no arguments", "\"5\"" } },
	{ "last layer not dense", "layer = dense 10", "layer = dense 10\nlayer = tanh", "tanh", NULL, 0,
	  { "[model]", "tanh1", "last layer", "dense" } },
	{ "input with 4 dims", "input = 28x28x1", "input = 28x28x1x1", "input", NULL, 0,
	  { "[model] input", "\"28x28x1x1\"", "shape" } },
	{ "input with a 0 dim", "input = 28x28x1", "input = 0x28", "input", NULL, 0,
	  { "[model] input", "\"0x28\"", "shape" } },
	{ "input too large", "input = 28x28x1", "input = 65536x65536x65536", "input", NULL, 0,
	  { "[model] input", "features" } },

	/* --set */
	{ "--set overlong host", NULL, NULL, NULL, "cluster.ps=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa:1", NO_FILE,
	  { "[cluster] ps", "longer than 255", "--set" } },
	{ "--set unknown key", NULL, NULL, NULL, "train.bogus=1", NO_FILE,
	  { "--set train.bogus=1", "unknown key", "bogus" } },
	{ "--set unknown section", NULL, NULL, NULL, "bogus.x=1", NO_FILE,
	  { "--set bogus.x=1", "unknown key", "[bogus]" } },
	{ "--set out of range", NULL, NULL, NULL, "train.batch_size=0", NO_FILE,
	  { "--set train.batch_size=0", "batch_size", "out of range" } },
	{ "--set malformed", NULL, NULL, NULL, "gpu.memory_fraction=0.5x", NO_FILE,
	  { "--set", "memory_fraction", "\"0.5x\"", "not a number" } },
	{ "--set without =", NULL, NULL, NULL, "train.batch_size", NO_FILE,
	  { "--set train.batch_size", "section.key=value" } },
	{ "--set without a section", NULL, NULL, NULL, "batch_size=3", NO_FILE,
	  { "--set batch_size=3", "section.key=value" } },
	{ "--set on model.layer", NULL, NULL, NULL, "model.layer=relu", NO_FILE,
	  { "--set model.layer=relu", "layer", "repeated key" } },
	{ "--set duplicates a host", NULL, NULL, NULL, "cluster.workers=127.0.0.1:2222", 0,
	  { "[cluster] workers", "127.0.0.1:2222", "listed twice" } },

	/* the file itself */
	{ "missing config file", NULL, NULL, NULL, NULL, NO_CONFIG,
	  { "nope.ini", "cannot open config" } },
};

#define NBAD (sizeof(bad_rows) / sizeof(bad_rows[0]))

/* Indices, not rows: Criterion may run each test in a fresh process, where
 * pointers inside copied parameters would not be valid. */
ParameterizedTestParameters(config, bad)
{
	static int idx[NBAD];
	for (size_t i = 0; i < NBAD; i++)
		idx[i] = (int)i;
	return cr_make_param_array(int, idx, NBAD);
}

ParameterizedTest(int *i, config, bad)
{
	const struct bad_row *row = &bad_rows[*i];
	char cfg[1024];
	char *text = NULL;

	make_data_files(tmpdir);
	snprintf(cfg, sizeof(cfg), "%s/%s", tmpdir, row->flags & NO_CONFIG ? "nope.ini" : "cluster.ini");
	if (!(row->flags & NO_CONFIG)) {
		text = row->find ? edit(row->find, row->replace) : strdup(base_config);
		write_file(tmpdir, "cluster.ini", text);
	}
	const char *args[] = { "check", "--config", cfg, row->set ? "--set" : NULL, row->set, NULL };
	struct run r;
	run_pstrain(&r, NULL, args);

	cr_expect_eq(r.status, 2, "%s: exit status %d, expected 2; stderr: %s", row->name, r.status, r.err);
	cr_expect_str_empty(r.out, "%s: stdout should be empty, got: %s", row->name, r.out);
	cr_expect_eq(count_lines(r.err), 1, "%s: stderr should be one line, got: %s", row->name, r.err);
	cr_expect(r.err[0] && r.err[strlen(r.err) - 1] == '\n', "%s: stderr should end in a newline: %s",
		  row->name, r.err);
	if (!(row->flags & NO_FILE))
		cr_expect(strstr(r.err, cfg), "%s: message does not name %s: %s", row->name, cfg, r.err);
	if (row->at) {
		char where[1100];
		snprintf(where, sizeof(where), "%s:%d: ", cfg, line_of(text, row->at));
		cr_expect(strstr(r.err, where), "%s: message does not say %s: %s", row->name, where, r.err);
	}
	for (int j = 0; j < 4 && row->want[j]; j++)
		cr_expect(strstr(r.err, row->want[j]), "%s: message lacks \"%s\": %s", row->name, row->want[j], r.err);
	free(text);
	run_free(&r);
}

/* ---- the command line ------------------------------------------------- */

Test(config, usage_errors)
{
	static const struct {
		const char *args[4];
		const char *want;
	} rows[] = {
		{ { NULL }, "no command given" },
		{ { "frob", NULL }, "unknown command \"frob\"" },
		{ { "check", "--frob", NULL }, "unknown option \"--frob\"" },
		{ { "check", "--config", NULL }, "--config needs a value" },
		{ { "check", "--set", NULL }, "--set needs a value" },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct run r;
		run_pstrain(&r, tmpdir, rows[i].args);
		cr_expect_eq(r.status, 2, "%s: exit status %d, expected 2", rows[i].want, r.status);
		cr_expect(strncmp(r.err, "pstrain: ", 9) == 0 && strstr(r.err, rows[i].want),
			  "stderr lacks \"%s\": %s", rows[i].want, r.err);
		cr_expect(strstr(r.err, "usage: pstrain"), "%s: no usage on stderr: %s", rows[i].want, r.err);
		cr_expect_str_empty(r.out, "%s: stdout should be empty", rows[i].want);
		run_free(&r);
	}
}

/* ---- valid configs through `pstrain check` ---------------------------- */

Test(config, check_valid_prints_resolved)
{
	char cfg[1024], want[1100];
	make_data_files(tmpdir);
	write_file(tmpdir, "cluster.ini", base_config);
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", tmpdir);

	struct run r;
	const char *args[] = { "check", "--config", cfg, NULL };
	run_pstrain(&r, NULL, args);
	cr_assert_eq(r.status, 0, "exit status %d; stderr: %s", r.status, r.err);
	cr_expect_str_empty(r.err);
	cr_expect(strstr(r.out, "is valid"), "%s", r.out);
	static const char *const lines[] = {
		"\n[cluster]\nps = 127.0.0.1:2222, 127.0.0.1:2223\n",
		"\nbatch_size = 32\n", "\nsteps = 10\n", "\nepochs = 0\n",
		"\nreplicas_to_aggregate = 2\n",   /* resolved from the 2 workers */
		"\noptimizer = momentum\n",        /* a default */
		"\nlayer = dense 16\nlayer = relu\nlayer = dense 10\n",
	};
	for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
		cr_expect(strstr(r.out, lines[i]), "output lacks \"%s\":\n%s", lines[i], r.out);
	snprintf(want, sizeof(want), "\ntrain_images = %s/train-images\n", tmpdir);
	cr_expect(strstr(r.out, want), "data path not resolved against the config's directory:\n%s", r.out);
	run_free(&r);
}

/* Relative data paths in a file resolve against the file's directory, not
 * the current one. */
Test(config, relative_paths_follow_the_config_file)
{
	char sub[600], cfg[700], want[1100];
	snprintf(sub, sizeof(sub), "%s/sub", tmpdir);
	cr_assert(mkdir(sub, 0700) == 0);
	make_data_files(sub);
	write_file(sub, "cluster.ini", base_config);

	/* From "/" with an absolute path. */
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", sub);
	struct run r;
	const char *abs_args[] = { "check", "--config", cfg, NULL };
	run_pstrain(&r, "/", abs_args);
	cr_expect_eq(r.status, 0, "from /: exit status %d; stderr: %s", r.status, r.err);
	run_free(&r);

	/* From tmpdir with "sub/cluster.ini": paths become absolute paths in
	 * sub/, so the printed config loads back from any directory. */
	char *real = realpath(tmpdir, NULL);
	cr_assert_not_null(real);
	const char *rel_args[] = { "check", "--config", "sub/cluster.ini", NULL };
	run_pstrain(&r, tmpdir, rel_args);
	cr_expect_eq(r.status, 0, "from tmpdir: exit status %d; stderr: %s", r.status, r.err);
	snprintf(want, sizeof(want), "\ntest_labels = %s/sub/test-labels\n", real);
	cr_expect(strstr(r.out, want), "want %s in:\n%s", want, r.out);
	snprintf(want, sizeof(want), "\nkey_file = %s/sub/cluster.key\n", real);
	cr_expect(strstr(r.out, want), "default key_file not next to the config; want %s in:\n%s", want, r.out);
	run_free(&r);

	/* The files exist in the current directory but not next to the config:
	 * an error naming the resolved path. */
	char other[1024];
	snprintf(other, sizeof(other), "%s/other", tmpdir);
	cr_assert(mkdir(other, 0700) == 0);
	write_file(other, "cluster.ini", base_config);
	make_data_files(tmpdir);
	const char *other_args[] = { "check", "--config", "other/cluster.ini", NULL };
	run_pstrain(&r, tmpdir, other_args);
	cr_expect_eq(r.status, 2);
	snprintf(want, sizeof(want), "other/cluster.ini:%d: [data] train_images: cannot read %s/other/train-images",
		 line_of(base_config, "train_images"), real);
	cr_expect(strstr(r.err, want), "expected \"%s\", got: %s", want, r.err);
	run_free(&r);
	free(real);
}

/* --set overrides the file; its relative paths resolve against the
 * current directory. */
Test(config, set_overrides_the_file)
{
	char cfg[700], sub[600];
	snprintf(sub, sizeof(sub), "%s/sub", tmpdir);
	cr_assert(mkdir(sub, 0700) == 0);
	make_data_files(sub);
	write_file(tmpdir, "other-labels", "");
	write_file(sub, "cluster.ini", base_config);
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", sub);

	struct run r;
	const char *args[] = { "check", "--config", cfg, "--set", "train.batch_size=64",
			       "--set=train.optimizer=adam", "--set", "train.learning_rate = 0.001",
			       "--set", "data.test_labels=other-labels",
			       "--set", "cluster.workers=[::1]:9000", "--set", "train.epochs=2",
			       NULL };
	run_pstrain(&r, tmpdir, args);
	cr_assert_eq(r.status, 0, "exit status %d; stderr: %s", r.status, r.err);
	static const char *const lines[] = {
		"\nbatch_size = 64\n", "\noptimizer = adam\n", "\nlearning_rate = 0.001\n",
		"\ntest_labels = other-labels\n", "\nworkers = [::1]:9000\n",
		"\nreplicas_to_aggregate = 1\n", "\nsteps = 0\nepochs = 2\n",
	};
	for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
		cr_expect(strstr(r.out, lines[i]), "output lacks \"%s\":\n%s", lines[i], r.out);
	run_free(&r);
}

/* ---- config_parse_string ---------------------------------------------- */

static struct config *parse_ok(const char *text)
{
	struct config *c = malloc(sizeof(*c));
	char err[CONFIG_ERR_MAX] = "";
	cr_assert(c);
	int r = config_parse_string(c, "test.ini", text, err, sizeof(err));
	cr_assert_eq(r, 0, "config_parse_string: %d %s\n--- text:\n%s", r, err, text);
	return c;
}

static void parse_bad(const char *text, const char *want)
{
	struct config *c = malloc(sizeof(*c));
	char err[CONFIG_ERR_MAX] = "";
	cr_assert(c);
	int r = config_parse_string(c, "test.ini", text, err, sizeof(err));
	cr_expect_eq(r, -EINVAL, "expected -EINVAL, got %d (%s)\n--- text:\n%s", r, err, text);
	cr_expect(strstr(err, want), "message lacks \"%s\": %s", want, err);
	cr_expect(!strchr(err, '\n'), "message has a newline: %s", err);
	free(c);
}

Test(config, defaults)
{
	struct config *c = parse_ok("");
	cr_expect_eq(c->cluster.nps, 2);
	cr_expect_str_eq(c->cluster.ps[0].name, "127.0.0.1");
	cr_expect_eq(c->cluster.ps[0].port, 2222);
	cr_expect_eq(c->cluster.ps[1].port, 2223);
	cr_expect_eq(c->cluster.nworkers, 2);
	cr_expect_eq(c->cluster.workers[1].port, 2225);
	cr_expect_str_eq(c->cluster.key_file, "cluster.key");
	cr_expect_eq(c->train.mode, MODE_SYNC);
	cr_expect_eq(c->train.replicas_to_aggregate, 2);   /* = workers */
	cr_expect_eq(c->train.slices, CONFIG_INT_AUTO);
	cr_expect_eq(config_slices(c, 1), 2);              /* a cluster: one per worker */
	cr_expect_eq(config_slices(c, 0), 1);              /* local: one */
	cr_expect_eq(c->cluster.max_workers, 2);           /* = workers */
	cr_expect_eq(c->cluster.min_workers, 2);           /* = max_workers: not elastic */
	cr_expect_eq(config_elastic(c), 0);
	cr_expect_eq(c->train.staleness_lr, 1);
	cr_expect_eq(c->train.steps, 0);
	cr_expect_eq(c->train.epochs, 1);                   /* neither set: one epoch */
	cr_expect_eq(c->train.batch_size, 256);
	cr_expect_eq(c->train.optim.kind, OPTIM_MOMENTUM);
	cr_expect_eq(c->train.optim.lr, 0.05f);
	cr_expect_eq(c->train.optim.momentum, 0.9f);
	cr_expect_eq(c->train.optim.eps, 1e-8f);
	cr_expect_eq(c->train.seed, 1);
	cr_expect_str_eq(c->train.checkpoint_dir, "test.ckpt");   /* named after "test.ini" */
	cr_expect_eq(c->train.checkpoint_every, 500);
	cr_expect_eq(c->gpu.all, 1);
	cr_expect_eq(c->gpu.memory_fraction, 0.9);
	cr_expect_eq(c->gpu.allow_growth, 0);
	cr_expect_eq(c->gpu.soft_placement, 1);
	cr_expect_eq(c->data.format, DATA_IDX);
	cr_expect(strstr(c->data.train_images, "fashion-mnist/train-images-idx3-ubyte.gz"));
	cr_expect_str_empty(c->data.train_csv);
	cr_expect_eq(c->data.label_column, 0);
	cr_expect_eq(c->data.header, CSV_HEADER_AUTO);
	cr_expect_eq(c->data.test_fraction, 0.2);
	cr_expect_eq(c->model.in_h, 28);
	cr_expect_eq(c->model.in_w, 28);
	cr_expect_eq(c->model.in_c, 1);
	cr_expect_eq(c->model.nlayers, 5);
	cr_expect_eq(c->model.layers[0].kind, LAYER_DENSE);
	cr_expect_eq(c->model.layers[0].units, 512);
	cr_expect_eq(c->model.layers[4].units, 10);
	cr_expect_str_eq(c->path, "test.ini");
	free(c);
}

Test(config, values)
{
	struct config *c = parse_ok(
		"[train]\n"
		"mode = async   ; inline comment\n"
		"max_staleness = 4\n"
		"epochs = 3\n"
		"batch_size = 100\n"
		"optimizer = adam\n"
		"learning_rate = 2.5e-3\n"
		"nesterov = yes\n"
		"seed = 18446744073709551615\n"
		"checkpoint_dir = /var/ck\n"
		"[gpu]\n"
		"devices = 1, 3\n"
		"memory_fraction = 1\n"
		"log_placement = on\n"
		"[data]\n"
		"format = csv\n"
		"train_csv = rel/t.csv\n"
		"label_column = last\n"
		"header = no\n"
		"[model]\n"
		"input = 784\n"
		"layer = dense 8\n"
		"layer = tanh\n"
		"layer = dense 4\n");
	cr_expect_eq(c->train.mode, MODE_ASYNC);
	cr_expect_eq(c->train.max_staleness, 4);
	cr_expect_eq(c->train.epochs, 3);
	cr_expect_eq(c->train.steps, 0);
	cr_expect_eq(c->train.batch_size, 100);
	cr_expect_eq(c->train.optim.kind, OPTIM_ADAM);
	cr_expect_eq(c->train.optim.lr, 2.5e-3f);
	cr_expect_eq(c->train.optim.nesterov, 1);
	cr_expect_eq(c->train.seed, UINT64_MAX);
	cr_expect_str_eq(c->train.checkpoint_dir, "/var/ck");
	cr_expect_eq(c->gpu.all, 0);
	cr_expect_eq(c->gpu.ndevices, 2);
	cr_expect_eq(c->gpu.devices[1], 3);
	cr_expect_eq(c->gpu.memory_fraction, 1.0);
	cr_expect_eq(c->gpu.log_placement, 1);
	cr_expect_eq(c->data.format, DATA_CSV);
	cr_expect_str_eq(c->data.train_csv, "rel/t.csv");   /* from a string: as written */
	cr_expect_eq(c->data.label_column, -1);
	cr_expect_eq(c->data.header, CSV_HEADER_NO);
	cr_expect_eq(c->model.in_h, 784);
	cr_expect_eq(c->model.in_w, 1);
	cr_expect_eq(c->model.in_c, 1);
	cr_expect_eq(c->model.nlayers, 3);   /* the file's layers replace the defaults */
	cr_expect_eq(c->model.layers[1].kind, LAYER_TANH);
	cr_expect_eq(c->model.layers[2].units, 4);
	cr_expect_eq(c->model.layers[0].line, 22);
	free(c);
}

Test(config, host_lists_ipv6_and_continuations)
{
	struct config *c = parse_ok(
		"[cluster]\n"
		"ps = [::1]:2222, host-a.example.com:1,   ; rack 1\n"
		"     [fe80::1:2]:3,\n"
		"\t10.0.0.1:65535   ; rack 2\n"
		"     10.0.0.2:1\n"
		"workers = [::1]:2223\n"
		"key_file = k\n");
	cr_assert_eq(c->cluster.nps, 5);
	cr_expect_str_eq(c->cluster.ps[0].name, "::1");
	cr_expect_eq(c->cluster.ps[0].port, 2222);
	cr_expect_str_eq(c->cluster.ps[1].name, "host-a.example.com");
	cr_expect_str_eq(c->cluster.ps[2].name, "fe80::1:2");
	cr_expect_eq(c->cluster.ps[2].port, 3);
	cr_expect_str_eq(c->cluster.ps[3].name, "10.0.0.1");
	cr_expect_eq(c->cluster.ps[3].port, 65535);
	cr_expect_str_eq(c->cluster.ps[4].name, "10.0.0.2");
	cr_expect_eq(c->cluster.nworkers, 1);
	cr_expect_str_eq(c->cluster.workers[0].name, "::1");
	cr_expect_eq(c->cluster.workers[0].port, 2223);
	cr_expect_eq(c->train.replicas_to_aggregate, 1);
	free(c);

	/* Continued layers: layer is a repeated key. */
	c = parse_ok("[model]\nlayer = dense 8\n  relu\n  dense 3\n");
	cr_expect_eq(c->model.nlayers, 3);
	cr_expect_eq(c->model.layers[2].units, 3);
	free(c);
}

Test(config, devices)
{
	struct config *c = parse_ok("[gpu]\ndevices = 0,0\n");
	cr_expect_eq(c->gpu.all, 0);
	cr_expect_eq(c->gpu.ndevices, 2);
	cr_expect_eq(c->gpu.devices[0], 0);
	cr_expect_eq(c->gpu.devices[1], 0);
	free(c);

	c = parse_ok("[gpu]\ndevices = 2,\n  63\n");
	cr_expect_eq(c->gpu.ndevices, 2);
	cr_expect_eq(c->gpu.devices[1], 63);
	free(c);

	parse_bad("[gpu]\ndevices = 0, all\n", "test.ini:2: [gpu] devices: \"all\"");
	parse_bad("[gpu]\ndevices = all\n  1\n", "test.ini:3: [gpu] devices: \"all\" cannot be combined");
}

/* Lines up to 198 characters (docs/CONFIG.md), with "\n" or "\r\n"; one
 * more is an error rather than a line that inih silently splits in two. */
Test(config, line_length_limit)
{
	char text[512];
	snprintf(text, sizeof(text), "[train]\n; %0196d\nsteps = 5\n", 0);
	cr_assert_eq(strchr(text + 8, '\n') - (text + 8), 198);
	free(parse_ok(text));
	snprintf(text, sizeof(text), "[train]\r\n; %0196d\r\nsteps = 5\r\n", 0);
	free(parse_ok(text));
	snprintf(text, sizeof(text), "[train]\nsteps = %0190d", 5);   /* no final newline */
	cr_assert_eq(strlen(text + 8), 198);
	free(parse_ok(text));
	snprintf(text, sizeof(text), "[train]\n; %0197d\nsteps = 5\n", 0);
	parse_bad(text, "test.ini:2: line longer than 198 characters");
	snprintf(text, sizeof(text), "[train]\nsteps = 5\nbatch_size = %0300d\n", 1);
	parse_bad(text, "test.ini:3: line longer than 198 characters");
}

Test(config, parse_string_errors)
{
	parse_bad("[train]\nsteps = 5\n[train]\nsteps = 6\n", "test.ini:4: [train] steps: set twice (first on line 2)");
	parse_bad("[model]\ninput = 65536x65536x65536\nlayer = dense 3\n", "test.ini:2: [model] input:");
	parse_bad("[model]\nlayer = dense 3\nlayer = relu\n", "test.ini:3: [model] the last layer is relu1");
	parse_bad("[cluster]\nps = a:1,\n  b:2,,\n", "test.ini:3: [cluster] ps: empty entry");
	parse_bad("[cluster]\nps = a:1\n  workers = b:2\n", "test.ini:3: [cluster] ps: indented line \"workers = b:2\"");
	parse_bad("[train]\nadam_epsilon = 1e-60\n", "test.ini:2: [train] adam_epsilon: 1e-60 is out of range");
	parse_bad("[train]\nmomentum = 0.999999999\n", "test.ini:2: [train] momentum: 0.999999999 is out of range");
}

/* ---- config_print round trip ------------------------------------------ */

static char *print_config(const struct config *c)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert(f);
	config_print(c, f);
	cr_assert(fclose(f) == 0);
	return buf;
}

static void expect_same(const struct config *a, const struct config *b)
{
	cr_expect_eq(a->cluster.nps, b->cluster.nps);
	cr_expect_eq(a->cluster.nworkers, b->cluster.nworkers);
	for (int i = 0; i < a->cluster.nps && i < b->cluster.nps; i++) {
		cr_expect_str_eq(a->cluster.ps[i].name, b->cluster.ps[i].name);
		cr_expect_eq(a->cluster.ps[i].port, b->cluster.ps[i].port);
	}
	for (int i = 0; i < a->cluster.nworkers && i < b->cluster.nworkers; i++) {
		cr_expect_str_eq(a->cluster.workers[i].name, b->cluster.workers[i].name);
		cr_expect_eq(a->cluster.workers[i].port, b->cluster.workers[i].port);
	}
	cr_expect_str_eq(a->cluster.key_file, b->cluster.key_file);
#define SAME(f) cr_expect(a->f == b->f, #f " differs")
	SAME(cluster.connect_timeout);
	SAME(train.mode);
	SAME(train.replicas_to_aggregate);
	SAME(train.slices);
	SAME(cluster.min_workers);
	SAME(cluster.max_workers);
	SAME(train.max_staleness);
	SAME(train.staleness_lr);
	SAME(train.steps);
	SAME(train.epochs);
	SAME(train.batch_size);
	SAME(train.optim.kind);
	SAME(train.optim.lr);
	SAME(train.optim.momentum);
	SAME(train.optim.nesterov);
	SAME(train.optim.weight_decay);
	SAME(train.optim.beta1);
	SAME(train.optim.beta2);
	SAME(train.optim.eps);
	SAME(train.optim.schedule);
	SAME(train.optim.decay_steps);
	SAME(train.optim.decay_rate);
	SAME(train.optim.warmup_steps);
	SAME(train.seed);
	SAME(train.checkpoint_every);
	SAME(train.eval_every);
	SAME(train.threads);
	SAME(gpu.all);
	SAME(gpu.ndevices);
	SAME(gpu.memory_fraction);
	SAME(gpu.allow_growth);
	SAME(gpu.soft_placement);
	SAME(gpu.log_placement);
	SAME(data.format);
	SAME(data.label_column);
	SAME(data.header);
	SAME(data.test_fraction);
	SAME(model.in_h);
	SAME(model.in_w);
	SAME(model.in_c);
	SAME(model.nlayers);
	SAME(model.loss);
	for (int i = 0; i < a->gpu.ndevices && i < b->gpu.ndevices; i++)
		SAME(gpu.devices[i]);
	for (int i = 0; i < a->model.nlayers && i < b->model.nlayers; i++) {
		SAME(model.layers[i].kind);
		SAME(model.layers[i].units);
	}
#undef SAME
	cr_expect_str_eq(a->train.checkpoint_dir, b->train.checkpoint_dir);
	cr_expect_str_eq(a->data.train_images, b->data.train_images);
	cr_expect_str_eq(a->data.train_labels, b->data.train_labels);
	cr_expect_str_eq(a->data.test_images, b->data.test_images);
	cr_expect_str_eq(a->data.test_labels, b->data.test_labels);
	cr_expect_str_eq(a->data.train_csv, b->data.train_csv);
	cr_expect_str_eq(a->data.test_csv, b->data.test_csv);
}

static void expect_round_trip(const char *text)
{
	struct config *a = parse_ok(text);
	char *printed = print_config(a);
	struct config *b = parse_ok(printed);
	char *again = print_config(b);
	expect_same(a, b);
	cr_expect_str_eq(printed, again);
	free(printed);
	free(again);
	free(a);
	free(b);
}

Test(config, print_round_trip_default)
{
	expect_round_trip("");
}

/* 40 hosts print over several lines: one line would pass inih's limit and
 * `pstrain check` output would not load back. */
Test(config, print_round_trip_long_host_list)
{
	char text[4096] = "[cluster]\nps = 10.0.0.1:2000";
	for (int i = 1; i < 40; i++)
		snprintf(text + strlen(text), sizeof(text) - strlen(text), ",\n  10.0.0.%d:%d", i + 1, 2000 + i);
	strcat(text, "\n");
	struct config *c = parse_ok(text);
	cr_assert_eq(c->cluster.nps, 40);
	free(c);
	expect_round_trip(text);
}

Test(config, print_round_trip_custom)
{
	expect_round_trip(
		"[cluster]\n"
		"ps = [::1]:1, h.example:2,\n"
		"  10.1.2.3:65535\n"
		"workers = a:1, b:1, c:1\n"
		"key_file = /etc/k\n"
		"connect_timeout = 2.5\n"
		"[train]\n"
		"mode = async\n"
		"replicas_to_aggregate = 2\n"
		"slices = 3\n"
		"max_staleness = 7\n"
		"staleness_lr = false\n"
		"steps = 12345\n"
		"batch_size = 3\n"
		"optimizer = sgd\n"
		"learning_rate = 0.0123456789\n"
		"momentum = 0.3333333333\n"
		"nesterov = true\n"
		"weight_decay = 1e-4\n"
		"adam_beta1 = 0.85\n"
		"adam_beta2 = 0.98765\n"
		"adam_epsilon = 1e-7\n"
		"lr_schedule = step\n"
		"lr_decay_steps = 77\n"
		"lr_decay_rate = 0.7\n"
		"warmup_steps = 9\n"
		"seed = 18446744073709551615\n"
		"checkpoint_dir = /tmp/ck\n"
		"checkpoint_every = 0\n"
		"eval_every = 11\n"
		"threads = 4\n"
		"[gpu]\n"
		"devices = 1, 0, 1\n"
		"memory_fraction = 0.333333333333333\n"
		"allow_growth = yes\n"
		"soft_placement = off\n"
		"log_placement = 1\n"
		"[data]\n"
		"format = csv\n"
		"train_csv = /d/train.csv\n"
		"test_csv = /d/test.csv\n"
		"label_column = 5\n"
		"header = yes\n"
		"test_fraction = 0.15\n"
		"[model]\n"
		"input = 7x3\n"
		"layer = dense 100\n"
		"layer = sigmoid\n"
		"layer = dense 50\n"
		"layer = tanh\n"
		"layer = relu\n"
		"layer = dense 3\n");
}

/* ---- config_hash ------------------------------------------------------- */

static void hash_of(const char *text, uint8_t out[CONFIG_HASH_BYTES])
{
	struct config *c = parse_ok(text);
	cr_assert_eq(config_hash(c, out), 0);
	free(c);
}

Test(config, hash_covers_training_keys_only)
{
	uint8_t base[CONFIG_HASH_BYTES], h[CONFIG_HASH_BYTES];
	hash_of("[train]\nlearning_rate = 0.05\n", base);
	/* Same meaning, other spelling: same hash. */
	hash_of("[train]\nlearning_rate = 5e-2\n; comment\n", h);
	cr_expect(memcmp(base, h, sizeof(h)) == 0, "spelling changed the hash");
	/* Node-local keys do not matter. */
	static const char *const same[] = {
		"[train]\neval_every = 7\n", "[train]\nthreads = 1\n", "[gpu]\nmemory_fraction = 0.3\n",
		"[data]\ntrain_images = /elsewhere/x.gz\n", "[cluster]\nkey_file = /k\n",
		"[cluster]\nconnect_timeout = 5\n", "[cluster]\nsend_buffer_kib = 64\n",
	};
	for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++) {
		hash_of(same[i], h);
		cr_expect(memcmp(base, h, sizeof(h)) == 0, "node-local change altered the hash: %s", same[i]);
	}
	/* Anything that changes what is trained does. */
	static const char *const differ[] = {
		"[train]\nlearning_rate = 0.01\n", "[train]\nseed = 2\n", "[train]\nbatch_size = 64\n",
		"[train]\nmode = async\n", "[model]\nlayer = dense 100\nlayer = relu\nlayer = dense 10\n",
		"[cluster]\nworkers = 127.0.0.1:2224\n", "[data]\nformat = csv\ntrain_csv = /x.csv\n",
	};
	for (size_t i = 0; i < sizeof(differ) / sizeof(differ[0]); i++) {
		hash_of(differ[i], h);
		cr_expect(memcmp(base, h, sizeof(h)) != 0, "change did not alter the hash: %s", differ[i]);
	}
}

/* Issue 40: the workers' entries are not hashed, their number is (as
 * max_workers): the pods a scaled TFJob adds get a longer worker list
 * than the others, and must agree with them; another max_workers, or
 * another number of workers without it, differs. */
Test(config, hash_counts_workers_not_their_entries)
{
	uint8_t a[CONFIG_HASH_BYTES], b[CONFIG_HASH_BYTES];
	hash_of("[cluster]\nworkers = 127.0.0.1:2224, 127.0.0.1:2225\nmax_workers = 4\nmin_workers = 1\n", a);
	hash_of("[cluster]\nworkers = h:1, h:2, h:3\nmax_workers = 4\nmin_workers = 1\n", b);
	cr_expect(memcmp(a, b, sizeof(a)) == 0, "the workers' entries changed the hash");
	hash_of("[cluster]\nworkers = h:1, h:2, h:3\nmax_workers = 5\nmin_workers = 1\n", b);
	cr_expect(memcmp(a, b, sizeof(a)) != 0, "max_workers did not change the hash");
	hash_of("[cluster]\nworkers = 127.0.0.1:2224, 127.0.0.1:2225\n", a);
	hash_of("[cluster]\nworkers = 127.0.0.1:2224, 127.0.0.1:2225, h:3\n", b);
	cr_expect(memcmp(a, b, sizeof(a)) != 0, "the number of workers did not change the hash");
}

/* [cluster] KEY = VAL: parsed into the int at field (its offset in struct
 * config) as want, printed back as written, and node-local (the config
 * hash stays the default config's). */
static void expect_cluster_int(const char *key, const char *val, size_t field, int want)
{
	uint8_t dflt[CONFIG_HASH_BYTES], h[CONFIG_HASH_BYTES];
	char text[96], line[80];
	hash_of("", dflt);
	snprintf(text, sizeof(text), "[cluster]\n%s = %s\n", key, val);
	struct config *c = parse_ok(text);
	int got = *(const int *)((const char *)c + field);
	cr_expect_eq(got, want, "%s = %s: %d, want %d", key, val, got, want);
	char *out = print_config(c);
	snprintf(line, sizeof(line), "%s = %s\n", key, val);
	cr_expect(strstr(out, line), "check does not print %s", line);
	free(out);
	free(c);
	hash_of(text, h);
	cr_expect(memcmp(h, dflt, CONFIG_HASH_BYTES) == 0, "%s = %s changed the hash", key, val);
}

/* [cluster] overlap: a boolean that also takes auto, the default; node-
 * local; any other boolean still takes only true or false. */
Test(config, overlap_takes_auto)
{
	struct config *c = parse_ok("");
	cr_expect_eq(c->cluster.overlap, CONFIG_OVERLAP_AUTO);
	free(c);
	static const char *const names[] = { "false", "true", "auto" };
	for (int i = 0; i < 3; i++)
		expect_cluster_int("overlap", names[i], offsetof(struct config, cluster.overlap), i);
	parse_bad("[cluster]\noverlap = sometimes\n", "\"sometimes\" is not a boolean (expected true, auto or false)");
	parse_bad("[cluster]\nlocal_socket = auto\n", "\"auto\" is not a boolean (expected true or false)");
}

/* [cluster] send_buffer_kib: auto by default (sized from what each
 * connection measures, net/sndbuf.h), 0 (the kernel's) and a number of KiB
 * as before; each printed as parsed; node-local; anything else refused
 * with the choices. */
Test(config, send_buffer_kib_takes_auto)
{
	struct config *c = parse_ok("");
	cr_expect_eq(c->cluster.send_buffer_kib, CONFIG_INT_AUTO);
	free(c);
	static const struct {
		const char *text;
		int v;
	} rows[] = { { "auto", CONFIG_INT_AUTO }, { "0", 0 }, { "64", 64 }, { "1048576", 1 << 20 } };
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		expect_cluster_int("send_buffer_kib", rows[i].text, offsetof(struct config, cluster.send_buffer_kib),
				   rows[i].v);
	parse_bad("[cluster]\nsend_buffer_kib = -1\n", "-1 is out of range (expected 0..1048576 or auto)");
	parse_bad("[cluster]\nsend_buffer_kib = 1048577\n",
		  "1048577 is out of range (expected 0..1048576 or auto)");
	parse_bad("[cluster]\nsend_buffer_kib = automatic\n", "\"automatic\" is not an integer or auto");
	parse_bad("[cluster]\nsend_buffer_kib = 64k\n", "\"64k\" is not an integer or auto");
	/* Other integers take no auto. */
	parse_bad("[cluster]\ncrypto_threads = auto\n", "\"auto\" is not an integer");
	parse_bad("[cluster]\ncrypto_threads = 9\n", "9 is out of range (expected 0..8)");
}

/* [cluster] cipher: auto by default, each name parsed and printed, a bad
 * one named with the choices; node-local, so it leaves the config hash
 * alone (each connection agrees on its cipher in the handshake). */
Test(config, cipher)
{
	static const char *const names[] = { "auto", "aegis-256", "aes-256-gcm", "chacha20-poly1305" };
	uint8_t dflt[CONFIG_HASH_BYTES], h[CONFIG_HASH_BYTES];
	struct config *c = parse_ok("");
	cr_expect_eq(c->cluster.cipher, CIPHER_AUTO);
	free(c);
	hash_of("", dflt);
	for (int i = 0; i < 4; i++) {
		char text[80];
		snprintf(text, sizeof(text), "[cluster]\ncipher = %s\n", names[i]);
		c = parse_ok(text);
		cr_expect_eq(c->cluster.cipher, i, "%s", names[i]);
		char *out = print_config(c);
		char line[64];
		snprintf(line, sizeof(line), "cipher = %s\n", names[i]);
		cr_expect(strstr(out, line), "check does not print %s", line);
		free(out);
		free(c);
		hash_of(text, h);
		cr_expect(memcmp(h, dflt, CONFIG_HASH_BYTES) == 0, "cipher = %s changed the hash", names[i]);
	}
	parse_bad("[cluster]\ncipher = aes-128-gcm\n",
		  "test.ini:2: [cluster] cipher: \"aes-128-gcm\" is not one of auto, aegis-256, aes-256-gcm or chacha20-poly1305");
}

/* [cluster] wire_dtype: its four values, fp32 by default, a bad value
 * named with the choices, and each value its own config hash, so a ps and
 * a worker that disagree refuse each other at the handshake. */
Test(config, wire_dtype)
{
	static const char *const names[] = { "fp32", "bf16", "bf16_grads", "bf16_params" };
	uint8_t h[4][CONFIG_HASH_BYTES], dflt[CONFIG_HASH_BYTES];
	struct config *c = parse_ok("");
	cr_expect_eq(c->cluster.wire_dtype, PRECISION_FP32);
	free(c);
	hash_of("", dflt);
	for (int i = 0; i < 4; i++) {
		char text[64];
		snprintf(text, sizeof(text), "[cluster]\nwire_dtype = %s\n", names[i]);
		c = parse_ok(text);
		cr_expect_eq(c->cluster.wire_dtype, i, "%s", names[i]);
		char *out = print_config(c);
		snprintf(text, sizeof(text), "wire_dtype = %s\n", names[i]);
		cr_expect(strstr(out, text), "check does not print %s", text);
		free(out);
		free(c);
		snprintf(text, sizeof(text), "[cluster]\nwire_dtype = %s\n", names[i]);
		hash_of(text, h[i]);
		for (int j = 0; j < i; j++)
			cr_expect(memcmp(h[i], h[j], CONFIG_HASH_BYTES) != 0, "%s and %s hash the same",
				  names[i], names[j]);
	}
	cr_expect(memcmp(h[0], dflt, CONFIG_HASH_BYTES) == 0, "fp32 is not the default's hash");
	parse_bad("[cluster]\nwire_dtype = bf8\n",
		  "test.ini:2: [cluster] wire_dtype: \"bf8\" is not one of fp32, bf16, bf16_grads or bf16_params");
	parse_bad("[cluster]\nwire_dtype = BF16\n", "\"BF16\" is not one of");
}

/* --version names the BLAS kernels the dense layers run on, and says when
 * OPENBLAS_CORETYPE chose them: on an AVX-512 CPU a preset Haswell halves
 * the GEMMs' speed (docs/BENCHMARKS.md), and only this line shows it. */
Test(config, version_names_blas_kernels)
{
	const char *args[] = { "--version", NULL };
	struct run r;

	cr_assert_eq(setenv("OPENBLAS_CORETYPE", "Haswell", 1), 0);
	run_pstrain(&r, NULL, args);
	cr_assert_eq(r.status, 0, "exit status %d; stderr: %s", r.status, r.err);
	cr_expect(strstr(r.out, "; OpenBLAS 0."), "no BLAS named: %s", r.out);
	cr_expect(strstr(r.out, ", Haswell kernels (OPENBLAS_CORETYPE=Haswell)\n"),
		  "the forced kernels are not named: %s", r.out);
	run_free(&r);

	cr_assert_eq(unsetenv("OPENBLAS_CORETYPE"), 0);
	run_pstrain(&r, NULL, args);
	cr_assert_eq(r.status, 0, "exit status %d; stderr: %s", r.status, r.err);
	cr_expect(strstr(r.out, " kernels (OpenBLAS's pick; this CPU has ") ||
		  strstr(r.out, " kernels (chosen by pstrain: OpenBLAS picked "),
		  "the kernels picked and why are not named: %s", r.out);
	cr_expect_null(strstr(r.out, "OPENBLAS_CORETYPE"), "nothing forced, yet: %s", r.out);
	run_free(&r);
}
