#!/usr/bin/env python3
"""PyTorch DistributedDataParallel (gloo) peer of bench/ctr.ini's CTR cluster.

One process per rank; bench/netlab_ctr starts one in each of two network
namespaces. DDP keeps a whole replica of the model on every rank, so the
embedding tables (26 x ROWS x 16) are replicated, and each step all-reduces
their gradient:

  --dense   (the default) nn.Embedding(sparse=False): the table's gradient
            is a dense (26*ROWS, 16) tensor, all-reduced whole every step
            (666 MB at 400,000 rows a field), and Adagrad updates every row
  --sparse  nn.Embedding(sparse=True): DDP all-reduces the sparse gradient
            (gloo: an allgather of each rank's indices and values, the
            batch's 26*B lookups, duplicates included) and Adagrad updates
            the rows it names: the peer's best setting

The rest is bench/ctr.ini's model as far as torch lets it be the same:

  model     26 fields of ROWS rows (one nn.Embedding of 26*ROWS rows, field
            j's rows at j*ROWS: pstrain's layout), dim 16, uniform in
            [-0.05, 0.05); an empty column's lookup is multiplied by 0; the
            26*16 values then the 13 numeric features into Linear 128,
            ReLU, Linear 64, ReLU, Linear 1 (He-normal before a ReLU,
            Glorot-uniform last, zero biases)
  data      bench/ctr_prep.py's arrays (pstrain's own rows of the IDs, its
            log(1 + v) numbers), memory-mapped
  batches   per epoch a seeded permutation; rank r takes samples
            [(s mod spe)*W*B + r*B, +B) at step s, the remainder dropped
  loss      sigmoid cross-entropy, mean over the batch; DDP averages the
            ranks' gradients, as a sync ps averages the workers'
  optimizer Adagrad (lr 0.1, accumulator from 0, eps 1e-10) on the table,
            Adam (lr 0.001) on the dense layers: pstrain's

--mode speed: --warmup steps, a barrier, `ddp: window begin`, --steps timed
steps, a barrier, `ddp: window end`, then

  ddp: steps/s S step_ms T cpu_ms R0/R1 steps N loss L

--mode tta: one epoch; rank 0 evaluates the test set every --eval-every
steps and prints `eval: step S test_auc A test_logloss L elapsed E`
(rank 1 waits in its next allreduce meanwhile), stopping at --target.

Run with build/torchvenv/bin/python (a current torch with gloo).
"""
import argparse
import datetime
import json
import math
import os
import resource
import sys
import time

import numpy as np


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def load(prep, part):
    """(rows int64 (N,26), mask float32 (N,26), dense (N,13), label (N)) as numpy memory maps."""
    m = json.load(open(os.path.join(prep, "meta.json")))
    n, f, d = m[part], m["fields"], m["numeric"]
    p = lambda k: os.path.join(prep, "%s_%s" % (part, k))
    return (np.memmap(p("rows.i32"), np.int32, "r", shape=(n, f)),
            np.memmap(p("mask.u8"), np.uint8, "r", shape=(n, f)),
            np.memmap(p("dense.f32"), np.float32, "r", shape=(n, d)),
            np.memmap(p("label.f32"), np.float32, "r", shape=(n,)), m)


def auc(y, p):
    """ROC AUC (ties broken by order: the scores are continuous)."""
    o = np.argsort(p, kind="mergesort")
    r = np.empty(len(p))
    r[o] = np.arange(1, len(p) + 1)
    pos = y.sum()
    return (r[y == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(y) - pos))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--master", required=True, help="HOST:PORT of rank 0")
    ap.add_argument("--prep", required=True, help="bench/ctr_prep.py's output directory")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--dense", dest="sparse", action="store_false")
    g.add_argument("--sparse", dest="sparse", action="store_true")
    ap.add_argument("--mode", choices=("speed", "tta"), default="speed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--embedding-lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--target", type=float, default=0.0, help="tta: stop at this test AUC; 0 = never")
    args = ap.parse_args()
    host, port = args.master.rsplit(":", 1)
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=port)
    for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(v, str(args.threads))
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(args.threads)

    rows, mask, dense, label, meta = load(args.prep, "train")
    F, R, D, B, W = meta["fields"], meta["rows"], meta["numeric"], args.batch, args.world
    torch.manual_seed(args.seed)

    class Ctr(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(F * R, args.dim, sparse=args.sparse)
            nn.init.uniform_(self.emb.weight, -0.05, 0.05)
            self.l1 = nn.Linear(F * args.dim + D, 128)
            self.l2 = nn.Linear(128, 64)
            self.l3 = nn.Linear(64, 1)
            for l in (self.l1, self.l2):
                nn.init.kaiming_normal_(l.weight, nonlinearity="relu")
                nn.init.zeros_(l.bias)
            nn.init.xavier_uniform_(self.l3.weight)
            nn.init.zeros_(self.l3.bias)

        def forward(self, r, m, x):
            e = (self.emb(r) * m.unsqueeze(2)).flatten(1)            # (B, F*dim)
            h = torch.relu(self.l1(torch.cat([e, x], 1)))
            return self.l3(torch.relu(self.l2(h))).squeeze(1)       # logits (B)

    t_init = time.perf_counter()
    dist.init_process_group("gloo", rank=args.rank, world_size=W, timeout=datetime.timedelta(minutes=30))
    t_up = time.perf_counter()
    model = DDP(Ctr())
    emb_opt = torch.optim.Adagrad([model.module.emb.weight], lr=args.embedding_lr, initial_accumulator_value=0.0,
                                  eps=1e-10)
    dense_params = [p for n_, p in model.named_parameters() if "emb" not in n_]
    dense_opt = torch.optim.Adam(dense_params, lr=args.lr)
    lossf = nn.BCEWithLogitsLoss()
    n = len(label)
    spe = n // (W * B)
    perm = {"epoch": -1, "p": None}

    def batch(s):
        e = s // spe
        if e != perm["epoch"]:
            perm["p"] = np.random.default_rng(args.seed * 1000003 + e).permutation(n)
            perm["epoch"] = e
        i = perm["p"][(s % spe) * W * B + args.rank * B:][:B]
        return (torch.from_numpy(rows[i].astype(np.int64)), torch.from_numpy(mask[i].astype(np.float32)),
                torch.from_numpy(np.asarray(dense[i])), torch.from_numpy(np.asarray(label[i])))

    def step(s):
        r, m, x, y = batch(s)
        emb_opt.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)
        loss = lossf(model(r, m, x), y)
        loss.backward()
        emb_opt.step()
        dense_opt.step()
        return float(loss.detach())

    P = sum(p.numel() for p in model.parameters())
    print("# ddp_ctr: torch %s, gloo, %d ranks, rank %d; %s embedding gradients; %d parameters (%d in the "
          "table); batch %d per rank; threads %d; %d steps per epoch; group up in %.2f s" % (
              torch.__version__, W, args.rank, "sparse" if args.sparse else "dense", P, F * R * args.dim, B,
              torch.get_num_threads(), spe, t_up - t_init), flush=True)

    if args.mode == "tta":
        tr, tm, td, ty, _ = load(args.prep, "test")
        tr, tm, td, ty = (torch.from_numpy(np.asarray(tr).astype(np.int64)),
                          torch.from_numpy(np.asarray(tm).astype(np.float32)),
                          torch.from_numpy(np.asarray(td)), np.asarray(ty))

        def evaluate():
            with torch.no_grad():
                z = torch.cat([model.module(tr[i:i + 4096], tm[i:i + 4096], td[i:i + 4096])
                               for i in range(0, len(ty), 4096)]).double().numpy()
            p = np.clip(1 / (1 + np.exp(-z)), 1e-15, 1 - 1e-15)
            return auc(ty, z), float(-(ty * np.log(p) + (1 - ty) * np.log(1 - p)).mean())

        for s in range(spe):
            if args.rank == 0 and s > 0 and s % args.eval_every == 0:
                a, ll = evaluate()
                print("eval: step %d test_auc %.4f test_logloss %.4f elapsed %.3f" % (
                    s, a, ll, time.perf_counter() - t_up), flush=True)
                if args.target > 0 and a >= args.target:
                    print("ddp: target %.4f reached at step %d" % (args.target, s), flush=True)
                    os._exit(0)   # the bench stops rank 1
            step(s)
        if args.rank == 0:
            a, ll = evaluate()
            print("eval: step %d test_auc %.4f test_logloss %.4f elapsed %.3f" % (
                spe, a, ll, time.perf_counter() - t_up), flush=True)
        os._exit(0)

    for s in range(args.warmup):
        step(s)
    dist.barrier()
    if args.rank == 0:
        print("ddp: window begin", flush=True)
    t0, c0 = time.perf_counter(), cpu_seconds()
    loss = 0.0
    for s in range(args.warmup, args.warmup + args.steps):
        loss = step(s)
    dist.barrier()
    t, c = time.perf_counter() - t0, cpu_seconds() - c0
    cpus = [torch.tensor([1e3 * c / args.steps]) for _ in range(W)]
    dist.all_gather(cpus, torch.tensor([1e3 * c / args.steps]))
    if args.rank == 0:
        print("ddp: window end", flush=True)
        print("ddp: steps/s %.3f step_ms %.3f cpu_ms %s steps %d loss %.4f" % (
            args.steps / t, 1e3 * t / args.steps, "/".join("%.1f" % float(x) for x in cpus), args.steps, loss),
            flush=True)
    dist.barrier()
    time.sleep(2)   # the bench reads both ranks' CPU time and memory at the window's end line
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
