#!/bin/sh
# dear-info runs as an MPI singleton (no mpirun): it prints the build configuration, every
# parameter of base/params.def with its value and origin, and the topology; a bad value is
# reported with the same message dear_init logs and exit status 1; an unknown DEAR_* variable is
# a warning; --help and --markdown work without MPI.
set -u
: "${top_srcdir:=.}" "${top_builddir:=.}"
info=$top_builddir/apps/tools/dear-info
[ -x "$info" ] || { echo "dear-info.sh: $info not built" >&2; exit 99; }
fail() { echo "dear-info.sh: FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dear-info.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT
# Start from no DEAR_* variables at all.
for v in $(env | sed -n 's/^\(DEAR_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done

"$info" --help > "$tmp/help" || fail "--help exit status"
grep -q -- '--markdown' "$tmp/help" || fail "--help does not mention --markdown"
"$info" --bogus > /dev/null 2>&1 && fail "an unknown option is accepted"

# Plain run: every parameter listed once, from its default.
"$info" > "$tmp/out" 2> "$tmp/err" || { cat "$tmp/err"; fail "plain run exit status"; }
for name in $(sed -n 's/^DEAR_PARAM(\([A-Z0-9_]*\),.*/\1/p' "$top_srcdir/base/params.def"); do
    n=$(grep -c "^  DEAR_$name  *= .*(default\(, [0-9]* bytes\)\?)\$" "$tmp/out")
    [ "$n" -eq 1 ] || fail "DEAR_$name listed $n times as default"
done
for s in '^dear [0-9]*\.[0-9]*\.[0-9]*$' '^  MPI library     : ' '^  hwloc           : ' \
         '^  CUDA            : \(yes\|no\)' '^  NCCL            : \(yes\|no\)' '^  compiler        : ' \
         '^  cores           : [1-9]' '^  PUs             : [1-9]' '^  local rank      : 0 of 1' \
         '^  nodes           : 1 (at most 1 rank'; do
    grep -q "$s" "$tmp/out" || fail "no line matching '$s'"
done
# A size with a suffix is shown with the bytes it means (10MB is decimal, 10MiB binary).
DEAR_FUSION_THRESHOLD=10MB "$info" > "$tmp/size" 2>&1 || fail "DEAR_FUSION_THRESHOLD=10MB refused"
grep -q '^  DEAR_FUSION_THRESHOLD  *= 10MB  *(environment, 10000000 bytes)$' "$tmp/size" ||
    { grep FUSION_THRESHOLD "$tmp/size"; fail "10MB not shown as 10000000 bytes"; }
# The CUDA and NCCL lines say what configure found (config.h), not what a file forgot to include.
for what in CUDA NCCL; do
    if grep -q "^#define HAVE_$what 1" "$top_builddir/config.h"; then want=yes; else want=no; fi
    grep -q "^  $what  *: $want" "$tmp/out" || fail "dear-info's $what line does not say '$want' as configure did"
done
# No dear message on a clean environment (MPI itself may talk on stderr in some containers).
grep -q '^\[dear' "$tmp/err" && { cat "$tmp/err"; fail "dear printed messages on a clean environment"; }

# The number of cores and PUs agree with hwloc's own tools when they are installed.
if command -v hwloc-calc >/dev/null 2>&1; then
    want=$(hwloc-calc --number-of core machine:0)
    grep -q "^  cores           : $want\$" "$tmp/out" || fail "cores differ from hwloc-calc ($want)"
    want=$(hwloc-calc --number-of pu machine:0)
    grep -q "^  PUs             : $want\$" "$tmp/out" || fail "PUs differ from hwloc-calc ($want)"
fi

# Values from the environment, a bad one and an unknown variable.
DEAR_SEED=42 DEAR_SCHEDULE=fast DEAR_SCHEDUEL=wfbp "$info" > "$tmp/out" 2> "$tmp/err" && fail "bad value accepted (exit 0)"
grep -q '^  DEAR_SEED  *= 42  *(environment)$' "$tmp/out" || fail "DEAR_SEED=42 not shown from the environment"
grep -q '^  DEAR_SCHEDULE  *= fast  *(environment, INVALID' "$tmp/out" || fail "bad DEAR_SCHEDULE not marked"
grep -q "error params: DEAR_SCHEDULE='fast' is not valid: expected one of dear|wfbp|sync" "$tmp/err" \
    || { cat "$tmp/err"; fail "no dear_init-style error for DEAR_SCHEDULE"; }
grep -q "warn params: unknown variable DEAR_SCHEDUEL ignored" "$tmp/err" || fail "no warning for DEAR_SCHEDUEL"

# A progress core this node does not have fails topology detection with the core count.
ncores=$(sed -n 's/^  cores  *: \([0-9]*\)$/\1/p' "$tmp/out")
DEAR_PROGRESS_CORE=$((ncores + 5)) "$info" > "$tmp/out" 2> "$tmp/err" && fail "core $((ncores + 5)) accepted"
grep -q "DEAR_PROGRESS_CORE=$((ncores + 5)) names Core $((ncores + 5)), but this node has $ncores Cores" "$tmp/err" \
    || { cat "$tmp/err"; fail "no message naming the core and the count"; }
echo "dear-info.sh: all checks passed"
