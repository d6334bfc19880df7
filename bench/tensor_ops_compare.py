#!/usr/bin/env python3
"""Puts bench/tensor_ops_bench (kiln) beside bench/tensor_ops_bench_torch.py (PyTorch): one row per case and mode,
kiln us, torch us and kiln / torch (above 1: kiln is slower), with the cases where kiln is more than --flag times
slower marked. Either reads the two programs' outputs from files, or runs both (one after the other, the same flags):

    bench/tensor_ops_compare.py kiln.txt torch.txt
    bench/tensor_ops_compare.py --run [--bench build/bench/tensor_ops_bench] [--python /usr/bin/python3]
                                [--threads 1] [--seconds 0.5] [--filter substring] [--markdown]

With --run on one thread, both programs are pinned to CPU 0 with taskset when it is there (as bench/RESULTS.md's
one-thread runs are); --no-pin turns that off.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

LINE = re.compile(r"^(RESULT|OVERHEAD) (tensor_ops(?:_torch)?) (.*)$")


def parse(text):
    """{(op, size, mode): us} from RESULT lines, with the OVERHEAD lines as op 'overhead (median of ops)'."""
    out = {}
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue
        fields = dict(kv.split("=", 1) for kv in m.group(3).split())
        op = fields.get("op", f"overhead (median of {fields.get('ops', '?')} ops)")
        out[(op, fields["size"], fields["mode"])] = float(fields["us"])
    return out


def run_both(args):
    here = os.path.dirname(os.path.abspath(__file__))
    flags = ["--threads", str(args.threads), "--seconds", str(args.seconds)]
    if args.filter:
        flags += ["--filter", args.filter]
    pin = ["taskset", "-c", "0"] if args.threads == 1 and not args.no_pin and shutil.which("taskset") else []
    bench = args.bench or os.path.join(here, "..", "build", "bench", "tensor_ops_bench")
    outputs = []
    for cmd in (pin + [bench] + flags, pin + [args.python, os.path.join(here, "tensor_ops_bench_torch.py")] + flags):
        print("running:", " ".join(cmd), file=sys.stderr)
        outputs.append(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return outputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*", help="kiln's output, then torch's")
    ap.add_argument("--run", action="store_true", help="run both programs instead of reading files")
    ap.add_argument("--bench", help="the tensor_ops_bench binary (default: build/bench/tensor_ops_bench)")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--filter", default="")
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--flag", type=float, default=2.0, help="mark rows where kiln / torch exceeds this")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()
    if args.run:
        kiln_text, torch_text = run_both(args)
    elif len(args.files) == 2:
        kiln_text, torch_text = (open(f).read() for f in args.files)
    else:
        ap.error("give kiln's and torch's outputs as two files, or --run")
    kiln, torch = parse(kiln_text), parse(torch_text)
    keys = list(kiln) + [k for k in torch if k not in kiln]
    rows = []
    for key in keys:
        k, t = kiln.get(key), torch.get(key)
        ratio = k / t if k is not None and t else None
        rows.append((*key, k, t, ratio))
    fmt = lambda v, spec: "-" if v is None else format(v, spec)
    if args.markdown:
        print("| op | size | mode | kiln µs | torch µs | kiln / torch |")
        print("|---|---|---|---:|---:|---:|")
        for op, size, mode, k, t, r in rows:
            mark = " **slower**" if r is not None and r > args.flag else ""
            print(f"| {op} | {size} | {mode} | {fmt(k, '.2f')} | {fmt(t, '.2f')} | {fmt(r, '.2f')}×{mark} |")
    else:
        print(f"{'op':<34} {'size':<12} {'mode':<17} {'kiln us':>11} {'torch us':>11} {'kiln/torch':>10}")
        for op, size, mode, k, t, r in rows:
            mark = f"  <-- kiln > {args.flag:g}x slower" if r is not None and r > args.flag else ""
            print(f"{op:<34} {size:<12} {mode:<17} {fmt(k, '11.2f')} {fmt(t, '11.2f')} {fmt(r, '10.2f')}{mark}")
    slow = [r for r in rows if r[5] is not None and r[5] > args.flag]
    print(f"\n{len(slow)} of {sum(r[5] is not None for r in rows)} cases have kiln more than {args.flag:g}x slower "
          "than torch", file=sys.stderr)


if __name__ == "__main__":
    main()
