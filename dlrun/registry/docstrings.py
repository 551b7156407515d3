"""What `dlrun list` and `dlrun show` say about a component, read from its code: the docstring as
plain text, its Google-style ``Args:`` section, and its options from the constructor's signature
and type hints."""
from __future__ import annotations

import inspect
import re
import typing
from dataclasses import dataclass
from typing import Any

from .options import describe


@dataclass(frozen=True)
class Option:
    """One option of a component, as `dlrun show` prints it."""

    name: str
    hint: Any
    default: Any
    required: bool
    doc: str

    @property
    def type_name(self) -> str:
        return describe(self.hint)


def plain_doc(obj) -> str:
    """The docstring as a terminal shows it: Sphinx roles (``:func:`f```) become plain names and
    double backquotes single ones. Only the object's own docstring: a plugin class without one
    must not show its base class's ("Base class for losses.")."""
    own = obj.__doc__ if isinstance(obj.__doc__, str) else None
    doc = inspect.cleandoc(own) if own else ""
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", doc).replace("``", "`")


def doc_args(obj) -> dict[str, str]:
    """Parse a Google-style ``Args:`` section into {name: text}: the object's own, or for a class
    without its own docstring, that of the class in its MRO that defines ``__init__`` (a plugin
    ``class MyLinear(Linear)`` takes Linear's options and their descriptions)."""
    if inspect.isclass(obj) and not isinstance(obj.__dict__.get("__doc__"), str):
        owner = next((c for c in obj.__mro__ if "__init__" in c.__dict__), obj)
        obj = owner if owner is not object else obj
    doc = plain_doc(obj)
    out: dict[str, str] = {}
    m = re.search(r"^Args:\s*$(.*?)(?:^\S|\Z)", doc, re.M | re.S)
    if not m:
        return out
    current = None
    for line in m.group(1).splitlines():
        hit = re.match(r"^\s{2,8}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
        if hit:
            current = hit.group(1)
            out[current] = hit.group(2).strip()
        elif current and line.strip():
            out[current] += " " + line.strip()
    return out


def signature(obj) -> inspect.Signature:
    """The options' signature: ``__init__`` without ``self`` for classes, else the function's."""
    if inspect.isclass(obj):
        if obj.__init__ is object.__init__:
            return inspect.Signature()
        sig = inspect.signature(obj.__init__)
        return sig.replace(parameters=list(sig.parameters.values())[1:])
    return inspect.signature(obj)


def summary(obj) -> str:
    """The docstring's first paragraph, on one line."""
    return " ".join(description(obj).split("\n\n")[0].split())


def description(obj) -> str:
    """The docstring up to its ``Args:`` section, as a terminal shows it (see plain_doc)."""
    return plain_doc(obj).split("\nArgs:")[0].strip()


def options(obj) -> list[Option]:
    """The component's options: name, type hint, default, docs."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    hints = typing.get_type_hints(target, include_extras=True)
    docs = doc_args(obj)
    out = []
    for p in signature(obj).parameters.values():
        required = p.default is inspect.Parameter.empty
        out.append(Option(p.name, hints.get(p.name, Any), None if required else p.default, required, docs.get(p.name, "")))
    return out
