#!/bin/bash
# A one-node Slurm from Debian's packages (munge, slurmctld, slurmd), all of
# it in a temporary directory, runs examples/slurm/pstrain.sbatch with 1 ps
# + 2 workers as three tasks of one srun, and checks the chief's accuracy
# line; then such a step again with `pstrain status` asked from the batch
# script. Needs root (slurmd runs jobs as their users). Bounded in time;
# every daemon is stopped and the directory removed, also on failure.
#
#   tests/slurm/run.sh [PSTRAIN]        (make test-slurm)
set -u
bin=$(realpath "${1:-${PSTRAIN_BIN:-./pstrain}}")
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
echo "test-slurm: ok: 1 ps + 2 workers as one srun of 3 tasks under Slurm $(sinfo -V | awk '{print $2}'), test accuracy $acc%; status from the batch script took Slurm's lists"
