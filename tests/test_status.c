/* `pstrain status` end to end (issue 16 item 4): 2 ps + 2 workers of the
 * pstrain binary ($PSTRAIN_BIN) on 127.0.0.1, with `pstrain status` asked
 * mid-training (table and --json), watching a whole run (--watch, never
 * counted as a worker), and against a ps that is not running or a key
 * that is not the cluster's (exit 3, named); and the attack of issue 38:
 * greetings recorded from `pstrain status` runs on their way to ps 0 and
 * replayed to ps 1, or observers that greet and never send a frame, can
 * no longer keep the operator's status out. What an observer may send is
 * tests/test_robust.c's (robust/observer_may_only_ask_status). And issue
 * 40 part 2: status started by a scheduler (TF_CONFIG, Slurm's variables,
 * a StatefulSet pod's name) asks the ps that source names, as the roles
 * there do, and says which source it used. Every run is bounded in time:
 * on timeout the processes are killed. */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include "../core/config/config.h"
#include "../core/json.h"
#include "../net/handshake.h"
#include "../net/key.h"
#include "../net/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RUN_TIMEOUT_S 60

static char dir[256];

static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
	test_dir_make(dir, sizeof(dir), "status");
}

static void teardown(void)
{
	test_dir_remove(dir);
	leak_check();
}

TestSuite(status, .init = setup, .fini = teardown, .timeout = 120);

static pid_t start_role(const char *role, const char *index, const char *cfg, char *out,
			const char *env)
{
	snprintf(out, 300, "%s/%s%s.log", dir, role, index);
	const char *args[] = { role, "--index", index, "--config", cfg, NULL };
	return spawn_pstrain(args, out, env);
}

/* Both ps and both workers of cfg, worker 0 (the chief) with env;
 * their outputs in out[0..3]. */
static void start_run(const char *cfg, pid_t pids[4], char out[4][300], const char *chief_env)
{
	pids[0] = start_role("ps", "0", cfg, out[0], NULL);
	pids[1] = start_role("ps", "1", cfg, out[1], NULL);
	pids[2] = start_role("worker", "1", cfg, out[2], NULL);
	pids[3] = start_role("worker", "0", cfg, out[3], chief_env);
}

/* `pstrain status --config cfg` with up to three more arguments; its
 * output (stdout and stderr) in out; its exit status. */
static int status_run(const char *cfg, const char *a, const char *b, const char *c, const char *tag,
		      char *out)
{
	snprintf(out, 300, "%s/status-%s.log", dir, tag);
	const char *args[] = { "status", "--config", cfg, a, b, c, NULL };
	pid_t p = spawn_pstrain(args, out, NULL);
	int st;
	wait_children(&p, 1, &st, 30);
	return st;
}

/* The last line of text that starts with '{', parsed. */
static struct json *last_json(const char *text)
{
	const char *at = NULL;
	for (const char *p = text; (p = strstr(p, "{\"time\"")) != NULL; p++)
		at = p;
	cr_assert_not_null(at, "no JSON object in:\n%s", text);
	const char *end = strchr(at, '\n');
	struct json *j = NULL;
	char err[256];
	size_t len = end ? (size_t)(end - at) : strlen(at);
	cr_assert_eq(json_parse(at, len, &j, err, sizeof(err)), 0, "%s in:\n%.*s", err, (int)len, at);
	return j;
}

static double num(const struct json *obj, const char *key)
{
	const struct json *v = json_get(obj, key);
	cr_assert(v && v->type == JSON_NUMBER, "\"%s\" is not a number", key);
	return strtod(v->text, NULL);
}

/* Mid-training, status answers for both shards: exit 0, plausible
 * versions, both workers live, a known rate; --json parses with every
 * shard. The chief sleeps 150 ms before each evaluation (every 20 steps)
 * so that the run lasts a few seconds. The run then ends as usual. */
Test(status, mid_training_table_and_json)
{
	char cfg[300], out[4][300], st_out[300];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 400, 20, "mode = sync\n", "");
	pid_t pids[4];
	start_run(cfg, pids, out, "PSTRAIN_EVAL_DELAY_MS=150");
	cr_assert(wait_for_text(out[2], "worker 1: step 40/400"), "%s", slurp(out[2]));

	int rc = status_run(cfg, NULL, NULL, NULL, "table", st_out);
	char *text = slurp(st_out);
	cr_assert_eq(rc, 0, "status exit %d:\n%s", rc, text);
	cr_assert_not_null(strstr(text, "run: in progress"), "%s", text);
	char from[400];
	snprintf(from, sizeof(from), "pstrain: ps and workers from [cluster] of %s\n", cfg);
	cr_assert_not_null(strstr(text, from), "no scheduler's variables: the file's lists, said so:\n%s", text);
	for (int k = 0; k < 2; k++) {
		char row[32];
		snprintf(row, sizeof(row), "\n%d   127.0.0.1:", k);
		const char *r = strstr(text, row);
		cr_assert_not_null(r, "no row for ps %d:\n%s", k, text);
		unsigned long long v = 0, total = 0;
		cr_assert_eq(sscanf(strchr(r + 1, ' ') + strspn(strchr(r + 1, ' '), " "), "%*s %llu/%llu", &v, &total), 2,
			     "%s", text);
		cr_assert(v >= 38 && v < 400 && total == 400, "ps %d at %llu/%llu:\n%s", k, v, total, text);
		const char *eol = strchr(r + 1, '\n');
		const char *live = strstr(r, "0-1 live");
		cr_assert(live && live < eol, "ps %d's workers are not both live:\n%s", k, text);
	}

	rc = status_run(cfg, "--json", NULL, NULL, "json", st_out);
	text = slurp(st_out);
	cr_assert_eq(rc, 0, "status --json exit %d:\n%s", rc, text);
	struct json *j = last_json(text);
	const struct json *shards = json_get(j, "shards"), *un = json_get(j, "unanswered");
	cr_assert(shards && shards->type == JSON_ARRAY && shards->n == 2, "%s", text);
	cr_assert(un && un->type == JSON_ARRAY && un->n == 0, "%s", text);
	cr_assert_eq(json_get(j, "complete")->type, JSON_FALSE, "%s", text);
	for (size_t k = 0; k < 2; k++) {
		const struct json *s = &shards->kids[k];
		cr_assert_eq(num(s, "ps"), (double)k);
		cr_assert(num(s, "version") >= 40 && num(s, "total") == 400, "%s", text);
		cr_assert_gt(num(s, "steps_per_s"), 0, "%s", text);
		cr_assert_geq(num(s, "applied"), num(s, "version") * 2 - 2, "two gradients a version:\n%s", text);
		const struct json *w = json_get(s, "workers");
		cr_assert(w && w->type == JSON_ARRAY && w->n == 2, "%s", text);
		for (size_t i = 0; i < 2; i++)
			cr_assert_str_eq(w->kids[i].text, "live", "%s", text);
	}
	json_free(j);

	wait_children(pids, 4, st, RUN_TIMEOUT_S);
	assert_exits_zero(st, out, 4, "");
	double acc = final_accuracy(slurp(out[3]));
	cr_assert_gt(acc, 90.0, "final accuracy %.2f%%:\n%s", acc, slurp(out[3]));
	for (int k = 0; k < 2; k++)
		cr_assert_not_null(strstr(slurp(out[k]), "all 2 workers done: version 400"), "%s",
				   slurp(out[k]));
}

/* A ps that is not running is named, with why, and the exit is 3; the one
 * that runs still has its row (its workers absent). With a key that is
 * not the cluster's no ps answers: exit 3 and a hint at key_file; the ps
 * logs the refusal. */
Test(status, unanswered_ps_and_wrong_key_exit_3)
{
	char cfg[300], out[300], st_out[300], path[300], bad[340], err[KEY_ERR_MAX];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 10, 10, "mode = sync\n", "");
	pid_t ps = start_role("ps", "0", cfg, out, NULL);
	cr_assert(wait_for_text(out, "listening on"), "%s", slurp(out));

	int rc = status_run(cfg, NULL, NULL, NULL, "one", st_out);
	char *text = slurp(st_out);
	cr_assert_eq(rc, 3, "status exit %d:\n%s", rc, text);
	cr_assert_not_null(strstr(text, "\n0   127.0.0.1:"), "no row for ps 0:\n%s", text);
	cr_assert_not_null(strstr(text, "0-1 absent"), "%s", text);
	cr_assert_not_null(strstr(text, "pstrain: ps 1 (127.0.0.1:"), "ps 1 not named:\n%s", text);
	cr_assert_not_null(strstr(text, "did not answer: cannot reach"), "%s", text);
	cr_assert_not_null(strstr(text, "status: 1 of 2 ps did not answer"), "%s", text);

	rc = status_run(cfg, "--json", NULL, NULL, "one-json", st_out);
	text = slurp(st_out);
	cr_assert_eq(rc, 3, "status --json exit %d:\n%s", rc, text);
	struct json *j = last_json(text);
	const struct json *un = json_get(j, "unanswered");
	cr_assert(un && un->type == JSON_ARRAY && un->n == 1, "%s", text);
	cr_assert_eq(num(&un->kids[0], "ps"), 1);
	cr_assert_not_null(strstr(json_get(&un->kids[0], "reason")->text, "cannot reach"), "%s", text);
	cr_assert_eq(json_get(j, "shards")->n, 1, "%s", text);
	json_free(j);

	snprintf(path, sizeof(path), "%s/other.key", dir);
	cr_assert_eq(key_generate(path, err, sizeof(err)), 0, "%s", err);
	snprintf(bad, sizeof(bad), "cluster.key_file=%s", path);
	rc = status_run(cfg, "--set", bad, NULL, "key", st_out);
	text = slurp(st_out);
	cr_assert_eq(rc, 3, "status with another key, exit %d:\n%s", rc, text);
	cr_assert_not_null(strstr(text, "no answer to our greeting"), "%s", text);
	cr_assert_not_null(strstr(text, "is [cluster] key_file this cluster's key?"), "%s", text);
	cr_assert_null(strstr(text, "\n0   127.0.0.1:"), "a row without the key:\n%s", text);
	cr_assert(wait_for_text(out, "handshake refused"), "%s", slurp(out));

	kill(ps, SIGTERM);
	int st;
	wait_children(&ps, 1, &st, RUN_TIMEOUT_S);
	cr_assert_eq(st, 130, "ps exit %d:\n%s", st, slurp(out));
	cr_assert_null(strstr(slurp(out), "worker 2"), "%s", slurp(out));
}

/* --watch from before the workers start to the end: the run completes as
 * usual (observers are no workers: the ps neither waits for them nor
 * counts them), and each watch ends by itself with the run, exit 0, its
 * last report saying complete: the one asking every 0.3 s from its
 * rounds, the one asking every 30 s from the last REPORT each ps sends as
 * it ends, long before its next round. */
Test(status, watch_a_whole_run)
{
	char cfg[300], out[6][300];
	int st[6];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 150, 10, "mode = sync\n", "");
	pid_t pids[6];
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	pids[0] = start_role("ps", "0", cfg, out[0], NULL);
	pids[1] = start_role("ps", "1", cfg, out[1], NULL);
	cr_assert(wait_for_text(out[0], "listening on") && wait_for_text(out[1], "listening on"));
	snprintf(out[4], 300, "%s/watch.log", dir);
	const char *args[] = { "status", "--config", cfg, "--json", "--watch", "0.3", NULL };
	pids[4] = spawn_pstrain(args, out[4], NULL);
	snprintf(out[5], 300, "%s/watch-slow.log", dir);
	const char *slow[] = { "status", "--config", cfg, "--watch=30", NULL };
	pids[5] = spawn_pstrain(slow, out[5], NULL);
	cr_assert(wait_for_text(out[4], "\"absent\", \"absent\""), "%s", slurp(out[4]));
	cr_assert(wait_for_text(out[5], "0-1 absent"), "%s", slurp(out[5]));
	pids[2] = start_role("worker", "1", cfg, out[2], NULL);
	pids[3] = start_role("worker", "0", cfg, out[3], "PSTRAIN_EVAL_DELAY_MS=50");
	wait_children(pids, 6, st, RUN_TIMEOUT_S);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	assert_exits_zero(st, out, 6, "");
	cr_assert_lt(t1.tv_sec - t0.tv_sec, 25, "the slow watch waited for its next round");
	char *watch = slurp(out[4]);
	struct json *j = last_json(watch);
	cr_assert_eq(json_get(j, "complete")->type, JSON_TRUE, "%s", watch);
	cr_assert_eq(json_get(j, "shards")->n, 2, "%s", watch);
	json_free(j);
	cr_assert_not_null(strstr(watch, "\"live\", \"live\""), "never saw the workers live:\n%s", watch);
	char *sw = slurp(out[5]);
	cr_assert_not_null(strstr(sw, "run: complete"), "%s", sw);
	cr_assert_not_null(strstr(sw, "150/150"), "%s", sw);
	cr_assert_not_null(strstr(sw, "(ended)"), "%s", sw);
	for (int k = 0; k < 2; k++) {
		char *ps = slurp(out[k]);
		cr_assert_not_null(strstr(ps, "all 2 workers done: version 150"), "%s", ps);
		cr_assert_null(strstr(ps, "observer"), "ps %d logged its observer:\n%s\nWATCH:\n%s\nSLOW:\n%s", k, ps, slurp(out[4]), slurp(out[5]));
	}
	cr_assert_gt(final_accuracy(slurp(out[3])), 90.0, "%s", slurp(out[3]));
}

/* How often text occurs in s. */
static int count_of(const char *s, const char *text)
{
	int n = 0;
	for (const char *p = s; (p = strstr(p, text)) != NULL; p += strlen(text))
		n++;
	return n;
}

/* `pstrain status --config cfg --watch 0.3` (and json, may be NULL), its
 * output in out; its exit status, or -1 if it was still watching after
 * bound_s and was killed. */
static int watch_run(const char *cfg, const char *json, const char *tag, char *out, int bound_s)
{
	snprintf(out, 300, "%s/watch-%s.log", dir, tag);
	const char *args[] = { "status", "--config", cfg, "--watch", "0.3", json, NULL };
	pid_t p = spawn_pstrain(args, out, NULL);
	int st;
	wait_children(&p, 1, &st, bound_s);
	return st;
}

/* --watch started after the run has ended used to wait until Ctrl-C.
 * With every ps gone it ends as plain status does: each ps named, one line
 * saying none answered, exit 3, after one round (a ps has 2 s to accept).
 * With the ps of the finished run started again (each serves its final
 * checkpoint until workers come), it prints that final status once, the
 * run complete, and exits 0. The 10 s bound is several times either. */
Test(status, watch_after_the_run_ended)
{
	char cfg[300], out[4][300], w_out[300];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 40, 20, "mode = sync\n", "");
	pid_t pids[4];
	start_run(cfg, pids, out, NULL);
	wait_children(pids, 4, st, RUN_TIMEOUT_S);
	assert_exits_zero(st, out, 4, "");

	int rc = watch_run(cfg, NULL, "gone", w_out, 10);
	char *text = slurp(w_out);
	cr_assert_eq(rc, 3, "watch with every ps gone: exit %d (-1: still watching after 10 s):\n%s", rc, text);
	cr_assert_eq(count_of(text, "run: "), 1, "more than one round:\n%s", text);
	cr_assert_not_null(strstr(text, "pstrain: ps 1 (127.0.0.1:"), "ps 1 not named:\n%s", text);
	cr_assert_not_null(strstr(text, "did not answer: cannot reach"), "%s", text);
	cr_assert_not_null(strstr(text, "status: none of the 2 ps answered"), "%s", text);

	pids[0] = start_role("ps", "0", cfg, out[0], NULL);
	pids[1] = start_role("ps", "1", cfg, out[1], NULL);
	for (int k = 0; k < 2; k++)
		cr_assert(wait_for_text(out[k], "run finished: ") && wait_for_text(out[k], "listening on"),
			  "%s", slurp(out[k]));
	rc = watch_run(cfg, "--json", "finished", w_out, 10);
	text = slurp(w_out);
	cr_assert_eq(rc, 0, "watch of a finished run: exit %d (-1: still watching after 10 s):\n%s", rc, text);
	cr_assert_eq(count_of(text, "{\"time\""), 1, "more than one round:\n%s", text);
	struct json *j = last_json(text);
	cr_assert_eq(json_get(j, "complete")->type, JSON_TRUE, "%s", text);
	const struct json *shards = json_get(j, "shards");
	cr_assert(shards && shards->n == 2, "%s", text);
	for (size_t k = 0; k < 2; k++) {
		cr_assert(num(&shards->kids[k], "version") == 40 && num(&shards->kids[k], "total") == 40, "%s", text);
		cr_assert_eq(num(&shards->kids[k], "checkpoint"), 40, "%s", text);
	}
	json_free(j);
	rc = status_run(cfg, NULL, NULL, NULL, "finished", w_out);
	text = slurp(w_out);
	cr_assert_eq(rc, 0, "status of a finished run: exit %d:\n%s", rc, text);
	cr_assert_not_null(strstr(text, "run: complete"), "%s", text);

	for (int k = 0; k < 2; k++)
		kill(pids[k], SIGTERM);
	wait_children(pids, 2, st, RUN_TIMEOUT_S);
	cr_assert(st[0] == 130 && st[1] == 130, "ps exits %d %d", st[0], st[1]);
}

/* --watch of a run whose every ps dies used to redial until Ctrl-C. It
 * now ends once no ps has answered for peer_timeout (2 s here: the
 * workers give up on them then too): exit 3, one line saying so, after
 * rounds that named the ps that did not answer. Workers get SIGKILL too
 * if still there; the 30 s bound is several times the 2 s plus the 2 s
 * connect timeout of each round. */
Test(status, watch_ends_when_every_ps_is_gone)
{
	char cfg[300], out[4][300], w_out[300];
	int st[4];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 1000000, 100000, "mode = sync\n", "peer_timeout = 2\n");
	pid_t pids[4];
	start_run(cfg, pids, out, NULL);
	snprintf(w_out, sizeof(w_out), "%s/watch-dies.log", dir);
	const char *args[] = { "status", "--config", cfg, "--watch", "0.3", NULL };
	pid_t w = spawn_pstrain(args, w_out, NULL);
	cr_assert(wait_for_text(w_out, "0-1 live"), "%s", slurp(w_out));
	kill(pids[0], SIGKILL);
	kill(pids[1], SIGKILL);
	int rc;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	wait_children(&w, 1, &rc, 30);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	char *text = slurp(w_out);
	cr_assert_eq(rc, 3, "watch with every ps killed: exit %d (-1: still watching after 30 s):\n%s", rc, text);
	cr_assert_geq(t1.tv_sec - t0.tv_sec, 1, "ended before peer_timeout:\n%s", text);
	cr_assert_not_null(strstr(text, "status: none of the 2 ps answered for 2 s (peer_timeout)"), "%s", text);
	cr_assert_not_null(strstr(text, "pstrain: ps 0 (127.0.0.1:"), "ps 0 not named:\n%s", text);
	kill(pids[2], SIGKILL);
	kill(pids[3], SIGKILL);
	wait_children(pids, 4, st, RUN_TIMEOUT_S);
}

/* The port of ps k in cfg (write_cluster's "ps = 127.0.0.1:P0, 127.0.0.1:P1"). */
static int ps_port(const char *cfg, int k)
{
	const char *line = strstr(slurp(cfg), "\nps = ");
	cr_assert_not_null(line);
	int p[2];
	cr_assert_eq(sscanf(line, "\nps = 127.0.0.1:%d, 127.0.0.1:%d", &p[0], &p[1]), 2);
	return p[k];
}

/* Plays ps 0 to record greetings: accepts on its port, keeps the 144
 * bytes each connection sends, and closes it unanswered (so `pstrain
 * status` greets once more, and fails on ps 0). */
struct recorder {
	int lfd;
	_Atomic int stop;
	int n;
	uint8_t hello[8][HS_HELLO_BYTES];
};

static void *recorder_main(void *arg)
{
	struct recorder *r = arg;
	while (!r->stop) {
		int fd;
		char e[256];
		if (sock_accept(r->lfd, 100, &fd, NULL, 0, e, sizeof(e)))
			continue;
		if (r->n < 8 && sock_read_full(fd, r->hello[r->n], HS_HELLO_BYTES, 2000, e, sizeof(e)) == 0)
			r->n++;
		close(fd);
	}
	return NULL;
}

static int dial(int port)
{
	int fd;
	char e[256];
	cr_assert_eq(sock_connect_retry("127.0.0.1", (uint16_t)port, 5000, &fd, e, sizeof(e)), 0, "%s", e);
	return fd;
}

/* Issue 38's attack: every greeting of two `pstrain status` runs recorded
 * on its way to ps 0 (four: each run greets twice when unanswered) and
 * replayed to ps 1 at once, each on a connection left open. ps 1 had
 * never seen them, so it used to answer all four, which then held its 4
 * observer slots for the 5 s confirmation deadline, and the operator's
 * next `pstrain status` exited 3 ("ps 1 ... did not answer"). A greeting
 * now names the ps it is for: ps 1 refuses them unanswered, and status
 * answers for both ps. */
Test(status, greetings_recorded_for_ps_0_do_not_block_ps_1)
{
	char cfg[300], out[2][300], st_out[300], e[256];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 10, 10, "mode = sync\n", "");
	struct recorder rec = { .lfd = -1 };
	cr_assert_eq(sock_listen("127.0.0.1", (uint16_t)ps_port(cfg, 0), 16, &rec.lfd, e, sizeof(e)), 0, "%s", e);
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, recorder_main, &rec), 0);
	pid_t pids[2];
	pids[1] = start_role("ps", "1", cfg, out[1], NULL);
	cr_assert(wait_for_text(out[1], "listening on"), "%s", slurp(out[1]));
	for (int i = 0; i < 2; i++) {
		char tag[16];
		snprintf(tag, sizeof(tag), "rec%d", i);
		int rc = status_run(cfg, NULL, NULL, NULL, tag, st_out);
		cr_assert_eq(rc, 3, "status with ps 0 recording, exit %d:\n%s", rc, slurp(st_out));
	}
	rec.stop = 1;
	pthread_join(th, NULL);
	close(rec.lfd);
	cr_assert_eq(rec.n, 4, "recorded %d greetings", rec.n);

	pids[0] = start_role("ps", "0", cfg, out[0], NULL);
	cr_assert(wait_for_text(out[0], "listening on"), "%s", slurp(out[0]));
	int fds[4];
	for (int i = 0; i < 4; i++) {
		fds[i] = dial(ps_port(cfg, 1));
		cr_assert_eq(sock_write_full(fds[i], rec.hello[i], HS_HELLO_BYTES, 2000, e, sizeof(e)), 0, "%s", e);
	}
	struct timespec nap = { 0, 500 * 1000000L }; /* the ps takes a greeting within 200 ms */
	nanosleep(&nap, NULL);
	int rc = status_run(cfg, NULL, NULL, NULL, "after", st_out);
	char *text = slurp(st_out);
	cr_assert_eq(rc, 0, "status after 4 replayed greetings, exit %d:\n%s", rc, text);
	cr_assert_not_null(strstr(text, "\n1   127.0.0.1:"), "no row for ps 1:\n%s", text);
	cr_assert(wait_for_text(out[1], "for ps 0, and this is ps 1"), "%s", slurp(out[1]));
	cr_assert_null(strstr(slurp(out[1]), "closed an observer"), "ps 1 answered a replay:\n%s",
		       slurp(out[1]));
	for (int i = 0; i < 4; i++)
		close(fds[i]);
	kill(pids[0], SIGTERM);
	kill(pids[1], SIGTERM);
	int st[2];
	wait_children(pids, 2, st, RUN_TIMEOUT_S);
}

/* Observers that greet a ps and never send a frame (a key holder's, or
 * greetings an on-path attacker kept from their ps and replayed) hold no
 * slot against one that does: with all 4 slots taken by such observers,
 * `pstrain status` is answered (the oldest is evicted, and logged), where
 * it used to be refused until their 5 s deadline. */
Test(status, unconfirmed_observers_give_way)
{
	char cfg[300], out[300], st_out[300], e[256], cerr[CONFIG_ERR_MAX];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 10, 10, "mode = sync\n", "");
	struct config *c = malloc(sizeof(*c));
	cr_assert_not_null(c);
	cr_assert_eq(config_load(c, cfg, NULL, 0, cerr, sizeof(cerr)), 0, "%s", cerr);
	uint8_t key[KEY_BYTES];
	cr_assert_eq(key_load(key, c->cluster.key_file, e, sizeof(e)), 0, "%s", e);
	struct hs_identity me = { .role = HS_OBSERVER, .index = 0, .to = 0, .ciphers = frame_offers() };
	cr_assert_eq(config_hash(c, me.config_hash), 0);
	free(c);

	pid_t ps = start_role("ps", "0", cfg, out, NULL);
	cr_assert(wait_for_text(out, "listening on"), "%s", slurp(out));
	int fds[4];
	for (int i = 0; i < 4; i++) {
		struct hs h;
		struct hs_result hr;
		uint8_t h1[HS_HELLO_BYTES], h2[HS_HELLO_BYTES];
		cr_assert_eq(hs_client_start(&h, h1, key, &me, e, sizeof(e)), 0, "%s", e);
		fds[i] = dial(ps_port(cfg, 0));
		cr_assert_eq(sock_write_full(fds[i], h1, sizeof(h1), 2000, e, sizeof(e)), 0, "%s", e);
		cr_assert_eq(sock_read_full(fds[i], h2, sizeof(h2), 2000, e, sizeof(e)), 0, "%s", e);
		cr_assert_eq(hs_client_finish(&h, &hr, h2, sizeof(h2), e, sizeof(e)), 0, "%s", e);
		frame_key_wipe(&hr.send);
		frame_key_wipe(&hr.recv);
	}
	/* ps 1 is not running: exit 3 for it, but ps 0 must answer */
	int rc = status_run(cfg, NULL, NULL, NULL, "evict", st_out);
	char *text = slurp(st_out);
	cr_assert_eq(rc, 3, "status exit %d:\n%s", rc, text);
	cr_assert_not_null(strstr(text, "\n0   127.0.0.1:"), "ps 0 did not answer:\n%s", text);
	cr_assert_null(strstr(text, "pstrain: ps 0 ("), "ps 0 did not answer:\n%s", text);
	cr_assert(wait_for_text(out, "evicted before any frame opened"), "%s", slurp(out));
	sodium_memzero(key, sizeof(key));
	for (int i = 0; i < 4; i++)
		close(fds[i]);
	kill(ps, SIGTERM);
	int st;
	wait_children(&ps, 1, &st, RUN_TIMEOUT_S);
}

/* `pstrain status --config cfg [--json]` with envs ("NAME=value",
 * NULL-terminated) set; its output in out; its exit status. */
static int status_env(const char *cfg, const char *const *envs, const char *json, const char *tag, char *out)
{
	snprintf(out, 300, "%s/status-%s.log", dir, tag);
	const char *args[] = { "status", "--config", cfg, json, NULL };
	pid_t p = spawn_pstrain_env(args, out, envs);
	int st;
	wait_children(&p, 1, &st, 30);
	return st;
}

/* `pstrain run --config cfg` with envs: a task whose role a scheduler's
 * variables give; its output in out (tag names it). */
static pid_t run_task(const char *cfg, const char *const *envs, const char *tag, char *out)
{
	snprintf(out, 300, "%s/%s.log", dir, tag);
	const char *args[] = { "run", "--config", cfg, NULL };
	return spawn_pstrain_env(args, out, envs);
}

/* A bad value of a source: exit 2, and the output is the one line
 * (the roles' own, tests/test_launch.c: launch/status_refuses_...). */
static void assert_refused(const char *cfg, const char *const *envs, const char *tag, const char *line)
{
	char out[300];
	int rc = status_env(cfg, envs, NULL, tag, out);
	char *text = slurp(out);
	cr_assert_eq(rc, 2, "status with %s: exit %d:\n%s", envs[0], rc, text);
	cr_assert(strstr(text, line) && strchr(text, '\n') == text + strlen(text) - 1, "not the one line \"%s\":\n%s",
		  line, text);
}

static void stop_all(pid_t *pids, int n)
{
	int st[4];
	for (int i = 0; i < n; i++)
		kill(pids[i], SIGTERM);
	wait_children(pids, n, st, RUN_TIMEOUT_S);
	for (int i = 0; i < n; i++)
		cr_assert_eq(st[i], 130, "ps %d exit %d", i, st[i]);
}

/* In a TFJob's pod: 2 ps started by `pstrain run` with the TF_CONFIG a
 * TFJob sets, on other ports than the file lists (where nothing
 * listens). Status with the chief's TF_CONFIG asks TF_CONFIG's ps (exit 0,
 * a row each, the line naming TF_CONFIG; --json still parses), where it
 * used to ask the file's and fail (as it still does without TF_CONFIG:
 * exit 3); a TF_CONFIG that is not JSON is the roles' one line, exit 2. */
Test(status, lists_from_tf_config)
{
	char cfg[300], out[2][300], st_out[300], tf[3][600], want[120];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 10, 10, "mode = sync\n", "");
	int ps[2] = { free_port(), free_port() }, chief = free_port(), w = free_port();
	const char *type[3] = { "ps", "ps", "chief" };
	for (int i = 0; i < 3; i++)
		snprintf(tf[i], sizeof(tf[i]),
			 "TF_CONFIG={\"cluster\": {\"ps\": [\"127.0.0.1:%d\", \"127.0.0.1:%d\"], \"chief\": [\"127.0.0.1:%d\"], "
			 "\"worker\": [\"127.0.0.1:%d\"]}, \"task\": {\"type\": \"%s\", \"index\": %d}}",
			 ps[0], ps[1], chief, w, type[i], i < 2 ? i : 0);
	pid_t pids[2];
	for (int k = 0; k < 2; k++) {
		const char *envs[] = { tf[k], NULL };
		char tag[16];
		snprintf(tag, sizeof(tag), "tf-ps%d", k);
		pids[k] = run_task(cfg, envs, tag, out[k]);
	}
	for (int k = 0; k < 2; k++)
		cr_assert(wait_for_text(out[k], "listening on"), "%s", slurp(out[k]));
	const char *chief_env[] = { tf[2], NULL };
	int rc = status_env(cfg, chief_env, NULL, "tf", st_out);
	char *text = slurp(st_out);
	cr_assert_eq(rc, 0, "status in the chief's pod: exit %d:\n%s", rc, text);
	cr_assert_not_null(strstr(text, "pstrain: ps and workers from TF_CONFIG (task chief 0)\n"), "%s", text);
	for (int k = 0; k < 2; k++) {
		snprintf(want, sizeof(want), "\n%d   127.0.0.1:%d ", k, ps[k]);
		cr_assert_not_null(strstr(text, want), "no row for TF_CONFIG's ps %d:\n%s", k, text);
	}
	cr_assert_not_null(strstr(text, "0-1 absent"), "the chief and the worker:\n%s", text);

	rc = status_env(cfg, chief_env, "--json", "tf-json", st_out);
	text = slurp(st_out);
	cr_assert_eq(rc, 0, "status --json: exit %d:\n%s", rc, text);
	cr_assert_not_null(strstr(text, "pstrain: ps and workers from TF_CONFIG (task chief 0)\n"), "%s", text);
	struct json *j = last_json(text);
	const struct json *shards = json_get(j, "shards");
	cr_assert(shards && shards->n == 2, "%s", text);
	snprintf(want, sizeof(want), "127.0.0.1:%d", ps[1]);
	cr_assert_str_eq(json_get(&shards->kids[1], "address")->text, want, "%s", text);
	json_free(j);

	rc = status_run(cfg, NULL, NULL, NULL, "tf-file", st_out);
	cr_assert_eq(rc, 3, "without TF_CONFIG, the file's ps (none runs): exit %d:\n%s", rc, slurp(st_out));
	const char *bad[] = { "TF_CONFIG=not json", NULL };
	assert_refused(cfg, bad, "tf-bad", "pstrain: TF_CONFIG is not valid JSON: ");
	stop_all(pids, 2);
}

/* A loopback port that nothing listens on now (bind succeeds). */
static int port_free(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int ok = port < 65535 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	close(fd);
	return ok;
}

/* In a Slurm job: ps tasks 0 and 1 of a 4-task srun step on one node
 * ("127.0.0.1"), so at the file's ps 0 port and the next, where the file
 * lists ps 1 elsewhere. Status with the batch script's variables (the
 * job's SLURM_NTASKS and node list; no step of its own) asks those (exit
 * 0, ps 1 at ps 0's port + 1, the line naming Slurm); without them the
 * file's ps 1, which nothing serves (exit 3); 2 tasks for 2 ps is the
 * roles' one line, exit 2. */
Test(status, lists_from_slurm)
{
	char cfg[300], out[2][300], st_out[300], procid[2][32], want[120];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	int p0 = 0;
	for (int tries = 0; tries < 20 && !p0; tries++) {
		write_cluster(dir, cfg, 10, 10, "mode = sync\n", "");
		if (port_free(ps_port(cfg, 0) + 1) && ps_port(cfg, 0) + 1 != ps_port(cfg, 1))
			p0 = ps_port(cfg, 0);
	}
	cr_assert_neq(p0, 0, "no free port after ps 0's in 20 configs");
	pid_t pids[2];
	for (int k = 0; k < 2; k++) {
		snprintf(procid[k], sizeof(procid[k]), "SLURM_PROCID=%d", k);
		const char *envs[] = { procid[k], "SLURM_STEP_NUM_TASKS=4", "SLURM_STEP_NODELIST=127.0.0.1",
				       "SLURM_STEP_TASKS_PER_NODE=4", NULL };
		char tag[16];
		snprintf(tag, sizeof(tag), "slurm-ps%d", k);
		pids[k] = run_task(cfg, envs, tag, out[k]);
	}
	for (int k = 0; k < 2; k++)
		cr_assert(wait_for_text(out[k], "listening on"), "%s", slurp(out[k]));
	const char *batch[] = { "SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_JOB_NODELIST=127.0.0.1",
				"SLURM_TASKS_PER_NODE=4", NULL };
	int rc = status_env(cfg, batch, NULL, "slurm", st_out);
	char *text = slurp(st_out);
	cr_assert_eq(rc, 0, "status in the batch script: exit %d:\n%s", rc, text);
	cr_assert_not_null(strstr(text, "pstrain: ps and workers from Slurm (task 0 of 4; the first 2 are ps)\n"), "%s",
			   text);
	snprintf(want, sizeof(want), "\n1   127.0.0.1:%d ", p0 + 1);
	cr_assert_not_null(strstr(text, want), "no row for Slurm's ps 1:\n%s", text);

	rc = status_run(cfg, NULL, NULL, NULL, "slurm-file", st_out);
	text = slurp(st_out);
	cr_assert_eq(rc, 3, "without Slurm's variables, the file's ps 1: exit %d:\n%s", rc, text);
	snprintf(want, sizeof(want), "pstrain: ps 1 (127.0.0.1:%d", ps_port(cfg, 1));
	cr_assert_not_null(strstr(text, want), "%s", text);
	const char *bad[] = { "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=127.0.0.1", "SLURM_TASKS_PER_NODE=2",
			      NULL };
	assert_refused(cfg, bad, "slurm-bad", "pstrain: Slurm: 2 tasks, but [cluster] ps has 2: ");
	stop_all(pids, 2);
}

/* status_env in a pod named pod (spawn_pstrain_pod); skips the test
 * where this system gives a process no host name of its own. */
static int status_in_pod(const char *cfg, const char *const *envs, const char *pod, const char *tag, char *out)
{
	snprintf(out, 300, "%s/status-%s.log", dir, tag);
	const char *args[] = { "status", "--config", cfg, NULL };
	pid_t p = spawn_pstrain_pod(args, out, envs, pod);
	int st;
	wait_children(&p, 1, &st, 30);
	if (st == SPAWN_NO_POD)
		cr_skip_test("%s", slurp(out));
	return st;
}

/* In a StatefulSet's pod: the pod name names no lists ([cluster] lists
 * the pods' stable names), so status asks the file's ps and says it read
 * them there, and in which pod; in a pod of no StatefulSet (a debug pod)
 * it is the file's lists with no pod named, exit 0, where `pstrain
 * worker` without --index there is the roles' error, exit 2. */
Test(status, lists_from_a_pod_name)
{
	char cfg[300], out[2][300], st_out[300], want[400];
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	write_cluster(dir, cfg, 10, 10, "mode = sync\n", "");
	pid_t pids[2] = { start_role("ps", "0", cfg, out[0], NULL), start_role("ps", "1", cfg, out[1], NULL) };
	for (int k = 0; k < 2; k++)
		cr_assert(wait_for_text(out[k], "listening on"), "%s", slurp(out[k]));
	const char *k8s[] = { "KUBERNETES_SERVICE_HOST=10.0.0.1", NULL };
	int rc = status_in_pod(cfg, k8s, "pstrain-worker-1", "pod", st_out);
	char *text = slurp(st_out);
	cr_assert_eq(rc, 0, "status in a StatefulSet's pod: exit %d:\n%s", rc, text);
	snprintf(want, sizeof(want), "pstrain: ps and workers from [cluster] of %s (the StatefulSet pod name pstrain-worker-1: ",
		 cfg);
	cr_assert_not_null(strstr(text, want), "%s", text);
	cr_assert_not_null(strstr(text, "\n1   127.0.0.1:"), "%s", text);

	rc = status_in_pod(cfg, k8s, "debug", "pod-debug", st_out);
	text = slurp(st_out);
	cr_assert_eq(rc, 0, "status in a debug pod: exit %d:\n%s", rc, text);
	snprintf(want, sizeof(want), "pstrain: ps and workers from [cluster] of %s\n", cfg);
	cr_assert_not_null(strstr(text, want), "%s", text);
	const char *args[] = { "worker", "--config", cfg, NULL };
	snprintf(st_out, sizeof(st_out), "%s/worker-debug.log", dir);
	pid_t p = spawn_pstrain_pod(args, st_out, k8s, "debug");
	wait_children(&p, 1, &rc, 30);
	text = slurp(st_out);
	cr_assert(rc == 2 && strstr(text, "pstrain: pod name \"debug\" is not a StatefulSet's NAME-K"),
		  "a worker in a debug pod: exit %d:\n%s", rc, text);
	stop_all(pids, 2);
}
