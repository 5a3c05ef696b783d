/* Helpers shared by the tests that make files, train or start processes. */
#ifndef PSTRAIN_TEST_UTIL_H
#define PSTRAIN_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* CSV "label,x0,..": n rows of K well-separated Gaussian blobs in D
 * dimensions; asserts on any I/O failure. */
void write_blobs(const char *path, int n, int K, int D, uint64_t seed);

/* The whole file at path as a string, "" if it cannot be read. The buffer
 * lives as long as the test's process (every test is one) and is the
 * path's own: reading the same path again refreshes it in place, so a log
 * can be polled without using memory per poll, and a pointer kept from an
 * earlier read stays valid (it shows that read's text or newer). No length
 * limit. */
char *slurp(const char *path);

/* The whole file at path into a new buffer (*len bytes, NUL after them)
 * that the caller frees; asserts that it can be read. */
void read_all(const char *path, unsigned char **buf, size_t *len);

/* In dir: blobs.csv (write_blobs: 600 rows, 3 blobs, 6 features) and
 * cluster.key, each made the first time. */
void write_cluster_files(const char *dir);

/* write_cluster_files(dir), and at cfg a config of 2 ps + 2
 * workers on free loopback ports training the blobs (dense 16, relu,
 * dense 3; batch 16, momentum, one thread) for `steps`. train_extra goes
 * into [train] (with eval_every = eval_every unless it sets one),
 * cluster_extra into [cluster] (with socket_dir = sockets, beside cfg,
 * unless it sets one). */
void write_cluster(const char *dir, const char *cfg, int steps, int eval_every,
		   const char *train_extra, const char *cluster_extra);

/* A new directory $TMPDIR/pstrain-TAG-XXXXXX (/tmp without TMPDIR) in dir;
 * asserts that it was made. */
void test_dir_make(char *dir, size_t len, const char *tag);

/* The absolute path of rel (a path inside the repository, e.g.
 * "tests/tb_read.py"), found from this file's; make runs the suite from
 * the root, where __FILE__'s relative path starts. Asserts it resolves. */
void test_repo_path(char *buf, size_t len, const char *rel);

/* Waits up to 30 s for the file at path to contain text; 1 if it did. */
int wait_for_text(const char *path, const char *text);

/* rm -rf dir. Returns 0, or -1 after a line on stderr: a teardown goes on,
 * a caller that wants it checked asserts on the result. */
int test_dir_remove(const char *dir);

/* A loopback port nobody listens on, never the same twice in one test. */
int free_port(void);

/* Starts $PSTRAIN_BIN with args (NULL-terminated, at most 14), stdout and
 * stderr to outpath, with env ("NAME=value" or NULL) added. It is killed
 * when the process that started it ends (a failed assertion). What a
 * scheduler sets in the test's own environment (TF_CONFIG, SLURM_*,
 * KUBERNETES_SERVICE_HOST: cluster/launch.c reads them) is removed, so a
 * suite run in a pod or a Slurm job is not steered by it; env may set it. */
pid_t spawn_pstrain(const char *const *args, const char *outpath, const char *env);
/* The same with every "NAME=value" of envs (NULL-terminated) added. */
pid_t spawn_pstrain_env(const char *const *args, const char *outpath, const char *const *envs);
/* The same on a host named pod (a pod's name: gethostname's), in a UTS
 * namespace of its own (as root, or in a user namespace mapping only our
 * ids); where the system allows neither it exits SPAWN_NO_POD, having
 * said why in outpath. */
#define SPAWN_NO_POD 125
pid_t spawn_pstrain_pod(const char *const *args, const char *outpath, const char *const *envs,
			const char *pod);

/* Waits for all n processes up to timeout_s; kills every one left then.
 * st[i]: exit status, 128+signal, or -1 if it had to be killed. */
void wait_children(const pid_t *pids, int n, int *st, int timeout_s);
/* wait_children, calling sample(ctx) (if not NULL) every nap_ms while they
 * run: a test that watches a process as it trains. */
void wait_children_sampling(const pid_t *pids, int n, int *st, int timeout_s, long nap_ms,
			    void (*sample)(void *ctx), void *ctx);

/* Every one of the n processes exited 0 (st from wait_children); if not,
 * fails showing every exit status and the head of every log out[i]: the
 * process that failed first is often not the first one checked (a ps
 * killed at the time limit while it waited for a worker that exited 3).
 * what (may be "") starts the message. */
void assert_exits_zero(const int *st, char (*out)[300], int n, const char *what);

/* The test accuracy (percent) of a chief's or `local`'s final line:
 * "done: ...", or "run finished: ... (test accuracy A%)" when the other
 * workers (backup workers) trained every step before the chief connected;
 * fails the test when there is neither. */
double final_accuracy(const char *text);

/* The "tensor" lines of `pstrain check --checkpoint stepdir` (its log in
 * dir/check.log): every parameter tensor and optimizer moment with its
 * blake2b hash, whatever shards hold it, into out (len bytes). */
void checkpoint_tensor_lines(const char *dir, const char *stepdir, char *out, size_t len);

/* tests/tb_read.py's output for log_dir (saved at outpath: "TAG STEP
 * VALUE" lines), or NULL without the tensorboard package in build/pyvenv
 * (`make deps-test`): the caller skips what needs it. */
char *test_tb_read(const char *log_dir, const char *outpath);
/* The value of tag at step in that output; NAN if absent. */
double test_tb_value(const char *text, const char *tag, long step);

#endif
