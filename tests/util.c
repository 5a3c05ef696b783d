/* Helpers shared by the tests that train or start processes. */
#include <criterion/criterion.h>

#include "util.h"

#include "../core/nn/rng.h"
#include "../net/key.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

/* K Gaussian blobs in D dimensions, well separated: a model that learns
 * anything gets far above chance, one that learns nothing stays at 1/K. */
void write_blobs(const char *path, int n, int K, int D, uint64_t seed)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fprintf(f, "label");
	for (int j = 0; j < D; j++)
		fprintf(f, ",x%d", j);
	fprintf(f, "\n");
	for (int i = 0; i < n; i++) {
		int k = i % K;
		fprintf(f, "%d", k);
		for (int j = 0; j < D; j++) {
			double center = 2.5 * rng_normal(seed, 100 + (uint64_t)k, (uint64_t)j);
			double v = center + rng_normal(seed, RNG_DATA, (uint64_t)i * (uint64_t)D + (uint64_t)j);
			fprintf(f, ",%.5f", v);
		}
		fprintf(f, "\n");
	}
	cr_assert_eq(fclose(f), 0);
}

void test_dir_make(char *dir, size_t len, const char *tag)
{
	const char *t = getenv("TMPDIR");
	snprintf(dir, len, "%s/pstrain-%s-XXXXXX", t ? t : "/tmp", tag);
	cr_assert_not_null(mkdtemp(dir), "mkdtemp %s", dir);
}

void test_repo_path(char *buf, size_t len, const char *rel)
{
	char here[PATH_MAX], root[PATH_MAX];
	snprintf(here, sizeof(here), "%s", __FILE__);
	char *slash = strrchr(here, '/');
	if (slash)
		snprintf(slash, sizeof(here) - (size_t)(slash - here), "/..");
	else
		snprintf(here, sizeof(here), "..");
	cr_assert_not_null(realpath(here, root), "%s: %s (run the suite from the repository root)", here,
			   strerror(errno));
	snprintf(buf, len, "%s/%s", root, rel);
}

int wait_for_text(const char *path, const char *text)
{
	struct timespec nap = { 0, 2 * 1000 * 1000 };
	for (int i = 0; i < 15000; i++) {
		if (strstr(slurp(path), text))
			return 1;
		nanosleep(&nap, NULL);
	}
	return 0;
}

int test_dir_remove(const char *dir)
{
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) == 0)
		return 0;
	fprintf(stderr, "cannot remove %s\n", dir);
	return -1;
}

/* The first port of the kernel's ephemeral range, 0 if unknown. */
static int ephemeral_low(void)
{
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	int lo = 0, hi = 0;
	if (f) {
		if (fscanf(f, "%d %d", &lo, &hi) != 2)
			lo = 0;
		fclose(f);
	}
	return lo;
}

/* How long a port handed out stays reserved for the test that got it:
 * longer than any test runs. */
#define PORT_HELD_S (15 * 60)

/* Whether port is this test's now: a file named after it, made only if
 * none is there or the one there is older than PORT_HELD_S, in a
 * directory every test process of this machine shares. Two tests running
 * at once picked the same random port about once in four CI runs (the
 * ps of one never listened); a port bound and closed again is no
 * reservation. */
static int port_reserve(int port)
{
	const char *dir = "/tmp/pstrain-test-ports";
	char path[64];
	if (mkdir(dir, 0700) != 0 && errno != EEXIST)
		return 1; /* no directory: the bind test alone, as before */
	snprintf(path, sizeof(path), "%s/%d", dir, port);
	for (int tries = 0; tries < 2; tries++) {
		int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
		if (fd >= 0) {
			close(fd);
			return 1;
		}
		struct stat st;
		if (errno != EEXIST || stat(path, &st) != 0 || time(NULL) - st.st_mtime < PORT_HELD_S)
			return 0;
		unlink(path); /* stale: its test is long gone */
	}
	return 0;
}

/* A free loopback port, below the kernel's ephemeral range where it can:
 * every outgoing connection (this test's or one running beside it) takes
 * its source port from that range, and one had taken the port of a ps
 * killed by a recovery test before it could bind it again ("bind: Address
 * already in use"). Tried by binding it, then closed, and reserved for
 * this test against the others running at the same time (port_reserve);
 * a test (one process) remembers what it got and never uses a port
 * twice. Where the range leaves no room below it, port 0: the kernel's
 * choice. */
int free_port(void)
{
	static int used[512];
	static int nused;
	static unsigned seed;
	if (!seed)
		seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
	int lo = ephemeral_low();
	for (int tries = 0;; tries++) {
		int want = lo > 11024 && tries < 1000 ? lo - 10000 + (int)(rand_r(&seed) % 10000u) : 0;
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		cr_assert_geq(fd, 0);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)want),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
			cr_assert_neq(want, 0, "cannot bind a loopback port: %s", strerror(errno));
			close(fd);
			continue;
		}
		socklen_t len = sizeof(a);
		cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
		close(fd);
		int port = ntohs(a.sin_port), seen = 0;
		for (int i = 0; i < nused; i++)
			seen |= used[i] == port;
		if (seen || (want && !port_reserve(port)))
			continue;
		cr_assert_lt(nused, 512);
		used[nused++] = port;
		return port;
	}
}

pid_t spawn_pstrain(const char *const *args, const char *outpath, const char *env)
{
	const char *envs[] = { env, NULL };
	return spawn_pstrain_env(args, outpath, envs);
}

pid_t spawn_pstrain_env(const char *const *args, const char *outpath, const char *const *envs)
{
	return spawn_pstrain_pod(args, outpath, envs, NULL);
}

/* "text" into the /proc file at path: 0 or an errno. */
static int proc_write(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY), e = 0;
	if (fd < 0)
		return errno;
	if (write(fd, text, strlen(text)) != (ssize_t)strlen(text))
		e = errno ? errno : EIO;
	close(fd);
	return e;
}

/* In a fork's child (one thread, as a user namespace needs): a UTS
 * namespace of its own, host named name; as root, or else in a user
 * namespace that maps only our own ids. 0 or an errno. */
static int child_hostname(const char *name)
{
	if (unshare(CLONE_NEWUTS) != 0) {
		char map[64];
		unsigned uid = (unsigned)getuid(), gid = (unsigned)getgid();
		int e = 0;
		if (unshare(CLONE_NEWUSER | CLONE_NEWUTS) != 0)
			return errno;
		snprintf(map, sizeof(map), "%u %u 1", uid, uid);
		e = proc_write("/proc/self/setgroups", "deny");
		if (!e)
			e = proc_write("/proc/self/uid_map", map);
		snprintf(map, sizeof(map), "%u %u 1", gid, gid);
		if (!e)
			e = proc_write("/proc/self/gid_map", map);
		if (e)
			return e;
	}
	return sethostname(name, strlen(name)) ? errno : 0;
}

pid_t spawn_pstrain_pod(const char *const *args, const char *outpath, const char *const *envs, const char *pod)
{
	const char *bin = getenv("PSTRAIN_BIN");
	cr_assert_not_null(bin, "PSTRAIN_BIN is not set (run through make unit)");
	pid_t parent = getpid(), pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		/* Dies with the test: a failed assertion ends the test's
		 * process without reaching the waits and kills that follow,
		 * and a ps left behind waits for its workers for ever (seen:
		 * 27 minutes, until killed by hand). */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		int fd = open(outpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(fd, 1);
		dup2(fd, 2);
		/* What a scheduler sets says where the ps are (cluster/launch.h):
		 * a suite run inside a pod or a Slurm job must not have its
		 * processes read the runner's. */
		static const char *const scheduler[] = {
			"TF_CONFIG", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_JOB_NODELIST",
			"SLURM_STEP_NODELIST", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
			"KUBERNETES_SERVICE_HOST",
		};
		for (size_t i = 0; i < sizeof(scheduler) / sizeof(scheduler[0]); i++)
			unsetenv(scheduler[i]);
		for (int i = 0; envs && envs[i]; i++)
			putenv((char *)envs[i]);
		int e = pod ? child_hostname(pod) : 0;
		if (e) {
			dprintf(1, "spawn_pstrain_pod: no host name of its own: %s\n", strerror(e));
			_exit(SPAWN_NO_POD);
		}
		char *argv[16];
		int n = 0;
		argv[n++] = (char *)bin;
		for (int i = 0; args[i] && n < 15; i++)
			argv[n++] = (char *)args[i];
		argv[n] = NULL;
		execv(bin, argv);
		_exit(127);
	}
	return pid;
}

void wait_children_sampling(const pid_t *pids, int n, int *st, int timeout_s, long nap_ms,
			    void (*sample)(void *ctx), void *ctx)
{
	int left = n;
	for (int i = 0; i < n; i++)
		st[i] = -2;
	struct timespec t0, now, nap = { nap_ms / 1000, nap_ms % 1000 * 1000 * 1000 };
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (left > 0) {
		if (sample)
			sample(ctx);
		for (int i = 0; i < n; i++) {
			int s;
			if (st[i] != -2 || waitpid(pids[i], &s, WNOHANG) != pids[i])
				continue;
			st[i] = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
			left--;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - t0.tv_sec > timeout_s) {
			for (int i = 0; i < n; i++)
				if (st[i] == -2) {
					kill(pids[i], SIGCONT);
					kill(pids[i], SIGKILL);
					waitpid(pids[i], NULL, 0);
					st[i] = -1;
				}
			return;
		}
		nanosleep(&nap, NULL);
	}
}

void wait_children(const pid_t *pids, int n, int *st, int timeout_s)
{
	wait_children_sampling(pids, n, st, timeout_s, 20, NULL, NULL);
}

void assert_exits_zero(const int *st, char (*out)[300], int n, const char *what)
{
	int bad = 0;
	for (int i = 0; i < n; i++)
		bad |= st[i] != 0;
	if (!bad)
		return;
	static char msg[1 << 17], log[7001];
	size_t at = (size_t)snprintf(msg, sizeof(msg), "%s%sexit statuses", what, what[0] ? ": " : "");
	for (int i = 0; i < n; i++)
		at += (size_t)snprintf(msg + at, sizeof(msg) - at, " %d", st[i]);
	for (int i = 0; i < n && at < sizeof(msg) - 1; i++) {
		FILE *f = fopen(out[i], "r");
		size_t len = f ? fread(log, 1, sizeof(log) - 1, f) : 0;
		log[len] = '\0';
		if (f)
			fclose(f);
		at += (size_t)snprintf(msg + at, sizeof(msg) - at, "\n--- process %d (%s):\n%s", i, out[i], log);
	}
	cr_assert_fail("%s", msg);
}

void read_all(const char *path, unsigned char **buf, size_t *len)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "cannot read %s: %s", path, strerror(errno));
	size_t cap = 1 << 16, n = 0, got;
	unsigned char *b = malloc(cap);
	cr_assert_not_null(b);
	while ((got = fread(b + n, 1, cap - n - 1, f)) > 0) {
		n += got;
		if (cap - n - 1 == 0) {
			cap *= 2;
			b = realloc(b, cap);
			cr_assert_not_null(b);
		}
	}
	cr_assert(!ferror(f), "reading %s: %s", path, strerror(errno));
	fclose(f);
	b[n] = '\0';
	*buf = b;
	*len = n;
}

/* The paths slurp has read, each with its buffer. A buffer that had to
 * grow is kept, not freed, so that pointers handed out before stay valid;
 * everything is reachable from here, so LeakSanitizer counts none of it. */
#define SLURP_PATHS 64
#define SLURP_RETIRED 512

static struct {
	char path[300];
	char *buf;
	size_t cap;
} slurped[SLURP_PATHS];
static int nslurped;
static char *retired[SLURP_RETIRED];
static int nretired;

char *slurp(const char *path)
{
	int i;
	for (i = 0; i < nslurped && strcmp(slurped[i].path, path); i++)
		;
	if (i == nslurped) {
		cr_assert_lt(nslurped, SLURP_PATHS, "slurp: more than %d files", SLURP_PATHS);
		snprintf(slurped[i].path, sizeof(slurped[i].path), "%s", path);
		slurped[i].cap = 1 << 12;
		slurped[i].buf = calloc(1, slurped[i].cap);
		cr_assert_not_null(slurped[i].buf);
		nslurped++;
	}
	FILE *f = fopen(path, "rb");
	size_t n = 0, got;
	if (f) {
		for (;;) {
			if (n + 1 == slurped[i].cap) {
				cr_assert_lt(nretired, SLURP_RETIRED, "slurp: too many growths");
				char *b = malloc(2 * slurped[i].cap);
				cr_assert_not_null(b);
				memcpy(b, slurped[i].buf, n);
				retired[nretired++] = slurped[i].buf;
				slurped[i].buf = b;
				slurped[i].cap *= 2;
			}
			got = fread(slurped[i].buf + n, 1, slurped[i].cap - n - 1, f);
			if (got == 0)
				break;
			n += got;
		}
		fclose(f);
	}
	slurped[i].buf[n] = '\0';
	return slurped[i].buf;
}

void write_cluster_files(const char *dir)
{
	char path[300], err[KEY_ERR_MAX];
	snprintf(path, sizeof(path), "%s/blobs.csv", dir);
	if (access(path, F_OK) != 0)
		write_blobs(path, 600, 3, 6, 3);
	snprintf(path, sizeof(path), "%s/cluster.key", dir);
	if (access(path, F_OK) != 0)
		cr_assert_eq(key_generate(path, err, sizeof(err)), 0, "%s", err);
}

void write_cluster(const char *dir, const char *cfg, int steps, int eval_every,
		   const char *train_extra, const char *cluster_extra)
{
	write_cluster_files(dir);
	FILE *f = fopen(cfg, "w");
	cr_assert_not_null(f);
	/* The ps's Unix sockets beside the config, so that a ps a test kills
	 * leaves its socket in the test's directory, not in /tmp/pstrain-UID. */
	fprintf(f, "[cluster]\nps = 127.0.0.1:%d, 127.0.0.1:%d\nworkers = 127.0.0.1:%d, 127.0.0.1:%d\n"
		   "key_file = cluster.key\n%s%s"
		   "[data]\nformat = csv\ntrain_csv = blobs.csv\nlabel_column = first\n"
		   "[train]\nsteps = %d\nbatch_size = 16\nlearning_rate = 0.05\noptimizer = momentum\n"
		   "momentum = 0.9\nthreads = 1\n",
		free_port(), free_port(), free_port(), free_port(),
		strstr(cluster_extra, "socket_dir") ? "" : "socket_dir = sockets\n", cluster_extra, steps);
	if (!strstr(train_extra, "eval_every"))
		fprintf(f, "eval_every = %d\n", eval_every);
	fprintf(f, "%s[model]\ninput = 6\nlayer = dense 16\nlayer = relu\nlayer = dense 3\n", train_extra);
	cr_assert_eq(fclose(f), 0);
}

double final_accuracy(const char *text)
{
	const char *done = strstr(text, "done: ");
	if (!done)
		done = strstr(text, "run finished: ");
	cr_assert_not_null(done, "no final line in:\n%s", text);
	const char *a = strstr(done, "accuracy ");
	cr_assert_not_null(a);
	double acc = 0;
	cr_assert_eq(sscanf(a, "accuracy %lf%%", &acc), 1);
	return acc;
}

void checkpoint_tensor_lines(const char *dir, const char *stepdir, char *out, size_t len)
{
	char log[300];
	snprintf(log, sizeof(log), "%s/check.log", dir);
	const char *args[] = { "check", "--checkpoint", stepdir, NULL };
	pid_t pid = spawn_pstrain(args, log, NULL);
	int st;
	wait_children(&pid, 1, &st, 30);
	char *text = slurp(log);
	cr_assert_eq(st, 0, "check %s: exit %d:\n%s", stepdir, st, text);
	size_t at = 0;
	int n = 0;
	for (char *p = text; *p; ) {
		char *eol = strchr(p, '\n');
		size_t l = eol ? (size_t)(eol - p) + 1 : strlen(p);
		if (strncmp(p, "tensor ", 7) == 0) {
			cr_assert_lt(at + l, len, "check output too long:\n%s", text);
			memcpy(out + at, p, l);
			at += l;
			n++;
		}
		p += l;
	}
	out[at] = '\0';
	cr_assert_gt(n, 0, "no tensor lines for %s:\n%s", stepdir, text);
}

char *test_tb_read(const char *log_dir, const char *outpath)
{
	char py[PATH_MAX], script[PATH_MAX], cmd[3 * PATH_MAX];
	test_repo_path(py, sizeof(py), "build/pyvenv/bin/python");
	test_repo_path(script, sizeof(script), "tests/tb_read.py");
	if (access(py, X_OK) != 0)
		return NULL;
	snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s' > '%s' 2>&1", py, script, log_dir, outpath);
	int st = system(cmd);
	cr_assert_eq(st, 0, "tb_read.py failed:\n%s", slurp(outpath));
	return slurp(outpath);
}

double test_tb_value(const char *text, const char *tag, long step)
{
	char want[200];
	snprintf(want, sizeof(want), "%s %ld ", tag, step);
	for (const char *at = text; (at = strstr(at, want)) != NULL; at++)
		if (at == text || at[-1] == '\n')
			return strtod(at + strlen(want), NULL);
	return NAN;
}
