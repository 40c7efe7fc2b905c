#!/bin/sh
# dear-bench must catch a wrong result: a perturbed gradient on one rank (the parameters stay
# identical across ranks but leave the float64 reference) and a perturbed parameter on one rank
# (ranks differ). Both must exit 1, say PARAMETER CHECK FAILED and mark the CSV row.
. "${top_srcdir:-.}/tests/apps/dearbench-lib.sh"
for spec in "3 grad reference-mismatch" "2 param ranks-differ"; do
    set -- $spec
    bench "$1" --profile "$TINY" --iters 3 --warmup 6 --quiet --configs "dear:threshold:100k;wfbp:none" \
        --inject-fault "$2" --csv "$TMPD/f.csv"
    [ $rc -eq 1 ] || fail "fault $2 at np $1: exit status $rc, expected 1"
    grep -q "PARAMETER CHECK FAILED" "$TMPD/out" || fail "fault $2: no PARAMETER CHECK FAILED message"
    n=$(grep -c ",$3" "$TMPD/f.csv" 2>/dev/null)
    [ "$n" = 2 ] || { cat "$TMPD/f.csv" >&2; fail "fault $2: expected 2 CSV rows marked $3, got $n"; }
done
# The same run without a fault passes (the check is not merely always failing).
bench 2 --profile "$TINY" --iters 3 --warmup 6 --quiet --configs "dear:threshold:100k;wfbp:none"
[ $rc -eq 0 ] || { cat "$TMPD/out" >&2; fail "clean run: exit status $rc"; }
[ $fails -eq 0 ]
