#!/bin/sh
# dear-bench end to end on a tiny profile at np 2 and 3: every schedule (and the planners the
# runtime offers), also sharded (+shard: each element updated by one rank) and compressed, must
# pass the parameter check (all ranks identical and equal to the float64 reference, within the
# all-gather's rounding when compressed), and the CSV must hold one well-formed row per
# configuration, in order; a compressed configuration's lower bound counts the bytes that travel
# (never more).
. "${top_srcdir:-.}/tests/apps/dearbench-lib.sh"
CONFIGS="sync;wfbp:threshold:64m;wfbp:none;wfbp:threshold:100k;dear:threshold:100k;dear:none;dear:auto"
CONFIGS="$CONFIGS;sync+shard;wfbp:threshold:100k+shard;dear:auto+shard"
CONFIGS="$CONFIGS;wfbp:threshold:64m+bf16;dear:auto+compress=fp16/none+ef;dear:auto+shard+bf16"
for np in 2 3; do
    bench "$np" --profile "$TINY" --iters 6 --warmup 7 --configs "$CONFIGS" --csv "$TMPD/r$np.csv"
    [ $rc -eq 0 ] || { cat "$TMPD/out" >&2; fail "np $np: exit status $rc"; continue; }
    grep -q "^lower bound: [0-9.]* ms (1 host(s), link measured rank 0 -> 1 (the same host), [0-9.]* MB/s)$" \
        "$TMPD/out" || fail "np $np: no measured link for the lower bound"
    python3 - "$TMPD/r$np.csv" "$np" "$CONFIGS" <<'PY' || fail "np $np: CSV check"
import csv, sys
path, np, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(";")
rows = list(csv.DictReader(open(path)))
assert [r["config"] for r in rows] == configs, [r["config"] for r in rows]
for r in rows:
    assert r["model"] == "tiny" and int(r["np"]) == np, r
    assert r["check"] == "ok", r
    it, comp, nominal = float(r["iter_ms"]), float(r["compute_meas_ms"]), float(r["compute_ms"])
    # 3.1 ms of emulated compute: sleeping may overshoot but never undershoot by much.
    assert abs(nominal - 3.1) < 1e-6 and comp > 0.95 * nominal and it >= comp * 0.99, r
    assert abs(float(r["exposed_ms"]) - (it - comp)) < 1e-3, r
    assert float(r["iter_min_ms"]) <= it <= float(r["iter_max_ms"]), r
    assert float(r["pred_ms"]) >= nominal * 0.99 and float(r["bound_ms"]) >= nominal * 0.99, r
    # The SGD callbacks are timed, and the prediction counts them as compute: each layer's median
    # rank's, never more than its slowest rank's.
    upd, typ = float(r["update_ms"]), float(r["update_typ_ms"])
    assert 0 < typ <= upd + 1e-3 and upd < it and float(r["pred_ms"]) >= nominal + typ - 1e-3, r
    assert abs(float(r["iter_over_bound"]) - it / float(r["bound_ms"])) < 1e-3, r
    assert int(r["grad_bytes"]) == 414404, r
    # The period (the ranks' mean iteration) is never above the slowest rank's; the last rank's
    # lateness is never negative; the prediction is judged against the period.
    per, late = float(r["period_ms"]), float(r["late_ms"])
    assert comp * 0.99 <= per <= it + 1e-3 and late >= 0, r
    assert abs(float(r["pred_err_pct"]) - 100 * (float(r["pred_ms"]) / per - 1)) < 0.011, r
by = {r["config"]: r for r in rows}
assert abs(float(by["sync"]["speedup_sync"]) - 1) < 1e-9
assert abs(float(by["wfbp:threshold:64m"]["speedup_wfbp64"]) - 1) < 1e-9
assert int(by["dear:threshold:100k"]["threshold_bytes"]) == 102400
assert float(by["wfbp:threshold:64m+bf16"]["bound_ms"]) <= float(by["wfbp:threshold:64m"]["bound_ms"])
PY
    grep -q "PARAMETER CHECK FAILED" "$TMPD/out" && fail "np $np: check failure reported"
done
# The lower bound over the links (--link-rate; measured when not given): np 2 on one host moves
# half of each phase's bytes through a rank's link, so a layer's two phases take its bytes / rate.
# The layers' compute (forward + backward) is 0.6, 0.9, 0.2, 0.9, 0.5 ms and their bytes 40400,
# 160000, 0, 124004, 90000. For each k the bytes of layers 0..k cross the link while layers
# k..4 are not computing: the bound is the largest of 3.1 ms + u (u: the updates sharding would
# leave, the measured update_ms over P) and, per k, compute(k..4) + bytes(0..k) / rate. Far
# below the rate shared memory carries (0.01 MB/s) the run beats its "bound", and dear-bench
# says so; at 1000 MB/s compute sets the bound and nothing beats it; at 100 MB/s either may
# happen, by the machine's load.
for lr in 100 1000 0.01; do
    bench 2 --profile "$TINY" --iters 2 --warmup 3 --configs "wfbp:none" --link-rate "$lr" --csv "$TMPD/lb.csv"
    [ $rc -eq 0 ] || { cat "$TMPD/out" >&2; fail "--link-rate $lr: exit status $rc"; continue; }
    got=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } { print $c["bound_ms"] }' "$TMPD/lb.csv")
    upd=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } { print $c["update_ms"] }' "$TMPD/lb.csv")
    want=$(awk -v u="$upd" -v r="$lr" 'BEGIN {
        split("3.1 2.5 1.6 1.4 0.5", after); split("40.4 200.4 200.4 324.404 414.404", sent)
        b = 3.1 + u / 2
        for (k = 1; k <= 5; k++) if (after[k] + sent[k] / r > b) b = after[k] + sent[k] / r
        printf "%.4f", b }')
    awk -v g="$got" -v w="$want" 'BEGIN { exit !(g - w < 2e-4 && w - g < 2e-4) }' ||
        fail "--link-rate $lr: bound_ms $got, want $want (update_ms $upd)"
    warned=$(grep -c "warning: wfbp:none ran [0-9.]* ms, below its lower bound [0-9.]* ms (link --link-rate $lr MB/s)" "$TMPD/out")
    case $lr:$warned in
    1000:0 | 0.01:1 | 100:[01]) ;;
    *) fail "--link-rate $lr: $warned warning(s)" ;;
    esac
done
# A compressed configuration's bound counts the bytes that travel; sharded, the all-gathers carry
# parameters, which travel in float32. At 100 MB/s the cut after layer 1 (200400 bytes) sets both:
# bf16 in both phases 2.5 + 1.002 ms, sharded bf16 (the reduce-scatter only) 2.5 + 1.503 ms.
bench 2 --profile "$TINY" --iters 2 --warmup 3 --configs "dear:auto+bf16;dear:auto+shard+bf16" --link-rate 100 \
    --csv "$TMPD/sb.csv"
[ $rc -eq 0 ] || { cat "$TMPD/out" >&2; fail "sharded bf16 bound: exit status $rc"; }
python3 - "$TMPD/sb.csv" <<'PY' || fail "sharded bf16: the bound does not count float32 all-gathers"
import csv, sys
by = {r["config"]: float(r["bound_ms"]) for r in csv.DictReader(open(sys.argv[1]))}
assert abs(by["dear:auto+bf16"] - 3.502) < 2e-4 and abs(by["dear:auto+shard+bf16"] - 4.003) < 2e-4, by
PY
# --rounds: the configurations run twice, 5 measured iterations split 3 + 2, pooled; the
# default warm-up per planner (3 for a fixed plan).
bench 2 --profile "$TINY" --iters 5 --rounds 2 --configs "dear:threshold:100k;wfbp:none" --csv "$TMPD/rr.csv"
[ $rc -eq 0 ] || { cat "$TMPD/out" >&2; fail "--rounds 2: exit status $rc"; }
[ "$(grep -c 'round 2 of 2' "$TMPD/out")" -eq 2 ] || { cat "$TMPD/out" >&2; fail "--rounds 2: second round"; }
python3 - "$TMPD/rr.csv" <<'PY' || fail "--rounds 2: CSV check"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [r["config"] for r in rows] == ["dear:threshold:100k", "wfbp:none"], rows
for r in rows:
    assert r["check"] == "ok" and int(r["iters"]) == 5 and int(r["warmup"]) == 3, r
PY
# --size-scale and --time-scale shrink the model consistently (threshold too).
bench 2 --profile "$TINY" --iters 3 --warmup 6 --size-scale 0.5 --time-scale 0.5 \
    --schedule dear --fusion threshold --threshold 100k --csv "$TMPD/s.csv"
[ $rc -eq 0 ] || { cat "$TMPD/out" >&2; fail "scaled run: exit status $rc"; }
python3 - "$TMPD/s.csv" <<'PY' || fail "scaled run: CSV check"
import csv, sys
(r,) = list(csv.DictReader(open(sys.argv[1])))
assert r["config"] == "dear:threshold:100k" and r["check"] == "ok", r
assert int(r["threshold_bytes"]) == 51200 and abs(float(r["compute_ms"]) - 1.55) < 1e-6, r
# half of 10000+100+40000+30000+1001+22500 floats, each tensor rounded to whole floats (500.5 -> 501)
assert int(r["grad_bytes"]) == 4 * (5000 + 50 + 20000 + 15000 + 501 + 11250), r["grad_bytes"]
PY
# Partitioned tensors (+part=SIZE): the runtime cuts the registered tensors where dear-plan cuts
# the profile, so under the same cost model (--alpha/--beta) dear-bench's prediction of the plan
# the runtime ran is dear-plan's, unit for unit, plus at most the measured updates; wfbp keeps
# every tensor whole unless told. Two rounds: each round's plan is predicted, and fixed plans are
# the same in both, so none is listed as having run different plans.
PLANX=$top_builddir/apps/tools/dear-plan
PCONF="wfbp:threshold:64m;dear:threshold:100k+part=20k;dear:none+part=20k;wfbp:threshold:100k+part=50k"
bench 2 --profile "$TINY" --iters 4 --rounds 2 --warmup 3 --alpha 1e-4 --beta 1e-9 --configs "$PCONF" \
    --csv "$TMPD/p.csv"
[ $rc -eq 0 ] || { cat "$TMPD/out" >&2; fail "partitioned run: exit status $rc"; }
if grep -q "ran different plans" "$TMPD/out"; then
    cat "$TMPD/out" >&2
    fail "partitioned run: a fixed plan reported as different between rounds"
fi
python3 - "$TMPD/p.csv" "$PLANX" "$TINY" <<'PY' || fail "partitioned run: CSV check against dear-plan"
import csv, subprocess, sys
rows = {r["config"]: r for r in csv.DictReader(open(sys.argv[1]))}
want = {  # config: dear-plan arguments, partition bytes
    "wfbp:threshold:64m": (["wfbp", "threshold", "67108864"], 0),
    "dear:threshold:100k+part=20k": (["dear", "threshold", "102400"], 20480),
    "dear:none+part=20k": (["dear", "none", "102400"], 20480),
    "wfbp:threshold:100k+part=50k": (["wfbp", "threshold", "102400"], 51200),
}
for config, ((sched, planner, thr), part) in want.items():
    r = rows[config]
    assert r["check"] == "ok" and int(r["partition_bytes"]) == part, r
    out = subprocess.run([sys.argv[2], "--profile", sys.argv[3], "--alpha", "1e-4", "--beta", "1e-9",
                          "--workers", "2", "--schedule", sched, "--planner", planner, "--threshold", thr,
                          "--partition", str(part), "--csv"], capture_output=True, text=True, check=True).stdout
    (p,) = [x for x in csv.DictReader(out.splitlines()) if x["schedule"] == sched]
    assert int(r["units"]) == int(p["units"]), (config, r["units"], p["units"])
    # dear-plan's profile has no updates; dear-bench adds the measured ones to the forward
    # compute and the last rank's lateness to the backward, which delays the iteration by at
    # least nothing and at most all of them.
    pred, upd, plan, late = float(r["pred_ms"]), float(r["update_typ_ms"]), float(p["iter_ms"]), float(r["late_ms"])
    assert plan - 1e-3 <= pred <= plan + upd + late + 1e-3, (config, pred, upd, late, plan)
    assert (int(r["units"]) > 6) == (part > 0), (config, r["units"])
PY
# --jitter-ms: up to 20 ms of noise per iteration and rank, counted as compute: the measured
# compute (slowest rank's) grows by about the jitter's maximum over the ranks, never beyond 20 ms
# plus scheduling slack; the parameters still check, and the same seed gives the same jitter to
# every configuration.
bench 2 --profile "$TINY" --iters 12 --warmup 3 --jitter-ms 20 --jitter-seed 7 \
    --configs "dear:threshold:100k;wfbp:none" --csv "$TMPD/j.csv"
[ $rc -eq 0 ] || { cat "$TMPD/out" >&2; fail "jitter run: exit status $rc"; }
grep -q "injected jitter: up to 20 ms per iteration and rank, uniform, seed 7" "$TMPD/out" || fail "jitter line"
python3 - "$TMPD/j.csv" <<'PY' || fail "jitter run: CSV check"
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    comp, nominal = float(r["compute_meas_ms"]), float(r["compute_ms"])
    assert r["check"] == "ok", r
    # the median of max(U1, U2) * 20 ms is 14.1 ms; 12 samples put it well inside (5, 20 + slack)
    assert nominal + 5 < comp < nominal + 30, r
    # The jitter delays one rank's backward pass behind the other's by |U1 - U2| * 20 ms, whose
    # half (the last rank behind the median of two) has a median of 2.9 ms. wfbp starts every
    # iteration together (its backward_end waits for the all-reduces), so that is the lateness.
    if r["config"] == "wfbp:none":
        assert 1 < float(r["late_ms"]) < 12, r
PY
# The first plan (DEAR_FIRST_PLAN) with hints from a model description (layer 2, without tensors,
# hinted to the layer before it): held all run it is the estimate's; the time to train the
# first 4 iterations and the 8 of a run, from dear_init; parameters check under each start.
# DEAR_FIRST_MIN_GAIN=0: the estimate's plan runs whatever its predicted gain on this tiny model.
printf 'dear-model 1\nlayer 0 4\nlayer 1 6\nlayer 2 2\nlayer 3 6\nlayer 4 4\ntensor l0.weight 0 40000\nend 5 1\n' \
    >"$TMPD/tiny.model"
FCONF="dear:auto+first=threshold;dear:auto+first=range+hold;dear:auto+first=first+hold+nohints"
DEAR_LOG_LEVEL=info DEAR_FIRST_MIN_GAIN=0 bench 2 --profile "$TINY" --hints "$TMPD/tiny.model" --iters 8 --warmup 0 --first-n 4 \
    --configs "$FCONF" --csv "$TMPD/f.csv"
[ $rc -eq 0 ] || { cat "$TMPD/out" >&2; fail "first plan run: exit status $rc"; }
grep -q "first plan, from the model's structure (4 of 4 layer(s) with a compute hint" "$TMPD/out" ||
    { cat "$TMPD/out" >&2; fail "first plan run: the hints did not reach the runtime"; }
python3 - "$TMPD/f.csv" "$FCONF" <<'PY' || fail "first plan run: CSV check"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [r["config"] for r in rows] == sys.argv[2].split(";"), rows
for r in rows:
    assert r["check"] == "ok" and int(r["run_iters"]) == 8 and int(r["first_n"]) == 4, r
    assert 0 < float(r["startup_s"]) < float(r["first_n_s"]) < float(r["run_s"]), r
assert rows[1]["plan"].startswith("est:") and rows[2]["plan"].startswith("est:dp"), rows
assert rows[1]["first_plan"] == "range" and rows[2]["first_plan"] == "first", rows
PY
# A sparse embedding (1000 rows of 16 floats, 5% of them per rank): the replay draws a new set
# of Zipf rows each iteration on each rank, the check recomputes the same draws in float64, and
# '+sparse' configurations make the runtime send the rows sparse; the dense configuration is the
# speedup reference. Sharded (+sparse+shard), only the sparse tensor's reduce-scatter travels
# sparse (its all-gather carries parameters), and it still checks.
{ sed '/^end /d' "$TINY"; echo "tensor emb 4 64000"; echo "sparse emb 64 0.05 0.2"; echo "end 5 7"; } \
    >"$TMPD/sparse.prof"
SCONF="wfbp:threshold:64m;wfbp:threshold:64m+sparse;dear:threshold:100k+sparse;dear:auto+sparse;dear:auto+sparse+shard"
for np in 2 3; do
    DEAR_LOG_LEVEL=info bench "$np" --profile "$TMPD/sparse.prof" --iters 4 --configs "$SCONF" --csv "$TMPD/sp$np.csv"
    [ $rc -eq 0 ] || { cat "$TMPD/out" >&2; fail "sparse np $np: exit status $rc"; continue; }
    grep -q "^sparse emb: 1000 rows of 16; [0-9]* Zipf(1) draws per rank and iteration: expected 5\.0[0-9]% of" \
        "$TMPD/out" || { cat "$TMPD/out" >&2; fail "sparse np $np: the replay is not at 5% per rank"; }
    grep -q "tensor 'emb' (block 16).*reduce-scatter sparse" "$TMPD/out" ||
        { cat "$TMPD/out" >&2; fail "sparse np $np: the runtime did not send emb sparse"; }
    grep -q "with sharded updates (DEAR_SHARD, dear_set_shard): tensors declared sparse send only their" \
        "$TMPD/out" && grep -q "tensor 'emb' (block 16).*reduce-scatter sparse, all-gather dense" "$TMPD/out" ||
        { cat "$TMPD/out" >&2; fail "sparse np $np: sharded, emb's phases are not sparse, then dense"; }
    python3 - "$TMPD/sp$np.csv" "$SCONF" <<'PY' || fail "sparse np $np: CSV check"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [r["config"] for r in rows] == sys.argv[2].split(";"), rows
assert all(r["check"] == "ok" for r in rows), rows
assert abs(float(rows[0]["speedup_wfbp64"]) - 1) < 1e-9, rows[0]
assert int(rows[0]["grad_bytes"]) == 414404 + 64000, rows[0]
PY
done
bench 2 --profile "$TMPD/sparse.prof" --iters 2 --warmup 1 --tokens 10 --zipf 0.5 --configs "dear:threshold+sparse"
[ $rc -eq 0 ] && grep -q "^sparse emb: 1000 rows of 16; 10 Zipf(0.5) draws" "$TMPD/out" ||
    { cat "$TMPD/out" >&2; fail "--tokens 10 --zipf 0.5"; }
# --calib-load: the model's compute replayed beside dear_commit while dp calibrates into a fresh
# cache; the replay ran (at least one iteration), stopped, and the run still checks.
DEAR_CALIBRATION_FILE="$TMPD/load.cal" bench 2 --profile "$TINY" --iters 2 --warmup 1 --calib-load \
    --configs "dear:dp"
[ $rc -eq 0 ] && grep -q "^--calib-load: dear_commit took [0-9.]* s beside [1-9][0-9]* replayed iteration(s)" \
    "$TMPD/out" && grep -q "^2 2 rs auto " "$TMPD/load.cal" || { cat "$TMPD/out" >&2; fail "--calib-load"; }
[ $fails -eq 0 ]
