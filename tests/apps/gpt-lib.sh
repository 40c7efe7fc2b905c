# shellcheck shell=sh
# tests/apps/gpt-lib.sh: shared by tests/apps/gpt-equiv.sh and gpt-words.sh (sourced, not run).
# Finds dear-gpt, makes a scratch folder $tmp, runs dear-gpt with $ARGS on N ranks, and compares
# two runs' loss curves and final validation losses, or their trained parameters, to a tolerance;
# failures count in $fails.
set -u
: "${top_srcdir:=.}"
: "${top_builddir:=.}"
exe=$top_builddir/apps/gpt/dear-gpt
[ -x "$exe" ] || { echo "$0: $exe not built" >&2; exit 99; }
. "$top_srcdir/tests/mpi-launch.sh"
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM
TOL=${GPT_EQUIV_TOL:-2e-4}  # relative, per iteration
# Per parameter, relative to the larger magnitude or 1: a tenth of one AdamW step at --lr 1e-2.
# Sums of 3 or more ranks in another order move a parameter by far less (AdamW scales rounding
# in small gradients up); a lost or wrong gradient row moves it by whole steps.
PTOL=${GPT_PARAMS_TOL:-1e-3}
fails=0

# run NAME NP SCHEDULE [VAR=VALUE]...: dear-gpt $ARGS on NP ranks with the variables in their
# environment; $tmp/NAME.out (output), .loss (--loss-out, $ITERS lines), .val (final validation),
# .params (--params-out: the trained parameters).
run() {
    run_name=$1 run_np=$2 run_sched=$3
    shift 3
    # shellcheck disable=SC2086
    mpi_run 300 "$run_np" "$@" "$exe" $ARGS --schedule "$run_sched" \
        --loss-out "$tmp/$run_name.loss" --params-out "$tmp/$run_name.params" \
        >"$tmp/$run_name.out" 2>&1
    run_rc=$?
    if [ $run_rc -ne 0 ] || [ "$(wc -l <"$tmp/$run_name.loss")" -ne "$ITERS" ] ||
        ! mpi_check_np "$run_np" "$tmp/$run_name.out"; then
        echo "FAIL: $run_name (np $run_np, $run_sched $*) exited $run_rc"
        sed 's/^/    | /' "$tmp/$run_name.out"
        fails=$((fails + 1))
        return 1
    fi
    sed -n 's/^final: .*validation \([0-9.]*\) .*/\1/p' "$tmp/$run_name.out" >"$tmp/$run_name.val"
    return 0
}

# compare REF NAME: the loss of every iteration and the final validation loss agree within $TOL.
compare() {
    worst=$(paste "$tmp/$1.loss" "$tmp/$2.loss" | awk '
        { d = $2 - $4; if (d < 0) d = -d; r = d / ($2 > 0 ? $2 : 1); if (r > w) w = r }
        END { printf "%.3g", w }')
    vdiff=$(paste "$tmp/$1.val" "$tmp/$2.val" | awk '
        { d = $1 - $2; if (d < 0) d = -d; printf "%.3g", d / $1 }')
    if awk -v w="$worst" -v v="$vdiff" -v t="$TOL" 'BEGIN { exit !(w <= t && v <= t && v != "") }'
    then
        echo "ok: $2 equals $1: worst relative loss difference $worst, validation $vdiff"
    else
        echo "FAIL: $2 differs from $1: worst relative loss difference $worst," \
             "validation $vdiff (tolerance $TOL)"
        paste "$tmp/$1.loss" "$tmp/$2.loss" | sed 's/^/    | /'
        fails=$((fails + 1))
    fi
}

# compare_params REF NAME: the same number of parameters, each within $PTOL of REF's.
compare_params() {
    pworst=$(paste "$tmp/$1.params" "$tmp/$2.params" | awk '
        NF != 2 { bad = 1; exit }
        { d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; b = $2 < 0 ? -$2 : $2
          m = a > b ? a : b; if (m < 1) m = 1; if (d / m > w) w = d / m; n++ }
        END { if (bad || n == 0) print "mismatch"; else printf "%.3g %d", w, n }')
    if [ "$pworst" != mismatch ] &&
        awk -v w="${pworst% *}" -v t="$PTOL" 'BEGIN { exit !(w <= t) }'; then
        echo "ok: $2 has the parameters of $1: worst difference ${pworst% *} over ${pworst#* } parameters"
    else
        echo "FAIL: $2's parameters differ from $1's: $pworst (tolerance $PTOL)"
        fails=$((fails + 1))
    fi
}
