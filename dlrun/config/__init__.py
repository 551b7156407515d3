"""The one module that reads YAML and validates configs.

``load_config(path, overrides)`` parses the file with a safe loader, applies ``--set`` overrides,
checks every key against the registries' signatures and returns a :class:`Config`. Every
problem found is reported at once, each with ``file:line: key.path: message``.
"""
from __future__ import annotations

import copy
import os
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from .. import registry
from ..metrics.base import split_entry
from .source import Source, _join, apply_override, key_paths, parse_yaml, read_config_text
from ..errors import ConfigError, DlrunError, Location, PluginError, collect
from ..registry.options import OptionError, _got, check_value, did_you_mean, recorded
from ..metrics import monitor
from ..registry.plugins import load_plugins, loaded
from .settings import TOP_LEVEL, TrainSettings
from .graph import NodeSpec, is_chain, layer_options, lower
from ..data.preprocess import Settings


@dataclass
class Config:
    """A validated config. ``raw`` is the resolved dict that is written to the run directory."""

    raw: dict
    source: Source
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
    # how a stratified split rounds the classes' shares (data.split): a checkpoint records it
    split_shares: str = "whole"
    preprocess: Settings | None = None  # data.preprocess (data.load_data fits it on the training split)
    # a model that is not a chain (Residual, Parallel, named inputs): its nodes in running order
    nodes: list[NodeSpec] | None = None
    warnings: list[str] = field(default_factory=list)  # for the user, printed by the command line

    def locate(self, path: str) -> Location:
        return self.source.locate(path)

    def build_layers(self) -> list:
        """Fresh layer instances (a model owns its layers): one per entry of a chain, one per node
        of a graph."""
        if self.nodes is not None:
            return [registry.layers.build(n.spec, n.node.path, self.locate) for n in self.nodes]
        return [build_layer(s, i, self.locate)[0] for i, s in enumerate(self.model)]

    @property
    def frozen(self) -> list[int]:
        """Indexes of the layers (a graph's nodes) marked ``trainable: false``: their parameters
        are not trained."""
        if self.nodes is not None:
            return [k for k, n in enumerate(self.nodes) if n.frozen]
        return [i for i, s in enumerate(self.model) if isinstance(s, dict) and s.get("trainable") is False]

    @property
    def frozen_loose(self) -> list[int]:
        """Those of :attr:`frozen` frozen by a block around them, which may have no weights."""
        return [k for k, n in enumerate(self.nodes or []) if n.frozen and n.loose]

    def build(self, kind: str):
        """A fresh instance of the component of section ``kind`` (loss, optimizer, regularizer, data)."""
        spec = getattr(self, kind)
        if spec is None:
            return None
        reg = registry.data if kind == "data" else getattr(registry, kind + ("es" if kind == "loss" else "s"))
        return reg.build(spec, kind, self.locate)


def build_layer(spec, i: int, locate) -> tuple:
    """The layer of model entry ``i`` and whether it is frozen. ``trainable: false`` is a model
    setting that any entry may carry (Keras' ``layer.trainable = False``), not a layer option."""
    if not (isinstance(spec, dict) and ("trainable" in spec or "name" in spec)):
        return registry.layers.build(spec, f"model[{i}]", locate), False
    if "name" in spec and not isinstance(spec["name"], str):
        raise ConfigError(f"expected a node name (a string), got {spec['name']!r}", locate(f"model[{i}].name"))
    try:
        trainable = check_value(spec.get("trainable", True), bool)
    except OptionError as e:
        raise ConfigError(str(e), locate(f"model[{i}].trainable")) from None
    options = layer_options(spec)
    layer = registry.layers.build(options, f"model[{i}]", locate)
    spec.update(options)  # options as recorded (units: 1e3 is written as 1000)
    return layer, not trainable




def _safe_name(name: str) -> bool:
    """A run name stays one directory level inside the runs directory, and leaves room in a file
    name (255 bytes) for the ``-YYYYmmdd-HHMMSS-N`` dlrun appends."""
    return bool(name.strip()) and name == name.strip() and name not in (".", "..") and not any(
        c in name for c in ("/", "\\", "\0", os.sep)) and len(name.encode(errors="replace")) <= MAX_NAME


MAX_NAME = 200  # bytes


def _settings_class(hint):
    """The dataclass in a ``Settings | None`` hint, or None."""
    for a in typing.get_args(hint) or (hint,):
        if isinstance(a, type) and is_dataclass(a):
            return a
    return None


def _check_fields(cls, given: dict, path: str, locate) -> tuple[Any, list]:
    """Validate a settings section against a dataclass's typed fields."""
    errors: list[DlrunError] = []
    hints = typing.get_type_hints(cls, include_extras=True)
    names = [f.name for f in fields(cls)]
    kwargs = {}
    if not isinstance(given, dict):
        return cls(), [ConfigError(f"expected a mapping with keys {', '.join(names)}, got {given!r}", locate(path))]
    for k, v in given.items():
        p = _join(path, k)
        if k not in names:
            errors.append(ConfigError(f"unknown key {k!r}{did_you_mean(k, names)}; valid keys: {', '.join(names)}", locate(p)))
            continue
        section = _settings_class(hints[k])
        if section is not None and v is not None:  # a nested settings mapping
            kwargs[k], errs = _check_fields(section, v, p, locate)
            errors.extend(errs)
            continue
        try:
            kwargs[k] = check_value(v, hints[k])
            given[k] = recorded(v, kwargs[k])
        except OptionError as e:
            errors.append(ConfigError(str(e), locate(p)))
    return cls(**kwargs), errors


def validate(raw: Any, source: Source, base_dir: Path | None = None, run_plugins: bool = True,
             from_checkpoint: bool = False) -> Config:
    """Check a parsed config; raise every problem at once (ConfigErrors).

    ``run_plugins``: load the files its ``plugins:`` list names. False for a config recorded in a
    checkpoint, which never runs code: each file must already have been loaded (``--plugin``).
    ``from_checkpoint``: a checkpoint's config, which may keep data options that preprocessing replaced."""
    locate = source.locate
    if not isinstance(raw, dict):
        raise ConfigError(f"expected a mapping with keys such as model, data, loss, optimizer; got {type(raw).__name__}", locate(""))
    errors: list[DlrunError] = []
    for k in raw:
        if k not in TOP_LEVEL:
            errors.append(ConfigError(f"unknown key {k!r}{did_you_mean(k, TOP_LEVEL)}; valid keys: {', '.join(TOP_LEVEL)}", locate(str(k))))
    for k in (k for k, key in TOP_LEVEL.items() if key.required):
        if k not in raw:
            errors.append(ConfigError(f"missing required key {k!r} ({TOP_LEVEL[k].doc})", locate("")))
        elif raw[k] is None:
            errors.append(ConfigError(f"expected a value ({TOP_LEVEL[k].doc}), got null", locate(k)))

    def check(key, hint, default):
        if key not in raw:
            return default
        try:
            value = check_value(raw[key], hint)
            raw[key] = recorded(raw[key], value)
            return value
        except OptionError as e:
            errors.append(ConfigError(str(e), locate(key)))
            return default

    name = check("name", str, Path(source.file).stem if source.file else "run")
    if "name" in raw and isinstance(name, str) and not _safe_name(name):
        shown = name if len(name) <= 60 else f"{name[:57]}... ({len(name)} characters)"
        errors.append(ConfigError(f"expected a run name of at most {MAX_NAME} bytes without path separators or "
                                  f"surrounding spaces (it names a directory inside the runs directory), got "
                                  f"{shown!r}", locate("name")))
    seed, device, dtype = (check(k, TOP_LEVEL[k].hint, TOP_LEVEL[k].default) for k in ("seed", "device", "dtype"))
    plugins = check("plugins", TOP_LEVEL["plugins"].hint, [])
    if base_dir is not None:
        plugins = [str((base_dir / p).resolve()) if not Path(p).is_absolute() else str(p) for p in plugins]
        raw["plugins"] = plugins
    plugin_failed = None
    if plugins:
        try:
            if not run_plugins:
                for p in plugins:
                    if not loaded(p):
                        raise PluginError(f"{p}: plugin code runs only from files named on the command line; "
                                          f"add --plugin {p} to run it")
            load_plugins(plugins)
        except DlrunError as e:
            e.where = e.where or locate("plugins")
            errors.append(e)
            plugin_failed = e

    for key in ("path", "validation_path"):
        if base_dir is not None and isinstance(raw.get("data"), dict) and isinstance(raw["data"].get(key), str):
            p = Path(raw["data"][key])
            # absolute, so the recorded config reads the same file from any directory (evaluate, --resume)
            raw["data"][key] = str(p if p.is_absolute() else os.path.abspath(base_dir / p))

    def component(reg, key, source_only=False):
        if raw.get(key) is None:
            return None
        spec = raw[key]
        if source_only and isinstance(spec, dict):  # data: the generator's options, without preprocess
            spec = {k: v for k, v in spec.items() if k != "preprocess"}
        try:
            reg.build(spec, key, locate) if reg is not registry.data else reg.check(spec, key, locate)
        except DlrunError as e:
            errors.append(e)
        if spec is not raw[key]:
            raw[key].update(spec)  # (numbers as recorded)
        return spec

    preprocess = None
    if isinstance(raw.get("data"), dict) and "preprocess" in raw["data"]:
        given = raw["data"]["preprocess"]
        preprocess, errs = _check_fields(Settings, {} if given is None else given, "data.preprocess", locate)
        errors.extend(errs)
    errors.extend(_legacy_data_options(raw.get("data"), from_checkpoint, locate))
    data = component(registry.data, "data", source_only=True)
    loss = component(registry.losses, "loss")
    optimizer = component(registry.optimizers, "optimizer")
    regularizer = component(registry.regularizers, "regularizer")
    model = raw.get("model")
    nodes, warnings = None, []
    if "model" in raw:  # (null was reported above)
        if model is not None and (not isinstance(model, list) or not model):
            errors.append(ConfigError(f"expected a non-empty list of layers, got {model!r}", locate("model")))
            model = []
        if model and not is_chain(model):
            try:
                nodes, warnings = lower(model, locate)
                for n in nodes:
                    try:
                        registry.layers.build(n.spec, n.node.path, locate)
                    except DlrunError as e:
                        errors.append(e)
            except DlrunError as e:
                errors.append(e)
        else:
            names = {}
            for i, spec in enumerate(model or []):
                try:
                    build_layer(spec, i, locate)
                except DlrunError as e:
                    errors.append(e)
                if isinstance(spec, dict) and isinstance(spec.get("name"), str):
                    if spec["name"] in names:
                        errors.append(ConfigError(f"the name {spec['name']!r} is already used by {names[spec['name']]}; "
                                                  f"names must be unique in the model", locate(f"model[{i}].name")))
                    names.setdefault(spec["name"], f"model[{i}]")
    train, errs = _check_fields(TrainSettings, {} if raw.get("train") is None else raw["train"], "train", locate)
    errors.extend(errs)
    specs = [("train.schedule", train.schedule)] if train.schedule is not None else []
    if train.metrics is not None and not isinstance(train.metrics, list):
        errors.append(ConfigError(f"expected a list of metrics such as [mae] or [f1, {{type: top_k_accuracy, k: 3}}], "
                                  f"got {_got(train.metrics)}", locate("train.metrics")))
        train.metrics = None
    for path, spec in specs + [(f"train.metrics[{i}]", m) for i, m in enumerate(train.metrics or [])]:
        try:
            if path == "train.schedule":
                registry.schedules.build(spec, path, locate)
            else:  # a metric entry may name its columns (name:), which is not the metric's option
                registry.metrics.build(split_entry(spec, path, locate)[0], path, locate)
        except DlrunError as e:
            errors.append(e)
    errors.extend(monitor.config_errors(train, locate))
    given = raw.get("train") if isinstance(raw.get("train"), dict) else {}
    if train.log_every_n_steps is not None and "tensorboard" not in train.loggers \
            and given.get("loggers", train.loggers) == train.loggers:  # (loggers valid: not reported above)
        errors.append(ConfigError(f"log_every_n_steps writes the step loss to TensorBoard, but train.loggers is "
                                  f"[{', '.join(train.loggers)}]; add tensorboard to it (loggers: [csv, tensorboard]) or drop "
                                  f"log_every_n_steps", locate("train.log_every_n_steps")))
    if plugin_failed is not None:  # names it would have defined are unknown: one error, not ten
        unknown = [e for e in errors if getattr(e, "unknown_name", None)]
        if unknown:
            errors = [e for e in errors if e not in unknown]
            names = ", ".join(dict.fromkeys(e.unknown_name for e in unknown))
            plugin_failed.message += f" (so these names were not checked: {names})"
    collect(errors)
    return Config(raw, source, name, seed, device, dtype, plugins, data, model, loss, optimizer, regularizer, train,
                  preprocess=preprocess, nodes=nodes, warnings=warnings)


# data generator options that preprocessing replaced: a config spells them the new way; a run
# recorded before keeps them (and its meaning) in its checkpoint's config
LEGACY_DATA_OPTIONS = {
    ("iris", "standardize"): "preprocess: {numeric: standardize} (fitted on the training split and saved with "
                             "the model, so predict and evaluate take raw measurements)",
}


def _legacy_data_options(spec, from_checkpoint: bool, locate) -> list[DlrunError]:
    """A ConfigError for each replaced data option a config (not a checkpoint's) sets to true."""
    if from_checkpoint or not isinstance(spec, dict):
        return []
    return [ConfigError(f"replaced by {new}", locate(f"data.{key}"))
            for (kind, key), new in LEGACY_DATA_OPTIONS.items() if spec.get("type") == kind and spec.get(key) is True]


def load_config(path: str | Path, overrides: list[str] = (), seed: int | None = None,
                device: str | None = None) -> Config:
    """Read, override and validate a config file. ``seed``/``device`` come from CLI flags."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}" + (" (it is a folder)" if p.is_dir() else ""), Location(str(p)))
    raw, source = parse_yaml(read_config_text(p), str(p))
    raw = copy.deepcopy(raw) if raw is not None else {}
    if not isinstance(raw, dict):
        raise ConfigError(f"expected a mapping at the top of the file, got {type(raw).__name__}", Location(str(p), 1))
    return _resolve(raw, source, overrides, seed, device, p.parent)


def config_from_dict(raw: dict, name: str = "run", overrides: list[str] = (), device: str | None = None,
                     origin: str | None = None, run_plugins: bool = True, from_checkpoint: bool = False) -> Config:
    """Validate an already-parsed config (a checkpoint's recorded config, or one built in Python).

    ``overrides`` are ``--set`` items and ``device`` the ``--device`` flag, applied first;
    ``origin`` names where the dict came from in error messages (a checkpoint file);
    ``run_plugins=False`` (a checkpoint's config) loads no plugin file: those it lists must have
    been named with ``--plugin``; ``from_checkpoint``: the config a checkpoint recorded (see :func:`validate`).
    """
    src = Source(origin, known=set(key_paths(raw)))
    raw = copy.deepcopy(raw)
    named = "name" in raw
    raw.setdefault("name", name)
    config = _resolve(raw, src, overrides, None, device, None, run_plugins, from_checkpoint)
    if not named and config.raw.get("name") == name:  # the default names the Config, it is not recorded:
        config.raw.pop("name")  # a checkpoint's config without one (named after its file) stays so in config.yaml
    return config


def _resolve(raw: dict, source: Source, overrides, seed: int | None, device: str | None,
             base_dir: Path | None, run_plugins: bool = True, from_checkpoint: bool = False) -> Config:
    """Apply ``--set`` items and the --seed/--device flags, then validate; all problems at once."""
    errors: list[DlrunError] = []
    for item in overrides:
        try:
            apply_override(raw, item, source)
        except DlrunError as e:
            errors.append(e)
    for key, value, flag in (("seed", seed, "--seed"), ("device", device, "--device")):
        if value is not None:
            raw[key] = value
            source.flags[key] = flag
    config = None
    try:
        config = validate(raw, source, base_dir, run_plugins, from_checkpoint)
    except DlrunError as e:
        errors.append(e)
    collect(errors)  # --set problems and the file's problems, all at once
    return config
