#!/usr/bin/env python3
"""first-plan-report.py: the CSVs of bench/first-plan.sh (dear-bench) and bench/torch-first.sh (the
PyTorch binding) to the "First plan without a profile" section of docs/PERFORMANCE.md (and a copy
at bench/results/first-plan.md)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from docsection import markers, read_csvs, read_meta, replace_section  # noqa: E402

BEGIN, END = markers("first-plan", "bench/first-plan-report.py")
TRAIN = ["dear:auto+first=threshold", "dear:auto+first=range", "dear:auto+first=first",
         "dear:auto+first=range+nohints", "dear:auto+first=first+nohints"]
TRAIN_NAMES = ["threshold (before)", "range (default)", "first", "range, bytes only", "first, bytes only"]
CLOSE = ["dear:auto+first=range+hold", "dear:auto+first=first+hold", "dear:auto+first=range+hold+nohints",
         "dear:auto+first=first+hold+nohints"]
CLOSE_NAMES = ["range", "first", "range, bytes only", "first, bytes only"]


def by_config(rows):
    return {r["config"]: r for r in rows}


def num(r, key):
    try:
        v = float(r[key])
        return v if v == v else None
    except (KeyError, TypeError, ValueError):
        return None


def cases(results, job):
    return [(name[len("first-plan-%s-" % job):-4], by_config(rows))
            for name, rows in read_csvs(os.path.join(results, "first-plan-%s-*.csv" % job))]


def pct(v, ref):
    return "%+.1f%%" % (100 * (v / ref - 1)) if v is not None and ref else "-"


def train_table(train, key, what):
    L = ["| case | " + " | ".join(TRAIN_NAMES) + " |", "|---" * (len(TRAIN) + 1) + "|"]
    gains = [[] for _ in TRAIN]
    for case, rows in train:
        ref = num(rows.get(TRAIN[0], {}), key)
        cells = []
        for i, c in enumerate(TRAIN):
            v = num(rows.get(c, {}), key)
            if v is None:
                cells.append("-")
                continue
            cells.append("%.2f s" % v if i == 0 else "%.2f s (%s)" % (v, pct(v, ref)))
            if i > 0 and ref:
                gains[i].append(v / ref - 1)
        L.append("| %s | %s |" % (case, " | ".join(cells)))
    L.append("| mean vs threshold | - | " + " | ".join(
        "%+.1f%%" % (100 * sum(g) / len(g)) if g else "-" for g in gains[1:]) + " |")
    n = train[0][1].get(TRAIN[0], {}).get(what, "?") if train else "?"
    return L, n


def close_table(close):
    L = ["| case | measured plan (dear:auto settled): iter ms, pred ms, plan | " +
         " | ".join("%s: iter ms, pred ms, plan" % n for n in CLOSE_NAMES) + " |",
         "|---" * (len(CLOSE) + 2) + "|"]
    worst = [0.0 for _ in CLOSE]
    for case, rows in close:
        a = rows.get("dear:auto", {})
        ai, ap = num(a, "iter_ms"), num(a, "pred_ms")
        cells = ["%.1f, %.1f, %s" % (ai or 0, ap or 0, a.get("plan", "-"))]
        for i, c in enumerate(CLOSE):
            r = rows.get(c, {})
            ri, rp = num(r, "iter_ms"), num(r, "pred_ms")
            if ri is None:
                cells.append("-")
                continue
            cells.append("%.1f (%s), %.1f (%s), %s" % (ri, pct(ri, ai), rp or 0, pct(rp, ap), r.get("plan", "-")))
            if ap and rp:
                worst[i] = max(worst[i], rp / ap - 1)
        L.append("| %s | %s |" % (case, " | ".join(cells)))
    L.append("| worst predicted | - | " + " | ".join("%+.1f%%" % (100 * w) for w in worst) + " |")
    return L


TORCH = ["threshold", "range", "range+example", "first", "range+example+hold", "first+hold"]


def torch_table(results):
    """Rows per model of the binding's runs, or [] when there are none."""
    L = []
    files = read_csvs(os.path.join(results, "first-plan-torch-*.csv"))
    for _, rows in files:
        rows = by_config(rows)
        ref = rows.get("threshold", {})
        settled = num(ref, "steady_ms")
        for c in TORCH:
            r = rows.get(c)
            if r is None:
                continue
            f, w, st = num(r, "first_n_s"), num(r, "run_s"), num(r, "steady_ms")
            L.append("| %s | %s | %.2f s (%s) | %.2f s (%s) | %.1f ms (%s) |" % (
                r["model"], c, f, pct(f, num(ref, "first_n_s")) if c != "threshold" else "-",
                w, pct(w, num(ref, "run_s")) if c != "threshold" else "-",
                st, pct(st, settled) if c.endswith("+hold") else "-"))
    if not L:
        return []
    first = next(iter(by_config(files[0][1]).values()))
    return ["| model | start | first %s iterations | whole run (%s) | steady state (last %s) |" % (
        first["first_n"], first["run_iters"], first["tail"]), "|---|---|---|---|---|"] + L


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", required=True)
    ap.add_argument("--doc", help="replace the generated section of this file (docs/PERFORMANCE.md)")
    ap.add_argument("--command", default="bench/first-plan.sh")
    ap.add_argument("--torch-command", help="the torch-first.sh command behind the binding's rows (default: "
                    "the one bench/results/first-plan-torch.meta records, which torch-first.sh writes)")
    a = ap.parse_args()
    if a.torch_command is None:
        a.torch_command = (read_meta(os.path.join(a.results, "first-plan-torch.meta")) or [""])[0].strip() \
            or "bench/torch-first.sh"
    train, close = cases(a.results, "train"), cases(a.results, "close")
    torch_rows = torch_table(a.results)
    if not train and not close and not torch_rows:
        sys.exit("first-plan-report.py: no bench/results/first-plan-*.csv: run bench/first-plan.sh first")
    meta = ["- " + line for line in read_meta(os.path.join(a.results, "first-plan.meta"))]
    L = [BEGIN, "## First plan without a profile (DEAR_FIRST_PLAN)", "",
         "Generated by `%s` (as root) from `bench/results/first-plan-*.csv`; do not edit by hand. "
         "dear-bench on the emulated cluster, each e2e-matrix model scaled as its balanced case (compute about "
         "equal to the communication of its gradients), `dear:auto` started on the threshold plan as before "
         "(`threshold`), on the plan made at commit from the model's structure and the calibrated cost model "
         "across five compute/communication ratios 1/4..4 (`range`, the default), and on that plan made again with "
         "the first iteration's measured times (`first`); each with the model's FLOPs per layer "
         "(`fusion/profiles/*.model` through `dear_set_layer_cost`, what the PyTorch binding gives from module "
         "shapes) or with parameter bytes only (`bytes only`, no hint)." % a.command, ""] + meta + [""]
    if train:
        t1, n = train_table(train, "first_n_s", "first_n")
        t2, _ = train_table(train, "run_s", "run_iters")
        runs = train[0][1].get(TRAIN[0], {}).get("run_iters", "?")
        L += ["### Time to train", "",
              "From dear_init (calibration, cached after the first run, and planning included) to the end of "
              "iteration %s, slowest rank, median over the rounds (the configurations take turns):" % n, ""] + t1 + [
              "", "The whole run, %s iterations (past the warm-up, the online plan and auto's check):" % runs, ""] + t2 + [""]
    if close:
        L += ["### The first plan against the plan from the measured profile", "",
              "Steady-state iteration (median of the slowest rank over the measured iterations) and the simulator's "
              "prediction for the plan that ran (the runtime's calibrated cost model), with the first plan held all "
              "run long (`+hold`) against `dear:auto` settled on the plan from the measured profile; in brackets "
              "the difference to it. The goal: within 5%.", ""] + close_table(close) + [""]
    if torch_rows:
        L += ["### Through the PyTorch binding", "",
              "Generated by `%s` (as root, from the build directory): bench/torch-first.py, the models, batches "
              "and link rates of the PyTorch section below (communication about equal to the compute), one rank "
              "per host, dear with `auto`, the starts taking turns round after round; each figure the slowest "
              "rank's, median over the rounds. Time to train from `dear.wrap` (calibration and the first plan "
              "included); the steady state is the mean of the run's last iterations, for `+hold` on the first "
              "plan, otherwise on the plan from the measured profile (after auto's check). The binding's hints: "
              "each known module's FLOPs per position from its parameter shapes at wrap (`range`), or from "
              "the shapes a forward of the batch shows at wrap (`+example`, wrap's example=), and from the "
              "shapes of the first forward for the plan made again after it (`first`)." % a.torch_command, ""] + torch_rows + [""]
    L.append(END)
    text = "\n".join(L) + "\n"
    with open(os.path.join(a.results, "first-plan.md"), "w") as f:
        f.write(text)
    if a.doc:
        replace_section(a.doc, text, BEGIN, END, after="<!-- END gpt-sparse -->")
    print(text)


if __name__ == "__main__":
    main()
