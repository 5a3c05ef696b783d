#!/usr/bin/python3
"""PyTorch reference benchmark for pstrain's MLP and CNN training throughput.

Trains the same network as pstrain's examples:
    mlp : 784-512-512-10   (Linear/ReLU/Linear/ReLU/Linear)
    wide: 4096-4096-4096-10 (same layout, input 4096)
    cnn : the Fashion-MNIST CNN of issue 5 on 1x28x28 input (NCHW):
          Conv2d(1,32,5,padding=2) ReLU MaxPool2d(2) Conv2d(32,64,5,padding=2)
          ReLU MaxPool2d(2) Flatten Linear(3136,1024) ReLU Dropout(0.5)
          Linear(1024,10), as build/bench/cpu_mlp --model cnn
    fashion-cnn: examples/fashion-cnn.ini's network: the cnn with
          BatchNorm2d after each Conv2d (before its ReLU)
with softmax cross-entropy and SGD (momentum 0.9, lr 0.05), and reports
training samples/s over timed steps after a warm-up.

--device cuda (bench/gpu_mlp runs it beside build/bench/gpu_mlp; method in
docs/BENCHMARKS.md, "GPU training throughput"): the data is generated on
the GPU (16 batches, at most 256 MiB of features, as gpu_mlp's); steps run
for at least --warmup-seconds of wall time, then torch.cuda.synchronize();
then --repeats loops of steps, each running until --seconds of wall time
have passed, timed with CUDA events and synchronized; median and best.
TF32 is set from --tf32 for cuBLAS matmuls and cuDNN convolutions alike
(PyTorch's own default is off for matmuls and ON for cuDNN), read back and
checked by a probe matmul and conv against float64. cuDNN's autotuner
(cudnn.benchmark) is on by default, and SGD is the fused kernel where torch
has one: the fastest eager settings. --mode graph captures the whole step
(forward, backward, optimizer) in one CUDA graph and replays it: not eager,
a separately labelled row. With --csv the last line is
    torch,cuda,MODEL,B,THREADS,BEST,MEDIAN,TF32,MODE,REPEATS,MS_MEDIAN,-,gpu,RATES,PROBE
(RATES: each repeat's samples/s joined by ';'; PROBE: the larger probe
error), the lines before it start with '#'.

Data is random (Fashion-MNIST shaped for mlp) unless --real is given, which
reads /usr/share/datasets/fashion-mnist/train-*-idx*-ubyte.gz (mlp only).

Run with Debian's interpreter (python3-torch is installed for it):
    /usr/bin/python3 bench/torch_mlp.py --threads 1 --batch 256
    /usr/bin/python3 bench/torch_mlp.py --threads 2 --batch 256 --csv
    python3 bench/torch_mlp.py --device cuda --model wide --batch 4096 --tf32 off

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
    "fashion-cnn": (784, 0, 0, 10),
}


def build_model(name):
    if name == "cnn":
        return nn.Sequential(
            nn.Unflatten(1, (1, 28, 28)),
            nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 1024), nn.ReLU(), nn.Dropout(0.5),
            nn.Linear(1024, 10))
    if name == "fashion-cnn":  # examples/fashion-cnn.ini, layer for layer
        return nn.Sequential(
            nn.Unflatten(1, (1, 28, 28)),
            nn.Conv2d(1, 32, 5, padding=2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
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


def batches_of(X, Y, B):
    """The whole batches of B rows of X, Y (contiguous), and their count."""
    nb = X.shape[0] // B
    return [(X[i * B:(i + 1) * B].contiguous(), Y[i * B:(i + 1) * B].contiguous())
            for i in range(nb)], nb


def eager_step_of(model, opt, lossf, batches, state):
    """One eager training step over the next batch; state["i"] counts the
    steps, state["loss"] keeps the last loss (a tensor: reading it syncs)."""
    def step():
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        state["loss"] = loss
    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--interop", type=int, default=None, help="inter-op threads (default = --threads)")
    ap.add_argument("--blas-threads", type=int, default=None,
                    help="OpenBLAS threads (default = --threads; 0 = leave as is)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=0,
                    help="timed steps per repeat (default 0 = as many as fit in --seconds)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="time per repeat when --steps=0 (default 3 on the CPU; on cuda 0.5, "
                    "and every repeat runs at least this long)")
    ap.add_argument("--warmup", type=int, default=20, help="warm-up steps (CPU)")
    ap.add_argument("--warmup-seconds", type=float, default=0.5,
                    help="warm-up wall time on cuda (default 0.5)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--tf32", choices=("on", "off"), default="off",
                    help="cuda: TF32 for cuBLAS matmuls and cuDNN convolutions (default off)")
    ap.add_argument("--mode", choices=("eager", "graph"), default="eager",
                    help="cuda: eager steps, or the whole step captured in one CUDA graph")
    ap.add_argument("--cudnn-benchmark", choices=("on", "off"), default="on",
                    help="cuda: cuDNN's autotuner (default on)")
    ap.add_argument("--sgd", choices=("auto", "fused", "foreach"), default="auto",
                    help="cuda: SGD implementation (auto: fused where torch has it)")
    ap.add_argument("--model", choices=tuple(MODELS), default="mlp")
    ap.add_argument("--real", action="store_true", help="use Fashion-MNIST from " + FMNIST_DIR)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csv", action="store_true",
                    help="print only: torch,<device>,<model>,<batch>,<threads>,<samples_per_s>")
    args = ap.parse_args()
    if args.seconds is None:
        args.seconds = 0.5 if args.device == "cuda" else 3.0
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")

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

    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("torch_mlp: skipped (--device cuda but torch.cuda.is_available() is False)")
            return 0
        return cuda_main(args)
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
    batches, _ = batches_of(X, Y, B)

    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    state = {"i": 0, "loss": None, "cpu": []}
    step = eager_step_of(model, opt, lossf, batches, state)

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
    loss = float(state["loss"].detach()) if hasattr(state["loss"], "detach") else float(state["loss"])

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


def set_tf32(on):
    """TF32 for cuBLAS matmuls and cuDNN convolutions, and what torch reports back.

    The allow_tf32 setters write both the legacy flags and, in torch >= 2.9,
    the per-backend fp32_precision ones, so the two never disagree (torch 2.9+
    raises when code reads flags that were set through a mix of the two APIs).
    Deprecation warnings go to stderr, which bench/gpu_mlp keeps in its log."""
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    seen = []
    for name, get in (("cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
                      ("cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32),
                      ("cuda.matmul.fp32_precision", lambda: torch.backends.cuda.matmul.fp32_precision),
                      ("cudnn.conv.fp32_precision", lambda: torch.backends.cudnn.conv.fp32_precision),
                      ("float32_matmul_precision", torch.get_float32_matmul_precision)):
        try:
            seen.append("%s=%s" % (name, get()))
        except Exception as e:  # noqa: BLE001  (older torch: AssertionError for unknown names)
            seen.append("%s=? (%s)" % (name, str(e).split("\n")[0][:60]))
    return " ".join(seen)


def tf32_probe(dev):
    """Max error over max |value| of a (256x1024)(1024x256) matmul and of a
    conv (32 -> 64 channels, 5x5, on 8x14x14) against float64 on the CPU:
    about 1e-3 with TF32, about 1e-6 in fp32."""
    g = torch.Generator().manual_seed(7)
    a, b = torch.rand(256, 1024, generator=g) * 2 - 1, torch.rand(1024, 256, generator=g) * 2 - 1
    x, w = torch.rand(8, 32, 14, 14, generator=g) * 2 - 1, torch.rand(64, 32, 5, 5, generator=g) * 2 - 1

    def rel(got, ref):
        return float((got.double().cpu() - ref).abs().max() / ref.abs().max())
    mm = rel(a.to(dev) @ b.to(dev), a.double() @ b.double())
    conv = rel(torch.nn.functional.conv2d(x.to(dev), w.to(dev), padding=2),
               torch.nn.functional.conv2d(x.double(), w.double(), padding=2))
    return mm, conv


def make_sgd(model, args):
    """SGD as asked; auto = fused where this torch has it, else foreach."""
    kw = dict(lr=args.lr, momentum=args.momentum)
    if args.sgd in ("auto", "fused"):
        try:
            return torch.optim.SGD(model.parameters(), fused=True, **kw), "fused"
        except (TypeError, RuntimeError, ValueError) as e:
            if args.sgd == "fused":
                raise SystemExit("torch_mlp: --sgd fused: %s" % e)
    return torch.optim.SGD(model.parameters(), foreach=True, **kw), "foreach"


def cuda_main(args):
    """--device cuda: time-based warm-up and repeats timed with CUDA events
    (see the top of this file)."""
    dev = torch.device("cuda")
    tf32 = args.tf32 == "on"
    flags = set_tf32(tf32)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark == "on"
    probe_mm, probe_conv = tf32_probe(dev)

    n_in, _, _, n_out = MODELS[args.model]
    model = build_model(args.model).to(dev)
    model.train()
    opt, sgd = make_sgd(model, args)
    lossf = nn.CrossEntropyLoss()

    B = args.batch
    if args.real:
        X, Y = load_fmnist(n_in)
        X, Y = X.to(dev), Y.to(dev)
    else:  # as build/bench/gpu_mlp: 16 batches, at most 256 MiB of features, at least one batch
        n = max(B, min(16 * B, (256 << 20) // (4 * n_in)))
        X = torch.rand(n, n_in, device=dev)
        Y = torch.randint(0, n_out, (n,), device=dev)
    batches, nb = batches_of(X, Y, B)
    state = {"i": 0, "loss": None}
    eager_step = eager_step_of(model, opt, lossf, batches, state)
    step = eager_step
    if args.mode == "graph":
        # PyTorch's whole-network capture recipe: warm up on a side stream
        # (cuDNN's autotuner, the momentum buffers), capture forward,
        # backward and step once, then copy each batch into the captured
        # input and replay.
        static_x, static_y = batches[0][0].clone(), batches[0][1].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                eager_step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = lossf(model(static_x), static_y)
            static_loss.backward()
            opt.step()

        def graph_step():
            x, y = batches[state["i"] % nb]
            state["i"] += 1
            static_x.copy_(x)
            static_y.copy_(y)
            graph.replay()
            state["loss"] = static_loss
        step = graph_step

    t0, warm_steps = time.perf_counter(), 0
    while warm_steps < 2 or time.perf_counter() - t0 < args.warmup_seconds:
        step()
        warm_steps += 1
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0

    rates, times, counts = [], [], []
    for _ in range(args.repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t0, n = time.perf_counter(), 0
        while n == 0 or time.perf_counter() - t0 < args.seconds:
            step()
            n += 1
        b.record()
        b.synchronize()
        ms = a.elapsed_time(b)
        rates.append(n * B / (ms / 1e3))
        times.append(ms)
        counts.append(n)
    best, med = max(rates), statistics.median(rates)
    loss = float(state["loss"])

    label = "eager" if args.mode == "eager" else "CUDA graph (not eager)"
    print("# torch %s (CUDA %s, cuDNN %s) on %s; threads=%d interop=%d" % (
        torch.__version__, torch.version.cuda, torch.backends.cudnn.version(),
        torch.cuda.get_device_name(dev), torch.get_num_threads(), torch.get_num_interop_threads()))
    print("# model %s (%d parameters), batch %d, %s, SGD %s, cudnn.benchmark=%s" % (
        args.model, sum(p.numel() for p in model.parameters()), B, label, sgd,
        torch.backends.cudnn.benchmark))
    print("# tf32 %s: %s" % (args.tf32, flags))
    print("# tf32 probe: matmul max error %.1e, conv %.1e of the largest value (%s, %s)" % (
        probe_mm, probe_conv, "TF32 matmul" if probe_mm > 3e-5 else "fp32 matmul",
        "TF32 conv" if probe_conv > 3e-5 else "fp32 conv"))
    print("# data: %d random samples on the GPU in %d pre-cut batches" % (X.shape[0], nb))
    print("# warm-up %.2f s (%d steps); %d repeats of >= %.2f s timed with CUDA events" % (
        warm_s, warm_steps, args.repeats, args.seconds))
    for k, (n, ms, r) in enumerate(zip(counts, times, rates)):
        print("#   repeat %d: %d steps in %.1f ms: %.0f samples/s" % (k + 1, n, ms, r))
    print("# median %.0f samples/s (%.4f ms/step), best %.0f; shortest repeat %.1f ms; last loss %.4f" % (
        med, 1e3 * B / med, best, min(times), loss))
    if args.csv:
        print("torch,cuda,%s,%d,%d,%.1f,%.1f,%d,%s,%d,%.5f,-,gpu,%s,%.2e" % (
            args.model, B, args.threads, best, med, tf32, args.mode, args.repeats, 1e3 * B / med,
            ";".join("%.1f" % r for r in rates), max(probe_mm, probe_conv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
