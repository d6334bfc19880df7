"""Shared pieces of the Python peers: arguments, thread environment, deterministic data/init, MNIST, RESULT lines.

Deterministic numbers (identical in libtorch_bench.cpp): stream `s` element `i` is
splitmix64(s * 2**32 + i); uniform u = (z >> 11) * 2**-53; normal k uses elements 2k and 2k+1 (Box-Muller,
sqrt(-2 ln(1-u1)) cos(2 pi u2)). Every peer therefore trains on the same data from the same initial weights:
Linear(in, out) weights (PyTorch layout [out, in]) and bias are U(-1/sqrt(in), 1/sqrt(in)), which is exactly the
range of PyTorch's default init (Kaiming-uniform a=sqrt(5)); only the random stream differs from torch's own.
mnist_cnn, lstm and resnet (init_tensors) fill each parameter tensor the same way, in PyTorch's layout and
parameters() order, with PyTorch's default ranges: U(+-1/sqrt(fan_in)) for Conv2d (fan_in = in_channels * k * k) and
Linear, U(+-1/sqrt(hidden)) for every LSTM tensor; a BatchNorm's weight is 1 and its bias 0, as PyTorch's.
transformer's tensors follow PyTorch's initialisation too (transformer_param_shapes): N(0, 1) for the token embedding,
N(0, 0.02) for the position table, Xavier-uniform for the attention's input projection, zeros for its biases, ones
and zeros for a LayerNorm.
"""
import argparse
import gzip
import os
import statistics
import sys

import numpy as np

# Stream ids (also in libtorch_bench.cpp).
S_REG_X, S_REG_Y = 1, 2
S_WIDE_X, S_WIDE_Y = 3, 4
S_TINY_X = 5
S_SHUFFLE = 6
S_LAYER0 = 100  # layer k: weight stream 100 + 2k, bias stream 101 + 2k (mnist_cnn, lstm: tensor k: 100 + k); + offset
WORKLOAD_OFFSET = {"seed_regression": 0, "mnist_mlp": 10, "wide_mlp": 20, "tiny_op": 30, "mnist_cnn": 40, "lstm": 50,
                   "resnet": 60, "transformer": 70}

WORKLOADS = ["seed_regression", "mnist_mlp", "wide_mlp", "tiny_op", "mnist_cnn", "lstm", "resnet", "transformer"]
# mnist_cnn, lstm and resnet train, as bench/ladder does, on the first BATCHES[w] batches of 64 of one seeded epoch,
# cycling; transformer on the first BATCHES[w] batches of TEXT_BATCH windows of the training text, in order, cycling.
BATCHES = {"mnist_cnn": 32, "lstm": 64, "resnet": 32, "transformer": 8}
BATCH_SIZE = 64
# transformer: examples/tiny_gpt's model (byte tokens, a learned position table, pre-norm causal encoder layers with
# GELU and no dropout, a final LayerNorm, a Linear head), its batches TEXT_BATCH windows of CONTEXT bytes, AdamW.
VOCAB, CONTEXT, WIDTH, HEADS, FEEDFORWARD, LAYERS = 256, 128, 128, 4, 512, 4
TEXT_BATCH = 32
ADAMW_LR, ADAMW_WEIGHT_DECAY = 2e-3, 0.01
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081  # the normalisation of bench/ladder's MNIST workloads
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530  # and of its Fashion-MNIST workload (resnet)
# resnet's residual blocks after the stem: (channels, stride), two a stage; a block that changes the shape has a
# shortcut of a 1x1 convolution with its stride and a BatchNorm.
RESNET_BLOCKS = [(16, 1), (16, 1), (32, 2), (32, 1), (64, 2), (64, 1)]


def dataset_of(workload):
    """The data set a workload trains on: its subfolder of the data directory and its normalisation."""
    if workload == "resnet":
        return "fashion-mnist", FASHION_MEAN, FASHION_STD
    return "mnist", MNIST_MEAN, MNIST_STD
M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def parse_args(systems, description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--system", choices=systems, action="append",
                   help="system(s) to run (default: all of this script's)")
    p.add_argument("--workload", choices=WORKLOADS + ["all"], default="all")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="fewer steps/repetitions (mnist_mlp stays a full epoch)")
    p.add_argument("--data", default=None, help="directory with the MNIST IDX .gz files")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 7, quick 5)")
    p.add_argument("--steps", type=int, default=None, help="steps per repetition (default depends on workload)")
    a = p.parse_args()
    a.systems = a.system or systems
    a.workloads = WORKLOADS if a.workload == "all" else [a.workload]
    if a.reps is None:
        a.reps = 5 if a.quick else 7
    return a


def torch_on_gpu():
    """torch, set for FP32 products without TF32 (as kiln's policy::cuda); prints SKIPPED and exits 0 when PyTorch or a
    usable CUDA device is missing, so that scripts/gpu_check can run the GPU peers anywhere."""
    try:
        import torch
    except ImportError as e:
        print("SKIPPED: no PyTorch (%s)" % e)
        sys.exit(0)
    if not torch.cuda.is_available():
        print("SKIPPED: PyTorch %s has no usable CUDA device" % torch.__version__)
        sys.exit(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def set_thread_env(n):
    """Must run before numpy/torch/jax/tf are imported for the settings to take."""
    n = str(n)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        os.environ[k] = n
    flags = os.environ.get("XLA_FLAGS", "")
    if n == "1":
        flags += " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    # N > 1: XLA's default pool uses all cores (2 here); a bare "intra_op_parallelism_threads=N" token that does
    # not follow a "--" flag makes XLA abort (it takes it for a flag file name).
    os.environ["XLA_FLAGS"] = flags.strip()


# ---------------------------------------------------------------- deterministic numbers
def _splitmix(stream, n, start=0):
    with np.errstate(over="ignore"):
        z = (np.uint64(stream) << np.uint64(32)) + np.arange(start, start + n, dtype=np.uint64)
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z


def uniform(stream, n):
    """float64 in [0, 1)."""
    return (_splitmix(stream, n) >> np.uint64(11)).astype(np.float64) * (2.0 ** -53)


def normal(stream, shape):
    n = int(np.prod(shape))
    u = uniform(stream, 2 * n)
    z = np.sqrt(-2.0 * np.log(1.0 - u[0::2])) * np.cos(2.0 * np.pi * u[1::2])
    return z.astype(np.float32).reshape(shape)


def linear_init(workload, layer, fan_in, fan_out):
    """(W [out, in], b [out]) float32, U(+-1/sqrt(fan_in)) like PyTorch's default."""
    bound = 1.0 / np.sqrt(fan_in)
    s = S_LAYER0 + WORKLOAD_OFFSET[workload] + 2 * layer
    w = ((2.0 * uniform(s, fan_in * fan_out) - 1.0) * bound).astype(np.float32).reshape(fan_out, fan_in)
    b = ((2.0 * uniform(s + 1, fan_out) - 1.0) * bound).astype(np.float32)
    return w, b


def layer_sizes(workload):
    return {"seed_regression": [100, 10, 1], "mnist_mlp": [784, 128, 10],
            "wide_mlp": [784, 1024, 1024, 10], "tiny_op": [8, 8]}[workload]


def init_params(workload):
    sz = layer_sizes(workload)
    return [linear_init(workload, k, sz[k], sz[k + 1]) for k in range(len(sz) - 1)]


def resnet_param_shapes():
    """resnet: [(shape, bound)] per parameter tensor in parameters() order, the bound "ones" or "zeros" for a
    BatchNorm's weight and bias: the stem's Conv2d(1, 16, 3) and BatchNorm2d(16); per block the body's two 3x3
    convolutions and BatchNorms, then the shortcut's 1x1 convolution and BatchNorm where it has one; Linear(64, 10)."""
    shapes = []

    def conv(cin, cout, k):
        shapes.append(((cout, cin, k, k), 1.0 / np.sqrt(cin * k * k)))

    def bn(c):
        shapes.extend([((c,), "ones"), ((c,), "zeros")])
    conv(1, 16, 3)
    bn(16)
    cin = 16
    for cout, stride in RESNET_BLOCKS:
        conv(cin, cout, 3)
        bn(cout)
        conv(cout, cout, 3)
        bn(cout)
        if stride != 1 or cin != cout:
            conv(cin, cout, 1)
            bn(cout)
        cin = cout
    return shapes + [((10, 64), 1.0 / np.sqrt(64)), ((10,), 1.0 / np.sqrt(64))]


def transformer_param_shapes():
    """transformer: [(shape, bound)] per parameter tensor in the parameters() order of torch_bench.TinyGPT, a bound
    ("normal", std) for a normal distribution: the token embedding [256, 128] N(0, 1) and the position table [128, 128]
    N(0, 0.02); per layer (nn.TransformerEncoderLayer's order) the attention's in_proj_weight [384, 128] Xavier-uniform
    (U(+-sqrt(6 / (128 + 384)))) and in_proj_bias zeros, out_proj U(+-1/sqrt(128)) and its bias zeros, linear1 and
    linear2 U(+-1/sqrt(fan_in)) (weight and bias), norm1 and norm2 ones and zeros; the final LayerNorm; the head
    Linear(128, 256)."""
    d, f = WIDTH, FEEDFORWARD
    shapes = [((VOCAB, d), ("normal", 1.0)), ((CONTEXT, d), ("normal", 0.02))]
    for _ in range(LAYERS):
        shapes += [((3 * d, d), np.sqrt(6.0 / (d + 3 * d))), ((3 * d,), "zeros"),
                   ((d, d), 1.0 / np.sqrt(d)), ((d,), "zeros"),
                   ((f, d), 1.0 / np.sqrt(d)), ((f,), 1.0 / np.sqrt(d)),
                   ((d, f), 1.0 / np.sqrt(f)), ((d,), 1.0 / np.sqrt(f)),
                   ((d,), "ones"), ((d,), "zeros"), ((d,), "ones"), ((d,), "zeros")]
    return shapes + [((d,), "ones"), ((d,), "zeros"), ((VOCAB, d), 1.0 / np.sqrt(d)), ((VOCAB,), 1.0 / np.sqrt(d))]


def param_shapes(workload):
    """mnist_cnn / lstm / resnet / transformer: [(shape, bound)] per parameter tensor, in PyTorch's layout and
    parameters() order."""
    if workload == "mnist_cnn":  # Conv2d(1,32,3) Conv2d(32,64,3) Linear(9216,128) Linear(128,10), weight then bias
        layers = [((32, 1, 3, 3), 9), ((64, 32, 3, 3), 32 * 9), ((128, 9216), 9216), ((10, 128), 128)]
        return [t for shape, fan_in in layers
                for t in ((shape, 1.0 / np.sqrt(fan_in)), ((shape[0],), 1.0 / np.sqrt(fan_in)))]
    if workload == "lstm":  # LSTM(28, 128): weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0; Linear(128, 10)
        b = 1.0 / np.sqrt(128)
        return [((512, 28), b), ((512, 128), b), ((512,), b), ((512,), b), ((10, 128), b), ((10,), b)]
    if workload == "resnet":
        return resnet_param_shapes()
    if workload == "transformer":
        return transformer_param_shapes()
    raise ValueError(workload)


def init_tensors(workload):
    """mnist_cnn / lstm / resnet / transformer initial parameters: tensor k is U(+-bound) or N(0, std) (Box-Muller,
    `normal`) from stream S_LAYER0 + offset + k, or all ones or zeros (a BatchNorm's or a LayerNorm's)."""
    out = []
    for k, (shape, bound) in enumerate(param_shapes(workload)):
        if isinstance(bound, str):
            out.append((np.ones if bound == "ones" else np.zeros)(shape, np.float32))
            continue
        if isinstance(bound, tuple):
            out.append((normal(S_LAYER0 + WORKLOAD_OFFSET[workload] + k, shape) * np.float32(bound[1]))
                       .astype(np.float32))
            continue
        u = uniform(S_LAYER0 + WORKLOAD_OFFSET[workload] + k, int(np.prod(shape)))
        out.append(((2.0 * u - 1.0) * bound).astype(np.float32).reshape(shape))
    return out


def normalise_mnist(images, mean=MNIST_MEAN, std=MNIST_STD):
    """uint8 [n, 784] -> float32 scaled to [0, 1], then (x - mean) / std (MNIST's 0.1307 and 0.3081 unless given), as
    bench/ladder's MNIST and Fashion-MNIST workloads."""
    return (images.astype(np.float32) / np.float32(255.0) - np.float32(mean)) / np.float32(std)


def regression_data():
    return normal(S_REG_X, (1000, 100)), normal(S_REG_Y, (1000, 1))


def wide_data(batch=256):
    x = uniform(S_WIDE_X, batch * 784).astype(np.float32).reshape(batch, 784)
    y = np.minimum((uniform(S_WIDE_Y, batch) * 10).astype(np.int64), 9)
    return x, y


def tiny_input():
    return normal(S_TINY_X, (1, 8))


def permutation(n, seed_stream=S_SHUFFLE):
    """Seeded shuffle: indices sorted by their random key (stable), as in libtorch_bench.cpp."""
    return np.argsort(_splitmix(seed_stream, n), kind="stable").astype(np.int64)


# ---------------------------------------------------------------- MNIST
def find_data(explicit=None, subdir="mnist"):
    """The folder with the IDX files of MNIST (subdir "mnist") or Fashion-MNIST ("fashion-mnist"): a candidate's
    subfolder of that name, or for MNIST the candidate itself, or one of the other data set when it is named so."""
    here = os.path.dirname(os.path.abspath(__file__))
    cands = []
    if explicit:
        cands.append(explicit)
    if os.environ.get("KILN_DATA"):
        cands.append(os.environ["KILN_DATA"])
    cands += ["./data", "../shared/data", "/work/shared/data",
              os.path.join(here, "..", "..", "data"), os.path.join(here, "..", "..", "..", "shared", "data")]
    for c in cands:
        for d in (os.path.join(c, subdir), c):
            if d == c and subdir != "mnist" and os.path.basename(os.path.normpath(c)) != subdir:
                continue  # a folder of MNIST's files is no Fashion-MNIST
            if os.path.exists(os.path.join(d, "train-images-idx3-ubyte.gz")):
                return d
    raise SystemExit("%s not found (tried --data, $KILN_DATA, ./data, ../shared/data, /work/shared/data, each with a "
                     "%s/ subfolder)" % ("MNIST" if subdir == "mnist" else "Fashion-MNIST", subdir))


def load_mnist(explicit=None, subdir="mnist"):
    """Train set: uint8 images [60000, 784], int64 labels [60000] (of Fashion-MNIST with subdir "fashion-mnist")."""
    d = find_data(explicit, subdir)
    with gzip.open(os.path.join(d, "train-images-idx3-ubyte.gz")) as f:
        raw = f.read()
    magic, n, r, c = (int.from_bytes(raw[i:i + 4], "big") for i in range(0, 16, 4))
    assert magic == 2051, magic
    images = np.frombuffer(raw, np.uint8, n * r * c, 16).reshape(n, r * c)
    with gzip.open(os.path.join(d, "train-labels-idx1-ubyte.gz")) as f:
        raw = f.read()
    assert int.from_bytes(raw[0:4], "big") == 2049
    labels = np.frombuffer(raw, np.uint8, n, 8).astype(np.int64)
    return images, labels


# ---------------------------------------------------------------- text
def find_text(explicit=None):
    """The text corpus folder (a candidate's text/ subfolder), in the places find_data looks."""
    here = os.path.dirname(os.path.abspath(__file__))
    cands = ([explicit] if explicit else []) + ([os.environ["KILN_DATA"]] if os.environ.get("KILN_DATA") else [])
    cands += ["./data", "../shared/data", "/work/shared/data",
              os.path.join(here, "..", "..", "data"), os.path.join(here, "..", "..", "..", "shared", "data")]
    for c in cands:
        if os.path.isdir(os.path.join(c, "text")):
            return os.path.join(c, "text")
    raise SystemExit("text corpus not found (tried --data, $KILN_DATA, ./data, ../shared/data, /work/shared/data, "
                     "each with a text/ subfolder)")


def validation_cut(text, fraction=0.1):
    """Where a file's held-out part begins, as kiln::data::validation_cut: the first entry start (the byte after a
    line "%") at or after the fraction's byte, else the last one before it, else the fraction's byte."""
    n = len(text)
    at = min(n, int(n * (1.0 - fraction)))

    def entry_starts_at(i):
        if i >= 3:
            return text[i - 3:i] == b"\n%\n"
        return i == 2 and text[:2] == b"%\n"
    for i in range(at, n):
        if entry_starts_at(i):
            return i
    for i in range(at - 1, 1, -1):
        if entry_starts_at(i):
            return i
    return at


def load_text(explicit=None):
    """The training text as kiln::data::load_text_corpus gives it: every regular, non-hidden file of the corpus
    folder in name order (gzip read through), each up to its validation cut, joined. uint8 array."""
    d = find_text(explicit)
    parts = []
    for name in sorted(os.listdir(d)):
        path = os.path.join(d, name)
        if name.startswith(".") or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        parts.append(raw[:validation_cut(raw)])
    return np.frombuffer(b"".join(parts), np.uint8)


def text_batches(explicit=None, nb=None):
    """transformer's data: the first nb * TEXT_BATCH windows of CONTEXT tokens of the training text, side by side (as
    kiln::data::text_windows with stride = context), in order: ids int64 [nb * TEXT_BATCH, CONTEXT] and the next
    tokens, the targets, of the same shape. Batch b is rows [b * TEXT_BATCH, (b + 1) * TEXT_BATCH)."""
    nb = nb or BATCHES["transformer"]
    tokens = load_text(explicit).astype(np.int64)
    n = nb * TEXT_BATCH
    if len(tokens) < n * CONTEXT + 1:
        raise SystemExit("text corpus: %d training bytes, fewer than the %d needed" % (len(tokens), n * CONTEXT + 1))
    x = tokens[:n * CONTEXT].reshape(n, CONTEXT)
    y = tokens[1:n * CONTEXT + 1].reshape(n, CONTEXT)
    return x, y


# ---------------------------------------------------------------- output
def result(system, version, workload, threads, times_us=None, data_us=-1.0, final_loss=float("nan"),
           status="ok", reason=None, decimals=2):
    if times_us:
        med, lo, hi = statistics.median(times_us), min(times_us), max(times_us)
        f = "%.{}f".format(decimals)
        s, mn, mx = f % med, f % lo, f % hi
    else:
        s = mn = mx = "-1"
    d = "%.2f" % data_us if data_us is not None and data_us >= 0 else "-1"
    line = ("RESULT bench=peer system=%s version=%s workload=%s threads=%d step_us=%s min_us=%s max_us=%s "
            "data_us=%s final_loss=%.6g status=%s" % (system, version, workload, threads, s, mn, mx, d,
                                                       final_loss, status))
    if reason:
        line += " reason=" + reason.replace(" ", "_")
    print(line, flush=True)


def info(**kw):
    print("INFO " + " ".join("%s=%s" % (k, v) for k, v in kw.items()), flush=True)


def reason_of(e):
    msg = "%s:%s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    return "".join(ch if ch.isalnum() or ch in "._:-/" else "_" for ch in msg)[:160]


def default_steps(workload, quick):
    """Timed steps per repetition; mnist_cnn, lstm, resnet and transformer as bench/ladder times them."""
    return {"seed_regression": 200, "wide_mlp": 10 if quick else 20, "tiny_op": 2000 if quick else 10000,
            "mnist_cnn": 3 if quick else 10, "lstm": 10 if quick else 40, "resnet": 3 if quick else 10,
            "transformer": 3 if quick else 10}.get(workload, 0)


def warmup_steps(steps):
    """Untimed steps before the repetitions of mnist_cnn, lstm, resnet and transformer: min(steps, 20), as
    bench/ladder."""
    return min(steps, 20)


class CycledTiming:
    """mnist_cnn / lstm / resnet / transformer timing, as bench/ladder times them: step(x, y) on batch(0) (the first
    step, compilation included, reported apart as `first`), warmup_steps untimed steps, then `reps` repetitions of
    `steps` steps over batches 0..nb-1 cycled. `times` holds each repetition's mean step time and `data_us` each
    batch's assembly time (timed apart), both in microseconds; `last` the last step's return value."""

    def __init__(self, step, batch, nb, steps, reps):
        import time
        now = time.perf_counter
        self.warmup = warmup_steps(steps)
        t0 = now()
        self.last = step(*batch(0))
        self.first = now() - t0
        for i in range(1, self.warmup):
            self.last = step(*batch(i % nb))
        self.times, self.data_us = [], []
        for _ in range(reps):
            total = 0.0
            for i in range(steps):
                t0 = now()
                xb, yb = batch(i % nb)
                t1 = now()
                self.last = step(xb, yb)
                total += now() - t1
                self.data_us.append((t1 - t0) * 1e6)
            self.times.append(total / steps * 1e6)
