#!/bin/sh
# dear-gpt's word vocabulary with a sparse input embedding: DEAR_SPARSE=on sends only the rows
# of the tokens in each batch and must train as DEAR_SPARSE=off (dense) does. With the same
# global batch and seed, on 2, 3 and 4 ranks, every schedule (dear, wfbp, sync) with the sparse
# path on and off (and auto on 2 ranks) must end with the parameters of dense sync on as many
# ranks, to float tolerance, and give the loss curve and final validation loss of dense sync on
# 2 ranks (the ranks split the same global batch). The app's line from dear_get_sparse_stats must
# show the sparse runs really sent sparse messages for the embedding (and far fewer bytes than
# its dense collectives would: a bound computed here from the vocabulary, width and ranks), and
# the dense runs none. The text is generated here, so the test needs no data package.
. "${top_srcdir:-.}/tests/apps/gpt-lib.sh"
# About 2800 distinct words with Zipf-like frequencies (log-uniform ranks); half the words
# follow from the previous one, so there is context to learn. A small LCG picks (exact in awk's
# doubles; every rank reads this one file).
awk 'function name(w,   t) {
        t = "w"; do { t = t sprintf("%c", 97 + w % 26); w = int(w / 26) } while (w > 0); return t
    }
    BEGIN {
        N = 3000; s = 12345; n = 0
        while (n < 100000) {
            s = (s * 75 + 74) % 65537; k = 3 + s % 6; line = ""; prev = -1
            for (i = 0; i < k; i++) {
                s = (s * 75 + 74) % 65537
                if (prev >= 0 && s % 2) w = (prev * 7 + 3) % N
                else { s = (s * 75 + 74) % 65537; w = int(exp(s / 65537 * log(N))) - 1 }
                line = line (i ? " " : "") name(w); prev = w
            }
            line = line ".\n"; printf "%s", line; n += length(line)
        }
    }' >"$tmp/words.txt"
[ "$(wc -c <"$tmp/words.txt")" -ge 100000 ] ||
    { echo "gpt-words.sh: awk wrote no text" >&2; exit 99; }

K=1000 DIM=16 ITERS=12
# a global batch of 12 sequences divides over 2, 3 and 4 ranks: 96, 64 or 48 tokens per rank
ARGS="--data $tmp/words.txt --vocab words --vocab-size $K --iters $ITERS --batch 12 --seq 16
      --dim $DIM --heads 2 --layers 1 --lr 1e-2 --seed 3 --print-every 0 --eval-every 6
      --sample 20 --val-chars 8192"

# sparse_check NAME NP on|off|shard: the line "sparse embedding wte ..." of the run. on: every
# phase sparse, only sparse messages, a density in (0, 0.1], and fewer bytes than a quarter of
# what the dense collectives of the embedding send in ITERS iterations (2 (P-1)/P of its rows, all
# of its bytes, each iteration); shard: the same with the reduce-scatters sparse and the
# all-gathers (parameters) dense; off: dense, density not measured, no sparse message.
sparse_check() {
    line=$(grep '^sparse embedding wte' "$tmp/$1.out")
    if [ -z "$line" ]; then
        echo "FAIL: $1 printed no sparse embedding line"; fails=$((fails + 1)); return
    fi
    if echo "$line" | awk -v np="$2" -v want="$3" -v k="$K" -v dim="$DIM" -v iters="$ITERS" '
        {
            phases = $0; sub(/;.*/, "", phases); sub(/^[^:]*: /, "", phases)
            match($0, /[0-9]+ sparse and [0-9]+ dense messages, [0-9.]+ MB/)
            split(substr($0, RSTART, RLENGTH), m, " ")
            dense_mb = 2 * (np - 1) / np * (k + 1) * dim * 4 * iters / 1e6
            if (want == "on" || want == "shard") {
                match($0, /warm-up density [0-9.]+/); d = substr($0, RSTART + 16, RLENGTH - 16) + 0
                ok = (want == "on" ? phases !~ /dense/ : phases == "reduce-scatter sparse, all-gather dense") &&
                     m[1] > 0 && m[4] == 0 && d > 0 && d <= 0.1 && m[7] < dense_mb / 4
            } else {
                ok = phases !~ /sparse/ && /density not measured/ && m[1] == 0
            }
            exit !ok
        }'
    then
        echo "ok: $1: $line"
    else
        echo "FAIL: $1: expected the embedding to go $3 sparse: $line"
        fails=$((fails + 1))
    fi
}

run np2-sync-off 2 sync DEAR_SPARSE=off || exit 1
sparse_check np2-sync-off 2 off
# the vocabulary line: K words of the distinct tokens, <unk> for the rest
if grep -q "^words: the $K most frequent of the [0-9]* distinct tokens" "$tmp/np2-sync-off.out" &&
    grep -q "vocabulary $((K + 1))," "$tmp/np2-sync-off.out"; then
    echo "ok: $(grep '^words:' "$tmp/np2-sync-off.out")"
else
    echo "FAIL: no vocabulary of $K words and <unk>"; sed 's/^/    | /' "$tmp/np2-sync-off.out"
    fails=$((fails + 1))
fi
for np in 2 3 4; do
    ref=np$np-sync-off
    if [ "$np" -ne 2 ]; then
        run "$ref" "$np" sync DEAR_SPARSE=off || continue
        compare np2-sync-off "$ref"
    fi
    for s in sync wfbp dear; do
        for mode in off on; do
            name=np$np-$s-$mode
            [ "$name" = "$ref" ] && continue
            run "$name" "$np" "$s" DEAR_SPARSE=$mode || continue
            compare_params "$ref" "$name"
            compare np2-sync-off "$name"
            sparse_check "$name" "$np" $mode
        done
    done
done
# auto measures the density over the warm-up and keeps the sparse form, which sends less
if run np2-dear-auto 2 dear DEAR_SPARSE=auto; then
    compare_params np2-sync-off np2-dear-auto
    compare np2-sync-off np2-dear-auto
    sparse_check np2-dear-auto 2 on
fi
# sharded updates (--shard): the reduce-scatters still sparse, the all-gathers carry parameters
unsharded=$ARGS ARGS="$ARGS --shard"
if run np3-dear-shard 3 dear DEAR_SPARSE=on; then
    compare_params np3-sync-off np3-dear-shard
    compare np2-sync-off np3-dear-shard
    sparse_check np3-dear-shard 3 shard
fi
ARGS=$unsharded
[ $fails -eq 0 ] || { echo "gpt-words.sh: $fails check(s) failed"; exit 1; }
echo "gpt-words.sh: sparse and dense runs agree"
