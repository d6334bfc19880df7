#!/usr/bin/env python3
"""PyTorch peers: pytorch_tutorial, pytorch_preloaded, pytorch_compile, pytorch_autocast_bf16.

pytorch_autocast_bf16 is pytorch_preloaded with the forward under torch.autocast("cpu", dtype=torch.bfloat16), the
way PyTorch trains in bfloat16 on a CPU: the counterpart of kiln's --precision bf16 (bench/report puts the two side
by side, apart from the single-precision table).

Runs with whatever torch the interpreter has: /usr/bin/python3 (Debian's python3-torch 1.13) or
bench/peers/.venv/bin/python (current torch from PyPI). See README.md.
"""
import inspect
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

SYSTEMS = ["pytorch_tutorial", "pytorch_preloaded", "pytorch_compile", "pytorch_autocast_bf16"]
args = C.parse_args(SYSTEMS, __doc__)
C.set_thread_env(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)
try:
    torch.set_num_interop_threads(args.threads)
except RuntimeError:
    pass
torch.manual_seed(0)
VERSION = torch.__version__.split("+")[0]
now = time.perf_counter


class LstmNet(nn.Module):
    """lstm: LSTM(28, 128, batch_first) over the image's 28 rows, its final hidden state into Linear(128, 10)."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(28, 128, batch_first=True)
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        _, (h, _) = self.lstm(x)
        return self.fc(h[-1])


class BasicBlock(nn.Module):
    """resnet's residual block: relu(body(x) + shortcut(x)), the body Conv 3x3 - BatchNorm - ReLU - Conv 3x3 -
    BatchNorm (the first convolution with the block's stride), the shortcut the identity or, where the block changes
    the shape, a 1x1 convolution with its stride and a BatchNorm. No convolution has a bias."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                                  nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return F.relu(self.body(x) + self.shortcut(x))


def resnet():
    """resnet: Conv2d(1, 16, 3, padding 1) - BatchNorm - ReLU, the blocks of common.RESNET_BLOCKS, global average
    pooling, Linear(64, 10) (examples/resnet_fashion's network)."""
    layers, cin = [nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()], 16
    for cout, stride in C.RESNET_BLOCKS:
        layers.append(BasicBlock(cin, cout, stride))
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def build_net(workload):
    """mnist_cnn / lstm / resnet, their parameters set from common.init_tensors (PyTorch's default ranges, shared
    streams)."""
    if workload == "mnist_cnn":
        model = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Linear(128, 10))
    elif workload == "resnet":
        model = resnet()
    else:
        model = LstmNet()
    return with_initial_weights(model, workload)


def with_initial_weights(model, workload):
    """model, its parameters set from common.init_tensors(workload) in order (the shapes checked)."""
    params, init = list(model.parameters()), C.init_tensors(workload)
    assert [tuple(p.shape) for p in params] == [a.shape for a in init], workload
    with torch.no_grad():
        for p, a in zip(params, init):
            p.copy_(torch.from_numpy(a))
    return model


class Positions(nn.Module):
    """A learned position table [CONTEXT, WIDTH] added to every sequence (kiln's nn::LearnedPositionalEmbedding)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(C.CONTEXT, C.WIDTH))

    def forward(self, x):
        return x + self.weight[:x.shape[1]]


# nn.TransformerEncoder.forward takes is_causal from torch 2.0 on; before, the mask alone says it.
CAUSAL_HINT = "is_causal" in inspect.signature(nn.TransformerEncoder.forward).parameters


class TinyGPT(nn.Module):
    """transformer (examples/tiny_gpt's model): ids [N, L] -> Embedding(256, 128) + Positions ->
    nn.TransformerEncoder of 4 nn.TransformerEncoderLayer(128, 4 heads, 512, GELU, dropout 0, batch_first, norm_first)
    with a final LayerNorm -> Linear(128, 256), next-token logits [N, L, 256]. The causal mask goes with is_causal=True,
    so that nn.MultiheadAttention hands the attention to F.scaled_dot_product_attention's causal path without the
    mask (torch 2.x)."""

    def __init__(self):
        super().__init__()
        d = C.WIDTH
        self.tokens = nn.Embedding(C.VOCAB, d)
        self.positions = Positions()
        layer = nn.TransformerEncoderLayer(d, C.HEADS, C.FEEDFORWARD, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.trunk = nn.TransformerEncoder(layer, C.LAYERS, norm=nn.LayerNorm(d), enable_nested_tensor=False)
        self.head = nn.Linear(d, C.VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(C.CONTEXT), persistent=False)

    def forward(self, ids):
        x = self.positions(self.tokens(ids))
        L = ids.shape[1]
        causal = {"is_causal": True} if CAUSAL_HINT else {}
        return self.head(self.trunk(x, mask=self.mask[:L, :L], **causal))


def build(workload):
    if workload == "transformer":
        return with_initial_weights(TinyGPT(), workload)
    if workload in C.BATCHES:
        return build_net(workload)
    sz = C.layer_sizes(workload)
    layers = []
    for k, (w, b) in enumerate(C.init_params(workload)):
        lin = nn.Linear(sz[k], sz[k + 1])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
        layers.append(lin)
        if k + 1 < len(sz) - 1:
            layers.append(nn.ReLU())
    if workload == "mnist_mlp":
        layers.insert(0, nn.Flatten())
    return nn.Sequential(*layers)


class AutocastBf16(nn.Module):
    """The model's forward under CPU autocast to bfloat16 (matrix products and convolutions in bfloat16), its output
    back in float for the loss; the parameters and the optimizer stay float."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.model(x).float()


def maybe_compile(system, model):
    if system == "pytorch_autocast_bf16":
        return AutocastBf16(model)
    if system != "pytorch_compile":
        return model
    return torch.compile(model)


def compile_unavailable():
    if not hasattr(torch, "compile"):
        return "torch_%s_has_no_torch.compile" % VERSION
    return None


def timed_steps(step, steps, reps, warmup=10):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(reps):
        t0 = now()
        for _ in range(steps):
            step()
        times.append((now() - t0) / steps * 1e6)
    return times


def run_fixed_batch(system, workload, x, y, lossfn):
    """seed_regression (full batch) and wide_mlp (one fixed batch): median of reps of `steps` steps."""
    model = maybe_compile(system, build(workload))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    tutorial = system == "pytorch_tutorial"
    last = [None]

    def step():
        opt.zero_grad()
        loss = lossfn(model(x), y)
        loss.backward()
        opt.step()
        last[0] = loss.item() if tutorial else loss
    steps = args.steps or C.default_steps(workload, args.quick)
    t0 = now()
    step()  # first step (compilation for pytorch_compile)
    info(system, workload, first_step_s="%.3f" % (now() - t0))
    times = timed_steps(step, steps, args.reps, warmup=9)
    C.result(system, VERSION, workload, args.threads, times, -1, float(last[0]))


class MnistDataset(torch.utils.data.Dataset):
    """The tutorial way: one sample at a time, converted to float on access (and normalised with (mean, std) and
    shaped, for the mnist_cnn, lstm and resnet workloads, as torchvision's ToTensor + Normalize would)."""

    def __init__(self, images, labels, shape=None, normalise=None):
        self.images, self.labels, self.shape, self.normalise = images, labels, shape, normalise

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = torch.from_numpy(self.images[i]).float().div_(255.0)
        if self.normalise:
            x = x.sub_(self.normalise[0]).div_(self.normalise[1])
        if self.shape:
            x = x.view(self.shape)
        return x, int(self.labels[i])


def run_mnist(system):
    images, labels = C.load_mnist(args.data)
    model = maybe_compile(system, build("mnist_mlp"))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    n, bs = len(labels), 64
    data_t, step_t = [], []
    losses = []
    if system == "pytorch_tutorial":
        g = torch.Generator()
        g.manual_seed(0)
        loader = torch.utils.data.DataLoader(MnistDataset(images, labels), batch_size=bs, shuffle=True,
                                             num_workers=0, generator=g)
        t_epoch = now()
        it = iter(loader)
        while True:
            t0 = now()
            try:
                xb, yb = next(it)
            except StopIteration:
                break
            t1 = now()
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            t2 = now()
            data_t.append((t1 - t0) * 1e6)
            step_t.append((t2 - t1) * 1e6)
        epoch = now() - t_epoch
        final = losses[-1]
    else:
        t_load = now()
        X = torch.from_numpy(images).float().div_(255.0)
        Y = torch.from_numpy(labels)
        perm = torch.from_numpy(C.permutation(n))
        info(system, "mnist_mlp", preload_s="%.3f" % (now() - t_load))
        t_epoch = now()
        for s in range(0, n, bs):
            t0 = now()
            idx = perm[s:s + bs]
            xb, yb = X.index_select(0, idx), Y.index_select(0, idx)
            t1 = now()
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            t2 = now()
            data_t.append((t1 - t0) * 1e6)
            step_t.append((t2 - t1) * 1e6)
        epoch = now() - t_epoch
        final = loss.item()
    info(system, "mnist_mlp", epoch_s="%.3f" % epoch, steps=len(step_t),
         mean_step_us="%.1f" % (sum(step_t) / len(step_t)), mean_data_us="%.1f" % (sum(data_t) / len(data_t)),
         first_step_s="%.3f" % (step_t[0] / 1e6), samples=n)
    C.result(system, VERSION, "mnist_mlp", args.threads, step_t, float(np.median(data_t)), final)


def cycling(loader):
    """batch(b): the loader's next batch, starting it over when it runs out (b is ignored: batches come in order)."""
    it = [iter(loader)]

    def batch(b):
        try:
            return next(it[0])
        except StopIteration:
            it[0] = iter(loader)
            return next(it[0])

    return batch


def run_batches(system, workload):
    """mnist_cnn, lstm and resnet (on Fashion-MNIST) as bench/ladder times them: the first BATCHES[workload]
    batches of 64 of one seeded epoch, cycled; warmup_steps untimed steps (the first one, compilation included,
    reported apart), then `reps` repetitions of `steps` steps. step_us is the median over repetitions of the mean
    step time; the batch's assembly is timed apart (data_us, median per step)."""
    subdir, mean, std = C.dataset_of(workload)
    images, labels = C.load_mnist(args.data, subdir)
    shape = (28, 28) if workload == "lstm" else (1, 28, 28)
    nb, bs = C.BATCHES[workload], C.BATCH_SIZE
    perm = C.permutation(len(labels))
    model = maybe_compile(system, build(workload))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    tutorial = system == "pytorch_tutorial"
    if tutorial:
        # DataLoader over a per-sample Dataset of the same nb * bs images, in its own shuffled order (so batch()
        # ignores the ladder's batch number) and reshuffled at each pass; loss.item() every step
        sub = perm[:nb * bs]
        g = torch.Generator()
        g.manual_seed(0)
        loader = torch.utils.data.DataLoader(MnistDataset(images[sub], labels[sub], shape, normalise=(mean, std)),
                                             batch_size=bs, shuffle=True, num_workers=0, generator=g)
        batch = cycling(loader)  # the next epoch of the nb batches after the last
    else:
        t_load = now()
        X = torch.from_numpy(C.normalise_mnist(images, mean, std)).view(-1, *shape)
        Y = torch.from_numpy(labels)
        P = torch.from_numpy(perm)
        info(system, workload, preload_s="%.3f" % (now() - t_load))

        def batch(b):
            idx = P[b * bs:(b + 1) * bs]
            return X.index_select(0, idx), Y.index_select(0, idx)
    last = [None]

    def step(xb, yb):
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        last[0] = loss.item() if tutorial else loss
    steps = args.steps or C.default_steps(workload, args.quick)
    t = C.CycledTiming(step, batch, nb, steps, args.reps)
    extra = {}
    if system == "pytorch_compile" and workload == "lstm":  # Dynamo's default (torch._dynamo.config.allow_rnn)
        extra["note"] = "dynamo_graph_break_at_nn.LSTM_which_runs_eager"
    info(system, workload, first_step_s="%.3f" % t.first, warmup_steps=t.warmup, steps=steps, reps=args.reps,
         batches=nb, mean_data_us="%.1f" % (sum(t.data_us) / len(t.data_us)), **extra)
    final = last[0] if tutorial else last[0].item()
    C.result(system, VERSION, workload, args.threads, t.times, float(np.median(t.data_us)), final)


class TextWindows(torch.utils.data.Dataset):
    """The tutorial way for text: one window (ids, next-token targets) at a time."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i]), torch.from_numpy(self.y[i])


def run_transformer(system):
    """transformer as bench/ladder times it: the first BATCHES["transformer"] batches of TEXT_BATCH windows of the
    training text in order, cycled; AdamW; mean cross-entropy over every position. Timing as run_batches.
    pytorch_tutorial: a DataLoader over a per-window Dataset (shuffle off, so the same batches in the same order) and
    loss.item() every step; the others slice the batch out of one preloaded tensor."""
    x, y = C.text_batches(args.data)
    nb, bs = C.BATCHES["transformer"], C.TEXT_BATCH
    model = maybe_compile(system, build("transformer"))
    opt = torch.optim.AdamW(model.parameters(), lr=C.ADAMW_LR, weight_decay=C.ADAMW_WEIGHT_DECAY)
    tutorial = system == "pytorch_tutorial"
    if tutorial:
        loader = torch.utils.data.DataLoader(TextWindows(x, y), batch_size=bs, shuffle=False, num_workers=0)
        batch = cycling(loader)  # the next pass over the nb batches after the last
    else:
        X, Y = torch.from_numpy(x), torch.from_numpy(y)

        def batch(b):
            return X[b * bs:(b + 1) * bs], Y[b * bs:(b + 1) * bs]
    last = [None]

    def step(xb, yb):
        opt.zero_grad()
        loss = F.cross_entropy(model(xb).reshape(-1, C.VOCAB), yb.reshape(-1))
        loss.backward()
        opt.step()
        last[0] = loss.item() if tutorial else loss
    steps = args.steps or C.default_steps("transformer", args.quick)
    t = C.CycledTiming(step, batch, nb, steps, args.reps)
    info(system, "transformer", first_step_s="%.3f" % t.first, warmup_steps=t.warmup, steps=steps, reps=args.reps,
         batches=nb, mean_data_us="%.1f" % (sum(t.data_us) / len(t.data_us)))
    final = last[0] if tutorial else last[0].item()
    C.result(system, VERSION, "transformer", args.threads, t.times, float(np.median(t.data_us)), final)


def run_tiny(system):
    if system == "pytorch_tutorial":
        info(system, "tiny_op", note="same_code_as_pytorch_preloaded_skipped")
        return
    lin = build("tiny_op")
    f = maybe_compile(system, lin)
    x = torch.from_numpy(C.tiny_input())
    n = args.steps or C.default_steps("tiny_op", args.quick)
    out = [None]

    def fwd():
        out[0] = f(x)

    def step():
        y = f(x).sum()
        y.backward()
        out[0] = y
    for name, fn in (("tiny_op_forward", fwd), ("tiny_op_step", step)):
        times = timed_steps(fn, n, args.reps, warmup=50)
        C.result(system, VERSION, name, args.threads, times, -1, float(out[0].sum()), decimals=3)


def info(system, workload, **kw):
    C.info(system=system, version=VERSION, workload=workload, threads=args.threads, **kw)


def main():
    for system in args.systems:
        if system == "pytorch_compile":
            why = compile_unavailable()
            if why:
                for w in args.workloads:
                    for name in (["tiny_op_forward", "tiny_op_step"] if w == "tiny_op" else [w]):
                        C.result(system, VERSION, name, args.threads, status="unavailable", reason=why)
                continue
        for w in args.workloads:
            try:
                if w == "seed_regression":
                    x, y = (torch.from_numpy(a) for a in C.regression_data())
                    run_fixed_batch(system, w, x, y, F.mse_loss)
                elif w == "wide_mlp":
                    x, y = (torch.from_numpy(a) for a in C.wide_data())
                    run_fixed_batch(system, w, x, y, F.cross_entropy)
                elif w == "mnist_mlp":
                    run_mnist(system)
                elif w == "transformer":
                    run_transformer(system)
                elif w in C.BATCHES:
                    run_batches(system, w)
                elif w == "tiny_op":
                    run_tiny(system)
            except Exception as e:  # a peer that breaks reports it instead of stopping the harness
                if os.environ.get("PEER_DEBUG"):
                    raise
                names = ["tiny_op_forward", "tiny_op_step"] if w == "tiny_op" else [w]
                for name in names:
                    C.result(system, VERSION, name, args.threads, status="unavailable", reason=C.reason_of(e))


if __name__ == "__main__":
    main()
