"""House rules enforced by parsing the source: the wings' layering, no import cycles, one owner
per concern (see docs/architecture.md)."""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "dlrun"
FILES = sorted(PKG.rglob("*.py"))

# The wings, lowest first: a module may import its own wing and the wings below it, never one
# above. Components (layers, losses, optimizers, schedules, metrics) form one level.
LAYERS = [
    {"errors", "seeding", "signals"},
    {"backend"},
    {"parallel"},  # the ranks of a data-parallel run (mpi4py, NCCL through the backend)
    {"registry"},
    {"layers", "losses", "optimizers", "schedules", "metrics"},
    {"data"},
    {"model"},
    {"training"},
    {"config"},
    {"api"},  # the plugin authors' facade: components, their registries and option types
    {"runs"},
    {"commands"},
    {"gradcheck"},
    {"cli"},
    {"console", "__main__", "__init__"},
]
LEVEL = {wing: i for i, wings in enumerate(LAYERS) for wing in wings}

# deferred imports that are not there to dodge a cycle: optional or platform-specific modules,
# and the console script's guard (Ctrl-C while the CLI imports ends with one line)
DEFERRED = {("backend/backend.py", "cupy"), ("backend/backend.py", "cupyx"), ("runs/rundir.py", "fcntl"),
            ("runs/rundir.py", "msvcrt"), ("backend/memory.py", "resource"), ("console.py", "dlrun.cli"), ("cli/__init__.py", "typer._click.exceptions"),
            ("cli/__init__.py", "click.exceptions"),
            # optional extras, imported when a run asks for them: train.loggers: [tensorboard]
            # (pip install 'dlrun[tensorboard]'), dlrun plot --output (pip install 'dlrun[plot]')
            ("runs/tensorboard.py", "tensorboardX"), ("runs/tensorboard.py", "tensorboardX.proto"),
            ("runs/figures.py", "matplotlib.figure"), ("runs/figures.py", "matplotlib.colors"),
            ("runs/figures.py", "matplotlib"),
            # pyarrow's CSV reader: optional (the arrow extra), imported when a CSV is first read
            ("data/fastcsv.py", "pyarrow"), ("data/fastcsv.py", "pyarrow.csv"),
            # optional: the mpi extra, imported only by a process that mpiexec started as one of several ranks
            ("parallel.py", "mpi4py"),
            # optional: NCCL, for a data-parallel run on GPUs
            ("backend/backend.py", "cupy.cuda")}


def _rel(p: Path) -> str:
    return p.relative_to(PKG).as_posix()


def _module(p: Path) -> list[str]:
    parts = list(p.relative_to(PKG).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _package(p: Path) -> list[str]:
    parts = _module(p)
    return parts if p.name == "__init__.py" else parts[:-1]


def _type_checking(tree) -> set[int]:
    """ids of import nodes under ``if TYPE_CHECKING:`` (type hints only: never run)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            out |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return out


def _dlrun_imports(p: Path):
    """(node, dotted module inside dlrun or None, deferred) for every import in file ``p``."""
    tree = ast.parse(p.read_text())
    hints = _type_checking(tree)
    top = {id(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in hints:
            continue
        deferred = id(node) not in top
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node, a.name[6:] if a.name.startswith("dlrun.") else None, deferred, a.name
            continue
        if node.level == 0:
            name = node.module or ""
            inner = name[6:] if name.startswith("dlrun.") else "" if name == "dlrun" else None
        else:
            base = _package(p)
            base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
            inner = ".".join(base + ([node.module] if node.module else []))
            name = "dlrun." + inner if inner else "dlrun"
        if inner is not None and not node.module or inner == "":
            for a in node.names:  # from . import checkpoint: the module named
                yield node, f"{inner}.{a.name}".strip("."), deferred, name
        else:
            yield node, inner, deferred, name


def _wing(dotted: str) -> str:
    return dotted.split(".")[0] if dotted else "__init__"


def test_every_module_belongs_to_a_declared_wing():
    missing = sorted({_wing(".".join(_module(p))) for p in FILES} - set(LEVEL))
    assert not missing, f"modules outside the declared wings (add them to LAYERS and docs/architecture.md): {missing}"


def test_no_import_runs_upward():
    upward = []
    for p in FILES:
        here = _wing(".".join(_module(p)))
        for node, inner, _, _ in _dlrun_imports(p):
            if inner is None:
                continue
            there = _wing(inner)
            if there in LEVEL and LEVEL[there] > LEVEL[here]:
                upward.append(f"{_rel(p)}:{node.lineno} ({here}) imports {inner} ({there})")
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def test_no_deferred_import_dodges_a_cycle():
    deferred = [f"{_rel(p)}:{node.lineno} imports {name}" for p in FILES for node, _, late, name in _dlrun_imports(p)
                if late and (_rel(p), name) not in DEFERRED]
    assert not deferred, "imports inside functions (move them to the top; a cycle means a module is in the wrong wing):\n" \
        + "\n".join(deferred)


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    modules = {".".join(_module(p)) for p in FILES}
    for p in FILES:
        here = ".".join(_module(p))
        for _, inner, late, _ in _dlrun_imports(p):
            if inner is None or late:
                continue
            while inner and inner not in modules:  # from .x import name: the module x
                inner = inner.rpartition(".")[0]
            if inner != here and inner:
                graph.setdefault(here, set()).add(inner)
    # a package's __init__ importing its own modules is how a package presents itself: not a cycle
    state, cycle = {}, []

    def visit(m, path):
        state[m] = 1
        for n in graph.get(m, ()):
            if n.startswith(m + ".") or m.startswith(n + ".") and not graph.get(n, set()) - {m}:
                continue
            if state.get(n) == 1:
                cycle.append(path[path.index(n):] + [n] if n in path else [m, n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycle, "import cycles: " + "; ".join(" -> ".join(c) for c in cycle[:5])


@pytest.mark.parametrize("module,owners", [
    ("cupy", {"backend/backend.py"}),
    ("cupyx", {"backend/backend.py"}),
    ("yaml", {"config/__init__.py", "config/source.py"}),
])
def test_only_the_owner_imports(module, owners):
    offenders = [_rel(p) for p in FILES for _, _, _, name in _dlrun_imports(p)
                 if name.split(".")[0] == module and _rel(p) not in owners]
    assert not offenders, f"{module} imported outside {owners}: {offenders}"


def test_only_the_cli_prints():
    offenders = []
    for p in FILES:
        if _rel(p).startswith("cli/"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                offenders.append(f"{_rel(p)}:{node.lineno}")
    assert not offenders, f"print() outside the CLI: {offenders}"


def test_no_file_name_that_windows_reserves():
    reserved = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(1, 10)), *(f"lpt{i}" for i in range(1, 10))}
    root = PKG.parent
    bad = [str(p.relative_to(root)) for p in root.rglob("*") if ".git" not in p.parts and ".venv" not in p.parts
           and p.name.split(".")[0].lower() in reserved]
    assert not bad, f"names Windows cannot check out: {bad}"


def test_no_bare_except():
    bad = [f"{_rel(p)}:{n.lineno}" for p in FILES for n in ast.walk(ast.parse(p.read_text()))
           if isinstance(n, ast.ExceptHandler) and n.type is None]
    assert not bad


def test_every_package_says_what_it_owns():
    silent = [_rel(p) for p in PKG.rglob("__init__.py") if not ast.get_docstring(ast.parse(p.read_text()))]
    assert not silent, f"packages without a docstring saying what they own: {silent}"
