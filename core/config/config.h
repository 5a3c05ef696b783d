/* cluster.ini: the resolved configuration of a run.
 *
 * Parsing follows wireguard-tools' config.c: one table row per key with a
 * strict parser, defaults applied by parsing the default text through the
 * same parsers, presence bits to reject duplicate keys, and a finish step for
 * rules that span keys. Every failure is one line naming the file, the line,
 * the key and what was expected. docs/CONFIG.md is the user's reference and
 * must list the same keys as the table in config.c. */
#ifndef PSTRAIN_CONFIG_H
#define PSTRAIN_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "../data/data.h"
#include "../nn/model.h"
#include "../nn/optim.h"

#define CONFIG_MAX_HOSTS 256
#define CONFIG_MAX_DEVICES 64
#define CONFIG_HOST_MAX 256
#define CONFIG_ERR_MAX 1024

enum train_mode {
	MODE_SYNC,
	MODE_ASYNC,
};

/* [cluster] wire_dtype: which tensors travel as bfloat16 (half the bytes)
 * rather than float32. The ps keeps float32 master weights either way. */
enum wire_precision {
	PRECISION_FP32,        /* both directions float32 */
	PRECISION_BF16,        /* gradients and parameters bf16 */
	PRECISION_BF16_GRADS,  /* gradients (PUSH) bf16, parameters float32 */
	PRECISION_BF16_PARAMS, /* parameters (PARAMS) bf16, gradients float32 */
};

/* [cluster] cipher: what this node offers to seal frames with; a
 * connection uses the best cipher both ends offer, ChaCha20-Poly1305 when
 * they share no other. */
enum cipher_choice {
	CIPHER_AUTO,     /* every cipher this CPU runs */
	CIPHER_AEGIS256, /* AEGIS-256 only (needs AES-NI) */
	CIPHER_AES256GCM, /* AES-256-GCM only (needs AES-NI and PCLMUL) */
	CIPHER_CHACHA20, /* ChaCha20-Poly1305 only */
};

struct host {
	char name[CONFIG_HOST_MAX];   /* DNS name, IPv4, or IPv6 without brackets */
	uint16_t port;
};

struct config {
	char path[DATA_PATH_MAX];   /* the file it came from, for messages */

	struct {
		struct host ps[CONFIG_MAX_HOSTS];
		int nps;
		struct host workers[CONFIG_MAX_HOSTS];
		int nworkers;
		int max_workers;            /* resolved: nworkers..CONFIG_MAX_HOSTS: worker
					     * indexes a ps admits (a scheduler may give a
					     * worker a longer list than the others') */
		int min_workers;            /* resolved: 1..max_workers; below it the
					     * worker set is elastic (config_elastic) */
		struct host listen[CONFIG_MAX_HOSTS]; /* what each ps binds; none: its ps entry */
		int nlisten;                /* 0, 1 (every ps) or nps (ps K: entry K) */
		char key_file[DATA_PATH_MAX];
		double connect_timeout;     /* seconds a worker retries a ps */
		int crypto_threads;         /* sealing/opening threads, 0 = auto, 1 = none */
		int send_buffer_kib;        /* SO_SNDBUF of peer connections (KiB); 0 = the kernel's,
					     * CONFIG_INT_AUTO = sized from measurements (net/sndbuf.h) */
		int wire_dtype;             /* enum wire_precision */
		int cipher;                 /* enum cipher_choice */
		int overlap;                /* sync pieces: push while backward runs: CONFIG_OVERLAP_* */
		int wire_pack;              /* float32 packed on TCP links: CONFIG_OVERLAP_* too */
		int local_socket;           /* a ps on this host over a Unix socket, unencrypted */
		int local_ring;             /* and that connection's bytes through shared memory */
		char socket_dir[DATA_PATH_MAX]; /* where those sockets are; "" = /tmp/pstrain-UID */
		double peer_timeout;        /* seconds a ps waits for a lost worker to come back */
		double handshake_timeout;   /* seconds a new connection has to greet a ps */
	} cluster;

	struct {
		enum train_mode mode;
		int replicas_to_aggregate;  /* resolved: 1..config_slices(c, 1) */
		int slices;                 /* the global batch's slices; CONFIG_INT_AUTO:
					     * config_slices's default */
		int max_staleness;
		int staleness_lr;           /* async: a gradient's step divided by its staleness */
		long steps;                 /* 0 = run `epochs` epochs instead */
		long epochs;
		int batch_size;
		struct optim_config optim;
		int embed_optimizer;        /* enum sparse_kind: the embedding tables' optimizer */
		float embed_lr;             /* its learning rate (no schedule: see docs/CONFIG.md) */
		uint64_t seed;
		char checkpoint_dir[DATA_PATH_MAX];
		char log_dir[DATA_PATH_MAX];    /* TensorBoard event files; "" = none */
		long checkpoint_every;      /* 0 = only at the end (and when stopped) */
		int keep_checkpoints;       /* newest complete checkpoints kept, >= 1 */
		long eval_every;            /* 0 = once per epoch */
		int threads;                /* CPU threads for OpenBLAS, 0 = one per CPU */
	} train;

	struct {
		int memory_limit;           /* MiB a ps's shard (or a local run's model) may
					     * take: parameters, embedding rows and their
					     * optimizer state; 0 = no limit (core/memlimit.h) */
		int apply_threads;          /* threads stepping a sync shard's pieces; 0 = auto
					     * (cluster/ps_apply.h) */
	} ps;

	struct {
		int all;                    /* devices = all */
		int devices[CONFIG_MAX_DEVICES];
		int ndevices;
		double memory_fraction;
		int allow_growth;
		int soft_placement;
		int log_placement;
		int tf32;                   /* cuBLAS may use TF32 tensor cores */
		int cuda_graphs;            /* replay a local step as one CUDA graph */
	} gpu;

	struct data_config data;
	struct model_spec model;
};

/* Loads defaults, then the file at path (relative file paths inside it are
 * taken relative to the file's directory), then each "section.key=value"
 * override (relative paths taken from the current directory), then checks
 * cross-key rules and that the data files exist. Returns 0, or -EINVAL /
 * -ENOENT / -EIO with one line in err. */
int config_load(struct config *c, const char *path, const char *const *sets, int nsets,
		char *err, size_t errlen);

/* Same, from a string; name is used in messages and relative paths resolve
 * against the current directory. Data files are not checked. */
int config_parse_string(struct config *c, const char *name, const char *text,
			char *err, size_t errlen);

/* The resolved config as INI text that config_load accepts. */
void config_print(const struct config *c, FILE *f);

/* [train] slices resolved: how many slices of batch_size samples one
 * step trains and averages (core/job.h). Unset, a cluster (cluster 1)
 * has one per worker (max_workers) and `local` one, the numbers every
 * config had before the key existed. */
int config_slices(const struct config *c, int cluster);

/* Whether the worker set of a cluster may change while it runs: [cluster]
 * min_workers below max_workers (docs/ELASTIC.md). */
int config_elastic(const struct config *c);

#define CONFIG_HASH_BYTES 32

/* [cluster] overlap and wire_pack: booleans that also take "auto"
 * (cluster/autoflow.h). */
enum { CONFIG_OVERLAP_OFF = 0, CONFIG_OVERLAP_ON = 1, CONFIG_OVERLAP_AUTO = 2 };
/* An integer key that also takes "auto" ([cluster] send_buffer_kib): -1,
 * below every range such a key has. */
#define CONFIG_INT_AUTO (-1)

/* BLAKE2b of every training-relevant key (model, optimizer, data format,
 * seed, topology...), defaults included; node-local keys (paths, [gpu],
 * eval_every, threads, connect_timeout, peer_timeout, handshake_timeout,
 * crypto_threads, send_buffer_kib, listen) are left out, and so are the
 * workers' entries (their number counts, as max_workers: a scaled TFJob
 * gives its new pods longer lists). Nodes of one cluster must agree on it. Returns 0 or -ENOMEM. */
int config_hash(const struct config *c, uint8_t out[CONFIG_HASH_BYTES]);

#endif
