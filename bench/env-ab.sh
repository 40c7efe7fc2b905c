#!/bin/bash
# env-ab.sh: what one DEAR_* setting costs, end to end, on the emulated cluster.
#
# Runs dear-bench on the balanced e2e cases (compute about equal to the all-reduce at the link
# rate, as bench/e2e-matrix.sh scales them) with VAR=A, then VAR=B, alternately, --rounds times in
# one cluster, and reports per profile and configuration the median iteration time of each
# setting and the ratio B/A. Writes bench/results/envab-TAG.csv and the section "TAG" of
# docs/PERFORMANCE.md (bench/docsection.py), TAG being the variable's name in lower case.
#
#   bench/env-ab.sh --var DEAR_DETERMINISTIC --a 0 --b 1
set -euo pipefail

SRCDIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EMU=$SRCDIR/bench/emucluster
PROG=env-ab.sh
VAR= VA= VB= ROUNDS=3 ITERS=10 LAYOUT=4x1 RATE=1gbit COMM_MS=300 BUILDDIR=
PROFILES="resnet50 bert-base gpt2-small"
CONFIGS="wfbp:threshold:64m;dear:auto"
WHY=
: "${EMU_PREFIX:=v}" "${EMU_SUBNET:=10.213.50}"
export EMU_PREFIX EMU_SUBNET

usage() {
    cat <<EOF
usage: bench/env-ab.sh --var NAME --a VALUE --b VALUE [options]
  --profiles "..."  profiles (default "$PROFILES")
  --configs LIST    dear-bench --configs (default "$CONFIGS")
  --layout HxR      hosts x ranks per host (default $LAYOUT)
  --rounds N        A then B, N times (default $ROUNDS)
  --iters N         measured iterations per configuration and run (default $ITERS)
  --why TEXT        one line for the page: what the setting does
  --builddir DIR    holding apps/bench/dear-bench (default: this tree)
Needs root (bench/emucluster). EMU_PREFIX and EMU_SUBNET give the run a cluster of its own
(default v, 10.213.50).
EOF
}

while [[ $# -gt 0 ]]; do
    case $1 in
        --var) VAR=${2:?}; shift 2 ;;
        --a) VA=${2?}; shift 2 ;;
        --b) VB=${2?}; shift 2 ;;
        --profiles) PROFILES=${2:?}; shift 2 ;;
        --configs) CONFIGS=${2:?}; shift 2 ;;
        --layout) LAYOUT=${2:?}; shift 2 ;;
        --rounds) ROUNDS=${2:?}; shift 2 ;;
        --iters) ITERS=${2:?}; shift 2 ;;
        --why) WHY=${2:?}; shift 2 ;;
        --builddir) BUILDDIR=${2:?}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; echo "$PROG: unknown option '$1'" >&2; exit 2 ;;
    esac
done
[[ $VAR =~ ^DEAR_[A-Z0-9_]+$ ]] || { echo "$PROG: --var '$VAR': expected a DEAR_* name" >&2; exit 2; }
[[ $ROUNDS =~ ^[1-9][0-9]*$ && $ITERS =~ ^[1-9][0-9]*$ ]] || { echo "$PROG: bad --rounds/--iters" >&2; exit 2; }
[[ $LAYOUT =~ ^([1-4])x([1-8])$ ]] || { echo "$PROG: bad --layout '$LAYOUT': expected HOSTSxRANKS, 1-4 hosts" >&2; exit 2; }
nh=${BASH_REMATCH[1]} rph=${BASH_REMATCH[2]}
np=$((nh * rph))
BUILDDIR=${BUILDDIR:-$SRCDIR}
BENCH=$(cd "$BUILDDIR" && pwd)/apps/bench/dear-bench
[[ -x $BENCH ]] || { echo "$PROG: $BENCH is not built" >&2; exit 1; }
[[ $EUID -eq 0 ]] || { echo "$PROG: needs root (network namespaces)" >&2; exit 1; }

tag=$(echo "${VAR#DEAR_}" | tr 'A-Z_' 'a-z-')
csv=$SRCDIR/bench/results/envab-$tag.csv
tmp=$(mktemp -d)
cleanup() { "$EMU" down >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
"$EMU" up "$nh" "$RATE" >/dev/null
hosts=$(seq -s, -f "${EMU_PREFIX}%g:$rph" 1 "$nh")
for r in $(seq 1 "$ROUNDS"); do
    for p in $PROFILES; do
        read -r sscale tscale < <(python3 "$SRCDIR/bench/e2e-report.py" scale \
            --profile "$SRCDIR/fusion/profiles/$p.prof" --rate "$RATE" --np "$np" \
            --hosts "$nh" --comm-ms "$COMM_MS" --ratio 1)
        for side in a b; do
            v=$VA
            [[ $side == b ]] && v=$VB
            echo "$PROG: round $r, $p, $VAR=$v"
            "$EMU" mpirun -np "$np" --host "$hosts" -x "$VAR=$v" "$BENCH" --profile "$SRCDIR/fusion/profiles/$p.prof" \
                --configs "$CONFIGS" --iters "$ITERS" --size-scale "$sscale" --time-scale "$tscale" \
                --csv "$tmp/$p-$side-$r.csv" --quiet >/dev/null
        done
    done
done
"$EMU" down >/dev/null
python3 - "$tmp" "$csv" "$VAR" "$VA" "$VB" "$ROUNDS" "$LAYOUT" "$SRCDIR/docs/PERFORMANCE.md" "$WHY" \
    "bench/env-ab.sh --var $VAR --a $VA --b $VB --layout $LAYOUT --rounds $ROUNDS --iters $ITERS" <<'EOF'
import csv, glob, os, statistics, sys
sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[8]), "..", "bench"))
from docsection import replace_section
tmp, out, var, va, vb, rounds, layout, doc, why, cmd = sys.argv[1:11]
runs = {}
for f in sorted(glob.glob(os.path.join(tmp, "*.csv"))):
    prof, side, _ = os.path.basename(f)[:-4].rsplit("-", 2)
    for row in csv.DictReader(open(f)):
        runs.setdefault((prof, row["config"]), {}).setdefault(side, []).append(float(row["iter_ms"]))
rows = []
for (prof, conf), s in sorted(runs.items()):
    if "a" in s and "b" in s:
        a, b = statistics.median(s["a"]), statistics.median(s["b"])
        rows.append((prof, conf, a, b, b / a, min(s["b"]) / max(s["a"]), max(s["b"]) / min(s["a"])))
with open(out, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["profile", "config", "var", "a", "b", "iter_ms_a", "iter_ms_b", "ratio_b_a"])
    for r in rows:
        w.writerow([r[0], r[1], var, va, vb, "%.2f" % r[2], "%.2f" % r[3], "%.4f" % r[4]])
tag = var[len("DEAR_"):].lower().replace("_", "-")
begin = "<!-- BEGIN envab-%s: generated by bench/env-ab.sh, edits here are overwritten -->" % tag
end = "<!-- END envab-%s -->" % tag
lines = [begin, "## What %s=%s costs" % (var, vb), ""]
if why:
    lines += [why, ""]
lines += ["Emulated cluster, %s layout at 1 Gbit/s, balanced cases (compute about equal to the all-reduce at the link"
          " rate); %s runs of each setting, alternately; median iteration time over the runs. Reproduce: `%s`." %
          (layout, rounds, cmd), "",
          "| profile | configuration | %s=%s (ms) | %s=%s (ms) | ratio |" % (var, va, var, vb), "|---|---|---:|---:|---:|"]
for r in rows:
    lines.append("| %s | %s | %.1f | %.1f | %.3f |" % (r[0], r[1], r[2], r[3], r[4]))
if rows:
    lines += ["", "Median ratio: %.3f." % statistics.median(r[4] for r in rows)]
lines.append(end)
replace_section(doc, "\n".join(lines) + "\n", begin.split(":")[0], end)
print("\n".join(lines))
EOF
