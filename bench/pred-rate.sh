#!/bin/bash
# pred-rate.sh: is the simulator's miss with several ranks per host a matter of the layout, or of
# the bytes per second the hosts' cores must move? Runs one profile's case on each layout at each
# link rate, scaled as bench/e2e-matrix.sh scales it (the same ~--comm-ms of communication per
# iteration at every rate, so a slower link means fewer bytes per second), --runs times, each job
# calibrating afresh (so two runs also show how far two calibrations price the same plans apart).
# Around every job it reads the first emulated host's byte counters: its loopback, which carries
# the traffic between ranks of that host (the socket transport connects them by TCP), and its
# link; and the machine's CPU time from /proc/stat (the emulated hosts share its cores).
# Writes bench/results/pred-rate-LAYOUT-RATE-RUN.csv (dear-bench's rows) and .io (the counters),
# and pred-rate.meta; then bench/pred-rate-report.py writes the "Predictions against bytes per
# second" section of docs/PERFORMANCE.md. Needs root (network namespaces).
set -euo pipefail
PROG="pred-rate.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

HOSTS=4
RATES="250mbit 1gbit"
LAYOUTS="4x1 2x2 2x3"
PROFILE=resnet50
CONFIGS="dear:threshold:25m;dear:dp;dear:gradssa;wfbp:mgwfbp"
COMM_MS=300
RUNS=2
ITERS=21
ROUNDS=3
REPORT_ONLY=0
BUILDDIR=
ENVS=
emu_names pr 10.213.63

usage() {
    cat <<EOF
usage: bench/pred-rate.sh [options]
  --builddir DIR    build directory holding apps/bench/dear-bench (default: the current
                    directory if it has it, else the source tree)
  --rates LIST      link rates, tc syntax (default "$RATES")
  --layouts LIST    HOSTSxRANKS, hosts <= $HOSTS, at least 2 ranks (default "$LAYOUTS")
  --profile NAME    fusion/profiles/NAME.prof (default $PROFILE)
  --configs LIST    dear-bench --configs (default "$CONFIGS")
  --comm-ms MS      communication per iteration the case is scaled to (default $COMM_MS)
  --runs N          jobs per layout and rate, each calibrating afresh (default $RUNS)
  --iters N         measured iterations per configuration and job (default $ITERS)
  --rounds R        every configuration runs R times in turn within a job (default $ROUNDS)
  --env LIST        DEAR_NAME=VALUE settings for every rank, space-separated (default none),
                    e.g. DEAR_SOCKET_SHM_BYTES=4m
  --report-only     do not measure; regenerate the section from bench/results/pred-rate-*
  --help            this text
Environment: EMU_PREFIX (default pr), EMU_SUBNET (default 10.213.63).
EOF
}

bench_options --builddir=BUILDDIR --rates=RATES --layouts=LAYOUTS --profile=PROFILE --configs=CONFIGS \
    --comm-ms=COMM_MS --runs=RUNS --iters=ITERS --rounds=ROUNDS --env=ENVS --report-only=REPORT_ONLY! -- "$@"
for n in "$COMM_MS" "$RUNS" "$ITERS" "$ROUNDS"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "bad count '$n': a positive integer"
done
((ROUNDS <= ITERS)) || die "want --rounds <= --iters"
for r in $RATES; do
    [[ $r =~ ^[1-9][0-9]*(\.[0-9]+)?(kbit|mbit|gbit)$ ]] || die "bad rate '$r': e.g. 250mbit, 1gbit"
done
# shellcheck disable=SC2086 # a list of words
check_layouts $LAYOUTS
xenv=()
for e in $ENVS; do
    [[ $e =~ ^DEAR_[A-Z0-9_]+=[^[:space:]]*$ ]] || die "bad --env '$e': DEAR_NAME=VALUE"
    xenv+=(-x "$e")
done
PROF=$SRCDIR/fusion/profiles/$PROFILE.prof
[[ -r $PROF ]] || die "no profile $PROF"

args="--rates '$RATES' --layouts '$LAYOUTS' --profile $PROFILE --comm-ms $COMM_MS --runs $RUNS"
args+=" --iters $ITERS --rounds $ROUNDS"
[[ -z $ENVS ]] || args+=" --env '$ENVS'"
((REPORT_ONLY)) && { section_report pred-rate "$args"; exit 0; }
BENCH=$(emu_bench "$BUILDDIR")

# counters: the first host's loopback and link bytes sent, and the machine's busy and total CPU
# ticks, on one line.
counters() {
    local lo eth
    read -r lo eth < <("$EMU" exec "${EMU_PREFIX}1" cat /proc/net/dev |
        awk '$1 == "lo:" { lo = $10 } $1 == "eth0:" { eth = $10 } END { print lo + 0, eth + 0 }')
    awk -v lo="$lo" -v eth="$eth" '$1 == "cpu" { t = 0; for (i = 2; i <= NF; i++) t += $i;
        printf "%s %s %d %d\n", lo, eth, t - $5 - $6, t }' /proc/stat
}

# One run's files only: a layout, rate or run left from an earlier run would join the table.
mkdir -p "$RES"
rm -f "$RES"/pred-rate-*.csv "$RES"/pred-rate-*.io
bench_start
start=$(date +%s)
status=0
for rate in $RATES; do
    emu_up "$HOSTS" "$rate" >/dev/null
    for layout in $LAYOUTS; do
        nh=${layout%x*} rph=${layout#*x}
        np=$((nh * rph))
        hosts=$(emu_hosts "$nh" "$rph")
        read -r sscale tscale < <(e2e_scale "$PROF" "$rate" "$np" "$nh" "$COMM_MS" 1)
        for ((run = 1; run <= RUNS; run++)); do
            out=$RES/pred-rate-$layout-$rate-$run
            echo "$PROG: $PROFILE on $layout at $rate, run $run (size x $sscale, time x $tscale)"
            rm -f "$tmp/cal"
            c0=$(counters)
            rc=0
            emu_mpirun "$np" "$hosts" -x "DEAR_CALIBRATION_FILE=$tmp/cal" "${xenv[@]}" "$BENCH" --profile "$PROF" \
                --configs "$CONFIGS" --iters "$ITERS" --rounds "$ROUNDS" --size-scale "$sscale" \
                --time-scale "$tscale" --quiet --csv "$out.csv" >"$tmp/out" 2>&1 || rc=$?
            c1=$(counters)
            ((rc == 0)) || { cat "$tmp/out" >&2; echo "$PROG: dear-bench exit status $rc" >&2; status=1; }
            { echo "lo_bytes link_bytes cpu_busy cpu_total"; paste -d' ' <(echo "$c0") <(echo "$c1") |
                awk '{ print $5 - $1, $6 - $2, $7 - $3, $8 - $4 }'; } >"$out.io"
        done
    done
    emu_down >/dev/null
done
{
    echo "date: $(meta_date)"
    echo "commit: $(meta_commit -- . ':!bench/results' ':!docs')"
    echo "cluster: $HOSTS emulated hosts (bench/emucluster), rates $RATES each way per host; layouts $LAYOUTS"
    echo "case: $PROFILE, communication scaled to ~$COMM_MS ms per iteration at each rate," \
        "compute to the same; $RUNS job(s) per layout and rate, each calibrating afresh"
    echo "machine: $(meta_machine)"
    echo "run: $(($(date +%s) - start)) s in all"
} >"$RES/pred-rate.meta"
section_report pred-rate "$args"
exit $status
