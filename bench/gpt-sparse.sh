#!/bin/bash
# gpt-sparse.sh: what sending the word-level embedding sparse buys dear-gpt on the emulated
# cluster.
#
# Brings up emulated hosts (bench/emucluster, 4 at 1 Gbit/s by default, one rank each, under its
# own prefix and subnet so it never disturbs a cluster someone else has up) and runs dear-gpt
# with a word vocabulary (--vocab words: 16k rows, of which a batch touches a few hundred) under
# DEAR_SPARSE=off, on and auto, the modes taking turns round after round, so a stall of the
# shared machine spoils parts of several modes rather than one whole. Each run reports the median
# iteration time of its slowest rank over the second half of its iterations (past dear's
# warm-up, the online plan and auto's checks); the table gives each mode's median over its runs,
# the spread of those runs and the ratio to off, with the embedding's densities (the share of its
# rows non-zero on rank 0, and of the averaged gradient, measured by dear in warm-up) and
# what its sparse collectives sent. Calibration is cached for the job, so only the first run
# measures it. Tears the cluster down, keeps the runs in bench/results/gpt-sparse-NxRATE.csv
# (.meta: when, where, what) and rewrites the generated "gpt-sparse" section of
# docs/PERFORMANCE.md; --report-only redoes that last step from the kept files, --no-report
# (a smoke run) keeps and writes nothing. Needs root (network namespaces).
set -euo pipefail
PROG="gpt-sparse.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
HOSTS=4
RATE=1gbit
ROUNDS=3
ITERS=40
MODES="off on auto"
SCHEDULE=dear
BUILDDIR=
REPORT=1
NO_REPORT=0
REPORT_ONLY=0
GPT_ARGS=(--vocab words --vocab-size 16384 --batch 32 --seq 64 --dim 96)
emu_names gs 10.213.61

usage() {
    cat <<EOF
usage: bench/gpt-sparse.sh [options] [-- DEAR-GPT-ARGS...]
  --builddir DIR    build directory holding apps/gpt/dear-gpt (default: the current directory
                    if it has it, else the source tree)
  --hosts N         emulated hosts, one rank each (default $HOSTS)
  --rate RATE       link rate of each host, tc syntax (default $RATE)
  --rounds R        runs per mode, the modes taking turns (default $ROUNDS)
  --iters N         iterations per run (default $ITERS); each run's median is over the second
                    half
  --modes LIST      DEAR_SPARSE values compared, space separated (default "$MODES"); the
                    first is the baseline of the ratios
  --schedule S      dear|wfbp|sync (default $SCHEDULE)
  --report-only     do not measure; regenerate the section of docs/PERFORMANCE.md from
                    bench/results/gpt-sparse-NxRATE.{csv,meta}
  --no-report       print the table only: write nothing to bench/results or docs/ (smoke runs)
  --help            this text
  -- ARGS           dear-gpt arguments instead of the default: ${GPT_ARGS[*]}
                    (always added: --iters, --schedule, and no progress, evaluation or sample)
Environment: EMU_PREFIX (default gs: hosts gs1..gsN), EMU_SUBNET (default 10.213.61).
Writes bench/results/gpt-sparse-NxRATE.csv (one row per run: mode, round, median_ms, mean_ms,
blocked_pct, density, density_avg, msgs_sparse, msgs_dense, sparse_mb), .meta, and the
"gpt-sparse" section of docs/PERFORMANCE.md. Needs root (network namespaces) and Debian's
fortunes (or --data FILE after --). The default takes several minutes on 2 cores; a smoke run:
bench/gpt-sparse.sh --rounds 1 --iters 4 --no-report.
EOF
}

bench_options --builddir=BUILDDIR --hosts=HOSTS --rate=RATE --rounds=ROUNDS --iters=ITERS --modes=MODES \
    --schedule=SCHEDULE --report-only=REPORT_ONLY! --no-report=NO_REPORT! --=GPT_ARGS -- "$@"
((NO_REPORT)) && REPORT=0
[[ $HOSTS =~ ^[0-9]+$ ]] && ((HOSTS >= 2 && HOSTS <= 16)) || die "--hosts '$HOSTS': expected 2 to 16"
[[ $ROUNDS =~ ^[0-9]+$ ]] && ((ROUNDS >= 1)) || die "--rounds '$ROUNDS': expected a count >= 1"
[[ $ITERS =~ ^[0-9]+$ ]] && ((ITERS >= 4)) || die "--iters '$ITERS': expected a count >= 4"
[[ $SCHEDULE =~ ^(dear|wfbp|sync)$ ]] || die "--schedule '$SCHEDULE': expected dear, wfbp or sync"
for m in $MODES; do
    [[ $m =~ ^(off|on|auto)$ ]] || die "--modes: '$m' is no DEAR_SPARSE value (off, on, auto)"
done
[[ -n $MODES ]] || die "--modes: empty"

TAG=${HOSTS}x$RATE
RUNS_CSV=$RES/gpt-sparse-$TAG.csv
META=$RES/gpt-sparse-$TAG.meta

# report CSV META [DOC]: each mode's median over its runs, the spread of the runs and the ratio
# to the first mode, printed; with DOC also written into its "gpt-sparse" section.
report() {
    python3 - "$SRCDIR/bench" "$MODES" "$@" <<'PY'
import statistics, sys
sys.path.insert(0, sys.argv[1])
from docsection import markers, meta_fields, read_csv, write_section
modes, runs_csv, meta_path = sys.argv[2].split(), sys.argv[3], sys.argv[4]
doc = sys.argv[5] if len(sys.argv) > 5 else None
meta = meta_fields(meta_path)
rows = read_csv(runs_csv)
modes = [m for m in modes if any(r["mode"] == m for r in rows)] or sorted({r["mode"] for r in rows})
summary = []
for m in modes:
    rs = [r for r in rows if r["mode"] == m]
    t = [float(r["median_ms"]) for r in rs]
    dens = [float(r["density"]) for r in rs if float(r["density"]) >= 0]
    davg = [float(r["density_avg"]) for r in rs if float(r["density_avg"]) >= 0]
    summary.append(dict(mode=m, runs=len(rs), med=statistics.median(t), lo=min(t), hi=max(t),
                        blocked=statistics.median(float(r["blocked_pct"]) for r in rs),
                        dens=statistics.median(dens) if dens else None,
                        davg=statistics.median(davg) if davg else None,
                        mb=statistics.median(float(r["sparse_mb"]) for r in rs)))
base = summary[0]["med"]
fmt = lambda x: "-" if x is None else "%.4f" % x
table = ["| DEAR_SPARSE | runs | median ms | runs min-max ms | vs %s | blocked | density rank 0 | "
         "density avg | sparse MB/run |" % modes[0], "|---|---|---|---|---|---|---|---|---|"]
for s in summary:
    table.append("| %s | %d | %.2f | %.2f-%.2f | %.3fx | %.1f%% | %s | %s | %.3f |" % (
        s["mode"], s["runs"], s["med"], s["lo"], s["hi"], s["med"] / base, s["blocked"],
        fmt(s["dens"]), fmt(s["davg"]), s["mb"]))
print("\n".join(table))
if doc:
    begin, end = markers("gpt-sparse", "bench/gpt-sparse.sh")
    L = [begin, "## dear-gpt with a word vocabulary: the embedding sent sparse", "",
         "Generated by `%s` (as root) from `bench/results/gpt-sparse-%s.csv`; do not edit by hand. "
         "%s. dear-gpt `%s`, schedule %s: %s; %s. The modes take turns round after round in one "
         "job; each run's figure is the median iteration time of its slowest rank over the second "
         "half of its iterations (past dear's warm-up and the online plan), the table gives the "
         "median over the runs." % (meta["command"], meta["tag"], meta["cluster"],
                                    meta["gpt args"], meta["schedule"], meta["vocabulary"],
                                    meta["model"]), "",
         "- date: %s, commit %s" % (meta["date"], meta["commit"]),
         "- machine: %s" % meta["machine"], ""] + table + ["",
         "`off` sends the embedding's gradient dense like every other tensor; `on` sends only its "
         "non-zero rows (with their indices) in every phase; `auto` measures the density over "
         "dear's warm-up and keeps the form that costs less. Density: the share of the "
         "embedding's rows non-zero in one batch's gradient on rank 0, and in the averaged "
         "gradient (the union over the ranks), as dear measured them; sparse MB: what rank 0's "
         "sparse collectives of the embedding sent in the whole run. The output head (the same "
         "size as the embedding, untied) is dense in every batch and always travels dense.", "",
         end]
    write_section(doc, L, begin, end)
PY
}

if ((REPORT_ONLY)); then
    [[ -f $RUNS_CSV && -f $META ]] || die "no results for $TAG under $RES: run without --report-only first"
    report "$RUNS_CSV" "$META" "$DOC"
    exit 0
fi

GPT=$(bench_prog "$BUILDDIR" apps/gpt/dear-gpt "build it (make apps/gpt/dear-gpt)")
[[ $EUID -eq 0 ]] || die "needs root to create network namespaces"

bench_start

emu_up "$HOSTS" "$RATE" >/dev/null
hosts=$(emu_hosts "$HOSTS")
echo "$PROG: $HOSTS hosts at $RATE, one rank each; schedule $SCHEDULE; $ROUNDS round(s) of" \
     "DEAR_SPARSE in {$MODES}, $ITERS iterations each; dear-gpt ${GPT_ARGS[*]}"
printf '%-5s %5s %10s %10s %8s %9s %9s %8s %7s %9s\n' mode round median_ms mean_ms blocked \
    density dens_avg sparse dense sparse_MB
runs=$tmp/runs.csv
echo "mode,round,median_ms,mean_ms,blocked_pct,density,density_avg,msgs_sparse,msgs_dense,sparse_mb" >"$runs"
start=$(date +%s)
# run ROUND MODE: one dear-gpt job under DEAR_SPARSE=MODE, its row added to $runs and printed.
run() {
    local r=$1 m=$2 out row
    out=$tmp/$m-$r.out
    emu_mpirun "$HOSTS" "$hosts" -x DEAR_SPARSE="$m" \
        -x DEAR_CALIBRATION_FILE="$tmp/calibration" "$GPT" "${GPT_ARGS[@]}" \
        --iters "$ITERS" --schedule "$SCHEDULE" --print-every 0 --eval-every 0 --sample 0 \
        --val-chars 1024 >"$out" 2>&1 || { cat "$out" >&2; die "dear-gpt failed (DEAR_SPARSE=$m, round $r)"; }
    # the run's figures, from its summary lines (fields absent when not measured: -1)
    row=$(awk -v m="$m" -v r="$r" '
        /^iteration time: median/ { med = $4 }
        /^throughput:/ { for (i = 1; i <= NF; i++) if ($i == "ms/iteration,") mean = $(i - 1)
                         match($0, /communication [0-9.]+%/); blk = substr($0, RSTART + 14, RLENGTH - 15) }
        /^sparse embedding wte/ {
            d = da = -1
            if (match($0, /density [0-9.]+ on rank 0, [0-9.]+ of the averaged/)) {
                split(substr($0, RSTART, RLENGTH), f, " "); d = f[2]; sub(/,/, "", f[6]); da = f[6] }
            match($0, /[0-9]+ sparse and [0-9]+ dense messages, [0-9.]+ MB/)
            split(substr($0, RSTART, RLENGTH), g, " "); s = g[1]; dn = g[4]; mb = g[7] }
        END {
            if (med == "" || s == "") exit 1
            printf "%s,%d,%s,%s,%s,%s,%s,%s,%s,%s\n", m, r, med, mean, blk, d, da, s, dn, mb
        }' "$out") || { cat "$out" >&2; die "no iteration time or sparse line in dear-gpt's output"; }
    echo "$row" >>"$runs"
    echo "$row" | awk -F, '{ printf "%-5s %5d %10.2f %10.2f %7.1f%% %9s %9s %8d %7d %9.3f\n",
        $1, $2, $3, $4, $5, $6 < 0 ? "-" : sprintf("%.4f", $6), $7 < 0 ? "-" : sprintf("%.4f", $7),
        $8, $9, $10 }'
}
# shellcheck disable=SC2086 # MODES is a list
bench_rounds "$ROUNDS" run $MODES
elapsed=$(($(date +%s) - start))
emu_down >/dev/null

first=$tmp/${MODES%% *}-1.out
{
    echo "date: $(meta_date)"
    echo "commit: $(meta_commit)"
    echo "tag: $TAG"
    echo "command: bench/gpt-sparse.sh --hosts $HOSTS --rate $RATE --rounds $ROUNDS --iters $ITERS --modes '$MODES' --schedule $SCHEDULE -- ${GPT_ARGS[*]}"
    echo "cluster: $HOSTS emulated hosts at $RATE each way, one rank per host"
    echo "machine: $(meta_machine) (${elapsed} s in all)"
    echo "gpt args: ${GPT_ARGS[*]} --iters $ITERS"
    echo "schedule: $SCHEDULE"
    echo "vocabulary: $(sed -n 's/^words: //p' "$first")"
    echo "model: $(sed -n 's/^model: //p' "$first")"
} >"$tmp/meta"

echo
echo "per mode: median over the runs of each run's median iteration (slowest rank), min-max of"
echo "the runs, ratio to ${MODES%% *}; the embedding's warm-up density on rank 0 and of the averaged gradient"
if ((REPORT)); then
    mkdir -p "$RES"
    cp "$runs" "$RUNS_CSV"
    cp "$tmp/meta" "$META"
    report "$RUNS_CSV" "$META" "$DOC"
    echo "$PROG: wrote $RUNS_CSV, $META and the gpt-sparse section of $DOC"
else
    report "$runs" "$tmp/meta"
fi
