#!/bin/bash
# engine-cost.sh: what a collective costs when the runtime runs it, against the price the
# calibration at commit gave it. Calibration times each collective on the application thread
# before the progress thread starts; training runs them on the progress thread, up to
# DEAR_MAX_INFLIGHT at once, while every rank's application thread sleeps its compute, wakes and
# waits. Where the two differ, every plan of many buckets is mispriced by the difference times
# its collectives.
#
# For each layout and size, a made-up model of --layers layers of one tensor of that size each,
# with so little compute (--compute-us per layer forward, twice that backward) that the channel
# never runs dry: the period is then the collectives' own cost. dear-bench runs it as
#   dear:none  one reduce-scatter and one all-gather per tensor, as many in flight as the
#              progress thread keeps (2 x layers collectives per iteration);
#   sync:none  one all-reduce per tensor, all queued at the end of backward (layers collectives);
# and predicts each with the calibration the layout's first job measured (one cache per layout,
# kept as bench/results/engine-cost-LAYOUT.cal). Writes bench/results/engine-cost-LAYOUT-SIZE.csv
# and engine-cost.meta, then bench/engine-cost-report.py writes the "Collectives as the runtime
# runs them" section of docs/PERFORMANCE.md. Needs root (network namespaces).
set -euo pipefail
PROG="engine-cost.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

HOSTS=4
RATE=1gbit
LAYOUTS="4x1 2x2 2x3"
SIZES="64k 256k 1m"
LAYERS=40
COMPUTE_US=100
ITERS=21
ROUNDS=3
REPORT_ONLY=0
BUILDDIR=
CONFIGS="dear:none;sync:none"
emu_names ec 10.213.62

usage() {
    cat <<EOF
usage: bench/engine-cost.sh [options]
  --builddir DIR    build directory holding apps/bench/dear-bench (default: the current
                    directory if it has it, else the source tree)
  --rate RATE       link rate, tc syntax (default $RATE)
  --layouts LIST    HOSTSxRANKS, hosts <= $HOSTS, at least 2 ranks (default "$LAYOUTS")
  --sizes LIST      tensor sizes, k/m suffixes, 4k..16m (default "$SIZES")
  --layers N        tensors (one per layer) of the made-up model (default $LAYERS)
  --compute-us US   forward compute per layer, backward twice it (default $COMPUTE_US)
  --iters N         measured iterations per configuration (default $ITERS)
  --rounds R        every configuration runs R times in turn (default $ROUNDS)
  --report-only     do not measure; regenerate the section from bench/results/engine-cost-*
  --help            this text
Environment: EMU_PREFIX (default ec), EMU_SUBNET (default 10.213.62).
EOF
}

bench_options --builddir=BUILDDIR --rate=RATE --layouts=LAYOUTS --sizes=SIZES --layers=LAYERS \
    --compute-us=COMPUTE_US --iters=ITERS --rounds=ROUNDS --report-only=REPORT_ONLY! -- "$@"
for n in "$LAYERS" "$COMPUTE_US" "$ITERS" "$ROUNDS"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "bad count '$n': a positive integer"
done
((ROUNDS <= ITERS && LAYERS <= 1000)) || die "want --rounds <= --iters and --layers <= 1000"
# shellcheck disable=SC2086 # a list of words
check_layouts $LAYOUTS
# bytes SIZE: the size in bytes, or nothing when it is not one this script takes.
bytes() {
    local n
    [[ $1 =~ ^([1-9][0-9]*)([km])$ ]] || return 0
    n=$((BASH_REMATCH[1] * 1024))
    [[ ${BASH_REMATCH[2]} == k ]] || n=$((n * 1024))
    ((n >= 4096 && n <= 16777216 && n % 4 == 0)) && echo "$n"
}
for s in $SIZES; do
    [[ -n $(bytes "$s") ]] || die "bad size '$s': 4k..16m, a number with a k or m suffix"
done

args="--rate $RATE --layouts '$LAYOUTS' --sizes '$SIZES' --layers $LAYERS --compute-us $COMPUTE_US"
args+=" --iters $ITERS --rounds $ROUNDS"
((REPORT_ONLY)) && { section_report engine-cost "$args"; exit 0; }
BENCH=$(emu_bench "$BUILDDIR")

# profile SIZE BYTES: the made-up model (docs/FORMATS.md) in $tmp/SIZE.prof.
profile() {
    local f=$tmp/$1.prof fwd bwd i
    fwd=$(awk -v us="$COMPUTE_US" 'BEGIN { printf "%.9g", us * 1e-6 }')
    bwd=$(awk -v us="$COMPUTE_US" 'BEGIN { printf "%.9g", 2 * us * 1e-6 }')
    {
        echo "dear-profile 1"
        echo "model engine-cost-$1"
        for ((i = 0; i < LAYERS; i++)); do echo "layer $i $fwd $bwd"; done
        for ((i = 0; i < LAYERS; i++)); do echo "tensor t$i $i $2"; done
        echo "end $LAYERS $LAYERS"
    } >"$f"
}

# One run's files only: a layout or size left from an earlier run would join the table.
mkdir -p "$RES"
rm -f "$RES"/engine-cost-*.csv "$RES"/engine-cost-*.cal
bench_start
emu_up "$HOSTS" "$RATE" >/dev/null
start=$(date +%s)
status=0
for s in $SIZES; do profile "$s" "$(bytes "$s")"; done
first=${SIZES%% *}
for layout in $LAYOUTS; do
    nh=${layout%x*} rph=${layout#*x}
    np=$((nh * rph))
    hosts=$(emu_hosts "$nh" "$rph")
    cal=$tmp/cal-$layout
    # The calibration every job of the layout is priced by: dear:dp calibrates at commit (only
    # a model-driven planner does), into the cache the later jobs read.
    echo "$PROG: $layout: calibrating"
    rc=0
    emu_mpirun "$np" "$hosts" -x "DEAR_CALIBRATION_FILE=$cal" "$BENCH" --profile "$tmp/$first.prof" \
        --configs dear:dp --iters 1 --rounds 1 --quiet >"$tmp/cal-$layout.out" 2>&1 || rc=$?
    if ((rc != 0)) || [[ ! -s $cal ]]; then
        cat "$tmp/cal-$layout.out" >&2
        echo "$PROG: $layout: calibration failed (dear-bench exit status $rc)" >&2
        status=1
        continue
    fi
    cp "$cal" "$RES/engine-cost-$layout.cal"
    for s in $SIZES; do
        echo "$PROG: $layout, $LAYERS tensors of $s"
        rc=0
        emu_mpirun "$np" "$hosts" -x "DEAR_CALIBRATION_FILE=$cal" "$BENCH" --profile "$tmp/$s.prof" \
            --configs "$CONFIGS" --iters "$ITERS" --rounds "$ROUNDS" --quiet \
            --csv "$RES/engine-cost-$layout-$s.csv" || rc=$?
        ((rc == 0)) || { echo "$PROG: $layout $s: dear-bench exit status $rc" >&2; status=1; }
    done
done
{
    echo "date: $(meta_date)"
    echo "commit: $(meta_commit -- . ':!bench/results' ':!docs')"
    echo "cluster: $HOSTS emulated hosts (bench/emucluster), $RATE each way per host; layouts $LAYOUTS"
    echo "model: $LAYERS layers of one float32 tensor each," \
        "$COMPUTE_US us forward and $((2 * COMPUTE_US)) us backward per layer"
    echo "machine: $(meta_machine)"
    echo "run: $(($(date +%s) - start)) s in all"
} >"$RES/engine-cost.meta"
emu_down >/dev/null
section_report engine-cost "$args"
exit $status
