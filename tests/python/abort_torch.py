"""One rank fails while the others train: run by tests/python/torch.sh at np 2, which requires the
whole job to end within seconds, not after DEAR_STALL_ABORT_S, with the original error printed.

    abort_torch.py raise    rank 1 raises an uncaught ValueError in its forward pass, iteration 3
    abort_torch.py sigint   rank 1 gets SIGINT in its forward pass, iteration 3
"""
import os
import signal
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import dear
from mpi4py import MPI

RANK = MPI.COMM_WORLD.Get_rank()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)
        self.it = 0

    def forward(self, x):
        if RANK == 1 and self.it == 3:
            if sys.argv[1] == "raise":
                raise ValueError("deliberate failure on rank 1")
            os.kill(os.getpid(), signal.SIGINT)
        return self.fc2(F.relu(self.fc1(x)))


def main():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = dear.wrap(model, opt)
    g = torch.Generator().manual_seed(RANK)
    for it in range(1000):   # rank 0 would train for long after rank 1 stopped
        model.it = it
        x = torch.randn(8, 16, generator=g)
        F.cross_entropy(model(x), x[:, :4].argmax(1)).backward()
        opt.step()
        opt.zero_grad()
    dear.close(model)
    print("rank %d: finished: the failure did not end the job" % RANK, flush=True)


if __name__ == "__main__":
    main()
