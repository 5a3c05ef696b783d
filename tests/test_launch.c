/* Roles from the environment (cluster/launch.c, issue 16 item 1): the JSON
 * reader under TF_CONFIG, Slurm's host lists, each source's rules and
 * conflicts over a struct of variables, and `pstrain run` with the
 * TF_CONFIG a Kubeflow TFJob sets, as three processes on loopback. */
#include <criterion/criterion.h>

#include "leak.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../core/config/config.h"
#include "../core/json.h"
#include "../cluster/launch.h"
#include "../cluster/launch_config.h"

/* key_generate (util.c's write_cluster) needs libsodium initialized. */
static void setup(void)
{
	cr_assert_geq(sodium_init(), 0);
}

TestSuite(launch, .init = setup, .fini = leak_check);

static char err[512];

Test(launch, json_reads_what_tf_config_holds)
{
	const char *t = " {\"a\": [1, -2.5e3, true, false, null], \"s\": \"x\\u00e9\\ud83d\\ude00\\n\\\"\", "
			"\"o\": {}} ";
	struct json *j;
	cr_assert_eq(json_parse(t, strlen(t), &j, err, sizeof(err)), 0, "%s", err);
	const struct json *a = json_get(j, "a"), *s = json_get(j, "s");
	cr_assert(a && a->type == JSON_ARRAY && a->n == 5);
	cr_assert_str_eq(a->kids[1].text, "-2.5e3");
	cr_assert_eq(a->kids[2].type, JSON_TRUE);
	cr_assert_eq(a->kids[4].type, JSON_NULL);
	cr_assert_str_eq(s->text, "x\xc3\xa9\xf0\x9f\x98\x80\n\"");
	cr_assert_eq(json_get(j, "o")->n, 0);
	cr_assert_null(json_get(j, "missing"));
	cr_assert_null(json_get(a, "a"), "an array has no members");
	json_free(j);
}

Test(launch, json_refuses_what_is_not_json)
{
	const char *bad[] = { "", "{", "[1,]", "{\"a\" 1}", "{\"a\":1,}", "01", "1.", "-", "\"abc",
			      "\"a\tb\"", "\"\\x\"", "\"\\ud800\"", "\"\\u0000\"", "tru", "{} {}", "{'a':1}" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct json *j = (struct json *)1;
		cr_expect_eq(json_parse(bad[i], strlen(bad[i]), &j, err, sizeof(err)), -EINVAL, "accepted <%s>",
			     bad[i]);
		cr_expect_null(j);
		cr_expect_not_null(strstr(err, "at byte"), "<%s>: %s", bad[i], err);
	}
	char deep[80];
	memset(deep, '[', 40);
	memset(deep + 40, ']', 40);
	struct json *j;
	cr_assert_eq(json_parse(deep, 80, &j, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "nested too deeply"), "%s", err);
	cr_assert_eq(json_parse(deep + 8, 64, &j, err, sizeof(err)), 0, "%s", err);
	json_free(j);
}

/* What TensorFlow's reader (Python's json) would read otherwise: a name
 * given twice (Python keeps the last, json_get the first) and bytes that
 * are not UTF-8 (Python would see other characters). Each row: the text,
 * and what the one-line error says. */
Test(launch, json_refuses_repeated_names_and_bad_utf8)
{
	const struct {
		const char *text, *want;
	} rows[] = {
		{ "{\"a\": 1, \"a\": 2}", "at byte 9: a member name given twice in one object" },
		{ "{\"task\": {\"type\": \"ps\", \"index\": 0, \"type\": \"worker\"}}", "at byte 36: a member name given twice" },
		{ "{\"b\": 1, \"a\": 2, \"c\": 3, \"b\": 4}", "at byte 25: a member name given twice" },
		{ "{\"\\u0061\": 1, \"a\": 2}", "given twice" },   /* the same name, escaped once */
		{ "\"\xff\"", "at byte 1: invalid UTF-8 in a string" },
		{ "\"ab\xc0\x80\"", "at byte 3: invalid UTF-8" },        /* overlong NUL */
		{ "\"\xc1\xbf\"", "invalid UTF-8" },                      /* overlong '\x7f' */
		{ "\"\xe0\x80\xaf\"", "invalid UTF-8" },                  /* overlong '/' */
		{ "\"\xf0\x80\x80\xaf\"", "invalid UTF-8" },              /* overlong '/' */
		{ "\"\xed\xa0\x80\"", "invalid UTF-8" },                  /* U+D800, a surrogate */
		{ "\"\xed\xbf\xbf\"", "invalid UTF-8" },                  /* U+DFFF */
		{ "\"\xf4\x90\x80\x80\"", "invalid UTF-8" },              /* past U+10FFFF */
		{ "\"\xf5\x80\x80\x80\"", "invalid UTF-8" },
		{ "\"\x80\"", "invalid UTF-8" },                          /* a stray continuation */
		{ "\"\xc3\"", "invalid UTF-8" },                          /* cut short by the quote */
		{ "\"\xe2\x82\"", "invalid UTF-8" },
		{ "\"\xf0\x9f\x98\"", "invalid UTF-8" },
		{ "\"\xc3\x28\"", "invalid UTF-8" },                      /* not a continuation */
		{ "{\"\xff\": 1}", "invalid UTF-8" },                     /* in a name too */
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct json *j = (struct json *)1;
		err[0] = 0;
		cr_expect_eq(json_parse(rows[i].text, strlen(rows[i].text), &j, err, sizeof(err)), -EINVAL,
			     "row %zu accepted", i);
		cr_expect_null(j);
		cr_expect_not_null(strstr(err, rows[i].want), "row %zu: %s", i, err);
	}
	/* Every length of well-formed UTF-8, at the edges of each range, and
	 * one name in two different objects, are fine. */
	const char *good = "{\"a\": {\"a\": \"\xc2\x80\xdf\xbf\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80\xef\xbf\xbf"
			   "\xf0\x90\x80\x80\xf4\x8f\xbf\xbf\"}, \"b\": {\"a\": 2}}";
	struct json *j;
	cr_assert_eq(json_parse(good, strlen(good), &j, err, sizeof(err)), 0, "%s", err);
	cr_assert_str_eq(json_get(json_get(j, "a"), "a")->text,
			 "\xc2\x80\xdf\xbf\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80\xef\xbf\xbf\xf0\x90\x80\x80\xf4\x8f\xbf\xbf");
	json_free(j);
	/* A megabyte of distinct names is checked in n log n, not n squared. */
	size_t cap = JSON_MAX_BYTES, n = 0;
	char *big = malloc(cap);
	n += (size_t)snprintf(big, cap, "{");
	for (int k = 0; n + 32 < cap; k++)
		n += (size_t)snprintf(big + n, cap - n, "%s\"%x\":0", k ? "," : "", k);
	big[n++] = '}';
	cr_assert_eq(json_parse(big, n, &j, err, sizeof(err)), 0, "%s", err);
	cr_assert_gt(j->n, 100000);
	json_free(j);
	free(big);
}

static void expect_hosts(const char *list, const char *want)
{
	char **names, got[512] = "";
	int n;
	cr_assert_eq(launch_hostlist(list, &names, &n, 64, err, sizeof(err)), 0, "%s: %s", list, err);
	for (int i = 0; i < n; i++)
		snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%s", i ? " " : "", names[i]);
	launch_names_free(names, n);
	cr_assert_str_eq(got, want, "%s", list);
}

Test(launch, slurm_host_lists_and_tasks_per_node)
{
	expect_hosts("n[01-03,7],gpu5", "n01 n02 n03 n7 gpu5");
	expect_hosts("node1", "node1");
	expect_hosts("a,b[9-10]x", "a b9x b10x");
	const char *bad[] = { "", "a,,b", "n[1-2][3]", "n[3-1]", "n[1-", "n[a]" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char **names;
		int n;
		cr_expect_eq(launch_hostlist(bad[i], &names, &n, 64, err, sizeof(err)), -EINVAL, "accepted <%s>",
			     bad[i]);
	}
	char **names;
	int n, counts[8];
	cr_assert_eq(launch_hostlist("n[1-9]", &names, &n, 8, err, sizeof(err)), -EINVAL, "cap");
	cr_assert_eq(launch_tasks_per_node("2(x3),1", counts, 8, &n, err, sizeof(err)), 0, "%s", err);
	cr_assert(n == 4 && counts[0] == 2 && counts[2] == 2 && counts[3] == 1);
	cr_assert_eq(launch_tasks_per_node("2(x0)", counts, 8, &n, err, sizeof(err)), -EINVAL);
	cr_assert_eq(launch_tasks_per_node("x", counts, 8, &n, err, sizeof(err)), -EINVAL);
	cr_assert_eq(launch_tasks_per_node("1(x9)", counts, 8, &n, err, sizeof(err)), -EINVAL);
}

/* A 2 ps + 2 worker config on free loopback ports, in a new dir. */
static void config_2x2(struct config *c, char *dir, size_t len)
{
	char cfg[400];
	test_dir_make(dir, len, "launch");
	snprintf(cfg, sizeof(cfg), "%s/c.ini", dir);
	write_cluster(dir, cfg, 10, 0, "", "");
	cr_assert_eq(config_load(c, cfg, NULL, 0, err, sizeof(err)), 0, "%s", err);
}

static const char *TF = "{\"cluster\": {\"ps\": [\"p0:1\", \"p1:2\"], \"chief\": [\"c:3\"], \"worker\": [\"w0:4\", \"w1:5\"]},"
			" \"task\": {\"type\": \"%s\", \"index\": %d}}";

static int tf(struct launch *l, int want, const char *index, const char *type, int ix)
{
	static struct config c;
	char text[400];
	snprintf(text, sizeof(text), TF, type, ix);
	struct launch_env env = { .tf_config = text };
	return launch_resolve(l, want, index, &env, &c, err, sizeof(err));
}

Test(launch, tf_config_roles_and_lists)
{
	struct launch l;
	cr_assert_eq(tf(&l, LAUNCH_WORKER, NULL, "worker", 1), 0, "%s", err);
	cr_assert(l.role == LAUNCH_WORKER && l.index == 2, "TF worker 1 after a chief is worker 2, got %d", l.index);
	cr_assert_str_eq(l.ps, "p0:1, p1:2");
	cr_assert_str_eq(l.workers, "c:3, w0:4, w1:5", "the chief first");
	cr_assert_not_null(strstr(l.from, "TF_CONFIG"), "%s", l.from);
	launch_free(&l);
	cr_assert_eq(tf(&l, LAUNCH_ANY, NULL, "chief", 0), 0, "%s", err);
	cr_assert(l.role == LAUNCH_WORKER && l.index == 0);
	launch_free(&l);
	cr_assert_eq(tf(&l, LAUNCH_ANY, "1", "ps", 1), 0, "an agreeing --index: %s", err);
	cr_assert(l.role == LAUNCH_PS && l.index == 1);
	launch_free(&l);
	/* conflicts */
	cr_assert_eq(tf(&l, LAUNCH_PS, NULL, "worker", 0), -EINVAL);
	cr_assert_not_null(strstr(err, "pstrain ps, but TF_CONFIG"), "%s", err);
	cr_assert_eq(tf(&l, LAUNCH_WORKER, "0", "worker", 0), -EINVAL);
	cr_assert_not_null(strstr(err, "--index 0, but TF_CONFIG"), "%s", err);
	cr_assert_eq(tf(&l, LAUNCH_ANY, NULL, "evaluator", 0), -EINVAL);
	cr_assert_eq(tf(&l, LAUNCH_ANY, NULL, "chief", 1), -EINVAL);
	cr_assert_null(l.ps, "nothing left allocated on failure");
	struct config c;
	memset(&c, 0, sizeof(c));
	const char *bad[] = { "{}", "{\"cluster\": {\"ps\": [\"a:1\"]}, \"task\": {\"type\": \"ps\", \"index\": 0}}",
			      "{\"cluster\": {\"ps\": \"a:1\", \"worker\": [\"b:1\"]}, \"task\": {\"type\": \"ps\", \"index\": 0}}",
			      "{\"cluster\": {\"ps\": [\"a:1,b:2\"], \"worker\": [\"b:1\"]}, \"task\": {\"type\": \"ps\", \"index\": 0}}",
			      "{\"cluster\": {\"ps\": [\"a:1\"], \"worker\": [\"b:1\"]}, \"task\": {\"type\": \"ps\", \"index\": -1}}",
			      "{\"cluster\": {\"ps\": [\"a:1\"], \"worker\": [\"b:1\"]}, \"task\": {\"type\": \"ps\", \"index\": 0.5}}",
			      "not json" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct launch_env env = { .tf_config = bad[i] };
		cr_expect_eq(launch_resolve(&l, LAUNCH_ANY, NULL, &env, &c, err, sizeof(err)), -EINVAL, "accepted %s",
			     bad[i]);
		cr_expect_not_null(strstr(err, "TF_CONFIG"), "%s", err);
	}
}

/* 1 if s is one line of printable ASCII. */
static int printable(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
			return 0;
	return 1;
}

/* TF_CONFIG's host strings hold only what a host:port may (its own text
 * goes into [cluster]'s lists, whose messages quote it), and no error
 * from the environment holds a byte that is not printable ASCII: rows of
 * escape sequences in every variable launch_resolve reads. */
Test(launch, environment_text_is_never_printed_raw)
{
	static struct config c;
	c.cluster.nps = 1;
	c.cluster.ps[0].port = 2222;
	struct launch l;
	const char *TFH = "{\"cluster\": {\"ps\": [\"%s\"], \"worker\": [\"w:2\"]}, \"task\": {\"type\": \"ps\", \"index\": 0}}";
	const struct {
		const char *host, *want;
	} hosts[] = {
		{ "\\u001b[31mevil:1", "TF_CONFIG: cluster.ps[0] \"?[31mevil:1\" is not a \"host:port\": byte 0 is 0x1b" },
		{ "p:1\\u001b]0;title\\u0007", "byte 3 is 0x1b" },
		{ "p:1 ", "byte 3 is 0x20" },
		{ "p:1,q:2", "byte 3 is 0x2c" },
		{ "h\xc3\xa9:1", "\"h??:1\" is not a \"host:port\": byte 1 is 0xc3" },
		{ "p:1\\n", "byte 3 is 0x0a" },
		{ "", "cluster.ps[0] is not a \"host:port\"" },
	};
	for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++) {
		char text[400];
		snprintf(text, sizeof(text), TFH, hosts[i].host);
		struct launch_env env = { .tf_config = text };
		err[0] = 0;
		cr_expect_eq(launch_resolve(&l, LAUNCH_ANY, NULL, &env, &c, err, sizeof(err)), -EINVAL,
			     "host row %zu accepted", i);
		cr_expect(printable(err) && strstr(err, hosts[i].want), "host row %zu: %s", i, err);
	}
	const char *fine[] = { "[::1]:2222", "Node-1.example.org:80", "10.0.0.1:65535" };
	for (size_t i = 0; i < sizeof(fine) / sizeof(fine[0]); i++) {
		char text[400];
		snprintf(text, sizeof(text), TFH, fine[i]);
		struct launch_env env = { .tf_config = text };
		cr_assert_eq(launch_resolve(&l, LAUNCH_ANY, NULL, &env, &c, err, sizeof(err)), 0, "%s: %s", fine[i], err);
		cr_assert_str_eq(l.ps, fine[i]);
		launch_free(&l);
	}
	/* Every other variable, and the flag, with an escape sequence. */
	const char *E = "\x1b[2J\x1b]0;owned\x07";
	char tf_type[200];
	snprintf(tf_type, sizeof(tf_type), "{\"cluster\": {\"ps\": [\"p:1\"], \"worker\": [\"w:2\"]}, \"task\": {\"type\": \"%s\", \"index\": 0}}",
		 "\\u001b[2Jx");
	const struct launch_env envs[] = {
		{ .tf_config = tf_type },
		{ .slurm_procid = E, .slurm_ntasks = "4" },
		{ .slurm_procid = "1", .slurm_ntasks = E },
		{ .slurm_procid = "1", .slurm_ntasks = "4", .slurm_nodelist = E, .slurm_tasks_per_node = "4" },
		{ .slurm_procid = "1", .slurm_ntasks = "4", .slurm_nodelist = "n\x1b[1-2]", .slurm_tasks_per_node = "2,2" },
		{ .slurm_procid = "1", .slurm_ntasks = "4", .slurm_nodelist = "n1", .slurm_tasks_per_node = E },
		{ .k8s = "10.0.0.1", .hostname = E },
		{ .k8s = "10.0.0.1", .hostname = "x\x1b[2J-ps-" },
	};
	for (size_t i = 0; i < sizeof(envs) / sizeof(envs[0]); i++) {
		err[0] = 0;
		cr_expect_eq(launch_resolve(&l, LAUNCH_ANY, NULL, &envs[i], &c, err, sizeof(err)), -EINVAL,
			     "env row %zu accepted", i);
		cr_expect(err[0] && printable(err), "env row %zu: %s", i, err);
	}
	struct launch_env none = { 0 };
	cr_assert_eq(launch_resolve(&l, LAUNCH_PS, E, &none, &c, err, sizeof(err)), -EINVAL);
	cr_assert(printable(err), "--index: %s", err);
	/* A Slurm node name only of host characters gets through as before. */
	char **names;
	int n;
	cr_assert_eq(launch_hostlist("gpu-[01-02].rack1", &names, &n, 8, err, sizeof(err)), 0, "%s", err);
	cr_assert_str_eq(names[1], "gpu-02.rack1");
	launch_names_free(names, n);
}

Test(launch, slurm_tasks_hosts_and_ports)
{
	struct config c;
	char dir[300], ps[200], workers[200];
	config_2x2(&c, dir, sizeof(dir));
	unsigned p = c.cluster.ps[0].port;
	struct launch_env env = { .slurm_procid = "3", .slurm_ntasks = "5", .slurm_nodelist = "n[1-2]",
				  .slurm_tasks_per_node = "3,2" };
	struct launch l;
	cr_assert_eq(launch_resolve(&l, LAUNCH_ANY, NULL, &env, &c, err, sizeof(err)), 0, "%s", err);
	cr_assert(l.role == LAUNCH_WORKER && l.index == 1, "task 3 with 2 ps is worker 1: %s %d",
		  launch_role_name(l.role), l.index);
	snprintf(ps, sizeof(ps), "n1:%u, n1:%u", p, p + 1);
	snprintf(workers, sizeof(workers), "n1:%u, n2:%u, n2:%u", p + 2, p + 3, p + 4);
	cr_assert_str_eq(l.ps, ps);
	cr_assert_str_eq(l.workers, workers);
	launch_free(&l);
	env.slurm_procid = "1";
	cr_assert_eq(launch_resolve(&l, LAUNCH_PS, NULL, &env, &c, err, sizeof(err)), 0, "%s", err);
	cr_assert(l.role == LAUNCH_PS && l.index == 1);
	launch_free(&l);
	cr_assert_eq(launch_resolve(&l, LAUNCH_WORKER, NULL, &env, &c, err, sizeof(err)), -EINVAL);
	/* --index wins: Slurm is not read at all */
	cr_assert_eq(launch_resolve(&l, LAUNCH_WORKER, "0", &env, &c, err, sizeof(err)), 0, "%s", err);
	cr_assert(l.index == 0 && !l.from[0] && !l.ps);
	env.slurm_ntasks = "2";
	env.slurm_procid = "0";
	cr_assert_eq(launch_resolve(&l, LAUNCH_ANY, NULL, &env, &c, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "at least one more must be a worker"), "%s", err);
	env.slurm_ntasks = "5";
	env.slurm_tasks_per_node = "2,2";
	cr_assert_eq(launch_resolve(&l, LAUNCH_ANY, NULL, &env, &c, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "add up to 4"), "%s", err);
	env.slurm_tasks_per_node = NULL;
	cr_assert_eq(launch_resolve(&l, LAUNCH_ANY, NULL, &env, &c, err, sizeof(err)), -EINVAL);
	test_dir_remove(dir);
}

Test(launch, statefulset_pod_names)
{
	struct config c;
	memset(&c, 0, sizeof(c));
	struct launch l;
	struct launch_env env = { .k8s = "10.0.0.1", .hostname = "pstrain-worker-2" };
	cr_assert_eq(launch_resolve(&l, LAUNCH_ANY, NULL, &env, &c, err, sizeof(err)), 0, "%s", err);
	cr_assert(l.role == LAUNCH_WORKER && l.index == 2);
	env.hostname = "train-ps-0";
	cr_assert_eq(launch_resolve(&l, LAUNCH_ANY, NULL, &env, &c, err, sizeof(err)), 0, "%s", err);
	cr_assert(l.role == LAUNCH_PS && l.index == 0);
	env.hostname = "anything-7";
	cr_assert_eq(launch_resolve(&l, LAUNCH_WORKER, NULL, &env, &c, err, sizeof(err)), 0, "%s", err);
	cr_assert(l.role == LAUNCH_WORKER && l.index == 7);
	cr_assert_eq(launch_resolve(&l, LAUNCH_ANY, NULL, &env, &c, err, sizeof(err)), -EINVAL,
		     "run needs -ps or -worker in the name");
	env.hostname = "web-x";
	cr_assert_eq(launch_resolve(&l, LAUNCH_WORKER, NULL, &env, &c, err, sizeof(err)), -EINVAL);
	/* outside Kubernetes a host name is never taken for an index */
	env = (struct launch_env){ .hostname = "node-3" };
	cr_assert_eq(launch_resolve(&l, LAUNCH_WORKER, NULL, &env, &c, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "which task is this?"), "%s", err);
}

/* launch_config_load into c (want: LAUNCH_STATUS unless given) with the
 * one override set (may be NULL); where the lists came from in from. */
static int load_env(struct config *c, const char *cfg, const struct launch_env *env, int want,
		    const char *set, char *from, size_t fromlen)
{
	struct launch l;
	const char *sets[] = { set };
	int r = launch_config_load(c, &l, want, NULL, env, cfg, sets, set ? 1 : 0, err, sizeof(err));
	if (r == 0) {
		launch_config_from(&l, c, from, fromlen);
		launch_free(&l);
	}
	return r;
}

/* Issue 40 part 2: `pstrain status` takes [cluster]'s lists where the
 * roles do (launch_config_load), in the same order, and says from where:
 * TF_CONFIG over Slurm over a pod name over the file; a --set of the list
 * loses to the environment's, as for the roles; a pod name that is no
 * StatefulSet's NAME-K is no error for status (it names no lists), only
 * for the roles. */
Test(launch, status_lists_from_every_source)
{
	char dir[300], cfg[400], from[600], want[700], text[400], ps[600], workers[600];
	struct config *c = malloc(sizeof(*c));
	cr_assert_not_null(c);
	test_dir_make(dir, sizeof(dir), "launchcfg");
	snprintf(cfg, sizeof(cfg), "%s/c.ini", dir);
	write_cluster(dir, cfg, 10, 0, "", "");
	cr_assert_eq(config_load(c, cfg, NULL, 0, err, sizeof(err)), 0, "%s", err);
	unsigned p = c->cluster.ps[0].port, p1 = c->cluster.ps[1].port;
	snprintf(text, sizeof(text), TF, "chief", 0);
	struct launch_env env = { .tf_config = text, .slurm_procid = "3", .slurm_ntasks = "5",
				  .slurm_nodelist = "n[1-2]", .slurm_tasks_per_node = "3,2",
				  .k8s = "10.0.0.1", .hostname = "train-worker-1" };

	cr_assert_eq(load_env(c, cfg, &env, LAUNCH_STATUS, "cluster.ps=127.0.0.1:9", from, sizeof(from)), 0, "%s", err);
	cr_assert_str_eq(from, "TF_CONFIG (task chief 0)");
	cr_assert(c->cluster.nps == 2 && c->cluster.nworkers == 3, "%d ps, %d workers", c->cluster.nps,
		  c->cluster.nworkers);
	cr_assert(strcmp(c->cluster.ps[1].name, "p1") == 0 && c->cluster.ps[1].port == 2, "TF_CONFIG's ps 1, not %s:%u",
		  c->cluster.ps[1].name, c->cluster.ps[1].port);
	cr_assert_str_eq(c->cluster.workers[0].name, "c", "the chief is worker 0");
	/* the roles get the same lists, the same way */
	snprintf(text, sizeof(text), TF, "worker", 1);
	cr_assert_eq(load_env(c, cfg, &env, LAUNCH_WORKER, NULL, from, sizeof(from)), 0, "%s", err);
	cr_assert(c->cluster.nps == 2 && strcmp(c->cluster.ps[0].name, "p0") == 0);

	env.tf_config = NULL;
	cr_assert_eq(load_env(c, cfg, &env, LAUNCH_STATUS, NULL, from, sizeof(from)), 0, "%s", err);
	cr_assert_str_eq(from, "Slurm (task 3 of 5; the first 2 are ps)");
	snprintf(ps, sizeof(ps), "n1:%u n1:%u", c->cluster.ps[0].port, c->cluster.ps[1].port);
	snprintf(workers, sizeof(workers), "%s:%u %s:%u", c->cluster.workers[0].name, c->cluster.workers[0].port,
		 c->cluster.workers[2].name, c->cluster.workers[2].port);
	snprintf(want, sizeof(want), "n1:%u n1:%u", p, p + 1);
	cr_assert(strcmp(c->cluster.ps[0].name, "n1") == 0 && strcmp(ps, want) == 0, "ps %s, not %s", ps, want);
	snprintf(want, sizeof(want), "n1:%u n2:%u", p + 2, p + 4);
	cr_assert(c->cluster.nworkers == 3 && strcmp(workers, want) == 0, "workers %s, not %s", workers, want);

	env.slurm_procid = NULL;
	cr_assert_eq(load_env(c, cfg, &env, LAUNCH_STATUS, NULL, from, sizeof(from)), 0, "%s", err);
	snprintf(want, sizeof(want), "[cluster] of %s (the StatefulSet pod name train-worker-1: the StatefulSets' pods are named there)",
		 c->path);
	cr_assert_str_eq(from, want);
	cr_assert(c->cluster.nps == 2 && c->cluster.ps[1].port == p1, "the file's lists");

	env.hostname = "debug";   /* a pod of no StatefulSet: no source for status */
	cr_assert_eq(load_env(c, cfg, &env, LAUNCH_STATUS, NULL, from, sizeof(from)), 0, "%s", err);
	snprintf(want, sizeof(want), "[cluster] of %s", c->path);
	cr_assert_str_eq(from, want);
	cr_assert_eq(load_env(c, cfg, &env, LAUNCH_WORKER, NULL, from, sizeof(from)), -EINVAL, "a role needs NAME-K");
	cr_assert_not_null(strstr(err, "pod name \"debug\" is not a StatefulSet's NAME-K"), "%s", err);

	env = (struct launch_env){ 0 };
	cr_assert_eq(load_env(c, cfg, &env, LAUNCH_STATUS, NULL, from, sizeof(from)), 0, "%s", err);
	cr_assert_str_eq(from, want);
	cr_assert(c->cluster.nps == 2 && c->cluster.ps[0].port == p && c->cluster.ps[1].port == p1);
	free(c);
	test_dir_remove(dir);
}

/* What is wrong in a source is the same one line for status as for run:
 * a row per variable, each refused with launch_resolve's message; a
 * config error over lists from the environment names where they came
 * from, on the same line. */
Test(launch, status_refuses_what_the_roles_refuse)
{
	char dir[300], cfg[400], from[600], role_err[512];
	struct config *c = malloc(sizeof(*c));
	cr_assert_not_null(c);
	test_dir_make(dir, sizeof(dir), "launchbad");
	snprintf(cfg, sizeof(cfg), "%s/c.ini", dir);
	write_cluster(dir, cfg, 10, 0, "", "");
	const struct launch_env envs[] = {
		{ .tf_config = "not json" },
		{ .tf_config = "{\"cluster\": {\"ps\": [\"a:1\"]}, \"task\": {\"type\": \"ps\", \"index\": 0}}" },
		{ .tf_config = "{\"cluster\": {\"ps\": [\"a:1\"], \"worker\": [\"b:1\"]}, \"task\": {\"type\": \"chief\", \"index\": 1}}" },
		{ .tf_config = "{\"cluster\": {\"ps\": [\"\\u001b[2J:1\"], \"worker\": [\"b:1\"]}, \"task\": {\"type\": \"ps\", \"index\": 0}}" },
		{ .slurm_procid = "x", .slurm_ntasks = "4" },
		{ .slurm_procid = "0", .slurm_ntasks = "2", .slurm_nodelist = "n1", .slurm_tasks_per_node = "2" },
		{ .slurm_procid = "0", .slurm_ntasks = "4" },
		{ .slurm_procid = "0", .slurm_ntasks = "4", .slurm_nodelist = "n[1-", .slurm_tasks_per_node = "4" },
		{ .slurm_procid = "0", .slurm_ntasks = "4", .slurm_nodelist = "n1", .slurm_tasks_per_node = "3" },
	};
	for (size_t i = 0; i < sizeof(envs) / sizeof(envs[0]); i++) {
		role_err[0] = err[0] = 0;
		cr_expect_eq(load_env(c, cfg, &envs[i], LAUNCH_ANY, NULL, from, sizeof(from)), -EINVAL, "row %zu: run", i);
		snprintf(role_err, sizeof(role_err), "%s", err);
		cr_expect_eq(load_env(c, cfg, &envs[i], LAUNCH_STATUS, NULL, from, sizeof(from)), -EINVAL,
			     "row %zu accepted by status", i);
		cr_expect(role_err[0] && strcmp(err, role_err) == 0, "row %zu: status says \"%s\", run \"%s\"", i, err,
			  role_err);
		cr_expect(!strchr(err, '\n'), "row %zu: %s", i, err);
	}
	const struct launch_env port0 = {
		.tf_config = "{\"cluster\": {\"ps\": [\"a:0\"], \"worker\": [\"b:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}"
	};
	const int wants[] = { LAUNCH_STATUS, LAUNCH_ANY, LAUNCH_WORKER };
	for (int i = 0; i < 3; i++) {
		int want = wants[i];
		cr_assert_eq(load_env(c, cfg, &port0, want, NULL, from, sizeof(from)), -EINVAL, "want %d", want);
		cr_assert(strstr(err, "\"a:0\"") && strstr(err, " (the [cluster] lists came from TF_CONFIG (task worker 0))") &&
				  !strchr(err, '\n'),
			  "want %d: %s", want, err);
	}
	free(c);
	test_dir_remove(dir);
}

/* The TF_CONFIG a TFJob with 1 ps, a chief and 1 worker sets, on three
 * processes started with the same command line, `pstrain run`. */
Test(launch, tfjob_tf_config_trains_on_loopback, .timeout = 120)
{
	char dir[200], cfg[300], out[3][300], env[3][600];
	test_dir_make(dir, sizeof(dir), "tfjob");
	snprintf(cfg, sizeof(cfg), "%s/c.ini", dir);
	write_cluster(dir, cfg, 300, 0, "", "connect_timeout = 20\n");
	int ps = free_port(), chief = free_port(), w = free_port();
	const char *types[3] = { "ps", "chief", "worker" };
	pid_t pids[3];
	int st[3];
	for (int i = 0; i < 3; i++) {
		snprintf(env[i], sizeof(env[i]),
			 "TF_CONFIG={\"cluster\": {\"ps\": [\"127.0.0.1:%d\"], \"chief\": [\"127.0.0.1:%d\"], "
			 "\"worker\": [\"127.0.0.1:%d\"]}, \"task\": {\"type\": \"%s\", \"index\": 0}}",
			 ps, chief, w, types[i]);
		snprintf(out[i], sizeof(out[i]), "%s/%s.log", dir, types[i]);
		const char *args[] = { "run", "--config", cfg, NULL };
		pids[i] = spawn_pstrain(args, out[i], env[i]);
	}
	wait_children(pids, 3, st, 100);
	assert_exits_zero(st, out, 3, "TF_CONFIG cluster");
	cr_assert_not_null(strstr(slurp(out[0]), "pstrain: ps 0, from TF_CONFIG (task ps 0)"), "%s", slurp(out[0]));
	cr_assert_not_null(strstr(slurp(out[1]), "pstrain: worker 0, from TF_CONFIG (task chief 0)"), "%s",
			   slurp(out[1]));
	cr_assert_not_null(strstr(slurp(out[2]), "pstrain: worker 1, from TF_CONFIG (task worker 0, after the chief)"),
			   "%s", slurp(out[2]));
	cr_assert_not_null(strstr(slurp(out[1]), "1 ps"), "the config's 2 ps were replaced: %s", slurp(out[1]));
	double acc = final_accuracy(slurp(out[1]));
	cr_assert(acc >= 90, "blobs to %.2f%%", acc);
	/* a flag that disagrees is exit 2, before anything starts */
	const char *args[] = { "worker", "--index", "1", "--config", cfg, NULL };
	char bad[320];
	snprintf(bad, sizeof(bad), "%s/bad.log", dir);
	pid_t p = spawn_pstrain(args, bad, env[1]);
	wait_children(&p, 1, st, 20);
	cr_assert_eq(st[0], 2, "%s", slurp(bad));
	cr_assert_not_null(strstr(slurp(bad), "--index 1, but TF_CONFIG (task chief 0) makes this task worker 0"), "%s",
			   slurp(bad));
	test_dir_remove(dir);
}

static int can_connect(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(0x7f000001);
	int ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	close(fd);
	return ok;
}

/* Issue 16 item 6: a ps binds [cluster] listen, not its entry, which is
 * what workers dial; a worker whose own entry is not this host says so. */
Test(launch, listen_is_what_a_ps_binds_and_a_wrong_worker_entry_is_named, .timeout = 60)
{
	char dir[200], cfg[300], out[2][300], listen[64];
	test_dir_make(dir, sizeof(dir), "listen");
	snprintf(cfg, sizeof(cfg), "%s/c.ini", dir);
	write_cluster(dir, cfg, 10, 0, "", "");
	struct config c;
	cr_assert_eq(config_load(&c, cfg, NULL, 0, err, sizeof(err)), 0, "%s", err);
	int entry = c.cluster.ps[0].port, bound = free_port();
	snprintf(listen, sizeof(listen), "cluster.listen=127.0.0.1:%d", bound);
	snprintf(out[0], sizeof(out[0]), "%s/ps.log", dir);
	const char *args[] = { "ps", "--index", "0", "--config", cfg, "--set", listen, NULL };
	pid_t ps = spawn_pstrain(args, out[0], NULL);
	char want[100];
	snprintf(want, sizeof(want), "listening on 127.0.0.1:%d", bound);
	int up = wait_for_text(out[0], want);
	int on_bound = can_connect(bound), on_entry = can_connect(entry);
	kill(ps, SIGTERM);
	int st;
	wait_children(&ps, 1, &st, 20);
	cr_assert(up, "%s", slurp(out[0]));
	cr_assert(on_bound && !on_entry, "bound %d: %d, entry %d: %d", bound, on_bound, entry, on_entry);
	/* 192.0.2.1 (TEST-NET-1) is nobody's address here */
	snprintf(out[1], sizeof(out[1]), "%s/w.log", dir);
	const char *wargs[] = { "worker", "--index", "1", "--config", cfg, "--set",
				"cluster.workers=127.0.0.1:1, 192.0.2.1:2", "--set", "cluster.connect_timeout=1", NULL };
	pid_t w = spawn_pstrain(wargs, out[1], NULL);
	wait_children(&w, 1, &st, 30);
	cr_assert_not_null(strstr(slurp(out[1]), "lists this worker as 192.0.2.1:2, which is not an address of this host"),
			   "%s", slurp(out[1]));
	test_dir_remove(dir);
}

/* Issue 16 item 3: examples/k8s validates offline against the Kubernetes
 * API's schemas (strict) and against what pstrain needs of it
 * (tests/k8s_validate.py, with kubernetes-validate from `make deps-test`). */
Test(launch, kubernetes_manifests_validate_offline, .timeout = 120)
{
	char r[PATH_MAX], py[PATH_MAX + 32], cmd[5 * PATH_MAX], out[400];
	test_repo_path(r, sizeof(r), ".");
	snprintf(py, sizeof(py), "%s/build/pyvenv/bin/python", r);
	snprintf(cmd, sizeof(cmd), "'%s' -c 'import kubernetes_validate' 2>/dev/null", py);
	if (access(py, X_OK) != 0 || system(cmd) != 0)
		cr_skip_test("kubernetes-validate is not installed in build/pyvenv (make deps-test installs it): examples/k8s not validated");
	char dir[200];
	test_dir_make(dir, sizeof(dir), "k8s");
	snprintf(out, sizeof(out), "%s/validate.log", dir);
	snprintf(cmd, sizeof(cmd), "'%s' '%s/tests/k8s_validate.py' '%s/examples/k8s' '%s' > '%s' 2>&1", py, r, r,
		 getenv("PSTRAIN_BIN"), out);
	int st = system(cmd);
	cr_assert_eq(st, 0, "%s", slurp(out));
	cr_assert_not_null(strstr(slurp(out), "ok"), "%s", slurp(out));
	test_dir_remove(dir);
}

/* Issue 16 item 6: examples/ssh-cluster.sh starts every task on its host
 * over ssh; here `ssh` is a stand-in that records the host and runs the
 * command on this one, so the test checks the commands and the run. */
Test(launch, ssh_launcher_starts_every_task_on_its_host, .timeout = 120)
{
	char r[PATH_MAX], dir[200], cfg[300], fake[300], hostlog[300], out[300], link[300], cmd[2 * PATH_MAX];
	/* absolute: the script runs in dir */
	test_repo_path(r, sizeof(r), ".");
	test_dir_make(dir, sizeof(dir), "ssh");
	snprintf(cfg, sizeof(cfg), "%s/c.ini", dir);
	write_cluster(dir, cfg, 100, 50, "", "");
	snprintf(link, sizeof(link), "%s/pstrain", dir);
	cr_assert_eq(symlink(getenv("PSTRAIN_BIN"), link), 0);
	snprintf(fake, sizeof(fake), "%s/fake-ssh", dir);
	snprintf(hostlog, sizeof(hostlog), "%s/hosts.log", dir);
	FILE *f = fopen(fake, "w");
	cr_assert_not_null(f);
	fprintf(f, "#!/bin/sh\n# fake-ssh HOST COMMAND\necho \"$1 $2\" >> '%s'\nexec sh -c \"$2\"\n", hostlog);
	cr_assert_eq(fclose(f), 0);
	cr_assert_eq(chmod(fake, 0755), 0);
	snprintf(out, sizeof(out), "%s/launcher.log", dir);
	snprintf(cmd, sizeof(cmd), "cd '%s' && SSH='%s' PSTRAIN='%s' timeout 100 '%s/examples/ssh-cluster.sh' c.ini '%s' > '%s' 2>&1",
		 dir, fake, getenv("PSTRAIN_BIN"), r, dir, out);
	int st = system(cmd);
	cr_assert_eq(st, 0, "%s", slurp(out));
	double acc = final_accuracy(slurp(out));
	cr_assert_gt(acc, 90.0, "%s", slurp(out));
	const char *hosts = slurp(hostlog);
	const char *want[] = { "127.0.0.1 cd  '", "./pstrain ps --index 0 --config  'c.ini'\n", "./pstrain ps --index 1 ",
			       "./pstrain worker --index 1 ", "./pstrain worker --index 0 " };
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		cr_assert_not_null(strstr(hosts, want[i]), "no \"%s\" in:\n%s", want[i], hosts);
	test_dir_remove(dir);
}
