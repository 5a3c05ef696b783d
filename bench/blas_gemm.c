/* The MLP training step's GEMMs under two BLAS libraries: OpenBLAS, linked
 * into pstrain, with the kernels pstrain chooses (core/nn/blas.h), against
 * BLIS from Debian (libblis4-pthread, loaded with dlopen so that its
 * symbols never meet OpenBLAS's), which picks its kernels from CPUID
 * features at run time rather than from the CPU's model number. Issue 35
 * asks whether such a BLAS is as fast; this answers it for the work that
 * dominates a CPU step.
 *
 *   build/bench/blas_gemm [--batch B] [--rounds R] [--seconds S] [--threads "1 2"] [--blis PATH]
 *
 * One "step" is the 8 sgemm calls of the 784-512-512-10 MLP (bench/models.h
 * "mlp") at batch B: per dense layer the forward product X W (NN), the
 * weight gradient X^T dY (TN) and the input gradient dY W^T (NT; not for
 * the first layer, as the trainer skips it). Rounds alternate the two
 * libraries; each prints its median steps/s and the ratio. */
#include "../core/nn/blas.h"

#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*cblas_sgemm_t)(int, int, int, int, int, int, float, const float *, int, const float *, int,
			      float, float *, int);
typedef void (*set_threads_t)(int);

struct lib {
	const char *name;
	cblas_sgemm_t gemm;
	set_threads_t threads;
};

static const int dims[] = { 784, 512, 512, 10 };
#define NLAYERS 3

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* buf holds X, W, Y, dY, dW, dX for the widest layer. */
static void step(const struct lib *l, int B, float *buf)
{
	size_t big = (size_t)B * 784 > (size_t)784 * 512 ? (size_t)B * 784 : (size_t)784 * 512;
	float *X = buf, *W = X + big, *Y = W + big, *dY = Y + big, *dW = dY + big, *dX = dW + big;
	for (int i = 0; i < NLAYERS; i++) {
		int in = dims[i], out = dims[i + 1];
		l->gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, out, in, 1, X, in, W, out, 0, Y, out);
	}
	for (int i = NLAYERS - 1; i >= 0; i--) {
		int in = dims[i], out = dims[i + 1];
		l->gemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, B, 1, X, in, dY, out, 0, dW, out);
		if (i > 0)
			l->gemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, in, out, 1, dY, out, W, out, 0, dX, in);
	}
}

static double rate(const struct lib *l, int B, float *buf, double seconds)
{
	for (int i = 0; i < 5; i++)
		step(l, B, buf);
	long n = 0;
	double t0 = now(), t;
	do {
		step(l, B, buf);
		n++;
	} while ((t = now() - t0) < seconds);
	return (double)n / t;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void openblas_threads(int n)
{
	openblas_set_num_threads(n);
}

int main(int argc, char **argv)
{
	int B = 128, rounds = 5;
	double seconds = 1.0;
	const char *threads = "1 2", *blis = "libblis.so.4";
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--batch"))
			B = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--rounds"))
			rounds = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--seconds"))
			seconds = atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--threads"))
			threads = argv[i + 1];
		else if (!strcmp(argv[i], "--blis"))
			blis = argv[i + 1];
		else {
			fprintf(stderr, "blas_gemm: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	if (B < 1 || rounds < 1 || rounds > 99 || seconds <= 0) {
		fprintf(stderr, "blas_gemm: --batch, --rounds (1..99) and --seconds must be positive\n");
		return 2;
	}
	struct blas_choice bc;
	char desc[256], cpu[128];
	if (blas_choose(&bc) < 0)
		return 1;
	blas_describe(&bc, desc, sizeof(desc));
	cpu_model_name(cpu, sizeof(cpu));
	void *h = dlopen(blis, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "blas_gemm: cannot load BLIS (%s): %s (make deps-bench installs libblis4-pthread)\n",
			blis, dlerror());
		return 1;
	}
	struct lib libs[2] = {
		{ "OpenBLAS", (cblas_sgemm_t)cblas_sgemm, openblas_threads },
		{ "BLIS", (cblas_sgemm_t)dlsym(h, "cblas_sgemm"), (set_threads_t)dlsym(h, "bli_thread_set_num_threads") },
	};
	if (!libs[1].gemm || !libs[1].threads) {
		fprintf(stderr, "blas_gemm: %s lacks cblas_sgemm or bli_thread_set_num_threads\n", blis);
		return 1;
	}
	const char *(*arch_name)(int) = (const char *(*)(int))dlsym(h, "bli_arch_string");
	int (*arch_id)(void) = (int (*)(void))dlsym(h, "bli_arch_query_id");
	printf("# CPU: %s\n# OpenBLAS: %s\n# BLIS: %s, %s kernels\n", cpu, desc, blis,
	       arch_name && arch_id ? arch_name(arch_id()) : "(its kernels not named)");
	printf("# the 784-512-512-10 MLP's 8 GEMMs of one training step, batch %d; %d interleaved rounds of %.1f s\n",
	       B, rounds, seconds);
	printf("%-8s %14s %14s %8s\n", "threads", "OpenBLAS st/s", "BLIS st/s", "BLIS/OB");
	size_t big = (size_t)B * 784 > (size_t)784 * 512 ? (size_t)B * 784 : (size_t)784 * 512;
	float *buf = malloc(6 * big * sizeof(float));
	if (!buf)
		return 1;
	for (size_t i = 0; i < 6 * big; i++)
		buf[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
	char list[64];
	snprintf(list, sizeof(list), "%s", threads);
	for (char *t = strtok(list, " ,"); t; t = strtok(NULL, " ,")) {
		int n = atoi(t);
		double r[2][99];
		for (int k = 0; k < rounds; k++)
			for (int j = 0; j < 2; j++) {
				int which = (k % 2) ? 1 - j : j;   /* ABBA: neither always goes first */
				libs[which].threads(n);
				r[which][k] = rate(&libs[which], B, buf, seconds);
			}
		qsort(r[0], (size_t)rounds, sizeof(double), cmp);
		qsort(r[1], (size_t)rounds, sizeof(double), cmp);
		double a = r[0][rounds / 2], b = r[1][rounds / 2];
		printf("%-8d %14.1f %14.1f %7.2fx\n", n, a, b, b / a);
	}
	free(buf);
	dlclose(h);
	return 0;
}
