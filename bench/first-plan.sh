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
PROG="first-plan.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

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
emu_names fp 10.213.58

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

bench_options --builddir=BUILDDIR --rate=RATE --comm-ms=COMM_MS --run-iters=RUN_ITERS --first-n=FIRST_N \
    --iters=ITERS --rounds=ROUNDS --profiles=PROFILES --layouts=LAYOUTS --jobs=JOBS --report-only=REPORT_ONLY! \
    -- "$@"
for n in "$RUN_ITERS" "$FIRST_N" "$ITERS" "$ROUNDS"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "bad count '$n'"
done
((FIRST_N <= RUN_ITERS && ROUNDS <= ITERS)) || die "want --first-n <= --run-iters and --rounds <= --iters"
for j in $JOBS; do [[ $j == train || $j == close ]] || die "bad job '$j': train or close"; done
# shellcheck disable=SC2086 # a list of words
check_layouts $LAYOUTS
for p in $PROFILES; do
    [[ -f $SRCDIR/fusion/profiles/$p.prof && -f $SRCDIR/fusion/profiles/$p.model ]] ||
        die "no fusion/profiles/$p.prof and $p.model"
done

report() {
    python3 "$SRCDIR/bench/first-plan-report.py" --results "$RES" --doc "$DOC" \
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
bench_start
emu_up "$HOSTS" "$RATE"
start=$(date +%s)
status=0
for layout in $LAYOUTS; do
    nh=${layout%x*} rph=${layout#*x}
    np=$((nh * rph))
    hosts=$(emu_hosts "$nh" "$rph")
    for prof in $PROFILES; do
        case=$prof-$layout
        read -r sscale tscale < <(e2e_scale "$SRCDIR/fusion/profiles/$prof.prof" "$RATE" "$np" "$nh" "$COMM_MS" 1)
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
            emu_mpirun "$np" "$hosts" "$BENCH" "${common[@]}" "$@" \
                --csv "$RES/first-plan-$job-$case.csv" || rc=$?
            ((rc == 0)) || { echo "$PROG: $case $job: dear-bench exit status $rc" >&2; status=1; }
        done
    done
done
{
    echo "date: $(meta_date)"
    echo "commit: $(meta_commit -- . ':!bench/results' ':!docs')"
    echo "cluster: $HOSTS emulated hosts (bench/emucluster), $RATE each way per host; layouts $LAYOUTS"
    echo "machine: $(meta_machine)"
    echo "jobs: $JOBS; $(($(date +%s) - start)) s in all"
} >"$RES/first-plan.meta"
emu_down
report "$args"
exit $status
