#!/bin/bash
# compress-perf.sh: the figures of gradient compression (DEAR_COMPRESS), from measurement to the
# "Gradient compression" section of docs/PERFORMANCE.md. Parts, each writing
# bench/results/compress-PART*.csv (and a .meta line), run in this order:
#   accuracy  one all-reduce (average) of random float32 per algorithm and format (none, bf16,
#             fp16, int8) against the float64 average, np 2..6 on this host (dear-coll-bench
#             --accuracy), and hier over the emulated cluster's 2x2, 3x2 and 2x3 layouts
#   convert   the progress thread's conversions per MiB, bf16, fp16 and int8 (dear-coll-bench
#             --convert)
#   coll      busbw of auto's collectives on 4 emulated hosts at --rate, float32 against bf16,
#             fp16 and int8 on the wire, busbw counted on the float32 bytes (dear-coll-bench
#             --compress)
#   e2e       dear-bench on 4 emulated hosts: vgg16, gpt2-small, bert-base, resnet50, each
#             communication-bound (float32 communication twice the compute) and balanced, under
#             wfbp+64M and dear:auto, dense and +bf16, and dear:auto+int8; then the phases (which
#             phase to compress) on the communication-bound vgg16 and gpt2-small
#   layouts   dear-bench on the e2e matrix's layouts of several ranks per host (--layouts,
#             default 2x2 and 2x3): the communication-bound cases under wfbp+64M, dear:auto+bf16
#             and dear:auto+int8
#   train     dear-cnn (--epochs, np 4) and dear-gpt (1000 iterations, np 4) in float32, bf16,
#             fp16, both with error feedback, and int8 with error feedback (its default) and
#             without, --seeds seeds each, on this host
# then bench/compress-report.py writes the section. --parts picks some; --report-only redraws.
# The emulated cluster is brought up under EMU_PREFIX / EMU_SUBNET (export your own).
set -euo pipefail
PROG="compress-perf.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
PARTS="accuracy convert coll e2e layouts train"
LAYOUTS="2x2 2x3"
RATE=1gbit
ITERS=21
ROUNDS=3
EPOCHS=5
SEEDS=3
CASES="vgg16 gpt2-small bert-base resnet50"
BUILDDIR=
REPORT_ONLY=0
emu_names z 10.213.60

usage() {
    cat <<EOF
usage: bench/compress-perf.sh [options]
  --parts LIST      some of: $PARTS (default all, in that order)
  --builddir DIR    where the programs were built (default: the current directory if it has
                    them, else the source tree)
  --rate RATE       emulated link rate, tc syntax (default $RATE)
  --iters N         dear-bench measured iterations per configuration (default $ITERS)
  --rounds R        dear-bench rounds (default $ROUNDS)
  --cases "A B"     e2e and layouts profiles (default "$CASES")
  --layouts "HxR"   the layouts part's hosts x ranks per host, 2-4 hosts (default "$LAYOUTS")
  --epochs N        dear-cnn epochs (default $EPOCHS)
  --seeds N         seeds per training configuration (default $SEEDS)
  --report-only     only bench/compress-report.py on the results there
Environment: EMU_PREFIX, EMU_SUBNET (default z, 10.213.60). Needs root for coll, e2e and
accuracy's hier rows. The whole takes about three and a half hours on 2 cores (layouts: about
25 minutes).
EOF
}
bench_options --parts=PARTS --builddir=BUILDDIR --rate=RATE --iters=ITERS --rounds=ROUNDS --cases=CASES \
    --layouts=LAYOUTS --epochs=EPOCHS --seeds=SEEDS --report-only=REPORT_ONLY! -- "$@"
for p in $PARTS; do
    [[ " accuracy convert coll e2e layouts train " == *" $p "* ]] ||
        die "unknown part '$p' (accepted: accuracy convert coll e2e layouts train)"
done
for l in $LAYOUTS; do
    [[ $l =~ ^[2-4]x[1-8]$ ]] || die "--layouts: '$l' is not HOSTSxRANKS with 2-4 hosts of 1-8 ranks"
done
[[ $ITERS =~ ^[0-9]+$ && $ROUNDS =~ ^[0-9]+$ && $EPOCHS =~ ^[0-9]+$ && $SEEDS =~ ^[0-9]+$ ]] ||
    die "--iters, --rounds, --epochs and --seeds take counts"

report() { python3 "$SRCDIR/bench/compress-report.py" --results "$RES" --doc "$DOC" --rate "$RATE"; }
if ((REPORT_ONLY)); then
    report
    exit 0
fi

BUILDDIR=$(bench_builddir "$BUILDDIR" apps/tools/dear-coll-bench)
COLL=$BUILDDIR/apps/tools/dear-coll-bench BENCH=$BUILDDIR/apps/bench/dear-bench
CNN=$BUILDDIR/apps/cnn/dear-cnn GPT=$BUILDDIR/apps/gpt/dear-gpt
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
LOCAL=(mpirun --oversubscribe --bind-to none)
mkdir -p "$RES"
bench_start
# The cluster comes up once, for the first part that needs it.
cluster() {
    ((BENCH_EMU_UP)) && return
    emu_up 4 "$RATE" >/dev/null
}
meta() { echo "$1: $(meta_date), commit $(meta_head), load $(meta_load), $(nproc) cores: $2" >"$RES/compress-$1.meta"; }
# bench_case HOSTS RANKS PROFILE COMM_MS RATIO CONFIGS NAME COLUMNS VALUES: dear-bench of PROFILE on
# HOSTS emulated hosts of RANKS ranks, scaled by e2e_scale, into $tmp/NAME.csv with the columns
# COLUMNS (VALUES on every row) put first; the file is added to files[] when it has rows.
bench_case() {
    local h=$1 r=$2 prof=$3 ms=$4 ratio=$5 configs=$6 name=$7 cols=$8 vals=$9 ss ts
    local out=$tmp/$name.csv
    read -r ss ts < <(e2e_scale "$SRCDIR/fusion/profiles/$prof.prof" "$RATE" $((h * r)) "$h" "$ms" "$ratio")
    emu_mpirun $((h * r)) "$(emu_hosts "$h" "$r")" "$BENCH" --profile "$SRCDIR/fusion/profiles/$prof.prof" \
        --configs "$configs" --iters "$ITERS" --rounds "$ROUNDS" --size-scale "$ss" --time-scale "$ts" --quiet \
        --csv "$out" || echo "$PROG: $name: dear-bench failed" >&2
    if [[ -s $out ]]; then
        sed -i "1s/^/$cols,/; 2,\$s/^/$vals,/" "$out"
        files+=("$out")
    fi
}
merge() { # OUT IN...: the first file whole, the header of the others dropped
    local out=$1; shift
    { cat "$1"; shift; for f in "$@"; do tail -n +2 "$f"; done; } >"$out"
}

for part in $PARTS; do
    echo "$PROG: $part"
    case $part in
    accuracy)
        files=()
        for np in 2 3 4 5 6; do
            "${LOCAL[@]}" -np $np "$COLL" --accuracy --compress none,bf16,fp16,int8 --algos ring,rhd,direct,mpi,sparse \
                --max 4m --csv "$tmp/acc$np.csv" | tee -a "$tmp/acc.txt"
            files+=("$tmp/acc$np.csv")
        done
        cluster
        for l in 2x2 3x2 2x3; do
            h=${l%x*} r=${l#*x}
            emu_mpirun $((h * r)) "$(emu_hosts "$h" "$r")" "$COLL" --accuracy \
                --compress bf16,fp16,int8 --algos hier --max 4m --csv "$tmp/acch$l.csv" | tee -a "$tmp/acc.txt"
            sed -i "s/^hier,/hier-$l,/" "$tmp/acch$l.csv"
            files+=("$tmp/acch$l.csv")
        done
        merge "$RES/compress-accuracy.csv" "${files[@]}"
        meta accuracy "dear-coll-bench --accuracy --compress none,bf16,fp16,int8 --max 4m at np 2..6 (local), hier (bf16,fp16,int8) on 2x2, 3x2, 2x3 emulated hosts"
        ;;
    convert)
        "${LOCAL[@]}" -np 1 "$COLL" --convert --compress bf16,fp16,int8 --max 16m --iters 15 --csv "$RES/compress-convert.csv"
        meta convert "dear-coll-bench --convert --compress bf16,fp16,int8 --max 16m --iters 15"
        ;;
    coll)
        cluster
        for l in 4x1 2x2; do
            h=${l%x*} r=${l#*x}
            emu_mpirun 4 "$(emu_hosts "$h" "$r")" "$COLL" --min 64k --max 64m \
                --ops rs,ag,ar --algos auto --compress none,bf16,fp16,int8 --iters 7 --warmup 2 --transport socket \
                --csv "$RES/compress-coll-$l.csv"
        done
        meta coll "dear-coll-bench --min 64k --max 64m --algos auto --compress none,bf16,fp16,int8 --iters 7 --warmup 2 --transport socket, 4 ranks on 4x1 and 2x2 emulated hosts at $RATE"
        ;;
    e2e)
        cluster
        files=()
        configs="wfbp:threshold:64m;wfbp:threshold:64m+bf16;dear:auto;dear:auto+bf16;dear:auto+int8"
        for prof in $CASES; do
            for kind in comm balanced; do
                if [[ $kind == comm ]]; then ratio=0.5 ms=600; else ratio=1 ms=300; fi
                bench_case 4 1 "$prof" $ms $ratio "$configs" "e2e-$prof-$kind" case "$prof-$kind"
            done
        done
        merge "$RES/compress-e2e.csv" "${files[@]}"
        files=()
        pconf="dear:auto;dear:auto+compress=bf16/none;dear:auto+compress=none/bf16;dear:auto+bf16"
        for prof in vgg16 gpt2-small; do
            bench_case 4 1 "$prof" 600 0.5 "$pconf" "ph-$prof" case "$prof-comm"
        done
        merge "$RES/compress-phases.csv" "${files[@]}"
        meta e2e "dear-bench --iters $ITERS --rounds $ROUNDS on 4 emulated hosts at $RATE; comm: --comm-ms 600 --ratio 0.5, balanced: --comm-ms 300 --ratio 1 (bench/e2e-report.py scale)"
        ;;
    layouts)
        cluster
        files=()
        configs="wfbp:threshold:64m;dear:auto+bf16;dear:auto+int8"
        for l in $LAYOUTS; do
            for prof in $CASES; do
                bench_case "${l%x*}" "${l#*x}" "$prof" 600 0.5 "$configs" "ly-$l-$prof" layout,case "$l,$prof-comm"
            done
        done
        merge "$RES/compress-layouts.csv" "${files[@]}"
        meta layouts "dear-bench --iters $ITERS --rounds $ROUNDS on the emulated cluster at $RATE, layouts $LAYOUTS (hosts x ranks); --comm-ms 600 --ratio 0.5 (bench/e2e-report.py scale)"
        ;;
    train)
        echo "kind,compress,ef,seed,metric,value,seconds" >"$RES/compress-train.csv"
        for seed in $(seq 1 "$SEEDS"); do
            for c in none bf16 fp16 bf16+ef fp16+ef int8+ef int8; do
                fmt=${c%+ef} ef=0
                [[ $c == *+ef ]] && ef=1
                t0=$(date +%s)
                "${LOCAL[@]}" -np 4 -x DEAR_COMPRESS="$fmt" -x DEAR_COMPRESS_EF=$ef "$CNN" --epochs "$EPOCHS" --seed "$seed" \
                    --log-every 0 >"$tmp/cnn.txt" 2>&1 || { cat "$tmp/cnn.txt" >&2; die "dear-cnn $c seed $seed failed"; }
                acc=$(sed -n 's/^final iter [0-9]* test_acc \([0-9.]*\) .*/\1/p' "$tmp/cnn.txt")
                echo "cnn,$fmt,$ef,$seed,test_acc,$acc,$(($(date +%s) - t0))" | tee -a "$RES/compress-train.csv"
                t0=$(date +%s)
                "${LOCAL[@]}" -np 4 -x DEAR_COMPRESS="$fmt" -x DEAR_COMPRESS_EF=$ef "$GPT" --seed "$seed" --sample 0 \
                    --print-every 0 >"$tmp/gpt.txt" 2>&1 || { cat "$tmp/gpt.txt" >&2; die "dear-gpt $c seed $seed failed"; }
                val=$(sed -n 's/^final: .* validation \([0-9.]*\)  unigram.*/\1/p' "$tmp/gpt.txt")
                echo "gpt,$fmt,$ef,$seed,val_loss,$val,$(($(date +%s) - t0))" | tee -a "$RES/compress-train.csv"
            done
        done
        meta train "np 4 on this host: dear-cnn --epochs $EPOCHS --seed S; dear-gpt (1000 iterations, defaults) --seed S; DEAR_COMPRESS and DEAR_COMPRESS_EF per row"
        ;;
    esac
done
report
