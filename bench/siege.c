/* Siege: how long 2 workers take to join a ps and train N steps while
 * peers without the cluster key hammer the ps, against the same run with
 * nobody attacking (issue 13, item 7). The ps and the workers are the real
 * `pstrain` binary on 127.0.0.1 with a generated cluster.ini; the attackers
 * are threads of this process, each class one poll() loop:
 *
 *   idle    --idle N connections that connect and never send a byte; each
 *           is re-opened as soon as the ps drops it.
 *   replay  --replay N connections that send a worker's HELLO1 recorded
 *           before any ps of this bench started (the exact 144 bytes a real
 *           worker sent: see record_greeting), then wait; re-connect and
 *           re-send as soon as the ps closes them. Connection i replays
 *           worker (i % 2)'s greeting.
 *   junk    --junk N connections that send [144, --junk-bytes] random bytes
 *           and wait for the ps to close them; a closed one is re-opened,
 *           at most --junk-rate new junk connections per second in all.
 *
 * Each attacker binds its sockets to the --from addresses in turn (default
 * 127.0.0.1, the workers' own address: the hardest case for a per-address
 * cap). Everything a ps sends to an attacker is counted, per class.
 *
 * Runs alternate quiet, siege, quiet, siege... (--repeats of each). A run:
 * start the ps, wait for its listening socket (read from /proc/net/tcp, so
 * the quiet run sees no probe connection), in a siege run start the
 * attackers and give them --ramp seconds, start workers 1 and 0, and time
 * from their start until the last of them has exited: that is the run's
 * wall time. The ps then gets --grace seconds to exit; the attackers stop
 * when it has. Every wait is bounded: a run that passes --timeout, or a ps
 * that outlives its grace, is interrupted (SIGINT, then SIGKILL 5 s later)
 * and the table says so. The ps's peak resident memory is VmHWM from
 * /proc/PID/status, polled every 10 ms, and ru_maxrss from wait4 as a check.
 *
 *   build/bench/siege [--pstrain ./pstrain] [--steps 1000] [--repeats 3]
 *       [--idle 300] [--replay 40] [--junk 16] [--junk-rate 200]
 *       [--junk-bytes 1024] [--from 127.0.0.1[,127.0.0.2...]]
 *       [--hidden 128] [--batch 64] [--ramp 0.5] [--timeout 120] [--grace 10]
 *       [--mem-slack 4] [--attacker-nice 0]
 *       [--cluster 'key = value']... [--dir DIR] [--keep]
 *
 * On loopback the attackers' own CPU time (mostly the kernel's, connecting
 * and closing) competes with the ps and the workers for this machine's
 * cores, which a remote attacker's would not: the table reports it ("bench
 * CPU s"), and --attacker-nice N runs the attacker threads at nice N.
 * --mem-slack is how many MiB of the ps's peak resident memory above the
 * quiet runs' the memory target allows ("a few MB").
 * --cluster adds a line to the generated [cluster] section (e.g. a
 * handshake_timeout once the config has one). Exit status: 0 when every
 * run completed and every target was met, 1 when a target was missed or a
 * run failed, 2 when the bench could not set up. The table's columns are
 * described in docs/BENCHMARKS.md ("Siege").
 *
 * This file links nothing of pstrain's: it sees the ps only as a network
 * peer and a process, as an attacker would. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define HELLO_BYTES 144      /* a handshake message (net/handshake.h) */
#define MAX_FROM 16
#define MAX_EXTRA 16
#define MAX_RUNS 64
#define POLL_MS 10           /* the monitor's period: exits, VmHWM */
#define CONNECT_BACKOFF 0.01 /* s after a failed connect (ps not listening) */

struct opts {
	const char *pstrain, *dir;
	long steps;
	int repeats, idle, replay, junk, junk_bytes, hidden, batch, keep, nice;
	double junk_rate, ramp, timeout, grace, mem_slack_mib;
	const char *from[MAX_FROM];
	int nfrom;
	const char *extra[MAX_EXTRA];
	int nextra;
};

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

static double mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void nap(double s)
{
	struct timespec ts = { .tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9) };
	nanosleep(&ts, NULL);
}

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* ---- processes ---------------------------------------------------------- */

/* One child: the ps, a worker, or keygen. */
struct proc {
	const char *name;
	pid_t pid;
	int running, status, killed; /* killed: by us, after a deadline */
	long hwm_kb;                 /* VmHWM, polled */
	struct rusage ru;            /* from wait4 */
	double t_exit;
	char log[600];
};

/* Starts argv with stdin from /dev/null and stdout and stderr into p->log. */
static int proc_start(struct proc *p, const char *name, char *const argv[], const char *log)
{
	posix_spawn_file_actions_t fa;
	memset(p, 0, sizeof(*p));
	p->name = name;
	snprintf(p->log, sizeof(p->log), "%s", log);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	posix_spawn_file_actions_adddup2(&fa, 1, 2);
	int e = posix_spawn(&p->pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (e) {
		fprintf(stderr, "siege: cannot start %s: %s\n", argv[0], strerror(e));
		return -1;
	}
	p->running = 1;
	return 0;
}

static long vm_hwm_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

/* Polls p once: VmHWM while it runs, the exit status once it has ended. */
static void proc_poll(struct proc *p)
{
	if (!p->running)
		return;
	long kb = vm_hwm_kb(p->pid);
	if (kb > p->hwm_kb)
		p->hwm_kb = kb;
	int st;
	if (wait4(p->pid, &st, WNOHANG, &p->ru) == p->pid) {
		p->running = 0;
		p->status = st;
		p->t_exit = mono();
	}
}

/* SIGINT (a clean interrupt), then SIGKILL if it is still there after
 * STOP_SECONDS (a ps drains its connections for up to 2 s on SIGINT). */
#define STOP_SECONDS 5
static void proc_stop(struct proc *p)
{
	if (!p->running)
		return;
	p->killed = 1;
	kill(p->pid, SIGINT);
	for (double end = mono() + STOP_SECONDS; p->running && mono() < end; nap(0.01))
		proc_poll(p);
	if (p->running) {
		kill(p->pid, SIGKILL);
		int st;
		if (wait4(p->pid, &st, 0, &p->ru) == p->pid) {
			p->running = 0;
			p->status = st;
			p->t_exit = mono();
		}
	}
}

/* "0", "3", "sig9"; a trailing "K" when we interrupted it. */
static const char *proc_exit_str(const struct proc *p, char *buf, size_t len)
{
	if (p->running || p->pid == 0)
		snprintf(buf, len, "-");
	else if (WIFEXITED(p->status))
		snprintf(buf, len, "%d%s", WEXITSTATUS(p->status), p->killed ? "K" : "");
	else
		snprintf(buf, len, "sig%d%s", WTERMSIG(p->status), p->killed ? "K" : "");
	return buf;
}

static int proc_ok(const struct proc *p)
{
	return !p->running && !p->killed && WIFEXITED(p->status) && WEXITSTATUS(p->status) == 0;
}

static double proc_cpu(const struct proc *p)
{
	return (double)p->ru.ru_utime.tv_sec + (double)p->ru.ru_utime.tv_usec * 1e-6 +
	       (double)p->ru.ru_stime.tv_sec + (double)p->ru.ru_stime.tv_usec * 1e-6;
}

/* The last non-empty line of a log, for the notes under the table. */
static void log_last_line(const char *path, char *out, size_t len)
{
	char line[1024];
	out[0] = 0;
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\r\n")] = 0;
		if (line[0])
			snprintf(out, len, "%s", line);
	}
	fclose(f);
}

/* Counts lines of a log containing s ("" for every line). */
static long log_count(const char *path, const char *s)
{
	char line[1024];
	long n = 0;
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, s) != NULL;
	fclose(f);
	return n;
}

/* Whether something listens on 127.0.0.1:port (or the wildcard), from
 * /proc/net/tcp: no connection is made, so the ps sees nothing. */
static int listening(int port)
{
	char line[512];
	int found = 0;
	FILE *f = fopen("/proc/net/tcp", "r");
	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f)) {
		unsigned addr, p, st;
		if (sscanf(line, " %*d: %x:%x %*x:%*x %x", &addr, &p, &st) == 3)
			found = (int)p == port && st == 0x0A && (addr == 0 || addr == htonl(INADDR_LOOPBACK));
	}
	fclose(f);
	return found;
}

/* ---- attackers ---------------------------------------------------------- */

enum cls { C_IDLE, C_REPLAY, C_JUNK, C_COUNT };
static const char *const cls_names[C_COUNT] = { "idle", "replay", "junk" };

/* What one class did during one run. */
struct tally {
	uint64_t attempts;   /* connect() calls */
	uint64_t connected;  /* of which completed */
	uint64_t failed;     /* of which failed */
	uint64_t refused;    /* of those, ECONNREFUSED: nothing listening */
	uint64_t dropped;    /* connections the ps closed or reset */
	uint64_t sent;       /* bytes we sent */
	uint64_t recv;       /* bytes the ps sent us: the point of the count */
	uint64_t answered;   /* connections that got at least one byte */
	int last_errno;      /* of the last failed connect */
};

enum st { S_FREE, S_CONNECTING, S_SENDING, S_WAITING };

struct slot {
	int fd;
	enum st st;
	size_t off, len;  /* bytes sent of len to send */
	uint64_t got;     /* bytes received on this connection */
	double retry_at;  /* S_FREE: not before this time */
	uint8_t *buf;     /* what to send (replay: a greeting; junk: random) */
};

struct siege {
	struct sockaddr_in ps;
	struct sockaddr_in from[MAX_FROM];
	int nfrom;
	uint8_t greeting[2][HELLO_BYTES]; /* workers 0 and 1 */
	atomic_int stop;
};

struct attacker {
	enum cls cls;
	int n, junk_bytes, nice;
	double rate, tokens, last;
	uint64_t rng;
	struct slot *slots;
	uint8_t *junkbuf;    /* n * junk_bytes */
	struct siege *sg;
	struct tally t;
	pthread_t th;
};

static void slot_close(struct attacker *a, struct slot *s, double now, double backoff)
{
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
	s->st = S_FREE;
	s->retry_at = now + backoff;
	(void)a;
}

/* A new non-blocking connection for slot i; its first bytes are sent when
 * the connect completes. */
static void slot_open(struct attacker *a, int i, double now)
{
	struct slot *s = &a->slots[i];
	struct siege *sg = a->sg;
	a->t.attempts++;
	s->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s->fd < 0) {
		a->t.failed++;
		a->t.last_errno = errno;
		slot_close(a, s, now, CONNECT_BACKOFF);
		return;
	}
	int one = 1;
	/* The port is chosen at connect time, so a source address does not
	 * pin a port of its own for each socket. */
	(void)setsockopt(s->fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
	const struct sockaddr_in *src = &sg->from[(a->t.attempts + (uint64_t)i) % (uint64_t)sg->nfrom];
	s->off = s->got = 0;
	if (a->cls == C_REPLAY) {
		s->buf = sg->greeting[i % 2];
		s->len = HELLO_BYTES;
	} else if (a->cls == C_JUNK) {
		s->buf = a->junkbuf + (size_t)i * (size_t)a->junk_bytes;
		s->len = HELLO_BYTES + rng_next(&a->rng) % (uint64_t)(a->junk_bytes - HELLO_BYTES + 1);
		for (size_t k = 0; k < s->len; k += 8) {
			uint64_t r = rng_next(&a->rng);
			memcpy(s->buf + k, &r, s->len - k < 8 ? s->len - k : 8);
		}
	} else {
		s->len = 0;
	}
	if (bind(s->fd, (const struct sockaddr *)src, sizeof(*src)) < 0 ||
	    (connect(s->fd, (const struct sockaddr *)&sg->ps, sizeof(sg->ps)) < 0 && errno != EINPROGRESS)) {
		a->t.failed++;
		a->t.refused += errno == ECONNREFUSED;
		a->t.last_errno = errno;
		slot_close(a, s, now, CONNECT_BACKOFF);
		return;
	}
	s->st = S_CONNECTING;
}

/* The ps has data, a close or an error for slot s. */
static void slot_read(struct attacker *a, struct slot *s, double now)
{
	uint8_t buf[4096];
	for (;;) {
		ssize_t r = recv(s->fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (r > 0) {
			if (s->got == 0)
				a->t.answered++;
			s->got += (uint64_t)r;
			a->t.recv += (uint64_t)r;
			continue;
		}
		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		/* 0: closed; < 0: reset. Re-open at once. */
		a->t.dropped++;
		slot_close(a, s, now, 0);
		return;
	}
}

static void slot_event(struct attacker *a, struct slot *s, short rev, double now)
{
	if (s->st == S_CONNECTING) {
		int e = 0;
		socklen_t el = sizeof(e);
		if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
			e = errno;
		if (e) {
			a->t.failed++;
			a->t.refused += e == ECONNREFUSED;
			a->t.last_errno = e;
			slot_close(a, s, now, CONNECT_BACKOFF);
			return;
		}
		if (!(rev & (POLLOUT | POLLIN | POLLHUP | POLLERR)))
			return;
		a->t.connected++;
		s->st = s->len ? S_SENDING : S_WAITING;
	}
	if (s->st == S_SENDING) {
		while (s->off < s->len) {
			ssize_t w = send(s->fd, s->buf + s->off, s->len - s->off, MSG_DONTWAIT | MSG_NOSIGNAL);
			if (w > 0) {
				s->off += (size_t)w;
				a->t.sent += (uint64_t)w;
				continue;
			}
			if (w < 0 && (errno == EAGAIN || errno == EINTR))
				break;
			a->t.dropped++;
			slot_close(a, s, now, 0);
			return;
		}
		if (s->off == s->len)
			s->st = S_WAITING;
	}
	if (s->st == S_WAITING && (rev & (POLLIN | POLLHUP | POLLERR)))
		slot_read(a, s, now);
}

/* A junk connection may open when the token bucket has a token. */
static int may_open(struct attacker *a, double now)
{
	if (a->cls != C_JUNK || a->rate <= 0)
		return 1;
	a->tokens += (now - a->last) * a->rate;
	a->last = now;
	if (a->tokens > a->rate * 0.05 + 1)
		a->tokens = a->rate * 0.05 + 1; /* bursts of at most 50 ms worth */
	if (a->tokens < 1)
		return 0;
	a->tokens -= 1;
	return 1;
}

static void *attacker_main(void *arg)
{
	struct attacker *a = arg;
	struct pollfd *pfd = calloc((size_t)a->n, sizeof(*pfd));
	int *who = calloc((size_t)a->n, sizeof(*who));
	if (!pfd || !who) {
		fprintf(stderr, "siege: out of memory in the %s attacker\n", cls_names[a->cls]);
		free(pfd);
		free(who);
		return NULL;
	}
	/* Threads are tasks on Linux: this lowers only the attackers. */
	if (a->nice)
		(void)setpriority(PRIO_PROCESS, (id_t)gettid(), a->nice);
	a->last = mono();
	while (!atomic_load(&a->sg->stop)) {
		double now = mono();
		int np = 0;
		for (int i = 0; i < a->n; i++) {
			struct slot *s = &a->slots[i];
			if (s->st == S_FREE && now >= s->retry_at && may_open(a, now))
				slot_open(a, i, now);
			if (s->st == S_FREE)
				continue;
			pfd[np] = (struct pollfd){ .fd = s->fd,
						   .events = s->st == S_WAITING ? POLLIN : POLLOUT };
			who[np++] = i;
		}
		int r = poll(pfd, (nfds_t)np, 2);
		if (r <= 0)
			continue;
		now = mono();
		for (int k = 0; k < np; k++)
			if (pfd[k].revents)
				slot_event(a, &a->slots[who[k]], pfd[k].revents, now);
	}
	for (int i = 0; i < a->n; i++)
		if (a->slots[i].fd >= 0)
			close(a->slots[i].fd);
	free(pfd);
	free(who);
	return NULL;
}

static int attackers_start(struct attacker a[C_COUNT], struct siege *sg, const struct opts *o)
{
	int n[C_COUNT] = { o->idle, o->replay, o->junk };
	atomic_store(&sg->stop, 0);
	for (int c = 0; c < C_COUNT; c++) {
		a[c] = (struct attacker){ .cls = (enum cls)c, .n = n[c], .sg = sg, .rate = o->junk_rate,
					  .junk_bytes = o->junk_bytes, .nice = o->nice,
					  .rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)mono() * 1000003u ^ (uint64_t)c };
		if (n[c] == 0)
			continue;
		a[c].slots = calloc((size_t)n[c], sizeof(struct slot));
		if (c == C_JUNK)
			a[c].junkbuf = malloc((size_t)n[c] * (size_t)o->junk_bytes);
		if (!a[c].slots || (c == C_JUNK && !a[c].junkbuf))
			return -1;
		for (int i = 0; i < n[c]; i++)
			a[c].slots[i].fd = -1;
		if (pthread_create(&a[c].th, NULL, attacker_main, &a[c]) != 0) {
			a[c].n = 0;
			return -1;
		}
	}
	return 0;
}

static void attackers_stop(struct attacker a[C_COUNT], struct siege *sg)
{
	atomic_store(&sg->stop, 1);
	for (int c = 0; c < C_COUNT; c++) {
		if (a[c].n > 0 && a[c].slots)
			pthread_join(a[c].th, NULL);
		free(a[c].slots);
		free(a[c].junkbuf);
		a[c].slots = NULL;
		a[c].junkbuf = NULL;
	}
}

/* ---- set-up ------------------------------------------------------------- */

struct bench {
	const struct opts *o;
	char dir[400], cfg[500], key[500];
	int port[3]; /* ps, worker 0, worker 1 */
	struct siege sg;
};

/* Three distinct free loopback ports (bound with port 0 and read back, all
 * held until the last is chosen so none repeats). */
static int free_ports(int *port, int n)
{
	int fd[8], ok = 0;
	for (int i = 0; i < n; i++) {
		fd[i] = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		socklen_t len = sizeof(a);
		if (fd[i] < 0 || bind(fd[i], (struct sockaddr *)&a, sizeof(a)) < 0 ||
		    getsockname(fd[i], (struct sockaddr *)&a, &len) < 0) {
			for (int k = 0; k <= i; k++)
				if (fd[k] >= 0)
					close(fd[k]);
			return -1;
		}
		port[i] = ntohs(a.sin_port);
		ok++;
	}
	for (int i = 0; i < ok; i++)
		close(fd[i]);
	return 0;
}

static int write_config(struct bench *b)
{
	const struct opts *o = b->o;
	FILE *f = fopen(b->cfg, "w");
	if (!f)
		return -1;
	fprintf(f, "; written by bench/siege: 1 ps + 2 workers on 127.0.0.1\n"
		   "[cluster]\nps = 127.0.0.1:%d\nworkers = 127.0.0.1:%d, 127.0.0.1:%d\n"
		   "key_file = cluster.key\nconnect_timeout = 10\npeer_timeout = 10\n",
		b->port[0], b->port[1], b->port[2]);
	for (int i = 0; i < o->nextra; i++)
		fprintf(f, "%s\n", o->extra[i]);
	fprintf(f, "\n[train]\nmode = sync\nsteps = %ld\nbatch_size = %d\noptimizer = momentum\n"
		   "learning_rate = 0.05\nmomentum = 0.9\nseed = 1\nthreads = 1\ncheckpoint_every = 0\n"
		   "\n[data]\nformat = idx\n"
		   "train_images = /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz\n"
		   "train_labels = /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz\n"
		   "test_images = /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz\n"
		   "test_labels = /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz\n"
		   "\n[model]\ninput = 28x28x1\nlayer = dense %d\nlayer = relu\nlayer = dense 10\n",
		o->steps, o->batch, o->hidden);
	return fclose(f) == 0 ? 0 : -1;
}

/* Runs a child to its end within limit seconds; its exit status or -1. */
static int run_child(char *const argv[], const char *log, double limit)
{
	struct proc p;
	if (proc_start(&p, argv[0], argv, log))
		return -1;
	for (double end = mono() + limit; p.running && mono() < end && !interrupted; nap(0.01))
		proc_poll(&p);
	proc_stop(&p);
	return proc_ok(&p) ? 0 : -1;
}

static void worker_argv(const struct bench *b, int w, const char *ckpt, char *buf[8], char idx[8],
			char set[600])
{
	snprintf(idx, 8, "%d", w);
	snprintf(set, 600, "train.checkpoint_dir=%s", ckpt);
	buf[0] = (char *)b->o->pstrain;
	buf[1] = "worker";
	buf[2] = "--index";
	buf[3] = idx;
	buf[4] = "--config";
	buf[5] = (char *)b->cfg;
	buf[6] = "--set";
	buf[7] = set;
}

/* The greeting worker w sends, recorded as an eavesdropper would: this
 * process listens on the ps's address, a real `pstrain worker --index w`
 * connects and sends its HELLO1, the 144 bytes are kept and the worker is
 * killed before any ps exists. Whatever the handshake puts in a greeting
 * (timestamps, a keyed config hash), this is exactly what a worker sent in
 * an earlier run. */
static int record_greeting(struct bench *b, int w)
{
	char *argv[9] = { 0 }, idx[8], set[600], log[520], ckpt[520];
	snprintf(log, sizeof(log), "%s/record-worker%d.log", b->dir, w);
	snprintf(ckpt, sizeof(ckpt), "%s/record-ckpt", b->dir);
	worker_argv(b, w, ckpt, argv, idx, set);
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, cfd = -1, ret = -1;
	size_t got = 0;
	struct proc p = { 0 };
	if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(lfd, (struct sockaddr *)&b->sg.ps, sizeof(b->sg.ps)) < 0 || listen(lfd, 4) < 0) {
		fprintf(stderr, "siege: cannot listen on 127.0.0.1:%d to record a greeting: %s\n",
			b->port[0], strerror(errno));
		goto out;
	}
	if (proc_start(&p, "recorder's worker", argv, log))
		goto out;
	/* The worker loads its data before it connects: up to 60 s. */
	double end = mono() + 60;
	while (cfd < 0 && p.running && mono() < end && !interrupted) {
		struct pollfd pf = { .fd = lfd, .events = POLLIN };
		if (poll(&pf, 1, POLL_MS) == 1)
			cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		proc_poll(&p);
	}
	end = mono() + 10;
	while (cfd >= 0 && got < HELLO_BYTES && mono() < end && !interrupted) {
		struct pollfd pf = { .fd = cfd, .events = POLLIN };
		if (poll(&pf, 1, POLL_MS) != 1)
			continue;
		ssize_t r = recv(cfd, b->sg.greeting[w] + got, HELLO_BYTES - got, 0);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	if (got == HELLO_BYTES) {
		ret = 0;
	} else {
		char last[1024];
		log_last_line(log, last, sizeof(last));
		fprintf(stderr, "siege: recording worker %d's greeting failed: %s after %zu of %d bytes; "
			"the worker's last line: %s (log %s)\n",
			w, cfd < 0 ? "no connection" : "connection ended", got, HELLO_BYTES, last, log);
	}
out:
	/* The worker goes first, so the TIME_WAIT is its port's, not the ps's. */
	if (p.pid > 0) {
		kill(p.pid, SIGKILL);
		int st;
		waitpid(p.pid, &st, 0);
	}
	if (cfd >= 0)
		close(cfd);
	if (lfd >= 0)
		close(lfd);
	return ret;
}

/* RLIMIT_NOFILE: every attacker connection is a descriptor of this process. */
static int raise_nofile(const struct opts *o)
{
	struct rlimit rl;
	rlim_t need = (rlim_t)(o->idle + o->replay + o->junk + 64);
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return -1;
	if (rl.rlim_cur >= need) {
		printf("# RLIMIT_NOFILE: soft %llu (enough for %llu)\n", (unsigned long long)rl.rlim_cur,
		       (unsigned long long)need);
		return 0;
	}
	if (rl.rlim_max < need) {
		fprintf(stderr, "siege: need %llu descriptors, hard RLIMIT_NOFILE is %llu\n",
			(unsigned long long)need, (unsigned long long)rl.rlim_max);
		return -1;
	}
	rlim_t old = rl.rlim_cur;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		return -1;
	printf("# RLIMIT_NOFILE: soft raised from %llu to the hard limit %llu (need %llu)\n",
	       (unsigned long long)old, (unsigned long long)rl.rlim_max, (unsigned long long)need);
	return 0;
}

/* ---- runs --------------------------------------------------------------- */

struct row {
	int siege, timed_out, ps_killed_late;
	double wall, ps_end, ps_cpu, w_cpu, bench_cpu;
	long ps_hwm_kb, ps_maxrss_kb, ps_log_lines;
	struct proc ps, w[2];
	struct tally t[C_COUNT];
};

static double self_cpu(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static void poll_all(struct row *r)
{
	proc_poll(&r->ps);
	proc_poll(&r->w[0]);
	proc_poll(&r->w[1]);
}

static int run_one(struct bench *b, int k, int siege, struct row *r)
{
	const struct opts *o = b->o;
	char ckpt[520], log[520], set[600], idx[2][8], wset[2][600];
	char *ps_argv[] = { (char *)o->pstrain, "ps", "--index", "0", "--config", b->cfg, "--fresh",
			    "--set", set, NULL };
	struct attacker a[C_COUNT];
	memset(r, 0, sizeof(*r));
	memset(a, 0, sizeof(a));
	r->siege = siege;
	snprintf(ckpt, sizeof(ckpt), "%s/run%02d-ckpt", b->dir, k);
	snprintf(set, sizeof(set), "train.checkpoint_dir=%s", ckpt);
	snprintf(log, sizeof(log), "%s/run%02d-ps.log", b->dir, k);
	double t_start = mono(), cpu0 = self_cpu();
	if (proc_start(&r->ps, "ps", ps_argv, log))
		return -1;
	while (r->ps.running && !listening(b->port[0]) && mono() < t_start + 30 && !interrupted) {
		nap(0.005);
		proc_poll(&r->ps);
	}
	int up = r->ps.running && listening(b->port[0]);
	if (up && siege) {
		if (attackers_start(a, &b->sg, o)) {
			fprintf(stderr, "siege: cannot start the attackers\n");
			up = 0;
		}
		for (double end = mono() + o->ramp; up && mono() < end; nap(POLL_MS * 1e-3))
			poll_all(r);
	}
	double t0 = mono(), end = t0 + o->timeout;
	if (up) {
		for (int w = 1; w >= 0; w--) {
			char *wa[9] = { 0 };
			worker_argv(b, w, ckpt, wa, idx[w], wset[w]);
			snprintf(log, sizeof(log), "%s/run%02d-worker%d.log", b->dir, k, w);
			if (proc_start(&r->w[w], w ? "worker 1" : "worker 0", wa, log))
				break;
		}
	}
	/* Until both workers have ended, then the ps within its grace. */
	while ((r->w[0].running || r->w[1].running) && mono() < end && !interrupted) {
		nap(POLL_MS * 1e-3);
		poll_all(r);
	}
	double t_workers = mono();
	r->timed_out = r->w[0].running || r->w[1].running;
	proc_stop(&r->w[0]);
	proc_stop(&r->w[1]);
	double ps_end = t_workers + o->grace < end ? t_workers + o->grace : end;
	while (r->ps.running && mono() < ps_end && !interrupted) {
		nap(POLL_MS * 1e-3);
		poll_all(r);
	}
	r->ps_killed_late = r->ps.running;
	proc_stop(&r->ps);
	if (siege)
		attackers_stop(a, &b->sg);
	for (int c = 0; c < C_COUNT; c++)
		r->t[c] = a[c].t;
	r->bench_cpu = self_cpu() - cpu0;
	r->wall = (r->w[0].pid && r->w[1].pid ? t_workers : t0) - t0;
	r->ps_end = r->ps.t_exit - t0;
	r->ps_cpu = proc_cpu(&r->ps);
	r->w_cpu = proc_cpu(&r->w[0]) + proc_cpu(&r->w[1]);
	r->ps_hwm_kb = r->ps.hwm_kb;
	r->ps_maxrss_kb = r->ps.ru.ru_maxrss;
	r->ps_log_lines = log_count(r->ps.log, "");
	return up ? 0 : -1;
}

/* ---- report ------------------------------------------------------------- */

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return (a > b) - (a < b);
}

static double median(double *v, int n)
{
	if (n == 0)
		return 0;
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int row_ok(const struct row *r)
{
	return !r->timed_out && proc_ok(&r->ps) && proc_ok(&r->w[0]) && proc_ok(&r->w[1]);
}

static void print_row(int k, const struct row *r)
{
	char e[3][16], idle[64], rep[64], junk[64];
	snprintf(idle, sizeof(idle), "%llu / %llu / %llu", (unsigned long long)r->t[C_IDLE].attempts,
		 (unsigned long long)r->t[C_IDLE].connected, (unsigned long long)r->t[C_IDLE].recv);
	snprintf(rep, sizeof(rep), "%llu / %llu / %llu / %llu", (unsigned long long)r->t[C_REPLAY].attempts,
		 (unsigned long long)r->t[C_REPLAY].connected, (unsigned long long)r->t[C_REPLAY].answered,
		 (unsigned long long)r->t[C_REPLAY].recv);
	snprintf(junk, sizeof(junk), "%llu / %llu / %llu", (unsigned long long)r->t[C_JUNK].attempts,
		 (unsigned long long)r->t[C_JUNK].connected, (unsigned long long)r->t[C_JUNK].recv);
	printf("| %d | %s | %.2f%s | %.2f%s | %s %s %s | %.1f | %.1f | %.2f | %.2f | %s | %s | %s | %.2f | %ld |\n",
	       k, r->siege ? "siege" : "quiet", r->wall, r->timed_out ? " TIMEOUT" : "", r->ps_end,
	       r->ps_killed_late ? " (killed)" : "", proc_exit_str(&r->ps, e[0], 16),
	       proc_exit_str(&r->w[0], e[1], 16), proc_exit_str(&r->w[1], e[2], 16), r->ps_hwm_kb / 1024.0,
	       r->ps_maxrss_kb / 1024.0, r->ps_cpu, r->w_cpu, r->siege ? idle : "-", r->siege ? rep : "-",
	       r->siege ? junk : "-", r->bench_cpu, r->ps_log_lines);
}

/* The table, the medians and the targets; returns 1 when all are met. */
static int report(const struct opts *o, struct row *rows, int nrows)
{
	double wall[2][MAX_RUNS], hwm[2][MAX_RUNS];
	int n[2] = { 0, 0 }, all_ok = 1, ok_kind[2] = { 1, 1 };
	uint64_t junk_back = 0, idle_back = 0, replay_back = 0, replay_answered_max = 0;
	printf("\n| run | kind | wall s | ps end s | exit ps w0 w1 | ps VmHWM MiB | ps maxrss MiB | ps CPU s | workers CPU s "
	       "| idle: tried / connected / bytes back | replay: tried / connected / answered / bytes back "
	       "| junk: tried / connected / bytes back | bench CPU s | ps log lines |\n");
	printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
	for (int k = 0; k < nrows; k++) {
		struct row *r = &rows[k];
		print_row(k + 1, r);
		int s = r->siege;
		wall[s][n[s]] = r->wall;
		hwm[s][n[s]++] = r->ps_hwm_kb / 1024.0;
		if (!row_ok(r))
			all_ok = ok_kind[s] = 0;
		junk_back += r->t[C_JUNK].recv;
		idle_back += r->t[C_IDLE].recv;
		replay_back += r->t[C_REPLAY].recv;
		if (r->t[C_REPLAY].answered > replay_answered_max)
			replay_answered_max = r->t[C_REPLAY].answered;
	}
	printf("\n");
	for (int k = 0; k < nrows; k++) {
		struct row *r = &rows[k];
		struct proc *p[3] = { &r->ps, &r->w[0], &r->w[1] };
		for (int i = 0; i < 3; i++) {
			char line[1024], e[16];
			if (proc_ok(p[i]) || !p[i]->pid)
				continue;
			log_last_line(p[i]->log, line, sizeof(line));
			printf("# run %d %s exit %s%s: %s\n", k + 1, p[i]->name, proc_exit_str(p[i], e, sizeof(e)),
			       p[i]->killed ? " (interrupted by the bench after its deadline)" : "", line);
		}
	}
	/* Refused connects are mostly the attackers' own doing: they knock on
	 * while the ps is stopping (its listening socket is closed). */
	for (int k = 0; k < nrows; k++) {
		const struct tally *t = rows[k].t;
		if (!t[C_IDLE].failed && !t[C_REPLAY].failed && !t[C_JUNK].failed)
			continue;
		printf("# run %d connects that failed (of them refused: nothing listening, as while the ps stops):", k + 1);
		for (int c = 0; c < C_COUNT; c++)
			if (t[c].failed)
				printf(" %s %llu (%llu; last error: %s)", cls_names[c], (unsigned long long)t[c].failed,
				       (unsigned long long)t[c].refused, strerror(t[c].last_errno));
		printf("\n");
	}
	double mw[2], mh[2];
	for (int s = 0; s < 2; s++) {
		double c[MAX_RUNS];
		memcpy(c, wall[s], sizeof(double) * (size_t)n[s]);
		printf("%s: wall s per run:", s ? "siege" : "quiet");
		for (int i = 0; i < n[s]; i++)
			printf(" %.2f", wall[s][i]);
		mw[s] = median(c, n[s]);
		memcpy(c, hwm[s], sizeof(double) * (size_t)n[s]);
		mh[s] = median(c, n[s]);
		printf("; median %.2f s; ps VmHWM median %.1f MiB%s\n", mw[s], mh[s],
		       ok_kind[s] ? "" : " (runs failed: a failed run's time is not a training time)");
	}
	int met = 1;
	double ratio = mw[0] > 0 ? mw[1] / mw[0] : 0;
	if (ok_kind[0] && ok_kind[1])
		printf("ratio siege/quiet (medians): %.2f (target <= 1.2): %s\n", ratio,
		       ratio <= 1.2 ? "met" : "MISSED");
	else
		printf("ratio siege/quiet (medians): n/a, runs failed (%.2f over what they did)\n", ratio);
	met &= ok_kind[0] && ok_kind[1] && ratio <= 1.2;
	printf("every process exited 0: %s\n", all_ok ? "yes (target met)" : "NO (target MISSED; see the lines above)");
	met &= all_ok;
	printf("bytes the ps sent to junk connections: %llu (target 0): %s\n", (unsigned long long)junk_back,
	       junk_back == 0 ? "met" : "MISSED");
	printf("bytes the ps sent to idle connections: %llu (expected 0): %s\n", (unsigned long long)idle_back,
	       idle_back == 0 ? "met" : "MISSED");
	met &= junk_back == 0 && idle_back == 0;
	/* A fresh ps has accepted no greeting yet: the first replay of each of
	 * the 2 recorded greetings may be answered with one HELLO2. */
	printf("bytes the ps sent to replaying connections: %llu in all; at most %llu connections answered in one run "
	       "(allowed: 2, one HELLO2 per recorded greeting after a ps start): %s\n",
	       (unsigned long long)replay_back, (unsigned long long)replay_answered_max,
	       replay_answered_max <= 2 ? "met" : "MISSED");
	met &= replay_answered_max <= 2;
	/* A ps that trained nothing peaks lower: only compare runs that trained. */
	double dm = mh[1] - mh[0];
	if (ok_kind[0] && ok_kind[1])
		printf("ps VmHWM siege - quiet (medians): %+.1f MiB (target within %.0f MiB): %s\n", dm,
		       o->mem_slack_mib, dm <= o->mem_slack_mib ? "met" : "MISSED");
	else
		printf("ps VmHWM siege - quiet (medians): n/a, runs failed (%+.1f MiB over what they did)\n", dm);
	met &= ok_kind[0] && ok_kind[1] && dm <= o->mem_slack_mib;
	printf("all targets: %s\n", met ? "met" : "MISSED");
	return met;
}

/* ---- options and main --------------------------------------------------- */

static void usage(FILE *f, int status)
{
	fprintf(f,
		"usage: build/bench/siege [options]   (docs/BENCHMARKS.md, \"Siege\")\n"
		"  --pstrain PATH      the binary to run (default ./pstrain)\n"
		"  --steps N           sync steps per run (1000)\n"
		"  --repeats R         quiet and siege runs each, interleaved (3)\n"
		"  --idle N            connections that never send a byte (300)\n"
		"  --replay N          connections replaying a recorded worker HELLO1 (40)\n"
		"  --junk N            connections sending random bytes (16)\n"
		"  --junk-rate R       at most R new junk connections per second, 0 = no limit (200)\n"
		"  --junk-bytes B      each junk connection sends 144..B bytes (1024)\n"
		"  --from A[,A...]     source addresses of the attackers, in turn (127.0.0.1)\n"
		"  --attacker-nice N   run the attacker threads at nice N (0)\n"
		"  --hidden N          the MLP's hidden width, 784-N-10 (128)\n"
		"  --batch N           batch per worker (64)\n"
		"  --ramp S            seconds of attack before the workers start (0.5)\n"
		"  --timeout S         workers still running after S s are interrupted (120)\n"
		"  --grace S           a ps still running S s after the workers is interrupted (10)\n"
		"  --mem-slack MIB     the ps's VmHWM target: siege median - quiet median <= MIB (4)\n"
		"  --cluster 'K = V'   a line for the generated [cluster] section (repeatable)\n"
		"  --dir DIR           work directory (default a new one under $TMPDIR or /tmp)\n"
		"  --keep              keep the work directory even when every target is met\n"
		"exit status: 0 every target met, 1 a target missed or a run failed, 2 set-up failed\n");
	exit(status);
}

static double num(const char *name, const char *v, double lo, double hi)
{
	char *end;
	errno = 0;
	double d = strtod(v, &end);
	if (end == v || *end || errno || d < lo || d > hi) {
		fprintf(stderr, "siege: %s: \"%s\" is not a number in [%g, %g]\n", name, v, lo, hi);
		exit(2);
	}
	return d;
}

static void parse(struct opts *o, int argc, char **argv)
{
	static char from_buf[1024];
	*o = (struct opts){ .pstrain = "./pstrain", .steps = 1000, .repeats = 3, .idle = 300, .replay = 40,
			    .junk = 16, .junk_rate = 200, .junk_bytes = 1024, .hidden = 128, .batch = 64,
			    .ramp = 0.5, .timeout = 120, .grace = 10, .mem_slack_mib = 4 };
	const char *from = "127.0.0.1";
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
			usage(stdout, 0);
		if (strcmp(a, "--keep") == 0) {
			o->keep = 1;
			continue;
		}
		if (!v || strncmp(a, "--", 2) != 0)
			usage(stderr, 2);
		i++;
		if (!strcmp(a, "--pstrain")) o->pstrain = v;
		else if (!strcmp(a, "--dir")) o->dir = v;
		else if (!strcmp(a, "--from")) from = v;
		else if (!strcmp(a, "--steps")) o->steps = (long)num(a, v, 1, 1e9);
		else if (!strcmp(a, "--repeats")) o->repeats = (int)num(a, v, 1, MAX_RUNS / 2);
		else if (!strcmp(a, "--idle")) o->idle = (int)num(a, v, 0, 100000);
		else if (!strcmp(a, "--replay")) o->replay = (int)num(a, v, 0, 100000);
		else if (!strcmp(a, "--junk")) o->junk = (int)num(a, v, 0, 100000);
		else if (!strcmp(a, "--junk-rate")) o->junk_rate = num(a, v, 0, 1e7);
		else if (!strcmp(a, "--junk-bytes")) o->junk_bytes = (int)num(a, v, HELLO_BYTES, 1 << 20);
		else if (!strcmp(a, "--hidden")) o->hidden = (int)num(a, v, 1, 1 << 16);
		else if (!strcmp(a, "--batch")) o->batch = (int)num(a, v, 1, 1 << 16);
		else if (!strcmp(a, "--ramp")) o->ramp = num(a, v, 0, 600);
		else if (!strcmp(a, "--timeout")) o->timeout = num(a, v, 1, 86400);
		else if (!strcmp(a, "--grace")) o->grace = num(a, v, 0, 86400);
		else if (!strcmp(a, "--mem-slack")) o->mem_slack_mib = num(a, v, 0, 1e6);
		else if (!strcmp(a, "--attacker-nice")) o->nice = (int)num(a, v, 0, 19);
		else if (!strcmp(a, "--cluster") && o->nextra < MAX_EXTRA) o->extra[o->nextra++] = v;
		else usage(stderr, 2);
	}
	snprintf(from_buf, sizeof(from_buf), "%s", from);
	for (char *t = strtok(from_buf, ","); t; t = strtok(NULL, ","))
		if (o->nfrom < MAX_FROM)
			o->from[o->nfrom++] = t;
	if (o->nfrom == 0)
		usage(stderr, 2);
}

int main(int argc, char **argv)
{
	struct opts o;
	struct bench b;
	static struct row rows[MAX_RUNS];
	parse(&o, argc, argv);
	memset(&b, 0, sizeof(b));
	b.o = &o;
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	struct sigaction sa = { .sa_handler = on_signal };
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	char abs[400];
	if (!realpath(o.pstrain, abs) || access(abs, X_OK) != 0) {
		fprintf(stderr, "siege: no pstrain binary at %s (run make, or pass --pstrain)\n", o.pstrain);
		return 2;
	}
	o.pstrain = abs;
	for (int i = 0; i < o.nfrom; i++) {
		b.sg.from[i] = (struct sockaddr_in){ .sin_family = AF_INET };
		if (inet_pton(AF_INET, o.from[i], &b.sg.from[i].sin_addr) != 1) {
			fprintf(stderr, "siege: --from: \"%s\" is not an IPv4 address\n", o.from[i]);
			return 2;
		}
	}
	b.sg.nfrom = o.nfrom;
	if (raise_nofile(&o))
		return 2;
	if (o.dir)
		snprintf(b.dir, sizeof(b.dir), "%s", o.dir);
	else
		snprintf(b.dir, sizeof(b.dir), "%s/pstrain-siege-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (o.dir ? mkdir(b.dir, 0700) < 0 && errno != EEXIST : !mkdtemp(b.dir)) {
		fprintf(stderr, "siege: cannot make %s: %s\n", b.dir, strerror(errno));
		return 2;
	}
	snprintf(b.cfg, sizeof(b.cfg), "%s/cluster.ini", b.dir);
	snprintf(b.key, sizeof(b.key), "%s/cluster.key", b.dir);
	char keylog[520];
	snprintf(keylog, sizeof(keylog), "%s/keygen.log", b.dir);
	char *kg[] = { (char *)o.pstrain, "keygen", b.key, NULL };
	if (access(b.key, F_OK) != 0 && run_child(kg, keylog, 30)) {
		fprintf(stderr, "siege: pstrain keygen failed (log %s)\n", keylog);
		return 2;
	}
	if (free_ports(b.port, 3) || write_config(&b)) {
		fprintf(stderr, "siege: cannot pick ports or write %s\n", b.cfg);
		return 2;
	}
	b.sg.ps = (struct sockaddr_in){ .sin_family = AF_INET, .sin_port = htons((uint16_t)b.port[0]),
					.sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	printf("# dir %s; ps 127.0.0.1:%d; model 784-%d-10, batch %d per worker, %ld sync steps, threads = 1 per process\n",
	       b.dir, b.port[0], o.hidden, o.batch, o.steps);
	printf("# attack: %d idle, %d replaying, %d junk (at most %g new/s, %d..%d bytes each), from %d address%s,"
	       " attacker threads at nice %d; ramp %.2f s; timeout %g s per run, ps grace %g s\n",
	       o.idle, o.replay, o.junk, o.junk_rate, HELLO_BYTES, o.junk_bytes, o.nfrom, o.nfrom == 1 ? "" : "es",
	       o.nice, o.ramp, o.timeout, o.grace);
	for (int w = 0; w < 2; w++)
		if (record_greeting(&b, w))
			return 2;
	printf("# recorded the HELLO1 of workers 0 and 1 (%d bytes each) before any ps started\n", HELLO_BYTES);

	int nrows = 0, failed_setup = 0;
	for (int i = 0; i < 2 * o.repeats && !interrupted; i++) {
		int siege = i % 2;
		double la[1] = { 0 };
		getloadavg(la, 1);
		if (run_one(&b, i, siege, &rows[nrows]))
			failed_setup = 1;
		struct row *r = &rows[nrows++];
		char e[3][16];
		printf("# run %d %s: wall %.2f s, exits ps %s w0 %s w1 %s, ps VmHWM %.1f MiB (load before %.2f)\n", nrows,
		       siege ? "siege" : "quiet", r->wall, proc_exit_str(&r->ps, e[0], 16),
		       proc_exit_str(&r->w[0], e[1], 16), proc_exit_str(&r->w[1], e[2], 16), r->ps_hwm_kb / 1024.0,
		       la[0]);
	}
	if (interrupted)
		printf("# interrupted: the table has the runs that finished\n");
	int met = report(&o, rows, nrows);
	if (failed_setup)
		printf("# a ps did not start listening within 30 s in some run: see its log\n");
	if (met && !o.keep && !interrupted) {
		char cmd[500];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", b.dir);
		if (system(cmd) != 0)
			fprintf(stderr, "siege: cannot remove %s\n", b.dir);
	} else {
		printf("# logs kept in %s\n", b.dir);
	}
	return interrupted ? 130 : met && !failed_setup ? 0 : 1;
}
