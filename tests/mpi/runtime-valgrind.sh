#!/bin/sh
# make check-valgrind-runtime: the engine test (test_runtime engine: calls out of order, one
# training run per schedule against the MPI_Allreduce reference, the stall warning) on 2 ranks,
# each under valgrind memcheck; any memcheck error fails. Open MPI/PMIx internals are
# suppressed by tests/valgrind-ompi.supp; hwloc's x86 backend (cpuid) cannot run under valgrind
# and is switched off. VALGRIND_TOOL=helgrind runs the thread checker
# instead, with tests/mpi/helgrind-runtime.supp (foreign code only).
set -u
: "${top_srcdir:=.}" "${top_builddir:=.}"
exe=$top_builddir/tests/mpi/test_runtime
[ -x "$exe" ] || { echo "runtime-valgrind.sh: $exe not built" >&2; exit 99; }
command -v valgrind >/dev/null 2>&1 || { echo "valgrind not found: skipped"; exit 77; }
tool=${VALGRIND_TOOL:-memcheck}
supp=$top_srcdir/tests/valgrind-ompi.supp
extra=--leak-check=no
if [ "$tool" = helgrind ]; then
    supp=$top_srcdir/tests/mpi/helgrind-runtime.supp
    extra=
fi
OMPI_ALLOW_RUN_AS_ROOT=1; OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; CK_FORK=no
OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM CK_FORK OMPI_MCA_btl_vader_single_copy_mechanism
# libtool wrapper scripts: run valgrind on the real binary
real=$exe
[ -x "$top_builddir/tests/mpi/.libs/test_runtime" ] && real=$top_builddir/tests/mpi/.libs/test_runtime
timeout -k 10 900 mpirun -np 2 --oversubscribe --bind-to none --mca btl self,vader \
    --mca mpi_yield_when_idle 1 -x CK_FORK -x HWLOC_COMPONENTS=-x86 \
    valgrind --tool="$tool" --error-exitcode=1 $extra \
    --suppressions="$supp" --quiet "$real" engine
rc=$?
echo "runtime-valgrind.sh: $tool exit status $rc"
exit $rc
