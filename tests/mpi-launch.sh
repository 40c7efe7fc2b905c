# shellcheck shell=sh
# tests/mpi-launch.sh: how every test starts MPI ranks (sourced, not run). configure chose the
# launcher and its flags for the MPI that CC links (m4/dear_mpi.m4) and make check passes them in
# the environment (Makefile.am: MPI_LAUNCH_ENV); `make check MPIRUN=...` overrides one.
#
#   mpi_run SECONDS NP [NAME=VALUE]... PROGRAM [ARGS]...
#       PROGRAM on NP ranks of this node (more ranks than cores, unbound), each NAME=VALUE in
#       every rank's environment; killed after SECONDS (status 124 or 137, as timeout(1)) times
#       TEST_TIME_SCALE (default 1; make check-asan and check-tsan set it for their slowdown).
#   mpi4py_mismatch PYTHON
#       prints why PYTHON's mpi4py cannot share a process with libdear (it was built against another
#       MPI than configure's MPI_FLAVOUR), nothing when it can.
#   mpi_check_np NP FILE
#       fails when a rank-count line that dear-cnn, dear-gpt or dear-bench printed into FILE
#       says another count than NP.
#
# Every rank also gets MPI_TEST_NP=NP: the MPI test programs fail when MPI_COMM_WORLD has
# another size (tests/mpi/np_check.h), since a launcher of another MPI starts NP one-rank jobs
# that would each pass. (Not DEAR_*: the library warns about DEAR_ variables it does not know.)
if [ -z "${MPIRUN:-}" ]; then
    echo "mpi-launch.sh: MPIRUN is not set: run the test through make check (TESTS=... for one)," \
         "which passes the launcher configure chose" >&2
    exit 99
fi

# A subshell: the argument rewriting and the exports below stay inside.
mpi_run() (
    secs=$(($1 * ${TEST_TIME_SCALE:-1})) np=$2
    shift 2
    # Rotate the arguments once through "$@": the NAME=VALUE words in front become launcher flags
    # where they stand, PROGRAM and its arguments follow unchanged.
    set -- "MPI_TEST_NP=$np" "$@"
    n=$# env=1
    while [ "$n" -gt 0 ]; do
        a=$1
        shift
        n=$((n - 1))
        name=${a%%=*}
        case $env:$name in
        1:"$a" | 1: | 1:*[!A-Za-z0-9_]* | 1:[0-9]*) env=0 ;;
        esac
        if [ $env = 0 ]; then
            set -- "$@" "$a"
            continue
        fi
        case $MPIRUN_ENV in
        -genv | -env) set -- "$@" "$MPIRUN_ENV" "$name" "${a#*=}" ;;
        "") export "${a?}" ;; # a launcher without such a flag: ranks inherit its environment
        *) set -- "$@" "$MPIRUN_ENV" "$a" ;;
        esac
    done
    # shellcheck disable=SC2086 # MPIRUN and the flags are lists of words
    exec timeout -k 10 "$secs" $MPIRUN $MPIRUN_NP "$np" $MPIRUN_FLAGS "$@"
)

mpi_check_np() {
    awk -v np="$1" '
        /^dear-(cnn|gpt): [0-9]+ ranks,/ || /^dear-bench: [^,]*, [0-9]+ ranks;/ {
            match($0, /[0-9]+ ranks/)
            k = substr($0, RSTART, RLENGTH) + 0
            if (k != np) { printf "mpi_check_np: %s ran on %d rank(s), %d were asked for\n", $1, k, np; bad = 1 }
        }
        END { exit bad }' "$2" >&2
}

mpi4py_mismatch() {
    vendor=$("$1" -c "from mpi4py import MPI; print(MPI.get_vendor()[0])" 2>/dev/null)
    case "$vendor:${MPI_FLAVOUR:-unknown}" in
    "Open MPI:openmpi" | "MPICH:mpich" | *:unknown) ;;
    *) echo "mpi4py uses $vendor, libdear was built for $MPI_FLAVOUR" ;;
    esac
}
