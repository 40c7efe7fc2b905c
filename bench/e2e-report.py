#!/usr/bin/env python3
"""e2e-report.py: helpers of bench/e2e-matrix.sh, standard library only.

  scale   print "SIZE_SCALE TIME_SCALE" for a profile so that one iteration's communication
          (reduce-scatter + all-gather of every gradient at the link rate, each host sending
          (H-1)/H of the bytes per phase over its link, H = --hosts, default --np) takes about
          --comm-ms and compute is --ratio times that.
  report  read bench/results/e2e-*.csv (dear-bench --csv), write bench/results/e2e.md (tables,
          the end-to-end targets, lower bounds) and SVG plots: iteration time per
          configuration for each case, and a Gantt chart of one iteration from the runtime's
          timeline when the run drew one (e2e-gantt-CASE.svg, by the gantt command).
  gantt   draw that chart from rank 0's timeline (DEAR_TIMELINE, Chrome trace JSON).
  tails   how much longer a timeline's collectives ran than their sizes' medians, which the
          calibration prices: the sum of their durations over as many medians, by the compute
          phase they ran in (what stalls add in training).
  check   judge one configuration's prediction in a dear-bench CSV: prints its measured and
          predicted iteration and the error; exit 0 within --max-err percent, 1 off by more,
          3 when the machine stalled the run (then the error says little: run it again).

Lower bound (as dear-bench's, apps/bench/predict.c): compute runs on one thread, updates
included, and a layer's gradients exist only when its backward ends and are needed all-gathered
when its forward begins. So for each layer k the bytes of layers 0..k cross the link between the
end of k's backward and the start of its next forward, while the forward and backward of layers
k..L-1 fill the rest of the iteration: the bound is max(compute + updates, max over k of
compute(k..L-1) + link time of layers 0..k). k = 0 is the first layer's tail; the last k is all
the bytes. At the link rate each host must send (H-1)/H of the gradient bytes per phase over its
own link (H hosts), which no algorithm can beat; the rate is the measured one-way TCP rate of
bench/results/p2p-*.csv when present, else 95% of the nominal rate (TCP payload per frame).
"""
import argparse
import bisect
import html
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from docsection import markers, meta_block, read_csvs, replace_section  # noqa: E402
from docsection import parse_rate as docsection_parse_rate  # noqa: E402

PROFILES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fusion", "profiles")
ORDER = ["sync", "wfbp:threshold:64m", "wfbp:threshold:25m", "wfbp:mgwfbp", "dear:threshold:25m",
         "dear:gradssa", "dear:auto", "dear:auto+shard", "wfbp:threshold:64m+sparse", "dear:auto+sparse",
         "dear:auto+sparse+shard"]
DENSE = ORDER[:8]   # every case runs these (CSVs before dear:auto+shard joined lack it); a sparse case also
                    # the '+sparse' ones (CSVs before dear:auto+sparse+shard joined lack it)
SHARDED = "dear:auto+shard"
SHARDED_SPARSE = "dear:auto+sparse+shard"  # a sparse case's: sparse reduce-scatters, dense all-gathers
NOISE = 0.03  # run-to-run noise allowance for "never slower" (see the report for the measured spread)
PRED_LIMIT = 10  # percent: the prediction target of every configuration, and check's default limit


def parse_rate(text):
    """docsection.parse_rate, a bad rate ending the report with its message."""
    try:
        return docsection_parse_rate(text)
    except ValueError as e:
        sys.exit("e2e-report.py: %s" % e)


def load_profile(path, sparse=None):
    """Layers and tensors of a profile; with a dict as sparse, also its `sparse` records there
    (name -> (block bytes, RS density, AG density))."""
    layers, tensors = [], []
    with open(path) as f:
        for line in f:
            w = line.split("#")[0].split()
            if not w:
                continue
            if w[0] == "layer":
                layers.append((int(w[1]), float(w[2]), float(w[3])))
            elif w[0] == "tensor":
                tensors.append((w[1], int(w[2]), int(w[3])))
            elif w[0] == "sparse" and sparse is not None:
                sparse[w[1]] = (int(w[2]), float(w[3]), float(w[4]))
    return layers, tensors


def zipf_share(rows, draws, s=1.0):
    """Expected share of `rows` touched by `draws` Zipf(s) draws (dear-bench's expected_share)."""
    w = [(k + 1) ** -s for k in range(rows)]
    total = sum(w)
    return sum(1.0 if x >= total else -math.expm1(draws * math.log1p(-x / total)) for x in w) / rows


def replay_densities(rows, density_rs, nranks):
    """The densities dear-bench replays a sparse tensor of `rows` rows at (without --tokens): the
    fewest draws per rank whose expected share reaches density_rs, and the share of all ranks'
    draws together (the all-gather's union)."""
    lo, hi = 1, 64 * rows
    if zipf_share(rows, hi) < density_rs:
        lo = hi
    while lo < hi:
        mid = (lo + hi) // 2
        if zipf_share(rows, mid) >= density_rs:
            hi = mid
        else:
            lo = mid + 1
    return zipf_share(rows, lo), zipf_share(rows, lo * nranks)


def replayed_sparse(record, full, sscale, nranks):
    """A sparse tensor as dear-bench replays it: its bytes (whole rows at the size scale) and the
    reduce-scatter's and all-gather's densities (replay_densities), from its profile record
    (block bytes, RS density, AG density) and full size."""
    block, drs, _ = record
    rows = max(1, math.floor(full // block * sscale + 0.5))
    return (rows * block,) + replay_densities(rows, drs, nranks)


def scaled_bytes(tensors, sscale):
    """As dear-bench rounds: whole float32 elements, at least one."""
    return [(name, layer, 4 * max(1, math.floor(b / 4 * sscale + 0.5))) for name, layer, b in tensors]


def cmd_scale(a):
    layers, tensors = load_profile(a.profile)
    comp = sum(f + b for _, f, b in layers)
    total = sum(b for _, _, b in tensors)
    rate = parse_rate(a.rate) * 0.95
    # Per host link, as the lower bound counts it: with several ranks per host the two-level
    # collective sends only (H-1)/H, so "balanced" must be judged on the hosts, not the ranks.
    hosts = a.hosts or a.np
    est_full = 2 * (hosts - 1) / hosts * total / rate
    sscale = min(1.0, a.comm_ms / 1e3 / est_full)
    est = est_full * sscale
    tscale = a.ratio * est / comp
    print("%.6g %.6g" % (sscale, tscale))


def measured_rate(results, rate_text):
    for name, rows in read_csvs(os.path.join(results, "p2p-*%s.csv" % rate_text)):
        for r in rows:
            if r.get("mode") == "oneway":
                return float(r["MBps"]) * 1e6, "measured one-way TCP rate %.1f MB/s (%s)" % (float(r["MBps"]), name)
    r = parse_rate(rate_text) * 0.95
    return r, "95%% of the nominal %s = %.1f MB/s" % (rate_text, r / 1e6)


def sharded(config):
    """Whether a configuration steps its optimizer sharded (dear-bench's `+shard`)."""
    return "+shard" in config


def least_updates(rows):
    """The least update time (ms) any schedule of a case needs per iteration, as dear-bench's
    bound counts it: a sharded configuration's own, an unsharded one's over P; 0 when the CSV
    predates update_ms."""
    v = [float(r["update_ms"]) / (1 if sharded(r["config"]) else int(r["np"]))
         for r in rows if r.get("update_ms") and r["check"] == "ok"]
    return min(v) if v else 0.0


def link_bound(row, hosts, rate, parts=False, sparse=False, upd_ms=0.0, f_rs=1.0, f_ag=1.0):
    """The lower bound at the link rate, in ms, for one CSV row (as dear-bench's): the compute
    with upd_ms of updates (least_updates), or for some layer k the compute of layers k..L-1 plus
    the link time of layers 0..k, whose gradients exist only once backward has passed k and are
    needed all-gathered when the next forward reaches k. With parts, also how far the bound lies
    above compute (ms), and the layers 0..k of the cut that sets it (their count and share of the
    gradient bytes). With sparse, the profile's sparse tensors count by the bytes their non-zero
    rows and 4-byte indices put on the wire in each phase, at the densities dear-bench replays
    (never more than dense), instead of their whole size. f_rs, f_ag scale each phase's wire
    bytes (compression)."""
    prof = os.path.join(PROFILES_DIR, row["model"] + ".prof")
    if not os.path.exists(prof):
        return (float("nan"),) * 4 if parts else float("nan")
    records = {}
    layers, tensors = load_profile(prof, records)
    sscale = float(row["size_scale"])
    tb = scaled_bytes(tensors, sscale)
    pos = {lid: k for k, (lid, _, _) in enumerate(layers)}
    link = [0.0] * len(layers)   # per layer, seconds on the link (both phases)
    per_phase = lambda s: (hosts - 1) / hosts * s / rate
    for (name, layer, b), (_, _, full) in zip(tb, tensors):
        rs = ag = b
        if sparse and name in records:
            block = records[name][0]
            b, d_rs, d_ag = replayed_sparse(records[name], full, sscale, int(row["np"]))
            rs, ag = min(b, d_rs * b * (1 + 4 / block)), min(b, d_ag * b * (1 + 4 / block))
        link[pos[layer]] += per_phase(rs * f_rs) + per_phase(ag * f_ag)
    # The CSV's compute, spread over the layers as the profile spreads it (time_scale times the
    # profile's, as dear-bench replays it).
    comp = float(row["compute_ms"]) / 1e3
    prof_comp = sum(f + b for _, f, b in layers) or 1.0
    fb = [comp * (f + b) / prof_comp for _, f, b in layers]
    bound, cut, after, sent = comp + upd_ms / 1e3, -1, comp, 0.0
    for k in range(len(layers)):
        sent += link[k]
        if after + sent > bound:
            bound, cut = after + sent, k
        after -= fb[k]
    if not parts:
        return 1e3 * bound
    total = sum(b for _, _, b in tb)
    share = sum(b for _, l, b in tb if pos[l] <= cut) / total if cut >= 0 else 0.0
    return 1e3 * bound, 1e3 * (bound - comp), cut + 1, share


def floor_ms(row, hosts, rate, dear_plan, sparse=False, startup_s=0.0):
    """dear's best schedule on ideal collectives, in ms, and the bound likewise, for one CSV row:
    auto's plan for the row's profile at dear-bench's scales (compute spread as link_bound spreads
    it, the CSV's partition), predicted by dear-plan with no start-ups and each phase moving
    (H-1)/H of its bytes at the link rate, as the bound counts them; updates left out of both.
    With sparse, the profile's sparse tensors keep their `sparse` records at the densities
    dear-bench replays (their rows as it scales them), which dear-plan prices at the wire bytes
    the sparse bound counts. Their ratio is what dear's schedule and planners leave to the bound
    on perfect collectives (their order, which groups gather early, the candidates auto weighs):
    no start-up or link to fix can win it. startup_s prices each reduce-scatter and all-gather
    that much more (the startups command). (NaN, NaN) without dear-plan or the profile, or when
    dear-plan fails."""
    prof = os.path.join(PROFILES_DIR, row["model"] + ".prof")
    if not dear_plan or not os.path.exists(prof):
        return float("nan"), float("nan")
    records = {}
    layers, tensors = load_profile(prof, records)
    sscale = float(row["size_scale"])
    comp = float(row["compute_ms"]) / 1e3
    f = comp / (sum(a + b for _, a, b in layers) or 1.0)
    part = row.get("partition_bytes") or str(int(16 * 2**20 * sscale))
    with tempfile.NamedTemporaryFile("w", suffix=".prof", delete=False) as out:
        out.write("dear-profile 1\nmodel %s\n" % row["model"])
        out.writelines("layer %d %.9g %.9g\n" % (lid, a * f, b * f) for lid, a, b in layers)
        for (name, layer, b), (_, _, full) in zip(scaled_bytes(tensors, sscale), tensors):
            if not (sparse and name in records):
                out.write("tensor %s %d %d\n" % (name, layer, b))
                continue
            b, d_rs, d_ag = replayed_sparse(records[name], full, sscale, int(row["np"]))
            out.write("tensor %s %d %d\nsparse %s %d %.9g %.9g\n" % (name, layer, b, name, records[name][0],
                                                                      d_rs, d_ag))
        out.write("end %d %d\n" % (len(layers), len(tensors)))
    try:
        run = subprocess.run([dear_plan, "--profile", out.name, "--alpha", "%.9g" % (2 * startup_s), "--beta",
                              "%.9g" % (2 * (hosts - 1) / hosts / rate), "--workers", row["np"],
                              "--schedule", "dear", "--planner", "auto", "--partition", part, "--csv"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return float("nan"), float("nan")
    finally:
        os.unlink(out.name)
    lines = run.stdout.splitlines()
    if run.returncode != 0 or len(lines) < 2:
        return float("nan"), float("nan")
    best = dict(zip(lines[0].split(","), lines[1].split(",")))
    return float(best["iter_ms"]), link_bound(row, hosts, rate, sparse=sparse)


def product(by):
    """The configuration a case is about: dear+auto, with sparse communication where it ran."""
    return "dear:auto+sparse" if "dear:auto+sparse" in by else "dear:auto"


def same_updates(a, b):
    """Whether two configurations step their optimizer alike (both sharded or both not): "never
    slower" compares only those, since sharding is the trainer's choice (it must step slices), not
    the planner's, and it saves (P-1)/P of the update that no schedule can."""
    return sharded(a) == sharded(b)


def own_bound(row, hosts, rate, sparse=False):
    """The lower bound with the update time this configuration spends itself instead of the least
    any schedule needs: unsharded, the whole model's step on every rank, the median rank's
    (update_typ_ms; the sum of each layer's slowest rank, update_ms, stands above any one rank's);
    sharded, the slowest rank's slices (update_ms), as *pred* counts them. NaN in CSVs without
    them. What the schedule alone can still win is its time over this."""
    col = "update_ms" if sharded(row["config"]) or not row.get("update_typ_ms") else "update_typ_ms"
    if not row.get(col):
        return float("nan")
    return link_bound(row, hosts, rate, sparse=sparse, upd_ms=float(row[col]))


def quart(row, key):
    """A quartile column in ms; NaN in CSVs written before dear-bench reported quartiles."""
    try:
        return float(row.get(key) or "nan")
    except ValueError:
        return float("nan")


def plan_text(r):
    """What the runtime ran: planner and buckets/groups/early groups (CSVs before dear-bench read
    the plan back have none)."""
    if not r.get("plan") or r["plan"] == "-":
        return "-"
    if r["schedule"] != "dear":
        return "%s %s" % (r["plan"], r["rs_buckets"])
    return "%s %s/%s/%s" % (r["plan"], r["rs_buckets"], r["ag_groups"], r["ag_early"])


def fnum(x, fmt="%.1f"):
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt % x


def iter_ms(r):
    """A configuration's iteration time: the period (the ranks' mean iteration, median over the
    iterations), which the simulator predicts and which is the training's pace; CSVs from before
    dear-bench measured it have only the slowest rank's (iter_ms), which jitter between the ranks
    leaves above the period."""
    p = r.get("period_ms")
    return float(p) if p not in (None, "", "nan") else float(r["iter_ms"])


def bar_svg(case, rows, bound, path):
    """Horizontal bars: measured iteration time per configuration (compute part darker), the
    simulator's prediction as a tick, the lower bound as a dashed line."""
    w, left, top, bh = 760, 170, 40, 22
    h = top + bh * len(rows) + 62
    vals = [iter_ms(r) for r in rows if r["check"] == "ok"] + [float(r["pred_ms"]) for r in rows
                                                                         if r["pred_ms"] not in ("nan", "")]
    vmax = max(vals + [bound if math.isfinite(bound) else 0]) * 1.1 or 1
    x = lambda v: left + (w - left - 20) * v / vmax
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="12">' % (w, h),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="10" y="20" font-size="14">%s: iteration time per configuration (ms)</text>' % html.escape(case)]
    for i, r in enumerate(rows):
        y = top + i * bh
        out.append('<text x="%d" y="%d" text-anchor="end">%s</text>' % (left - 6, y + 15, html.escape(r["config"])))
        if r["check"] == "ok":
            it = iter_ms(r)
            comp = min(float(r["compute_meas_ms"]), it)
            color = "#d62728" if r["schedule"] == "dear" else "#1f77b4" if r["schedule"] == "wfbp" else "#7f7f7f"
            out.append('<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s" opacity="0.45"/>'
                       % (left, y + 3, x(it) - left, bh - 6, color))
            out.append('<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>'
                       % (left, y + 3, x(comp) - left, bh - 6, color))
            out.append('<text x="%.1f" y="%d">%.1f</text>' % (x(it) + 4, y + 15, it))
        else:
            out.append('<text x="%d" y="%d" fill="#d62728">%s</text>' % (left + 4, y + 15, html.escape(r["check"])))
        if r["pred_ms"] not in ("nan", ""):
            px = x(float(r["pred_ms"]))
            out.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="black" stroke-width="2"/>'
                       % (px, px, y + 1, y + bh - 1))
    if math.isfinite(bound):
        bx = x(bound)
        out.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="green" stroke-dasharray="4,3"/>'
                   % (bx, bx, top - 4, top + bh * len(rows)))
    yl = top + bh * len(rows) + 25
    out.append('<text x="10" y="%d">dark: emulated compute; light: rest of the iteration (exposed '
               'communication);</text>' % yl)
    out.append('<text x="10" y="%d">black tick: simulator\'s prediction; green dashes: lower bound</text>' % (yl + 15))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def timeline_spans(tl_path):
    """The complete events (spans) of a DEAR_TIMELINE file, Chrome trace JSON in either form."""
    with open(tl_path) as f:
        d = json.load(f)
    return [e for e in (d["traceEvents"] if isinstance(d, dict) else d) if e.get("ph") == "X"]


def tails(tl_path, from_iter=0, min_bytes=1 << 20):
    """How much longer a timeline's collectives took than their typical run: for each kind and
    size of more than min_bytes (above DEAR_INFLIGHT_BYTES's default each runs alone, so its
    duration is its own) with five or more runs from iteration from_iter on, their durations'
    sum over as many times that size's median, summed by the compute phase the middle of each
    falls in (forward, backward, or none: between compute spans). The calibration prices the
    median collective; a ratio above 1 is what stalls add to it in training. Returns a list of
    (phase, runs, ratio), phases in that order, then ("all", runs, ratio)."""
    ev = timeline_spans(tl_path)
    comp = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"].split()[0]) for e in ev
                  if e.get("cat") == "compute" and e["name"].startswith(("forward", "backward")))
    starts = [c[0] for c in comp]

    def phase(t):
        i = bisect.bisect_right(starts, t) - 1
        return ("forward" if comp[i][2].startswith("forward") else "backward") \
            if i >= 0 and comp[i][1] >= t else "none"
    ops = [e for e in ev if e.get("cat") == "comm" and e.get("args", {}).get("bytes", 0) > min_bytes and
           e["args"].get("iteration", -1) >= from_iter]
    runs = {}
    for e in ops:
        runs.setdefault((e["name"].split()[0], e["args"]["bytes"]), []).append(e)
    acc = {}
    for group in runs.values():
        if len(group) < 5:
            continue
        med = statistics.median(e["dur"] for e in group)
        for e in group:
            a = acc.setdefault(phase(e["ts"] + e["dur"] / 2), [0, 0.0, 0.0])
            a[0] += 1
            a[1] += e["dur"]
            a[2] += med
    out = [(p, acc[p][0], acc[p][1] / acc[p][2]) for p in ("forward", "backward", "none") if p in acc and acc[p][2]]
    n, dur, med = (sum(acc[p][i] for p in acc) for i in range(3))
    return out + [("all", n, dur / med if med else float("nan"))]


def gantt_svg(case, tl_path, path):
    """One steady-state iteration of rank 0 from its timeline: compute, waits, communication."""
    ev = timeline_spans(tl_path)
    comp = sorted((e for e in ev if e.get("cat") == "compute"), key=lambda e: e["ts"])
    if not comp:
        return False
    first = comp[0]["name"]
    starts = [e["ts"] for e in comp if e["name"] == first]
    if len(starts) < 3:
        return False
    t0, t1 = starts[-2], starts[-1]  # the last complete iteration
    lanes = [("compute", "compute"), ("wait", "app blocked"), ("comm", "communication")]
    w, left, top, lh = 900, 110, 40, 28
    scale = (w - left - 20) / (t1 - t0)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="12">' % (w, top + lh * 3 + 40),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="10" y="20" font-size="14">%s, dear+auto, rank 0: one iteration, %.1f ms (timeline)</text>'
           % (html.escape(case), (t1 - t0) / 1e3)]
    for i, (cat, label) in enumerate(lanes):
        y = top + i * lh
        out.append('<text x="%d" y="%d" text-anchor="end">%s</text>' % (left - 6, y + 17, label))
        for e in ev:
            if e.get("cat") != cat:
                continue
            a, b = max(e["ts"], t0), min(e["ts"] + e.get("dur", 0), t1)
            if b <= a:
                continue
            n = e["name"]
            color = ("#2ca02c" if n.startswith("backward") else "#1f77b4") if cat == "compute" else \
                "#d62728" if cat == "wait" else ("#ff7f0e" if n.startswith("reduce") else
                                                 "#9467bd" if n.startswith("all-gather") else "#8c564b")
            out.append('<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s" stroke="white" '
                       'stroke-width="0.3"><title>%s %.2f ms</title></rect>'
                       % (left + (a - t0) * scale, y + 4, max(0.5, (b - a) * scale), lh - 8, color,
                          html.escape(n), (b - a) / 1e3))
    out.append('<text x="10" y="%d">blue forward, green backward, red blocked, orange reduce-scatter, '
               'purple all-gather, brown all-reduce</text>' % (top + lh * 3 + 25))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return True


def cmd_startups(a):
    """Per dense case of --results, dear:auto's best plan (dear-plan's auto, as the floor column
    plans it) over the lower bound, on collectives at the link rate with each start-up of
    --startup-us per reduce-scatter and all-gather: how far start-ups alone, as the planners work
    around them, keep the schedule from the bound. Returns the exit status."""
    rate, rate_note = measured_rate(a.results, a.rate)
    ups = [float(x) for x in a.startup_us.split(",")]
    print("dear-plan auto over the bound (%s), start-up per reduce-scatter and all-gather in us" % rate_note)
    print("| case | " + " | ".join("%g us" % u for u in ups) + " |")
    print("|---|" + "---|" * len(ups))
    n = 0
    for name, rows in read_csvs(os.path.join(a.results, "e2e-*.csv")):
        name = name[4:-4]
        row = [r for r in rows if r["config"] == "dear:auto"]
        m = re.search(r"-(\d+)x(\d+)$", name)
        if "sparse" in name or not row or not m:
            continue
        got = [floor_ms(row[0], int(m.group(1)), rate, a.dear_plan, startup_s=u * 1e-6) for u in ups]
        print("| %s | %s |" % (name, " | ".join("%.3f" % (f / b) for f, b in got)))
        n += 1
    if n == 0:
        print("e2e-report.py startups: no dense case with a dear:auto row in %s" % a.results, file=sys.stderr)
        return 1
    return 0


def cmd_report(a):
    res = a.results
    rate, rate_note = measured_rate(res, a.rate)
    cases = []
    for name, rows in read_csvs(os.path.join(res, "e2e-*.csv")):
        name = name[4:-4]
        if rows:
            rows.sort(key=lambda r: ORDER.index(r["config"]) if r["config"] in ORDER else len(ORDER))
            cases.append((name, rows))
    md = ["## End-to-end: dear-bench on the emulated cluster", "",
          "Generated by `bench/e2e-report.py` from `bench/results/e2e-*.csv`; command: `%s`." % a.command, ""]
    meta = meta_block(os.path.join(res, "e2e.meta"))
    md += meta
    md += ["Each case runs the configurations one after another in one job (dear-bench: compute emulated "
           "by sleeping for the profiled times, real float32 gradients through libdear, parameters checked "
           "against a float64 reference after every configuration). Times are medians over the measured "
           "iterations (of which statistic: below), *q1..q3* and *min..max* those of the slowest rank's "
           "iterations (the run-to-run noise); *exposed* = "
           "iteration - emulated compute; *pred* = the simulator (fusion/sim.c) on the plan the runtime "
           "ran (read back with dear_plan_save; *plan* gives its planner and, for dear, reduce-scatter "
           "buckets / all-gather groups / groups gathered early, during backward), with the cost model "
           "of column `cost_model` of the CSV: `runtime-fit` is the runtime's own calibration from the "
           "same runs (each size timed as a stream of back-to-back collectives, the model the online "
           "planner used), `bench-fit-mpi` a fallback fit of MPI's collectives; *bound* = the "
           "lower bound at %s. The machine has 2 shared cores: figures are noisy." % rate_note, ""]
    md += updates_note(cases) + period_note(cases)
    summary = []
    for name, rows in cases:
        m = re.search(r"-(\d+)x(\d+)$", name)
        hosts = int(m.group(1)) if m else int(rows[0]["np"])
        ok = [r for r in rows if r["check"] == "ok"]
        upd = least_updates(rows)
        bound, over, ncut, cut_share = link_bound(rows[0], hosts, rate, parts=True, upd_ms=upd)
        sparse_case = any(r["config"].endswith("+sparse") for r in rows)
        sbound, sover, sncut, scut_share = (link_bound(rows[0], hosts, rate, parts=True, sparse=True, upd_ms=upd)
                                            if sparse_case else (bound, over, ncut, cut_share))
        bound_of = lambda r: sbound if "+sparse" in r["config"] else bound
        md += ["### %s" % name, "",
               "%s, %s ranks on %d host(s); gradients %.2f MiB (size x %s), compute %.1f ms (time x %s)."
               % (rows[0]["model"], rows[0]["np"], hosts, int(rows[0]["grad_bytes"]) / 2**20, rows[0]["size_scale"],
                  float(rows[0]["compute_ms"]), rows[0]["time_scale"]), "",
               "| configuration | iter ms | q1..q3 | min..max | exposed ms | blocked ms | vs sync | vs wfbp+64M "
               "| pred ms | pred err | iter/bound | check | plan |",
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        ref = {c: iter_ms(r) for r in ok for c in ("sync", "wfbp:threshold:64m") if r["config"] == c}
        for r in rows:
            good = r["check"] == "ok"
            it = iter_ms(r) if good else float("nan")
            vs = [ref[c] / it if c in ref else float("nan") for c in ("sync", "wfbp:threshold:64m")]
            md.append("| %s | %s | %s..%s | %s..%s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["config"], fnum(it), fnum(quart(r, "iter_q1_ms")), fnum(quart(r, "iter_q3_ms")),
                fnum(float(r["iter_min_ms"])), fnum(float(r["iter_max_ms"])),
                fnum(it - float(r["compute_meas_ms"]) if good else None),
                fnum(float(r["blocked_ms"]) if good else None),
                fnum(vs[0], "%.2fx"), fnum(vs[1], "%.2fx"),
                fnum(float(r["pred_ms"])), fnum(float(r["pred_err_pct"]), "%+.1f%%"),
                fnum(it / bound_of(r), "%.2f"), r["check"], plan_text(r)))
        md += ["", "Lower bound: %.1f ms%s. ![iteration times](e2e-%s.svg)"
               % (bound, "; with the sparse embedding's expected wire bytes (for the `+sparse` configurations) "
                  "%.1f ms" % sbound if sparse_case else "", name)]
        floor_cfg = "dear:auto+sparse" if sparse_case else "dear:auto"  # the product, where it ran
        floor_row = [r for r in ok if r["config"] == floor_cfg]
        floor = (floor_ms(floor_row[0], hosts, rate, a.dear_plan, sparse=sparse_case) if floor_row
                 else (float("nan"),) * 2)
        if math.isfinite(floor[0]):
            md += ["", "Floor: %s's best plan on ideal collectives (no start-ups, the link's rate; dear-plan%s) "
                   "%.1f ms, %.3f x the bound without updates (%.1f ms)."
                   % (floor_cfg, ", the sparse tensors at their replayed densities" if sparse_case else "",
                      floor[0], floor[0] / floor[1], floor[1])]
        bar_svg(name, rows, sbound if sparse_case else bound, os.path.join(res, "e2e-%s.svg" % name))
        by = {r["config"]: r for r in ok}
        prod = product(by) if by else floor_cfg
        if os.path.exists(os.path.join(res, "e2e-gantt-%s.svg" % name)):
            md.append(" ![one iteration of %s, from the timeline](e2e-gantt-%s.svg)" % (prod, name))
        if os.path.exists(os.path.join(res, "e2e-pred-%s.svg" % name)):
            md.append(" ![%s as the simulator predicts it](e2e-pred-%s.svg)" % (prod, name))
        md.append("")
        # The end-to-end targets, judged on the product configuration (dear+auto, sparse where it ran).
        auto = by.get(prod)
        t = {"case": name, "rows": by, "product": prod, "bound_ms": sbound if sparse_case else bound,
             "over": sover if sparse_case else over, "cut": (sncut, scut_share) if sparse_case else (ncut, cut_share)}
        if auto:
            ta = iter_ms(auto)
            others = [(iter_ms(r), r["config"]) for r in ok if r["config"] != prod and same_updates(r["config"], prod)]
            best = min(others) if others else None
            # Slower beyond noise: more than NOISE, and auto's first quartile above the other's
            # third (the middle halves of the two samples do not overlap).
            within = best is not None and (ta <= best[0] * (1 + NOISE) or
                                           quart(auto, "iter_q1_ms") <= quart(by[best[1]], "iter_q3_ms"))
            t["never_slower"] = (best is None or within,
                                 "best other %s %.1f ms, auto %+.1f%%" % (best[1], best[0], 100 * (ta / best[0] - 1))
                                 if best else "no other configuration")
            t["best_other"] = best
            w64 = by.get("wfbp:threshold:64m")
            if "balanced" in name and w64:
                s = iter_ms(w64) / ta
                t["x1.3"] = (s >= 1.3, "%.2fx" % s)
            w64s = by.get("wfbp:threshold:64m+sparse")
            if sparse_case and w64s:
                s = iter_ms(w64s) / ta
                t["x_wfbp_sparse"] = (s > 1, "%.2fx" % s)
            t["bound"] = (ta / t["bound_ms"] <= 1.15, "%.2f x bound" % (ta / t["bound_ms"]))
            t["own_bound_ms"] = own_bound(auto, hosts, rate, sparse=sparse_case)
            if prod == floor_cfg and math.isfinite(floor[0]):
                t["floor"] = floor[0] / floor[1]
        if sparse_case and SHARDED_SPARSE in by:
            t["shard_bound"] = iter_ms(by[SHARDED_SPARSE]) / sbound
        elif SHARDED in by:
            t["shard_bound"] = iter_ms(by[SHARDED]) / bound
        errs = [(abs(float(r["pred_err_pct"])), r["config"]) for r in ok if r["pred_err_pct"] not in ("nan", "")]
        if errs:
            worst = max(errs)
            t["pred"] = (worst[0] <= PRED_LIMIT, "worst %.1f%% (%s)" % (worst[0], worst[1]))
            t["worst_pred"] = worst[1]
        spreads = [(quart(r, "iter_q3_ms") - quart(r, "iter_q1_ms")) / float(r["iter_ms"]) for r in ok]
        spreads = [s for s in spreads if math.isfinite(s)]
        t["spread"] = statistics.median(spreads) if spreads else float("nan")
        summary.append(t)
    if summary:
        md += ["### Targets", "",
               "Judged on dear+auto, with sparse communication in the sparse cases (`dear:auto+sparse`), "
               "and never slower than the configurations that step their optimizer alike: dear:auto+shard's "
               "sharded step is the trainer's choice, so it is judged against the bound only (summary table).", "",
               "| case | auto never slower (%.0f%% or quartiles overlap) | balanced: >= 1.3x wfbp+64M "
               "| sparse: faster than wfbp+64M+sparse | auto within 15%% of bound "
               "| prediction within %g%% | median (q3-q1)/median |" % (100 * NOISE, PRED_LIMIT),
               "|---|---|---|---|---|---|---|"]
        cell = lambda t, k: ("%s: %s" % ("met" if t[k][0] else "**missed**", t[k][1])) if k in t else "-"
        for t in summary:
            md.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                t["case"], cell(t, "never_slower"), cell(t, "x1.3"), cell(t, "x_wfbp_sparse"),
                cell(t, "bound"), cell(t, "pred"), fnum(100 * t["spread"], "%.0f%%")))
        md += [""] + disturbed(summary) + why_missed(summary) + [""]
        md += ["### Prediction per configuration", ""] + prediction_table(summary)
    with open(os.path.join(res, "e2e.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("e2e-report.py: wrote %s (%d case(s))" % (os.path.join(res, "e2e.md"), len(cases)))
    if a.doc:
        write_doc(a.doc, doc_section(a.command, meta, summary, a.section, a.title), a.section)
        print("e2e-report.py: updated %s" % a.doc)


def why_missed(summary):
    """One line per missed target, from the measurements: by how much, and what stands in the way."""
    out = ["Where a target is missed, from the figures above (the timelines and predicted Gantt charts "
           "show the same):", ""]
    for t in summary:
        by, b, over = t["rows"], t["bound_ms"], t["over"]
        auto = by.get(t["product"])
        if not auto:
            continue
        ta = iter_ms(auto)
        notes = []
        big_over = over > 0.05 * b
        why_over = ("%.1f ms of it beyond compute: the gradients of the first %d layer(s) (%.0f%% of the bytes) "
                    "must cross the link between the end of their backward and the start of their next forward"
                    % (over, t["cut"][0], 100 * t["cut"][1]))
        if "x1.3" in t and not t["x1.3"][0]:
            w64 = iter_ms(by["wfbp:threshold:64m"])
            notes.append("1.3x over wfbp+64M needs %.1f ms or less (auto %.1f ms); even the lower bound, %.1f ms, "
                         "would be %.2fx%s" % (w64 / 1.3, ta, b, w64 / b, ", " + why_over if big_over else ""))
        own = t.get("own_bound_ms", float("nan"))
        if "bound" in t and not t["bound"][0] and math.isfinite(own) and own > b:
            notes.append("auto at %.2f x the bound: %.1f ms of it is the update it steps whole on every rank, "
                         "where the bound counts the least any schedule needs (a sharded step); against the bound "
                         "with its own update, %.1f ms, auto runs %.2fx" % (ta / b, own - b, own, ta / own))
        elif "bound" in t and not t["bound"][0]:
            notes.append("auto at %.2f x the bound: %.1f ms exposed%s; the rest is collectives running below the "
                         "link rate (the calibration's stream rate is %s) and waits the plan could not hide"
                         % (ta / b, ta - float(auto["compute_meas_ms"]),
                            ", %.1f ms of it the bound's own beyond compute" % over if big_over else "",
                            "below the one-way TCP rate, and smaller buckets pay their start-up"))
        if "x_wfbp_sparse" in t and not t["x_wfbp_sparse"][0]:
            ws = by["wfbp:threshold:64m+sparse"]
            notes.append("wfbp+64M+sparse ran %.1f ms (%s), auto+sparse %.1f ms (%s): with the sparse embedding's "
                         "bytes gone, little communication is left for dear's schedule to hide beyond what wfbp "
                         "hides in backward" % (iter_ms(ws), plan_text(ws), ta, plan_text(auto)))
        if "never_slower" in t and not t["never_slower"][0] and t.get("best_other"):
            bo = by[t["best_other"][1]]
            pa, pb = float(auto["pred_ms"]), float(bo["pred_ms"])
            notes.append("auto ran %s, %.1f ms (predicted %s); %s ran %s, %.1f ms (predicted %s)%s"
                         % (plan_text(auto), ta, fnum(pa), bo["config"], plan_text(bo), iter_ms(bo),
                            fnum(pb), ": the simulator ranked them the other way and auto's measured check did not "
                            "overturn it" if pa < pb else ""))
        if "pred" in t and not t["pred"][0]:
            w = by[t["worst_pred"]]
            stalled = disturbance(w)
            notes.append("prediction off by %s for %s (%s): measured %.1f ms, predicted %s; %s"
                         % (fnum(float(w["pred_err_pct"]), "%+.1f%%"), w["config"], plan_text(w),
                            iter_ms(w), fnum(float(w["pred_ms"])),
                            ("the machine stalled this run (%s)" % ", ".join(stalled)) if stalled else
                            "the model leaves out what made it slower: collectives slower in training than "
                            "calibrated on idle cores, or waits for the last rank beyond its median lateness "
                            "(the Gantt charts above show which)"
                            if float(w["pred_err_pct"]) < 0 else
                            "it ran faster than its calibrated means (a burst allowance after idle gaps, or a "
                            "calibration stream a stall of the host slowed)"))
        if notes:
            out.append("- **%s**: %s." % (t["case"], "; ".join(notes)))
    if len(out) == 2:
        out.append("- none.")
    return out


def updates_note(cases):
    """Which cases' *pred* and *bound* count the optimizer's updates (CSVs with update_ms), and
    whose *pred* takes the median rank's (CSVs with update_typ_ms)."""
    with_upd = [name for name, rows in cases if rows and rows[0].get("update_ms")]
    if not with_upd:
        return []
    which = "every case" if len(with_upd) == len(cases) else "the cases " + ", ".join(with_upd)
    typ = [name for name, rows in cases if rows and rows[0].get("update_typ_ms")]
    # One statement of whose updates *pred* counts: where every such case has the median rank's,
    # say only that, since "the slowest rank's ... instead the median's" reads as a contradiction.
    if len(typ) == len(with_upd):
        whose, also = ("the median rank's, column `update_typ_ms` of the CSV; sharded configurations the "
                       "slowest rank's, column `update_ms`, and the last rank's lateness adds the rest"), ""
    else:
        whose = "the slowest rank's, column `update_ms` of the CSV"
        also = "" if not typ else (" In the cases %s, *pred* counts each layer's median rank instead (column "
                                   "`update_typ_ms`; sharded configurations keep the slowest): the last rank's "
                                   "lateness adds the rest." % ", ".join(typ))
    return ["In %s, *pred* counts each layer's measured update (dear-bench's SGD callback, %s) as forward "
            "compute, where the runtime runs it (before the layer's forward pass, on the application's "
            "thread), and *bound* the least update time any schedule needs (a sharded configuration's, or "
            "an unsharded one's over P)%s.%s"
            % (which, whose, "" if len(with_upd) == len(cases) else "; the other cases were measured before "
               "dear-bench timed its updates, and their predictions leave them out", also),
            ""]


def period_note(cases):
    """Which cases' times are the period and whose *pred* counts the last rank's lateness (CSVs
    with period_ms and late_ms)."""
    with_p = [name for name, rows in cases if rows and rows[0].get("period_ms")]
    if not with_p:
        return ["Times are the slowest rank's: each iteration's most over the ranks.", ""]
    which = "every case" if len(with_p) == len(cases) else "the cases " + ", ".join(with_p)
    return ["In %s, times are the **period**: each iteration's mean over the ranks (the pace of training, "
            "which the simulator predicts; the slowest rank's times, column `iter_ms` of the CSV, lie above "
            "it by the jitter between the ranks), and *pred* adds the last rank's lateness to the end of "
            "backward (column `late_ms`: how much after the median rank the last one ends its backward "
            "pass, median over the iterations), which every collective there waits for%s."
            % (which, "" if len(with_p) == len(cases) else "; the other cases were measured before "
               "dear-bench measured the period: their times are the slowest rank's, their predictions "
               "without the lateness"), ""]


def prediction_table(summary):
    """Every configuration's prediction against its measurement, case by case: the simulator's
    error per planner, beside whether the machine disturbed the run (then the error says less)."""
    out = ["Prediction per configuration: *pred* = the simulator on the plan that ran, *meas* = the median "
           "measured iteration, *err* = pred / meas - 1 (negative: predicted too fast).", "",
           "| case | configuration | plan | meas ms | pred ms | err | within %g%% | disturbed |" % PRED_LIMIT,
           "|---|---|---|---|---|---|---|---|"]
    for t in summary:
        for c, r in t["rows"].items():
            err = float(r["pred_err_pct"]) if r["pred_err_pct"] not in ("nan", "") else float("nan")
            out.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                t["case"], c, plan_text(r), fnum(iter_ms(r)), fnum(float(r["pred_ms"])),
                fnum(err, "%+.1f%%"), "-" if not math.isfinite(err) else "yes" if abs(err) <= PRED_LIMIT else "**no**",
                ", ".join(disturbance(r)) or "-"))
    return out + [""]


DISTURBED = 0.05  # measured emulated compute this far over its nominal time: the machine stalled the run
SPREAD = 0.10     # (q3 - q1) / median above this: the iterations of one configuration disagree


def disturbance(r):
    """Why the machine disturbed one configuration's run (empty: it did not): its sleeping compute
    overran, or its iterations spread too wide to stand for one number."""
    over = float(r["compute_meas_ms"]) / float(r["compute_ms"]) - 1
    spread = (quart(r, "iter_q3_ms") - quart(r, "iter_q1_ms")) / float(r["iter_ms"])
    why = []
    if over > DISTURBED:
        why.append("compute +%.0f%%" % (100 * over))
    if spread > SPREAD:
        why.append("spread %.0f%%" % (100 * spread))
    return why


def disturbed(summary):
    """The configurations the machine disturbed, as a paragraph of the report."""
    out = []
    for t in summary:
        for c, r in t["rows"].items():
            why = disturbance(r)
            if why:
                out.append("%s %s (%s)" % (t["case"], c, ", ".join(why)))
    if not out:
        return []
    return ["**Disturbed**: in these runs the emulated compute (a sleep) overran its nominal time by more than "
            "%.0f%%, or the middle half of the iterations spread over more than %.0f%% of the median: the "
            "machine itself stalled, and their figures say less about the schedule: %s. Rerun such a case "
            "with `bench/e2e-matrix.sh --cases NAME --keep-others`." % (100 * DISTURBED, 100 * SPREAD,
                                                                      "; ".join(out)), ""]


def doc_section(command, meta, summary, section="e2e", title=None):
    """The section of docs/PERFORMANCE.md: the headline numbers, the targets and every
    configuration's prediction error; the details stay in the results' e2e.md."""
    begin, end = markers(section, "bench/e2e-report.py")
    sub = "" if section == "e2e" else section + "/"
    L = [begin, "## %s" % (title or "End-to-end: dear-bench on the emulated cluster"), "",
         "Generated by `bench/e2e-report.py` (run by `%s`, as root from the build directory); do not edit "
         "this section by hand. Per-case tables, quartiles, the plans that ran, bar charts and Gantt charts: "
         "[bench/results/%se2e.md](../bench/results/%se2e.md)." % (command, sub, sub), ""]
    L += meta
    L += updates_note([(t["case"], list(t["rows"].values())) for t in summary])
    L += period_note([(t["case"], list(t["rows"].values())) for t in summary])
    any_sparse = any(t["product"] != "dear:auto" for t in summary)
    cols = ORDER if any_sparse else DENSE
    heads = ["sync", "wfbp+64M", "wfbp+25M", "wfbp+mgwfbp", "dear+25M", "dear+gradssa", "dear+auto",
             "dear+auto+shard", "wfbp+64M+sparse", "dear+auto+sparse", "dear+auto+sparse+shard"][:len(cols)]
    L += ["Median iteration time in ms (the period where measured, above), compute emulated by sleeping, "
          "real gradients through "
          "libdear; *x w64* = wfbp+64M / dear+auto (dear+auto+sparse in the sparse cases, which also run "
          "wfbp+64M with sparse communication); *bound* = the lower bound (for sparse communication, with "
          "the embedding's expected wire bytes), the most of: the compute with the least updates, and for "
          "each layer k the compute of layers k..L-1 plus the link time of layers 0..k (their gradients "
          "exist only once backward has passed k and must be all-gathered before the next forward reaches "
          "it); *own* = auto over that bound with the update time auto needs itself instead of the least (an "
          "unsharded step on every rank against a sharded one: what is left for a schedule to win); *floor* = "
          "dear:auto's best plan predicted on ideal collectives (no start-ups, every phase at the link's rate) "
          "over the bound, updates left out of both: the part of the gap that dear's schedule and planners "
          "leave, which no faster collective wins (in the sparse cases dear:auto+sparse's, the sparse tensors at the "
          "densities dear-bench replays, over the sparse bound; planned by the build that drew this "
          "report, whose planners may be newer than the runs'); *shard* = "
          "dear+auto+shard (sharded updates, a choice of the trainer) over the bound (in the sparse cases "
          "dear+auto+sparse+shard, whose reduce-scatters run sparse and all-gathers dense, over the sparse "
          "bound); *pred* = the simulator's "
          "error for the bold configuration. \"Never slower\" compares configurations that step alike (sharded "
          "or not).", "",
          "| case | %s | x w64 | auto/bound | own | floor | shard | pred |" % " | ".join(heads),
          "|---|%s---|---|---|---|---|---|" % ("---|" * len(cols))]
    for t in summary:
        by = t["rows"]
        cell = lambda c: fnum(iter_ms(by[c])) if c in by else "-"
        auto = by.get(t["product"])
        w64 = by.get("wfbp:threshold:64m")
        L.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            t["case"], " | ".join(("**%s**" if c == t["product"] else "%s") % cell(c) for c in cols),
            fnum(iter_ms(w64) / iter_ms(auto), "%.2fx") if auto and w64 else "-",
            fnum(iter_ms(auto) / t["bound_ms"], "%.2f") if auto else "-",
            fnum(iter_ms(auto) / t.get("own_bound_ms", float("nan")), "%.2f") if auto else "-",
            fnum(t.get("floor", float("nan")), "%.3f"),
            fnum(t.get("shard_bound", float("nan")), "%.2f"),
            fnum(float(auto["pred_err_pct"]), "%+.1f%%") if auto else "-"))
    L += ["", "Targets (never slower: within %.0f%% or the middle halves of the samples overlap, against the "
          "configurations that step alike):" % (100 * NOISE),
          "", "| case | auto never slower | balanced: >= 1.3x wfbp+64M | sparse: faster than wfbp+64M+sparse "
          "| auto within 15%% of bound | prediction within %g%% (all configurations) |" % PRED_LIMIT,
          "|---|---|---|---|---|---|"]
    cellt = lambda t, k: ("%s: %s" % ("met" if t[k][0] else "**missed**", t[k][1])) if k in t else "-"
    keys = ("never_slower", "x1.3", "x_wfbp_sparse", "bound", "pred")
    met = {k: [0, 0] for k in keys}
    for t in summary:
        L.append("| %s | %s |" % (t["case"], " | ".join(cellt(t, k) for k in keys)))
        for k in met:
            if k in t:
                met[k][0] += t[k][0]
                met[k][1] += 1
    L += ["", "Met: never slower %d of %d, 1.3x %d of %d, faster than wfbp+sparse %d of %d, bound %d of %d, "
          "prediction %d of %d." % tuple(v for k in keys for v in met[k]), ""]
    L += near_bound(summary)
    L += disturbed(summary) + why_missed(summary) + [""] + prediction_table(summary) + [end]
    return "\n".join(L) + "\n"


def near_bound(summary, limit=1.03):
    """How many cases run auto within limit x the bound, and those where dear's best plan on
    ideal collectives (the floor) already lies above it: there no collective can close the gap."""
    judged = [t for t in summary if t["product"] in t["rows"]]
    near = sum(iter_ms(t["rows"][t["product"]]) / t["bound_ms"] <= limit for t in judged)
    above = ["%s (%.3f)" % (t["case"], t["floor"]) for t in judged if t.get("floor", 0) > limit]
    floored = sum("floor" in t for t in judged)
    if not judged:
        return []
    return ["Within %.0f%% of the bound (auto/bound <= %.2f): %d of %d. The floor lies above %.2f in %d of the %d "
            "cases that have one%s" % (100 * (limit - 1), limit, near, len(judged), limit, len(above), floored,
                                        ": " + ", ".join(above) + "." if above else "."), ""]


def write_doc(path, text, section="e2e"):
    begin, end = markers(section, "bench/e2e-report.py")
    replace_section(path, text, begin, end)


def cmd_check(a):
    rows = [r for r in read_csvs(a.csv)[0][1] if r["config"] == a.config] if os.path.exists(a.csv) else []
    if not rows:
        sys.exit("e2e-report.py check: no row of configuration '%s' in %s" % (a.config, a.csv))
    r = rows[0]
    if r["check"] != "ok" or r["pred_err_pct"] in ("nan", ""):
        print("check: %s did not run right (%s) or has no prediction" % (a.config, r["check"]))
        return 1
    err, why = float(r["pred_err_pct"]), disturbance(r)
    print("check: %s (%s): measured %.1f ms (%sq1..q3 %s..%s), predicted %.1f ms, error %+.1f%% (limit %g%%)%s"
          % (a.config, plan_text(r), iter_ms(r), "the period; the slowest rank's " if r.get("period_ms") else "",
             fnum(quart(r, "iter_q1_ms")), fnum(quart(r, "iter_q3_ms")),
             float(r["pred_ms"]), err, a.max_err, "; the machine stalled: %s" % ", ".join(why) if why else ""))
    if why:
        return 3
    return 0 if abs(err) <= a.max_err else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("scale", help="size and time scales for one case")
    s.add_argument("--profile", required=True)
    s.add_argument("--rate", required=True)
    s.add_argument("--np", type=int, required=True)
    s.add_argument("--hosts", type=int, default=0, help="hosts the ranks span (default --np)")
    s.add_argument("--comm-ms", type=float, required=True)
    s.add_argument("--ratio", type=float, required=True, help="compute / communication")
    g = sub.add_parser("gantt", help="Gantt SVG of one iteration from a timeline JSON")
    g.add_argument("--case", required=True)
    g.add_argument("--timeline", required=True)
    g.add_argument("--svg", required=True)
    t = sub.add_parser("tails", help="collectives' durations in a timeline JSON over their sizes' medians")
    t.add_argument("--timeline", required=True, nargs="+")
    t.add_argument("--from-iter", type=int, default=0, help="skip the iterations before (warm-up, checks)")
    t.add_argument("--min-bytes", type=int, default=1 << 20,
                   help="only collectives of more bytes (default 1 MiB: above it each runs alone)")
    c = sub.add_parser("check", help="one configuration's prediction error against a limit")
    c.add_argument("--csv", required=True)
    c.add_argument("--config", default="dear:auto")
    c.add_argument("--max-err", type=float, default=PRED_LIMIT, help="percent (default %g)" % PRED_LIMIT)
    u = sub.add_parser("startups", help="dear:auto's best plan over the bound with a start-up per collective")
    u.add_argument("--results", required=True)
    u.add_argument("--rate", default="1gbit")
    u.add_argument("--startup-us", default="0,25,50,100", help="comma-separated (default 0,25,50,100)")
    u.add_argument("--dear-plan", default=os.path.join("apps", "tools", "dear-plan"))
    r = sub.add_parser("report", help="e2e.md and SVG plots from the CSVs")
    r.add_argument("--results", required=True)
    r.add_argument("--rate", default="1gbit")
    r.add_argument("--command", default="bench/e2e-matrix.sh")
    r.add_argument("--doc", help="also replace the generated section of this file (docs/PERFORMANCE.md)")
    r.add_argument("--section", default="e2e", help="the name of that section (default e2e)")
    r.add_argument("--title", help="its heading (default: End-to-end: dear-bench on the emulated cluster)")
    r.add_argument("--dear-plan", default=os.path.join("apps", "tools", "dear-plan"),
                   help="dear-plan, for the floor column (default: the build directory's, from the current one)")
    a = ap.parse_args()
    if a.cmd == "scale":
        if a.np < 2 or a.comm_ms <= 0 or a.ratio <= 0 or a.hosts < 0 or a.hosts == 1 or a.hosts > a.np:
            sys.exit("e2e-report.py scale: --np >= 2, --hosts 2..NP, --comm-ms > 0 and --ratio > 0 are required")
        cmd_scale(a)
    elif a.cmd == "check":
        sys.exit(cmd_check(a))
    elif a.cmd == "tails":
        for path in a.timeline:
            rows = tails(path, a.from_iter, a.min_bytes)
            if rows[-1][1] == 0:
                sys.exit("e2e-report.py tails: %s: no size of more than %d bytes ran five times from iteration %d"
                         % (path, a.min_bytes, a.from_iter))
            print("%s: %s" % (path, ", ".join("%s %d runs x%.3f" % r for r in rows)))
    elif a.cmd == "startups":
        try:
            bad = not os.access(a.dear_plan, os.X_OK) or any(not float(x) >= 0 for x in a.startup_us.split(","))
        except ValueError:
            bad = True
        if bad:
            sys.exit("e2e-report.py startups: needs an executable --dear-plan (%s) and --startup-us as "
                     "comma-separated microseconds, e.g. 0,25,50" % a.dear_plan)
        sys.exit(cmd_startups(a))
    elif a.cmd == "gantt":
        if not gantt_svg(a.case, a.timeline, a.svg):
            sys.exit("e2e-report.py gantt: %s holds fewer than three iterations" % a.timeline)
    else:
        if not os.access(a.dear_plan, os.X_OK):
            print("e2e-report.py: no %s: the floor column is left out (give --dear-plan)" % a.dear_plan,
                  file=sys.stderr)
            a.dear_plan = None
        cmd_report(a)


if __name__ == "__main__":
    main()
