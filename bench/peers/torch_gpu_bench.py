#!/usr/bin/env python3
"""PyTorch on the GPU: the peer of bench/cuda/mnist_gpu.cu.

The MNIST MLP (Flatten - Linear(784, 128) - ReLU - Linear(128, 10), cross-entropy, Adam lr 1e-3, batch 64, one epoch
of 938 steps, the last of 32) with the training set uploaded once and resident on the GPU, the epoch's order applied
once on the device before timing (batches are then slices, no copies), pixels scaled to [0, 1] and normalised with
MNIST's mean and deviation as kiln's bench does. Modes, named as mnist_gpu's:
  gpu_eager    eager, loss.item() every step (the host waits for the GPU once per step)
  gpu_async    eager, losses kept on the device until the end of the epoch
  gpu_compile  torch.compile(model), losses kept on the device
  gpu_graph    the whole step (forward, loss, backward, Adam(capturable=True)) captured with torch.cuda.graph and
               replayed; each step copies its batch into the graph's static inputs; the last batch runs eagerly
Every mode first runs a few warm-up steps (cuBLAS handles, compilation, graph capture) and then resets the weights
and Adam's state to the initial ones, so the timed epoch starts from the same point in every mode. Initial weights
and the data order come from common.py's deterministic streams (as the CPU peers'), not from kiln's generator, so
losses match kiln's only in their trend.

  torch_gpu_bench.py [--data DIR] [--threads N] [--system gpu_eager ...]
Prints SKIPPED and exits 0 when torch or CUDA is missing.
"""
import argparse
import gzip
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

MODES = ["gpu_eager", "gpu_async", "gpu_compile", "gpu_graph"]
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
BATCH = 64
WARMUP_STEPS = 5

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--system", choices=MODES, action="append", help="mode(s) to run (default: all)")
p.add_argument("--data", default=None, help="directory with the MNIST IDX .gz files")
p.add_argument("--threads", type=int, default=1)
args = p.parse_args()
C.set_thread_env(args.threads)

torch = C.torch_on_gpu()
import numpy as np  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)
VERSION = torch.__version__.split("+")[0]
DEVICE = torch.device("cuda")
now = time.perf_counter


def read_idx(path, magic):
    with gzip.open(path) as f:
        raw = f.read()
    assert int.from_bytes(raw[0:4], "big") == magic, path
    if magic == 2051:
        n, r, c = (int.from_bytes(raw[i:i + 4], "big") for i in range(4, 16, 4))
        return np.frombuffer(raw, np.uint8, n * r * c, 16).reshape(n, r * c)
    n = int.from_bytes(raw[4:8], "big")
    return np.frombuffer(raw, np.uint8, n, 8).astype(np.int64)


def normalised(images):
    x = torch.from_numpy(images).to(DEVICE).float().div_(255.0)
    return x.sub_(MNIST_MEAN).div_(MNIST_STD)


def build():
    sizes = C.layer_sizes("mnist_mlp")
    linears = [nn.Linear(sizes[k], sizes[k + 1]) for k in range(len(sizes) - 1)]
    model = nn.Sequential(nn.Flatten(), linears[0], nn.ReLU(), linears[1]).to(DEVICE)
    initial = [(torch.from_numpy(w).to(DEVICE), torch.from_numpy(b).to(DEVICE)) for w, b in C.init_params("mnist_mlp")]
    with torch.no_grad():
        for lin, (w, b) in zip(linears, initial):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
    return model, linears, initial


def reset(linears, initial, opt, capturable):
    """Initial weights and a fresh Adam, in place (a captured graph keeps pointing at the same tensors)."""
    with torch.no_grad():
        for lin, (w, b) in zip(linears, initial):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
            if not capturable:
                lin.weight.grad = lin.bias.grad = None
        if capturable:
            for state in opt.state.values():
                for value in state.values():
                    if torch.is_tensor(value):
                        value.zero_()
        else:
            opt.state.clear()


def run(mode, x, y, x_test, y_test):
    model, linears, initial = build()
    capturable = mode == "gpu_graph"
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=capturable)
    forward = torch.compile(model) if mode == "gpu_compile" else model
    n = x.shape[0]
    starts = list(range(0, n, BATCH))

    def step(xb, yb):
        opt.zero_grad(set_to_none=not capturable)
        loss = F.cross_entropy(forward(xb), yb)
        loss.backward()
        opt.step()
        return loss

    info = {}
    graph = None
    if capturable:
        static_x, static_y = x[:BATCH].clone(), y[:BATCH].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for s in starts[:WARMUP_STEPS]:
                static_x.copy_(x[s:s + BATCH])
                static_y.copy_(y[s:s + BATCH])
                step(static_x, static_y)
        torch.cuda.current_stream().wait_stream(side)
        t0 = now()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_loss = step(static_x, static_y)
        torch.cuda.synchronize()
        info["capture_s"] = now() - t0
    else:
        t0 = now()
        for s in starts[:WARMUP_STEPS]:
            step(x[s:s + BATCH], y[s:s + BATCH])
        torch.cuda.synchronize()
        info["warmup_s"] = now() - t0
    reset(linears, initial, opt, capturable)
    torch.cuda.synchronize()

    losses = []
    t0 = now()
    for s in starts:
        xb, yb = x[s:s + BATCH], y[s:s + BATCH]
        if graph is not None and xb.shape[0] == BATCH:
            static_x.copy_(xb)
            static_y.copy_(yb)
            graph.replay()
            losses.append(static_loss.detach().clone())
        else:
            loss = step(xb, yb)
            losses.append(loss.item() if mode == "gpu_eager" else loss.detach())
    torch.cuda.synchronize()
    epoch = now() - t0
    losses = [float(v) for v in losses]
    with torch.no_grad():
        accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
    return epoch, len(starts), accuracy, losses, info


def main():
    d = C.find_data(args.data)
    train_x = read_idx(os.path.join(d, "train-images-idx3-ubyte.gz"), 2051)
    train_y = read_idx(os.path.join(d, "train-labels-idx1-ubyte.gz"), 2049)
    test_x = read_idx(os.path.join(d, "t10k-images-idx3-ubyte.gz"), 2051)
    test_y = read_idx(os.path.join(d, "t10k-labels-idx1-ubyte.gz"), 2049)
    t0 = now()
    perm = torch.from_numpy(C.permutation(len(train_y))).to(DEVICE)
    x = normalised(train_x).index_select(0, perm).view(-1, 28, 28)
    y = torch.from_numpy(train_y).to(DEVICE).index_select(0, perm)
    x_test = normalised(test_x).view(-1, 28, 28)
    y_test = torch.from_numpy(test_y).to(DEVICE)
    torch.cuda.synchronize()
    C.info(system="pytorch", version=VERSION, device=torch.cuda.get_device_name().replace(" ", "_"),
           upload_s="%.3f" % (now() - t0))
    for mode in args.system or MODES:
        if mode == "gpu_compile" and not hasattr(torch, "compile"):
            print("RESULT bench=mnist_gpu system=pytorch mode=%s version=%s status=unavailable reason=no_torch.compile"
                  % (mode, VERSION), flush=True)
            continue
        try:
            epoch, steps, accuracy, losses, info = run(mode, x, y, x_test, y_test)
        except Exception as e:  # torch.compile needs a compiler toolchain (Triton) that may be missing
            print("RESULT bench=mnist_gpu system=pytorch mode=%s version=%s status=unavailable reason=%s"
                  % (mode, VERSION, C.reason_of(e)), flush=True)
            continue
        C.info(system="pytorch", mode=mode, **{k: "%.3f" % v for k, v in info.items()})
        print("RESULT bench=mnist_gpu system=pytorch mode=%s version=%s threads=%d steps=%d step_us=%.2f epoch_s=%.4f "
              "test_acc=%.4f final_loss=%.6g status=ok" % (mode, VERSION, args.threads, steps, epoch / steps * 1e6,
                                                           epoch, accuracy, losses[-1]), flush=True)


if __name__ == "__main__":
    main()
