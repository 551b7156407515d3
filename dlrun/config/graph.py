"""The graph forms of ``model:``, read and checked, and lowered to the node list a Graph runs.

A model is a list. Besides layers, an entry may be

* a ``Residual`` block, ``{type: Residual, body: [...], projection: ...}``: y = x + body(x), with
  the optional projection layer(s) applied to x when the body changes its shape;
* a ``Parallel`` block, ``{type: Parallel, branches: [[...], [...]], merge: concat|add|multiply}``
  (``axis:`` for concat): each branch a list applied to the same input, their outputs merged;
* a node with a ``name:`` that later entries read with ``inputs: [name, ...]`` (an entry without
  ``inputs`` reads the entry before it; ``input`` is the model's input), and a node
  ``{shares: NAME, inputs: [...]}`` that applies the named layer again with the same weights.

The model's output is the last entry's. Blocks nest, and names are global to the model.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, DlrunError, collect
from ..model.graph import INPUT, Node
from ..registry.options import OptionError, check_value, did_you_mean

NODE_KEYS = ("name", "inputs", "shares", "trainable")  # what a graph reads; the rest are the layer's options
BLOCK_KEYS = {"Residual": ("type", "body", "projection", "name", "trainable", "inputs"),
              "Parallel": ("type", "branches", "merge", "axis", "name", "trainable", "inputs")}
MERGES = {"concat": "Concatenate", "add": "Add", "multiply": "Multiply"}
MODEL_INPUT = "input"


@dataclass
class NodeSpec:
    """A node of a lowered model: its layer's spec (``type`` and options), its :class:`Node`,
    whether ``trainable: false`` froze it, and whether that came from a block around it
    (``loose``: a layer without weights in a frozen block is simply left as it is)."""

    spec: Any
    node: Node
    frozen: bool = False
    loose: bool = False


def is_chain(model) -> bool:
    """Whether a model list is a plain chain of layers (``name:`` alone keeps it one)."""
    return isinstance(model, list) and not any(
        isinstance(s, dict) and (block_type(s) or "inputs" in s or "shares" in s) for s in model)


def block_type(spec) -> str | None:
    """``Residual`` or ``Parallel`` for a block entry, else None."""
    kind = spec.get("type") if isinstance(spec, dict) else None
    return kind if isinstance(kind, str) and kind in BLOCK_KEYS else None


def layer_options(spec):
    """A layer entry's spec without the keys that place it in the model (``name``, ``trainable``)."""
    if not isinstance(spec, dict):
        return spec
    return {k: v for k, v in spec.items() if k not in NODE_KEYS}


def node_names(model, path: str = "model"):
    """``{name: config path}`` of every named entry of a model list, blocks included."""
    out = {}
    for j, s in enumerate(model if isinstance(model, list) else []):
        p = f"{path}[{j}]"
        if not isinstance(s, dict):
            continue
        if isinstance(s.get("name"), str):
            out.setdefault(s["name"], p)
        if isinstance(s.get("body"), list):
            out.update({k: v for k, v in node_names(s["body"], f"{p}.body").items() if k not in out})
        if isinstance(s.get("branches"), list):
            for m, b in enumerate(s["branches"]):
                out.update({k: v for k, v in node_names(b, f"{p}.branches[{m}]").items() if k not in out})
    return out


class _Lowering:
    """One pass over a graph model list: raw nodes (inputs as names or indexes), then names
    resolved, sorted so each node follows its inputs, and the unused ones left out."""

    def __init__(self, locate):
        self.locate = locate
        self.specs: list = []       # per raw node: the layer spec
        self.paths: list[str] = []
        self.inputs: list[list] = []  # per raw node: ints (raw indexes, INPUT) or (name, path) pairs
        self.names: dict[str, int] = {}
        self.named: list[str | None] = []
        self.shares: list = []       # per raw node: None or (name, path)
        self.frozen: list[tuple[bool, bool]] = []
        self.hints: list[str] = []
        self.errors: list[DlrunError] = []
        self.warnings: list[str] = []

    def error(self, message: str, path: str) -> None:
        self.errors.append(ConfigError(message, self.locate(path)))

    def add(self, spec, path, inputs, name=None, shares=None, frozen=(False, False), hint="") -> int:
        self.specs.append(spec)
        self.paths.append(path)
        self.inputs.append(list(inputs))
        self.named.append(name)
        self.shares.append(shares)
        self.frozen.append(frozen)
        self.hints.append(hint)
        if name is not None:
            if name == MODEL_INPUT:
                self.error(f"the name {MODEL_INPUT!r} is the model's input; give the node another name", f"{path}.name")
            elif name in self.names:
                self.error(f"the name {name!r} is already used by {self.paths[self.names[name]]}; names must be "
                           f"unique in the model", f"{path}.name")
            else:
                self.names[name] = len(self.specs) - 1
        return len(self.specs) - 1

    def chain(self, entries, path: str, prev, frozen) -> Any:
        if not isinstance(entries, list):
            self.error(f"expected a list of layers, got {entries!r:.60}", path)
            return prev
        for j, spec in enumerate(entries):
            prev = self.entry(spec, f"{path}[{j}]", prev, frozen)
        return prev

    def _common(self, spec: dict, path: str, prev, frozen):
        """An entry's name, its inputs (``inputs:`` or the entry before) and its frozen flags."""
        name = spec.get("name")
        if name is not None and not isinstance(name, str):
            self.error(f"expected a node name (a string), got {name!r}", f"{path}.name")
            name = None
        inputs = [prev]
        if "inputs" in spec:
            given = spec["inputs"]
            given = [given] if isinstance(given, str) else given
            if not isinstance(given, list) or not given or not all(isinstance(n, str) for n in given):
                self.error(f"expected a list of node names (inputs: [a, b]; {MODEL_INPUT} is the model's input), "
                           f"got {spec['inputs']!r}", f"{path}.inputs")
            else:
                inputs = [(n, f"{path}.inputs[{m}]") for m, n in enumerate(given)]
        if "trainable" in spec:  # on a layer: it must have weights; on a block: those inside that have them
            try:
                frozen = (False, False) if check_value(spec["trainable"], bool) else \
                    (True, block_type(spec) is not None)
            except OptionError as e:
                self.error(str(e), f"{path}.trainable")
        return name, inputs, frozen

    def entry(self, spec, path: str, prev, frozen) -> Any:
        kind = block_type(spec)
        if kind is not None:
            for k in spec:
                if k not in BLOCK_KEYS[kind]:
                    self.error(f"unknown key {k!r} of a {kind} block{did_you_mean(k, BLOCK_KEYS[kind])}; valid keys: "
                               f"{', '.join(BLOCK_KEYS[kind])}", f"{path}.{k}")
            name, inputs, frozen = self._common(spec, path, prev, frozen)
            if len(inputs) != 1:
                self.error(f"a {kind} block reads one input, got {len(inputs)}", f"{path}.inputs")
            start = inputs[0]
            block_frozen = (frozen[0], True)  # a layer without weights inside it is left as it is
            if kind == "Residual":
                return self.residual(spec, path, start, name, block_frozen)
            return self.parallel(spec, path, start, name, block_frozen)
        if isinstance(spec, dict) and "shares" in spec:
            owner = spec["shares"]
            extra = [k for k in spec if k not in ("shares", "inputs", "name")]
            if extra:
                self.error(f"a node that shares a layer's weights takes only shares, inputs and name (the layer and "
                           f"its options are the shared node's), got {', '.join(map(repr, extra))}", f"{path}.{extra[0]}")
            if not isinstance(owner, str):
                self.error(f"expected the name of the node whose weights to share, got {owner!r}", f"{path}.shares")
                return prev
            name, inputs, _ = self._common(spec, path, prev, (False, False))
            return self.add(None, path, inputs, name, (owner, f"{path}.shares"))
        if isinstance(spec, dict):
            name, inputs, frozen = self._common(spec, path, prev, frozen)
            return self.add(layer_options(spec), path, inputs, name, frozen=frozen)
        return self.add(spec, path, [prev], frozen=frozen)

    def residual(self, spec, path, start, name, frozen) -> int:
        body = spec.get("body")
        if not isinstance(body, list) or not body:
            self.error(f"expected body: a non-empty list of layers (y = x + body(x)), got {body!r:.60}",
                       f"{path}.body")
            body = []
        last = self.chain(body, f"{path}.body", start, frozen)
        skip, hint = start, ("; a Residual block adds its input to its body's output: when the body changes the "
                             "shape, give the block a projection for its input (projection: {type: Linear, units: D} "
                             "for vectors, {type: Conv2D, filters: C, kernel_size: 1, stride: S} for images)")
        if spec.get("projection") is not None:
            proj = spec["projection"]
            if isinstance(proj, list):
                skip = self.chain(proj, f"{path}.projection", start, frozen)
            else:
                skip = self.entry(proj, f"{path}.projection", start, frozen)
            hint = ""
        return self.add({"type": "Add"}, path, [last, skip], name, hint=hint)

    def parallel(self, spec, path, start, name, frozen) -> int:
        branches = spec.get("branches")
        if not isinstance(branches, list) or len(branches) < 2:
            self.error(f"expected branches: a list of two or more lists of layers (an empty list passes the input "
                       f"through), got {branches!r:.60}", f"{path}.branches")
            branches = []
        merge = spec.get("merge", "concat")
        if merge not in MERGES:
            self.error(f"expected merge: {' | '.join(MERGES)}, got {merge!r}{did_you_mean(merge, MERGES)}",
                       f"{path}.merge")
            merge = "concat"
        if "axis" in spec and merge != "concat":
            self.error(f"axis applies to merge: concat, not {merge}", f"{path}.axis")
        outs = [self.chain(b, f"{path}.branches[{m}]", start, frozen) for m, b in enumerate(branches)]
        layer = {"type": MERGES[merge]}
        if merge == "concat" and "axis" in spec:
            layer["axis"] = spec["axis"]
        return self.add(layer, path, outs or [start], name)

    def resolve(self) -> None:
        """Names in ``inputs`` and ``shares`` to node indexes (did-you-mean for an unknown one)."""
        choices = [MODEL_INPUT, *self.names]
        for j, ins in enumerate(self.inputs):
            for m, ref in enumerate(ins):
                if isinstance(ref, tuple):
                    ref_name, at = ref
                    if ref_name == MODEL_INPUT:
                        ins[m] = INPUT
                    elif ref_name in self.names:
                        ins[m] = self.names[ref_name]
                    else:
                        self.error(f"unknown input {ref_name!r}{did_you_mean(ref_name, choices)}; inputs name nodes "
                                   f"of this model ({', '.join(choices)})", at)
                        ins[m] = INPUT
        for j, ref in enumerate(self.shares):
            if ref is None:
                continue
            owner_name, at = ref
            k = self.names.get(owner_name)
            if k is None:
                self.error(f"unknown node {owner_name!r}{did_you_mean(owner_name, self.names)} to share weights with",
                           at)
                self.shares[j] = None
                self.specs[j] = "ReLU"  # (checked no further: the error stops the run)
                continue
            if self.shares[k] is not None:
                self.error(f"{owner_name!r} itself shares the weights of another node: name that node", at)
            self.shares[j] = k
            self.specs[j] = self.specs[k]

    def order(self) -> list[int]:
        """The raw nodes in an order where each follows its inputs (the config's order where it
        allows); a cycle is an error naming its nodes."""
        n = len(self.specs)
        users = [[] for _ in range(n)]
        waiting = [0] * n
        for j, ins in enumerate(self.inputs):
            for i in set(ins):
                if i != INPUT:
                    users[i].append(j)
                    waiting[j] += 1
        ready = [j for j in range(n) if waiting[j] == 0]
        heapq.heapify(ready)
        out = []
        while ready:
            j = heapq.heappop(ready)
            out.append(j)
            for u in users[j]:
                waiting[u] -= 1
                if waiting[u] == 0:
                    heapq.heappush(ready, u)
        if len(out) < n:
            stuck = [j for j in range(n) if waiting[j]]
            cycle = self._cycle(stuck)
            shown = " -> ".join(self._shown(j) for j in cycle + cycle[:1])
            self.error(f"the model's nodes form a cycle: {shown}; a node can read only nodes that do not read it",
                       f"{self.paths[cycle[0]]}.inputs")
            return list(range(n))
        return out

    def _cycle(self, stuck: list[int]) -> list[int]:
        left = set(stuck)
        j = stuck[0]
        seen: list[int] = []
        while j not in seen:
            seen.append(j)
            j = next(i for i in self.inputs[j] if i in left)
        return seen[seen.index(j):][::-1]

    def _shown(self, j: int) -> str:
        return f"{self.named[j]} ({self.paths[j]})" if self.named[j] else self.paths[j]


def lower(model: list, locate) -> tuple[list[NodeSpec], list[str]]:
    """The nodes of a graph model list in running order, and warnings (a node whose output
    nothing reads is left out); every problem at once as ConfigErrors."""
    g = _Lowering(locate)
    last = g.chain(model, "model", INPUT, (False, False))
    if last == INPUT:
        raise ConfigError("expected a non-empty list of layers", locate("model"))
    g.resolve()
    collect(g.errors)
    order = g.order()
    collect(g.errors)
    # the nodes the output depends on; the others are reported and left out
    needed = {last}
    for j in reversed(order):
        if j in needed:
            needed.update(i for i in g.inputs[j] if i != INPUT)
    for j in order:
        if j not in needed:
            g.warnings.append(f"{g.locate(g.paths[j])}: the output of {g._shown(j)} is read by no other node and is "
                              f"not the model's output (the last entry's); it is left out of the model")
    kept = [j for j in order if j in needed]
    kept.remove(last)
    kept.append(last)  # the output last (nothing reads it, so any place after its inputs holds)
    index = {j: k for k, j in enumerate(kept)}
    nodes = []
    for j in kept:
        share = g.shares[j]
        if share is not None and share not in index:
            raise ConfigError(f"{g._shown(j)} shares the weights of {g._shown(share)}, whose output is read by no "
                              f"node: apply the layer where it is used and share it from there",
                              locate(f"{g.paths[j]}.shares"))
        node = Node(g.paths[j], tuple(INPUT if i == INPUT else index[i] for i in g.inputs[j]), g.named[j],
                    None if share is None else index[share], g.hints[j])
        nodes.append(NodeSpec(g.specs[j], node, *g.frozen[j]))
    # a shared node applied before its owner runs: the owner must come first (it holds the weights)
    for k, ns in enumerate(nodes):
        if ns.node.shares is not None and ns.node.shares > k:
            raise ConfigError(f"{ns.node.path} shares the weights of {nodes[ns.node.shares].node.path}, which runs "
                              f"after it; give the weights to the node that runs first", locate(f"{ns.node.path}.shares"))
    return nodes, g.warnings
