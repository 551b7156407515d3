"""Typed options: the annotations components use, and the checker that validates config values.

A component's options are its constructor's keyword parameters. Their type hints say what a
config may give; :func:`check_value` converts a YAML value to that type or raises OptionError
with a message saying what was expected and what was received.
"""
from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union


# each component kind's base class and its registry (Initializer: the initializers), filled by
# dlrun.registry as the kinds' modules declare their bases: an option typed with a base class
# takes a name or spec of that kind
COMPONENT_KINDS: dict[type, Any] = {}


def component_registry(hint):
    """The registry whose base class ``hint`` is (an option typed ``Initializer``, say), or None."""
    if not isinstance(hint, type) or hint is object:
        return None
    for base, reg in COMPONENT_KINDS.items():
        if issubclass(base, hint):
            return reg
    return None


@dataclass(frozen=True)
class Range:
    """A numeric bound for an option: ``Annotated[float, Range(0, 1, max_inclusive=False)]``."""

    min: float | None = None
    max: float | None = None
    min_inclusive: bool = True
    max_inclusive: bool = True

    def check(self, v) -> bool:
        if self.min is not None and (v < self.min if self.min_inclusive else v <= self.min):
            return False
        if self.max is not None and (v > self.max if self.max_inclusive else v >= self.max):
            return False
        return True

    def describe(self) -> str:
        lo = hi = ""
        if self.min is not None:
            lo = f"{'>=' if self.min_inclusive else '>'} {self.min:g}"
        if self.max is not None:
            hi = f"{'<=' if self.max_inclusive else '<'} {self.max:g}"
        return " and ".join(p for p in (lo, hi) if p)


class FilePath(str):
    """A path option; the config resolves it relative to the config file's folder."""


PositiveInt = Annotated[int, Range(min=1)]
NonNegativeInt = Annotated[int, Range(min=0)]
PositiveFloat = Annotated[float, Range(min=0, min_inclusive=False)]
NonNegativeFloat = Annotated[float, Range(min=0)]
Fraction = Annotated[float, Range(0, 1, max_inclusive=False)]  # [0, 1): split, dropout rate
UnitInterval = Annotated[float, Range(0, 1, min_inclusive=False)]  # (0, 1]: a factor


class OptionError(ValueError):
    """A value does not fit its option's type; the message says expected vs received. A component
    that checks its options together raises it with ``option``, the key to point the error at."""

    def __init__(self, message: str, option: str | None = None):
        super().__init__(message)
        self.option = option


def did_you_mean(name: str, choices) -> str:
    """' (did you mean X?)' when a close match exists, else ''."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=3, cutoff=0.6)
    if not close:
        lowered = {str(c).lower(): str(c) for c in choices}
        if str(name).lower() in lowered:
            close = [lowered[str(name).lower()]]
    if not close:  # initials: lr -> learning_rate, bs -> batch_size
        close = [str(c) for c in choices
                 if "_" in str(c) and "".join(w[:1] for w in str(c).split("_")) == str(name).lower()]
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def _got(value) -> str:
    """A received value as a config writes it (true, null, [16], {a: 1}), cut to 60 characters."""
    text = _flow(value)
    if isinstance(value, (dict, list)):
        text = f"a {'list' if isinstance(value, list) else 'mapping'} {text}"
    return text if len(text) <= 60 else f"{text[:57]}..."


def _flow(value) -> str:
    """``value`` in YAML flow style: null, true, [false, 2], {a: 'x'} (strings quoted as given)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value[:20]) + (", ...]" if len(value) > 20 else "]")
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in list(value.items())[:20]) + "}"
    return repr(value)


def describe(hint) -> str:
    """A short human name for a type hint, used in 'expected ...' messages and `dlrun show`."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        base, *meta = typing.get_args(hint)
        rng = next((m for m in meta if isinstance(m, Range)), None)
        name = describe(base)
        if rng is not None:
            if rng == Range(min=1) and base is int:
                return "a positive integer"
            return f"{name} {rng.describe()}"
        return name
    if origin is Literal:
        choices = typing.get_args(hint)
        return repr(choices[0]) if len(choices) == 1 else "one of " + ", ".join(repr(a) for a in choices)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        text = " or ".join(describe(a) for a in args)
        return text + (" or null" if len(args) < len(typing.get_args(hint)) else "")
    if origin in (tuple, list):
        args = typing.get_args(hint)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} {_plural(args[0])}"
        return f"a list of {_plural(args[0]) if args else 'values'}"
    reg = component_registry(hint)
    if reg is not None:
        return f"{reg.article} {reg.kind} name or spec"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
            FilePath: "a file path", Path: "a file path", Any: "any value"}.get(hint, getattr(hint, "__name__", str(hint)))


def _plural(hint) -> str:
    """describe(hint) for several values: 'integers >= 0', not 'integer >= 0s'."""
    if typing.get_origin(hint) is Literal:
        return "values among " + ", ".join(repr(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) is Annotated:
        base, *meta = typing.get_args(hint)
        rng = next((m for m in meta if isinstance(m, Range)), None)
        if rng == Range(min=1) and base is int:
            return "positive integers"
        return _plural(base) + (f" {rng.describe()}" if rng is not None else "")
    return describe(hint).removeprefix("a ").removeprefix("an ") + "s"


def recorded(given, value):
    """What a run records for a checked value: an integer given as 1e3 or 32.0 is recorded as
    1000 or 32, as it is used (not 1000.0); anything else as it was written."""
    integral = isinstance(value, int) and not isinstance(value, bool) and isinstance(given, float)
    return value if integral else given


def check_value(value, hint, *, build_component=None):
    """Convert ``value`` to ``hint`` or raise OptionError.

    ``build_component(registry, value)`` builds nested components (an initializer given as an
    option of a layer); it is supplied by the registry so errors keep their key path.
    """
    origin = typing.get_origin(hint)
    if hint is Any or hint is typing.Any:
        return value
    if origin is Annotated:
        base, *meta = typing.get_args(hint)
        try:
            v = check_value(value, base, build_component=build_component)
        except OptionError:
            raise OptionError(f"expected {describe(hint)}, got {_got(value)}") from None
        for m in meta:
            if isinstance(m, Range) and not m.check(v):
                raise OptionError(f"expected {describe(hint)}, got {_got(value)}")
        return v
    if origin is Literal:
        choices = typing.get_args(hint)
        if value in choices and type(value) is type(choices[choices.index(value)]):
            return value
        raise OptionError(f"expected {describe(hint)}, got {_got(value)}{did_you_mean(value, choices)}")
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None:
            if type(None) in args:
                return None
            raise OptionError(f"expected {describe(hint)}, got null")
        errors, lists = [], []
        for a in args:
            if a is type(None):
                continue
            try:
                return check_value(value, a, build_component=build_component)
            except OptionError as e:
                errors.append(str(e))
                if typing.get_origin(a) in (list, tuple):
                    lists.append(str(e))
        if len(errors) == 1:
            raise OptionError(errors[0])
        if isinstance(value, (list, tuple)) and len(lists) == 1:  # a list: what is wrong inside it
            raise OptionError(lists[0])
        words = [c for a in args if typing.get_origin(a) is Literal for c in typing.get_args(a) if isinstance(c, str)]
        near = did_you_mean(value, words) if isinstance(value, str) and words else ""
        raise OptionError(f"expected {describe(hint)}, got {_got(value)}{near}")
    if origin in (tuple, list):
        args = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            raise OptionError(f"expected {describe(hint)}, got {_got(value)}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise OptionError(f"expected {describe(hint)}, got {len(value)} values")
            items = [check_value(v, a, build_component=build_component) for v, a in zip(value, args)]
        else:
            inner = args[0] if args else Any
            items = []
            for k, v in enumerate(value):  # the item at fault, by its index in the list
                try:
                    items.append(check_value(v, inner, build_component=build_component))
                except OptionError as e:
                    raise OptionError(f"item [{k}]: {e}") from None
        return tuple(items) if origin is tuple else items
    if value is None:
        raise OptionError(f"expected {describe(hint)}, got null")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise OptionError(f"expected true or false, got {_got(value)}")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise OptionError(f"expected an integer, got {_got(value)}")
        return int(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise OptionError(f"expected a number, got {_got(value)}")
        v = float(value)
        if v != v or v in (float("inf"), float("-inf")):
            raise OptionError(f"expected a finite number, got {value!r}")
        return v
    if hint in (str, FilePath, Path):
        if not isinstance(value, str):
            raise OptionError(f"expected {describe(hint)}, got {_got(value)}")
        return hint(value) if hint is not str else value
    reg = component_registry(hint)
    if reg is not None:
        if isinstance(value, hint):
            return value
        if build_component is None:
            return reg.build(value)
        return build_component(reg, value)
    if isinstance(hint, type) and isinstance(value, hint):
        return value
    raise OptionError(f"expected {describe(hint)}, got {_got(value)}")
