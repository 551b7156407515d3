"""User plugins: Python files (or installed packages) that register their own components.

Plugin code runs only when the user names it: ``--plugin FILE.py``, a config's ``plugins:``
list, or an installed package's ``dlrun.plugins`` entry point.
"""
from __future__ import annotations

import hashlib
import importlib.util
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
    registry._loading_origin = str(p)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        raise PluginError(f"{e.filename or p}:{e.lineno}: syntax error in plugin: {e.msg}") from None
    except DlrunError as e:
        sys.modules.pop(name, None)
        raise PluginError(f"{p}: {e.message}") from None
    except Exception as e:  # the plugin's own code failed: say where, in one line
        sys.modules.pop(name, None)
        tb = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(p)]
        line = f":{tb[-1].lineno}" if tb else ""
        raise PluginError(f"{p}{line}: plugin raised {type(e).__name__}: {e}") from None
    finally:
        registry._loading_origin = None
    _loaded[key] = name


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
