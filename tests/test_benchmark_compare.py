"""benchmarks/compare.py: times versions of dlrun on one workload (the real script, one quick round)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# compare.py checks revisions out of the repository's history: a copy of the files without it
# (an unpacked source archive, a synced tree whose .git holds no commits) cannot run it
IN_GIT = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "-q", "HEAD"],
                        capture_output=True).returncode == 0


def worktrees() -> set[str]:
    """compare.py's temporary worktrees (others, which may come and go meanwhile, are not its own)."""
    out = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if "dlrun-compare-" in line}


@pytest.mark.skipif(not IN_GIT, reason="needs a git checkout with history")
def test_compare_times_a_revision_and_the_worktree_then_removes_its_worktree():
    before = worktrees()
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare.py"), "spiral", "HEAD", "WORKTREE",
                        "--rounds", "1", "--repeats", "1", "--threads", "1"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    rows = {m[0]: (float(m[1]), float(m[2])) for m in re.findall(r"^(HEAD|WORKTREE)\s+([\d.]+)\s+([\d.]+)\s", p.stdout, re.M)}
    assert set(rows) == {"HEAD", "WORKTREE"} and all(med > 0 and lo > 0 for med, lo in rows.values())
    assert re.search(r"^HEAD\s+[\d.]+\s+[\d.]+\s+\+0\.0% /\s+\+0\.0%$", p.stdout, re.M)  # the baseline row
    assert worktrees() <= before  # its temporary worktree is gone


def test_compare_rejects_an_unknown_workload():
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare.py"), "nope", "WORKTREE"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "invalid choice: 'nope'" in p.stderr


@pytest.mark.skipif(not IN_GIT, reason="needs a git checkout with history")
def test_compare_names_a_revision_git_does_not_know():
    before = worktrees()
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare.py"), "spiral", "WORKTREE", "no-such-rev"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "cannot check out 'no-such-rev'" in p.stderr and "Traceback" not in p.stderr
    assert worktrees() <= before
