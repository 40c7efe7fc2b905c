#!/bin/bash
# ab-builds.sh: two builds of libdear side by side on the emulated cluster, alternately.
#
# Runs bench/e2e-matrix.sh (end to end: dear-bench) and bench/coll-perf.sh (collectives:
# dear-coll-bench), and with --engine-cost bench/engine-cost.sh (streams of equal collectives as
# training runs them), against build A, then build B, then A again, ... --rounds times, each from a
# scratch copy of this source tree so the repository's results and docs are left alone, and
# prints the ratio B/A of the medians over the rounds: per case and configuration the median
# iteration time, per algorithm and size the median busbw. A ratio near 1 on every row says that a
# change left behaviour as it was; one run's noise is the spread across rounds, printed with it.
#
#   bench/ab-builds.sh --a /work/base --b . [--rounds 3] [--cases "..."] [--no-coll]
set -euo pipefail
PROG="ab-builds.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
BENCH_USAGE_RC=2
A='' B='' ROUNDS=3 NOCOLL=0 NOE2E=0 CMAX=16m ENGINE=
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
  --engine-cost "LAYOUTS"  also bench/engine-cost.sh on these layouts (its sizes 64k and 256k);
                  its rows are the e2e rows named engine-cost-LAYOUT-SIZE
  --out DIR       keep every run's CSVs there (default: a temporary directory, removed)
Needs root (bench/emucluster). Each round takes a few minutes per case.
EOF
}

bench_options --a=A --b=B --rounds=ROUNDS --cases=CASES --configs=CONFIGS --iters=ITERS --no-coll=NOCOLL! \
    --no-e2e=NOE2E! --coll-max=CMAX --engine-cost=ENGINE --out=OUT -- "$@"
[[ -n $A && -n $B ]] || { usage >&2; exit 2; }
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || usage_error "bad --rounds '$ROUNDS': expected a count >= 1"
A=$(bench_builddir "$A" apps/bench/dear-bench)
B=$(bench_builddir "$B" apps/bench/dear-bench)

bench_start
scratch=$tmp
[[ -n $OUT ]] || OUT=$scratch/out
mkdir -p "$OUT"
# Every run from the same scripts: this tree's, copied (its results and docs stay untouched).
src=$scratch/src
mkdir -p "$src"
(cd "$SRCDIR" && tar -cf - bench/*.sh bench/*.py bench/emucluster fusion/profiles docs/PERFORMANCE.md) | tar -xf - -C "$src"

# run ROUND SIDE: both benchmarks against build SIDE (a or b), their CSVs kept under $OUT.
run() {
    local r=$1 side=$2 dir=$A
    [[ $side == b ]] && dir=$B
    echo "$PROG: round $r, build $side ($dir)"
    if ((!NOE2E)); then
        "$src/bench/e2e-matrix.sh" --builddir "$dir" --cases "$CASES" --configs "$CONFIGS" --iters "$ITERS" \
            --rounds 1 --sparse-profiles "" >"$OUT/e2e-$side-$r.log" 2>&1 ||
            { tail -20 "$OUT/e2e-$side-$r.log"; die "e2e-matrix failed (build $side)"; }
        mkdir -p "$OUT/e2e-$side-$r"
        cp "$src"/bench/results/e2e-*.csv "$OUT/e2e-$side-$r/"
    fi
    if [[ -n $ENGINE ]]; then
        "$src/bench/engine-cost.sh" --builddir "$dir" --layouts "$ENGINE" --sizes "64k 256k" --iters "$ITERS" \
            --rounds 1 >"$OUT/engine-$side-$r.log" 2>&1 ||
            { tail -20 "$OUT/engine-$side-$r.log"; die "engine-cost failed (build $side)"; }
        mkdir -p "$OUT/e2e-$side-$r"
        for f in "$src"/bench/results/engine-cost-*-*.csv; do cp "$f" "$OUT/e2e-$side-$r/e2e-${f##*/}"; done
    fi
    if ((!NOCOLL)); then
        "$src/bench/coll-perf.sh" --builddir "$dir" --max "$CMAX" --overlap 0 >"$OUT/coll-$side-$r.log" 2>&1 ||
            { tail -20 "$OUT/coll-$side-$r.log"; die "coll-perf failed (build $side)"; }
        mkdir -p "$OUT/coll-$side-$r"
        cp "$src"/bench/results/coll-*.csv "$OUT/coll-$side-$r/"
    fi
}
bench_rounds "$ROUNDS" run a b
python3 "$SRCDIR/bench/ab-report.py" "$OUT" "$ROUNDS"
