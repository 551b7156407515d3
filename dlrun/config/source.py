"""YAML for configs: safe parsing with the line of every key path, and --set overrides.

Part of the config concern (with dlrun/config.py): nothing else in dlrun imports yaml.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, DlrunError, Location, collect
from ..registry.options import did_you_mean
from .graph import node_names


class _Loader(yaml.SafeLoader):
    """SafeLoader whose numbers follow YAML 1.2 rather than 1.1: ``1e-3`` is a float (1.1 insists
    on ``1.0e-3``), ``0o17`` is octal, while ``010`` and ``1:30`` are not numbers (1.1 reads them as
    octal 8 and base-60 90: in a config they are typos, and become errors naming the value).
    Beyond 1.2, ``_`` separates digits as in Python (``60_000``).

    Composing stops at the limits below (see :class:`TooLarge`), so a hostile or mistaken
    file (thousands of nested brackets, millions of values) is refused in bounded time and
    memory instead of exhausting Python's stack."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = self._nodes = 0

    def compose_node(self, parent, index):
        self._nodes += 1
        if self._nodes > MAX_WRITTEN:
            raise TooLarge(f"{{what}} holds more than {MAX_WRITTEN:,} values; a config holds settings, not data "
                           f"(put data in a data file: data: {{{{type: file, path: ...}}}})", self.peek_event().start_mark)
        if self._depth >= MAX_DEPTH:
            raise TooLarge(f"{{what}} nests lists and mappings more than {MAX_DEPTH} levels deep; a config needs "
                           f"a few levels", self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# A config is a small text file of a few hundred values (the shipped ones are under 2 KB, five
# levels deep). These limits keep parsing to about a second whatever a file holds (PyYAML composes
# some 40,000 values a second) and Python's stack safe (composing recurses once per level).
MAX_BYTES = 1 << 20  # the file (or a --set / --data value)
MAX_WRITTEN = 10_000  # values written out in it
MAX_VALUES = 100_000  # values once YAML aliases are expanded: aliases must not multiply them without bound
MAX_DEPTH = 50  # levels of nested lists and mappings


class TooLarge(Exception):
    """YAML beyond the limits above: the message (``{what}`` stands for 'the config' or 'the
    value'), the YAML mark where it was found and the key path (when known); each caller says
    which file or flag it was."""

    def __init__(self, message: str, mark=None, path: str | None = None):
        super().__init__(message)
        self.message, self.mark, self.path = message, mark, path

    def text(self, what: str) -> str:
        """The message about ``what`` ('the config': a file, whose line is the anchor's for an alias)."""
        return self.message.format(what=what, at=" (the line is the anchor's)" if what == "the config" else "")

    def where(self, file: str | None) -> Location:
        return Location(file, self.mark.line + 1 if self.mark is not None else None, self.path or None)


_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(_INT, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+|0o[0-7_]+|0b[01_]+)$"),
                              list("-+0123456789"))


def _construct_int(loader, node) -> int:
    """An integer as the resolver above reads it (``0o17`` is 1.2's octal); one too long for any
    setting (Python refuses to convert over 4300 digits) is a YAML error at its line."""
    text = loader.construct_scalar(node).replace("_", "")
    body = text.lstrip("+-")
    base = {"0x": 16, "0o": 8, "0b": 2}.get(body[:2].lower(), 10)
    digits = body if base == 10 else body[2:]
    if base == 10 and len(digits) > 4300:
        raise yaml.constructor.ConstructorError(None, None, f"an integer of {len(digits)} digits is larger than any "
                                                f"setting can take", node.start_mark)
    return (-1 if text.startswith("-") else 1) * int(digits, base)


_Loader.add_constructor(_INT, _construct_int)
_Loader.add_implicit_resolver(_FLOAT, re.compile(
    r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))


@dataclass
class Source:
    """Maps key paths to the file line (or ``--set`` flag) they came from."""

    file: str | None
    lines: dict[str, int] = field(default_factory=dict)
    flags: dict[str, str] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)  # paths of a dict without lines (a checkpoint's config)

    def locate(self, path: str) -> Location:
        probe = path
        while True:
            if probe in self.flags:
                return Location(self.flags[probe], None, path)
            if probe in self.lines:
                return Location(self.file, self.lines[probe], path)
            if probe in self.known:  # recorded before any --set: the file, not a flag, holds it
                return Location(self.file, None, path)
            # a mapping that --set a.b=1 created (no file line) is located by that flag, and so is
            # a default filled into it (a.monitor): not the file's line of the enclosing section
            created = next((flag for flagged, flag in self.flags.items()
                            if probe and flagged.startswith((probe + ".", probe + "["))), None)
            if created is not None:
                return Location(created, None, path)
            if not probe:
                return Location(self.file, None, path)
            parent = re.sub(r"(\.[^.\[\]]+|\[\d+\])$", "", probe)
            probe = parent if parent != probe else ""  # a top-level key's parent is the root


def key_paths(value, path: str = ""):
    """Every key path in a parsed config (``train``, ``train.epochs``, ``model[0].units``)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        p = _join(path, k)
        yield p
        yield from key_paths(v, p)


def _join(path: str, key) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _walk(node, path: str, lines: dict, errors: list, file: str, seen_nodes: list, parents: tuple = ()) -> None:
    """Record the line of every key path; refuse an alias that contains itself, and alias chains
    that expand to more than MAX_VALUES values (a "billion laughs" file) or MAX_DEPTH levels
    (TooLarge, located by the caller)."""
    if any(node is p for p in parents):
        raise TooLarge("a YAML alias refers to a value that contains it, an endless structure{at}", node.start_mark,
                       path)
    seen_nodes[0] += 1
    if seen_nodes[0] > MAX_VALUES:
        raise TooLarge(f"{{what}} expands to more than {MAX_VALUES:,} values through YAML aliases (&name / "
                       f"*name); write the repeated parts out or use fewer levels of aliases")
    if len(parents) >= MAX_DEPTH:
        raise TooLarge(f"{{what}} nests lists and mappings more than {MAX_DEPTH} levels deep through YAML "
                       f"aliases (&name / *name); a config needs a few levels", node.start_mark, path)
    lines.setdefault(path, node.start_mark.line + 1)
    parents = (*parents, node)
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):
                raise ConfigError(f"a key must be a name, got a {'list' if isinstance(k, yaml.SequenceNode) else 'mapping'}",
                                  Location(file, k.start_mark.line + 1, path))
            key = k.value
            p = _join(path, key)
            if key in seen:
                errors.append(ConfigError(f"duplicate key {key!r}", Location(file, k.start_mark.line + 1, p)))
            seen.add(key)
            lines[p] = k.start_mark.line + 1
            _walk(v, p, lines, errors, file, seen_nodes, parents)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _walk(v, _join(path, i), lines, errors, file, seen_nodes, parents)


def _unshare(value):
    """A copy in which no two places share one list or mapping: an alias (*name) becomes a copy
    of its anchor, so ``--set model[0].units=5`` changes model[0] and not every alias of it."""
    if isinstance(value, dict):
        return {k: _unshare(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unshare(v) for v in value]
    return value


def _load(text: str, lines: dict, errors: list, file: str | None) -> Any:
    """The YAML document in ``text``: composed within the limits (TooLarge otherwise), walked
    (lines of key paths, duplicate keys into ``errors``, endless and exploding aliases refused)
    and only then constructed, from the same nodes, so the text is parsed once."""
    if len(text) > MAX_BYTES:
        raise TooLarge(f"{{what}} is {len(text):,} characters long; a config is a small text file of settings "
                       f"(at most {MAX_BYTES:,} bytes)")
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _walk(node, "", lines, errors, file, [0])
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_config_text(p: Path) -> str:
    """A config file's text: refused unread when larger than MAX_BYTES (a config is a small text
    file; a data file named by mistake would take minutes to parse), and named with the line and
    column of the first byte that is not UTF-8."""
    try:
        size = p.stat().st_size
        if size > MAX_BYTES:
            raise ConfigError(f"the file is {_size(size)}; a config is a small text file of settings (at most "
                              f"{_size(MAX_BYTES)}). Is it a data file? Name one under data: "
                              f"{{type: file, path: ...}}", Location(str(p)))
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read the config file ({e.strerror or e})", Location(str(p))) from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")  # (a BOM, as some editors write)
    except UnicodeDecodeError as e:
        start = data.rfind(b"\n", 0, e.start) + 1
        column = len(data[start:e.start].decode("utf-8", errors="replace")) + 1
        raise ConfigError(f"not UTF-8 text (byte 0x{data[e.start]:02x} at column {column}); save the file as UTF-8 "
                          f"(or plain ASCII)", Location(str(p), data.count(b"\n", 0, e.start) + 1)) from None


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 10 * 2**20 else f"{n:,} bytes"


def _reader_error(e: yaml.reader.ReaderError, text: str) -> tuple[int, str]:
    """(line, message) for a character YAML refuses (a control character: a binary file?)."""
    line = text.count("\n", 0, e.position) + 1
    column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
    char = e.character if isinstance(e.character, int) else ord(e.character or "\0")
    return line, (f"control character U+{char:04X} at column {column}; a config is text (is this a binary "
                  f"file?)")


def parse_yaml(text: str, file: str | None = None) -> tuple[Any, Source]:
    """Parse YAML safely; return the data and a Source with line numbers for every key path."""
    source = Source(file)
    errors: list[DlrunError] = []
    try:
        data = _load(text, source.lines, errors, file)
    except TooLarge as e:
        raise ConfigError(e.text("the config"), e.where(file)) from None
    except yaml.reader.ReaderError as e:
        line, message = _reader_error(e, text)
        raise ConfigError(message, Location(file, line)) from None
    except yaml.constructor.ConstructorError as e:
        mark = e.problem_mark or e.context_mark
        tag = re.search(r"tag '([^']*)'", e.problem or "")
        if tag is None:  # not a tag: an unhashable key ([1, 2]: 3), a bad merge (<<: 5)
            raise ConfigError(f"YAML error: {e.problem}" + (f" ({e.context})" if e.context else ""),
                              Location(file, mark.line + 1 if mark else None)) from None
        raise ConfigError(
            f"YAML tag {tag.group(1)!r} is not allowed: dlrun reads configs with a safe loader "
            f"that only builds plain values (numbers, strings, lists, mappings), never Python objects",
            Location(file, mark.line + 1 if mark else None)) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        col = f" (column {mark.column + 1})" if mark else ""
        raise ConfigError(f"YAML syntax error{col}: {e.problem or e.context}", Location(file, line)) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"YAML error: {e}", Location(file)) from None
    collect(errors)
    return _unshare(data), source


_KEY_PATH = re.compile(r"[A-Za-z_]\w*(?:\[\d+\])*(?:\.[A-Za-z_]\w*(?:\[\d+\])*)*")
_PATH_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _split_path(path: str) -> list:
    keys = []
    for name, index in _PATH_TOKEN.findall(path):
        keys.append(int(index) if index else (int(name) if name.isdigit() else name))
    return keys


def apply_override(raw: dict, item: str, source: Source) -> None:
    """Apply one ``--set key.path=value``; the value is parsed as YAML (``5``, ``0.1``, ``[1, 2]``)."""
    flag = f"--set {item}" if len(item) <= 120 else f"--set {item.partition('=')[0]}=(a value of {len(item)} characters)"
    if "=" not in item:
        raise ConfigError(f"expected KEY=VALUE (for example train.epochs=5), got {item!r}", Location("--set"))
    key, _, text = item.partition("=")
    if re.search(r"\[\s*-\d+\s*\]", key):
        raise ConfigError(f"{key.strip()!r}: a negative index does not count from the end here; give the position "
                          f"from 0 (model[0] is the first layer)", Location("--set"))
    if not _KEY_PATH.fullmatch(key.strip()):
        raise ConfigError(f"expected a key path such as train.epochs or model[0].units before '=', got {key!r}",
                          Location("--set"))
    keys = _split_path(key.strip())
    if len(keys) > 1 and keys[0] == "model" and isinstance(keys[1], str) and isinstance(raw.get("model"), list):
        names = node_names(raw["model"])  # model.NAME.key: the node the model names so
        if keys[1] not in names:
            raise ConfigError(f"the model has no node named {keys[1]!r}{did_you_mean(keys[1], names)}"
                              + (f"; its named nodes: {', '.join(names)}" if names else
                                 " (give an entry name: NAME, or address it as model[i])"), Location(flag, None, key.strip()))
        keys = _split_path(names[keys[1]]) + keys[2:]
    try:
        errors: list[DlrunError] = []
        value = _unshare(_load(text, {}, errors, None)) if text.strip() else None  # a file's limits and checks
        if errors:
            raise ConfigError(f"{errors[0].message} in the value", Location(flag, None, key.strip()))
    except TooLarge as e:
        raise ConfigError(e.text("the value"), Location(flag, None, key.strip())) from None
    except yaml.YAMLError as e:
        # meant as a mapping or list, or a tag or a number no setting takes: a plain string would mislead
        if text.strip().startswith(("{", "[")) or isinstance(e, yaml.constructor.ConstructorError):
            shown = text.strip() if len(text.strip()) <= 60 else text.strip()[:57] + "..."
            raise ConfigError(f"cannot parse the value {shown!r} as YAML: {getattr(e, 'problem', None) or e}",
                              Location(flag, None, key.strip())) from None
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
        elif isinstance(target, dict) and isinstance(k, int):
            raise ConfigError(f"[{k}] indexes a list, but {path[:path.rindex('[')] or 'this'} is a mapping",
                              Location(flag, None, path))
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
    elif isinstance(target, dict) and not isinstance(last, int):
        target[last] = value
    else:
        raise ConfigError(f"cannot set {key!r}: {'the index is out of range' if isinstance(target, list) else 'no such list'}",
                          Location(flag, None, path))
    source.flags[path] = flag
    source.lines = {p: n for p, n in source.lines.items() if not (p == path or p.startswith(path + ".") or p.startswith(path + "["))}


def dump_yaml(data: Any, block: tuple[str, ...] = ()) -> str:
    """YAML text for a config (written into run directories): a mapping or list of plain values
    on one line (``{type: Linear, units: 64}``), the top-level keys named in ``block`` one
    setting a line."""
    if not block or not isinstance(data, dict):
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    return "".join(yaml.safe_dump({k: v}, sort_keys=False,
                                  default_flow_style=None if k not in block and isinstance(v, (dict, list)) else False)
                   for k, v in data.items())


def parse_value(text: str, where: str) -> Any:
    """A command-line value written as YAML (``spiral``, ``{type: spiral, seed: 3}``), within
    the limits of a config file."""
    errors: list[DlrunError] = []
    try:
        value = _load(text, {}, errors, None)
    except TooLarge as e:
        raise ConfigError(e.text("the value"), Location(where)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at column {mark.column + 1}" if mark is not None else ""
        why = getattr(e, "problem", None) or type(e).__name__
        raise ConfigError(f"cannot parse {_shown(text)!r} as YAML: {why}{at}", Location(where)) from None
    if errors:
        raise ConfigError(f"{errors[0].message} in the value", Location(where))
    return _unshare(value)


def _shown(text: str) -> str:
    """A value as an error message shows it: whole up to 60 characters, else its start."""
    return text if len(text) <= 60 else f"{text[:57]}... ({len(text):,} characters)"
