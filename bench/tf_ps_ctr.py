#!/usr/bin/env python3
"""TensorFlow ParameterServerStrategy peer of bench/ctr.ini's CTR cluster.

The cluster of bench/tf_ps_mlp.py (2 ps, 2 workers, a chief that
coordinates; its --role/--ps/--workers/--chief, threads and the inter-op
note hold here too), training bench/ctr.ini's model on bench/ctr_prep.py's
arrays:

  table     one (26*ROWS, 16) variable, field j's rows at j*ROWS (pstrain's
            layout and, through ctr_prep.py, its very rows of the IDs),
            split in two by FixedShardsPartitioner(2): rows [0, 13*ROWS) on
            ps 0, the rest on ps 1, as pstrain's shard plan splits them;
            each half initialized on its ps, uniform in [-0.05, 0.05)
  lookup    tf.nn.embedding_lookup on the ShardedVariable: each ps gathers
            the batch's rows it holds and sends them to the worker: the op
            Keras 2's Embedding layer runs on a ShardedVariable. TF 2.19
            ships Keras 3 (tf-keras is not installed), whose layers make
            keras.Variables; its Embedding over TF's partitioner was not
            tried. An empty column's row is multiplied by 0
  dense     26*16 values then the 13 numbers into 128, ReLU, 64, ReLU, 1
            (He-normal before a ReLU, Glorot-uniform last, zero biases),
            each weight and bias split over the 2 ps likewise
  loss      sigmoid cross-entropy, mean over the batch
  optimizer Adagrad on the table (lr 0.1, accumulator from 0, pstrain's;
            TF's own default starts it at 0.1): the batch's gradient rows
            summed per unique row, then ResourceSparseApplyAdagradV2 on the
            ps that holds them (each accumulator half beside its table
            half); Adam (lr 0.001, ResourceApplyAdam) on the dense layers,
            its bias correction from the step's index (asynchronous
            updates have no one step count)
  data      each worker reads the arrays itself (a per-worker tf.data
            dataset, cached); the chief sends the B sample indices with
            each function: per epoch a seeded permutation, and the k-th
            function of step s trains samples [(s mod spe)*W*B + r*B, +B),
            r = k mod W, pstrain's worker r's batch

ParameterServerStrategy is asynchronous: each worker's function pulls the
rows and dense values it needs, computes its batch's gradient and applies
it at once. A step is W functions (W*B samples), as in tf_ps_mlp.py.

--mode speed prints `tfps: window begin` / `tfps: window end` around the
timed steps, then `tfps: steps/s S step_ms T samples/s X functions F steps
N chief_cpu_ms C loss L`. --mode tta: one epoch, the chief evaluating the
test set every --eval-every steps (`eval: step S test_auc A test_logloss L
elapsed E`), stopping at --target.

Run with build/tfvenv/bin/python (tensorflow-cpu).
"""
import argparse
import json
import math
import os
import sys
import time

from tf_ps_mlp import addrs, cpu_seconds


def shards_of(v):
    """A ShardedVariable's parts; a variable too small to split (the last
    layer's bias of 1) is one."""
    return list(v.variables) if hasattr(type(v), "variables") else [v]


def auc(y, p, np):
    o = np.argsort(p, kind="mergesort")
    r = np.empty(len(p))
    r[o] = np.arange(1, len(p) + 1)
    pos = y.sum()
    return (r[y == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(y) - pos))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", choices=("ps", "worker", "chief"), required=True)
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--ps", required=True)
    ap.add_argument("--workers", required=True)
    ap.add_argument("--chief", required=True)
    ap.add_argument("--prep", required=True, help="bench/ctr_prep.py's output directory")
    ap.add_argument("--mode", choices=("speed", "tta"), default="speed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--embedding-lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--target", type=float, default=0.0, help="tta: stop at this test AUC; 0 = never")
    args = ap.parse_args()

    cluster = {"ps": addrs(args.ps, "ps", 2), "worker": addrs(args.workers, "workers", 2),
               "chief": addrs(args.chief, "chief", 1)}
    task = {"type": args.role, "index": 0 if args.role == "chief" else args.index}
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": task})
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(v, str(args.threads))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    inter = max(2, args.threads) if args.role == "worker" else args.threads
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if args.role in ("ps", "worker"):
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=args.threads,
                                          inter_op_parallelism_threads=inter, device_count={"GPU": 0})
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                      task_index=resolver.task_id, protocol="grpc", config=config, start=True)
        print("# tf_ps_ctr: tensorflow %s, %s %d serving at %s" % (
            tf.__version__, args.role, args.index, cluster[args.role][args.index]), flush=True)
        server.join()
        return 0

    # ---- the chief -----------------------------------------------------------
    meta = json.load(open(os.path.join(args.prep, "meta.json")))
    F, R, D, n, DIM = meta["fields"], meta["rows"], meta["numeric"], meta["train"], args.dim
    W, B = len(cluster["worker"]), args.batch
    spe = n // (W * B)
    prep = os.path.abspath(args.prep)

    t_init = time.perf_counter()
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2))
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    t_up = time.perf_counter()

    rng = np.random.default_rng(args.seed)
    sizes = [(F * DIM + D, 128), (128, 64), (64, 1)]
    init = []
    for i, (c, oc) in enumerate(sizes):
        if i < len(sizes) - 1:
            w = rng.normal(0.0, math.sqrt(2.0 / c), (c, oc))
        else:
            a = math.sqrt(6.0 / (c + oc))
            w = rng.uniform(-a, a, (c, oc))
        init += [w.astype(np.float32), np.zeros(oc, np.float32)]

    def table_init(partition_shape=None, partition_offset=None):
        # TF's sharded variable creation calls this once per shard with
        # the shard's shape, on its ps: the table never crosses the network.
        return tf.random.uniform(partition_shape or (F * R, DIM), -0.05, 0.05, tf.float32, seed=args.seed)

    with strategy.scope():
        table = tf.Variable(table_init, shape=(F * R, DIM), dtype=tf.float32, name="table")
        tshards = shards_of(table)
        accs = []
        for s in tshards:
            with strategy.extended.colocate_vars_with(s):
                accs.append(tf.Variable(lambda s=s: tf.zeros(s.shape, tf.float32), shape=s.shape, dtype=tf.float32,
                                        trainable=False, name=s.name.split(":")[0] + "/accum"))
        params = [tf.Variable(v, name="p%d" % i) for i, v in enumerate(init)]
        pshards = [s for p in params for s in shards_of(p)]
        ms, vs = [], []
        for s in pshards:
            with strategy.extended.colocate_vars_with(s):
                ms.append(tf.Variable(tf.zeros(s.shape), trainable=False, name=s.name.split(":")[0] + "/m"))
                vs.append(tf.Variable(tf.zeros(s.shape), trainable=False, name=s.name.split(":")[0] + "/v"))
    placement = sorted({s.device for s in tshards})

    def per_worker_data():
        def load(_):
            def raw(name, dt, shape):
                return tf.reshape(tf.io.decode_raw(tf.io.read_file(os.path.join(prep, name)), dt), shape)
            return (raw("train_rows.i32", tf.int32, [n, F]), raw("train_mask.u8", tf.uint8, [n, F]),
                    raw("train_dense.f32", tf.float32, [n, D]), raw("train_label.f32", tf.float32, [n]))
        return tf.data.Dataset.range(1).map(load).cache().repeat()

    data_iter = iter(coordinator.create_per_worker_dataset(per_worker_data))
    b1, b2 = 0.9, 0.999

    def forward(rows, mask, x, tab, ws):
        e = tf.nn.embedding_lookup(tab, rows) * tf.expand_dims(mask, 2)        # (B, F, DIM)
        h = tf.concat([tf.reshape(e, [-1, F * DIM]), x], 1)
        for i in range(0, len(ws), 2):
            h = tf.matmul(h, ws[i]) + ws[i + 1]
            if i + 2 < len(ws):
                h = tf.nn.relu(h)
        return tf.squeeze(h, 1)

    @tf.function
    def train_step(it, idx, t):
        def replica(d, idx, t):
            rows, mask = tf.gather(d[0], idx), tf.cast(tf.gather(d[1], idx), tf.float32)
            x, y = tf.gather(d[2], idx), tf.gather(d[3], idx)
            with tf.GradientTape() as tape:
                z = forward(rows, mask, x, table, params)
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=z))
            grads = tape.gradient(loss, tshards + pshards)
            for s, a, g in zip(tshards, accs, grads[:len(tshards)]):
                u, k = tf.unique(g.indices)
                vals = tf.math.unsorted_segment_sum(g.values, k, tf.shape(u)[0])
                tf.raw_ops.ResourceSparseApplyAdagradV2(var=s.handle, accum=a.handle, lr=args.embedding_lr,
                                                        epsilon=1e-10, grad=vals, indices=u)
            tf1 = tf.cast(t, tf.float32)
            for s, m, v, g in zip(pshards, ms, vs, grads[len(tshards):]):
                tf.raw_ops.ResourceApplyAdam(var=s.handle, m=m.handle, v=v.handle, beta1_power=tf.pow(b1, tf1),
                                             beta2_power=tf.pow(b2, tf1), lr=args.lr, beta1=b1, beta2=b2,
                                             epsilon=1e-8, grad=g)
            return loss
        return strategy.run(replica, args=(next(it), idx, t))

    perm = {"epoch": -1, "p": None}

    def schedule_step(s):
        e = s // spe
        if e != perm["epoch"]:
            perm["p"] = np.random.default_rng(args.seed * 1000003 + e).permutation(n).astype(np.int32)
            perm["epoch"] = e
        first = (s % spe) * W * B
        t = tf.constant(s + 1, tf.int32)
        last = None
        for r in range(W):
            last = coordinator.schedule(train_step, args=(data_iter, tf.constant(perm["p"][first + r * B:][:B]), t))
        return last

    print("# tf_ps_ctr: tensorflow %s, ParameterServerStrategy (2 ps, %d workers, chief at %s); table (%d, %d) "
          "in %d shards on %s; batch %d per worker, a step = %d functions; %d steps per epoch; cluster up in %.2f s" % (
              tf.__version__, W, cluster["chief"][0], F * R, DIM, len(tshards), ", ".join(placement), B, W, spe,
              t_up - t_init), flush=True)

    if args.mode == "tta":
        tp = lambda k: os.path.join(prep, "test_" + k)
        nt = meta["test"]
        Tr = np.fromfile(tp("rows.i32"), np.int32).reshape(nt, F)
        Tm = np.fromfile(tp("mask.u8"), np.uint8).reshape(nt, F).astype(np.float32)
        Td = np.fromfile(tp("dense.f32"), np.float32).reshape(nt, D)
        Ty = np.fromfile(tp("label.f32"), np.float32)

        Tu, Ti = np.unique(Tr, return_inverse=True)   # the rows the test set touches, once each
        Ti = Ti.reshape(Tr.shape)

        def evaluate():
            """Test (AUC, logloss): the test set's rows (one lookup of each
            unique row) and the dense values read from the ps, the forward
            in numpy."""
            rows = tf.nn.embedding_lookup(table, tf.constant(Tu)).numpy()
            ws = [tf.convert_to_tensor(p).numpy() for p in params]
            h = np.concatenate([(rows[Ti] * Tm[:, :, None]).reshape(nt, F * DIM), Td], 1)
            for i in range(0, len(ws), 2):
                h = h @ ws[i] + ws[i + 1]
                if i + 2 < len(ws):
                    h = np.maximum(h, 0.0)
            z = h[:, 0].astype(np.float64)
            p = np.clip(1 / (1 + np.exp(-z)), 1e-15, 1 - 1e-15)
            return auc(Ty, z, np), float(-(Ty * np.log(p) + (1 - Ty) * np.log(1 - p)).mean())

        for s in range(spe):
            if s > 0 and s % args.eval_every == 0:
                coordinator.join()
                a, ll = evaluate()
                print("eval: step %d test_auc %.4f test_logloss %.4f elapsed %.3f" % (
                    s, a, ll, time.perf_counter() - t_up), flush=True)
                if args.target > 0 and a >= args.target:
                    print("tfps: target %.4f reached at step %d" % (args.target, s), flush=True)
                    os._exit(0)
            schedule_step(s)
        coordinator.join()
        a, ll = evaluate()
        print("eval: step %d test_auc %.4f test_logloss %.4f elapsed %.3f" % (
            spe, a, ll, time.perf_counter() - t_up), flush=True)
        os._exit(0)

    s = 0
    for _ in range(args.warmup):
        schedule_step(s % spe)
        s += 1
    coordinator.join()
    print("tfps: window begin", flush=True)
    t0, c0 = time.perf_counter(), cpu_seconds()
    last = None
    for _ in range(args.steps):
        last = schedule_step(s % spe)
        s += 1
    coordinator.join()
    t, c = time.perf_counter() - t0, cpu_seconds() - c0
    print("tfps: window end", flush=True)
    print("tfps: steps/s %.3f step_ms %.3f samples/s %.1f functions %d steps %d chief_cpu_ms %.2f loss %.4f" % (
        args.steps / t, 1e3 * t / args.steps, args.steps * W * B / t, args.steps * W, args.steps,
        1e3 * c / args.steps, float(last.fetch())), flush=True)
    time.sleep(2)   # the bench reads the chief's CPU time and memory at the window's end line
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
