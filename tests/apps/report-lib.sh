# Sourced by the tests of bench/'s report scripts (e2e-report.sh, perf-report.sh) after
# `: "${srcdir:=.}"`: they skip without python3, work in a scratch folder ($dir) removed at exit,
# and fail() with the test's name; p2p_csv FILE writes a dear-p2p CSV of 100 MB/s one way;
# cut_bound computes a lower bound by hand.
set -u
me=$(basename "$0")
command -v python3 >/dev/null 2>&1 || { echo "$me: no python3, skipped"; exit 77; }
dir=$(mktemp -d "/tmp/dear-${me%.sh}.XXXXXX") || exit 99
trap 'rm -rf "$dir"' EXIT
fail() { echo "$me: $*" >&2; exit 1; }
p2p_csv() {
    printf 'mode,bytes,msgs,window,reps,time_s,MBps,MBps_best,wrong\noneway,4194304,58,4,3,1,100.0,100.0,0\n' >"$1"
}
# cut_bound PROFILE SCALE C [NAME RS AG] [FACTOR]: the lower bound by hand, in ms, on 4 hosts at
# 100 MB/s: compute C ms spread over the layers as the profile spreads it, each tensor's bytes
# scaled as dear-bench rounds them (whole floats), both phases of each host's 3/4 times FACTOR
# (the wire bytes per float32 byte; default 1); the largest of C and, for each layer k, the
# compute of layers k.. plus the link time of layers 0..k (the bytes of layers 0..k cross while
# those layers wait). A tensor named NAME travels RS + AG bytes instead of twice its size.
cut_bound() {
    awk -v s="$2" -v C="$3" -v name="${4:-}" -v rs="${5:-0}" -v ag="${6:-0}" -v f="${7:-1}" '
        $1 == "layer" { pos[$2] = n + 0; fb[n++] = $3 + $4; tot += $3 + $4 }
        $1 == "tensor" { b = 4 * int($4 / 4 * s + 0.5); if (b < 4) b = 4
                         link[pos[$3]] += ($2 == name ? rs + ag : 2 * b) * f * 0.75 / 1e8 * 1e3 }
        END { bound = C; after = C; sent = 0
              for (k = 0; k < n; k++) { sent += link[k]; if (after + sent > bound) bound = after + sent
                                        after -= C * fb[k] / tot }
              printf "%.1f", bound }' "$srcdir/fusion/profiles/$1.prof"
}
# placed_once REPORT TAG PREV: after REPORT ran once on $dir into $dir/P.md (a page of a PREV
# marker, then a line "after"), its section TAG lies between the two, and a second run replaces
# it in place.
placed_once() {
    awk -v prev="END $3" -v tag="BEGIN $2" 'index($0, prev) { e = NR } index($0, tag) { b = NR }
        /^after$/ { a = NR } END { exit !(e && e < b && b < a) }' "$dir/P.md" ||
        fail "the section is not after the $3 one"
    python3 "$1" --results "$dir" --doc "$dir/P.md" --command test >"$dir/out" 2>&1 || fail "the second run failed"
    [ "$(grep -c "BEGIN $2" "$dir/P.md")" = 1 ] || fail "the section was added twice"
}
# refused REPORT RESULTS MESSAGE: REPORT on the files under RESULTS fails, printing MESSAGE (a
# fixed string), and leaves $dir/P.md as it was.
refused() {
    cp "$dir/P.md" "$dir/P.before"
    python3 "$1" --results "$2" --doc "$dir/P.md" --command test >"$dir/out" 2>&1 && fail "$2 was taken"
    grep -qF "$3" "$dir/out" || { cat "$dir/out"; fail "the error does not say '$3'"; }
    cmp -s "$dir/P.md" "$dir/P.before" || fail "a failed report changed the page"
}
