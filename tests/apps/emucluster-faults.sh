#!/bin/sh
# Dead links on the emulated cluster: 2 hosts, 2 ranks each, streaming ring all-reduces over the
# socket transport (test_net --cut), when
#   A. the socket transport's own link to h2 is cut (a second veth per host carries it, so MPI
#      and Open MPI's daemons still talk): every rank must fail with DEAR_ERR_NET, the log naming
#      the peer that acknowledged nothing for DEAR_SOCKET_DEAD_S=3, within 8 s of the cut, and
#      the job (which then aborts, as an application does) must end within 15 s;
#   B. h2 is cut off altogether (both its links down, daemons included): the job must end within
#      20 s, which takes mpirun's OOB keepalive (bench/emucluster sets it; docs/DESIGN.md "Peers
#      that are gone" says why nothing else ends mpirun's wait).
# Skips (77) where the cluster cannot be made (tests/apps/emucluster-lib.sh). Its own host
# prefix, bridge and subnets, torn down even on failure.
set -u
TEST=emucluster-faults.sh
. "${top_srcdir:-.}/tests/apps/emucluster-lib.sh"
DEAD_S=3

emu_require
exe=$top_builddir/tests/mpi/test_net
[ -x "$exe" ] || fail "$exe is not built"
emu_unique f
DATA_SUBNET=10.215.$(( $$ % 250 + 1 ))
h1=${EMU_PREFIX}1
h2=${EMU_PREFIX}2

out=$(mktemp) || exit 99
# shellcheck disable=SC2317  # called from the traps
# The data links go by name: a namespace whose TCP sockets still retransmit to a cut host
# outlives its deletion, and would keep them in the root namespace.
cleanup() {
    "$EMU" down >/dev/null 2>&1
    ip link del "dd${id}k1" 2>/dev/null
    ip link del "dd${id}k2" 2>/dev/null
    rm -f "$out"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
start=$(date +%s)

"$EMU" up 2 100mbit >/dev/null || fail "emucluster up 2 100mbit failed"
bridge=$(sed -n 's/^BRIDGE=//p' "/run/dear-emucluster-$EMU_PREFIX/config" 2>/dev/null)
[ -n "$bridge" ] || fail "cannot find the cluster's bridge in /run/dear-emucluster-$EMU_PREFIX/config"
# The socket transport's own link: dear0 in each host, on the same bridge, in its own subnet.
for k in 1 2; do
    if ! { ip link add "dd${id}k$k" type veth peer name dear0 netns "${EMU_PREFIX}$k" &&
        ip link set "dd${id}k$k" master "$bridge" up &&
        ip netns exec "${EMU_PREFIX}$k" ip addr add "$DATA_SUBNET.$k/24" dev dear0 &&
        ip netns exec "${EMU_PREFIX}$k" ip link set dear0 up; }; then
        fail "cannot add the data link to ${EMU_PREFIX}$k"
    fi
done

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Run test_net --cut in the background (args: extra mpirun options), wait until it streams, run
# the cut command, then wait for the job to end within $1 s. Sets t_cut, t_end, rc, t_fail
# (seconds from the cut to the first failure a rank reports, empty if none). With soft=1 a job
# still running at the limit is killed and run_cut returns 1 (late=1) instead of failing.
soft=0
run_cut() {
    late=0
    limit=$1
    shift
    cut_cmd=$1
    shift
    : >"$out"
    timeout -k 5 120 "$EMU" mpirun -np 4 --host "$h1:2,$h2:2" "$@" "$exe" --cut >"$out" 2>&1 &
    job=$!
    i=0
    until grep -q 'test_net --cut: streaming' "$out"; do
        i=$((i + 1))
        [ $i -le 600 ] || { kill "$job" 2>/dev/null; cat "$out"; fail "test_net --cut never streamed"; }
        kill -0 "$job" 2>/dev/null || { cat "$out"; fail "test_net --cut ended before streaming"; }
        sleep 0.1
    done
    t_cut=$(now)
    $cut_cmd || fail "'$cut_cmd' failed"
    t_fail=
    while kill -0 "$job" 2>/dev/null; do
        [ -z "$t_fail" ] && grep -q 'acknowledged nothing\|an all-reduce failed' "$out" && t_fail=$(since "$t_cut")
        if awk -v s="$(since "$t_cut")" -v l="$limit" 'BEGIN { exit !(s > l) }'; then
            kill "$job" 2>/dev/null
            wait "$job" 2>/dev/null
            cat "$out"
            [ "$soft" = 1 ] || fail "$label: the job was still running ${limit} s after the cut"
            late=1
            return 1
        fi
        sleep 0.1
    done
    wait "$job"
    rc=$?
    t_end=$(since "$t_cut")
    [ -z "$t_fail" ] && grep -q 'acknowledged nothing\|an all-reduce failed' "$out" && t_fail=$t_end
}

# A: the data path dies, the launcher's path lives.
label="A (socket link cut)"
run_cut 15 "ip link set dd${id}k2 down" -x DEAR_SOCKET_IFNAME=dear0 -x DEAR_SOCKET_DEAD_S=$DEAD_S
grep -v '^\[.*\] \*\*\*\|^ *$' "$out" | head -20
[ "$rc" -ne 0 ] || fail "$label: the job ended with status 0"
[ -n "$t_fail" ] || fail "$label: no rank reported the failure"
awk -v t="$t_fail" -v d=$DEAD_S 'BEGIN { exit !(t <= d + 5) }' ||
    fail "$label: the first failure came ${t_fail} s after the cut (DEAR_SOCKET_DEAD_S=$DEAD_S)"
grep -Eq "connection to rank [23] \\($DATA_SUBNET\\.2:[0-9]+\\) .*acknowledged nothing for DEAR_SOCKET_DEAD_S=$DEAD_S" "$out" ||
    fail "$label: no rank on $h1 named a rank of $h2 as dead"
grep -Eq "connection to rank [01] \\($DATA_SUBNET\\.1:[0-9]+\\) .*acknowledged nothing" "$out" ||
    fail "$label: no rank on $h2 named a rank of $h1 as dead"
echo "emucluster-faults.sh: $label: first failure ${t_fail} s, job ended ${t_end} s after the cut (status $rc)"

# B: the host is cut off, daemons and all.
label="B (host cut off)"
# h2's links back as new: forwarding on the bridge, and no neighbour entry that a cut left
# failed (a connect to it would be refused at once, and set-up does not retry refusals).
reconnect_h2() {
    for l in "emu-$h2" "dd${id}k2"; do
        ip link set "$l" up || fail "cannot bring $l of $h2 back"
        i=0
        until bridge link show dev "$l" 2>/dev/null | grep -q 'state forwarding'; do
            i=$((i + 1))
            [ $i -le 50 ] || fail "$l of $h2 does not forward again"
            sleep 0.1
        done
    done
    for h in "$h1" "$h2"; do
        ip netns exec "$h" ip neigh flush all || fail "cannot flush the neighbours of $h"
    done
}
# shellcheck disable=SC2317  # run by run_cut
cut_host() { ip link set "emu-$h2" down && ip link set "dd${id}k2" down; }
# mpirun ends through its keepalive to the cut daemon, which applies only while nothing is queued
# on that connection: a message in flight at the cut leaves TCP's retransmission timeout (minutes),
# which no part of dear controls. One such attempt is said and tried once more.
soft=1
for attempt in 1 2; do
    reconnect_h2
    run_cut 20 cut_host -x DEAR_SOCKET_IFNAME=dear0
    [ "$late" = 1 ] || break
    echo "emucluster-faults.sh: $label: attempt $attempt: still running 20 s after the cut"
done
soft=0
[ "$late" = 0 ] || fail "$label: the job was still running 20 s after the cut, twice"
grep -v '^\[.*\] \*\*\*\|^ *$' "$out" | head -12
[ "$rc" -ne 0 ] || fail "$label: the job ended with status 0"
echo "emucluster-faults.sh: $label: job ended ${t_end} s after the cut (status $rc)"

"$EMU" down >/dev/null || fail "emucluster down failed"
for k in 1 2; do
    ip link del "dd${id}k$k" 2>/dev/null
done
echo "emucluster-faults.sh: PASS in $(( $(date +%s) - start )) s"
exit 0
