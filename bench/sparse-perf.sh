#!/bin/bash
# sparse-perf.sh: block-sparse against dense collectives on the emulated cluster, over densities.
#
# Brings up the emulated cluster (4 hosts at 1 Gbit/s by default, one rank each, its own prefix
# and subnet), runs dear-coll-bench once per density with --density D: every rank zeroes each
# block of its input with probability 1 - D (its own pattern), and the dense algorithm the
# selection table picks (`auto`) and the block-sparse one (`sparse`) run on the same data, in
# turn, for each size. Then tears the cluster down, keeps bench/results/sparse-NxRATE.csv and
# regenerates the "Sparse collectives" section of docs/PERFORMANCE.md (bench/sparse-report.py).
# --report-only redoes the last step from the kept CSV.
# With --ranks-per-host R >= 2 the dense algorithm is hier, and each density also runs the
# exchange forced (DEAR_SPARSE_AGREE above every vector: no agreement, no fall-back; rows named
# `exchange`), what a rule counting the bytes per rank alone would run; the results go to
# bench/results/sparse-HxRxRATE.csv and the "Sparse collectives with several ranks per host"
# section.
set -euo pipefail
PROG="sparse-perf.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

HOSTS=4
RPH=1
RATE=1gbit
MIN=4m
MAX=64m
ITERS=5
ROUNDS=1
WARMUP=1
BLOCK=256
DENSITIES="0.001 0.01 0.05 0.2 0.5 1"
BUILDDIR=
REPORT_ONLY=0
emu_names s 10.213.51

usage() {
    cat <<EOF
usage: bench/sparse-perf.sh [options]
  --builddir DIR    build directory holding apps/tools/dear-coll-bench (default: the current
                    directory if it has it, else the source tree)
  --hosts N         emulated hosts (default $HOSTS)
  --ranks-per-host R
                    ranks on each host (default $RPH); from 2, the exchange forced runs too
  --rate RATE       link rate, tc syntax (default $RATE)
  --min BYTES       smallest vector (default $MIN; k, m, g suffixes: 1024-based)
  --max BYTES       largest vector, reached by doubling (default $MAX)
  --iters N         timed iterations per row, median reported (default $ITERS)
  --rounds N        every density (and the forced exchange) N times in turn; the report takes
                    the median over the rounds, so that a slow spell of the link spoils a part of
                    each column, not one whole (default $ROUNDS)
  --warmup N        untimed iterations per row (default $WARMUP)
  --block N         elements per block (default $BLOCK)
  --densities LIST  fractions of non-zero blocks per rank (default "$DENSITIES")
  --report-only     do not measure; regenerate docs/PERFORMANCE.md from the kept CSV
  --help            this text
Environment: EMU_PREFIX (default $EMU_PREFIX), EMU_SUBNET (default $EMU_SUBNET).
Writes bench/results/sparse-NxRATE.{csv,meta} (sparse-NxRxRATE with R ranks per host) and the
"Sparse collectives" section (with R: "... with several ranks per host") of
docs/PERFORMANCE.md. Needs root (network namespaces); about 10 minutes at the defaults.
EOF
}

bench_options --builddir=BUILDDIR --hosts=HOSTS --ranks-per-host=RPH --rate=RATE --min=MIN --max=MAX --iters=ITERS \
    --rounds=ROUNDS \
    --warmup=WARMUP --block=BLOCK --densities=DENSITIES --report-only=REPORT_ONLY! -- "$@"
[[ $HOSTS =~ ^[0-9]+$ ]] && ((HOSTS >= 2)) || die "bad --hosts '$HOSTS': expected 2 or more"
[[ $RPH =~ ^[0-9]+$ ]] && ((RPH >= 1 && RPH <= 8)) || die "bad --ranks-per-host '$RPH': expected 1 to 8"
[[ $ROUNDS =~ ^[0-9]+$ ]] && ((ROUNDS >= 1)) || die "bad --rounds '$ROUNDS': expected a count >= 1"
[[ $ITERS =~ ^[0-9]+$ && $WARMUP =~ ^[0-9]+$ && $BLOCK =~ ^[0-9]+$ ]] && ((ITERS >= 1 && BLOCK >= 1)) ||
    die "bad --iters/--warmup/--block '$ITERS'/'$WARMUP'/'$BLOCK': expected counts (iters, block >= 1)"
for d in $DENSITIES; do
    [[ $d =~ ^(0|1|0?\.[0-9]+|1\.0*)$ ]] || die "bad density '$d' in --densities: expected a fraction in [0, 1]"
done

TAG=${HOSTS}x$RATE
((RPH > 1)) && TAG=${HOSTS}x${RPH}x$RATE
CSV=$RES/sparse-$TAG.csv
META=$RES/sparse-$TAG.meta
report() {
    local more=() rph=
    ((RPH > 1)) && more=(--hosts-section) rph=" --ranks-per-host $RPH"
    python3 "$SRCDIR/bench/sparse-report.py" --csv "$CSV" --meta "$META" --doc "$DOC" "${more[@]}" \
        --command "bench/sparse-perf.sh --hosts $HOSTS$rph --rate $RATE --min $MIN --max $MAX --iters $ITERS$( ((ROUNDS > 1)) && echo " --rounds $ROUNDS") --warmup $WARMUP --block $BLOCK --densities '$DENSITIES'"
}
if ((REPORT_ONLY)); then
    [[ -f $CSV ]] || die "no $CSV: run without --report-only first"
    report
    exit 0
fi

BENCH=$(bench_prog "$BUILDDIR" apps/tools/dear-coll-bench "build it (make apps/tools/dear-coll-bench)")
[[ $EUID -eq 0 ]] || die "needs root to create network namespaces"

mkdir -p "$RES"
bench_start

emu_up "$HOSTS" "$RATE"
hosts=$(emu_hosts "$HOSTS" "$( ((RPH > 1)) && echo "$RPH")")
np=$((HOSTS * RPH))
start=$(date +%s)
first=1
for r in $(seq "$ROUNDS"); do
for d in $DENSITIES; do
    echo "$PROG: density $d (round $r of $ROUNDS)"
    emu_mpirun "$np" "$hosts" "$BENCH" --min "$MIN" --max "$MAX" --iters "$ITERS" \
        --warmup "$WARMUP" --algos auto,sparse --density "$d" --block "$BLOCK" --csv "$tmp/d.csv"
    [[ -s $tmp/d.csv ]] || die "dear-coll-bench --density $d wrote no CSV"
    # One CSV for all densities: dear-coll-bench's columns with the density and block first.
    if ((first)); then echo "density,block,$(head -n 1 "$tmp/d.csv")"; fi >>"$tmp/all.csv"
    tail -n +2 "$tmp/d.csv" | sed "s/^/$d,$BLOCK,/" >>"$tmp/all.csv"
    first=0
    ((RPH > 1)) || continue
    emu_mpirun "$np" "$hosts" -x DEAR_SPARSE_AGREE=1073741824 "$BENCH" --min "$MIN" --max "$MAX" \
        --iters "$ITERS" --warmup "$WARMUP" --algos sparse --density "$d" --block "$BLOCK" --csv "$tmp/d.csv"
    [[ -s $tmp/d.csv ]] || die "dear-coll-bench --density $d (the exchange forced) wrote no CSV"
    tail -n +2 "$tmp/d.csv" | sed -e "s/^/$d,$BLOCK,/" -e "s/,sparse,/,exchange,/" >>"$tmp/all.csv"
done
done
{
    echo "date: $(meta_date)"
    echo "commit: $(meta_commit -- . ':!bench/results')"
    echo "cluster: $HOSTS hosts, $RATE each way per host (bench/emucluster), $RPH rank(s) per host"
    echo "machine: $(meta_machine)"
    echo "bench: $ROUNDS round(s) of dear-coll-bench --min $MIN --max $MAX --iters $ITERS --warmup $WARMUP --algos auto,sparse --block $BLOCK, --density in $DENSITIES$( ((RPH > 1)) && echo "; then --algos sparse with DEAR_SPARSE_AGREE=1073741824 (exchange)") ($(($(date +%s) - start)) s in all)"
} >"$tmp/meta"
cp "$tmp/all.csv" "$CSV"
cp "$tmp/meta" "$META"
emu_down
report
echo "$PROG: wrote $CSV and docs/PERFORMANCE.md"
