#!/bin/sh
# The simulator's prediction as a test: on the emulated cluster, 2 hosts x 2 ranks behind a
# 300 Mbit/s link, dear+auto's predicted iteration (the simulator on the plan that ran, with the
# runtime's own calibration) must be within 10% of the measured median iteration. The timings are
# communication-dominated (about 300 ms of collectives per iteration, compute half of that), so
# scheduling noise of the shared cores is small against them. The rate is a compromise: faster
# links make the 2 cores the bottleneck (copies, not the link), slower ones make the runtime's
# calibration at commit, whose bytes are fixed, take most of a minute. When the run shows the machine
# stalled (compute overran, or the iterations spread wide: bench/e2e-report.py check), or missed,
# it says so and runs once more: the second run's verdict stands, and a second stall skips,
# saying why, rather than pass on no evidence.
# Skips (77) where the emulated cluster cannot run. Uses its own host prefix, bridge and subnet.
set -u
TEST=e2e-predict.sh
. "${top_srcdir:-.}/tests/apps/emucluster-lib.sh"
RATE=300mbit
PROFILE=$top_srcdir/fusion/profiles/vgg16.prof
MAX_ERR=10

emu_require
BENCH=$top_builddir/apps/bench/dear-bench
[ -x "$BENCH" ] || fail "$BENCH is not built"
emu_unique p

tmpd=$(mktemp -d)
# shellcheck disable=SC2317  # called from the traps
cleanup() { "$EMU" down >/dev/null 2>&1; rm -rf "$tmpd"; }
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
start=$(date +%s)

"$EMU" up 2 $RATE >/dev/null || fail "emucluster up 2 $RATE failed"
hosts=${EMU_PREFIX}1:2,${EMU_PREFIX}2:2
# Communication about 300 ms per iteration at the link rate (per host, as the lower bound counts
# it), compute half of it.
scales=$(python3 "$top_srcdir/bench/e2e-report.py" scale --profile "$PROFILE" --rate $RATE --np 4 --hosts 2 \
    --comm-ms 300 --ratio 0.5) || fail "e2e-report.py scale failed"
sscale=${scales% *} tscale=${scales#* }

# No check of auto's plan (DEAR_VERIFY_ITERS=0): on cores other tests share, its timings may send
# the run back to the threshold plan now and then, and the test is of the model, not of the check.
# run N: dear+auto on the cluster, then the judgement; its status is check's (0, 1, 3).
run() {
    csv=$tmpd/run$1.csv
    timeout -k 5 100 "$EMU" mpirun -np 4 --host "$hosts" -x DEAR_VERIFY_ITERS=0 -x DEAR_LOG_LEVEL=info \
        "$BENCH" --profile "$PROFILE" --configs dear:auto \
        --iters 9 --size-scale "$sscale" --time-scale "$tscale" --csv "$csv" --quiet >"$tmpd/out$1" 2>&1
    rc=$?
    [ $rc -eq 0 ] || { cat "$tmpd/out$1"; fail "dear-bench (run $1) exited with $rc"; }
    # Across hosts the calibration also prices each phase alone on an idle link, from 1 MiB.
    for op in rs ag; do
        grep -q "info plan:   $op auto@idle 1048576 B: " "$tmpd/out$1" ||
            { grep "auto" "$tmpd/out$1" | head -20; fail "run $1: no idle curve for $op in the log"; }
    done
    python3 "$top_srcdir/bench/e2e-report.py" check --csv "$csv" --config dear:auto --max-err $MAX_ERR
}

run 1
rc=$?
if [ $rc -ne 0 ]; then
    # A second run decides: under make -j2 check another test may share the cores for part of
    # one run, while a model that misprices misses in both.
    case $rc in
    3) echo "$TEST: the machine stalled during run 1: its error says little; running once more" ;;
    *) echo "$TEST: run 1 missed by more than $MAX_ERR%; running once more to tell noise from a mispricing" ;;
    esac
    first=$rc
    run 2
    rc=$?
    [ $rc -eq 3 ] && skip "the machine stalled in run 2 after run 1's $([ $first -eq 3 ] && echo stall || echo miss) (see the check lines above): no verdict"
fi
[ $rc -eq 0 ] || fail "dear+auto's prediction is more than $MAX_ERR% off the measured iteration (see above)"
echo "$TEST: PASS in $(( $(date +%s) - start )) s"
exit 0
