#!/usr/bin/env python3
"""Checks kiln's ONNX export: runs `io_export onnx DIR`, then for every DIR/<name>.onnx runs onnx.checker.check_model
and onnxruntime on DIR/<name>.input.bin and compares with kiln's DIR/<name>.output.bin (|a - e| <= 1e-5 (1 + |e|)).
The graph's input and output each have one symbolic dimension "N", the batch: first, or second in a time-major
sequence ([seq, N, features]). The initializers carry the model's state_dict names (DIR/<name>.safetensors) with its
values: each tensor is there under its name, or transposed under <name>_t (a Linear on inputs of rank > 2, an
attention's packed in_proj_weight), except
num_batches_tracked (unused at inference) and the recurrent weights, which are regrouped in ONNX's gate order.

    python3 tests/onnx_check.py <path to io_export> <dir>

Needs onnx, onnxruntime and numpy (python3 -m pip install onnx onnxruntime numpy); without them it prints SKIPPED and
exits with 77, which CTest reports as a skipped test.
"""
import glob
import json
import os
import re
import subprocess
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
except ImportError as e:
    print(f"SKIPPED: onnx_check needs onnx, onnxruntime and numpy ({e}); "
          "install them with: python3 -m pip install onnx onnxruntime numpy")
    sys.exit(77)


# State_dict entries that are not initializers of their own.
NOT_EXPORTED = re.compile(r"(^|\.)(num_batches_tracked|(weight|bias)_(ih|hh)_l\d+(_reverse)?)$")


def read_safetensors(path):
    """The tensors of a safetensors file by name (float32 and int64 ones)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        data = f.read()
    dtypes = {"F32": "<f4", "I64": "<i8"}
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        tensors[name] = np.frombuffer(data[begin:end], dtype=dtypes[info["dtype"]]).reshape(info["shape"])
    return tensors


def names_problems(model, state):
    """What is wrong with the initializers' names and values against the state_dict: a list of messages."""
    initializers = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    problems = []
    for name, value in state.items():
        if NOT_EXPORTED.search(name):
            continue
        if name in initializers:
            found = initializers[name]
        elif name + "_t" in initializers:
            found = initializers[name + "_t"].T
        else:
            problems.append(f"no initializer named {name}")
            continue
        if found.shape != value.shape or not np.array_equal(found, value):
            problems.append(f"initializer {name} differs from the state_dict's (shape {found.shape}, {value.shape})")
    return problems


def main():
    exporter, out_dir = sys.argv[1], sys.argv[2]
    subprocess.run([exporter, "onnx", out_dir], check=True)
    models = sorted(glob.glob(os.path.join(out_dir, "*.onnx")))
    if not models:
        sys.exit("onnx_check: io_export wrote no models")
    failures = 0
    for path in models:
        name = os.path.basename(path)[:-5]
        model = onnx.load(path)
        onnx.checker.check_model(model, full_check=True)
        assert model.producer_name == "kiln", model.producer_name
        dims = model.graph.input[0].type.tensor_type.shape.dim
        assert [d.dim_param for d in dims if d.dim_param] == ["N"], dims
        x_shape = [-1 if d.dim_param else d.dim_value for d in dims]
        x = np.fromfile(os.path.join(out_dir, name + ".input.bin"), dtype="<f4").reshape(x_shape)
        expected = np.fromfile(os.path.join(out_dir, name + ".output.bin"), dtype="<f4")
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        (y,) = session.run(None, {session.get_inputs()[0].name: x})
        out_dims = model.graph.output[0].type.tensor_type.shape.dim
        assert [d.dim_param for d in out_dims if d.dim_param] == ["N"], out_dims
        assert len(out_dims) == y.ndim and all(d.dim_param or d.dim_value == n for d, n in zip(out_dims, y.shape)), \
            (out_dims, y.shape)
        y = y.reshape(-1)
        err = np.abs(y - expected) - 1e-5 * (1 + np.abs(expected))
        ok = y.shape == expected.shape and bool((err <= 0).all())
        worst = float(np.abs(y - expected).max()) if y.shape == expected.shape else float("nan")
        problems = names_problems(model, read_safetensors(os.path.join(out_dir, name + ".safetensors")))
        ok = ok and not problems
        ops = sorted({n.op_type for n in model.graph.node})
        print(f"{'ok  ' if ok else 'FAIL'} {name}: opset {model.opset_import[0].version}, {len(model.graph.node)} nodes "
              f"({', '.join(ops)}), max |onnxruntime - kiln| = {worst:.3g}")
        for problem in problems:
            print(f"     {problem}")
        failures += not ok
    if failures:
        sys.exit(f"onnx_check: {failures} of {len(models)} models differ from kiln's outputs")
    print(f"onnx_check: {len(models)} models pass onnx.checker, match kiln within 1e-5 and name their weights as "
          f"its state_dict (onnx {onnx.__version__}, onnxruntime {ort.__version__})")


if __name__ == "__main__":
    main()
