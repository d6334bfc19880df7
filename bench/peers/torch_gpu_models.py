#!/usr/bin/env python3
"""PyTorch on the GPU: the peer of bench/cuda/models_gpu.cu.

The ladder's CNN and LSTM workloads, and the LSTM's GRU twin, as a PyTorch training loop on the GPU (forward, cross-entropy, backward, Adam
lr 1e-3, loss.item() every step), batch 64, FP32 without TF32, 8 random batches (uniform in [-1, 1)) resident on the
device and cycled, as models_gpu does. Each figure is the median of 5 repetitions of --steps steps, after 10 warm-up
steps (cuDNN's algorithm choice, the caching allocator).
  mnist_cnn  Conv2d(1, 32, 3) - ReLU - Conv2d(32, 64, 3) - ReLU - MaxPool2d(2) - Flatten - Linear(9216, 128) - ReLU -
             Linear(128, 10)
  lstm       LSTM(28, 128, batch_first) over 28 x 28 images, the last step's hidden state into Linear(128, 10)
  gru        the same with GRU(28, 128, batch_first)

  torch_gpu_models.py [--workload mnist_cnn|lstm|gru|all] [--steps 50]
Prints SKIPPED and exits 0 when torch or CUDA is missing.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--workload", default="all", choices=["all", "mnist_cnn", "lstm", "gru"])
p.add_argument("--steps", type=int, default=50)
args = p.parse_args()

torch = C.torch_on_gpu()
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
DEVICE = torch.device("cuda")
BATCH, BATCHES, REPS = 64, 8, 5


class LastStep(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(28, 128, batch_first=True)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def build(workload):
    if workload == "mnist_cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Linear(128, 10)), (1, 28, 28)
    return LastStep(nn.LSTM if workload == "lstm" else nn.GRU), (28, 28)


def run(workload):
    torch.manual_seed(1)
    model, sample = build(workload)
    model = model.to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.rand((BATCHES, BATCH) + sample, device=DEVICE) * 2 - 1
    y = torch.randint(0, 10, (BATCHES, BATCH), device=DEVICE)

    def step(b):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[b % BATCHES]), y[b % BATCHES])
        loss.backward()
        opt.step()
        return loss.item()

    for b in range(10):
        step(b)
    times = []
    for r in range(REPS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for s in range(args.steps):
            step(10 + r * args.steps + s)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / args.steps * 1e6)
    times.sort()
    print("RESULT bench=models_gpu workload=%s system=pytorch_eager version=%s steps=%d step_us=%.1f min_us=%.1f "
          "max_us=%.1f" % (workload, torch.__version__.split("+")[0], args.steps, times[REPS // 2], times[0],
                           times[-1]), flush=True)


print("torch_gpu_models on %s, PyTorch %s" % (torch.cuda.get_device_name(0), torch.__version__), flush=True)
for w in (["mnist_cnn", "lstm", "gru"] if args.workload == "all" else [args.workload]):
    run(w)
