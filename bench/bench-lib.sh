# bench-lib.sh: what bench/'s dear-bench scripts share (sourced, bash). Needs SRCDIR and die.

# dear_bench_path BUILDDIR: the dear-bench to run: BUILDDIR's, else the current directory's or
# the source tree's, whichever is built; dies naming both when none is.
dear_bench_path() {
    local dir=$1 d
    if [[ -z $dir ]]; then
        for d in "$PWD" "$SRCDIR"; do
            [[ -x $d/apps/bench/dear-bench ]] && { dir=$d; break; }
        done
        [[ -n $dir ]] || die "apps/bench/dear-bench not found in $PWD or $SRCDIR: build it or pass --builddir"
    fi
    dir=$(cd "$dir" && pwd)
    [[ -x $dir/apps/bench/dear-bench ]] || die "$dir/apps/bench/dear-bench is not built"
    echo "$dir/apps/bench/dear-bench"
}
