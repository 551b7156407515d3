"""YAML for configs: safe parsing with the line of every key path, and --set overrides.

Part of the config concern (with dlrun/config.py): nothing else in dlrun imports yaml.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from .errors import ConfigError, DlrunError, Location, collect


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-3`` as a float (YAML 1.1 insists on ``1.0e-3``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


@dataclass
class Source:
    """Maps key paths to the file line (or ``--set`` flag) they came from."""

    file: str | None
    lines: dict[str, int] = field(default_factory=dict)
    flags: dict[str, str] = field(default_factory=dict)

    def locate(self, path: str) -> Location:
        for flagged, flag in self.flags.items():  # a key created by --set a.b=1 locates "a" too
            if path and flagged.startswith((path + ".", path + "[")) and path not in self.lines:
                return Location(flag, None, path)
        probe = path
        while True:
            if probe in self.flags:
                return Location(self.flags[probe], None, path)
            if probe in self.lines:
                return Location(self.file, self.lines[probe], path)
            if not probe:
                return Location(self.file, None, path)
            parent = re.sub(r"(\.[^.\[\]]+|\[\d+\])$", "", probe)
            probe = parent if parent != probe else ""  # a top-level key's parent is the root


def _join(path: str, key) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _walk(node, path: str, lines: dict, errors: list, file: str) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for k, v in node.value:
            key = k.value
            p = _join(path, key)
            if key in seen:
                errors.append(ConfigError(f"duplicate key {key!r}", Location(file, k.start_mark.line + 1, p)))
            seen.add(key)
            lines[p] = k.start_mark.line + 1
            _walk(v, p, lines, errors, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _walk(v, _join(path, i), lines, errors, file)


def parse_yaml(text: str, file: str | None = None) -> tuple[Any, Source]:
    """Parse YAML safely; return the data and a Source with line numbers for every key path."""
    try:
        node = yaml.compose(text, Loader=_Loader)
        data = yaml.load(text, Loader=_Loader)
    except yaml.constructor.ConstructorError as e:
        mark = e.problem_mark or e.context_mark
        tag = re.search(r"tag '([^']*)'", e.problem or "")
        raise ConfigError(
            f"YAML tag {tag.group(1) if tag else '?'!r} is not allowed: dlrun reads configs with a safe loader "
            f"that only builds plain values (numbers, strings, lists, mappings), never Python objects",
            Location(file, mark.line + 1 if mark else None)) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        col = f" (column {mark.column + 1})" if mark else ""
        raise ConfigError(f"YAML syntax error{col}: {e.problem or e.context}", Location(file, line)) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"YAML error: {e}", Location(file)) from None
    source = Source(file)
    errors: list[DlrunError] = []
    if node is not None:
        _walk(node, "", source.lines, errors, file)
    collect(errors)
    return data, source


_PATH_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _split_path(path: str) -> list:
    keys = []
    for name, index in _PATH_TOKEN.findall(path):
        keys.append(int(index) if index else (int(name) if name.isdigit() else name))
    return keys


def apply_override(raw: dict, item: str, source: Source) -> None:
    """Apply one ``--set key.path=value``; the value is parsed as YAML (``5``, ``0.1``, ``[1, 2]``)."""
    flag = f"--set {item}"
    if "=" not in item:
        raise ConfigError(f"expected KEY=VALUE (for example train.epochs=5), got {item!r}", Location("--set"))
    key, _, text = item.partition("=")
    keys = _split_path(key.strip())
    if not keys:
        raise ConfigError(f"empty key in {item!r}", Location("--set"))
    try:
        value = yaml.load(text, Loader=_Loader) if text.strip() else None
    except yaml.YAMLError:
        value = text
    target = raw
    path = ""
    for k in keys[:-1]:
        path = _join(path, k)
        if isinstance(target, list) and isinstance(k, int):
            if not -len(target) <= k < len(target):
                raise ConfigError(f"index {k} is out of range (the list has {len(target)} items)", Location(flag, None, path))
            if isinstance(target[k], str):  # "ReLU" shorthand -> mapping, so options can be set
                target[k] = {"type": target[k]}
            target = target[k]
        elif isinstance(target, dict):
            if isinstance(target.get(k), str) and k in ("loss", "optimizer", "regularizer", "data", "schedule"):
                target[k] = {"type": target[k]}
            target = target.setdefault(k, {})
        else:
            raise ConfigError(f"cannot set a key inside a {type(target).__name__}", Location(flag, None, path))
    last = keys[-1]
    path = _join(path, last)
    if isinstance(target, list) and isinstance(last, int) and -len(target) <= last < len(target):
        target[last] = value
    elif isinstance(target, dict):
        target[last] = value
    else:
        raise ConfigError(f"cannot set {key!r} here", Location(flag, None, path))
    source.flags[path] = flag
    source.lines = {p: n for p, n in source.lines.items() if not (p == path or p.startswith(path + ".") or p.startswith(path + "["))}


def dump_yaml(data: Any) -> str:
    """YAML text for a resolved config (written into run directories)."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None)


def parse_value(text: str, where: str) -> Any:
    """A command-line value written as YAML (``spiral``, ``{type: spiral, seed: 3}``)."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        raise ConfigError(f"cannot parse {text!r} as YAML ({type(e).__name__})", Location(where)) from None
