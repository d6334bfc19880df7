#!/usr/bin/env python3
"""PyTorch peer of bench/lstm_bench.cpp: nn.LSTM forward and forward + backward at the same shapes and threads,
printing the same RESULT lines (impl=torch). Run with Debian's torch: /usr/bin/python3 bench/lstm_bench_torch.py

    lstm_bench_torch.py [--threads N] [--batch 64] [--seq 28] [--input 28] [--hidden 128] [--layers 1] [--iters 20]
"""
import argparse
import time

import torch


def time_ms(iters, body):
    body()
    body()
    t0 = time.perf_counter()
    for _ in range(iters):
        body()
    return (time.perf_counter() - t0) * 1000.0 / iters


def main():
    ap = argparse.ArgumentParser()
    for name, default in (("threads", 1), ("batch", 64), ("seq", 28), ("input", 28), ("hidden", 128), ("layers", 1),
                          ("iters", 20)):
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    for bidirectional in (False, True):
        lstm = torch.nn.LSTM(a.input, a.hidden, num_layers=a.layers, batch_first=True, bidirectional=bidirectional)
        x = torch.randn(a.batch, a.seq, a.input, requires_grad=True)
        dout = torch.full((a.batch, a.seq, a.hidden * (2 if bidirectional else 1)), 0.01)

        def forward():
            with torch.no_grad():
                lstm(x)

        def forward_backward():
            lstm.zero_grad()
            x.grad = None
            out, _ = lstm(x)
            out.backward(dout)

        fwd = time_ms(a.iters, forward)
        both = time_ms(a.iters, forward_backward)
        print(f"RESULT bench=lstm impl=torch bidirectional={int(bidirectional)} batch={a.batch} seq={a.seq} "
              f"input={a.input} hidden={a.hidden} layers={a.layers} threads={a.threads} fwd_ms={fwd:.3f} "
              f"fwd_bwd_ms={both:.3f} us_per_seq={both * 1000.0 / a.batch:.2f}")


if __name__ == "__main__":
    main()
