#!/bin/sh
# bench/refit-report.py on made-up dear-bench CSVs: each job's error against its own period, the
# R job's period over its pair's A job's, a job without prediction left out, the summary per
# layout and rate (median and worst |error|, the count within 5%), slower rates first, the plan
# mode's jobs (refit-plan/) in a table of their own, the section placed after the pred-rate one,
# and a results folder without a job refused by name.
: "${srcdir:=.}"
. "$srcdir/tests/apps/report-lib.sh"
report=$srcdir/bench/refit-report.py

H=model,np,config,period_ms,pred_ms
# pair 1: threshold 400 -> 404 (+1.0%) then 404 -> 404; dp 340 -> 306 (-10.0%) then 350 -> 343 (-2.0%)
{ echo "$H"; echo "m,6,dear:threshold:25m,400,404"; echo "m,6,dear:dp,340,306"; } >"$dir/refit-2x3-1gbit-A1.csv"
{ echo "$H"; echo "m,6,dear:threshold:25m,404,404"; echo "m,6,dear:dp,350,343"; } >"$dir/refit-2x3-1gbit-R1.csv"
# pair 2: threshold 410 -> 389.5 (-5.0%) then 410 -> 410; dp without a prediction, then 330 -> 336.6
{ echo "$H"; echo "m,6,dear:threshold:25m,410,389.5"; echo "m,6,dear:dp,330,nan"; } >"$dir/refit-2x3-1gbit-A2.csv"
{ echo "$H"; echo "m,6,dear:threshold:25m,410,410"; echo "m,6,dear:dp,330,336.6"; } >"$dir/refit-2x3-1gbit-R2.csv"
# another layout at a slower rate, and the plan mode's pair: 200 -> 210 (+5.0%), 200 -> 190 (-5.0%)
{ echo "$H"; echo "m,8,dear:dp,200,210"; } >"$dir/refit-2x4-100mbit-A1.csv"
{ echo "$H"; echo "m,8,dear:dp,220,209"; } >"$dir/refit-2x4-100mbit-R1.csv"
mkdir "$dir/refit-plan"
{ echo "$H"; echo "m,4,dear:gradssa,300,297"; } >"$dir/refit-plan/refit-2x2-1gbit-A1.csv"
{ echo "$H"; echo "m,4,dear:gradssa,330,330"; } >"$dir/refit-plan/refit-2x2-1gbit-R1.csv"
printf '# perf\n\n<!-- END pred-rate -->\n\nafter\n' >"$dir/P.md"
python3 "$report" --results "$dir" --doc "$dir/P.md" --command test >"$dir/out" 2>&1 ||
    { cat "$dir/out"; fail "the report failed"; }

grep -qF "| 2x3, 1gbit | dear:threshold:25m | +1.0%, -5.0% | +0.0%, +0.0% | 1.010, 1.000 |" "$dir/P.md" ||
    { grep "^| 2x3" "$dir/P.md"; fail "the threshold row"; }
grep -qF "| 2x3, 1gbit | dear:dp | -10.0% | -2.0%, +2.0% | 1.029, 1.000 |" "$dir/P.md" ||
    { grep "^| 2x3" "$dir/P.md"; fail "the dp row (a job without prediction left out)"; }
grep -qF "2x3, 1gbit: A median 5.0%, worst -10.0%, within 5%: 2 of 3; R median 1.0%, worst -2.0%, within 5%: 4 of 4." \
    "$dir/P.md" || { grep "per layout" "$dir/P.md"; fail "the summary"; }
grep -qF "| 2x4, 100mbit | dear:dp | +5.0% | -5.0% | 1.100 |" "$dir/P.md" || fail "the 100mbit row"
[ "$(grep -n '^| 2x' "$dir/P.md" | head -n 1 | grep -c 100mbit)" = 1 ] || fail "the slower rate is not first"
heading=$(grep -nF "### Planning with the fitted model" "$dir/P.md" | cut -d: -f1)
row=$(grep -nF "| 2x2, 1gbit | dear:gradssa | -1.0% | +0.0% | 1.100 |" "$dir/P.md" | cut -d: -f1)
[ -n "$heading" ] && [ -n "$row" ] && [ "$row" -gt "$heading" ] || fail "the plan mode's table"
placed_once "$report" refit pred-rate
mkdir "$dir/empty"
refused "$report" "$dir/empty" "no bench/results/refit-LAYOUT-RATE-{A,R}N.csv under $dir/empty"
echo "refit-report.sh: errors, period ratios and summary as computed by hand: ok"
