"""House rules enforced by parsing the source: one owner per concern."""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "dlrun"
FILES = sorted(PKG.rglob("*.py"))


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _rel(p: Path) -> str:
    return p.relative_to(PKG).as_posix()


@pytest.mark.parametrize("module,owners", [
    ("cupy", {"backend.py"}),
    ("cupyx", {"backend.py"}),
    ("yaml", {"config.py", "config_yaml.py"}),
])
def test_only_the_owner_imports(module, owners):
    offenders = [_rel(p) for p in FILES if module in _imports(p) and _rel(p) not in owners]
    assert not offenders, f"{module} imported outside {owners}: {offenders}"


def test_only_the_cli_and_progress_print():
    offenders = []
    for p in FILES:
        rel = _rel(p)
        if rel.startswith("cli/") or rel == "progress.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, f"print() outside the CLI: {offenders}"


def test_modules_stay_small():
    big = [(_rel(p), n) for p in FILES if (n := len(p.read_text().splitlines())) > 300]
    assert not big, f"modules over 300 lines (split by noun): {big}"


def test_no_bare_except():
    bad = [f"{_rel(p)}:{n.lineno}" for p in FILES for n in ast.walk(ast.parse(p.read_text()))
           if isinstance(n, ast.ExceptHandler) and n.type is None]
    assert not bad
