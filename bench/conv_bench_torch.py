#!/usr/bin/env python3
"""PyTorch peer of bench/conv_bench.cpp: Conv2d forward + backward (weight, bias and input gradients) at the MNIST
CNN's shapes, batch 64, printing the same RESULT lines. Run with Debian's torch:

    /usr/bin/python3 bench/conv_bench_torch.py --threads 1
"""
import argparse
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    for name, cin, cout, size in (("conv1_1x28x28_to_32", 1, 32, 28), ("conv2_32x26x26_to_64", 32, 64, 26)):
        x = torch.randn(args.batch, cin, size, size, requires_grad=True)
        w = (torch.randn(cout, cin, 3, 3) * 0.1).requires_grad_(True)
        b = torch.zeros(cout, requires_grad=True)
        out = size - 2
        dy = torch.randn(args.batch, cout, out, out)
        flops = 2.0 * args.batch * cout * out * out * cin * 9

        def forward():
            with torch.no_grad():
                F.conv2d(x, w, b)

        def forward_backward():
            y = F.conv2d(x, w, b)
            x.grad = w.grad = b.grad = None
            y.backward(dy)

        def timed(body):
            body()
            reps, start = 0, time.perf_counter()
            while time.perf_counter() - start < args.seconds or reps < 3:
                body()
                reps += 1
            return (time.perf_counter() - start) / reps

        tf, tfb = timed(forward), timed(forward_backward)
        print(f"RESULT bench=conv impl=torch-{torch.__version__} shape={name} batch={args.batch} threads={args.threads} "
              f"fwd_ms={tf * 1e3:.3f} fwd_bwd_ms={tfb * 1e3:.3f} fwd_gflops={flops / tf * 1e-9:.2f} "
              f"fwd_bwd_gflops={3 * flops / tfb * 1e-9:.2f}")


if __name__ == "__main__":
    main()
