/* cluster.ini parsing: a table of keys with strict per-type parsers.
 *
 * inih does the INI syntax. Debian builds it without line numbers in the
 * handler (INI_HANDLER_LINENO 0) and we must not redefine its macros, so we
 * feed it lines through our own reader, which counts them. The reader also
 * tells whether a line was indented: inih treats an indented line as the
 * continuation of the previous key, which is how long host lists span lines,
 * and must be an error for scalar keys rather than a silent overwrite. */
#include "config.h"
#include "config_keys.h"

#include <errno.h>
#include <ini.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct parse {
	struct config *c;
	const char *name;           /* file name for messages */
	char dir[DATA_PATH_MAX];    /* base of relative paths, "" = cwd */
	const char *text;           /* reader input */
	size_t pos;
	int line;
	int indented;               /* the line just read started with blanks */
	int in_key;                 /* a key was read since the last [section]; inih
				     * continues it on indented lines */
	int bad_line;               /* first line the reader rejected */
	char bad[192];              /* why */
	int key_line[CONFIG_MAX_KEYS];   /* where each key was set, 0 = default */
	char def_bad[CONFIG_MAX_KEYS][CONFIG_ERR_MAX / 4];   /* why a default path did not
				     * resolve; an error only if the key stays unset */
	int layers_from_input;      /* first `layer` line replaces the defaults */
	int err_line;
	char err[CONFIG_ERR_MAX];
};

static const struct key_def *key_find(const char *section, const char *name)
{
	for (size_t i = 0; i < config_nkeys; i++)
		if (strcmp(config_keys[i].section, section) == 0 && strcmp(config_keys[i].key, name) == 0)
			return &config_keys[i];
	return NULL;
}

static int section_known(const char *s)
{
	for (size_t i = 0; i < config_nsections; i++)
		if (strcmp(config_sections[i], s) == 0)
			return 1;
	return 0;
}

/* The default of k as config text, for a config called name: def itself,
 * or for a NAMED key name without its .ini/.conf extension and then def
 * ("examples/mlp.ini" -> "examples/mlp.ckpt"). A name that is only an
 * extension (".ini") keeps it: ".ini.ckpt", not a hidden ".ckpt". */
static const char *default_text(const struct key_def *k, const char *name, char *buf, size_t len)
{
	if (!(k->flags & NAMED))
		return k->def;
	const char *slash = strrchr(name, '/');
	const char *base = slash ? slash + 1 : name;
	const char *dot = strrchr(base, '.');
	size_t n = strlen(name);
	if (dot && dot > base && (strcasecmp(dot, ".ini") == 0 || strcasecmp(dot, ".conf") == 0))
		n = (size_t)(dot - name);
	snprintf(buf, len, "%.*s%s", (int)n, name, k->def);
	return buf;
}

static void config_defaults(struct config *c, const char *name)
{
	char err[CONFIG_ERR_MAX], text[DATA_PATH_MAX + 16];
	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < config_nkeys; i++)
		if (config_keys[i].def)
			(void)config_key_parse(c, &config_keys[i], default_text(&config_keys[i], name, text, sizeof(text)),
					0, "", err, sizeof(err));
	for (size_t i = 0; i < config_ndefault_layers; i++) {
		layer_spec_parse(&c->model.layers[i], config_default_layers[i], err, sizeof(err));
		c->model.nlayers++;
	}
}

/* inih handler: returns 1 to go on, 0 on error (inih then reports this line). */
static int handler(void *user, const char *section, const char *name, const char *value)
{
	struct parse *p = user;
	char msg[CONFIG_ERR_MAX];

	if (p->err_line)
		return 1;   /* report the first error only */
	if (!section[0]) {
		snprintf(msg, sizeof(msg), "%s = %s: key outside any section (expected [cluster], [train], [gpu], [data] or [model] above it)",
			 name, value);
		goto fail;
	}
	if (!section_known(section)) {
		snprintf(msg, sizeof(msg), "unknown section [%s] (expected cluster, train, gpu, data or model)", section);
		goto fail;
	}
	const struct key_def *k = key_find(section, name);
	if (!k) {
		snprintf(msg, sizeof(msg), "[%s] unknown key \"%s\" (see docs/CONFIG.md)", section, name);
		goto fail;
	}
	size_t ki = (size_t)(k - config_keys);
	int append = 0;
	char cont[INI_MAX_LINE];
	if (p->indented && !p->in_key) {
		/* inih reads it as a key, but the next indented line would be a
		 * continuation of it: reject the style rather than half-accept it. */
		snprintf(msg, sizeof(msg), "[%s] %s: indented key; start keys in column 1 (indented lines continue the key above)",
			 section, name);
		goto fail;
	}
	if (p->indented) {
		if (!(k->flags & (LIST | REPEAT)) || strchr(value, '=')) {
			snprintf(msg, sizeof(msg), "[%s] %s: indented line \"%s\" is read as a continuation of %s; remove the leading blanks",
				 section, name, value, name);
			goto fail;
		}
		/* inih strips inline comments only from key = value lines. */
		snprintf(cont, sizeof(cont), "%s", value);
		for (char *q = cont; *q; q++)
			if (*q == ';' && q > cont && (q[-1] == ' ' || q[-1] == '\t')) {
				*q = '\0';
				break;
			}
		for (size_t n = strlen(cont); n && (cont[n - 1] == ' ' || cont[n - 1] == '\t'); n--)
			cont[n - 1] = '\0';
		value = cont;
		append = 1;
	} else if (p->key_line[ki] && !(k->flags & REPEAT)) {
		snprintf(msg, sizeof(msg), "[%s] %s: set twice (first on line %d)", section, name, p->key_line[ki]);
		goto fail;
	}
	if (k->type == K_LAYER && !p->layers_from_input) {
		p->c->model.nlayers = 0;
		p->layers_from_input = 1;
	}
	char detail[CONFIG_ERR_MAX - 64];
	if (config_key_parse(p->c, k, value, append, p->dir, detail, sizeof(detail)) < 0) {
		snprintf(msg, sizeof(msg), "[%s] %s: %s", section, name, detail);
		goto fail;
	}
	if (k->type == K_LAYER)
		p->c->model.layers[p->c->model.nlayers - 1].line = p->line;
	if (!p->indented)
		p->key_line[ki] = p->line;
	p->def_bad[ki][0] = '\0';
	p->in_key = 1;
	return 1;
fail:
	p->err_line = p->line;
	snprintf(p->err, sizeof(p->err), "%s", msg);
	return 0;
}

/* inih reader over p->text that counts lines. */
static char *reader(char *str, int num, void *stream)
{
	struct parse *p = stream;
	const char *s = p->text + p->pos;
	if (!*s)
		return NULL;
	const char *nl = strchr(s, '\n');
	size_t n = nl ? (size_t)(nl - s) + 1 : strlen(s);
	p->line++;
	p->pos += n;
	p->indented = (s[0] == ' ' || s[0] == '\t');
	size_t len = n;   /* without the line end */
	if (len && s[len - 1] == '\n')
		len--;
	if (len && s[len - 1] == '\r')
		len--;
	/* We pass the line on with "\n" for "\r\n": it needs len + 2 bytes. */
	if (len > (size_t)num - 2) {
		/* inih would split it and read the tail as a line of its own. */
		if (!p->bad_line) {
			p->bad_line = p->line;
			snprintf(p->bad, sizeof(p->bad), "line longer than %d characters (split long host lists over indented lines)",
				 num - 2);
		}
		str[0] = '\n';
		str[1] = '\0';
		return str;
	}
	/* A [section] line, unless inih reads it as a continuation ("  [::1]:1").
	 * Checked here because inih never calls the handler for a section
	 * without keys, and ignores whatever follows the "]". */
	const char *t = config_skip_blank(s);
	if (*t == '[' && !(p->indented && p->in_key)) {
		p->in_key = 0;
		const char *close = memchr(t, ']', len - (size_t)(t - s));
		if (close && !p->bad_line) {
			int namelen = (int)(close - t - 1);
			char name[32];
			snprintf(name, sizeof(name), "%.*s", namelen, t + 1);
			const char *rest = config_skip_blank(close + 1);
			if (namelen >= (int)sizeof(name) || !section_known(name)) {
				p->bad_line = p->line;
				snprintf(p->bad, sizeof(p->bad), "unknown section [%.*s] (expected cluster, train, gpu, data or model)",
					 namelen < 64 ? namelen : 64, t + 1);
			} else if (rest < s + len && *rest != ';' && *rest != '#') {
				p->bad_line = p->line;
				snprintf(p->bad, sizeof(p->bad), "syntax error: text after [%s] (expected a ; comment or nothing)", name);
			}
		}
	}
	memcpy(str, s, len);
	str[len] = '\n';
	str[len + 1] = '\0';
	return str;
}

static int parse_text(struct parse *p, char *err, size_t errlen)
{
	int r = ini_parse_stream(reader, p, handler, p);
	if (r == -2) {
		snprintf(err, errlen, "%s: out of memory while parsing", p->name);
		return -ENOMEM;
	}
	int first = p->bad_line;
	if (r > 0 && (!first || r < first))
		first = r;
	if (p->err_line && (!first || p->err_line <= first)) {
		snprintf(err, errlen, "%s:%d: %s", p->name, p->err_line, p->err);
		return -EINVAL;
	}
	if (first == p->bad_line && first) {
		snprintf(err, errlen, "%s:%d: %s", p->name, first, p->bad);
		return -EINVAL;
	}
	if (first) {
		snprintf(err, errlen, "%s:%d: syntax error (expected [section], key = value, or a ; comment)",
			 p->name, first);
		return -EINVAL;
	}
	return 0;
}

static int hosts_equal(const struct host *a, const struct host *b)
{
	return a->port == b->port && strcmp(a->name, b->name) == 0;
}

static int key_line(const struct parse *p, const char *section, const char *name)
{
	const struct key_def *k = key_find(section, name);
	return k ? p->key_line[k - config_keys] : 0;
}

static void where(char *buf, size_t len, const struct parse *p, const char *section, const char *name)
{
	int line = key_line(p, section, name);
	if (line)
		snprintf(buf, len, "%s:%d", p->name, line);
	else
		snprintf(buf, len, "%s", p->name);
}

int config_slices(const struct config *c, int cluster)
{
	if (c->train.slices > 0)
		return c->train.slices;
	return cluster ? c->cluster.max_workers : 1;
}

int config_elastic(const struct config *c)
{
	return c->cluster.min_workers < c->cluster.max_workers;
}

/* max_workers (the workers listed, or more: indexes a ps admits beyond
 * them) and min_workers (all of them, or fewer: elastic). */
static int finish_workers(struct config *c, const struct parse *p, char *err, size_t errlen)
{
	char at[DATA_PATH_MAX + 16];
	int n = c->cluster.nworkers;
	if (c->cluster.max_workers == 0)
		c->cluster.max_workers = n;
	if (c->cluster.max_workers < n) {
		where(at, sizeof(at), p, "cluster", "max_workers");
		snprintf(err, errlen, "%s: [cluster] max_workers: %d is fewer than the %d workers in [cluster] workers",
			 at, c->cluster.max_workers, n);
		return -EINVAL;
	}
	if (c->cluster.min_workers == 0)
		c->cluster.min_workers = c->cluster.max_workers;
	if (c->cluster.min_workers > c->cluster.max_workers) {
		where(at, sizeof(at), p, "cluster", "min_workers");
		snprintf(err, errlen, "%s: [cluster] min_workers: %d is more than the %d workers %s", at,
			 c->cluster.min_workers, c->cluster.max_workers,
			 c->cluster.max_workers > n ? "of max_workers" : "in [cluster] workers");
		return -EINVAL;
	}
	return 0;
}

/* replicas_to_aggregate against the slices a cluster's step sums: all of
 * them by default; fewer (backup workers) only where each worker has one
 * slice, since the first R of slices that one worker computes in turn
 * would be that worker's, not the fastest workers'. */
static int finish_replicas(struct config *c, const struct parse *p, char *err, size_t errlen)
{
	char at[DATA_PATH_MAX + 16];
	int S = config_slices(c, 1), R = c->train.replicas_to_aggregate;
	where(at, sizeof(at), p, "train", "replicas_to_aggregate");
	if (R == 0) {
		c->train.replicas_to_aggregate = S;
		return 0;
	}
	if (R > S && c->train.slices == CONFIG_INT_AUTO)
		snprintf(err, errlen, "%s: [train] replicas_to_aggregate: %d is more than the %d workers in [cluster] workers",
			 at, R, S);
	else if (R > S)
		snprintf(err, errlen, "%s: [train] replicas_to_aggregate: %d is more than the %d [train] slices", at, R, S);
	else if (R < S && S != c->cluster.max_workers)
		snprintf(err, errlen, "%s: [train] replicas_to_aggregate = %d (backup workers) needs one slice per worker: leave [train] slices unset or set it to the %d workers",
			 at, R, c->cluster.max_workers);
	else if (R < S && c->train.mode == MODE_SYNC && c->cluster.min_workers < R) {
		where(at, sizeof(at), p, "cluster", "min_workers");
		snprintf(err, errlen, "%s: [cluster] min_workers: %d is below replicas_to_aggregate = %d: with backup workers each step needs that many workers' gradients",
			 at, c->cluster.min_workers, R);
	} else
		return 0;
	return -EINVAL;
}

/* Rules that involve more than one key. */
static int config_finish(struct config *c, const struct parse *p, char *err, size_t errlen)
{
	char at[DATA_PATH_MAX + 16];

	if (c->cluster.nps < 1 || c->cluster.nworkers < 1) {
		where(at, sizeof(at), p, "cluster", c->cluster.nps < 1 ? "ps" : "workers");
		snprintf(err, errlen, "%s: [cluster] %s: needs at least one host:port", at,
			 c->cluster.nps < 1 ? "ps" : "workers");
		return -EINVAL;
	}
	int total = c->cluster.nps + c->cluster.nworkers;
	for (int i = 0; i < total; i++) {
		const struct host *a = i < c->cluster.nps ? &c->cluster.ps[i] : &c->cluster.workers[i - c->cluster.nps];
		for (int j = i + 1; j < total; j++) {
			const struct host *b = j < c->cluster.nps ? &c->cluster.ps[j] : &c->cluster.workers[j - c->cluster.nps];
			if (hosts_equal(a, b)) {
				const char *key = j < c->cluster.nps ? "ps" : "workers";
				where(at, sizeof(at), p, "cluster", key);
				snprintf(err, errlen, "%s: [cluster] %s: %s:%u is listed twice (each task needs its own host:port)",
					 at, key, a->name, a->port);
				return -EINVAL;
			}
		}
	}
	if (c->cluster.nlisten > 1 && c->cluster.nlisten != c->cluster.nps) {
		where(at, sizeof(at), p, "cluster", "listen");
		snprintf(err, errlen, "%s: [cluster] listen: %d addresses for %d ps (give one for every ps, or one for all)",
			 at, c->cluster.nlisten, c->cluster.nps);
		return -EINVAL;
	}
	int e = finish_workers(c, p, err, errlen);
	if (!e)
		e = finish_replicas(c, p, err, errlen);
	if (e)
		return e;
	if (c->train.steps > 0 && c->train.epochs > 0) {
		where(at, sizeof(at), p, "train", "epochs");
		snprintf(err, errlen, "%s: [train] steps and epochs are both set; set only one", at);
		return -EINVAL;
	}
	if (c->train.steps == 0 && c->train.epochs == 0)
		c->train.epochs = 1;
	if (c->data.format != DATA_IDX && !c->data.train_csv[0]) {
		where(at, sizeof(at), p, "data", "format");
		snprintf(err, errlen, "%s: [data] format = %s needs train_csv", at, c->data.format == DATA_CSV ? "csv" : "criteo");
		return -EINVAL;
	}
	char merr[CONFIG_ERR_MAX];
	struct model m;
	if (model_build(&m, &c->model, merr, sizeof(merr)) < 0) {
		/* A failure before the layers were named is about the input. */
		int line = key_line(p, "model", "input");
		for (int i = 0; i < c->model.nlayers; i++)
			if (c->model.layers[i].line && m.layers[i].name[0] && strstr(merr, m.layers[i].name))
				line = c->model.layers[i].line;
		if (line)
			snprintf(err, errlen, "%s:%d: %s", p->name, line, merr);
		else
			snprintf(err, errlen, "%s: %s", p->name, merr);
		return -EINVAL;
	}
	return 0;
}

static int check_file(const struct parse *p, const char *key, const char *path, char *err, size_t errlen)
{
	struct stat st;
	int e = access(path, R_OK) == 0 ? 0 : errno;
	if (!e && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
		e = EISDIR;
	if (!e)
		return 0;
	char at[DATA_PATH_MAX + 16];
	where(at, sizeof(at), p, "data", key);
	snprintf(err, errlen, "%s: [data] %s: cannot read %s: %s", at, key, path, strerror(e));
	return -ENOENT;
}

static int config_check_files(const struct config *c, const struct parse *p, char *err, size_t errlen)
{
	const struct data_config *d = &c->data;
	int r = 0;
	if (d->format == DATA_IDX) {
		if (!r) r = check_file(p, "train_images", d->train_images, err, errlen);
		if (!r) r = check_file(p, "train_labels", d->train_labels, err, errlen);
		if (!r) r = check_file(p, "test_images", d->test_images, err, errlen);
		if (!r) r = check_file(p, "test_labels", d->test_labels, err, errlen);
	} else {
		if (!r) r = check_file(p, "train_csv", d->train_csv, err, errlen);
		if (!r && d->test_csv[0]) r = check_file(p, "test_csv", d->test_csv, err, errlen);
	}
	return r;
}

/* Applies "section.key=value" from the command line. */
static int config_set(struct config *c, struct parse *p, const char *set, char *err, size_t errlen)
{
	char sec[32];
	const char *dot = strchr(set, '.');
	const char *eq = strchr(set, '=');
	if (!dot || !eq || dot > eq || (size_t)(dot - set) >= sizeof(sec)) {
		snprintf(err, errlen, "--set %s: expected section.key=value", set);
		return -EINVAL;
	}
	memcpy(sec, set, (size_t)(dot - set));
	sec[dot - set] = '\0';
	char name[64];
	size_t nl = (size_t)(eq - dot - 1);
	if (nl >= sizeof(name))
		nl = sizeof(name) - 1;
	memcpy(name, dot + 1, nl);
	while (nl && (name[nl - 1] == ' ' || name[nl - 1] == '\t'))
		nl--;   /* "train.epochs = 3" */
	name[nl] = '\0';
	const struct key_def *k = key_find(sec, name);
	if (!k) {
		snprintf(err, errlen, "--set %s: unknown key [%s] %s (see docs/CONFIG.md)", set, sec, name);
		return -EINVAL;
	}
	if (k->flags & REPEAT) {
		snprintf(err, errlen, "--set %s: [%s] %s is a repeated key; edit the config file instead", set, sec, name);
		return -EINVAL;
	}
	char detail[CONFIG_ERR_MAX - 64];
	if (config_key_parse(c, k, config_skip_blank(eq + 1), 0, "", detail, sizeof(detail)) < 0) {
		snprintf(err, errlen, "--set %s: [%s] %s: %s", set, sec, name, detail);
		return -EINVAL;
	}
	p->key_line[k - config_keys] = 0;
	p->def_bad[k - config_keys][0] = '\0';
	/* steps and epochs are two ways to say one thing: overriding one on the
	 * command line replaces the other from the file instead of clashing. */
	if (k->off == offsetof(struct config, train.steps))
		c->train.epochs = 0;
	else if (k->off == offsetof(struct config, train.epochs))
		c->train.steps = 0;
	return 0;
}

static int read_text(const char *path, char **out, char *err, size_t errlen)
{
	enum { MAX_CONFIG = 1 << 20 };
	FILE *f = fopen(path, "rb");
	if (!f) {
		snprintf(err, errlen, "%s: cannot open config: %s", path, strerror(errno));
		return -ENOENT;
	}
	char *buf = malloc(MAX_CONFIG + 1);
	if (!buf) {
		fclose(f);
		snprintf(err, errlen, "%s: out of memory", path);
		return -ENOMEM;
	}
	size_t n = fread(buf, 1, MAX_CONFIG + 1, f);
	int bad = ferror(f);
	fclose(f);
	if (bad || n > MAX_CONFIG || memchr(buf, '\0', n)) {
		snprintf(err, errlen, "%s: %s", path, bad ? "read error" : n > MAX_CONFIG ?
			 "larger than 1 MiB; is this a config file?" : "contains NUL bytes; is this a config file?");
		free(buf);
		return -EINVAL;
	}
	buf[n] = '\0';
	*out = buf;
	return 0;
}

int config_parse_string(struct config *c, const char *name, const char *text,
			char *err, size_t errlen)
{
	struct parse *p = calloc(1, sizeof(*p));
	if (!p) {
		snprintf(err, errlen, "%s: out of memory", name);
		return -ENOMEM;
	}
	config_defaults(c, name);
	p->c = c;
	p->name = name;
	p->text = text;
	int r = parse_text(p, err, errlen);
	if (!r)
		r = config_finish(c, p, err, errlen);
	if (!r)
		snprintf(c->path, sizeof(c->path), "%s", name);
	free(p);
	return r;
}

int config_load(struct config *c, const char *path, const char *const *sets, int nsets,
		char *err, size_t errlen)
{
	char *text = NULL;
	struct parse *p = calloc(1, sizeof(*p));
	if (!p) {
		snprintf(err, errlen, "%s: out of memory", path);
		return -ENOMEM;
	}
	int r = read_text(path, &text, err, errlen);
	if (r)
		goto out;
	const char *slash = strrchr(path, '/');
	const char *base = slash ? slash + 1 : path;
	config_defaults(c, base);
	snprintf(c->path, sizeof(c->path), "%s", path);
	p->c = c;
	p->name = path;
	p->text = text;
	/* Relative paths in the file, and the defaults (cluster.key, NAME.ckpt),
	 * are taken from the file's directory, made absolute so that the output
	 * of `pstrain check` loads back from anywhere. */
	char dir[DATA_PATH_MAX];
	size_t n = slash ? (size_t)(slash - path) : 1;
	if (slash && n == 0)
		n = 1;   /* "/cluster.ini" lives in "/" */
	if (n >= sizeof(dir)) {
		snprintf(err, errlen, "%s: path too long", path);
		r = -EINVAL;
		goto out;
	}
	memcpy(dir, slash ? path : ".", n);
	dir[n] = '\0';
	char *abs = realpath(dir, NULL);
	if (!abs || strlen(abs) >= sizeof(p->dir)) {
		snprintf(err, errlen, "%s: cannot resolve its directory: %s", path, abs ? "path too long" : strerror(errno));
		free(abs);
		r = -EINVAL;
		goto out;
	}
	snprintf(p->dir, sizeof(p->dir), "%s", abs);
	free(abs);
	for (size_t i = 0; i < config_nkeys; i++) {
		const struct key_def *k = &config_keys[i];
		char text_def[DATA_PATH_MAX + 16];
		const char *t = k->def ? default_text(k, base, text_def, sizeof(text_def)) : NULL;
		if (k->type == K_PATH && t && t[0] && t[0] != '/')
			(void)config_key_parse(c, k, t, 0, p->dir, p->def_bad[i], sizeof(p->def_bad[i]));
	}
	r = parse_text(p, err, errlen);
	for (int i = 0; !r && i < nsets; i++)
		r = config_set(c, p, sets[i], err, errlen);
	/* A default too long to resolve (a deep directory) matters only if
	 * neither the file nor --set replaced it. */
	for (size_t i = 0; !r && i < config_nkeys; i++)
		if (p->def_bad[i][0]) {
			snprintf(err, errlen, "%s: [%s] %s: its default beside this file: %s; set %s", path,
				 config_keys[i].section, config_keys[i].key, p->def_bad[i], config_keys[i].key);
			r = -EINVAL;
		}
	if (!r)
		r = config_finish(c, p, err, errlen);
	if (!r)
		r = config_check_files(c, p, err, errlen);
out:
	free(text);
	free(p);
	return r;
}

/* The shortest %g text that parses back to the same value, so that
 * config_print's output loads to the same config. */
