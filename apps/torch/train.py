"""train.py: dear-cnn's training in PyTorch, through the dear binding.

    mpirun -np 4 --oversubscribe python3 apps/torch/train.py [--epochs 5]

The same model (conv 5x5 1->16, pool, conv 5x5 16->32, pool, fc 512->128, fc 128->10), data
(Fashion-MNIST from Debian's dataset-fashion-mnist, pixels normalised with the training set's
mean and deviation), global batch 64 split over the ranks, SGD with momentum 0.9 and weight
decay 5e-4, peak learning rate 0.06 with a 200-iteration linear warm-up and cosine decay, as
apps/cnn/dear-cnn; so it should reach dear-cnn's test accuracy (about 91% after 5 epochs).
The learning rate is set per iteration by a LambdaLR scheduler; dear applies each gradient with
the rate opt.step() saw, even where the step runs in the next forward. --shard: sharded
updates (dear.wrap(shard=True)), each rank stepping and keeping the momentum of 1/P of every
parameter. From the build tree: PYTHONPATH=python.
"""
import argparse
import gzip
import math
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import dear
from mpi4py import MPI

MEAN, STD = 0.2860, 0.3530


def idx(path, magic):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if struct.unpack(">I", data[:4])[0] != magic:
        sys.exit("train.py: %s is not an IDX file" % path)
    dims = struct.unpack(">%dI" % (magic & 0xff), data[4:4 + 4 * (magic & 0xff)])
    return torch.frombuffer(bytearray(data[4 + 4 * len(dims):]), dtype=torch.uint8).reshape(dims)


def load(d, prefix):
    def find(name):
        for p in (os.path.join(d, name + ".gz"), os.path.join(d, name)):
            if os.path.exists(p):
                return p
        sys.exit("train.py: no %s in %s (apt-get install dataset-fashion-mnist, or --data DIR)" % (name, d))
    x = idx(find(prefix + "-images-idx3-ubyte"), 0x803).float().div_(255).sub_(MEAN).div_(STD).unsqueeze(1)
    return x, idx(find(prefix + "-labels-idx1-ubyte"), 0x801).long()


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(512, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--iters", type=int, default=0, help="stop after this many iterations (0: --epochs)")
    ap.add_argument("--batch", type=int, default=64, help="global batch, split over the ranks")
    ap.add_argument("--lr", type=float, default=0.06)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--shard", action="store_true", help="sharded updates: 1/P of the optimizer's work and state")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if a.batch % size:
        sys.exit("train.py: --batch %d does not divide over %d ranks" % (a.batch, size))
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    xtr, ytr = load(a.data, "train")
    xte, yte = load(a.data, "t10k")
    model = CNN()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4)
    model, opt = dear.wrap(model, opt, shard=a.shard)
    per_epoch = len(xtr) // a.batch
    total = a.iters or a.epochs * per_epoch

    def rate(i):   # a multiplier of --lr: linear warm-up, then cosine decay to 0
        if i < a.warmup:
            return (i + 1) / a.warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (i - a.warmup) / max(1, total - a.warmup))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, rate)
    local = a.batch // size
    t0, it = time.time(), 0
    g = torch.Generator().manual_seed(a.seed)
    while it < total:
        perm = torch.randperm(len(xtr), generator=g)
        for b in range(per_epoch):
            if it == total:
                break
            idx_ = perm[b * a.batch + rank * local:b * a.batch + (rank + 1) * local]
            loss = F.cross_entropy(model(xtr[idx_]), ytr[idx_])
            loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            it += 1
            if rank == 0 and a.log_every and it % a.log_every == 0:
                print("iter %d  loss %.4f  lr %.4f  %.1f s" % (it, loss.item(), a.lr * rate(it - 1), time.time() - t0),
                      flush=True)
    dear.flush(model)
    train_s = time.time() - t0
    model.eval()
    with torch.no_grad():
        shard = slice(rank * len(xte) // size, (rank + 1) * len(xte) // size)
        correct = (model(xte[shard]).argmax(1) == yte[shard]).sum().item()
    correct = comm.allreduce(correct, op=MPI.SUM)
    dear.close(model)
    if rank == 0:
        print("test accuracy %.2f%% after %d iterations (%d ranks, schedule %s%s), %.1f s of training"
              % (100.0 * correct / len(xte), total, size, os.environ.get("DEAR_SCHEDULE", "dear"),
                 ", sharded" if a.shard else "", train_s), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
