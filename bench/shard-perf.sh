#!/bin/bash
# shard-perf.sh: sharded updates (DEAR_SHARD, dear_set_shard, dear.wrap(shard=True)) against
# unsharded ones, measured on the emulated cluster, into the generated "shard" section of
# docs/PERFORMANCE.md.
#
# Brings up 4 emulated hosts (bench/emucluster, its own EMU_PREFIX) at --rate and runs, one rank
# per host, everything taking turns in one job per part:
#   1. dear-bench on shipped profiles scaled as the e2e matrix's balanced cases (communication
#      about equal to compute at the link rate): on 4 hosts x 1 rank dear:auto and wfbp (25 MiB
#      buckets), each unsharded and sharded (+shard); on the other --layouts (HOSTSxRANKS, the
#      e2e matrix's by default) dear:auto unsharded and sharded; --rounds rounds;
#   2. dear-gpt with AdamW, unsharded and --shard alternating, --gpt-runs pairs: the median
#      iteration time of the slowest rank over each run's second half;
#   3. the Python binding on bench/torch-ddp.py's transformer encoder with AdamW: DDP, DDP with
#      torch's ZeroRedundancyOptimizer, dear:auto, and dear:auto with shard=True (steps at backward's
#      end) and shard='at_step' (steps at opt.step()), in one job.
# Then, without the cluster, each trainer's optimizer state per rank at 2 and 4 ranks. Tears the
# cluster down, keeps bench/results/shard-*.csv and rewrites the section. Needs root,
# python3-torch and python3-mpi4py. Run from the build directory.
set -euo pipefail
PROG="shard-perf.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
BENCH_USAGE_RC=2
HOSTS=4 RATE=1gbit ROUNDS=3 ITERS=21 GPT_RUNS=4 TORCH_ROUNDS=3 TORCH_BATCH=16 LAYOUTS="4x1 2x2 2x3"
PROFILES="gpt2-small resnet50 bert-base"
CONFIGS="dear:auto;dear:auto+shard;wfbp:threshold:25m;wfbp:threshold:25m+shard"
LAYOUT_CONFIGS="dear:auto;dear:auto+shard"
GPT_ARGS="--iters 60 --batch 16 --seq 64 --dim 256 --heads 4 --layers 4 --print-every 0 --eval-every 0 --sample 0 --val-chars 2048"
TORCH_CONFIGS="ddp;zero;dear:dear:auto;dear:dear:auto+shard;dear:dear:auto+shard+at_step"
emu_names z 10.213.60
usage() {
    sed -n '2,18p' "$0"
    echo "options: --rate RATE (tc, default $RATE) --rounds N --iters N (dear-bench) --profiles 'A B'"
    echo "         --layouts 'HOSTSxRANKS ...' (dear-bench, default '$LAYOUTS'; 4x1 also runs wfbp)"
    echo "         --gpt-runs N (pairs of dear-gpt runs) --torch-rounds N --torch-batch N (per rank)"
    echo "environment: EMU_PREFIX, EMU_SUBNET (default z, 10.213.60): the cluster's own names"
}
bench_options --rate=RATE --rounds=ROUNDS --iters=ITERS --profiles=PROFILES --layouts=LAYOUTS --gpt-runs=GPT_RUNS \
    --torch-rounds=TORCH_ROUNDS --torch-batch=TORCH_BATCH -- "$@"
for l in $LAYOUTS; do
    [[ $l =~ ^([1-4])x([1-8])$ ]] || usage_error "--layouts: '$l' is not HOSTSxRANKS with 1-4 hosts and 1-8 ranks each"
done
BENCH=$PWD/apps/bench/dear-bench GPT=$PWD/apps/gpt/dear-gpt
for f in "$BENCH" "$GPT"; do
    [[ -e $f ]] || usage_error "run from the build directory ($f not found)"
done
bench_torch_setup
mkdir -p "$RES"
bench_start
hosts=$(emu_hosts "$HOSTS")
emu_up "$HOSTS" "$RATE"

# 1. dear-bench, the e2e matrix's balanced scaling, on every layout (4x1's CSVs keep their names)
for p in $PROFILES; do
    for l in $LAYOUTS; do
        nh=${l%x*} np=$((${l%x*} * ${l#*x}))
        configs=$LAYOUT_CONFIGS csv=$RES/shard-bench-$p-$l.csv
        [[ $l != 4x1 ]] || configs=$CONFIGS csv=$RES/shard-bench-$p.csv
        read -r sscale tscale < <(e2e_scale "$SRCDIR/fusion/profiles/$p.prof" "$RATE" "$np" "$nh" 300 1)
        emu_mpirun "$np" "$(emu_hosts "$nh" "${l#*x}")" "$BENCH" --profile "$SRCDIR/fusion/profiles/$p.prof" \
            --configs "$configs" --iters "$ITERS" --rounds "$ROUNDS" --size-scale "$sscale" --time-scale "$tscale" \
            --csv "$csv"
    done
done

# 2. dear-gpt with AdamW, the two alternating
echo "pair,config,median_ms,state_floats,unsharded_floats" >"$RES/shard-gpt.csv"
for ((i = 1; i <= GPT_RUNS; i++)); do
    for s in "" --shard; do
        # shellcheck disable=SC2086
        emu_mpirun "$HOSTS" "$hosts" "$GPT" $GPT_ARGS $s >"$tmp/gpt.out" 2>&1 ||
            { cat "$tmp/gpt.out"; exit 1; }
        awk -v pair="$i" -v cfg="${s:-unsharded}" '
            /^iteration time: median/ { ms = $4 }
            /^optimizer state:/ { st = $3; un = $NF; sub(/\)/, "", un) }
            END { print pair "," (cfg == "--shard" ? "sharded" : cfg) "," ms "," st "," un }' \
            "$tmp/gpt.out" >>"$RES/shard-gpt.csv"
        tail -1 "$RES/shard-gpt.csv"
    done
done

# 3. the binding against DDP and ZeroRedundancyOptimizer
emu_mpirun "$HOSTS" "$hosts" "${TORCH_PY[@]}" "$SRCDIR/bench/torch-ddp.py" --model encoder --opt adamw \
    --rounds "$TORCH_ROUNDS" --iters 6 --batch "$TORCH_BATCH" --configs "$TORCH_CONFIGS" --csv "$RES/shard-torch.csv"
emu_down

# 4. optimizer state per rank at 2 and 4 ranks (no timing: the cluster is not needed)
echo "trainer,np,config,state" >"$RES/shard-state.csv"
for np in 2 4; do
    for s in "" --shard; do
        # shellcheck disable=SC2086
        mpirun_local --oversubscribe -np $np --bind-to none \
            "$GPT" --iters 2 --batch 16 --seq 64 --dim 256 --heads 4 --layers 4 --print-every 0 --eval-every 0 \
            --sample 0 --val-chars 256 $s >"$tmp/st.out" 2>&1 || { cat "$tmp/st.out"; exit 1; }
        awk -v np=$np -v cfg="${s:-unsharded}" '/^optimizer state:/ { printf "dear-gpt AdamW,%d,%s,%s floats\n", np,
            cfg == "--shard" ? "sharded" : cfg, $3 }' "$tmp/st.out" >>"$RES/shard-state.csv"
    done
done

cmd="bench/shard-perf.sh --rate $RATE --rounds $ROUNDS --iters $ITERS --profiles '$PROFILES' --layouts '$LAYOUTS' --gpt-runs $GPT_RUNS --torch-rounds $TORCH_ROUNDS --torch-batch $TORCH_BATCH"
# shellcheck disable=SC2086 # one argument per profile
python3 - "$DOC" "$RES" "$cmd" "$HOSTS" "$RATE" "$GPT_ARGS" "$LAYOUTS" $PROFILES <<'PY'
import os, statistics, sys
sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[1]), "..", "bench"))
from docsection import markers, read_csv, section_head, write_section
doc, res, cmd, hosts, rate, gpt_args, layouts, profiles = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], \
    sys.argv[5], sys.argv[6], sys.argv[7].split(), sys.argv[8:]
begin, end = markers("shard", "bench/shard-perf.sh")
L = section_head(
    begin, "Sharded updates", cmd, "as root, from the build directory",
    "%s emulated hosts at %s each way, one rank per host unless a layout says otherwise (2 shared cores for "
    "all). Each part's configurations take turns in one job." % (hosts, rate)) + [
     "dear-bench, the e2e matrix's balanced scaling (communication about equal to compute), SGD; median "
     "iteration of the slowest rank over the pooled rounds, and the ratio sharded / unsharded (layout: hosts x "
     "ranks per host):", "",
     "| profile | layout | config | iter ms | q1-q3 ms | sharded / unsharded |", "|---|---|---|---|---|---|"]
for p in profiles:
    for lay in layouts:
        name = "shard-bench-%s.csv" % p if lay == "4x1" else "shard-bench-%s-%s.csv" % (p, lay)
        rows = {r["config"]: r for r in read_csv(os.path.join(res, name))}
        for c, r in rows.items():
            base = rows.get(c[:-len("+shard")]) if c.endswith("+shard") else None
            ratio = "%.3f" % (float(r["iter_ms"]) / float(base["iter_ms"])) if base else ""
            L.append("| %s | %s | %s | %.1f | %.1f-%.1f | %s |" % (p, lay, c, float(r["iter_ms"]),
                                                                 float(r["iter_q1_ms"]), float(r["iter_q3_ms"]), ratio))
g = read_csv(os.path.join(res, "shard-gpt.csv"))
pairs = {}
for r in g:
    pairs.setdefault(r["pair"], {})[r["config"]] = float(r["median_ms"])
ratios = [v["sharded"] / v["unsharded"] for v in pairs.values() if "sharded" in v and "unsharded" in v]
med = {c: statistics.median(float(r["median_ms"]) for r in g if r["config"] == c) for c in ("unsharded", "sharded")}
st = {r["config"]: r for r in g}
L += ["", "dear-gpt with AdamW (`%s`), unsharded and `--shard` alternating, %d pairs: each run's median iteration "
      "of the slowest rank over its second half; the ratio is the median of the pairs' ratios." %
      (gpt_args, len(ratios)), "",
      "| config | median ms | sharded / unsharded (per pair: %s) | AdamW state, largest rank |" %
      ", ".join("%.3f" % x for x in ratios), "|---|---|---|---|",
      "| unsharded | %.1f | | %s floats |" % (med["unsharded"], st["unsharded"]["state_floats"]),
      "| --shard | %.1f | %.3f | %s floats |" % (med["sharded"], statistics.median(ratios), st["sharded"]["state_floats"])]
L += ["", "The binding against torch's DDP and ZeroRedundancyOptimizer (DDP with each rank stepping the parameters it "
      "owns and broadcasting them after the step), bench/torch-ddp.py's transformer encoder with AdamW, one job:", "",
      "| config | median ms | rounds min-max ms | speed-up over ddp | AdamW state MB, largest rank |",
      "|---|---|---|---|---|"]
for r in read_csv(os.path.join(res, "shard-torch.csv")):
    L.append("| %s | %s | %s-%s | %sx | %s |" % (r["config"], r["median_ms"], r["min_ms"], r["max_ms"], r["speedup"],
                                                 r["state_mb"]))
L += ["", "Optimizer state per rank (dear-gpt's AdamW moments, the model above):", "",
      "| trainer | ranks | config | largest rank |", "|---|---|---|---|"]
for r in read_csv(os.path.join(res, "shard-state.csv")):
    L.append("| %s | %s | %s | %s |" % (r["trainer"], r["np"], r["config"], r["state"]))
L += ["", end]
write_section(doc, L, begin, end)
print("\n".join(L))
PY
