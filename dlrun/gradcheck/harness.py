"""Calls one layer instance the way a check needs: state frozen, randomness reseeded, errors named.

Before every forward the layer's declared ``state`` is restored to its frozen value (annealed
coefficients, running statistics) and a stochastic layer gets the same freshly seeded
``layer.rng``; so f(θ+h), f(θ−h) and the analytic pass see the same function.
"""
from __future__ import annotations

import copy
import numbers

import numpy as np

from ..backend import to_host
from ..model import contract
from ..model.contract import output_shape, source_line
from ..errors import ShapeError
from ..layers.base import Layer
from . import kinks


class LayerRaised(Exception):
    """The layer's own code raised; ``call`` says which (build, forward, backward, ...)."""

    def __init__(self, call: str, error: BaseException, where: str = "", layer=None):
        self.call, self.error, self.where = call, error, where
        at = source_line(layer, error) if layer is not None else ""
        self.what = f"{call} raised {type(error).__name__}: {error}{at}"  # without where it was checked
        super().__init__(self.what + (f" ({where})" if where else ""))


class ContractError(Exception):
    """The layer broke the contract in a way that stops the check (a missing state attribute)."""


def build(layer, shape: tuple, where: str) -> tuple[int, ...]:
    """Build ``layer`` for per-sample ``shape``; its output shape, whose sizes must be >= 1."""
    try:
        out = layer.build(shape)
    except Exception as e:
        raise LayerRaised("build", e, f"input shape {shape}", layer) from e
    try:
        return output_shape(layer, out, shape)
    except ShapeError as e:
        # sizes below 1: --dims too small for the layer's options (nothing to check); else a bug
        small = "integer >= 1" in e.message and "is the input too small" in e.message
        hint = "; choose --dims that leave every output size >= 1" if small else ""
        raise ContractError(f"{e.message} ({where}){hint}") from None


def snapshot_state(layer) -> dict:
    """Deep copies of the attributes the layer declares in ``state``."""
    out = {}
    for attr in layer.state:
        if not hasattr(layer, attr):
            raise ContractError(f"{type(layer).__name__} declares state {attr!r} but has no attribute {attr!r} after build")
        out[attr] = copy.deepcopy(getattr(layer, attr))
    return out


def restore_state(layer, frozen: dict) -> None:
    """Put declared state back: arrays in place (the layer may hold references), others by value."""
    for attr, value in frozen.items():
        cur = getattr(layer, attr, None)
        if hasattr(cur, "shape") and hasattr(value, "shape") and cur.shape == value.shape:
            cur[...] = value
        else:
            setattr(layer, attr, copy.deepcopy(value))


def state_changes(layer, frozen: dict) -> list[str]:
    """Names of declared state attributes that differ from their frozen value."""
    return [a for a, v in frozen.items() if not _equal(getattr(layer, a, None), v)]


def public_scalars(layer) -> dict:
    """Undeclared public numeric attributes: a step must not change them (hidden counters, β)."""
    skip = {"training", "rng", "backend", "xp", "dtype", "params", "spec", *layer.state}
    return {k: v for k, v in vars(layer).items()
            if not k.startswith("_") and k not in skip and isinstance(v, (numbers.Number, np.generic))
            and not isinstance(v, bool)}


def public_arrays(layer) -> dict:
    """Host copies of undeclared public float arrays that are not parameters (running statistics
    kept as plain attributes): a step that changes them is hidden state, not saved in checkpoints."""
    return {k: np.array(to_host(v)) for k, v in contract.loose_arrays(layer).items()}


def loose_arrays(name: str, layer) -> str | None:
    """A warning naming the float arrays a built layer keeps outside its parameters and state
    (neon-style ``self.W``): nothing trains, checks or saves them."""
    loose = ", ".join(f"{k} {tuple(v.shape)}" for k, v in public_arrays(layer).items())
    return (f"{name} keeps float arrays that are not parameters: {loose}. dlrun does not train, check or save "
            f"them: create weights with self.add_param, and declare running statistics in `state` (constants "
            f"can stay as they are)") if loose else None


def _equal(a, b) -> bool:
    if hasattr(a, "shape") or hasattr(b, "shape"):
        try:
            return bool(np.array_equal(to_host(a), to_host(b)))
        except Exception:
            return False
    try:
        return bool(a == b)
    except Exception:
        return a is b


class Harness:
    """Runs forward/backward on one layer with frozen state and reseeded randomness."""

    def __init__(self, layer, seed: int, device):
        self.layer = layer
        self.seed = seed
        self.device = device  # where the layer's arrays live (gradcheck.device.Device)
        self.frozen = snapshot_state(layer)
        self.where = ""
        self.signed = kinks.has_signature(layer)
        self.distanced = kinks.declares(layer, "kink_distance", Layer)
        # the arrays the check perturbs and reads: each parameter's own, as in training's arena
        self._arrays = [(n, p, p.data, p.grad) for n, p in layer.params.items()]
        self.rebound: set[str] = set()  # parameters whose data the layer replaced (p.data = ...)
        self.fresh = None  # (dtype) -> a new, never called instance of the layer, when the check can make one
        self.twin = None  # float32 checks: the float64 copy differentiated in its place (gradcheck.twin)
        self.twin_note = None  # why no twin could stand in, when none could
        self.fell_back = False  # whether the last point's differences were taken in float32 (no twin)

    def call(self, name: str, fn, *args):
        try:
            return fn(*args)
        except Exception as e:  # the layer's own code: report which call and where
            raise LayerRaised(name, e, self.where, self.layer) from e
        finally:
            self._adopt()

    def _adopt(self) -> None:
        """Copy a parameter array the layer replaced (``p.data = clip(p.data)``) back into the
        parameter's own array and point it there again, as training's arena does before the
        optimizer steps; so a perturbation still reaches what the next forward reads. An array
        of another shape or dtype is left for the contract checks to report."""
        for n, p, data, grad in self._arrays:
            for attr, own in (("data", data), ("grad", grad)):
                new = getattr(p, attr)
                if new is own or own is None or new is None:
                    continue
                if getattr(new, "shape", None) == own.shape and getattr(new, "dtype", None) == own.dtype:
                    own[...] = new
                    setattr(p, attr, own)
                    if attr == "data":
                        self.rebound.add(n)

    def forward(self, x, y=None):
        layer = self.layer
        restore_state(layer, self.frozen)
        if layer.stochastic:
            layer.rng = layer.backend.rng(self.seed)
        if layer.needs_labels:
            return self.call("forward", layer.forward, x, y)
        return self.call("forward", layer.forward, x)

    def backward(self, dy):
        """``dy`` on the host is moved to the device first (on the CPU: the same array)."""
        return self.call("backward", self.layer.backward, self.device.put(dy))

    def signature(self):
        if not self.signed:
            return None
        return kinks.freeze(self.call("branch_signature", self.layer.branch_signature))

    def kink_distance(self, x, y):
        """The layer's declared distance to a kink at host point (x, y), or None (smooth)."""
        if not self.distanced:
            return None
        args = (self.device.put(x), self.device.put(y)) if self.layer.needs_labels else (self.device.put(x),)
        return self.call("kink_distance", self.layer.kink_distance, *args)

    def loss(self, x, y, g64: np.ndarray) -> float:
        """L = Σ G ⊙ forward(x, y), accumulated in float64."""
        out = self.forward(x, y)
        return float(np.dot(g64.ravel(), np.asarray(to_host(out), dtype=np.float64).ravel()))

    def parts(self, x, y, g64: np.ndarray) -> np.ndarray:
        """The terms G ⊙ forward(x, y) of L, flat, in float64 (for ``--detect-kinks``)."""
        return g64.ravel() * np.asarray(to_host(self.forward(x, y)), dtype=np.float64).ravel()
