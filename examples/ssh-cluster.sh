#!/bin/sh
# Starts every ps and worker of a cluster.ini on its own host over ssh:
# `pstrain ps --index K` on the host of ps K, `pstrain worker --index N` on
# the host of worker N, each in the remote directory DIR (which must hold
# pstrain, the config, the key and the data at the config's paths: copy
# them there first). Shows the chief's (worker 0's) output; the others'
# go to a local temporary directory. Waits for all and exits with the
# first failure's status; Ctrl-C stops every remote task (ssh -tt gives
# each a terminal, so the interrupt reaches it).
#
#   examples/ssh-cluster.sh [CONFIG [DIR]] [-- --set S.K=V ...]
#
# CONFIG defaults to ./cluster.ini, DIR to the current directory's path
# (the same path on every host). SSH (default "ssh -tt -o BatchMode=yes")
# is the command that runs `SSH HOST COMMAND`; hosts are the names in
# [cluster] ps and workers, without their ports. For one host, use
# examples/local-cluster.sh.
set -u

config=cluster.ini
dir=$(pwd)
if [ $# -gt 0 ] && [ "$1" != "--" ]; then config=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" != "--" ]; then dir=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" = "--" ]; then shift; fi
ssh=${SSH:-ssh -tt -o BatchMode=yes}
bin=${PSTRAIN:-./pstrain}

[ -f "$config" ] || { echo "ssh-cluster: no config $config" >&2; exit 2; }
[ -x "$bin" ] || { echo "ssh-cluster: no pstrain at $bin to read the config with (PSTRAIN=...)" >&2; exit 2; }
resolved=$("$bin" check --config "$config" "$@" 2>&1) || { echo "$resolved" >&2; exit 2; }
hosts() {
	printf '%s\n' "$resolved" | sed -n "s/^$1 *= *//p" | head -n 1 | tr ',' '\n' | sed 's/^ *//; s/ *$//' | grep -v '^$'
}
# host:port or [v6]:port -> host
host_of() { printf '%s\n' "$1" | sed 's/^\[\(.*\)\]:[0-9]*$/\1/; t; s/:[0-9]*$//'; }

# The remote command line: every argument single-quoted.
quote() {
	for a in "$@"; do printf " '%s'" "$(printf '%s' "$a" | sed "s/'/'\\\\''/g")"; done
}
cfgname=$(basename "$config")
logs=$(mktemp -d "${TMPDIR:-/tmp}/pstrain-ssh.XXXXXX")
pids=""
start() { # ROLE INDEX HOST [ARG...]
	role=$1 index=$2 host=$3
	shift 3
	cmd="cd $(quote "$dir") && exec ./pstrain $role --index $index --config $(quote "$cfgname")$(quote "$@")"
	if [ "$role" = worker ] && [ "$index" = 0 ]; then
		$ssh "$host" "$cmd" &
	else
		$ssh "$host" "$cmd" >"$logs/$role$index.log" 2>&1 &
	fi
	pids="$pids $!"
}
stop() {
	trap - INT TERM
	echo "ssh-cluster: stopping all tasks" >&2
	for p in $pids; do kill -INT "$p" 2>/dev/null; done
	wait
	exit 130
}
trap stop INT TERM

k=0
for h in $(hosts ps); do
	start ps "$k" "$(host_of "$h")" "$@"
	k=$((k + 1))
done
n=0
for h in $(hosts workers); do
	[ "$n" -gt 0 ] && start worker "$n" "$(host_of "$h")" "$@"
	n=$((n + 1))
done
echo "ssh-cluster: $k ps + $n workers from $config in $dir; logs in $logs" >&2
start worker 0 "$(host_of "$(hosts workers | head -n 1)")" "$@"

status=0
for p in $pids; do
	wait "$p"
	s=$?
	[ "$s" -ne 0 ] && [ "$status" -eq 0 ] && status=$s
done
if [ "$status" -ne 0 ]; then
	echo "ssh-cluster: a task failed (exit $status); logs:" >&2
	for f in "$logs"/*.log; do echo "== $f" >&2; tail -n 5 "$f" >&2; done
else
	rm -rf "$logs"
fi
exit "$status"
