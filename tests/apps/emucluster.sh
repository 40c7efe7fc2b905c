#!/bin/sh
# The emulated cluster end to end: bring up 2 hosts at 100 Mbit/s, check that Open MPI lands
# ranks on both hosts with their own host names and shared-memory nodes (2 ranks per host),
# and that the measured point-to-point rate is what tbf was told (TCP goodput is ~95.6% of
# the line rate: 1448 payload bytes per 1514-byte frame), and that the runtime's training loop
# (dense and sparse) runs right across them on the socket transport, which auto picks there.
# Skips (77) where namespaces or tbf cannot be made. Uses its own host prefix, bridge and subnet
# so it never touches a cluster someone brought up with the defaults, and tears down even on
# failure.
set -u
TEST=emucluster.sh
. "${top_srcdir:-.}/tests/apps/emucluster-lib.sh"
RATE=100mbit
RATE_MBPS=12.5          # 100 Mbit/s in 10^6 bytes per second

emu_require
for p in bench/dear-p2p bench/emu-hello; do
    [ -x "$top_builddir/$p" ] || fail "$top_builddir/$p is not built"
done
emu_unique t

other=${EMU_PREFIX}x      # a second cluster, for the subnet claims
# shellcheck disable=SC2317  # called from the traps
cleanup() { "$EMU" down >/dev/null 2>&1; EMU_PREFIX=$other "$EMU" down >/dev/null 2>&1; }
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

out=$(mktemp)
trap 'cleanup; rm -f "$out"' EXIT
start=$(date +%s)

"$EMU" up 2 $RATE || fail "emucluster up 2 $RATE failed"
"$EMU" status
subnet=$(sed -n 's/^SUBNET=//p' "/run/dear-emucluster-$EMU_PREFIX/config")
[ -n "$subnet" ] || fail "no SUBNET in the cluster's config"

# A second cluster beside it gets another subnet, and naming the first one's is refused.
EMU_PREFIX=$other "$EMU" up 1 $RATE 2>/dev/null || fail "a second cluster (EMU_SUBNET=auto) failed to come up"
subnet2=$(sed -n 's/^SUBNET=//p' "/run/dear-emucluster-$other/config")
if [ -z "$subnet2" ] || [ "$subnet2" = "$subnet" ]; then
    fail "the second cluster got subnet '$subnet2', the first has '$subnet'"
fi
EMU_PREFIX=$other "$EMU" down >/dev/null 2>&1
msg=$(EMU_PREFIX=$other EMU_SUBNET=$subnet "$EMU" up 1 $RATE 2>&1) &&
    fail "a second cluster on the first one's subnet $subnet came up"
echo "$msg" | grep -q "is held by the cluster in /run/dear-emucluster-$EMU_PREFIX" ||
    fail "the refusal of a held subnet does not name its cluster: $msg"
echo "$TEST: subnets: $subnet, a second cluster $subnet2; naming a held one refused"

# Two ranks per host: vader inside a host, TCP between hosts.
h1=${EMU_PREFIX}1
h2=${EMU_PREFIX}2
timeout -k 5 60 "$EMU" mpirun -np 4 --host "$h1:2,$h2:2" "$top_builddir/bench/emu-hello" >"$out" 2>&1
rc=$?
cat "$out"
[ $rc -eq 0 ] || fail "emu-hello across $h1,$h2 exited with $rc"
summary=$(grep '^emu-hello: ranks=' "$out")
[ "$summary" = "emu-hello: ranks=4 hosts=2 nodes=2 names=$h1,$h2" ] ||
    fail "expected 4 ranks on 2 hosts ($h1,$h2) forming 2 shared-memory nodes, got: $summary"
for r in 0 1; do
    grep -q "^emu-hello: rank $r on $h1 " "$out" || fail "rank $r is not on $h1"
done
for r in 2 3; do
    grep -q "^emu-hello: rank $r on $h2 " "$out" || fail "rank $r is not on $h2"
done

# Test program tests/mpi/PROG on 2 ranks per host across the two hosts, with mpirun's
# arguments ARGS: its output in $out (last lines shown); a non-zero exit fails the test.
run_across() {
    prog=$1
    shift
    timeout -k 5 300 "$EMU" mpirun -np 4 --host "$h1:2,$h2:2" -x CK_FORK=no "$@" "$top_builddir/tests/mpi/$prog" \
        >"$out" 2>&1
    rc=$?
    tail -3 "$out"
    [ $rc -eq 0 ] || fail "$prog across $h1,$h2 ($*) exited with $rc"
}

# The runtime across the hosts: DEAR_TRANSPORT=auto must take the socket transport there (every
# context asserts it through DEAR_TEST_TRANSPORT), and test_loop's training patterns must match
# its MPI_Allreduce reference over it, hier's communicators included (2 hosts of 2 ranks).
[ -x "$top_builddir/tests/mpi/test_loop" ] && run_across test_loop -x DEAR_TEST_TRANSPORT=socket

# Sparse tensors across the hosts: test_sparse's loops must match their MPI_Allreduce reference
# (the all-gathers pass through a partner on each host), and DEAR_SPARSE=auto must weigh the
# reduce-scatter's bytes by the 2 ranks per host (its exchange crosses the link once per rank,
# hier once per host), which changes some of the test's phase decisions (the cost model plays no
# part: calibration off).
if [ -x "$top_builddir/tests/mpi/test_sparse" ]; then
    run_across test_sparse -x DEAR_CALIBRATE=off
    flips=$(sed -n 's/^test_sparse: 2 ranks per host: .*; \([0-9]*\) phase decision(s) so far.*/\1/p' "$out" | tail -1)
    [ "${flips:-0}" -gt 0 ] || fail "test_sparse across $h1,$h2: no phase decision weighed by 2 ranks per host"
    echo "$TEST: test_sparse across $h1,$h2: $flips phase decision(s) changed by weighing 2 ranks per host"
fi

# Ranks that cannot reach each other's sockets: each host's loopback (DEAR_SOCKET_IFNAME=lo)
# is its own, so DEAR_TRANSPORT=socket must fail on every rank within DEAR_SOCKET_TIMEOUT_S,
# and auto must go on over MPI (test_net --unreachable asserts both).
if [ -x "$top_builddir/tests/mpi/test_net" ]; then
    timeout -k 5 120 "$EMU" mpirun -np 4 --host "$h1:2,$h2:2" -x CK_FORK=no -x DEAR_SOCKET_IFNAME=lo \
        -x DEAR_SOCKET_TIMEOUT_S=3 "$top_builddir/tests/mpi/test_net" --unreachable >"$out" 2>&1
    rc=$?
    tail -6 "$out"
    [ $rc -eq 0 ] || fail "test_net --unreachable across $h1,$h2 exited with $rc"
    grep -q "DEAR_TRANSPORT=auto goes on over MPI" "$out" || fail "auto's fall-back to MPI printed no warning"
fi

# One-way streams h1 -> h2 (emucluster p2p) and h2 -> h1: each must sit near the configured
# rate, neither far below (shaping too tight, broken link) nor above it (no shaping at all).
for dir in "$h1,$h2" "$h2,$h1"; do
    if [ "$dir" = "$h1,$h2" ]; then
        timeout -k 5 60 "$EMU" p2p --mode oneway --size 1m --time 1 --reps 1 --csv >"$out" 2>&1
    else
        timeout -k 5 60 "$EMU" mpirun -np 2 --host "$dir" "$top_builddir/bench/dear-p2p" \
            --mode oneway --size 1m --time 1 --reps 1 --csv >"$out" 2>&1
    fi
    rc=$?
    cat "$out"
    [ $rc -eq 0 ] || fail "dear-p2p ($dir) exited with $rc"
    row=$(grep '^oneway,' "$out")
    [ -n "$row" ] || fail "dear-p2p ($dir) printed no oneway row"
    mbps=$(echo "$row" | cut -d, -f7)
    wrong=$(echo "$row" | cut -d, -f9)
    [ "$wrong" = 0 ] || fail "dear-p2p ($dir) saw $wrong messages with wrong contents"
    awk -v m="$mbps" -v r="$RATE_MBPS" 'BEGIN { exit !(m >= 0.80 * r && m <= 1.02 * r) }' ||
        fail "p2p rate $dir $mbps MB/s is outside [0.80, 1.02] x $RATE_MBPS MB/s (the $RATE link)"
    echo "emucluster.sh: p2p $dir $mbps MB/s on a $RATE link ($(awk -v m="$mbps" -v r="$RATE_MBPS" 'BEGIN { printf "%.1f", 100 * m / r }')% of line rate)"
done

"$EMU" down || fail "emucluster down failed"
"$EMU" status | grep -q '^emucluster: down$' || fail "status does not say down after down"
ip netns list | grep -q "^$h1" && fail "namespace $h1 survived down"
echo "emucluster.sh: PASS in $(( $(date +%s) - start )) s"
exit 0
