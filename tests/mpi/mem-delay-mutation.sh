#!/bin/sh
# The delayed memory row catches a missing fence: test_loop_delay (2 ranks, the learning-rate
# test under every schedule) must fail, with parameters that differ from the MPI_Allreduce loop,
# for each wait DEAR_DEBUG_DROP_WAIT leaves out, and pass with every wait in place.
set -u
: "${top_builddir:=.}" "${top_srcdir:=.}"
. "$top_srcdir/tests/mpi-launch.sh"
exe=$top_builddir/tests/mpi/test_loop_delay
[ -x "$exe" ] || { echo "mem-delay-mutation.sh: $exe not built" >&2; exit 99; }
log=$(mktemp) || exit 99
trap 'rm -f "$log"' EXIT
fail=0
for drop in none packed done; do
    mpi_run 120 2 CK_FORK=no MEM_DELAY_US=300 MEM_DELAY_SEED=7 DEAR_DEBUG_DROP_WAIT=$drop "$exe" --lr-only \
        >"$log" 2>&1
    rc=$?
    if [ $drop = none ]; then
        [ $rc -eq 0 ] || { echo "mem-delay-mutation.sh: every wait in place, yet the run failed ($rc):" >&2; tail -20 "$log" >&2; fail=1; }
    elif [ $rc -eq 0 ]; then
        echo "mem-delay-mutation.sh: DEAR_DEBUG_DROP_WAIT=$drop left a wait out and the results were still right" >&2
        fail=1
    elif ! grep -q 'differ from the MPI_Allreduce loop' "$log"; then
        echo "mem-delay-mutation.sh: DEAR_DEBUG_DROP_WAIT=$drop failed ($rc), but not on the values:" >&2
        tail -20 "$log" >&2
        fail=1
    else
        echo "mem-delay-mutation.sh: DEAR_DEBUG_DROP_WAIT=$drop: wrong results, as it must"
    fi
done
exit $fail
