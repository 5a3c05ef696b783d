/* libFuzzer harness for the config parser. The input is the text of a
 * cluster.ini, parsed with config_parse_string; if it holds NUL bytes, the
 * text before the first one goes through config_load from a file instead,
 * and each NUL-terminated piece after it is a --set "section.key=value".
 * Checks that a failure is one line of text, that a success satisfies the
 * cross-key rules, and, for config_parse_string, that config_print's output
 * parses back and prints the same (the round trip `pstrain check` promises).
 *
 * The round trip is not checked for text with a line within PRINT_SLACK of
 * inih's limit: config_print writes "key = value", indents continuations by
 * two and ends them with a comma, so a value that just fit on its line in
 * the input ("ps=<195 characters>") cannot be printed on one. Likewise
 * config_load, whose paths gain the file's directory and whose --set values
 * have no line limit at all. */
#include "../../core/config/config.h"
#include "fuzz.h"

#include <ini.h>

#define MAX_SETS 8
#define MAX_LINE (INI_MAX_LINE - 2)   /* what config.c's reader passes on */
#define PRINT_SLACK 4

static struct config c, back;   /* ~300 KiB each: not on the stack */
static struct fuzz_file ini = { .fd = -1 };

static void cleanup(void)
{
	fuzz_file_close(&ini);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fuzz_file_open(&ini, "ini");
	atexit(cleanup);
	return 0;
}

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
		FUZZ_CHECK(cfg->cluster.ps[i].port > 0 && cfg->cluster.ps[i].name[0] &&
			   strnlen(cfg->cluster.ps[i].name, CONFIG_HOST_MAX) < CONFIG_HOST_MAX);
	for (int i = 0; i < cfg->cluster.nworkers; i++)
		FUZZ_CHECK(cfg->cluster.workers[i].port > 0 && cfg->cluster.workers[i].name[0] &&
			   strnlen(cfg->cluster.workers[i].name, CONFIG_HOST_MAX) < CONFIG_HOST_MAX);
}

/* The file part through config_load, the rest as --set arguments. */
static void fuzz_load(const uint8_t *data, size_t size, size_t textlen)
{
	char err[CONFIG_ERR_MAX];
	const char *sets[MAX_SETS];
	int nsets = 0, ret;
	char *rest = malloc(size - textlen + 1);

	FUZZ_CHECK(rest);
	memcpy(rest, data + textlen, size - textlen);
	rest[size - textlen] = '\0';
	for (size_t i = 1; i < size - textlen && nsets < MAX_SETS; i += strlen(rest + i) + 1)
		sets[nsets++] = rest + i;
	fuzz_file_write(&ini, data, textlen);
	err[0] = '\0';
	ret = config_load(&c, ini.path, sets, nsets, err, sizeof(err));
	if (ret && memchr(data + textlen, '\n', size - textlen))
		FUZZ_CHECK(ret < 0 && err[0]);   /* it quotes the --set text */
	else if (ret)
		fuzz_check_err(ret, err);
	else
		check_config(&c);
	free(rest);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[CONFIG_ERR_MAX];
	const uint8_t *nul = memchr(data, '\0', size);
	char *text;
	int ret;

	if (nul) {
		fuzz_load(data, size, (size_t)(nul - data));
		return 0;
	}
	text = malloc(size + 1);
	FUZZ_CHECK(text);
	memcpy(text, data, size);
	text[size] = '\0';
	err[0] = '\0';
	ret = config_parse_string(&c, "fuzz.ini", text, err, sizeof(err));
	free(text);
	if (ret) {
		fuzz_check_err(ret, err);
		return 0;
	}
	check_config(&c);

	size_t line = 0;
	for (size_t i = 0; i < size; i++, line++) {
		if (data[i] == '\n')
			line = (size_t)-1;
		else if (line >= MAX_LINE - PRINT_SLACK)
			return 0;
	}

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
