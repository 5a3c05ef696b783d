# bench/netlab_lib.sh: what bench/netlab (the MLP) and bench/netlab_ctr (the
# CTR model) share: link rates and their shaping, iperf3 checks, the
# processes of a run (their pids, CPU ticks, stopping them), the header's
# CPU line. Sourced (bash) after tests/net/lab.sh, by scripts that set
# OUT, PY, HERE, IPERF_SECONDS, DELAYED, NETDELAY and the hosts H_PS0,
# H_PS1, H_W0, H_W1, H_FAR, and define die.

# A rate's parts: rate_base 1gbit for 1gbit+250us/q262144; rate_delay
# its delay in microseconds (250; 0 for none); rate_queue its queue's
# bytes (262144; --queue's, or 0 for the default pfifo, without /q).
rate_base() { echo "${1%%[+/]*}"; }
rate_delay() {
	local r=${1%%/*}
	case "$r" in
	*+*us) echo "${r#*+}" | sed 's/us$//' ;;
	*+*) echo x ;;
	*) echo 0 ;;
	esac
}
rate_queue() {
	case "$1" in
	*/q*) echo "${1##*/q}" ;;
	*/*) echo x ;;
	*) echo "${LAB_QUEUE:-0}" ;;
	esac
}
# PID and every process below it.
tree_pids() {
	local c
	echo "$1"
	for c in $(pgrep -P "$1"); do tree_pids "$c"; done
}

# The process at the bottom of PID's chain: a run's processes are started
# as a subshell -> ip netns exec (env, timeout) -> pstrain or python.
leaf_pid() {
	local p=$1 c
	while c=$(pgrep -P "$p" | head -n 1) && [ -n "$c" ]; do p=$c; done
	echo "$p"
}

# utime+stime ticks of process PID, "-" when it is gone.
cpu_ticks() {
	local stat
	read -r stat 2>/dev/null <"/proc/$1/stat" || { echo -; return; }
	stat=${stat##*) }
	set -- $stat
	echo $((${12} + ${13}))
}

now() { echo "${EPOCHREALTIME/,/.}"; }

# Stops what is left of a run: TERM to the trainers at the bottom of each
# chain, then, after 5 s, KILL to every process still in it.
reap() {
	local p t=0
	for p in "$@"; do kill -0 "$p" 2>/dev/null && kill -TERM "$(leaf_pid "$p")" 2>/dev/null; done
	while [ $t -lt 50 ]; do
		local alive=0
		for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
		[ $alive = 0 ] && break
		sleep 0.1
		t=$((t + 1))
	done
	for p in "$@"; do
		kill -0 "$p" 2>/dev/null || continue
		kill -KILL $(tree_pids "$p") 2>/dev/null
	done
	wait "$@" 2>/dev/null
}

batch_of() { sed -n 's/.*batch \([0-9]*\) x [0-9]* workers.*/\1/p' "$1" | head -n 1; }

# tf_watch LOG PID...: stops the coordinator (the first PID) when one of
# the servers (the other PIDs) is gone before it, with a line in LOG:
# TF's coordinator waits for a lost worker to come back, which here would
# be until the run's limit.
tf_watch() {
	local log=$1 c=$2 p
	shift 2
	while kill -0 "$c" 2>/dev/null; do
		for p in "$@"; do
			kill -0 "$p" 2>/dev/null && continue
			echo "netlab: a TF server (pid $p) exited before the coordinator; stopping it" >>"$log"
			reap "$c"
			return
		done
		sleep 1
	done
}

# iperf3 from host K to the far host's server, one direction or both at
# once (--bidir); "SENT RECEIVED" Mbit/s as the receiving ends saw them.
iperf_pair() {
	local k=$1 bidir=$2 j i=0
	while [ $i -lt 3 ]; do
		j=$(lab_run "$k" timeout $((IPERF_SECONDS + 15)) iperf3 -c "$(lab_ip $H_FAR)" -p "$IPERF_PORT" \
			-t "$IPERF_SECONDS" -J $bidir 2>>"$OUT/logs/iperf3.err") && break
		echo "host $k $bidir: iperf3 failed: $(printf '%s' "$j" | grep '"error"')" >>"$OUT/logs/iperf3.err"
		j=""
		sleep 0.5
		i=$((i + 1))
	done
	printf '%s' "$j" | "$PY" -c '
import json, sys
try:
    e = json.load(sys.stdin)["end"]
    up = e["sum_received"]["bits_per_second"] / 1e6
    down = e.get("sum_received_bidir_reverse", {}).get("bits_per_second", 0) / 1e6
    print("%.0f %.0f" % (up, down))
except Exception:
    print("- -")' 2>/dev/null
}

IPERF_PORT=5201
measure_links() {
	local rate=$1 k one bi srv i=0
	# One server on the far host for all the checks (it serves them one
	# at a time); up once it listens.
	lab_run $H_FAR iperf3 -s -p "$IPERF_PORT" >>"$OUT/logs/iperf3.server" 2>&1 &
	srv=$!
	while [ $i -lt 50 ] && ! lab_run $H_FAR ss -ltn 2>/dev/null | grep -q ":$IPERF_PORT "; do
		sleep 0.1
		i=$((i + 1))
	done
	for k in $H_PS0 $H_PS1 $H_W0 $H_W1; do
		one=$(iperf_pair "$k" "")
		bi=$(iperf_pair "$k" --bidir)
		printf '%s\t%s\t%s\t%s\n' "$rate" "$k" "${one% *}" "$bi" | tr ' ' '\t' >>"$OUT/links.tsv"
		printf '  %-7s host %d (%s) -> host %d: one way %s Mbit/s; both ways at once %s and %s Mbit/s\n' \
			"$rate" "$k" "$(host_name "$k")" $H_FAR "${one% *}" "${bi% *}" "${bi#* }"
	done
	reap "$srv"
}

host_name() {
	case "$1" in 0) echo "ps 0" ;; 1) echo "ps 1" ;; 2) echo "worker 0 / rank 0" ;; 3) echo "worker 1 / rank 1" ;; *) echo "iperf3 peer, TF coordinator" ;; esac
}

set_rate() {
	local k d
	d=$(rate_delay "$1")
	for k in 0 1 2 3 4; do
		LAB_QUEUE=$(rate_queue "$1") lab_rate "$k" "$(rate_base "$1")" || die "cannot shape host $k's link to $1"
		if [ $DELAYED = 1 ]; then
			lab_delay "$k" "$d" "$NETDELAY" 2>>"$OUT/logs/netdelay.err" || die "cannot delay host $k's packets by $d us"
		fi
	done
	[ "$d" = 0 ] || sleep 0.3 # netdelay binds its queue
}

# The idle round trip between the workers' hosts as TCP sees it (1 byte
# each way, 200 times, no other traffic): what a delayed rate really adds.
measure_rtt() {
	local srv i=0
	lab_run $H_W1 "$PY" "$HERE/netlab_rtt.py" serve 5301 >>"$OUT/logs/rtt.err" 2>&1 &
	srv=$!
	while [ $i -lt 50 ] && ! lab_run $H_W1 ss -ltn 2>/dev/null | grep -q ":5301 "; do
		sleep 0.1
		i=$((i + 1))
	done
	printf '  %-7s round trip host %d -> host %d (TCP, idle): %s\n' "$1" $H_W0 $H_W1 \
		"$(lab_run $H_W0 "$PY" "$HERE/netlab_rtt.py" ping "$(lab_ip $H_W1)" 5301 2>>"$OUT/logs/rtt.err" || echo failed)"
	reap "$srv"
}


# The CPU's model and vector units (OpenBLAS's kernels follow them), in
# cpu and vec, for the header.
lab_cpu_vec() {
	cpu=$(sed -n 's/^model name[^:]*: *//p' /proc/cpuinfo | head -n 1)
	flags=" $(sed -n 's/^flags[^:]*: *//p' /proc/cpuinfo | head -n 1) "
	case "$flags" in
	*" avx512f "*) vec="AVX-512$(case "$flags" in *" avx512_bf16 "*) echo " (BF16)" ;; esac), AVX2, FMA" ;;
	*" avx2 "*" fma "* | *" fma "*" avx2 "*) vec="AVX2, FMA" ;;
	*) vec="no AVX2" ;;
	esac
}
