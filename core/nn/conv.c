/* 2-D convolution on the CPU: im2col over a chunk of samples, then one
 * OpenBLAS sgemm per chunk.
 *
 * The patches of nb samples are unrolled side by side into col
 * (C*K*K, nb*OH*OW), so the convolution of the whole chunk is one product
 * weight (OC, C*K*K) @ col into tmp (OC, nb*OH*OW), which is then scattered
 * into the NCHW output with the bias (with one sample per chunk the product
 * is written straight into the output). How many samples a chunk holds is
 * set by the scratch size (below): small layers get several (the first
 * layer of the Fashion CNN, 5), big ones one. Backward gathers dout into
 * the same (OC, nb*OH*OW) layout, so dweight is one product over the chunk;
 * im2col is recomputed rather than kept from forward (B column matrices
 * would be 160 MB for the Fashion CNN). Chunks belong to slices of the
 * batch, which threads share out (see "slices, chunks and threads"). */
#include "layers.h"
#include "parallel.h"

#include <cblas.h>
#include <immintrin.h>
#include <string.h>

/* Loops get AVX2 and AVX-512 copies picked at load time, as in layers.c. */
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

/* Sum of x (n) in eight interleaved partial sums: the compiler may not
 * reorder a float sum by itself, and one serial chain of adds is bound by
 * the add latency. */
VECTOR_CLONES
static float sum8(const float *x, size_t n)
{
	float acc[8] = { 0 };
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int k = 0; k < 8; k++)
			acc[k] += x[i + k];
	float s = 0.0f;
	for (; i < n; i++)
		s += x[i];
	for (int k = 0; k < 8; k++)
		s += acc[k];
	return s;
}

/* One sample's padded planes, after the chunk's col and tmp. */
static size_t padded_size(const struct window *w)
{
	return (size_t)w->C * (size_t)(w->H + 2 * w->P) * (size_t)(w->W + 2 * w->P);
}

/* xp (C, H + 2P, W + 2P) = inp (C, H, W) with P zeros around each plane.
 * im2col and col2im then index without bounds checks: each (c, kh, kw)
 * row of col is OH straight copies of OW values, one or two masked vector
 * moves each with AVX-512 (below). */
VECTOR_CLONES
static void pad_planes(float *xp, const float *inp, const struct window *w)
{
	int P = w->P, H = w->H, W = w->W, Hp = H + 2 * P, Wp = W + 2 * P;
	for (int c = 0; c < w->C; c++) {
		float *d = xp + (size_t)c * Hp * Wp;
		const float *x = inp + (size_t)c * H * W;
		for (int i = 0; i < P * Wp; i++)
			d[i] = 0.0f;
		for (int h = 0; h < H; h++) {
			float *r = d + (size_t)(h + P) * Wp;
			for (int i = 0; i < P; i++)
				r[i] = 0.0f;
			for (int i = 0; i < W; i++)
				r[P + i] = x[(size_t)h * W + i];
			for (int i = P + W; i < Wp; i++)
				r[i] = 0.0f;
		}
		for (int i = (P + H) * Wp; i < Hp * Wp; i++)
			d[i] = 0.0f;
	}
}

/* d (n) = s (n); d (n) += s (n). restrict lets the compiler vectorize
 * without the overlap checks that made the inlined loops scalar. */
static inline void row_copy(float *restrict d, const float *restrict s, int n)
{
	for (int i = 0; i < n; i++)
		d[i] = s[i];
}

static inline void row_add(float *restrict d, const float *restrict s, int n)
{
	for (int i = 0; i < n; i++)
		d[i] += s[i];
}

/* col (C*K*K, OH*OW) with row stride ld = the patches of one sample's
 * padded planes xp (C, H + 2P, W + 2P). */
VECTOR_CLONES
static void im2col_any(float *col, size_t ld, const float *xp, const struct window *w)
{
	int K = w->K, S = w->S, OH = w->OH, OW = w->OW;
	int Hp = w->H + 2 * w->P, Wp = w->W + 2 * w->P;
	for (int c = 0; c < w->C; c++) {
		for (int kh = 0; kh < K; kh++) {
			for (int kw = 0; kw < K; kw++) {
				float *row = col + ((size_t)(c * K + kh) * K + kw) * ld;   // (OH, OW)
				const float *src = xp + (size_t)c * Hp * Wp + (size_t)kh * Wp + kw;
				for (int oh = 0; oh < OH; oh++) {
					float *r = row + (size_t)oh * OW;
					const float *x = src + (size_t)oh * S * Wp;
					if (S == 1) {
						row_copy(r, x, OW);
					} else {
						for (int ow = 0; ow < OW; ow++)
							r[ow] = x[(size_t)ow * S];
					}
				}
			}
		}
	}
}

/* dxp (C, H + 2P, W + 2P) = the sum of col's patches (row stride ld) back
 * at their places (set, padding included). */
VECTOR_CLONES
static void col2im_any(float *dxp, const float *col, size_t ld, const struct window *w)
{
	int K = w->K, S = w->S, OH = w->OH, OW = w->OW;
	int Hp = w->H + 2 * w->P, Wp = w->W + 2 * w->P;
	memset(dxp, 0, (size_t)w->C * Hp * Wp * sizeof(float));
	for (int c = 0; c < w->C; c++) {
		for (int kh = 0; kh < K; kh++) {
			for (int kw = 0; kw < K; kw++) {
				const float *row = col + ((size_t)(c * K + kh) * K + kw) * ld;
				float *dst = dxp + (size_t)c * Hp * Wp + (size_t)kh * Wp + kw;
				for (int oh = 0; oh < OH; oh++) {
					const float *r = row + (size_t)oh * OW;
					float *d = dst + (size_t)oh * S * Wp;
					if (S == 1) {
						row_add(d, r, OW);
					} else {
						for (int ow = 0; ow < OW; ow++)
							d[(size_t)ow * S] += r[ow];
					}
				}
			}
		}
	}
}

/* Stride 1 with AVX-512: each row of OW values is one or two masked vector
 * moves. The plain loops above spend their time on loop control and, for
 * the copies, on a memcpy call per 14-value row (GCC turns the copy loop
 * into one): perf on the Fashion CNN put im2col + those memcpys at ~10% of
 * a step and col2im at ~8%. Masked lanes are not read, so the last row of
 * a buffer is never overrun. */
#define AVX512 __attribute__((target("avx512f")))

AVX512
static void im2col_s1_avx512(float *col, size_t ld, const float *xp, const struct window *w)
{
	int K = w->K, OH = w->OH, OW = w->OW;
	int Hp = w->H + 2 * w->P, Wp = w->W + 2 * w->P, full = OW / 16;
	__mmask16 tail = (__mmask16)((1u << (OW % 16)) - 1u);
	for (int c = 0; c < w->C; c++) {
		for (int kh = 0; kh < K; kh++) {
			for (int kw = 0; kw < K; kw++) {
				float *row = col + ((size_t)(c * K + kh) * K + kw) * ld;   // (OH, OW)
				const float *src = xp + (size_t)c * Hp * Wp + (size_t)kh * Wp + kw;
				for (int oh = 0; oh < OH; oh++) {
					float *r = row + (size_t)oh * OW;
					const float *x = src + (size_t)oh * Wp;
					int i = 0;
					for (int f = 0; f < full; f++, i += 16)
						_mm512_storeu_ps(r + i, _mm512_loadu_ps(x + i));
					if (tail)
						_mm512_mask_storeu_ps(r + i, tail, _mm512_maskz_loadu_ps(tail, x + i));
				}
			}
		}
	}
}

AVX512
static void col2im_s1_avx512(float *dxp, const float *col, size_t ld, const struct window *w)
{
	int K = w->K, OH = w->OH, OW = w->OW;
	int Hp = w->H + 2 * w->P, Wp = w->W + 2 * w->P, full = OW / 16;
	__mmask16 tail = (__mmask16)((1u << (OW % 16)) - 1u);
	memset(dxp, 0, (size_t)w->C * Hp * Wp * sizeof(float));
	for (int c = 0; c < w->C; c++) {
		for (int kh = 0; kh < K; kh++) {
			for (int kw = 0; kw < K; kw++) {
				const float *row = col + ((size_t)(c * K + kh) * K + kw) * ld;
				float *dst = dxp + (size_t)c * Hp * Wp + (size_t)kh * Wp + kw;
				for (int oh = 0; oh < OH; oh++) {
					const float *r = row + (size_t)oh * OW;
					float *d = dst + (size_t)oh * Wp;
					int i = 0;
					for (int f = 0; f < full; f++, i += 16)
						_mm512_storeu_ps(d + i, _mm512_add_ps(_mm512_loadu_ps(d + i),
										      _mm512_loadu_ps(r + i)));
					if (tail)
						_mm512_mask_storeu_ps(d + i, tail,
								      _mm512_add_ps(_mm512_maskz_loadu_ps(tail, d + i),
										    _mm512_maskz_loadu_ps(tail, r + i)));
				}
			}
		}
	}
}

static int use_avx512(const struct window *w)
{
	return w->S == 1 && !w->scalar && __builtin_cpu_supports("avx512f");
}

static void im2col(float *col, size_t ld, const float *xp, const struct window *w)
{
	if (use_avx512(w))
		im2col_s1_avx512(col, ld, xp, w);
	else
		im2col_any(col, ld, xp, w);
}

static void col2im(float *dxp, const float *col, size_t ld, const struct window *w)
{
	if (use_avx512(w))
		col2im_s1_avx512(dxp, col, ld, w);
	else
		col2im_any(dxp, col, ld, w);
}

/* dinp (C, H, W) = the interior of dxp (C, H + 2P, W + 2P). */
static void unpad_planes(float *dinp, const float *dxp, const struct window *w)
{
	int P = w->P, H = w->H, W = w->W, Hp = H + 2 * P, Wp = W + 2 * P;
	for (int c = 0; c < w->C; c++)
		for (int h = 0; h < H; h++)
			memcpy(dinp + ((size_t)c * H + h) * W, dxp + ((size_t)c * Hp + h + P) * Wp + P,
			       (size_t)W * sizeof(float));
}

/* The padded planes of one sample: inp itself when there is no padding,
 * else a copy in xp. */
static const float *padded(float *xp, const float *inp, const struct window *w)
{
	if (w->P == 0)
		return inp;
	pad_planes(xp, inp, w);
	return xp;
}


/* ---- slices, chunks and threads --------------------------------------------
 * The batch is cut into S = min(CONV_SLICES, B) slices of consecutive
 * samples, whatever the thread count; each slice has its own scratch and
 * its own partial dweight and dbias, and threads take whole slices. The
 * partials are summed in slice order at the end, so the gradient is the same
 * bit for bit with 1 thread or 8 (each sgemm is single-threaded, on the same
 * operands). A slice is processed in chunks of samples whose im2col columns
 * sit side by side, so one sgemm covers the chunk.
 *
 * Scratch per chunk is kept near 1 MiB, about one core's L2 here, so col is
 * still in cache when the sgemm or col2im reads it back. Measured on the
 * Fashion CNN (CPU ms per step, 1 thread): 16 MiB was slowest (col2im
 * streamed from memory), 4 MiB in between, 1 MiB best, although it means
 * one sample per chunk for the 5x5x32 -> 64 layer (N = 196 per sgemm).
 * Measured again after the AVX-512 im2col/col2im (2 and 4 MiB; sgemm alone
 * at 1 to 8 samples per chunk): within the noise of the shared machine. */
#ifndef CONV_SCRATCH_FLOATS   /* -D for experiments */
#define CONV_SCRATCH_FLOATS ((size_t)1 << 18)
#endif
#define CONV_SLICES 8

struct conv_plan {
	int S;           /* slices */
	int nbmax;       /* samples per chunk, at most */
	int ckk;         /* C*K*K: rows of col */
	size_t ohw;      /* OH*OW */
	size_t in_n;     /* C*H*W */
	size_t stride;   /* floats of scratch per slice */
};

static void conv_plan_init(struct conv_plan *p, const struct window *w, int OC, int B)
{
	p->S = B < 1 ? 1 : B < CONV_SLICES ? B : CONV_SLICES;
	int smax = (B + p->S - 1) / p->S;
	p->ckk = w->C * w->K * w->K;
	p->ohw = (size_t)w->OH * w->OW;
	p->in_n = (size_t)w->C * w->H * w->W;
	size_t per = ((size_t)p->ckk + (size_t)OC) * p->ohw;
	size_t n = CONV_SCRATCH_FLOATS / per;
	p->nbmax = n < 1 ? 1 : n < (size_t)smax ? (int)n : smax;
	/* col, tmp, padded planes, partial dweight and dbias; slices start
	 * on 64-byte boundaries. */
	size_t f = (size_t)p->nbmax * per + padded_size(w) + (size_t)OC * p->ckk + (size_t)OC;
	p->stride = (f + 15) & ~(size_t)15;
}

size_t conv_col_size(const struct window *w, int OC, int B)
{
	/* Grows with B (S and the chunk do), so scratch sized for the largest
	 * batch serves every smaller one. */
	struct conv_plan p;
	conv_plan_init(&p, w, OC, B);
	return (size_t)p.S * p.stride;
}

struct conv_job {
	float *out, *col, *dinp, *dweight, *dbias;
	const float *inp, *weight, *bias, *dout;
	int B, OC;
	const struct window *w;
	struct conv_plan p;
};

/* Slice s's scratch: col (ckk, nbmax*OH*OW), tmp (OC, nbmax*OH*OW), the
 * padded planes of one sample, dweight (OC, ckk) and dbias (OC) partials. */
static float *slice_col(const struct conv_job *j, int s)
{
	return j->col + (size_t)s * j->p.stride;
}

static float *slice_tmp(const struct conv_job *j, int s)
{
	return slice_col(j, s) + (size_t)j->p.ckk * j->p.nbmax * j->p.ohw;
}

static float *slice_xp(const struct conv_job *j, int s)
{
	return slice_tmp(j, s) + (size_t)j->OC * j->p.nbmax * j->p.ohw;
}

static float *slice_dw(const struct conv_job *j, int s)
{
	return slice_xp(j, s) + padded_size(j->w);
}

/* Chunks in slice s: as few as the scratch allows, balanced. */
static int slice_chunks(const struct conv_job *j, int s)
{
	int lo = (int)((size_t)j->B * s / j->p.S), hi = (int)((size_t)j->B * (s + 1) / j->p.S);
	return (hi - lo + j->p.nbmax - 1) / j->p.nbmax;
}

/* Chunk k of nch in slice s: samples [*b0, *b0 + *nb). */
static void chunk_bounds(const struct conv_job *j, int s, int k, int nch, int *b0, int *nb)
{
	int lo = (int)((size_t)j->B * s / j->p.S), hi = (int)((size_t)j->B * (s + 1) / j->p.S);
	int n = hi - lo;
	*b0 = lo + (int)((size_t)n * k / nch);
	*nb = lo + (int)((size_t)n * (k + 1) / nch) - *b0;
}

static void conv_forward_slice(const struct conv_job *j, int s)
{
	const struct window *w = j->w;
	int ckk = j->p.ckk, OC = j->OC;
	size_t ohw = j->p.ohw, in_n = j->p.in_n;
	float *col = slice_col(j, s), *tmp = slice_tmp(j, s), *xp = slice_xp(j, s);
	int nch = slice_chunks(j, s);
	for (int k = 0; k < nch; k++) {
		int b0, nb;
		chunk_bounds(j, s, k, nch, &b0, &nb);
		size_t ld = (size_t)nb * ohw;
		for (int b = 0; b < nb; b++)
			im2col(col + (size_t)b * ohw, ld, padded(xp, j->inp + (size_t)(b0 + b) * in_n, w), w);
		if (nb == 1) {
			/* One sample: the product's layout (OC, OH*OW) is the
			 * output's, so sgemm adds into out seeded with the bias. */
			float *y = j->out + (size_t)b0 * OC * ohw;
			if (j->bias)
				for (int o = 0; o < OC; o++)
					for (size_t i = 0; i < ohw; i++)
						y[(size_t)o * ohw + i] = j->bias[o];
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OC, (int)ohw, ckk, 1.0f,
				    j->weight, ckk, col, (int)ohw, j->bias ? 1.0f : 0.0f, y, (int)ohw);
			continue;
		}
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OC, (int)ld, ckk,
			    1.0f, j->weight, ckk, col, (int)ld, 0.0f, tmp, (int)ld);
		for (int b = 0; b < nb; b++) {
			float *out_b = j->out + (size_t)(b0 + b) * OC * ohw;   // (OC, OH*OW)
			for (int o = 0; o < OC; o++) {
				const float *t = tmp + (size_t)o * ld + (size_t)b * ohw;
				float *y = out_b + (size_t)o * ohw;
				float bo = j->bias ? j->bias[o] : 0.0f;
				for (size_t i = 0; i < ohw; i++)
					y[i] = t[i] + bo;
			}
		}
	}
}

/* dweight and dbias of slice s SET into its partials; dinp of its samples. */
static void conv_backward_slice(const struct conv_job *j, int s)
{
	const struct window *w = j->w;
	int ckk = j->p.ckk, OC = j->OC;
	size_t ohw = j->p.ohw, in_n = j->p.in_n;
	float *col = slice_col(j, s), *tmp = slice_tmp(j, s), *xp = slice_xp(j, s);
	float *dw = slice_dw(j, s), *db = dw + (size_t)OC * ckk;
	int nch = slice_chunks(j, s);
	for (int k = 0; k < nch; k++) {
		int b0, nb;
		chunk_bounds(j, s, k, nch, &b0, &nb);
		size_t ld = (size_t)nb * ohw;
		const float *g = j->dout + (size_t)b0 * OC * ohw;   // (OC, ld) when nb == 1
		if (nb > 1) {
			/* Gather dout into the chunk's (OC, nb*OH*OW) layout. */
			for (int b = 0; b < nb; b++)
				for (int o = 0; o < OC; o++)
					memcpy(tmp + (size_t)o * ld + (size_t)b * ohw,
					       g + ((size_t)b * OC + o) * ohw, ohw * sizeof(float));
			g = tmp;
		}
		for (int b = 0; b < nb; b++)
			im2col(col + (size_t)b * ohw, ld, padded(xp, j->inp + (size_t)(b0 + b) * in_n, w), w);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, OC, ckk, (int)ld,
			    1.0f, g, (int)ld, col, (int)ld, k ? 1.0f : 0.0f, dw, ckk);
		if (j->dbias) {
			for (int o = 0; o < OC; o++) {
				float v = sum8(g + (size_t)o * ld, ld);
				db[o] = k ? db[o] + v : v;
			}
		}
		if (!j->dinp)
			continue;
		/* beta = 0: col is written without reading what was there. */
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, (int)ld, OC,
			    1.0f, j->weight, ckk, g, (int)ld, 0.0f, col, (int)ld);
		for (int b = 0; b < nb; b++) {
			float *dinp_b = j->dinp + (size_t)(b0 + b) * in_n;   // (C, H, W)
			if (w->P == 0) {
				col2im(dinp_b, col + (size_t)b * ohw, ld, w);
			} else {
				col2im(xp, col + (size_t)b * ohw, ld, w);
				unpad_planes(dinp_b, xp, w);
			}
		}
	}
}

/* dweight (and dbias) += the slices' partials summed in slice order, for
 * the elements [lo, hi) of the (OC*ckk + OC) that follow each other. */
VECTOR_CLONES
static void conv_reduce(const struct conv_job *j, size_t lo, size_t hi)
{
	size_t nw = (size_t)j->OC * j->p.ckk;
	float *p0 = slice_dw(j, 0);
	for (int s = 1; s < j->p.S; s++) {
		const float *ps = slice_dw(j, s);
		for (size_t i = lo; i < hi; i++)
			p0[i] += ps[i];
	}
	for (size_t i = lo; i < hi && i < nw; i++)
		j->dweight[i] += p0[i];
	for (size_t i = lo > nw ? lo : nw; j->dbias && i < hi; i++)
		j->dbias[i - nw] += p0[i];
}

static void conv_forward_share(void *arg, int t, int nt)
{
	const struct conv_job *j = arg;
	size_t lo, hi;
	parallel_share((size_t)j->p.S, t, nt, &lo, &hi);
	for (size_t s = lo; s < hi; s++)
		conv_forward_slice(j, (int)s);
}

static void conv_backward_share(void *arg, int t, int nt)
{
	const struct conv_job *j = arg;
	size_t lo, hi;
	parallel_share((size_t)j->p.S, t, nt, &lo, &hi);
	for (size_t s = lo; s < hi; s++)
		conv_backward_slice(j, (int)s);
}

static void conv_reduce_share(void *arg, int t, int nt)
{
	const struct conv_job *j = arg;
	size_t lo, hi;
	parallel_share((size_t)j->OC * j->p.ckk + (size_t)j->OC, t, nt, &lo, &hi);
	conv_reduce(j, lo, hi);
}

/* Runs fn over the slices with every sgemm single-threaded: the threads
 * here are the parallelism, and an OpenBLAS pool under each of them would
 * only contend. OpenBLAS's setting is process-wide; it is restored after. */
static void conv_run(struct conv_job *j, int threads, void (*fn)(void *, int, int))
{
	int blas = openblas_get_num_threads();
	if (blas != 1)
		openblas_set_num_threads(1);
	int nt = threads < 1 ? 1 : threads < j->p.S ? threads : j->p.S;
	parallel_run(nt, fn, j);
	if (blas != 1)
		openblas_set_num_threads(blas);
}

void conv_forward_mt(float *out, float *col, const float *inp, const float *weight,
		     const float *bias, int B, int OC, const struct window *w, int threads)
{
	// out (B, OC, OH, OW), inp (B, C, H, W), weight (OC, C, K, K), bias (OC)
	if (B <= 0)
		return;
	struct conv_job j = { .out = out, .col = col, .inp = inp, .weight = weight, .bias = bias,
			      .B = B, .OC = OC, .w = w };
	conv_plan_init(&j.p, w, OC, B);
	conv_run(&j, threads, conv_forward_share);
}

void conv_backward_mt(float *dinp, float *dweight, float *dbias, float *col,
		      const float *dout, const float *inp, const float *weight,
		      int B, int OC, const struct window *w, int threads)
{
	// dinp (B, C, H, W), dweight (OC, C, K, K), dbias (OC), dout (B, OC, OH, OW)
	if (B <= 0)
		return;
	struct conv_job j = { .dinp = dinp, .dweight = dweight, .dbias = dbias, .col = col,
			      .dout = dout, .inp = inp, .weight = weight, .B = B, .OC = OC, .w = w };
	conv_plan_init(&j.p, w, OC, B);
	conv_run(&j, threads, conv_backward_share);
	/* The sum is elementwise, so splitting it over threads keeps it exact. */
	parallel_run(threads, conv_reduce_share, &j);
}

void conv_forward(float *out, float *col, const float *inp, const float *weight,
		  const float *bias, int B, int OC, const struct window *w)
{
	conv_forward_mt(out, col, inp, weight, bias, B, OC, w, 1);
}

void conv_backward(float *dinp, float *dweight, float *dbias, float *col,
		   const float *dout, const float *inp, const float *weight,
		   int B, int OC, const struct window *w)
{
	conv_backward_mt(dinp, dweight, dbias, col, dout, inp, weight, B, OC, w, 1);
}
