"""The layer contract: what every built-in and user-written layer implements.

A layer is a small class registered with ``@layers.register()``:

* **options** are the constructor's keyword parameters, with type hints and defaults; they are
  the YAML keys (``units: 64``) and are checked against the signature before anything is built;
* ``build(input_shape)`` receives the per-sample input shape (no batch axis), creates parameters
  with :meth:`Layer.add_param` and returns the per-sample output shape; raise
  :class:`~dlrun.errors.ShapeError` for an input it cannot take;
* ``forward(x)`` (or ``forward(x, y)`` when ``needs_labels``) computes the output for a batch,
  in training or evaluation mode according to ``self.training``, and caches what backward needs;
* ``backward(dy)`` returns ``dx`` and *writes* (never accumulates) each trainable parameter's
  gradient into ``param.grad``.

A layer with several inputs (``num_inputs`` other than 1: ``Add``, ``Concatenate``, a user's
two-input layer) receives them as separate arguments, in the order its node lists them:
``build(shape_a, shape_b)``, ``forward(a, b)``, and ``backward(dy)`` returns one gradient per
input, ``(da, db)``.

Parameters and gradients live in one place, ``self.params`` (name -> :class:`Parameter`).
Class attributes declare what the framework and ``dlrun gradcheck`` need to know:
``needs_labels``, ``has_phase``, ``stochastic``, ``state`` and ``input_spec``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..backend import CPU, Backend, ensure_fits
from ..backend.buffers import BufferPool
from ..errors import ConfigError, DlrunError, ShapeError
from ..registry import initializers, layers
from .parameter import Parameter


@dataclass(frozen=True)
class InputSpec:
    """What inputs a layer takes, declared for `dlrun gradcheck` and the contract test.

    Args:
        shape: per-sample input shape with symbolic dims ("D", "C", "H", "W", "T") or ints.
            The checker binds each symbol to two different sizes, all dims distinct.
        kind: value kind of x: "float" (N(0,1)), "positive" (U[0.5, 2]), "prob" (rows sum to 1)
            or "index" (integers in [0, high), not differentiable).
        high: for kind "index", the exclusive upper bound (an int or a dim/option name).
        options: the options gradcheck builds the layer with when the user gives none;
            a string value naming a dim is replaced by that dim's size (``{"units": "C"}``).
        labels: for layers with ``needs_labels``: labels are drawn in [0, labels) where
            ``labels`` is a dim name or int (default: the layer's output size).
        inputs: for a layer with several inputs, one shape per input (symbolic dims as in
            ``shape``); empty: every input has ``shape`` (two inputs for ``num_inputs=None``).
    """

    def input_shapes(self, num_inputs: int | None) -> tuple:
        """The symbolic per-sample shape of each input of a layer taking ``num_inputs``."""
        if self.inputs:
            return tuple(tuple(s) for s in self.inputs)
        return (tuple(self.shape),) * (num_inputs or 2)

    shape: tuple = ("D",)
    kind: str = "float"
    inputs: tuple = ()
    high: Any = None
    options: dict = field(default_factory=dict)
    labels: Any = None

    def index_bound(self, layer) -> int | None:
        """For kind "index": the exclusive bound of a built ``layer``'s indices: ``high`` as an
        int, else the option bound to that dim (options={"input_dim": "D"}) or named by it."""
        h = self.high
        if isinstance(h, str):
            bound = next((k for k, v in self.options.items() if v == h), h)
            h = getattr(layer, bound, None)
        return int(h) if isinstance(h, (int, np.integer)) and not isinstance(h, bool) else None


class Layer:
    """Base class of all layers. Subclasses need not call ``super().__init__()``.

    Class attributes (declarations):
        needs_labels: forward takes ``(x, y)``; ``y`` holds integer labels in training and may
            be None in evaluation.
        has_phase: forward differs between training and evaluation (``self.training``).
        stochastic: forward draws from ``self.rng`` (a seeded generator the framework sets).
        state: names of attributes that change over training outside the parameters (running
            statistics, annealed coefficients); gradcheck freezes and restores them, and
            checkpoints save them.
        input_spec: see :class:`InputSpec`.
        num_inputs: how many inputs ``build``, ``forward`` and ``backward`` take: 1 (the
            default), a fixed number, or None for "two or more" (``Add``). A layer with several
            inputs gets them as separate arguments and returns a tuple of gradients, one per input.
        keeps_output: the layer reads the array its forward returned again later (Sigmoid's
            backward reads its output), or returns an array it holds on to. True (the default)
            is always safe; False (Linear and ReLU: their backward never reads their output)
            lets the layer after it in a chain overwrite that output in the trainer's fast mode.

    Attributes set by the framework (a layer may ignore both; they only save work):
        needs_input_grad: False when nothing consumes this layer's input gradient (the first
            trainable layer of a model during training); ``backward`` may then skip computing
            dx and return None.
        owns_input: True when nothing but this layer reads its input after its forward, so
            that it may write over it (in forward, or in backward once it has read it): in the
            trainer's fast mode, for a layer of a chain whose input is the output of the layer
            before it, and that layer does not keep it (``keeps_output`` False). ReLU then
            writes its output into its input's memory, Linear its dx: one activation-sized
            array less each to go through per step.
        buffers: a :class:`~dlrun.backend.buffers.BufferPool`; ``self.buffer(name, shape, dtype)`` gives
            a per-shape scratch array to pass as ``out=`` while the trainer owns the outputs,
            and None (allocate) otherwise. Arrays of one name share memory (a shorter batch's
            is the leading rows of the largest): give arrays alive at once their own names.
        world: in a data-parallel run of several ranks, the :class:`~dlrun.parallel.World`
            whose ``sum_device`` a layer calls to compute statistics over the global batch
            (BatchNorm's ``sync``); None in one process.
    """

    world = None
    needs_labels: ClassVar[bool] = False
    has_phase: ClassVar[bool] = False
    stochastic: ClassVar[bool] = False
    state: ClassVar[tuple[str, ...]] = ()
    input_spec: ClassVar[InputSpec] = InputSpec()
    num_inputs: ClassVar[int | None] = 1
    keeps_output: ClassVar[bool] = True

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        self.params = {}
        self.training = True
        self._rng = self._rng_seed = None
        self.backend = CPU
        self.xp = np
        self.dtype = np.dtype(np.float32)
        self._init_rng = None
        self.needs_input_grad = True
        self.owns_input = False
        self.buffers = BufferPool()
        return self

    def __init__(self) -> None:
        """A layer without options."""

    # -- set by the framework --------------------------------------------------------------
    def setup(self, backend: Backend, dtype, init_rng: np.random.Generator, rng=None) -> None:
        """Attach the device, dtype and generators before ``build`` (called by the model).

        ``rng`` is a generator, or a seed (an int or a numpy SeedSequence) for :meth:`seed_rng`."""
        self.backend = backend
        self.xp = backend.xp
        self.dtype = np.dtype(dtype)
        self._init_rng = init_rng
        if isinstance(rng, (int, np.integer, np.random.SeedSequence)):
            self.seed_rng(rng)
        else:
            self.rng = rng

    @property
    def rng(self):
        """The layer's seeded generator on its device, or None. Made on first use from the seed
        the framework gave (:meth:`seed_rng`): most layers never draw, and a CuPy generator
        holds per-thread state in device memory and takes a kernel launch to seed."""
        if self._rng is None and self._rng_seed is not None:
            self._rng = self.backend.rng(self._rng_seed)
        return self._rng

    @rng.setter
    def rng(self, generator) -> None:
        self._rng, self._rng_seed = generator, None

    def seed_rng(self, seed) -> None:
        """Drop the generator; the next use of :attr:`rng` makes one from ``seed`` on the layer's
        device. Same seed, same draws: making it later changes nothing."""
        self._rng, self._rng_seed = None, seed

    @property
    def rng_made(self):
        """The generator if :attr:`rng` has made or been given one, else None (reading this never
        makes one: checkpoints record the state of the generators that exist)."""
        return self._rng

    def add_param(self, name: str, shape, initializer=None, *, fan_in: int | None = None,
                  fan_out: int | None = None, trainable: bool = True, regularizer=None,
                  regularize: bool = True, value=None) -> Parameter:
        """Create a parameter, drawn on the host with the seeded generator and moved once.

        Give either an ``initializer`` or a fixed host ``value``. An initializer is a registered
        name or spec (``"xavier_uniform"``, ``{"type": "normal", "std": 0.01}``) or any callable
        ``initializer(shape, fan_in, fan_out, rng)``. Returns the Parameter, also stored in
        ``self.params[name]``.
        Without ``fan_in``/``fan_out``, a weight of shape (out, in, *kernel) has PyTorch's fans:
        fan_in = in·prod(kernel), fan_out = out·prod(kernel) (a vector: its length for both).
        """
        shape = tuple(int(s) for s in shape)
        drawn = value is None
        _fits_in_memory(name, shape, self.dtype, drawn)
        if drawn:
            if initializer is None:
                raise ValueError(f"parameter {name!r} needs an initializer or a value")
            if isinstance(initializer, (str, dict)):  # a registry name or spec, as a config writes it
                try:  # the model adds where the layer is; the error says which option
                    initializer = initializers.build(initializer, "initializer")
                except DlrunError as e:
                    raise ConfigError(f"add_param({name!r}): {e}") from None
            elif not callable(initializer):
                raise TypeError(f"parameter {name!r}: initializer must be an initializer name such as "
                                f"'xavier_uniform', a spec mapping or a callable, got {initializer!r}")
            rng = self._init_rng if self._init_rng is not None else np.random.default_rng(0)
            fi = fan_in if fan_in is not None else (int(np.prod(shape[1:])) if len(shape) > 1 else shape[0])
            fo = fan_out if fan_out is not None else shape[0] * int(np.prod(shape[2:]))
            value = initializer(shape, fi, fo, rng)
        with np.errstate(over="ignore", invalid="ignore"):  # (an overflow is the error below, not a warning)
            host = np.asarray(value, dtype=self.dtype)
        made = f"the initializer {initializer!r} returned an array that" if drawn else "value"
        if host.shape != shape:
            raise ConfigError(f"add_param({name!r}): {made} has shape {host.shape}, expected {shape}")
        _check_finite(name, made, value, host, drawn)
        data = self.backend.asarray(np.ascontiguousarray(host))
        grad = self.xp.zeros_like(data) if trainable else None
        p = Parameter(data, grad, trainable, regularizer, regularize and trainable)
        self.params[name] = p
        return p

    # -- the contract ----------------------------------------------------------------------
    def build(self, input_shape: tuple[int, ...], *more_shapes) -> tuple[int, ...]:
        """Create parameters for this per-sample input shape (a layer with several inputs: one
        per input); return the output shape (by default the (first) input's)."""
        return tuple(input_shape)

    def forward(self, x, y=None):  # pragma: no cover - abstract
        """Compute the output for a batch ``x`` (and labels ``y`` when ``needs_labels``)."""
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented")

    def backward(self, dy):  # pragma: no cover - abstract
        """Given dL/d(output), write parameter gradients and return dL/d(input)."""
        raise NotImplementedError(f"{type(self).__name__}.backward is not implemented")

    def branch_signature(self):
        """Which branch each element took in the last forward (ReLU mask, max-pool argmax).

        gradcheck compares it before and after a perturbation to skip elements that crossed a
        kink. Return None (the default) for smooth layers.
        """
        return None

    def kink_distance(self, x, y=None):
        """How far input ``x`` (labels ``y``) and the current parameters are from a kink, or None.

        For each kink argument f (the quantity whose sign picks a branch: x itself for ReLU, the
        gap between a window's two largest values for max-pooling), |f| / ‖∇f‖₂ with the
        gradient taken over the input and the parameters together: no perturbation of smaller
        L2 norm reaches the kink (to first order). Any shape; gradcheck redraws a point while
        its minimum is below ``--kink-margin`` (default 10·eps). None (the default): smooth.
        """
        return None

    # -- conveniences ----------------------------------------------------------------------
    def buffer(self, name: str, shape, dtype):
        """A reusable ``out=`` array for this (name, shape, dtype), or None: see ``buffers``."""
        return self.buffers.get(self.xp, name, tuple(shape), dtype)

    def output_array(self, name: str, shape, dtype):
        """An array to write into: the reused buffer in fast mode, else a new (empty) one. For
        code that must be given an array (slice assignment, a kernel's raw output, a cast)."""
        shape = tuple(shape)
        buf = self.buffers.get(self.xp, name, shape, dtype)
        return self.xp.empty(shape, dtype) if buf is None else buf

    def expect_rank(self, input_shape, rank: int, what: str) -> None:
        """Raise ShapeError unless the per-sample input has ``rank`` axes."""
        if len(input_shape) != rank:
            raise ShapeError(
                f"{type(self).__name__} expects {what}, got input of shape {tuple(input_shape)} per sample"
            )

    def __repr__(self) -> str:
        spec = getattr(self, "spec", None) or {}
        opts = ", ".join(f"{k}={v!r}" for k, v in spec.items() if k != "type")
        return f"{type(self).__name__}({opts})"



layers.base = Layer

def _check_finite(name: str, made: str, value, host: np.ndarray, drawn: bool) -> None:
    """A drawn parameter must be finite in the model's dtype (``constant: 1e300`` overflows float32
    to inf, and training fails at its first forward with NaN); a given value may hold inf or NaN
    on purpose (a mask), but not from an overflow of the cast."""
    if host.dtype.kind != "f":
        return
    bad = ~np.isfinite(host)
    if not bad.any():
        return
    given = np.asarray(value)
    if not drawn and not (given.dtype.kind in "fiu" and np.isfinite(given[bad] if given.shape == host.shape
                                                                          else given).all()):
        return
    big = float(np.max(np.abs(given[np.isfinite(given)]), initial=0.0)) if given.dtype.kind in "fiu" else float("nan")
    raise ConfigError(f"add_param({name!r}): {made} holds values that are not finite in {host.dtype} (largest "
                      f"magnitude given {big:.3g}; {host.dtype} holds up to {np.finfo(host.dtype).max:.3g})")


def _fits_in_memory(name: str, shape: tuple, dtype: np.dtype, drawn: bool) -> None:
    """MemoryError, with the sizes, for a parameter the host cannot hold while it is made: the
    initializer's float64 draw, its copy in ``dtype``, the parameter and its gradient. Linux
    would otherwise grant the arrays and kill the process (no message, exit 137) on first touch."""
    n = int(np.prod(shape, dtype=np.float64))
    ensure_fits(n * ((8 if drawn else 0) + 3 * dtype.itemsize),
                f"parameter {name!r} of shape {shape} ({n:,} values) while it is made")
