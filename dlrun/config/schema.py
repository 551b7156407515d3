"""A JSON Schema of dlrun configs, generated from what dlrun itself checks.

:func:`json_schema` turns the config's keys (:mod:`dlrun.config.settings`) and every registered
component's typed options (:mod:`dlrun.registry.options`: types, ranges, choices, defaults and
the docs of ``dlrun show``) into a JSON Schema (draft 2020-12) for editors' YAML language
servers: completion, hover docs and errors while typing. Plugins count when they were loaded
first (``dlrun schema --plugin FILE.py``).

A schema checks each value on its own. What needs the data, the model's shapes or several keys
together is checked by ``dlrun check`` alone: see :data:`NOT_IN_SCHEMA`.
"""
from __future__ import annotations

import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union
from urllib.parse import quote

from .. import registry
from ..registry import docstrings
from ..registry.options import FilePath, Range, component_registry
from . import LEGACY_DATA_OPTIONS
from .graph import MERGES
from .settings import TOP_LEVEL, Components

DRAFT = "https://json-schema.org/draft/2020-12/schema"

# a run name: one directory level, no surrounding spaces (dlrun.config._safe_name)
NAME_PATTERN = r"^(?!\s)(?!.*\s$)(?!\.\.?$)[^/\\\x00]+$"

# what dlrun checks that a JSON Schema cannot say (docs/config.md lists them for users)
NOT_IN_SCHEMA = {
    "finite numbers": "a schema's number type admits .nan and .inf, which dlrun refuses",
    "YAML itself": "syntax errors, tabs, duplicate keys, tags such as !!python, non-UTF-8 bytes, "
                   "values nested too deeply: the YAML reader refuses them before any schema applies",
    "data": "files that exist and hold numbers, labels in range, a validation split that is not empty",
    "shapes": "each layer's input shape, the loss against the model's outputs",
    "monitors": "train.monitor and early_stopping.monitor naming a column the run records",
    "plugins": "plugin files that exist and load; their components only when named with --plugin",
    "options checked together": "constraints a component checks across its options (a layer's "
                                "stride against its padding, say)",
}


def json_schema() -> dict:
    """The JSON Schema of a config, for every component registered now (built-ins, installed
    packages' entry points and plugin files loaded before the call)."""
    registry.load_builtins()
    defs: dict[str, Any] = {}
    sections = {m.kind: m.sections for m in map(_marker, [k.hint for k in TOP_LEVEL.values()]) if m is not None}
    for kind, reg in registry.REGISTRIES.items():
        defs[kind] = _kind(kind, reg, defs, sections.get(kind, ()))
    defs.update(_graph_entries())
    properties = {}
    for key, k in TOP_LEVEL.items():
        schema = _type(k.hint, defs)
        properties[key] = {**(_nullable(schema) if k.default is None and not k.required else schema), "description": k.doc}
        if k.default not in (None, [], MISSING):
            properties[key]["default"] = k.default
    properties["name"] = {"type": "string", "pattern": NAME_PATTERN, "description": TOP_LEVEL["name"].doc}
    return {"$schema": DRAFT, "title": "dlrun config",
            "description": "A dlrun training run: data, model, loss, optimizer and training settings.",
            "type": "object", "properties": properties, "additionalProperties": False,
            "required": [k for k, key in TOP_LEVEL.items() if key.required], "$defs": defs}


MODEL_ENTRY = "model.entry"  # an entry of a model list (the layers' schema, a block, a shared node)
ENTRY_KEYS = {  # the keys any entry of a model list may carry (dlrun.config.graph)
    "trainable": {"type": "boolean", "default": True,
                  "description": "false: keep the parameters of this layer (of every layer in this block) as they are"},
    "name": {"type": "string", "description": "the node's name, for inputs: of later entries, shares: and --set model.NAME"},
    "inputs": {"type": "array", "items": {"type": "string"}, "minItems": 1,
               "description": "the nodes this entry reads, by name (input: the model's input); default: the entry before"},
}


def _graph_entries() -> dict:
    """The schemas of a model list's entries besides layers: Residual, Parallel, a shared node."""
    entry, chain = _ref(MODEL_ENTRY), {"type": "array", "items": _ref(MODEL_ENTRY)}
    residual = {"type": "object", "description": "y = x + body(x), with an optional projection of x", "properties": {
        "type": {"const": "Residual"}, "body": {**chain, "minItems": 1, "description": "the layers of the body"},
        "projection": {"anyOf": [entry, chain, {"type": "null"}], "default": None,
                       "description": "layer(s) applied to x when the body changes its shape"}, **ENTRY_KEYS},
        "required": ["type", "body"], "additionalProperties": False}
    parallel = {"type": "object", "description": "branches on one input, their outputs merged", "properties": {
        "type": {"const": "Parallel"},
        "branches": {"type": "array", "items": chain, "minItems": 2, "description": "lists of layers ([]: the input)"},
        "merge": {"enum": list(MERGES), "default": "concat", "description": "how the branches' outputs are joined"},
        "axis": {"type": "integer", "default": 0, "description": "merge: concat joins along this per-sample axis"},
        **ENTRY_KEYS}, "required": ["type", "branches"], "additionalProperties": False}
    shared = {"type": "object", "description": "the layer of another node applied again, with the same weights",
              "properties": {"shares": {"type": "string", "description": "the node whose layer and weights to apply"},
                             "inputs": ENTRY_KEYS["inputs"], "name": ENTRY_KEYS["name"]},
              "required": ["shares"], "additionalProperties": False}
    blocks = {"Residual": residual, "Parallel": parallel}
    return {"model.Residual": residual, "model.Parallel": parallel, "model.shares": shared, MODEL_ENTRY: {
        "description": "a layer, a Residual or Parallel block, or {shares: NAME}",
        "if": {"type": "object", "required": ["shares"]}, "then": _ref("model.shares"),
        "else": {"if": {"type": "object", "properties": {"type": {"enum": list(blocks)}}, "required": ["type"]},
                 "then": {"anyOf": [_ref(f"model.{k}") for k in blocks]}, "else": _ref("layers")}}}


def _ref(name: str) -> dict:
    return {"$ref": "#/$defs/" + quote(name, safe="._-")}


def _marker(hint) -> Components | None:
    """The :class:`Components` of an ``Annotated[..., Components(kind)]`` hint, or None."""
    if typing.get_origin(hint) is Annotated:
        return next((m for m in typing.get_args(hint)[1:] if isinstance(m, Components)), None)
    return None


def _kind(kind: str, reg, defs: dict, sections=()) -> dict:
    """One kind's schema: a name (when the component needs no option) or ``{type: NAME, ...}``
    with that component's options; each component's own schema goes into ``defs``."""
    names = reg.names()
    bare = []
    branches = []
    for name in names:
        options = reg.options(name)
        if not any(o.required for o in options):
            bare.append(name)
        defs[f"{kind}.{name}"] = _component(reg, name, options, defs, sections)
        branches.append({"if": {"properties": {"type": {"const": name}}, "required": ["type"]},
                         "then": _ref(f"{kind}.{name}")})
    mapping = {"type": "object", "properties": {"type": {"enum": names, "description": f"the {reg.kind}"}},
               "required": ["type"], "allOf": branches}
    return {"description": f"{reg.article} {reg.kind}: a name, or a mapping with its type and options "
                           f"(`dlrun list {kind}`)", "if": {"type": "string"}, "then": {"enum": bare}, "else": mapping}


def _component(reg, name: str, options, defs: dict, sections=()) -> dict:
    """A component's mapping: ``type`` and its options, each with type, default and docs (and
    the settings ``sections`` a spec of its kind may carry: data's ``preprocess``)."""
    props: dict[str, Any] = {"type": {"const": name}}
    for o in options:
        props[o.name] = {**_type(o.hint, defs), **({"description": o.doc} if o.doc else {})}
        if not o.required:
            default = _json(o.default)
            if default is not MISSING:
                props[o.name]["default"] = default
    for key in (k for k in reg.entry_keys if k not in dict(sections)):  # a layer's trainable, a metric's name
        props[key] = ENTRY_KEYS[key] if reg is registry.layers else \
            {"type": "string", "description": "the name of its columns, train_NAME and val_NAME"}
    for key, cls in sections:
        props[key] = _nullable(_settings(cls, defs))
    for kind, key in LEGACY_DATA_OPTIONS:  # replaced: a config may not set it (its doc says by what)
        if reg is registry.data and name == kind and key in props:
            props[key].update({"not": {"const": True}, "deprecated": True})
    origin = reg.origin(name)
    summary = docstrings.summary(reg.get(name)) + ("" if origin == "builtin" else f" (from {origin})")
    return {"type": "object", "description": summary, "properties": props,
            "required": [o.name for o in options if o.required], "additionalProperties": False}


def _type(hint, defs: dict) -> dict:
    """The JSON Schema of a type hint as :func:`dlrun.registry.options.check_value` reads it."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        base, *meta = typing.get_args(hint)
        marker = _marker(hint)
        if marker is not None:
            one = _ref(marker.kind)
            if marker.many and marker.kind == "layers":  # a model list: layers, blocks, shared nodes
                return {"type": "array", "items": _ref(MODEL_ENTRY), "minItems": 1}
            return \
                {"anyOf": [{"type": "array", "items": one}, {"type": "null"}]} if marker.many else one
        out = _type(base, defs)
        for m in meta:
            if isinstance(m, Range):
                if m.min is not None:
                    out["minimum" if m.min_inclusive else "exclusiveMinimum"] = m.min
                if m.max is not None:
                    out["maximum" if m.max_inclusive else "exclusiveMaximum"] = m.max
        return out
    if origin is Literal:
        return {"enum": list(typing.get_args(hint))}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_type(a, defs) for a in typing.get_args(hint)]}
    if origin in (list, tuple):
        args = typing.get_args(hint)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return {"type": "array", "prefixItems": [_type(a, defs) for a in args], "items": False,
                    "minItems": len(args), "maxItems": len(args)}
        return {"type": "array", "items": _type(args[0], defs)} if args else {"type": "array"}
    if hint is type(None) or hint is None:
        return {"type": "null"}
    if isinstance(hint, type) and is_dataclass(hint):
        return _settings(hint, defs)
    simple = {bool: "boolean", int: "integer", float: "number", str: "string", FilePath: "string", Path: "string"}
    if hint in simple:
        return {"type": simple[hint]}
    reg = component_registry(hint)
    if reg is not None:
        kind = next(k for k, r in registry.REGISTRIES.items() if r is reg)
        return _ref(kind)
    return {}  # Any, or a type a config cannot write: anything


def _settings(cls, defs: dict) -> dict:
    """A settings section (``train:``, ``train.early_stopping:``): its typed fields, documented
    by the class's ``Args:``."""
    hints = typing.get_type_hints(cls, include_extras=True)
    docs = docstrings.doc_args(cls)
    props = {}
    for f in fields(cls):
        schema = _type(hints[f.name], defs)
        schema = _nullable(schema) if f.default is None else schema  # null: the setting's default (unset)
        props[f.name] = {**schema, **({"description": docs[f.name]} if f.name in docs else {})}
        default = _json(f.default)
        if default is not MISSING:
            props[f.name]["default"] = default
    return {"type": "object", "description": docstrings.summary(cls), "properties": props,
            "additionalProperties": False}


def _nullable(schema: dict) -> dict:
    """``schema`` or null."""
    if schema.get("type") == "null" or {"type": "null"} in schema.get("anyOf", []) or not schema:
        return schema
    return {"anyOf": [schema, {"type": "null"}]}


def _json(value):
    """A default as JSON writes it (tuples as lists), or MISSING when JSON has no such value."""
    if value is MISSING or value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value if value == value and value not in (float("inf"), float("-inf")) else MISSING
    if isinstance(value, (list, tuple)):
        items = [_json(v) for v in value]
        return MISSING if MISSING in items else items
    return MISSING
