"""The one module that reads YAML and validates configs.

``load_config(path, overrides)`` parses the file with a safe loader, applies ``--set`` overrides,
checks every key against the registries' signatures and returns a :class:`Config`. Every
problem found is reported at once, each with ``file:line: key.path: message``.
"""
from __future__ import annotations

import copy
import os
import re
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml

from . import registry
from .errors import ConfigError, DlrunError, Location, collect
from .options import FilePath, Fraction, NonNegativeInt, OptionError, PositiveInt, check_value, did_you_mean


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-3`` as a float (YAML 1.1 insists on ``1.0e-3``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


@dataclass
class TrainSettings:
    """The ``train:`` section.

    Args:
        epochs: passes over the training data.
        batch_size: samples per step; null means the whole training set (full batch).
        shuffle: reshuffle the training data every epoch (seeded by the run seed).
        validation_split: fraction of the data held out for validation (stratified for labels).
    """

    epochs: PositiveInt = 10
    batch_size: PositiveInt | None = 32
    shuffle: bool = True
    validation_split: Fraction = 0.0


@dataclass
class Config:
    """A validated config. ``raw`` is the resolved dict that is written to the run directory."""

    raw: dict
    source: "Source"
    name: str
    seed: int | None
    device: str
    dtype: str
    plugins: list[str]
    data: Any
    model: list
    loss: Any
    optimizer: Any
    regularizer: Any
    train: TrainSettings

    def locate(self, path: str) -> Location:
        return self.source.locate(path)

    def build_layers(self) -> list:
        """Fresh layer instances (a model owns its layers)."""
        return [registry.layers.build(s, f"model[{i}]", self.locate) for i, s in enumerate(self.model)]

    def build(self, kind: str):
        """A fresh instance of the component of section ``kind`` (loss, optimizer, regularizer, data)."""
        spec = getattr(self, kind)
        if spec is None:
            return None
        reg = registry.data if kind == "data" else getattr(registry, kind + ("es" if kind == "loss" else "s"))
        return reg.build(spec, kind, self.locate)


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
            probe = parent if parent != probe else ""  # "name" has no parent but the root


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
            if isinstance(target.get(k), str) and k in ("loss", "optimizer", "regularizer", "data"):
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


TOP_LEVEL = {
    "name": "run name used for the run directory (default: the config file's name)",
    "seed": "integer seed for weights, shuffling and layer randomness (default: drawn and recorded)",
    "device": "cpu or gpu",
    "dtype": "float32 (default) or float64",
    "plugins": "Python files with user layers, relative to this file",
    "data": "data generator or file",
    "model": "list of layers",
    "loss": "loss function",
    "optimizer": "optimizer",
    "regularizer": "run-wide default regularizer for weights",
    "train": "training settings",
}


def _check_fields(cls, given: dict, path: str, locate) -> tuple[Any, list]:
    """Validate a settings section against a dataclass's typed fields."""
    errors: list[DlrunError] = []
    hints = typing.get_type_hints(cls, include_extras=True)
    names = [f.name for f in fields(cls)]
    kwargs = {}
    if not isinstance(given, dict):
        return cls(), [ConfigError(f"expected a mapping of settings, got {given!r}", locate(path))]
    for k, v in given.items():
        p = _join(path, k)
        if k not in names:
            errors.append(ConfigError(f"unknown key {k!r}{did_you_mean(k, names)}; valid keys: {', '.join(names)}", locate(p)))
            continue
        try:
            kwargs[k] = check_value(v, hints[k])
        except OptionError as e:
            errors.append(ConfigError(str(e), locate(p)))
    return cls(**kwargs), errors


def validate(raw: Any, source: Source, base_dir: Path | None = None) -> Config:
    """Check a parsed config; raise every problem at once (ConfigErrors)."""
    locate = source.locate
    if not isinstance(raw, dict):
        raise ConfigError(f"expected a mapping with keys such as model, data, loss, optimizer; got {type(raw).__name__}", locate(""))
    errors: list[DlrunError] = []
    for k in raw:
        if k not in TOP_LEVEL:
            errors.append(ConfigError(f"unknown key {k!r}{did_you_mean(k, TOP_LEVEL)}; valid keys: {', '.join(TOP_LEVEL)}", locate(str(k))))
    for k in ("data", "model", "loss", "optimizer"):
        if k not in raw:
            errors.append(ConfigError(f"missing required key {k!r} ({TOP_LEVEL[k]})", locate("")))
        elif raw[k] is None:
            errors.append(ConfigError(f"expected a value ({TOP_LEVEL[k]}), got null", locate(k)))

    def check(key, hint, default):
        if key not in raw:
            return default
        try:
            return check_value(raw[key], hint)
        except OptionError as e:
            errors.append(ConfigError(str(e), locate(key)))
            return default

    name = check("name", str, Path(source.file).stem if source.file else "run")
    seed = check("seed", NonNegativeInt | None, None)
    device = check("device", Literal["cpu", "gpu"], "cpu")
    dtype = check("dtype", Literal["float32", "float64"], "float32")
    plugins = check("plugins", list[FilePath], [])
    if base_dir is not None:
        plugins = [str((base_dir / p).resolve()) if not Path(p).is_absolute() else str(p) for p in plugins]
        raw["plugins"] = plugins
    if plugins:
        from .plugins import load_plugins

        try:
            load_plugins(plugins)
        except DlrunError as e:
            e.where = e.where or locate("plugins")
            errors.append(e)

    if base_dir is not None and isinstance(raw.get("data"), dict) and isinstance(raw["data"].get("path"), str):
        p = Path(raw["data"]["path"])
        raw["data"]["path"] = str(p if p.is_absolute() else os.path.normpath(base_dir / p))

    def component(reg, key):
        if raw.get(key) is None:
            return None
        try:
            reg.build(raw[key], key, locate) if reg is not registry.data else reg.check(raw[key], key, locate)
        except DlrunError as e:
            errors.append(e)
        return raw[key]

    data = component(registry.data, "data")
    loss = component(registry.losses, "loss")
    optimizer = component(registry.optimizers, "optimizer")
    regularizer = component(registry.regularizers, "regularizer")
    model = raw.get("model")
    if "model" in raw:
        if not isinstance(model, list) or not model:
            errors.append(ConfigError(f"expected a non-empty list of layers, got {model!r}", locate("model")))
            model = []
        for i, spec in enumerate(model):
            try:
                registry.layers.build(spec, f"model[{i}]", locate)
            except DlrunError as e:
                errors.append(e)
    train, errs = _check_fields(TrainSettings, raw.get("train") or {}, "train", locate)
    errors.extend(errs)
    collect(errors)
    return Config(raw, source, name, seed, device, dtype, plugins, data, model, loss, optimizer, regularizer, train)


def load_config(path: str | Path, overrides: list[str] = (), seed: int | None = None,
                device: str | None = None) -> Config:
    """Read, override and validate a config file. ``seed``/``device`` come from CLI flags."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}", Location(str(p)))
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the config file ({e})", Location(str(p))) from None
    raw, source = parse_yaml(text, str(p))
    raw = copy.deepcopy(raw) if raw is not None else {}
    if not isinstance(raw, dict):
        raise ConfigError(f"expected a mapping at the top of the file, got {type(raw).__name__}", Location(str(p), 1))
    errors: list[DlrunError] = []
    for item in overrides:
        try:
            apply_override(raw, item, source)
        except DlrunError as e:
            errors.append(e)
    if seed is not None:
        raw["seed"] = seed
        source.flags["seed"] = "--seed"
    if device is not None:
        raw["device"] = device
        source.flags["device"] = "--device"
    try:
        config = validate(raw, source, p.parent)
    except DlrunError as e:
        errors.append(e)
    collect(errors)  # --set problems and the file's problems, all at once
    return config


def dump_yaml(data: Any) -> str:
    """YAML text for a resolved config (written into run directories)."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None)


def config_from_dict(raw: dict, name: str = "run") -> Config:
    """Validate an already-parsed config (a checkpoint's recorded config, or one built in Python)."""
    src = Source(None)
    raw = copy.deepcopy(raw)
    raw.setdefault("name", name)
    return validate(raw, src)
