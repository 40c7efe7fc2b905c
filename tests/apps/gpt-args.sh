#!/bin/sh
# dear-gpt refuses bad input cleanly: each case must exit non-zero (or 0 for --help) within the
# time limit, on every rank, with a message on stderr that names the problem.
. "${top_srcdir:-.}/tests/apps/gpt-lib.sh"

# expect NP RC-KIND PATTERN ARGS...: RC-KIND is "zero" or "nonzero"; PATTERN must appear in
# stdout+stderr.
expect() {
    np=$1 kind=$2 pattern=$3
    shift 3
    mpi_run 60 "$np" "$exe" "$@" >"$tmp/out" 2>&1
    rc=$?
    ok=1
    if [ $rc -eq 124 ]; then
        echo "FAIL (hang): np $np $*"; ok=0
    elif [ "$kind" = zero ] && [ $rc -ne 0 ]; then
        echo "FAIL (exit $rc, expected 0): np $np $*"; ok=0
    elif [ "$kind" = nonzero ] && [ $rc -eq 0 ]; then
        echo "FAIL (exit 0, expected an error): np $np $*"; ok=0
    elif ! grep -q -- "$pattern" "$tmp/out"; then
        echo "FAIL (no message matching '$pattern'): np $np $*"; ok=0
    fi
    if [ $ok -eq 1 ]; then
        echo "ok: np $np $* -> exit $rc: $(grep -m1 -- "$pattern" "$tmp/out")"
    else
        sed 's/^/    | /' "$tmp/out"
        fails=$((fails + 1))
    fi
}

expect 1 zero "Usage:" --help
expect 2 nonzero "does not divide across 2 ranks" --batch 3
expect 1 nonzero "expected dear, wfbp or sync" --schedule fast
expect 1 nonzero "not a multiple of --heads" --dim 10 --heads 4
expect 1 nonzero "--iters 'abc': expected an integer" --iters abc
expect 1 nonzero "--batch '0': expected an integer" --batch 0
expect 1 nonzero "--lr '-1': expected a number" --lr -1
expect 1 nonzero "unknown option '--bogus'" --bogus
expect 1 nonzero "--seq needs a value" --seq
expect 2 nonzero "/nonexistent/text.txt" --data /nonexistent/text.txt
printf 'tiny' >"$tmp/tiny.txt"
expect 2 nonzero "too short" --data "$tmp/tiny.txt"
# the word vocabulary: a size that is no positive integer, or more than the text's distinct
# tokens ("a", "b", "c", " " and "\n": 5), or given for characters, or another vocabulary kind
expect 1 nonzero "--vocab-size '0': expected an integer" --vocab words --vocab-size 0
expect 1 nonzero "--vocab-size '-5': expected an integer" --vocab words --vocab-size -5
expect 1 nonzero "--vocab-size 'many': expected an integer" --vocab words --vocab-size many
printf 'a b a c\n' >"$tmp/abc.txt"
expect 2 nonzero "has 5 distinct tokens (words, and the single bytes between them); pick 1 to 5" \
    --vocab words --vocab-size 6 --data "$tmp/abc.txt"
expect 1 nonzero "--vocab-size applies to --vocab words only" --vocab-size 100
expect 1 nonzero "--vocab 'bpe': expected chars or words" --vocab bpe
# A link planted at the loss file is refused, its target untouched; a FIFO does not block.
echo precious >"$tmp/victim"
ln -s "$tmp/victim" "$tmp/loss.txt"
mkfifo "$tmp/fifo"
expect 2 nonzero "a symbolic link; refused" --iters 2 --loss-out "$tmp/loss.txt"
[ "$(cat "$tmp/victim")" = precious ] || { echo "FAIL: --loss-out wrote through a link"; fails=$((fails + 1)); }
expect 2 nonzero "params-out $tmp/loss.txt is a symbolic link; refused" --iters 2 --params-out "$tmp/loss.txt"
[ "$(cat "$tmp/victim")" = precious ] || { echo "FAIL: --params-out wrote through a link"; fails=$((fails + 1)); }
expect 2 nonzero "fifo is not a regular file; refused" --iters 2 --loss-out "$tmp/fifo"

[ $fails -eq 0 ] || { echo "gpt-args.sh: $fails case(s) failed"; exit 1; }
echo "gpt-args.sh: all cases passed"
