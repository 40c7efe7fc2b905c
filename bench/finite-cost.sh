#!/bin/sh
# finite-cost.sh: DEAR_CHECK_FINITE's cost per MiB (bench/finite-cost) into the section
# "check-finite-cost" of docs/PERFORMANCE.md. The end-to-end cost is bench/env-ab.sh's:
#   bench/env-ab.sh --var DEAR_CHECK_FINITE --a off --b warn
set -eu
SRCDIR=$(cd "$(dirname "$0")/.." && pwd)
exe=${BUILDDIR:-$SRCDIR}/bench/finite-cost
[ -x "$exe" ] || { echo "finite-cost.sh: $exe not built (make)" >&2; exit 1; }
table=$("$exe" "${1:-64}" "${2:-15}")
cpu=$(grep -m1 "model name" /proc/cpuinfo | sed 's/.*: //')
/usr/bin/env python3 - "$SRCDIR/docs/PERFORMANCE.md" "$table" "$cpu" <<'PY'
import sys
sys.path.insert(0, sys.argv[0] and __import__("os").path.join(__import__("os").path.dirname(sys.argv[1]), "..", "bench"))
from docsection import replace_section
page, table, cpu = sys.argv[1], sys.argv[2], sys.argv[3]
begin, end = "<!-- begin check-finite-cost -->", "<!-- end check-finite-cost -->"
text = (begin + "\n### DEAR_CHECK_FINITE per MiB\n\n"
        "The check on the host (host memory, staged CUDA memory): the count of NaN and Inf elements of each "
        "unit of this rank's contribution, on one core (" + cpu + "); for scale the squared norm a device row's "
        "kernel takes instead, run here by the host row, and a copy of the same bytes. "
        "Reproduce: `bench/finite-cost.sh`.\n\n"
        + table + "\n" + end + "\n")
replace_section(page, text, begin, end)
PY
echo "finite-cost.sh: docs/PERFORMANCE.md, section check-finite-cost:"
echo "$table"
