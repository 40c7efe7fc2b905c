#!/bin/sh
# The delayed memory row catches a missing fence: test_loop_delay (2 ranks, the learning-rate
# test under every schedule, unsharded and sharded) must fail, with parameters that differ from
# the MPI_Allreduce loop, for each wait DEAR_DEBUG_DROP_WAIT leaves out, and pass with every wait
# in place.
set -u
: "${top_builddir:=.}" "${top_srcdir:=.}"
. "$top_srcdir/tests/mpi-launch.sh"
. "$top_srcdir/tests/drop-wait-lib.sh"
exe=$top_builddir/tests/mpi/test_loop_delay
[ -x "$exe" ] || { echo "mem-delay-mutation.sh: $exe not built" >&2; exit 99; }
rc=0
drop_wait_check mem-delay-mutation.sh 2 120 "none packed done" 'differ from the MPI_Allreduce loop' \
    MEM_DELAY_US=300 MEM_DELAY_SEED=7 "$exe" --lr-only || rc=1
drop_wait_check mem-delay-mutation.sh 2 120 "none packed done" 'differ from the MPI_Allreduce loop' \
    MEM_DELAY_US=300 MEM_DELAY_SEED=7 "$exe" --shard-lr-only || rc=1
exit $rc
