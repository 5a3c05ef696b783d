/* pstrain(1) says what `pstrain --help` says (issue 16 item 7): every
 * command with its arguments, every option and every exit status the help
 * prints is in docs/pstrain.1, and the page names no command the binary
 * lacks. The page's roff escapes \- as a dash; it is compared unescaped. */
#include <criterion/criterion.h>

#include "util.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The page, with "\-" as "-", next to this file's directory. */
static char *page(void)
{
	char path[PATH_MAX];
	test_repo_path(path, sizeof(path), "docs/pstrain.1");
	char *text = slurp(path);
	cr_assert(text[0], "%s is missing or empty", path);
	char *out = strdup(text), *w = out;
	for (const char *r = text; *r; r++) {
		if (r[0] == '\\' && r[1] == '-')
			r++;
		*w++ = *r;
	}
	*w = 0;
	return out;
}

static char *help(void)
{
	const char *bin = getenv("PSTRAIN_BIN");
	cr_assert_not_null(bin, "PSTRAIN_BIN is not set");
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "'%s' --help", bin);
	FILE *f = popen(cmd, "r");
	cr_assert_not_null(f);
	static char buf[16384];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	cr_assert_eq(pclose(f), 0);
	return buf;
}

Test(manpage, says_what_help_says)
{
	char *man = page(), *h = help(), *save = NULL;
	int commands = 0, options = 0;
	for (char *line = strtok_r(h, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char name[32], args[200];
		if (sscanf(line, "  pstrain %31s", name) == 1) {
			/* "  pstrain NAME ARGS   help": ARGS ends at two spaces */
			const char *a = line + strlen("  pstrain ") + strlen(name);
			while (*a == ' ')
				a++;
			const char *end = strstr(a, "  ");
			snprintf(args, sizeof(args), "%.*s", (int)(end ? end - a : (long)strlen(a)), a);
			char want[260];
			snprintf(want, sizeof(want), "pstrain %s\n%s", name, args);
			cr_expect_not_null(strstr(man, want), "pstrain.1's SYNOPSIS lacks \"pstrain %s %s\"", name, args);
			snprintf(want, sizeof(want), ".B %s\n", name);
			cr_expect_not_null(strstr(man, want), "pstrain.1's COMMANDS lacks %s", name);
			commands++;
		} else if (strncmp(line, "  --", 4) == 0) {
			char opt[40];
			cr_assert_eq(sscanf(line, " %39[^ ,]", opt), 1);
			cr_expect_not_null(strstr(man, opt), "pstrain.1 lacks the option %s", opt);
			options++;
		}
	}
	cr_assert_geq(commands, 8, "the help's command lines were not found");
	cr_assert_geq(options, 8);
	const char *codes[] = { "\n.B 0\n", "\n.B 1\n", "\n.B 2\n", "\n.B 3\n", "\n.B 130\n" };
	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
		cr_expect_not_null(strstr(man, codes[i]), "pstrain.1's EXIT STATUS lacks %s", codes[i]);
	/* and no command the binary does not have */
	for (const char *at = strstr(man, ".SH COMMANDS"); at && (at = strstr(at, "\n.TP\n.B ")) != NULL;) {
		at += 8;
		char name[32];
		if (sscanf(at, "%31s", name) != 1 || strcmp(name, "EXIT") == 0)
			break;
		if (strncmp(name, "--", 2) == 0)
			break;   /* OPTIONS */
		char want[64];
		snprintf(want, sizeof(want), "  pstrain %s ", name);
		cr_expect_not_null(strstr(help(), want), "pstrain.1 describes a command \"%s\" that --help lacks", name);
	}
	free(man);
}
