/* The test hooks of base/hooks.h: read and acted on only when compiled
 * with -DPSTRAIN_TEST_HOOKS (the Makefile's test build). */
#include "hooks.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PSTRAIN_TEST_HOOKS
static long env_ms(const char *name)
{
	const char *v = getenv(name);
	return v ? strtol(v, NULL, 10) : 0;
}

void hooks_read(struct test_hooks *h)
{
	const char *crash = getenv("PSTRAIN_CKPT_CRASH");
	memset(h, 0, sizeof(*h));
	if (crash)
		snprintf(h->ckpt_crash, sizeof(h->ckpt_crash), "%s", crash);
	h->ckpt_delay_ms = env_ms("PSTRAIN_CKPT_DELAY_MS");
	h->first_pull_delay_ms = env_ms("PSTRAIN_FIRST_PULL_DELAY_MS");
	h->eval_delay_ms = env_ms("PSTRAIN_EVAL_DELAY_MS");
	h->final_eval_delay_ms = env_ms("PSTRAIN_FINAL_EVAL_DELAY_MS");
	h->step_delay_ms = env_ms("PSTRAIN_STEP_DELAY_MS");
	h->rows_delay_ms = env_ms("PSTRAIN_ROWS_DELAY_MS");
}

int hooks_crash_due(const struct test_hooks *h, const char *point, long step)
{
	const char *want = h->ckpt_crash;
	size_t n = strlen(point);
	if (strncmp(want, point, n) != 0)
		return 0;
	return want[n] == '\0' || (want[n] == ':' && strtol(want + n + 1, NULL, 10) == step);
}

void hooks_crash_point(const struct test_hooks *h, const char *point, long step)
{
	if (hooks_crash_due(h, point, step))
		raise(SIGKILL);
}

int hooks_built_in(void)
{
	return 1;
}
#else
void hooks_read(struct test_hooks *h)
{
	memset(h, 0, sizeof(*h));
}

int hooks_crash_due(const struct test_hooks *h, const char *point, long step)
{
	(void)h, (void)point, (void)step;
	return 0;
}

void hooks_crash_point(const struct test_hooks *h, const char *point, long step)
{
	(void)h, (void)point, (void)step;
}

int hooks_built_in(void)
{
	return 0;
}
#endif
