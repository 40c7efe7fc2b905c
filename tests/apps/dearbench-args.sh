#!/bin/sh
# dear-bench refuses bad arguments and bad profiles with exit status 2 and a message naming the
# problem, quickly: alone, and on 2 ranks (no hang waiting for the other rank).
. "${top_srcdir:-.}/tests/apps/dearbench-lib.sh"
expect() { # expect NP 'message part' ARGS...
    np=$1; msg=$2; shift 2
    bench "$np" "$@"
    [ $rc -eq 2 ] || fail "dear-bench $*: exit status $rc, expected 2"
    grep -q -- "$msg" "$TMPD/out" || { cat "$TMPD/out" >&2; fail "dear-bench $*: no message '$msg'"; }
}
printf 'dear-profile 1\nlayer 0 0.001 0.002\ntensor a 0 100\n' >"$TMPD/trunc.prof"
printf 'dear-profile 1\nlayer 0 0.001 0.002\ntensor a 7 100\nend 1 1\n' >"$TMPD/badlayer.prof"
expect 0 "profile FILE is required" --iters 3
expect 2 "cannot open profile" --profile "$TMPD/none.prof"
expect 0 "truncated" --profile "$TMPD/trunc.prof"
expect 2 "cannot use profile" --profile "$TMPD/badlayer.prof"
expect 2 "schedule 'bogus'" --profile "$TINY" --configs "sync;bogus"
expect 0 "planner 'fast'" --profile "$TINY" --configs "dear:fast"
expect 0 "SCHEDULE\[:PLANNER" --profile "$TINY" --configs "dear:threshold:12q"
expect 0 "cannot be combined" --profile "$TINY" --configs "sync" --schedule dear
expect 0 "--iters '0'" --profile "$TINY" --iters 0
expect 0 "--rounds '0'" --profile "$TINY" --rounds 0
expect 0 "--rounds 4 exceeds --iters 3" --profile "$TINY" --iters 3 --rounds 4
expect 0 "--size-scale '-1'" --profile "$TINY" --size-scale -1
expect 0 "--time-scale 'x'" --profile "$TINY" --time-scale x
expect 0 "--alpha and --beta go together" --profile "$TINY" --alpha 1e-5
expect 0 "at most one cost model" --profile "$TINY" --preset 10gbe --alpha 1 --beta 1
expect 0 "--preset 'nope'" --profile "$TINY" --preset nope
expect 0 "unknown or incomplete option" --profile "$TINY" --frobnicate
expect 0 "--inject-fault 'x'" --profile "$TINY" --inject-fault x
expect 0 "--jitter-ms '-1'" --profile "$TINY" --jitter-ms -1
expect 0 "--jitter-seed 'x'" --profile "$TINY" --jitter-seed x
expect 0 "suffix '+dense' is not +sparse, +shard, +part=SIZE, +first=MODE, +hold, +nohints, +bf16" --profile "$TINY" \
    --configs "dear:threshold+dense"
expect 0 "+first=soon is not one of first|range|threshold" --profile "$TINY" --configs "dear:auto+first=soon"
expect 0 "--first-n '0'" --profile "$TINY" --first-n 0
expect 2 "cannot use --hints" --profile "$TINY" --hints "$TMPD/none.model"
printf 'dear-model 1\nlayer 0 5\nlayer 1 5\ntensor a 0 100\nend 2 1\n' >"$TMPD/other.model"
expect 0 "layers are not the profile's" --profile "$TINY" --hints "$TMPD/other.model"
expect 0 "'+compress=bf8': a format is one of none|bf16|fp16" --profile "$TINY" --configs "dear:auto+compress=bf8"
expect 0 "suffix '+fp16' is not" --profile "$TINY" --configs "dear:auto+bf16+fp16"
expect 0 "suffix '+bf16' is not" --profile "$TINY" --configs "dear:auto+int8+bf16"
expect 0 "suffix '+noef' is not" --profile "$TINY" --configs "dear:auto+int8+ef+noef"
expect 0 "suffix '+sparse' is not" --profile "$TINY" --configs "dear:threshold+sparse+sparse"
expect 0 "+part: DEAR_PARTITION='1q' is not valid" --profile "$TINY" --configs "dear:auto+part=1q"
expect 0 "declares no sparse tensor" --profile "$TINY" --configs "wfbp:none;dear:threshold+sparse"
expect 0 "--tokens '0'" --profile "$TINY" --tokens 0
expect 0 "--zipf 'x'" --profile "$TINY" --zipf x
printf 'dear-profile 1\nlayer 0 0.001 0.002\ntensor a 0 100\nsparse a 10 0.5 0.5\nend 1 1\n' >"$TMPD/rows.prof"
expect 0 "blocks of 10 bytes are not whole float32" --profile "$TMPD/rows.prof"
bench 0 --help
[ $rc -eq 0 ] && grep -q -- "--configs LIST" "$TMPD/out" && grep -q -- "--jitter-ms X" "$TMPD/out" || fail "--help"
[ $fails -eq 0 ]
