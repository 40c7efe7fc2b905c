#!/bin/sh
# dear-cnn numerics under dear: 2-rank and 3-rank runs equal a 1-rank run with the same global
# batch, and the three schedules (dear, wfbp, sync) give the same loss curve, to float
# tolerance. 3 ranks, because with 2 a sum of two floats is exact in either order and would hide
# reduction-order effects. 20 iterations over 480 images: the runs cross an epoch boundary
# (reshuffle, flush, evaluation).
. "${top_srcdir:-.}/tests/cnn-lib.sh"
ARGS="$SMALL --epochs 2"

cnn_run 1 $ARGS --schedule dear >"$WORK/np1.log" 2>&1 || { cat "$WORK/np1.log"; fail "np 1 run"; }
cnn_run 2 $ARGS --schedule dear >"$WORK/np2.log" 2>&1 || { cat "$WORK/np2.log"; fail "np 2 run"; }
for s in dear wfbp sync; do
    cnn_run 3 $ARGS --schedule $s >"$WORK/np3-$s.log" 2>&1 ||
        { cat "$WORK/np3-$s.log"; fail "np 3 --schedule $s run"; }
done
for f in np1 np2 np3-dear np3-wfbp np3-sync; do count_iters "$WORK/$f.log" 20; done
# Float32 sums in a different order (partial batches, then an average): relative 1e-4.
compare_losses "$WORK/np1.log" "$WORK/np2.log" 1e-4 "np 1 vs np 2 (dear)"
compare_losses "$WORK/np1.log" "$WORK/np3-dear.log" 1e-4 "np 1 vs np 3 (dear)"
compare_losses "$WORK/np3-dear.log" "$WORK/np3-wfbp.log" 1e-5 "np 3: dear vs wfbp"
compare_losses "$WORK/np3-dear.log" "$WORK/np3-sync.log" 1e-5 "np 3: dear vs sync"
# Training does something: the last loss is well below the first.
awk '/^iter 1 /{a=$6} /^iter 20 /{b=$6} END{exit !(b < 0.8 * a)}' "$WORK/np3-dear.log" ||
    fail "loss did not fall"
echo "PASS"
