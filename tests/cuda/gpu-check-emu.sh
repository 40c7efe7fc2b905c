#!/bin/sh
# cuda/gpu-check.sh in its emulator mode, so that the script a GPU machine runs cannot rot:
#  - all six steps against the emulated CUDA runtime and NCCL (the binding and the models on the
#    CPU), each result in steps.txt, the CSVs written, and --publish able to read them;
#  - a budget too short for a step skips it and says so;
#  - a run killed midway (as a GPU slot that runs out) keeps every result written before.
set -u
: "${top_builddir:=.}" "${top_srcdir:=.}"
gc() { bash "$top_srcdir/cuda/gpu-check.sh" --emulate --builddir "$top_builddir" --max-ranks 2 \
    --profile "$top_srcdir/tests/apps/dearbench-tiny.prof" "$@"; }
out=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-emu.XXXXXX")
trap 'rm -rf "$out"' EXIT
fail() { echo "gpu-check-emu: $*" >&2; cat "$out"/*/steps.txt >&2 2>/dev/null; exit 1; }
# SIGKILL to every process of session $1 (from /proc: procps may be absent).
kill_session() {
    for st in /proc/[0-9]*/stat; do
        p=${st#/proc/} p=${p%/stat}
        [ "$(sed 's/^.*) //' "$st" 2>/dev/null | cut -d' ' -f4)" = "$1" ] && kill -9 "$p" 2>/dev/null
    done
}

gc --out "$out/all" || fail "the emulated run failed"
for n in 1 2 3 4 5 6; do
    grep -q "^step $n [a-z0-9-]*: done in" "$out/all/steps.txt" || fail "step $n did not finish"
done

gc --out "$out/short" --budget 10 --steps "1 6" >/dev/null || fail "a short budget failed the run"
grep -q "^step 1 tests: skipped: [0-9]* s of the budget left, it needs about 60 s" "$out/short/steps.txt" ||
    fail "a step the budget cannot fit was not skipped with its reason"

# Killed once step 1 is done, in the middle of step 6: step 1's lines stay.
# setsid: its own session, so that every process of it (the launcher's ranks too) can be killed.
setsid bash "$top_srcdir/cuda/gpu-check.sh" --emulate --builddir "$top_builddir" \
    --max-ranks 2 --profile "$top_srcdir/tests/apps/dearbench-tiny.prof" --out "$out/cut" --steps "1 6" \
    >/dev/null 2>&1 &
pid=$!
i=0
until grep -q "^step 6 bench:" "$out/cut/steps.txt" 2>/dev/null; do
    i=$((i + 1))
    [ $i -lt 600 ] || { kill_session $pid; fail "step 6 never started"; }
    sleep 0.2
done
kill_session $pid
wait $pid 2>/dev/null
grep -q "^  test_gpu --quick: pass" "$out/cut/steps.txt" && grep -q "^step 1 tests: done in" "$out/cut/steps.txt" ||
    fail "a run killed in step 6 lost step 1's results"
echo "gpu-check-emu: six steps, a budget skip and a run killed midway all leave their results"
