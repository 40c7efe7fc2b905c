#!/bin/sh
# bench/engine-cost-report.py on a made-up calibration cache and dear-bench CSVs: the cost per
# collective as the runtime ran it (dear:none's period over its two collectives per tensor,
# sync:none's period less its compute over one per tensor), the calibration's prices alone and
# in a burst (interpolated between points, none past the burst curve's last), the worst error per
# layout, the section placed after the e2e-many one, and a bad cache refused by name.
: "${srcdir:=.}"
. "$srcdir/tests/apps/report-lib.sh"
report=$srcdir/bench/engine-cost-report.py

# 6 ranks, 3 per host: rs 100 us at 64 KiB and 300 us at 256 KiB, so 160 KiB costs 200 us; ag
# 150 and 350 (250 at 160 KiB); ar 400 and 800; the burst curve ends at 64 KiB.
cat >"$dir/engine-cost-2x3.cal" <<'EOF'
dear-cost 1
# made up
6 3 rs auto 0 0 0 0 2 65536:0.0001,262144:0.0003
6 3 rs auto/4 0 0 0 0 1 65536:0.00008
6 3 ag auto 0 0 0 0 2 65536:0.00015,262144:0.00035
6 3 ag auto/4 0 0 0 0 1 65536:0.00009
6 3 ar auto 0 0 0 0 2 65536:0.0004,262144:0.0008
EOF
H=model,np,config,grad_bytes,compute_meas_ms,period_ms,pred_ms,pred_err_pct
# 10 tensors: dear:none runs 20 collectives, sync:none 10.
{
    echo "$H"
    echo "m,6,dear:none,655360,3.1,12.0,6.0,-50.00"
    echo "m,6,sync:none,655360,3.0,8.0,7.0,-12.50"
} >"$dir/engine-cost-2x3-64k.csv"
{
    echo "$H"
    echo "m,6,dear:none,1638400,3.1,20.0,19.0,-5.00"
} >"$dir/engine-cost-2x3-160k.csv"
printf '# perf\n\n<!-- END e2e-many -->\n\nafter\n' >"$dir/P.md"
python3 "$report" --results "$dir" --doc "$dir/P.md" --command test >"$dir/out" 2>&1 ||
    { cat "$dir/out"; fail "the report failed"; }

# 64k: 12 ms / 20 = 600 us; sync (8 - 3) ms / 10 = 500 us.
row64="| 2x3 | 64k | 12.0 | 6.0 | -50.0% | 600 | 100 / 150 | 80 / 90 | 8.0 | 7.0 | -12.5% | 500 | 400 |"
grep -qF "$row64" "$dir/P.md" ||
    { grep "^| 2x3" "$dir/P.md"; fail "the 64k row"; }
# 160k: 1000 us, the curves interpolated, no burst price past 64 KiB, no sync row.
grep -qF "| 2x3 | 160k | 20.0 | 19.0 | -5.0% | 1000 | 200 / 250 | - | - | - | - | - | - |" "$dir/P.md" ||
    { grep "^| 2x3" "$dir/P.md"; fail "the 160k row"; }
# Sizes in order of bytes, not of names.
[ "$(grep -c '^| 2x3 | ' "$dir/P.md")" = 2 ] && grep '^| 2x3 | ' "$dir/P.md" | head -n 1 | grep -qF '| 64k |' ||
    fail "the rows are not one per size, smallest first"
grep -qF "per layout: 2x3 -50.0% (64k)." "$dir/P.md" || fail "the worst error"
placed_once "$report" engine-cost e2e-many
# A cache without an entry: a clear error naming it, the page untouched.
echo "dear-cost 1" >"$dir/engine-cost-2x3.cal"
refused "$report" "$dir" "engine-cost-2x3.cal: no calibration entry"
echo "engine-cost-report.sh: costs per collective, prices and placement as computed by hand: ok"
