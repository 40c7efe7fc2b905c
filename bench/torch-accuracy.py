"""torch-accuracy.py: what compressed gradients cost in accuracy through the binding, against DDP's
own compression hooks, in one mpirun job (bench/torch-accuracy.sh runs it).

Two learnable tasks with their own held-out data, so that a configuration's end state can be
scored (torch-ddp.py's batches are random, for timing only):
  lm     next-symbol prediction on text from a fixed order-2 Markov chain over 32 symbols, by a
         causal transformer (2 blocks, d_model 128, 4 heads, 32 positions), AdamW; scored by the
         held-out cross-entropy (nats per symbol) beside the chain's own, the floor no model beats;
  mlp    10-class labels of 64-dimensional Gaussian inputs from a fixed random teacher network, by
         an MLP (64-256-256-10), SGD with momentum; scored by held-out accuracy.
Every configuration trains the same model from the same initial weights on the same batches
(each rank its own stream, seeded by seed and rank), for the same steps; only the gradient
exchange differs. Configurations as torch-ddp.py names them (ddp, ddp+fp16, ddp+powersgdR,
dear:SCHEDULE[:FUSION][+bf16|+fp16|+int8]). A seed changes the initial weights and the batches,
not the task. Rank 0 writes one CSV row per task, configuration and seed.
"""
import argparse
import importlib.util
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

_spec = importlib.util.spec_from_file_location("torch_ddp", os.path.join(os.path.dirname(__file__), "torch-ddp.py"))
tdp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tdp)

COMM, RANK, SIZE = tdp.COMM, tdp.RANK, tdp.SIZE
V, CTX = 32, 32          # lm: symbols, positions
DIN, CLASSES = 64, 10    # mlp: input dimension, classes


def mlp():
    return nn.Sequential(nn.Linear(DIN, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, CLASSES))


class Chain:
    """The lm task: P[a * V + b] is the distribution of the symbol after a, b (a few likely each)."""

    def __init__(self):
        g = torch.Generator().manual_seed(7)
        self.p = F.softmax(3.0 * torch.randn(V * V, V, generator=g), dim=1)

    def sample(self, n, g):
        """n windows of CTX + 1 symbols, each from a random start state run 8 steps in."""
        s = torch.randint(0, V, (n, 2), generator=g)
        out = []
        for t in range(CTX + 9):
            nxt = torch.multinomial(self.p[s[:, 0] * V + s[:, 1]], 1, generator=g).squeeze(1)
            s = torch.stack([s[:, 1], nxt], 1)
            if t >= 8:
                out.append(nxt)
        return torch.stack(out, 1)

    def floor(self, w):
        """The chain's own cross-entropy on windows w (positions 2 on: their two predecessors known)."""
        ctx = w[:, :-2] * V + w[:, 1:-1]
        return float(-torch.log(self.p[ctx.reshape(-1), w[:, 2:].reshape(-1)]).mean())


class Teacher:
    """The mlp task: labels are the argmax of a fixed random two-layer network of the input."""

    def __init__(self):
        g = torch.Generator().manual_seed(11)
        self.w1, self.w2 = torch.randn(DIN, 64, generator=g), torch.randn(64, CLASSES, generator=g)

    def sample(self, n, g):
        x = torch.randn(n, DIN, generator=g)
        return x, (torch.tanh(x @ self.w1) @ self.w2).argmax(1)


def lm_loss(model, w):
    """Cross-entropy of predicting w[:, 1:] from w[:, :-1], positions 2 on (as Chain.floor)."""
    out = model(w[:, :-1])
    return F.cross_entropy(out[:, 1:].reshape(-1, V), w[:, 2:].reshape(-1))


def train(task, config, seed, steps, batch, data):
    torch.manual_seed(1000 + seed)
    model = tdp.Encoder(vocab=V, dim=128, heads=4, layers=2, seq=CTX, causal=True) if task == "lm" else mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3) if task == "lm" else \
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    net, opt = tdp.wrap_config(config, model, opt)
    g = torch.Generator().manual_seed(100000 * seed + RANK)
    for _ in range(steps):
        if task == "lm":
            loss = lm_loss(net, data.sample(batch, g))
        else:
            x, y = data.sample(batch, g)
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    if config.startswith("dear:"):
        tdp.dear.close(net)   # the all-gathers done: the parameters are the step's
    return model


def score(task, model, held):
    with torch.no_grad():
        if task == "lm":
            return float(lm_loss(model, held))
        x, y = held
        return float((model(x).argmax(1) == y).float().mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="lm mlp")
    ap.add_argument("--configs", default="ddp;ddp+fp16;ddp+powersgd1;ddp+powersgd4;dear:dear:auto;"
                                         "dear:dear:auto+bf16;dear:dear:auto+int8")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", default="lm=300,mlp=300", help="steps per task")
    ap.add_argument("--batch", default="lm=16,mlp=32", help="per rank, per task")
    ap.add_argument("--csv", help="rank 0 writes the rows here")
    a = ap.parse_args()
    steps = dict(kv.split("=") for kv in a.steps.split(","))
    batches = dict(kv.split("=") for kv in a.batch.split(","))
    torch.set_num_threads(1)
    tdp.init_dist("gloo")
    rows = []
    for task in a.tasks.split():
        data = Chain() if task == "lm" else Teacher()
        held = data.sample(2048, torch.Generator().manual_seed(99))
        floor = data.floor(held) if task == "lm" else 1.0
        for seed in range(1, a.seeds + 1):
            for config in a.configs.split(";"):
                model = train(task, config, seed, int(steps[task]), int(batches[task]), data)
                s = score(task, model, held)
                spread = COMM.allreduce(s, op=tdp.MPI.MAX) - COMM.allreduce(s, op=tdp.MPI.MIN)
                if RANK == 0:
                    print("%s seed %d %-24s %s %.4f (ranks apart by %.2g)" %
                          (task, seed, config, "loss" if task == "lm" else "accuracy", s, spread), flush=True)
                rows.append({"task": task, "config": config, "seed": seed, "np": SIZE, "steps": steps[task],
                             "batch": batches[task], "metric": "loss" if task == "lm" else "accuracy",
                             "value": "%.5f" % s, "floor": "%.5f" % floor, "rank_spread": "%.3g" % spread,
                             "torch": torch.__version__})
    tdp.dist.destroy_process_group()
    if RANK == 0 and a.csv:
        tdp.write_csv(a.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
