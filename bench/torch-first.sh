#!/bin/bash
# torch-first.sh: the first plan without a profile (DEAR_FIRST_PLAN) through the PyTorch binding,
# on the emulated cluster: bench/torch-first.py for torchvision's resnet18 and a transformer
# encoder, one rank per host, at the link rates and batches bench/torch-ddp.sh balances
# (communication about equal to the compute), into bench/results/first-plan-torch-MODEL.csv and
# the "First plan without a profile" section of docs/PERFORMANCE.md (bench/first-plan-report.py).
# Needs root, python3-torch, python3-torchvision, python3-mpi4py. Run from the build directory.
set -euo pipefail
PROG="torch-first.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
BENCH_USAGE_RC=2
HOSTS=4 ROUNDS=2 ITERS=40 FIRST_N=30 MODELS="resnet18 encoder"
declare -A RATE=([resnet18]=700mbit [encoder]=150mbit) BATCH=([resnet18]=128 [encoder]=32)
emu_names tf 10.213.59
usage() { sed -n '2,7p' "$0"; echo "options: --rounds N --iters N --first-n N --models 'resnet18 encoder'"; }
bench_options --rounds=ROUNDS --iters=ITERS --first-n=FIRST_N --models=MODELS -- "$@"
bench_torch_setup
mkdir -p "$RES"
bench_start
hosts=$(emu_hosts "$HOSTS")
for m in $MODELS; do
    [[ -n ${RATE[$m]:-} ]] || usage_error "unknown model '$m'"
    emu_up "$HOSTS" "${RATE[$m]}"
    emu_mpirun "$HOSTS" "$hosts" "${TORCH_PY[@]}" "$SRCDIR/bench/torch-first.py" --model "$m" --rounds "$ROUNDS" \
        --iters "$ITERS" --first-n "$FIRST_N" --batch "${BATCH[$m]}" --csv "$RES/first-plan-torch-$m.csv"
    emu_down
done
# The command is kept beside the CSVs, so first-plan.sh's report names it too.
echo "bench/torch-first.sh --rounds $ROUNDS --iters $ITERS --first-n $FIRST_N --models '$MODELS'" \
    >"$RES/first-plan-torch.meta"
python3 "$SRCDIR/bench/first-plan-report.py" --results "$RES" --doc "$DOC"
