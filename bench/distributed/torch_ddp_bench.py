#!/usr/bin/env python3
"""PyTorch's DistributedDataParallel on the gloo backend, on ddp_bench's workloads (Adam 1e-3, cross-entropy, the
global batch split across the ranks, one thread a rank, random batches drawn once and kept in memory):

    wide_mlp   784 -> 1024 ReLU -> 1024 ReLU -> 10 on [784] inputs, batch 256;
    mnist_mlp  Flatten, 784 -> 128 ReLU -> 10 on [28, 28] inputs, batch 64 (the ladder's MNIST MLP);
    resnet     bench/peers/torch_bench.py's resnet() on [1, 28, 28] inputs, batch 64 (the ladder's ResNet).

Three modes take turns, --block steps each, for --rounds rounds, as ddp_bench's do:

    single   rank 0 alone on the whole batch (the other ranks wait at a barrier): one process's step;
    local    every rank on its share, without communication;
    ddp      DistributedDataParallel (25 MB buckets, as its default), each rank on its share; BatchNorm's running
             statistics are rank 0's at the start and each rank's own afterwards, as kiln's data-parallel models
             keep them (no broadcast before each forward).

A mode's figure is the median of its steps, in ms. Usage (starts its own ranks on this machine):

    bench/peers/.venv/bin/python bench/distributed/torch_ddp_bench.py [--workload wide_mlp|mnist_mlp|resnet]
        [--ranks 2] [--rounds 15] [--block 4]

Prints one RESULT line a mode, as ddp_bench does."""
import argparse, inspect, os, statistics, sys, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

STEPS = 16
PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers")


def peer_resnet():
    """torch_bench.resnet(): the network bench/peers times on the resnet workload. torch_bench reads its command line
    when imported, so it is imported under one that names that workload on one thread."""
    sys.path.insert(0, PEERS)
    argv = sys.argv
    sys.argv = [argv[0], "--workload", "resnet", "--threads", "1"]
    try:
        import torch_bench
    finally:
        sys.argv = argv
    return torch_bench.resnet()


# Buffers rank 0's at the start and each rank's own afterwards, as kiln's data-parallel models keep them: PyTorch
# 2.15 names this forward_sync_buffers=False, and deprecates the broadcast_buffers=False of the versions before it.
RANK_OWN_BUFFERS = ({"forward_sync_buffers": False}
                    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                    else {"broadcast_buffers": False})

# Each workload: its global batch, the shape of one sample, and the network's builder.
WORKLOADS = {
    "wide_mlp": (256, (784,), lambda: nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                                                    nn.Linear(1024, 10))),
    "mnist_mlp": (64, (28, 28), lambda: nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(),
                                                      nn.Linear(128, 10))),
    "resnet": (64, (1, 28, 28), peer_resnet),
}


def run(rank, workload, ranks, rounds, block, port):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    batch, sample, model = WORKLOADS[workload]
    generator = torch.Generator().manual_seed(1)
    xs = [torch.randn(batch, *sample, generator=generator) for _ in range(STEPS)]
    ys = [torch.randint(0, 10, (batch,), generator=generator) for _ in range(STEPS)]
    share = batch // ranks
    mine = [(x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]) for x, y in zip(xs, ys)]
    torch.manual_seed(0)
    single, local, wrapped = model(), model(), model()
    ddp = DistributedDataParallel(wrapped, **RANK_OWN_BUFFERS)
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
            print(f"RESULT bench=torch_ddp workload={workload} mode={name} ranks={ranks} step_ms={ms:.3f} "
                  f"torch={torch.__version__}", flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="wide_mlp")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--port", type=int, default=29511)
    a = parser.parse_args()
    batch = WORKLOADS[a.workload][0]
    if batch % a.ranks:
        parser.error(f"--ranks: expected a number that divides the batch of {batch}, found {a.ranks}")
    mp.spawn(run, args=(a.workload, a.ranks, a.rounds, a.block, a.port), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
