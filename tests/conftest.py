"""Shared fixtures: run the real CLI against this checkout, in this process (the default) or in a
fresh one (``process=True``).

In this process, ``run_cli`` calls ``dlrun.cli.main(argv)`` as ``python -m dlrun`` would, with
what a fresh process would start from and nothing left behind: its own stdout, stderr and stdin
(not terminals), 200 columns, the working directory, os.environ, sys.argv, the registries as
the built-in modules (and installed entry points) filled them, no plugins loaded, the start-up
handlers of SIGINT and SIGTERM, numpy's error state, print options and global generator, and
Python's default warning filters (a warning is printed on stderr, as it would be). A test
whose subject is the process itself (signals sent to it, pipes, the installed console script,
start-up, environment variables read at start-up, timeouts) passes ``process=True``.
DLRUN_TEST_PROCESSES=1 runs every call in a process of its own (as the suite did before: slower),
but those that pass ``process=False`` (the test patches this process for the call).
"""
from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import threading
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path


def _threads_per_worker() -> None:
    """Under pytest-xdist, each worker's BLAS and OpenMP pools get its share of the cores (set
    before numpy and torch start them): a pool as large as the machine in every worker made the
    workers take each other's cores (python -m pytest -n auto ran about 1.8x slower on 2 cores)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, str(max(1, cores // workers)))


_threads_per_worker()


def _foreground_signals() -> None:
    """The suite sends itself SIGINT and SIGTERM (training stops at a batch boundary). A shell's
    background job starts with SIGINT ignored, and dlrun leaves an ignored signal ignored (as under
    nohup): the tests would find nothing to catch. The test process takes the foreground's."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


_foreground_signals()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
COLUMNS = "200"  # tables as wide as a large terminal (pytest-xdist workers set 80)

# read only when a process starts: a test that sets one of these runs the CLI in a process
START_UP_VARIABLES = ("PYTHON", "LD_", "OMP_", "OPENBLAS_", "MKL_", "CUPY_", "CUDA_")


@dataclass
class Result:
    code: int
    out: str
    err: str


def run_cli(*args, cwd=None, env=None, timeout=600, input=None, process=None) -> Result:
    """Run ``dlrun ARGS`` (``python -m dlrun ARGS`` with this checkout first on the path when
    ``process`` is true; ``timeout`` applies to that process). ``process=False``: in this process
    even under DLRUN_TEST_PROCESSES=1 (a test that patches this process for the call)."""
    if process or (process is None and os.environ.get("DLRUN_TEST_PROCESSES") == "1"):
        return run_process(*args, cwd=cwd, env=env, timeout=timeout, input=input)
    early = sorted(k for k in env or () if k.startswith(START_UP_VARIABLES))
    if early:
        raise ValueError(f"{', '.join(early)} take effect when a process starts: run_cli(..., process=True)")
    return _run_here([str(a) for a in args], cwd=cwd, env=env, input=input)


def run_process(*args, cwd=None, env=None, timeout=600, input=None) -> Result:
    """``python -m dlrun ARGS`` in a fresh process."""
    p = subprocess.run([sys.executable, "-m", "dlrun", *map(str, args)], cwd=cwd or ROOT, env=_environment(env),
                       capture_output=True, text=True, timeout=timeout, input=input)
    return Result(p.returncode, p.stdout, p.stderr)


def _environment(env) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["COLUMNS"] = COLUMNS
    e.update(env or {})
    return e


@pytest.fixture
def cli():
    return run_cli


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- the CLI in this process -------------------------------------------------------------------
# Imported, and the registries filled, before any test module registers components of its own:
# the state of a process that has just started, given to every call.

try:
    import dlrun.cli as _cli
    from dlrun import registry as _registry

    _registry.load_builtins()
except Exception:  # (dlrun broken: each call then shows it, in a process, rather than no test running)
    _cli = None
_MISSING = object()
_PRINT_OPTIONS = np.get_printoptions()
_ERRSTATE = {"divide": "warn", "over": "warn", "under": "ignore", "invalid": "warn"}
_SIGNALS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
_KEPT_MODULES = tuple(str(Path(p).resolve()) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}) + (
    str(ROOT / "dlrun"),)
# the modules whose globals say which components and plugins are loaded (whichever exist)
_STATE_MODULES = ("dlrun.registry", "dlrun.registry.plugins", "dlrun.registry.options", "dlrun.plugins", "dlrun.cli")
_VALUES = (bool, int, float, str, type(None))


def _registries() -> list:
    """What the registries hold: each registry's dicts (entries, origins), the names the entries
    were given, and the plain values, dicts and lists of the modules that load components and
    plugins (plugin files loaded, entry points, the origin being loaded, the CLI's argv)."""
    state = []
    for reg in _registry.REGISTRIES.values():
        state += [(reg, k, dict(v)) for k, v in vars(reg).items() if isinstance(v, dict)]
        state += [(obj, "registered_name", vars(obj).get("registered_name", _MISSING))
                  for obj in reg._entries.values() if hasattr(obj, "__dict__")]
    for name in _STATE_MODULES:
        module = sys.modules.get(name)
        for k, v in vars(module).items() if module is not None else ():
            if not k.startswith("__") and (type(v) in (dict, list) or isinstance(v, _VALUES)):
                state.append((module, k, v.copy() if type(v) in (dict, list) else v))
    return state


def _set_registries(state: list) -> None:
    for owner, k, v in state:
        if type(v) in (dict, list):  # in place: others hold the same object
            now = getattr(owner, k)
            if isinstance(now, dict):
                now.clear()
                now.update(v)
            else:
                now[:] = v
        elif v is not _MISSING:
            setattr(owner, k, v)


if _cli is not None:
    _FRESH = _registries()


class _Captured(io.StringIO):
    """A pipe's text stream as the CLI sees it: UTF-8, not a terminal."""

    @property
    def encoding(self):
        return "utf-8"


def _show_warning(message, category, filename, lineno, file=None, line=None):
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _default_warnings() -> None:
    """Python's filters in a process started without -W or PYTHONWARNINGS (and numpy's)."""
    warnings.resetwarnings()
    for category in (ResourceWarning, ImportWarning, PendingDeprecationWarning, DeprecationWarning):
        warnings.simplefilter("ignore", category)
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
    warnings.simplefilter("always", getattr(np, "exceptions", np).RankWarning)
    warnings.showwarning = _show_warning


def _exit_code(e: SystemExit) -> int:
    """The status a process ending with ``e`` has (sys.exit('text') prints the text, status 1)."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def _run_here(args: list[str], *, cwd, env, input) -> Result:
    if _cli is None or threading.current_thread() is not threading.main_thread():  # (signals: the main thread)
        return run_process(*args, cwd=cwd, env=env, input=input)
    saved_environ = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    saved_argv, saved_path = sys.argv, sys.path[:]
    saved_modules = set(sys.modules)
    hidden_plugins = {n: m for n, m in sys.modules.items() if n.startswith("dlrun_plugin_")}
    saved_registries = _registries()
    saved_hooks = sys.excepthook, sys.displayhook
    saved_signals = {s: signal.getsignal(s) for s in _SIGNALS}
    saved_consoles = [(c, c._width, c._height, c._color_system) for c in (_cli.out, _cli.err)]
    saved_np_random, saved_random = np.random.get_state(), random.getstate()
    out, err = _Captured(), _Captured()
    code = 0
    try:
        environ = _environment(env)
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd or ROOT)
        sys.stdin, sys.stdout, sys.stderr = _Captured(input or ""), out, err
        sys.argv = [str(ROOT / "dlrun" / "__main__.py"), *args]
        for n in hidden_plugins:
            del sys.modules[n]
        _set_registries(_FRESH)
        for s, h in _SIGNALS.items():
            signal.signal(s, h)
        for c, *_ in saved_consoles:  # as the Consoles are made at import: the width from COLUMNS
            columns, lines = os.environ.get("COLUMNS", ""), os.environ.get("LINES", "")
            c._width = int(columns) if columns.isdigit() else None
            c._height = int(lines) if lines.isdigit() else None
            c._color_system = c._detect_color_system()
        with warnings.catch_warnings(), np.errstate(**_ERRSTATE), np.printoptions(**_PRINT_OPTIONS):
            _default_warnings()
            try:
                _cli.main(args)
            except SystemExit as e:
                code = _exit_code(e)
            except KeyboardInterrupt:  # (the interpreter ends itself with SIGINT)
                traceback.print_exc()
                code = -signal.SIGINT
            except Exception:  # the interpreter prints the traceback, status 1
                traceback.print_exc()
                code = 1
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        for s, h in saved_signals.items():
            if h is not None:  # (None: a handler not set from Python, left as it is)
                signal.signal(s, h)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_environ)
        sys.argv = saved_argv
        sys.path[:] = saved_path
        for n in set(sys.modules) - saved_modules:
            where = getattr(sys.modules[n], "__file__", None)
            if n.startswith("dlrun_plugin_") or (where and not str(Path(where).resolve()).startswith(_KEPT_MODULES)):
                del sys.modules[n]  # plugin files, and modules they imported from beside them
        sys.modules.update(hidden_plugins)
        _set_registries(saved_registries)
        sys.excepthook, sys.displayhook = saved_hooks  # (typer sets its own excepthook)
        for c, width, height, color_system in saved_consoles:
            c._width, c._height, c._color_system = width, height, color_system
        np.random.set_state(saved_np_random)
        random.setstate(saved_random)
    return Result(code, out.getvalue(), err.getvalue())
