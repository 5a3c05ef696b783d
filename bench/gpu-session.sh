#!/bin/sh
# Every check that needs a GPU, packed here and run on a lent GPU machine
# in as few calls as possible (docs/GPU.md, "Running the GPU checks"). The
# GPU machine cannot install packages, so this machine builds everything and
# bundles it with the Criterion libraries and the Fashion-MNIST files.
#
#   bench/gpu-session.sh pack [DIR]          here: build and bundle into DIR (default .gpu,
#                                            git-ignored; carry it)
#   bench/gpu-session.sh run DIR OUTDIR STEP...   there: run the steps, one log per step in OUTDIR
#
# Steps (each bounded by `timeout`; together they must fit the device's
# 10-minute call, so split them over calls: "tests mlp bench" then "cnn pushpull"):
#   tests    the GPU suites: gpu_kernels, gpu, devices, then train (pstrain local on the GPU)
#   mlp      pstrain local on the Fashion-MNIST MLP (examples/fashion-mlp.ini), placement logged
#   bench    bench/gpu_mlp against PyTorch eager (torch from the machine's python3)
#   cnn      pstrain local on examples/fashion-cnn.ini (stopped at the time limit; the log has
#            the progress lines)
#   pushpull sealed vs plain push/pull with 1,2,4,8 and auto crypto threads (issue 3 on 16 cores)
set -u
cd "$(dirname "$0")/.."
mode=${1:-}
[ $# -gt 0 ] && shift

pack() {
	dir=${1:-.gpu}
	make -s pstrain build/tests/run build/bench/gpu_mlp build/bench/pushpull || exit 1
	rm -rf "$dir" && mkdir -p "$dir/lib" "$dir/data" || exit 1
	# Criterion and what it pulls in; glibc is on every machine.
	ldd build/tests/run | awk '$3 ~ /^\// { print $3 }' |
		grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*)\.so' |
		while read -r so; do cp -L "$so" "$dir/lib/"; done
	cp /usr/share/datasets/fashion-mnist/*.gz "$dir/data/" || exit 1
	# xz: the static binaries shrink about tenfold, gzip only halves them,
	# and a call carries at most 64 MiB.
	tar cf - pstrain build/tests/run build/bench/gpu_mlp build/bench/pushpull -C "$dir" lib |
		xz -T2 -6 >"$dir/bin.tar.xz" || exit 1
	rm -rf "$dir/lib"
	du -sh "$dir"
	echo "carry: [\"$dir\"]   command: bench/gpu-session.sh run $dir \$OUT tests mlp bench"
}

# A directory holding libcublas.so.13 (or .12) when the loader cannot find
# one by itself: on the lent machines it comes with PyTorch's pip wheels.
cublas_dir() {
	ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.1[23] ' && return 0
	f=$(find /opt /usr/local /usr/lib -name 'libcublas.so.1[23]' 2>/dev/null | head -n 1)
	[ -n "$f" ] && dirname "$f"
}

run_step() {
	name=$1 limit=$2
	shift 2
	echo "== $name (limit ${limit}s): $*"
	t0=$(date +%s)
	timeout "$limit" "$@" >"$out/$name.log" 2>&1
	rc=$?
	echo "== $name: exit $rc after $(($(date +%s) - t0))s"
	tail -n 15 "$out/$name.log"
}

run() {
	dir=$1 out=$2
	shift 2
	[ -f "$dir/bin.tar.xz" ] || { echo "gpu-session: no $dir/bin.tar.xz (run pack here first)" >&2; exit 2; }
	lib=$(mktemp -d)
	mkdir -p "$out" && xz -dc "$dir/bin.tar.xz" | tar xf - --exclude=lib && xz -dc "$dir/bin.tar.xz" | tar xf - -C "$lib" lib || exit 1
	lib=$lib/lib
	cb=$(cublas_dir)
	export LD_LIBRARY_PATH="$lib${cb:+:$cb}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	export PSTRAIN_BIN="$PWD/pstrain" CRITERION_JOBS=1
	data=$(cd "$dir/data" && pwd)
	set_data="--set data.train_images=$data/train-images-idx3-ubyte.gz --set data.train_labels=$data/train-labels-idx1-ubyte.gz --set data.test_images=$data/t10k-images-idx3-ubyte.gz --set data.test_labels=$data/t10k-labels-idx1-ubyte.gz"
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1
	echo "gpu: $(cat "$out/gpu.txt"); cpus: $(nproc); cublas from: ${cb:-loader path}"
	for step in "$@"; do
		ck=$(mktemp -d)
		case $step in
		tests)
			# Not the cluster suites: two workers on one GPU with the default
			# memory_fraction 0.9 refuse each other (docs/GPU.md).
			run_step tests 240 sh -c 'for s in gpu_kernels gpu devices train cli cnn; do
				build/tests/run --jobs 1 --verbose --filter "$s/*" >/tmp/suite.log 2>&1 || echo "suite $s FAILED"
				grep -v "Test is disabled" /tmp/suite.log; done' ;;
		mlp)
			# shellcheck disable=SC2086
			run_step mlp ${MLP_LIMIT:-200} ./pstrain local --config examples/fashion-mlp.ini --fresh $set_data \
				--set train.checkpoint_dir="$ck" --set gpu.log_placement=true ;;
		bench)
			run_step bench 240 env BIN=build/bench/gpu_mlp bench/gpu_mlp ;;
		cnn)
			# shellcheck disable=SC2086
			run_step cnn 420 ./pstrain local --config examples/fashion-cnn.ini --fresh $set_data \
				--set train.checkpoint_dir="$ck" ;;
		pushpull)
			run_step pushpull 170 sh -c 'build/bench/pushpull --sizes 1,16,64 --modes sealed,plain \
				--seconds 1 --rounds 2 --crypto-threads 1,2,4,8,0 && build/bench/pushpull --crypto' ;;
		*) echo "gpu-session: unknown step $step" >&2; exit 2 ;;
		esac
		rm -rf "$ck"
	done
}

case $mode in
pack) pack "$@" ;;
run) [ $# -ge 3 ] || { echo "usage: bench/gpu-session.sh run DIR OUTDIR STEP..." >&2; exit 2; }; run "$@" ;;
*) echo "usage: bench/gpu-session.sh pack [DIR] | run DIR OUTDIR STEP..." >&2; exit 2 ;;
esac
