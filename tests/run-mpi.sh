#!/bin/sh
# Test driver for *.mpi files (Makefile.am: MPI_LOG_COMPILER), launching through
# tests/mpi-launch.sh. A .mpi file is a few shell assignments naming an MPI test program and how
# to run it:
#   NP=3                         ranks (oversubscribed: more ranks than cores is fine)
#   PROG=tests/mpi/test_coll     program, relative to the build directory
#   ARGS="--quick"               optional arguments
#   ENVS="DEAR_SCHEDULE=wfbp"    optional environment for every rank
#   TIMEOUT=300                  optional limit in seconds (default 600)
# Exit status: the program's (77 = skipped, 1 when it got another rank count), 124 on timeout.
set -u
spec=$1
NP=1; PROG=; ARGS=; ENVS=; TIMEOUT=600
# shellcheck disable=SC1090
. "$spec"
: "${top_builddir:=.}" "${top_srcdir:=.}"
. "$top_srcdir/tests/mpi-launch.sh"
[ -n "$PROG" ] || { echo "run-mpi.sh: $spec names no PROG" >&2; exit 99; }
exe=$top_builddir/$PROG
[ -x "$exe" ] || { echo "run-mpi.sh: $exe not built" >&2; exit 99; }
echo "run-mpi.sh: $MPIRUN $MPIRUN_NP $NP $MPIRUN_FLAGS $PROG $ARGS ($ENVS)"
# Check must not fork under MPI. The program fails unless it got NP ranks (MPI_TEST_NP).
# shellcheck disable=SC2086
mpi_run "$TIMEOUT" "$NP" CK_FORK=no $ENVS "$exe" $ARGS
rc=$?
[ $rc -eq 124 ] && echo "run-mpi.sh: $PROG -np $NP timed out after ${TIMEOUT}s" >&2
exit $rc
