#!/bin/sh
# make check-valgrind-runtime: the engine test (test_runtime engine: calls out of order, one
# training run per schedule against the MPI_Allreduce reference, the stall warning) on 2 ranks,
# each under valgrind memcheck; any memcheck error fails. Open MPI/PMIx internals are
# suppressed by tests/valgrind-ompi.supp; hwloc's x86 backend (cpuid) cannot run under valgrind
# and is switched off. VALGRIND_TOOL=helgrind runs the thread checker
# instead, with tests/mpi/helgrind-runtime.supp (Open MPI's own state only); it first proves
# that those suppressions still report a race on a user buffer that Open MPI copies
# (tests/mpi/helgrind_race), then runs the engine test.
set -u
: "${top_srcdir:=.}" "${top_builddir:=.}"
exe=$top_builddir/tests/mpi/test_runtime
[ -x "$exe" ] || { echo "runtime-valgrind.sh: $exe not built" >&2; exit 99; }
command -v valgrind >/dev/null 2>&1 || { echo "valgrind not found: skipped"; exit 77; }
. "$top_srcdir/tests/mpi-launch.sh"
# The suppressions name Open MPI's and PMIx's functions: another MPI's internals would fail it.
[ "$MPI_FLAVOUR" = openmpi ] ||
    { echo "runtime-valgrind.sh: the suppressions cover Open MPI only, this build uses $MPI_FLAVOUR: skipped"; exit 77; }
tool=${VALGRIND_TOOL:-memcheck}
supp=$top_srcdir/tests/valgrind-ompi.supp
extra=--leak-check=no
if [ "$tool" = helgrind ]; then
    supp=$top_srcdir/tests/mpi/helgrind-runtime.supp
    extra=
    race=$top_builddir/tests/mpi/helgrind_race
    [ -x "$race" ] || { echo "runtime-valgrind.sh: $race not built" >&2; exit 99; }
    out=$(mpi_run 300 2 valgrind --tool=helgrind --error-exitcode=1 --suppressions="$supp" \
        "$race" 2>&1)
    rrc=$?
    if [ $rrc -ne 1 ] || ! echo "$out" | grep -q "planted_write"; then
        echo "$out" | tail -40
        echo "runtime-valgrind.sh: helgrind did not report the race helgrind_race plants" \
            "(exit $rrc): the suppressions hide races on user buffers" >&2
        exit 1
    fi
    echo "runtime-valgrind.sh: the planted race is reported ($(echo "$out" |
        grep -c 'Possible data race') report(s), in planted_write)"
fi
# libtool wrapper scripts: run valgrind on the real binary
real=$exe
[ -x "$top_builddir/tests/mpi/.libs/test_runtime" ] && real=$top_builddir/tests/mpi/.libs/test_runtime
# shellcheck disable=SC2086
mpi_run 900 2 CK_FORK=no HWLOC_COMPONENTS=-x86 valgrind --tool="$tool" --error-exitcode=1 $extra \
    --suppressions="$supp" --quiet "$real" engine
rc=$?
echo "runtime-valgrind.sh: $tool exit status $rc"
exit $rc
