/* CPU reference layers: dense through OpenBLAS sgemm, elementwise
 * activations as plain loops, and the fused softmax + cross-entropy.
 * Allocation, zeroing of gradients and the order of layers are left to
 * the model code; nothing here allocates. */
#include "layers.h"
#include "rng.h"

#include <cblas.h>
#include <math.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

/* Elementwise loops get AVX2 and AVX-512 copies picked at load time, so
 * the binary stays portable to any x86-64 while using the wide units. */
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

VECTOR_CLONES
void dense_forward_rows(float *out, const float *inp, const float *weight, const float *bias, int B,
			int C, int OC, int o0, int o1)
{
	// out (B, OC), inp (B, C), weight (OC, C), bias (OC); columns [o0, o1)
	if (B <= 0 || o0 < 0 || o1 > OC || o0 >= o1)
		return;
	float beta = 0.0f;
	if (bias) {
		/* Seeding out with the bias and letting sgemm add to it (beta = 1)
		 * costs one pass over out instead of a second pass after the
		 * product. */
		for (int b = 0; b < B; b++) {
			float *out_b = out + (size_t)b * OC;   // (OC)
			for (int o = o0; o < o1; o++)
				out_b[o] = bias[o];
		}
		beta = 1.0f;
	}
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, o1 - o0, C,
		    1.0f, inp, C, weight + (size_t)o0 * C, C, beta, out + o0, OC);
}

void dense_forward(float *out, const float *inp, const float *weight,
		   const float *bias, int B, int C, int OC)
{
	// out (B, OC), inp (B, C), weight (OC, C), bias (OC)
	dense_forward_rows(out, inp, weight, bias, B, C, OC, 0, OC);
}

VECTOR_CLONES
void dense_backward(float *dinp, float *dweight, float *dbias,
		    const float *dout, const float *inp, const float *weight,
		    int B, int C, int OC)
{
	// dinp (B, C), dweight (OC, C), dbias (OC), dout (B, OC),
	// inp (B, C), weight (OC, C)
	if (B <= 0 || C <= 0 || OC <= 0)
		return;
	/* beta = 0: BLAS writes the result without reading dinp, so stale
	 * NaNs in it cannot leak through (the contract says "set"). */
	if (dinp)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, C, OC,
			    1.0f, dout, OC, weight, C, 0.0f, dinp, C);
	if (dweight)
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, B,
			    1.0f, dout, OC, inp, C, 1.0f, dweight, C);
	if (dbias) {
		/* Row by row, so both dout and dbias are walked contiguously;
		 * the column-wise order would stride through dout by OC. */
		for (int b = 0; b < B; b++) {
			const float *dout_b = dout + (size_t)b * OC;   // (OC)
			for (int o = 0; o < OC; o++)
				dbias[o] += dout_b[o];
		}
	}
}

void dense_wgrad_rows(float *dweight, const float *dout, const float *inp, int B, int C, int OC,
		      int o0, int o1)
{
	// dweight (OC, C): rows [o0, o1) += dout[:, o0:o1]^T inp
	if (B <= 0 || C <= 0 || o0 < 0 || o1 > OC || o0 >= o1)
		return;
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, C, B,
		    1.0f, dout + o0, OC, inp, C, 1.0f, dweight + (size_t)o0 * C, C);
}

VECTOR_CLONES
void relu_forward(float *out, const float *inp, size_t N)
{
	// out (N), inp (N)
	/* out = x < 0 ? 0 : x, so a NaN stays NaN (as in PyTorch) and a
	 * diverging run shows in the loss instead of hiding behind the
	 * activation. Done as a bit mask because GCC compiles the plain
	 * select to a branch that mispredicts on half the elements (about
	 * 1 ms per 256x512 batch, more than a tenth of a training step); the
	 * mask is branch-free at -O2 and vectorizes where vectorization is on. */
	for (size_t i = 0; i < N; i++) {
		float x = inp[i];
		uint32_t bits, keep = (uint32_t)(x < 0.0f) - 1u;   // 0 or all ones
		memcpy(&bits, &x, sizeof(bits));
		bits &= keep;
		memcpy(&out[i], &bits, sizeof(bits));
	}
}

VECTOR_CLONES
void relu_backward(float *dinp, const float *dout, const float *out, size_t N)
{
	// dinp (N), dout (N), out (N)
	/* out > 0 exactly where inp > 0; the derivative at 0 is taken as 0.
	 * dout is loaded unconditionally so the compiler can turn the select
	 * into a mask instead of a branch that mispredicts on half the
	 * elements. */
	for (size_t i = 0; i < N; i++) {
		float d = dout[i];
		dinp[i] = out[i] > 0.0f ? d : 0.0f;
	}
}

void tanh_forward(float *out, const float *inp, size_t N)
{
	// out (N), inp (N)
	for (size_t i = 0; i < N; i++)
		out[i] = tanhf(inp[i]);
}

void tanh_backward(float *dinp, const float *dout, const float *out, size_t N)
{
	// dinp (N), dout (N), out (N)
	for (size_t i = 0; i < N; i++)
		dinp[i] = dout[i] * (1.0f - out[i] * out[i]);
}

void sigmoid_forward(float *out, const float *inp, size_t N)
{
	// out (N), inp (N)
	/* exp is only ever taken of -|x|, so it never overflows, and for
	 * x < 0 the result keeps its relative precision down to denormals
	 * instead of being 1 - (something close to 1). */
	for (size_t i = 0; i < N; i++) {
		float x = inp[i];
		if (x >= 0.0f) {
			out[i] = 1.0f / (1.0f + expf(-x));
		} else {
			float e = expf(x);
			out[i] = e / (1.0f + e);
		}
	}
}

void sigmoid_backward(float *dinp, const float *dout, const float *out, size_t N)
{
	// dinp (N), dout (N), out (N)
	for (size_t i = 0; i < N; i++)
		dinp[i] = dout[i] * out[i] * (1.0f - out[i]);
}

/* Element i's mask: the top 32 bits of a hash of (key, i) against p scaled
 * to 2^32, so p has 2^-32 resolution and the mask costs one hash. */
static uint32_t dropout_threshold(float p)
{
	double t = (double)p * 4294967296.0;
	return t >= 4294967295.0 ? 0xffffffffu : (uint32_t)t;
}

void dropout_forward(float *out, const float *inp, float p, uint64_t key, size_t N)
{
	// out (N), inp (N)
	if (p == 0.0f) {
		if (out != inp)
			memcpy(out, inp, N * sizeof(float));
		return;
	}
	uint32_t thr = dropout_threshold(p);
	float scale = 1.0f / (1.0f - p);
	for (size_t i = 0; i < N; i++) {
		uint32_t u = (uint32_t)(rng_hash(key, RNG_DROPOUT, i) >> 32);
		out[i] = u >= thr ? inp[i] * scale : 0.0f;
	}
}

uint64_t dropout_layer_key(uint64_t step_key, int layer)
{
	return rng_hash(step_key, RNG_DROPOUT, (uint64_t)layer);
}

void dropout_backward(float *dinp, const float *dout, float p, uint64_t key, size_t N)
{
	// dinp (N), dout (N)
	uint32_t thr = dropout_threshold(p);
	float scale = 1.0f / (1.0f - p);
	for (size_t i = 0; i < N; i++) {
		uint32_t u = (uint32_t)(rng_hash(key, RNG_DROPOUT, i) >> 32);
		dinp[i] = u >= thr ? dout[i] * scale : 0.0f;
	}
}

double softmax_xent_forward(float *probs, int *correct, const float *logits,
			    const int32_t *labels, int B, int C)
{
	// probs (B, C), logits (B, C), labels (B)
	double loss = 0.0;
	int ncorrect = 0;
	for (int b = 0; b < B; b++) {
		const float *x = logits + (size_t)b * C;   // (C)
		float *p = probs + (size_t)b * C;          // (C)
		int32_t label = labels[b];

		/* First maximum wins ties, like torch.argmax. */
		float maxv = x[0];
		int argmax = 0;
		for (int i = 1; i < C; i++) {
			if (x[i] > maxv) {
				maxv = x[i];
				argmax = i;
			}
		}
		if (argmax == label)
			ncorrect++;
		/* Read before probs is written, so probs may alias logits. */
		double zlabel = (double)x[label] - (double)maxv;

		/* Each exp(x - max) is in (0, 1] and one of them is 1, so the
		 * sum is in [1, C]: no overflow, and log(sum) is safe. The sum
		 * is kept in double so that log-sum-exp is accurate even for
		 * many classes. */
		double sum = 0.0;
		for (int i = 0; i < C; i++) {
			float e = expf(x[i] - maxv);
			p[i] = e;
			sum += e;
		}
		float inv = (float)(1.0 / sum);
		for (int i = 0; i < C; i++)
			p[i] *= inv;
		loss += log(sum) - zlabel;
	}
	if (correct)
		*correct = ncorrect;
	return loss;
}

void softmax_xent_backward(float *dlogits, const float *probs,
			   const int32_t *labels, int B, int C, float scale)
{
	// dlogits (B, C), probs (B, C), labels (B)
	for (int b = 0; b < B; b++) {
		const float *p = probs + (size_t)b * C;   // (C)
		float *d = dlogits + (size_t)b * C;       // (C)
		/* Read first, so dlogits may alias probs. */
		float plabel = p[labels[b]];
		for (int i = 0; i < C; i++)
			d[i] = p[i] * scale;
		d[labels[b]] = (plabel - 1.0f) * scale;
	}
}

int layers_cpus(void)
{
	/* The CPUs this process may run on (taskset, cgroups cpusets), not
	 * all the machine has: more threads than that only contend. */
	cpu_set_t set;
	int n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
	if (n <= 0) {
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
		n = ncpu > 0 ? (int)ncpu : 1;
	}
	return n;
}

int layers_set_threads(int n)
{
	if (n <= 0)
		n = layers_cpus();
	openblas_set_num_threads(n);
	return n;
}
