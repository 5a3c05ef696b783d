/* The BLAS kernels chosen from the CPU's features (core/nn/blas.c): the
 * choice as a table over stubbed flags and OpenBLAS core names, the
 * self-check against kernels that compute wrong or fault, and the switch
 * itself, from the generic kernels OpenBLAS 0.3.21 falls back to on a CPU
 * it does not know (Sapphire Rapids) to what this CPU allows. */
#include <criterion/criterion.h>

#include <cblas.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../core/nn/blas.h"

extern char *openblas_get_corename(void);

TestSuite(blas, .timeout = 30);

static const struct cpu_caps NONE = { 0 };
static const struct cpu_caps AVX2 = { .avx2 = 1, .fma = 1, .os_ymm = 1 };
/* Skylake-SP, Cascade Lake: AVX-512 without BF16. */
static const struct cpu_caps AVX512 = { .avx2 = 1, .fma = 1, .avx512f = 1, .avx512dq = 1, .avx512bw = 1,
					.avx512vl = 1, .os_ymm = 1, .os_zmm = 1 };
/* Sapphire Rapids, Zen 4: AVX-512 with BF16. */
static const struct cpu_caps AVX512_BF16 = { .avx2 = 1, .fma = 1, .avx512f = 1, .avx512dq = 1, .avx512bw = 1,
					     .avx512vl = 1, .avx512bf16 = 1, .os_ymm = 1, .os_zmm = 1 };
/* The CPU has AVX-512 but the OS does not save ZMM state (XCR0). */
static const struct cpu_caps AVX512_NO_OS = { .avx2 = 1, .fma = 1, .avx512f = 1, .avx512dq = 1, .avx512bw = 1,
					      .avx512vl = 1, .avx512bf16 = 1, .os_ymm = 1 };
/* AVX-512 F only (Knights Landing): not enough for SkylakeX's kernels. */
static const struct cpu_caps AVX512F_ONLY = { .avx2 = 1, .fma = 1, .avx512f = 1, .os_ymm = 1, .os_zmm = 1 };
static const struct cpu_caps AVX2_NO_FMA = { .avx2 = 1, .os_ymm = 1 };

Test(blas, pick_from_features_not_model)
{
	static const struct {
		const struct cpu_caps *caps;
		const char *current, *want;   /* want NULL: keep current */
		const char *why;              /* a word of the reason given */
	} rows[] = {
		/* OpenBLAS 0.3.21 on Sapphire Rapids: Prescott, 4.4x slower. */
		{ &AVX512_BF16, "Prescott", "Cooperlake", "BF16" },
		{ &AVX512, "Prescott", "SkylakeX", "AVX-512" },
		{ &AVX2, "Prescott", "Haswell", "AVX2" },
		{ &AVX512_BF16, "Sandybridge", "Cooperlake", "BF16" },
		{ &AVX512, "Haswell", "SkylakeX", "AVX-512" },
		{ &AVX512_BF16, "SkylakeX", "Cooperlake", "BF16" },
		{ &AVX2, "Nehalem", "Haswell", "FMA" },
		/* OpenBLAS already picked the best the flags allow (or better). */
		{ &AVX512_BF16, "Cooperlake", NULL, "BF16" },
		{ &AVX512_BF16, "SapphireRapids", NULL, "BF16" },
		{ &AVX512, "SkylakeX", NULL, "AVX-512" },
		{ &AVX512, "skylakex", NULL, "AVX-512" },
		{ &AVX2, "Haswell", NULL, "AVX2" },
		{ &AVX2, "Zen", NULL, "AVX2" },
		/* Never more than the CPU and its OS can run. */
		{ &AVX512_NO_OS, "Prescott", "Haswell", "AVX2" },
		{ &AVX512F_ONLY, "Prescott", "Haswell", "AVX2" },
		{ &AVX2_NO_FMA, "Prescott", NULL, "neither" },
		{ &NONE, "Prescott", NULL, "neither" },
		{ &NONE, "Core2", NULL, "neither" },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		const char *why = NULL;
		const char *got = blas_pick(rows[i].caps, rows[i].current, &why);
		if (rows[i].want)
			cr_expect(got && strcmp(got, rows[i].want) == 0, "row %zu (%s): picked %s, expected %s", i,
				  rows[i].current, got ? got : "nothing", rows[i].want);
		else
			cr_expect_null(got, "row %zu (%s): picked %s, expected to keep it", i, rows[i].current, got);
		cr_expect(why && strstr(why, rows[i].why), "row %zu: reason \"%s\" lacks \"%s\"", i, why ? why : "",
			  rows[i].why);
	}
}

static void openblas_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
			  int ldb, float beta, float *C, int ldc)
{
	cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
		    lda, B, ldb, beta, C, ldc);
}

/* Right everywhere but one element of the transposed-B case. */
static void off_by_a_bit(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
			 int ldb, float beta, float *C, int ldc)
{
	openblas_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
	if (tb)
		C[(M - 1) * ldc + N - 1] += 1e-2f;
}

/* Treats beta 0 as "scale C by 0": NaN in C stays NaN. */
static void beta_zero_reads_c(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
			      const float *B, int ldb, float beta, float *C, int ldc)
{
	for (int i = 0; i < M; i++)
		C[i * ldc] *= beta;
	openblas_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, 1.0f, C, ldc);
}

/* What a kernel built for a wider CPU does on a narrower one. */
static void illegal_instruction(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
				const float *B, int ldb, float beta, float *C, int ldc)
{
	(void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb,
		(void)beta, (void)C, (void)ldc;
	__builtin_trap();
}

Test(blas, self_check_catches_wrong_kernels)
{
	cr_expect_eq(blas_check(openblas_gemm), 0, "OpenBLAS's %s kernels fail the check", openblas_get_corename());
	cr_expect_eq(blas_check(off_by_a_bit), -EIO);
	cr_expect_eq(blas_check(beta_zero_reads_c), -EIO);
	cr_expect_eq(blas_check(illegal_instruction), -EILSEQ);
	/* The SIGILL handler is gone again: the check leaves none behind. */
	struct sigaction sa;
	sigaction(SIGILL, NULL, &sa);
	cr_expect_eq(sa.sa_handler, SIG_DFL);
	cr_expect_eq(blas_check(openblas_gemm), 0, "a good kernel fails after a faulting one");
}

/* As on a CPU OpenBLAS 0.3.21 does not know: it runs its generic SSE3
 * kernels; blas_choose moves to what this CPU's features allow. */
Test(blas, choose_upgrades_a_generic_pick)
{
	struct cpu_caps caps;
	cpu_caps_read(&caps);
	const char *why;
	const char *best = blas_pick(&caps, "Prescott", &why);
	if (!best)
		cr_skip_test("this CPU has no AVX2 with FMA: nothing to upgrade to (%s)", why);
	unsetenv("OPENBLAS_CORETYPE");
	cr_assert_eq(blas_switch("Prescott"), 0, "cannot start from Prescott: %s", openblas_get_corename());
	cr_assert_null(getenv("OPENBLAS_CORETYPE"), "blas_switch left the environment changed");

	struct blas_choice ch;
	cr_assert_eq(blas_choose(&ch), 0);
	cr_expect_eq(ch.how, BLAS_UPGRADED);
	cr_expect_str_eq(ch.was, "Prescott");
	cr_expect_str_eq(openblas_get_corename(), ch.core);
	/* This OpenBLAS may know fewer names than the table (0.3.21 maps a
	 * Cooperlake it cannot run to SkylakeX): at least better kernels. */
	cr_expect(strcmp(ch.core, "Prescott") != 0, "still on Prescott");
	char line[256];
	blas_describe(&ch, line, sizeof(line));
	cr_expect(strstr(line, "chosen by pstrain: OpenBLAS picked Prescott; this CPU has "), "%s", line);
	cr_expect_null(getenv("OPENBLAS_CORETYPE"), "the choice leaked into the environment");

	/* A second call keeps what is now the best. */
	cr_assert_eq(blas_choose(&ch), 0);
	cr_expect_eq(ch.how, BLAS_OWN_PICK);
}

/* An explicit OPENBLAS_CORETYPE is respected even where it is slower. */
Test(blas, choose_respects_a_forced_core)
{
	struct blas_choice ch;
	cr_assert_eq(setenv("OPENBLAS_CORETYPE", "Prescott", 1), 0);
	cr_assert_eq(blas_switch("Prescott"), 0);
	cr_assert_eq(blas_choose(&ch), 0);
	cr_expect_eq(ch.how, BLAS_FORCED);
	cr_expect_str_eq(ch.core, "Prescott");
	char line[256];
	blas_describe(&ch, line, sizeof(line));
	cr_expect(strstr(line, ", Prescott kernels (OPENBLAS_CORETYPE=Prescott)"), "%s", line);
	unsetenv("OPENBLAS_CORETYPE");
}

Test(blas, cpu_model_is_named)
{
	char name[64];
	cpu_model_name(name, sizeof(name));
	cr_expect(name[0] && strlen(name) < sizeof(name), "no CPU model name");
#if defined(__x86_64__)
	cr_expect_neq(strcmp(name, "unknown CPU"), 0, "CPUID's brand string not read");
#endif
}

/* Samples, every 2 ms over window_ms after a threaded GEMM and a pause
 * of after_ms, in which another thread of this process was running or
 * runnable (state R in /proc/self/task/N/stat). A spinning OpenBLAS
 * helper yields but never sleeps, so it stays R whatever else loads the
 * CPUs (CPU time would not do: a yielding thread gets next to none of a
 * busy CPU); a sleeping one is S. */
static int others_running(int after_ms, int window_ms)
{
	enum { N = 384 };
	static float a[N * N], b[N * N], c[N * N];
	for (int i = 0; i < N * N; i++)
		a[i] = b[i] = (float)(i % 7) - 3;
	openblas_set_num_threads(2);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1, a, N, b, N, 0, c, N);
	struct timespec pause = { 0, after_ms * 1000000L }, tick = { 0, 2000000L };
	nanosleep(&pause, NULL);
	long self = (long)syscall(SYS_gettid);
	int seen = 0;
	for (int t = 0; t < window_ms; t += 2) {
		DIR *dir = opendir("/proc/self/task");
		cr_assert_not_null(dir);
		for (struct dirent *e; (e = readdir(dir));) {
			char path[300], buf[512];
			if (e->d_name[0] == '.' || atol(e->d_name) == self)
				continue;
			snprintf(path, sizeof(path), "/proc/self/task/%s/stat", e->d_name);
			FILE *f = fopen(path, "r");
			if (!f)
				continue;   /* ended meanwhile */
			size_t n = fread(buf, 1, sizeof(buf) - 1, f);
			fclose(f);
			buf[n] = 0;
			const char *p = strrchr(buf, ')');   /* the name may hold spaces */
			seen += p && p[1] == ' ' && p[2] == 'R';
		}
		closedir(dir);
		nanosleep(&tick, NULL);
	}
	return seen;
}

/* blas_choose restarts OpenBLAS's helpers with a short spin: after a
 * GEMM they sleep within half a millisecond instead of spinning a tenth
 * of a second (2^28 cycles) and taking CPU time from the layers' own
 * threads or a ps beside the worker. The second half shows the measure
 * can tell: with OpenBLAS's own spin a helper is running in the same
 * window. */
Test(blas, idle_helpers_sleep_between_calls)
{
	unsetenv("OPENBLAS_THREAD_TIMEOUT");
	struct blas_choice ch;
	cr_assert_eq(blas_choose(&ch), 0);
	cr_assert_eq(ch.spin, BLAS_SPIN);
	cr_assert(!ch.spin_given);
	/* On a loaded machine a helper whose spin ran out is still R until it
	 * gets a CPU to notice (milliseconds): a few samples may see it. */
	int asleep = others_running(20, 40);
	cr_expect_leq(asleep, 5, "a helper was running in %d of 20 samples after a GEMM", asleep);

	cr_assert_eq(blas_spin(28), 0);
	int spinning = others_running(0, 40);
	cr_expect_geq(spinning, 15, "a helper was running in only %d of 20 samples right after a GEMM with OpenBLAS's own spin",
		      spinning);
}

/* An OPENBLAS_THREAD_TIMEOUT that OpenBLAS applies is left to it (here
 * 28, its own: a helper still spins after a GEMM), clamped as it clamps
 * it; one it ignores (0, negative, not a number) is not a choice, and
 * pstrain's spin applies. blas_spin leaves the environment as it was. */
Test(blas, a_given_thread_timeout_is_respected)
{
	struct blas_choice ch;
	cr_assert_eq(setenv("OPENBLAS_THREAD_TIMEOUT", "28", 1), 0);
	cr_assert_eq(blas_choose(&ch), 0);
	cr_expect_eq(ch.spin, 28);
	cr_expect(ch.spin_given);
	cr_expect_geq(others_running(0, 40), 15, "the given spin was overridden");
	cr_assert_eq(setenv("OPENBLAS_THREAD_TIMEOUT", "99", 1), 0);
	cr_assert_eq(blas_choose(&ch), 0);
	cr_expect_eq(ch.spin, 30);
	const char *ignored[] = { "0", "-3", "abc", "" };
	for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++) {
		cr_assert_eq(setenv("OPENBLAS_THREAD_TIMEOUT", ignored[i], 1), 0);
		cr_assert_eq(blas_choose(&ch), 0);
		cr_expect_eq(ch.spin, BLAS_SPIN, "OPENBLAS_THREAD_TIMEOUT=%s", ignored[i]);
		cr_expect(!ch.spin_given, "OPENBLAS_THREAD_TIMEOUT=%s", ignored[i]);
		cr_expect_str_eq(getenv("OPENBLAS_THREAD_TIMEOUT"), ignored[i], "blas_spin changed the environment");
	}
	unsetenv("OPENBLAS_THREAD_TIMEOUT");
	cr_assert_eq(blas_spin(12), 0);
	cr_expect_null(getenv("OPENBLAS_THREAD_TIMEOUT"), "blas_spin left the environment changed");
	cr_expect_eq(blas_spin(3), -EINVAL);
}
