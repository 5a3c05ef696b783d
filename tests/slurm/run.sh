#!/bin/bash
# A one-node Slurm from Debian's packages (munge, slurmctld, slurmd), all of
# it in a temporary directory, runs examples/slurm/pstrain.sbatch with 1 ps
# + 2 workers as three tasks of one srun, and checks the chief's accuracy
# line; then such a step again with `pstrain status` asked from the batch
# script; then an elastic job (docs/ELASTIC.md, "Schedulers"): the ps, the
# chief and worker 1 as srun steps of their own, worker 2 added by another
# srun step while the job trains, worker 1 removed by `scancel
# --signal=TERM` on its step, and the run ending bit for bit on `local`'s.
# Needs root (slurmd runs jobs as their users). Bounded in time; every
# daemon is stopped and the directory removed, also on failure.
#
#   tests/slurm/run.sh [PSTRAIN [PSTRAIN_TEST]]        (make test-slurm)
#
# PSTRAIN_TEST is a test build (build/pstrain-test): the elastic job slows
# its workers' steps with its PSTRAIN_STEP_DELAY_MS hook, so that the run
# lasts while a worker is added and one removed; without it that case says
# it was skipped.
set -u
bin=$(realpath "${1:-${PSTRAIN_BIN:-./pstrain}}")
tbin=${2:-}
[ -n "$tbin" ] && tbin=$(realpath "$tbin")
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" != 0 ] || ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
	echo "test-slurm: skipped (needs root and slurmctld, slurmd, munge: make deps-test installs them)"
	exit 0
fi
T=$(mktemp -d /tmp/pstrain-slurm.XXXXXX)
chmod 755 "$T"
pids=""
cleanup() {
	for p in $pids; do kill "$p" 2>/dev/null; done
	sleep 0.5
	for p in $pids; do kill -9 "$p" 2>/dev/null; done
	wait 2>/dev/null   # the daemons run in the foreground as our children: reaped here
	[ -n "${KEEP:-}" ] && echo "test-slurm: kept $T" || rm -rf "$T"
}
trap cleanup EXIT INT TERM
fail() {
	echo "test-slurm: FAIL: $*"
	for f in "$T"/log/*; do echo "== $f"; tail -n 15 "$f"; done
	exit 1
}
# The node is "localhost" (slurmd -N): it resolves on any machine, as the
# task addresses Slurm hands pstrain must.
host=localhost
mkdir -p "$T/log" "$T/state" "$T/spool" "$T/munge" "$T/run"
chmod 700 "$T/munge"
# munge: its own key and socket, not the host's
dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$T/munge/munge.key"
munged --foreground --key-file="$T/munge/munge.key" --socket="$T/munge/munge.sock" \
	--pid-file="$T/munge/munged.pid" --log-file="$T/log/munged.log" --seed-file="$T/munge/seed" --force \
	2>"$T/log/munged.err" &
pids="$pids $!"
for i in $(seq 1 50); do [ -S "$T/munge/munge.sock" ] && break; sleep 0.1; done
[ -S "$T/munge/munge.sock" ] || fail "munged did not start"
cpus=$(nproc)
cat >"$T/slurm.conf" <<CONF
ClusterName=pstraintest
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket=$T/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/run/slurmctld.pid
SlurmdPidFile=$T/run/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
MpiDefault=none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=10 State=UP
CONF
export SLURM_CONF=$T/slurm.conf
slurmctld -D -f "$SLURM_CONF" >"$T/log/slurmctld.out" 2>&1 &
pids="$pids $!"
slurmd -D -N "$host" -f "$SLURM_CONF" >"$T/log/slurmd.out" 2>&1 &
pids="$pids $!"
for i in $(seq 1 50); do
	sinfo -h -o %T 2>/dev/null | grep -qE '^idle' && break
	sleep 0.2
done
sinfo -h -o %T | grep -qE '^idle' || fail "the node did not come up: $(sinfo 2>&1)"

# The job: the example sbatch script on the test blobs' config.
mkdir -p "$T/job"
cp "$root/examples/slurm/pstrain.sbatch" "$T/job/"
cp "$bin" "$T/job/pstrain"
python3 - "$T/job/blobs.csv" <<'PY'
import random, sys
random.seed(3)
centers = [[random.gauss(0, 3) for _ in range(6)] for _ in range(3)]
with open(sys.argv[1], "w") as f:
    for i in range(600):
        k = i % 3
        f.write(",".join([str(k)] + ["%.5f" % (c + random.gauss(0, 0.5)) for c in centers[k]]) + "\n")
PY
"$T/job/pstrain" keygen "$T/job/cluster.key" >/dev/null || fail "keygen"
cat >"$T/job/cluster.ini" <<INI
[cluster]
; one ps; ports from ps 0's, one per task (srun: 1 ps + 2 workers)
ps = localhost:24600
workers = localhost:24601
key_file = cluster.key
connect_timeout = 30
[data]
format = csv
train_csv = blobs.csv
label_column = first
[train]
steps = 200
batch_size = 16
learning_rate = 0.05
optimizer = momentum
threads = 1
checkpoint_dir =
log_dir =
[model]
input = 6
layer = dense 16
layer = relu
layer = dense 3
INI
cd "$T/job" || fail "no job dir"
# --overcommit: 3 tasks on a node of 2 CPUs (one would do for each).
# run_job SCRIPT OUT: sbatch it as 3 tasks, wait up to 90 s for it to end.
run_job() {
	local job state reason
	job=$(sbatch --parsable --ntasks=3 --overcommit --time=5 --output="$2" --chdir="$T/job" \
		--export=ALL,PSTRAIN=./pstrain,PSTRAIN_CONFIG=cluster.ini "$1" 2>"$T/log/sbatch.err") ||
		fail "sbatch refused the job: $(cat "$T/log/sbatch.err")"
	for i in $(seq 1 300); do
		state=$(squeue -h -j "$job" -o %T 2>/dev/null)
		[ -z "$state" ] && break
		sleep 0.3
	done
	[ -z "$state" ] || { reason=$(squeue -h -j "$job" -o %R); scancel "$job"; fail "job $job still $state ($reason) after 90 s"; }
}
run_job pstrain.sbatch "$T/log/job.out"
out=$(cat "$T/log/job.out")
echo "$out" | grep -q "pstrain: ps 0, from Slurm (task 0 of 3; the first 1 are ps)" || fail "no role line for ps 0"
echo "$out" | grep -q "pstrain: worker 1, from Slurm (task 2 of 3" || fail "no role line for worker 1"
acc=$(echo "$out" | sed -n 's/^done: .* accuracy \([0-9.]*\)%.*/\1/p' | head -n 1)
[ -n "$acc" ] || fail "no final line from the chief"
awk -v a="$acc" 'BEGIN { exit !(a >= 90) }' || fail "accuracy $acc% (expected >= 90%)"

# `pstrain status` from the batch script while the step trains (issue 40
# part 2): the script's variables are the job's, which the step's match,
# so status asks the ps Slurm placed and says so.
cat >"$T/job/status.sbatch" <<'SB'
#!/bin/bash
long="--config cluster.ini --set train.steps=1000000"   # the same for status: the config's hash
srun --kill-on-bad-exit=1 ./pstrain run $long >run.out 2>&1 &
rc=1
for i in $(seq 1 100); do
	./pstrain status $long >status.out 2>&1 && { rc=0; break; }
	sleep 0.3
done
echo "status exit $rc"
kill -TERM %1
wait
SB
run_job status.sbatch "$T/log/status-job.out"
st=$(cat "$T/job/status.out" 2>/dev/null)
grep -q "status exit 0" "$T/log/status-job.out" || fail "status never answered: $st"
echo "$st" | grep -q "^pstrain: ps and workers from Slurm (task 0 of 3; the first 1 are ps)$" ||
	fail "status did not take Slurm's lists: $st"
echo "$st" | grep -q "^0   localhost:24600 " || fail "no row for ps 0: $st"
ok="1 ps + 2 workers as one srun of 3 tasks under Slurm $(sinfo -V | awk '{print $2}'), test accuracy $acc%; status from the batch script took Slurm's lists"
if [ -z "$tbin" ]; then
	echo "test-slurm: ok: $ok; the elastic job skipped (no test build given: make test-slurm passes build/pstrain-test)"
	exit 0
fi

# Elastic workers under Slurm (issue 40): each process an srun step of its
# own, started with --index (docs/ELASTIC.md): the [cluster] lists come
# from the config, which lists every worker that may run; min_workers = 1
# and 4 slices a step whatever the workers. The ps, the chief and worker
# 1 train; once ps 0 gives both slices and the chief is past step 40, a
# second srun step adds worker 2; once the three train and the chief is
# past step 120, `scancel --signal=TERM` on worker 1's step removes it
# (what a preemption or a step's end sends). Each wait is bounded; the
# script prints every step's exit status.
cp "$tbin" "$T/job/pstrain-test"
cat >"$T/job/elastic.ini" <<INI
[cluster]
ps = localhost:24610
; where each worker runs is only a note: a ps never dials a worker
workers = localhost:24611, localhost:24612, localhost:24613
min_workers = 1
key_file = cluster.key
overlap = false
socket_dir = sockets
connect_timeout = 30
[data]
format = csv
train_csv = blobs.csv
label_column = first
[train]
steps = 300
slices = 4
batch_size = 16
optimizer = adam
learning_rate = 0.01
lr_schedule = constant
seed = 3
threads = 1
eval_every = 10
checkpoint_dir = ck
checkpoint_every = 0
log_dir =
[model]
input = 6
layer = dense 16
layer = relu
layer = dropout 0.2
layer = dense 3
INI
cat >"$T/job/elastic.sbatch" <<'SB'
#!/bin/bash
# Each process an srun step; --overlap: steps share the allocation's CPUs.
export PSTRAIN_STEP_DELAY_MS=20
step() {   # step NAME ROLE INDEX: that process as a step named NAME, output in NAME.out
	srun --overlap -n 1 -J "$1" ./pstrain-test "$2" --index "$3" --config elastic.ini >"$1.out" 2>&1 &
}
# await FILE TEXT: up to 60 s for TEXT in FILE
await() {
	for i in $(seq 1 600); do grep -qF "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
	echo "elastic: no \"$2\" in $1 after 60 s"
	return 1
}
# await_step N: up to 60 s for the chief's log to show a step >= N
await_step() {
	for i in $(seq 1 600); do
		sed -n 's/.*step \([0-9]*\)\/.*/\1/p' w0.out 2>/dev/null | awk -v n="$1" '$1 >= n { f = 1 } END { exit !f }' && return 0
		sleep 0.1
	done
	echo "elastic: the chief shows no step >= $1 after 60 s"
	return 1
}
ok=1
step ps0 ps 0; ps0=$!
step w1 worker 1; w1=$!
step w0 worker 0; w0=$!
await ps0.out "workers 0, 1 train the 4 slices" && await_step 40 || ok=0
step w2 worker 2; w2=$!
[ $ok = 1 ] && await ps0.out "workers 0, 1, 2 train the 4 slices" && await_step 120 || ok=0
id=$(squeue -h -s -j "$SLURM_JOB_ID" -o '%i %j' | awk '$2 == "w1" { print $1 }')
echo "elastic: worker 1 is step $id"
[ -n "$id" ] && scancel --signal=TERM "$id" || { echo "elastic: no step w1 to signal"; ok=0; }
[ $ok = 1 ] || scancel --signal=KILL "$SLURM_JOB_ID"
for p in ps0 w0 w1 w2; do wait "${!p}"; echo "elastic: $p exit $?"; done
SB
run_job elastic.sbatch "$T/log/elastic-job.out"
eo=$(cat "$T/log/elastic-job.out")
for p in ps0 w0 w1 w2; do
	echo "$eo" | grep -qx "elastic: $p exit 0" || fail "elastic: $p did not exit 0: $eo; $p: $(tail -n 5 "$T/job/$p.out" 2>&1)"
done
grep -q "workers 0, 1, 2 train the 4 slices" "$T/job/ps0.out" || fail "elastic: worker 2 never trained: $(cat "$T/job/ps0.out")"
grep -q "worker 1 leaves after step" "$T/job/ps0.out" || fail "elastic: ps 0 saw no leave: $(cat "$T/job/ps0.out")"
grep -q "worker 1 left at step .* (SIGTERM): its slices go to the others" "$T/job/w1.out" ||
	fail "elastic: worker 1 did not leave on SIGTERM: $(cat "$T/job/w1.out")"
grep -q "^done: 300 steps" "$T/job/w0.out" || fail "elastic: the chief did not finish: $(cat "$T/job/w0.out")"
# The same run in `local`, 4 slices a step: the same parameters and Adam
# moments, bit for bit (tensor lines of `pstrain check`).
"$T/job/pstrain-test" local --config elastic.ini --set train.checkpoint_dir=ref >"$T/log/local.out" 2>&1 ||
	fail "elastic: local reference: $(cat "$T/log/local.out")"
lines() { "$T/job/pstrain-test" check --checkpoint "$1/step-00000300" | sed -n '/^tensor /p'; }
got=$(lines ck) || fail "elastic: check of the cluster's checkpoint: $got"
ref=$(lines ref) || fail "elastic: check of local's checkpoint: $ref"
[ -n "$ref" ] && [ "$got" = "$ref" ] || fail "elastic: the job ends elsewhere than local:
$got
local:
$ref"
echo "test-slurm: ok: $ok; an elastic job whose worker 2 an srun step added and worker 1 scancel --signal=TERM removed ended bit for bit on local's parameters"
