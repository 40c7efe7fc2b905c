#!/usr/bin/env python3
"""ab-report.py OUT ROUNDS: the ratio B/A of bench/ab-builds.sh's runs.

Per e2e case and configuration: the median over the rounds of each run's median iteration time
(iter_ms), for build A and build B, their ratio, and the spread of B/A over the rounds. Per
collective (op, algorithm, size): the same for busbw, and for busbw relative to Open MPI's own
non-blocking call of the same op and size in the same run (ompi-nb), which cancels what the
machine's load did to that run: both builds call the same Open MPI there. Prints markdown
tables and the median of all ratios of each kind."""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from docsection import read_csvs  # noqa: E402


def rows(pattern):
    for name, rs in read_csvs(pattern):
        for r in rs:
            yield name, r


def collect(out, kind, side, rounds, key, value):
    got = {}
    for r in range(1, rounds + 1):
        for fname, row in rows(os.path.join(out, "%s-%s-%d" % (kind, side, r), "*.csv")):
            k = key(fname, row)
            if k is None:
                continue
            try:
                got.setdefault(k, {})[r] = float(row[value])
            except (KeyError, ValueError):
                pass
    return got


def table(title, a, b, unit, rounds):
    print("### %s\n" % title)
    print("| what | A (%s) | B (%s) | B/A | B/A per round (min-max) |" % (unit, unit))
    print("|---|---:|---:|---:|---|")
    ratios = []
    for k in sorted(set(a) & set(b)):
        both = [r for r in range(1, rounds + 1) if r in a[k] and r in b[k]]
        if not both:
            continue
        ma, mb = statistics.median(a[k][r] for r in both), statistics.median(b[k][r] for r in both)
        per = [b[k][r] / a[k][r] for r in both if a[k][r] > 0]
        ratio = mb / ma if ma > 0 else float("nan")
        ratios.append(ratio)
        print("| %s | %.1f | %.1f | %.3f | %.3f-%.3f |" % (" ".join(k), ma, mb, ratio, min(per), max(per)))
    if ratios:
        print("\nmedian B/A over %d rows: %.3f (min %.3f, max %.3f)\n" %
              (len(ratios), statistics.median(ratios), min(ratios), max(ratios)))
    return ratios


def relative(got):
    """Each dear algorithm's busbw over ompi-nb's of the same op and size in the same run, x100."""
    out = {}
    for (op, algo, size), runs in got.items():
        base = got.get((op, "ompi-nb", size), {})
        if algo.startswith("ompi"):
            continue
        for r, v in runs.items():
            if base.get(r):
                out.setdefault((op, algo, size), {})[r] = 100.0 * v / base[r]
    return out


def main():
    out, rounds = sys.argv[1], int(sys.argv[2])
    e2e_key = lambda f, r: (f[len("e2e-"):-len(".csv")], r["config"]) if r.get("check", "ok") == "ok" else None
    table("End to end: iteration time (dear-bench, median)", collect(out, "e2e", "a", rounds, e2e_key, "iter_ms"),
          collect(out, "e2e", "b", rounds, e2e_key, "iter_ms"), "ms", rounds)
    coll_key = lambda f, r: (r["op"], r["algo"], "%dk" % (int(r["bytes"]) // 1024)) if r.get("wrong", "0") == "0" else None
    a = collect(out, "coll", "a", rounds, coll_key, "busbw_MBps")
    if a:
        b = collect(out, "coll", "b", rounds, coll_key, "busbw_MBps")
        table("Collectives: busbw (dear-coll-bench, 4 hosts x 1 rank at 1 Gbit/s)", a, b, "MB/s", rounds)
        table("Collectives: busbw relative to Open MPI's non-blocking call in the same run (x100)",
              relative(a), relative(b), "%", rounds)


if __name__ == "__main__":
    main()
