"""User plugins: Python files (or installed packages) that register their own components.

Plugin code runs only when the user names it: ``--plugin FILE.py``, a config's ``plugins:``
list, or an installed package's ``dlrun.plugins`` entry point.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
import traceback
from importlib.metadata import entry_points
from pathlib import Path

from . import registry
from .errors import DlrunError, PluginError

_loaded: dict[str, str] = {}  # resolved path -> module name
_entry_points_loaded = False


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
        raise PluginError(f"{e.filename or p}:{e.lineno}: syntax error in plugin: {e.msg}") from None
    except DlrunError as e:
        _forget(name, origin)
        raise PluginError(f"{p}{_line(e, p)}: {e.message}") from None
    except Exception as e:  # the plugin's own code failed: say where, in one line
        _forget(name, origin)
        raise PluginError(f"{p}{_line(e, p)}: plugin raised {type(e).__name__}: {e}") from None
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
    must subclass their base class when it is a class (an initializer, a loss, ...).
    """
    from .layers.base import Layer

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
            elif inspect.isclass(obj) and reg.base is not None and not issubclass(obj, reg.base):
                problem = f"it is not a subclass of {reg.base.__module__}.{reg.base.__name__}"
            if problem:
                e = PluginError(f"{reg.kind} {name!r} does not follow the {reg.kind} contract: {problem}")
                try:
                    e.plugin_line = inspect.getsourcelines(obj)[1]
                except (OSError, TypeError):
                    pass
                raise e


def load_plugins(paths) -> None:
    for p in paths:
        load_plugin(p)


def load_entry_points() -> None:
    """Load installed packages' ``dlrun.plugins`` entry points (once)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group="dlrun.plugins"):
        registry._loading_origin = f"entry point {ep.name} ({ep.value})"
        try:
            ep.load()
        except Exception as e:
            raise PluginError(f"entry point {ep.name!r} ({ep.value}) failed to load: {type(e).__name__}: {e}") from None
        finally:
            registry._loading_origin = None
