/* Progress lines for training loops. */
#include "progress.h"

#include <math.h>
#include <stdio.h>

#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

double progress_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void hms(char *buf, size_t len, double s)
{
	long t = s < 0 ? 0 : (long)(s + 0.5);
	if (t >= 3600)
		snprintf(buf, len, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
	else
		snprintf(buf, len, "%ld:%02ld", t / 60, t % 60);
}

void progress_init(struct progress *p, FILE *f, int tty, long total_steps, long steps_per_epoch)
{
	*p = (struct progress){ 0 };
	p->f = f;
	p->tty = tty;
	p->total_steps = total_steps;
	p->steps_per_epoch = steps_per_epoch;
	p->t0 = progress_now();
	/* A redrawn line that wraps leaves its first half on screen each time;
	 * keep it to the terminal's width. */
	struct winsize ws;
	p->width = 0;
	if (tty && ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20)
		p->width = ws.ws_col - 1;
}

static void draw(struct progress *p, long done, int final_eval)
{
	double elapsed = progress_now() - p->t0;
	double rate = p->train_time > 0 ? (double)p->samples / p->train_time : 0;
	/* Per step this process has trained: a resumed run did not train the
	 * steps before it started. */
	double eta = p->steps_seen > 0 ? elapsed / (double)p->steps_seen * (double)(p->total_steps - done) : 0;
	char el[32], et[32], test[48] = "", acc[24] = "";
	hms(el, sizeof(el), elapsed);
	hms(et, sizeof(et), eta);
	if (!p->binary)
		snprintf(acc, sizeof(acc), p->tty ? " acc %.1f%%" : "  acc %.2f%%", 100 * p->acc);
	if (p->have_test && p->binary && p->tty)
		snprintf(test, sizeof(test), " test AUC %.3f", p->test_auc);
	else if (p->have_test && p->binary)
		snprintf(test, sizeof(test), "  test logloss %.4f AUC %.4f", p->test_loss, p->test_auc);
	else if (p->have_test)
		snprintf(test, sizeof(test), "  test %.4f/%.2f%%", p->test_loss, 100 * p->test_acc);
	char stale[48] = "";
	if (p->stale)
		snprintf(stale, sizeof(stale), "  %llu stale", p->stale);
	long epoch = done > 0 ? (done - 1) / p->steps_per_epoch + 1 : 1;
	long epochs = (p->total_steps + p->steps_per_epoch - 1) / p->steps_per_epoch;
	char line[512];
	if (p->tty) {
		/* Compact, so the whole line fits an 80-column terminal. */
		if (p->have_test && !p->binary)
			snprintf(test, sizeof(test), " test %.1f%%", 100 * p->test_acc);
		if (p->stale)
			snprintf(stale, sizeof(stale), " %llu stale", p->stale);
		snprintf(line, sizeof(line), "step %ld/%ld ep %ld/%ld loss %.3f%s%s%s %.0f/s %s ETA %s",
			 done, p->total_steps, epoch, epochs, p->loss, acc, test, stale, rate, el, et);
	} else {
		snprintf(line, sizeof(line), "step %ld/%ld  epoch %ld/%ld  loss %.4f%s%s%s  %.0f samples/s  %s  ETA %s",
			 done, p->total_steps, epoch, epochs, p->loss, acc, test, stale, rate, el, et);
	}
	if (p->tty && p->width > 0 && strlen(line) > (size_t)p->width)
		line[p->width] = '\0';
	fprintf(p->f, "%s%s%s", p->tty ? "\r\033[K" : "", line, p->tty && !final_eval ? "" : "\n");
	fflush(p->f);
	p->drawn = p->tty && !final_eval;
}

void progress_tick(struct progress *p, long step, double secs)
{
	(void)step;
	p->train_time += secs;
	p->steps_seen++;
	p->pending++;
}

int progress_due(const struct progress *p, long step)
{
	return p->tty && (progress_now() - p->last_draw > 0.125 || step + 1 == p->total_steps);
}

void progress_step(struct progress *p, long step, long samples, double loss_sum, double right_sum)
{
	if (samples <= 0)
		return;
	int due = progress_due(p, step);
	long n = p->pending > 0 ? p->pending : 1, k = p->absorbed;
	p->samples += samples;
	p->pending = 0;
	p->absorbed += n;
	/* A short exponential average: one batch is noisy, an epoch is stale.
	 * A reading of n steps counts as n steps of it (weight 1 - 0.9^n).
	 * The first ten steps this process trains (not step 0..9 of the run:
	 * a resumed one starts later) are a plain mean, so it starts from the
	 * first batches rather than from 0. */
	double a = k < 10 ? (double)n / (double)(k + n) : 1.0 - pow(0.9, (double)n);
	p->loss += a * (loss_sum / (double)samples - p->loss);
	p->acc += a * (right_sum / (double)samples - p->acc);
	if (due) {
		p->last_draw = progress_now();
		draw(p, step + 1, 0);
	}
}

void progress_eval(struct progress *p, long step, double test_loss, double test_acc)
{
	p->test_loss = test_loss;
	p->test_acc = test_acc;
	p->have_test = 1;
	/* On a tty the line just updates; elsewhere each evaluation is a line. */
	draw(p, step, !p->tty);
}

void progress_set_binary(struct progress *p)
{
	p->binary = 1;
}

void progress_eval_auc(struct progress *p, long step, double test_logloss, double test_auc)
{
	p->test_auc = test_auc;
	progress_eval(p, step, test_logloss, 0);
}

void progress_clear(struct progress *p)
{
	if (p->drawn) {
		fprintf(p->f, "\n");
		fflush(p->f);
		p->drawn = 0;
	}
}

void progress_bytes(char *buf, size_t len, double b)
{
	const char *unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	int i = 0;
	while (b >= 1024 && i < 4) {
		b /= 1024;
		i++;
	}
	snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", b, unit[i]);
}
