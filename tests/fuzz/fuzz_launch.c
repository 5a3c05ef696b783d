/* libFuzzer harness for what a scheduler hands pstrain in the environment
 * (core/launch.c, core/json.c): the input as TF_CONFIG, and its halves as
 * a Slurm node list and tasks per node. Checks the error contract and that
 * an accepted task has a role, an index and its lists. */
#include "../../core/launch.h"
#include "fuzz.h"

#include <errno.h>

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
	} else {
		FUZZ_CHECK(l.role == LAUNCH_PS || l.role == LAUNCH_WORKER);
		FUZZ_CHECK(l.index >= 0 && l.ps && l.workers);
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
	if (rc < 0)
		fuzz_check_err(rc, err);
	else
		launch_free(&l);
	free(tpn);
	free(text);
	return 0;
}
