#!/bin/sh
# Install into a scratch DESTDIR, build tests/install/hello.c with nothing but
# `pkg-config --cflags --libs dear` from there, and run it on 2 ranks. MPICC is the compiler
# configure found (make check passes it): a program built for another MPI than the library's
# crashes.
set -eu
: "${top_builddir:=.}" "${top_srcdir:=.}"
. "$top_srcdir/tests/mpi-launch.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
${MAKE:-make} -s -C "$top_builddir" install DESTDIR="$tmp/root" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; exit 1; }
pcdir=$(find "$tmp/root" -name dear.pc -printf '%h\n' | head -1)
[ -n "$pcdir" ] || { echo "install.sh: dear.pc was not installed"; exit 1; }
prefix=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=prefix dear)
for f in include/dear.h include/dear_types.h; do
    [ -f "$tmp/root$prefix/$f" ] || { echo "install.sh: $f missing"; exit 1; }
done
ls "$tmp/root$prefix"/lib*/libdear.a "$tmp/root$prefix"/lib*/libdear.so >/dev/null
flags=$(PKG_CONFIG_PATH=$pcdir pkg-config --define-variable=prefix="$tmp/root$prefix" --cflags --libs dear)
echo "install.sh: $MPICC hello.c $flags"
# shellcheck disable=SC2086
$MPICC -std=c11 -Wall -Werror -o "$tmp/hello" "$top_srcdir/tests/install/hello.c" $flags
libdir=$(dirname "$(ls "$tmp/root$prefix"/lib*/libdear.so | head -1)")
# Only DEAR_API symbols may be exported from the shared library.
api=$(cat "$top_srcdir/include/dear.h" "$top_srcdir/include/dear_types.h" | grep -o 'DEAR_API [^(]*(' | grep -o 'dear_[a-z_]*' | sort -u)
bad=$(nm -D --defined-only "$libdir/libdear.so" | awk '$2 ~ /[TDBR]/ {print $3}' | sort -u |
      while read -r s; do echo "$api" | grep -qx "$s" || echo "$s"; done)
[ -z "$bad" ] || { echo "install.sh: libdear.so exports non-API symbols:"; echo "$bad" | head; exit 1; }
# The ThreadSanitizer runtime must start before any other library, so a program built without
# -fsanitize=thread cannot load a TSan build of libdear (make check-tsan): install and exports
# are checked above, the run is skipped.
if nm -D "$libdir/libdear.so" | grep -q ' U __tsan_init$'; then
    echo "install.sh: libdear is built with ThreadSanitizer, which hello cannot load: run skipped"
    exit 77
fi
mpi_run 60 2 "LD_LIBRARY_PATH=$libdir" "$tmp/hello" >"$tmp/hello.out" 2>&1 ||
    { cat "$tmp/hello.out"; echo "install.sh: hello failed"; exit 1; }
cat "$tmp/hello.out"
grep -q "^hello: dear .* on 2 ranks: " "$tmp/hello.out" || { echo "install.sh: hello did not run on 2 ranks"; exit 1; }
