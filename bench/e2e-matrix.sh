#!/bin/bash
# e2e-matrix.sh: the end-to-end matrix, from measurement to report.
#
# Brings up an emulated cluster (bench/emucluster; 4 hosts at 1 Gbit/s by default) under its own
# prefix and subnet, so it never disturbs a cluster someone else has up, and runs dear-bench on
# three layouts: 4 hosts x 1 rank, 2 hosts x 2 ranks and 2 hosts x 3 ranks. Cases: each of five
# shipped profiles scaled so that compute about equals the all-reduce of its gradients at the link
# rate, counted on each host's link as the lower bound counts it ("balanced"), plus one
# compute-bound case (resnet50, compute 3x communication) and one communication-bound case
# (bert-base, communication 3x compute). Every case runs the eight configurations below one after
# another in one job: dear+auto, its baselines, and dear+auto with sharded updates (`+shard`, the
# one that can reach the lower bound, which counts a sharded step). The sparse cases
# (PROFILE-sparse-balanced-*) take the profiles whose token embedding is row-sparse (a `sparse`
# record) and run the eight dense configurations plus wfbp+64M and dear+auto with sparse
# communication (`+sparse`), and dear+auto+sparse sharded (sparse reduce-scatters, dense
# all-gathers of parameters), on the same replayed batches, so each is compared with both dense and
# sparse baselines. Tensors are shrunk (--size-scale) so one iteration's communication takes about
# --comm-ms, then compute is scaled to the wanted ratio (--time-scale). A short extra run of
# dear+auto per case records the runtime's timeline for a Gantt chart (drawn at once; the JSON is
# not kept). Then the cluster is torn down and bench/e2e-report.py writes the tables, targets, lower
# bounds and SVG plots: bench/results/e2e.md, bench/results/e2e-*.csv and bench/results/e2e-*.svg,
# and the summary section of docs/PERFORMANCE.md.
# --quick: one profile (resnet50, balanced, 4x1) for a few iterations. --report-only: redraw.
# --many-ranks: its own run, 2 hosts x 4 ranks behind a slow link (100mbit), on the profiles of
# many small tensors, where the per-host collectives price many ranks' start-ups; its results and
# section are apart from the main matrix's (bench/results/e2e-many/, the e2e-many section).
set -euo pipefail
PROG="e2e-matrix.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

HOSTS=4
RATE=
COMM_MS=300
ITERS=21
ROUNDS=3
WARMUP=
QUICK=0
MANY=0
REPORT_ONLY=0
KEEP_OTHERS=0
ONLY_CASES=
BUILDDIR=
PROFILES="resnet50 vgg16 densenet201 bert-base gpt2-small"
LAYOUTS="4x1 2x2 2x3"
CONFIGS="sync;wfbp:threshold:64m;wfbp:threshold:25m;wfbp:mgwfbp;dear:threshold:25m;dear:gradssa;dear:auto;dear:auto+shard"
SPARSE_PROFILES="bert-base gpt2-small-untied"
SPARSE_LAYOUTS="4x1 2x2 2x3"
SPARSE_CONFIGS="wfbp:threshold:64m+sparse;dear:auto+sparse;dear:auto+sparse+shard"
emu_names e 10.213.49

usage() {
    cat <<EOF
usage: bench/e2e-matrix.sh [options]
  --builddir DIR    build directory holding apps/bench/dear-bench (default: the current
                    directory if it has it, else the source tree)
  --rate RATE       link rate, tc syntax (default 1gbit; 100mbit with --many-ranks)
  --comm-ms MS      target communication time per iteration after --size-scale (default $COMM_MS)
  --iters N         measured iterations per configuration (default $ITERS)
  --rounds R        the configurations of a case run R times in turn, N/R measured
                    iterations each, pooled (default $ROUNDS): a stall of the shared
                    machine then spoils a part of several configurations, not one whole
  --warmup N        warm-up iterations of every run (default: dear-bench's per planner, which
                    waits for the online plan and auto's check)
  --profiles LIST   profiles to run, space separated (default: $PROFILES)
  --layouts LIST    HOSTSxRANKS, 1-4 hosts, 1-8 ranks each (default "$LAYOUTS")
  --configs LIST    dear-bench --configs (default: the eight below)
  --sparse-profiles LIST
                    profiles with a sparse token embedding to run as sparse cases too, with
                    --configs plus "$SPARSE_CONFIGS" (default "$SPARSE_PROFILES";
                    "" for none)
  --sparse-layouts LIST
                    layouts of the sparse cases (default "$SPARSE_LAYOUTS")
  --cases "A B"     run only these cases (names as in the report, e.g. gpt2-small-balanced-4x1)
  --keep-others     keep the results of the cases not run (rerunning a disturbed case); the
                    meta file then lists each run's cases, date and commit
  --quick           resnet50 balanced on 4x1 only, --iters 4 --rounds 1, --comm-ms 150
  --many-ranks      many ranks per host behind a slow link: 2 hosts x 4 ranks (--layouts 2x4)
                    at 100mbit unless --rate says otherwise, densenet201, bert-base and resnet152
                    (467 tensors) balanced, no sparse cases; results in bench/results/e2e-many/
                    and the e2e-many section of docs/PERFORMANCE.md (every planner's predicted
                    against measured time).
                    With --quick: densenet201 only, --iters 4 --rounds 1, --comm-ms 150.
                    The measurement: bench/e2e-matrix.sh --many-ranks; a try: --many-ranks --quick
  --report-only     do not measure; regenerate the report from bench/results/e2e-*.csv
  --help            this text
Environment: EMU_PREFIX (default e: hosts e1..e4), EMU_SUBNET (default 10.213.49).
Writes bench/results/e2e-CASE.csv, e2e-CASE.svg, e2e-gantt-CASE.svg, e2e.meta and e2e.md, and the
end-to-end section of docs/PERFORMANCE.md (with --many-ranks: the same files under
bench/results/e2e-many/ and the e2e-many section).
Needs root (network namespaces). The full matrix takes about an hour and three quarters at 1gbit
on 2 cores.
EOF
}

bench_options --builddir=BUILDDIR --rate=RATE --comm-ms=COMM_MS --iters=ITERS --warmup=WARMUP --rounds=ROUNDS \
    --profiles=PROFILES --layouts=LAYOUTS --configs=CONFIGS --sparse-profiles=SPARSE_PROFILES? \
    --sparse-layouts=SPARSE_LAYOUTS --cases=ONLY_CASES --keep-others=KEEP_OTHERS! --quick=QUICK! \
    --many-ranks=MANY! --report-only=REPORT_ONLY! -- "$@"
SECTION=e2e TITLE="End-to-end: dear-bench on the emulated cluster"
if ((MANY)); then
    # Two hosts are all the layout needs: fewer namespaces and daemons on the shared cores.
    HOSTS=2 LAYOUTS=2x4 PROFILES="densenet201 bert-base resnet152" SPARSE_PROFILES= SPARSE_LAYOUTS= RATE=${RATE:-100mbit}
    RES=$RES/e2e-many SECTION=e2e-many TITLE="End-to-end, 4 ranks per host behind a slow link: predicted against measured"
    ((QUICK)) && PROFILES=densenet201 ITERS=4 ROUNDS=1 COMM_MS=150
elif ((QUICK)); then
    PROFILES=resnet50 LAYOUTS=4x1 ITERS=4 ROUNDS=1 COMM_MS=150 SPARSE_PROFILES=
fi
RATE=${RATE:-1gbit}
[[ $ITERS =~ ^[0-9]+$ && $ROUNDS =~ ^[0-9]+$ && ( -z $WARMUP || $WARMUP =~ ^[0-9]+$ ) ]] &&
    ((ITERS >= 1 && ROUNDS >= 1 && ROUNDS <= ITERS)) ||
    die "bad --iters/--rounds/--warmup '$ITERS'/'$ROUNDS'/'$WARMUP': expected counts, 1 <= rounds <= iters"
warm=()
[[ -n $WARMUP ]] && warm=(--warmup "$WARMUP")
[[ $COMM_MS =~ ^[0-9]+([.][0-9]+)?$ ]] || die "bad --comm-ms '$COMM_MS': expected milliseconds"
# shellcheck disable=SC2086 # lists of words
check_layouts $LAYOUTS $SPARSE_LAYOUTS
for p in $PROFILES $SPARSE_PROFILES; do
    [[ -f $SRCDIR/fusion/profiles/$p.prof ]] || die "no profile fusion/profiles/$p.prof"
done
for p in $SPARSE_PROFILES; do
    grep -q '^sparse ' "$SRCDIR/fusion/profiles/$p.prof" ||
        die "profile fusion/profiles/$p.prof has no sparse tensor: it cannot be a sparse case"
done

# The report; its floor column runs the build's dear-plan.
report() {
    local plan
    plan=$(bench_prog "$BUILDDIR" apps/tools/dear-plan "build it") || exit 1
    python3 "$SRCDIR/bench/e2e-report.py" report --results "$RES" --rate "$RATE" --dear-plan "$plan" \
        --command "bench/e2e-matrix.sh $*" --doc "$DOC" --section "$SECTION" --title "$TITLE"
}

if ((REPORT_ONLY)); then
    compgen -G "$RES/e2e-*.csv" >/dev/null || die "no bench/results/e2e-*.csv: run without --report-only first"
    # The command of the run the CSVs come from, as the section names it, kept.
    prev=$(sed -n "/^<!-- BEGIN $SECTION:/,/^<!-- END $SECTION -->/p" "$DOC" |
        sed -n 's/^Generated by `bench\/e2e-report.py` (run by `bench\/e2e-matrix.sh \([^`]*\)`.*/\1/p' | head -1)
    report "${prev:-(the last run)}"
    exit 0
fi

BENCH=$(dear_bench_path "$BUILDDIR")
[[ $EUID -eq 0 ]] || die "needs root to create network namespaces"

# Cases: NAME LAYOUT PROFILE RATIO (compute / communication) SPARSE (1: sparse configurations too).
cases=()
for l in $LAYOUTS; do
    for p in $PROFILES; do cases+=("$p-balanced-$l $l $p 1 0"); done
done
if ! ((QUICK || MANY)); then
    [[ " $PROFILES " == *" resnet50 "* ]] && cases+=("resnet50-compute-4x1 4x1 resnet50 3 0")
    [[ " $PROFILES " == *" bert-base "* ]] && cases+=("bert-base-comm-4x1 4x1 bert-base 0.333 0")
fi
for l in $SPARSE_LAYOUTS; do
    for p in $SPARSE_PROFILES; do cases+=("$p-sparse-balanced-$l $l $p 1 1"); done
done

if [[ -n $ONLY_CASES ]]; then
    kept=()
    for c in "${cases[@]}"; do
        [[ " $ONLY_CASES " == *" ${c%% *} "* ]] && kept+=("$c")
    done
    for n in $ONLY_CASES; do
        printf '%s\n' "${kept[@]}" | grep -q "^$n " || die "no case '$n' among the selected profiles and layouts"
    done
    cases=("${kept[@]}")
fi

mkdir -p "$RES"
bench_start
emu_up "$HOSTS" "$RATE"
"$EMU" status
start=$(date +%s)
((KEEP_OTHERS)) || rm -f "$RES"/e2e-*.csv "$RES"/e2e-*.svg "$RES"/e2e.meta
status=0
names=
for c in "${cases[@]}"; do
    read -r name layout prof ratio sparse <<<"$c"
    configs=$CONFIGS product=dear:auto
    ((sparse)) && configs="$CONFIGS;$SPARSE_CONFIGS" product=dear:auto+sparse
    names="$names $name"
    rm -f "$RES/e2e-$name.csv" "$RES/e2e-$name.svg" "$RES/e2e-gantt-$name.svg" "$RES/e2e-pred-$name.svg"
    nh=${layout%x*} rph=${layout#*x}
    np=$((nh * rph))
    hosts=$(emu_hosts "$nh" "$rph")
    read -r sscale tscale < <(e2e_scale "$SRCDIR/fusion/profiles/$prof.prof" "$RATE" "$np" "$nh" "$COMM_MS" "$ratio")
    echo "$PROG: case $name: $prof on $layout ($hosts), size x $sscale, time x $tscale"
    # A configuration the runtime refuses (exit 3) is recorded in the CSV and reported; a
    # failed parameter check (exit 1) fails the whole script after the report is written.
    rc=0
    emu_mpirun "$np" "$hosts" "$BENCH" --profile "$SRCDIR/fusion/profiles/$prof.prof" \
        --configs "$configs" --iters "$ITERS" --rounds "$ROUNDS" "${warm[@]}" --size-scale "$sscale" \
        --time-scale "$tscale" --csv "$RES/e2e-$name.csv" --svg-dir "$tmp" | tee "$tmp/$name.txt" || rc=$?
    ((rc == 0 || rc == 3)) || { echo "$PROG: case $name: dear-bench exit status $rc" >&2; status=1; }
    # Timeline of the product configuration for the Gantt chart (a short separate run: the
    # timeline file is rewritten by every dear_init).
    emu_mpirun "$np" "$hosts" -x "DEAR_TIMELINE=$tmp/tl-$name-%r.json" "$BENCH" \
        --profile "$SRCDIR/fusion/profiles/$prof.prof" --configs "$product" --iters 3 \
        "${warm[@]}" --size-scale "$sscale" --time-scale "$tscale" --quiet >/dev/null ||
        echo "$PROG: case $name: timeline run failed (no Gantt chart)" >&2
    if [[ -f $tmp/tl-$name-0.json ]]; then
        python3 "$SRCDIR/bench/e2e-report.py" gantt --case "$name" --timeline "$tmp/tl-$name-0.json" \
            --svg "$RES/e2e-gantt-$name.svg" || echo "$PROG: case $name: no Gantt chart" >&2
    fi
    for f in "$tmp"/pred-*-"${product//:/-}".svg; do
        [[ -f $f ]] && mv "$f" "$RES/e2e-pred-$name.svg"
    done
    rm -f "$tmp"/pred-*.svg
done
elapsed=$(($(date +%s) - start))
if ((KEEP_OTHERS)) && [[ -f $RES/e2e.meta ]]; then
    # A case the first run did not have joins its list, and the sparse layouts are those of the
    # sparse cases listed, so that the meta describes every result kept.
    listed=$(sed -n 's/^cases://p' "$RES/e2e.meta")
    added=
    for n in $names; do [[ " $listed " == *" $n "* ]] || added="$added $n"; done
    if [[ -n $added ]]; then
        listed="$listed$added"
        spl=$(for n in $listed; do [[ $n == *-sparse-balanced-* ]] && echo "${n##*-}"; done | sort -u | tr '\n' ' ')
        sed -i -e "s/^cases:.*/cases:$listed/" -e "s/(sparse cases: [^)]*)/(sparse cases: ${spl% })/" "$RES/e2e.meta"
    fi
    echo "rerun:$names: $(meta_date), commit $(meta_commit -- . ':!bench/results'), $elapsed s${added:+ (added:$added)}, $(meta_machine)" \
        >>"$RES/e2e.meta"
else {
    echo "date: $(meta_date)"
    echo "commit: $(meta_commit -- . ':!bench/results')"
    echo "cluster: $HOSTS emulated hosts (bench/emucluster), $RATE each way per host; layouts $LAYOUTS${SPARSE_PROFILES:+ (sparse cases: $SPARSE_LAYOUTS)}"
    echo "transport: DEAR_TRANSPORT=${DEAR_TRANSPORT:-auto} (auto: the socket transport across hosts)"
    echo "machine: $(meta_machine)"
    echo "bench: dear-bench --iters $ITERS --rounds $ROUNDS${WARMUP:+ --warmup $WARMUP}, communication scaled to ~$COMM_MS ms per iteration; $elapsed s in all$( ((QUICK)) && echo '; --quick')"
    echo "cases:$names"
} >"$RES/e2e.meta"
fi
emu_down
report "$( ((MANY)) && echo '--many-ranks ')$( ((QUICK)) && echo --quick || echo "--rate $RATE --comm-ms $COMM_MS --iters $ITERS --rounds $ROUNDS${WARMUP:+ --warmup $WARMUP}")"
exit $status
