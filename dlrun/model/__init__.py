"""Sequential: a model built from a list of layers, with eager shape inference."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import contract
from .. import parallel, seeding
from ..backend.arena import ParamArena
from ..backend import CPU, Backend, array_module
from ..errors import CheckpointError, ConfigError, DlrunError, LayerContractError, Location, ShapeError
from ..layers.base import Layer
from ..layers.order import execution_order


@dataclass(frozen=True)
class SummaryRow:
    index: int
    name: str
    output_shape: tuple[int, ...]
    params: int
    trainable: int
    node: str = ""           # a graph's node: its name, or its place in the config (model[2].body[0])
    inputs: tuple = ()       # a graph's node: the nodes it reads ("input": the model's input)


class Sequential:
    """Layers applied in order; built (parameters created, shapes inferred) on construction.

    Args:
        layers: instantiated layers.
        input_shape: per-sample input shape, e.g. ``(2,)`` or ``(1, 8, 8)``.
        backend: the device (``get_backend('gpu')`` for CuPy).
        dtype: parameter and activation dtype (float32 for training, float64 for checks).
        seed: seeds the host generator for initial weights and each layer's runtime generator.
        locate: maps ``"model[i]"`` to a config location for shape errors.
        reorder: run a ReLU that directly precedes a MaxPool2D after it (see
            :func:`execution_order`); False runs the layers strictly in list order.
        frozen: indexes of layers whose parameters are not trained (``trainable: false``).
        world: the ranks of a data-parallel run (:mod:`dlrun.parallel`), or None for one
            process: each rank draws its own runtime streams, and layers that synchronise
            statistics across the ranks get it as ``layer.world``.
    """

    def __init__(self, layers: list[Layer], input_shape, backend: Backend = CPU, dtype=np.float32,
                 seed: int = 0, locate=None, reorder: bool = True, frozen=(), world=None):
        self.layers = list(layers)
        self.input_shape = tuple(int(s) for s in input_shape)
        self.backend = backend
        self.dtype = np.dtype(dtype)
        init_rng = seeding.initial_weights(seed)
        run_seqs = seeding.layer_streams(seed, len(self.layers), world.rank if world is not None else 0)
        self.shapes: list[tuple[int, ...]] = []
        shape = self.input_shape
        for i, layer in enumerate(self.layers):
            layer.setup(backend, self.dtype, init_rng, run_seqs[i])
            if world is not None and world.size > 1:
                layer.world = world
            prev = self.layers[i - 1] if i else None
            shape = build_layer(layer, (shape,), f"model[{i}]", locate, prev, f"model[{i - 1}]", self.layers)
            self.shapes.append(shape)
        self.output_shape = shape
        self._freeze(list(frozen), locate)
        # forward runs layers[order[0]], layers[order[1]], ...; backward the reverse. Position k
        # outputs order_shapes[k]: order only swaps neighbours, so the layers run by then are
        # layers[0..max(order[:k+1])]
        self.order = tuple(execution_order(self.layers) if reorder else range(len(self.layers)))
        self.order_shapes = [self.shapes[max(self.order[:k + 1])] for k in range(len(self.order))]
        self._run = [self.layers[i] for i in self.order]
        self._labelled = [layer.needs_labels for layer in self._run]
        trainable = [k for k, layer in enumerate(self._run) if any(p.trainable for p in layer.params.values())]
        self._first_trainable = trainable[0] if trainable else len(self._run)
        self._stop = 0  # backward runs down to this position of order (see train(fast=True))
        self._unchecked_forward = self._unchecked_backward = True  # see _forward_checked
        # trainable tensors become views of one flat buffer (see dlrun.backend.arena); a plugin's
        # parameter of another dtype or shape than its gradient is left on its own
        packable = [p for _, p in self.named_parameters() if p.trainable and p.data.dtype == self.dtype
                    and (p.grad is None or p.grad.shape == p.data.shape)]
        spare = parallel.CONTROL if world is not None and world.size > 1 else 0
        self.arena = ParamArena(packable, backend.xp, self.dtype, spare) if packable else None
        self.world = world if world is not None else parallel.current()

    def label(self, i: int) -> str:
        """Where layer ``i`` is in the config (``model[i]``): errors and reports name it so."""
        return f"model[{i}]"

    def _freeze(self, frozen: list[int], locate, loose=()) -> None:
        """Mark the parameters of the layers ``frozen`` (``trainable: false``) untrainable, before
        the arena: a frozen tensor stays out of it and out of the optimizer. Those in ``loose``
        (frozen by a block around them) may have none."""
        for i in frozen:
            path = f"{self.label(i)}.trainable"
            where = locate(path) if locate else Location(path=path)
            if i not in loose and not any(p.trainable for p in self.layers[i].params.values()):
                raise ConfigError(f"{type(self.layers[i]).__name__} has no trainable parameters, so trainable: false "
                                  f"would freeze nothing; it applies to layers with weights (remove it here)", where)
            for p in self.layers[i].params.values():
                p.trainable = False
        if frozen and not any(p.trainable for _, p in self.named_parameters()):
            raise ConfigError("every layer with parameters is frozen (trainable: false): nothing would train",
                              locate(f"{self.label(frozen[-1])}.trainable") if locate else None)

    def train(self, mode: bool = True, fast: bool = False) -> "Sequential":
        """Set training (or evaluation) mode.

        ``fast=True`` is for a training loop that consumes each output before the next call and
        discards the input gradient: layers then reuse per-shape buffers, layers before the first
        trainable one are skipped in backward, and that layer is told it needs no input gradient.
        """
        fast = fast and mode
        for k, layer in enumerate(self._run):
            layer.training = mode
            layer.buffers.enabled = fast
            layer.needs_input_grad = not fast or k > self._first_trainable
            # its input is the output of the layer before it, which nothing reads again (never the batch)
            layer.owns_input = fast and k > 0 and not self._run[k - 1].keeps_output
        self._stop = self._first_trainable if fast else 0
        return self

    def eval(self) -> "Sequential":
        return self.train(False)

    def forward(self, x, y=None):
        try:
            if self._unchecked_forward:
                return self._forward_checked(x, y)
            for layer, labelled in zip(self._run, self._labelled):
                x = layer.forward(x, y) if labelled else layer.forward(x)
            return x
        except (DlrunError, MemoryError):
            raise
        except Exception as e:
            raise self._raised(e, "forward") from e

    def backward(self, dy):
        """Back-propagate dL/d(output); returns dL/d(input) (None in fast training mode)."""
        try:
            if self._unchecked_backward:
                return self._backward_checked(dy)
            layers = self._run
            for k in range(len(layers) - 1, self._stop - 1, -1):
                dy = layers[k].backward(dy)
            return dy if self._stop == 0 else None
        except (DlrunError, MemoryError):
            raise
        except Exception as e:
            raise self._raised(e, "backward") from e

    def _raised(self, e: Exception, call: str) -> Exception:
        """A LayerError naming the layer whose ``call`` raised ``e`` (see contract.layer_raised)."""
        return contract.layer_raised(self.layers, e, call, self.label)

    # The first forward and the first backward check what each layer returns against the shapes
    # build declared and the model's dtype and device, so a layer (a plugin) that breaks the
    # contract is named at once, not by a confusing error in the layer after it (on GPU a float64
    # gradient reaching a float32 fused kernel is a TypeError). Later calls skip the checks.
    def _forward_checked(self, x, y):
        for k in range(len(self._run)):
            x = self.checked_call(k, "forward", x, y)
        self._unchecked_forward = False
        return x

    def _backward_checked(self, dy):
        for k in range(len(self._run) - 1, self._stop - 1, -1):
            dy = self.checked_call(k, "backward", dy)
        self._unchecked_backward = False
        return dy if self._stop == 0 else None

    @property
    def run_order(self) -> list[Layer]:
        """The layers in the order forward runs them (``layers[order[k]]``; backward: reversed)."""
        return self._run

    @property
    def backward_stop(self) -> int:
        """The position in the execution order backward stops at: 0, or in fast training mode the
        first trainable layer (the layers below it need no gradient)."""
        return self._stop

    def call(self, k: int, call: str, a, y=None, check: bool = False):
        """The ``forward`` (with labels ``y`` if it takes them) or ``backward`` of the layer at
        position ``k`` of the execution order alone, as :meth:`forward` and :meth:`backward` run
        it: with the contract checks until a whole pass has passed them (or when ``check``), a
        failure named with the layer."""
        if check or (self._unchecked_forward if call == "forward" else self._unchecked_backward):
            try:
                return self.checked_call(k, call, a, y)
            except LayerContractError as e:  # which layer, for a caller that locates it in the config
                if getattr(e, "layer_index", None) is None:
                    e.layer_index = self.order[k]
                raise
        layer = self._run[k]
        try:
            if call == "forward":
                return layer.forward(a, y) if self._labelled[k] else layer.forward(a)
            return layer.backward(a)
        except (DlrunError, MemoryError):
            raise
        except Exception as e:
            raise self._raised(e, call) from e

    def forward_parts(self, x, y=None, check: bool = False):
        """:meth:`forward` one layer at a time, for an observer of the step: yields ``(k, output)``
        after the layer at position ``k`` of the execution order; the last output is the model's."""
        for k in range(len(self._run)):
            x = self.call(k, "forward", x, y, check)
            yield k, x
        self.passed_checks("forward")

    def backward_parts(self, dy, check: bool = False):
        """:meth:`backward` one layer at a time: yields ``(k, dx)`` after the layer at position
        ``k`` (``dx`` is what it returned: None when its input needs no gradient)."""
        for k in range(len(self._run) - 1, self._stop - 1, -1):
            dy = self.call(k, "backward", dy, None, check)
            yield k, dy
        self.passed_checks("backward")

    def passed_checks(self, call: str) -> None:
        """A whole ``forward`` or ``backward`` pass has run with its contract checks: later ones skip them."""
        if call == "forward":
            self._unchecked_forward = False
        else:
            self._unchecked_backward = False

    def checked_call(self, k: int, call: str, a, y=None):
        """Run the ``forward`` (with labels ``y`` if it takes them) or ``backward`` of the layer at
        position ``k`` of the execution order on ``a`` alone, with the first call's contract checks
        and a failure named as :meth:`forward` names it (``dlrun check`` goes layer by layer)."""
        layer, n, given = self._run[k], len(a), a.dtype
        grads = [(name, p) for name, p in layer.params.items() if p.trainable] if call == "backward" else []
        contract.mark_unwritten(p.grad for _, p in grads)  # backward must write every element
        try:
            if call == "forward":
                out = layer.forward(a, y) if self._labelled[k] else layer.forward(a)
            else:
                out = layer.backward(a)
        except (DlrunError, MemoryError):
            raise
        except Exception as e:
            raise self._raised(e, call) from e
        for name, p in grads:
            self._expect_grad(self.order[k], name, p)
        if call == "forward":
            # the model's dtype, or the input's when the caller passed another float dtype
            self._expect(self.order[k], "forward", "its output", out, (n, *self.order_shapes[k]), {self.dtype, given})
        elif out is not None or layer.needs_input_grad:
            # the model input's gradient may follow the input's dtype (indices: Embedding)
            shape = self.order_shapes[k - 1] if k else self.input_shape
            self._expect(self.order[k], "backward", "dx", out, (n, *shape), {self.dtype, given} if k else None)
        return out

    def _expect_grad(self, i: int, name: str, p) -> None:
        """A trainable parameter's gradient after the layer's first backward: the parameter's shape,
        dtype and device, and every element written (checked_call fills it with the dtype's largest
        value first)."""
        g, layer = p.grad, self.layers[i]
        self._expect(i, "backward", f"{name}.grad", g, tuple(p.data.shape), {p.data.dtype})
        if contract.unwritten(g):
            raise LayerContractError(f"{self.label(i)} {layer!r}: backward did not write every element of {name}.grad; "
                                     f"{contract.UNWRITTEN_HINT}{contract.defined_at(layer, 'backward')}")

    def _expect(self, i: int, call: str, what: str, a, shape: tuple, dtypes) -> None:
        problem = contract.mismatch(a, shape, dtypes, self.backend, self.dtype)
        if problem:
            verb = "left" if what.endswith(".grad") else "returned"
            hint = " (a missing return statement?)" if a is None and verb == "returned" else ""
            raise LayerContractError(f"{self.label(i)} {self.layers[i]!r}: {call} {verb} {what} as {problem}{hint}"
                                     f"{contract.defined_at(self.layers[i], call)}")

    def predict(self, x, batch_size: int | None = None) -> np.ndarray:
        """Raw outputs for host array ``x``, computed in evaluation mode, in batches (all at once
        without ``batch_size``); a host array."""
        self.eval()
        b, n = self.backend, len(x)
        bs = max(batch_size or n, 1)
        outs = [b.to_host(self.forward(b.asarray(np.ascontiguousarray(x[s:s + bs]), dtype=self.dtype)))
                for s in range(0, n, bs)]
        self.train()
        return np.concatenate(outs) if outs else np.empty((0,) + self.output_shape, dtype=self.dtype)

    def reads_input(self) -> list[int]:
        """The layers that take the model's input as it comes (a chain's first)."""
        return [0]

    def input_shapes(self, i: int) -> tuple:
        """The per-sample shape of each input of layer ``i`` (one for a chain's layer)."""
        return (self.input_shape if i == 0 else self.shapes[i - 1],)

    def owners(self):
        """``(i, layer)`` for each layer that owns its parameters and state (every layer of a
        Sequential; a graph's node that shares another's weights owns none)."""
        return enumerate(self.layers)

    def named_parameters(self):
        """``[("0.weight", Parameter), ...]``: qualified name = layer index and parameter name."""
        return [(f"{i}.{n}", p) for i, layer in self.owners() for n, p in layer.params.items()]

    def summary(self) -> list[SummaryRow]:
        rows = []
        for i, (layer, shape) in enumerate(zip(self.layers, self.shapes)):
            total = sum(p.size for p in layer.params.values())
            trainable = sum(p.size for p in layer.params.values() if p.trainable)
            rows.append(SummaryRow(i, repr(layer), shape, total, trainable))
        return rows

    @property
    def num_parameters(self) -> int:
        return sum(p.size for _, p in self.named_parameters())

    def device_state(self) -> dict:
        """Every parameter and declared layer state, by qualified name, as the model holds them:
        the live arrays on its device (a layer's state may also be a number), not copies."""
        out = {name: p.data for name, p in self.named_parameters()}
        for i, layer in self.owners():
            for attr in layer.state:
                out[f"{i}.state.{attr}"] = getattr(layer, attr)
        return out

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Host copies of every parameter and declared layer state, by qualified name (on the
        CPU views of the live arrays)."""
        to_host = self.backend.to_host
        return {k: np.asarray(to_host(v)) for k, v in self.device_state().items()}

    def load_state_arrays(self, arrays: dict, path="checkpoint", meta: dict | None = None) -> None:
        """Copy parameters and layer state back from ``state_arrays`` output.

        Every mismatch (names, shapes, layer types recorded in ``meta``, non-finite values) is
        reported at once, naming ``path``, before anything is copied.
        """
        check_fits(path, arrays, self, meta)
        for name, p in self.named_parameters():
            p.data[...] = self.backend.asarray(arrays[name], dtype=p.data.dtype)
        for i, layer in self.owners():
            for attr in layer.state:
                cur = getattr(layer, attr)
                val = arrays[f"{i}.state.{attr}"]
                if isinstance(cur, (int, float, np.number)) or np.ndim(cur) == 0 and not hasattr(cur, "shape"):
                    setattr(layer, attr, type(cur)(val))
                else:
                    cur[...] = self.backend.asarray(val, dtype=cur.dtype)


def build_layer(layer: Layer, in_shapes: tuple, path: str, locate, prev: Layer | None, prev_path: str,
                layers: list, label=None) -> tuple[int, ...]:
    """Build ``layer`` (already set up) for its per-sample input shapes (one for most layers, one
    per input for a layer with ``num_inputs`` other than 1) and return its checked output shape.
    A failure is located at the config path ``path``; ``prev`` (at ``prev_path``) is the layer
    that produced its (first) input, for a hint."""
    def where():
        return locate(path) if locate else Location(path=path)
    shape = in_shapes[0] if len(in_shapes) == 1 else tuple(in_shapes)
    wanted = layer.num_inputs
    if len(in_shapes) != (wanted or max(len(in_shapes), 2)):
        want = "2 or more inputs" if wanted is None else f"{wanted} input{'s' if wanted > 1 else ''}"
        how = (" (name its inputs: inputs: [a, b], or use it as the merge of a Parallel block)" if wanted != 1
               else " (give it one name in inputs:, or merge them first with Add or Concatenate)")
        raise ConfigError(f"{type(layer).__name__} takes {want}, got {len(in_shapes)}{how}", where())
    drawn = contract.GlobalDraws()
    try:
        out = layer.build(*in_shapes) if layer.num_inputs != 1 else layer.build(in_shapes[0])
        shape = contract.output_shape(layer, out, shape)
    except ShapeError as e:
        name = type(layer).__name__
        msg = e.message if e.message.startswith(name) else f"{name}: {e.message}"
        if getattr(prev, "return_sequences", False):  # a sequence where a vector was meant
            msg += f" ({prev_path} gives every step, return_sequences: true; set it to false for the last state)"
        raise ShapeError(msg, where()) from None
    except (ValueError, TypeError, OverflowError, MemoryError) as e:
        named = contract.blame_other(e, layer)
        if named is not None:  # a plugin initializer (or other helper) raised, not the layer
            named.where = where()
            raise named from None
        raise ShapeError(f"{type(layer).__name__} cannot take input of shape {shape}: "
                         f"{e or type(e).__name__}", where()) from None
    except DlrunError as e:
        if e.where is None:  # raised by code the layer called (add_param): say which layer
            e.where = where()
            e.message = f"{type(layer).__name__}: {e.message}"
        raise
    except Exception as e:  # a bug in the layer's build (IndexError, KeyError, ...): name it
        raise contract.layer_raised(layers, e, "build", label) from e
    problem = drawn.unsaved(layer)
    if problem:
        raise LayerContractError(f"{layer!r}: {problem}", where())
    return shape


def layer_types(model) -> list[str]:
    """The registered type of each of ``model``'s layers (a graph's nodes), in order."""
    return [getattr(layer, "registered_name", type(layer).__name__) for layer in model.layers]


def _layer_types(specs) -> list[str]:
    return [s if isinstance(s, str) else s.get("type", "?") if isinstance(s, dict) else "?" for s in specs or []]


def check_fits(path, arrays: dict, model, meta: dict | None = None) -> None:
    """Raise CheckpointError listing every way the checkpoint's arrays do not fit ``model``.

    Compares names (missing, unexpected), shapes, finiteness and, when the checkpoint records its
    config, the layer types in order (parameter-free layers have no arrays to compare).
    """
    expected = {k: np.shape(v) for k, v in model.device_state().items()}
    problems = []
    saved = None
    if meta and isinstance(meta.get("nodes"), list):  # a graph's layers, node by node
        saved = [str(t) for t in meta["nodes"]]
    elif meta and isinstance(meta.get("config"), dict) and isinstance(meta["config"].get("model"), list) \
            and getattr(model, "nodes", None) is None:  # a chain's: its config entries
        saved = _layer_types(meta["config"]["model"])
    if saved is not None:
        built = layer_types(model)
        if saved != built:
            problems.append(f"layers: the checkpoint has [{', '.join(saved)}], the model has [{', '.join(built)}]")
    for name, shape in expected.items():
        if name not in arrays:
            problems.append(f"{name}: missing from the checkpoint (the model expects shape {shape})")
        elif tuple(arrays[name].shape) != tuple(shape):
            problems.append(f"{name}: shape {tuple(arrays[name].shape)} in the checkpoint, {tuple(shape)} in the model")
        elif arrays[name].dtype.kind not in "fiub":
            problems.append(f"{name}: dtype {arrays[name].dtype} is not numeric")
        elif arrays[name].dtype.kind == "f" and not array_module(arrays[name]).isfinite(arrays[name]).all():
            problems.append(f"{name}: contains NaN or inf")
    problems += [f"{name}: in the checkpoint but not in the model" for name in arrays if name not in expected]
    if problems:
        raise CheckpointError(f"{path} does not fit the model ({len(problems)} problem"
                              f"{'s' if len(problems) > 1 else ''}):\n" + "\n".join(f"- {p}" for p in problems))
