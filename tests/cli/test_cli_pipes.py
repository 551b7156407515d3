"""The console around a command: a reader that goes away (`dlrun train x.yaml | head -1`)
silences the output, and the command runs to its end and leaves a whole run directory; Ctrl-C
while the CLI loads ends with one line."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT


def _closed_stdout(*args, stderr_too=False):
    """Run ``python -m dlrun ARGS`` with stdout (and stderr) a pipe nobody reads: the read end is
    closed before the process starts, so its first write fails (EPIPE) whatever the timing."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    read, write = os.pipe()
    os.close(read)
    try:
        p = subprocess.run([sys.executable, "-m", "dlrun", *map(str, args)], cwd=ROOT, env=env, stdout=write,
                           stderr=write if stderr_too else subprocess.PIPE, timeout=300)
    finally:
        os.close(write)
    return p.returncode, (p.stderr or b"").decode()


@pytest.mark.parametrize("stderr_too", [False, True], ids=["stdout", "stdout+stderr"])
def test_training_goes_on_when_the_reader_of_its_output_goes_away(tmp_path, stderr_too):
    code, err = _closed_stdout("train", "configs/spiral.yaml", "--runs-dir", tmp_path, "--set", "train.epochs=3",
                               stderr_too=stderr_too)
    assert code == 0, err  # it exited 1 after the first line, leaving metrics.csv without summary.json
    (run,) = tmp_path.iterdir()
    assert (run / "summary.json").is_file() and (run / "checkpoints" / "last.npz").is_file()
    assert len((run / "metrics.csv").read_text().splitlines()) == 1 + 3
    assert "BrokenPipe" not in err and "Exception ignored" not in err


def test_a_gradient_check_keeps_its_verdict_when_its_output_is_not_read():
    code, err = _closed_stdout("gradcheck", "ReQU")
    assert code == 0 and "BrokenPipe" not in err, err  # a PASS, not a failure (it exited 1)


def test_ctrl_c_while_the_cli_loads_is_one_line_and_exit_130(monkeypatch, capsys):
    # a SIGINT in the first few hundred ms (numpy, rich and the registries importing) printed
    # the import's traceback
    import builtins

    from dlrun import console

    real = builtins.__import__

    def interrupted(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "cli" and level == 1:
            raise KeyboardInterrupt
        return real(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    with pytest.raises(SystemExit) as e:
        console.main()
    assert e.value.code == 130 and capsys.readouterr().err == "interrupted\n"
