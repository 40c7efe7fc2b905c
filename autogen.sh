#!/bin/sh
# Regenerate configure and Makefile.in from configure.ac, Makefile.am and the */local.mk fragments.
set -e
cd "$(dirname "$0")"
mkdir -p build-aux m4
autoreconf --install --force --warnings=all,no-portability >/dev/null
echo "autogen.sh: now run ./configure"
