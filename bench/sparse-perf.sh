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
set -euo pipefail

SRCDIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EMU=$SRCDIR/bench/emucluster
PROG=sparse-perf.sh

HOSTS=4
RATE=1gbit
MIN=4m
MAX=64m
ITERS=5
WARMUP=1
BLOCK=256
DENSITIES="0.001 0.01 0.05 0.2 0.5 1"
BUILDDIR=
REPORT_ONLY=0
: "${EMU_PREFIX:=s}" "${EMU_SUBNET:=10.213.51}"
export EMU_PREFIX EMU_SUBNET

usage() {
    cat <<EOF
usage: bench/sparse-perf.sh [options]
  --builddir DIR    build directory holding apps/tools/dear-coll-bench (default: the current
                    directory if it has it, else the source tree)
  --hosts N         emulated hosts, one rank each (default $HOSTS)
  --rate RATE       link rate, tc syntax (default $RATE)
  --min BYTES       smallest vector (default $MIN; k, m, g suffixes: 1024-based)
  --max BYTES       largest vector, reached by doubling (default $MAX)
  --iters N         timed iterations per row, median reported (default $ITERS)
  --warmup N        untimed iterations per row (default $WARMUP)
  --block N         elements per block (default $BLOCK)
  --densities LIST  fractions of non-zero blocks per rank (default "$DENSITIES")
  --report-only     do not measure; regenerate docs/PERFORMANCE.md from the kept CSV
  --help            this text
Environment: EMU_PREFIX (default $EMU_PREFIX), EMU_SUBNET (default $EMU_SUBNET).
Writes bench/results/sparse-NxRATE.{csv,meta} and the "Sparse collectives" section of
docs/PERFORMANCE.md. Needs root (network namespaces); about 10 minutes at the defaults.
EOF
}

die() { echo "$PROG: $*" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --builddir) BUILDDIR=${2:?--builddir needs a directory}; shift 2 ;;
        --hosts) HOSTS=${2:?--hosts needs a number}; shift 2 ;;
        --rate) RATE=${2:?--rate needs a rate}; shift 2 ;;
        --min) MIN=${2:?--min needs bytes}; shift 2 ;;
        --max) MAX=${2:?--max needs bytes}; shift 2 ;;
        --iters) ITERS=${2:?--iters needs a count}; shift 2 ;;
        --warmup) WARMUP=${2:?--warmup needs a count}; shift 2 ;;
        --block) BLOCK=${2:?--block needs a count}; shift 2 ;;
        --densities) DENSITIES=${2:?--densities needs a list}; shift 2 ;;
        --report-only) REPORT_ONLY=1; shift ;;
        --help | -h) usage; exit 0 ;;
        *) usage >&2; die "unknown option '$1'" ;;
    esac
done
[[ $HOSTS =~ ^[0-9]+$ ]] && ((HOSTS >= 2)) || die "bad --hosts '$HOSTS': expected 2 or more"
[[ $ITERS =~ ^[0-9]+$ && $WARMUP =~ ^[0-9]+$ && $BLOCK =~ ^[0-9]+$ ]] && ((ITERS >= 1 && BLOCK >= 1)) ||
    die "bad --iters/--warmup/--block '$ITERS'/'$WARMUP'/'$BLOCK': expected counts (iters, block >= 1)"
for d in $DENSITIES; do
    [[ $d =~ ^(0|1|0?\.[0-9]+|1\.0*)$ ]] || die "bad density '$d' in --densities: expected a fraction in [0, 1]"
done

RES=$SRCDIR/bench/results
TAG=${HOSTS}x$RATE
CSV=$RES/sparse-$TAG.csv
META=$RES/sparse-$TAG.meta
report() {
    python3 "$SRCDIR/bench/sparse-report.py" --csv "$CSV" --meta "$META" --doc "$SRCDIR/docs/PERFORMANCE.md" \
        --command "bench/sparse-perf.sh --hosts $HOSTS --rate $RATE --min $MIN --max $MAX --iters $ITERS --warmup $WARMUP --block $BLOCK --densities '$DENSITIES'"
}
if ((REPORT_ONLY)); then
    [[ -f $CSV ]] || die "no $CSV: run without --report-only first"
    report
    exit 0
fi

if [[ -z $BUILDDIR ]]; then
    for d in "$PWD" "$SRCDIR"; do
        [[ -x $d/apps/tools/dear-coll-bench ]] && { BUILDDIR=$d; break; }
    done
    [[ -n $BUILDDIR ]] || die "apps/tools/dear-coll-bench not found in $PWD or $SRCDIR: build it or pass --builddir"
fi
BENCH=$(cd "$BUILDDIR" && pwd)/apps/tools/dear-coll-bench
[[ -x $BENCH ]] || die "$BENCH is not built (make apps/tools/dear-coll-bench)"
[[ $EUID -eq 0 ]] || die "needs root to create network namespaces"

mkdir -p "$RES"
tmp=$(mktemp -d)
cleanup() { "$EMU" down >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

"$EMU" up "$HOSTS" "$RATE"
hosts=$(seq -s, -f "${EMU_PREFIX}%g" 1 "$HOSTS")
start=$(date +%s)
first=1
for d in $DENSITIES; do
    echo "$PROG: density $d"
    "$EMU" mpirun -np "$HOSTS" --host "$hosts" "$BENCH" --min "$MIN" --max "$MAX" --iters "$ITERS" \
        --warmup "$WARMUP" --algos auto,sparse --density "$d" --block "$BLOCK" --csv "$tmp/d.csv"
    [[ -s $tmp/d.csv ]] || die "dear-coll-bench --density $d wrote no CSV"
    # One CSV for all densities: dear-coll-bench's columns with the density and block first.
    if ((first)); then echo "density,block,$(head -n 1 "$tmp/d.csv")"; fi >>"$tmp/all.csv"
    tail -n +2 "$tmp/d.csv" | sed "s/^/$d,$BLOCK,/" >>"$tmp/all.csv"
    first=0
done
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "commit: $(git -C "$SRCDIR" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$SRCDIR" diff --quiet -- . ':!bench/results' 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "cluster: $HOSTS hosts, $RATE each way per host (bench/emucluster), one rank per host"
    echo "machine: $(nproc) cores, $(uname -sr), $(mpirun --version 2>/dev/null | head -n 1)"
    echo "bench: dear-coll-bench --min $MIN --max $MAX --iters $ITERS --warmup $WARMUP --algos auto,sparse --block $BLOCK, --density in $DENSITIES ($(($(date +%s) - start)) s in all)"
} >"$tmp/meta"
cp "$tmp/all.csv" "$CSV"
cp "$tmp/meta" "$META"
"$EMU" down
report
echo "$PROG: wrote $CSV and docs/PERFORMANCE.md"
