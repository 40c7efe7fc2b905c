#!/bin/sh
# dear-gpt computes the same training whatever the rank count and schedule: with the same
# global batch and seed, 2 and 4 ranks under each schedule (dear, wfbp, sync) must give the loss
# curve of one rank, iteration by iteration, to float tolerance (the sums only associate
# differently), and the same validation loss (evaluated after dear_flush every 10 iterations,
# so flushing mid-run is exercised too). Also checks that the model learns, that --seed repeats
# a run and that --profile-out writes a profile. Sharded updates (--shard): AdamW's moments of
# 1/P of every tensor per rank (the optimizer-state line says so), the same loss curve, and
# without clipping on 2 ranks the unsharded parameters bit for bit (two summands add alike in
# any order; AdamW is element-wise); with clipping on 4, to the tolerance of other sum orders.
# The text is generated here, so the test needs no data package.
. "${top_srcdir:-.}/tests/apps/gpt-lib.sh"
# A text with structure to learn: sentences of 3 to 8 words from a list of 20, picked by a
# small LCG (exact in awk's doubles, so every awk writes the same text).
awk 'BEGIN {
    split("the a cat dog sat ran on under mat log and then quickly slowly big small red blue " \
          "house tree", w, " ")
    s = 12345; n = 0
    while (n < 60000) {
        s = (s * 75 + 74) % 65537; k = 3 + s % 6; line = ""
        for (i = 0; i < k; i++) {
            s = (s * 75 + 74) % 65537; line = line (i ? " " : "") w[1 + s % 20]
        }
        line = line ".\n"; printf "%s", line; n += length(line)
    } }' >"$tmp/text.txt"
[ "$(wc -c <"$tmp/text.txt")" -ge 60000 ] ||
    { echo "gpt-equiv.sh: awk wrote no text" >&2; exit 99; }

ITERS=30
ARGS="--data $tmp/text.txt --iters $ITERS --batch 4 --seq 16 --dim 16 --heads 2 --layers 2
      --lr 1e-2 --seed 3 --print-every 0 --eval-every 10 --sample 0 --val-chars 4096"

run np1 1 sync || exit 1
# --seed makes runs repeatable: the same run again gives the same losses bit for bit, another
# seed does not; --profile-out writes the measured profile, naming the registered tensors
ARGS_SAVED=$ARGS
ARGS="$ARGS --profile-out $tmp/profile.txt"
if run np1-again 1 sync; then
    if cmp -s "$tmp/np1.loss" "$tmp/np1-again.loss"; then
        echo "ok: the same seed repeats the run bit for bit"
    else
        echo "FAIL: the same seed gave different losses"; fails=$((fails + 1))
    fi
    if [ -s "$tmp/profile.txt" ] && grep -q "wte" "$tmp/profile.txt"; then
        echo "ok: --profile-out wrote $(wc -l <"$tmp/profile.txt") lines naming the tensors"
    else
        echo "FAIL: --profile-out wrote no profile naming wte"; fails=$((fails + 1))
    fi
fi
ARGS=$(echo "$ARGS_SAVED" | sed 's/--seed 3/--seed 4/')
if run np1-seed4 1 sync; then
    if cmp -s "$tmp/np1.loss" "$tmp/np1-seed4.loss"; then
        echo "FAIL: --seed 4 gave the losses of --seed 3"; fails=$((fails + 1))
    else
        echo "ok: another seed gives another run"
    fi
fi
ARGS=$ARGS_SAVED
# it learns: the validation loss falls between iteration 10 and the end, to 10% below the
# unigram baseline (the head starts at the unigram distribution: only context gets below it)
if ! awk '/^iter .* validation/ { v[n++] = $4 } /^unigram/ { u = $(NF-1) }
          END { exit !(n >= 2 && v[n-1] < v[0] - 0.1 && v[n-1] < 0.9 * u) }' "$tmp/np1.out"; then
    echo "FAIL: the validation loss did not fall below the unigram baseline"
    sed 's/^/    | /' "$tmp/np1.out"
    fails=$((fails + 1))
else
    echo "ok: validation loss falls: $(grep '^iter .* validation' "$tmp/np1.out" |
        awk '{print $4}' |
        tr '\n' ' ')($(sed -n 's/^unigram.*: \([0-9.]*\).*/unigram \1/p' "$tmp/np1.out"))"
fi
# 2 ranks sum in one order whatever the algorithm; 4 ranks (one sequence each) exercise the
# reduction orders of the schedules' different collectives
for np in 2 4; do
    for s in sync wfbp dear; do
        run "np$np-$s" $np "$s" && compare np1 "np$np-$s"
    done
done
# state_check NAME NP: the optimizer state of the largest rank is the whole model's split in NP,
# give or take an element per tensor and moment.
state_check() {
    if awk -v np="$2" '/^model:/ { for (i = 1; i < NF; i++) if ($(i + 1) ~ /^tensors/) nt = $i }
        /^optimizer state:/ { x = $3; y = $NF; sub(/\)/, "", y) }
        END { exit !(nt > 0 && x * np <= y + 2 * np * nt && x * np >= y - 2 * np * nt) }' "$tmp/$1.out"
    then
        echo "ok: $1: $(grep '^optimizer state' "$tmp/$1.out")"
    else
        echo "FAIL: $1: optimizer state not 1/$2 of the model's:"; grep '^optimizer\|^model' "$tmp/$1.out"
        fails=$((fails + 1))
    fi
}
ARGS="$ARGS_SAVED --shard"
for s in wfbp sync; do
    run "np2-$s-shard" 2 "$s" && compare np1 "np2-$s-shard" && state_check "np2-$s-shard" 2
done
if run np4-dear-shard 4 dear; then
    compare np1 np4-dear-shard
    compare_params np4-dear np4-dear-shard
    state_check np4-dear-shard 4
fi
ARGS="$ARGS_SAVED --clip 0"
run np2-noclip 2 dear
ARGS="$ARGS_SAVED --clip 0 --shard"
if [ -s "$tmp/np2-noclip.params" ] && run np2-noclip-shard 2 dear; then
    if cmp -s "$tmp/np2-noclip.params" "$tmp/np2-noclip-shard.params"; then
        echo "ok: sharded on 2 ranks has the unsharded parameters bit for bit"
    else
        echo "FAIL: sharded on 2 ranks, without clipping, differs from unsharded"; fails=$((fails + 1))
    fi
fi
[ $fails -eq 0 ] || { echo "gpt-equiv.sh: $fails check(s) failed"; exit 1; }
echo "gpt-equiv.sh: all runs agree"
