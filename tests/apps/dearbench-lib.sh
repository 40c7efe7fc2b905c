# shellcheck shell=sh disable=SC2034
# Shared by tests/dearbench-*.sh: where things are and how to start dear-bench on N ranks
# (tests/mpi-launch.sh). Sourced, not run.
: "${top_srcdir:=.}" "${top_builddir:=.}"
BENCH=$top_builddir/apps/bench/dear-bench
TINY=$top_srcdir/tests/apps/dearbench-tiny.prof
[ -x "$BENCH" ] || { echo "$BENCH not built" >&2; exit 99; }
. "$top_srcdir/tests/mpi-launch.sh"
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/dearbench.XXXXXX") || exit 99
trap 'rm -rf "$TMPD"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
# bench NP ARGS...: run dear-bench on NP ranks with a time limit; output in $TMPD/out, status in $rc.
# NP 0 runs one process without a launcher (an MPI singleton): Open MPI's mpirun spends about 2 s
# on any job that exits non-zero, which the argument tests would otherwise pay a dozen times.
bench() {
    np=$1; shift
    if [ "$np" = 0 ]; then
        timeout -k 5 60 "$BENCH" "$@" >"$TMPD/out" 2>&1
    else
        mpi_run 60 "$np" "$BENCH" "$@" >"$TMPD/out" 2>&1
    fi
    rc=$?
    [ $rc -eq 124 ] && fail "timed out: dear-bench $*"
    [ "$np" = 0 ] || mpi_check_np "$np" "$TMPD/out" || fail "dear-bench $*: not on $np ranks"
    return 0
}
