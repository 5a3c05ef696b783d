/* Test hooks: the few ways the tests make a run slow or kill it at a chosen
 * point, in one struct filled once when a role or a checkpoint layout is
 * made, so that the normal paths only see numbers (0: off).
 *
 * Only a test build has them: base/hooks.c compiled with
 * -DPSTRAIN_TEST_HOOKS, linked into build/tests/run and the test binary
 * $(BUILD)/pstrain-test (the Makefile's `unit` runs the suites with it).
 * The release pstrain gets an all-zero struct and a crash point that does
 * nothing: no environment variable of these is read, and no path a user
 * runs ends in SIGKILL. docs/CHECKPOINTS.md lists them with their tests. */
#ifndef PSTRAIN_BASE_HOOKS_H
#define PSTRAIN_BASE_HOOKS_H

struct test_hooks {
	/* PSTRAIN_CKPT_CRASH = POINT or POINT:STEP: SIGKILL at that point of
	 * a checkpoint save (POINT: shard, manifest or publish), as a power
	 * cut would stop it; or of a worker's step (rows: its embedding rows
	 * pushed, its dense gradient not); or of a ps's (spull: a request for
	 * rows at that version taken, not answered). */
	char ckpt_crash[32];
	long ckpt_delay_ms;       /* PSTRAIN_CKPT_DELAY_MS: every save takes this
				   * much longer, as on a slow or network disk */
	long first_pull_delay_ms; /* PSTRAIN_FIRST_PULL_DELAY_MS: a ps answers each
				   * connection's first PULL this much later, as a
				   * starved thread would */
	long eval_delay_ms;       /* PSTRAIN_EVAL_DELAY_MS: the chief sleeps this long
				   * before each periodic evaluation */
	long final_eval_delay_ms; /* PSTRAIN_FINAL_EVAL_DELAY_MS: and this long before
				   * the final one, so a ps can be lost during it */
	long step_delay_ms;       /* PSTRAIN_STEP_DELAY_MS: a worker sleeps this long
				   * before each step, so that a run lasts while the
				   * tests change its worker set */
	long rows_delay_ms;       /* PSTRAIN_ROWS_DELAY_MS: a ps answers each request
				   * for rows (SPULL) this much later, as over a slow
				   * link */
};

/* The hooks from the environment in a test build; all off otherwise. */
void hooks_read(struct test_hooks *h);

/* In a test build, SIGKILL when h->ckpt_crash names point ("POINT", or
 * "POINT:STEP" with this step); nothing otherwise. */
void hooks_crash_point(const struct test_hooks *h, const char *point, long step);
/* Whether hooks_crash_point(h, point, step) would; 0 outside a test build. */
int hooks_crash_due(const struct test_hooks *h, const char *point, long step);

/* Whether this binary has the hooks (for --dump-params and the tests). */
int hooks_built_in(void);

#endif
