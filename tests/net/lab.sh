# A lab of network namespaces: N hosts on one switch, each on its own
# shaped link, for the multi-host tests (tests/net/run.sh) and the network
# benchmark (bench/netlab). Source it (POSIX sh); every name starts with
# lab_ or LAB_.
#
#   lab_check                 0 when this shell can make namespaces (root, ip netns)
#   lab_up N RATE             hosts 0..N-1 at 10.77.0.(K+1)/24, every link RATE
#                             (LAB_CC set: each host's TCP congestion control)
#   lab_ns K / lab_ip K       host K's namespace / address
#   lab_run K CMD...          CMD in host K's namespace
#   lab_rate K RATE           reshape host K's link, both directions
#   lab_cut K / lab_heal K    take host K's switch port down / up again
#   lab_delay K US NETDELAY   hold every packet host K receives for US microseconds
#                             (NETDELAY: the bench/netdelay binary; 0 undoes it)
#   lab_down                  kill what runs in the lab's namespaces, delete them
#
# The switch is a bridge in a namespace of its own (LAB-sw), so the root
# namespace gains nothing, and parallel labs (LAB_NAME differs per shell)
# never share a name. Host K's end is eth0 in LAB-hK; its switch port is
# hK. A link's RATE (tc syntax: 1gbit, 100mbit; 0 = unshaped) is an HTB
# class on both ends' egress: eth0 shapes what host K sends, hK what it
# receives, as a switch port would. This kernel has no netem: lab_delay
# holds a host's incoming packets in user space instead (iptables NFQUEUE
# and bench/netdelay; every host delays what it receives, so a round trip
# between two delayed hosts is twice the delay).
# Each class queues in a pfifo of the device's txqueuelen packets (1000,
# of up to 64 KiB each with GSO: a deep buffer); LAB_QUEUE=BYTES gives it
# a bfifo of that many bytes instead, a switch port with a shallow buffer
# (this kernel has pfifo and bfifo, no fq_codel, fq, sfq or codel).
#
# Callers set `trap lab_down EXIT` (plus INT and TERM) right after lab_up,
# so a failing test leaves nothing behind.

LAB_NAME=${LAB_NAME:-pl$$}
LAB_N=0
LAB_NET=${LAB_NET:-10.77.0}

lab_check() {
	[ "$(id -u)" = 0 ] || return 1
	command -v ip >/dev/null && command -v tc >/dev/null || return 1
	ip netns add "$LAB_NAME-probe" 2>/dev/null || return 1
	ip netns del "$LAB_NAME-probe"
}

lab_ns() { echo "$LAB_NAME-h$1"; }
lab_ip() { echo "$LAB_NET.$(($1 + 1))"; }
lab_run() {
	_k=$1
	shift
	ip netns exec "$(lab_ns "$_k")" "$@"
}

# One end's egress shaped to $3 (dev $2 in namespace $1).
lab_shape() {
	ip netns exec "$1" tc qdisc del dev "$2" root 2>/dev/null
	[ "$3" = 0 ] && return 0
	# A burst of about 1 ms at the rate (HTB's default is far smaller
	# than what one GSO packet of 64 KiB needs at 10 Gbit/s).
	_b=$(lab_bytes_per_ms "$3")
	[ "$_b" -lt 65536 ] && _b=65536
	ip netns exec "$1" tc qdisc add dev "$2" root handle 1: htb default 1 &&
		ip netns exec "$1" tc class add dev "$2" parent 1: classid 1:1 htb \
			rate "$3" ceil "$3" burst "$_b" cburst "$_b" quantum 60000 || return 1
	[ "${LAB_QUEUE:-0}" = 0 ] ||
		ip netns exec "$1" tc qdisc add dev "$2" parent 1:1 bfifo limit "$LAB_QUEUE"
}

# Bytes per millisecond of a tc rate: 1gbit, 500mbit, 10gbit, 100kbit.
lab_bytes_per_ms() {
	case "$1" in
	*gbit) echo $((${1%gbit} * 1000000000 / 8000)) ;;
	*mbit) echo $((${1%mbit} * 1000000 / 8000)) ;;
	*kbit) echo $((${1%kbit} * 1000 / 8000)) ;;
	*) echo 65536 ;;
	esac
}

lab_up() {
	LAB_N=$1
	_sw="$LAB_NAME-sw"
	ip netns add "$_sw" || return 1
	ip -n "$_sw" link set lo up
	ip -n "$_sw" link add br0 type bridge || return 1
	ip -n "$_sw" link set br0 up
	_k=0
	while [ "$_k" -lt "$LAB_N" ]; do
		_ns=$(lab_ns "$_k")
		ip netns add "$_ns" || return 1
		ip -n "$_ns" link set lo up
		[ -z "${LAB_CC:-}" ] || ip netns exec "$_ns" sysctl -qw net.ipv4.tcp_congestion_control="$LAB_CC" || return 1
		ip -n "$_sw" link add "h$_k" type veth peer name eth0 netns "$_ns" || return 1
		ip -n "$_sw" link set "h$_k" master br0 up
		ip -n "$_ns" addr add "$(lab_ip "$_k")/24" dev eth0
		ip -n "$_ns" link set eth0 up
		lab_rate "$_k" "$2" || return 1
		_k=$((_k + 1))
	done
	# Wait until every port forwards (no STP: at once, but links come up
	# asynchronously). No ping here: Debian's minimal images lack it.
	_t=0
	while [ "$_t" -lt 50 ]; do
		[ "$(bridge -n "$_sw" link show | grep -c 'state forwarding')" -ge "$LAB_N" ] && return 0
		sleep 0.1
		_t=$((_t + 1))
	done
	echo "lab: the switch's ports did not come up" >&2
	return 1
}

lab_rate() {
	lab_shape "$(lab_ns "$1")" eth0 "$2" && lab_shape "$LAB_NAME-sw" "h$1" "$2"
}

lab_cut() { ip -n "$LAB_NAME-sw" link set "h$1" down; }
lab_heal() { ip -n "$LAB_NAME-sw" link set "h$1" up; }

# Host K's incoming packets on eth0 (not loopback) go through netdelay
# in K's namespace; --queue-bypass lets them through undelayed should
# netdelay not be running, rather than drop them. Incoming, not
# outgoing: a packet held on its way out still counts against its
# socket's TCP Small Queues budget (about 1 ms of data at the pacing
# rate), which at a 5 ms delay held TCP to 9 Mbit/s on a 1 Gbit/s link;
# one held on its way in belongs to no socket.
lab_delay() {
	_ns=$(lab_ns "$1")
	ip netns exec "$_ns" iptables -D INPUT -i eth0 -j NFQUEUE --queue-num 0 --queue-bypass 2>/dev/null
	_p=$(cat "/tmp/$LAB_NAME-delay-$1.pid" 2>/dev/null) && kill "$_p" 2>/dev/null
	rm -f "/tmp/$LAB_NAME-delay-$1.pid"
	[ "$2" = 0 ] && return 0
	# Started from a subshell, so that it is nobody's job here: a caller's
	# plain `wait` would otherwise wait for it.
	(
		ip netns exec "$_ns" "$3" --queue 0 --delay-us "$2" </dev/null &
		echo $! >"/tmp/$LAB_NAME-delay-$1.pid"
	)
	ip netns exec "$_ns" iptables -A INPUT -i eth0 -j NFQUEUE --queue-num 0 --queue-bypass
}

lab_down() {
	for _ns in $(ip netns list 2>/dev/null | sed -n "s/^\($LAB_NAME-[a-z0-9]*\).*/\1/p"); do
		_p=$(ip netns pids "$_ns" 2>/dev/null)
		[ -n "$_p" ] && kill -KILL $_p 2>/dev/null
		ip netns del "$_ns" 2>/dev/null
	done
	rm -f /tmp/"$LAB_NAME"-delay-*.pid
	return 0
}
