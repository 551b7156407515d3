"""Graph: a model whose layers form a directed acyclic graph (residual blocks, parallel branches,
named nodes, layers with several inputs, one set of weights applied at several places).

The config wing lowers every graph form of a config (``Residual``, ``Parallel``, nodes that
name their ``inputs``) to a list of :class:`Node` in an order where each node comes after the
nodes it reads; :class:`Graph` builds, runs and differentiates that list. A plain list of layers
stays a :class:`~dlrun.model.Sequential`, whose path this module does not touch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import Sequential, SummaryRow, build_layer, contract
from .. import parallel, seeding
from ..backend import CPU, Backend
from ..backend.arena import ParamArena
from ..errors import DlrunError, LayerContractError, Location, ShapeError

INPUT = -1  # Node.inputs entry for the model's input


@dataclass(frozen=True)
class Node:
    """One application of a layer in a graph.

    Args:
        path: where the node is in the config (``model[2]``, ``model[2].body[0]``): errors,
            tables and ``--set`` name it so.
        inputs: the nodes whose outputs it reads, in the order its layer takes them (indexes
            of earlier nodes; :data:`INPUT` is the model's input).
        name: the user's name for it (``name:``), or None.
        shares: the index of the node whose parameters (and state) this one applies, or None.
        hint: added to a shape error of this node (a Residual block's "add a projection").
    """

    path: str
    inputs: tuple[int, ...]
    name: str | None = None
    shares: int | None = None
    hint: str = ""


class Graph(Sequential):
    """Layers applied along a DAG of :class:`Node`; built (parameters created, shapes inferred)
    on construction. The output is the last node's. The gradient of an output read by several
    nodes is the sum of theirs; a node that shares another's weights adds its parameter
    gradients into the owner's, so the optimizer sees one parameter set.

    Args:
        layers: one instantiated layer per node (a sharing node gets its own instance, built
            like the owner's, whose parameters then become the owner's arrays).
        nodes: the :class:`Node` list, each after the nodes it reads.
        input_shape, backend, dtype, seed, locate, frozen, world: as for :class:`Sequential`.
        loose: those of ``frozen`` frozen by a block around them (they may have no weights).
    """

    def __init__(self, layers, nodes, input_shape, backend: Backend = CPU, dtype=np.float32, seed: int = 0,
                 locate=None, frozen=(), loose=(), world=None):
        self.layers, self.nodes = list(layers), list(nodes)
        self.input_shape = tuple(int(s) for s in input_shape)
        self.backend, self.dtype = backend, np.dtype(dtype)
        init_rng = seeding.initial_weights(seed)
        run_seqs = seeding.layer_streams(seed, len(self.layers), world.rank if world is not None else 0)
        self.shapes: list[tuple[int, ...]] = []
        for j, (layer, node) in enumerate(zip(self.layers, self.nodes)):
            if any(not INPUT <= i < j for i in node.inputs):
                raise ValueError(f"{node.path}: a node reads only the input and earlier nodes, got {node.inputs}")
            layer.setup(backend, self.dtype, init_rng, run_seqs[j])
            if world is not None and world.size > 1:
                layer.world = world
            shapes = tuple(self.input_shape if i == INPUT else self.shapes[i] for i in node.inputs)
            first = node.inputs[0]
            prev = self.layers[first] if first != INPUT else None
            try:
                shape = build_layer(layer, shapes, node.path, locate, prev, self.label(first), self.layers, self.label)
            except ShapeError as e:
                if len(node.inputs) > 1:  # a merge: which node gave which shape
                    e.message += " (" + ", ".join(f"{s} from {self.describe(i)}" for i, s in zip(node.inputs, shapes)) + ")"
                e.message += node.hint
                raise
            self.shapes.append(shape)
        self.output_shape = self.shapes[-1]
        self._shared = [(j, node.shares) for j, node in enumerate(self.nodes) if node.shares is not None]
        for j, s in self._shared:
            self._check_shared(j, s, locate)
        self._freeze(list(frozen), locate, set(loose))
        for j, s in self._shared:
            for name, p in self.layers[j].params.items():
                p.trainable = self.layers[s].params[name].trainable
        self.order = tuple(range(len(self.layers)))
        self.order_shapes = self.shapes
        self._run = self.layers
        self._labelled = [layer.needs_labels for layer in self.layers]
        self._multi = [len(node.inputs) > 1 or layer.num_inputs != 1 for layer, node in zip(self.layers, self.nodes)]
        # which nodes backward must reach in fast training mode: those with trainable weights at
        # or before them (a node after the last of them still passes the gradient down to them)
        trains = [any(p.trainable for p in layer.params.values()) for layer in self.layers]
        self._upstream = []
        for j, node in enumerate(self.nodes):
            self._upstream.append(trains[j] or any(i != INPUT and self._upstream[i] for i in node.inputs))
        self._fast = False
        self._runs = [True] * len(self.layers)
        self._stop = 0
        self._input_grad = None
        self._unchecked_forward = self._unchecked_backward = True
        packable = [p for _, p in self.named_parameters() if p.trainable and p.data.dtype == self.dtype
                    and (p.grad is None or p.grad.shape == p.data.shape)]
        spare = parallel.CONTROL if world is not None and world.size > 1 else 0
        self.arena = ParamArena(packable, backend.xp, self.dtype, spare) if packable else None
        self.world = world if world is not None else parallel.current()
        for j, s in self._shared:  # after the arena: the owner's arrays are views of its buffer now
            owner = self.layers[s]
            for name, p in self.layers[j].params.items():
                p.data = owner.params[name].data
            for attr in owner.state:
                if hasattr(getattr(owner, attr), "shape"):
                    setattr(self.layers[j], attr, getattr(owner, attr))

    # -- names --------------------------------------------------------------------------------
    def label(self, i: int) -> str:
        """Where node ``i`` is in the config (``model[2].body[0]``); ``input`` for the model's input."""
        return "input" if i == INPUT else self.nodes[i].path

    def describe(self, i: int) -> str:
        """Node ``i`` for a message: its place, its name and its layer's type."""
        if i == INPUT:
            return "the model's input"
        node = self.nodes[i]
        return f"{node.path}{f' ({node.name})' if node.name else ''} {type(self.layers[i]).__name__}"

    def _check_shared(self, j: int, s: int, locate) -> None:
        mine, theirs = self.layers[j].params, self.layers[s].params
        shapes = {n: p.shape for n, p in mine.items()}
        if type(self.layers[j]) is not type(self.layers[s]) or shapes != {n: p.shape for n, p in theirs.items()}:
            where = locate(self.nodes[j].path) if locate else Location(path=self.nodes[j].path)
            raise ShapeError(f"{self.describe(j)} shares the weights of {self.describe(s)}, but its input "
                             f"{self.shapes_in(j)} gives weights of shapes {shapes}, theirs "
                             f"{ {n: p.shape for n, p in theirs.items()} } (from input {self.shapes_in(s)}): a shared "
                             f"layer must get inputs of the same shape wherever it is applied", where)

    def reads_input(self) -> list[int]:
        return [j for j, node in enumerate(self.nodes) if INPUT in node.inputs]

    def input_shapes(self, i: int) -> tuple:
        return tuple(self.input_shape if k == INPUT else self.shapes[k] for k in self.nodes[i].inputs)

    def shapes_in(self, j: int) -> str:
        return " and ".join(str(self.input_shape if i == INPUT else self.shapes[i]) for i in self.nodes[j].inputs)

    def owners(self):
        return ((i, layer) for i, layer in enumerate(self.layers) if self.nodes[i].shares is None)

    # -- running ------------------------------------------------------------------------------
    def train(self, mode: bool = True, fast: bool = False) -> "Graph":
        """Set training (or evaluation) mode; ``fast`` as for :meth:`Sequential.train`: nodes with
        no trainable weights at or before them are skipped in backward."""
        fast = fast and mode
        self._fast = fast
        self._runs = [u or not fast for u in self._upstream]
        for j, (layer, node) in enumerate(zip(self.layers, self.nodes)):
            layer.training = mode
            layer.buffers.enabled = fast
            layer.needs_input_grad = not fast or any(i != INPUT and self._runs[i] for i in node.inputs)
            layer.owns_input = False  # (a node's output may feed several nodes)
        self._stop = 1 if fast else 0  # (fast: no gradient for the model's input)
        return self

    def forward(self, x, y=None):
        if self._unchecked_forward:
            out = x
            for _, out in self.forward_parts(x, y):
                pass
            return out
        try:
            vals = []
            for layer, node, labelled, multi in zip(self.layers, self.nodes, self._labelled, self._multi):
                if multi:
                    vals.append(layer.forward(*[x if i == INPUT else vals[i] for i in node.inputs]))
                else:
                    i = node.inputs[0]
                    a = x if i == INPUT else vals[i]
                    vals.append(layer.forward(a, y) if labelled else layer.forward(a))
            return vals[-1]
        except (DlrunError, MemoryError):
            raise
        except Exception as e:
            raise self._raised(e, "forward") from e

    def backward(self, dy):
        """Back-propagate dL/d(output); returns dL/d(input) (None in fast training mode)."""
        if self._unchecked_backward:
            for _ in self.backward_parts(dy):
                pass
            return self._input_grad
        try:
            grads = [None] * len(self.layers)
            grads[-1] = dy
            dx = None
            for j in range(len(self.layers) - 1, -1, -1):
                if not self._runs[j]:
                    continue
                g, grads[j] = grads[j], None
                out = self.layers[j].backward(g)
                dx = self._pass_down(j, out, grads, dx)
            self._sum_shared()
            return None if self._fast else dx
        except (DlrunError, MemoryError):
            raise
        except Exception as e:
            raise self._raised(e, "backward") from e

    def _pass_down(self, j: int, out, grads: list, dx):
        """Add node ``j``'s input gradients ``out`` to its producers' (a new array when two add up:
        a layer may return one array for several inputs, as Add does); returns the model input's."""
        for i, d in zip(self.nodes[j].inputs, out if self._multi[j] else (out,)):
            if d is None:
                continue
            if i == INPUT:
                dx = d if dx is None else dx + d
            elif self._runs[i]:
                grads[i] = d if grads[i] is None else grads[i] + d
        return dx

    def _sum_shared(self) -> None:
        """Each sharing node's parameter gradients, added into the owner's (one parameter set)."""
        for j, s in self._shared:
            owner = self.layers[s].params
            for name, p in self.layers[j].params.items():
                if p.trainable and self._runs[j]:
                    owner[name].grad += p.grad

    def forward_parts(self, x, y=None, check: bool = False):
        vals = []
        for j, node in enumerate(self.nodes):
            args = tuple(x if i == INPUT else vals[i] for i in node.inputs)
            vals.append(self._node_call(j, "forward", args, y, check or self._unchecked_forward))
            yield j, vals[-1]
        self._unchecked_forward = False

    def backward_parts(self, dy, check: bool = False):
        grads = [None] * len(self.layers)
        grads[-1] = dy
        dx = None
        for j in range(len(self.layers) - 1, -1, -1):
            if not self._runs[j]:
                continue
            g, grads[j] = grads[j], None
            out = self._node_call(j, "backward", (g,), None, check or self._unchecked_backward)
            yield j, out
            dx = self._pass_down(j, out, grads, dx)
        self._sum_shared()
        self._input_grad = None if self._fast else dx
        self._unchecked_backward = False

    def call(self, k: int, call: str, a, y=None, check: bool = False):
        """The ``forward`` (``a``: the tuple of the node's inputs) or ``backward`` of node ``k``
        alone, with the contract checks until a whole pass has passed them (or when ``check``)."""
        args = tuple(a) if call == "forward" else (a,)
        checked = check or (self._unchecked_forward if call == "forward" else self._unchecked_backward)
        return self._node_call(k, call, args, y, checked)

    def _node_call(self, j: int, call: str, args: tuple, y, checked: bool):
        layer = self.layers[j]
        grads = [(n, p) for n, p in layer.params.items() if p.trainable] if checked and call == "backward" else []
        contract.mark_unwritten(p.grad for _, p in grads)
        try:
            if call == "backward":
                out = layer.backward(args[0])
            elif self._multi[j]:
                out = layer.forward(*args)
            else:
                out = layer.forward(args[0], y) if self._labelled[j] else layer.forward(args[0])
        except (DlrunError, MemoryError):
            raise
        except Exception as e:
            raise self._raised(e, call) from e
        if checked:
            try:
                self._check_call(j, call, args, out, grads)
            except LayerContractError as e:
                if getattr(e, "layer_index", None) is None:
                    e.layer_index = j
                raise
        return out

    def _check_call(self, j: int, call: str, args: tuple, out, grads) -> None:
        """What node ``j``'s first ``call`` returned against what build declared (as
        :meth:`Sequential.checked_call` checks a layer of a chain)."""
        layer, node = self.layers[j], self.nodes[j]
        n = len(args[0])
        for name, p in grads:
            self._expect_grad(j, name, p)
        if call == "forward":
            self._expect(j, "forward", "its output", out, (n, *self.shapes[j]), {self.dtype, args[0].dtype})
            return
        if not self._multi[j]:
            outs = (out,)
        elif isinstance(out, (tuple, list)) and len(out) == len(node.inputs):
            outs = tuple(out)
        else:
            got = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else \
                type(out).__name__
            raise LayerContractError(f"{self.label(j)} {layer!r}: backward returned {got}; expected a tuple of "
                                     f"{len(node.inputs)} gradients, one per input{contract.defined_at(layer, 'backward')}")
        for m, (i, d) in enumerate(zip(node.inputs, outs)):
            if d is None and not layer.needs_input_grad:
                continue
            shape = self.input_shape if i == INPUT else self.shapes[i]
            what = "dx" if len(outs) == 1 else f"the gradient of input {m} ({self.label(i)})"
            self._expect(j, "backward", what, d, (n, *shape), None if i == INPUT else {self.dtype, args[0].dtype})

    def summary(self) -> list[SummaryRow]:
        rows = []
        for i, (layer, node, shape) in enumerate(zip(self.layers, self.nodes, self.shapes)):
            owned = node.shares is None
            total = sum(p.size for p in layer.params.values()) if owned else 0
            trainable = sum(p.size for p in layer.params.values() if p.trainable) if owned else 0
            name = repr(layer) if owned else f"{layer!r} shares {self.nodes[node.shares].name or self.label(node.shares)}"
            rows.append(SummaryRow(i, name, shape, total, trainable, node.name or node.path,
                                   tuple(self.nodes[k].name or self.label(k) if k != INPUT else "input"
                                         for k in node.inputs)))
        return rows
