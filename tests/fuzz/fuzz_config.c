/* libFuzzer harness for config_parse_string: the input is the text of a
 * cluster.ini. Checks that a failure is one line of text, that a success
 * satisfies the cross-key rules, and that config_print's output of it parses
 * back and prints the same (the round trip `pstrain check` promises). */
#include "config.h"
#include "fuzz.h"

static struct config c, back;   /* ~300 KiB each: not on the stack */

static char *print(const struct config *cfg)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	FUZZ_CHECK(f);
	config_print(cfg, f);
	FUZZ_CHECK(fclose(f) == 0);
	return buf;
}

static void check_config(const struct config *cfg)
{
	FUZZ_CHECK(cfg->cluster.nps >= 1 && cfg->cluster.nps <= CONFIG_MAX_HOSTS);
	FUZZ_CHECK(cfg->cluster.nworkers >= 1 && cfg->cluster.nworkers <= CONFIG_MAX_HOSTS);
	FUZZ_CHECK(cfg->train.replicas_to_aggregate >= 1 &&
		   cfg->train.replicas_to_aggregate <= cfg->cluster.nworkers);
	FUZZ_CHECK(!(cfg->train.steps > 0 && cfg->train.epochs > 0));
	FUZZ_CHECK(cfg->train.steps > 0 || cfg->train.epochs > 0);
	FUZZ_CHECK(cfg->gpu.ndevices >= 0 && cfg->gpu.ndevices <= CONFIG_MAX_DEVICES);
	FUZZ_CHECK(cfg->model.nlayers >= 1 && cfg->model.nlayers <= MODEL_MAX_LAYERS);
	for (int i = 0; i < cfg->cluster.nps; i++)
		FUZZ_CHECK(cfg->cluster.ps[i].port > 0 && cfg->cluster.ps[i].name[0]);
	for (int i = 0; i < cfg->cluster.nworkers; i++)
		FUZZ_CHECK(cfg->cluster.workers[i].port > 0 && cfg->cluster.workers[i].name[0]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[CONFIG_ERR_MAX];
	char *text = malloc(size + 1);
	int ret;

	FUZZ_CHECK(text);
	memcpy(text, data, size);
	text[size] = '\0';   /* an embedded NUL just ends the text early */
	err[0] = '\0';
	ret = config_parse_string(&c, "fuzz.ini", text, err, sizeof(err));
	free(text);
	if (ret) {
		fuzz_check_err(ret, err);
		return 0;
	}
	check_config(&c);

	char *once = print(&c);
	err[0] = '\0';
	ret = config_parse_string(&back, "printed.ini", once, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "config_print output does not parse back: %s\n--\n%s--\n", err, once);
		abort();
	}
	char *twice = print(&back);
	if (strcmp(once, twice) != 0) {
		fprintf(stderr, "config_print output changes on a round trip:\n--\n%s--\n%s--\n", once, twice);
		abort();
	}
	free(once);
	free(twice);
	return 0;
}
