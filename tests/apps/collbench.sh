#!/bin/sh
# dear-coll-bench: --stream N times N collectives back to back and reports the time per collective,
# every result still verified; a bad --stream is refused with its name and the status 1 of a usage
# error, before any collective runs.
: "${top_srcdir:=.}" "${top_builddir:=.}"
CB=$top_builddir/apps/tools/dear-coll-bench
[ -x "$CB" ] || { echo "$CB not built" >&2; exit 99; }
. "$top_srcdir/tests/mpi-launch.sh"
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/collbench.XXXXXX") || exit 99
trap 'rm -rf "$TMPD"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

mpi_run 60 3 "$CB" --min 4k --max 8k --ops rs,ag --algos direct,ring --iters 2 --warmup 0 --stream 5 \
    --csv "$TMPD/s.csv" >"$TMPD/out" 2>&1 || fail "--stream 5 exited $?: $(cat "$TMPD/out")"
# op,algo,dtype,bytes,count,nranks,time_us,algbw_MBps,busbw_MBps,wrong: 2 ops x 2 algos x 2 sizes,
# each verified (wrong 0) and timed (time > 0).
rows=$(awk -F, 'NR > 1 && $6 == 3 && $7 > 0 && $10 == 0' "$TMPD/s.csv" | wc -l)
[ "$rows" -eq 8 ] || fail "--stream 5: $rows of 8 rows verified and timed: $(cat "$TMPD/s.csv")"

for bad in 0 -3 x; do
    timeout -k 5 60 "$CB" --stream "$bad" >"$TMPD/out" 2>&1
    rc=$?
    [ $rc -ne 0 ] || fail "--stream $bad accepted"
    grep -q "bad value '$bad' for --stream" "$TMPD/out" || fail "--stream $bad: $(cat "$TMPD/out")"
done
[ $fails -eq 0 ] && echo "PASS: dear-coll-bench --stream"
exit $((fails > 0))
