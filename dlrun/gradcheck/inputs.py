"""Inputs from what a layer declares: shapes with symbolic dims, value kinds, labels, indices.

Two shape configurations are used, each with all dims distinct and the two differing in
which of N and D is larger, so a transposed gradient or a loop over the wrong axis (the
seed-000 bug: ``range(X.shape[1])`` for N samples) cannot hide behind equal sizes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import registry
from ..backend import array_module, ensure_fits
from ..errors import ConfigError, ShapeError
from ..registry.options import component_registry

# N is the batch; per-sample symbols are D, C, H, W, T, V (vocabulary), K.
DIM_CONFIGS = (
    {"N": 7, "D": 3, "C": 4, "H": 5, "W": 6, "T": 2, "V": 9, "K": 8},
    {"N": 3, "D": 5, "C": 2, "H": 4, "W": 7, "T": 6, "V": 8, "K": 9},
)
FLOAT_KINDS = ("float", "positive", "prob")


@dataclass
class Point:
    """One random point: the float (or index) input x and the labels y (or None)."""

    x: np.ndarray
    y: np.ndarray | None


def dims_text(dims: dict | None, shape=None) -> str:
    if dims is None:
        return f"x {tuple(shape)}" if shape is not None else ""
    return " ".join(f"{k}={v}" for k, v in dims.items() if k in ("N", "D", "C") or v is not None)


def bind(value, dims: dict | None):
    """A dim name ("C") becomes its size; anything else is returned unchanged."""
    if dims is not None and isinstance(value, str) and value in dims:
        return dims[value]
    return value


class JoinedShape(tuple):
    """The per-sample shape of a layer's several inputs checked as one input: their sizes side by
    side, ``(Σ sizeᵢ,)``; ``parts`` holds each input's own shape (see :func:`joined`)."""

    parts: tuple = ()


def joined_shape(parts) -> JoinedShape:
    """The :class:`JoinedShape` of inputs of per-sample shapes ``parts``."""
    parts = tuple(tuple(int(d) for d in p) for p in parts)
    shape = JoinedShape((sum(math.prod(p) for p in parts),))
    shape.parts = parts
    return shape


def shape_of(input_shape) -> tuple:
    """A given per-sample input shape as a tuple (a :class:`JoinedShape` kept as it is)."""
    return input_shape if isinstance(input_shape, JoinedShape) else tuple(input_shape)


def per_sample_shape(spec, dims: dict) -> tuple[int, ...]:
    if spec.inputs:  # a layer with several inputs: checked as one input, their values side by side
        return joined_shape(per_sample_shape(type(spec)(shape=tuple(s)), dims) for s in spec.inputs)
    shape = tuple(bind(s, dims) for s in spec.shape)
    bad = [s for s in shape if not isinstance(s, int)]
    if bad:
        raise ConfigError(f"input_spec shape {spec.shape} uses unknown dim {bad[0]!r}; "
                          f"known dims: {', '.join(DIM_CONFIGS[0])}")
    return shape


def layer_options(spec, dims: dict | None, user: dict) -> dict:
    """The spec's default options with dims bound, overridden by the user's ``--set`` options,
    where a dim name is bound too (``--set units=D``: a square weight in every configuration).

    Without dims (a layer inside a model) only the user's (the config's) options are used.
    """
    if dims is None:
        return dict(user)
    opts = {k: bind(v, dims) for k, v in spec.options.items()}
    opts.update({k: bind(v, dims) for k, v in user.items()})
    return opts


def built_with(name: str, given: dict) -> dict:
    """The layer as a check builds it: ``{"layer": "Linear(units=4, use_bias=True)", "options":
    {...}}``, the options given (the spec's with dims bound, the user's ``--set``) and the defaults
    that shape the function (numbers, booleans, strings, tuples; not initializers or regularizers,
    which parameters redrawn at every point make moot), in the constructor's order."""
    shown = {}
    for o in registry.layers.options(name):
        if o.name in given:
            shown[o.name] = given[o.name]
        elif (isinstance(o.default, (bool, int, float, str, tuple)) and not o.required
              and component_registry(o.hint) is None):
            shown[o.name] = o.default
    shown.update({k: v for k, v in given.items() if k not in shown})
    text = ", ".join(f"{k}={v!r}" for k, v in shown.items())
    return {"layer": f"{name}({text})", "options": {k: _plain(v) for k, v in shown.items()}}


def _plain(v):
    """An option value as JSON writes it (a tuple as a list; an object by its repr)."""
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return repr(v)


def build_layer(name: str, options: dict, path: str):
    """Instantiate through the registry so options are validated like config values; a layer
    with several inputs comes back as its :func:`joined` form."""
    layer = registry.layers.build({"type": name, **options}, path)
    if layer.num_inputs != 1:
        if not type(layer).input_spec.inputs:
            raise ConfigError(f"{name} takes several inputs: declare their shapes for the check, e.g. "
                              f"input_spec = InputSpec(inputs=((\"D\",), (\"D\",)))", path)
        layer.__class__ = joined(type(layer))
    return layer


_JOINED: dict = {}


def joined(cls):
    """``cls`` (a layer with several inputs) as a layer with one: its input x of per-sample shape
    :class:`JoinedShape` holds the inputs side by side (each a strided view of x, reshaped), and
    backward returns their gradients side by side, so the check of dL/dx checks every input's
    gradient, and each perturbation of x perturbs one element of one input."""
    if cls in _JOINED:
        return _JOINED[cls]

    def build(self, input_shape):
        parts = getattr(input_shape, "parts", None)
        if not parts:
            raise ShapeError(f"{cls.__name__} takes {len(cls.input_spec.inputs)} inputs; give their shapes with "
                             f"--dims, not --input-shape")
        self._joined = [(math.prod(p), tuple(p)) for p in parts]
        return cls.build(self, *parts)

    def forward(self, x, y=None):
        xs, at = [], 0
        for size, shape in self._joined:
            xs.append(x[:, at:at + size].reshape(len(x), *shape))
            at += size
        return cls.forward(self, *xs)

    def backward(self, dy):
        ds = cls.backward(self, dy)
        if not isinstance(ds, (tuple, list)) or len(ds) != len(self._joined):
            got = f"a {type(ds).__name__} of {len(ds)}" if isinstance(ds, (tuple, list)) else f"one {type(ds).__name__}"
            raise TypeError(f"backward returned {got}; a layer with {len(self._joined)} inputs returns a tuple "
                            f"of {len(self._joined)} gradients, one per input")
        if any(d is None for d in ds):
            return None
        bad = [f"input {m}: {getattr(d, 'shape', type(d).__name__)}" for m, (d, (_, shape)) in
               enumerate(zip(ds, self._joined)) if tuple(getattr(d, "shape", ())) != (len(dy), *shape)]
        if bad:
            raise ValueError(f"backward returned gradients of the wrong shape ({'; '.join(bad)}); each has its "
                             f"input's shape, {' and '.join(str((len(dy), *s)) for _, s in self._joined)}")
        return array_module(dy).concatenate([d.reshape(len(d), -1) for d in ds], axis=1)

    _JOINED[cls] = type(cls.__name__, (cls,), {"build": build, "forward": forward, "backward": backward,
                                               "num_inputs": 1, "__module__": cls.__module__,
                                               "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
    return _JOINED[cls]


def labels(n: int, classes: int, rng) -> np.ndarray:
    """int64 labels in [0, classes): every class present when n >= classes, and a repeat."""
    classes = max(int(classes), 1)
    if n >= classes:
        y = np.concatenate([np.arange(classes), rng.integers(0, classes, n - classes)])
        if n == classes and n > 1:
            y[-1] = y[0]  # force a repeated label (scatter-add bugs hide without one)
    else:
        y = rng.integers(0, classes, n)
        if n > 1:
            y[-1] = y[0]
    return rng.permutation(y).astype(np.int64)


def repeat_note(layer, spec, dims: dict | None, out_shape: tuple, n: int) -> str | None:
    """A warning when a labelled layer is checked on so few rows that only one label repeats: a
    backward that drops repeated labels (``w_grad[y] += v`` keeps one of each) can then pass."""
    classes = label_count(spec, dims, out_shape, layer) if layer.needs_labels else 0
    if not layer.needs_labels or n > classes + 1:
        return None
    return (f"few repeated labels: with N={n} rows for {classes} classes only one label "
            f"repeats, so a backward that drops repeated labels may pass; also check with more rows (the "
            f"default --dims)")


def draw_x(spec, batch_shape: tuple, high, dtype, rng) -> np.ndarray:
    """Values of the declared kind: float N(0,1), positive U[0.5,2], prob rows, index ints."""
    kind = spec.kind
    if kind == "float":
        x = rng.standard_normal(batch_shape)
    elif kind == "positive":
        x = rng.uniform(0.5, 2.0, batch_shape)
    elif kind == "prob":
        e = np.exp(rng.standard_normal(batch_shape))
        x = e / e.sum(axis=-1, keepdims=True)
    elif kind == "index":
        hi = max(int(high), 1)
        x = rng.integers(0, hi, batch_shape).astype(np.int64)
        if x.size > 1:
            x.flat[-1] = x.flat[0]  # a duplicate index
        return x
    else:
        raise ConfigError(f"input_spec kind {kind!r} is not one of float, positive, prob, index")
    return np.ascontiguousarray(x.astype(dtype))


def index_high(spec, dims: dict | None, layer) -> int:
    """The exclusive bound of index inputs: the layer's own (its option bound to ``high``, as
    Embedding's input_dim to D), else ``high``'s size in ``dims``."""
    h = spec.index_bound(layer)
    if h is None and isinstance(spec.high, str) and dims and spec.high in dims:
        h = bind(spec.high, dims)
    if not isinstance(h, (int, np.integer)):
        raise ConfigError(f"input_spec high={spec.high!r} is not a dim or an option of the layer")
    return int(h)


def label_count(spec, dims: dict | None, out_shape: tuple, layer=None) -> int:
    """How many classes labels are drawn from: ``spec.labels`` (an int, or a dim name: the layer
    option bound to that dim, else the dim's size in ``dims``, else an option named like it),
    else the output size."""
    c = spec.labels
    if isinstance(c, str):
        # the option the spec binds to that dim (options={"classes": "C"}) holds its value, also
        # when --set gave it another than the dim's; else the dim, else an option named like it
        bound = [k for k, v in spec.options.items() if v == c]
        value = getattr(layer, bound[0], None) if bound and layer is not None else None
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            c = value
        else:
            c = dims[c] if dims and c in dims else getattr(layer, c, None)
    if not isinstance(c, (int, np.integer)) or isinstance(c, bool):
        c = out_shape[-1] if out_shape else 1
    return int(c)


def fresh_layer(name: str, spec, dims, options: dict, shape: tuple, device, dtype, seed: int):
    """A new instance of the layer, set up and built as the checked one was (nothing called yet)."""
    layer = build_layer(name, layer_options(spec, dims, options), name)
    layer.setup(device.backend, dtype, np.random.default_rng(seed), seed)
    layer.build(shape)
    return layer


def redraw_params(layer, rng, device) -> None:
    """Trainable parameters get N(0,1) values in place (tiny training inits make poor checks)."""
    for p in layer.params.values():
        if p.trainable:
            device.assign(p.data, rng.standard_normal(p.data.shape))


def draw_point(spec, dims, shape, out_shape, n, layer, settings, rng) -> Point:
    """A random point of the layer's input kind (and labels when it takes them) for a batch of n."""
    high = index_high(spec, dims, layer) if spec.kind == "index" else None
    # the float64 draw, x in the checked dtype, its perturbed copy and gradient; the output, its
    # gradient and the perturbed outputs: refused before anything is allocated (Linux would grant
    # the arrays and kill the process when they are touched)
    item = np.dtype(settings.np_dtype).itemsize
    values = float(n) * math.prod(shape)
    ensure_fits(values * (8 + 3 * item) + float(n) * math.prod(out_shape) * 4 * item,
                f"{type(layer).__name__}'s check with x of shape {(n, *shape)} in {np.dtype(settings.np_dtype).name}")
    x = draw_x(spec, (n, *shape), high, settings.np_dtype, rng)
    y = None
    if layer.needs_labels:
        y = labels(n, label_count(spec, dims, out_shape, layer), rng)
    return Point(x, y)


def dims_label(spec, dims, input_shape) -> str:
    """'N=7 D=3 C=4' (the dims the layer uses), or 'x (N, 3, 8, 8)' inside a whole model."""
    if dims is None:
        return f"x (N, {', '.join(map(str, input_shape))})"
    used = ["N", *[s for s in spec.shape if isinstance(s, str)],
            *[v for v in (*spec.options.values(), spec.labels, spec.high) if isinstance(v, str) and v in dims]]
    seen = list(dict.fromkeys(u for u in used if u in dims))
    return " ".join(f"{k}={dims[k]}" for k in seen)
