#!/usr/bin/env python3
"""compress-report.py: the "Gradient compression" section of docs/PERFORMANCE.md from
bench/results/compress-*.csv (bench/compress-perf.sh writes them), standard library only.

Lower bound of a configuration: as bench/e2e-report.py's (max(compute + the first layer's
tail, reduce-scatter + all-gather at the link rate)), each phase counting the bytes that
travel: half for a phase compressed to 16 bits.
"""
import argparse
import importlib.util
import math
import os
import statistics
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from docsection import markers, read_csv, replace_section  # noqa: E402

spec = importlib.util.spec_from_file_location("e2e_report", os.path.join(HERE, "e2e-report.py"))
e2e = importlib.util.module_from_spec(spec)
spec.loader.exec_module(e2e)

BEGIN, END = markers("compress", "bench/compress-report.py")
TITLE = "## Gradient compression (DEAR_COMPRESS)"


def rows_of(path):
    return read_csv(path) if os.path.exists(path) else []


def meta_of(res, part):
    p = os.path.join(res, "compress-%s.meta" % part)
    return open(p).read().strip() if os.path.exists(p) else "%s: not measured" % part


def roundings(algo, np_):
    """Roundings to 16 bits on one element's path through a compressed all-reduce (both phases)."""
    lg = int(math.log2(np_))
    pow2 = 1 << lg == np_
    if algo in ("direct", "sparse"):
        return "2: each other rank's share once (own unrounded), the average once"
    if algo == "ring":
        return "%d: one per hop (%d), the average once" % (np_, np_ - 1)
    if algo in ("rhd", "mpi"):
        n = 1 + lg + (0 if pow2 else 1) + (0 if pow2 else 1)
        what = "the inputs, %d round(s)%s, the scaled sum%s" % (lg, "" if pow2 else ", the fold",
                                                                  " (exact: 1/P is a power of two)" if pow2 else "")
        return ("%d: " % n if algo == "rhd" else "as Open MPI's algorithm, e.g. ") + what
    if algo.startswith("hier-"):
        h, l = (int(x) for x in algo[5:].split("x"))
        cross = "1 across the 2 hosts" if h == 2 else "%d across the hosts (ring)" % (h - 1)
        return "the inputs, 1 inside the host, %s, the average" % cross
    return ""


def accuracy_section(res):
    rows = rows_of(os.path.join(res, "compress-accuracy.csv"))
    if not rows:
        return ["(not measured)"]
    by = defaultdict(dict)
    nps = sorted({int(r["nranks"]) for r in rows})
    for r in rows:
        by[(r["algo"], r["compress"])][int(r["nranks"])] = (float(r["max_err_u"]), float(r["rms_err_u"]))
    out = ["Error of one all-reduce (the average over the ranks) of random float32 in [-1, 1) against the float64 "
           "average, element by element over u times the element's mean |x| over the ranks (u: 2^-8 bf16, 2^-11 "
           "fp16, 2^-24 for float32 itself): largest / root mean square over 1 Mi elements per rank. Roundings are "
           "those on one element's path to 16 bits (the sums themselves are float32).", "",
           "| algorithm | format | " + " | ".join("np %d" % n for n in nps) + " | roundings on a path (np %d) |" % nps[-1],
           "|---|---|" + "---|" * len(nps) + "---|"]
    algos = []
    for r in rows:
        if r["algo"] not in algos:
            algos.append(r["algo"])
    for a in algos:
        for c in ("none", "bf16", "fp16"):
            if (a, c) not in by:
                continue
            cells = []
            for n in nps:
                v = by[(a, c)].get(n)
                cells.append("%.2f / %.2f" % v if v else "")
            npl = max(by[(a, c)])
            out.append("| %s | %s | %s | %s |" % (a, c, " | ".join(cells), roundings(a, npl) if c != "none" else ""))
    return out


def convert_section(res):
    rows = rows_of(os.path.join(res, "compress-convert.csv"))
    if not rows:
        return ["(not measured)"]
    out = ["| step | format | us per MiB of float32 | GB/s |", "|---|---|---|---|"]
    what = {"pack": "pack (round the float32 vector)", "unpack": "unpack (widen the result)",
            "hop": "ring hop (widen, add the own float32, round)"}
    for r in rows:
        out.append("| %s | %s | %.0f | %.1f |" % (what.get(r["step"], r["step"]), r["compress"],
                                                  float(r["us_per_MiB"]), float(r["GBps"])))
    return out


def coll_section(res):
    out = []
    for layout in ("4x1", "2x2"):
        rows = rows_of(os.path.join(res, "compress-coll-%s.csv" % layout))
        if not rows:
            continue
        t = {(r["op"], int(r["bytes"]), r["compress"]): float(r["busbw_MBps"]) for r in rows}
        sizes = sorted({int(r["bytes"]) for r in rows})
        out += ["", "%s (4 ranks, %s), algorithm auto: busbw in MB/s on the float32 bytes, and the ratio to float32:"
                % (layout, "one per host" if layout == "4x1" else "two per host: hier"), "",
                "| op | size | float32 | bf16 | fp16 | bf16 / float32 | fp16 / float32 |", "|---|---|---|---|---|---|---|"]
        for op in ("rs", "ag", "ar"):
            for b in sizes:
                if (op, b, "none") not in t:
                    continue
                n, bf, fp = t[(op, b, "none")], t.get((op, b, "bf16"), float("nan")), t.get((op, b, "fp16"), float("nan"))
                out.append("| %s | %s | %.0f | %.0f | %.0f | %.2f | %.2f |" % (op, size_text(b), n, bf, fp, bf / n, fp / n))
    return out or ["(not measured)"]


def size_text(b):
    return "%d MiB" % (b >> 20) if b >= 1 << 20 else "%d KiB" % (b >> 10)


def wire_bound(row, hosts, rate, comp_rs, comp_ag):
    """e2e-report's link bound with each phase's bytes halved when it is compressed."""
    prof = os.path.join(e2e.PROFILES_DIR, row["model"] + ".prof")
    _, tensors = e2e.load_profile(prof)
    tb = e2e.scaled_bytes(tensors, float(row["size_scale"]))
    f = [0.5 if comp_rs else 1.0, 0.5 if comp_ag else 1.0]
    per_phase = lambda s: (hosts - 1) / hosts * s / rate
    total = sum(b for _, _, b in tb)
    first = sum(b for _, l, b in tb if l == tb[0][1])
    comm = per_phase(total * f[0]) + per_phase(total * f[1])
    tail = per_phase(first * f[0]) + per_phase(first * f[1])
    return 1e3 * max(float(row["compute_ms"]) / 1e3 + tail, comm)


def comp_of(config):
    if "+bf16" in config or "+fp16" in config:
        return 1, 1
    if "+compress=" in config:
        rs, ag = config.split("+compress=")[1].split("+")[0].split("/")
        return rs != "none", ag != "none"
    return 0, 0


def e2e_section(res, rate_text):
    rows = rows_of(os.path.join(res, "compress-e2e.csv"))
    if not rows:
        return ["(not measured)"], []
    rate, rate_note = e2e.measured_rate(res, rate_text)
    cases = []
    for r in rows:
        if r["case"] not in cases:
            cases.append(r["case"])
    out = ["Iteration time in ms (median over the rounds; in brackets the quartiles), the lower bound at %s counting "
           "the bytes each configuration puts on the wire, and iter/bound. vs w64: over wfbp:threshold:64m in "
           "float32 with every tensor whole (Horovod), same run." % rate_note, "",
           "| case | configuration | iter ms | compute ms | vs w64 | bound ms | iter/bound | check |",
           "|---|---|---|---|---|---|---|---|"]
    targets = []
    for case in cases:
        by = {r["config"]: r for r in rows if r["case"] == case}
        w64 = by.get("wfbp:threshold:64m")
        for cfg, r in by.items():
            it = float(r["iter_ms"])
            rs, ag = comp_of(cfg)
            bound = wire_bound(r, 4, rate, rs, ag)
            vs = float(w64["iter_ms"]) / it if w64 else float("nan")
            out.append("| %s | %s | %.1f [%.1f, %.1f] | %.1f | %.2fx | %.1f | %.2f | %s |" % (
                case, cfg, it, float(r["iter_q1_ms"]), float(r["iter_q3_ms"]), float(r["compute_meas_ms"]), vs, bound,
                it / bound, r["check"]))
        p, wb = by.get("dear:auto+bf16"), by.get("wfbp:threshold:64m+bf16")
        if p and w64 and wb:
            it = float(p["iter_ms"])
            targets.append((case, float(w64["iter_ms"]) / it, float(wb["iter_ms"]) / it,
                            it / float(p["compute_meas_ms"]), it / wire_bound(p, 4, rate, 1, 1)))
    t = ["", "| case | dear:auto+bf16 over w64 float32 (goal >= 1.5x when communication-bound) | over w64+bf16 "
         "(goal > 1) | iter / compute | iter / bound |", "|---|---|---|---|---|"]
    for case, a, b, c, d in targets:
        t.append("| %s | %.2fx | %.2fx | %.2f | %.2f |" % (case, a, b, c, d))
    return out, t


def phases_section(res, rate_text):
    rows = rows_of(os.path.join(res, "compress-phases.csv"))
    if not rows:
        return ["(not measured)"]
    rate, _ = e2e.measured_rate(res, rate_text)
    out = ["| case | configuration (reduce-scatter / all-gather) | iter ms | vs float32 | iter/bound |",
           "|---|---|---|---|---|"]
    for case in sorted({r["case"] for r in rows}):
        by = {r["config"]: r for r in rows if r["case"] == case}
        base = by.get("dear:auto")
        for cfg, r in by.items():
            it = float(r["iter_ms"])
            rs, ag = comp_of(cfg)
            out.append("| %s | %s | %.1f [%.1f, %.1f] | %.2fx | %.2f |" % (
                case, cfg, it, float(r["iter_q1_ms"]), float(r["iter_q3_ms"]),
                float(base["iter_ms"]) / it if base else float("nan"), it / wire_bound(r, 4, rate, rs, ag)))
    return out


def train_section(res):
    rows = rows_of(os.path.join(res, "compress-train.csv"))
    if not rows:
        return ["(not measured)"]
    by = defaultdict(list)
    for r in rows:
        if r["value"]:
            by[(r["kind"], r["compress"], r["ef"])].append((int(r["seed"]), float(r["value"])))
    out = ["| trainer | metric | compression | per seed | mean | vs float32 |", "|---|---|---|---|---|---|"]
    for kind, metric in (("cnn", "test accuracy (%)"), ("gpt", "validation loss (nats/char)")):
        base = by.get((kind, "none", "0"))
        bmean = statistics.mean(v for _, v in base) if base else float("nan")
        for c, ef in (("none", "0"), ("bf16", "0"), ("fp16", "0"), ("bf16", "1"), ("fp16", "1")):
            vals = sorted(by.get((kind, c, ef), []))
            if not vals:
                continue
            scale = 100 if kind == "cnn" else 1
            m = statistics.mean(v for _, v in vals)
            diff = ("%+.2f points" % (scale * (m - bmean))) if kind == "cnn" else ("%+.2f%%" % (100 * (m / bmean - 1)))
            out.append("| %s | %s | %s%s | %s | %.4g | %s |" % (
                "dear-cnn" if kind == "cnn" else "dear-gpt", metric, c, " + error feedback" if ef == "1" else "",
                ", ".join("%.4g" % (scale * v) for _, v in vals), scale * m, "" if c == "none" else diff))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    ap.add_argument("--doc", default=os.path.join(HERE, "..", "docs", "PERFORMANCE.md"))
    ap.add_argument("--rate", default="1gbit")
    a = ap.parse_args()
    res = a.results
    e2e_rows, targets = e2e_section(res, a.rate)
    md = [TITLE, "", BEGIN, "",
          "Made by `bench/compress-perf.sh` (%s); the machine has 2 cores shared with other work, so timings are "
          "noisy and the load is given with each part." % ("--rate " + a.rate), ""]
    md += ["- " + meta_of(res, p) for p in ("accuracy", "convert", "coll", "e2e", "train")]
    md += ["", "### Accuracy of one compressed all-reduce", ""] + accuracy_section(res)
    md += ["", "### Conversions on the progress thread", ""] + convert_section(res)
    md += ["", "### Collectives: busbw on the float32 bytes"] + coll_section(res)
    md += ["", "### End to end (dear-bench, 4 emulated hosts)", ""] + e2e_rows + targets
    md += ["", "### Which phase to compress (communication-bound cases)", ""] + phases_section(res, a.rate)
    md += ["", "### Training (np 4 on this host)", ""] + train_section(res)
    md += ["", END, ""]
    replace_section(a.doc, "\n".join(md[2:]), BEGIN, END)
    with open(a.doc) as f:
        text = f.read()
    if TITLE not in text:
        text = text.replace(BEGIN, TITLE + "\n\n" + BEGIN, 1)
        with open(a.doc, "w") as f:
            f.write(text)
    print("compress-report.py: wrote the section to %s" % a.doc)


if __name__ == "__main__":
    main()
