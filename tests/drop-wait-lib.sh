# shellcheck shell=sh
# tests/drop-wait-lib.sh: the mutation check of the memory fences (sourced after mpi-launch.sh).
#
#   drop_wait_check NAME NP SECONDS DROPS WRONG [NAME=VALUE]... PROGRAM [ARGS]...
#       runs PROGRAM on NP ranks once per word of DROPS, with DEAR_DEBUG_DROP_WAIT set to it:
#       `none` must pass; every other must fail with WRONG (a grep pattern) in its output, i.e.
#       on the values, not by crashing. Returns 0 when all did, else 1 (NAME starts the messages).
drop_wait_check() (
    name=$1 np=$2 secs=$3 drops=$4 wrong=$5
    shift 5
    log=$(mktemp) || exit 99
    trap 'rm -f "$log"' EXIT
    fail=0
    for drop in $drops; do
        mpi_run "$secs" "$np" CK_FORK=no DEAR_DEBUG_DROP_WAIT="$drop" "$@" >"$log" 2>&1
        rc=$?
        if [ "$drop" = none ]; then
            [ $rc -eq 0 ] || { echo "$name: every wait in place, yet the run failed ($rc):" >&2; tail -30 "$log" >&2; fail=1; }
        elif [ $rc -eq 0 ]; then
            echo "$name: DEAR_DEBUG_DROP_WAIT=$drop left a wait out and the results were still right" >&2
            fail=1
        elif ! grep -q "$wrong" "$log"; then
            echo "$name: DEAR_DEBUG_DROP_WAIT=$drop failed ($rc), but not on the values:" >&2
            tail -30 "$log" >&2
            fail=1
        else
            echo "$name: DEAR_DEBUG_DROP_WAIT=$drop: wrong results, as it must"
        fi
    done
    exit $fail
)
