#!/usr/bin/python3
"""PyTorch reference benchmark for pstrain's MLP and CNN training throughput.

Trains the same network as pstrain's examples:
    mlp : 784-512-512-10   (Linear/ReLU/Linear/ReLU/Linear)
    wide: 4096-4096-4096-10 (same layout, input 4096)
    cnn : the Fashion-MNIST CNN of issue 5 on 1x28x28 input (NCHW):
          Conv2d(1,32,5,padding=2) ReLU MaxPool2d(2) Conv2d(32,64,5,padding=2)
          ReLU MaxPool2d(2) Flatten Linear(3136,1024) ReLU Dropout(0.5)
          Linear(1024,10), as build/bench/cpu_mlp --model cnn
with softmax cross-entropy and SGD (momentum 0.9, lr 0.05), and reports
training samples/s over timed steps after a warm-up.

Data is random (Fashion-MNIST shaped for mlp) unless --real is given, which
reads /usr/share/datasets/fashion-mnist/train-*-idx*-ubyte.gz (mlp only).

Run with Debian's interpreter (python3-torch is installed for it):
    /usr/bin/python3 bench/torch_mlp.py --threads 1 --batch 256
    /usr/bin/python3 bench/torch_mlp.py --threads 2 --batch 256 --csv

CPU note: Debian's torch does its GEMMs in OpenBLAS (pthread build), whose
thread count is NOT changed by torch.set_num_threads(); it defaults to the
number of CPUs (or $OPENBLAS_NUM_THREADS). --blas-threads sets it explicitly
via openblas_set_num_threads(); the default here is to make it equal to
--threads so that "threads" means the same thing in both layers.
"""
import argparse
import ctypes
import gzip
import os
import statistics
import struct
import sys
import time

try:
    import torch
    import torch.nn as nn
except Exception as e:  # ImportError, or a broken install
    print("torch_mlp: skipped (cannot import torch: %s: %s; try /usr/bin/python3 "
          "with apt package python3-torch)" % (type(e).__name__, e))
    sys.exit(0)

MODELS = {
    "mlp": (784, 512, 512, 10),
    "wide": (4096, 4096, 4096, 10),
    "cnn": (784, 0, 0, 10),
}


def build_model(name):
    if name == "cnn":
        return nn.Sequential(
            nn.Unflatten(1, (1, 28, 28)),
            nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 1024), nn.ReLU(), nn.Dropout(0.5),
            nn.Linear(1024, 10))
    n_in, h1, h2, n_out = MODELS[name]
    return nn.Sequential(nn.Linear(n_in, h1), nn.ReLU(), nn.Linear(h1, h2), nn.ReLU(),
                         nn.Linear(h2, n_out))
FMNIST_DIR = "/usr/share/datasets/fashion-mnist"


def openblas_lib():
    """The OpenBLAS shared object torch loaded, if any (ctypes handle)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {l.split()[-1] for l in f if "openblas" in l and ".so" in l}
    except OSError:
        return None
    for p in sorted(paths):
        try:
            lib = ctypes.CDLL(p)
            lib.openblas_get_num_threads  # noqa: B018  (symbol check)
            return lib
        except (OSError, AttributeError):
            continue
    return None


def blas_info(lib):
    if lib is None:
        return "blas=?"
    parts = []
    try:
        lib.openblas_get_corename.restype = ctypes.c_char_p
        parts.append("openblas_core=%s" % lib.openblas_get_corename().decode())
    except AttributeError:
        pass
    try:
        lib.openblas_get_config.restype = ctypes.c_char_p
        parts.append("openblas_config='%s'" % lib.openblas_get_config().decode().strip())
    except AttributeError:
        pass
    parts.append("openblas_threads=%d" % lib.openblas_get_num_threads())
    return " ".join(parts)


def header(args, blas):
    env = " ".join("%s=%s" % (k, os.environ.get(k, "-")) for k in
                   ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                    "MKL_NUM_THREADS", "MKL_ENABLE_INSTRUCTIONS"))
    be = torch.backends
    cap = "?"
    try:
        cap = torch.backends.cpu.get_cpu_capability()  # torch >= 2.0
    except AttributeError:
        for line in torch.__config__.show().splitlines():
            if "CPU capability usage" in line:
                cap = line.split(":", 1)[1].strip()
    bi = "?"
    for line in torch.__config__.show().splitlines():
        if "BLAS_INFO=" in line:
            bi = line.split("BLAS_INFO=", 1)[1].split(",", 1)[0]
    return ("# torch %s | threads=%d interop=%d | mkl=%s mkldnn=%s openmp=%s "
            "cpu_capability=%s BLAS_INFO=%s | %s | %s" % (
                torch.__version__, torch.get_num_threads(), torch.get_num_interop_threads(),
                be.mkl.is_available(), be.mkldnn.is_available(), be.openmp.is_available(),
                cap, bi, blas, env))


def load_fmnist(n_in):
    if n_in != 784:
        raise SystemExit("--real only applies to --model mlp and cnn")
    def rd(name):
        with gzip.open(os.path.join(FMNIST_DIR, name)) as f:
            return f.read()
    img = rd("train-images-idx3-ubyte.gz")
    lab = rd("train-labels-idx1-ubyte.gz")
    _, n, r, c = struct.unpack(">IIII", img[:16])
    x = torch.frombuffer(bytearray(img[16:]), dtype=torch.uint8).view(n, r * c).float() / 255.0
    y = torch.frombuffer(bytearray(lab[8:]), dtype=torch.uint8).long()
    return x, y


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--interop", type=int, default=None, help="inter-op threads (default = --threads)")
    ap.add_argument("--blas-threads", type=int, default=None,
                    help="OpenBLAS threads (default = --threads; 0 = leave as is)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=0,
                    help="timed steps per repeat (default 0 = as many as fit in --seconds)")
    ap.add_argument("--seconds", type=float, default=3.0, help="time per repeat when --steps=0")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", choices=tuple(MODELS), default="mlp")
    ap.add_argument("--real", action="store_true", help="use Fashion-MNIST from " + FMNIST_DIR)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csv", action="store_true",
                    help="print only: torch,<device>,<model>,<batch>,<threads>,<samples_per_s>")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(args.interop or args.threads)
    except RuntimeError:
        pass  # already set / parallel work started
    blas = openblas_lib()
    bt = args.threads if args.blas_threads is None else args.blas_threads
    if blas is not None and bt > 0:
        blas.openblas_set_num_threads(bt)
    torch.manual_seed(args.seed)

    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_mlp: skipped (--device cuda but torch.cuda.is_available() is False)")
        return 0
    dev = torch.device(args.device)

    n_in, h1, h2, n_out = MODELS[args.model]
    model = build_model(args.model).to(dev)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    lossf = nn.CrossEntropyLoss()

    B = args.batch
    if args.real:
        X, Y = load_fmnist(n_in)
        X, Y = X.to(dev), Y.to(dev)
    else:
        n = max(B * 16, 4096)
        X = torch.rand(n, n_in, device=dev)
        Y = torch.randint(0, n_out, (n,), device=dev)
    nb = X.shape[0] // B
    batches = [(X[i * B:(i + 1) * B].contiguous(), Y[i * B:(i + 1) * B].contiguous())
               for i in range(nb)]

    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    state = {"i": 0, "loss": None, "cpu": []}

    def step():
        x, y = batches[state["i"] % nb]
        state["i"] += 1
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        state["loss"] = loss

    def timed(nsteps):
        """Seconds for nsteps training steps."""
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            sync()
            a.record()
            for _ in range(nsteps):
                step()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1000.0
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(nsteps):
            step()
        state["cpu"].append((time.process_time() - c0) / nsteps)
        return time.perf_counter() - t0

    for _ in range(args.warmup):
        step()
    sync()

    nsteps = args.steps
    if nsteps <= 0:  # calibrate: steps that take ~--seconds
        n, t = 5, 0.0
        while True:
            t = timed(n)
            if t >= 0.25:
                break
            n *= 2
        nsteps = max(5, int(n * args.seconds / t))

    rates = []
    for _ in range(args.repeats):
        t = timed(nsteps)
        rates.append(nsteps * B / t)
    best, med = max(rates), statistics.median(rates)
    loss = float(state["loss"])

    if args.csv:
        print("torch,%s,%s,%d,%d,%.1f" % (args.device, args.model, B, args.threads, best))
        return 0
    print(header(args, blas_info(blas)))
    if cuda:
        print("# cuda device: %s" % torch.cuda.get_device_name(dev))
    # CPU ms per step (all threads' CPU time) of the fastest repeat: on a
    # shared machine steadier than wall time; compare with cpu_mlp's.
    cpu_ms = "%.2f" % (1e3 * min(state["cpu"])) if state["cpu"] else "-"
    print("%-6s %-5s %6s %7s %6s %7s %14s %14s %9s %11s" % (
        "device", "model", "batch", "threads", "blas", "steps", "best samples/s",
        "median samp/s", "last_loss", "cpu ms/step"))
    print("%-6s %-5s %6d %7d %6s %7d %14.1f %14.1f %9.4f %11s" % (
        args.device, args.model, B, args.threads,
        str(blas.openblas_get_num_threads()) if blas is not None else "-",
        nsteps, best, med, loss, cpu_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
