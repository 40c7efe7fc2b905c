# Sourced by the tests of bench/'s report scripts (e2e-report.sh, perf-report.sh) after
# `: "${srcdir:=.}"`: they skip without python3, work in a scratch folder ($dir) removed at exit,
# and fail() with the test's name; p2p_csv FILE writes a dear-p2p CSV of 100 MB/s one way.
set -u
me=$(basename "$0")
command -v python3 >/dev/null 2>&1 || { echo "$me: no python3, skipped"; exit 77; }
dir=$(mktemp -d "/tmp/dear-${me%.sh}.XXXXXX") || exit 99
trap 'rm -rf "$dir"' EXIT
fail() { echo "$me: $*" >&2; exit 1; }
p2p_csv() {
    printf 'mode,bytes,msgs,window,reps,time_s,MBps,MBps_best,wrong\noneway,4194304,58,4,3,1,100.0,100.0,0\n' >"$1"
}
