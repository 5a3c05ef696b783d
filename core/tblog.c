/* See tblog.h. The protobuf fields written (tensorflow/core/util/event.proto
 * and summary.proto):
 *   Event   1 wall_time double, 2 step int64, 3 file_version string, 5 summary
 *   Summary 1 value (repeated)
 *   Value   1 tag string, 2 simple_value float */
#include "tblog.h"

#include "fileio.h"
#include "progress.h"
#include "../base/err.h"
#include "../base/owndir.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

uint32_t tblog_crc32c(const void *data, size_t n)
{
	const uint8_t *p = data;
	uint32_t crc = 0xffffffffu;
	for (size_t i = 0; i < n; i++) {
		crc ^= p[i];
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
	}
	return crc ^ 0xffffffffu;
}

uint32_t tblog_masked_crc(uint32_t crc)
{
	return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* A protobuf message being built in a fixed buffer. */
struct pb {
	uint8_t b[512];
	size_t n;
	int over;
};

static void pb_byte(struct pb *m, uint8_t x)
{
	if (m->n < sizeof(m->b))
		m->b[m->n++] = x;
	else
		m->over = 1;
}

static void pb_varint(struct pb *m, uint64_t v)
{
	do {
		pb_byte(m, (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
		v >>= 7;
	} while (v);
}

static void pb_fixed(struct pb *m, const void *x, size_t n)
{
	for (size_t i = 0; i < n; i++)   /* little-endian hosts only (wire.h says so too) */
		pb_byte(m, ((const uint8_t *)x)[i]);
}

static void pb_bytes(struct pb *m, unsigned field, const void *x, size_t n)
{
	pb_varint(m, (uint64_t)field << 3 | 2);
	pb_varint(m, n);
	pb_fixed(m, x, n);
}

static double wall_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One Event record: wall_time, step, and either file_version or one
 * scalar (tag, value). */
static int tblog_event(struct tblog *t, long step, const char *version, const char *tag, float value)
{
	struct pb value_pb = { 0 }, summary = { 0 }, ev = { 0 };
	double wall = wall_now();
	pb_varint(&ev, 1 << 3 | 1);
	pb_fixed(&ev, &wall, 8);
	pb_varint(&ev, 2 << 3 | 0);
	pb_varint(&ev, (uint64_t)step);
	if (version) {
		pb_bytes(&ev, 3, version, strlen(version));
	} else {
		pb_bytes(&value_pb, 1, tag, strlen(tag));
		pb_varint(&value_pb, 2 << 3 | 5);
		pb_fixed(&value_pb, &value, 4);
		pb_bytes(&summary, 1, value_pb.b, value_pb.n);
		pb_bytes(&ev, 5, summary.b, summary.n);
	}
	if (ev.over || summary.over || value_pb.over)
		return -EINVAL;
	uint64_t len = ev.n;
	uint32_t lcrc = tblog_masked_crc(tblog_crc32c(&len, 8)), dcrc = tblog_masked_crc(tblog_crc32c(ev.b, ev.n));
	if (fwrite(&len, 8, 1, t->f) != 1 || fwrite(&lcrc, 4, 1, t->f) != 1 ||
	    fwrite(ev.b, 1, ev.n, t->f) != ev.n || fwrite(&dcrc, 4, 1, t->f) != 1)
		return -EIO;
	return 0;
}

size_t tblog_file_name(char *out, size_t outlen, long when, const char *host, long pid, int attempt)
{
	/* TensorBoard reads any name holding "tfevents"; TIME.HOST.PID is TF's
	 * own pattern. The host name is whatever the UTS namespace says (a
	 * container's may be set by whoever starts it): escaped, so that a
	 * '/' or ".." cannot reach another directory and no control byte gets
	 * into a file name a terminal will list. */
	char h[64 * 3 + 1];
	size_t k = 0;
	for (const char *c = host; *c && k + 3 < sizeof(h); c++) {
		unsigned char b = (unsigned char)*c;
		if ((b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') || b == '-' ||
		    b == '_' || b == '.')
			h[k++] = (char)b;
		else
			k += (size_t)snprintf(h + k, sizeof(h) - k, "%%%02X", b);
	}
	h[k] = 0;
	int n = attempt ? snprintf(out, outlen, "events.out.tfevents.%ld.%s.%ld.pstrain.%d", when, h, pid,
				   attempt)
			: snprintf(out, outlen, "events.out.tfevents.%ld.%s.%ld.pstrain", when, h, pid);
	return n < 0 ? 0 : (size_t)n;
}

/* log_dir as a descriptor, after the checks socket_dir gets (base/owndir.h)
 * with write, not read, kept from others: files are made in it by name,
 * and whoever may add names there could plant a link where the next file
 * goes or swap the directory under it. Opened without following a last
 * link, and checked through the descriptor that names are then made in,
 * so no swap between the check and the use changes where they go. */
static int log_dir_open(const char *dir, char *err, size_t errlen)
{
	char name[4096];
	size_t n = strlen(dir);
	while (n > 1 && dir[n - 1] == '/')   /* "L/" would follow the link L */
		n--;
	if (n >= sizeof(name))
		return err_set(err, errlen, -ENAMETOOLONG, "log_dir %s: path too long", dir);
	memcpy(name, dir, n);
	name[n] = 0;
	int fd = open(name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		struct stat st;
		if ((e == ELOOP || e == ENOTDIR) && lstat(name, &st) == 0 && S_ISLNK(st.st_mode))
			return err_set(err, errlen, -ELOOP,
				       "log_dir %s is a symbolic link: name the directory it leads to", name);
		return err_set(err, errlen, -e, "log_dir %s: %s", name, strerror(e));
	}
	struct stat st;
	char why[4200];
	int r = fstat(fd, &st) < 0 ? err_set(why, sizeof(why), -errno, "%s: %s", name, strerror(errno))
				   : owndir_check(&st, name, 022, why, sizeof(why));
	if (r) {
		close(fd);
		return err_set(err, errlen, r, "log_dir %s", why);
	}
	return fd;
}

int tblog_open(struct tblog *t, const char *dir, char *err, size_t errlen)
{
	memset(t, 0, sizeof(*t));
	if (!dir[0])
		return 0;
	char host[256] = "host", name[300];
	if (gethostname(host, sizeof(host) - 1))
		snprintf(host, sizeof(host), "host");
	int r = file_make_dirs(dir, NULL);
	if (r)
		return err_set(err, errlen, r, "log_dir %s: cannot make it: %s", dir, strerror(-r));
	int dfd = log_dir_open(dir, err, errlen);
	if (dfd < 0)
		return dfd;
	/* A new file every run, a resumed one too, written only through this
	 * descriptor: O_EXCL and O_NOFOLLOW make a name that is already there
	 * (a planted link, or one of ours from a run with the same time, host
	 * and PID, as a container's PID 1 restarted within the second) the
	 * next try's, never a file to append to. */
	int fd = -1, e = EEXIST;
	long when = (long)time(NULL), pid = (long)getpid();
	for (int attempt = 0; attempt < 16 && fd < 0 && e == EEXIST; attempt++) {
		tblog_file_name(name, sizeof(name), when, host, pid, attempt);
		fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		e = fd < 0 ? errno : 0;
	}
	close(dfd);
	snprintf(t->path, sizeof(t->path), "%s/%s", dir, name);
	if (fd < 0)
		return err_set(err, errlen, -e, "log_dir: cannot create %s: %s", t->path, strerror(e));
	t->f = fdopen(fd, "wb");
	if (!t->f) {
		close(fd);
		return err_set(err, errlen, -ENOMEM, "log_dir: cannot create %s: out of memory", t->path);
	}
	if (tblog_event(t, 0, "brain.Event:2", NULL, 0) || tblog_flush(t)) {
		r = err_set(err, errlen, -EIO, "log_dir: cannot write %s: %s", t->path, strerror(errno));
		tblog_close(t);
		return r;
	}
	return 0;
}

int tblog_scalar(struct tblog *t, long step, const char *tag, double value)
{
	if (!t->f)
		return 0;
	return tblog_event(t, step, NULL, tag, (float)value);
}

int tblog_eval(struct tblog *t, long step, const struct progress *p, double lr)
{
	if (!t->f)
		return 0;
	int r = tblog_scalar(t, step, "train/loss", p->loss);
	if (p->binary) {
		r |= tblog_scalar(t, step, "test/loss", p->test_loss);   /* the log loss */
		r |= tblog_scalar(t, step, "test/auc", p->test_auc);
	} else {
		r |= tblog_scalar(t, step, "train/accuracy", p->acc);
		r |= tblog_scalar(t, step, "test/loss", p->test_loss);
		r |= tblog_scalar(t, step, "test/accuracy", p->test_acc);
	}
	r |= tblog_scalar(t, step, "samples_per_second", p->train_time > 0 ? (double)p->samples / p->train_time : 0);
	r |= tblog_scalar(t, step, "learning_rate", lr);
	if (p->stale)
		r |= tblog_scalar(t, step, "dropped_stale", (double)p->stale);
	r |= tblog_flush(t);
	return r ? -EIO : 0;
}

int tblog_flush(struct tblog *t)
{
	return t->f && fflush(t->f) ? -EIO : 0;
}

void tblog_close(struct tblog *t)
{
	if (t->f)
		fclose(t->f);
	t->f = NULL;
}
