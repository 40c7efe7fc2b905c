# shellcheck shell=bash disable=SC2034 # the globals set here are the sourcing script's
# bench-lib.sh: the harness of bench/'s scripts (sourced, bash): options, the emulated cluster's
# set-up and tear-down, alternating rounds, the .meta lines. A script sets PROG and sources this
# file first, so it holds only what the script measures; the reports share bench/docsection.py.

SRCDIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EMU=$SRCDIR/bench/emucluster
RES=$SRCDIR/bench/results
DOC=$SRCDIR/docs/PERFORMANCE.md
# The exit status of a usage error: 1 unless the script has always answered 2.
BENCH_USAGE_RC=${BENCH_USAGE_RC:-1}

die() { echo "$PROG: $*" >&2; exit 1; }
usage_error() { echo "$PROG: $*" >&2; exit "$BENCH_USAGE_RC"; }

# bench_options SPEC... -- "$@": the command line, read by one table. SPEC is --name=VAR (a value,
# not empty), --name=VAR? (a value, possibly empty), --name=VAR! (a flag: VAR=1), --name=@FUNC
# (FUNC VALUE takes it) or --=ARRAY (the arguments after -- go to ARRAY). --help and -h print
# usage (the script's) and exit; anything else is a usage error after usage on stderr.
bench_options() {
    local -A spec=()
    while [[ $# -gt 0 && $1 != -- ]]; do spec[${1%%=*}]=${1#*=}; shift; done
    shift
    while [[ $# -gt 0 ]]; do
        local opt=$1 t=${spec[$1]:-}
        if [[ $opt == --help || $opt == -h ]]; then usage; exit 0; fi
        [[ -n $t ]] || { usage >&2; usage_error "unknown option '$opt'"; }
        if [[ $opt == -- ]]; then
            shift
            local -n bench_rest_=$t
            bench_rest_=("$@")
            return 0
        fi
        case $t in
            *!) printf -v "${t%!}" 1; shift; continue ;;
            *\?) [[ $# -ge 2 ]] || usage_error "$opt needs a value" ;;
            *) [[ -n ${2:-} ]] || usage_error "$opt needs a value" ;;
        esac
        if [[ $t == @* ]]; then "${t#@}" "$2"; else printf -v "${t%\?}" '%s' "$2"; fi
        shift 2
    done
}

# bench_builddir BUILDDIR PATH HINT: the build directory to run PATH from: BUILDDIR, else the
# current directory or the source tree, whichever has PATH built; dies naming both (and HINT).
bench_builddir() {
    local dir=$1 d
    if [[ -z $dir ]]; then
        for d in "$PWD" "$SRCDIR"; do
            [[ -x $d/$2 ]] && { dir=$d; break; }
        done
        [[ -n $dir ]] || die "$2 not found in $PWD or $SRCDIR: ${3:-build it} or pass --builddir"
    fi
    dir=$(cd "$dir" && pwd)
    [[ -x $dir/$2 ]] || die "$dir/$2 is not built"
    echo "$dir"
}
# bench_prog BUILDDIR PATH HINT: that build directory's PATH.
bench_prog() {
    local dir
    dir=$(bench_builddir "$@") || exit 1
    echo "$dir/$2"
}

# dear_bench_path BUILDDIR: the dear-bench to run (bench_prog's search).
dear_bench_path() { bench_prog "$1" apps/bench/dear-bench "build it"; }
# emu_bench DIR: dear_bench_path, for a script that needs root for the emulated cluster (dies without).
emu_bench() {
    [[ $EUID -eq 0 ]] || die "needs root to create network namespaces"
    dear_bench_path "$1"
}

# emu_names PREFIX SUBNET: the emulated cluster's names unless the caller exported its own, so
# two scripts' clusters never collide.
emu_names() {
    : "${EMU_PREFIX:=$1}" "${EMU_SUBNET:=$2}"
    export EMU_PREFIX EMU_SUBNET
}

# bench_start: a scratch directory ($tmp) and the traps that remove it and tear the cluster down
# on any exit, so an interrupted run leaves no namespaces behind.
BENCH_EMU_UP=0
bench_start() {
    tmp=$(mktemp -d)
    trap bench_cleanup EXIT
    trap 'exit 1' INT TERM HUP
}
bench_cleanup() {
    if ((BENCH_EMU_UP)); then "$EMU" down >/dev/null 2>&1 || true; fi
    [[ -z ${tmp:-} ]] || rm -rf "$tmp"
}

# emu_up HOSTS RATE: the emulated cluster up (root only); emu_down: down, as the trap would.
emu_up() {
    [[ $EUID -eq 0 ]] || die "needs root to create network namespaces"
    BENCH_EMU_UP=1
    "$EMU" up "$1" "$2"
}
emu_down() {
    "$EMU" down
    BENCH_EMU_UP=0
}

# check_layouts LAYOUT...: each is HOSTSxRANKS with 1-$HOSTS hosts (the script's), 1-8 ranks each
# and at least 2 ranks in all, else die naming it: the emulated cluster has $HOSTS hosts.
# shellcheck disable=SC2153 # HOSTS is the sourcing script's
check_layouts() {
    local l
    for l in "$@"; do
        [[ $l =~ ^([1-9])x([1-8])$ ]] && ((BASH_REMATCH[1] <= HOSTS && BASH_REMATCH[1] * BASH_REMATCH[2] >= 2)) ||
            die "bad layout '$l': expected HOSTSxRANKS with 1-$HOSTS hosts, 1-8 ranks each and at least 2 ranks in all"
    done
}
# emu_hosts HOSTS [RANKS]: the --host list of the emulated hosts, RANKS slots each when given.
emu_hosts() { seq -s, -f "${EMU_PREFIX:-h}%g${2:+:$2}" 1 "$1"; }

# emu_mpirun NP HOSTLIST ARGS...: mpirun across the emulated hosts.
emu_mpirun() {
    local np=$1 hosts=$2
    shift 2
    "$EMU" mpirun -np "$np" --host "$hosts" "$@"
}

# mpirun_local ARGS...: mpirun on this host, allowed as root (the emulated cluster needs root).
mpirun_local() { OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun "$@"; }

# bench_torch_setup: for the Python binding's runs, LIB (the libdear of the current directory,
# which must be the build directory, so the binding runs this build) and TORCH_PY (mpirun's
# arguments that start python3 on it with one thread per rank).
bench_torch_setup() {
    LIB=$PWD/.libs/libdear.so.1
    [[ -e $LIB ]] || usage_error "run from the build directory ($LIB not found)"
    TORCH_PY=(-x PYTHONPATH="$SRCDIR/python" -x DEAR_LIBRARY="$LIB" -x OMP_NUM_THREADS=1 /usr/bin/python3)
}

# e2e_scale PROFILE RATE NP HOSTS COMM_MS RATIO: "SIZE_SCALE TIME_SCALE" that give the profile
# about COMM_MS of communication per iteration and RATIO compute to it (HOSTS empty: not given).
e2e_scale() {
    python3 "$SRCDIR/bench/e2e-report.py" scale --profile "$1" --rate "$2" --np "$3" \
        ${4:+--hosts "$4"} --comm-ms "$5" --ratio "$6"
}

# bench_rounds ROUNDS FUNC SIDE...: FUNC ROUND SIDE for every side in turn, ROUNDS times, so a
# stall of the shared machine spoils a part of every side rather than one whole.
bench_rounds() {
    local rounds=$1 fn=$2 r s
    shift 2
    for ((r = 1; r <= rounds; r++)); do
        for s in "$@"; do "$fn" "$r" "$s"; done
    done
}

# The .meta lines every run records: when, at which commit (git diff's PATHSPEC... decides what
# counts as uncommitted), and on what machine.
meta_date() { date -u '+%Y-%m-%d %H:%M UTC'; }
meta_head() { git -C "$SRCDIR" rev-parse --short HEAD 2>/dev/null || echo unknown; }
# shellcheck disable=SC2120 # PATHSPEC is optional
meta_commit() {
    echo "$(meta_head)$(git -C "$SRCDIR" diff --quiet "$@" 2>/dev/null || echo ' (with uncommitted changes)')"
}
meta_load() { cut -d' ' -f1-3 /proc/loadavg; }
meta_machine() { echo "$(nproc) cores, $(uname -sr), $(mpirun --version 2>/dev/null | head -n 1)"; }

# section_report NAME ARGS: bench/NAME-report.py redraws its section of $DOC from the files kept
# under $RES, naming `bench/NAME.sh ARGS` as the command behind it.
section_report() {
    python3 "$SRCDIR/bench/$1-report.py" --results "$RES" --doc "$DOC" --command "bench/$1.sh $2"
}
