#!/bin/bash
# first-plan.sh: the plan training starts on before any profile (DEAR_FIRST_PLAN), measured on
# the emulated cluster against the threshold start dear had before it.
#
# For each e2e-matrix model (fusion/profiles, scaled as bench/e2e-matrix.sh scales its balanced
# cases: communication about --comm-ms per iteration, compute equal to it) and layout, two
# dear-bench jobs:
#   train  dear:auto started each way, every configuration a run of --run-iters iterations from
#          dear_init, --rounds times in turn: the time to train the first --first-n iterations and
#          the whole run (slowest rank, median over the rounds). threshold is the old start;
#          range the plan made at commit from the structure (the default); first that plan made
#          again with the first iteration's times. With the model's FLOPs hints (its .model
#          file, as the PyTorch binding gives them from module shapes) and, +nohints, with
#          parameter bytes only.
#   close  how near the first plan is to the plan from the measured profile: dear:auto settled
#          (warm-up, online plan, auto's check) against the first plans held all run (+hold),
#          each a median iteration over --iters measured iterations, with the simulator's
#          prediction of the plan that ran.
# Writes bench/results/first-plan-{train,close}-CASE.csv and first-plan.meta, then
# bench/first-plan-report.py writes the "First plan without a profile" section of
# docs/PERFORMANCE.md. Needs root (network namespaces).
set -euo pipefail

SRCDIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EMU=$SRCDIR/bench/emucluster
PROG=first-plan.sh
RES=$SRCDIR/bench/results

HOSTS=4
RATE=1gbit
COMM_MS=300
RUN_ITERS=60
FIRST_N=30
ITERS=21
ROUNDS=3
PROFILES="resnet50 vgg16 densenet201 bert-base gpt2-small"
LAYOUTS="4x1"
JOBS="train close"
REPORT_ONLY=0
BUILDDIR=
TRAIN_CONFIGS="dear:auto+first=threshold;dear:auto+first=range;dear:auto+first=first;dear:auto+first=range+nohints;dear:auto+first=first+nohints"
CLOSE_CONFIGS="dear:auto;dear:auto+first=range+hold;dear:auto+first=first+hold;dear:auto+first=range+hold+nohints;dear:auto+first=first+hold+nohints"
: "${EMU_PREFIX:=fp}" "${EMU_SUBNET:=10.213.58}"
export EMU_PREFIX EMU_SUBNET

usage() {
    cat <<EOF
usage: bench/first-plan.sh [options]
  --builddir DIR    build directory holding apps/bench/dear-bench (default: the current
                    directory if it has it, else the source tree)
  --rate RATE       link rate, tc syntax (default $RATE)
  --comm-ms MS      communication per iteration after scaling (default $COMM_MS)
  --run-iters N     iterations of each run of the train job (default $RUN_ITERS)
  --first-n N       the train job's time to train the first N iterations (default $FIRST_N)
  --iters N         measured iterations per configuration of the close job (default $ITERS)
  --rounds R        every configuration runs R times in turn (default $ROUNDS)
  --profiles LIST   models, space separated (default: $PROFILES)
  --layouts LIST    HOSTSxRANKS, hosts <= 4 (default "$LAYOUTS")
  --jobs LIST       train, close or both (default "$JOBS")
  --report-only     do not measure; regenerate the section from bench/results/first-plan-*.csv
  --help            this text
Environment: EMU_PREFIX (default fp), EMU_SUBNET (default 10.213.58).
EOF
}

die() { echo "$PROG: $*" >&2; exit 1; }
# shellcheck source=bench/bench-lib.sh
. "$SRCDIR/bench/bench-lib.sh"

while [[ $# -gt 0 ]]; do
    case $1 in
        --builddir) BUILDDIR=${2:?--builddir needs a directory}; shift 2 ;;
        --rate) RATE=${2:?--rate needs a rate}; shift 2 ;;
        --comm-ms) COMM_MS=${2:?--comm-ms needs milliseconds}; shift 2 ;;
        --run-iters) RUN_ITERS=${2:?--run-iters needs a count}; shift 2 ;;
        --first-n) FIRST_N=${2:?--first-n needs a count}; shift 2 ;;
        --iters) ITERS=${2:?--iters needs a count}; shift 2 ;;
        --rounds) ROUNDS=${2:?--rounds needs a count}; shift 2 ;;
        --profiles) PROFILES=${2:?--profiles needs a list}; shift 2 ;;
        --layouts) LAYOUTS=${2:?--layouts needs a list}; shift 2 ;;
        --jobs) JOBS=${2:?--jobs needs a list}; shift 2 ;;
        --report-only) REPORT_ONLY=1; shift ;;
        --help | -h) usage; exit 0 ;;
        *) usage >&2; die "unknown option '$1'" ;;
    esac
done
for n in "$RUN_ITERS" "$FIRST_N" "$ITERS" "$ROUNDS"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "bad count '$n'"
done
((FIRST_N <= RUN_ITERS && ROUNDS <= ITERS)) || die "want --first-n <= --run-iters and --rounds <= --iters"
for j in $JOBS; do [[ $j == train || $j == close ]] || die "bad job '$j': train or close"; done
for l in $LAYOUTS; do
    [[ $l =~ ^([1-4])x([1-8])$ ]] && ((BASH_REMATCH[1] * BASH_REMATCH[2] >= 2)) ||
        die "bad layout '$l': expected HOSTSxRANKS with 1-$HOSTS hosts and at least 2 ranks"
done
for p in $PROFILES; do
    [[ -f $SRCDIR/fusion/profiles/$p.prof && -f $SRCDIR/fusion/profiles/$p.model ]] ||
        die "no fusion/profiles/$p.prof and $p.model"
done

report() {
    python3 "$SRCDIR/bench/first-plan-report.py" --results "$RES" --doc "$SRCDIR/docs/PERFORMANCE.md" \
        --command "bench/first-plan.sh $*"
}
args="--rate $RATE --comm-ms $COMM_MS --run-iters $RUN_ITERS --first-n $FIRST_N --iters $ITERS --rounds $ROUNDS --profiles '$PROFILES' --layouts '$LAYOUTS'"
if ((REPORT_ONLY)); then
    report "$args"
    exit 0
fi

BENCH=$(dear_bench_path "$BUILDDIR")
[[ $EUID -eq 0 ]] || die "needs root to create network namespaces"

mkdir -p "$RES"
cleanup() { "$EMU" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
"$EMU" up "$HOSTS" "$RATE"
start=$(date +%s)
status=0
for layout in $LAYOUTS; do
    nh=${layout%x*} rph=${layout#*x}
    np=$((nh * rph))
    hosts=$(seq -s, -f "${EMU_PREFIX}%g:$rph" 1 "$nh")
    for prof in $PROFILES; do
        case=$prof-$layout
        read -r sscale tscale < <(python3 "$SRCDIR/bench/e2e-report.py" scale \
            --profile "$SRCDIR/fusion/profiles/$prof.prof" --rate "$RATE" --np "$np" --hosts "$nh" \
            --comm-ms "$COMM_MS" --ratio 1)
        common=(--profile "$SRCDIR/fusion/profiles/$prof.prof" --hints "$SRCDIR/fusion/profiles/$prof.model"
                --size-scale "$sscale" --time-scale "$tscale" --quiet)
        for job in $JOBS; do
            echo "$PROG: $case, $job job (size x $sscale, time x $tscale)"
            if [[ $job == train ]]; then
                set -- --configs "$TRAIN_CONFIGS" --warmup 0 --iters $((RUN_ITERS * ROUNDS)) --rounds "$ROUNDS" \
                    --first-n "$FIRST_N"
            else
                set -- --configs "$CLOSE_CONFIGS" --iters "$ITERS" --rounds "$ROUNDS"
            fi
            rc=0
            "$EMU" mpirun -np "$np" --host "$hosts" "$BENCH" "${common[@]}" "$@" \
                --csv "$RES/first-plan-$job-$case.csv" || rc=$?
            ((rc == 0)) || { echo "$PROG: $case $job: dear-bench exit status $rc" >&2; status=1; }
        done
    done
done
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "commit: $(git -C "$SRCDIR" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$SRCDIR" diff --quiet -- . ':!bench/results' ':!docs' 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "cluster: $HOSTS emulated hosts (bench/emucluster), $RATE each way per host; layouts $LAYOUTS"
    echo "machine: $(nproc) cores, $(uname -sr), $(mpirun --version 2>/dev/null | head -n 1)"
    echo "jobs: $JOBS; $(($(date +%s) - start)) s in all"
} >"$RES/first-plan.meta"
"$EMU" down
report "$args"
exit $status
