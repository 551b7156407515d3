"""JAX side of a CPU workload: the same layers, initial weights, data, batch order and optimizer, one
``jax.jit`` compiled training step called per batch (the usual JAX training loop).

The dlrun model is built first (same seed, numpy-drawn weights); each layer becomes a pure
function of its parameters, which start as copies of the dlrun layer's arrays. The step takes
the parameters, the optimizer's slots and the epoch's running loss sum and returns their new
values, so each batch is one call of the compiled function (a last, smaller batch compiles a
second shape once, in the untimed warm-up run). Dropout draws from JAX's own generator: the
same rate, other draws, so a workload with Dropout ends at a different loss.
"""
from __future__ import annotations

import time
from functools import partial

import numpy as np

import bench_dlrun
from workloads import Workload

try:  # an optional extra: pip install -e '.[jax]'
    import jax
    import jax.numpy as jnp
except ImportError:  # the benchmark says so in its column
    jax = jnp = None


class Unsupported(Exception):
    """The workload uses a dlrun layer, loss or optimizer this translator does not know, or JAX is not installed."""


def _linear(layer, out_shape):
    params = {"weight": layer.params["weight"].data}
    if "bias" in layer.params:
        params["bias"] = layer.params["bias"].data

    def f(p, x, key, training):
        y = x @ p["weight"].T
        return y + p["bias"] if "bias" in p else y

    return f, params


def _conv(layer, out_shape):
    pad = layer.padding.upper() if isinstance(layer.padding, str) else [(p, p) for p in layer.padding]
    params = {"weight": layer.params["weight"].data}
    if "bias" in layer.params:
        params["bias"] = layer.params["bias"].data

    def f(p, x, key, training):
        y = jax.lax.conv_general_dilated(x, p["weight"], window_strides=layer.stride, padding=pad,
                                         rhs_dilation=layer.dilation, dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y + p["bias"][None, :, None, None] if "bias" in p else y

    return f, params


def _maxpool(layer, out_shape):
    size = layer.pool_size
    stride = getattr(layer, "stride", None) or size
    size, stride = (size, size) if isinstance(size, int) else tuple(size), (
        (stride, stride) if isinstance(stride, int) else tuple(stride))

    def f(p, x, key, training):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, *size), (1, 1, *stride), "VALID")

    return f, {}


def _dropout(layer, out_shape):
    rate = layer.rate

    def f(p, x, key, training):
        if not training or rate == 0:
            return x
        keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
        return jnp.where(keep, x / (1.0 - rate), 0.0)

    return f, {}


_LAYERS = {
    "Linear": _linear,
    "Conv2D": _conv,
    "MaxPool2D": _maxpool,
    "Dropout": _dropout,
    "ReLU": lambda layer, shape: ((lambda p, x, key, training: jax.nn.relu(x)), {}),
    "Flatten": lambda layer, shape: ((lambda p, x, key, training: x.reshape(x.shape[0], -1)), {}),
}


def _optimizer(opt, decay: list[dict], regularizer):
    """(slot names, update(params, grads, slots, t) -> (params, slots)) as torch.optim does it: coupled
    L2 weight decay 2λw on the regularized tensors (``decay``: per layer, per parameter)."""
    name = type(opt).__name__
    wd = 0.0
    if regularizer is not None:
        if type(regularizer).__name__ != "L2":
            raise Unsupported(f"regularizer {type(regularizer).__name__}")
        wd = 2.0 * regularizer.strength  # dlrun's L2 gradient is 2λw
    lr = opt.learning_rate

    def decayed(params, grads):
        if not wd:
            return grads
        return [{k: g[k] + wd * params[i][k] if decay[i][k] else g[k] for k in g} for i, g in enumerate(grads)]

    tree = jax.tree_util.tree_map
    if name == "SGD":
        mom, nesterov = opt.momentum, opt.nesterov

        def update(params, grads, slots, t):
            grads = decayed(params, grads)
            if not mom:
                return tree(lambda w, g: w - lr * g, params, grads), slots
            (v,) = slots
            v = tree(lambda v, g: mom * v + g, v, grads)
            step = tree(lambda g, v: g + mom * v, grads, v) if nesterov else v
            return tree(lambda w, s: w - lr * s, params, step), (v,)

        return (1 if mom else 0), update
    if name == "Adam":
        b1, b2, eps = opt.beta1, opt.beta2, opt.epsilon

        def update(params, grads, slots, t):
            grads = decayed(params, grads)
            m, v = slots
            m = tree(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
            v = tree(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
            c1, c2 = 1 - b1 ** t, 1 - b2 ** t
            new = tree(lambda w, m, v: w - lr * (m / c1) / (jnp.sqrt(v / c2) + eps), params, m, v)
            return new, (m, v)

        return 2, update
    raise Unsupported(f"optimizer {name}")


def prepare(w: Workload, device: str = "cpu"):
    """Return ``run() -> (wall seconds, CPU seconds, final_loss)``; the final loss is the last epoch's
    mean batch loss, as dlrun's and torch's."""
    if jax is None:
        raise Unsupported("JAX is not installed (pip install -e '.[jax]')")
    if device != "cpu":
        raise Unsupported("the JAX column runs on the CPU only")
    trainer, x, y, epochs, cfg = bench_dlrun.build(w)
    dl_model = trainer.model
    if type(trainer.loss).__name__ != "SoftmaxCrossEntropy" or trainer.loss.label_smoothing:
        raise Unsupported(f"loss {trainer.loss!r}")
    fns, init = [], []
    for layer, shape in zip(dl_model.layers, dl_model.shapes):
        make = _LAYERS.get(type(layer).__name__)
        if make is None:
            raise Unsupported(f"no JAX translation of dlrun layer {type(layer).__name__}")
        f, params = make(layer, shape)
        fns.append(f)
        init.append({k: np.array(v, dtype=np.float32) for k, v in params.items()})
    regularizer = trainer.training_step.regularized[0][1] if trainer.training_step.regularized else None
    decay = [{k: regularizer is not None and layer.params[k].regularize for k in p} for layer, p in
             zip(dl_model.layers, init)]
    slots, update = _optimizer(trainer.optimizer, decay, regularizer)
    n = len(x)
    bs = n if trainer.batch_size is None else min(trainer.batch_size, n)
    xj = jnp.asarray(np.ascontiguousarray(x, dtype=np.float32))
    yj = jnp.asarray(y.astype(np.int32))
    del trainer, dl_model

    seed = jax.random.key(0)

    def loss_fn(params, xb, yb, key):
        h = xb
        for i, (f, p) in enumerate(zip(fns, params)):
            h = f(p, h, jax.random.fold_in(key, i), True)
        logp = jax.nn.log_softmax(h, axis=1)
        return -jnp.mean(jnp.take_along_axis(logp, yb[:, None], axis=1))

    # the step count t (Adam's bias correction, Dropout's key) and the loss sum stay on the
    # device, inside the step's arguments and results: one call of the compiled step per batch
    @partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, state, total, xb, yb):
        slots, t = state
        t = t + 1
        loss, grads = jax.value_and_grad(loss_fn)(params, xb, yb, jax.random.fold_in(seed, t))
        params, slots = update(params, grads, slots, t)
        return params, (slots, t), total + loss * xb.shape[0]

    batches = [(xj[s:s + bs], yj[s:s + bs]) for s in range(0, n, bs)]

    def run():
        params = jax.tree_util.tree_map(jnp.array, init)  # copies: the step donates its inputs
        state = (tuple(jax.tree_util.tree_map(jnp.zeros_like, params) for _ in range(slots)), jnp.zeros((), jnp.int32))
        jax.block_until_ready((params, state))
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(epochs):
            total = jnp.zeros((), jnp.float32)
            for xb, yb in batches:
                params, state, total = train_step(params, state, total, xb, yb)
        last = float(total) / n
        return time.perf_counter() - t0, time.process_time() - c0, last

    return run
