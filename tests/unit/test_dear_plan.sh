#!/bin/sh
# dear-plan's command line: help, a full run on a shipped profile (table, CSV, SVG, plan file,
# scaling), planning from a model description, and clear errors for bad arguments and bad
# profiles.
set -u
: "${top_builddir:=.}" "${top_srcdir:=.}"
exe=$top_builddir/apps/tools/dear-plan
prof=$top_srcdir/fusion/profiles/resnet50.prof
tmp=$(mktemp -d /tmp/dear-plan-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$exe" --help | grep -q -- "--profile FILE" || fail "--help"
out=$("$exe" --profile "$prof" --preset 10gbe --workers 16 --svg "$tmp/g.svg" --plan-out "$tmp/p.plan" \
      --scale 8,64) || fail "full run exited $?"
echo "$out" | grep -q "^sync " || fail "no sync row"
for p in none threshold mgwfbp dp gradssa auto; do
    [ "$(echo "$out" | grep -c "^[a-z]* *$p ")" -eq 2 ] || fail "planner $p missing for wfbp or dear"
done
echo "$out" | grep -q "best shown:" || fail "no best row"
grep -q "^<svg" "$tmp/g.svg" || fail "no SVG written"
grep -q "^dear-plan 2" "$tmp/p.plan" || fail "no plan written"
[ "$(grep -c '^tensor ' "$tmp/p.plan")" -eq 161 ] || fail "plan file does not list 161 tensors"
echo "$out" | grep -q "^ *64 " || fail "no scaling row for 64"
csv=$("$exe" --profile "$prof" --alpha 9.08e-4 --beta 7.4e-10 --workers 16 --schedule dear --planner dp --csv) \
    || fail "csv run"
[ "$(echo "$csv" | wc -l)" -eq 2 ] || fail "csv: want header and one row, got: $csv"
echo "$csv" | grep -q "^resnet50,16,dear,dp," || fail "csv row: $csv"

# A sparse token embedding (5% of its rows sent per rank, 15% in the sum) is priced by its wire
# bytes: auto's predicted iteration is shorter than with --dense, which prices it whole.
gpt=$tmp/gpt.prof
awk '{ print } /^tensor wte.weight /{ print "sparse wte.weight 3072 0.05 0.15" }' \
    "$top_srcdir/fusion/profiles/gpt2-small.prof" > "$gpt"
t_sparse=$("$exe" --profile "$gpt" --preset 10gbe --workers 16 --schedule dear --planner auto --csv | cut -d, -f5 | tail -1)
t_dense=$("$exe" --profile "$gpt" --preset 10gbe --workers 16 --schedule dear --planner auto --csv --dense |
          cut -d, -f5 | tail -1)
awk -v s="$t_sparse" -v d="$t_dense" 'BEGIN { exit !(s > 0 && s < d) }' ||
    fail "sparse embedding: auto predicts $t_sparse ms, dense $t_dense ms"
"$exe" --profile "$gpt" --preset 10gbe --workers 16 --schedule dear --planner dp |
    grep -q "^sparse wte.weight: 147.2 MiB in blocks of 3072 bytes; non-zero blocks 5.00%" ||
    fail "the table does not describe the sparse tensor"

# With 2 ranks per host the reduce-scatter's exchange crosses the link once per rank: the same
# curves keyed for 2 ranks per host price the sparse embedding's reduce-scatter as the dense
# collective of twice its wire bytes, so dear's prediction with a bucket per tensor grows, and the
# table says so; with 1 it does not.
rcost=$tmp/r.cost
{
    echo "dear-cost 1"
    for rph in 1 2; do
        for op in rs ag ar; do echo "4 $rph $op auto 0.001 1e-8 0 0.1 4 8192:0.001,65536:0.002,262144:0.004,8388608:0.1"; done
    done
} > "$rcost"
r1=$("$exe" --profile "$gpt" --cost "$rcost" --workers 4 --schedule dear --planner none) || fail "sparse, 1 rank per host"
r2=$("$exe" --profile "$gpt" --cost "$rcost" --ranks-per-host 2 --workers 4 --schedule dear --planner none) ||
    fail "sparse, 2 ranks per host"
t1=$(echo "$r1" | awk '$1 == "dear" && $2 == "none" { print $3 }')
t2=$(echo "$r2" | awk '$1 == "dear" && $2 == "none" { print $3 }')
awk -v a="$t1" -v b="$t2" 'BEGIN { exit !(a > 0 && b > a) }' ||
    fail "sparse embedding at 2 ranks per host: dear none predicts $t2 ms, at 1 rank $t1 ms"
echo "$r2" | grep -q "^  with 2 ranks per host the reduce-scatter's exchange sends each rank's pieces across the link: pr" ||
    fail "the table does not say how the exchange is priced at 2 ranks per host: $r2"
echo "$r1" | grep -q "ranks per host the reduce-scatter's exchange" && fail "1 rank per host: the exchange's line printed"

# Partitioned tensors: vgg16's fc6 (74% of the bytes) is cut at the default partition and the plan
# file records its chunks; with compute about equal to the all-reduce, auto's predicted iteration
# is more than 1% shorter with the cuts than with every tensor whole (--partition 0; whole, auto
# now gathers a few groups early where its trailing run gathered one), and the wfbp+threshold
# reference is the same in both (it keeps the tensors whole).
vgg=$top_srcdir/fusion/profiles/vgg16.prof
"$exe" --profile "$vgg" --alpha 2e-3 --beta 1.1e-9 --workers 4 --schedule dear --planner dp \
    --plan-out "$tmp/v.plan" | grep -q "^partition 16777216 bytes: 59 units; cut: .*classifier.0.weight in 25" ||
    fail "the table does not say how the tensors are cut"
grep -q "^cut 26 411041792 " "$tmp/v.plan" && grep -q "^units 59$" "$tmp/v.plan" || fail "the plan file lacks the cuts"
row() { "$exe" --profile "$vgg" --alpha 2e-3 --beta 1.1e-9 --workers 4 --schedule dear --planner auto --csv "$@" |
        tail -1; }
cut=$(row) whole=$(row --partition 0)
awk -F, -v c="$cut" -v w="$whole" 'BEGIN { split(c, a, ","); split(w, b, ",");
    r = a[5] * a[8] - b[5] * b[8];
    exit !(a[5] < 0.99 * b[5] && a[8] > b[8] && r * r < 1e-6 * b[5] * b[5] && a[15] == 59 && b[15] == 32) }' ||
    fail "partitioned auto ($cut) not faster than whole ($whole) against the same reference"
# A model description alone (no times): planned from its structure and hints, predicted on the
# estimate at --compute-ms; and a profile planned from its description's hints with the profile's
# totals (--estimate first) predicted within 1% of the plan made from its times (vs_prof).
bm=$top_srcdir/fusion/profiles/bert-base.model
out=$("$exe" --profile "$bm" --preset 10gbe --workers 4 --schedule dear --planner auto --compute-ms 300 \
      --estimate first --plan-out "$tmp/bm.plan") || fail "model description run exited $?"
echo "$out" | grep -q "forward 100.00 ms, backward 200.00 ms" || fail "description: totals not --compute-ms: $out"
echo "$out" | grep -q "predicted on the estimate at --compute-ms" || fail "description: no estimate line"
grep -q "^dear-plan 2" "$tmp/bm.plan" || fail "description: no plan written"
vs=$("$exe" --profile "$top_srcdir/fusion/profiles/bert-base.prof" --hints "$bm" --estimate first --preset 10gbe \
     --workers 4 --schedule dear --planner auto | awk '$1 == "dear" && $2 == "auto" { print $NF }')
awk -v v="$vs" 'BEGIN { sub("%", "", v); exit !(v != "" && v + 0 < 1) }' || fail "estimate first vs_prof '$vs'"
# Compression: priced at the bytes that travel, so --compress bf16 predicts what the profile with
# every tensor half the bytes predicts uncompressed (planners whose buckets follow the cost, not
# a byte threshold; every tensor whole, since the cuts are by bytes).
sed 's/^\(tensor [^ ]* [0-9]*\) \([0-9]*\)$/\1 HALF\2/' "$vgg" | awk '{ if ($4 ~ /^HALF/) { $4 = substr($4, 5) / 2 } print }' \
    > "$tmp/half.prof"
for planner in dp mgwfbp; do
    c=$("$exe" --profile "$vgg" --alpha 2e-3 --beta 1.1e-9 --workers 4 --planner $planner --partition 0 --csv \
        --compress bf16 | awk -F, 'NR > 1 { print $3, $5 }')
    h=$("$exe" --profile "$tmp/half.prof" --alpha 2e-3 --beta 1.1e-9 --workers 4 --planner $planner --partition 0 \
        --csv | awk -F, 'NR > 1 { print $3, $5 }')
    [ -n "$c" ] && [ "$c" = "$h" ] || fail "--compress bf16 with $planner: '$c', the half-size profile: '$h'"
done
"$exe" --profile "$vgg" --preset 10gbe --workers 4 --compress bf16/none | grep -q "^compressed: reduce-scatters (all-reduces) bf16, all-gathers none; priced at 263.9 and 527.8 MiB on the wire" ||
    fail "the table does not say what is compressed"
# --estimate shows the start the runtime makes (DEAR_FIRST_MIN_GAIN): a model-driven planner's row
# starts on the threshold plan exactly where its predicted gain is under the share, and then
# predicts the threshold row's iteration; at the default share every such row of resnet50 at 10GbE
# and P=64 starts on the threshold plan (each predicted under 10% faster), at 0 the plans predicted
# faster at all run.
for g in 0.1 0.05 0; do
    "$exe" --profile "$prof" --preset 10gbe --workers 64 --estimate range --schedule dear --first-min-gain $g --csv \
        > "$tmp/start.csv" || fail "--estimate range --first-min-gain $g exited $?"
    awk -F, -v g=$g 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        $c["planner"] == "threshold" { thr = $c["iter_ms"] }
        $c["planner"] != "none" && $c["planner"] != "threshold" {
            n++; s = $c["start"]; gain = $c["first_gain"] + 0
            if (s != (gain < g ? "threshold" : "plan")) { print "row " $c["planner"] ": start " s " at gain " gain; bad = 1 }
            want = s == "threshold" ? thr : $c["iter_ms"]
            if ($c["start_iter_ms"] != want) { print "row " $c["planner"] ": start_iter_ms " $c["start_iter_ms"] " != " want; bad = 1 }
            if (g == 0 && s != (gain < 0 ? "threshold" : "plan")) bad = 1
            nthr += s == "threshold" }
        END { if (n < 4) { print n " model-driven rows"; bad = 1 }
              if (g == 0.1 && nthr != n) { print "at 0.1 only " nthr " of " n " start on threshold"; bad = 1 }
              if (g == 0 && nthr == n) { print "at 0 every row starts on threshold"; bad = 1 }
              exit bad }' "$tmp/start.csv" || fail "--estimate's start column at --first-min-gain $g"
done
"$exe" --profile "$prof" --preset 10gbe --workers 64 --estimate range --schedule dear |
    grep -q "^dear     auto .*start: threshold (gain +[0-9.]*%), [0-9.]* ms$" || fail "the table shows no start for auto"
# The line naming the plan training starts on (dear + auto, the runtime's defaults): bert-base's
# description at 300 ms of compute, whose auto plan is predicted under 10% faster than the 8 MiB
# threshold plan (threshold start) and more than 10% faster than a 100 MiB one (auto start); both
# predictions are the table's dear rows (the estimate is the table's profile here), the gain and
# the decision recomputed from them.
for t in 8388608 104857600; do
    out=$("$exe" --profile "$bm" --preset 10gbe --workers 4 --schedule dear --compute-ms 300 --estimate first \
          --threshold $t) || fail "start line at --threshold $t: exited $?"
    want=$(echo "$out" | awk '$1 == "dear" && $2 == "threshold" { thr = $3 } $1 == "dear" && $2 == "auto" { a = $3 }
        END { g = 1 - a / thr
              printf "training starts on: the %s plan (dear + auto: its plan predicted %.3f ms, the threshold plan %.3f ms at the estimate'"'"'s times; gain %+.1f%%, %s DEAR_FIRST_MIN_GAIN=0.1)\n",
                     (g >= 0.1 ? "auto" : "threshold"), a, thr, 100 * g, (g >= 0.1 ? "at least" : "under") }')
    got=$(echo "$out" | grep "^training starts on:")
    [ "$got" = "$want" ] || fail "start line at --threshold $t: '$got', want '$want'"
    case $t in
        8388608) echo "$got" | grep -q "the threshold plan (" || fail "8 MiB: should start on the threshold plan" ;;
        *) echo "$got" | grep -q "the auto plan (" || fail "100 MiB: should start on auto's plan" ;;
    esac
done
# A calibration cache with burst curves (auto/4) at twice the alone curve's time: with
# --inflight 4 (the default) a queued reduce-scatter or all-gather costs twice, and dear's
# one-bucket-per-tensor plan is predicted slower than with --inflight 1 (no burst curve); the
# all-reduce has none, so wfbp's prediction does not move.
cost=$tmp/k.cost
pts="8192:0.001,65536:0.002,262144:0.004,8388608:0.1"
bpts="8192:0.002,65536:0.004,262144:0.008"
{
    echo "dear-cost 1"
    for op in rs ag ar; do echo "4 1 $op auto 0.001 1e-8 0 0.1 4 $pts"; done
    for op in rs ag; do echo "4 1 $op auto/4 0.002 2e-8 0 0.1 3 $bpts"; done
} > "$cost"
p4=$("$exe" --profile "$prof" --cost "$cost" --workers 4 --planner none) || fail "--cost with bursts"
echo "$p4" | grep -q "queued behind others (4 in flight), a rs costs x2.00 at 8192 B, x2.00 at 65536 B, x2.00 at 262144 B" ||
    fail "no burst pricing line: $p4"
p1=$("$exe" --profile "$prof" --cost "$cost" --workers 4 --planner none --inflight 1) || fail "--inflight 1"
echo "$p1" | grep -q "queued behind" && fail "--inflight 1 still prices bursts"
col() { echo "$1" | awk -v s="$2" '$1 == s && $2 == "none" { print $3 }'; }
awk -v a="$(col "$p4" dear)" -v b="$(col "$p1" dear)" 'BEGIN { exit !(a > b * 1.05) }' ||
    fail "dear none: $(col "$p4" dear) ms with bursts, $(col "$p1" dear) ms without"
[ "$(col "$p4" wfbp)" = "$(col "$p1" wfbp)" ] || fail "wfbp moved without an all-reduce burst curve"
# The best row's collectives against what was measured: dear + none, one bucket per layer with
# tensors (107), those of resnet50's layers under 8 KiB priced at it, which adds what the first
# segment's slope (1 ms over 57344 B) would have taken off below 8 KiB, those up to 256 KiB by the
# bursts; and as many all-gather groups alike.
layers() { # LO HI: layers whose tensors hold LO <= bytes < HI
    awk -v lo="$1" -v hi="$2" '$1 == "tensor" { b[$3] += $4 } END { for (l in b) if (b[l] >= lo && b[l] < hi) n++; print n }' "$prof"
}
small=$(layers 0 8192)
burst=$(layers 0 262145)
pen=$(awk '$1 == "tensor" { b[$3] += $4 } END { for (l in b) if (b[l] < 8192) s += (8192 - b[l]) * 0.001 / 57344; printf "%.3f", s * 1e3 }' "$prof")
d4=$("$exe" --profile "$prof" --cost "$cost" --workers 4 --planner none --schedule dear) || fail "dear none with bursts"
echo "$d4" | grep -q "^measured range, dear + none: $small of 107 rs below the smallest size calibrated (8192 B), priced at it (+[0-9.]* ms per iteration over its first segment carried down); $burst within the 4-in-flight burst curve (<= 262144 B), priced by it when queued; no idle curve: .*$" ||
    fail "measured range ($small below, +$pen ms, $burst in bursts): $d4"
[ "$(echo "$d4" | grep -c "^measured range, dear + none: $small of 107 [ra][sg] below")" -eq 2 ] ||
    fail "measured range: want the reduce-scatters and the all-gathers alike: $d4"
# The penalty each phase states, to the printed digits (its sum's order may move the last one).
for got in $(echo "$d4" | sed -n 's/^measured range, dear + none: .* priced at it (+\([0-9.]*\) ms per iteration.*/\1/p'); do
    awk -v g="$got" -v w="$pen" 'BEGIN { exit !(g - w <= 0.0015 && w - g <= 0.0015) }' ||
        fail "measured range: penalty +$got ms, want +$pen ms"
done
noburst="no burst curve: queued ones priced as alone; no idle curve: one on an idle link priced back to back"
echo "$p1" | grep -q "^measured range, .*$noburst$" ||
    fail "measured range without bursts: $p1"
# An idle curve (auto@idle) for the all-reduce, from 5 ms at 1 MiB to 50 ms at 8 MiB: a slope
# near half the back-to-back one, so a lone all-reduce costs the stream's price at 1 MiB plus
# that slope beyond it (plus the 3% tolerance). sync's one all-reduce (97.5 MiB) starts on a
# link idle through forward and backward, so its exposed time is that share of the stream's; the
# pricing line and the measured range say so.
icost=$tmp/i.cost
{ cat "$cost"; echo "4 1 ar auto@idle 0 6e-9 0 0.1 2 1048576:0.005,8388608:0.05"; } > "$icost"
pi=$("$exe" --profile "$prof" --cost "$icost" --workers 4 --planner none) || fail "--cost with an idle curve"
echo "$pi" | grep -q "starting on a link idle for 10 ms, a ar costs x1.00 at 1048576 B, x0.61 at 8388608 B of its time back to back" ||
    fail "no idle pricing line: $pi"
exposed() { echo "$1" | awk '$1 == "sync" { print $4 }'; }
share=$(awk '$1 == "tensor" { S += $4 }
             END { b1 = 0.004 + 0.096 * (1048576 - 262144) / (8388608 - 262144); s = 0.045 / (8388608 - 1048576)
                   printf "%.6f", (b1 + s * (S - 1048576)) / (0.1 / 8388608 * S) + 0.03 }' "$prof")
awk -v a="$(exposed "$pi")" -v b="$(exposed "$p4")" -v f="$share" 'BEGIN { d = a - b * f; exit !(d < 0.01 && d > -0.01) }' ||
    fail "sync exposed $(exposed "$pi") ms with the idle curve, want $share of $(exposed "$p4") ms"
echo "$pi" | grep -q "^measured range, sync + -: .*; 1 above the idle curve.s smallest size (1048576 B), priced by its slope .* 10 ms$" ||
    fail "measured range with the idle curve: $pi"
expect_err() {   # expected-status pattern args...
    want=$1; pat=$2; shift 2
    err=$("$exe" "$@" 2>&1 >/dev/null); rc=$?
    [ $rc -eq "$want" ] || fail "'$*' exited $rc, want $want ($err)"
    echo "$err" | grep -q -- "$pat" || fail "'$*': error '$err' lacks '$pat'"
}
expect_err 2 "--workers P is required" --profile "$prof" --preset 10gbe
expect_err 2 "exactly one cost model" --profile "$prof" --preset 10gbe --alpha 1 --beta 1 --workers 4
expect_err 2 "--workers '1'" --profile "$prof" --preset 10gbe --workers 1
expect_err 2 "--planner 'greedy'" --profile "$prof" --preset 10gbe --workers 4 --planner greedy
expect_err 2 "unknown cost preset 'wifi'" --profile "$prof" --preset wifi --workers 4
expect_err 2 "unknown or incomplete option" --profile "$prof" --preset 10gbe --workers 4 --bogus
expect_err 2 "--partition 'big'" --profile "$prof" --preset 10gbe --workers 4 --partition big
expect_err 2 "--compress 'bf16/fp8' is not RS\[/AG\], each one of none|bf16|fp16" --profile "$prof" --preset 10gbe \
    --workers 4 --compress bf16/fp8
head -n 40 "$prof" > "$tmp/cut.prof"
expect_err 1 "cut.prof:40: truncated" --profile "$tmp/cut.prof" --preset 10gbe --workers 4
sed 's/^tensor conv1.weight 0 37632/tensor conv1.weight 0 -5/' "$prof" > "$tmp/bad.prof"
expect_err 1 "bad.prof:.*BYTES" --profile "$tmp/bad.prof" --preset 10gbe --workers 4
sed 's/^sparse wte.weight 3072 0.05/sparse wte.weight 3072 1.05/' "$gpt" > "$tmp/dens.prof"
expect_err 1 "dens.prof:101:.*densities in \[0, 1\]" --profile "$tmp/dens.prof" --preset 10gbe --workers 4
expect_err 1 "nope.prof" --profile "$tmp/nope.prof" --preset 10gbe --workers 4
expect_err 2 "--estimate 'guess'" --profile "$prof" --preset 10gbe --workers 4 --estimate guess
expect_err 2 "--first-min-gain '2' is not a share between 0 and 1" --profile "$prof" --preset 10gbe --workers 4 \
    --first-min-gain 2
expect_err 2 "--inflight: DEAR_MAX_INFLIGHT='0' is not valid: expected an integer in \[1, 64\]" --profile "$prof" \
    --cost "$cost" --workers 4 --inflight 0
echo "4 1 rs auto/99 0.002 2e-8 0 0.1 0" >> "$cost"
expect_err 2 "k.cost:7: expected .*auto/K" --profile "$prof" --cost "$cost" --workers 4
expect_err 2 "--hints goes with --estimate" --profile "$prof" --preset 10gbe --workers 4 --hints "$bm"
expect_err 2 "layer 107 is not a layer of the profile" --profile "$prof" --preset 10gbe --workers 4 --estimate range \
    --hints "$bm"
echo "dear-plan tests passed"
