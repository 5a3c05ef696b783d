/* GPU discovery and placement. On a machine without a GPU (CI) the
 * discovery must fail with a reason, soft placement must fall back to the
 * CPU, and strict placement must refuse; the checks that need a GPU say
 * that they were skipped instead of passing. */
#include <criterion/criterion.h>

#include "leak.h"

#include "../core/config/config.h"
#include "../core/nn/devices.h"
#include "../core/nn/model.h"
#include "../gpu/arch.h"
#include "../gpu/arena.h"
#include "../gpu/gpu.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
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
		/* The backend refuses exactly the GPUs the rules refuse. */
		char why[320] = "", aerr[320] = "";
		int want = gpu_arch_supported(g.cc_major, g.cc_minor, why, sizeof(why));
		cr_assert_eq(gpu_arch_check(i, aerr, sizeof(aerr)), want, "gpu:%d: %s", i, aerr);
	}
	/* Refused before the runtime sees the ordinal: under compute-sanitizer
	 * a cudaGetDeviceProperties(n) was an API error (invalid device
	 * ordinal), though the test expected the refusal. */
	const int bad[] = { n, n + 7, -1 };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char want[64];
		cr_assert_eq(gpu_query(bad[i], &(struct gpu_info){ 0 }, err, sizeof(err)), -ENODEV,
			     "querying gpu:%d of %d must fail", bad[i], n);
		snprintf(want, sizeof(want), "gpu:%d: no such GPU (%d visible", bad[i], n);
		cr_assert_not_null(strstr(err, want), "message: %s", err);
		cr_assert_eq(gpu_arch_check(bad[i], err, sizeof(err)), -ENODEV, "gpu:%d of %d", bad[i], n);
		cr_assert_not_null(strstr(err, want), "message: %s", err);
	}
}

/* Without a GPU every index is refused with discovery's reason; in every
 * build, GPU or not. */
Test(gpu, query_without_a_gpu_has_a_reason)
{
	char why[256] = "", err[320] = "";
	int n = -1;
	if (gpu_count(&n, why, sizeof(why)) == 0)
		cr_skip_test("a GPU is present (%d visible): query_every_device checks the refusals", n);
	const int idx[] = { 0, 1, -1 };
	for (size_t i = 0; i < sizeof(idx) / sizeof(idx[0]); i++) {
		char want[32];
		cr_assert_eq(gpu_query(idx[i], &(struct gpu_info){ 0 }, err, sizeof(err)), -ENODEV);
		snprintf(want, sizeof(want), "gpu:%d: ", idx[i]);
		cr_assert(strstr(err, want) || strstr(err, "without CUDA"), "message: %s", err);
		cr_assert(strstr(err, why), "message %s lacks discovery's reason %s", err, why);
	}
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

/* The compute-capability rules, with a stubbed capability: these run in
 * every build, GPU or not. Rows over the default targets of the Makefile
 * (written out here, so CUDA_ARCHS=... builds test the same rows) and over
 * other lists that exercise each rule. */
#define DEFAULT_TARGETS "sm_80 sm_90 compute_90"

static const struct arch_case {
	const char *targets;
	int major, minor;
	int want;              /* 0 or -ENODEV */
	const char *why;       /* what the refusal must say, whole or NULL */
} arch_cases[] = {
	/* Turing and Pascal: no SASS of their major, older than the PTX. */
	{ DEFAULT_TARGETS, 7, 5, -ENODEV,
	  "compute capability 7.5; this pstrain carries sm_80, sm_90 and compute_90 PTX: "
	  "rebuild with make CUDA_ARCHS=\"75 80 90\" or use a newer GPU" },
	{ DEFAULT_TARGETS, 6, 1, -ENODEV,
	  "compute capability 6.1; this pstrain carries sm_80, sm_90 and compute_90 PTX: "
	  "rebuild with make CUDA_ARCHS=\"61 80 90\" or use a newer GPU" },
	/* SASS sm_80 runs on every 8.x; sm_90 on 9.0. */
	{ DEFAULT_TARGETS, 8, 0, 0, NULL },
	{ DEFAULT_TARGETS, 8, 6, 0, NULL },
	{ DEFAULT_TARGETS, 8, 9, 0, NULL },
	{ DEFAULT_TARGETS, 9, 0, 0, NULL },
	/* Blackwell: only through compute_90's PTX. */
	{ DEFAULT_TARGETS, 10, 0, 0, NULL },
	{ DEFAULT_TARGETS, 12, 0, 0, NULL },
	/* Without PTX a newer major is refused, and no "newer GPU" helps. */
	{ "sm_80 sm_90", 10, 0, -ENODEV,
	  "compute capability 10.0; this pstrain carries sm_80 and sm_90: "
	  "rebuild with make CUDA_ARCHS=\"80 90 100\"" },
	{ "sm_80 sm_90", 9, 0, 0, NULL },
	/* SASS needs minor >= the target's. */
	{ "sm_86", 8, 0, -ENODEV,
	  "compute capability 8.0; this pstrain carries sm_86: rebuild with make CUDA_ARCHS=\"80 86\" "
	  "or use a newer GPU" },
	{ "sm_86", 8, 9, 0, NULL },
	/* PTX alone, and PTX older than the GPU. */
	{ "compute_75", 12, 1, 0, NULL },
	{ "compute_80", 7, 5, -ENODEV,
	  "compute capability 7.5; this pstrain carries compute_80 PTX: rebuild with "
	  "make CUDA_ARCHS=\"75\" or use a newer GPU" },
	/* Architecture-specific code runs on that capability only. */
	{ "sm_90a compute_90a", 9, 0, 0, NULL },
	{ "sm_90a compute_90a", 10, 0, -ENODEV, NULL },
	{ "sm_100f", 10, 3, 0, NULL },
	{ "sm_100f", 11, 0, -ENODEV, NULL },
	{ "sm_120", 12, 1, 0, NULL },
	{ "sm_120", 10, 0, -ENODEV, NULL },
};

Test(gpu, arch_rules_table)
{
	for (size_t i = 0; i < sizeof(arch_cases) / sizeof(arch_cases[0]); i++) {
		const struct arch_case *c = &arch_cases[i];
		char why[320] = "";
		int r = gpu_arch_runs(c->targets, c->major, c->minor, why, sizeof(why));
		cr_expect_eq(r, c->want, "\"%s\" on %d.%d: got %d (%s), want %d", c->targets, c->major,
			     c->minor, r, why, c->want);
		if (r != -ENODEV)
			continue;
		/* Every refusal names the capability and what is carried. */
		char cc[32];
		snprintf(cc, sizeof(cc), "compute capability %d.%d;", c->major, c->minor);
		cr_expect_not_null(strstr(why, cc), "\"%s\" on %d.%d: %s", c->targets, c->major,
				   c->minor, why);
		cr_expect_not_null(strstr(why, "carries"), "%s", why);
		if (c->why)
			cr_expect_str_eq(why, c->why, "\"%s\" on %d.%d", c->targets, c->major, c->minor);
	}
}

static const struct {
	const char *targets;
	const char *quoted;   /* the word the error must quote */
} bad_targets[] = {
	{ "", NULL },
	{ "   ", NULL },
	{ "sm_8", "\"sm_8\"" },
	{ "sm_80x", "\"sm_80x\"" },
	{ "sm_80 gfx90a", "\"gfx90a\"" },
	{ "compute_", "\"compute_\"" },
	{ "sm_1000", "\"sm_1000\"" },
	{ "sm_08", "\"sm_08\"" },
	{ "sm_80aa", "\"sm_80aa\"" },
	{ "80", "\"80\"" },
	{ "sm_80 sm_80 sm_80 sm_80 sm_80 sm_80 sm_80 sm_80 sm_80 sm_80 sm_80 sm_80 sm_80 sm_80 "
	  "sm_80 sm_80 sm_80", "more than 16" },
};

Test(gpu, arch_bad_target_lists)
{
	for (size_t i = 0; i < sizeof(bad_targets) / sizeof(bad_targets[0]); i++) {
		char why[320] = "";
		int r = gpu_arch_runs(bad_targets[i].targets, 8, 0, why, sizeof(why));
		cr_expect_eq(r, -EINVAL, "\"%s\": got %d (%s)", bad_targets[i].targets, r, why);
		cr_expect_gt(strlen(why), 10, "\"%s\": no reason", bad_targets[i].targets);
		if (bad_targets[i].quoted)
			cr_expect_not_null(strstr(why, bad_targets[i].quoted), "\"%s\": %s",
					   bad_targets[i].targets, why);
	}
}

/* A short buffer truncates the reason; it never overflows. */
Test(gpu, arch_reason_truncates)
{
	char why[24];
	memset(why, 'x', sizeof(why));
	cr_assert_eq(gpu_arch_runs(DEFAULT_TARGETS, 7, 5, why, 16), -ENODEV);
	cr_assert_eq(strlen(why), 15);
	cr_assert_eq(why[16], 'x');
}

/* This build's own list (the Makefile's CUDA_ARCHS) parses, is what
 * gpu_arch_supported() applies, and is what gpu_build_info() prints in a
 * CUDA build, so the two cannot disagree. */
Test(gpu, arch_build_targets_are_the_checked_ones)
{
	const char *t = gpu_arch_targets();
	char why[320], why2[320];
	for (int major = 3; major <= 13; major++)
		for (int minor = 0; minor <= 9; minor++) {
			int r = gpu_arch_supported(major, minor, why, sizeof(why));
			cr_assert(r == 0 || r == -ENODEV, "%s on %d.%d: %d (%s)", t, major, minor, r, why);
			cr_assert_eq(r, gpu_arch_runs(t, major, minor, why2, sizeof(why2)));
		}
	const char *info = gpu_build_info();
	if (strncmp(info, "CUDA ", 5) == 0)
		cr_assert_not_null(strstr(info, t), "gpu_build_info() \"%s\" lacks the targets \"%s\"",
				   info, t);
}

/* Without CUDA the check refuses every device with a reason. */
Test(gpu, arch_check_without_a_gpu)
{
	int n;
	char why[256], err[320] = "";
	if (gpu_count(&n, why, sizeof(why)) == 0)
		cr_skip_test("a GPU is present: query_every_device checks gpu_arch_check");
	cr_assert_eq(gpu_arch_check(0, err, sizeof(err)), -ENODEV);
	cr_assert_gt(strlen(err), 10, "no reason: %s", err);
}

/* Every backend dlopens and dlcloses cuBLAS; it must stay mapped after the
 * last dlclose (RTLD_NODELETE) so it is loaded once per process. Needs only
 * a loadable libcublas, not a GPU. */
Test(gpu, cublas_stays_loaded)
{
	char soname[64], err[320] = "";
	for (int round = 0; round < 2; round++) {
		int r = gpu_cublas_kept(soname, sizeof(soname), err, sizeof(err));
		if (r == -ENODEV || r == -ENOENT)
			cr_skip_test("needs a loadable cuBLAS: %s", err);
		cr_assert_eq(r, 0, "round %d: %s", round, err);
		cr_assert_not_null(strstr(soname, "libcublas.so."), "soname %s", soname);
	}
}

/* The arena's bookkeeping on host memory: struct arena_mem stands in for
 * cudaMalloc/cudaFree and records every call. Under ASan the leak check
 * at the end of each test also proves arena_free returned everything. */
#define HOST_MAX 256

struct host_mem {
	int gets, puts;
	int fail_at;              /* the get that fails (-ENOMEM), -1 for none */
	size_t size[HOST_MAX];    /* of each get */
	void *ptr[HOST_MAX];
	void *put[HOST_MAX];
};

static int host_get(void *ctx, int device, void **p, size_t bytes, char *err, size_t errlen)
{
	struct host_mem *h = ctx;
	cr_assert_lt(h->gets, HOST_MAX);
	if (h->gets == h->fail_at) {
		h->fail_at = -1;
		snprintf(err, errlen, "gpu:%d: cudaMalloc of %zu bytes failed: test", device, bytes);
		return -ENOMEM;
	}
	*p = malloc(bytes);
	cr_assert_not_null(*p);
	h->size[h->gets] = bytes;
	h->ptr[h->gets++] = *p;
	return 0;
}

static void host_put(void *ctx, int device, void *p)
{
	struct host_mem *h = ctx;
	(void)device;
	cr_assert_lt(h->puts, HOST_MAX);
	h->put[h->puts++] = p;
	free(p);
}

static void host_init(struct host_mem *h, struct arena_mem *m)
{
	memset(h, 0, sizeof(*h));
	h->fail_at = -1;
	*m = (struct arena_mem){ host_get, host_put, h };
}

static size_t aligned(size_t n)
{
	return (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
}

/* Every buffer is its own allocation of exactly the bytes asked for (1 for
 * 0), counted against the cap as the arena counts it, and each is freed. */
Test(gpu, arena_exact_one_allocation_per_buffer)
{
	struct host_mem h;
	struct arena_mem m;
	struct gpu_arena a;
	char err[320] = "";
	static const size_t sizes[] = { 100, 0, 256, 1000, 4096, 3 };
	const size_t n = sizeof(sizes) / sizeof(sizes[0]);
	host_init(&h, &m);
	cr_assert_eq(arena_open(&a, &m, 2, ((size_t)1 << 20) + 7, 0, 1, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(h.gets, 0, "an exact arena reserves nothing at open");
	cr_assert_eq(a.cap, (size_t)1 << 20);
	void *p[6];
	size_t handed = 0;
	for (size_t i = 0; i < n; i++) {
		cr_assert_eq(arena_alloc(&a, &p[i], sizes[i], err, sizeof(err)), 0, "%s", err);
		handed += aligned(sizes[i] ? sizes[i] : 1);
		cr_assert_eq(h.gets, (int)i + 1, "buffer %zu: not its own allocation", i);
		cr_assert_eq(h.size[i], sizes[i] ? sizes[i] : 1, "buffer %zu: allocated %zu bytes for %zu",
			     i, h.size[i], sizes[i]);
		cr_assert_eq(p[i], h.ptr[i]);
		cr_assert_eq(a.handed, handed);
		cr_assert_eq(a.wanted, handed);
	}
	arena_free(&a);
	cr_assert_eq(h.puts, (int)n, "%d of %zu buffers freed", h.puts, n);
	for (size_t i = 0; i < n; i++) {
		int found = 0;
		for (size_t j = 0; j < n; j++)
			found |= h.put[j] == p[i];
		cr_assert(found, "buffer %zu was not freed", i);
	}
	cr_assert_null(a.buf);
	cr_assert_eq(a.nbuf, 0);
	cr_assert_eq(a.handed, 0);
}

/* More buffers than the first list of them holds (64): the list grows and
 * every buffer is still freed. */
Test(gpu, arena_exact_many_buffers)
{
	struct host_mem h;
	struct arena_mem m;
	struct gpu_arena a;
	char err[320] = "";
	host_init(&h, &m);
	cr_assert_eq(arena_open(&a, &m, 0, (size_t)1 << 30, 0, 1, err, sizeof(err)), 0, "%s", err);
	for (int i = 0; i < 200; i++) {
		void *p;
		cr_assert_eq(arena_alloc(&a, &p, (size_t)i * 8, err, sizeof(err)), 0, "%d: %s", i, err);
		cr_assert_eq(p, h.ptr[i]);
	}
	cr_assert_eq(a.nbuf, 200);
	arena_free(&a);
	cr_assert_eq(h.puts, 200);
}

/* Without growth, the exact arena accepts and refuses the same requests as
 * the one-chunk arena, with the same text and the same handed/wanted. */
Test(gpu, arena_exact_refuses_like_the_arena)
{
	static const size_t sizes[] = { 1000, 2000, 1500, 512, 1, 600, 0 };
	struct host_mem h[2];
	struct arena_mem m[2];
	struct gpu_arena a[2];
	char err[2][320];
	for (int e = 0; e < 2; e++) {
		host_init(&h[e], &m[e]);
		cr_assert_eq(arena_open(&a[e], &m[e], 1, 4096, 0, e, err[e], sizeof(err[e])), 0, "%s", err[e]);
	}
	cr_assert_eq(h[0].gets, 1, "the arena takes its cap at open");
	cr_assert_eq(h[0].size[0], 4096);
	int refused = 0;
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		int r[2];
		void *p[2];
		for (int e = 0; e < 2; e++) {
			err[e][0] = 0;
			r[e] = arena_alloc(&a[e], &p[e], sizes[i], err[e], sizeof(err[e]));
		}
		cr_assert_eq(r[1], r[0], "request %zu (%zu bytes): exact %d, arena %d (%s)", i, sizes[i],
			     r[1], r[0], err[1]);
		cr_assert_str_eq(err[1], err[0], "request %zu", i);
		cr_assert_eq(a[1].handed, a[0].handed, "request %zu", i);
		cr_assert_eq(a[1].wanted, a[0].wanted, "request %zu", i);
		if (r[0]) {
			refused++;
			cr_assert_eq(r[0], -ENOMEM);
			cr_assert_null(p[1]);
			char want[160];
			snprintf(want, sizeof(want), "gpu:1: needs at least %zu bytes", a[0].wanted);
			cr_assert_not_null(strstr(err[1], want), "%s", err[1]);
			cr_assert_not_null(strstr(err[1], "memory_fraction allows 4096"), "%s", err[1]);
		}
	}
	cr_assert_eq(refused, 2, "the table should refuse 1500 and 600 bytes");
	cr_assert_gt(a[0].wanted, a[0].handed, "refusals must count in wanted");
	for (int e = 0; e < 2; e++) {
		arena_free(&a[e]);
		cr_assert_eq(h[e].puts, h[e].gets);
	}
}

/* A failed allocation in exact mode passes the reason on, names the mode,
 * hands out nothing, and leaves the arena usable and freeable. */
Test(gpu, arena_exact_allocation_failure)
{
	struct host_mem h;
	struct arena_mem m;
	struct gpu_arena a;
	char err[320] = "";
	void *p, *q = (void *)1;
	host_init(&h, &m);
	h.fail_at = 1;
	cr_assert_eq(arena_open(&a, &m, 0, 1 << 20, 1, 1, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(arena_alloc(&a, &p, 300, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(arena_alloc(&a, &q, 700, err, sizeof(err)), -ENOMEM);
	cr_assert_null(q);
	cr_assert_not_null(strstr(err, "cudaMalloc of 700 bytes failed: test"), "%s", err);
	cr_assert_not_null(strstr(err, ARENA_EXACT_ENV "=1"), "%s", err);
	cr_assert_eq(a.handed, aligned(300));
	cr_assert_eq(a.wanted, aligned(300) + aligned(700));
	cr_assert_eq(arena_alloc(&a, &q, 700, err, sizeof(err)), 0, "%s", err);
	arena_free(&a);
	cr_assert_eq(h.puts, 2);
}

/* Growth without exact: 64 MiB chunks on demand up to the cap, bump
 * allocation inside them, and the refusal once the cap is reached. */
Test(gpu, arena_growth_takes_chunks_up_to_the_cap)
{
	struct host_mem h;
	struct arena_mem m;
	struct gpu_arena a;
	char err[320] = "";
	void *p, *q;
	const size_t MiB = (size_t)1 << 20;
	host_init(&h, &m);
	cr_assert_eq(arena_open(&a, &m, 0, 200 * MiB, 1, 0, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(h.gets, 0);
	cr_assert_eq(arena_alloc(&a, &p, 10 * MiB, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(arena_alloc(&a, &q, 1000, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(h.gets, 1);
	cr_assert_eq(h.size[0], ARENA_CHUNK);
	cr_assert_eq((char *)q, (char *)p + 10 * MiB, "bump allocation inside the chunk");
	cr_assert_eq(arena_alloc(&a, &p, 60 * MiB, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(h.gets, 2, "60 MiB does not fit the first chunk's rest");
	cr_assert_eq(h.size[1], ARENA_CHUNK);
	cr_assert_eq(arena_alloc(&a, &p, 100 * MiB, err, sizeof(err)), -ENOMEM);
	cr_assert_not_null(strstr(err, "memory_fraction allows 209715200"), "%s", err);
	cr_assert_eq(arena_alloc(&a, &p, 72 * MiB, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(h.size[2], 72 * MiB, "the last chunk is what the cap leaves");
	arena_free(&a);
	cr_assert_eq(h.puts, 3);
}

/* A chunk that cannot be had says what to change. */
Test(gpu, arena_chunk_failure_has_a_hint)
{
	struct host_mem h;
	struct arena_mem m;
	struct gpu_arena a;
	char err[320] = "";
	host_init(&h, &m);
	h.fail_at = 0;
	cr_assert_eq(arena_open(&a, &m, 3, 1 << 20, 0, 0, err, sizeof(err)), -ENOMEM);
	cr_assert_not_null(strstr(err, "gpu:3: cudaMalloc of 1048576 bytes failed: test; lower [gpu] "
				       "memory_fraction or set allow_growth = true"), "%s", err);
	arena_free(&a);
	cr_assert_eq(h.puts, 0);
	struct gpu_arena zero = { 0 };
	arena_free(&zero);
}

static const struct {
	const char *value;
	int want, exact;
} exact_values[] = {
	{ NULL, 0, 0 },
	{ "", 0, 0 },
	{ "0", 0, 0 },
	{ "1", 0, 1 },
	{ "yes", -EINVAL, 0 },
	{ "2", -EINVAL, 0 },
	{ " 1", -EINVAL, 0 },
	{ "1 ", -EINVAL, 0 },
	{ "01", -EINVAL, 0 },
};

Test(gpu, arena_exact_env_values)
{
	for (size_t i = 0; i < sizeof(exact_values) / sizeof(exact_values[0]); i++) {
		char err[160] = "";
		int exact = -1;
		const char *v = exact_values[i].value;
		int r = arena_exact_parse(v, &exact, err, sizeof(err));
		cr_expect_eq(r, exact_values[i].want, "\"%s\": got %d", v ? v : "(unset)", r);
		cr_expect_eq(exact, exact_values[i].exact, "\"%s\"", v ? v : "(unset)");
		if (r) {
			char quoted[64];
			snprintf(quoted, sizeof(quoted), ARENA_EXACT_ENV "=\"%s\"", v);
			cr_expect_not_null(strstr(err, quoted), "%s", err);
		}
	}
}

/* arena_room is what one more buffer can really get: with growth, what
 * the cap leaves after whole chunks (their unused tails are not there to
 * be had) or the last chunk's tail; without, the tail. A set that fits
 * the room is taken, one byte more is refused, so devices_set_data can
 * choose staging instead of failing. */
Test(gpu, arena_room_is_what_one_buffer_can_get)
{
	const size_t MiB = (size_t)1 << 20;
	for (int growth = 0; growth < 2; growth++) {
		struct host_mem h;
		struct arena_mem m;
		struct gpu_arena a;
		char err[320] = "";
		void *p;
		host_init(&h, &m);
		cr_assert_eq(arena_open(&a, &m, 0, 300 * MiB, growth, 0, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(arena_alloc(&a, &p, 10 * MiB, err, sizeof(err)), 0, "%s", err);
		size_t want = growth ? 300 * MiB - ARENA_CHUNK : 290 * MiB;
		cr_expect_eq(arena_room(&a), want, "growth %d: room %zu, want %zu", growth, arena_room(&a), want);
		cr_assert_eq(arena_alloc(&a, &p, arena_room(&a) + 1, err, sizeof(err)), -ENOMEM,
			     "growth %d: one byte past the room was handed out", growth);
		cr_assert_eq(arena_alloc(&a, &p, arena_room(&a), err, sizeof(err)), 0, "growth %d: %s",
			     growth, err);
		arena_free(&a);
	}
}
