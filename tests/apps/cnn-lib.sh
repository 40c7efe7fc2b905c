# shellcheck shell=sh disable=SC2034
# tests/apps/cnn-lib.sh: shared by the tests/apps/cnn-*.sh tests (sourced, not run). Finds dear-cnn and the
# data, runs it on N ranks with a time limit, and compares the loss lines of two runs.
: "${top_builddir:=.}"
CNN=$top_builddir/apps/cnn/dear-cnn
[ -x "$CNN" ] || { echo "cnn-lib: $CNN not built" >&2; exit 99; }
DATA=${CNN_TEST_DATA:-/usr/share/datasets/fashion-mnist}
if [ ! -r "$DATA/train-images-idx3-ubyte.gz" ] && [ ! -r "$DATA/train-images-idx3-ubyte" ]; then
    echo "SKIP: no Fashion-MNIST in $DATA (apt-get install dataset-fashion-mnist, or set CNN_TEST_DATA)"
    exit 77
fi
. "${top_srcdir:-.}/tests/mpi-launch.sh"
# Single-threaded BLAS in every rank (dear-cnn sets it too; this covers BLAS start-up threads).
OPENBLAS_NUM_THREADS=1
export OPENBLAS_NUM_THREADS
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cnn-test.XXXXXX") || exit 99
trap 'rm -rf "$WORK"' EXIT
# A few hundred images: 512 training images give 10 iterations of a global batch of 48 (48
# divides over 1, 2, 3 and 4 ranks).
SMALL="--data $DATA --train-limit 512 --test-limit 256 --batch 48 --lr 0.02 --warmup 5 --log-every 1"

fail() { echo "FAIL: $*" >&2; exit 1; }

# count_iters LOG N: LOG has loss lines for exactly iterations 1..N.
count_iters() {
    [ "$(grep -c '^iter ' "$1")" -eq "$2" ] && grep -q "^iter $2 " "$1" ||
        fail "$1: expected loss lines for iterations 1..$2"
}

# cnn_run NP ARGS...: dear-cnn on NP ranks, output on stdout; never hangs past CNN_TIMEOUT
# seconds. A run that says it had another rank count fails.
cnn_run() {
    np=$1
    shift
    mpi_run "${CNN_TIMEOUT:-120}" "$np" "$CNN" "$@" >"$WORK/run.out" 2>&1
    rc=$?
    cat "$WORK/run.out"
    mpi_check_np "$np" "$WORK/run.out" || return 1
    return $rc
}

# compare_losses A B TOL WHAT [UPTO]: every "iter N ... loss X" line of log B (N <= UPTO when
# given) has its iteration in log A and the losses agree within relative tolerance TOL (0:
# identical text).
compare_losses() {
    awk -v tol="$3" -v what="$4" -v upto="${5:-0}" '
        FNR == 1 { f++ }
        /^iter / && (upto == 0 || $2 + 0 <= upto + 0) { if (f == 1) a[$2] = $6; else { b[$2] = $6; n++ } }
        END {
            if (n == 0) { print what ": no loss lines"; exit 1 }
            for (i in b) {
                if (!(i in a)) { print what ": iteration " i " missing"; exit 1 }
                d = a[i] - b[i]; if (d < 0) d = -d
                if ((tol == 0 && a[i] != b[i]) || (tol > 0 && d > tol * (a[i] > 1 ? a[i] : 1))) {
                    print what ": iteration " i " loss " a[i] " vs " b[i]; exit 1
                }
                if (d > worst) worst = d
            }
            printf "%s: %d iterations agree (largest difference %g)\n", what, n, worst
        }' "$1" "$2" || fail "$4"
}
