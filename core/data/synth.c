/* The planted click-through model and the files drawn from it; see
 * synth.h. Everything is a function of (seed, vocab): the model's
 * constants from per-field formulas and hashed draws, each row from its
 * own counter-seeded generator, so the bytes do not depend on the order
 * rows are made in or on the machine. */
#include "synth.h"
#include "criteo.h"
#include "../metrics.h"
#include "../nn/rng.h"
#include "../../base/err.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <zlib.h>

#define SYNTH_PAIRS 4
#define SYNTH_RANK 4         /* of the planted interaction vectors */
#define SYNTH_CACHE 4096     /* ranks per field whose draws are kept: Zipf
			      * makes them most of the samples */
#define SYNTH_CALIB 20000    /* rows the bias is fitted on */
#define SYNTH_RATE 0.25      /* the click rate the bias aims at */
#define SYNTH_MAX_ROWS 100000000000ull
#define SYNTH_MAX_TEST 100000000ull   /* its scores are held for the AUC */
#define SYNTH_MAX_VOCAB 100000000ull
/* Scales of the three parts of the logit, chosen for a ceiling near
 * Criteo's best published models (AUC about 0.80). */
#define SYNTH_FIELD_SCALE 0.33
#define SYNTH_PAIR_SCALE 0.40
#define SYNTH_NUM_SCALE 0.12

/* Where a row's draws and the model's hashed draws live in rng.h's
 * RNG_DATA stream: rows at their key, the model under its own seed. */
#define ROW_TEST (1ull << 62)
#define ROW_CALIB (2ull << 62)
enum { DRAW_WEIGHT = 1, DRAW_VECTOR = 2 };

/* Zipf over ranks 1..n with exponent s by rejection-inversion (Hörmann
 * and Derflinger, 1996): O(1) time and memory per draw whatever n is,
 * where a table of the CDF would take n doubles per field. */
struct zipf {
	double s, n, h_x1, h_n, accept;
};

struct field {
	struct zipf z;
	uint64_t vocab;
	double miss;        /* probability the column is empty */
	double sigma;       /* its values' weights are N(0, sigma^2) */
	uint32_t salt;      /* of its rank -> ID bijection */
	int paired;         /* has interaction vectors */
	float *w;           /* (min(vocab, CACHE)) weights of ranks 1.. */
	float *e;           /* (min(vocab, CACHE), RANK) vectors, if paired */
};

struct numcol {
	double mu, sd;      /* log-normal counts */
	double miss, weight;
	int shift;          /* subtracted, so a column has values <= 0 too */
};

struct synth_model {
	uint64_t seed, mseed;
	struct field f[CRITEO_CATS];
	struct numcol c[CRITEO_INTS];
	double bias;
};

static const int synth_pairs[SYNTH_PAIRS][2] = { { 0, 1 }, { 2, 7 }, { 3, 11 }, { 5, 19 } };

static double zipf_h(double s, double x)
{
	return exp(-s * log(x));
}

/* log1p(x)/x and expm1(x)/x, exact near 0. */
static double zipf_helper1(double x)
{
	return fabs(x) > 1e-8 ? log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - x * 0.25));
}

static double zipf_helper2(double x)
{
	return fabs(x) > 1e-8 ? expm1(x) / x : 1 + x * 0.5 * (1 + x / 3 * (1 + x * 0.25));
}

/* H, the integral of h, and its inverse. */
static double zipf_big_h(double s, double x)
{
	double lx = log(x);
	return zipf_helper2((1 - s) * lx) * lx;
}

static double zipf_big_h_inv(double s, double x)
{
	double t = x * (1 - s);
	return exp(zipf_helper1(t < -1 ? -1 : t) * x);
}

static void zipf_init(struct zipf *z, double s, uint64_t n)
{
	z->s = s;
	z->n = (double)n;
	z->h_x1 = zipf_big_h(s, 1.5) - 1;
	z->h_n = zipf_big_h(s, z->n + 0.5);
	z->accept = 2 - zipf_big_h_inv(s, zipf_big_h(s, 2.5) - zipf_h(s, 2));
}

static uint64_t zipf_draw(const struct zipf *z, struct rng *g)
{
	for (;;) {
		double u = z->h_n + rng_next_uniform(g) * (z->h_x1 - z->h_n);
		double x = zipf_big_h_inv(z->s, u);
		double k = floor(x + 0.5);
		k = k < 1 ? 1 : k > z->n ? z->n : k;
		if (k - x <= z->accept || u >= zipf_big_h(z->s, k + 0.5) - zipf_h(z->s, k))
			return (uint64_t)k;
	}
}

/* A bijection of 32-bit words (murmur3's finalizer), so that distinct
 * ranks of a field get distinct IDs. */
static uint32_t synth_mix32(uint32_t h)
{
	h ^= h >> 16;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	h *= 0xc2b2ae35u;
	return h ^ (h >> 16);
}

static uint64_t draw_key(int kind, int field, uint64_t rank, int r)
{
	return (uint64_t)kind << 60 | (uint64_t)field << 48 | rank << 8 | (uint64_t)r;
}

static double field_weight(const struct synth_model *m, int j, uint64_t k)
{
	const struct field *f = &m->f[j];
	if (k <= SYNTH_CACHE)
		return f->w[k - 1];
	return f->sigma * rng_normal(m->mseed, RNG_DATA, draw_key(DRAW_WEIGHT, j, k, 0));
}

static void field_vector(const struct synth_model *m, int j, uint64_t k, float *v)
{
	const struct field *f = &m->f[j];
	for (int r = 0; r < SYNTH_RANK; r++)
		v[r] = k <= SYNTH_CACHE ? f->e[(k - 1) * SYNTH_RANK + r]
					: (float)rng_normal(m->mseed, RNG_DATA, draw_key(DRAW_VECTOR, j, k, r));
}

static void synth_model_free(struct synth_model *m)
{
	for (int j = 0; j < CRITEO_CATS; j++) {
		free(m->f[j].w);
		free(m->f[j].e);
	}
}

/* The fields and columns differ by formulas of their index (sizes from 3
 * to vocab, exponents 1.05..1.3, some columns often empty), so one seed's
 * data set has the spread of a real log; the weights are hashed draws. */
static int synth_model_init(struct synth_model *m, uint64_t seed, uint64_t vocab)
{
	memset(m, 0, sizeof(*m));
	m->seed = seed;
	m->mseed = rng_hash(seed, RNG_DATA, UINT64_MAX);
	for (int i = 0; i < SYNTH_PAIRS; i++)
		m->f[synth_pairs[i][0]].paired = m->f[synth_pairs[i][1]].paired = 1;
	for (int j = 0; j < CRITEO_CATS; j++) {
		struct field *f = &m->f[j];
		double t = 0.15 + 0.85 * ((j * 7) % 26) / 25.0;
		f->vocab = (uint64_t)llround(exp(log((double)vocab) * t));
		f->vocab = f->vocab < 3 ? (vocab < 3 ? vocab : 3) : f->vocab;
		zipf_init(&f->z, 1.05 + 0.25 * ((j * 11) % 26) / 25.0, f->vocab);
		f->miss = (j * 5) % 26 < 6 ? 0.05 + 0.4 * ((j * 3) % 7) / 6.0 : 0;
		f->sigma = SYNTH_FIELD_SCALE * (0.3 + ((j * 17) % 26) / 25.0);
		f->salt = (uint32_t)rng_hash(m->mseed, RNG_DATA, (uint64_t)j);
		size_t nc = f->vocab < SYNTH_CACHE ? (size_t)f->vocab : SYNTH_CACHE;
		f->w = malloc(nc * sizeof(*f->w));
		f->e = f->paired ? malloc(nc * SYNTH_RANK * sizeof(*f->e)) : NULL;
		if (!f->w || (f->paired && !f->e)) {
			synth_model_free(m);
			return -ENOMEM;
		}
		for (size_t k = 1; k <= nc; k++) {
			f->w[k - 1] = (float)(f->sigma * rng_normal(m->mseed, RNG_DATA, draw_key(DRAW_WEIGHT, j, k, 0)));
			for (int r = 0; f->paired && r < SYNTH_RANK; r++)
				f->e[(k - 1) * SYNTH_RANK + r] =
					(float)rng_normal(m->mseed, RNG_DATA, draw_key(DRAW_VECTOR, j, k, r));
		}
	}
	for (int i = 0; i < CRITEO_INTS; i++) {
		struct numcol *c = &m->c[i];
		c->mu = 0.5 + 4.0 * ((i * 5) % 13) / 12.0;
		c->sd = 0.8 + 1.2 * ((i * 7) % 13) / 12.0;
		c->miss = (i * 3) % 13 < 4 ? 0.1 + 0.3 * ((i * 5) % 4) / 3.0 : 0;
		c->weight = SYNTH_NUM_SCALE * (((i * 7) % 13) / 6.0 - 1);
		c->shift = i == 1 ? 3 : 0;
	}
	return 0;
}

/* A row without its label: the raw integers (has[i] 0 when empty), the
 * IDs, and the logit less the bias. */
struct synth_row {
	int64_t v[CRITEO_INTS];
	int has[CRITEO_INTS];
	uint32_t ids[CRITEO_CATS];
	uint64_t rank[CRITEO_CATS];   /* 0: empty */
};

static double synth_row_draw(const struct synth_model *m, struct rng *g, struct synth_row *row)
{
	double logit = 0;

	for (int j = 0; j < CRITEO_CATS; j++) {
		const struct field *f = &m->f[j];
		row->rank[j] = rng_next_uniform(g) < f->miss ? 0 : zipf_draw(&f->z, g);
		row->ids[j] = DATA_ID_NONE;
		if (!row->rank[j])
			continue;
		row->ids[j] = synth_mix32((uint32_t)(row->rank[j] - 1) * 0x9e3779b1u + f->salt);
		logit += field_weight(m, j, row->rank[j]);
	}
	for (int i = 0; i < SYNTH_PAIRS; i++) {
		int a = synth_pairs[i][0], b = synth_pairs[i][1];
		float va[SYNTH_RANK], vb[SYNTH_RANK];
		double dot = 0;
		if (!row->rank[a] || !row->rank[b])
			continue;
		field_vector(m, a, row->rank[a], va);
		field_vector(m, b, row->rank[b], vb);
		for (int r = 0; r < SYNTH_RANK; r++)
			dot += (double)va[r] * vb[r];
		logit += SYNTH_PAIR_SCALE * dot / sqrt((double)SYNTH_RANK);
	}
	for (int i = 0; i < CRITEO_INTS; i++) {
		const struct numcol *c = &m->c[i];
		double u1 = rng_next_uniform(g), u2 = rng_next_uniform(g), miss = rng_next_uniform(g);
		double z = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
		row->has[i] = miss >= c->miss;
		row->v[i] = (int64_t)floor(exp(c->mu + c->sd * z)) - c->shift;
		/* The planted weight is on the loader's feature, so a linear
		 * model on what it reads can represent this part exactly. */
		if (row->has[i] && row->v[i] > 0)
			logit += c->weight * log1p((double)row->v[i]);
	}
	return logit;
}

static double synth_sigmoid(double x)
{
	return 1 / (1 + exp(-x));
}

/* The bias for a click rate of SYNTH_RATE over calibration rows that are
 * in neither file: bisection, the mean rate being monotone in it. */
static int synth_fit_bias(struct synth_model *m)
{
	double *l = malloc(SYNTH_CALIB * sizeof(*l)), lo = -30, hi = 30;
	struct synth_row row;
	struct rng g;

	if (!l)
		return -ENOMEM;
	for (size_t i = 0; i < SYNTH_CALIB; i++) {
		rng_seed(&g, m->seed, RNG_DATA, ROW_CALIB | i);
		l[i] = synth_row_draw(m, &g, &row);
	}
	for (int it = 0; it < 100; it++) {
		double mid = (lo + hi) / 2, rate = 0;
		for (size_t i = 0; i < SYNTH_CALIB; i++)
			rate += synth_sigmoid(mid + l[i]);
		*(rate / SYNTH_CALIB < SYNTH_RATE ? &lo : &hi) = mid;
	}
	m->bias = (lo + hi) / 2;
	free(l);
	return 0;
}

/* Text out, plain or gzip, through one buffer of whole lines. */
struct synth_out {
	FILE *f;
	gzFile gz;
	char *buf;
	size_t len;
	int bad;            /* a write failed: errno was kept */
	int err;
};

#define SYNTH_OUT_BUF (1u << 20)

static void synth_flush(struct synth_out *o)
{
	if (!o->len || o->bad)
		return;
	errno = 0;
	if (o->gz ? gzwrite(o->gz, o->buf, (unsigned)o->len) != (int)o->len
		  : fwrite(o->buf, 1, o->len, o->f) != o->len) {
		o->bad = 1;
		o->err = errno ? errno : EIO;
	}
	o->len = 0;
}

static char *put_u64(char *p, uint64_t v)
{
	char t[20];
	int n = 0;

	do
		t[n++] = (char)('0' + v % 10);
	while (v /= 10);
	while (n)
		*p++ = t[--n];
	return p;
}

/* One line of the layout criteo.h reads. */
static char *synth_format(char *p, int32_t y, const struct synth_row *row)
{
	static const char hex[] = "0123456789abcdef";

	*p++ = (char)('0' + y);
	for (int i = 0; i < CRITEO_INTS; i++) {
		*p++ = '\t';
		if (!row->has[i])
			continue;
		if (row->v[i] < 0)
			*p++ = '-';
		p = put_u64(p, row->v[i] < 0 ? (uint64_t)-row->v[i] : (uint64_t)row->v[i]);
	}
	for (int j = 0; j < CRITEO_CATS; j++) {
		*p++ = '\t';
		if (row->ids[j] == DATA_ID_NONE)
			continue;
		for (int s = 28; s >= 0; s -= 4)
			*p++ = hex[row->ids[j] >> s & 15];
	}
	*p++ = '\n';
	return p;
}

/* rows rows with keys key_base | i into path (by way of path.tmp); their
 * probabilities and labels into p, y when those are not NULL. */
static int synth_file(const struct synth_model *m, const char *path, uint64_t rows, uint64_t key_base, int gzip,
		      float *p, int32_t *y, double *rate, char *err, size_t errlen)
{
	struct synth_out o = { 0 };
	struct synth_row row;
	struct rng g;
	char tmp[SYNTH_PATH_MAX + 32];
	uint64_t clicks = 0;
	int e;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	o.buf = malloc(SYNTH_OUT_BUF);
	errno = 0;
	if (gzip)
		o.gz = gzopen(tmp, "wb1");   /* level 1: the files are made to be read again, fast */
	else
		o.f = fopen(tmp, "wb");
	if (!o.buf || (!o.gz && !o.f)) {
		e = errno ? errno : ENOMEM;
		free(o.buf);
		if (o.f)
			fclose(o.f);
		if (o.gz)
			gzclose_w(o.gz);
		/* A directory the user cannot write to is theirs to fix. */
		return err_set(err, errlen, e == ENOMEM ? -ENOMEM : -EINVAL, "%s: cannot write: %s", tmp, strerror(e));
	}
	for (uint64_t i = 0; i < rows && !o.bad; i++) {
		rng_seed(&g, m->seed, RNG_DATA, key_base | i);
		double q = synth_sigmoid(m->bias + synth_row_draw(m, &g, &row));
		int32_t label = rng_next_uniform(&g) < q;
		clicks += (uint64_t)label;
		if (p) {
			p[i] = (float)q;
			y[i] = label;
		}
		if (o.len + 512 > SYNTH_OUT_BUF)
			synth_flush(&o);
		o.len = (size_t)(synth_format(o.buf + o.len, label, &row) - o.buf);
	}
	synth_flush(&o);
	errno = 0;
	if ((o.gz ? gzclose_w(o.gz) != Z_OK : fclose(o.f) != 0) && !o.bad) {
		o.bad = 1;
		o.err = errno ? errno : EIO;
	}
	free(o.buf);
	if (!o.bad && rename(tmp, path) != 0) {
		o.bad = 1;
		o.err = errno;
	}
	if (o.bad) {
		remove(tmp);
		return err_set(err, errlen, o.err == ENOSPC || o.err == EDQUOT ? -o.err : -EIO, "%s: cannot write: %s",
			       path, strerror(o.err));
	}
	*rate = rows ? (double)clicks / (double)rows : 0;
	return 0;
}

static double synth_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* out exists as a directory, or is made. */
static int synth_dir(const char *out, char *err, size_t errlen)
{
	struct stat st;

	if (mkdir(out, 0777) != 0 && errno != EEXIST)
		return err_set(err, errlen, -EINVAL, "%s: cannot make the directory: %s", out, strerror(errno));
	if (stat(out, &st) != 0 || !S_ISDIR(st.st_mode))
		return err_set(err, errlen, -EINVAL, "%s: not a directory", out);
	return 0;
}

static int synth_files(const struct synth_opts *o, const struct synth_model *m, struct synth_result *res,
		       char *err, size_t errlen)
{
	size_t nt = (size_t)o->test_rows;
	float *p = malloc(nt * sizeof(*p));
	int32_t *y = malloc(nt * sizeof(*y));
	struct metrics_pair *scratch = malloc(nt * sizeof(*scratch));
	int e = -ENOMEM;

	if (!p || !y || !scratch)
		err_set(err, errlen, e, "out of memory for the scores of %zu test rows", nt);
	else if (!(e = synth_file(m, res->train_path, o->train_rows, 0, o->gzip, NULL, NULL, &res->train_rate, err,
				  errlen)) &&
		 !(e = synth_file(m, res->test_path, o->test_rows, ROW_TEST, o->gzip, p, y, &res->test_rate, err,
				  errlen))) {
		double r = res->train_rate, t = res->test_rate;
		res->logloss = metrics_logloss(p, y, nt);
		res->auc = metrics_auc(p, y, nt, scratch);
		r = r < METRICS_EPS ? METRICS_EPS : r > 1 - METRICS_EPS ? 1 - METRICS_EPS : r;
		res->base_logloss = -(t * log(r) + (1 - t) * log1p(-r));
	}
	free(p);
	free(y);
	free(scratch);
	return e;
}

int synth_write(const struct synth_opts *o, struct synth_result *res, char *err, size_t errlen)
{
	struct synth_model m;
	double t0 = synth_now();
	const char *ext = o->gzip ? ".gz" : "";
	int e;

	memset(res, 0, sizeof(*res));
	if (!o->out[0] || o->train_rows < 1 || o->train_rows > SYNTH_MAX_ROWS || o->test_rows < 1 ||
	    o->test_rows > SYNTH_MAX_TEST || o->vocab < 2 || o->vocab > SYNTH_MAX_VOCAB)
		return err_set(err, errlen, -EINVAL, "synth: an empty --out, or rows or vocab out of range");
	snprintf(res->train_path, sizeof(res->train_path), "%s/train.txt%s", o->out, ext);
	snprintf(res->test_path, sizeof(res->test_path), "%s/test.txt%s", o->out, ext);
	e = synth_dir(o->out, err, errlen);
	if (e)
		return e;
	e = synth_model_init(&m, o->seed, o->vocab);
	if (!e)
		e = synth_fit_bias(&m);
	if (e == -ENOMEM)
		err_set(err, errlen, e, "out of memory for the planted model");
	if (!e)
		e = synth_files(o, &m, res, err, errlen);
	synth_model_free(&m);
	res->seconds = synth_now() - t0;
	return e;
}

void synth_defaults(struct synth_opts *o)
{
	memset(o, 0, sizeof(*o));
	snprintf(o->out, sizeof(o->out), "ctr-synth");
	o->train_rows = 1000000;
	o->test_rows = 100000;
	o->seed = 1;
	o->vocab = 1000000;
}

/* A whole decimal number in [lo, hi]: no sign, blank, suffix or exponent. */
static int synth_number(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;

	if (!(*s >= '0' && *s <= '9'))
		return -1;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

int synth_arg(struct synth_opts *o, char *const *argv, int argc, char *err, size_t errlen)
{
	static const struct {
		const char *name;
		size_t off;
		uint64_t lo, hi;
	} nums[] = {
		{ "--train-rows", offsetof(struct synth_opts, train_rows), 1, SYNTH_MAX_ROWS },
		{ "--test-rows", offsetof(struct synth_opts, test_rows), 1, SYNTH_MAX_TEST },
		{ "--seed", offsetof(struct synth_opts, seed), 0, UINT64_MAX },
		{ "--vocab", offsetof(struct synth_opts, vocab), 2, SYNTH_MAX_VOCAB },
	};
	const char *a = argv[0], *v;
	size_t n = strcspn(a, "="), i, k = sizeof(nums) / sizeof(nums[0]);
	int is_out = n == 5 && strncmp(a, "--out", 5) == 0;

	if (strcmp(a, "--gzip") == 0) {
		o->gzip = 1;
		return 1;
	}
	for (i = 0; i < k && !(strlen(nums[i].name) == n && strncmp(a, nums[i].name, n) == 0); i++)
		;
	if (i == k && !is_out)
		return 0;
	v = a[n] == '=' ? a + n + 1 : argc > 1 ? argv[1] : NULL;
	if (!v)
		return err_set(err, errlen, -EINVAL, "%.*s needs a value", (int)n, a);
	if (is_out && (!v[0] || strlen(v) >= sizeof(o->out)))
		return err_set(err, errlen, -EINVAL, "--out: a directory name of 1 to %zu bytes", sizeof(o->out) - 1);
	if (is_out)
		snprintf(o->out, sizeof(o->out), "%s", v);
	else if (synth_number(v, nums[i].lo, nums[i].hi, (uint64_t *)((char *)o + nums[i].off)) < 0)
		return err_set(err, errlen, -EINVAL, "%s \"%.40s\": not a whole number from %llu to %llu", nums[i].name, v,
			       (unsigned long long)nums[i].lo, (unsigned long long)nums[i].hi);
	return a[n] == '=' ? 1 : 2;
}

void synth_report(const struct synth_opts *o, const struct synth_result *res, FILE *f)
{
	fprintf(f, "synth: wrote %s (%llu rows, %.2f%% clicks) and %s (%llu rows, %.2f%% clicks) in %.1f s\n",
		res->train_path, (unsigned long long)o->train_rows, 100 * res->train_rate, res->test_path,
		(unsigned long long)o->test_rows, 100 * res->test_rate, res->seconds);
	fprintf(f, "synth: planted model on the test rows: logloss %.4f, AUC %.4f, the ceiling a trainer can approach (the click rate alone: logloss %.4f, AUC 0.5)\n",
		res->logloss, res->auc, res->base_logloss);
}
