"""User plugins: Python files (or installed packages) that register their own components.

Plugin code runs only when the user names it: ``--plugin FILE.py``, a config's ``plugins:``
list, or an installed package's ``dlrun.plugins`` entry point.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
import traceback
from pathlib import Path

from .. import registry
from ..errors import DlrunError, PluginError, PluginRaised

_loaded: dict[str, str] = {}  # resolved path -> module name


def source_hash(path: str | Path) -> str:
    """sha256 of a plugin file's bytes (recorded in checkpoints)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_plugin(path: str | Path) -> None:
    """Run a plugin file once so its decorators register its components."""
    registry.load_builtins()
    p = Path(path).expanduser()
    if not p.is_file():
        raise PluginError(f"plugin file not found: {p}")
    key = str(p.resolve())
    if key in _loaded:
        return
    name = f"dlrun_plugin_{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise PluginError(f"{p}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    origin = str(p)
    registry._loading_origin = origin
    try:
        spec.loader.exec_module(module)
        check_contract(origin)
    except SyntaxError as e:
        _forget(name, origin)
        own = not e.filename or Path(e.filename).resolve() == p.resolve()  # (else a module it imports)
        raise PluginError(f"{p if own else e.filename}:{e.lineno}: syntax error in plugin: {e.msg}") from None
    except DlrunError as e:
        _forget(name, origin)
        raise PluginError(f"{p}{_line(e, p)}: {e.message}") from None
    except (Exception, SystemExit) as e:  # the plugin's own code failed (or exited): say where, in one line
        _forget(name, origin)
        moved = ("; dlrun's own modules may move between releases: import what a plugin needs from dlrun.api "
                 "(Layer, layers, PositiveInt, ...)" if isinstance(e, ModuleNotFoundError)
                 and (e.name or "").startswith("dlrun.") else "")
        raise PluginError(f"{p}{_line(e, p)}: plugin {_raised(e)}{moved}") from None
    finally:
        registry._loading_origin = None
    _loaded[key] = name


def _line(e: BaseException, p: Path) -> str:
    """':LINE' of the deepest traceback frame inside the plugin file, or ''."""
    line = getattr(e, "plugin_line", None)
    if line is None:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == p.resolve()]
        line = frames[-1].lineno if frames else None
    return f":{line}" if line else ""


def _forget(module_name: str, origin: str) -> None:
    """Undo a failed load: drop the module and whatever it registered before failing."""
    sys.modules.pop(module_name, None)
    for reg in registry.REGISTRIES.values():
        for n in [n for n, o in reg._origin.items() if o == origin]:
            reg.unregister(n)


def check_contract(origin: str) -> None:
    """Every component a plugin registered must fit its kind's contract, or PluginError.

    Layers must subclass dlrun.layers.Layer and implement forward and backward; other kinds
    must subclass their base class when it is a class (an initializer, a loss, ...); a metric
    must also implement size, update and result, and say its task, mode and a free name.
    """
    Layer = registry.layers.base
    for reg in registry.REGISTRIES.values():
        for name, where in list(reg._origin.items()):
            if where != origin:
                continue
            obj = reg._entries[name]
            problem = None
            if reg is registry.layers:
                if not (inspect.isclass(obj) and issubclass(obj, Layer)):
                    problem = "it is not a subclass of dlrun.layers.Layer"
                else:
                    missing = [m for m in ("forward", "backward") if getattr(obj, m) is getattr(Layer, m)]
                    if missing:
                        problem = f"it does not implement {' and '.join(missing)}"
                    else:
                        problem = _labels_problem(obj)
            elif inspect.isclass(obj) and reg.base is not None and not issubclass(obj, reg.base):
                problem = f"it is not a subclass of {reg.base.__module__}.{reg.base.__name__}"
            elif reg.check_entry is not None:  # (metrics: size, update, result, task, mode)
                problem = reg.check_entry(obj, name)
            if problem:
                e = PluginError(f"{reg.kind} {name!r} does not follow the {reg.kind} contract: {problem}")
                try:
                    e.plugin_line = inspect.getsourcelines(obj)[1]
                except (OSError, TypeError):
                    pass
                raise e


def blame(e: BaseException) -> PluginRaised | None:
    """The error to report for an exception that a loaded plugin file's code raised: the
    innermost traceback frame inside one names the file and line, and its ``self`` the
    registered component (``the optimizer 'MySGD'``). None when no plugin code is in the
    traceback (a bug in dlrun itself). Found from the traceback, so no call carries bookkeeping."""
    hit = _innermost(e)
    if hit is None:
        return None
    frame = hit.tb_frame
    owner = frame.f_locals.get("self")
    what = _component(owner) if owner is not None else None
    call = frame.f_code.co_name
    where = f"{os.path.basename(frame.f_code.co_filename)}:{hit.tb_lineno}"
    head = f"{what}: {call}" if what else f"plugin code ({call})"
    return PluginRaised(f"{head} {_raised(e)} ({where})")


def _raised(e: BaseException) -> str:
    """'raised ValueError: bad', or 'called sys.exit(0)': what code did that ended it."""
    if isinstance(e, SystemExit):
        return f"called sys.exit({e.code!r}), which ends the whole process; raise an exception instead"
    return f"raised {type(e).__name__}" + (f": {e}" if str(e) else "")


def _innermost(e: BaseException):
    """The innermost traceback entry of ``e`` whose code is in a loaded plugin file, or None."""
    files = {os.path.realpath(k) for k in (*_loaded, *registry.entry_point_files)}
    hit, tb = None, e.__traceback__
    while tb is not None:
        if os.path.realpath(tb.tb_frame.f_code.co_filename) in files:
            hit = tb
        tb = tb.tb_next
    return hit


def raised_elsewhere(e: BaseException, layer) -> bool:
    """Whether the innermost plugin frame that ``e`` passed through belongs to code other than
    ``layer``'s own: a registered component (a plugin initializer that a built-in layer called),
    or code in another file. A helper function or class in the layer's own file is the layer's."""
    hit = _innermost(e)
    if hit is None:
        return False
    owner = hit.tb_frame.f_locals.get("self")
    if owner is layer:
        return False
    if owner is not None and _registered(owner):
        return True
    try:
        own = os.path.realpath(inspect.getsourcefile(type(layer)) or "")
    except TypeError:
        own = ""
    return os.path.realpath(hit.tb_frame.f_code.co_filename) != own


def _registered(obj) -> bool:
    return any(entry is type(obj) for reg in registry.REGISTRIES.values() for entry in reg._entries.values())


def _component(obj) -> str | None:
    """'the optimizer 'MySGD'' for an instance of a registered class, else its class name."""
    for reg in registry.REGISTRIES.values():
        for name, entry in reg._entries.items():
            if entry is type(obj):
                return f"the {reg.kind} {name!r}"
    return type(obj).__name__


def _labels_problem(cls) -> str | None:
    """The model calls forward(x, y) when ``needs_labels`` is True, forward(x) otherwise, and
    forward(a, b, ...) for a layer with several inputs (``num_inputs``): a forward whose signature
    does not take that call is refused when the plugin loads."""
    try:
        params = list(inspect.signature(cls.forward).parameters.values())[1:]  # after self
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    n = getattr(cls, "num_inputs", 1)
    if n != 1:
        if cls.needs_labels:
            return "a layer with several inputs (num_inputs) cannot take labels (needs_labels)"
        if n is None:
            return "num_inputs = None (two or more inputs) needs forward(self, *xs)"
        if len(positional) < n or len(required) > n:
            return (f"num_inputs = {n}, so the model calls forward with {n} inputs, but forward takes "
                    f"{', '.join(p.name for p in positional) or 'none'}: write forward(self, "
                    f"{', '.join(f'x{i + 1}' for i in range(n))})")
        return None
    if cls.needs_labels and len(positional) < 2:
        return "needs_labels = True, so the model calls forward(x, y), but forward takes no labels: write forward(self, x, y)"
    if not cls.needs_labels and len(required) > 1:
        return (f"forward requires {required[1].name!r}, but the model calls forward(x) alone unless the class sets "
                f"needs_labels = True: set it, or give {required[1].name} a default (y=None)")
    return None


def named_for(config: dict, records: list[dict] | None, path) -> tuple[dict, list[str]]:
    """The recorded ``config`` of checkpoint ``path`` with its ``plugins:`` list replaced by the
    files the user named (``--plugin``) that define the recorded components, and warnings for
    plugins that moved or changed since the checkpoint was written.

    A checkpoint never causes code to run: it only names plugins. A recorded plugin whose
    components no file given with ``--plugin`` (nor an installed entry point) defines is a
    PluginError saying which ``--plugin`` to pass; its file is never imported from here."""
    warnings, named, needed = [], [], []
    records = list(records or [])
    covered = {os.path.realpath(r["path"]) for r in records}
    # a checkpoint written before plugin records: only the config's list says which files ran
    records += [{"path": q, "defines": None} for q in config.get("plugins") or [] if os.path.realpath(q) not in covered]
    for rec in records:
        old = Path(rec["path"])
        names = rec.get("defines")
        if names is None:
            if loaded(old):
                named.append(str(old))
            else:
                needed.append((old, None))
            continue
        if not names:  # a file that registered nothing: the model does not need it
            continue
        origins = {registered_by(n) for n in names}
        if None in origins:
            needed.append((old, names))
            continue
        files = {o for o in origins if os.path.isfile(o)}  # (the rest: entry points, built-ins)
        named += sorted(os.path.abspath(f) for f in files)  # (a --plugin given relative to the working directory)
        given = files.pop() if len(files) == 1 else None
        if given is not None and os.path.realpath(given) != os.path.realpath(old):
            warnings.append(f"plugin {old} is gone; using {given}, which defines {', '.join(names)}"
                            if not old.is_file() else
                            f"using {given} (given with --plugin) instead of the recorded plugin {old}, for "
                            f"{', '.join(names)}")
        current = Path(given) if given is not None else None
        if current is not None and rec.get("sha256") and source_hash(current) != rec["sha256"]:
            warnings.append(f"plugin {current} changed since {Path(path).name} was written (sha256 "
                            f"{rec['sha256'][:12]}… → {source_hash(current)[:12]}…); the model runs with the current code")
    if needed:
        raise PluginError(_needed_message(path, needed))
    return {**config, "plugins": list(dict.fromkeys(named))}, warnings


def _needed_message(path, needed: list) -> str:
    """One line: the plugins a checkpoint's model needs that were not named, and the flags to pass."""
    what = "; ".join(f"{old} (defines {', '.join(names)})" if names else str(old) for old, names in needed)
    flags = " ".join(f"--plugin {old}" for old, _ in needed)
    missing = [str(old) for old, _ in needed if not old.is_file()]
    if missing:
        gone = ("that file is missing" if len(needed) == 1 else
                f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing")
        return (f"{path}: the model needs plugin code from {what}, but {gone}; put it back, or name its new place "
                f"with --plugin FILE.py")
    return (f"{path}: the model needs plugin code from {what}; a checkpoint never runs code by itself: "
            f"add {flags} to run it")


def loaded(path: str | Path) -> bool:
    """Whether plugin file ``path`` has been loaded (named with --plugin or by a config)."""
    return str(Path(path).expanduser().resolve()) in _loaded


def loaded_files() -> list[str]:
    """The plugin files loaded so far, resolved, in the order they ran."""
    return list(_loaded)


def registered_by(name: str) -> str | None:
    """Where component ``name`` (of any kind) was registered from: a plugin file, an entry
    point's description, or 'builtin'; None when nothing registered it."""
    for reg in registry.REGISTRIES.values():
        if name in reg._entries:
            return reg.origin(name)
    return None


def load_plugins(paths) -> None:
    for p in paths:
        load_plugin(p)
