/* The key table of cluster.ini: every key, its type, range and default
 * (config_keys.h says what a row holds). */
#include "config_keys.h"

#include <stddef.h>

static const char *const mode_names[] = { "sync", "async", NULL };
static const char *const optim_names[] = { "sgd", "momentum", "adam", NULL };
static const char *const sched_names[] = { "constant", "step", "cosine", NULL };
static const char *const format_names[] = { "idx", "csv", "criteo", NULL };
static const char *const header_names[] = { "auto", "yes", "no", NULL };
static const char *const loss_names[] = { "softmax_cross_entropy", "sigmoid_cross_entropy", NULL };
/* enum sparse_kind's order */
static const char *const embed_optim_names[] = { "adagrad", "lazy_adam", NULL };
static const char *const wire_dtype_names[] = { "fp32", "bf16", "bf16_grads", "bf16_params", NULL };
static const char *const cipher_names[] = { "auto", "aegis-256", "aes-256-gcm", "chacha20-poly1305",
					    NULL };

#define FMNIST "/usr/share/datasets/fashion-mnist/"
#define OFF(f) offsetof(struct config, f)

const struct key_def config_keys[] = {
	{ "cluster", "ps", K_HOSTS, OFF(cluster.ps), OFF(cluster.nps), 0, 0, LIST, NULL,
	  "127.0.0.1:2222, 127.0.0.1:2223" },
	{ "cluster", "workers", K_HOSTS, OFF(cluster.workers), OFF(cluster.nworkers), 0, 0, LIST, NULL,
	  "127.0.0.1:2224, 127.0.0.1:2225" },
	{ "cluster", "max_workers", K_INT, OFF(cluster.max_workers), 0, 0, CONFIG_MAX_HOSTS, 0, NULL, "0" },
	{ "cluster", "min_workers", K_INT, OFF(cluster.min_workers), 0, 0, CONFIG_MAX_HOSTS, 0, NULL, "0" },
	{ "cluster", "listen", K_HOSTS, OFF(cluster.listen), OFF(cluster.nlisten), 0, 0, LIST, NULL, "" },
	{ "cluster", "key_file", K_PATH, OFF(cluster.key_file), 0, 0, 0, 0, NULL, "cluster.key" },
	{ "cluster", "connect_timeout", K_DOUBLE, OFF(cluster.connect_timeout), 0, 1, 86400, 0, NULL, "60" },
	{ "cluster", "crypto_threads", K_INT, OFF(cluster.crypto_threads), 0, 0, 8, 0, NULL, "0" },
	{ "cluster", "send_buffer_kib", K_INT, OFF(cluster.send_buffer_kib), 0, 0, 1 << 20, AUTO, NULL, "auto" },
	{ "cluster", "wire_dtype", K_ENUM, OFF(cluster.wire_dtype), 0, 0, 0, 0, wire_dtype_names, "fp32" },
	{ "cluster", "cipher", K_ENUM, OFF(cluster.cipher), 0, 0, 0, 0, cipher_names, "auto" },
	{ "cluster", "overlap", K_BOOL, OFF(cluster.overlap), 0, 0, 0, AUTO, NULL, "auto" },
	{ "cluster", "wire_pack", K_BOOL, OFF(cluster.wire_pack), 0, 0, 0, AUTO, NULL, "auto" },
	{ "cluster", "local_socket", K_BOOL, OFF(cluster.local_socket), 0, 0, 0, 0, NULL, "true" },
	{ "cluster", "local_ring", K_BOOL, OFF(cluster.local_ring), 0, 0, 0, 0, NULL, "true" },
	{ "cluster", "socket_dir", K_PATH, OFF(cluster.socket_dir), 0, 0, 0, 0, NULL, "" },
	{ "cluster", "peer_timeout", K_DOUBLE, OFF(cluster.peer_timeout), 0, 1, 86400, 0, NULL, "60" },
	{ "cluster", "handshake_timeout", K_DOUBLE, OFF(cluster.handshake_timeout), 0, 0.05, 60, 0, NULL, "1" },

	{ "train", "mode", K_ENUM, OFF(train.mode), 0, 0, 0, 0, mode_names, "sync" },
	{ "train", "replicas_to_aggregate", K_INT, OFF(train.replicas_to_aggregate), 0,
	  0, CONFIG_MAX_HOSTS, 0, NULL, "0" },
	{ "train", "slices", K_INT, OFF(train.slices), 0, 1, CONFIG_MAX_HOSTS, AUTO, NULL, "auto" },
	{ "train", "max_staleness", K_INT, OFF(train.max_staleness), 0, 0, 1e9, 0, NULL, "0" },
	{ "train", "staleness_lr", K_BOOL, OFF(train.staleness_lr), 0, 0, 0, 0, NULL, "true" },
	{ "train", "steps", K_LONG, OFF(train.steps), 0, 0, 1e12, 0, NULL, "0" },
	{ "train", "epochs", K_LONG, OFF(train.epochs), 0, 0, 1e6, 0, NULL, "0" },
	{ "train", "batch_size", K_INT, OFF(train.batch_size), 0, 1, 1 << 20, 0, NULL, "256" },
	{ "train", "optimizer", K_ENUM, OFF(train.optim.kind), 0, 0, 0, 0, optim_names, "momentum" },
	{ "train", "learning_rate", K_FLOAT, OFF(train.optim.lr), 0, 0, 1e3, LO_OPEN, NULL, "0.05" },
	{ "train", "momentum", K_FLOAT, OFF(train.optim.momentum), 0, 0, 1, HI_OPEN, NULL, "0.9" },
	{ "train", "nesterov", K_BOOL, OFF(train.optim.nesterov), 0, 0, 0, 0, NULL, "false" },
	{ "train", "weight_decay", K_FLOAT, OFF(train.optim.weight_decay), 0, 0, 1, HI_OPEN, NULL, "0" },
	{ "train", "adam_beta1", K_FLOAT, OFF(train.optim.beta1), 0, 0, 1, HI_OPEN, NULL, "0.9" },
	{ "train", "adam_beta2", K_FLOAT, OFF(train.optim.beta2), 0, 0, 1, HI_OPEN, NULL, "0.999" },
	{ "train", "adam_epsilon", K_FLOAT, OFF(train.optim.eps), 0, 0, 1, LO_OPEN, NULL, "1e-8" },
	{ "train", "lr_schedule", K_ENUM, OFF(train.optim.schedule), 0, 0, 0, 0, sched_names, "constant" },
	{ "train", "lr_decay_steps", K_LONG, OFF(train.optim.decay_steps), 0, 1, 1e12, 0, NULL, "1000" },
	{ "train", "lr_decay_rate", K_FLOAT, OFF(train.optim.decay_rate), 0, 0, 1, LO_OPEN, NULL, "0.1" },
	{ "train", "warmup_steps", K_LONG, OFF(train.optim.warmup_steps), 0, 0, 1e12, 0, NULL, "0" },
	{ "train", "embedding_optimizer", K_ENUM, OFF(train.embed_optimizer), 0, 0, 0, 0, embed_optim_names,
	  "adagrad" },
	{ "train", "embedding_learning_rate", K_FLOAT, OFF(train.embed_lr), 0, 0, 1e3, LO_OPEN, NULL, "0.05" },
	{ "train", "seed", K_U64, OFF(train.seed), 0, 0, 0, 0, NULL, "1" },
	{ "train", "checkpoint_dir", K_PATH, OFF(train.checkpoint_dir), 0, 0, 0, NAMED, NULL, ".ckpt" },
	{ "train", "log_dir", K_PATH, OFF(train.log_dir), 0, 0, 0, NAMED, NULL, ".logs" },
	{ "train", "checkpoint_every", K_LONG, OFF(train.checkpoint_every), 0, 0, 1e12, 0, NULL, "500" },
	{ "train", "keep_checkpoints", K_INT, OFF(train.keep_checkpoints), 0, 1, 1000000, 0, NULL, "3" },
	{ "train", "eval_every", K_LONG, OFF(train.eval_every), 0, 0, 1e12, 0, NULL, "0" },
	{ "train", "threads", K_INT, OFF(train.threads), 0, 0, 1024, 0, NULL, "0" },

	{ "ps", "memory_limit", K_INT, OFF(ps.memory_limit), 0, 0, 1 << 30, 0, NULL, "0" },
	{ "ps", "apply_threads", K_INT, OFF(ps.apply_threads), 0, 0, 8, 0, NULL, "0" },

	{ "gpu", "devices", K_DEVICES, OFF(gpu.devices), OFF(gpu.ndevices), 0, CONFIG_MAX_DEVICES - 1,
	  LIST, NULL, "all" },
	{ "gpu", "memory_fraction", K_DOUBLE, OFF(gpu.memory_fraction), 0, 0, 1, LO_OPEN, NULL, "0.9" },
	{ "gpu", "allow_growth", K_BOOL, OFF(gpu.allow_growth), 0, 0, 0, 0, NULL, "false" },
	{ "gpu", "soft_placement", K_BOOL, OFF(gpu.soft_placement), 0, 0, 0, 0, NULL, "true" },
	{ "gpu", "log_placement", K_BOOL, OFF(gpu.log_placement), 0, 0, 0, 0, NULL, "false" },
	{ "gpu", "tf32", K_BOOL, OFF(gpu.tf32), 0, 0, 0, 0, NULL, "false" },
	{ "gpu", "cuda_graphs", K_BOOL, OFF(gpu.cuda_graphs), 0, 0, 0, 0, NULL, "true" },

	{ "data", "format", K_ENUM, OFF(data.format), 0, 0, 0, 0, format_names, "idx" },
	{ "data", "train_images", K_PATH, OFF(data.train_images), 0, 0, 0, 0, NULL,
	  FMNIST "train-images-idx3-ubyte.gz" },
	{ "data", "train_labels", K_PATH, OFF(data.train_labels), 0, 0, 0, 0, NULL,
	  FMNIST "train-labels-idx1-ubyte.gz" },
	{ "data", "test_images", K_PATH, OFF(data.test_images), 0, 0, 0, 0, NULL,
	  FMNIST "t10k-images-idx3-ubyte.gz" },
	{ "data", "test_labels", K_PATH, OFF(data.test_labels), 0, 0, 0, 0, NULL,
	  FMNIST "t10k-labels-idx1-ubyte.gz" },
	{ "data", "train_csv", K_PATH, OFF(data.train_csv), 0, 0, 0, 0, NULL, "" },
	{ "data", "test_csv", K_PATH, OFF(data.test_csv), 0, 0, 0, 0, NULL, "" },
	{ "data", "label_column", K_LABEL_COLUMN, OFF(data.label_column), 0, 0, 1e6, 0, NULL, "first" },
	{ "data", "header", K_ENUM, OFF(data.header), 0, 0, 0, 0, header_names, "auto" },
	{ "data", "test_fraction", K_DOUBLE, OFF(data.test_fraction), 0, 0, 1, LO_OPEN | HI_OPEN, NULL, "0.2" },
	{ "data", "max_resident_mb", K_INT, OFF(data.max_resident_mb), 0, 1, 1 << 24, 0, NULL, "4096" },

	{ "model", "input", K_INPUT, OFF(model.in_h), 0, 1, 65536, 0, NULL, "28x28x1" },
	{ "model", "layer", K_LAYER, OFF(model.layers), OFF(model.nlayers), 0, 0, REPEAT, NULL, NULL },
	{ "model", "loss", K_ENUM, OFF(model.loss), 0, 0, 0, 0, loss_names, "softmax_cross_entropy" },
};

const size_t config_nkeys = sizeof(config_keys) / sizeof(config_keys[0]);

const char *const config_sections[] = { "cluster", "train", "ps", "gpu", "data", "model" };
const size_t config_nsections = 6;

const char *const config_default_layers[] = { "dense 512", "relu", "dense 512", "relu", "dense 10" };
const size_t config_ndefault_layers =
	sizeof(config_default_layers) / sizeof(config_default_layers[0]);
_Static_assert(sizeof(config_keys) / sizeof(config_keys[0]) <= CONFIG_MAX_KEYS,
	       "more keys than CONFIG_MAX_KEYS: raise it");
