#!/bin/sh
# make check-asan / make check-tsan: the test suite of this tree, built again with a sanitizer.
# The distribution files are copied (make distdir) to build-<kind>/src in the build tree,
# configured there in build-<kind>/build with the sanitizer's flags, built and checked with
# make check (SAN_TESTS, when set, names the tests to run instead of all of them). Every
# report goes to a file of build-<kind>/reports (log_path), so a report in a process whose
# failure a test expects (a bad argument, a deliberate abort) is not lost; the target fails if
# make check fails or if any report was written. Open MPI's own noise is suppressed by
# tests/sanitizers/lsan.supp and, for TSan, the option below (docs/HACKING.md says what and why).
#   kind asan: -fsanitize=address,undefined (ASan, LeakSanitizer, UBSan)
#   kind tsan: -fsanitize=thread
set -u
kind=${1:?usage: check-sanitized.sh asan|tsan}
: "${top_srcdir:=.}" "${top_builddir:=.}" "${MAKE:=make}"
supp=$(cd "$top_srcdir/tests/sanitizers" && pwd) || exit 99
case $kind in
    asan) flags="-fsanitize=address,undefined -fno-omit-frame-pointer -g -O1" ;;
    tsan) flags="-fsanitize=thread -fno-omit-frame-pointer -g -O1" ;;
    *) echo "check-sanitized.sh: unknown kind '$kind' (asan or tsan)" >&2; exit 99 ;;
esac
top=$(cd "$top_builddir" && pwd) || exit 99
dir=$top/build-$kind
reports=$dir/reports
start=$(date +%s)
rm -rf "$dir" && mkdir -p "$dir/build" "$reports" || exit 99

echo "check-$kind: copying the distribution to $dir/src"
$MAKE -C "$top" distdir distdir="$dir/src" top_distdir="$dir/src" >"$dir/distdir.out" 2>&1 ||
    { tail -n 20 "$dir/distdir.out"; echo "check-$kind: make distdir failed" >&2; exit 1; }
cd "$dir/build" || exit 99
echo "check-$kind: configuring with CFLAGS='$flags'"
"$dir/src/configure" CFLAGS="$flags" LDFLAGS="${flags%% *}" >configure.out 2>&1 ||
    { tail -n 20 configure.out; echo "check-$kind: configure failed (config.log in $dir/build)" >&2; exit 1; }
echo "check-$kind: building (log: $dir/build/make.out)"
$MAKE -j2 >make.out 2>&1 || { tail -n 30 make.out; echo "check-$kind: build failed" >&2; exit 1; }

# halt_on_error: the first report ends the process, so one bug cannot hide behind another.
# fast_unwind_on_malloc=0: Open MPI is built without frame pointers, and only the slow unwinder
# reaches the MPI_Init frame that lsan.supp names. verify_asan_link_order=0: tests/install.sh
# links a user's program without -fsanitize against the installed (instrumented) libdear.
ASAN_OPTIONS="log_path=$reports/asan:halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1"
ASAN_OPTIONS="$ASAN_OPTIONS:strict_string_checks=1:fast_unwind_on_malloc=0:verify_asan_link_order=0"
LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
UBSAN_OPTIONS="log_path=$reports/ubsan:halt_on_error=1:print_stacktrace=1"
# ignore_noninstrumented_modules: Open MPI is not instrumented, so TSan sees only the libc calls
# it makes (memcpy into fragments and receive buffers, pthread calls on its requests' mutexes),
# never the atomics that order them, and reports races on them that are not (a receive that
# the test's own MPI call completes for the progress thread, which then reads it). With the
# flag the libc calls made from uninstrumented libraries are ignored, all of them, so no lock is
# seen half; every access made by libdear, the tests and the apps is still checked. A pattern
# list (called_from_lib) would have to name every Open MPI component and miss one sooner or later.
TSAN_OPTIONS="log_path=$reports/tsan:halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1"
# Check's own per-test limits (fork mode) and every test's launch limit (tests/mpi-launch.sh),
# scaled for the sanitizer's slowdown: ASan about 2x, TSan 5-15x on the engine's threads.
case $kind in
    asan) scale=4 ;;
    tsan) scale=10 ;;
esac
CK_TIMEOUT_MULTIPLIER=${CK_TIMEOUT_MULTIPLIER:-$scale}
TEST_TIME_SCALE=${TEST_TIME_SCALE:-$scale}
export ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS CK_TIMEOUT_MULTIPLIER TEST_TIME_SCALE
# One test at a time (SAN_JOBS): the suite's time limits (a stall abort within 20 s, np 4 within
# 300 s) are set for a plain build sharing 2 cores with one other test, not a sanitized one.
jobs=${SAN_JOBS:-1}
echo "check-$kind: make -j$jobs check ${SAN_TESTS:+TESTS=\"$SAN_TESTS\" }(logs: $dir/build/tests/)"
if [ -n "${SAN_TESTS:-}" ]; then
    $MAKE -j"$jobs" check TESTS="$SAN_TESTS" >check.out 2>&1
else
    $MAKE -j"$jobs" check >check.out 2>&1
fi
rc=$?
grep -E '^(# [A-Z]+:|FAIL:|ERROR:)' check.out
nrep=$(find "$reports" -type f | wc -l)
if [ "$nrep" -gt 0 ]; then
    echo "check-$kind: $nrep report file(s) in $reports:"
    for f in "$reports"/*; do
        echo "== $f"
        grep -m 1 -E 'ERROR|WARNING|runtime error' "$f"
        grep -m 3 -E '^ +#[0-9]+ ' "$f"
    done
    rc=1
fi
echo "check-$kind: exit $rc after $(( $(date +%s) - start )) s"
exit $rc
