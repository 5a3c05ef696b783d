/* Tests of core/shard.c: the plan is contiguous, covers [0, P) and is
 * balanced to one element for several models and ps counts (including
 * nps == P and P near 2^31 and SIZE_MAX); more ps than parameters is an
 * error from shard_check and empty trailing shards from shard_plan;
 * initializing shard by shard equals initializing the whole vector bitwise;
 * and the printed plan names the tensor ranges each shard touches. */
#include <criterion/criterion.h>

#include "leak.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../core/config/config.h"
#include "../core/nn/model.h"
#include "../core/shard.h"

TestSuite(shard, .fini = leak_check);

static const char *const models[] = {
	/* the default 784-512-512-10 MLP: P = 669706 */
	"[model]\ninput = 28x28x1\nlayer = dense 512\nlayer = relu\nlayer = dense 512\nlayer = relu\nlayer = dense 10\n",
	/* tiny: P = 3*2 + 2 = 8 */
	"[model]\ninput = 3\nlayer = dense 2\n",
	/* tanh (Glorot init) with a spatial input: P = 20*7 + 7 + 7*3 + 3 = 171 */
	"[model]\ninput = 4x5\nlayer = dense 7\nlayer = tanh\nlayer = dense 3\n",
	/* wide: P = 2048*1024 + 1024 + 1024*2 + 2 = 2100226 */
	"[model]\ninput = 2048\nlayer = dense 1024\nlayer = relu\nlayer = dense 2\n",
};
static const size_t model_params[] = { 669706, 8, 171, 2100226 };
#define NMODELS (sizeof(models) / sizeof(models[0]))

static const int ps_counts[] = { 1, 2, 3, 7, 64 };
#define NCOUNTS (sizeof(ps_counts) / sizeof(ps_counts[0]))

static void build(struct model *m, const char *text)
{
	struct config c;
	char err[CONFIG_ERR_MAX];
	cr_assert_eq(config_parse_string(&c, "t.ini", text, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(model_build(m, &c.model, err, sizeof(err)), 0, "%s", err);
}

/* Contiguous from 0 to P; the first P % nps shards have P/nps + 1
 * elements, the rest P/nps. */
static void assert_plan(const struct shard *s, int nps, size_t P)
{
	size_t q = P / (size_t)nps, r = P % (size_t)nps, min = SIZE_MAX, max = 0;
	cr_assert_eq(s[0].begin, 0, "nps %d P %zu: shard 0 begins at %zu", nps, P, s[0].begin);
	for (int k = 0; k < nps; k++) {
		if (k > 0)
			cr_assert_eq(s[k].begin, s[k - 1].end, "nps %d P %zu: gap or overlap before shard %d: %zu != %zu",
				     nps, P, k, s[k].begin, s[k - 1].end);
		cr_assert_leq(s[k].begin, s[k].end, "nps %d P %zu: shard %d is reversed", nps, P, k);
		size_t n = s[k].end - s[k].begin;
		cr_assert_eq(n, q + ((size_t)k < r), "nps %d P %zu: shard %d has %zu elements, expected %zu",
			     nps, P, k, n, q + ((size_t)k < r));
		min = n < min ? n : min;
		max = n > max ? n : max;
	}
	cr_assert_eq(s[nps - 1].end, P, "nps %d P %zu: the plan ends at %zu", nps, P, s[nps - 1].end);
	cr_assert_leq(max - min, 1, "nps %d P %zu: sizes range %zu..%zu", nps, P, min, max);
}

Test(shard, balanced_and_contiguous_for_models_and_ps_counts)
{
	char err[256];
	for (size_t i = 0; i < NMODELS; i++) {
		struct model m;
		build(&m, models[i]);
		cr_assert_eq(m.nparams, model_params[i], "model %zu has %zu parameters", i, m.nparams);
		size_t P = m.nparams;
		for (size_t j = 0; j <= NCOUNTS; j++) {
			int nps = j < NCOUNTS ? ps_counts[j] : (int)P;   /* last: one element each */
			if ((size_t)nps > P)
				continue;   /* more_ps_than_parameters covers it */
			struct shard *s = malloc((size_t)nps * sizeof(*s));
			cr_assert(s != NULL);
			cr_assert_eq(shard_check(nps, P, err, sizeof(err)), 0, "%s", err);
			shard_plan(s, nps, P);
			assert_plan(s, nps, P);
			if (nps == (int)P)
				for (int k = 0; k < nps; k++)
					cr_assert_eq(s[k].begin, (size_t)k);
			free(s);
		}
	}
}

Test(shard, known_boundaries)
{
	/* 669706 = 2 * 334853; 669706 = 3 * 223235 + 1; 14 = 3 * 4 + 2 */
	struct shard s[3];
	shard_plan(s, 2, 669706);
	cr_assert_eq(s[0].end, 334853);
	cr_assert_eq(s[1].begin, 334853);
	shard_plan(s, 3, 669706);
	cr_assert_eq(s[0].end, 223236);
	cr_assert_eq(s[1].end, 446471);
	cr_assert_eq(s[2].end, 669706);
	shard_plan(s, 3, 14);
	cr_assert_eq(s[0].end, 5);
	cr_assert_eq(s[1].end, 10);
	cr_assert_eq(s[2].end, 14);
}

Test(shard, no_overflow_near_limits)
{
	const size_t sizes[] = {
		((size_t)1 << 31) - 1, (size_t)1 << 31, ((size_t)1 << 32) + 3, SIZE_MAX - 1, SIZE_MAX,
	};
	const int counts[] = { 1, 2, 3, 7, 64, 255, 256 };
	struct shard s[256];
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		for (size_t j = 0; j < sizeof(counts) / sizeof(counts[0]); j++) {
			shard_plan(s, counts[j], sizes[i]);
			assert_plan(s, counts[j], sizes[i]);
		}
	/* Forming k*P would wrap here: 255 * SIZE_MAX. */
	shard_plan(s, 256, SIZE_MAX);
	cr_assert_eq(s[255].begin, SIZE_MAX - SIZE_MAX / 256);
}

Test(shard, more_ps_than_parameters)
{
	char err[256];
	struct shard s[64];
	cr_assert_eq(shard_check(8, 8, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(shard_check(9, 8, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "[cluster] ps: 9 ps tasks but the model has only 8 parameters; "
			      "each ps needs at least one (list at most 8)");
	cr_assert_eq(shard_check(64, 8, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "64 ps tasks") != NULL, "%s", err);
	cr_assert_eq(shard_check(0, 8, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "[cluster] ps: needs at least one host:port");

	/* shard_plan itself stays total: one element each, then empty [P, P). */
	shard_plan(s, 64, 8);
	assert_plan(s, 64, 8);
	for (int k = 0; k < 64; k++) {
		size_t want = k < 8 ? (size_t)k : 8;
		cr_assert_eq(s[k].begin, want, "shard %d begins at %zu", k, s[k].begin);
		cr_assert_eq(s[k].end, k < 8 ? want + 1 : 8, "shard %d ends at %zu", k, s[k].end);
	}
}

Test(shard, sharded_init_equals_whole_init)
{
	const uint64_t seed = 42;
	for (size_t i = 0; i < NMODELS; i++) {
		struct model m;
		build(&m, models[i]);
		size_t P = m.nparams;
		float *whole = malloc(P * sizeof(float)), *parts = malloc(P * sizeof(float));
		cr_assert(whole && parts);
		model_init_params(&m, whole, 0, P, seed);
		/* Not all zero: the comparison below must be able to fail. */
		size_t nonzero = 0;
		for (size_t p = 0; p < P; p++)
			nonzero += whole[p] != 0.0f;
		cr_assert_gt(nonzero, P / 2, "model %zu: only %zu of %zu weights are nonzero", i, nonzero, P);
		for (size_t j = 0; j <= NCOUNTS; j++) {
			int nps = j < NCOUNTS ? ps_counts[j] : (int)P;
			if ((size_t)nps > P)
				continue;
			struct shard *s = malloc((size_t)nps * sizeof(*s));
			cr_assert(s != NULL);
			shard_plan(s, nps, P);
			/* NaN first, so a range a shard failed to write differs too. */
			memset(parts, 0xff, P * sizeof(float));
			for (int k = 0; k < nps; k++)
				model_init_params(&m, parts + s[k].begin, s[k].begin, s[k].end, seed);
			size_t bad = P;
			for (size_t p = 0; p < P && bad == P; p++)
				if (memcmp(&whole[p], &parts[p], sizeof(float)))
					bad = p;
			cr_assert_eq(bad, P, "model %zu, %d ps: parameter %zu is %a sharded, %a whole",
				     i, nps, bad, bad < P ? parts[bad] : 0.0, bad < P ? whole[bad] : 0.0);
			free(s);
		}
		free(whole);
		free(parts);
	}
}

/* The plan as text, for the asserts below. */
static char *print_plan(const struct model *m, int nps, const struct host *ps)
{
	struct shard s[64];
	char *buf = NULL;
	size_t len = 0;
	cr_assert_leq(nps, 64);
	shard_plan(s, nps, m->nparams);
	FILE *f = open_memstream(&buf, &len);
	cr_assert(f != NULL);
	shard_print(f, m, s, nps, ps);
	cr_assert_eq(fclose(f), 0);
	return buf;
}

#define assert_has(text, want) \
	cr_assert(strstr((text), (want)) != NULL, "missing \"%s\" in:\n%s", (want), (text))

Test(shard, print_shows_straddling_tensors)
{
	/* P = 3*2 + 2 + 2*2 + 2 = 14 over 3 ps: [0,5) [5,10) [10,14).
	 * dense1.weight (6) straddles ps 0 and 1, dense2.weight (4) ps 1 and 2. */
	struct model m;
	build(&m, "[model]\ninput = 3\nlayer = dense 2\nlayer = relu\nlayer = dense 2\n");
	cr_assert_eq(m.nparams, 14);
	struct host ps[3] = { { "10.0.0.1", 2222 }, { "ps1.example", 2223 }, { "::1", 2224 } };
	char *out = print_plan(&m, 3, ps);
	assert_has(out, "; sharding: 14 parameters (56 B) over 3 ps tasks");
	assert_has(out, "\n;       dense1.weight[0:5)\n");
	assert_has(out, "\n;       dense1.weight[5:6) dense1.bias[0:2) dense2.weight[0:2)\n");
	assert_has(out, "\n;       dense2.weight[2:4) dense2.bias[0:2)\n");
	assert_has(out, "10.0.0.1:2222");
	assert_has(out, "ps1.example:2223");
	assert_has(out, "[::1]:2224");
	assert_has(out, "[5, 10)");
	/* ps 2: 4 elements, 16 bytes */
	cr_assert(strstr(out, "[10, 14)") != NULL, "%s", out);
	const char *row2 = strstr(out, ";   2 ");
	cr_assert(row2 != NULL, "%s", out);
	char idx[8], host[64], b[16], e[16], human[16];
	size_t n, bytes;
	cr_assert_eq(sscanf(row2, "; %7s %63s %15s %15s %zu %zu (%15[^)])", idx, host, b, e, &n, &bytes, human), 7,
		     "row: %.80s", row2);
	cr_assert_str_eq(b, "[10,");
	cr_assert_str_eq(e, "14)");
	cr_assert_eq(n, 4);
	cr_assert_eq(bytes, 16);
	cr_assert_str_eq(human, "16 B");
	cr_assert_str_eq(idx, "2");
	cr_assert_str_eq(host, "[::1]:2224");
	/* relu has no parameters and must not be listed */
	cr_assert(strstr(out, "relu") == NULL, "%s", out);
	/* every line is a comment for the config reader */
	for (const char *p = out; *p; p = strchr(p, '\n') + 1) {
		cr_assert(strncmp(p, "; ", 2) == 0, "line without \"; \": %.60s", p);
		if (!strchr(p, '\n'))
			break;
	}
	free(out);
}

Test(shard, print_default_mlp_two_ps)
{
	struct model m;
	build(&m, models[0]);
	struct host ps[2] = { { "127.0.0.1", 2222 }, { "127.0.0.1", 2223 } };
	char *out = print_plan(&m, 2, ps);
	assert_has(out, "; sharding: 669706 parameters (2.6 MiB) over 2 ps tasks");
	assert_has(out, "[0, 334853)");
	assert_has(out, "[334853, 669706)");
	assert_has(out, " 334853  1339412 (1.3 MiB)\n");
	assert_has(out, "\n;       dense1.weight[0:334853)\n");
	/* ps 1's list wraps before column 100 */
	assert_has(out, "\n;       dense1.weight[334853:401408) dense1.bias[0:512) dense2.weight[0:262144) dense2.bias[0:512)\n"
			";       dense3.weight[0:5120) dense3.bias[0:10)\n");
	free(out);
}

Test(shard, print_without_hosts_and_empty_shards)
{
	struct model m;
	build(&m, models[1]);   /* P = 8 */
	char *out = print_plan(&m, 9, NULL);
	assert_has(out, "over 9 ps tasks");
	assert_has(out, "\n;       dense1.bias[1:2)\n");
	const char *last = strstr(out, ";   8 ");
	cr_assert(last != NULL, "%s", out);
	assert_has(last, "[8, 8)");
	assert_has(last, "\n;       (no parameters)\n");
	cr_assert(strstr(out, ";   0    -  ") != NULL, "%s", out);
	free(out);
}
