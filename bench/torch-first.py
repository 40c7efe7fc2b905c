"""torch-first.py: the first plan without a profile (DEAR_FIRST_PLAN) through the PyTorch binding.

The models and batches of bench/torch-ddp.py (torchvision's resnet18, a transformer encoder),
dear's schedule with DEAR_FUSION=auto, started each way: `threshold` (the threshold plan until
the measured profile), `range` (the plan from the model's structure at wrap, the default),
`first` (that plan made again after the first iteration, with the FLOPs its shapes gave), with
`+example` the plan at wrap knowing those FLOPs from a forward of the batch (wrap's example=),
and with `+hold` a first plan held all run long. The configurations take turns, round after round.
Per run: the time to train from dear.wrap (calibration, the first plan) to the end of iteration
--first-n and of the whole run, and the steady state (the mean iteration over the run's last
--tail iterations), each the slowest rank's. Run by bench/torch-first.sh on the emulated
cluster; alone: mpirun -np 4 python3 bench/torch-first.py --model encoder.
"""
import argparse
import importlib.util
import os
import statistics
import sys
import time

import torch
from mpi4py import MPI

import dear

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
_spec = importlib.util.spec_from_file_location("torch_ddp", os.path.join(os.path.dirname(__file__), "torch-ddp.py"))
tdp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tdp)


def run(name, config, iters, first_n, tail, b):
    """One run of config (MODE[+example][+hold]): seconds to the end of iteration first_n, to the
    end of the run, and the mean of its last tail iterations, each the slowest rank's."""
    mode, *extra = config.split("+")
    os.environ.update({"DEAR_SCHEDULE": "dear", "DEAR_FUSION": "auto", "DEAR_FIRST_PLAN": mode})
    if "hold" in extra:
        os.environ["DEAR_WARMUP_ITERS"] = "1000000"
    else:
        os.environ.pop("DEAR_WARMUP_ITERS", None)
    model = tdp.make(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = tdp.batch(name, b)
    COMM.Barrier()
    t0 = time.perf_counter()
    net, opt = dear.wrap(model, opt, example=x if "example" in extra else None)
    stamps = []
    for _ in range(iters):
        tdp.loss_fn(name, net(x), y).backward()
        opt.step()
        opt.zero_grad()
        stamps.append(time.perf_counter())
    dear.close(net)
    mine = (stamps[first_n - 1] - t0, stamps[-1] - t0, (stamps[-1] - stamps[-1 - tail]) / tail)
    return tuple(COMM.allreduce(v, op=MPI.MAX) for v in mine)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["resnet18", "encoder"], required=True)
    ap.add_argument("--configs", default="threshold;range;range+example;first;range+example+hold;first+hold",
                    help="';'-separated DEAR_FIRST_PLAN values, each optionally +example (dear.wrap's example=, "
                         "the batch) and +hold (the first plan all run long)")
    ap.add_argument("--iters", type=int, default=40, help="iterations per run")
    ap.add_argument("--first-n", type=int, default=30)
    ap.add_argument("--tail", type=int, default=10, help="the steady state: the run's last N iterations")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="per rank")
    ap.add_argument("--csv", help="one row per configuration (rank 0)")
    a = ap.parse_args()
    if not (1 <= a.first_n <= a.iters and 1 <= a.tail < a.iters):
        sys.exit("torch-first.py: want 1 <= --first-n <= --iters and 1 <= --tail < --iters")
    torch.set_num_threads(1)
    configs = a.configs.split(";")
    got = {c: [] for c in configs}
    for r in range(a.rounds):
        for c in (configs if r % 2 == 0 else configs[::-1]):
            t = run(a.model, c, a.iters, a.first_n, a.tail, a.batch)
            got[c].append(t)
            if RANK == 0:
                print("round %d %-12s first %d: %.2f s, run of %d: %.2f s, steady %.1f ms" %
                      (r + 1, c, a.first_n, t[0], a.iters, t[1], 1e3 * t[2]), flush=True)
    if RANK == 0:
        rows = []
        for c in configs:
            med = [statistics.median(t[k] for t in got[c]) for k in range(3)]
            rows.append({"model": a.model, "torch": torch.__version__, "np": SIZE, "config": c, "batch": a.batch,
                         "rounds": a.rounds, "first_n": a.first_n, "first_n_s": "%.3f" % med[0],
                         "run_iters": a.iters, "run_s": "%.3f" % med[1], "tail": a.tail,
                         "steady_ms": "%.2f" % (1e3 * med[2])})
            print("%-10s %-12s first %d %.2f s  run %.2f s  steady %.1f ms" % (a.model, c, a.first_n, med[0], med[1],
                                                                          1e3 * med[2]), flush=True)
        if a.csv:
            tdp.write_csv(a.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
