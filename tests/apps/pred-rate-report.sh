#!/bin/sh
# bench/pred-rate-report.py on made-up dear-bench CSVs and counters: each job's error against its
# own period, the CPU share and loopback bytes per link byte summed over a cell's jobs, the worst
# error and the count within 5%, cells ordered by layout then by rate in bits (250mbit before
# 1gbit), the section placed after the engine-cost one, and a results folder without a job
# refused by name.
: "${srcdir:=.}"
. "$srcdir/tests/apps/report-lib.sh"
report=$srcdir/bench/pred-rate-report.py

H=model,np,config,plan,rs_buckets,ag_groups,period_ms,pred_ms
# 2x3 at 1gbit, two jobs: threshold 400 -> 404 (+1.0%) and 410 -> 389.5 (-5.0%), dp 340 -> 323
# (-5.0%) and 330 -> 313.5 (-5.0%); dp's second job has no prediction and is left out.
{
    echo "$H"
    echo "m,6,dear:threshold:25m,threshold,4,4,400,404"
    echo "m,6,dear:dp,dp,40,30,340,306"
} >"$dir/pred-rate-2x3-1gbit-1.csv"
{
    echo "$H"
    echo "m,6,dear:threshold:25m,threshold,4,4,410,389.5"
    echo "m,6,dear:dp,dp,41,31,330,nan"
} >"$dir/pred-rate-2x3-1gbit-2.csv"
printf 'lo_bytes link_bytes cpu_busy cpu_total\n400 100 30 100\n' >"$dir/pred-rate-2x3-1gbit-1.io"
printf 'lo_bytes link_bytes cpu_busy cpu_total\n4.0e2 100 50 100\n' >"$dir/pred-rate-2x3-1gbit-2.io"
# 2x3 at 250mbit, one job without counters: 300 -> 303 (+1.0%).
{ echo "$H"; echo "m,6,dear:dp,dp,20,20,300,303"; } >"$dir/pred-rate-2x3-250mbit-1.csv"
printf '# perf\n\n<!-- END engine-cost -->\n\nafter\n' >"$dir/P.md"
python3 "$report" --results "$dir" --doc "$dir/P.md" --command test >"$dir/out" 2>&1 ||
    { cat "$dir/out"; fail "the report failed"; }

# CPU (30 + 50) / 200 = 40%, loopback 800 / 200 = 4.0, worst -10.0% (dp's first job), 2 of 3.
grep -qF "| 2x3 | 1gbit | 40% | 4.0 | -10.0% | 2 of 3 |" "$dir/P.md" ||
    { grep "^| 2x3" "$dir/P.md"; fail "the 1gbit summary row"; }
grep -qF "| 2x3 | 250mbit | - | - | +1.0% | 1 of 1 |" "$dir/P.md" ||
    { grep "^| 2x3" "$dir/P.md"; fail "the 250mbit summary row"; }
grep -qF "| 2x3 | 1gbit | dear:threshold:25m | threshold 4/4 / threshold 4/4 | 400.0 / 410.0 | 404.0 / 389.5 | +1.0% / -5.0% |" \
    "$dir/P.md" || { grep "^| 2x3" "$dir/P.md"; fail "the threshold row"; }
grep -qF "| 2x3 | 1gbit | dear:dp | dp 40/30 | 340.0 | 306.0 | -10.0% |" "$dir/P.md" ||
    { grep "^| 2x3" "$dir/P.md"; fail "the dp row (a job without prediction left out)"; }
# 250mbit before 1gbit: by bits, not by name.
grep '^| 2x3 | [0-9a-z]* | [0-9-]' "$dir/P.md" | head -n 1 | grep -qF '| 250mbit |' ||
    fail "the rates are not in order of bits"
grep -qF "2x3 at 250mbit 1.0%; 2x3 at 1gbit 5.0%." "$dir/P.md" || fail "the median errors"
placed_once "$report" pred-rate engine-cost
# No job kept: a clear error naming the folder, the page untouched.
mkdir "$dir/empty"
refused "$report" "$dir/empty" "no bench/results/pred-rate-LAYOUT-RATE-RUN.csv under $dir/empty"
echo "pred-rate-report.sh: errors, CPU share, loopback bytes and order as computed by hand: ok"
