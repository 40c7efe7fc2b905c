#!/bin/sh
# DEAR_STALL_ABORT_S=1 with rank 1 asleep for 30 s (test_runtime stall-abort): the job must end
# with a non-zero status well before rank 1 wakes, and the abort message must name the phase,
# the bucket, the layers and the parameter. The limit is on the whole job, start-up and
# calibration included, so it leaves room for a loaded machine (make -j2 check ran it in 8 s
# with an 8 s sleep); an abort that never comes still fails, at 30 s.
set -u
: "${top_builddir:=.}"
exe=$top_builddir/tests/mpi/test_runtime
[ -x "$exe" ] || { echo "runtime-stall-abort.sh: $exe not built" >&2; exit 99; }
out=$(mktemp /tmp/dear-abort.XXXXXX) || exit 99
trap 'rm -f "$out"' EXIT
t0=$(date +%s)
timeout -k 5 60 mpirun -np 2 --oversubscribe --bind-to none --mca btl self,vader \
    --mca mpi_yield_when_idle 1 -x CK_FORK=no "$exe" stall-abort >"$out" 2>&1
rc=$?
dt=$(( $(date +%s) - t0 ))
cat "$out"
[ $rc -ne 0 ] || { echo "runtime-stall-abort.sh: the job did not fail" >&2; exit 1; }
grep -q "stall: reduce-scatter of bucket [0-9]* (layers [0-9.]*, .* past DEAR_STALL_ABORT_S=1: aborting" "$out" ||
    { echo "runtime-stall-abort.sh: no abort message" >&2; exit 1; }
[ $dt -lt 20 ] || { echo "runtime-stall-abort.sh: took ${dt}s, the abort came too late" >&2; exit 1; }
echo "runtime-stall-abort.sh: aborted after ${dt}s with status $rc: ok"
