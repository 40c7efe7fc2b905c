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
PROG="env-ab.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
BENCH_USAGE_RC=2
VAR='' VA='' VB='' ROUNDS=3 ITERS=10 LAYOUT=4x1 RATE=1gbit COMM_MS=300 BUILDDIR=
PROFILES="resnet50 bert-base gpt2-small"
CONFIGS="wfbp:threshold:64m;dear:auto"
WHY=
emu_names v 10.213.50

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

bench_options --var=VAR --a=VA? --b=VB? --profiles=PROFILES --configs=CONFIGS --layout=LAYOUT --rounds=ROUNDS \
    --iters=ITERS --why=WHY --builddir=BUILDDIR -- "$@"
[[ $VAR =~ ^DEAR_[A-Z0-9_]+$ ]] || usage_error "--var '$VAR': expected a DEAR_* name"
[[ $ROUNDS =~ ^[1-9][0-9]*$ && $ITERS =~ ^[1-9][0-9]*$ ]] || usage_error "bad --rounds/--iters"
[[ $LAYOUT =~ ^([1-4])x([1-8])$ ]] || usage_error "bad --layout '$LAYOUT': expected HOSTSxRANKS, 1-4 hosts"
nh=${BASH_REMATCH[1]} rph=${BASH_REMATCH[2]}
np=$((nh * rph))
BENCH=$(bench_prog "${BUILDDIR:-$SRCDIR}" apps/bench/dear-bench)
[[ $EUID -eq 0 ]] || die "needs root (network namespaces)"

tag=$(echo "${VAR#DEAR_}" | tr 'A-Z_' 'a-z-')
csv=$RES/envab-$tag.csv
bench_start
emu_up "$nh" "$RATE" >/dev/null
hosts=$(emu_hosts "$nh" "$rph")
declare -A scale
for p in $PROFILES; do
    scale[$p]=$(e2e_scale "$SRCDIR/fusion/profiles/$p.prof" "$RATE" "$np" "$nh" "$COMM_MS" 1)
done
# run ROUND PROFILE:SIDE: dear-bench on PROFILE with VAR at side a's value or side b's.
run() {
    local r=$1 p=${2%:*} side=${2#*:} v=$VA sscale tscale
    [[ $side == b ]] && v=$VB
    read -r sscale tscale <<<"${scale[$p]}"
    echo "$PROG: round $r, $p, $VAR=$v"
    emu_mpirun "$np" "$hosts" -x "$VAR=$v" "$BENCH" --profile "$SRCDIR/fusion/profiles/$p.prof" \
        --configs "$CONFIGS" --iters "$ITERS" --size-scale "$sscale" --time-scale "$tscale" \
        --csv "$tmp/$p-$side-$r.csv" --quiet >/dev/null
}
sides=()
for p in $PROFILES; do sides+=("$p:a" "$p:b"); done
bench_rounds "$ROUNDS" run "${sides[@]}"
emu_down >/dev/null
python3 - "$tmp" "$csv" "$VAR" "$VA" "$VB" "$ROUNDS" "$LAYOUT" "$DOC" "$WHY" \
    "bench/env-ab.sh --var $VAR --a $VA --b $VB --layout $LAYOUT --rounds $ROUNDS --iters $ITERS \
--profiles '$PROFILES' --configs '$CONFIGS'" <<'EOF'
import csv, glob, os, statistics, sys
sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[8]), "..", "bench"))
from docsection import markers, read_csv, write_section
tmp, out, var, va, vb, rounds, layout, doc, why, cmd = sys.argv[1:11]
runs = {}
for f in sorted(glob.glob(os.path.join(tmp, "*.csv"))):
    prof, side, _ = os.path.basename(f)[:-4].rsplit("-", 2)
    for row in read_csv(f):
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
begin, end = markers("envab-" + tag, "bench/env-ab.sh")
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
write_section(doc, lines, begin.split(":")[0], end)
print("\n".join(lines))
EOF
