#!/bin/bash
# ab-builds.sh: two builds of libdear side by side on the emulated cluster, alternately.
#
# Runs bench/e2e-matrix.sh (end to end: dear-bench) and bench/coll-perf.sh (collectives:
# dear-coll-bench) against build A, then build B, then A again, ... --rounds times, each from a
# scratch copy of this source tree so the repository's results and docs are left alone, and
# prints the ratio B/A of the medians over the rounds: per case and configuration the median
# iteration time, per algorithm and size the median busbw. A ratio near 1 on every row says that a
# change left behaviour as it was; one run's noise is the spread across rounds, printed with it.
#
#   bench/ab-builds.sh --a /work/base --b . [--rounds 3] [--cases "..."] [--no-coll]
set -euo pipefail

SRCDIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROG=ab-builds.sh
A= B= ROUNDS=3 NOCOLL=0 NOE2E=0 CMAX=16m
CASES="resnet50-balanced-2x2 bert-base-balanced-2x2 gpt2-small-balanced-4x1"
CONFIGS="wfbp:threshold:64m;dear:threshold:25m;dear:auto"
ITERS=12
OUT=

usage() {
    cat <<EOF
usage: bench/ab-builds.sh --a BUILDDIR --b BUILDDIR [options]
  --rounds N      A then B, N times (default $ROUNDS)
  --cases "..."   e2e-matrix cases (default "$CASES")
  --configs LIST  dear-bench configurations (default "$CONFIGS")
  --iters N       measured iterations per configuration and run (default $ITERS)
  --no-coll       skip the collectives
  --no-e2e        skip the end-to-end runs
  --coll-max SIZE largest collective (default $CMAX)
  --out DIR       keep every run's CSVs there (default: a temporary directory, removed)
Needs root (bench/emucluster). Each round takes a few minutes per case.
EOF
}

while [[ $# -gt 0 ]]; do
    case $1 in
        --a) A=${2:?}; shift 2 ;;
        --b) B=${2:?}; shift 2 ;;
        --rounds) ROUNDS=${2:?}; shift 2 ;;
        --cases) CASES=${2:?}; shift 2 ;;
        --configs) CONFIGS=${2:?}; shift 2 ;;
        --iters) ITERS=${2:?}; shift 2 ;;
        --no-coll) NOCOLL=1; shift ;;
        --no-e2e) NOE2E=1; shift ;;
        --coll-max) CMAX=${2:?}; shift 2 ;;
        --out) OUT=${2:?}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; echo "$PROG: unknown option '$1'" >&2; exit 2 ;;
    esac
done
[[ -n $A && -n $B ]] || { usage >&2; exit 2; }
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "$PROG: bad --rounds '$ROUNDS': expected a count >= 1" >&2; exit 2; }
A=$(cd "$A" && pwd) B=$(cd "$B" && pwd)
for d in "$A" "$B"; do
    [[ -x $d/apps/bench/dear-bench ]] || { echo "$PROG: $d/apps/bench/dear-bench is not built" >&2; exit 1; }
done

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
[[ -n $OUT ]] || OUT=$scratch/out
mkdir -p "$OUT"
# Every run from the same scripts: this tree's, copied (its results and docs stay untouched).
src=$scratch/src
mkdir -p "$src"
(cd "$SRCDIR" && tar -cf - bench/*.sh bench/*.py bench/emucluster fusion/profiles docs/PERFORMANCE.md) | tar -xf - -C "$src"

for r in $(seq 1 "$ROUNDS"); do
    for side in a b; do
        dir=$A
        [[ $side == b ]] && dir=$B
        echo "$PROG: round $r, build $side ($dir)"
        if ((!NOE2E)); then
            "$src/bench/e2e-matrix.sh" --builddir "$dir" --cases "$CASES" --configs "$CONFIGS" --iters "$ITERS" \
                --rounds 1 --sparse-profiles "" >"$OUT/e2e-$side-$r.log" 2>&1 ||
                { tail -20 "$OUT/e2e-$side-$r.log"; echo "$PROG: e2e-matrix failed (build $side)" >&2; exit 1; }
            mkdir -p "$OUT/e2e-$side-$r"
            cp "$src"/bench/results/e2e-*.csv "$OUT/e2e-$side-$r/"
        fi
        if ((!NOCOLL)); then
            "$src/bench/coll-perf.sh" --builddir "$dir" --max "$CMAX" --overlap 0 >"$OUT/coll-$side-$r.log" 2>&1 ||
                { tail -20 "$OUT/coll-$side-$r.log"; echo "$PROG: coll-perf failed (build $side)" >&2; exit 1; }
            mkdir -p "$OUT/coll-$side-$r"
            cp "$src"/bench/results/coll-*.csv "$OUT/coll-$side-$r/"
        fi
    done
done
python3 "$SRCDIR/bench/ab-report.py" "$OUT" "$ROUNDS"
