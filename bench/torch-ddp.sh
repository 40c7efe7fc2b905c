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
PROG="torch-ddp.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
BENCH_USAGE_RC=2
HOSTS=4 RATE=1gbit ROUNDS=3 ITERS=6 MODELS="resnet18 encoder"
BATCH=8
# The generated section: torch (resnet18 and the encoder), torch-wordlm (the word-level
# language model, whose embedding the binding sends sparse), or torch-compress (compressed
# gradients: DDP's fp16 and PowerSGD hooks against the binding's bf16 and int8, CSVs of their own),
# each between its own markers.
SECTION=torch
REPORT_ONLY=0
DEFAULT_CONFIGS="plain;dear:sync:threshold;ddp;dear:wfbp:threshold;dear:dear:threshold;dear:dear:auto"
# DDP's bf16_compress_hook needs CUDA and NCCL (torch refuses it on gloo): its 16-bit row here is fp16's.
COMPRESS_CONFIGS="ddp;ddp+fp16;ddp+powersgd1;ddp+powersgd4;dear:dear:auto+bf16;dear:dear:auto+int8"
CONFIGS=
emu_names t 10.213.51
usage() {
    sed -n '2,12p' "$0"
    echo "options: --rate RATE|MODEL=RATE,... (tc rate, e.g. 1gbit) --batch N|MODEL=N,... (per rank)"
    echo "         --rounds N --iters N --models 'resnet18 encoder'"
    echo "         --configs '$DEFAULT_CONFIGS'"
    echo "         --section torch|torch-wordlm|torch-compress (the section of docs/PERFORMANCE.md written;"
    echo "           torch-compress's configurations default to '$COMPRESS_CONFIGS')"
    echo "         --report-only (rewrite the section from bench/results/torch-*.csv, measuring nothing)"
}
bench_options --rate=RATE --rounds=ROUNDS --iters=ITERS --models=MODELS --configs=CONFIGS --batch=BATCH \
    --section=SECTION --report-only=REPORT_ONLY! -- "$@"
case $SECTION in
    torch | torch-wordlm) CSV=torch DEFAULT=$DEFAULT_CONFIGS ;;
    torch-compress) CSV=torch-compress DEFAULT=$COMPRESS_CONFIGS ;;
    *) usage_error "--section '$SECTION' is not torch, torch-wordlm or torch-compress" ;;
esac
CONFIGS=${CONFIGS:-$DEFAULT}
bench_torch_setup
mkdir -p "$RES"
bench_start
# --rate and --batch take one value for every model, or MODEL=VALUE,... (each model balanced on
# its own). per_model OPTION VALUE MODEL prints the model's value.
per_model() {
    local v
    [[ $2 == *=* ]] || { echo "$2"; return; }
    for v in ${2//,/ }; do [[ ${v%%=*} == "$3" ]] && { echo "${v#*=}"; return; }; done
    usage_error "$1 $2 names no value for $3"
}
for m in $MODELS; do
    per_model --rate "$RATE" "$m" >/dev/null && per_model --batch "$BATCH" "$m" >/dev/null || exit 2
done
hosts=$(emu_hosts "$HOSTS")
if ((!REPORT_ONLY)); then
    for m in $MODELS; do
        emu_up "$HOSTS" "$(per_model --rate "$RATE" "$m")"
        emu_mpirun "$HOSTS" "$hosts" "${TORCH_PY[@]}" "$SRCDIR/bench/torch-ddp.py" --model "$m" --rounds "$ROUNDS" \
            --iters "$ITERS" --batch "$(per_model --batch "$BATCH" "$m")" --configs "$CONFIGS" \
            --csv "$RES/$CSV-$m.csv"
        emu_down
    done
    # The binding's own cost: one rank, nothing to communicate, so dear's hooks and updates alone.
    for m in $MODELS; do
        [[ $SECTION == torch-compress ]] && break
        mpirun_local -np 1 --bind-to none "${TORCH_PY[@]}" \
            "$SRCDIR/bench/torch-ddp.py" --model "$m" --rounds $((2 * ROUNDS)) --iters "$ITERS" \
            --batch "$(per_model --batch "$BATCH" "$m")" \
            --configs "plain;dear:dear:auto" --csv "$RES/torch-np1-$m.csv"
    done
fi
cmd="bench/torch-ddp.sh --rate $RATE --batch $BATCH --rounds $ROUNDS --iters $ITERS"
case $SECTION in
    torch) TITLE="PyTorch: dear's binding against torch DDP" ;;
    torch-wordlm) TITLE="PyTorch: a word-level language model, its embedding sent sparse" ;;
    torch-compress) TITLE="PyTorch: compressed gradients, DDP's hooks against the binding" ;;
esac
if [[ $SECTION == torch ]]; then
    [[ $CONFIGS == "$DEFAULT_CONFIGS" ]] || cmd="$cmd --configs '$CONFIGS'"
elif [[ $SECTION == torch-compress ]]; then
    [[ $CONFIGS == "$COMPRESS_CONFIGS" ]] || cmd="$cmd --configs '$CONFIGS'"
    cmd="$cmd --section $SECTION"
else
    cmd="$cmd --models '$MODELS' --configs '$CONFIGS' --section $SECTION"
fi
python3 - "$DOC" "$RES" "$cmd" "$HOSTS" "$RATE" "$SECTION" "$TITLE" "$CSV" $MODELS <<'PY'
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[1]), "..", "bench"))
from docsection import markers, read_csv, section_head, write_section
doc, res, cmd, hosts, rate, tag, title, csv = sys.argv[1:9]
models = sys.argv[9:]
first = read_csv(os.path.join(res, "%s-%s.csv" % (csv, models[0])))[0]
torch_version = first["torch"]
warms = sorted({int(r["warmup"]) for m in models for r in read_csv(os.path.join(res, "%s-%s.csv" % (csv, m)))})
warmup = "%d (%d under auto, whose check of its runners-up runs in them)" % (warms[0], warms[-1]) \
    if len(warms) > 1 else "%d" % warms[0]
begin, end = markers(tag, "bench/torch-ddp.sh")
L = section_head(
    begin, title, cmd, "as root, from the build directory",
    "%s emulated hosts "
     "at %s each way (%s), one rank per host (2 shared cores for all), torch %s on the CPU, SGD with momentum, "
     "synthetic batches of the real shapes; the configurations take turns in one job, round after round. A "
     "round's figure is its slowest rank's mean iteration time: the span from its first measured iteration's "
     "start to its last one's end, over the iterations (time to train; no barrier or other MPI call between "
     "iterations), after %s warm-up iterations (dear's planning and auto's check). The table gives the median "
     "over the rounds and their range, and the quartiles of all ranks' single iterations." %
     (hosts, rate, "communication-bound: compare `plain`, the compute alone, with `ddp`" if tag == "torch-wordlm"
      else "chosen so that DDP's communication about equals the compute", torch_version, warmup)) + [
     "| model | parameters | batch/rank | config | median ms | rounds min-max ms | iterations q1-q3 ms | speed-up | over | CPU ms/rank |",
     "|---|---|---|---|---|---|---|---|---|---|"]
for m in models:
    for r in read_csv(os.path.join(res, "%s-%s.csv" % (csv, m))):
        L.append("| %s | %.1fM | %s | %s | %s | %s-%s | %s-%s | %sx | %s | %s |" % (
            m, int(r["params"]) / 1e6, r["batch"], r["config"], r["median_ms"], r["min_ms"], r["max_ms"],
            r["q1_ms"], r["q3_ms"], r["speedup"], r["baseline"], r.get("cpu_ms", "-")))
L += ["", "`plain` is PyTorch without any communication (the compute alone, 4 ranks sharing the cores); "
      "`dear:sync:threshold` runs it and then all communication, with no overlap (their difference is the "
      "communication alone); "
      "`ddp` is DistributedDataParallel with its default 25 MB buckets (`ddp+fp16`: with its fp16_compress_hook); "
      "`dear:SCHEDULE:FUSION` is the binding "
      "with DEAR_SCHEDULE and DEAR_FUSION (`threshold`: 25 MiB buckets as DDP's; `auto`: the measured planner; "
      "`+dense`: the embedding's gradient sent dense, `sparse=\"off\"`; `+bf16`, `+fp16`: `compress=\"bf16\"` or "
      "`\"fp16\"`, 16-bit wire in both phases, sums in float32). "
      "CPU ms/rank: user and system time of a rank's process per iteration (compute, communication threads, "
      "its sockets)."]
if tag == "torch-compress":
    L += ["", "`ddp+fp16`: DDP with its fp16_compress_hook (its bf16_compress_hook needs CUDA and NCCL; torch "
          "refuses it on gloo); `ddp+powersgdR`: DDP with its PowerSGD hook at "
          "matrix_approximation_rank R, error feedback and warm start on, compressing from the third warm-up "
          "iteration; `+int8`: `compress=\"int8\"` (8-bit codes, a float32 scale per 256 values, error feedback). "
          "Times only: these batches are synthetic, so accuracy is not measured here (the C trainers' is, in "
          "the compression section).", "", end]
    write_section(doc, L, begin, end, after="<!-- END torch -->")
    print("\n".join(L))
    sys.exit(0)
L += ["", "The binding's own cost at 1 rank (no communication: dear's hooks, its bookkeeping and the updates it "
      "runs), the two taking turns in one job:", "",
      "| model | plain ms | rounds min-max ms | dear ms | rounds min-max ms | overhead |",
      "|---|---|---|---|---|---|"]
for m in models:
    rows = {r["config"]: r for r in read_csv(os.path.join(res, "torch-np1-%s.csv" % m))}
    p, d = rows["plain"], rows["dear:dear:auto"]
    pm, dm = float(p["median_ms"]), float(d["median_ms"])
    L.append("| %s | %.2f | %s-%s | %.2f | %s-%s | %+.1f%% |" % (
        m, pm, p["min_ms"], p["max_ms"], dm, d["min_ms"], d["max_ms"], 100.0 * (dm / pm - 1.0)))
L += ["", end]
write_section(doc, L, begin, end, after="<!-- END torch -->")
print("\n".join(L))
PY
