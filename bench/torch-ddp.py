"""torch-ddp.py: dear (python/dear) against torch DistributedDataParallel in one mpirun job.

Every configuration trains the same model on the same synthetic batches (the shapes of the
real data: 3x32x32 images for resnet18, 64-character windows of text for the encoder); the
configurations take turns, round after round, so the machine's drift falls on all of them.
A round's figure for a configuration is its slowest rank's mean iteration time: the span from
its first measured iteration's start to its last one's end, over the iterations, with no
barrier or other MPI call in between (time to train, as a user sees it). Reported per
configuration: the median over the rounds, their range, the quartiles of all ranks' single
iterations, and the ratio to DDP's median. Run by bench/torch-ddp.sh on the emulated cluster;
alone: mpirun -np 4 python3 bench/torch-ddp.py.

Configurations: plain (no communication), ddp, ddp+fp16 and ddp+bf16 (DDP with its
fp16_compress_hook or bf16_compress_hook; torch 1.13 takes the latter only with CUDA and NCCL),
ddp+powersgdR (DDP with its PowerSGD hook at
matrix_approximation_rank R, error feedback and warm start on, compressing from the warm-up's
third iteration), zero (DDP with torch's ZeroRedundancyOptimizer: each rank steps the parameters
it owns and broadcasts them after the step), and
dear:SCHEDULE[:FUSION][+shard[+at_step]][+dense][+bf16|+fp16|+int8] (the
binding; +shard: wrap(shard=True), each rank steps its slice of every parameter, at backward's end,
and dear's all-gathers carry them; +at_step: wrap(shard='at_step'), the slices stepped at
opt.step(); +dense: wrap(sparse="off"), the embedding's gradient sent dense; +bf16, +fp16, +int8:
wrap(compress=...)). Models: resnet18, a transformer encoder, and wordlm (an 18000-word LSTM
language model whose embedding the binding sends row-sparse). --opt picks SGD with momentum or AdamW; the
CSV also gives the largest rank's optimizer state in MB. --device cuda trains on the GPUs (each
measured span then ends with the GPU's work done; cuda/gpu-check.sh runs it so), --backend nccl
gives DDP NCCL's process group.

Why not the median of each iteration's slowest rank: without a barrier, dear's ranks leave an
iteration at times that jitter apart (their all-gathers run into the next forward pass), while
DDP's all-reduce ends every backward pass on all ranks together. The slowest of several
jittering spans is longer than their common period, so that statistic charged dear up to 10%
that no rank ever spent.
"""
import argparse
import csv
import os
import resource
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from mpi4py import MPI

import dear

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


class Encoder(nn.Module):
    """A character-level transformer encoder: 4 blocks, d_model 256, 4 heads, 64 positions; with
    causal, each position attends only to those before it (a language model's)."""

    def __init__(self, vocab=96, dim=256, heads=4, layers=4, seq=64, causal=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        block = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)
        mask = torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1) if causal else None
        self.register_buffer("mask", mask)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x) + self.pos, mask=self.mask))


class WordLM(nn.Module):
    """A word-level language model as PyTorch's examples have it: an embedding of 18000 words,
    a two-layer LSTM of 256, an output layer over the words (untied): the two word matrices are
    88% of the parameters, and a batch touches a few percent of the embedding's rows."""

    def __init__(self, vocab=18000, dim=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, num_layers=2, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        return self.head(self.rnn(self.embed(x))[0])


def make(name):
    torch.manual_seed(1)
    if name == "wordlm":
        return WordLM()
    if name == "resnet18":
        import torchvision
        return torchvision.models.resnet18(num_classes=10)
    return Encoder()


def batch(name, b, device):
    g = torch.Generator().manual_seed(100 + RANK)
    if name == "resnet18":
        x, y = torch.randn(b, 3, 32, 32, generator=g), torch.randint(0, 10, (b,), generator=g)
    elif name == "wordlm":   # 35-word windows of words drawn as text has them: Zipf(1) frequencies
        zipf = 1.0 / torch.arange(1, 18001, dtype=torch.float64)
        w = torch.multinomial(zipf, b * 36, replacement=True, generator=g).view(b, 36)
        x, y = w[:, :35].contiguous(), w[:, 1:].contiguous()
    else:
        x, y = torch.randint(0, 96, (b, 64), generator=g), torch.randint(0, 96, (b, 64), generator=g)
    return x.to(device), y.to(device)


def settle(device):
    """The device's queued work done: a time stamp then covers the GPU's work, not only its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def loss_fn(name, out, y):
    return F.cross_entropy(out if name == "resnet18" else out.reshape(-1, out.shape[-1]), y.reshape(-1))


def cpu_seconds():
    """User and system CPU time of this process so far: its compute, its communication threads
    (dear's progress thread, gloo's) and the kernel's work on its sockets."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def make_opt(kind, params, zero=False):
    """SGD with momentum or AdamW, or the same inside torch's ZeroRedundancyOptimizer."""
    cls, kw = (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}) if kind == "sgd" else \
        (torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.1})
    if zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(params, optimizer_class=cls, **kw)
    return cls(params, **kw)


def state_bytes(opt):
    """Bytes of this rank's optimizer state tensors (momenta, moments; a step count's scalar aside)."""
    inner = getattr(opt, "optim", opt)   # ZeroRedundancyOptimizer keeps its partition's optimizer there
    return sum(v.numel() * v.element_size() for st in inner.state.values() for v in st.values()
               if torch.is_tensor(v) and v.dim() > 0)


def warmup_of(config, a):
    """A configuration's warm-up: longer where auto's check runs (dear:SCHEDULE with FUSION auto)."""
    parts = config.split("+")[0].split(":")
    auto = parts[0] == "dear" and (len(parts) < 3 or parts[2] == "auto")
    return max(a.warmup, a.auto_warmup) if auto else a.warmup


def wrap_config(config, model, opt):
    """The model and optimizer as configuration config trains them ('plain', 'ddp', 'ddp+HOOK',
    'zero' or 'dear:SCHEDULE[:FUSION][+...]'): (net, opt). dear's configurations are closed with
    dear.close(net) after use."""
    if config == "plain":   # no communication at all: the binding's own cost at np 1
        net = model
    elif config in ("ddp", "zero") or config.startswith("ddp+"):
        hook = config[len("ddp+"):] if config.startswith("ddp+") else None
        # PowerSGD issues a bucket's second all-reduce from the first one's completion callback,
        # so with several buckets the ranks' gloo collectives interleave in different orders and
        # gloo aborts (torch 1.13): its DDP gets one bucket, its small first bucket too.
        psgd = hook is not None and hook.startswith("powersgd")
        first = dist._DEFAULT_FIRST_BUCKET_BYTES
        if psgd:
            dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 36
        net = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False,
                                                  bucket_cap_mb=1 << 16 if psgd else 25)
        dist._DEFAULT_FIRST_BUCKET_BYTES = first
        if hook in ("fp16", "bf16"):   # DDP's own 16-bit compression
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            net.register_comm_hook(None, getattr(default_hooks, hook + "_compress_hook"))
        elif hook is not None and hook.startswith("powersgd") and hook[len("powersgd"):].isdigit():
            # PowerSGD: vanilla all-reduces for its first iterations (start_powerSGD_iter, which
            # must exceed 1 with error feedback), then low-rank factors; all within the warm-up
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
            state = powerSGD_hook.PowerSGDState(process_group=None,
                                                matrix_approximation_rank=int(hook[len("powersgd"):]),
                                                start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)
            net.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        elif hook is not None:
            raise SystemExit("torch-ddp.py: unknown DDP configuration %s (accepted: ddp, ddp+fp16, ddp+bf16, "
                             "ddp+powersgdR with R a rank)" % config)
    else:
        base, *suffixes = config.split("+")
        unknown = [x for x in suffixes if x not in ("shard", "at_step", "dense", "bf16", "fp16", "int8")]
        if unknown:
            raise SystemExit("torch-ddp.py: unknown suffix '+%s' in %s" % (unknown[0], config))
        if "at_step" in suffixes and "shard" not in suffixes:
            raise SystemExit("torch-ddp.py: +at_step in %s without +shard: it says where sharded steps run" % config)
        shard = ("at_step" if "at_step" in suffixes else True) if "shard" in suffixes else False
        parts = base.split(":")
        os.environ["DEAR_SCHEDULE"] = parts[1]
        os.environ["DEAR_FUSION"] = parts[2] if len(parts) > 2 else "auto"
        comp = next((c for c in ("bf16", "fp16", "int8") if c in suffixes), None)
        net, opt = dear.wrap(model, opt, shard=shard, compress=comp,
                             sparse="off" if "dense" in suffixes else None)
    return net, opt


def run(name, config, iters, warmup, b, opt_kind="sgd", device=torch.device("cpu")):
    """One round of a configuration ('plain', 'ddp', 'zero' or 'dear:SCHEDULE[:FUSION][+shard]'): the
    slowest rank's mean iteration time (s), every rank's single iteration times, the CPU seconds
    (user + system, all threads of this process) per measured iteration, averaged over the ranks,
    and the largest rank's optimizer state in bytes."""
    model = make(name).to(device)
    opt = make_opt(opt_kind, model.parameters(), zero=config == "zero")
    net, opt = wrap_config(config, model, opt)
    x, y = batch(name, b, device)
    # An iteration's time is the span from its start to the next one's on each rank, with no
    # barrier or MPI call in between: in a real loop nothing else shares the connections with
    # dear's all-gathers, which run into the next forward pass. The stamps go out after the run.
    stamps = []
    COMM.Barrier()
    for it in range(warmup + iters):
        if it == warmup:
            settle(device)
            cpu0 = cpu_seconds()
        if it >= warmup:
            stamps.append(time.perf_counter())
        loss_fn(name, net(x), y).backward()
        opt.step()
        opt.zero_grad()
    settle(device)
    stamps.append(time.perf_counter())
    cpu = (cpu_seconds() - cpu0) / iters
    spans = [b - a for a, b in zip(stamps, stamps[1:])]
    slowest = COMM.allreduce((stamps[-1] - stamps[0]) / iters, op=MPI.MAX)
    spans = [s for rank in COMM.allgather(spans) for s in rank]
    state = COMM.allreduce(state_bytes(opt), op=MPI.MAX)
    if config.startswith("dear:"):
        dear.close(net)
    return slowest, spans, COMM.allreduce(cpu) / SIZE, state


def init_dist(backend="gloo"):
    """torch.distributed's process group over the MPI job's ranks (rank 0's host and a free port)."""
    host = socket.gethostbyname(socket.gethostname())
    port = None
    if RANK == 0:
        s = socket.socket()
        s.bind((host, 0))
        port = s.getsockname()[1]
        s.close()
    host, port = COMM.bcast((host, port), root=0)
    dist.init_process_group(backend, init_method="tcp://%s:%d" % (host, port), rank=RANK, world_size=SIZE)


def write_csv(path, rows):
    """rows (dicts with the same keys) as CSV with a header line."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["resnet18", "encoder", "wordlm"], required=True)
    ap.add_argument("--configs", default="ddp;dear:wfbp:threshold;dear:dear:threshold;dear:dear:auto",
                    help="';'-separated: ddp, ddp+fp16, ddp+bf16, ddp+powersgdR (DDP's hooks), zero (DDP + "
                         "ZeroRedundancyOptimizer), dear:SCHEDULE[:FUSION][+shard][+bf16|+fp16|+int8] "
                         "(DEAR_SCHEDULE, DEAR_FUSION; FUSION defaults to auto; +shard: wrap(shard=True), "
                         "+shard+at_step: wrap(shard='at_step')), plain "
                         "(no communication)")
    ap.add_argument("--opt", choices=["sgd", "adamw"], default="sgd", help="SGD with momentum, or AdamW")
    ap.add_argument("--iters", type=int, default=6, help="measured iterations per configuration per round")
    ap.add_argument("--warmup", type=int, default=20,
                    help="iterations before measuring, configurations without auto's check")
    ap.add_argument("--auto-warmup", type=int, default=40,
                    help="iterations before measuring under DEAR_FUSION=auto: dear plans after DEAR_WARMUP_ITERS "
                         "(5), then auto's check times up to DEAR_VERIFY_TRIES (3) plans, each in blocks of "
                         "DEAR_VERIFY_ITERS (4) with a settling iteration after each switch (38 in all at the "
                         "defaults); measured earlier, auto's figure would include its own trials, as "
                         "dear-bench's auto warm-up of 40 avoids")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8, help="per rank")
    ap.add_argument("--csv", help="one row per configuration (rank 0)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the model trains (cuda: GPU rank modulo the GPUs; cuda/gpu-check.sh)")
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo", help="DDP's process group")
    a = ap.parse_args()
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if a.device == "cuda":
        device = torch.device("cuda", RANK % torch.cuda.device_count())
        torch.cuda.set_device(device)
    init_dist(a.backend)
    configs = a.configs.split(";")
    rounds = {c: [] for c in configs}
    spans = {c: [] for c in configs}
    cpus = {c: [] for c in configs}
    states = {}
    for r in range(a.rounds):
        order = configs if r % 2 == 0 else configs[::-1]
        for c in order:
            t, s, cpu, states[c] = run(a.model, c, a.iters, warmup_of(c, a), a.batch, a.opt, device)
            rounds[c].append(t)
            spans[c] += s
            cpus[c].append(cpu)
            if RANK == 0:
                print("round %d %s: %.1f ms per iteration (slowest rank)" % (r + 1, c, 1e3 * t), flush=True)
    dist.destroy_process_group()
    if RANK == 0:
        nparams = sum(p.numel() for p in make(a.model).parameters())
        ref = "ddp" if "ddp" in rounds else "plain" if "plain" in rounds else None
        base = statistics.median(rounds[ref]) if ref else None
        rows = []
        for c in configs:
            m = statistics.median(rounds[c])
            q = statistics.quantiles(spans[c], n=4)
            rows.append({"model": a.model, "torch": torch.__version__, "np": SIZE, "config": c, "params": nparams,
                         "batch": a.batch, "warmup": warmup_of(c, a), "rounds": len(rounds[c]), "iters": a.iters,
                         "median_ms": "%.2f" % (1e3 * m),
                         "min_ms": "%.2f" % (1e3 * min(rounds[c])), "max_ms": "%.2f" % (1e3 * max(rounds[c])),
                         "q1_ms": "%.2f" % (1e3 * q[0]), "q3_ms": "%.2f" % (1e3 * q[2]),
                         "baseline": ref or "", "speedup": "%.3f" % (base / m) if base else "",
                         "cpu_ms": "%.1f" % (1e3 * statistics.median(cpus[c])), "opt": a.opt,
                         "state_mb": "%.2f" % (states[c] / 1e6), "device": a.device,
                         "backend": a.backend})
            print("%-10s %-20s median %8.1f ms  cpu/rank %8.1f ms  %s" % (a.model, c, 1e3 * m, 1e3 * statistics.median(cpus[c]),
                                                       ("%.3fx %s" % (base / m, ref)) if base else ""), flush=True)
        if a.csv:
            write_csv(a.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
