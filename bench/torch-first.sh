#!/bin/bash
# torch-first.sh: the first plan without a profile (DEAR_FIRST_PLAN) through the PyTorch binding,
# on the emulated cluster: bench/torch-first.py for torchvision's resnet18 and a transformer
# encoder, one rank per host, at the link rates and batches bench/torch-ddp.sh balances
# (communication about equal to the compute), into bench/results/first-plan-torch-MODEL.csv and
# the "First plan without a profile" section of docs/PERFORMANCE.md (bench/first-plan-report.py).
# Needs root, python3-torch, python3-torchvision, python3-mpi4py. Run from the build directory.
set -euo pipefail
SRCDIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EMU=$SRCDIR/bench/emucluster
HOSTS=4 ROUNDS=2 ITERS=40 FIRST_N=30 MODELS="resnet18 encoder"
declare -A RATE=([resnet18]=700mbit [encoder]=150mbit) BATCH=([resnet18]=128 [encoder]=32)
: "${EMU_PREFIX:=tf}" "${EMU_SUBNET:=10.213.59}"
export EMU_PREFIX EMU_SUBNET
while [[ $# -gt 0 ]]; do
    case $1 in
        --rounds) ROUNDS=$2; shift 2 ;;
        --iters) ITERS=$2; shift 2 ;;
        --first-n) FIRST_N=$2; shift 2 ;;
        --models) MODELS=$2; shift 2 ;;
        --help | -h) sed -n '2,7p' "$0"; echo "options: --rounds N --iters N --first-n N --models 'resnet18 encoder'"
            exit 0 ;;
        *) echo "torch-first.sh: unknown option '$1'" >&2; exit 2 ;;
    esac
done
LIB=$(pwd)/.libs/libdear.so.1
[[ -e $LIB ]] || { echo "torch-first.sh: run from the build directory ($LIB not found)" >&2; exit 2; }
RES=$SRCDIR/bench/results
mkdir -p "$RES"
cleanup() { "$EMU" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
hosts=$(seq -s, -f "${EMU_PREFIX}%g" 1 "$HOSTS")
for m in $MODELS; do
    [[ -n ${RATE[$m]:-} ]] || { echo "torch-first.sh: unknown model '$m'" >&2; exit 2; }
    "$EMU" up "$HOSTS" "${RATE[$m]}"
    "$EMU" mpirun -np "$HOSTS" --host "$hosts" -x PYTHONPATH="$SRCDIR/python" -x DEAR_LIBRARY="$LIB" \
        -x OMP_NUM_THREADS=1 /usr/bin/python3 "$SRCDIR/bench/torch-first.py" --model "$m" --rounds "$ROUNDS" \
        --iters "$ITERS" --first-n "$FIRST_N" --batch "${BATCH[$m]}" --csv "$RES/first-plan-torch-$m.csv"
    "$EMU" down
done
# The command is kept beside the CSVs, so first-plan.sh's report names it too.
echo "bench/torch-first.sh --rounds $ROUNDS --iters $ITERS --first-n $FIRST_N --models '$MODELS'" \
    >"$RES/first-plan-torch.meta"
python3 "$SRCDIR/bench/first-plan-report.py" --results "$RES" --doc "$SRCDIR/docs/PERFORMANCE.md"
