# pstrain build. `make` builds ./pstrain (with CUDA when nvcc is found),
# `make test` is what CI runs, `make demo` trains the default cluster.ini.
# Objects go under $(BUILD); a stamp of the flags rebuilds when they change.
#
#   make CUDA=0      CPU-only binary even where nvcc exists
#   make V=1         show the commands
#   make deps        install the Debian packages the build and tests need

CUDA ?= auto
V ?= 0
BUILD ?= build
BIN ?= pstrain
SAN ?= 0
VERSION := 0.1.0

CC := gcc
CFLAGS ?= -O3 -g
CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow -Wno-sign-compare -MMD -MP \
	-DPSTRAIN_VERSION='"$(VERSION)"'
# No code reads errno after sqrtf; with it, GCC must keep each sqrtf scalar
# to set errno on a negative argument, so the optimizers' loops (Adam,
# Adagrad) never vectorized. IEEE square roots are exact either way: the
# numbers do not change. (-std=c11 keeps -ffp-contract=off: no FMA either.)
CFLAGS += -fno-math-errno
LDFLAGS ?=
# Everything but glibc is linked statically: `ldd pstrain` must list only glibc.
STATIC_LIBS := -Wl,-Bstatic -linih -lsodium -lopenblas -lz -Wl,-Bdynamic
LDLIBS := $(STATIC_LIBS) -lm -lpthread -ldl -lrt

ifeq ($(SAN),1)
CFLAGS += -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif
# SAN=thread: ThreadSanitizer, by hand (not in `make test`: OpenBLAS's own
# threads are not instrumented), e.g. `make CUDA=0 SAN=thread
# BUILD=build/tsan BIN=build/tsan/pstrain` and the cluster suites with
# PSTRAIN_BIN=build/tsan/pstrain-test (tests/tsan_noclones.h says why it is
# included).
ifeq ($(SAN),thread)
CFLAGS += -O1 -fno-omit-frame-pointer -fsanitize=thread -include tests/tsan_noclones.h
LDFLAGS += -fsanitize=thread
endif

# CUDA: auto-detect nvcc on PATH or in /usr/local/cuda. `$(shell ...)` matters:
# without it the probe silently never runs (llm.c's Makefile had that bug).
ifeq ($(CUDA),auto)
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
else ifeq ($(CUDA),0)
NVCC :=
else
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(NVCC),)
$(error CUDA=$(CUDA) but no nvcc found on PATH or in /usr/local/cuda/bin)
endif
endif

# The GPU architectures the CUDA build carries: SASS for each of CUDA_ARCHS
# and PTX for CUDA_PTX (by default the newest; the driver JIT-compiles it for
# later GPUs; empty for none), e.g. `make CUDA_ARCHS="75 80 90"` for a T4.
# These two lines are the only list: nvcc's -gencode flags and
# PSTRAIN_CUDA_TARGETS, the string gpu/arch.c checks a device against and
# gpu_build_info() prints, are both made from them. A CPU-only build gets
# the same string, for the tests of that check.
CUDA_ARCHS ?= 80 90
CUDA_PTX ?= $(lastword $(CUDA_ARCHS))
CUDA_TARGETS := $(strip $(CUDA_ARCHS:%=sm_%) $(CUDA_PTX:%=compute_%))
GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
	$(foreach a,$(CUDA_PTX),-gencode arch=compute_$(a),code=compute_$(a))
ARCH_FLAGS := -DPSTRAIN_CUDA_TARGETS='"$(CUDA_TARGETS)"'

CORE_SRC := $(wildcard core/*.c core/*/*.c)
NET_SRC := $(wildcard net/*.c)
# Below core/ and net/ both: err_set.
BASE_SRC := $(wildcard base/*.c)
# The ps and worker roles: in the binary and the test binary (their pure
# parts have unit tests), not in the benchmarks.
# cluster/ps_harness.c drives a ps without sockets for fuzz_ps only: it is
# never linked into pstrain or the test runner.
ROLE_SRC := $(filter-out cluster/ps_harness.c,$(wildcard cluster/*.c))
# The plain-C parts of gpu/ (the rules that decide, not the CUDA calls) are
# in every build, so their tests run without a GPU.
GPU_PLAIN := gpu/arch.c gpu/arena.c
ifneq ($(NVCC),)
ifeq ($(strip $(CUDA_ARCHS)),)
$(error CUDA_ARCHS is empty: name at least one architecture, e.g. CUDA_ARCHS="80 90")
endif
CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib))
GPU_CU := $(wildcard gpu/*.cu)
GPU_C := $(GPU_PLAIN) $(filter-out gpu/stub.c $(GPU_PLAIN),$(wildcard gpu/*.c))
# -lineinfo: compute-sanitizer and Nsight name the source line of a fault
# (line tables only: the optimization level is unchanged).
NVCCFLAGS := -std=c++17 -O2 -lineinfo -Xcompiler -Wall $(GENCODE)
# cudart is static; the driver (libcuda.so.1) and, later, cuBLAS are loaded
# at run time with dlopen, so the binary starts where CUDA is absent.
CUDA_LIBS := -L$(CUDA_LIBDIR) -Wl,-Bstatic -lcudart_static -Wl,-Bdynamic -lstdc++ -lrt
GPU_DESC := nvcc $(shell $(NVCC) --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') ($(CUDA_TARGETS))
else
GPU_CU :=
GPU_C := $(GPU_PLAIN) gpu/stub.c
CUDA_LIBS :=
GPU_DESC := no CUDA
endif

OBJ_CORE := $(CORE_SRC:%.c=$(BUILD)/%.o) $(NET_SRC:%.c=$(BUILD)/%.o) $(BASE_SRC:%.c=$(BUILD)/%.o) \
	$(GPU_C:%.c=$(BUILD)/%.o) $(GPU_CU:%.cu=$(BUILD)/%.cu.o)
OBJ_ROLE := $(ROLE_SRC:%.c=$(BUILD)/%.o)
OBJ_MAIN := $(BUILD)/main.o
TEST_SRC := $(wildcard tests/test_*.c) tests/util.c tests/target.c tests/gradcheck.c
OBJ_TEST := $(TEST_SRC:%.c=$(BUILD)/%.o)
TEST_BIN := $(BUILD)/tests/run
ifeq ($(NVCC),)
LINK := $(CC)
else
# libstdc++ is needed by cudart_static; link it statically too.
LINK := $(CC) -static-libstdc++ -static-libgcc
CUDA_LIBS := -L$(CUDA_LIBDIR) -Wl,-Bstatic -lcudart_static -lstdc++ -Wl,-Bdynamic -lrt
endif

ifeq ($(V),0)
Q := @
say = @printf '  %-6s %s\n' $(1) $(2);
else
Q :=
say :=
endif

.PHONY: all deps deps-test deps-bench install test unit test-cpu test-net test-slurm asan demo bench netlab netlab-ctr fuzz clean summary FORCE
.DEFAULT_GOAL := all

all: deps summary $(BIN)

summary:
	@echo "pstrain $(VERSION): $(GPU_DESC), OpenBLAS static, build dir $(BUILD)$(if $(filter 1,$(SAN)), with ASan+UBSan,)"

# Rebuild everything when the compiler or flags change.
FLAGS_NOW := $(CC) $(CFLAGS) $(LDFLAGS) $(LDLIBS) $(NVCC) $(NVCCFLAGS) $(CUDA_LIBS) $(CUDA_TARGETS)
$(BUILD)/flags.stamp: FORCE
	@mkdir -p $(BUILD)
	@echo '$(FLAGS_NOW)' | cmp -s - $@ || echo '$(FLAGS_NOW)' > $@

# The one list of architectures, for the two files that read it.
$(BUILD)/gpu/arch.o: CFLAGS += $(ARCH_FLAGS)
$(BUILD)/gpu/device.cu.o: NVCCFLAGS += $(ARCH_FLAGS)

$(BUILD)/%.o: %.c $(BUILD)/flags.stamp
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu $(BUILD)/flags.stamp
	@mkdir -p $(dir $@)
	$(call say,NVCC,$<)$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(BIN): $(OBJ_MAIN) $(OBJ_ROLE) $(OBJ_CORE)
	$(call say,LINK,$@)$(LINK) $(LDFLAGS) $^ -o $@ $(CUDA_LIBS) $(LDLIBS)

# The test build: base/hooks.c again with -DPSTRAIN_TEST_HOOKS (the only
# object that differs), in the test runner and in $(BUILD)/pstrain-test,
# the binary the suites start. The release $(BIN) has no test hook.
OBJ_CORE_TEST := $(patsubst $(BUILD)/base/hooks.o,$(BUILD)/test-hooks/base/hooks.o,$(OBJ_CORE))
TEST_PSTRAIN := $(BUILD)/pstrain-test
$(BUILD)/test-hooks/base/hooks.o: base/hooks.c $(BUILD)/flags.stamp
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(CFLAGS) -DPSTRAIN_TEST_HOOKS -c $< -o $@

$(TEST_BIN): $(OBJ_TEST) $(OBJ_ROLE) $(OBJ_CORE_TEST)
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(LINK) $(LDFLAGS) $^ -o $@ $(CUDA_LIBS) -lcriterion $(LDLIBS)

$(TEST_PSTRAIN): $(OBJ_MAIN) $(OBJ_ROLE) $(OBJ_CORE_TEST)
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(LINK) $(LDFLAGS) $^ -o $@ $(CUDA_LIBS) $(LDLIBS)

# The unit and integration suite against this build's objects and binary.
unit: deps summary $(BIN) $(TEST_BIN) $(TEST_PSTRAIN)
	$(Q)LSAN_OPTIONS=suppressions=$(abspath tests/lsan.supp) PSTRAIN_BIN=$(abspath $(TEST_PSTRAIN)) $(TEST_BIN) --jobs 2 $(TESTFLAGS)
	$(Q)$(if $(filter 1,$(SAN)),echo "ldd check skipped: sanitizer runtimes are shared libraries",./tests/ldd_check.sh $(BIN))
	$(Q)./tests/house.sh $(BIN)

# What CI runs: the default build's suite, then the CPU-only build's, then
# the suite under AddressSanitizer + UndefinedBehaviorSanitizer.
test: deps-test unit
	$(Q)$(MAKE) --no-print-directory test-cpu
	$(Q)$(MAKE) --no-print-directory asan
	$(Q)$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(FUZZ_CI_SECONDS) FUZZ_SEED=1
	$(Q)$(MAKE) --no-print-directory test-net
	$(Q)$(MAKE) --no-print-directory test-slurm
	@echo "make test: all suites passed (default build: $(GPU_DESC); CPU-only; ASan+UBSan; every fuzzer $(FUZZ_CI_SECONDS) s)"

# Each fuzzer's run in `make test`: long enough to replay its corpus and
# find what a change broke near the seeds, short enough for CI; a fixed
# seed, so that CI does not fail at random on an old finding (`make fuzz`
# alone draws a new seed each time, to find them).
FUZZ_CI_SECONDS ?= 5

# Every ps and worker of a cluster in a network namespace of its own, on
# one bridge, links shaped with HTB (tests/net/run.sh, docs/NETWORK.md):
# about 1.5 minutes on 2 cores. Without root or `ip netns` it says it
# skipped. NET_TESTS="heal cut" runs only those. The delay test holds
# packets with bench/netdelay (iptables NFQUEUE: make deps-test).
test-net: deps-test $(BIN) $(BUILD)/bench/netdelay
	$(Q)NETDELAY=$(abspath $(BUILD)/bench/netdelay) timeout --foreground -k 10 600 tests/net/run.sh $(abspath $(BIN)) $(NET_TESTS)

# A one-node Slurm from Debian's packages in a temporary directory runs
# examples/slurm/pstrain.sbatch (1 ps + 2 workers as one srun) and checks
# the accuracy line, then an elastic job whose workers srun steps add and
# scancel removes, with the test build (its step-delay hook keeps the run
# going meanwhile) (tests/slurm/run.sh). Without root it says it skipped.
test-slurm: deps $(BIN) $(TEST_PSTRAIN)
	$(Q)timeout --foreground -k 10 300 tests/slurm/run.sh $(abspath $(BIN)) $(abspath $(TEST_PSTRAIN))

test-cpu:
	$(Q)$(MAKE) --no-print-directory CUDA=0 BUILD=build/cpu BIN=build/cpu/pstrain unit

# CUDA=0 because the sanitizers' allocator and cudart's do not mix.
asan:
	$(Q)$(MAKE) --no-print-directory CUDA=0 SAN=1 BUILD=build/asan BIN=build/asan/pstrain \
		unit TESTFLAGS="$(TESTFLAGS)"

# The default cluster.ini (2 ps + 2 workers on 127.0.0.1) as four local
# processes, showing the chief's progress. Makes cluster.key the first time
# (keygen never overwrites one). Ctrl-C stops all four. Checkpoints go to a
# new temporary folder, not to cluster.ini's default cluster.ckpt/, so each
# demo trains from step 0 and a later `pstrain local` or cluster run of
# cluster.ini does not resume the demo's.
demo: all
	$(Q)[ -e cluster.key ] || ./$(BIN) keygen cluster.key
	$(Q)d=$$(mktemp -d "$${TMPDIR:-/tmp}/pstrain-demo.XXXXXX") && echo "demo: checkpoints in $$d" && \
		examples/local-cluster.sh cluster.ini ./$(BIN) -- --set train.checkpoint_dir=$$d --set train.log_dir=$$d/logs

BENCH_BIN := $(BUILD)/bench/cpu_mlp
$(BENCH_BIN): $(BUILD)/bench/cpu_mlp.o $(OBJ_CORE)
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(LINK) $(LDFLAGS) $^ -o $@ $(CUDA_LIBS) $(LDLIBS)

# The MLP step's GEMMs, OpenBLAS (pstrain's kernels) against BLIS from
# Debian loaded with dlopen: bench/blas_gemm (make deps-bench installs it).
$(BUILD)/bench/blas_gemm: $(BUILD)/bench/blas_gemm.o $(OBJ_CORE)
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(LINK) $(LDFLAGS) $^ -o $@ $(CUDA_LIBS) $(LDLIBS)

# Push/pull GB/s over loopback, sealed frames against plain: bench/pushpull.
$(BUILD)/bench/pushpull: $(BUILD)/bench/pushpull.o $(OBJ_CORE)
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(LINK) $(LDFLAGS) $^ -o $@ $(CUDA_LIBS) $(LDLIBS)

# float32 <-> bf16 conversion GB/s against memcpy, one thread: bench/bf16.
$(BUILD)/bench/bf16: $(BUILD)/bench/bf16.o $(BUILD)/net/bf16.o
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) $^ -o $@

# float32 packed without loss: size and GB/s against memcpy: bench/fpack.
$(BUILD)/bench/fpack: $(BUILD)/bench/fpack.o $(BUILD)/net/fpack.o $(BUILD)/net/xdelta.o
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) $^ -o $@

# A ps's row work alone (sparse optimizer, gather) over tables larger than
# the caches: bench/rows_step, and rows_step_plain, the same sources built
# without the rows' prefetch (EMBED_AHEAD=0) and rows_step_4k without huge
# pages (BIGMEM_HUGE=0, base/bigmem.h) for a before and after.
ROWS_STEP_SRC := core/nn/sparse_optim.c core/nn/embed.c core/nn/rng.c base/bigmem.c
$(BUILD)/bench/rows_step: bench/rows_step.c $(ROWS_STEP_SRC)
	@mkdir -p $(dir $@)
	$(call say,CC,$@)$(CC) $(CFLAGS) $(CPPFLAGS) $^ -o $@ -lm
$(BUILD)/bench/rows_step_plain: bench/rows_step.c $(ROWS_STEP_SRC)
	@mkdir -p $(dir $@)
	$(call say,CC,$@)$(CC) $(CFLAGS) $(CPPFLAGS) -DEMBED_AHEAD=0 $^ -o $@ -lm
$(BUILD)/bench/rows_step_4k: bench/rows_step.c $(ROWS_STEP_SRC)
	@mkdir -p $(dir $@)
	$(call say,CC,$@)$(CC) $(CFLAGS) $(CPPFLAGS) -DBIGMEM_HUGE=0 $^ -o $@ -lm

# Training steps on the GPU against PyTorch's: bench/gpu_mlp.
$(BUILD)/bench/gpu_mlp: $(BUILD)/bench/gpu_mlp.o $(OBJ_CORE)
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(LINK) $(LDFLAGS) $^ -o $@ $(CUDA_LIBS) $(LDLIBS)

# Workers training while peers without the key hammer the ps: bench/siege.
# It drives the pstrain binary as processes and attacks it over TCP, so it
# links none of our objects (an attacker has none of them either).
$(BUILD)/bench/siege: $(BUILD)/bench/siege.o
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) $^ -o $@ -lpthread

# A fixed delay on a lab host's outgoing packets, for bench/netlab's
# delayed rates (--rates 1gbit+250us; tests/net/lab.sh, lab_delay): NFQUEUE, as this kernel has no netem.
# Linked against Debian's libnetfilter-queue (make deps-bench), not static:
# a lab tool, never shipped.
$(BUILD)/bench/netdelay: $(BUILD)/bench/netdelay.o
	@mkdir -p $(dir $@)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) $^ -o $@ -lnetfilter_queue -lnfnetlink

# `make install PREFIX=/usr/local` (DESTDIR for staging): the binary and
# pstrain(1). Nothing else is needed at run time: the binary is static but
# for glibc.
PREFIX ?= /usr/local
install: $(BIN)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/pstrain
	install -m 0644 docs/pstrain.1 $(DESTDIR)$(PREFIX)/share/man/man1/pstrain.1

# Prints tables: pstrain's CPU step throughput against PyTorch's on this machine.
bench: all $(BENCH_BIN)
	./bench/cpu_mlp

# pstrain against PyTorch DDP over shaped links in network namespaces (as
# root): bench/netlab. NETLAB_ARGS passes options, e.g. NETLAB_ARGS=--quick.
netlab: deps-bench all $(BUILD)/bench/netdelay
	./bench/netlab --pstrain ./$(BIN) --netdelay $(BUILD)/bench/netdelay $(NETLAB_ARGS)

# The click-through model (issue 39) on the same lab against TF's
# ParameterServerStrategy and DDP: bench/netlab_ctr (about 30 min).
netlab-ctr: deps-bench all
	./bench/netlab_ctr --pstrain ./$(BIN) $(NETLAB_ARGS)

# Installs only what is missing. Needs root (or sudo) the first time.
# The test tools (clang and its libFuzzer runtime, for `make fuzz`) only
# for `make test`, not for the demo.
DEB_PACKAGES := gcc make libc6-dev libinih-dev libsodium-dev libcriterion-dev \
	libopenblas-dev zlib1g-dev dataset-fashion-mnist
TEST_DEB_PACKAGES := clang libclang-rt-14-dev python3 python3-venv slurmctld slurmd slurm-client munge \
	iptables libnetfilter-queue-dev
define install_missing
	@missing=""; for p in $(1); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "deps: installing$$missing"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; \
		else echo "deps: need root to install$$missing (run make deps as root)" >&2; exit 1; fi; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null \
		|| { echo "deps: apt-get install$$missing failed" >&2; exit 1; }; \
	fi
endef
deps:
	$(call install_missing,$(DEB_PACKAGES))
# Test-only Python packages from PyPI, in a venv of Debian's python3
# (build/pyvenv, kept between runs): TensorBoard's own event reader for
# tests/test_tblog.c, kubernetes-validate (the API's JSON schemas,
# bundled: no network needed) for tests/k8s_validate.py, and aeg (a binding
# of libaegis, an AEGIS-256 written apart from ours) for tests/aegis_ref.py.
# aeg is pinned: it is the reference that net/aegis.c is compared with.
PY_VENV := build/pyvenv
AEG_VERSION := 0.9.0
PY_TEST_PACKAGES := tensorboard kubernetes-validate aeg==$(AEG_VERSION)
deps-test:
	$(call install_missing,$(DEB_PACKAGES) $(TEST_DEB_PACKAGES))
	$(Q)$(PY_VENV)/bin/python -c 'import tensorboard, kubernetes_validate, aeg' 2>/dev/null || { \
		echo "deps: installing $(PY_TEST_PACKAGES) (PyPI) in $(PY_VENV)"; \
		/usr/bin/python3 -m venv $(PY_VENV) && $(PY_VENV)/bin/pip install -q $(PY_TEST_PACKAGES); } || \
		{ echo "deps: could not install $(PY_TEST_PACKAGES) in $(PY_VENV)" >&2; exit 1; }
# The benchmarks' peers and tools: PyTorch (Debian's build, with gloo) for
# bench/torch_mlp.py and bench/netlab's ddp-debian row, iperf3 for netlab's link check,
# and TensorFlow for netlab's tfps row (bench/tf_ps_mlp.py): Debian has no
# TensorFlow, so tensorflow-cpu from PyPI in a venv of Debian's python3
# (build/tfvenv, kept between runs; 2.19.1 supports Python 3.11, Debian 12's).
TF_VENV := build/tfvenv
TF_PACKAGE := tensorflow-cpu==2.19.1
BENCH_DEB_PACKAGES := python3-torch python3-venv iperf3 iptables libnetfilter-queue-dev libblis4-pthread
# A current PyTorch from PyPI (build/torchvenv, kept between runs) for
# bench/cpu_mlp's peer row and bench/netlab's and netlab_ctr's DDP rows: its MKL and oneDNN defaults are the peer's best
# on the CPU; Debian's 1.13 runs its GEMMs in OpenBLAS. PyPI's wheel brings
# CUDA's libraries too (about 5 GB), which its import needs.
TORCH_VENV := build/torchvenv
deps-bench:
	$(call install_missing,$(DEB_PACKAGES) $(BENCH_DEB_PACKAGES))
	$(Q)$(TORCH_VENV)/bin/python -c 'import torch' 2>/dev/null || { \
		echo "deps: installing torch (PyPI) in $(TORCH_VENV)"; \
		/usr/bin/python3 -m venv $(TORCH_VENV) && $(TORCH_VENV)/bin/pip install -q torch numpy; } || \
		{ echo "deps: could not install torch in $(TORCH_VENV)" >&2; exit 1; }
	$(Q)TF_CPP_MIN_LOG_LEVEL=3 $(TF_VENV)/bin/python -c 'import tensorflow' 2>/dev/null || { \
		echo "deps: installing $(TF_PACKAGE) (PyPI) in $(TF_VENV)"; \
		/usr/bin/python3 -m venv $(TF_VENV) && $(TF_VENV)/bin/pip install -q $(TF_PACKAGE); } || \
		{ echo "deps: could not install $(TF_PACKAGE) in $(TF_VENV)" >&2; exit 1; }

# ---- fuzzing: `make fuzz` ------------------------------------------------
# A libFuzzer harness per parser (tests/fuzz/fuzz_*.c), built with clang
# straight from the core sources it needs, each run for FUZZ_SECONDS. New
# inputs go to $(BUILD)/fuzz/corpus/NAME; the seeds in tests/fuzz/corpus/NAME
# are only read. A finding is left as $(BUILD)/fuzz/NAME-crash-* (or leak-,
# timeout-, oom-) and reproduces with `$(BUILD)/fuzz/fuzz_NAME FILE`.
# -fno-sanitize-recover: UBSan only reports by default; libFuzzer needs the
# abort to keep the input.
FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang
FUZZ_CFLAGS := -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	-std=c11 -D_GNU_SOURCE
FUZZ_NAMES := config layer idx csv criteo handshake msg safetensors ps launch aegis worker
FUZZ_BINS := $(FUZZ_NAMES:%=$(BUILD)/fuzz/fuzz_%)
$(BUILD)/fuzz/fuzz_config: core/config/config.c core/config/config_value.c core/config/config_keys.c core/config/config_print.c core/nn/model.c core/nn/embed_spec.c core/nn/rng.c
$(BUILD)/fuzz/fuzz_layer: core/nn/model.c core/nn/embed_spec.c core/nn/rng.c
$(BUILD)/fuzz/fuzz_idx: core/data/idx.c core/data/dataset.c
$(BUILD)/fuzz/fuzz_csv: core/data/csv.c core/data/dataset.c
FUZZ_LIBS_config := -linih -lsodium
FUZZ_LIBS_idx := -lz
FUZZ_LIBS_csv := -lz
$(BUILD)/fuzz/fuzz_criteo: core/data/criteo.c core/data/lines.c core/data/stream.c core/data/data.c core/data/csv.c \
	core/data/idx.c core/data/dataset.c core/nn/rng.c base/err.c
FUZZ_LIBS_criteo := -lz
$(BUILD)/fuzz/fuzz_handshake: net/handshake.c net/frame.c net/aegis.c base/err.c
FUZZ_LIBS_handshake := -lsodium
$(BUILD)/fuzz/fuzz_msg: net/msg.c net/msg_factors.c net/msg_rows.c net/msg_elastic.c net/bf16.c net/fpack.c net/idpack.c net/xdelta.c base/err.c
# net/bf16.c's and net/fpack.c's target_clones (ifuncs) do not link under clang's fuzzer
# build, as for fuzz_ps: the default clone only.
FUZZ_LIBS_msg := '-Dtarget_clones(...)=__unused__'
$(BUILD)/fuzz/fuzz_safetensors: core/ckpt/safetensors.c core/json.c base/err.c
$(BUILD)/fuzz/fuzz_launch: cluster/launch.c core/json.c base/err.c
# AEGIS-256 against libaegis: its C source from the source release of aeg,
# the PyPI binding that tests/aegis_ref.py uses (pinned to the same
# version), fetched with the venv's pip into build/ (never into the tree),
# compiled without the fuzzer's coverage and with the two names that ours
# share renamed.
AEG_DIR := build/aeg-$(AEG_VERSION)
AEG_SRC := $(AEG_DIR)/libaegis/src
$(AEG_DIR)/.unpacked:
	$(Q)test -x $(PY_VENV)/bin/pip || $(MAKE) --no-print-directory deps-test
	$(call say,PIP,aeg-$(AEG_VERSION).tar.gz)$(PY_VENV)/bin/pip download -q --no-deps --no-binary :all: \
		aeg==$(AEG_VERSION) -d build
	$(Q)tar xzf build/aeg-$(AEG_VERSION).tar.gz -C build && touch $@
$(BUILD)/fuzz/libaegis.a: $(AEG_DIR)/.unpacked
	@mkdir -p $(BUILD)/fuzz/libaegis
	$(call say,CLANG,$@)for f in $$(find $(AEG_SRC) -name '*.c'); do \
		$(FUZZ_CC) -c -g -O1 -fsanitize=address,undefined -I$(AEG_SRC)/include \
			-Daegis256_encrypt=aegisref256_encrypt -Daegis256_decrypt=aegisref256_decrypt \
			$$f -o $(BUILD)/fuzz/libaegis/$$(basename $$f .c).o || exit 1; \
	done && rm -f $@ && ar rcs $@ $(BUILD)/fuzz/libaegis/*.o
$(BUILD)/fuzz/fuzz_aegis: net/aegis.c $(BUILD)/fuzz/libaegis.a
FUZZ_LIBS_aegis := $(BUILD)/fuzz/libaegis.a -lsodium
# The ps's whole message handling (stateful): every role and core source.
$(BUILD)/fuzz/fuzz_ps: $(ROLE_SRC) cluster/ps_harness.c $(CORE_SRC) $(NET_SRC) $(BASE_SRC) gpu/arch.c gpu/arena.c gpu/stub.c
FUZZ_LIBS_ps := '-Dtarget_clones(...)=__unused__' $(ARCH_FLAGS) -DPSTRAIN_VERSION='"$(VERSION)"' -linih -lsodium -lopenblas -lz -lpthread
# A worker's links against a ps that says anything (the same sources, no harness).
$(BUILD)/fuzz/fuzz_worker: $(ROLE_SRC) $(CORE_SRC) $(NET_SRC) $(BASE_SRC) gpu/arch.c gpu/arena.c gpu/stub.c
FUZZ_LIBS_worker := $(FUZZ_LIBS_ps)

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h $(wildcard core/*.h core/*/*.h net/*.h base/*.h cluster/*.h)
	@mkdir -p $(dir $@)
	$(call say,CLANG,$@)$(FUZZ_CC) $(FUZZ_CFLAGS) $(filter %.c,$^) -o $@ $(FUZZ_LIBS_$*) -lm

fuzz: $(FUZZ_BINS)
	$(Q)for n in $(FUZZ_NAMES); do \
		mkdir -p $(BUILD)/fuzz/corpus/$$n; \
		$(BUILD)/fuzz/fuzz_$$n $(BUILD)/fuzz/corpus/$$n tests/fuzz/corpus/$$n \
			-max_total_time=$(FUZZ_SECONDS) -detect_leaks=1 -timeout=10 $(FUZZ_SEED:%=-seed=%) \
			-artifact_prefix=$(BUILD)/fuzz/$$n- -print_final_stats=1 \
			> $(BUILD)/fuzz/$$n.log 2>&1 \
		|| { tail -n 40 $(BUILD)/fuzz/$$n.log; echo "fuzz: $$n failed, see $(BUILD)/fuzz/$$n.log"; exit 1; }; \
		printf 'fuzz: %-6s %s, %s exec/s, corpus %s\n' $$n \
			"$$(grep -o 'Done [0-9]* runs in [0-9]* second(s)' $(BUILD)/fuzz/$$n.log)" \
			"$$(sed -n 's/^stat::average_exec_per_sec: *//p' $(BUILD)/fuzz/$$n.log)" \
			"$$(ls $(BUILD)/fuzz/corpus/$$n | wc -l)"; \
	done

clean:
	rm -rf build $(BIN)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
