#!/usr/bin/env python3
"""refit-report.py: the "The model fitted to training" section of docs/PERFORMANCE.md, from
bench/refit.sh's kept files: per layout and pair, dear-bench's CSV of the job with
DEAR_COST_REFIT=off (refit-LAYOUT-AN.csv, calibrating afresh) and of the job with the fit on
(refit-LAYOUT-RN.csv, refit.meta says in which mode) on that calibration, whose predictions use the
factor the runtime fitted to the plan in force during warm-up."""
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docsection  # noqa: E402

TAG = "refit"
TITLE = "The model fitted to training"
NAME = re.compile(r"refit-(\d+x\d+)-([AR])(\d+)\.csv")
LIMIT = 5.0  # the target: every planner's prediction within this many percent, as shown (0.1%)


def jobs(results):
    """{layout: {side: {pair: rows}}} of every kept job."""
    out = {}
    for name in sorted(os.listdir(results)):
        m = NAME.fullmatch(name)
        if m:
            rows = docsection.read_csv(os.path.join(results, name))
            out.setdefault(m.group(1), {}).setdefault(m.group(2), {})[int(m.group(3))] = rows
    return out


def summary(errors):
    if not errors:
        return "-"
    return "median %.1f%%, worst %+.1f%%, within %.0f%%: %d of %d" % (
        statistics.median(map(abs, errors)), max(errors, key=abs), LIMIT,
        sum(round(abs(e), 1) <= LIMIT for e in errors), len(errors))


def section(results, command):
    found = jobs(results)
    if not found:
        raise ValueError("no bench/results/refit-LAYOUT-{A,R}N.csv under %s" % results)
    begin, end = docsection.markers(TAG, "bench/refit-report.py")
    lines = docsection.section_head(
        begin, TITLE, command, "as root, from the build directory",
        "Pairs of jobs on one calibration each: A plans and predicts with the calibrated model "
        "(DEAR_COST_REFIT=off), R predicts with the model the runtime fitted to the plan in force during "
        "warm-up (and plans with it under DEAR_COST_REFIT=plan; the case line below says which). *error*: "
        "dear-bench's prediction over the measured period, less 1, one figure per job (pairs in order); "
        "*R / A*: R's period over A's in the same pair.")
    lines += docsection.meta_block(os.path.join(results, "refit.meta"))
    lines += ["| layout | configuration | error, A | error, R | R / A (period) |", "|---|---|---|---|---|"]
    totals = []
    for layout in sorted(found):
        sides = found[layout]
        pairs = sorted(set(sides.get("A", {})) & set(sides.get("R", {})))
        configs = []
        for p in pairs:
            for r in sides["A"][p]:
                if r["config"] not in configs:
                    configs.append(r["config"])
        errs = {"A": [], "R": []}
        for c in configs:
            cell, ratio = {}, []
            for s in "AR":
                cell[s] = []
                for p in pairs:
                    r = [x for x in sides[s][p] if x["config"] == c and x["pred_ms"] != "nan"]
                    if r:
                        cell[s].append(docsection.pred_error(r[0]))
            for p in pairs:
                a = [x for x in sides["A"][p] if x["config"] == c]
                b = [x for x in sides["R"][p] if x["config"] == c]
                if a and b and float(a[0]["period_ms"]) > 0:
                    ratio.append(float(b[0]["period_ms"]) / float(a[0]["period_ms"]))
            errs["A"] += cell["A"]
            errs["R"] += cell["R"]
            lines.append("| %s | %s | %s | %s | %s |" % (
                layout, c, ", ".join("%+.1f%%" % e for e in cell["A"]),
                ", ".join("%+.1f%%" % e for e in cell["R"]), ", ".join("%.3f" % v for v in ratio)))
        totals.append("%s: A %s; R %s" % (layout, summary(errs["A"]), summary(errs["R"])))
    lines += ["", "|error| per layout: " + "; ".join(totals) + ".", "", end]
    return lines, begin, end


def main():
    docsection.report_main(__doc__, "refit", section, "<!-- END pred-rate")


if __name__ == "__main__":
    main()
