#!/usr/bin/env python3
"""Checks that PyTorch loads kiln's safetensors files: runs `io_export safetensors DIR`, loads DIR/<name>.safetensors
into torch.nn.Sequential(Flatten(), Linear(12, 8), ReLU(), Linear(8, 5)) with load_state_dict(strict=True) and
compares its outputs on DIR/<name>.input.bin with kiln's DIR/<name>.output.bin (within 1e-5).

    python3 tests/torch_check.py <path to io_export> <dir>

Reads the files with the safetensors package when it is installed, else by hand. Needs PyTorch: when the python3 that
runs it has none, it re-runs itself with /usr/bin/python3 if that one has it; otherwise it prints SKIPPED and exits
with 77 (a skipped CTest test).
"""
import os
import subprocess
import sys

try:
    import torch
except ImportError:
    for other in ("/usr/bin/python3",):
        if os.path.realpath(other) != os.path.realpath(sys.executable) and os.path.exists(other) and \
                subprocess.run([other, "-c", "import torch"], capture_output=True).returncode == 0:
            os.execv(other, [other] + sys.argv)
    print("SKIPPED: torch_check needs PyTorch (import torch failed)")
    sys.exit(77)

import numpy as np  # noqa: E402  (comes with torch)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
from generate_io import load_file, model  # noqa: E402


def main():
    exporter, out_dir = sys.argv[1], sys.argv[2]
    subprocess.run([exporter, "safetensors", out_dir], check=True)
    for name in ("static_mlp", "dynamic_mlp"):
        try:
            from safetensors.torch import load_file as st_load
            state = st_load(os.path.join(out_dir, name + ".safetensors"))
        except ImportError:
            state, _ = load_file(os.path.join(out_dir, name + ".safetensors"))
        net = model()
        net.load_state_dict(state, strict=True)
        x = torch.from_numpy(np.fromfile(os.path.join(out_dir, name + ".input.bin"), dtype="<f4").reshape(-1, 3, 4))
        expected = torch.from_numpy(np.fromfile(os.path.join(out_dir, name + ".output.bin"), dtype="<f4"))
        with torch.no_grad():
            y = net(x).reshape(-1)
        worst = float((y - expected).abs().max())
        if not torch.allclose(y, expected, rtol=1e-5, atol=1e-5):
            sys.exit(f"torch_check: {name}: PyTorch's outputs differ from kiln's by up to {worst:.3g}")
        print(f"ok {name}: PyTorch {torch.__version__} loads kiln's file, max |torch - kiln| = {worst:.3g}")


if __name__ == "__main__":
    main()
