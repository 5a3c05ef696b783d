#!/usr/bin/env python3
"""Criteo-layout TSV (`pstrain synth`'s) to the arrays bench/netlab_ctr's
TensorFlow and PyTorch peers read, once, outside every timed window.

    ctr_prep.py --data DIR --rows ROWS [--batch B] [--out DIR/prep-ROWS]

Reads DIR/train.txt and DIR/test.txt and writes, per file (train_, test_):

  rows.i32   (N, 26) int32: each categorical ID's global embedding row,
             exactly pstrain's (docs/CTR.md, "The model"): field j's ID
             lands in row j*ROWS + splitmix64(j << 32 | id) mod ROWS; an
             empty column (no ID) gets row j*ROWS and mask 0
  mask.u8    (N, 26) uint8: 1 where the column has an ID (an empty one adds
             nothing to its field, as in pstrain)
  dense.f32  (N, 13) float32: log(1 + v) for v > 0, else 0 (pstrain's)
  label.f32  (N) float32: 0 or 1

and meta.json: the counts, and the unique rows per worker batch of --batch
samples (mean over 200 batches of a seeded permutation: what pstrain pulls
per worker and step), from which the bench computes the rows' bytes per
step for every row of its table. Also prints a plain logistic regression's
test AUC on the same hashed IDs (--lr-baseline; numpy, one epoch of
Adagrad over batches of --batch, the numeric features too).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

FIELDS, NUM = 26, 13
M64 = (1 << 64) - 1


def splitmix(field, ids):
    """pstrain's embed_hash(id, field) (core/nn/embed.c), vectorized."""
    with np.errstate(over="ignore"):
        z = ((np.uint64(field) << np.uint64(32)) | ids.astype(np.uint64)) + np.uint64(0x9e3779b97f4a7c15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
        return z ^ (z >> np.uint64(31))


def parse(path):
    """(ids uint32 (N,26), has uint8 (N,26), dense float32 (N,13), label float32 (N))."""
    lines = open(path, "rb").read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    n = len(lines)
    ids = np.zeros((n, FIELDS), np.uint32)
    has = np.zeros((n, FIELDS), np.uint8)
    ints = np.zeros((n, NUM), np.float64)
    label = np.zeros(n, np.float32)
    for i, line in enumerate(lines):
        c = line.split(b"\t")
        if len(c) != 40:
            raise SystemExit("ctr_prep: %s:%d: %d columns, expected 40" % (path, i + 1, len(c)))
        label[i] = int(c[0])
        ints[i] = [int(v) if v else 0 for v in c[1:14]]
        for j, v in enumerate(c[14:]):
            if v:
                h = int(v, 16)
                ids[i, j] = 0xfffffffe if h == 0xffffffff else h
                has[i, j] = 1
    dense = np.where(ints > 0, np.log1p(np.maximum(ints, 0)), 0.0).astype(np.float32)
    return ids, has, dense, label


def rows_of(ids, has, R):
    rows = np.zeros(ids.shape, np.int64)
    for j in range(FIELDS):
        rows[:, j] = j * R + (splitmix(j, ids[:, j]) % np.uint64(R)).astype(np.int64)
        rows[has[:, j] == 0, j] = j * R
    return rows.astype(np.int32)


def auc(y, p):
    """ROC AUC with ties averaged."""
    order = np.argsort(p, kind="mergesort")
    ps, ys = p[order], y[order]
    ranks = np.empty(len(p))
    i = 0
    while i < len(p):
        k = i
        while k + 1 < len(p) and ps[k + 1] == ps[i]:
            k += 1
        ranks[i:k + 1] = (i + k) / 2.0 + 1
        i = k + 1
    pos = ys.sum()
    neg = len(ys) - pos
    return (ranks[ys == 1].sum() - pos * (pos + 1) / 2) / (pos * neg)


def lr_baseline(tr, te, R, B, lr, seed):
    """Logistic regression on the hashed IDs and the numbers: one weight a
    row, one a numeric feature, a bias; Adagrad (accumulator from 0, as
    pstrain's), batches of B, one epoch. Test (AUC, logloss)."""
    rows, mask, dense, y = tr
    w = np.zeros(FIELDS * R, np.float64)
    gw = np.zeros(FIELDS * R, np.float64)
    v = np.zeros(NUM + 1, np.float64)
    gv = np.zeros(NUM + 1, np.float64)
    perm = np.random.default_rng(seed).permutation(len(y))
    for s in range(len(y) // B):
        b = perm[s * B:(s + 1) * B]
        r, m, x = rows[b], mask[b].astype(np.float64), dense[b]
        z = (w[r] * m).sum(1) + x @ v[:NUM] + v[NUM]
        g = (1.0 / (1.0 + np.exp(-z)) - y[b]) / B          # dL/dz, batch mean
        u, inv = np.unique(r.ravel(), return_inverse=True)
        gr = np.bincount(inv, weights=(g[:, None] * m).ravel(), minlength=len(u))
        gw[u] += gr ** 2
        w[u] -= lr * gr / (np.sqrt(gw[u]) + 1e-10)
        gd = np.concatenate([x.T @ g, [g.sum()]])
        gv += gd ** 2
        v -= lr * gd / (np.sqrt(gv) + 1e-10)
    rows, mask, dense, y = te
    z = (w[rows] * mask).sum(1) + dense @ v[:NUM] + v[NUM]
    p = 1.0 / (1.0 + np.exp(-z))
    pc = np.clip(p, 1e-15, 1 - 1e-15)
    return auc(y, p), float(-(y * np.log(pc) + (1 - y) * np.log(1 - pc)).mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="directory with train.txt and test.txt")
    ap.add_argument("--rows", type=int, required=True, help="rows per field (the embedding's ROWS)")
    ap.add_argument("--batch", type=int, default=256, help="per worker (default 256)")
    ap.add_argument("--out", help="default DATA/prep-ROWS")
    ap.add_argument("--lr-baseline", action="store_true", help="print the logistic regression's test AUC")
    ap.add_argument("--lr", type=float, default=0.1, help="its Adagrad learning rate (default 0.1)")
    args = ap.parse_args()
    out = args.out or os.path.join(args.data, "prep-%d" % args.rows)
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    sets = {}
    for part in ("train", "test"):
        ids, has, dense, label = parse(os.path.join(args.data, part + ".txt"))
        rows = rows_of(ids, has, args.rows)
        rows.tofile(os.path.join(out, part + "_rows.i32"))
        has.tofile(os.path.join(out, part + "_mask.u8"))
        dense.tofile(os.path.join(out, part + "_dense.f32"))
        label.tofile(os.path.join(out, part + "_label.f32"))
        sets[part] = (rows, has, dense, label)
    rows = sets["train"][0]
    perm = np.random.default_rng(1).permutation(len(rows))
    nb = min(200, len(rows) // args.batch)
    uniq = [len(np.unique(rows[perm[k * args.batch:(k + 1) * args.batch]])) for k in range(nb)]
    meta = {"train": len(sets["train"][3]), "test": len(sets["test"][3]), "fields": FIELDS,
            "numeric": NUM, "rows": args.rows, "batch": args.batch,
            "unique_rows_per_batch": float(np.mean(uniq)), "ids_per_batch": args.batch * FIELDS}
    print("ctr_prep: %d train, %d test rows into %s in %.1f s; %.1f unique rows per batch of %d (of %d IDs)" % (
        meta["train"], meta["test"], out, time.time() - t0, meta["unique_rows_per_batch"], args.batch,
        args.batch * FIELDS), flush=True)
    if args.lr_baseline:
        t1 = time.time()
        a, ll = lr_baseline(sets["train"], sets["test"], args.rows, args.batch, args.lr, 1)
        meta["lr_auc"], meta["lr_logloss"] = a, ll
        print("ctr_prep: logistic regression on the same hashed IDs (numpy, Adagrad lr %g, batch %d, 1 epoch): "
              "test AUC %.4f logloss %.4f (%.1f s)" % (args.lr, args.batch, a, ll, time.time() - t1), flush=True)
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
