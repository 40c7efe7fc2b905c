#!/bin/bash
# auto-repeat.sh: does dear:auto end on the same plan run after run, and is it never behind the
# best fixed configuration beyond noise? Runs one dear-bench case --runs times; each run is one
# dear-bench job that interleaves the configurations (--rounds), so they share the machine's
# state. The cost model is measured once and cached for every run (DEAR_CALIBRATION_FILE, as a
# deployment would), or afresh in every run (--calibrate fresh). Per run it prints each
# configuration's median iteration time and quartiles, the plan auto ended on and its check's
# verdicts (DEAR_LOG_LEVEL=info lines of rank 0); then the medians over the runs and a verdict
# per run: auto's median against the best fixed configuration's, "behind" only when the gap
# exceeds the half interquartile ranges of the two (the noise of that run); then every
# configuration's prediction error per run and its median over the runs. Writes a CSV of
# every run's rows (--csv).
#
# Layouts: local:NP runs NP ranks on this host (mpirun --oversubscribe; shared memory, so
# --jitter-ms stands in for a network's noise); emu:HxR runs H emulated hosts of R ranks each
# (bench/emucluster, root, --rate per link), the case scaled as bench/e2e-matrix.sh scales it.
set -euo pipefail
PROG="auto-repeat.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

RUNS=5
LAYOUT=local:4
PROFILE=resnet50
CONFIGS="dear:threshold:25m;dear:dp;dear:auto"
ITERS=12
ROUNDS=2
JITTER_MS=
SIZE_SCALE=0.1
TIME_SCALE=0.5
RATE=1gbit
COMM_MS=300
CSV=
LOGS=
CALIBRATE=shared
ENVS=
BUILDDIR=
emu_names ar 10.213.57

usage() {
    cat <<EOF
usage: bench/auto-repeat.sh [options]
  --runs N          dear-bench jobs, one after another (default $RUNS)
  --layout L        local:NP (NP ranks on this host, default $LAYOUT) or emu:HxR (H emulated
                    hosts of R ranks, bench/emucluster; needs root)
  --profile NAME    fusion/profiles/NAME.prof (default $PROFILE)
  --configs LIST    dear-bench --configs; must hold dear:auto and at least one other
                    (default "$CONFIGS")
  --iters N         measured iterations per configuration and run (default $ITERS)
  --rounds R        the configurations take turns R times within a run (default $ROUNDS)
  --jitter-ms X     dear-bench --jitter-ms, seeded by the run number (default: 5 for local,
                    0 for emu)
  --size-scale X, --time-scale X
                    local: dear-bench's scales (default $SIZE_SCALE, $TIME_SCALE)
  --rate RATE, --comm-ms MS
                    emu: link rate (default $RATE) and the communication per iteration the
                    case is scaled to (default $COMM_MS), compute about equal to it
  --calibrate MODE  shared: the first run measures the cost model and every later run loads
                    it (DEAR_CALIBRATION_FILE); fresh: every run measures its own, so auto's
                    plan also varies with the calibration (default $CALIBRATE)
  --csv FILE        every run's dear-bench rows, with a leading run column
  --logs DIR        keep each run's whole output, rank 0's info log included (the fit of
                    the cost model, every plan and check), as DIR/runN.txt
  --env "VAR=VALUE ..."
                    DEAR_* settings handed to every rank (mpirun -x), to repeat a setting
                    against the default one (default: none)
  --builddir DIR    build directory holding apps/bench/dear-bench (default: the current
                    directory if it has it, else the source tree)
  --help            this text
Environment: MPIRUN (local; default mpirun), EMU_PREFIX (default ar), EMU_SUBNET (default 10.213.57).
The machine is shared and noisy: read the per-run quartiles next to the medians.
EOF
}

bench_options --runs=RUNS --layout=LAYOUT --profile=PROFILE --configs=CONFIGS --iters=ITERS --rounds=ROUNDS \
    --jitter-ms=JITTER_MS --size-scale=SIZE_SCALE --time-scale=TIME_SCALE --rate=RATE --comm-ms=COMM_MS --csv=CSV \
    --logs=LOGS --env=ENVS --calibrate=CALIBRATE --builddir=BUILDDIR -- "$@"
if ! [[ $RUNS =~ ^[0-9]+$ && $ITERS =~ ^[0-9]+$ && $ROUNDS =~ ^[0-9]+$ ]] ||
    ((RUNS < 1 || ROUNDS < 1 || ROUNDS > ITERS)); then
    die "bad --runs/--iters/--rounds '$RUNS'/'$ITERS'/'$ROUNDS': counts, 1 <= rounds <= iters"
fi
[[ $CALIBRATE == shared || $CALIBRATE == fresh ]] || die "bad --calibrate '$CALIBRATE': shared or fresh"
[[ ";$CONFIGS;" == *";dear:auto;"* ]] || die "--configs must hold dear:auto"
PROF=$SRCDIR/fusion/profiles/$PROFILE.prof
[[ -f $PROF ]] || die "no profile $PROF"
[[ -z $LOGS || -d $LOGS ]] || die "--logs $LOGS: no such directory"
read -r -a envs <<<"$ENVS"
for e in "${envs[@]}"; do
    [[ $e =~ ^DEAR_[A-Z0-9_]+=[^[:space:]]*$ ]] || die "--env '$e': expected DEAR_NAME=VALUE, space-separated"
done

BENCH=$(dear_bench_path "$BUILDDIR")
bench_start

case $LAYOUT in
    local:[0-9]*)
        np=${LAYOUT#local:}
        ((np >= 2)) || die "layout $LAYOUT: at least 2 ranks"
        : "${JITTER_MS:=5}"
        scales=(--size-scale "$SIZE_SCALE" --time-scale "$TIME_SCALE")
        # shellcheck disable=SC2206,SC2054 # MPIRUN is a command line; self,vader is one word
        launch=(${MPIRUN:-mpirun} -np "$np" --oversubscribe --bind-to none --mca btl self,vader
            --mca mpi_yield_when_idle 1)
        ;;
    emu:[1-4]x[1-8])
        l=${LAYOUT#emu:} nh=${l%x*} rph=${l#*x}
        np=$((nh * rph))
        : "${JITTER_MS:=0}"
        read -r ss ts < <(e2e_scale "$PROF" "$RATE" "$np" "$nh" "$COMM_MS" 1)
        scales=(--size-scale "$ss" --time-scale "$ts")
        emu_up "$nh" "$RATE" >/dev/null
        launch=(emu_mpirun "$np" "$(emu_hosts "$nh" "$rph")")
        ;;
    *) die "bad --layout '$LAYOUT': expected local:NP or emu:HxR (hosts 1-4, ranks 1-8)" ;;
esac

# Rank 0 decides on calibration and logs auto's check: -x hands both to the ranks in the hosts.
launch+=(-x DEAR_LOG_LEVEL=info)
[[ $CALIBRATE == shared ]] && launch+=(-x "DEAR_CALIBRATION_FILE=$tmp/calibration")
for e in "${envs[@]}"; do launch+=(-x "$e"); done

echo "$PROG: $PROFILE on $LAYOUT, ${scales[*]}, jitter up to $JITTER_MS ms, $RUNS run(s) of" \
    "\"$CONFIGS\", $ITERS iterations each in $ROUNDS round(s), $CALIBRATE calibration${ENVS:+, $ENVS};" \
    "$(nproc) cores, load $(meta_load)"
for ((r = 1; r <= RUNS; r++)); do
    rc=0
    "${launch[@]}" "$BENCH" --profile "$PROF" --configs "$CONFIGS" --iters "$ITERS" --rounds "$ROUNDS" \
        "${scales[@]}" --jitter-ms "$JITTER_MS" --jitter-seed "$r" --quiet --csv "$tmp/run$r.csv" \
        >"$tmp/run$r.txt" 2>&1 || rc=$?
    ((rc == 0)) || { cat "$tmp/run$r.txt" >&2; die "run $r: dear-bench exit status $rc"; }
    echo "$PROG: run $r done, load $(meta_load)"
    [[ -z $LOGS ]] || cp "$tmp/run$r.txt" "$LOGS/run$r.txt"
    grep -a "^\[dear 0\] info plan: auto's check" "$tmp/run$r.txt" | sed 's/^.*iteration(s) per plan ([^)]*): /    check: /' || true
done

python3 - "$tmp" "$RUNS" "${CSV:-}" <<'PY'
import csv, statistics, sys
tmp, runs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
for r in range(1, runs + 1):
    for row in csv.DictReader(open(f"{tmp}/run{r}.csv")):
        rows.append(dict(run=r, **row))
configs = list(dict.fromkeys(row["config"] for row in rows))
get = {(row["run"], row["config"]): row for row in rows}
ms = lambda row, k: float(row[k])
sig = lambda row: f'{row["plan"]} {row["rs_buckets"]}/{row["ag_groups"]}/{row["ag_early"]}'
fixed = [c for c in configs if c != "dear:auto"]
print("\nmedian iteration ms [q1-q3] per run (slowest rank; machine shared and noisy)")
print("run  " + "  ".join(f"{c:>26}" for c in configs) + "  auto's plan (buckets/groups/early)   auto/best  verdict")
behind = 0
for r in range(1, runs + 1):
    cells = [f'{ms(get[r, c], "iter_ms"):8.1f} [{ms(get[r, c], "iter_q1_ms"):7.1f}-{ms(get[r, c], "iter_q3_ms"):7.1f}]'
             for c in configs]
    a = get[r, "dear:auto"]
    best = min(fixed, key=lambda c: ms(get[r, c], "iter_ms"))
    b = get[r, best]
    gap = ms(a, "iter_ms") - ms(b, "iter_ms")
    noise = (ms(a, "iter_q3_ms") - ms(a, "iter_q1_ms") + ms(b, "iter_q3_ms") - ms(b, "iter_q1_ms")) / 2
    verdict = "behind" if gap > noise else "ok"
    behind += verdict == "behind"
    print(f"{r:3d}  " + "  ".join(f"{x:>26}" for x in cells) +
          f"  {sig(a):36s} {ms(a, 'iter_ms') / ms(b, 'iter_ms'):7.3f}x  {verdict} (best fixed {best}, gap {gap:+.1f} ms, noise {noise:.1f} ms)")
over_runs = lambda c, k: statistics.median(ms(get[r, c], k) for r in range(1, runs + 1))
print("\nmedian over runs: " + ", ".join(f'{c} {over_runs(c, "iter_ms"):.1f} ms' for c in configs))
# The forecast's error, as dear-bench gives it (the plan that ran, against the period): one run
# is one draw of the machine's noise, so the median over the runs is the figure to judge.
print("\nprediction error per run (pred_ms / period_ms - 1; negative: predicted too fast)")
print("run  " + "  ".join(f"{c:>26}" for c in configs))
for r in range(1, runs + 1):
    print(f"{r:3d}  " + "  ".join(f'{ms(get[r, c], "pred_err_pct"):+25.1f}%' for c in configs))
print("median over runs: " + ", ".join(f'{c} {over_runs(c, "pred_err_pct"):+.1f}%' for c in configs))
plans = [sig(get[r, "dear:auto"]) for r in range(1, runs + 1)]
kinds = [get[r, "dear:auto"]["plan"] for r in range(1, runs + 1)]
print(f"auto's plan: {len(set(plans))} distinct plan(s) over {runs} runs ({len(set(kinds))} planner(s): {', '.join(sorted(set(kinds)))}); "
      f"behind the best fixed configuration beyond noise in {behind} of {runs} runs")
if out:
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
PY
