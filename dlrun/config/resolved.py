"""The resolved config: what a run does, every default written out.

A config names only what it changes. :func:`resolved` writes out the rest from the registries'
typed options (:mod:`dlrun.registry.options`) and the config's own schema
(:mod:`dlrun.config.settings`): every top-level key, every ``train:`` setting, every option of
every layer, initializer, loss, optimizer, schedule, metric and data source with its default.
The result is a config that ``dlrun train`` accepts and that trains exactly as the original:
`dlrun config` prints it and each run directory keeps it as ``config.resolved.yaml``.
"""
from __future__ import annotations

import types
import typing
from dataclasses import fields, is_dataclass
from typing import Annotated, Any, Union

from .. import registry
from ..registry.options import component_registry
from .graph import block_type, layer_options
from .settings import TOP_LEVEL, Components, TrainSettings


BLOCK = ("train",)  # written one setting a line by dump_yaml(resolved(config), BLOCK)


def resolved(config) -> dict:
    """The config ``config`` (a validated :class:`dlrun.config.Config`) with every default applied.

    ``seed`` is the run's seed once a run has drawn one, else null (drawn when a run starts)."""
    raw = config.raw
    out: dict[str, Any] = {"name": config.name, "seed": config.seed, "device": config.device,
                           "dtype": config.dtype, "plugins": [str(p) for p in config.plugins]}
    for key in TOP_LEVEL:
        if key in out:
            continue
        if key == "train":
            out[key] = _settings(TrainSettings, raw.get("train") or {})
        elif key == "model" and isinstance(raw.get("model"), list):
            out[key] = _model(raw["model"])
        else:
            out[key] = _value(raw.get(key, TOP_LEVEL[key].default), TOP_LEVEL[key].hint)
    return out


def component(reg, spec, sections: tuple[tuple[str, type], ...] = ()) -> dict:
    """``{type: NAME, option: value, ...}`` for a spec of registry ``reg``: every option of the
    component, given or default, nested components resolved too; the keys every entry of its
    kind may carry (a layer's ``trainable``, a metric's ``name``) as given, ``trainable`` true
    when not given; the settings ``sections`` the spec may carry (data's ``preprocess``) with
    their defaults, when given (a data source without ``preprocess`` is used as it is)."""
    name, given = reg.parse_spec(spec)
    out = {"type": name}
    for o in reg.options(name):
        out[o.name] = _value(given[o.name] if o.name in given else o.default, o.hint)
    for key, cls in sections:
        if key in given:
            out[key] = _settings(cls, given[key] or {})
    for key in reg.entry_keys:
        if key in out:
            continue
        if key in given:
            out[key] = given[key]
        elif key == "trainable":
            out[key] = True
    return out


def _model(entries: list) -> list:
    """A model list resolved: each layer with every option; a Residual or Parallel block with its
    defaults and its layers resolved; a node that shares another's weights as given."""
    out = []
    for spec in entries:
        kind = block_type(spec)
        if kind == "Residual":
            proj = spec.get("projection")
            entry = {"type": kind, "body": _model(spec["body"]),
                     "projection": None if proj is None else _model(proj) if isinstance(proj, list) else _model([proj])[0]}
        elif kind == "Parallel":
            entry = {"type": kind, "branches": [_model(b) for b in spec["branches"]],
                     "merge": spec.get("merge", "concat")}
            if entry["merge"] == "concat":
                entry["axis"] = spec.get("axis", 0)
        elif isinstance(spec, dict) and "shares" in spec:
            entry = dict(spec)
        else:
            entry = component(registry.layers, layer_options(spec))
        for key in ("trainable", "name", "inputs"):
            if isinstance(spec, dict) and key in spec:
                entry[key] = spec[key]
        out.append(entry)
    return out


def _settings(cls, given: dict) -> dict:
    """A settings section (a dataclass of typed fields) with every field, given or default."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: _value(given.get(f.name, f.default), hints[f.name]) for f in fields(cls)}


def _value(value, hint):
    """``value`` resolved for its type ``hint``: component specs and settings sections with their
    defaults, tuples as lists (as YAML writes them)."""
    if value is None:
        return None
    marker = _components(hint)
    if marker is not None:
        reg = registry.REGISTRIES[marker.kind]
        if marker.many:
            return [component(reg, v, marker.sections) for v in value] if isinstance(value, list) else value
        return component(reg, value, marker.sections)
    for arg in _alternatives(hint):
        if isinstance(arg, type) and is_dataclass(arg) and isinstance(value, dict):
            return _settings(arg, value)
        reg = component_registry(arg)
        if reg is not None and isinstance(value, (str, dict)):
            return component(reg, value)
    if isinstance(value, (list, tuple)):
        return [_value(v, Any) for v in value]
    for plain in (bool, int, float, str):  # a str subclass (FilePath) as YAML writes a str
        if isinstance(value, plain):
            return plain(value)
    return value


def _components(hint) -> Components | None:
    """The :class:`Components` marker of an ``Annotated[..., Components(kind)]`` hint, or None."""
    if typing.get_origin(hint) is Annotated:
        return next((m for m in typing.get_args(hint)[1:] if isinstance(m, Components)), None)
    return None


def _alternatives(hint) -> tuple:
    """The types a hint allows: the members of a union, the base of an Annotated, else itself."""
    if typing.get_origin(hint) is Annotated:
        return _alternatives(typing.get_args(hint)[0])
    if typing.get_origin(hint) in (Union, types.UnionType):
        return tuple(a for arg in typing.get_args(hint) for a in _alternatives(arg))
    return (hint,)
