#!/usr/bin/env python3
"""Runs an ONNX model exported by examples/mnist_cnn, fashion_cnn or sequence_classify (--onnx FILE) in onnxruntime on
the test set, with the examples' normalisation, and prints its accuracy: the same figure as the example's own test
accuracy. Images go in as (N, 1, 28, 28) to a model whose input has rank 4 (the CNNs), else as (N, 28, 28): 28 rows
of 28 pixels (the sequence classifier).

    python3 examples/onnx_mnist_accuracy.py MODEL.onnx [--fashion] [--data DIR]

The data set is looked up in --data DIR, $KILN_DATA, ./data and ../shared/data (mnist/ or fashion-mnist/ under each).
Needs numpy and onnxruntime (python3 -m pip install numpy onnxruntime).
"""
import argparse
import gzip
import os
import sys

import numpy as np
import onnxruntime as ort

# kiln/data/mnist.hpp's mnist_mean / mnist_std and fashion_mnist_mean / fashion_mnist_std.
NORMALISATION = {"mnist": (0.1307, 0.3081), "fashion-mnist": (0.2860, 0.3530)}


def find(subdir, given):
    places = [given] if given else []
    places += [os.environ.get("KILN_DATA", ""), "data", os.path.join("..", "shared", "data")]
    tried = []
    for place in filter(None, places):
        d = os.path.join(place, subdir)
        tried.append(d)
        if os.path.exists(os.path.join(d, "t10k-images-idx3-ubyte.gz")):
            return d
    sys.exit(f"onnx_mnist_accuracy: no t10k-images-idx3-ubyte.gz found; looked in {', '.join(tried)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--fashion", action="store_true")
    ap.add_argument("--data")
    args = ap.parse_args()
    subdir = "fashion-mnist" if args.fashion else "mnist"
    d = find(subdir, args.data)
    with gzip.open(os.path.join(d, "t10k-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read()[16:], np.uint8).astype(np.float32)
    with gzip.open(os.path.join(d, "t10k-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read()[8:], np.uint8)
    mean, std = NORMALISATION[subdir]
    # As kiln computes it: (x * (1/255) - mean) * (1/std), in float32.
    x = (x * np.float32(1 / 255) - np.float32(mean)) * np.float32(1 / std)
    session = ort.InferenceSession(args.model)
    name = session.get_inputs()[0].name
    x = x.reshape((-1, 1, 28, 28) if len(session.get_inputs()[0].shape) == 4 else (-1, 28, 28))
    out = np.concatenate([session.run(None, {name: x[i:i + 500]})[0] for i in range(0, len(x), 500)])
    print(f"RESULT example=onnx_mnist_accuracy data={subdir} test_acc={(out.argmax(1) == y).mean():.4f}")


if __name__ == "__main__":
    main()
