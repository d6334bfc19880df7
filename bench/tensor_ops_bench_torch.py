#!/usr/bin/env python3
"""PyTorch peer of bench/tensor_ops_bench.cpp: the same tensor ops, sizes, modes and timing, printing

    RESULT tensor_ops_torch op=<name> size=<shape> mode=<forward|forward_backward> us=<median of rounds>

forward: the op under torch.no_grad() (inputs require grad); forward_backward: the op, then torch.sum(y).backward()
into inputs whose .grad is set to None before each call (the time includes the sum and its backward). torch's
transpose is a view; transpose_contiguous adds the copy that kiln's transpose always makes. Run with Debian's torch:

    /usr/bin/python3 bench/tensor_ops_bench_torch.py --threads 1 [--seconds 0.5] [--filter substring]
"""
import argparse
import time

import torch


def median_us(seconds, body):
    """The median over rounds of us per call of body, filling about `seconds` (as the C++ bench's median_us)."""
    body()  # warm-up
    calibration, start = 0, time.perf_counter()
    while True:
        body()
        calibration += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds * 0.02:
            break
    per_call = elapsed / calibration
    rounds = 11
    calls = int(seconds / rounds / per_call)
    if calls < 1:
        calls = 1
        rounds = min(max(int(seconds / per_call), 3), 11)
    us = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            body()
        us.append((time.perf_counter() - t0) * 1e6 / calls)
    us.sort()
    return us[len(us) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--filter", default="", help='substring of "<op>/<size>"')
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    overhead = []

    def normal(*shape):
        return torch.randn(*shape).requires_grad_(True)

    def uniform(low, high, *shape):
        return (low + (high - low) * torch.rand(*shape)).requires_grad_(True)

    def run(op, size, inputs, f):
        if args.filter and args.filter not in f"{op}/{size}":
            return

        def forward():
            with torch.no_grad():
                f(*inputs)

        def forward_backward():
            for x in inputs:
                x.grad = None
            torch.sum(f(*inputs)).backward()

        fwd = median_us(args.seconds, forward)
        print(f"RESULT tensor_ops_torch op={op} size={size} mode=forward us={fwd:.3f}", flush=True)
        fwd_bwd = median_us(args.seconds, forward_backward)
        print(f"RESULT tensor_ops_torch op={op} size={size} mode=forward_backward us={fwd_bwd:.3f}", flush=True)
        if size in ("1x8", "1x1x8"):
            overhead.append((op, fwd, fwd_bwd))

    for n, f in ((1, 8), (64, 64), (256, 256), (1024, 1024)):
        sz = f"{n}x{f}"
        run("add_row", sz, (normal(n, f), normal(f)), torch.add)
        run("mul", sz, (normal(n, f), normal(n, f)), torch.mul)
        run("div", sz, (normal(n, f), uniform(1.0, 2.0, n, f)), torch.div)
        run("exp", sz, (normal(n, f),), torch.exp)
        run("sum_all", sz, (normal(n, f),), torch.sum)  # the loss itself
        run("sum_last", sz, (normal(n, f),), lambda x: torch.sum(x, -1))
        run("sum_dim0", sz, (normal(n, f),), lambda x: torch.sum(x, 0))
        run("amax_last", sz, (normal(n, f),), lambda x: torch.amax(x, -1))
        run("softmax_last", sz, (normal(n, f),), lambda x: torch.softmax(x, -1))
        run("transpose", sz, (normal(n, f),), lambda x: torch.transpose(x, 0, 1))
        run("transpose_contiguous", sz, (normal(n, f),), lambda x: torch.transpose(x, 0, 1).contiguous())
        run("cat_dim1", sz, (normal(n, f), normal(n, f)), lambda a, b: torch.cat((a, b), 1))
    for n, m, f in ((1, 1, 8), (16, 16, 16), (64, 64, 16), (128, 128, 64)):
        run("add_outer", f"{n}x{m}x{f}", (normal(n, 1, f), normal(1, m, f)), torch.add)
    for n in (8, 64, 256, 1024):
        run("matmul", f"{n}x{n}", (normal(n, n), normal(n, n)), torch.matmul)
    b, h, l, d = 8, 4, 128, 32
    sz = f"{b}x{h}x{l}x{d}"
    run("attn_matmul_transpose", sz, (normal(b, h, l, d), normal(b, h, l, d)),
        lambda q, k: torch.matmul(q, torch.transpose(k, -2, -1)))
    run("attn_einsum", sz, (normal(b, h, l, d), normal(b, h, l, d)),
        lambda q, k: torch.einsum("bhqd,bhkd->bhqk", q, k))

    if overhead:
        print(f"# per-op overhead at 1x8 (threads={args.threads}, torch {torch.__version__}), us per call:")
        for op, fwd, fwd_bwd in overhead:
            print(f"#   {op:<22} forward {fwd:8.3f}   forward_backward {fwd_bwd:8.3f}")
        for mode, k in (("forward", 1), ("forward_backward", 2)):
            print(f"OVERHEAD tensor_ops_torch size=1x8 ops={len(overhead)} mode={mode} "
                  f"us={sorted(o[k] for o in overhead)[len(overhead) // 2]:.3f}")


if __name__ == "__main__":
    main()
