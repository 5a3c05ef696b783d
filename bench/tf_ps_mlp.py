#!/usr/bin/env python3
"""TensorFlow ParameterServerStrategy peer of pstrain's sync cluster.

One process per task of a TF_CONFIG-style cluster: 2 ps, 2 workers and a
chief, the coordinator (tf.distribute.experimental.ParameterServerStrategy
with a ClusterCoordinator). bench/netlab starts each in its own network
namespace: ps on hosts 0 and 1, workers on 2 and 3, the chief on 4. The ps
and worker tasks are plain tf.distribute.Server processes that run until
they are killed; the chief builds the model, schedules the steps and
prints the results. The run is the default cluster.ini's, as far as TF
lets the two trainers share it:

  model     784-512-512-10 MLP (dense/ReLU/dense/ReLU/dense), weights
            initialized as pstrain does (He-normal before a ReLU,
            Glorot-uniform for the last layer, zero biases; not the same
            numbers: numpy's generator, seeded with --seed)
  variables every weight, bias and momentum buffer split in two along its
            first axis (FixedShardsPartitioner(2)), one half on each ps;
            each momentum half lives with its weight half
  data      Fashion-MNIST from the IDX gz files, pixels / 255; each worker
            reads the training files itself (a per-worker tf.data dataset:
            the whole set, decoded in-graph, cached) and the chief the test
            files
  batches   per epoch a permutation of the 60,000 training samples (seeded
            with seed and epoch); the k-th scheduled step function trains
            samples [(s mod spe)*W*B + r*B, +B) of step s = k div W,
            r = k mod W, spe = floor(n / (W*B)): the samples pstrain's
            worker r trains at step s (core/job.h), the remainder dropped.
            The chief sends the B indices with each function; the worker
            that is free runs it.
  loss      softmax cross-entropy, mean over the batch
  optimizer SGD, momentum 0.9 (ResourceApplyMomentum on the ps that holds
            the variable: v = mu v + g; p -= lr v, as core/nn/optim.c), lr 0.05
            with cosine decay over the run's steps
            (lr * (1 + cos(pi * s / total)) / 2), the lr of step s passed
            with its function

ParameterServerStrategy is asynchronous: each worker's function reads the
parameters, computes the gradient of its own batch and applies it at once
(no averaging with the other worker's, no staleness bound). A "step" here
is pstrain's: one update's worth of W workers x B samples, that is W
scheduled functions, so steps/s = samples/s / (W * B) (256 by default).
pstrain's sync step averages the two gradients into one update; here the
two are applied one after the other, each with the step's lr (as pstrain
async applies them, less its staleness_lr).

--mode speed: --warmup steps, coordinator.join(), then --steps timed
steps (W * steps functions) closed by coordinator.join(): the chief's wall
clock between the two joins. Around the window the chief prints
`tfps: window begin` and `tfps: window end` (the bench reads the
processes' CPU times at them), then one line:

  tfps: steps/s S step_ms T samples/s X functions F steps N chief_cpu_ms C loss L

(C: the chief's own CPU time per step over the window: scheduling.)

--mode tta: trains --epochs epochs; every --eval-every steps (and after
the last) the chief joins (the workers finish what was scheduled, then
wait), reads the parameters from the ps and evaluates the test set
itself, then prints

  eval: step S test_acc A% test_loss L elapsed E

flushed, E seconds since the strategy connected to the cluster. With
--target it exits at the first line with A >= target.

Threads: --threads intra-op threads in every task and as many inter-op
threads (the servers' ConfigProto, tf.config.threading on the chief), but
at least 2 inter-op threads on a worker: with 1, the first step function
that updates a ps variable never returns (TF 2.19.1; a function that only
reads the variables does). In gdb the stuck worker's eager service
handler (Enqueue, on a pool thread) waits in KernelAndDeviceFunc::Run for
the function, which never finishes; with 2 it does (tensorflow/tensorflow
issue 38969 is a like hang in one process, fixed there by 2 as well).
Kernels still run on the one intra-op thread. OpenBLAS and OpenMP at --threads through the environment
(TF's kernels are Eigen's and oneDNN's); TF's gRPC has threads of its own.
CPU only: CUDA_VISIBLE_DEVICES is emptied before TF loads.

TF's gRPC is neither authenticated nor encrypted: anyone who reaches a
task's port can run ops in it. Run it on a private network only.

Needs TensorFlow (tensorflow-cpu from PyPI in build/tfvenv: `make
deps-bench`); run with build/tfvenv/bin/python.
"""
import argparse
import gzip
import json
import math
import os
import resource
import struct
import sys
import time

FMNIST_DIR = "/usr/share/datasets/fashion-mnist"


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def idx_header(images, labels):
    """(n, rows * cols) of an IDX image/label pair, or SystemExit."""
    def head(p, k):
        op = gzip.open if p.endswith(".gz") else open
        with op(p, "rb") as f:
            return f.read(k)
    img, lab = head(images, 16), head(labels, 8)
    if len(img) < 16 or len(lab) < 8:
        raise SystemExit("tf_ps_mlp: %s / %s: too short for IDX" % (images, labels))
    magic, n, r, c = struct.unpack(">IIII", img)
    if magic != 0x803 or struct.unpack(">II", lab) != (0x801, n):
        raise SystemExit("tf_ps_mlp: %s / %s: not a matching IDX image/label pair" % (images, labels))
    return n, r * c


def load_idx(images, labels, np):
    """(x float32 (n, 784) in [0, 1], y int32 (n)) from IDX files (gz or raw)."""
    n, d = idx_header(images, labels)
    op = gzip.open if images.endswith(".gz") else open
    with op(images, "rb") as f:
        x = np.frombuffer(f.read(), dtype=np.uint8, offset=16, count=n * d).reshape(n, d)
    op = gzip.open if labels.endswith(".gz") else open
    with op(labels, "rb") as f:
        y = np.frombuffer(f.read(), dtype=np.uint8, offset=8, count=n)
    return x.astype(np.float32) / 255.0, y.astype(np.int32)


def addrs(s, what, k):
    a = [x.strip() for x in s.split(",") if x.strip()]
    if len(a) != k:
        raise SystemExit("tf_ps_mlp: --%s %s: expected %d HOST:PORT" % (what, s, k))
    return a


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", choices=("ps", "worker", "chief"), required=True)
    ap.add_argument("--index", type=int, default=0, help="ps / worker: the task's index")
    ap.add_argument("--ps", required=True, help="HOST:PORT,HOST:PORT of the 2 ps")
    ap.add_argument("--workers", required=True, help="HOST:PORT,HOST:PORT of the 2 workers")
    ap.add_argument("--chief", required=True, help="HOST:PORT of the chief (coordinator)")
    ap.add_argument("--mode", choices=("speed", "tta"), default="speed")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    ap.add_argument("--inter-op-threads", type=int, default=0,
                    help="default: --threads, but at least 2 on a worker (see Threads above)")
    ap.add_argument("--batch", type=int, default=128, help="per worker (default 128)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=100, help="speed: warm-up steps")
    ap.add_argument("--steps", type=int, default=100, help="speed: timed steps")
    ap.add_argument("--eval-every", type=int, default=117, help="tta: steps between evaluations")
    ap.add_argument("--target", type=float, default=0.0,
                    help="tta: stop after the first evaluation at or above this test accuracy (%%); 0 = never")
    ap.add_argument("--data-dir", default=FMNIST_DIR)
    args = ap.parse_args()

    cluster = {"ps": addrs(args.ps, "ps", 2), "worker": addrs(args.workers, "workers", 2),
               "chief": addrs(args.chief, "chief", 1)}
    task = {"type": args.role, "index": 0 if args.role == "chief" else args.index}
    if not 0 <= task["index"] < len(cluster[args.role]):
        raise SystemExit("tf_ps_mlp: --index %d: no such %s" % (args.index, args.role))
    # Before TF loads: its cluster, CPU only, thread pools at --threads.
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": task})
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(v, str(args.threads))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    inter = args.inter_op_threads or (max(2, args.threads) if args.role == "worker" else args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()

    if args.role in ("ps", "worker"):
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=args.threads,
                                          inter_op_parallelism_threads=inter,
                                          device_count={"GPU": 0})
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                      task_index=resolver.task_id, protocol="grpc",
                                      config=config, start=True)
        print("# tf_ps_mlp: tensorflow %s, %s %d serving at %s (threads %d, inter-op %d)" % (
            tf.__version__, args.role, args.index, cluster[args.role][args.index], args.threads, inter),
            flush=True)
        server.join()   # until killed
        return 0

    # ---- the chief: the coordinator ----------------------------------------
    dd = args.data_dir
    train_img = os.path.join(dd, "train-images-idx3-ubyte.gz")
    train_lab = os.path.join(dd, "train-labels-idx1-ubyte.gz")
    n, d = idx_header(train_img, train_lab)
    if d != 784:
        raise SystemExit("tf_ps_mlp: %s: %d pixels per image, the model takes 784" % (train_img, d))
    Xt = Yt = None
    if args.mode == "tta":
        Xt, Yt = load_idx(os.path.join(dd, "t10k-images-idx3-ubyte.gz"),
                          os.path.join(dd, "t10k-labels-idx1-ubyte.gz"), np)

    W, B = len(cluster["worker"]), args.batch
    spe = n // (W * B)
    if spe < 1:
        raise SystemExit("tf_ps_mlp: %d samples do not make one step of %d x %d" % (n, W, B))
    total = spe * args.epochs

    t_init = time.perf_counter()
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2))
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    t_up = time.perf_counter()

    # Initial weights on the chief (numpy), sent to the ps once.
    rng = np.random.default_rng(args.seed)
    sizes = [(784, 512), (512, 512), (512, 10)]
    init = []
    for i, (c, oc) in enumerate(sizes):
        if i < len(sizes) - 1:
            w = rng.normal(0.0, math.sqrt(2.0 / c), (c, oc))           # He-normal, fan_in
        else:
            a = math.sqrt(6.0 / (c + oc))
            w = rng.uniform(-a, a, (c, oc))                              # Glorot-uniform
        init += [w.astype(np.float32), np.zeros(oc, np.float32)]
    with strategy.scope():
        params = [tf.Variable(v, name="p%d" % i) for i, v in enumerate(init)]   # ShardedVariables
        shards = [s for p in params for s in p.variables]
        moms = []
        for s in shards:   # each momentum half on its weight half's ps
            with strategy.extended.colocate_vars_with(s):
                moms.append(tf.Variable(tf.zeros(s.shape, tf.float32), trainable=False,
                                        name=s.name.split(":")[0] + "/momentum"))
    P = sum(int(np.prod(v.shape)) for v in init)
    placement = sorted({s.device for s in shards + moms})

    def per_worker_data():
        """The training set on the worker, read and decoded there."""
        def load(_):
            img = tf.io.decode_raw(tf.io.decode_compressed(tf.io.read_file(train_img), "GZIP"), tf.uint8)
            lab = tf.io.decode_raw(tf.io.decode_compressed(tf.io.read_file(train_lab), "GZIP"), tf.uint8)
            x = tf.reshape(tf.cast(img[16:16 + n * d], tf.float32) / 255.0, [n, d])
            return x, tf.cast(lab[8:8 + n], tf.int32)
        return tf.data.Dataset.range(1).map(load).cache().repeat()

    data_iter = iter(coordinator.create_per_worker_dataset(per_worker_data))
    mu = tf.constant(args.momentum, tf.float32)

    def forward(x):
        h = x
        for i in range(0, len(params), 2):
            h = tf.matmul(h, params[i]) + params[i + 1]
            if i + 2 < len(params):
                h = tf.nn.relu(h)
        return h   # logits (B, 10)

    @tf.function
    def train_step(it, idx, lr):
        def replica(xy, idx, lr):
            x, y = tf.gather(xy[0], idx), tf.gather(xy[1], idx)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, forward(x)))
            grads = tape.gradient(loss, shards)
            for s, m, g in zip(shards, moms, grads):   # each on the ps of s
                tf.raw_ops.ResourceApplyMomentum(var=s.handle, accum=m.handle, lr=lr, grad=g,
                                                 momentum=mu, use_locking=False)
            return loss
        return strategy.run(replica, args=(next(it), idx, lr))

    perm = {"epoch": -1, "p": None}

    def schedule_step(s):
        """The W functions of step s (s < total)."""
        e = s // spe
        if e != perm["epoch"]:
            perm["p"] = np.random.default_rng(args.seed * 1000003 + e).permutation(n).astype(np.int32)
            perm["epoch"] = e
        lr = tf.constant(args.lr * 0.5 * (1.0 + math.cos(math.pi * min(s, total) / total)), tf.float32)
        first = (s % spe) * W * B
        last = None
        for r in range(W):
            idx = tf.constant(perm["p"][first + r * B:first + (r + 1) * B])
            last = coordinator.schedule(train_step, args=(data_iter, idx, lr))
        return last

    def evaluate():
        """(accuracy %, mean loss) on the test set, parameters read from the ps."""
        ws = [tf.convert_to_tensor(p).numpy() for p in params]
        right, loss = 0, 0.0
        for i in range(0, Xt.shape[0], 1000):
            h = Xt[i:i + 1000]
            for j in range(0, len(ws), 2):
                h = h @ ws[j] + ws[j + 1]
                if j + 2 < len(ws):
                    h = np.maximum(h, 0.0)
            h = h.astype(np.float64)
            z = h - h.max(1, keepdims=True)
            lse = np.log(np.exp(z).sum(1))
            y = Yt[i:i + 1000]
            loss += float((lse - z[np.arange(len(y)), y]).sum())
            right += int((h.argmax(1) == y).sum())
        return 100.0 * right / Xt.shape[0], loss / Xt.shape[0]

    print("# tf_ps_mlp: tensorflow %s, ParameterServerStrategy (%d ps, %d workers, chief at %s), "
          "variables in 2 shards each on %s; %d parameters; batch %d per worker, a step = %d functions; "
          "threads %d (inter-op %d); %d steps per epoch; cluster up in %.2f s" % (
              tf.__version__, len(cluster["ps"]), W, cluster["chief"][0], ", ".join(placement), P, B, W,
              tf.config.threading.get_intra_op_parallelism_threads(),
              tf.config.threading.get_inter_op_parallelism_threads(), spe, t_up - t_init), flush=True)

    if args.mode == "tta":
        t0 = t_up
        for s in range(total):
            if s > 0 and s % args.eval_every == 0:
                coordinator.join()
                acc, tl = evaluate()
                print("eval: step %d test_acc %.2f%% test_loss %.4f elapsed %.3f" % (
                    s, acc, tl, time.perf_counter() - t0), flush=True)
                if args.target > 0 and acc >= args.target:
                    print("tfps: target %.2f%% reached at step %d" % (args.target, s), flush=True)
                    os._exit(0)   # the ps and workers are stopped by the bench
            schedule_step(s)
        coordinator.join()
        acc, tl = evaluate()
        print("eval: step %d test_acc %.2f%% test_loss %.4f elapsed %.3f" % (
            total, acc, tl, time.perf_counter() - t0), flush=True)
        sys.stdout.flush()
        os._exit(0)

    # speed
    s = 0
    for _ in range(args.warmup):
        schedule_step(s % total)
        s += 1
    coordinator.join()
    print("tfps: window begin", flush=True)
    t0, c0 = time.perf_counter(), cpu_seconds()
    for _ in range(args.steps):
        last = schedule_step(s % total)
        s += 1
    coordinator.join()
    t = time.perf_counter() - t0
    c = cpu_seconds() - c0
    print("tfps: window end", flush=True)
    loss = float(last.fetch())
    print("tfps: steps/s %.3f step_ms %.3f samples/s %.1f functions %d steps %d chief_cpu_ms %.2f loss %.4f" % (
        args.steps / t, 1e3 * t / args.steps, args.steps * W * B / t, args.steps * W, args.steps,
        1e3 * c / args.steps, loss), flush=True)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
