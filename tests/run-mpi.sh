#!/bin/sh
# Test driver for *.mpi files (Makefile.am: MPI_LOG_COMPILER). A .mpi file is a few shell
# assignments naming an MPI test program and how to run it:
#   NP=3                         ranks (oversubscribed: more ranks than cores is fine)
#   PROG=tests/mpi/test_coll     program, relative to the build directory
#   ARGS="--quick"               optional arguments
#   ENVS="DEAR_SCHEDULE=wfbp"    optional environment for every rank
#   TIMEOUT=300                  optional limit in seconds (default 600)
# Exit status: the program's (77 = skipped), 124 on timeout.
set -u
spec=$1
NP=1; PROG=; ARGS=; ENVS=; TIMEOUT=600
# shellcheck disable=SC1090
. "$spec"
: "${top_builddir:=.}"
[ -n "$PROG" ] || { echo "run-mpi.sh: $spec names no PROG" >&2; exit 99; }
exe=$top_builddir/$PROG
[ -x "$exe" ] || { echo "run-mpi.sh: $exe not built" >&2; exit 99; }
envargs=
for e in $ENVS; do envargs="$envargs -x $e"; done
echo "run-mpi.sh: mpirun -np $NP $PROG $ARGS ($ENVS)"
# Check must not fork under MPI; ranks share the node through vader only.
CK_FORK=no
export CK_FORK
# shellcheck disable=SC2086
timeout -k 10 "$TIMEOUT" mpirun -np "$NP" --oversubscribe --bind-to none \
    --mca btl self,vader --mca mpi_yield_when_idle 1 -x CK_FORK $envargs "$exe" $ARGS
rc=$?
[ $rc -eq 124 ] && echo "run-mpi.sh: $PROG -np $NP timed out after ${TIMEOUT}s" >&2
exit $rc
