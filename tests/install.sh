#!/bin/sh
# Install into a scratch DESTDIR, build tests/install/hello.c with nothing but
# `pkg-config --cflags --libs dear` from there, and run it under mpirun -np 2.
set -eu
: "${top_builddir:=.}" "${top_srcdir:=.}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
${MAKE:-make} -s -C "$top_builddir" install DESTDIR="$tmp/root" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; exit 1; }
pcdir=$(find "$tmp/root" -name dear.pc -printf '%h\n' | head -1)
[ -n "$pcdir" ] || { echo "install.sh: dear.pc was not installed"; exit 1; }
prefix=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=prefix dear)
# shellcheck disable=SC2043
for f in include/dear.h; do
    [ -f "$tmp/root$prefix/$f" ] || { echo "install.sh: $f missing"; exit 1; }
done
ls "$tmp/root$prefix"/lib*/libdear.a "$tmp/root$prefix"/lib*/libdear.so >/dev/null
flags=$(PKG_CONFIG_PATH=$pcdir pkg-config --define-variable=prefix="$tmp/root$prefix" --cflags --libs dear)
echo "install.sh: mpicc hello.c $flags"
# shellcheck disable=SC2086
mpicc -std=c11 -Wall -Werror -o "$tmp/hello" "$top_srcdir/tests/install/hello.c" $flags
libdir=$(dirname "$(ls "$tmp/root$prefix"/lib*/libdear.so | head -1)")
# Only DEAR_API symbols may be exported from the shared library.
api=$(grep -o 'DEAR_API [^(]*(' "$top_srcdir/include/dear.h" | grep -o 'dear_[a-z_]*' | sort -u)
bad=$(nm -D --defined-only "$libdir/libdear.so" | awk '$2 ~ /[TDBR]/ {print $3}' | sort -u |
      while read -r s; do echo "$api" | grep -qx "$s" || echo "$s"; done)
[ -z "$bad" ] || { echo "install.sh: libdear.so exports non-API symbols:"; echo "$bad" | head; exit 1; }
LD_LIBRARY_PATH=$libdir mpirun -np 2 --oversubscribe --bind-to none --mca btl self,vader "$tmp/hello"
