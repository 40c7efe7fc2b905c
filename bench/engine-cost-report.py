#!/usr/bin/env python3
"""engine-cost-report.py: the "Collectives as the runtime runs them" section of
docs/PERFORMANCE.md, from bench/engine-cost.sh's kept files: per layout the calibration cache
(engine-cost-LAYOUT.cal) and per tensor size dear-bench's CSV (engine-cost-LAYOUT-SIZE.csv).

A made-up model of equal tensors and almost no compute keeps the channel busy all iteration, so
a configuration's period over its collectives per iteration is what one collective costs as the
runtime runs it (dear:none: a reduce-scatter and an all-gather per tensor; sync:none: an
all-reduce per tensor), next to what the simulator predicted from the calibration and the
calibration's own price of one collective alone and, for dear's small ones, in a burst."""
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docsection  # noqa: E402

TAG = "engine-cost"
TITLE = "Collectives as the runtime runs them"


def read_cal(path):
    """The curves of a calibration cache's first entry (docs/FORMATS.md: one communicator size
    and ranks per host) as {(op, algo): [(bytes, s), ...]}."""
    curves, key = {}, None
    with open(path) as f:
        for line in f:
            fields = line.split()
            if not fields or not fields[0].isdigit():
                continue
            p, rph, op, algo = int(fields[0]), int(fields[1]), fields[2], fields[3]
            if key is None:
                key = (p, rph)
            if (p, rph) != key:
                continue
            pts = " ".join(fields[9:]).replace(",", " ").split()
            curves[op, algo] = sorted((float(b), float(s)) for b, s in (x.split(":") for x in pts))
    if key is None:
        raise ValueError("%s: no calibration entry" % path)
    return curves


def price(curves, op, algo, nbytes):
    """Seconds for one collective of nbytes on that curve: linear between its points, the first
    point's time below it, the last point's time per byte above; None without the curve."""
    pts = curves.get((op, algo))
    if not pts:
        return None
    if nbytes <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if nbytes <= x1:
            return y0 + (y1 - y0) * (nbytes - x0) / (x1 - x0)
    return pts[-1][1] * nbytes / pts[-1][0]


def size_bytes(text):
    m = re.fullmatch(r"([1-9][0-9]*)([km])", text)
    if not m:
        raise ValueError("bad size %r in a file name" % text)
    return int(m.group(1)) * (1024 if m.group(2) == "k" else 1048576)


def us(v):
    return "-" if v is None else "%.0f" % (1e6 * v)


def pair(curves, algo, nbytes):
    """A reduce-scatter's and an all-gather's price as "rs / ag" in microseconds."""
    return "%s / %s" % (us(price(curves, "rs", algo, nbytes)), us(price(curves, "ag", algo, nbytes)))


def timed(row):
    """A configuration's period, prediction and error, as the table shows them."""
    return ["%.1f" % float(row["period_ms"]), "%.1f" % float(row["pred_ms"]), "%+.1f%%" % float(row["pred_err_pct"])]


def rows_for(results):
    """[(layout, size text, bytes, curves, {config: row})] in layout then size order."""
    out = []
    for cal in sorted(glob.glob(os.path.join(results, "engine-cost-*.cal"))):
        layout = os.path.basename(cal)[len("engine-cost-"):-len(".cal")]
        curves = read_cal(cal)
        sized = []
        for name, rows in docsection.read_csvs(os.path.join(results, "engine-cost-%s-*.csv" % layout)):
            text = name[len("engine-cost-%s-" % layout):-len(".csv")]
            sized.append((size_bytes(text), text, {r["config"]: r for r in rows}))
        for nbytes, text, by in sorted(sized):
            out.append((layout, text, nbytes, curves, by))
    return out


def section(results, command):
    rows = rows_for(results)
    if not rows:
        raise ValueError("no bench/results/engine-cost-LAYOUT.cal with its CSVs under %s" % results)
    begin, end = docsection.markers(TAG, "bench/engine-cost-report.py")
    lines = docsection.section_head(
        begin, TITLE, command, "as root, from the build directory",
        "A made-up model of equal float32 tensors, one per layer, with so little compute that the "
        "channel is never idle, so each configuration's period (median of the ranks' mean iteration) "
        "over its collectives per iteration is what one collective costs as the runtime runs it: "
        "`dear:none` a reduce-scatter and an all-gather per tensor on the progress thread, up to "
        "DEAR_MAX_INFLIGHT in flight (the period over them); `sync:none` an all-reduce per tensor after "
        "backward (the period less the measured compute, over them). *predicted*: "
        "dear-bench's simulator on the layout's calibration (measured once per layout at commit, on the "
        "application thread before the progress thread starts); *alone* and *burst*: that calibration's "
        "price of one collective back to back and with DEAR_MAX_INFLIGHT in flight (`auto/K`; dear's "
        "queued collectives are priced by it), rs / ag.")
    lines += docsection.meta_block(os.path.join(results, "engine-cost.meta"))
    lines += ["| layout | tensor | dear:none ms | predicted | error | us per collective | alone rs / ag | "
              "burst rs / ag | sync:none ms | predicted | error | us per all-reduce | alone |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    worst = {}
    for layout, text, nbytes, curves, by in rows:
        d, s = by.get("dear:none"), by.get("sync:none")
        ntensors = round(float((d or s)["grad_bytes"]) / nbytes) if d or s else None
        burst = [a for (op, a) in curves if op == "rs" and a.startswith("auto/")]
        cells = [layout, text]
        if d:
            per = float(d["period_ms"]) / (2 * ntensors) / 1e3
            cells += timed(d) + ["%.0f" % (1e6 * per), pair(curves, "auto", nbytes),
                      pair(curves, burst[0], nbytes) if burst and nbytes <= curves["rs", burst[0]][-1][0] else "-"]
            w = worst.setdefault(layout, [0.0, ""])
            if abs(float(d["pred_err_pct"])) > abs(w[0]):
                worst[layout] = [float(d["pred_err_pct"]), text]
        else:
            cells += ["-"] * 6
        if s:
            per = (float(s["period_ms"]) - float(s["compute_meas_ms"])) / ntensors / 1e3  # after backward
            cells += timed(s) + ["%.0f" % (1e6 * per), us(price(curves, "ar", "auto", nbytes))]
        else:
            cells += ["-"] * 5
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "dear:none's prediction furthest from the measurement, per layout: " +
              "; ".join("%s %+.1f%% (%s)" % (l, w[0], w[1]) for l, w in worst.items()) + ".", "", end]
    return lines, begin, end


def main():
    docsection.report_main(__doc__, "engine-cost", section, "<!-- END e2e-many")


if __name__ == "__main__":
    main()
