#!/usr/bin/python3
"""PyTorch DistributedDataParallel (gloo over TCP) peer of pstrain's sync cluster.

One process per rank; bench/netlab starts one in each of two network
namespaces. The run is the default cluster.ini's, as far as the two
trainers can share it:

  model     784-512-512-10 MLP (Linear/ReLU/Linear/ReLU/Linear), weights
            initialized as pstrain does (He-normal before a ReLU,
            Glorot-uniform for the last layer, zero biases; not the same
            numbers: torch's generator)
  data      Fashion-MNIST from the IDX gz files, pixels / 255 (pstrain
            scales IDX to [0, 1] and does not standardize it)
  batches   per epoch a permutation of the 60,000 training samples (seeded
            with seed and epoch); rank r of W takes samples
            [(s mod spe)*W*B + r*B, +B) at step s, spe = floor(n / (W*B)),
            as pstrain's worker r does (core/job.h); the remainder is dropped
  loss      softmax cross-entropy, mean over the batch; DDP averages the
            ranks' gradients, as a sync ps averages the workers'
  optimizer SGD, momentum 0.9, lr 0.05 with cosine decay over the run's
            steps (lr * (1 + cos(pi * s / total)) / 2, core/nn/optim.c)

--mode speed: --warmup steps, a barrier, then --steps timed DDP steps
(rank 0's wall clock and both ranks' process CPU time) in chunks of
--chunk, each chunk followed by as many steps under no_sync() (forward,
backward, optimizer step, no allreduce: the compute part of a step) and a
barrier, which is not timed; then --allreduce-reps plain allreduces of a P-float tensor (what DDP's one bucket costs on the wire).
Rank 0 prints one line:

  ddp: steps/s S step_ms T compute_ms C comm_ms M cpu_ms R0/R1 allreduce_ms A steps N

comm_ms = step_ms - compute_ms: the part of the step the allreduce adds.
cpu_ms: each rank's process CPU time (all threads: torch's and gloo's) per
timed step.

--mode tta: trains --epochs epochs; rank 0 evaluates the test set every
--eval-every steps (and after the last) and prints

  eval: step S test_acc A% test_loss L elapsed E

flushed, E seconds since the process group was up; rank 1 meanwhile waits
in its next allreduce, as a sync pstrain worker waits for the chief. The
bench stops the clock at the first line with A >= its target, so the
evaluations are inside that clock, on both sides.

Run with Debian's interpreter (python3-torch, with gloo): /usr/bin/python3.
Threads: --threads torch intra-op and inter-op threads and OpenBLAS's own
pool (Debian's torch does its GEMMs in OpenBLAS, see bench/torch_mlp.py).
"""
import argparse
import datetime
import gzip
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


def load_idx(images, labels, torch):
    """(x float32 (n, 784) in [0, 1], y int64 (n)) from IDX files (gz or raw)."""
    def rd(p):
        op = gzip.open if p.endswith(".gz") else open
        with op(p, "rb") as f:
            return f.read()
    img, lab = rd(images), rd(labels)
    magic, n, r, c = struct.unpack(">IIII", img[:16])
    if magic != 0x803 or struct.unpack(">II", lab[:8]) != (0x801, n):
        raise SystemExit("ddp_mlp: %s / %s: not a matching IDX image/label pair" % (images, labels))
    x = torch.frombuffer(bytearray(img[16:16 + n * r * c]), dtype=torch.uint8).view(n, r * c).float() / 255.0
    y = torch.frombuffer(bytearray(lab[8:8 + n]), dtype=torch.uint8).long()
    return x, y


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--master", required=True, help="IP:PORT of rank 0 (tcp:// init)")
    ap.add_argument("--mode", choices=("speed", "tta"), default="speed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128, help="per rank (default 128)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=100, help="speed: warm-up steps")
    ap.add_argument("--steps", type=int, default=100, help="speed: timed steps")
    ap.add_argument("--chunk", type=int, default=10,
                    help="speed: DDP steps per timed chunk, each followed by as many no_sync steps")
    ap.add_argument("--allreduce-reps", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=117, help="tta: steps between evaluations")
    ap.add_argument("--target", type=float, default=0.0,
                    help="tta: stop after the first evaluation at or above this test accuracy (%%); 0 = never")
    ap.add_argument("--data-dir", default=FMNIST_DIR)
    ap.add_argument("--timeout", type=float, default=600, help="gloo timeout, seconds")
    args = ap.parse_args()

    # Before torch loads OpenBLAS, so that its pool starts at this size.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_mlp import blas_info, openblas_lib

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(args.threads)
    except RuntimeError:
        pass
    blas = openblas_lib()
    if blas is not None:
        blas.openblas_set_num_threads(args.threads)

    dd = args.data_dir
    X, Y = load_idx(os.path.join(dd, "train-images-idx3-ubyte.gz"),
                    os.path.join(dd, "train-labels-idx1-ubyte.gz"), torch)
    Xt, Yt = load_idx(os.path.join(dd, "t10k-images-idx3-ubyte.gz"),
                      os.path.join(dd, "t10k-labels-idx1-ubyte.gz"), torch)

    t_init = time.perf_counter()
    dist.init_process_group("gloo", init_method="tcp://" + args.master, rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=args.timeout))
    t_up = time.perf_counter()

    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    with torch.no_grad():
        for i, m in enumerate(l for l in net if isinstance(l, nn.Linear)):
            if i < 2:
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")   # fan_in, sqrt(2 / fan_in)
            else:
                nn.init.xavier_uniform_(m.weight)
            m.bias.zero_()
    P = sum(p.numel() for p in net.parameters())
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    W, B, n = args.world, args.batch, X.shape[0]
    spe = n // (W * B)
    total = spe * args.epochs
    if spe < 1:
        raise SystemExit("ddp_mlp: %d samples do not make one step of %d x %d" % (n, W, B))
    gen = torch.Generator()
    state = {"epoch": -1, "perm": None}

    def batch_at(s):
        e = s // spe
        if e != state["epoch"]:
            gen.manual_seed(args.seed * 1000003 + e)
            state["perm"], state["epoch"] = torch.randperm(n, generator=gen), e
        first = (s % spe) * W * B + args.rank * B
        idx = state["perm"][first:first + B]
        return X[idx], Y[idx]

    def lr_at(s):
        return args.lr * 0.5 * (1.0 + math.cos(math.pi * min(s, total) / total))

    def step(s):
        x, y = batch_at(s % total)
        for g in opt.param_groups:
            g["lr"] = lr_at(s % total)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def evaluate():
        net.eval()
        right, loss = 0, 0.0
        with torch.no_grad():
            for i in range(0, Xt.shape[0], 1000):
                out = net(Xt[i:i + 1000])
                loss += float(F.cross_entropy(out, Yt[i:i + 1000], reduction="sum"))
                right += int((out.argmax(1) == Yt[i:i + 1000]).sum())
        net.train()
        return 100.0 * right / Xt.shape[0], loss / Xt.shape[0]

    if args.rank == 0:
        print("# ddp_mlp: torch %s, gloo, world %d, rank 0 at %s; %d parameters; batch %d per rank; "
              "threads %d (interop %d, %s); %d steps per epoch; process group up in %.2f s" % (
                  torch.__version__, W, args.master, P, B, torch.get_num_threads(),
                  torch.get_num_interop_threads(), blas_info(blas), spe, t_up - t_init), flush=True)

    if args.mode == "tta":
        t0 = t_up
        for s in range(total):
            if args.rank == 0 and s > 0 and s % args.eval_every == 0:
                acc, tl = evaluate()
                print("eval: step %d test_acc %.2f%% test_loss %.4f elapsed %.3f" % (
                    s, acc, tl, time.perf_counter() - t0), flush=True)
                if args.target > 0 and acc >= args.target:
                    print("ddp: target %.2f%% reached at step %d" % (args.target, s), flush=True)
                    os._exit(0)   # rank 1 is stopped by the bench (its allreduce has no peer)
            step(s)
        if args.rank == 0:
            acc, tl = evaluate()
            print("eval: step %d test_acc %.2f%% test_loss %.4f elapsed %.3f" % (
                total, acc, tl, time.perf_counter() - t0), flush=True)
        dist.destroy_process_group()
        return 0

    # speed
    s = 0
    for _ in range(args.warmup):
        step(s)
        s += 1
    # Timed: chunks of --chunk DDP steps, each followed by as many steps
    # under no_sync() (forward, backward, optimizer step, no allreduce:
    # each rank alone, both at once, so that they share the CPUs as in the
    # DDP steps). Alternating keeps a drifting machine load out of the
    # difference between the two.
    t_ddp = t_cmp = cpu_ddp = 0.0
    done = 0
    dist.barrier()
    while done < args.steps:
        k = min(args.chunk, args.steps - done)
        t0, c0 = time.perf_counter(), cpu_seconds()
        for _ in range(k):
            loss = step(s)
            s += 1
        t_ddp += time.perf_counter() - t0
        cpu_ddp += cpu_seconds() - c0
        t0 = time.perf_counter()
        with model.no_sync():
            for _ in range(k):
                step(s)
                s += 1
        t_cmp += time.perf_counter() - t0
        dist.barrier()  # the next chunk starts together
        done += k
    t_step, t_compute, cpu_step = t_ddp / done, t_cmp / done, cpu_ddp / done

    # DDP's gradient bucket on the wire: one allreduce of P floats.
    buf = torch.zeros(P)
    dist.barrier()
    dist.all_reduce(buf)
    t0 = time.perf_counter()
    for _ in range(args.allreduce_reps):
        dist.all_reduce(buf)
    t_ar = (time.perf_counter() - t0) / max(1, args.allreduce_reps)

    cpus = [torch.tensor([cpu_step]) for _ in range(W)]
    dist.all_gather(cpus, torch.tensor([cpu_step]))
    if args.rank == 0:
        print("ddp: steps/s %.3f step_ms %.3f compute_ms %.3f comm_ms %.3f cpu_ms %s allreduce_ms %.3f "
              "steps %d loss %.4f" % (
                  1.0 / t_step, 1e3 * t_step, 1e3 * t_compute, 1e3 * (t_step - t_compute),
                  "/".join("%.2f" % (1e3 * float(c)) for c in cpus), 1e3 * t_ar, args.steps,
                  float(loss)), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
