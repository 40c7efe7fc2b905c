# shellcheck shell=sh disable=SC2034
# Shared by tests/dearbench-*.sh: where things are and how to start dear-bench under mpirun
# (the flags of tests/run-mpi.sh). Sourced, not run.
: "${top_srcdir:=.}" "${top_builddir:=.}"
BENCH=$top_builddir/apps/bench/dear-bench
TINY=$top_srcdir/tests/dearbench-tiny.prof
[ -x "$BENCH" ] || { echo "$BENCH not built" >&2; exit 99; }
command -v mpirun >/dev/null 2>&1 || { echo "no mpirun: skipped" >&2; exit 77; }
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM OMPI_MCA_btl_vader_single_copy_mechanism
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/dearbench.XXXXXX") || exit 99
trap 'rm -rf "$TMPD"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
# bench NP ARGS...: run dear-bench on NP ranks with a time limit; output in $TMPD/out, status in $rc.
# NP 0 runs one process without mpirun (an MPI singleton): mpirun spends about 2 s on any job
# that exits non-zero, which the argument tests would otherwise pay a dozen times.
bench() {
    np=$1; shift
    if [ "$np" = 0 ]; then
        timeout -k 5 60 "$BENCH" "$@" >"$TMPD/out" 2>&1
    else
        timeout -k 5 60 mpirun -np "$np" --oversubscribe --bind-to none --mca btl self,vader \
            --mca mpi_yield_when_idle 1 "$BENCH" "$@" >"$TMPD/out" 2>&1
    fi
    rc=$?
    [ $rc -eq 124 ] && fail "timed out: dear-bench $*"
    return 0
}
