#!/bin/bash
# refit.sh: do the predictions hold once the cost model is fitted to training? Runs pred-rate.sh's
# case (one profile scaled to ~--comm-ms of communication per iteration at the link rate) on each
# layout in pairs of jobs on one calibration: A with DEAR_COST_REFIT=off, R with
# DEAR_COST_REFIT=--refit (predict: a forecast; plan: the planners use it too). The pairs alternate
# their order (A R, then R A), the first job calibrating afresh into a cache the second loads, so
# that R over A measures the fit, not the order. Writes bench/results/refit-LAYOUT-RATE-{A,R}N.csv
# (dear-bench's rows; R's predictions use the factor the runtime fitted; under --refit plan in
# bench/results/refit-plan/) and refit.meta beside them, and the section "The model fitted to
# training" of docs/PERFORMANCE.md: each configuration's prediction error per job, the share
# within 5%, and R's period over A's. Needs root (network namespaces).
set -euo pipefail
PROG="refit.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

HOSTS=4
RATE=1gbit
LAYOUTS="2x3"
PROFILE=resnet50
CONFIGS="dear:threshold:25m;dear:dp;dear:gradssa;wfbp:mgwfbp"
COMM_MS=300
PAIRS=3
ITERS=21
ROUNDS=3
REFIT=predict
REPORT_ONLY=0
KEEP_OTHERS=0
BUILDDIR=
emu_names rf 10.213.64

usage() {
    cat <<EOF
usage: bench/refit.sh [options]
  --builddir DIR    build directory holding apps/bench/dear-bench (default: the current
                    directory if it has it, else the source tree)
  --rate RATE       link rate, tc syntax (default $RATE)
  --layouts LIST    HOSTSxRANKS, hosts <= $HOSTS (default "$LAYOUTS")
  --profile NAME    fusion/profiles/NAME.prof (default $PROFILE)
  --configs LIST    dear-bench --configs (default "$CONFIGS")
  --comm-ms MS      communication per iteration the case is scaled to (default $COMM_MS)
  --pairs N         pairs of jobs (A and R on one calibration, order alternating) per layout
                    (default $PAIRS)
  --iters N         measured iterations per configuration and job (default $ITERS)
  --rounds R        every configuration runs R times in turn within a job (default $ROUNDS)
  --refit MODE      DEAR_COST_REFIT of the R jobs: predict or plan (default $REFIT; plan's
                    results go to bench/results/refit-plan/)
  --keep-others     keep the results of other layouts and rates (the meta file then lists each
                    run); else every earlier result of the mode is removed first
  --report-only     do not measure; regenerate the section from bench/results/refit-*
  --help            this text
Environment: EMU_PREFIX (default rf), EMU_SUBNET (default 10.213.64).
EOF
}

bench_options --builddir=BUILDDIR --rate=RATE --layouts=LAYOUTS --profile=PROFILE --configs=CONFIGS \
    --comm-ms=COMM_MS --pairs=PAIRS --iters=ITERS --rounds=ROUNDS --refit=REFIT --report-only=REPORT_ONLY! \
    --keep-others=KEEP_OTHERS! -- "$@"
for n in "$COMM_MS" "$PAIRS" "$ITERS" "$ROUNDS"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "bad count '$n': a positive integer"
done
[[ $REFIT == predict || $REFIT == plan ]] || die "bad --refit '$REFIT': predict or plan"
[[ $RATE =~ ^[1-9][0-9]*(\.[0-9]+)?(kbit|mbit|gbit)$ ]] || die "bad rate '$RATE': e.g. 250mbit, 1gbit"
# shellcheck disable=SC2086 # a list of words
check_layouts $LAYOUTS
PROF=$SRCDIR/fusion/profiles/$PROFILE.prof
[[ -r $PROF ]] || die "no profile $PROF"

args="--rate $RATE --layouts '$LAYOUTS' --profile $PROFILE --comm-ms $COMM_MS --pairs $PAIRS"
args+=" --iters $ITERS --rounds $ROUNDS --refit $REFIT"
((KEEP_OTHERS)) && args+=" --keep-others"
# The section names the script; each run's own command is the first line of its meta block.
report() { python3 "$SRCDIR/bench/refit-report.py" --results "$RES" --doc "$DOC" --command bench/refit.sh; }
((REPORT_ONLY)) && { report; exit 0; }
BENCH=$(emu_bench "$BUILDDIR")

OUT=$RES
[[ $REFIT == plan ]] && OUT=$RES/refit-plan
mkdir -p "$OUT"
if ((KEEP_OTHERS)); then
    for layout in $LAYOUTS; do rm -f "$OUT/refit-$layout-$RATE-"*.csv; done
else
    rm -f "$OUT"/refit-*.csv "$OUT/refit.meta"
fi
bench_start
start=$(date +%s)
status=0
emu_up "$HOSTS" "$RATE" >/dev/null
for layout in $LAYOUTS; do
    nh=${layout%x*} rph=${layout#*x}
    np=$((nh * rph))
    hosts=$(emu_hosts "$nh" "$rph")
    read -r sscale tscale < <(e2e_scale "$PROF" "$RATE" "$np" "$nh" "$COMM_MS" 1)
    for ((pair = 1; pair <= PAIRS; pair++)); do
        rm -f "$tmp/cal"
        order="A R"
        ((pair % 2)) || order="R A"
        for side in $order; do
            echo "$PROG: $PROFILE on $layout at $RATE, pair $pair, $side (size x $sscale, time x $tscale)"
            rc=0
            emu_mpirun "$np" "$hosts" -x "DEAR_CALIBRATION_FILE=$tmp/cal" -x "DEAR_COST_REFIT=$([[ $side == R ]] &&
                echo "$REFIT" || echo off)" "$BENCH" --profile "$PROF" --configs "$CONFIGS" --iters "$ITERS" \
                --rounds "$ROUNDS" --size-scale "$sscale" --time-scale "$tscale" --quiet \
                --csv "$OUT/refit-$layout-$RATE-$side$pair.csv" >"$tmp/out" 2>&1 || rc=$?
            ((rc == 0)) || { cat "$tmp/out" >&2; echo "$PROG: dear-bench exit status $rc" >&2; status=1; }
        done
    done
done
emu_down >/dev/null
elapsed=$(($(date +%s) - start))
if ((KEEP_OTHERS)) && [[ -f $OUT/refit.meta ]]; then
    echo "rerun: bench/refit.sh $args: $(meta_date), commit" \
        "$(meta_commit -- . ':!bench/results' ':!docs'), $elapsed s, $(meta_machine)" >>"$OUT/refit.meta"
else {
    echo "command: bench/refit.sh $args"
    echo "date: $(meta_date)"
    echo "commit: $(meta_commit -- . ':!bench/results' ':!docs')"
    echo "cluster: $HOSTS emulated hosts (bench/emucluster), $RATE each way per host; layouts $LAYOUTS"
    echo "case: $PROFILE, communication scaled to ~$COMM_MS ms per iteration, compute to the same;" \
        "$PAIRS pair(s) of jobs per layout, A (DEAR_COST_REFIT=off) and R (=$REFIT) on one calibration," \
        "A first in odd pairs, R first in even"
    echo "machine: $(meta_machine)"
    echo "run: $elapsed s in all"
} >"$OUT/refit.meta"
fi
report
exit $status
