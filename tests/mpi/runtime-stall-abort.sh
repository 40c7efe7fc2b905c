#!/bin/sh
# A peer that is gone ends the job (test_runtime stall-abort, DEAR_STALL_ABORT_S=1), for each
# PEER_FAULT: rank 1 asleep for 30 s in backward, rank 1 stopped (SIGSTOP), rank 1 leaving the
# loop early (its dear_finalize while rank 0 still trains). The job must end with a non-zero
# status well before the fault would have, with a message naming the phase, bucket and layers
# (stall) or the ranks that never came (finalize). The limit is on the whole job, start-up and
# calibration included, so it leaves room for a loaded machine (make -j2 check ran the sleep case
# in 8 s with an 8 s sleep); an abort that never comes still fails, at 30 s.
set -u
: "${top_builddir:=.}" "${top_srcdir:=.}"
. "$top_srcdir/tests/mpi-launch.sh"
exe=$top_builddir/tests/mpi/test_runtime
[ -x "$exe" ] || { echo "runtime-stall-abort.sh: $exe not built" >&2; exit 99; }
out=$(mktemp /tmp/dear-abort.XXXXXX) || exit 99
trap 'rm -f "$out"' EXIT
fails=0
for fault in sleep stop leave; do
    case $fault in
    leave) want="dear_finalize: after [0-9.]* s (DEAR_STALL_ABORT_S=1), rank(s) 0 have not reached dear_finalize" ;;
    *) want="stall: reduce-scatter of bucket [0-9]* (layers [0-9.]*, .*waiting for messages from rank(s) 1), past DEAR_STALL_ABORT_S=1: aborting" ;;
    esac
    t0=$(date +%s)
    mpi_run 60 2 CK_FORK=no PEER_FAULT=$fault "$exe" stall-abort >"$out" 2>&1
    rc=$?
    dt=$(( $(date +%s) - t0 ))
    if [ $rc -eq 0 ]; then
        cat "$out"; echo "runtime-stall-abort.sh: $fault: the job did not fail" >&2; fails=$((fails + 1))
    elif ! grep -q "$want" "$out"; then
        cat "$out"; echo "runtime-stall-abort.sh: $fault: no message matching '$want'" >&2; fails=$((fails + 1))
    elif [ $dt -ge 20 ]; then
        cat "$out"; echo "runtime-stall-abort.sh: $fault: took ${dt}s, the abort came too late" >&2; fails=$((fails + 1))
    else
        echo "runtime-stall-abort.sh: $fault: job ended after ${dt}s with status $rc: $(grep -m1 "$want" "$out")"
    fi
done
[ $fails -eq 0 ]
