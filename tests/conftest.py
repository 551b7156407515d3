"""Shared fixtures: run the real CLI in a subprocess against this checkout."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


@dataclass
class Result:
    code: int
    out: str
    err: str


def run_cli(*args, cwd=None, env=None, timeout=600, input=None) -> Result:
    """Run ``python -m dlrun ARGS`` with this checkout first on the path."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["COLUMNS"] = "200"  # tables as wide as a large terminal (pytest-xdist workers set 80)
    if env:
        e.update(env)
    p = subprocess.run([sys.executable, "-m", "dlrun", *map(str, args)], cwd=cwd or ROOT, env=e,
                       capture_output=True, text=True, timeout=timeout, input=input)
    return Result(p.returncode, p.stdout, p.stderr)


@pytest.fixture
def cli():
    return run_cli


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
