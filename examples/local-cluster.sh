#!/bin/sh
# Starts every ps and worker of a cluster.ini whose hosts are all on this
# machine, in the background; shows the chief's (worker 0's) output, the
# others' logs go to a temporary directory. Waits for all of them and exits
# with the first failure's status. Ctrl-C stops every process.
#
#   examples/local-cluster.sh [CONFIG [PSTRAIN]] [-- --set S.K=V ...]
#
# CONFIG defaults to ./cluster.ini, PSTRAIN to ./pstrain. The cluster key
# (key_file, relative to CONFIG's directory) must exist: `pstrain keygen`
# makes one (`make demo` does that for ./cluster.ini). The ps tasks share
# CONFIG's checkpoint_dir, by default NAME.ckpt beside it (cluster.ckpt for
# cluster.ini); `-- --set train.checkpoint_dir=DIR` puts it elsewhere, as
# `make demo` does.
set -u

config=cluster.ini
bin=./pstrain
if [ $# -gt 0 ] && [ "$1" != "--" ]; then config=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" != "--" ]; then bin=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" = "--" ]; then shift; fi

[ -f "$config" ] || { echo "local-cluster: no config $config" >&2; exit 2; }
[ -x "$bin" ] || { echo "local-cluster: no pstrain binary at $bin (run make)" >&2; exit 2; }

# Read ps and workers from the resolved config (pstrain check prints it).
resolved=$("$bin" check --config "$config" "$@" 2>&1) || { echo "$resolved" >&2; exit 2; }
hosts() {
	printf '%s\n' "$resolved" | sed -n "s/^$1 *= *//p" | head -n 1 | tr ',' '\n' | sed 's/^ *//; s/ *$//' | grep -v '^$'
}
nps=$(hosts ps | wc -l)
nworkers=$(hosts workers | wc -l)
for h in $(hosts ps) $(hosts workers); do
	case "$h" in
	127.*|localhost:*|'[::1]':*|::1:*) ;;
	*) echo "local-cluster: $h is not on this machine; start each task on its own host" >&2; exit 2 ;;
	esac
done
[ "$nps" -ge 1 ] && [ "$nworkers" -ge 1 ] || { echo "local-cluster: no [cluster] ps or workers in $config" >&2; exit 2; }

logs=$(mktemp -d "${TMPDIR:-/tmp}/pstrain-cluster.XXXXXX")
pids=""
stop() {
	trap - INT TERM
	echo "local-cluster: stopping all tasks" >&2
	# Ctrl-C on a terminal has already signalled every task (one process
	# group); a second SIGINT would kill them at once, so give them a
	# moment and then stop only those still running (kill -INT on the
	# script alone, say).
	sleep 1
	for p in $pids; do kill -0 "$p" 2>/dev/null && kill -INT "$p" 2>/dev/null; done
	wait
	exit 130
}
trap stop INT TERM

i=0
while [ "$i" -lt "$nps" ]; do
	"$bin" ps --index "$i" --config "$config" "$@" >"$logs/ps$i.log" 2>&1 &
	pids="$pids $!"
	i=$((i + 1))
done
i=1
while [ "$i" -lt "$nworkers" ]; do
	"$bin" worker --index "$i" --config "$config" "$@" >"$logs/worker$i.log" 2>&1 &
	pids="$pids $!"
	i=$((i + 1))
done
echo "local-cluster: $nps ps + $nworkers workers from $config; logs in $logs" >&2
"$bin" worker --index 0 --config "$config" "$@" &
chief=$!
pids="$pids $chief"

status=0
for p in $pids; do
	wait "$p"
	s=$?
	[ "$s" -ne 0 ] && [ "$status" -eq 0 ] && status=$s
done
if [ "$status" -eq 130 ]; then
	echo "local-cluster: interrupted; logs in $logs" >&2
elif [ "$status" -ne 0 ]; then
	echo "local-cluster: a task failed (exit $status); logs:" >&2
	for f in "$logs"/*.log; do echo "== $f" >&2; tail -n 5 "$f" >&2; done
else
	rm -rf "$logs"
fi
exit "$status"
