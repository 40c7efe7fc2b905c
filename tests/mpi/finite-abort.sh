#!/bin/sh
# DEAR_CHECK_FINITE=abort (test_finite --abort, 3 ranks): rank 1's NaN in iteration 4 ends the job
# with a non-zero status and rank 1's message naming the tensor, the iteration and the count.
set -u
: "${top_builddir:=.}" "${top_srcdir:=.}"
. "$top_srcdir/tests/mpi-launch.sh"
exe=$top_builddir/tests/mpi/test_finite
[ -x "$exe" ] || { echo "finite-abort.sh: $exe not built" >&2; exit 99; }
out=$(mktemp /tmp/dear-finite.XXXXXX) || exit 99
trap 'rm -f "$out"' EXIT
want="rank 1: the gradient of tensor 'b' (layer 1, elements 0..600) has 3 non-finite values in iteration 4, before its reduce-scatter: this rank made them; aborting every rank"
mpi_run 120 3 "$exe" --abort >"$out" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
    cat "$out"; echo "finite-abort.sh: the job did not fail" >&2; exit 1
fi
if ! grep -qF "$want" "$out"; then
    cat "$out"; echo "finite-abort.sh: no message '$want'" >&2; exit 1
fi
echo "finite-abort.sh: the job ended with status $rc: $(grep -F -m1 "$want" "$out")"
