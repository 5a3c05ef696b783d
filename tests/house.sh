#!/bin/sh
# The limits the house has agreed, checked on every `make test` so that
# later work cannot quietly break them (STYLE.md; issue 37):
#   - no source file outside tests/ and bench/ over MAX_FILE lines;
#   - no function over MAX_FUNC lines (from its opening brace in column 0
#     to its closing one: the house style puts both there);
#   - nothing in core/ (any of its rooms), net/ or gpu/ includes cluster/;
#     core/ reaches gpu/ only through gpu/gpu.h;
#   - the release binary (argument 1) holds no PSTRAIN_ test hook
#     (base/hooks.h: a test build's only) and no fuzz harness.
# A file or function already over a limit when the limit came is listed
# below with its size then: it may shrink, never grow, and the list only
# gets shorter.
set -u
cd "$(dirname "$0")/.."
bin=${1:-./pstrain}
MAX_FILE=900
MAX_FUNC=120
# path[:function] size-when-listed
DEBTS="
"
fail=0
debt_of() { echo "$DEBTS" | awk -v k="$1" '$1 == k { print $2 }'; }
over() { # what size limit
	d=$(debt_of "$1")
	if [ -n "$d" ]; then
		[ "$2" -le "$d" ] && return 0
		echo "house: $1 is $2 lines, more than the $d it had when listed (limit $3)" >&2
	else
		echo "house: $1 is $2 lines (limit $3)" >&2
	fi
	fail=1
}
for f in $(git ls-files '*.c' '*.h' '*.cu' | grep -v -E '^(tests|bench)/'); do
	n=$(wc -l <"$f")
	[ "$n" -gt $MAX_FILE ] && over "$f" "$n" $MAX_FILE
	awk -v f="$f" '
		/^[A-Za-z_].*\(/ { sig = $0 }
		/^[{]/ { start = NR; name = sig; sub(/\(.*/, "", name); n = split(name, w, /[ *]+/); name = w[n] }
		/^[}]/ && start { print f ":" name, NR - start + 1; start = 0 }' "$f" >/tmp/house.$$
	while read -r fn len; do
		[ "$len" -gt $MAX_FUNC ] && over "$fn" "$len" $MAX_FUNC
	done </tmp/house.$$
done
rm -f /tmp/house.$$
bad=$(git grep -n -E '#include "(\.\./)*cluster/' -- core net gpu || true)
[ -n "$bad" ] && { echo "house: below cluster/, an include of cluster/:" >&2; echo "$bad" >&2; fail=1; }
bad=$(git grep -n -E '#include "(\.\./)+gpu/' -- core | grep -v -E '(\.\./)+gpu/gpu\.h"' || true)
[ -n "$bad" ] && { echo "house: core/ reaches gpu/ other than through gpu.h:" >&2; echo "$bad" >&2; fail=1; }
# PSTRAIN_GPU_EXACT_ALLOC is a memory checker's setting for the release
# binary on a GPU (gpu/arena.h, docs/GPU.md), not a test hook.
hooks=$(strings "$bin" | grep -o 'PSTRAIN_[A-Z_]*' | grep -v -x -E 'PSTRAIN_GPU_EXACT_ALLOC' | sort -u || true)
[ -n "$hooks" ] && { echo "house: $bin holds test hooks: $hooks" >&2; fail=1; }
# The fuzzer's harness (cluster/ps_harness.c) drives a ps without sockets;
# it is linked into fuzz_ps only.
harness=$(nm "$bin" 2>/dev/null | grep -o 'ps_harness_[a-z_]*' | sort -u || true)
[ -n "$harness" ] && { echo "house: $bin holds the fuzz harness: $harness" >&2; fail=1; }
[ $fail = 0 ] && echo "house: file and function lengths, includes and test hooks within the limits ($bin)"
exit $fail
