#!/usr/bin/env python3
"""compress-report.py: the "Gradient compression" section of docs/PERFORMANCE.md from
bench/results/compress-*.csv (bench/compress-perf.sh writes them), standard library only.

Lower bound of a configuration: bench/e2e-report.py's (compute, or for some layer k the compute
of layers k..L-1 plus the link time of layers 0..k), each phase counting the bytes that
travel: half for a phase compressed to 16 bits, (256 + 4) / 1024 for int8 (a byte per value and
a float32 scale per 256).

int8's goals (busbw at least INT8_BUSBW_GOAL x float32's from INT8_BUSBW_FROM up; training within
TRAIN_GOALS of float32) are checked where measured; where the kept CSVs have no int8 rows the
int8 cells say "not measured".
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
NOT_MEASURED = "not measured"
# Bytes on the wire per float32 byte in a phase compressed to each format.
WIRE = {"none": 1.0, "bf16": 0.5, "fp16": 0.5, "int8": (256 + 4) / 1024}
# A format not built: 4-bit codes with int8's float32 scale per 256 values, judged by its bound.
WIRE_INT4 = (128 + 4) / 1024


def rows_of(path):
    return read_csv(path) if os.path.exists(path) else []


def meta_of(res, part):
    p = os.path.join(res, "compress-%s.meta" % part)
    return open(p).read().strip() if os.path.exists(p) else "%s: not measured" % part


def roundings(algo, np_, comp):
    """Roundings on one element's path through a compressed all-reduce (both phases)."""
    if comp == "int8" and algo == "sparse":
        # block-sparse vectors leave int8 alone (coll.c): the error is float32's
        return "none: the block-sparse collective sends float32 (int8 applies to dense vectors)"
    if comp == "int8" and algo.startswith("hier"):
        # hier quantizes only what crosses the hosts (coll_hier.c)
        return ("2: each other host's partial sum once (the own host's unquantized, float32 inside a "
                "host), the average once")
    if comp == "int8":
        # the flat algorithms fall back to the direct exchange (coll.h)
        return "2: each other rank's share once (own unquantized), the average once; %s" % (
            "runs direct" if algo in ("direct", "sparse") else "%s runs direct" % algo)
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
           "fp16, 2^-24 for float32 itself; int8: over 1/254, half a scale of a block whose largest |x| is 1, as "
           "the data's are): largest / root mean square over 1 Mi elements per rank. Roundings are those on one "
           "element's path to 16 bits or 8 (the sums themselves are float32).", "",
           "| algorithm | format | " + " | ".join("np %d" % n for n in nps) + " | roundings on a path (np %d) |" % nps[-1],
           "|---|---|" + "---|" * len(nps) + "---|"]
    algos = []
    for r in rows:
        if r["algo"] not in algos:
            algos.append(r["algo"])
    for a in algos:
        for c in ("none", "bf16", "fp16", "int8"):
            if (a, c) not in by:
                continue
            cells = []
            for n in nps:
                v = by[(a, c)].get(n)
                cells.append("%.2f / %.2f" % v if v else "")
            npl = max(by[(a, c)])
            out.append("| %s | %s | %s | %s |" % (a, c, " | ".join(cells), roundings(a, npl, c) if c != "none" else ""))
    if not any(c == "int8" for _, c in by):
        out += ["", "int8: %s." % NOT_MEASURED]
    return out


def convert_section(res):
    rows = rows_of(os.path.join(res, "compress-convert.csv"))
    if not rows:
        return ["(not measured)"]
    out = ["| step | format | us per MiB of float32 | GB/s |", "|---|---|---|---|"]
    what = {"pack": "pack (round the float32 vector)", "unpack": "unpack (widen the result)",
            "hop": "ring hop (widen, add the own float32, round)",
            ("pack", "int8"): "pack (quantize: a scale per 256 values, the codes)",
            ("unpack", "int8"): "unpack (dequantize the result)",
            ("add", "int8"): "owner's add (dequantize a received chunk into the float32 sum)"}
    for r in rows:
        step = what.get((r["step"], r["compress"]), what.get(r["step"], r["step"]))
        out.append("| %s | %s | %.0f | %.1f |" % (step, r["compress"], float(r["us_per_MiB"]), float(r["GBps"])))
    if not any(r["compress"] == "int8" for r in rows):
        out += ["| %s | int8 | %s | |" % (what[(s, "int8")], NOT_MEASURED) for s in ("pack", "unpack")]
    return out


INT8_BUSBW_GOAL, INT8_BUSBW_FROM = 3.0, 4 << 20


def coll_section(res):
    out = []
    for layout in ("4x1", "2x2"):
        rows = rows_of(os.path.join(res, "compress-coll-%s.csv" % layout))
        if not rows:
            continue
        t = {(r["op"], int(r["bytes"]), r["compress"]): float(r["busbw_MBps"]) for r in rows}
        sizes = sorted({int(r["bytes"]) for r in rows})
        out += ["", "%s (4 ranks, %s), algorithm auto: busbw in MB/s on the float32 bytes, and the "
                "ratio to float32. int8's goal: at least %gx float32's busbw from %s up:"
                % (layout, "one per host; int8 runs direct" if layout == "4x1" else
                   "two per host: hier; int8 runs hier where auto picks it (float32 inside a host, int8 across), "
                   "else direct", INT8_BUSBW_GOAL,
                   size_text(INT8_BUSBW_FROM)), "",
                "| op | size | float32 | bf16 | fp16 | int8 | bf16 / float32 | fp16 / float32 | int8 / float32 | "
                "int8 goal |", "|---|---|---|---|---|---|---|---|---|---|"]
        met = checked = 0
        for op in ("rs", "ag", "ar"):
            for b in sizes:
                if (op, b, "none") not in t:
                    continue
                n, bf, fp = t[(op, b, "none")], t.get((op, b, "bf16"), float("nan")), t.get((op, b, "fp16"), float("nan"))
                q = t.get((op, b, "int8"))
                goal = NOT_MEASURED if q is None and b >= INT8_BUSBW_FROM else ""
                if q is None:
                    qbw = qratio = NOT_MEASURED
                else:
                    qbw, qratio = "%.0f" % q, "%.2f" % (q / n)
                    if b >= INT8_BUSBW_FROM:
                        ok = q >= INT8_BUSBW_GOAL * n
                        met, checked, goal = met + ok, checked + 1, "pass" if ok else "fail"
                out.append("| %s | %s | %.0f | %.0f | %.0f | %s | %.2f | %.2f | %s | %s |" % (
                    op, size_text(b), n, bf, fp, qbw, bf / n, fp / n, qratio, goal))
        out += ["", "int8 goal on %s: %s." % (layout, "met in %d of %d rows from %s up" % (
            met, checked, size_text(INT8_BUSBW_FROM)) if checked else NOT_MEASURED)]
    return out or ["(not measured)"]


def size_text(b):
    return "%d MiB" % (b >> 20) if b >= 1 << 20 else "%d KiB" % (b >> 10)


def wire_bound(row, hosts, rate, f_rs, f_ag, upd_ms=0.0):
    """e2e-report's link bound with each phase's bytes scaled by f_rs, f_ag (wire_of), upd_ms of
    updates counted as compute (e2e-report's least_updates)."""
    return e2e.link_bound(row, hosts, rate, upd_ms=upd_ms, f_rs=f_rs, f_ag=f_ag)


def wire_of(config):
    """Bytes on the wire per float32 byte in the reduce-scatter and the all-gather of a
    dear-bench configuration (its +bf16, +fp16, +int8 or +compress=RS/AG)."""
    for c in ("bf16", "fp16", "int8"):
        if "+" + c in config.split("+compress=")[0]:
            return WIRE[c], WIRE[c]
    if "+compress=" in config:
        rs, ag = config.split("+compress=")[1].split("+")[0].split("/")
        return WIRE[rs], WIRE[ag]
    return 1.0, 1.0


def goal_cell(ratio, ok):
    return "%.2fx (%s)" % (ratio, "pass" if ok else "fail")


BOUND_ALLOWS = ("*the bound allows*: wfbp+64M float32 over dear:auto+int8's lower bound, the most any int8 run "
                "could gain on that case; where it is under the goal, the goal cannot be met there. *compute and "
                "updates allow*: wfbp+64M float32 over the int8 run's compute plus its own updates, each rank "
                "stepping every parameter as dear:auto does (the bound counts the updates sharded, over P): no "
                "unsharded run, whatever its bytes, gets past it.")


def speedup_goal_cell(base_ms, iter_ms, bound_ms, goal, floor_ms=None):
    """The speedup over a baseline against its goal, with the ceiling the configuration's own lower
    bound allows (base / bound): where that is under the goal, no run can meet it; with floor_ms
    (the run's compute and its own updates), also the ceiling of its unsharded schedule."""
    ratio, ceiling = base_ms / iter_ms, base_ms / bound_ms
    if ratio >= goal:
        return "%.2fx (pass)" % ratio
    why = "the bound allows" if ceiling >= goal else "unreachable: the bound allows"
    own = "; compute and updates allow %.2fx" % (base_ms / floor_ms) if floor_ms else ""
    return "%.2fx (fail; %s %.2fx%s)" % (ratio, why, ceiling, own)


def own_floor(row):
    """The run's compute and its own measured updates (ms), None when the CSV has no update_ms."""
    return float(row["compute_ms"]) + float(row["update_ms"]) if row.get("update_ms") else None


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
    targets, int4 = [], []
    for case in cases:
        by = {r["config"]: r for r in rows if r["case"] == case}
        upd = e2e.least_updates(list(by.values()))
        w64 = by.get("wfbp:threshold:64m")
        for cfg, r in by.items():
            it = float(r["iter_ms"])
            bound = wire_bound(r, 4, rate, *wire_of(cfg), upd)
            vs = float(w64["iter_ms"]) / it if w64 else float("nan")
            out.append("| %s | %s | %.1f [%.1f, %.1f] | %.1f | %.2fx | %.1f | %.2f | %s |" % (
                case, cfg, it, float(r["iter_q1_ms"]), float(r["iter_q3_ms"]), float(r["compute_meas_ms"]), vs, bound,
                it / bound, r["check"]))
        p, wb, q = by.get("dear:auto+bf16"), by.get("wfbp:threshold:64m+bf16"), by.get("dear:auto+int8")
        if p and w64 and wb:
            it = float(p["iter_ms"])
            cells = ["%.2fx" % (float(w64["iter_ms"]) / it), "%.2fx" % (float(wb["iter_ms"]) / it),
                     "%.2f" % (it / float(p["compute_meas_ms"])), "%.2f" % (it / wire_bound(p, 4, rate, *wire_of(
                         "dear:auto+bf16"), upd))]
            if q:
                qi = float(q["iter_ms"])
                over_w64, over_bf16 = float(w64["iter_ms"]) / qi, it / qi
                # the goals are the communication-bound cases'; balanced ones show the ratios only
                comm = case.endswith("-comm")
                qbound = wire_bound(q, 4, rate, *wire_of("dear:auto+int8"), upd)
                cells += [speedup_goal_cell(float(w64["iter_ms"]), qi, qbound, 2.5, own_floor(q)) if comm
                          else "%.2fx" % over_w64,
                          goal_cell(over_bf16, over_bf16 > 1) if comm else "%.2fx" % over_bf16]
                if comm:
                    b4 = wire_bound(q, 4, rate, WIRE_INT4, WIRE_INT4, upd)
                    upd_q = float(q["update_ms"]) if q.get("update_ms") else float("nan")
                    int4.append("| %s | %.1f | %.1f | %.1f | %.1f | %.2fx | %.1f | %.2fx | %.2fx |" % (
                        case, float(q["exposed_ms"]), upd_q, qbound, b4, float(w64["iter_ms"]) / b4,
                        b4 * qi / qbound, float(w64["iter_ms"]) / (b4 * qi / qbound), qbound / b4))
            else:
                cells += [NOT_MEASURED] * 2
            targets.append((case, cells))
    t = ["", "| case | dear:auto+bf16 over w64 float32 (goal >= 1.5x when communication-bound) | over w64+bf16 "
         "(goal > 1) | iter / compute | iter / bound | dear:auto+int8 over w64 float32 (goal >= 2.5x when "
         "communication-bound) | dear:auto+int8 over dear:auto+bf16 (goal > 1 when communication-bound) |",
         "|---|---|---|---|---|---|---|"]
    for case, cells in targets:
        t.append("| %s | %s |" % (case, " | ".join(cells)))
    t += ["", BOUND_ALLOWS]
    if int4:
        t += ["", "Would 4-bit codes pay? int4 is not built; its bound counts (128 + 4) / 1024 of float32's bytes "
              "(two codes a byte, int8's scale per 256), and *at int8's efficiency* is that bound times int8's "
              "measured iter/bound in the same case. Fewer bytes can only shorten what int8 leaves exposed "
              "(iteration - compute), and that holds the optimizer's updates, each rank stepping every "
              "parameter (sharded, the all-gathers would carry float32 parameters):", "",
              "| case | int8 exposed ms | of it updates ms | int8 bound ms | int4 bound ms | int4's bound over w64 "
              "float32 | int4 at int8's efficiency ms | over w64 float32 | over dear:auto+int8 |",
              "|---|---|---|---|---|---|---|---|---|"] + int4
    return out, t


def layouts_section(res, rate_text):
    """The communication-bound cases on layouts of several ranks per host: int8 against dense
    wfbp+64M and dear:auto+bf16 in the same run, with the goals of the 4-host cases."""
    rows = rows_of(os.path.join(res, "compress-layouts.csv"))
    if not rows:
        return ["(not measured)"]
    rate, rate_note = e2e.measured_rate(res, rate_text)
    out = ["Iteration time in ms (median over the rounds; in brackets the quartiles) and iter/bound, the bound at "
           "%s on each host's link; float32 communication twice the compute." % rate_note, "",
           "| layout | case | wfbp+64M float32 | dear:auto+bf16 | dear:auto+int8 | int8 iter/bound | int8 over w64 "
           "(goal >= 2.5x) | int8 over bf16 (goal > 1) | prediction error bf16 / int8 |",
           "|---|---|---|---|---|---|---|---|---|"]
    keys = []
    for r in rows:
        if (r["layout"], r["case"]) not in keys:
            keys.append((r["layout"], r["case"]))
    for layout, case in keys:
        by = {r["config"]: r for r in rows if r["layout"] == layout and r["case"] == case}
        upd = e2e.least_updates(list(by.values()))
        w, b, q = by.get("wfbp:threshold:64m"), by.get("dear:auto+bf16"), by.get("dear:auto+int8")
        cell = lambda r: "%.1f [%.1f, %.1f]" % (float(r["iter_ms"]), float(r["iter_q1_ms"]), float(
            r["iter_q3_ms"])) if r else NOT_MEASURED
        cells = [cell(w), cell(b), cell(q)]
        if q and w and b:
            qi = float(q["iter_ms"])
            hosts = int(layout.split("x")[0])
            qbound = wire_bound(q, hosts, rate, *wire_of("dear:auto+int8"), upd)
            cells += ["%.2f" % (qi / qbound), speedup_goal_cell(float(w["iter_ms"]), qi, qbound, 2.5, own_floor(q)),
                      goal_cell(float(b["iter_ms"]) / qi, float(b["iter_ms"]) / qi > 1)]
        else:
            cells += [NOT_MEASURED] * 3
        err = lambda r: "%+.1f%%" % float(r["pred_err_pct"]) if r and r.get("pred_err_pct", "nan") != "nan" else "-"
        cells.append("%s / %s" % (err(b), err(q)))
        out.append("| %s | %s | %s |" % (layout, case, " | ".join(cells)))
    out += ["", BOUND_ALLOWS, "",
            "Prediction error: the simulator's iteration for the plan that ran, with the runtime's calibration "
            "(compressed collectives by the curves measured in their format), against the measured median; "
            "negative: the run was slower."]
    return out


def phases_section(res, rate_text):
    rows = rows_of(os.path.join(res, "compress-phases.csv"))
    if not rows:
        return ["(not measured)"]
    rate, _ = e2e.measured_rate(res, rate_text)
    out = ["| case | configuration (reduce-scatter / all-gather) | iter ms | vs float32 | iter/bound |",
           "|---|---|---|---|---|"]
    for case in sorted({r["case"] for r in rows}):
        by = {r["config"]: r for r in rows if r["case"] == case}
        upd = e2e.least_updates(list(by.values()))
        base = by.get("dear:auto")
        for cfg, r in by.items():
            it = float(r["iter_ms"])
            out.append("| %s | %s | %.1f [%.1f, %.1f] | %.2fx | %.2f |" % (
                case, cfg, it, float(r["iter_q1_ms"]), float(r["iter_q3_ms"]),
                float(base["iter_ms"]) / it if base else float("nan"), it / wire_bound(r, 4, rate, *wire_of(cfg), upd)))
    return out


TRAIN_GOALS = {"cnn": "at most 0.3 points below float32", "gpt": "at most 1% above float32"}


def train_section(res):
    rows = rows_of(os.path.join(res, "compress-train.csv"))
    if not rows:
        return ["(not measured)"]
    by = defaultdict(list)
    for r in rows:
        if r["value"]:
            by[(r["kind"], r["compress"], r["ef"])].append((int(r["seed"]), float(r["value"])))
    seeds = len({r["seed"] for r in rows})
    out = ["Median over the seeds (%d; every configuration runs the same seeds as float32)." % seeds, "",
           "| trainer | metric | compression | per seed | median | vs float32 |", "|---|---|---|---|---|---|"]
    goals = ["", "int8's goals: dear-cnn's test accuracy %s, dear-gpt's validation loss %s, on the medians:"
             % (TRAIN_GOALS["cnn"], TRAIN_GOALS["gpt"]), "",
             "| trainer | compression | median | vs float32 | goal | check |", "|---|---|---|---|---|---|"]
    for kind, metric in (("cnn", "test accuracy (%)"), ("gpt", "validation loss (nats/char)")):
        name = "dear-cnn" if kind == "cnn" else "dear-gpt"
        scale = 100 if kind == "cnn" else 1
        base = by.get((kind, "none", "0"))
        bmed = statistics.median(v for _, v in base) if base else float("nan")
        for c, ef in (("none", "0"), ("bf16", "0"), ("fp16", "0"), ("bf16", "1"), ("fp16", "1"), ("int8", "1"),
                      ("int8", "0")):
            label = c + (" + error feedback" if ef == "1" else ", no error feedback" if c == "int8" else "")
            vals = sorted(by.get((kind, c, ef), []))
            if not vals:
                if c == "int8":
                    goals.append("| %s | %s | %s | | %s | %s |" % (name, label, NOT_MEASURED, TRAIN_GOALS[kind],
                                                                   NOT_MEASURED))
                continue
            m = statistics.median(v for _, v in vals)
            # cnn: points of accuracy; gpt: relative validation loss
            off = scale * (m - bmed) if kind == "cnn" else 100 * (m / bmed - 1)
            diff = ("%+.2f points" % off) if kind == "cnn" else ("%+.2f%%" % off)
            out.append("| %s | %s | %s | %s | %.4g | %s |" % (
                name, metric, label, ", ".join("%.4g" % (scale * v) for _, v in vals), scale * m,
                "" if c == "none" else diff))
            if c == "int8":
                ok = off >= -0.3 if kind == "cnn" else off <= 1.0  # worse by no more than the goal; better passes
                goals.append("| %s | %s | %.4g | %s | %s | %s |" % (name, label, scale * m, diff, TRAIN_GOALS[kind],
                                                                   "pass" if ok else "fail" if base else NOT_MEASURED))
    return out + goals


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
    md += ["- " + meta_of(res, p) for p in ("accuracy", "convert", "coll", "e2e", "layouts", "train")]
    md += ["", "### Accuracy of one compressed all-reduce", ""] + accuracy_section(res)
    md += ["", "### Conversions on the progress thread", ""] + convert_section(res)
    md += ["", "### Collectives: busbw on the float32 bytes"] + coll_section(res)
    md += ["", "### End to end (dear-bench, 4 emulated hosts)", ""] + e2e_rows + targets
    md += ["", "### Which phase to compress (communication-bound cases)", ""] + phases_section(res, a.rate)
    md += ["", "### Several ranks per host (dear-bench, communication-bound cases)", ""] + layouts_section(res, a.rate)
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
