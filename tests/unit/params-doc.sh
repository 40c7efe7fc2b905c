#!/bin/sh
# docs/PARAMS.md is generated from base/params.def: fail when the file in the source tree
# differs from what this build's `dear-info --markdown` prints (someone edited it by hand, or
# changed a parameter without `make params-doc`).
set -u
: "${top_srcdir:=.}" "${top_builddir:=.}"
info=$top_builddir/apps/tools/dear-info
doc=$top_srcdir/docs/PARAMS.md
[ -x "$info" ] || { echo "params-doc.sh: $info not built" >&2; exit 99; }
[ -f "$doc" ] || { echo "params-doc.sh: $doc is missing: run 'make params-doc'" >&2; exit 1; }
tmp=$(mktemp "${TMPDIR:-/tmp}/dear-params-md.XXXXXX") || exit 99
trap 'rm -f "$tmp"' EXIT
"$info" --markdown > "$tmp" || { echo "params-doc.sh: dear-info --markdown failed" >&2; exit 1; }
if ! diff -u "$doc" "$tmp"; then
    echo "params-doc.sh: $doc is out of date (diff above: - committed, + generated)." >&2
    echo "params-doc.sh: regenerate it with 'make params-doc'; never edit it by hand." >&2
    exit 1
fi
# The generated text must cover the whole table: one row per DEAR_PARAM entry.
ndef=$(grep -c '^DEAR_PARAM(' "$top_srcdir/base/params.def")
nrow=$(grep -c '^| `DEAR_' "$doc")
[ "$ndef" -eq "$nrow" ] || { echo "params-doc.sh: $nrow rows for $ndef parameters" >&2; exit 1; }
echo "params-doc.sh: $doc matches the generated text ($nrow parameters)"
