#!/bin/sh
# docs/iteration-figure.sh: README's picture, docs/iteration.svg: one iteration of vgg16 on 64
# ranks at 10GbE (the shipped profile and cost preset) as dear-plan simulates it, under wfbp
# (Horovod's and DDP's all-reduce buckets) above and under dear (reduce-scatter in backward,
# all-gather in the next forward) below, on one time axis each. Run from the build directory
# (apps/tools/dear-plan built); rewrites the file in the source tree.
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
plan=${DEAR_PLAN:-apps/tools/dear-plan}
[ -x "$plan" ] || { echo "iteration-figure.sh: $plan not built (run from the build directory)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args="--profile $src/fusion/profiles/vgg16.prof --preset 10gbe --workers 64"
# shellcheck disable=SC2086
"$plan" $args --schedule wfbp --planner threshold --svg "$tmp/wfbp.svg" >/dev/null
# shellcheck disable=SC2086
"$plan" $args --schedule dear --planner auto --svg "$tmp/dear.svg" >/dev/null
python3 - "$tmp/wfbp.svg" "$tmp/dear.svg" "$src/docs/iteration.svg" <<'PY'
import re, sys
parts, y, w = [], 0, 0
for path in sys.argv[1:3]:
    svg = open(path).read()
    m = re.match(r'<svg [^>]*width="(\d+)" height="(\d+)"[^>]*>', svg)
    pw, ph = int(m.group(1)), int(m.group(2))
    parts.append('<svg x="0" y="%d" width="%d" height="%d">%s' % (y, pw, ph, svg[m.end():]))
    y, w = y + ph, max(w, pw)
out = ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
       'font-size="12">\n%s\n</svg>\n' % (w, y, "\n".join(parts)))
open(sys.argv[3], "w").write(out)
PY
echo "iteration-figure.sh: wrote $src/docs/iteration.svg"
