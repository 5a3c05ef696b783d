#!/bin/sh
# Every check that needs a GPU, packed here and run on a lent GPU machine
# in as few calls as possible (docs/GPU.md, "Running the GPU checks"). The
# GPU machine cannot install packages, so this machine builds everything and
# bundles it with the Criterion libraries and the Fashion-MNIST files.
#
#   bench/gpu-session.sh pack [DIR]               here: build and bundle into DIR (default .gpu,
#                                                 git-ignored; carry it)
#   bench/gpu-session.sh run DIR OUTDIR [--budget S] STEP...
#                                                 there: run the steps; every step's log in
#                                                 OUTDIR/logs.tar.gz, the statuses in OUTDIR/summary.txt
#
# A device call runs at most 10 minutes and carries at most 64 MiB, the
# working tree (about 1.5 MB) included, and a whole session has 15 minutes
# of device time, the machine's start included: one full call and one short
# one. So pack fails when DIR is 60 MiB or more, every step has a time
# limit (LIMIT below, seconds), and --budget S bounds the whole call: the
# steps run in the order given, each within what is left of S seconds
# (counted from before unpacking), cut to that when it still leaves the
# step its FLOOR, and not run at all when it does not. "all" stands for
# the steps a GPU session owes, in the order of what it most needs:
# env cpu-blas tests sanitize bench-cnn cluster-bench bench ncu cnn (mlp, cluster
# and pushpull have run: docs/BENCHMARKS.md; name them to run them again).
# A session's first call: run .gpu $OUT --budget 560 all (timeout_s 590);
# its second, if minutes are left: the steps the first did not run.
#
# Steps (LIMIT/FLOOR; expected time on one H200 in parentheses):
#   env       (120/60; ~15 s) nvidia-smi, driver, glibc, where libcublas is found, torch's version
#             and TF32 flags, and a timed one-step `pstrain local` on Fashion-MNIST at
#             memory_fraction 0.9 and 0.05
#   cpu-blas  (90/45; ~30 s) the host CPU's training throughput with the BLAS kernels pstrain
#             chooses against each OPENBLAS_CORETYPE by hand (build/bench/cpu_mlp, MLP, batch 128,
#             1 thread, 3 interleaved rounds): issue 35's check on a CPU we did not tune on (the
#             first H200 host's CPU made OpenBLAS fall back to its Prescott kernels)
#   tests     (300/120; ~1 min) the GPU suites one by one: gpu_kernels, gpu, devices, devflow, train,
#             cli, cnn
#   sanitize  (300/120; unknown: the whole list likely needs more than one call) compute-sanitizer:
#             memcheck, initcheck, racecheck and synccheck over the devices, devflow, gpu_kernels,
#             gpu and cnn suites, and memcheck over 3 steps of every examples/*.ini, memcheck first; the
#             units the limit leaves out are listed with the SANITIZE=... that runs them
#   bench-cnn (240/150; ~2 min) bench/gpu_mlp for the example CNN at batch 256, TF32 off and on,
#             against PyTorch's CUDA graph (3 rounds) and eager (1 round)
#   cluster-bench (180/90; ~30 s) bench/gpu_cluster: `local`, 1 ps + 1 worker, 1 ps + 2 workers
#             and 4 ps + 1 worker beside it on this GPU (over Unix sockets), for the CNN at batch 256
#             and the MLP at 128: steps/s, samples/s against local's, each worker's compute and
#             communication per step and its overlap (steps whose gradient went up as backward made
#             it, forward passes on parameters as they arrived, their wait for them)
#   bench     (420/200; ~5 min) bench/gpu_mlp: MLP-256, MLP-4096, wide at 4096 (TF32 off, on)
#             against PyTorch's CUDA graph (3 rounds) and eager (1 round)
#   ncu       (240/120; ~2 min) Nsight Compute per-kernel times of MLP-256 and MLP-4096 steps
#             (kernel by kernel, so each launch is one kernel)
#   cnn       (480/480; unknown) pstrain local on examples/fashion-cnn.ini for CNN_EPOCHS epochs
#             (default 12, the example's); fails at its limit if the GPU is too slow for that
#   mlp       (200/90; < 1 min) pstrain local on examples/fashion-mlp.ini, placement logged
#   cluster   (300/120; ~30 s) 1 ps + 2 workers of cluster.ini's MLP on this one GPU,
#             memory_fraction 0.4 each
#   pushpull  (170/120; ~2 min) sealed vs plain push/pull with 1,2,4,8 and auto crypto threads
# A step's exit status is its program's or suite's (124: stopped at its
# limit), never a pipeline's; run's own status is 0 only when every step
# passed, 1 when any failed, 3 when none failed but the budget left some
# unrun; its last lines list every step's status, "not run" ones too.
set -u
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$self")/.." || exit 1
mode=${1:-}
[ $# -gt 0 ] && shift

MAX_BYTES=$((60 * 1024 * 1024))
# build/pstrain-test: the binary the suites start (pstrain with the test
# hooks, base/hooks.h); the release pstrain has none.
BINS="pstrain build/pstrain-test build/tests/run build/bench/gpu_mlp build/bench/pushpull build/bench/cpu_mlp"

# pack [DIR]: the binaries (GPU_PACK_BINS, default all five) and the
# Criterion libraries as one archive, DIR/bin.tar.xz, or DIR/bin.tar.gz
# where this machine has no xz or GPU_PACK_FORMAT=gzip; DIR/FORMAT records
# which, DIR/MANIFEST what was packed from which commit; DIR/data the
# Fashion-MNIST files (30 MB). xz shrinks the static binaries (28 MB each:
# cudart, the kernels, OpenBLAS) about tenfold, gzip only fourfold: the
# four in gzip do not fit, so a gzip bundle names fewer in GPU_PACK_BINS.
# Where the GPU machine has no xz, run unpacks with python3's lzma instead.
# cpu-blas: pstrain's kernel choice against each OPENBLAS_CORETYPE on the
# host CPU, one thread, rounds interleaved; medians. The names OpenBLAS
# maps to kernels already timed are left out, as bench/cpu_mlp does.
cpublas_step() {
	b=build/bench/cpu_mlp
	[ -x $b ] || { echo "$b was not packed"; return 1; }
	unset OPENBLAS_CORETYPE
	$b --describe
	grep -m1 -o -w -E 'avx512_bf16|amx_tile|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
	sets="" seen=" $($b --csv --seconds 0 --warmup 1 --batch 8 | cut -d, -f7) "
	for c in Prescott Haswell SkylakeX Cooperlake SapphireRapids; do
		k=$(OPENBLAS_CORETYPE=$c $b --csv --seconds 0 --warmup 1 --batch 8 2>/dev/null | cut -d, -f7)
		case "$seen" in *" $k "*) echo "OPENBLAS_CORETYPE=$c: $k kernels, timed already" ;;
		*) sets="$sets $c"; seen="$seen$k "; echo "OPENBLAS_CORETYPE=$c: $k kernels" ;; esac
	done
	tmp=$(mktemp)
	for r in 1 2 3; do
		for c in choice $sets; do
			if [ $c = choice ]; then line=$($b --warmup 10 --threads 1 --batch 128 --seconds 1 --csv)
			else line=$(OPENBLAS_CORETYPE=$c $b --warmup 10 --threads 1 --batch 128 --seconds 1 --csv); fi
			echo "$c $(echo "$line" | cut -d, -f7) $(echo "$line" | cut -d, -f6)" >>"$tmp"
		done
	done
	echo "samples/s, MLP batch 128, 1 thread, median of 3 (rounds):"
	best=$(sort -k3 -g "$tmp" | awk '{print $3}' | tail -1)
	for c in choice $sets; do
		awk -v c=$c '$1 == c { print $3, $2 }' "$tmp" | sort -g | awk -v c=$c '
			{ v[NR] = $1; k = $2; all = all " " $1 }
			END { printf "  %-16s %-14s %10.0f  (%s)\n", c == "choice" ? "pstrain choice" : c, k, v[2], substr(all, 2) }'
	done
	rm -f "$tmp"
}

pack() {
	dir=${1:-.gpu}
	fmt=${GPU_PACK_FORMAT:-xz}
	command -v xz >/dev/null 2>&1 || fmt=gzip
	case $fmt in xz | gzip) ;; *) echo "gpu-session: GPU_PACK_FORMAT is xz or gzip, not $fmt" >&2; exit 2 ;; esac
	bins=""
	for b in ${GPU_PACK_BINS:-$BINS}; do
		# gpu_mlp needs core/nn/devices.h's resident-data API; without it the
		# rest is still worth packing, and the bench steps say why they fail.
		if [ "$b" = build/bench/gpu_mlp ] && ! make -s "$b"; then
			echo "gpu-session: WARNING: $b did not build; packing without it (the bench steps will fail)" >&2
			continue
		fi
		make -s "$b" || exit 1
		bins="$bins $b"
	done
	rm -rf "$dir" && mkdir -p "$dir/data" || exit 1
	stage=$(mktemp -d) || exit 1
	mkdir -p "$stage/build/gpu-lib" || exit 1
	# The test binary's Criterion and what it pulls in; glibc is on every
	# machine, and the other binaries need nothing else.
	case " $bins " in *" build/tests/run "*)
		for so in $(ldd build/tests/run | awk '$3 ~ /^\// { print $3 }' |
			grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*)\.so'); do
			cp -L "$so" "$stage/build/gpu-lib/" || exit 1
		done ;;
	esac
	for b in $bins; do
		mkdir -p "$stage/$(dirname "$b")" && cp "$b" "$stage/$b" || exit 1
	done
	cp /usr/share/datasets/fashion-mnist/*.gz "$dir/data/" || exit 1
	tar cf "$stage.tar" -C "$stage" . || exit 1
	if [ "$fmt" = xz ]; then
		xz -T2 -6 -c "$stage.tar" >"$dir/bin.tar.xz" || exit 1
	else
		gzip -9 -c "$stage.tar" >"$dir/bin.tar.gz" || exit 1
	fi
	rm -rf "$stage" "$stage.tar"
	echo "$fmt" >"$dir/FORMAT"
	{
		echo "commit $(git rev-parse HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
		echo "packed $(date -u '+%Y-%m-%d %H:%M UTC') as $fmt"
		echo "binaries:$bins"
		./pstrain --version
	} >"$dir/MANIFEST"
	bytes=$(du -sb "$dir" | cut -f1)
	echo "gpu-session: $dir is $bytes bytes ($((bytes / 1024 / 1024)) MiB, limit 60 MiB), $fmt"
	if [ "$bytes" -ge "$MAX_BYTES" ]; then
		echo "gpu-session: $dir is over 60 MiB: a device call carries at most 64 MiB with the working tree" >&2
		exit 1
	fi
	echo "carry: [\"$dir\"]   command: bench/gpu-session.sh run $dir \$OUT --budget 560 all (timeout_s 590)"
}

# unpack ARCHIVE FORMAT: into the current directory, with xz or gzip, or
# where that tool is missing, with python3's standard library (lzma, gzip).
unpack() {
	if command -v "$2" >/dev/null 2>&1; then
		t=$(mktemp) || return 1
		"$2" -dc "$1" >"$t" && tar xf "$t"
		rc=$?
		rm -f "$t"
		return $rc
	fi
	echo "gpu-session: no $2 here; unpacking with ${PY:-python3}'s tarfile"
	"${PY:-python3}" -c 'import sys, tarfile
kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
with tarfile.open(sys.argv[1]) as t:
    t.extractall(".", **kw)' "$1"
}

# A directory holding libcublas.so.13 (or .12) when the loader cannot find
# one by itself: on the lent machines it comes with PyTorch's pip wheels.
cublas_dir() {
	ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.1[23] ' && return 0
	f=$(find /opt /usr/local /usr/lib -name 'libcublas.so.1[23]' 2>/dev/null | head -n 1)
	[ -n "$f" ] && dirname "$f"
}

# fit NAME LIMIT FLOOR: sets lim to the seconds step NAME may run: LIMIT,
# or under --budget what is left of the call less a margin for the
# timeout's grace, when that is less; returns 1, and records the step as
# not run, when that is under FLOOR.
fit() {
	lim=$2
	[ "$budget" -gt 0 ] || return 0
	left=$((budget - ($(date +%s) - call_t0) - 15))
	[ "$left" -lt "$lim" ] && lim=$left
	[ "$lim" -ge "$3" ] && return 0
	echo "== $1: not run: ${left}s left of the call's budget of ${budget}s, it needs at least $3s"
	summary="$summary
   $1: not run (budget)"
	unrun=$((unrun + 1))
	return 1
}

# run_step NAME LIMIT CMD...: CMD with its output in $logs/NAME.log,
# stopped at LIMIT seconds; its status is CMD's (124 at the limit).
run_step() {
	name=$1 limit=$2
	shift 2
	echo "== $name (limit ${limit}s): $*"
	t0=$(date +%s)
	timeout -k 10 "$limit" "$@" >"$logs/$name.log" 2>&1
	rc=$?
	echo "== $name: exit $rc after $(($(date +%s) - t0))s$([ $rc = 124 ] && echo ' (stopped at its limit)')"
	tail -n 25 "$logs/$name.log"
	summary="$summary
   $name: exit $rc"
	[ $rc = 0 ] || failed=$((failed + 1))
}

# The logs so far as OUTDIR/logs.tar.gz (.tar without gzip) and the summary
# as OUTDIR/summary.txt, after every step: a device call brings back at
# most 8 files, fewer than the steps, and what is in OUTDIR when a call is
# stopped at its limit still comes back.
save_logs() {
	echo "steps:$summary" >"$out/summary.txt"
	if command -v gzip >/dev/null 2>&1; then
		tar czf "$out/.logs.part" -C "$logs" . && mv "$out/.logs.part" "$out/logs.tar.gz"
	else
		tar cf "$out/.logs.part" -C "$logs" . && mv "$out/.logs.part" "$out/logs.tar"
	fi
}

# The env step, in a shell of its own (run_step's timeout needs a program).
env_step() {
	st=0
	echo "## nvidia-smi"
	nvidia-smi || st=1
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || st=1
	echo "## kernel and glibc: $(uname -r); $(ldd --version 2>&1 | head -n 1)"
	echo "## CPUs: $(nproc); memory: $(awk '/MemTotal/ { print $2 / 1048576 " GiB" }' /proc/meminfo)"
	echo "## libcublas: ${CUBLAS_DIR:-found by the loader}"
	ldconfig -p 2>/dev/null | grep 'libcublas\.so\.1[23] '
	[ -n "${CUBLAS_DIR:-}" ] && ls -l "$CUBLAS_DIR"/libcublas*.so*
	echo "## pstrain: $(./pstrain --version)"
	echo "## python: $(command -v "$PY")"
	"$PY" -c 'import torch
b = torch.backends
print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN", b.cudnn.version(),
      "cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
# The defaults, before anything sets them (bench/torch_mlp.py sets both):
for name, get in (("cuda.matmul.allow_tf32", lambda: b.cuda.matmul.allow_tf32),
                  ("cudnn.allow_tf32", lambda: b.cudnn.allow_tf32),
                  ("cuda.matmul.fp32_precision", lambda: b.cuda.matmul.fp32_precision),
                  ("cudnn.conv.fp32_precision", lambda: b.cudnn.conv.fp32_precision),
                  ("float32_matmul_precision", torch.get_float32_matmul_precision)):
    try:
        print("default", name, "=", get())
    except Exception as e:
        print("default", name, "= ? (%s)" % e)' || st=1
	for frac in 0.9 0.05; do
		ck=$(mktemp -d)
		echo "## pstrain local, one step, memory_fraction $frac"
		t0=$(date +%s%N)
		# shellcheck disable=SC2086
		./pstrain local --config examples/fashion-mlp.ini --fresh $set_data --set train.steps=1 \
			--set gpu.memory_fraction=$frac --set gpu.soft_placement=false \
			--set train.checkpoint_dir="$ck"
		rc=$?
		echo "## memory_fraction $frac: exit $rc, $((($(date +%s%N) - t0) / 1000000)) ms wall"
		[ $rc = 0 ] || st=1
		rm -rf "$ck"
	done
	return $st
}

# The GPU suites one process at a time: every test that trains takes an
# arena of memory_fraction 0.9, so two at once would refuse each other. A
# test that needs a GPU skips without one; on a machine where nvidia-smi
# lists a GPU such a skip (a missing cuBLAS, say) fails its suite, since a
# skipped check proves nothing.
tests_step() {
	[ -x build/tests/run ] || { echo "build/tests/run was not packed"; return 1; }
	has_gpu=0
	nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && has_gpu=1
	echo "## nvidia-smi lists a GPU: $([ $has_gpu = 1 ] && echo yes || echo no)"
	st=0
	log=$(mktemp) || return 1
	# Suites, and of ctr only the GPU test (its others are CPU runs a
	# GPU host would repeat on the GPU at length).
	for f in 'gpu_kernels/*' 'gpu/*' 'devices/*' 'devflow/*' 'train/*' 'cli/*' 'cnn/*' 'ctr/gpu_*'; do
		s=${f%%/*}
		echo "## suite $s ($f)"
		# Launches wait for their kernels: a fault is reported by the
		# call that caused it, not by a later one (a step never waits).
		# Not for devices: its CUDA graph test captures a step, and a
		# capture is reported to fail under blocking launches.
		blocking=1
		[ "$s" = devices ] && blocking=0
		CUDA_LAUNCH_BLOCKING=$blocking LD_LIBRARY_PATH="$TESTS_LIB" build/tests/run --jobs 1 --verbose \
			--filter "$f" >"$log" 2>&1
		rc=$?
		cat "$log"
		skips=$(grep -c '^\[SKIP\] .*: needs a GPU' "$log")
		echo "## suite $s: exit $rc, $skips test(s) skipped for want of a GPU"
		if [ $rc != 0 ]; then
			st=1
		elif [ $has_gpu = 1 ] && [ "$skips" != 0 ]; then
			echo "## suite $s FAILED: $skips test(s) skipped on a machine with a GPU"
			st=1
		fi
	done
	rm -f "$log"
	return $st
}

# compute-sanitizer over every GPU suite and 3 steps of every example, as
# units TOOL:SUITE and memcheck:example/NAME in the order of need: memcheck
# first (the first GPU run's failures were memory errors, in a suite this
# step did not run then), then initcheck, racecheck and synccheck. The
# step's limit (SAN_LIMIT seconds) is shared out: each unit runs within what
# is left, and one that cannot have SAN_FLOOR seconds is not started; the
# step then fails and prints the SANITIZE=... that runs the rest in a later
# call. SANITIZE (space-separated units) runs only those. The cnn suite's
# tests run on the CPU today; it is here so that a CNN test that comes to
# use the GPU is covered. Each tool stops with status 99 on a finding; the
# log has its report. One cudaMalloc per buffer (PSTRAIN_GPU_EXACT_ALLOC),
# so that memcheck sees each buffer's bounds, not the arena's.
SAN_SUITES="devices devflow gpu_kernels gpu cnn"
# Suites that may make no CUDA call in any process (their tests, and the
# pstrain they spawn, run on the CPU today). compute-sanitizer ends such a
# run with "Target application terminated before first instrumented API
# call" and status 255 (the first H200 session, cnn under every tool), so
# these get --require-cuda-init no: the suite's own status then, or 99
# when a process of it (--target-processes all: Criterion's workers and
# the pstrain they execv, which keep the environment the tool injects)
# made a finding. The GPU suites keep the default: one that never reached
# CUDA on a GPU machine tested nothing, and should fail.
SAN_CPU_SUITES="cnn"
san_units() {
	for tool in memcheck initcheck racecheck synccheck; do
		for s in $SAN_SUITES; do echo "$tool:$s"; done
		if [ $tool = memcheck ]; then
			for ex in examples/*.ini; do
				echo "memcheck:example/$(basename "$ex" .ini)"
			done
		fi
	done
}

# san_unit CS UNIT SECONDS: one unit under compute-sanitizer CS.
san_unit() {
	tool=${2%%:*} what=${2#*:}
	case $what in
	example/*)
		ck=$(mktemp -d)
		ex="examples/${what#example/}.ini" data=$set_data
		# A click-through example reads synth's files, which the bundle
		# does not carry: a small set of them, made here.
		if grep -q '^format *= *criteo' "$ex"; then
			./pstrain synth --out "$ck/synth" --train-rows 20000 --test-rows 2000 >/dev/null || return 1
			data="--set data.train_csv=$ck/synth/train.txt --set data.test_csv=$ck/synth/test.txt"
		fi
		# Every example, the cluster ones too, as `pstrain local`: a
		# worker's device work (forward, backward, the gradient out) is
		# a part of a local step's.
		# shellcheck disable=SC2086
		PSTRAIN_GPU_EXACT_ALLOC=1 timeout -k 10 "$3" "$1" --tool "$tool" --error-exitcode 99 ./pstrain local \
			--config "$ex" --fresh $data --set train.steps=3 \
			--set gpu.soft_placement=false --set gpu.memory_fraction=0.4 --set train.checkpoint_dir="$ck/ckpt"
		rc=$?
		rm -rf "$ck"
		return $rc ;;
	esac
	init=""
	case " $SAN_CPU_SUITES " in *" $what "*) init="--require-cuda-init no" ;; esac
	# shellcheck disable=SC2086
	PSTRAIN_GPU_EXACT_ALLOC=1 timeout -k 10 "$3" "$1" $init --tool "$tool" --target-processes all --error-exitcode 99 \
		env LD_LIBRARY_PATH="$TESTS_LIB" build/tests/run --jobs 1 --filter "$what/*"
}

sanitize_step() {
	cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
	[ -n "$cs" ] || { echo "no compute-sanitizer on this machine"; return 1; }
	[ -x build/tests/run ] || { echo "build/tests/run was not packed"; return 1; }
	units=${SANITIZE:-$(san_units)}
	t_end=$(($(date +%s) + ${SAN_LIMIT:-480} - 5))
	floor=${SAN_FLOOR:-30}
	st=0 left_out="" results=""
	for u in $units; do
		left=$((t_end - $(date +%s)))
		if [ "$left" -lt "$floor" ]; then
			left_out="$left_out${left_out:+ }$u"
			continue
		fi
		echo "## $u (at most ${left}s)"
		t0=$(date +%s)
		san_unit "$cs" "$u" "$left"
		rc=$?
		case $rc in
		0) r="clean" ;;
		99) r="FINDINGS (exit 99)" ;;
		124) r="stopped at the step's limit" ;;
		*) r="FAILED (exit $rc)" ;;
		esac
		echo "## $u: $r after $(($(date +%s) - t0))s"
		results="$results
   $u: $r"
		[ $rc = 0 ] || st=1
	done
	echo "## sanitize units:$results"
	if [ -n "$left_out" ]; then
		echo "## not run for want of time: $left_out"
		echo "## the rest in a later call: SANITIZE='$left_out' bench/gpu-session.sh run DIR OUT --budget S sanitize"
		st=1
	fi
	return $st
}

# Per-kernel GPU times of a few whole steps after a warm-up (launches 60 on
# are steps past the first ones); the summary lists each kernel's duration.
ncu_step() {
	nc=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
	[ -n "$nc" ] || { echo "no ncu on this machine"; return 1; }
	st=0
	for b in 256 4096; do
		echo "## ncu: mlp at batch $b"
		# One cudaMalloc per buffer: ncu's kernel replay saves every
		# allocation a kernel may touch, and the default arena is one
		# allocation of 0.9 of the GPU.
		PSTRAIN_GPU_EXACT_ALLOC=1 "$nc" --launch-skip 60 --launch-count 40 --section SpeedOfLight --print-summary per-kernel \
			build/bench/gpu_mlp --model mlp --batch $b --graphs off --warmup 0 --seconds 0.05 \
			--repeats 1 || st=1
	done
	return $st
}

# cluster.ini's MLP as 1 ps + 2 workers, all on this machine's GPU.
cluster_step() {
	d=$(mktemp -d)
	cp cluster.ini "$d/" && ./pstrain keygen "$d/cluster.key" >/dev/null || return 1
	# shellcheck disable=SC2086
	examples/local-cluster.sh "$d/cluster.ini" ./pstrain -- $set_data \
		--set cluster.ps=127.0.0.1:2222 --set gpu.memory_fraction=0.4 \
		--set gpu.soft_placement=false --set train.checkpoint_dir="$d/ckpt"
	rc=$?
	rm -rf "$d"
	return $rc
}

bench_step() {
	[ -x build/bench/gpu_mlp ] || { echo "build/bench/gpu_mlp was not packed (see $1/MANIFEST)"; return 1; }
	BIN=build/bench/gpu_mlp REQUIRE_GPU=1 sh bench/gpu_mlp
}

run() {
	call_t0=$(date +%s)
	dir=$1 out=$2
	shift 2
	budget=0
	if [ "${1:-}" = --budget ]; then
		case ${2:-} in
		'' | *[!0-9]*) echo "gpu-session: --budget takes whole seconds, not '${2:-}'" >&2; exit 2 ;;
		esac
		budget=$2
		shift 2
	fi
	[ $# -gt 0 ] || { echo "gpu-session: no step named" >&2; exit 2; }
	steps=""
	for step in "$@"; do
		case $step in
		all) steps="$steps env cpu-blas tests sanitize bench-cnn cluster-bench bench ncu cnn" ;;
		*) steps="$steps $step" ;;
		esac
	done
	fmt=$(cat "$dir/FORMAT" 2>/dev/null || echo xz)
	arc=$dir/bin.tar.$([ "$fmt" = xz ] && echo xz || echo gz)
	[ -f "$arc" ] || { echo "gpu-session: no $arc (run pack here first)" >&2; exit 2; }
	mkdir -p "$out" || exit 1
	logs=$(mktemp -d) || exit 1
	t0=$(date +%s)
	unpack "$arc" "$fmt" || { echo "gpu-session: cannot unpack $arc" >&2; exit 1; }
	echo "gpu-session: unpacked $arc ($fmt) in $(($(date +%s) - t0))s; $(head -n 1 "$dir/MANIFEST" 2>/dev/null)"
	[ "$budget" -gt 0 ] && echo "gpu-session: budget ${budget}s for:$steps"
	CUBLAS_DIR=$(cublas_dir)
	# cuBLAS's directory for every program; the build machine's libraries
	# that Criterion needs (TESTS_LIB) only for the test binary, so that
	# python3, ncu and compute-sanitizer keep their own libcrypto, libffi...
	export CUBLAS_DIR LD_LIBRARY_PATH="${CUBLAS_DIR}${LD_LIBRARY_PATH:+${CUBLAS_DIR:+:}$LD_LIBRARY_PATH}"
	export TESTS_LIB="$PWD/build/gpu-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	PSTRAIN_BIN="$PWD/build/pstrain-test"
	[ -x "$PSTRAIN_BIN" ] || PSTRAIN_BIN="$PWD/pstrain"   # a bundle without it: the hook tests fail
	export PSTRAIN_BIN CRITERION_JOBS=1 PY="${PY:-python3}"
	data=$(cd "$dir/data" && pwd)
	set_data="--set data.train_images=$data/train-images-idx3-ubyte.gz --set data.train_labels=$data/train-labels-idx1-ubyte.gz --set data.test_images=$data/t10k-images-idx3-ubyte.gz --set data.test_labels=$data/t10k-labels-idx1-ubyte.gz"
	export set_data
	summary="" failed=0 unrun=0
	for step in $steps; do
		ck=$(mktemp -d)
		case $step in
		env) fit env 120 60 && run_step env "$lim" sh "$self" _env ;;
		cpu-blas) fit cpu-blas 90 45 && run_step cpu-blas "$lim" sh "$self" _cpublas ;;
		tests) fit tests 300 120 && run_step tests "$lim" sh "$self" _tests ;;
		bench)
			# gpu_mlp starts no run after its BUDGET; a run takes up to a
			# minute. PyTorch eager in one round of three: its rows vary
			# by 15% with Python's host loop, and the CUDA-graph row is
			# the comparison that counts.
			fit bench 420 200 && run_step bench "$lim" env BUDGET=$((lim - 70)) RUN_LIMIT=60 EAGER_ROUNDS=1 \
				CASES="mlp:256:off mlp:4096:off wide:4096:off wide:4096:on" sh "$self" _bench "$dir" ;;
		bench-cnn)
			fit bench-cnn 240 150 && run_step bench-cnn "$lim" env BUDGET=$((lim - 70)) RUN_LIMIT=60 EAGER_ROUNDS=1 \
				CASES="fashion-cnn:256:off fashion-cnn:256:on" sh "$self" _bench "$dir" ;;
		cluster-bench)
			# bench/gpu_cluster starts no run after its BUDGET; a run is
			# 5-15 s on an H200, RUN_LIMIT its guard.
			fit cluster-bench 180 90 && run_step cluster-bench "$lim" env BUDGET=$((lim - 70)) RUN_LIMIT=60 \
				PSTRAIN=./pstrain SET="$set_data" sh bench/gpu_cluster ;;
		mlp)
			# shellcheck disable=SC2086
			fit mlp 200 90 && run_step mlp "$lim" ./pstrain local --config examples/fashion-mlp.ini --fresh \
				$set_data --set train.checkpoint_dir="$ck" --set gpu.log_placement=true ;;
		cnn)
			# shellcheck disable=SC2086
			fit cnn 480 480 && run_step cnn "$lim" ./pstrain local --config examples/fashion-cnn.ini --fresh \
				$set_data --set train.epochs="${CNN_EPOCHS:-12}" --set train.checkpoint_dir="$ck" ;;
		sanitize) fit sanitize 300 120 && run_step sanitize "$lim" env SAN_LIMIT="$lim" sh "$self" _sanitize ;;
		cluster) fit cluster 300 120 && run_step cluster "$lim" sh "$self" _cluster ;;
		ncu) fit ncu 240 120 && run_step ncu "$lim" sh "$self" _ncu ;;
		pushpull)
			fit pushpull 170 120 && run_step pushpull "$lim" sh -c 'build/bench/pushpull --sizes 1,16,64 \
				--modes sealed,plain --seconds 1 --rounds 2 --crypto-threads 1,2,4,8,0 && build/bench/pushpull --crypto' ;;
		*)
			echo "gpu-session: unknown step $step" >&2
			summary="$summary
   $step: unknown step"
			failed=$((failed + 1)) ;;
		esac
		rm -rf "$ck"
		save_logs
	done
	rm -rf "$logs"
	echo "gpu-session: steps:$summary"
	echo "gpu-session: $(($(date +%s) - call_t0))s in all"
	[ "$failed" = 0 ] || { echo "gpu-session: $failed step(s) failed"; exit 1; }
	[ "$unrun" = 0 ] || { echo "gpu-session: $unrun step(s) not run for want of budget"; exit 3; }
}

case $mode in
pack) pack "$@" ;;
run) [ $# -ge 3 ] || { echo "usage: bench/gpu-session.sh run DIR OUTDIR [--budget S] STEP..." >&2; exit 2; }; run "$@" ;;
# The steps that are shell functions, run as programs under run_step's timeout.
_env) env_step ;;
_tests) tests_step ;;
_cpublas) cpublas_step ;;
_bench) bench_step "$1" ;;
_sanitize) sanitize_step ;;
_cluster) cluster_step ;;
_ncu) ncu_step ;;
*) echo "usage: bench/gpu-session.sh pack [DIR] | run DIR OUTDIR [--budget S] STEP..." >&2; exit 2 ;;
esac
