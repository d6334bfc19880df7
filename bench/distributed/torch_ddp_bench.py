#!/usr/bin/env python3
"""PyTorch's DistributedDataParallel on the gloo backend, on ddp_bench's workload: the wide MLP (784 -> 1024 ReLU ->
1024 ReLU -> 10, Adam 1e-3, cross-entropy), a batch of 256 split across the ranks, one thread a rank, the batches
drawn once and kept in memory. Three modes take turns, --block steps each, for --rounds rounds, as ddp_bench's do:

    single   rank 0 alone on the whole batch (the other ranks wait at a barrier): one process's step;
    local    every rank on its share, without communication;
    ddp      DistributedDataParallel (25 MB buckets, as its default), each rank on its share.

A mode's figure is the median of its steps, in ms. Usage (starts its own ranks on this machine):

    bench/peers/.venv/bin/python bench/distributed/torch_ddp_bench.py [--ranks 2] [--rounds 15] [--block 4]

Prints one RESULT line a mode, as ddp_bench does."""
import argparse, os, statistics, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

BATCH, STEPS = 256, 16


def model():
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def run(rank, ranks, rounds, block, port):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    generator = torch.Generator().manual_seed(1)
    xs = [torch.randn(BATCH, 784, generator=generator) for _ in range(STEPS)]
    ys = [torch.randint(0, 10, (BATCH,), generator=generator) for _ in range(STEPS)]
    share = BATCH // ranks
    mine = [(x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]) for x, y in zip(xs, ys)]
    torch.manual_seed(0)
    single, local, wrapped = model(), model(), model()
    ddp = DistributedDataParallel(wrapped)
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-3)
                  for name, m in (("single", single), ("local", local), ("ddp", ddp))}
    loss_fn = nn.CrossEntropyLoss()
    times = {"single": [], "local": [], "ddp": []}

    def step(name, net, x, y):
        opt = optimizers[name]
        opt.zero_grad(set_to_none=True)
        loss_fn(net(x), y).backward()
        opt.step()

    counter = 0
    for _ in range(rounds + 1):  # the first round warms up and is not counted
        for name in ("single", "local", "ddp"):
            for _ in range(block):
                dist.barrier()
                start = time.perf_counter()
                s = counter % STEPS
                if name == "single":
                    if rank == 0:
                        step(name, single, xs[s], ys[s])
                else:
                    step(name, local if name == "local" else ddp, *mine[s])
                elapsed = time.perf_counter() - start
                if name == "single":
                    dist.barrier()  # the other ranks wait for rank 0's step, outside its time
                times[name].append(elapsed)
                counter += 1
    if rank == 0:
        for name, values in times.items():
            ms = statistics.median(values[block * 1:]) * 1e3  # past the warm-up round's first block
            print(f"RESULT bench=torch_ddp mode={name} ranks={ranks} step_ms={ms:.3f} torch={torch.__version__}",
                  flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--port", type=int, default=29511)
    a = parser.parse_args()
    mp.spawn(run, args=(a.ranks, a.rounds, a.block, a.port), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
