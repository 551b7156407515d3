"""SIGINT and SIGTERM outside training: one line (`interrupted` / `terminated`), exit 130 / 143,
and no half-written output file. (Training's own stop at a batch boundary is in test_faults.py.)"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, write

C = ROOT / "tests/corpus/configs"
SIGNALS = [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from dlrun.config import load_config
    from dlrun.runs.run import train

    d = tmp_path_factory.mktemp("signals")
    train(load_config(C / "valid.yaml"), d / "runs")
    (run,) = (d / "runs").iterdir()
    write(d / "x.csv", "0.1,0.2\n0.3,0.4\n")
    return run, d / "x.csv"


class Killed(BaseException):
    """Stands in for SIGTERM's default action, the end of the process (and of this test run)."""


def _killed(signum, frame):
    raise Killed(signal.Signals(signum).name)


@pytest.fixture
def default_handlers():
    """The handlers a process starts with (a test runner's worker may ignore SIGINT), SIGTERM's
    default replaced by :class:`Killed`; put back after the test."""
    old = {s: signal.getsignal(s) for s, _, _ in SIGNALS}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _killed)
    yield
    for s, h in old.items():
        signal.signal(s, h)


def _signal_self(sig):
    os.kill(os.getpid(), sig)
    time.sleep(10)  # the handler raises here
    raise AssertionError(f"{sig.name} was not delivered")


def _commands(run, x, out):
    """(argv, module, function to replace with one that signals) for each command outside training."""
    import dlrun.cli.check as check
    import dlrun.cli.gradcheck as gradcheck
    from dlrun.runs import evaluation, inference, run as runs

    return {
        "predict": (["predict", run, "--input", x, "--output", out], inference, "write_csv"),
        "evaluate": (["evaluate", run], evaluation, "evaluate"),
        "check": (["check", C / "valid.yaml"], check, "check_config"),
        "gradcheck": (["gradcheck", "Linear"], gradcheck, "check_layer"),
        # while a run is prepared, before the fit installs training's own handlers
        "train": (["train", C / "valid.yaml", "--runs-dir", out.parent / "runs"], runs, "assemble"),
    }


@pytest.mark.parametrize("command", ["predict", "evaluate", "check", "gradcheck", "train"])
@pytest.mark.parametrize("sig,code,word", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_a_signal_outside_training_is_one_line_and_its_exit_code(command, sig, code, word, trained, tmp_path,
                                                                  monkeypatch, capsys, default_handlers):
    # Ctrl-C in predict exited 130 with no message; SIGTERM killed the process silently (-15) and
    # left predict's temporary output file behind
    from dlrun.cli import main

    run, x = trained
    out = tmp_path / "out" / "p.csv"
    out.parent.mkdir()
    argv, module, name = _commands(run, x, out)[command]

    def signalled(table, f=None, *args, **kwargs):
        if command == "predict":
            f.write("prediction\n0\n")  # half a file
            f.flush()
        _signal_self(sig)

    monkeypatch.setattr(module, name, signalled)
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    assert e.value.code == code
    assert capsys.readouterr().err == f"{word}\n"
    assert list(out.parent.iterdir()) == []  # no output file, no temporary file, no run directory
    # the process's own handlers are back
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is _killed


def test_a_signal_the_parent_ignores_stays_ignored(trained, tmp_path, monkeypatch, capsys, default_handlers):
    # `dlrun ... &` in a script: the shell ignores SIGINT for background jobs, and so does dlrun
    from dlrun.runs import evaluation
    from dlrun.cli import main

    run, _ = trained
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    seen = []

    def ignored(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        seen.append(signal.getsignal(signal.SIGINT))
        raise SystemExit(0)

    monkeypatch.setattr(evaluation, "evaluate", ignored)
    with pytest.raises(SystemExit) as e:
        main(["evaluate", str(run)])
    assert e.value.code == 0 and seen == [signal.SIG_IGN]


STALLED_PREDICT = r"""
import sys, time
from pathlib import Path
from dlrun.runs import inference
marker = Path(sys.argv[1])
def stalled(table, f):  # write part of the file, then wait for the signal
    f.write("prediction\n0\n"); f.flush()
    marker.write_text("writing"); time.sleep(60)
inference.write_csv = stalled
sys.argv = ["dlrun", *sys.argv[2:]]
from dlrun.console import main
main()
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig,code,word", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_the_process_killed_while_predict_writes_says_so_and_leaves_no_file(sig, code, word, trained, tmp_path):
    # the real process, with the signal from outside (kill, Ctrl-C in a terminal, a job scheduler)
    run, x = trained
    marker, out = tmp_path / "marker", tmp_path / "out" / "p.csv"
    out.parent.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-c", STALLED_PREDICT, str(marker), "predict", str(run), "--input", str(x),
                          "--output", str(out)], env=env, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while not marker.exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.02)
    assert marker.exists(), p.communicate()[1]
    assert list(out.parent.iterdir()), "the temporary file should be there while predict writes"
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == code and err == f"{word}\n", (p.returncode, err)
    assert list(out.parent.iterdir()) == []
