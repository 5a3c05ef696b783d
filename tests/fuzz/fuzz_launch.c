/* libFuzzer harness for what a scheduler hands pstrain in the environment
 * (cluster/launch.c, core/json.c): the input as TF_CONFIG, and its halves as
 * a Slurm node list and tasks per node. Checks the error contract, that no
 * message holds a byte that is not printable ASCII (the environment's text
 * is shown filtered), and that an accepted task has a role, an index and
 * lists of host:port characters only. */
#include "../../cluster/launch.h"
#include "fuzz.h"

#include <errno.h>

/* 1 if s holds only bytes in allowed, or printable ASCII when allowed is NULL. */
static int only(const char *s, const char *allowed)
{
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (allowed ? !strchr(allowed, c) : c < 0x20 || c >= 0x7f)
			return 0;
	}
	return 1;
}

static const char HOSTPORT[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:[], ";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct config c;
	char err[512] = "";
	char *text = malloc(size + 1);
	FUZZ_CHECK(text);
	memcpy(text, data, size);
	text[size] = 0;
	c.cluster.nps = 1 + (size % 3);
	c.cluster.ps[0].port = 2222;
	struct launch l;
	struct launch_env env = { .tf_config = text };
	int rc = launch_resolve(&l, LAUNCH_ANY, NULL, &env, &c, err, sizeof(err));
	if (rc < 0) {
		fuzz_check_err(rc, err);
		FUZZ_CHECK(only(err, NULL));
	} else {
		FUZZ_CHECK(l.role == LAUNCH_PS || l.role == LAUNCH_WORKER);
		FUZZ_CHECK(l.index >= 0 && l.ps && l.workers);
		FUZZ_CHECK(only(l.ps, HOSTPORT) && only(l.workers, HOSTPORT) && only(l.from, NULL));
		launch_free(&l);
	}
	size_t half = strlen(text) / 2;
	char *tpn = strdup(text + half);
	FUZZ_CHECK(tpn);
	text[half] = 0;
	env = (struct launch_env){ .slurm_procid = "1", .slurm_ntasks = "4", .slurm_nodelist = text,
				   .slurm_tasks_per_node = tpn };
	err[0] = 0;
	rc = launch_resolve(&l, LAUNCH_ANY, NULL, &env, &c, err, sizeof(err));
	if (rc < 0) {
		fuzz_check_err(rc, err);
		FUZZ_CHECK(only(err, NULL));
	} else {
		FUZZ_CHECK(only(l.ps, HOSTPORT) && only(l.workers, HOSTPORT));
		launch_free(&l);
	}
	free(tpn);
	free(text);
	return 0;
}
