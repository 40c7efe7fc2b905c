#!/bin/sh
# make check-fuzz: builds a libFuzzer harness per file reader (profile, planfile, cost) with
# clang (-fsanitize=fuzzer,address,undefined, the reader's MPI-free sources compiled in) and
# runs each for FUZZ_SECONDS (60) from the corpus kept in tests/fuzz/corpus/<reader>/ and the
# inputs of tests/fuzz/regress/<reader>/. New inputs go to tests/fuzz/work/<reader>/ in the
# build tree (the source tree is never written); a crash is left as tests/fuzz/crash-<reader>-*
# and fails the target. Skips, saying why, when FUZZ_CC (clang) cannot build a fuzz target.
set -u
: "${top_srcdir:=.}" "${top_builddir:=.}" "${FUZZ_CC:=clang}" "${FUZZ_SECONDS:=60}"
out=$top_builddir/tests/fuzz
mkdir -p "$out" || exit 99

probe=$out/probe-$$
printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return (int)(d != 0) + (int)n - (int)n - 1; }\n' \
    > "$probe.c"
if ! $FUZZ_CC -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" >/dev/null 2>&1; then
    rm -f "$probe" "$probe.c"
    echo "check-fuzz: skipped: '$FUZZ_CC' cannot build a libFuzzer target (-fsanitize=fuzzer);"
    echo "check-fuzz: install clang (Debian: apt-get install clang) or pass FUZZ_CC=clang-NN"
    exit 0
fi
rm -f "$probe" "$probe.c"

# What the readers link: fusion/ and base/ are MPI-free, so the sources compile alone.
lib="fusion/profile.c fusion/planfile.c fusion/cost.c fusion/plan.c base/textio.c base/fileio.c base/log.c
     base/tables.c base/status.c base/util.c tests/fuzz/fuzz_common.c"
status=0
for reader in profile planfile cost; do
    # Longer than the largest seed of each format, short enough to keep executions fast.
    case $reader in
        profile) max_len=16384 ;;
        planfile) max_len=8192 ;;
        *) max_len=4096 ;;
    esac
    exe=$out/fuzz-$reader
    srcs=
    for s in $lib tests/fuzz/fuzz_$reader.c; do srcs="$srcs $top_srcdir/$s"; done
    echo "check-fuzz: building $exe with $FUZZ_CC"
    # shellcheck disable=SC2086
    if ! $FUZZ_CC -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
            -D_GNU_SOURCE -I"$top_srcdir" -I"$top_srcdir/include" $srcs -lm -lpthread -o "$exe"; then
        echo "check-fuzz: $reader: build failed" >&2
        status=1
        continue
    fi
    work=$out/work/$reader
    mkdir -p "$work"
    dirs="$work $top_srcdir/tests/fuzz/corpus/$reader"
    [ -d "$top_srcdir/tests/fuzz/regress/$reader" ] && dirs="$dirs $top_srcdir/tests/fuzz/regress/$reader"
    log=$out/fuzz-$reader.out
    echo "check-fuzz: $reader: fuzzing for $FUZZ_SECONDS s (log: $log)"
    # shellcheck disable=SC2086
    "$exe" -max_total_time="$FUZZ_SECONDS" -max_len=$max_len -malloc_limit_mb=64 -timeout=10 \
        -print_final_stats=1 -artifact_prefix="$out/crash-$reader-" $dirs >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    if [ $rc -eq 0 ]; then
        echo "check-fuzz: $reader: ${runs:-?} inputs executed, no crash"
    else
        status=1
        grep -E '^(==[0-9]+==ERROR|SUMMARY|fuzz:)' "$log" | head -n 5
        crash=$(sed -n 's/.*Test unit written to //p' "$log" | tail -n 1)
        echo "check-fuzz: $reader: FAILED after ${runs:-?} inputs (exit $rc); input: ${crash:-see $log}"
        echo "check-fuzz: keep it in $top_srcdir/tests/fuzz/regress/$reader/ and fix the reader"
    fi
done
exit $status
