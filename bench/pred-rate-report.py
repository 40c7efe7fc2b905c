#!/usr/bin/env python3
"""pred-rate-report.py: the "Predictions against bytes per second" section of
docs/PERFORMANCE.md, from bench/pred-rate.sh's kept files: per layout, rate and run dear-bench's
CSV (pred-rate-LAYOUT-RATE-RUN.csv) and the counters read around the job (.io: the first host's
loopback and link bytes sent, the machine's busy and total CPU ticks).

The case is scaled to the same communication time at every rate, so a slower link means fewer
bytes per second through the hosts' cores; each job calibrated afresh, so the runs of one cell
also show how far two calibrations price the plans they chose."""
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docsection  # noqa: E402

TAG = "pred-rate"
TITLE = "Predictions against bytes per second"
NAME = re.compile(r"pred-rate-(\d+x\d+)-([0-9.]+[kmg]bit)-(\d+)\.csv")
LIMIT = 5.0  # the target: every planner's prediction within this many percent, as shown (0.1%)


def read_io(path):
    """The .io file's counters as a dict of floats; empty when the file is absent."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        keys, vals = f.readline().split(), f.readline().split()
    return dict(zip(keys, map(float, vals)))


def cells(results):
    """{(layout, rate): [(run, rows, io)]} of every kept job."""
    out = {}
    for name in sorted(os.listdir(results)):
        m = NAME.fullmatch(name)
        if not m:
            continue
        layout, rate, run = m.group(1), m.group(2), int(m.group(3))
        rows = docsection.read_csv(os.path.join(results, name))
        io = read_io(os.path.join(results, name[:-len(".csv")] + ".io"))
        out.setdefault((layout, rate), []).append((run, rows, io))
    return out


def joined(values, fmt):
    return " / ".join(fmt % v for v in values)


def section(results, command):
    found = cells(results)
    if not found:
        raise ValueError("no bench/results/pred-rate-LAYOUT-RATE-RUN.csv under %s" % results)
    keys = sorted(found, key=lambda k: (k[0], docsection.parse_rate(k[1])))
    begin, end = docsection.markers(TAG, "bench/pred-rate-report.py")
    lines = docsection.section_head(
        begin, TITLE, command, "as root, from the build directory",
        "One case on each layout at each link rate, scaled to the same communication time per "
        "iteration, so a slower link means fewer bytes per second through the hosts' cores; every job "
        "calibrated afresh. *error*: dear-bench's prediction on its job's calibration over the measured "
        "period, less 1, one figure per job; *CPU busy*: the machine's cores over the jobs (calibration "
        "and warm-up included; the emulated hosts share them); *loopback / link*: bytes the first host "
        "sent between its own ranks (TCP over loopback, the socket transport) per byte it sent over its "
        "link.")
    lines += docsection.meta_block(os.path.join(results, "pred-rate.meta"))
    lines += ["| layout | rate | CPU busy | loopback / link | worst error | within %.0f%% |" % LIMIT,
              "|---|---|---|---|---|---|"]
    detail = ["| layout | rate | configuration | plans | measured ms | predicted ms | error |",
              "|---|---|---|---|---|---|---|"]
    errs = {}  # key: the errors of its jobs, for the medians below
    for key in keys:
        jobs = sorted(found[key])
        io = [j[2] for j in jobs if j[2]]
        busy = sum(i["cpu_busy"] for i in io) / sum(i["cpu_total"] for i in io) if io else None
        link = sum(i["link_bytes"] for i in io)
        loop = "%.1f" % (sum(i["lo_bytes"] for i in io) / link) if link > 0 else "-"
        configs = []
        for _, rows, _ in jobs:
            for r in rows:
                if r["config"] not in configs:
                    configs.append(r["config"])
        errors = errs[key] = []
        for c in configs:
            rs = [r for _, rows, _ in jobs for r in rows if r["config"] == c and r["pred_ms"] != "nan"]
            if not rs:
                continue
            e = [docsection.pred_error(r) for r in rs]
            errors += e
            plans = joined([(r["plan"], int(r["rs_buckets"]), int(r["ag_groups"])) for r in rs], "%s %d/%d")
            detail.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                key[0], key[1], c, plans, joined([float(r["period_ms"]) for r in rs], "%.1f"),
                joined([float(r["pred_ms"]) for r in rs], "%.1f"), joined(e, "%+.1f%%")))
        worst = max(errors, key=abs) if errors else None
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            key[0], key[1], "-" if busy is None else "%.0f%%" % (100 * busy), loop,
            "-" if worst is None else "%+.1f%%" % worst,
            "-" if worst is None else "%d of %d" % (sum(round(abs(e), 1) <= LIMIT for e in errors), len(errors))))
    lines += [""] + detail
    lines += ["", "Median |error| per layout and rate: " +
              "; ".join("%s at %s %.1f%%" % (k[0], k[1], statistics.median(map(abs, e)))
                        for k, e in errs.items() if e) + ".", "", end]
    return lines, begin, end


def main():
    docsection.report_main(__doc__, "pred-rate", section, "<!-- END engine-cost")


if __name__ == "__main__":
    main()
