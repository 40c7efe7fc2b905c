#!/bin/sh
# dear-cnn refuses bad input with a clear message and a non-zero exit on every rank, without
# hanging: bad options, a batch that does not divide across the ranks, a missing data folder.
. "${top_srcdir:-.}/tests/apps/cnn-lib.sh"
CNN_TIMEOUT=60

# expect_error NEEDLE ARGS...: 2 ranks, non-zero exit (not a timeout), NEEDLE in the output.
expect_error() {
    needle=$1
    shift
    cnn_run 2 "$@" >"$WORK/out" 2>&1
    rc=$?
    [ $rc -ne 0 ] || { cat "$WORK/out"; fail "'$*' exited 0"; }
    [ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "'$*' hung"
    grep -q -- "$needle" "$WORK/out" || { cat "$WORK/out"; fail "'$*': no '$needle' in the message"; }
    echo "ok: $* -> $(grep -m1 -- "$needle" "$WORK/out")"
}

expect_error "does not divide across 2 ranks" --data "$DATA" --batch 33
expect_error "unknown option '--bogus'" --bogus 1
expect_error "expected a number" --lr abc
expect_error "expected dear, wfbp or sync" --schedule fast
expect_error "needs a value" --epochs
expect_error "needs --ckpt-every" --ckpt "$WORK/x.ckpt"
expect_error "apt-get install dataset-fashion-mnist" --data "$WORK/nowhere"
expect_error "cannot open checkpoint" --data "$DATA" --train-limit 64 --resume "$WORK/none.ckpt"
# A bad DEAR_* value is refused by dear_init on every rank (the runtime names the variable).
DEAR_SCHEDULE=bogus
export DEAR_SCHEDULE
expect_error "DEAR_SCHEDULE='bogus'" --data "$DATA" --train-limit 64 --test-limit 64 --batch 32 --iters 1
unset DEAR_SCHEDULE
cnn_run 2 --help >"$WORK/out" 2>&1 || fail "--help exited non-zero"
grep -q -- "--schedule" "$WORK/out" || fail "--help does not list --schedule"
echo "PASS"
