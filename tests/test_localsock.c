/* [cluster] local_socket against what else may be at a ps's socket path:
 * a listener there that is not the ps (another cluster's ps under the
 * same path, any program of the same user), and a path taken over by
 * something else while the ps runs. Each run is bounded in time: on
 * timeout every process is killed and the test fails. */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include "../net/handshake.h"
#include "../net/sock.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define RUN_TIMEOUT_S 60

static char dir[256];

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
	test_dir_make(dir, sizeof(dir), "localsock");
}

static void teardown(void)
{
	test_dir_remove(dir);
	leak_check();
}

TestSuite(localsock, .init = setup, .fini = teardown, .timeout = 120);

/* The path of ps k's Unix socket in sockets, for the config at cfg
 * (write_cluster's: both ps at 127.0.0.1). */
static void ps_socket_path(char *path, size_t len, const char *cfg, const char *sockets, int k)
{
	int port[2];
	char err[300];
	const char *ps = strstr(slurp(cfg), "ps = ");
	cr_assert_not_null(ps);
	cr_assert_eq(sscanf(ps, "ps = 127.0.0.1:%d, 127.0.0.1:%d", &port[0], &port[1]), 2, "%s", ps);
	cr_assert_eq(sock_unix_path(path, len, sockets, "127.0.0.1", (uint16_t)port[k], err, sizeof(err)), 0,
		     "%s", err);
}

/* Something listening at a ps's socket path that is not that ps. It
 * reads each greeting; with garbage it answers with a HELLO-sized reply
 * that fails authentication, without it closes the connection, as a ps
 * does with a greeting it cannot authenticate (another cluster's key). */
struct impostor {
	int fd;
	int garbage;
	atomic_int stop;
	atomic_int taken; /* connections accepted */
	pthread_t th;
};

static void *impostor_main(void *arg)
{
	struct impostor *im = arg;
	while (!atomic_load(&im->stop)) {
		struct pollfd p = { .fd = im->fd, .events = POLLIN };
		if (poll(&p, 1, 50) <= 0)
			continue;
		int c = accept(im->fd, NULL, NULL);
		if (c < 0)
			continue;
		atomic_fetch_add(&im->taken, 1);
		uint8_t hello[HS_HELLO_BYTES];
		struct pollfd q = { .fd = c, .events = POLLIN };
		if (poll(&q, 1, 2000) > 0 && recv(c, hello, sizeof(hello), MSG_WAITALL) > 0 && im->garbage) {
			memset(hello, 0x5a, sizeof(hello));
			(void)!send(c, hello, sizeof(hello), MSG_NOSIGNAL);
		}
		close(c);
	}
	/* What came in since the last poll counts too. */
	for (int c; (c = accept(im->fd, NULL, NULL)) >= 0;) {
		atomic_fetch_add(&im->taken, 1);
		close(c);
	}
	return NULL;
}

static void impostor_start(struct impostor *im, const char *path, int garbage)
{
	char err[300];
	*im = (struct impostor){ .garbage = garbage };
	cr_assert_eq(sock_listen_unix(path, &im->fd, NULL, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(pthread_create(&im->th, NULL, impostor_main, im), 0);
}

static void impostor_stop(struct impostor *im)
{
	atomic_store(&im->stop, 1);
	pthread_join(im->th, NULL);
	close(im->fd);
}

/* cfg and sockets in dir: write_cluster's 2 ps + 2 workers, sync, with
 * their Unix sockets in sockets (made here when mk) and more [cluster]
 * keys in keys. */
static void localsock_config(char *cfg, char *sockets, int steps, int every, const char *train,
			     const char *keys, int mk)
{
	char extra[400];
	snprintf(cfg, 300, "%s/cluster.ini", dir);
	snprintf(sockets, 300, "%s/sockets", dir);
	snprintf(extra, sizeof(extra), "local_socket = true\nsocket_dir = %s\n%s", sockets, keys);
	write_cluster(dir, cfg, steps, every, train, extra);
	if (mk)
		cr_assert_eq(mkdir(sockets, 0700), 0);
}

/* The roles in the order they start: both ps, then the workers. */
static const char *const ROLES[4][2] = { { "ps", "0" }, { "ps", "1" }, { "worker", "1" }, { "worker", "0" } };

/* Starts ROLES of cfg, each logging to out[i] in dir. */
static void localsock_start(const char *cfg, char out[4][300], pid_t pids[4])
{
	for (int i = 0; i < 4; i++) {
		snprintf(out[i], 300, "%s/%s%s.log", dir, ROLES[i][0], ROLES[i][1]);
		const char *args[] = { ROLES[i][0], "--index", ROLES[i][1], "--config", cfg, NULL };
		pids[i] = spawn_pstrain(args, out[i], NULL);
	}
}

/* The workers first: a ps waits for workers that exited until the time
 * limit, and their failure is the one to see. */
static void localsock_wait(pid_t pids[4], int st[4])
{
	wait_children(pids + 2, 2, st + 2, RUN_TIMEOUT_S);
	wait_children(pids, 2, st, st[2] == 0 && st[3] == 0 ? RUN_TIMEOUT_S : 1);
}

/* The review's case: ps 0's socket path is held by a listener that drops
 * every greeting, ps 1's by one that answers with garbage. Each ps finds
 * its path in use and listens on TCP only; each worker, after one failed
 * greeting on each socket, says why and reaches that ps over TCP, and the
 * run ends as any other (before, a worker greeted ps 0's three times and
 * exited; ps 1's alone, once). */
Test(localsock, worker_falls_back_to_tcp_after_a_failed_greeting)
{
	char cfg[300], sockets[300], path[2][300], out[4][300];
	int st[4];
	localsock_config(cfg, sockets, 30, 10, "mode = sync\n", "", 1);
	struct impostor im[2];
	for (int k = 0; k < 2; k++) {
		ps_socket_path(path[k], sizeof(path[k]), cfg, sockets, k);
		impostor_start(&im[k], path[k], k == 1);
	}
	pid_t pids[4];
	localsock_start(cfg, out, pids);
	localsock_wait(pids, st);
	for (int k = 0; k < 2; k++)
		impostor_stop(&im[k]);
	assert_exits_zero(st, out, 4, "");
	for (int k = 0; k < 2; k++)
		cr_assert_not_null(strstr(slurp(out[k]), "another process listens there"), "%s", slurp(out[k]));
	for (int i = 2; i < 4; i++) {
		char *text = slurp(out[i]);
		for (int k = 0; k < 2; k++) {
			char want[700];
			snprintf(want, sizeof(want), "ps %d: the Unix socket %s did not answer as ps %d", k, path[k], k);
			cr_assert_not_null(strstr(text, want), "no \"%s\" in:\n%s", want, text);
		}
		char tcp[100];
		snprintf(tcp, sizeof(tcp), "connected to 2 ps (%s);",
			 frame_cipher_name(frame_cipher_choose(frame_offers(), frame_offers())));
		cr_assert_not_null(strstr(text, tcp), "no \"%s\" in:\n%s", tcp, text);
	}
	/* One greeting each per worker, and the ps's probe of its path: the
	 * workers remember the socket and do not knock again. */
	for (int k = 0; k < 2; k++)
		cr_assert_eq(atomic_load(&im[k].taken), 3, "ps %d's impostor took %d connections", k,
			     atomic_load(&im[k].taken));
}

/* A reconnect after a lost link: ps 0's path is still held by the
 * stranger when ps 0 is killed and started again (it listens on TCP only,
 * as the first time), so the workers, who remember that socket file, go
 * straight to TCP and greet the stranger no more; the run finishes. */
Test(localsock, reconnect_past_the_same_stranger_goes_straight_to_tcp)
{
	char cfg[300], sockets[300], path[300], out[4][300], again[300];
	int st[4];
	localsock_config(cfg, sockets, 4000, 100, "mode = sync\ncheckpoint_every = 100\n", "peer_timeout = 10\n", 1);
	ps_socket_path(path, sizeof(path), cfg, sockets, 0);
	struct impostor im;
	impostor_start(&im, path, 0);
	pid_t pids[4];
	localsock_start(cfg, out, pids);
	int seen = wait_for_text(out[3], "step 500/4000"), ws = 0;
	kill(pids[0], SIGKILL);
	waitpid(pids[0], &ws, 0);
	cr_assert(seen && !WIFEXITED(ws), "the chief never reached step 500 before the kill:\n%s", slurp(out[3]));
	snprintf(again, sizeof(again), "%s/ps0-again.log", dir);
	const char *args[] = { "ps", "--index", "0", "--config", cfg, NULL };
	pids[0] = spawn_pstrain(args, again, NULL);
	localsock_wait(pids, st);
	impostor_stop(&im);
	snprintf(out[0], 300, "%s", again);
	assert_exits_zero(st, out, 4, "ps 0 killed and started again");
	cr_assert_not_null(strstr(slurp(out[3]), "reconnected to every ps"), "%s", slurp(out[3]));
	cr_assert_not_null(strstr(slurp(out[3]), "done: 4000 steps"), "%s", slurp(out[3]));
	/* The first ps's probe of its path and a greeting from each worker,
	 * then the restarted ps's probe, and nothing more from a worker. */
	cr_assert_eq(atomic_load(&im.taken), 4, "the stranger took %d connections", atomic_load(&im.taken));
}

/* A ps at its exit removes its socket file only if it is still the one
 * it bound: here ours was removed while it ran and a second listener (as
 * a second ps would) bound the path; that one stays, and the ps says
 * why. Before, the ps removed whatever was at the path. */
Test(localsock, ps_leaves_a_socket_that_is_not_its_own)
{
	char cfg[300], sockets[300], path[300], out[300];
	localsock_config(cfg, sockets, 10, 10, "mode = sync\n", "", 0);
	ps_socket_path(path, sizeof(path), cfg, sockets, 0);
	snprintf(out, sizeof(out), "%s/ps0.log", dir);
	const char *args[] = { "ps", "--index", "0", "--config", cfg, NULL };
	pid_t ps = spawn_pstrain(args, out, NULL);
	/* (A failed assertion ends the test's process, and the ps with it.) */
	cr_assert(wait_for_text(out, "workers on this host reach it over the Unix socket"),
		  "the ps never listened on its Unix socket:\n%s", slurp(out));
	cr_assert_eq(unlink(path), 0, "%s: %s", path, strerror(errno));
	struct impostor im;
	impostor_start(&im, path, 0);
	struct stat before, after;
	cr_assert_eq(lstat(path, &before), 0);
	kill(ps, SIGTERM);
	int st[1];
	wait_children(&ps, 1, st, RUN_TIMEOUT_S);
	char *log = slurp(out);
	cr_assert_eq(st[0], 130, "ps exit %d:\n%s", st[0], log);
	cr_assert_eq(lstat(path, &after), 0, "the ps removed the socket that took its path:\n%s", log);
	cr_assert(after.st_ino == before.st_ino && S_ISSOCK(after.st_mode));
	char want[400];
	snprintf(want, sizeof(want), "ps 0: left %s in place: it is no longer the socket this ps bound", path);
	cr_assert_not_null(strstr(log, want), "no \"%s\" in:\n%s", want, log);
	impostor_stop(&im);
}
