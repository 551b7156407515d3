"""One small Registry class, used for every kind of component, and the eight registries.

Components register with a decorator. A config names them by string; options are checked
against the constructor's signature (keyword parameters with type hints and defaults).
"""
from __future__ import annotations

import difflib
import importlib
import os
import sys
from importlib.metadata import entry_points
from typing import Any, Callable

from . import docstrings
from .docstrings import signature
from ..errors import ConfigError, DlrunError, Location, PluginError, UsageError, collect
from .options import COMPONENT_KINDS, OptionError, check_value, did_you_mean, recorded

Locate = Callable[[str], Location]
_TYPE_ALIASES = {"name", "kind", "class", "layer", "cls"}  # keys users write where 'type' belongs


class RegistryError(UsageError):
    """A registration or lookup problem (duplicate name, unknown name)."""


def _default_locate(path: str) -> Location:
    return Location(path=path)


class Registry:
    """Named components of one kind (layer, initializer, loss, regularizer, optimizer, data, schedule, metric)."""

    def __init__(self, kind: str, plural: str):
        self.kind = kind
        self.plural = plural
        self._base: type | None = None  # set by the module that defines the kind's base class
        # a kind's further contract for a plugin's entry: (entry, name) -> a problem, or None
        self.check_entry = None
        self._entries: dict[str, Any] = {}
        self._origin: dict[str, str] = {}
        self.entry_keys: tuple[str, ...] = ()  # keys every entry may carry besides its options (model: trainable)
        self.entry_section = ""  # where such entries are written (model, train.metrics)

    @property
    def base(self) -> type | None:
        """The kind's base class (Layer, Loss, ...): every entry subclasses it, and an option
        typed with it takes a name or spec of this kind (:func:`dlrun.registry.options.component_registry`)."""
        return self._base

    @base.setter
    def base(self, cls: type) -> None:
        self._base = cls
        COMPONENT_KINDS[cls] = self

    def __contains__(self, name: str) -> bool:
        load_builtins()
        return name in self._entries

    def names(self) -> list[str]:
        load_builtins()
        return sorted(self._entries, key=str.lower)

    def register(self, name: str | None = None, *, origin: str | None = None):
        """Decorator: ``@layers.register()`` registers a class under its own name."""

        def deco(obj):
            where = origin or _loading_origin or "builtin"
            key = name or obj.__name__
            if key in self._entries and self._entries[key] is not obj:
                raise RegistryError(
                    f"{self.kind} {key!r} is already registered (by {self._origin[key]}); "
                    f"choose another name"
                )
            twin = next((k for k in self._entries if k.lower() == key.lower() and k != key), None)
            if twin is not None:  # `type: linear` would silently pick the other one of the two
                raise RegistryError(
                    f"{self.kind} {key!r} differs from the registered {twin!r} (by {self._origin[twin]}) only in "
                    f"case, which a config could mistype without notice; choose another name"
                )
            sig = signature(obj)
            for p in sig.parameters.values():
                if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                    raise RegistryError(
                        f"{self.kind} {key!r}: options must be explicit keyword parameters, "
                        f"not *{p.name}/**{p.name} (a typo in a config could not be caught)"
                    )
                if p.annotation is p.empty:  # the hint is what checks (and converts) a config's value
                    kind = type(p.default).__name__ if p.default not in (p.empty, None) else "int"
                    default = "" if p.default is p.empty else f" = {p.default!r}"
                    raise RegistryError(f"{self.kind} {key!r}: option {p.name!r} has no type hint, so a config "
                                        f"value could not be checked; write it as {p.name}: {kind}{default}")
            self._entries[key] = obj
            self._origin[key] = where
            obj.registered_name = key
            return obj

        return deco

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)
        self._origin.pop(name, None)

    def get(self, name: str, where: Location | None = None):
        """The component called ``name``, or a RegistryError with did-you-mean and valid names."""
        load_builtins()
        if not isinstance(name, str):
            raise ConfigError(f"expected {self.article} {self.kind} name, got {name!r}", where)
        if name not in self._entries:
            valid = ", ".join(self.names())
            close = did_you_mean(name, self._entries)
            # no built-in comes close: most likely a plugin's, from a file not named
            yours = "" if close else f" (a {self.kind} of your own? name its file with --plugin FILE.py or the config's plugins:)"
            e = ConfigError(f"unknown {self.kind} {name!r}{close}{yours}; valid {self.plural}: {valid}", where)
            e.unknown_name = name  # a config whose plugin failed to load drops these (see config.py)
            raise e
        return self._entries[name]

    @property
    def article(self) -> str:
        """'an' before 'initializer' and 'optimizer', else 'a'."""
        return "an" if self.kind[0] in "aeiou" else "a"

    def origin(self, name: str) -> str:
        return self._origin.get(name, "builtin")

    def summary(self, name: str) -> str:
        """The docstring's first paragraph, on one line."""
        return docstrings.summary(self.get(name))

    def description(self, name: str) -> str:
        """The docstring up to its ``Args:`` section, as a terminal shows it."""
        return docstrings.description(self.get(name))

    def options(self, name: str) -> list[docstrings.Option]:
        """The component's options: name, type hint, default, docs."""
        return docstrings.options(self.get(name))

    def parse_spec(self, spec, where: Location | None = None) -> tuple[str, dict]:
        """Split ``'ReLU'`` or ``{type: Linear, units: 3}`` into (name, options)."""
        if isinstance(spec, str):
            return spec, {}
        if isinstance(spec, dict):
            if "type" not in spec:
                raise ConfigError(
                    f"expected {self.article} {self.kind} name or a mapping with a 'type' key, got a mapping with keys "
                    f"{', '.join(map(str, spec)) or '(none)'}{self._type_hint(spec)}",
                    where,
                )
            opts = {k: v for k, v in spec.items() if k != "type"}
            return spec["type"], opts
        raise ConfigError(f"expected {self.article} {self.kind} name or a mapping with a 'type' key, got {spec!r}", where)

    def _type_hint(self, spec: dict) -> str:
        """How to write a mapping that lacks 'type': ``{Linear: {units: 3}}`` or ``{name: spiral}``."""
        if len(spec) == 1:
            (key, value), = spec.items()
            if isinstance(key, str) and (value is None or isinstance(value, dict)):
                load_builtins()
                close = [key] if key in self._entries else difflib.get_close_matches(key, self._entries, n=1)
                if close:
                    opts = "".join(f", {k}: {v}" for k, v in (value or {}).items())
                    return f"; write it as {{type: {close[0]}{opts}}}" if opts else f"; write it as {close[0]}"
        alias = next((k for k in spec if str(k).lower() in _TYPE_ALIASES), None)
        return f"; name the {self.kind} with 'type', not {alias!r}" if alias is not None else ""

    def check(self, spec, path: str = "", locate: Locate = _default_locate) -> tuple[str, dict]:
        """Validate a config spec against the component's signature; return (name, kwargs).

        All problems in the spec are raised together (ConfigErrors), each with its location.
        Nested components (an initializer option) are built, so they are checked too.
        """
        where = locate(path)
        name, given = self.parse_spec(spec, where)
        self.get(name, locate(f"{path}.type" if isinstance(spec, dict) else path))
        opts = {o.name: o for o in self.options(name)}
        errors: list[DlrunError] = []
        kwargs = {}
        for key, value in given.items():
            kpath = f"{path}.{key}" if path else str(key)
            if key in self.entry_keys:  # an entry's key (a layer's trainable), given where no entry is
                section = self.entry_section
                errors.append(ConfigError(f"{key!r} is a key of a {section} entry ({section}[i].{key}), not an option "
                                          f"of {self.kind} {name}; give it in a config's {section} list", locate(kpath)))
                continue
            if key not in opts:
                valid = ", ".join(opts) or "(none)"
                valid += "".join(f" (and {k}, which any {self.kind} takes)" for k in self.entry_keys)
                errors.append(ConfigError(
                    f"unknown option {key!r} for {self.kind} {name}{did_you_mean(key, [*opts, *self.entry_keys])}; "
                    f"valid options: {valid}", locate(kpath),
                ))
                continue
            try:
                kwargs[key] = check_value(value, opts[key].hint,
                                          build_component=lambda r, v, kp=kpath: r.build(v, kp, locate))
                if isinstance(spec, dict):  # the run records units: 1e3 as the 1000 it used
                    spec[key] = recorded(value, kwargs[key])
            except OptionError as e:
                errors.append(ConfigError(str(e), locate(kpath)))
            except DlrunError as e:
                errors.append(e)
        for o in opts.values():
            if o.required and o.name not in given:
                errors.append(ConfigError(f"{self.kind} {name} needs option {o.name!r} ({o.type_name})", where))
        collect(errors)
        return name, kwargs

    def build(self, spec, path: str = "", locate: Locate = _default_locate):
        """Instantiate a component from a config spec (``'ReLU'`` or ``{type: Linear, units: 3}``)."""
        name, kwargs = self.check(spec, path, locate)
        try:
            instance = self._entries[name](**kwargs)
        except (ValueError, TypeError, OptionError) as e:
            option = getattr(e, "option", None)  # an OptionError that names the key at fault
            raise ConfigError(f"{name}: {e}", locate(f"{path}.{option}" if option and path else path)) from None
        except (OverflowError, MemoryError) as e:  # e.g. a generator asked for more samples than fit
            given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            raise ConfigError(f"{name}: options too large ({given}): {e or type(e).__name__}", locate(path)) from None
        # the spec as written, with numbers as the component received them (units: 8.0 arrives as 8)
        given = {k: kwargs[k] if isinstance(v, (int, float)) and isinstance(kwargs.get(k), (int, float)) else v
                 for k, v in self.parse_spec(spec)[1].items()}
        try:
            instance.spec = {"type": name, **given}
        except AttributeError:
            pass
        return instance


layers = Registry("layer", "layers")
# trainable: false (config.build_layer); a graph node's name and inputs (config.graph)
layers.entry_keys, layers.entry_section = ("trainable", "name", "inputs"), "model"
initializers = Registry("initializer", "initializers")
losses = Registry("loss", "losses")
regularizers = Registry("regularizer", "regularizers")
optimizers = Registry("optimizer", "optimizers")
data = Registry("data generator", "data generators")
data.entry_keys, data.entry_section = ("preprocess",), "data"  # data.preprocess (config.validate takes it off)
schedules = Registry("schedule", "schedules")
metrics = Registry("metric", "metrics")
metrics.entry_keys, metrics.entry_section = ("name",), "train.metrics"  # its columns' name (metrics.build)

REGISTRIES = {
    "layers": layers,
    "initializers": initializers,
    "losses": losses,
    "regularizers": regularizers,
    "optimizers": optimizers,
    "data": data,
    "schedules": schedules,
    "metrics": metrics,
}

_loading_origin: str | None = None  # set by dlrun.registry.plugins while a plugin file runs

_BUILTIN_MODULES = ("layers", "layers.initializers", "losses", "losses.regularizers", "optimizers", "data",
                    "data.files", "data.datasets", "data.generators", "schedules", "metrics")
_loaded = False


def load_builtins() -> None:
    """Import the modules whose decorators fill the registries (once)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in _BUILTIN_MODULES:
        importlib.import_module(f"dlrun.{mod}")
    _load_entry_points()


entry_point_files: dict[str, str] = {}  # the files of loaded entry points' modules: plugin code (dlrun.registry.plugins.blame)


def _load_entry_points() -> None:
    """Load installed packages' ``dlrun.plugins`` entry points (with the built-ins, once)."""
    global _loading_origin
    for ep in entry_points(group="dlrun.plugins"):
        _loading_origin = f"entry point {ep.name} ({ep.value})"
        try:
            ep.load()
        except Exception as e:
            raise PluginError(f"entry point {ep.name!r} ({ep.value}) failed to load: {type(e).__name__}: {e}") from None
        finally:
            _loading_origin = None
        module = sys.modules.get(ep.module)
        if getattr(module, "__file__", None):  # its code is plugin code: an error in it is named
            entry_point_files.setdefault(os.path.realpath(module.__file__), ep.module)




def find(name: str) -> tuple[Registry, Any]:
    """Look a name up in every registry (for `dlrun show NAME`)."""
    load_builtins()
    for reg in REGISTRIES.values():
        if name in reg._entries:
            return reg, reg._entries[name]
    every = [n for r in REGISTRIES.values() for n in r._entries]
    raise UsageError(f"no component named {name!r}{did_you_mean(name, every)}; `dlrun list` shows them all")
