#!/usr/bin/env python3
"""refit-report.py: the "The model fitted to training" section of docs/PERFORMANCE.md, from
bench/refit.sh's kept files: per layout, rate and pair, dear-bench's CSV of the job with
DEAR_COST_REFIT=off (refit-LAYOUT-RATE-AN.csv) and of the job with the fit on (refit-LAYOUT-RATE-RN.csv)
on one calibration, whose predictions use the factor the runtime fitted to the plan in force
during warm-up: those of DEAR_COST_REFIT=predict beside refit.meta in the results folder, those of
=plan (a table of their own) under its refit-plan/ folder."""
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docsection  # noqa: E402

TAG = "refit"
TITLE = "The model fitted to training"
NAME = re.compile(r"refit-(\d+x\d+)-([0-9.]+[kmg]bit)-([AR])(\d+)\.csv")
LIMIT = 5.0  # the target: every planner's prediction within this many percent, as shown (0.1%)


def jobs(results):
    """{(layout, rate): {side: {pair: rows}}} of every kept job."""
    out = {}
    for name in sorted(os.listdir(results)):
        m = NAME.fullmatch(name)
        if m:
            rows = docsection.read_csv(os.path.join(results, name))
            out.setdefault((m.group(1), m.group(2)), {}).setdefault(m.group(3), {})[int(m.group(4))] = rows
    return out


def summary(errors):
    if not errors:
        return "-"
    return "median %.1f%%, worst %+.1f%%, within %.0f%%: %d of %d" % (
        statistics.median(map(abs, errors)), max(errors, key=abs), LIMIT,
        sum(round(abs(e), 1) <= LIMIT for e in errors), len(errors))


def table(found):
    """The table of one mode's jobs and its summary line per layout and rate."""
    lines = ["| layout | configuration | error, A | error, R | R / A (period) |", "|---|---|---|---|---|"]
    totals = []
    for key in sorted(found, key=lambda k: (docsection.parse_rate(k[1]), k[0])):
        sides, where = found[key], "%s, %s" % key
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
                where, c, ", ".join("%+.1f%%" % e for e in cell["A"]),
                ", ".join("%+.1f%%" % e for e in cell["R"]), ", ".join("%.3f" % v for v in ratio)))
        totals.append("%s: A %s; R %s" % (where, summary(errs["A"]), summary(errs["R"])))
    return lines + ["", "|error| per layout: " + "; ".join(totals) + ".", ""]


def section(results, command):
    found = jobs(results)
    if not found:
        raise ValueError("no bench/results/refit-LAYOUT-RATE-{A,R}N.csv under %s" % results)
    begin, end = docsection.markers(TAG, "bench/refit-report.py")
    lines = docsection.section_head(
        begin, TITLE, command, "as root, from the build directory; each run's command heads its meta block",
        "Pairs of jobs on one calibration each, in alternating order (the first calibrates, the second "
        "loads its cache): A plans and predicts with the calibrated model (DEAR_COST_REFIT=off), R "
        "predicts with the model the runtime fitted to the plan in force during warm-up. *error*: "
        "dear-bench's prediction over the measured period, less 1, one figure per job (pairs in order); "
        "*R / A*: R's period over A's in the same pair.")
    lines += docsection.meta_block(os.path.join(results, "refit.meta"))
    lines += table(found)
    plan = os.path.join(results, "refit-plan")
    found = jobs(plan) if os.path.isdir(plan) else {}
    if found:
        lines += ["### Planning with the fitted model (DEAR_COST_REFIT=plan)", "",
                  "The same pairs with R's planners on the fitted model too (`bench/refit.sh --refit plan`); "
                  "the CSVs are in bench/results/refit-plan/.", ""]
        lines += docsection.meta_block(os.path.join(plan, "refit.meta"))
        lines += table(found)
    return lines + [end], begin, end


def main():
    docsection.report_main(__doc__, "refit", section, "<!-- END pred-rate")


if __name__ == "__main__":
    main()
