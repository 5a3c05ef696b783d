/* Windows of a Criteo file too large to hold; see stream.h. gzip cannot
 * seek, so a window that is not the next one is reached by reading from
 * the start and skipping lines unparsed; in training that happens once
 * an epoch (back to window 0) and once on a resume. */
#include "stream.h"
#include "criteo.h"
#include "data.h"
#include "../nn/rng.h"
#include "../../base/err.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static int stream_changed(const struct stream *s, size_t rows, char *err, size_t errlen)
{
	return err_set(err, errlen, -EINVAL, "%s: has %zu rows now but had %zu when training started (changed since?)",
		       s->path, rows, s->n);
}

size_t stream_window_rows(uint64_t cap_bytes, size_t per_step)
{
	uint64_t rows = cap_bytes / CRITEO_ROW_BYTES;

	if (per_step < 1)
		per_step = 1;
	rows -= rows % per_step;
	if (rows > SIZE_MAX / 2)
		rows = SIZE_MAX / 2 - (SIZE_MAX / 2) % per_step;
	return rows < per_step ? per_step : (size_t)rows;
}

int stream_open(struct stream *s, const char *path, size_t window, struct dataset *win, char *err,
		size_t errlen)
{
	memset(s, 0, sizeof(*s));
	s->held = SIZE_MAX;
	if (snprintf(s->path, sizeof(s->path), "%s", path) >= (int)sizeof(s->path))
		return err_set(err, errlen, -ENAMETOOLONG, "%s: path longer than %zu bytes", path,
			       sizeof(s->path) - 1);
	if (window < 1)
		return err_set(err, errlen, -EINVAL, "%s: a window of 0 rows", path);
	s->window = window;
	int r = criteo_load(win, s->path, window, &s->n, err, errlen);
	if (r == 0)
		s->held = 0;
	return r;
}

size_t stream_windows(const struct stream *s)
{
	return s->window ? (s->n + s->window - 1) / s->window : 0;
}

/* Positions the reader at row `row`, skipping lines without parsing
 * them: they were checked when the stream opened. */
static int stream_seek(struct stream *s, size_t row, char *err, size_t errlen)
{
	char *line;
	size_t len;
	int r;

	if (!s->l.gz) {
		r = lines_open(&s->l, s->path, err, errlen);
		if (r < 0)
			return r;
		s->next = 0;
	} else if (s->next > row) {
		r = lines_rewind(&s->l, err, errlen);
		if (r < 0)
			return r;
		s->next = 0;
	}
	for (; s->next < row; s->next++) {
		r = lines_next(&s->l, &line, &len, err, errlen);
		if (r == 0)
			r = stream_changed(s, s->next, err, errlen);
		if (r < 0)
			return r;
	}
	return 0;
}

int stream_fill(struct stream *s, size_t k, struct dataset *win, char *err, size_t errlen)
{
	if (k >= stream_windows(s))
		return err_set(err, errlen, -EINVAL, "%s: window %zu of %zu", s->path, k, stream_windows(s));
	if (k == s->held)
		return 0;
	size_t first = k * s->window, rows = s->n - first < s->window ? s->n - first : s->window;
	s->held = SIZE_MAX;   /* until the window is whole */
	int r = stream_seek(s, first, err, errlen);
	for (size_t i = 0; r == 0 && i < rows; i++) {
		r = criteo_next(&s->l, win->x + i * win->d, win->ids + i * win->f, win->y + i, err, errlen);
		if (r == 0)
			r = stream_changed(s, first + i, err, errlen);
		r = r > 0 ? 0 : r;
		s->next++;
	}
	if (r < 0)
		return r;
	win->n = rows;
	s->held = k;
	return 0;
}

void stream_order(uint32_t *order, size_t n, uint64_t seed, uint64_t epoch, size_t k)
{
	/* A seed per epoch, then data_permute's per-"epoch" shuffle per
	 * window: one Fisher-Yates, and no stream of rng.h of our own. */
	data_permute(order, n, rng_hash(seed, RNG_SHUFFLE, epoch), (uint64_t)k);
}

void stream_close(struct stream *s)
{
	lines_close(&s->l);
	s->held = SIZE_MAX;
}
