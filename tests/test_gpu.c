/* GPU discovery and placement. On a machine without a GPU (CI) the
 * discovery must fail with a reason, soft placement must fall back to the
 * CPU, and strict placement must refuse; the checks that need a GPU say
 * that they were skipped instead of passing. */
#include <criterion/criterion.h>

#include "leak.h"

#include "../core/config.h"
#include "../core/devices.h"
#include "../core/model.h"
#include "../gpu/gpu.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

TestSuite(gpu, .fini = leak_check);

Test(gpu, missing_gpu_has_a_reason)
{
	char err[256] = "";
	int n = -1;
	int r = gpu_count(&n, err, sizeof(err));
	if (r == 0)
		cr_skip_test("a GPU is present (%d visible)", n);
	cr_assert_eq(r, -ENODEV);
	cr_assert_eq(n, 0);
	cr_assert_gt(strlen(err), 10, "no reason given for the missing GPU");
}

/* Needs a GPU: reported as SKIP (not PASS) by Criterion without one. */
Test(gpu, query_every_device)
{
	char err[256] = "";
	int n = -1;
	if (gpu_count(&n, err, sizeof(err)) < 0) {
		fprintf(stderr, "gpu: SKIPPED the checks that need a GPU (%s)\n", err);
		cr_skip_test("needs a GPU: %s", err);
	}
	cr_assert_gt(n, 0);
	for (int i = 0; i < n; i++) {
		struct gpu_info g;
		cr_assert_eq(gpu_query(i, &g, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(g.index, i);
		cr_assert_gt(strlen(g.name), 0);
		cr_assert_gt(g.total_bytes, (size_t)1 << 28, "gpu:%d reports %zu bytes", i, g.total_bytes);
		cr_assert_geq(g.cc_major, 7);
	}
	cr_assert_neq(gpu_query(n, &(struct gpu_info){ 0 }, err, sizeof(err)), 0,
		      "querying a GPU past the last one must fail");
}

static int placement(const char *ini, char *out, size_t outlen, char *err, size_t errlen)
{
	struct config c;
	cr_assert_eq(config_parse_string(&c, "gpu.ini", ini, err, errlen), 0, "%s", err);
	struct model m;
	cr_assert_eq(model_build(&m, &c.model, err, errlen), 0, "%s", err);
	FILE *f = fmemopen(out, outlen, "w");
	cr_assert_not_null(f);
	struct devices d;
	int r = devices_open(&d, &c, &m, &c.train.optim, 8, "/job:test", f, err, errlen);
	fclose(f);
	if (r == 0)
		devices_close(&d);
	return r;
}

/* Without a GPU, soft placement trains on the CPU and says why; strict
 * placement refuses with the reason. */
static void no_gpu_here(void)
{
	int n;
	char why[256];
	if (gpu_count(&n, why, sizeof(why)) == 0)
		cr_skip_test("a GPU is present: the no-GPU placement cannot be checked here");
}

Test(gpu, soft_placement_falls_back_to_cpu)
{
	char out[512] = "", err[512] = "";
	no_gpu_here();
	cr_assert_eq(placement("[gpu]\nsoft_placement = true\n", out, sizeof(out), err, sizeof(err)), 0, "%s", err);
	cr_assert_not_null(strstr(out, "training on the CPU"), "placement said: %s", out);
}

Test(gpu, strict_placement_refuses_without_backend)
{
	char out[512] = "", err[512] = "";
	no_gpu_here();
	int r = placement("[gpu]\nsoft_placement = false\n", out, sizeof(out), err, sizeof(err));
	cr_assert_eq(r, -ENODEV);
	cr_assert_not_null(strstr(err, "soft_placement"), "message: %s", err);
	cr_assert_not_null(strstr(err, "gpu.ini"), "message does not name the config: %s", err);
}

Test(gpu, missing_device_index_is_named)
{
	char out[512] = "", err[512] = "";
	int r = placement("[gpu]\ndevices = 63\nsoft_placement = false\n", out, sizeof(out), err, sizeof(err));
	cr_assert_eq(r, -ENODEV);
	int n;
	char why[256];
	if (gpu_count(&n, why, sizeof(why)) == 0)
		cr_assert_not_null(strstr(err, "gpu:63"), "message: %s", err);
	else
		cr_assert_not_null(strstr(err, why), "message %s lacks the reason %s", err, why);
}
