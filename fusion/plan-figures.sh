#!/bin/sh
# Figures of the fusion planners, printed as Markdown:
#  1. planner run times (none, threshold, mgwfbp, dp, gradssa, auto; schedule dear) on synthetic
#     profiles of 160, 500 and 2000 tensors (two tensors per layer, sizes 1 KiB..1.5 MiB,
#     forward 0.1-0.8 ms per layer, backward twice that; 10GbE preset, P = 16);
#  2. predicted iteration times of the five shipped profiles under sync, wfbp+threshold (25 MiB),
#     wfbp+mgwfbp, dear+threshold (25 MiB), dear+dp and dear+gradssa, on the 10GbE preset for
#     P = 16 and P = 64, and P = 64 with four GPUs sharing each 10GbE link (beta x 4), with
#     dear+gradssa's gain over the best non-dear method.
# Usage: fusion/plan-figures.sh [DEAR_PLAN_BINARY] [SRCDIR]   (run from a build directory)
set -eu
plan=${1:-./apps/tools/dear-plan}
src=${2:-$(dirname "$0")/..}
[ -x "$plan" ] || { echo "plan-figures.sh: $plan is not built (make apps/tools/dear-plan)" >&2; exit 1; }
tmp=$(mktemp -d /tmp/dear-plan-figures.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

synthetic() {   # ntensors > file
    awk -v n="$1" 'BEGIN {
        L = n / 2
        print "dear-profile 1"
        print "model synthetic-" n
        for (l = 0; l < L; l++) {
            f = 1e-4 * (1 + (l * 37) % 8)
            printf "layer %d %.6g %.6g\n", l, f, 2 * f
        }
        for (l = 0; l < L; l++) {
            printf "tensor w%d %d %d\n", l, l, 16384 * (1 + (l * 7919) % 97)
            printf "tensor b%d %d %d\n", l, l, 1024 * (1 + l % 4)
        }
        printf "end %d %d\n", L, n
    }'
}

echo "## Planner CPU time (ms, schedule dear, 10GbE preset, P=16; one run each, thread CPU time)"
echo
echo "| tensors | none | threshold | mgwfbp | dp | gradssa | auto |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
for n in 160 500 2000; do
    synthetic "$n" > "$tmp/s$n.prof"
    "$plan" --profile "$tmp/s$n.prof" --preset 10gbe --workers 16 --schedule dear --csv > "$tmp/s$n.csv"
    awk -F, -v n="$n" '$3 == "dear" { t[$4] = $11 }
        END { printf "| %d | %s | %s | %s | %s | %s | %s |\n", n, t["none"], t["threshold"], t["mgwfbp"],
              t["dp"], t["gradssa"], t["auto"] }' "$tmp/s$n.csv"
done

table() {   # title, then dear-plan cost arguments
    title=$1; shift
    echo
    echo "## Predicted iteration time (ms), $title"
    echo
    echo "| model | sync | wfbp+threshold | wfbp+mgwfbp | dear+threshold | dear+dp | dear+gradssa | dear+gradssa vs best other |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    for m in resnet50 vgg16 densenet201 bert-base gpt2-small; do
        "$plan" --profile "$src/fusion/profiles/$m.prof" "$@" --csv > "$tmp/$m.csv"
        awk -F, -v m="$m" 'NR > 1 { t[$3 "+" $4] = $5 }
            END {
                other = t["sync+-"]
                for (k in t) if (k ~ /^wfbp\+/ && t[k] < other) other = t[k]
                printf "| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %+.1f%% |\n", m, t["sync+-"],
                    t["wfbp+threshold"], t["wfbp+mgwfbp"], t["dear+threshold"], t["dear+dp"], t["dear+gradssa"],
                    100 * (other / t["dear+gradssa"] - 1)
            }' "$tmp/$m.csv"
    done
}

table "10GbE preset, P=16" --preset 10gbe --workers 16
table "10GbE preset, P=64" --preset 10gbe --workers 64
# DeAR's 64 GPUs were 16 nodes of 4 GPUs sharing one 10GbE NIC: each GPU gets about a quarter
# of the link, so the same model with beta x 4 brackets that setting (alpha unchanged).
table "10GbE shared by 4 GPUs per NIC, P=64 (alpha 3.81e-3 s, beta 4 x 7.77e-10 s/B)" \
    --alpha 3.81e-3 --beta 3.108e-9 --workers 64
echo
echo "Best other = the fastest of sync and wfbp under every planner (none, threshold, mgwfbp, dp,"
echo "gradssa, auto). DeAR's reported headline: up to 83% faster than the best other method on"
echo "10GbE with 64 GPUs (measured, on its own models and GPUs)."
