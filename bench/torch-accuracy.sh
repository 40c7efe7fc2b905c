#!/bin/bash
# torch-accuracy.sh: what compressed gradients cost in accuracy through the binding, against
# DDP's fp16 and PowerSGD hooks (bench/torch-accuracy.py: two learnable tasks, held-out scores,
# several seeds), into the generated "torch-accuracy" section of docs/PERFORMANCE.md; the
# CSV stays in bench/results/torch-accuracy.csv. On this host, no emulated network: accuracy does
# not depend on the link (the time of the same configurations is torch-ddp.sh's torch-compress
# section). Needs python3-torch and python3-mpi4py. Run from the build directory.
set -euo pipefail
PROG="torch-accuracy.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
NP=4 SEEDS=3 STEPS="lm=200,mlp=800" TASKS="lm mlp"
CONFIGS="ddp;ddp+fp16;ddp+powersgd1;ddp+powersgd4;dear:dear:auto+bf16;dear:dear:auto+int8"
REPORT_ONLY=0
usage() {
    sed -n '2,7p' "$0"
    echo "options: --np N --seeds N --steps 'lm=N,mlp=N' --tasks 'lm mlp' --configs '$CONFIGS'"
    echo "         --report-only (rewrite the section from the CSV, measuring nothing)"
}
bench_options --np=NP --seeds=SEEDS --steps=STEPS --tasks=TASKS --configs=CONFIGS --report-only=REPORT_ONLY! -- "$@"
CSV=$RES/torch-accuracy.csv
if ((!REPORT_ONLY)); then
    bench_torch_setup
    mkdir -p "$RES"
    # Calibration off: the preset prices the plans; the plan changes the rounding, not the method.
    mpirun_local -np "$NP" --oversubscribe --bind-to none --mca btl self,vader -x DEAR_CALIBRATE=off \
        "${TORCH_PY[@]}" "$SRCDIR/bench/torch-accuracy.py" --tasks "$TASKS" --seeds "$SEEDS" --steps "$STEPS" \
        --configs "$CONFIGS" --csv "$CSV.new"
    mv "$CSV.new" "$CSV"
fi
cmd="bench/torch-accuracy.sh --np $NP --seeds $SEEDS --steps $STEPS"
python3 - "$DOC" "$CSV" "$cmd" <<'PY'
import os, statistics, sys
sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[1]), "..", "bench"))
from docsection import markers, read_csv, section_head, write_section
doc, csv, cmd = sys.argv[1:4]
rows = read_csv(csv)
begin, end = markers("torch-accuracy", "bench/torch-accuracy.sh")
r0 = rows[0]
L = section_head(
    begin, "PyTorch: what compression costs in accuracy, DDP's hooks against the binding", cmd,
    "from the build directory",
    "%s ranks on this host, torch %s on the "
    "CPU. Two learnable tasks (bench/torch-accuracy.py): `lm`, next-symbol prediction on text from a fixed "
    "order-2 Markov chain over 32 symbols by a causal transformer (2 blocks, d_model 128), AdamW, scored by the "
    "held-out cross-entropy in nats (lower is better; `floor` is the chain's own, which no model beats); `mlp`, "
    "10 classes from a fixed random teacher network, by an MLP 64-256-256-10, SGD with momentum, scored by "
    "held-out accuracy. Every configuration starts from the same weights and sees the same batches; only the "
    "gradient exchange differs. A cell is the median over the seeds (their range after it); `vs ddp` is the "
    "median over seeds of the difference to DDP's float32 on the same seed." % (r0["np"], r0["torch"]))
tasks = list(dict.fromkeys(r["task"] for r in rows))
configs = list(dict.fromkeys(r["config"] for r in rows))
for t in tasks:
    tr = [r for r in rows if r["task"] == t]
    metric = tr[0]["metric"]
    ref = {r["seed"]: float(r["value"]) for r in tr if r["config"] == "ddp"}
    L += ["### %s (%s steps of %s per rank; held-out %s%s)" % (
        t, tr[0]["steps"], tr[0]["batch"], metric, ", floor %.4f" % float(tr[0]["floor"]) if t == "lm" else ""), "",
        "| config | %s (median, range) | vs ddp | seeds | ranks apart |" % metric, "|---|---|---|---|---|"]
    for c in configs:
        v = [float(r["value"]) for r in tr if r["config"] == c]
        if not v:
            continue
        d = [float(r["value"]) - ref[r["seed"]] for r in tr if r["config"] == c and r["seed"] in ref]
        apart = max(float(r["rank_spread"]) for r in tr if r["config"] == c)
        unit = "%+.4f" if metric == "loss" else "%+.2f points"
        dd = (unit % (100 * statistics.median(d) if metric == "accuracy" else statistics.median(d))) if d else "-"
        fmt = "%.4f" if metric == "loss" else "%.2f%%"
        k = 1 if metric == "loss" else 100
        L.append("| %s | %s (%s-%s) | %s | %d | %.2g |" % (c, fmt % (k * statistics.median(v)), fmt % (k * min(v)),
                                                          fmt % (k * max(v)), dd, len(v), apart))
    L.append("")
L += ["`ddp+fp16`: DDP's fp16_compress_hook (its bf16_compress_hook needs CUDA and NCCL; torch 1.13 refuses it on "
      "gloo); `ddp+powersgdR`: DDP's PowerSGD hook at matrix_approximation_rank R, error feedback and warm start "
      "on, from the third iteration; `dear:dear:auto+bf16` / `+int8`: the binding with `compress=\"bf16\"` or "
      "`\"int8\"` (8-bit codes with a float32 scale per 256 values, error feedback on both sides). `ranks apart`: "
      "the largest difference of the score between ranks (0: every rank holds the same parameters). The time "
      "each takes is in the torch-compress section above.", "", end]
write_section(doc, L, begin, end, after="<!-- END torch-compress -->")
print("\n".join(L))
PY
