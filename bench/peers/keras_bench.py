#!/usr/bin/env python3
"""Keras 3 peers: keras_fit (model.fit / train_on_batch) and keras_loop (custom training loop).

Backend: JAX by default (jax[cpu] is a ~100 MB install from PyPI; TensorFlow is several times larger), or --backend
torch|tensorflow if installed. The custom loop is the JAX-idiomatic one from the Keras guide: a jitted step of
jax.value_and_grad over model.stateless_call plus optimizer.stateless_apply (the GradientTape analogue); with the
torch backend it is the eager torch loop (loss.backward(), optimizer.apply).
Run with bench/peers/.venv/bin/python.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

SYSTEMS = ["keras_fit", "keras_loop"]
_backend = "jax"
if "--backend" in sys.argv:
    i = sys.argv.index("--backend")
    _backend = sys.argv[i + 1]
    del sys.argv[i:i + 2]
args = C.parse_args(SYSTEMS, __doc__)
C.set_thread_env(args.threads)
os.environ["KERAS_BACKEND"] = _backend
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import keras  # noqa: E402

B = keras.backend.backend()
if B == "jax":
    import jax
    import jax.numpy as jnp
    BVER = jax.__version__
elif B == "torch":
    import torch
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(args.threads)
    except RuntimeError:
        pass
    BVER = torch.__version__.split("+")[0]
elif B == "tensorflow":
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    BVER = tf.__version__
VERSION = "%s+%s%s" % (keras.__version__, B, BVER)
now = time.perf_counter
keras.utils.set_random_seed(0)


def build(workload):
    """Sequential MLP carrying the shared initial weights (PyTorch-default ranges)."""
    sz = C.layer_sizes(workload)
    params = C.init_params(workload)
    layers = [keras.Input((sz[0],))]
    for k in range(len(sz) - 1):
        act = "relu" if k + 1 < len(sz) - 1 else None
        layers.append(keras.layers.Dense(sz[k + 1], activation=act))
    model = keras.Sequential(layers)
    dense = [l for l in model.layers if isinstance(l, keras.layers.Dense)]
    for lay, (w, b) in zip(dense, params):
        lay.set_weights([w.T.copy(), b])
    return model


def build_resnet(t):
    """resnet (torch_bench.resnet), channels_last, carrying common.init_tensors' weights: each convolution's
    [out, in, kh, kw] as Keras' [kh, kw, in, out], BatchNormalization with PyTorch's eps 1e-5 and momentum 0.1 (Keras'
    0.9) and its initial weight 1 and bias 0 (Keras' defaults, as init_tensors gives them). A 3x3 convolution with
    stride 2 is ZeroPadding2D(1) and a "valid" one, as PyTorch's padding 1: Keras' "same" would pad only the bottom
    and right there, which computes another function."""
    L = keras.layers
    params = iter(t)
    convs = []

    def conv(x, filters, k, stride):
        if k == 3 and stride != 1:
            x = L.ZeroPadding2D(1)(x)
        layer = L.Conv2D(filters, k, strides=stride, padding="same" if k == 3 and stride == 1 else "valid",
                         use_bias=False)
        convs.append((layer, next(params)))
        return layer(x)

    def bn(x):
        next(params), next(params)  # the BatchNorm's weight (1) and bias (0): Keras' initial gamma and beta
        return L.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)
    inputs = keras.Input((28, 28, 1))
    x = L.ReLU()(bn(conv(inputs, 16, 3, 1)))
    cin = 16
    for cout, stride in C.RESNET_BLOCKS:
        y = bn(conv(L.ReLU()(bn(conv(x, cout, 3, stride))), cout, 3, 1))
        if stride != 1 or cin != cout:
            x = bn(conv(x, cout, 1, stride))
        x = L.ReLU()(L.Add()([y, x]))
        cin = cout
    dense = L.Dense(10)
    outputs = dense(L.GlobalAveragePooling2D()(x))
    model = keras.Model(inputs, outputs)
    for layer, w in convs:
        layer.set_weights([w.transpose(2, 3, 1, 0)])
    dense.set_weights([next(params).T, next(params)])
    return model


class PositionTable(keras.layers.Layer):
    """A learned position table [CONTEXT, WIDTH] added to every sequence (torch_bench.Positions)."""

    def build(self, input_shape):
        self.table = self.add_weight(shape=(C.CONTEXT, C.WIDTH), initializer="zeros", name="table")

    def call(self, x):
        return x + self.table


def gelu(x):
    """PyTorch's "gelu", the exact one (Keras' gelu defaults to the tanh approximation)."""
    return keras.activations.gelu(x, approximate=False)


def build_transformer(t):
    """transformer (torch_bench.TinyGPT) carrying common.init_tensors' weights: Embedding and PositionTable, then per
    layer x + MultiHeadAttention(4 heads of 32, use_causal_mask)(LayerNormalization(x)) and
    x + Dense(128)(Dense(512, exact GELU)(LayerNormalization(x))), a final LayerNormalization and Dense(256); every
    LayerNormalization with PyTorch's epsilon 1e-5. PyTorch's packed in_proj_weight [384, 128] gives the query, key
    and value kernels [128, heads, 32] (rows 0-127, 128-255, 256-383, transposed), its out_proj [128, 128] the output
    kernel [heads, 32, 128]."""
    L = keras.layers
    d, heads = C.WIDTH, C.HEADS
    hd = d // heads
    params = iter(t)
    ids = keras.Input((C.CONTEXT,), dtype="int32")
    tokens, positions = L.Embedding(C.VOCAB, d), PositionTable()
    x = positions(tokens(ids))
    blocks = []
    for _ in range(C.LAYERS):
        norm1, attention = L.LayerNormalization(epsilon=1e-5), L.MultiHeadAttention(heads, hd)
        norm2 = L.LayerNormalization(epsilon=1e-5)
        linear1, linear2 = L.Dense(C.FEEDFORWARD, activation=gelu), L.Dense(d)
        h = norm1(x)
        x = L.Add()([x, attention(h, h, use_causal_mask=True)])
        x = L.Add()([x, linear2(linear1(norm2(x)))])
        blocks.append((attention, linear1, linear2, norm1, norm2))
    norm, head = L.LayerNormalization(epsilon=1e-5), L.Dense(C.VOCAB)
    model = keras.Model(ids, head(norm(x)))
    tokens.set_weights([next(params)])
    positions.set_weights([next(params)])
    for attention, linear1, linear2, norm1, norm2 in blocks:
        w_in, b_in, w_out, b_out = (next(params) for _ in range(4))
        for k, dense in enumerate((attention._query_dense, attention._key_dense, attention._value_dense)):
            rows = slice(k * d, (k + 1) * d)
            dense.set_weights([w_in[rows].T.reshape(d, heads, hd), b_in[rows].reshape(heads, hd)])
        attention._output_dense.set_weights([w_out.T.reshape(heads, hd, d), b_out])
        for layer in (linear1, linear2):
            w, b = next(params), next(params)
            layer.set_weights([w.T, b])
        for layer in (norm1, norm2):
            layer.set_weights([next(params), next(params)])
    norm.set_weights([next(params), next(params)])
    w, b = next(params), next(params)
    head.set_weights([w.T, b])
    return model


def build_net(workload):
    """mnist_cnn / lstm / resnet / transformer carrying common.init_tensors' weights (PyTorch's layouts and default
    ranges), converted. mnist_cnn and resnet are channels_last, Keras' natural layout (input 28x28x1), so mnist_cnn's
    first Dense takes the flattened (h, w, c) features where PyTorch's takes (c, h, w): its rows are permuted to give
    the same function."""
    t = C.init_tensors(workload)
    L = keras.layers
    if workload == "resnet":
        return build_resnet(t)
    if workload == "transformer":
        return build_transformer(t)
    if workload == "mnist_cnn":
        model = keras.Sequential([keras.Input((28, 28, 1)), L.Conv2D(32, 3, activation="relu"),
                                  L.Conv2D(64, 3, activation="relu"), L.MaxPooling2D(2), L.Flatten(),
                                  L.Dense(128, activation="relu"), L.Dense(10)])
        conv1, conv2, dense1, dense2 = [lay for lay in model.layers if lay.weights]
        conv1.set_weights([t[0].transpose(2, 3, 1, 0), t[1]])  # [out, in, kh, kw] -> [kh, kw, in, out]
        conv2.set_weights([t[2].transpose(2, 3, 1, 0), t[3]])
        dense1.set_weights([t[4].reshape(128, 64, 12, 12).transpose(2, 3, 1, 0).reshape(9216, 128), t[5]])
        dense2.set_weights([t[6].T, t[7]])
    else:
        # LSTM(128) returns its final hidden state; gates i, f, c, o in the order of PyTorch's i, f, g, o. Keras has
        # one bias where PyTorch has bias_ih + bias_hh: it starts as their sum (and then gets one Adam update per
        # step where PyTorch's pair gets two, so the losses part slightly).
        model = keras.Sequential([keras.Input((28, 28)), L.LSTM(128), L.Dense(10)])
        lstm, dense = [lay for lay in model.layers if lay.weights]
        lstm.set_weights([t[0].T, t[1].T, t[2] + t[3]])
        dense.set_weights([t[4].T, t[5]])
    return model


def net_data(workload):
    """The training set (Fashion-MNIST's for resnet) normalised as bench/ladder's and shaped for the workload (NHWC
    for mnist_cnn and resnet), labels, and the seeded epoch order; for transformer the text windows and their
    next-token targets (int32, JAX's integers) in their order."""
    if workload == "transformer":
        x, y = C.text_batches(args.data)
        return x.astype(np.int32), y.astype(np.int32), np.arange(len(x))
    subdir, mean, std = C.dataset_of(workload)
    images, labels = C.load_mnist(args.data, subdir)
    shape = (28, 28) if workload == "lstm" else (28, 28, 1)
    return C.normalise_mnist(images, mean, std).reshape((-1,) + shape), labels, C.permutation(len(labels))


def batch_size(workload):
    return C.TEXT_BATCH if workload == "transformer" else C.BATCH_SIZE


def optimizer_for(workload):
    """Adam(1e-3) with PyTorch's epsilon; AdamW(2e-3, weight decay 0.01) for transformer."""
    if workload == "transformer":
        return keras.optimizers.AdamW(C.ADAMW_LR, weight_decay=C.ADAMW_WEIGHT_DECAY, epsilon=1e-8)
    return keras.optimizers.Adam(1e-3, epsilon=1e-8)


def loss_for(workload):
    if workload == "seed_regression":
        return keras.losses.MeanSquaredError()
    if workload == "tiny_op":
        return lambda y_true, y_pred: keras.ops.sum(y_pred)
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def to_backend(a):
    if B == "jax":
        return jnp.asarray(a)
    if B == "torch":
        return torch.from_numpy(np.ascontiguousarray(a))
    return tf.convert_to_tensor(a)


def sync(x):
    if B == "jax":
        x.block_until_ready()
    return float(x)


class BatchTimes(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.t = []

    def on_train_batch_end(self, batch, logs=None):
        self.t.append(now())


# ---------------------------------------------------------------- keras_fit
def fit_fixed(workload, x, y):
    model = build(workload)
    model.compile(optimizer=keras.optimizers.Adam(1e-3, epsilon=1e-8), loss=loss_for(workload))
    steps = args.steps or C.default_steps(workload, args.quick)
    bs = len(x)
    t0 = now()
    model.fit(np.tile(x, (10, 1)), np.tile(y, (10,) + (1,) * (y.ndim - 1)), batch_size=bs, epochs=1,
              shuffle=False, verbose=0)  # 10 warm-up steps, includes tracing/compilation
    info("keras_fit", workload, warmup_s="%.3f" % (now() - t0))
    xt, yt = np.tile(x, (steps, 1)), np.tile(y, (steps,) + (1,) * (y.ndim - 1))
    times = []
    for _ in range(args.reps):
        t0 = now()
        h = model.fit(xt, yt, batch_size=bs, epochs=1, shuffle=False, verbose=0)
        times.append((now() - t0) / steps * 1e6)
    C.result("keras_fit", VERSION, workload, args.threads, times, -1, h.history["loss"][-1])


def fit_mnist():
    images, labels = C.load_mnist(args.data)
    perm = C.permutation(len(labels))
    t0 = now()
    X = (images[perm].astype(np.float32) / 255.0)
    Y = labels[perm]
    info("keras_fit", "mnist_mlp", preload_s="%.3f" % (now() - t0))
    model = build("mnist_mlp")
    model.compile(optimizer=keras.optimizers.Adam(1e-3, epsilon=1e-8), loss=loss_for("mnist_mlp"))
    cb = BatchTimes()
    t0 = now()
    h = model.fit(X, Y, batch_size=64, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    epoch = now() - t0
    iv = np.diff(np.array([t0] + cb.t)) * 1e6
    info("keras_fit", "mnist_mlp", epoch_s="%.3f" % epoch, steps=len(iv), mean_step_us="%.1f" % iv.mean(),
         first_step_s="%.3f" % (iv[0] / 1e6), samples=len(Y),
         note="step_us=median_interval_between_batches_incl_data_pipeline")
    C.result("keras_fit", VERSION, "mnist_mlp", args.threads, list(iv), -1, h.history["loss"][-1])


def fit_batches(workload):
    """mnist_cnn / lstm / resnet / transformer: one model.fit over the warm-up steps and then every repetition's `steps` steps (the
    ladder's batches: the first BATCHES[workload] of the seeded epoch, cycled), so fit's own setup and compilation
    fall on the first step only. A step is the interval between batch ends (data pipeline included, data_us=-1;
    the callback makes fit wait for each batch's loss); a repetition's time is the mean over its steps."""
    t0 = now()
    X, Y, perm = net_data(workload)
    nb, bs = C.BATCHES[workload], batch_size(workload)
    steps = args.steps or C.default_steps(workload, args.quick)
    warmup = C.warmup_steps(steps)
    order = [i % nb for i in range(warmup)] + [i % nb for _ in range(args.reps) for i in range(steps)]
    idx = np.concatenate([perm[b * bs:(b + 1) * bs] for b in order])
    Xs, Ys = X[idx], Y[idx]
    info("keras_fit", workload, preload_s="%.3f" % (now() - t0))
    model = build_net(workload)
    model.compile(optimizer=optimizer_for(workload), loss=loss_for(workload))
    cb = BatchTimes()
    t0 = now()
    h = model.fit(Xs, Ys, batch_size=bs, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    t = np.array(cb.t)
    times = [(t[warmup - 1 + (r + 1) * steps] - t[warmup - 1 + r * steps]) / steps * 1e6 for r in range(args.reps)]
    info("keras_fit", workload, first_step_s="%.3f" % (t[0] - t0), warmup_steps=warmup, steps=steps,
         reps=args.reps, batches=nb, note="step_us=interval_between_batches_incl_data_pipeline")
    C.result("keras_fit", VERSION, workload, args.threads, times, -1, h.history["loss"][-1])


# ---------------------------------------------------------------- keras_loop
def make_step(model, loss_fn, opt, update=True):
    """Returns (step(x, y) -> loss, finish()) for the backend."""
    if B == "jax":
        opt.build(model.trainable_variables)
        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]
        ov = [v.value for v in opt.variables]

        def compute(tv, ntv, x, y):
            yp, ntv = model.stateless_call(tv, ntv, x, training=True)
            return loss_fn(y, yp), ntv
        grad_fn = jax.value_and_grad(compute, has_aux=True)

        @jax.jit
        def train_step(state, x, y):
            tv, ntv, ov = state
            (loss, ntv), grads = grad_fn(tv, ntv, x, y)
            if update:
                tv, ov = opt.stateless_apply(ov, grads, tv)
            else:
                loss = loss + 0.0 * grads[0].sum()
            return loss, (tv, ntv, ov)
        state = [(tv, ntv, ov)]

        def step(x, y):
            loss, state[0] = train_step(state[0], x, y)
            return loss

        def finish():
            tv, ntv, ov = state[0]
            for v, a in zip(model.trainable_variables, tv):
                v.assign(a)
        return step, finish
    if B == "torch":
        def step(x, y):
            yp = model(x, training=True)
            loss = loss_fn(y, yp)
            model.zero_grad()
            loss.backward()
            if update:
                tvs = model.trainable_weights
                opt.apply([v.value.grad for v in tvs], tvs)
            return loss.detach()
        return step, lambda: None
    # tensorflow: the GradientTape loop, in a tf.function

    @tf.function(jit_compile=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        if update:
            opt.apply(grads, model.trainable_variables)
        return loss
    return step, lambda: None


def loop_fixed(workload, x, y):
    model = build(workload)
    step, finish = make_step(model, loss_for(workload), keras.optimizers.Adam(1e-3, epsilon=1e-8))
    xb, yb = to_backend(x), to_backend(y)
    t0 = now()
    for _ in range(10):
        loss = step(xb, yb)
    sync(loss)
    info("keras_loop", workload, warmup_s="%.3f" % (now() - t0))
    steps = args.steps or C.default_steps(workload, args.quick)
    times = []
    for _ in range(args.reps):
        t0 = now()
        for _ in range(steps):
            loss = step(xb, yb)
        sync(loss)
        times.append((now() - t0) / steps * 1e6)
    C.result("keras_loop", VERSION, workload, args.threads, times, -1, sync(loss))


def loop_mnist():
    images, labels = C.load_mnist(args.data)
    t0 = now()
    X = images.astype(np.float32) / 255.0
    perm = C.permutation(len(labels))
    info("keras_loop", "mnist_mlp", preload_s="%.3f" % (now() - t0))
    model = build("mnist_mlp")
    step, finish = make_step(model, loss_for("mnist_mlp"), keras.optimizers.Adam(1e-3, epsilon=1e-8))
    dt, st = [], []
    t_epoch = now()
    for s in range(0, len(labels), 64):
        t0 = now()
        idx = perm[s:s + 64]
        xb, yb = to_backend(X[idx]), to_backend(labels[idx])
        t1 = now()
        loss = step(xb, yb)
        lv = sync(loss)  # per-step sync so that step and data times separate (loss.item() cost on CPU)
        t2 = now()
        dt.append((t1 - t0) * 1e6)
        st.append((t2 - t1) * 1e6)
    epoch = now() - t_epoch
    info("keras_loop", "mnist_mlp", epoch_s="%.3f" % epoch, steps=len(st), mean_step_us="%.1f" % np.mean(st),
         mean_data_us="%.1f" % np.mean(dt), first_step_s="%.3f" % (st[0] / 1e6), samples=len(labels))
    C.result("keras_loop", VERSION, "mnist_mlp", args.threads, st, float(np.median(dt)), lv)


def loop_batches(workload):
    """mnist_cnn / lstm / resnet / transformer: the jitted step over the ladder's batches (numpy fancy-index batch, timed apart, and a
    per-step block_until_ready as in loop_mnist); warm-up, then repetitions of `steps` steps."""
    t0 = now()
    X, Y, perm = net_data(workload)
    info("keras_loop", workload, preload_s="%.3f" % (now() - t0))
    nb, bs = C.BATCHES[workload], batch_size(workload)
    model = build_net(workload)
    step, _ = make_step(model, loss_for(workload), optimizer_for(workload))

    def batch(b):
        idx = perm[b * bs:(b + 1) * bs]
        return to_backend(X[idx]), to_backend(Y[idx])
    steps = args.steps or C.default_steps(workload, args.quick)
    t = C.CycledTiming(lambda xb, yb: sync(step(xb, yb)), batch, nb, steps, args.reps)
    info("keras_loop", workload, first_step_s="%.3f" % t.first, warmup_steps=t.warmup, steps=steps, reps=args.reps,
         batches=nb, mean_data_us="%.1f" % np.mean(t.data_us))
    C.result("keras_loop", VERSION, workload, args.threads, t.times, float(np.median(t.data_us)), t.last)


# ---------------------------------------------------------------- tiny_op
def tiny(system):
    model = build("tiny_op")
    x = C.tiny_input()
    n = args.steps or C.default_steps("tiny_op", args.quick)
    if system == "keras_fit":
        # forward: predict_on_batch; step: train_on_batch (forward + backward + Adam update, loss = sum(output))
        model.compile(optimizer=keras.optimizers.Adam(1e-3, epsilon=1e-8), loss=loss_for("tiny_op"))
        y = np.zeros((1, 8), np.float32)
        fns = (("tiny_op_forward", lambda: model.predict_on_batch(x)),
               ("tiny_op_step", lambda: model.train_on_batch(x, y)))
        n = max(200, n // 10)
    else:
        # forward: eager model(x) call; step: the loop's compiled value_and_grad (forward + backward, no update)
        xb = to_backend(x)
        yb = to_backend(np.zeros((1, 8), np.float32))
        step, _ = make_step(model, loss_for("tiny_op"), keras.optimizers.Adam(1e-3, epsilon=1e-8), update=False)
        fns = (("tiny_op_forward", lambda: model(xb)), ("tiny_op_step", lambda: step(xb, yb)))
    for name, fn in fns:
        for _ in range(50):
            out = fn()
        times = []
        for _ in range(args.reps):
            t0 = now()
            for _ in range(n):
                out = fn()
            v = float(np.sum(np.asarray(out)))
            times.append((now() - t0) / n * 1e6)
        C.result(system, VERSION, name, args.threads, times, -1, v, decimals=3)


def info(system, workload, **kw):
    C.info(system=system, version=VERSION, workload=workload, threads=args.threads, **kw)


def main():
    for system in args.systems:
        for w in args.workloads:
            try:
                if w == "seed_regression":
                    x, y = C.regression_data()
                    (fit_fixed if system == "keras_fit" else loop_fixed)(w, x, y)
                elif w == "wide_mlp":
                    x, y = C.wide_data()
                    (fit_fixed if system == "keras_fit" else loop_fixed)(w, x, y)
                elif w == "mnist_mlp":
                    (fit_mnist if system == "keras_fit" else loop_mnist)()
                elif w in C.BATCHES:
                    (fit_batches if system == "keras_fit" else loop_batches)(w)
                else:
                    tiny(system)
            except Exception as e:
                if os.environ.get("PEER_DEBUG"):
                    raise
                for name in (["tiny_op_forward", "tiny_op_step"] if w == "tiny_op" else [w]):
                    C.result(system, VERSION, name, args.threads, status="unavailable", reason=C.reason_of(e))


if __name__ == "__main__":
    main()
