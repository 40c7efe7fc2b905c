#!/bin/sh
# dear-cnn checkpoints: a run stopped at a checkpoint and resumed ends bit for bit where the
# uninterrupted run ends (same checkpoint bytes, same loss text); a process killed halfway
# through writing a checkpoint leaves the previous one intact, and resuming from it again ends
# bit for bit where the uninterrupted run does; a damaged checkpoint is refused. Sharded runs
# (--shard) write the same checkpoints and resume from unsharded ones.
. "${top_srcdir:-.}/tests/apps/cnn-lib.sh"
S=${CNN_SCHEDULE:-dear}   # CNN_SCHEDULE / CNN_NP: try other schedules and rank counts by hand
NP=${CNN_NP:-2}

# 1. Uninterrupted: 30 iterations (10 per epoch), checkpoints at 7, 14, 21, 28 and 30: resuming
#    happens in the middle of an epoch.
cnn_run $NP $SMALL --schedule $S --iters 30 --ckpt "$WORK/a.ckpt" --ckpt-every 7 >"$WORK/a.log" 2>&1 ||
    { cat "$WORK/a.log"; fail "uninterrupted run"; }
[ -f "$WORK/a.ckpt" ] || fail "no checkpoint written"
# The temporary file is a.ckpt.XXXXXX (mkstemp: never a predictable name).
[ -z "$(ls "$WORK" | grep '^a\.ckpt\.')" ] || fail "temporary checkpoint left behind: $(ls "$WORK")"

# 2. Killed while writing checkpoint 4 (iteration 28): checkpoint 3 (iteration 21) survives.
cnn_run $NP $SMALL --schedule $S --iters 30 --ckpt "$WORK/b.ckpt" --ckpt-every 7 --ckpt-test-crash 4 \
    >"$WORK/b.log" 2>&1 && { cat "$WORK/b.log"; fail "the crashing run exited 0"; }
grep -q "halfway through checkpoint 4" "$WORK/b.log" || { cat "$WORK/b.log"; fail "no crash"; }
partial=$(ls "$WORK" | grep '^b\.ckpt\.......$')
[ -n "$partial" ] && [ -s "$WORK/$partial" ] || fail "the crash left no partial temporary file: $(ls "$WORK")"
cmp -s "$WORK/b.ckpt" "$WORK/a.ckpt" && fail "the killed write replaced the checkpoint"
# ... and resuming from it finishes exactly like the uninterrupted run.
cnn_run $NP $SMALL --schedule $S --iters 30 --ckpt "$WORK/b.ckpt" --ckpt-every 7 --resume "$WORK/b.ckpt" \
    >"$WORK/c.log" 2>&1 || { cat "$WORK/c.log"; fail "resume after the crash"; }
grep -q "iterations from 21," "$WORK/c.log" || { cat "$WORK/c.log"; fail "did not resume at 21"; }
count_iters "$WORK/a.log" 30
[ "$(grep -c '^iter ' "$WORK/c.log")" -eq 9 ] || fail "the resumed run did not run iterations 22..30"
cmp "$WORK/a.ckpt" "$WORK/b.ckpt" || fail "resumed run differs from the uninterrupted run"
compare_losses "$WORK/a.log" "$WORK/c.log" 0 "resumed after crash vs uninterrupted"

# 3. A clean stop at iteration 14 (constant lr, so the stopping point changes nothing else),
#    then --resume to 30.
cnn_run $NP $SMALL --schedule $S --lr-schedule const --iters 30 --ckpt "$WORK/d.ckpt" --ckpt-every 7 \
    >"$WORK/d.log" 2>&1 || fail "const run"
cnn_run $NP $SMALL --schedule $S --lr-schedule const --iters 14 --ckpt "$WORK/e.ckpt" --ckpt-every 7 \
    >"$WORK/e.log" 2>&1 || fail "stopped run"
cnn_run $NP $SMALL --schedule $S --lr-schedule const --iters 30 --ckpt "$WORK/e.ckpt" --ckpt-every 7 \
    --resume "$WORK/e.ckpt" >"$WORK/f.log" 2>&1 || { cat "$WORK/f.log"; fail "resume after stop"; }
cmp "$WORK/d.ckpt" "$WORK/e.ckpt" || fail "stop + resume differs from the uninterrupted run"
cat "$WORK/e.log" "$WORK/f.log" >"$WORK/ef.log"
count_iters "$WORK/ef.log" 30
compare_losses "$WORK/d.log" "$WORK/ef.log" 0 "stopped + resumed vs uninterrupted"

# 4. Sharded updates (--shard): each rank keeps its slices of the momentum and rank 0 gathers
#    them into the same checkpoint format, so on 2 ranks (two summands add alike in any order)
#    the sharded run's checkpoints are the unsharded run's bit for bit, and a checkpoint of an
#    unsharded run resumes sharded to the uninterrupted unsharded run's end.
cnn_run $NP $SMALL --schedule $S --iters 30 --shard --ckpt "$WORK/s.ckpt" --ckpt-every 7 >"$WORK/s.log" 2>&1 ||
    { cat "$WORK/s.log"; fail "sharded run"; }
grep -q "^sharded updates: momentum of" "$WORK/s.log" || { cat "$WORK/s.log"; fail "no sharded momentum line"; }
if [ "$NP" -eq 2 ]; then
    cmp "$WORK/a.ckpt" "$WORK/s.ckpt" || fail "the sharded run's checkpoint differs from the unsharded one"
fi
cnn_run $NP $SMALL --schedule $S --lr-schedule const --iters 14 --ckpt "$WORK/t.ckpt" --ckpt-every 7 \
    >"$WORK/t.log" 2>&1 || fail "stopped unsharded run"
cnn_run $NP $SMALL --schedule $S --lr-schedule const --iters 30 --shard --ckpt "$WORK/t.ckpt" --ckpt-every 7 \
    --resume "$WORK/t.ckpt" >"$WORK/u.log" 2>&1 || { cat "$WORK/u.log"; fail "sharded resume"; }
if [ "$NP" -eq 2 ]; then
    cmp "$WORK/d.ckpt" "$WORK/t.ckpt" || fail "resumed sharded differs from the uninterrupted unsharded run"
fi

# 5. A damaged checkpoint is refused on every rank, with a reason, without hanging.
cp "$WORK/a.ckpt" "$WORK/bad.ckpt"
printf 'X' | dd of="$WORK/bad.ckpt" bs=1 seek=100 conv=notrunc 2>/dev/null
cnn_run $NP $SMALL --iters 30 --resume "$WORK/bad.ckpt" >"$WORK/g.log" 2>&1 && fail "damaged checkpoint accepted"
grep -q "checksum mismatch" "$WORK/g.log" || { cat "$WORK/g.log"; fail "no checksum message"; }
head -c 1000 "$WORK/a.ckpt" >"$WORK/short.ckpt"
cnn_run $NP $SMALL --iters 30 --resume "$WORK/short.ckpt" >"$WORK/h.log" 2>&1 && fail "truncated checkpoint accepted"
grep -q "truncated" "$WORK/h.log" || { cat "$WORK/h.log"; fail "no truncation message"; }
echo "PASS"
