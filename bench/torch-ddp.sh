#!/bin/bash
# torch-ddp.sh: dear's Python binding against torch DDP (gloo), measured in one run on the
# emulated cluster, into the generated "PyTorch" section of docs/PERFORMANCE.md.
#
# Brings up 4 emulated hosts (bench/emucluster, its own EMU_PREFIX) at a link rate chosen so that
# DDP's communication about equals the compute on these 2 cores (--rate), runs bench/torch-ddp.py
# for torchvision's resnet18 and a transformer encoder, one rank per host, the configurations
# taking turns round after round: plain PyTorch without communication (the compute alone), DDP,
# and dear through the binding under wfbp, dear (threshold buckets, as DDP's) and dear+auto.
# Then the binding's own cost at 1 rank: plain against dear. Tears the cluster down, keeps the
# CSVs in bench/results/torch-*.csv and rewrites the section. Needs root, python3-torch,
# python3-torchvision, python3-mpi4py. Run from the build directory (libdear.so.1 in .libs/).
set -euo pipefail
SRCDIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EMU=$SRCDIR/bench/emucluster
HOSTS=4 RATE=1gbit ROUNDS=3 ITERS=6 MODELS="resnet18 encoder"
BATCH=8
# The generated section: torch (resnet18 and the encoder), or torch-wordlm (the word-level
# language model, whose embedding the binding sends sparse), each between its own markers.
SECTION=torch
REPORT_ONLY=0
CONFIGS="plain;dear:sync:threshold;ddp;dear:wfbp:threshold;dear:dear:threshold;dear:dear:auto"
: "${EMU_PREFIX:=t}" "${EMU_SUBNET:=10.213.51}"
export EMU_PREFIX EMU_SUBNET
while [[ $# -gt 0 ]]; do
    case $1 in
        --rate) RATE=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --iters) ITERS=$2; shift 2 ;;
        --models) MODELS=$2; shift 2 ;;
        --configs) CONFIGS=$2; shift 2 ;;
        --batch) BATCH=$2; shift 2 ;;
        --section) SECTION=$2; shift 2 ;;
        --report-only) REPORT_ONLY=1; shift ;;
        --help | -h) sed -n '2,12p' "$0"
            echo "options: --rate RATE|MODEL=RATE,... (tc rate, e.g. 1gbit) --batch N|MODEL=N,... (per rank)"
            echo "         --rounds N --iters N --models 'resnet18 encoder'"
            echo "         --configs '$CONFIGS'"
            echo "         --section torch|torch-wordlm (the section of docs/PERFORMANCE.md written)"
            echo "         --report-only (rewrite the section from bench/results/torch-*.csv, measuring nothing)"
            exit 0 ;;
        *) echo "torch-ddp.sh: unknown option '$1'" >&2; exit 2 ;;
    esac
done
LIB=$(pwd)/.libs/libdear.so.1
[[ -e $LIB ]] || { echo "torch-ddp.sh: run from the build directory ($LIB not found)" >&2; exit 2; }
RES=$SRCDIR/bench/results
mkdir -p "$RES"
cleanup() { "$EMU" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
# --rate and --batch take one value for every model, or MODEL=VALUE,... (each model balanced on
# its own). per_model OPTION VALUE MODEL prints the model's value.
per_model() {
    local v
    [[ $2 == *=* ]] || { echo "$2"; return; }
    for v in ${2//,/ }; do [[ ${v%%=*} == "$3" ]] && { echo "${v#*=}"; return; }; done
    echo "torch-ddp.sh: $1 $2 names no value for $3" >&2
    exit 2
}
for m in $MODELS; do
    per_model --rate "$RATE" "$m" >/dev/null && per_model --batch "$BATCH" "$m" >/dev/null || exit 2
done
hosts=$(seq -s, -f "${EMU_PREFIX}%g" 1 "$HOSTS")
if ((!REPORT_ONLY)); then
    for m in $MODELS; do
        "$EMU" up "$HOSTS" "$(per_model --rate "$RATE" "$m")"
        "$EMU" mpirun -np "$HOSTS" --host "$hosts" -x PYTHONPATH="$SRCDIR/python" -x DEAR_LIBRARY="$LIB" \
            -x OMP_NUM_THREADS=1 /usr/bin/python3 "$SRCDIR/bench/torch-ddp.py" --model "$m" --rounds "$ROUNDS" \
            --iters "$ITERS" --batch "$(per_model --batch "$BATCH" "$m")" --configs "$CONFIGS" \
            --csv "$RES/torch-$m.csv"
        "$EMU" down
    done
    # The binding's own cost: one rank, nothing to communicate, so dear's hooks and updates alone.
    for m in $MODELS; do
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 1 --bind-to none \
            -x PYTHONPATH="$SRCDIR/python" -x DEAR_LIBRARY="$LIB" -x OMP_NUM_THREADS=1 \
            /usr/bin/python3 "$SRCDIR/bench/torch-ddp.py" --model "$m" --rounds $((2 * ROUNDS)) --iters "$ITERS" \
            --batch "$(per_model --batch "$BATCH" "$m")" \
            --configs "plain;dear:dear:auto" --csv "$RES/torch-np1-$m.csv"
    done
fi
cmd="bench/torch-ddp.sh --rate $RATE --batch $BATCH --rounds $ROUNDS --iters $ITERS"
case $SECTION in
    torch) TITLE="PyTorch: dear's binding against torch DDP" ;;
    torch-wordlm) TITLE="PyTorch: a word-level language model, its embedding sent sparse" ;;
    *) echo "torch-ddp.sh: --section '$SECTION' is not torch or torch-wordlm" >&2; exit 2 ;;
esac
[[ $SECTION == torch ]] || cmd="$cmd --models '$MODELS' --configs '$CONFIGS' --section $SECTION"
python3 - "$SRCDIR/docs/PERFORMANCE.md" "$RES" "$cmd" "$HOSTS" "$RATE" "$SECTION" "$TITLE" $MODELS <<'PY'
import csv, datetime, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[1]), "..", "bench"))
from docsection import replace_section
doc, res, cmd, hosts, rate, tag, title = sys.argv[1:8]
models = sys.argv[8:]
first = next(csv.DictReader(open(os.path.join(res, "torch-%s.csv" % models[0]))))
torch_version, warmup = first["torch"], first["warmup"]
begin = "<!-- BEGIN %s: generated by bench/torch-ddp.sh, edits here are overwritten -->" % tag
end = "<!-- END %s -->" % tag
L = [begin, "## " + title, "",
     "Generated by `%s` (as root, from the build directory); do not edit by hand. %s emulated hosts "
     "at %s each way (%s), one rank per host (2 shared cores for all), torch %s on the CPU, SGD with momentum, "
     "synthetic batches of the real shapes; the configurations take turns in one job, round after round. A "
     "round's figure is its slowest rank's mean iteration time: the span from its first measured iteration's "
     "start to its last one's end, over the iterations (time to train; no barrier or other MPI call between "
     "iterations), after %s warm-up iterations (dear's planning and auto's check). The table gives the median "
     "over the rounds and their range, and the quartiles of all ranks' single iterations." %
     (cmd, hosts, rate, "chosen so that DDP's communication about equals the compute" if tag == "torch" else
      "communication-bound: compare `plain`, the compute alone, with `ddp`", torch_version, warmup), "",
     "- date: %s" % datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "",
     "| model | parameters | batch/rank | config | median ms | rounds min-max ms | iterations q1-q3 ms | speed-up | over | CPU ms/rank |",
     "|---|---|---|---|---|---|---|---|---|---|"]
for m in models:
    for r in csv.DictReader(open(os.path.join(res, "torch-%s.csv" % m))):
        L.append("| %s | %.1fM | %s | %s | %s | %s-%s | %s-%s | %sx | %s | %s |" % (
            m, int(r["params"]) / 1e6, r["batch"], r["config"], r["median_ms"], r["min_ms"], r["max_ms"],
            r["q1_ms"], r["q3_ms"], r["speedup"], r["baseline"], r.get("cpu_ms", "-")))
L += ["", "`plain` is PyTorch without any communication (the compute alone, 4 ranks sharing the cores); "
      "`dear:sync:threshold` runs it and then all communication, with no overlap (their difference is the "
      "communication alone); "
      "`ddp` is DistributedDataParallel with its default 25 MB buckets (`ddp+fp16`: with its fp16_compress_hook); "
      "`dear:SCHEDULE:FUSION` is the binding "
      "with DEAR_SCHEDULE and DEAR_FUSION (`threshold`: 25 MiB buckets as DDP's; `auto`: the measured planner; "
      "`+dense`: the embedding's gradient sent dense, `sparse=\"off\"`; `+bf16`: `compress=\"bf16\"`). "
      "CPU ms/rank: user and system time of a rank's process per iteration (compute, communication threads, "
      "its sockets).",
      "", "The binding's own cost at 1 rank (no communication: dear's hooks, its bookkeeping and the updates it "
      "runs), the two taking turns in one job:", "",
      "| model | plain ms | dear ms | overhead |", "|---|---|---|---|"]
for m in models:
    rows = {r["config"]: r for r in csv.DictReader(open(os.path.join(res, "torch-np1-%s.csv" % m)))}
    p, d = float(rows["plain"]["median_ms"]), float(rows["dear:dear:auto"]["median_ms"])
    L.append("| %s | %.2f | %.2f | %+.1f%% |" % (m, p, d, 100.0 * (d / p - 1.0)))
L += ["", end]
replace_section(doc, "\n".join(L) + "\n", begin, end, after="<!-- END torch -->")
print("\n".join(L))
PY
