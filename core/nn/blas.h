/* Which OpenBLAS kernels the dense layers run on, chosen from what the CPU
 * can do rather than from its model number.
 *
 * Debian 12's OpenBLAS 0.3.21 (DYNAMIC_ARCH) picks its kernels by CPU model
 * in a constructor that runs before main. A core it does not know, such as
 * Sapphire Rapids, gets its SSE3 "Prescott" kernels: 4.4x slower GEMMs on
 * an AVX-512 server with nothing to say why. blas_choose, called once at
 * the start of main, reads CPUID's feature flags (and XGETBV: whether the
 * OS saves the wide registers), re-runs OpenBLAS's dynamic initialization
 * with the best kernels those flags allow when OpenBLAS picked worse, and
 * then checks the kernels in use with a small sgemm against a plain
 * reference, falling back to the generic ones if they compute wrong (or
 * fault). An explicit OPENBLAS_CORETYPE is always respected (and checked).
 * The choice is a value the caller keeps; nothing here is global but
 * OpenBLAS's own state. */
#ifndef PSTRAIN_BLAS_H
#define PSTRAIN_BLAS_H

#include <stdbool.h>
#include <stddef.h>

/* The CPU features that decide between OpenBLAS's x86-64 kernel sets. */
struct cpu_caps {
	bool avx2, fma;
	bool avx512f, avx512dq, avx512bw, avx512vl, avx512bf16;
	bool os_ymm;        /* XCR0: the OS saves the AVX (YMM) state */
	bool os_zmm;        /* XCR0: ... and the AVX-512 (opmask, ZMM) state */
};

/* This CPU's features (all false off x86-64). */
void cpu_caps_read(struct cpu_caps *c);

/* The CPU's model name from CPUID's brand string, e.g. "Intel(R) Xeon(R)
 * Platinum 8481C CPU @ 2.70GHz", or "unknown CPU". */
void cpu_model_name(char *out, size_t outlen);

/* The kernels to switch to on a CPU with caps c when OpenBLAS picked
 * `current` (its corename, e.g. "Prescott"), or NULL to keep them: the
 * best set the features allow (Cooperlake with AVX-512 and BF16, SkylakeX
 * with AVX-512, Haswell with AVX2 and FMA) when it ranks above the current
 * one. *why says which features decided, or why nothing changes. Pure:
 * the table test drives it with stubbed flags and names. */
const char *blas_pick(const struct cpu_caps *c, const char *current, const char **why);

enum blas_how {
	BLAS_OWN_PICK,      /* OpenBLAS's pick was already the best the CPU allows */
	BLAS_FORCED,        /* OPENBLAS_CORETYPE chose them */
	BLAS_UPGRADED,      /* pstrain switched to kernels the CPU's features allow */
	BLAS_FELL_BACK,     /* the kernels in use failed the self-check; generic ones now */
};

struct blas_choice {
	enum blas_how how;
	char core[32];      /* the kernels in use, as OpenBLAS names them */
	char was[32];       /* UPGRADED, FELL_BACK: the kernels before */
	char forced[32];    /* OPENBLAS_CORETYPE as given, "" when unset */
	const char *why;    /* a phrase: which features decided, or what failed */
	int spin;           /* how long an idle helper thread spins before it
			     * sleeps, as 2^spin cycles: BLAS_SPIN, or the
			     * OPENBLAS_THREAD_TIMEOUT given (spin_given); 0
			     * where OpenBLAS has no helper threads */
	int spin_given;
};

/* OpenBLAS's helper threads spin (sched_yield) for 2^28 cycles, about a
 * tenth of a second, after each threaded GEMM before they sleep, so in a
 * step they never sleep: while the layers' own threads (conv, pooling,
 * batchnorm) or a ps beside the worker run, each helper takes a CPU's
 * share from them. The CNN at batch 256 on 2 threads ran 1,447 samples/s
 * so and 1,830 with the helpers asleep (bench/cpu_mlp, AMD EPYC Zen 4).
 * 2^20 cycles (0.3-0.5 ms at 2-3.5 GHz) still spans the microseconds
 * between one layer's GEMMs, so back-to-back GEMMs never pay a wake-up,
 * and it bounds what a helper wastes in any longer gap to half a
 * millisecond. OPENBLAS_THREAD_TIMEOUT, when given, is respected. */
#define BLAS_SPIN 20

/* sgemm in the CBLAS row-major form the layers use; the self-check's
 * subject (cblas_sgemm in use, another function in its test). */
typedef void (*blas_sgemm_fn)(int transa, int transb, int M, int N, int K, float alpha,
			      const float *A, int lda, const float *B, int ldb, float beta, float *C,
			      int ldc);

/* 0 when gemm matches a plain double-precision reference on small odd
 * shapes in every transpose the layers use, with beta 0 and 1; -EIO when
 * it computes wrong; -EILSEQ when it faults with an illegal instruction. */
int blas_check(blas_sgemm_fn gemm);

/* Once, at the start of main, before anything else calls BLAS and while
 * the only other threads are OpenBLAS's idle ones: choose, switch, check,
 * and restart the helper threads with BLAS_SPIN (blas_spin).
 * 0, or -EIO when even the generic kernels compute wrong (then nothing
 * must train: the caller exits with the message blas_describe gives). */
int blas_choose(struct blas_choice *ch);

/* Re-run OpenBLAS's kernel selection as if OPENBLAS_CORETYPE were core
 * (the environment is left as it was). 0, or -ENOENT when this OpenBLAS
 * ended on other kernels than the ones asked for. For blas_choose and the
 * tests, which start from a generic core to see the switch happen. */
int blas_switch(const char *core);

/* Restarts OpenBLAS's helper threads so that an idle one spins 2^log2
 * cycles before it sleeps (4 to 30, as OPENBLAS_THREAD_TIMEOUT; the
 * environment is left as it was, and a child forked later starts its
 * helpers with the same). Only while no BLAS call runs. 0, or -ENOTSUP
 * where this OpenBLAS has no thread server (a serial or OpenMP build). */
int blas_spin(int log2);

/* The kernels in use and why, e.g. "OpenBLAS 0.3.21, Cooperlake kernels
 * (chosen by pstrain: OpenBLAS picked Prescott; this CPU has AVX-512 with
 * BF16)" or ", Haswell kernels (OPENBLAS_CORETYPE=Haswell)". */
void blas_describe(const struct blas_choice *ch, char *out, size_t outlen);

/* The kernels the GEMMs run now, without why: "OpenBLAS 0.3.21 SkylakeX";
 * two processes whose strings differ may round the same GEMM differently. */
void blas_kernels(char *out, size_t outlen);

#endif
