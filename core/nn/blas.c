/* OpenBLAS's kernels chosen from the CPU's features, then checked
 * (blas.h says why). What is left to OpenBLAS: the kernels themselves and
 * its own CPU-model table, which still decides wherever it already picks
 * the best set the features allow. */
#include "blas.h"

#include "../../base/err.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define HAVE_CPUID 1
#endif

/* OpenBLAS (DYNAMIC_ARCH builds) exports these; blas_switch uses them to
 * re-run the selection its constructor ran before main. */
extern void gotoblas_dynamic_init(void);
extern void gotoblas_dynamic_quit(void);
extern char *openblas_get_corename(void);
extern char *openblas_get_config(void);
/* And the pthreads build's thread server (blas_spin): its helpers read
 * their spin at start from what openblas_read_env read. Weak, so that a
 * serial or OpenMP OpenBLAS still links (and blas_spin says so). */
extern void openblas_read_env(void) __attribute__((weak));
extern int blas_thread_init(void) __attribute__((weak));
extern int blas_thread_shutdown_(void) __attribute__((weak));

#ifdef HAVE_CPUID
static uint64_t xcr0_read(void)
{
	uint32_t lo, hi;
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return (uint64_t)hi << 32 | lo;
}
#endif

void cpu_caps_read(struct cpu_caps *c)
{
	memset(c, 0, sizeof(*c));
#ifdef HAVE_CPUID
	unsigned a, b, cx, d;
	if (!__get_cpuid(1, &a, &b, &cx, &d))
		return;
	bool osxsave = cx >> 27 & 1, avx = cx >> 28 & 1;
	c->fma = cx >> 12 & 1;
	/* XCR0 bits 1-2: SSE and YMM state; 5-7: opmask and the two ZMM
	 * halves. Without them the OS would not save the registers across a
	 * context switch, and the kernels would compute garbage. */
	uint64_t xcr0 = osxsave ? xcr0_read() : 0;
	c->os_ymm = avx && (xcr0 & 0x6) == 0x6;
	c->os_zmm = c->os_ymm && (xcr0 & 0xe0) == 0xe0;
	if (__get_cpuid_max(0, NULL) < 7)
		return;
	__cpuid_count(7, 0, a, b, cx, d);
	c->avx2 = b >> 5 & 1;
	c->avx512f = b >> 16 & 1;
	c->avx512dq = b >> 17 & 1;
	c->avx512bw = b >> 30 & 1;
	c->avx512vl = b >> 31 & 1;
	unsigned max_sub = a;
	if (max_sub >= 1) {
		__cpuid_count(7, 1, a, b, cx, d);
		c->avx512bf16 = a >> 5 & 1;
	}
#endif
}

void cpu_model_name(char *out, size_t outlen)
{
	snprintf(out, outlen, "unknown CPU");
#ifdef HAVE_CPUID
	unsigned r[12];
	if (__get_cpuid_max(0x80000000, NULL) < 0x80000004)
		return;
	for (unsigned i = 0; i < 3; i++)
		__get_cpuid(0x80000002 + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
	char brand[49];
	memcpy(brand, r, 48);
	brand[48] = 0;
	const char *s = brand + strspn(brand, " ");
	size_t n = strlen(s);
	while (n && s[n - 1] == ' ')
		n--;
	if (n)
		snprintf(out, outlen, "%.*s", (int)n, s);
#endif
}

/* OpenBLAS's x86-64 kernel sets in the order of what they need; a name not
 * listed (Prescott, Nehalem, Sandybridge, the old AMD cores...) ranks
 * below all of them. SapphireRapids is known to OpenBLAS releases after
 * Debian 12's: where one picks it, nothing here outranks it. */
static const struct {
	const char *name;
	int rank;
} core_ranks[] = {
	{ "Haswell", 1 }, { "Zen", 1 }, { "SkylakeX", 2 }, { "Cooperlake", 3 }, { "SapphireRapids", 4 },
};

static int core_rank(const char *name)
{
	for (size_t i = 0; i < sizeof(core_ranks) / sizeof(core_ranks[0]); i++)
		if (strcasecmp(core_ranks[i].name, name) == 0)
			return core_ranks[i].rank;
	return 0;
}

const char *blas_pick(const struct cpu_caps *c, const char *current, const char **why)
{
	/* SkylakeX's kernels use AVX-512 F, DQ, BW and VL; Haswell's use AVX2
	 * and FMA3. */
	bool avx512 = c->os_zmm && c->avx512f && c->avx512dq && c->avx512bw && c->avx512vl;
	const char *best = NULL;
	if (avx512 && c->avx512bf16) {
		best = "Cooperlake";
		*why = "this CPU has AVX-512 with BF16";
	} else if (avx512) {
		best = "SkylakeX";
		*why = "this CPU has AVX-512";
	} else if (c->os_ymm && c->avx2 && c->fma) {
		best = "Haswell";
		*why = "this CPU has AVX2 and FMA";
	} else {
		*why = "this CPU has neither AVX2 with FMA nor AVX-512";
	}
	return best && core_rank(best) > core_rank(current) ? best : NULL;
}

/* Runs fn with the environment variable name set to value, then puts
 * back what was there (or nothing): OpenBLAS reads its settings only from
 * the environment, and the user's must not be left changed. */
static int env_during(const char *name, const char *value, void (*fn)(void))
{
	const char *prev = getenv(name);
	char *keep = prev ? strdup(prev) : NULL;
	if (prev && !keep)
		return -ENOMEM;
	if (setenv(name, value, 1) < 0) {
		int e = -errno;
		free(keep);
		return e;
	}
	fn();
	if (keep)
		setenv(name, keep, 1);
	else
		unsetenv(name);
	free(keep);
	return 0;
}

static void dynamic_reinit(void)
{
	gotoblas_dynamic_quit();
	gotoblas_dynamic_init();
}

int blas_switch(const char *core)
{
	int r = env_during("OPENBLAS_CORETYPE", core, dynamic_reinit);
	if (r)
		return r;
	return strcasecmp(openblas_get_corename(), core) == 0 ? 0 : -ENOENT;
}

/* Read once here and kept by OpenBLAS for every later start of its
 * helpers (after a fork too), whatever the environment says then. */
static void threads_restart(void)
{
	openblas_read_env();
	blas_thread_shutdown_();
	blas_thread_init();
}

int blas_spin(int log2)
{
	if (!openblas_read_env || !blas_thread_init || !blas_thread_shutdown_)
		return -ENOTSUP;
	if (log2 < 4 || log2 > 30)
		return -EINVAL;
	char want[16];
	snprintf(want, sizeof(want), "%d", log2);
	return env_during("OPENBLAS_THREAD_TIMEOUT", want, threads_restart);
}

/* OPENBLAS_THREAD_TIMEOUT as OpenBLAS applies it (atoi, clamped to
 * 4..30), or 0 where OpenBLAS ignores it (unset, empty, 0, negative, not a
 * number: it keeps its own 2^28 then). */
static int spin_given(void)
{
	const char *s = getenv("OPENBLAS_THREAD_TIMEOUT");
	int v = s ? atoi(s) : 0;
	return v <= 0 ? 0 : v < 4 ? 4 : v > 30 ? 30 : v;
}

/* The self-check's shapes: odd sizes, so that every kernel's edge cases
 * run beside its full tiles, and small enough (M*N*K under OpenBLAS's
 * threading threshold) to run on this thread alone, where a SIGILL can be
 * caught. */
enum { CHECK_M = 37, CHECK_N = 29, CHECK_K = 53 };

/* One sgemm against a double-precision reference; beta 0 over NaN checks
 * that C's old contents are ignored, beta 1 that they are added. */
static int check_one(blas_sgemm_fn gemm, int ta, int tb, float beta, const float *A, const float *B, float *C)
{
	const int M = CHECK_M, N = CHECK_N, K = CHECK_K;
	int lda = ta ? M : K, ldb = tb ? K : N;
	for (int i = 0; i < M * N; i++)
		C[i] = beta == 0 ? NAN : (float)(i % 7) - 3;
	float C0[CHECK_M * CHECK_N];
	memcpy(C0, C, sizeof(C0));
	gemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, C, N);
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double s = 0, mag = 0;
			for (int k = 0; k < K; k++) {
				double a = ta ? A[k * lda + i] : A[i * lda + k];
				double b = tb ? B[j * ldb + k] : B[k * ldb + j];
				s += a * b;
				mag += fabs(a * b);
			}
			double c0 = beta == 0 ? 0 : C0[i * N + j];
			double want = 0.5 * s + beta * c0;
			double tol = 1e-5 * (mag + fabs(c0)) + 1e-6;
			if (!(fabs(C[i * N + j] - want) <= tol))   /* NaN fails too */
				return -EIO;
		}
	return 0;
}

/* The self-check's way back from an illegal instruction: thread-local and
 * set only around the check, since a signal handler can reach nothing
 * else. The only mutable state in this file. */
static _Thread_local sigjmp_buf *check_escape;

static void on_sigill(int sig)
{
	(void)sig;
	if (check_escape)
		siglongjmp(*check_escape, 1);
	signal(SIGILL, SIG_DFL);
	raise(SIGILL);
}

int blas_check(blas_sgemm_fn gemm)
{
	static const int modes[][3] = { { 0, 0, 0 }, { 0, 1, 0 }, { 1, 0, 0 }, { 0, 1, 1 }, { 1, 0, 1 } };
	float A[CHECK_M * CHECK_K], B[CHECK_K * CHECK_N], C[CHECK_M * CHECK_N];
	uint32_t x = 12345;
	for (int i = 0; i < CHECK_M * CHECK_K; i++, x = x * 1664525u + 1013904223u)
		A[i] = (float)(x >> 8) / (1 << 24) * 2 - 1;
	for (int i = 0; i < CHECK_K * CHECK_N; i++, x = x * 1664525u + 1013904223u)
		B[i] = (float)(x >> 8) / (1 << 24) * 2 - 1;

	struct sigaction sa, old;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigill;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGILL, &sa, &old);
	sigjmp_buf escape;
	volatile int r = 0;
	if (sigsetjmp(escape, 1) == 0) {
		check_escape = &escape;
		for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]) && r == 0; m++)
			r = check_one(gemm, modes[m][0], modes[m][1], (float)modes[m][2], A, B, C);
	} else {
		r = -EILSEQ;
	}
	check_escape = NULL;
	sigaction(SIGILL, &old, NULL);
	return r;
}

static void openblas_sgemm(int transa, int transb, int M, int N, int K, float alpha, const float *A, int lda,
			   const float *B, int ldb, float beta, float *C, int ldc)
{
	cblas_sgemm(CblasRowMajor, transa ? CblasTrans : CblasNoTrans, transb ? CblasTrans : CblasNoTrans, M, N, K,
		    alpha, A, lda, B, ldb, beta, C, ldc);
}

/* The generic x86-64 kernels (SSE3): what OpenBLAS falls back to itself. */
#define GENERIC_CORE "Prescott"

int blas_choose(struct blas_choice *ch)
{
	memset(ch, 0, sizeof(*ch));
	snprintf(ch->core, sizeof(ch->core), "%s", openblas_get_corename());
	const char *forced = getenv("OPENBLAS_CORETYPE");
	if (forced && *forced) {
		ch->how = BLAS_FORCED;
		/* From the environment: shown filtered, never raw. */
		err_shown(ch->forced, sizeof(ch->forced), forced, SIZE_MAX);
	} else {
		struct cpu_caps caps;
		cpu_caps_read(&caps);
		const char *to = blas_pick(&caps, ch->core, &ch->why);
		/* Keep a switch only where this OpenBLAS ended on better kernels
		 * than its own pick (it may know fewer names than the table). */
		if (to && (blas_switch(to) == 0 || core_rank(openblas_get_corename()) > core_rank(ch->core))) {
			ch->how = BLAS_UPGRADED;
			snprintf(ch->was, sizeof(ch->was), "%s", ch->core);
			snprintf(ch->core, sizeof(ch->core), "%s", openblas_get_corename());
		} else if (to) {
			blas_switch(ch->core);
		}
	}
	ch->spin = spin_given();
	ch->spin_given = ch->spin > 0;
	if (!ch->spin_given)   /* 0: no thread server, no helpers to spin */
		ch->spin = blas_spin(BLAS_SPIN) == 0 ? BLAS_SPIN : 0;
	int r = blas_check(openblas_sgemm);
	if (r == 0)
		return 0;
	ch->why = r == -EILSEQ ? "faulted with an illegal instruction" : "computed a wrong sgemm";
	snprintf(ch->was, sizeof(ch->was), "%s", ch->core);
	ch->how = BLAS_FELL_BACK;
	if (strcasecmp(ch->core, GENERIC_CORE) == 0)
		return -EIO;
	blas_switch(GENERIC_CORE);
	snprintf(ch->core, sizeof(ch->core), "%s", openblas_get_corename());
	return blas_check(openblas_sgemm) == 0 ? 0 : -EIO;
}

void blas_kernels(char *out, size_t outlen)
{
	char name[32] = "?", version[32] = "";
	sscanf(openblas_get_config(), "%31s %31s", name, version);
	snprintf(out, outlen, "%s %s %s", name, version, openblas_get_corename());
}

void blas_describe(const struct blas_choice *ch, char *out, size_t outlen)
{
	/* openblas_get_config() starts "OpenBLAS 0.3.21 NO_LAPACKE ...". */
	char name[32] = "?", version[32] = "", how[160] = "";
	sscanf(openblas_get_config(), "%31s %31s", name, version);
	switch (ch->how) {
	case BLAS_OWN_PICK:
		snprintf(how, sizeof(how), "OpenBLAS's pick; %s", ch->why);
		break;
	case BLAS_FORCED:
		snprintf(how, sizeof(how), "OPENBLAS_CORETYPE=%s", ch->forced);
		break;
	case BLAS_UPGRADED:
		snprintf(how, sizeof(how), "chosen by pstrain: OpenBLAS picked %s; %s", ch->was, ch->why);
		break;
	case BLAS_FELL_BACK:
		snprintf(how, sizeof(how), "%s kernels %s on this CPU%s%s", ch->was, ch->why,
			 ch->forced[0] ? ", OPENBLAS_CORETYPE=" : "", ch->forced);
		break;
	}
	snprintf(out, outlen, "%s %s, %s kernels (%s)", name, version, ch->core, how);
}
